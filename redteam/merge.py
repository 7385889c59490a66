"""Hierarchical merge: groups of clients → sub-aggregators → … → root.

Clients are assigned to ``fan_out ** (depth − 1)`` bottom groups. Each bottom group runs
the scenario's defense on its members' updates and passes up a sub-aggregate weighted by
the sample counts it accepted; each level above combines up to ``fan_out`` children with
the upper defense (mean by default), until one root aggregate remains. With depth 1 the
merge is flat: the defense sees every update at once.

With the (sample-weighted) mean at every level, a group of total weight W_g passes
up Σ_{i∈g} wᵢxᵢ / W_g with weight W_g, so the root computes exactly the flat FedAvg
Σ wᵢxᵢ / Σ wᵢ (up to float rounding).

Grouping (``grouping``):

* ``random``: a fresh random assignment every round (from the round's generator);
* ``region``: contiguous blocks of client ids (clients of one region share a
  sub-aggregator), fixed across rounds;
* ``hash``: group = SHA-256(identity) mod groups, the identity being the client's
  public name (its id in decimal unless ``identities`` says otherwise) — fixed and
  *predictable*, which is exactly what an identity-grinding attacker exploits
  (``group_grinding`` in :mod:`attacks.hierarchy`).

Sub-aggregators. The leader of a bottom group — the member that computes and passes up
its partial aggregate — is the member with the lowest client id. A compromised leader
can replace that partial aggregate (``rogue_aggregator`` in :mod:`attacks.hierarchy`);
``hierarchical_merge`` models this with its ``tamper_group`` hook, applied to each bottom
group's aggregate before it passes up (only when there is more than one group: a flat
merge is the server's own).

Non-finite sub-aggregates. A node whose aggregate (as passed up, after any tampering)
has a NaN or ±Inf entry is refused: it passes nothing up, and ``MergeResult.refused``
records it (node key → reason and the client ids below it). The clients' ``accepted``
flags are left as their defense decided: the refusal is the merge's, not the defense's.

Defense memory across rounds (:class:`DefenseMemory`). A stateful defense's state belongs
to the clients it describes, not to the merge node that happened to hold them:

* per-client parts — a state with an ``"ids"`` list (client ids), whose matrices (tensors
  of ≥ 2 dimensions) and lists of that length are one row per client, like FoolsGold's
  history — are rebuilt
  for every bottom node from its members: each member's row comes from the state of the
  node that member was last merged in (churned-out clients keep theirs); a state that
  lists its per-client keys under ``"per_client"`` has exactly those gathered (dicts
  among them are keyed by client id), so a node-level matrix that happens to have one
  row per id (FLDetector's L-BFGS history) is never mistaken for per-client rows;
* node-level parts (centered clipping's previous aggregate) stay with the node key when
  the grouping is fixed across rounds (flat, ``region``, ``hash``: today's behaviour);
  with ``random`` grouping they are rebuilt from the members: a tensor is the mean, over
  the node's members, of the tensor of the node each member was last in; anything else
  is taken from the lowest-id member's last node. Pipelines (stage states under
  ``"0"``, ``"1"`` …) are handled stage by stage. Upper levels keep their node keys.

Degradation notes (:func:`degradation_notes`). A robust rule that a round thinned by
churn or screening cannot run as configured goes on with what it can do and says so in
its ``Decision.state``; the rule words that state itself (its ``degradation(state, n)``
method, or ``state["degraded"]``), and the merge collects one line each, naming the rule
and the node, in ``MergeResult.notes`` (the round record's ``defense_notes``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np
import torch

from .errors import InvalidParameter
from .types import Decision, Defense, ServerContext

__all__ = ["Hierarchy", "MergeResult", "DefenseMemory", "assign_groups", "degradation_notes",
           "group_of_identity", "hierarchical_merge"]


@dataclass(frozen=True, slots=True)
class Hierarchy:
    fan_out: int = 4
    depth: int = 1
    grouping: Literal["random", "region", "hash"] = "random"

    def __post_init__(self) -> None:
        if not (isinstance(self.fan_out, int) and self.fan_out >= 2):
            raise InvalidParameter(f"Hierarchy.fan_out = {self.fan_out!r}: must be an integer ≥ 2")
        if not (isinstance(self.depth, int) and 1 <= self.depth <= 8):
            raise InvalidParameter(f"Hierarchy.depth = {self.depth!r}: must be an integer in [1, 8]")
        if self.grouping not in ("random", "region", "hash"):
            raise InvalidParameter(
                f"Hierarchy.grouping = {self.grouping!r}: must be 'random', 'region' or 'hash'"
            )

    @property
    def n_groups(self) -> int:
        return self.fan_out ** (self.depth - 1)


@dataclass(slots=True)
class MergeResult:
    aggregate: torch.Tensor
    accepted: torch.Tensor  # (m,) over the rows given
    reasons: dict[int, str] = field(default_factory=dict)  # row → why rejected
    groups: list[list[int]] = field(default_factory=list)  # bottom groups, as row positions
    state: dict[str, dict] = field(default_factory=dict)
    refused: dict[str, dict[str, Any]] = field(default_factory=dict)  # node key → reason, rows
    notes: list[str] = field(default_factory=list)  # what a defense gave up, one line each


def _finite(x: torch.Tensor) -> bool:
    return bool(torch.isfinite(x).all())


def _label(defense: Any) -> str:
    """The registry name a defense was built from (``trimmed_mean``); its class name otherwise."""
    from .registry import DEFENSES

    cls = type(defense)
    for table in (getattr(DEFENSES, "_extra", {}), getattr(DEFENSES, "_loaded", {})):
        for name, c in table.items():
            if c is cls:
                return str(name)
    target = f"{cls.__module__}:{cls.__qualname__}"  # built directly: its entry point, found without loading any
    names = sorted(n for n, ep in DEFENSES._entry_points().items() if ep.value == target)
    return names[0] if names else cls.__name__


def _flag_note(defense: Any, state: Mapping[str, Any], accepted: torch.Tensor | int) -> str | None:
    """The one-line note of a degraded decision; ``None`` if it ran as configured.

    ``state["degraded"]`` (a rule's own words), else the rule's ``degradation(state,
    n_accepted)`` method, which the built-in rules that go on through thinned rounds
    define (trimmed mean, RLR, DnC: see their docstrings)."""
    note = state.get("degraded")
    if isinstance(note, str) and note:
        return note
    if not isinstance(defense, Defense):  # a bare callable (tests): it declares nothing
        return None
    n = int(accepted) if isinstance(accepted, int) else int(accepted.sum())
    return defense.degradation(state, n)


def degradation_notes(defense: Any, state: Mapping[str, Any], accepted: torch.Tensor | int,
                      where: str = "") -> list[str]:
    """One line per rule (a pipeline's stages each) whose ``state`` says it could not run as
    configured: ``"trimmed_mean: b reduced from 2 to 1 (3 updates)"``. ``accepted`` is the
    node's accepted mask (or its count); ``where`` names the node (empty for a flat merge)."""
    stages = defense.stages if isinstance(defense, Defense) else ()
    if isinstance(stages, tuple) and stages and any(isinstance(state.get(str(i)), Mapping)
                                                    for i in range(len(stages))):
        out: list[str] = []
        for i, st in enumerate(stages):
            sub = state.get(str(i))
            if isinstance(sub, Mapping):
                inner = f"pipeline stage {i}" + (f", {where}" if where else "")
                out.extend(degradation_notes(st, sub, accepted, inner))
        return out
    note = _flag_note(defense, state, accepted)
    if note is None:
        return []
    return [f"{_label(defense)}{f' ({where})' if where else ''}: {note}"]


def group_of_identity(identity: str, n_groups: int) -> int:
    """The bottom group of ``identity`` under ``grouping="hash"``: SHA-256(identity) mod groups
    (the first 8 bytes of the digest, big-endian)."""
    return int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "big") % n_groups


def assign_groups(
    client_ids: list[int], n_total: int, hierarchy: Hierarchy, rng: np.random.Generator,
    identities: Mapping[int, str] | None = None,
) -> list[list[int]]:
    """Bottom groups as lists of *positions* into ``client_ids`` (empty groups dropped).

    ``identities`` (client id → public name) is what ``grouping="hash"`` hashes; clients
    not in it are named by their id.
    """
    m = len(client_ids)
    g = min(hierarchy.n_groups, max(m, 1))
    if g <= 1:
        return [list(range(m))] if m else []
    if hierarchy.grouping == "random":
        labels = np.empty(m, dtype=np.int64)
        labels[rng.permutation(m)] = np.arange(m) % g
    elif hierarchy.grouping == "region":
        labels = np.array([cid * g // max(n_total, 1) for cid in client_ids], dtype=np.int64)
    else:  # hash
        names = identities or {}
        labels = np.array([group_of_identity(names.get(cid, str(cid)), g) for cid in client_ids], dtype=np.int64)
    groups = [np.flatnonzero(labels == k).tolist() for k in range(g)]
    return [grp for grp in groups if grp]


def hierarchical_merge(
    updates: torch.Tensor,
    weights: torch.Tensor,
    groups: list[list[int]],
    defense: Defense,
    upper: Defense,
    fan_out: int,
    make_ctx: Callable[[torch.Tensor, list[int], str], ServerContext],
    tamper_group: Callable[[int, list[int], torch.Tensor], torch.Tensor] | None = None,
) -> MergeResult:
    """Merge ``updates`` (``(m, d)``) up the tree described by ``groups`` and ``fan_out``.

    ``make_ctx(weights, rows, key)`` builds the server context of one node (``rows`` are
    the positions it covers at the bottom level, ``key`` names the node for its state).
    ``tamper_group(group index, rows, aggregate) -> aggregate`` is what each bottom
    group's leader passes up instead of its honest aggregate (a compromised
    sub-aggregator); it is not called for a flat merge.
    """
    m = updates.shape[0]
    accepted = torch.zeros(m, dtype=torch.bool, device=updates.device)
    reasons: dict[int, str] = {}
    state: dict[str, dict] = {}
    refused: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    if m == 0:
        return MergeResult(torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device),
                           accepted, reasons, groups, state)

    # bottom level
    nodes: list[tuple[torch.Tensor, torch.Tensor, list[int]]] = []  # (aggregate, weight, rows)
    for gi, rows in enumerate(groups):
        idx = torch.tensor(rows, dtype=torch.long, device=updates.device)
        w = weights[idx]
        key = f"0.{gi}"
        dec: Decision = defense(updates[idx], make_ctx(w, rows, key))
        state[key] = dict(dec.state)
        acc = dec.accepted.to(torch.bool)
        if state[key]:
            notes.extend(degradation_notes(defense, state[key], acc, f"group {gi}" if len(groups) > 1 else ""))
        accepted[idx[acc]] = True
        for local, why in dec.reasons.items():
            reasons[rows[local]] = why
        for local in (~acc).nonzero().flatten().tolist():
            reasons.setdefault(rows[local], f"rejected by {type(defense).__name__}")
        total = (w * acc.to(w.dtype)).sum()
        if len(groups) == 1:
            return MergeResult(dec.aggregate, accepted, reasons, groups, state, notes=notes)
        agg = dec.aggregate
        if tamper_group is not None:
            agg = tamper_group(gi, list(rows), agg)
            if not isinstance(agg, torch.Tensor) or tuple(agg.shape) != tuple(dec.aggregate.shape):
                raise InvalidParameter(
                    f"tamper_group returned {tuple(getattr(agg, 'shape', ()))} for group {gi}, "
                    f"expected {tuple(dec.aggregate.shape)}"
                )
            agg = agg.to(dtype=dec.aggregate.dtype, device=dec.aggregate.device)
        if bool(acc.any()):
            if _finite(agg):
                nodes.append((agg, total, rows))
            else:
                refused[key] = {"reason": "non-finite sub-aggregate", "rows": list(rows)}

    # upper levels
    level = 1
    while len(nodes) > 1:
        parents: list[tuple[torch.Tensor, torch.Tensor, list[int]]] = []
        for pi in range(0, len(nodes), fan_out):
            children = nodes[pi : pi + fan_out]
            aggs = torch.stack([c[0] for c in children])
            cw = torch.stack([c[1] for c in children]).to(updates.dtype)
            rows = [r for c in children for r in c[2]]
            key = f"{level}.{pi // fan_out}"
            dec = upper(aggs, make_ctx(cw, rows, key))
            state[key] = dict(dec.state)
            if state[key]:
                notes.extend(degradation_notes(upper, state[key], dec.accepted.to(torch.bool),
                                               f"merge level {level}, node {pi // fan_out}"))
            kept_rows: list[int] = []
            for ci, child in enumerate(children):
                if bool(dec.accepted[ci]):
                    kept_rows.extend(child[2])
                else:
                    for r in child[2]:
                        if accepted[r]:
                            accepted[r] = False
                            reasons[r] = f"its group was rejected at merge level {level}: " + dec.reasons.get(
                                ci, type(upper).__name__
                            )
            total = (cw * dec.accepted.to(cw.dtype)).sum()
            if kept_rows and not _finite(dec.aggregate) and len(nodes) > fan_out:
                refused[key] = {"reason": "non-finite sub-aggregate", "rows": kept_rows}
            elif kept_rows:
                parents.append((dec.aggregate, total, kept_rows))
        nodes = parents
        level += 1
    if not nodes:
        return MergeResult(torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device),
                           accepted, reasons, groups, state, refused, notes)
    return MergeResult(nodes[0][0], accepted, reasons, groups, state, refused, notes)


class DefenseMemory:
    """The defenses' state across rounds, kept by client id (rules in the module docstring)."""

    def __init__(self, regrouped: bool) -> None:
        self.regrouped = regrouped
        self.by_node: dict[str, dict] = {}
        self.by_client: dict[int, dict] = {}

    def start(self, key: str, members: list[int]) -> dict:
        """The state node ``key`` starts from, given its members' client ids (bottom) or none (upper)."""
        if not key.startswith("0.") or not members:
            return self.by_node.get(key, {})
        own = self.by_node.get(key, {})
        known = [c for c in sorted(set(members)) if c in self.by_client]
        if not known:
            return {} if self.regrouped else own
        return _rebuild(own, [self.by_client[c] for c in known], known, self.regrouped)

    def record(self, state: Mapping[str, dict], groups: list[list[int]]) -> None:
        """After a round: node states, and for every client the bottom node it was merged in."""
        self.by_node = dict(state)
        seen: set[int] = set()
        for gi, members in enumerate(groups):
            st = state.get(f"0.{gi}")
            if st is None:
                continue
            for c in members:
                if c not in seen:
                    seen.add(c)
                    self.by_client[c] = st


def _per_client(state: Mapping[str, Any]) -> int | None:
    ids = state.get("ids")
    return len(ids) if isinstance(ids, list) else None


def _rebuild(own: Mapping[str, Any], member_states: list[Mapping[str, Any]], members: list[int],
             regrouped: bool) -> dict:
    """One node's starting state from its own last state and its members' last node states."""
    base: Mapping[str, Any] = member_states[0] if regrouped else own
    if not regrouped and not any(_per_client(s) for s in member_states) \
            and not any(isinstance(v, Mapping) for v in own.values()):
        return dict(own)
    out: dict[str, Any] = {}
    k_ids = [_per_client(s) for s in member_states]
    keys = set(base)
    for s in member_states:
        keys |= set(s)
    for key in sorted(keys):
        subs = [s.get(key) for s in member_states]
        if key.isdigit() and any(isinstance(v, Mapping) for v in subs + [own.get(key)]):
            mine = own.get(key) if isinstance(own.get(key), Mapping) else {}
            out[key] = _rebuild(mine, [v if isinstance(v, Mapping) else {} for v in subs], members, regrouped)
            continue
        per_client = [isinstance(s, Mapping) and _is_per_client(s, key) for s in member_states]
        if key == "ids" or any(per_client):
            continue  # gathered below
        if not regrouped:
            if key in own:
                out[key] = own[key]
            continue
        tensors = [v for v in subs if isinstance(v, torch.Tensor)]
        if tensors and len(tensors) == len(subs) and all(t.shape == tensors[0].shape for t in tensors):
            if all(t is tensors[0] for t in tensors):
                out[key] = tensors[0]
            else:
                out[key] = torch.stack([t.to(torch.float64) for t in tensors]).mean(0).to(tensors[0].dtype)
        else:
            out[key] = next(v for v in subs if v is not None) if any(v is not None for v in subs) else None
    if any(k is not None for k in k_ids):
        _gather_rows(out, member_states, members)
    return out


def _declared(state: Mapping[str, Any]) -> set[str] | None:
    """The per-client keys a state names under ``"per_client"`` (None: not declared)."""
    names = state.get("per_client")
    return {str(v) for v in names} if isinstance(names, (list, tuple)) else None


def _is_per_client(state: Mapping[str, Any], key: str) -> bool:
    """Whether ``state[key]`` is per client: named in ``"per_client"`` when the state
    declares its keys (a node-level matrix may have as many rows as there are ids),
    else a matrix or list with one entry per id."""
    k = _per_client(state)
    if k is None:
        return False
    names = _declared(state)
    return key in names and key in state if names is not None else _rows_of(state.get(key), k)


def _rows_of(value: Any, k: int) -> bool:
    if isinstance(value, torch.Tensor):  # a (k, …) matrix; a 1-D tensor is a node-level vector
        return value.ndim >= 2 and int(value.shape[0]) == k
    return isinstance(value, list) and len(value) == k


def _gather_rows(out: dict[str, Any], member_states: list[Mapping[str, Any]], members: list[int]) -> None:
    """Per-client rows of each member, taken from the state of the node it was last in."""
    ids: list[int] = []
    picks: list[tuple[Mapping[str, Any], int]] = []
    for c, s in zip(members, member_states):
        held = s.get("ids")
        if isinstance(held, list) and c in held:
            ids.append(c)
            picks.append((s, held.index(c)))
    out["ids"] = ids
    if not picks:
        return
    names = {key for s, _ in picks for key in s if key != "ids" and _is_per_client(s, key)}
    for key in sorted(names):
        if all(isinstance(s.get(key), Mapping) for s, _ in picks if key in s):  # keyed by client id
            out[key] = {c: s[key][c] for c, s in zip(members, member_states)
                        if isinstance(s.get(key), Mapping) and c in s[key]}
            continue
        rows = [s[key][j] for s, j in picks if _is_per_client(s, key)]
        if len(rows) != len(picks):
            continue
        out[key] = torch.stack(rows) if all(isinstance(r, torch.Tensor) for r in rows) else list(rows)
