"""Any redteam defense as a Flower strategy (Flower's message API, ``flwr.serverapp.strategy``).

:class:`DefenseStrategy` is Flower's ``FedAvg`` (its node sampling, configuration and federated
evaluation unchanged) whose training aggregation is a redteam defense:

1. ``configure_train`` keeps the global model it sends (flattened, :mod:`._records`);
2. ``aggregate_train`` flattens each valid reply's model and takes its row
   ``local − global`` (the update form every redteam defense reads: ``(n, d)`` float32),
   sorted by node id so that the decision does not depend on the order replies arrive in;
3. the defense decides on those rows with a :class:`~redteam.types.ServerContext`: the round
   (0-based, so Flower's round 1 is redteam's round 0), the replies' ``num-examples`` as
   ``weights``, the global model, the previous round's aggregate, a seeded generator, and its
   ``state`` from earlier rounds, kept by client (:class:`~redteam.merge.DefenseMemory`): each
   Flower node id gets a small stable client id the first time it replies, so a per-client
   memory (FoolsGold's history) follows the node across rounds in which others drop out;
4. the new global model is ``global + server_lr · aggregate``, unflattened into the global
   model's arrays, shapes and dtypes.

The round's train metrics are Flower's weighted average over the *accepted* replies (as
Flower's Krum averages those it selected), plus ``redteam-accepted`` and ``redteam-rejected``
(counts); :attr:`DefenseStrategy.history` holds every round's decision by node id with the
defense's reasons and degradation notes. A defense that refuses a round (``InvalidParameter``,
e.g. Krum with too few replies) or returns a non-finite aggregate leaves the global model as it
was, as redteam's own server does, and says so in the history and in ``redteam-refused``.

Defenses that need what a Flower server does not give them (server-held data, the model's
functions, replaying clients' work, a commit phase, validator seats, or acting anywhere but
at aggregation) are refused by name when the strategy is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg

from ...errors import InvalidParameter
from ...merge import DefenseMemory, degradation_notes
from ...types import Defense, ServerContext
from ._records import Layout, flatten, layout_of, unflatten

if TYPE_CHECKING:
    from flwr.serverapp import Grid

__all__ = ["DefenseStrategy", "FlowerRound", "build_defense_for_flower"]

log = logging.getLogger(__name__)

#: capability → why a Flower server cannot offer it
_UNSUPPORTED: tuple[tuple[str, str], ...] = (
    ("uses_server_data", "reads server-held root data (ctx.evaluate_loss / ctx.root_update)"),
    ("inspects_models", "reads the clients' models through ctx.model (a ModelView)"),
    ("replays_work", "recomputes clients' training (ctx.replay_work)"),
    ("commit_reveal", "needs a commit phase (ctx.commits)"),
    ("prepares_broadcast", "prepares the model the server sends (Defense.broadcast)"),
)


@dataclass(frozen=True, slots=True)
class FlowerRound:
    """One round of a :class:`DefenseStrategy`: ``accepted`` and ``rejected`` (node id → the
    defense's reason) over the replies it aggregated, the ``client_ids`` it gave the defense for
    those node ids, ``notes`` (what the rule gave up, in its words) and ``refused`` (why the global
    model was kept, or ``None``)."""

    round: int
    nodes: tuple[int, ...]
    client_ids: tuple[int, ...]
    accepted: tuple[int, ...]
    rejected: Mapping[int, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    refused: str | None = None


def build_defense_for_flower(defense: "str | Defense", params: Mapping[str, Any] | None = None,
                             malicious: int | None = None) -> Defense:
    """The defense ``defense`` (a registry name with ``params``, or an instance), checked for what a
    Flower server can give it. ``malicious`` fills the fields a defense takes from the malicious
    count (trimmed mean's ``b``) when they are unset, as a scenario does."""
    if isinstance(defense, str):
        from ...federation.builders import build_defense
        from ...scenario import PluginSpec

        built = build_defense(PluginSpec(defense, dict(params or {})), n_malicious=malicious)
    elif isinstance(defense, Defense):
        if params:
            raise InvalidParameter("DefenseStrategy: params are for a defense given by name; "
                                   f"got an instance ({type(defense).__name__}) and params {dict(params)!r}")
        built = defense
    else:
        raise InvalidParameter(f"DefenseStrategy: defense = {defense!r}: expected a registry name or a "
                               "redteam.Defense instance")
    for part in built.parts():
        unset = [f for f in part.from_malicious_count if getattr(part, f, None) is None]
        if unset and malicious is None:
            raise InvalidParameter(f"DefenseStrategy: {type(part).__name__}.{unset[0]} is unset; give it, or "
                                   f"malicious=f, the count it is derived from (as a scenario derives it)")
        for cap, why in _UNSUPPORTED:
            if getattr(part, cap, False):
                raise InvalidParameter(f"DefenseStrategy: defense {type(part).__name__} {why}, which a Flower "
                                       f"server does not offer ({cap} = True)")
        if part.acts_at != "aggregate":
            raise InvalidParameter(f"DefenseStrategy: defense {type(part).__name__} acts at {part.acts_at!r}; "
                                   "a Flower strategy aggregates (acts_at = 'aggregate')")
        if part.validators:
            raise InvalidParameter(f"DefenseStrategy: defense {type(part).__name__} is a consensus of "
                                   f"{part.validators} validators, which a Flower server does not run")
    return built


class DefenseStrategy(FedAvg):
    """Flower's ``FedAvg`` whose training aggregation is redteam defense ``defense``.

    ``defense``: a registry name (``"trimmed_mean"``) with ``params``, or a
    :class:`~redteam.types.Defense` instance; ``malicious``: the count that fills the defense's
    unset ``from_malicious_count`` fields; ``seed``: the defense's random stream;
    ``server_lr``: the server step on the aggregate (1.0: the aggregate is the step). Every other
    keyword goes to Flower's ``FedAvg`` (``fraction_train``, ``min_train_nodes``,
    ``weighted_by_key`` …)."""

    def __init__(self, defense: "str | Defense", params: Mapping[str, Any] | None = None, *,
                 malicious: int | None = None, seed: int = 0, server_lr: float = 1.0, **fedavg: Any) -> None:
        super().__init__(**fedavg)
        if not (isinstance(server_lr, (int, float)) and not isinstance(server_lr, bool) and server_lr > 0):
            raise InvalidParameter(f"DefenseStrategy: server_lr = {server_lr!r}: must be a number > 0")
        self.defense = build_defense_for_flower(defense, params, malicious)
        self.server_lr = float(server_lr)
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.memory = DefenseMemory(regrouped=False)
        self.history: list[FlowerRound] = []
        self._ids: dict[int, int] = {}  # Flower node id → the client id the defense sees
        self._sent: dict[int, tuple[torch.Tensor, Layout]] = {}  # round → (global row, its layout)
        self._previous: torch.Tensor | None = None

    def summary(self) -> None:
        log.info("redteam defense: %r (server_lr %s, seed %d)", self.defense, self.server_lr, self.seed)
        super().summary()

    def client_id(self, node_id: int) -> int:
        """The stable client id the defense knows node ``node_id`` by (assigned on first reply)."""
        return self._ids.setdefault(int(node_id), len(self._ids))

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: "Grid") -> Iterable[Message]:
        layout = layout_of(arrays)
        self._sent = {server_round: (flatten(arrays, layout, who="the global model"), layout)}
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid, _ = self._check_and_log_replies(replies, is_train=True)
        if not valid:
            return None, None
        if server_round not in self._sent:
            raise InvalidParameter(f"DefenseStrategy: aggregate_train for round {server_round}, but the strategy "
                                   "configured no such round (configure_train keeps the model it sends)")
        g, layout = self._sent[server_round]
        valid = sorted(valid, key=lambda m: int(m.metadata.src_node_id))
        nodes = tuple(int(m.metadata.src_node_id) for m in valid)
        rows = torch.stack([flatten(_arrays(m), layout, who=f"node {node}") - g for m, node in zip(valid, nodes)])
        weights = torch.tensor([float(_metrics(m)[self.weighted_by_key]) for m in valid], dtype=torch.float32)
        ids = tuple(self.client_id(node) for node in nodes)
        ctx = ServerContext(round=server_round - 1, n_clients=len(nodes), weights=weights, global_params=g,
                            previous_update=self._previous, generator=self.generator,
                            state=self.memory.start("0.0", list(ids)), client_ids=ids)
        try:
            dec = self.defense(rows, ctx)
        except InvalidParameter as exc:  # the rule cannot run on this round: keep the model
            return self._keep(server_round, nodes, ids, str(exc), valid)
        self.memory.record({"0.0": dict(dec.state)}, [list(ids)])
        acc = [bool(a) for a in dec.accepted.tolist()]
        notes = tuple(degradation_notes(self.defense, dec.state, dec.accepted.to(torch.bool))) if dec.state else ()
        rejected = {node: str(dec.reasons.get(i, f"rejected by {type(self.defense).__name__}"))
                    for i, (node, ok) in enumerate(zip(nodes, acc)) if not ok}
        agg = dec.aggregate.to(torch.float32)
        if not bool(torch.isfinite(agg).all()):
            return self._keep(server_round, nodes, ids, "non-finite aggregate", valid, acc, rejected)
        self._previous = agg.clone()
        self.history.append(FlowerRound(server_round, nodes, ids, tuple(n for n, ok in zip(nodes, acc) if ok),
                                        rejected, notes))
        new = g + self.server_lr * agg
        kept = [m.content for m, ok in zip(valid, acc) if ok] or [m.content for m in valid]
        metrics = self.train_metrics_aggr_fn(kept, self.weighted_by_key)
        metrics["redteam-accepted"] = sum(acc)
        metrics["redteam-rejected"] = len(acc) - sum(acc)
        metrics["redteam-refused"] = 0
        return unflatten(new, layout), metrics

    def _keep(self, server_round: int, nodes: tuple[int, ...], ids: tuple[int, ...], why: str,
              valid: list[Message], acc: list[bool] | None = None, rejected: Mapping[int, str] | None = None
              ) -> tuple[None, MetricRecord]:
        log.warning("DefenseStrategy round %d: the global model is kept: %s", server_round, why)
        decided = acc is not None  # the rule decided (a non-finite aggregate), or refused to
        acc = acc if acc is not None else [False] * len(nodes)
        self.history.append(FlowerRound(server_round, nodes, ids, tuple(n for n, ok in zip(nodes, acc) if ok),
                                        dict(rejected or {}), refused=why))
        metrics = self.train_metrics_aggr_fn([m.content for m in valid], self.weighted_by_key)
        metrics["redteam-accepted"] = sum(acc)
        metrics["redteam-rejected"] = len(acc) - sum(acc) if decided else 0
        metrics["redteam-refused"] = 1
        return None, metrics


def _arrays(msg: Message) -> ArrayRecord:
    return next(iter(msg.content.array_records.values()))


def _metrics(msg: Message) -> MetricRecord:
    return next(iter(msg.content.metric_records.values()))
