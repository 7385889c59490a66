"""A Flower ``Grid`` that runs a ClientApp in this process (tests only): every message Flower's
strategies send goes, as a copy, to ``client_app(message, context)`` of its node, whose
``node_config`` carries ``partition-id`` and ``num-partitions`` as Flower's simulation sets them.
It runs the strategy's ``start``, the ClientApp and its mods as Flower runs them, without Ray (the
simulation's transport); one test in test_flower_integration.py runs the real engine."""

from __future__ import annotations

import copy
import itertools
import time
from typing import Iterable

from flwr.app import Context, Error, Message, Metadata, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

SERVER = 1


class LocalGrid(Grid):
    def __init__(self, client_app, node_ids: list[int], drop: dict[int, set[int]] | None = None) -> None:
        TaskIdentity.run_id = 7
        TaskIdentity.node_id = SERVER
        TaskIdentity.task_id = 0
        self.client_app = client_app
        self.node_ids = list(node_ids)
        self.contexts = {nid: Context(run_id=7, node_id=nid, node_config={"partition-id": p,
                                                                          "num-partitions": len(node_ids)},
                                      state=RecordDict(), run_config={}) for p, nid in enumerate(node_ids)}
        self.drop = drop or {}  # call number → node ids whose replies are lost
        self.calls = 0
        self._ids = itertools.count()

    def set_run(self, run) -> None:  # pragma: no cover - not used by Strategy.start
        pass

    @property
    def run(self):  # pragma: no cover
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages):  # pragma: no cover
        raise NotImplementedError

    def pull_messages(self, message_ids):  # pragma: no cover
        raise NotImplementedError

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        self.calls += 1
        lost = self.drop.get(self.calls, set())
        out = []
        for m in messages:
            md = m.metadata
            meta = Metadata(run_id=7, message_id=f"m{next(self._ids)}", src_node_id=SERVER,
                            dst_node_id=md.dst_node_id, reply_to_message_id="", group_id=md.group_id,
                            created_at=time.time(), ttl=md.ttl, message_type=md.message_type)
            sent = Message(content=copy.deepcopy(m.content), metadata=meta)
            try:
                reply = self.client_app(sent, self.contexts[md.dst_node_id])
            except Exception as exc:  # as Flower's runtime does: the ClientApp's exception is an error reply
                reply = sent.create_error_reply(Error(code=0, reason=f"{type(exc).__name__}: {exc}"))
            if md.dst_node_id not in lost:
                out.append(reply)
        return out[::-1]  # replies in another order than sent: a strategy must not rely on it


def reply(node: int, arrays, n: int, **records) -> Message:
    """A training reply from ``node`` carrying ``arrays`` and ``num-examples`` = ``n``."""
    from flwr.app import MetricRecord

    meta = Metadata(run_id=7, message_id=f"r{node}", src_node_id=node, dst_node_id=SERVER, reply_to_message_id="",
                    group_id="", created_at=time.time(), ttl=100.0, message_type="train")
    return Message(content=RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": n}), **records}),
                   metadata=meta)
