"""Any redteam update or data attack inside a Flower app.

**On the clients: :class:`AttackMod`**, a Flower client mod (``ClientApp(mods=[AttackMod(...)])``).
Clients are chosen by their ``partition-id`` (the node config Flower's simulation gives every
node; set it with ``--node-config`` on a deployed SuperNode). On a chosen client's training
message it

* makes the attack active while the ClientApp trains, so that :func:`poison` (one line in the
  ClientApp's data loading) returns the attack's poisoned training set (``Surface.DATA``:
  label flipping, backdoor triggers);
* after training, replaces the reply's model with ``global + crafted`` where ``crafted`` is the
  attack's ``craft_updates`` on the client's own update ``local − global`` (``Surface.UPDATES``),
  in the same flat float32 form redteam's own runs use.

One client sees only its own update, so an attack that crafts from every honest update of the
round (``omniscient``, such as ALIE) cannot run in a mod alone: :class:`AttackMod` refuses it by
name unless ``colluding=True``.

**In a simulation: :class:`ColludingAttack`**, a wrapper around any Flower strategy (ours or
Flower's own). The server process of a simulation holds every reply of the round, so it can
stand in for colluding attackers who pool what they see, as redteam's own engine does: before
the wrapped strategy aggregates, it replaces the chosen clients' replies with the attack's rows
crafted from all of them (the honest rows as ``visible_updates`` for an omniscient attack). The
clients then run ``AttackMod(..., colluding=True)``, which tags each reply with its
``partition-id`` (a ``ConfigRecord`` under ``"redteam"``; Flower's strategies read only the
reply's one ArrayRecord and one MetricRecord) and applies data attacks, leaving updates to the
server-side stand-in. This is a simulation device: in a real deployment no server-side party
holds the attackers' pooled view.

Attacks that act elsewhere (transport, provenance, their own local training, hierarchies,
pipelines, gossip, asynchrony), that read the server's defense (``adaptive``) or the model's
functions (``needs_model``) are refused by name.
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord
from flwr.serverapp.strategy import Strategy

from ...errors import InvalidParameter
from ...types import Attack, AttackContext, ClientData, Surface
from ._records import flatten, layout_of, unflatten

__all__ = ["AttackMod", "ColludingAttack", "poison", "build_attack_for_flower"]

log = logging.getLogger(__name__)

#: the tag a colluding client's reply carries, and the flag ColludingAttack puts in the train config
TAG = "redteam"
FLAG = "redteam-colluding"

#: (attack, partition id, seed) while a chosen client's ClientApp trains (read by :func:`poison`)
_ACTIVE: contextvars.ContextVar[tuple[Attack, int, int] | None] = contextvars.ContextVar("redteam_attack",
                                                                                        default=None)


def build_attack_for_flower(attack: "str | Attack", params: Mapping[str, Any] | None, who: str) -> Attack:
    """The attack (a registry name with ``params``, or an instance), refused by name where it acts on
    something a Flower app does not expose."""
    if isinstance(attack, str):
        from ...registry import ATTACKS

        built = ATTACKS.create(attack, dict(params or {}), where=f"{who}:")
    elif isinstance(attack, Attack):
        if params:
            raise InvalidParameter(f"{who}: params are for an attack given by name; got an instance "
                                   f"({type(attack).__name__}) and params {dict(params)!r}")
        built = attack
    else:
        raise InvalidParameter(f"{who}: attack = {attack!r}: expected a registry name or a redteam.Attack instance")
    if not isinstance(built, Attack):
        raise InvalidParameter(f"{who}: {attack!r} is not a redteam.Attack (got {type(built).__name__})")
    name = attack if isinstance(attack, str) else type(built).__name__
    other = [s for s in built.surfaces if s not in (Surface.UPDATES, Surface.DATA)]
    if other:
        raise InvalidParameter(f"{who}: attack {name!r} acts on {', '.join(other)}; in a Flower app redteam applies "
                               "update and data attacks only (surfaces 'updates', 'data')")
    for cap, why in (("adaptive", "reads the server's defense"), ("needs_model", "reads the model's functions")):
        if getattr(built, cap, False):
            raise InvalidParameter(f"{who}: attack {name!r} {why} ({cap} = True), which a Flower client is not given")
    return built


def _partitions(malicious: Iterable[int], who: str) -> frozenset[int]:
    try:
        out = frozenset(int(p) for p in malicious)
    except (TypeError, ValueError):
        raise InvalidParameter(f"{who}: malicious = {malicious!r}: expected partition ids (integers)") from None
    if any(p < 0 for p in out):
        raise InvalidParameter(f"{who}: malicious = {sorted(out)}: partition ids are ≥ 0")
    return out


def _generator(seed: int, *parts: int) -> torch.Generator:
    """A generator seeded from ``seed`` and ``parts`` (a partition, a round): a stream of its own."""
    mixed = np.random.SeedSequence([int(seed), *[int(p) for p in parts]]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed) & 0x7FFF_FFFF_FFFF_FFFF)


@dataclass(frozen=True, slots=True)
class AttackMod:
    """A Flower client mod applying redteam attack ``attack`` on the clients whose ``partition-id``
    is in ``malicious`` (module docstring). ``params``: the attack's parameters when it is given by
    name; ``seed``: the attack's random streams (one per client and round); ``colluding``: leave
    the update to a server-side :class:`ColludingAttack` (required for omniscient attacks)."""

    attack: "str | Attack"
    params: Mapping[str, Any] = field(default_factory=dict)
    malicious: Iterable[int] = ()
    seed: int = 0
    colluding: bool = False
    built: Attack = field(init=False, repr=False, compare=False)
    chosen: frozenset[int] = field(init=False, repr=False, compare=False)
    #: the attack's memory per partition (its ``attack_state``), in the process the client runs in
    memory: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        built = build_attack_for_flower(self.attack, self.params, "AttackMod")
        name = self.attack if isinstance(self.attack, str) else type(built).__name__
        if Surface.UPDATES in built.surfaces and built.omniscient and not self.colluding:
            raise InvalidParameter(
                f"AttackMod: attack {name!r} is omniscient (it crafts from every honest update of the round), "
                "and one Flower client sees only its own; in a simulation, pass colluding=True and wrap the "
                "server's strategy in ColludingAttack(...), which crafts the chosen clients' updates from all "
                "the round's replies")
        object.__setattr__(self, "built", built)
        object.__setattr__(self, "chosen", _partitions(self.malicious, "AttackMod"))

    def __call__(self, msg: Message, ctxt: Context, call_next: Any) -> Message:
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, ctxt)
        if "partition-id" not in ctxt.node_config:
            raise InvalidParameter("AttackMod: the node has no 'partition-id' in its node config, which chooses the "
                                   "attacked clients (Flower's simulation sets it; a SuperNode takes --node-config)")
        pid = int(ctxt.node_config["partition-id"])
        config = next(iter(msg.content.config_records.values()), ConfigRecord())
        rnd = int(config.get("server-round", 1))
        if self.colluding and not config.get(FLAG, False):
            raise InvalidParameter("AttackMod(colluding=True): the training message carries no "
                                   f"{FLAG!r} flag: wrap the server's strategy in ColludingAttack(...)")
        chosen = pid in self.chosen
        token = _ACTIVE.set((self.built, pid, self.seed) if chosen and Surface.DATA in self.built.surfaces else None)
        try:
            reply = call_next(msg, ctxt)
        finally:
            _ACTIVE.reset(token)
        if reply.has_error():
            return reply
        if self.colluding:
            reply.content[TAG] = ConfigRecord({"partition-id": pid})
        elif chosen and Surface.UPDATES in self.built.surfaces:
            self._craft(msg, reply, pid, rnd, ctxt)
        return reply

    def _craft(self, msg: Message, reply: Message, pid: int, rnd: int, ctxt: Context) -> None:
        sent = next(iter(msg.content.array_records.values()))
        layout = layout_of(sent)
        g = flatten(sent, layout, who="the global model")
        key, local = next(iter(reply.content.array_records.items()))
        own = (flatten(local, layout, who=f"partition {pid}'s reply") - g).unsqueeze(0)
        metrics = next(iter(reply.content.metric_records.values()), MetricRecord())
        weight = float(metrics.get("num-examples", 1.0))
        ctx = AttackContext(round=rnd - 1, n_clients=int(ctxt.node_config.get("num-partitions", 1)),
                            malicious=(pid,), malicious_rows=(0,), own_updates=own, visible_updates=own,
                            global_params=g, generator=_generator(self.seed, pid, rnd),
                            weights=torch.tensor([weight]), attack_state=self.memory.setdefault(pid, {}),
                            visible_clients=(pid,))
        crafted = self.built.craft_updates(ctx)
        if tuple(crafted.shape) != tuple(own.shape):
            raise InvalidParameter(f"AttackMod: craft_updates returned shape {tuple(crafted.shape)}, "
                                   f"expected {tuple(own.shape)}")
        reply.content[key] = unflatten(g + crafted[0].to(torch.float32), layout)


def poison(context: Context, x: Any, y: Any) -> tuple[Any, Any]:
    """The training set ``(x, y)`` a ClientApp should train on: the active data attack's poisoned set
    when this node is a chosen client of an :class:`AttackMod`, else ``(x, y)`` unchanged. Call it
    in the ClientApp's training, on the data it loaded; numpy arrays come back as numpy arrays,
    tensors as tensors. The poisoned set is drawn from a stream of the mod's seed and the partition,
    so it is the same in every round."""
    active = _ACTIVE.get()
    if active is None:
        return x, y
    attack, pid, seed = active
    as_numpy = isinstance(x, np.ndarray)
    tx, ty = (torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(y))) if as_numpy else (x, y)
    out = attack.poison_data(ClientData(tx, ty), pid, _generator(seed, pid))
    if as_numpy:
        return out.x.numpy(), out.y.numpy()
    return out.x, out.y


class ColludingAttack(Strategy):
    """Flower strategy ``inner`` whose training replies from the clients in ``malicious`` (partition
    ids) are replaced, before ``inner`` aggregates them, by redteam attack ``attack``'s rows crafted
    from every reply of the round (module docstring). The clients must run
    ``AttackMod(..., colluding=True)``. ``history`` lists, per round, the partitions whose replies
    were replaced."""

    def __init__(self, inner: Strategy, attack: "str | Attack", params: Mapping[str, Any] | None = None, *,
                 malicious: Iterable[int] = (), seed: int = 0, weighted_by_key: str | None = None) -> None:
        if not isinstance(inner, Strategy):
            raise InvalidParameter(f"ColludingAttack: inner = {inner!r}: expected a flwr.serverapp.strategy.Strategy")
        self.inner = inner
        self.attack = build_attack_for_flower(attack, params, "ColludingAttack")
        self.malicious = _partitions(malicious, "ColludingAttack")
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.weighted_by_key = weighted_by_key or getattr(inner, "weighted_by_key", "num-examples")
        self.attack_state: dict[str, Any] = {}
        self.history: list[tuple[int, tuple[int, ...]]] = []
        self._global: tuple[int, torch.Tensor, Any] | None = None
        self._previous: torch.Tensor | None = None

    def summary(self) -> None:
        log.info("redteam colluding attack: %r on partitions %s (seed %d)", self.attack, sorted(self.malicious),
                 self.seed)
        self.inner.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
                        ) -> Iterable[Message]:
        layout = layout_of(arrays)
        self._global = (server_round, flatten(arrays, layout, who="the global model"), layout)
        messages = list(self.inner.configure_train(server_round, arrays, config, grid))
        for m in messages:
            for rec in m.content.config_records.values():
                rec[FLAG] = True
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        if self._global is None or self._global[0] != server_round:
            raise InvalidParameter(f"ColludingAttack: aggregate_train for round {server_round} before its "
                                   "configure_train")
        _, g, layout = self._global
        valid = [m for m in replies if not m.has_error()]
        pids = [self._partition(m) for m in valid]
        order = sorted(range(len(valid)), key=lambda i: pids[i])
        valid, pids = [valid[i] for i in order], [pids[i] for i in order]
        mal = [i for i, p in enumerate(pids) if p in self.malicious]
        if mal and Surface.UPDATES in self.attack.surfaces:
            self._replace(server_round, valid, pids, mal, g, layout)
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        if arrays is not None:
            self._previous = flatten(arrays, layout, who="the aggregate") - g
        return arrays, metrics

    def _partition(self, msg: Message) -> int:
        tag = msg.content.config_records.get(TAG) if TAG in msg.content.config_records else None
        if tag is None or "partition-id" not in tag:
            raise InvalidParameter(f"ColludingAttack: the reply of node {msg.metadata.src_node_id} carries no "
                                   f"{TAG!r} partition tag: add AttackMod(..., colluding=True) to the ClientApp's mods")
        return int(tag["partition-id"])

    def _replace(self, server_round: int, valid: list[Message], pids: list[int], mal: list[int],
                 g: torch.Tensor, layout: Any) -> None:
        rows = torch.stack([flatten(next(iter(m.content.array_records.values())), layout,
                                    who=f"partition {p}") - g for m, p in zip(valid, pids)])
        weights = torch.tensor([float(next(iter(m.content.metric_records.values()))[self.weighted_by_key])
                                for m in valid], dtype=torch.float32)
        honest = [i for i in range(len(valid)) if i not in mal]
        omni = bool(self.attack.omniscient) and bool(honest)
        shown = honest if omni else mal
        ctx = AttackContext(round=server_round - 1, n_clients=len(valid), malicious=tuple(pids[i] for i in mal),
                            malicious_rows=tuple(mal), own_updates=rows[mal], visible_updates=rows[shown],
                            global_params=g, generator=self.generator, weights=weights,
                            previous_update=self._previous, attack_state=self.attack_state,
                            visible_clients=tuple(pids[i] for i in shown))
        crafted = self.attack.craft_updates(ctx)
        if tuple(crafted.shape) != (len(mal), rows.shape[1]):
            raise InvalidParameter(f"ColludingAttack: craft_updates returned shape {tuple(crafted.shape)}, "
                                   f"expected {(len(mal), rows.shape[1])}")
        for j, i in enumerate(mal):
            key = next(iter(valid[i].content.array_records))
            valid[i].content[key] = unflatten(g + crafted[j].to(torch.float32), layout)
        self.history.append((server_round, tuple(pids[i] for i in mal)))

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
                           ) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)
