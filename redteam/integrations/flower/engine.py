"""Where a scored Flower app's ClientApps run: in this process (:class:`LocalGrid`), or in Flower's
simulation engine on Ray (:func:`run_on_ray`).

:class:`LocalGrid` is a Flower ``Grid`` that hands every message a strategy sends, as a copy, to
``client_app(message, context)`` of its node, one node after another, in this process; each node's
``node_config`` carries ``partition-id`` and ``num-partitions`` as Flower's simulation sets them,
and a ClientApp's exception becomes an error reply, as Flower's runtime makes it. The strategy's
``start``, the ClientApp and its mods run exactly as Flower runs them; only the transport (Ray
actors and Flower's message store) is left out, so a run is deterministic and starts in
milliseconds. Replies come back in the reverse of the order sent, so that nothing downstream can
rely on arrival order.
"""

from __future__ import annotations

import copy
import itertools
import os
import time
from typing import Any, Iterable

from flwr.app import Context, Error, Message, Metadata, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["LocalGrid", "SERVER", "RUN_ID", "run_on_ray"]

#: the server's node id and the run id of a :class:`LocalGrid`
SERVER = 1
RUN_ID = 7


class LocalGrid(Grid):
    """``client_app``'s nodes ``node_ids`` (partition ``i`` is ``node_ids[i]``) in this process;
    ``drop``: call number (1-based) → node ids whose replies are lost in that call."""

    def __init__(self, client_app: Any, node_ids: list[int], drop: dict[int, set[int]] | None = None) -> None:
        TaskIdentity.run_id = RUN_ID
        TaskIdentity.node_id = SERVER
        TaskIdentity.task_id = 0
        self.client_app = client_app
        self.node_ids = list(node_ids)
        self.contexts = {nid: Context(run_id=RUN_ID, node_id=nid,
                                      node_config={"partition-id": p, "num-partitions": len(node_ids)},
                                      state=RecordDict(), run_config={}) for p, nid in enumerate(node_ids)}
        self.drop = drop or {}
        self.calls = 0
        self._ids = itertools.count()

    def set_run(self, run: Any) -> None:  # pragma: no cover - not used by Strategy.start
        pass

    @property
    def run(self) -> Any:  # pragma: no cover
        raise NotImplementedError("LocalGrid has no Run object (Strategy.start does not read it)")

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # pragma: no cover
        raise NotImplementedError("LocalGrid delivers through send_and_receive only")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # pragma: no cover
        raise NotImplementedError("LocalGrid delivers through send_and_receive only")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        self.calls += 1
        lost = self.drop.get(self.calls, set())
        out = []
        for m in messages:
            md = m.metadata
            meta = Metadata(run_id=RUN_ID, message_id=f"m{next(self._ids)}", src_node_id=SERVER,
                            dst_node_id=md.dst_node_id, reply_to_message_id="", group_id=md.group_id,
                            created_at=time.time(), ttl=md.ttl, message_type=md.message_type)
            sent = Message(content=copy.deepcopy(m.content), metadata=meta)
            try:
                reply = self.client_app(sent, self.contexts[md.dst_node_id])
            except Exception as exc:  # noqa: BLE001 - as Flower's runtime does: an error reply
                reply = sent.create_error_reply(Error(code=0, reason=f"{type(exc).__name__}: {exc}"))
            if md.dst_node_id not in lost:
                out.append(reply)
        return out[::-1]


def run_on_ray(server_app: Any, client_app: Any, clients: int, cpus: int, import_dirs: Iterable[str] = ()) -> None:
    """Run ``server_app`` with ``clients`` SuperNodes of ``client_app`` in Flower's simulation engine
    on a local Ray instance of ``cpus`` CPUs (one ClientApp actor per CPU). ``import_dirs`` go on
    the workers' ``PYTHONPATH`` (where the app's module lies: Ray's workers import it)."""
    from flwr.simulation import run_simulation

    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([*[d for d in import_dirs if d not in paths], *paths])
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=int(clients), backend_name="ray",
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": int(cpus), "include_dashboard": False}})
