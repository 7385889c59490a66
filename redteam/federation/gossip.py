"""Serverless gossip: every node keeps its own model and merges its neighbours' (issue 26 §1).

The regime (``[gossip]`` in a scenario; see :mod:`.regimes`) shares the round's shape and its
outputs with the data-parallel federation: the same workloads, partitions, attack and defense
registries, and the same :class:`~redteam.types.RoundRecord` per round (the clients are the
graph's nodes), so the store, reports, ``[[expect]]`` rows and the pytest plugin work unchanged.
What differs is who merges whose models:

* **graph** — ``[gossip] topology`` on the ``[federation] clients`` nodes
  (:mod:`.graphs`: ring, torus, Erdős–Rényi, exponential, two worlds, complete) with mixing
  weights W (Metropolis–Hastings by default); with ``churn`` each round's graph loses each edge
  with that probability (a time-varying graph; W recomputed). In the attack window the attackers
  understate their degree (announce 1; ``byzantine_degree = "true"`` turns this off), so each
  honest neighbour i weighs them 1/(1 + deg_i), the most Metropolis–Hastings gives a neighbour
  (the Byzantine weight the papers assume). The ``attackers`` Byzantine nodes
  are nodes of the graph drawn at random (``placement = "random"``), its highest-degree nodes
  (``"hubs"``), or extra nodes linked to every honest node (``"everywhere"``: the graph is built
  on the honest nodes, and each honest node has b = attackers Byzantine neighbours, as in
  Gaucher, Dieuleveut & Hendrikx, ICML 2025).
* **one round** — every node trains locally from its own model (one batched program over the
  nodes: :class:`~.training.BatchedTrainer` with one starting row per node), then ``steps``
  gossip steps: each honest node i calls the ``[defense]`` rule on the rows it received, centred
  on its own model (row 0 its own zero row with weight W_ii, then x_j − x_i for each neighbour j
  with weight W_ij; ``ServerContext.own_row = 0``) and moves by the aggregate. With ``mean`` this
  is plain gossip x_i ← x_i + Σ_j W_ij (x_j − x_i) = Σ_j W_ij x_j; the robust rules of
  :mod:`defenses.gossip` (ClippedGossip, CS+, IOS) and today's rules apply the same way.
* **Byzantine nodes** — in the attack window they do not merge; each sends each honest
  neighbour its own message: a ``Surface.GOSSIP`` attack's :meth:`~redteam.types.Attack.craft_gossip`
  (the topology-aware attacks of :mod:`attacks.gossip`), or an update attack's ``craft_updates``
  applied per neighbour (its context centred on the target: ``global_params`` = x_i, the rows
  x_j − x_i of the target's neighbourhood; the message is x_i + the crafted row), or, for a data
  attack, their model trained on poisoned data. Outside the window they are honest nodes.
* **the record** — ``accuracy`` / ``loss``: the mean over the honest nodes (the nodes not placed
  as attackers, the same set in the attacked run and its baseline) of each node's test accuracy
  and loss; ``extra["gossip"]``: ``worst_accuracy`` / ``worst_loss`` (the worst honest node),
  ``consensus_distance`` (the mean squared distance of the honest models to their mean),
  ``spectral_gap`` (1 − the second-largest eigenvalue modulus of the round's W),
  ``algebraic_connectivity`` (μ₂ of the honest subgraph's Laplacian), ``edges`` and, where a
  node's rule refused to run, ``refused``. A node's rows are *accepted* in a round when every
  honest neighbour that judged them used them (IOS drops rows; the clipping rules never do).
  ``bytes_on_wire``: every model sent along an edge (both ways) in every gossip step.

Deterministic under the seed: the graph, the roles, the batches and the churn come from their
own streams, so the baseline (attack ``none``) sees the same graph, data and batches.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InvalidParameter, RedteamError
from ..scenario import PluginSpec, Scenario
from ..topology import GOSSIP, Support
from ..types import AttackContext, GossipContext, RoundRecord, Surface
from . import graphs
from .rounds import RunResult, adopt, call_defense, record, result_of, server_context, standard_extra
from .setup import build_setup

__all__ = ["GossipRun", "GossipPlacement", "gossip_step", "consensus_distance", "STREAMS"]

#: the gossip regime's random streams
STREAMS = ("split", "roles", "init", "train", "topology", "attack", "defense", "churn")


def consensus_distance(x: torch.Tensor) -> float:
    """The mean squared distance of the rows of ``x`` to their mean."""
    x = x.to(torch.float64)
    return float(((x - x.mean(0)) ** 2).sum(1).mean()) if x.shape[0] else 0.0


@dataclass
class StepResult:
    """One gossip step: the new models, and what each honest node's rule said about its rows."""

    models: torch.Tensor
    accepted: dict[int, bool] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)


#: the padded neighbourhood tensors of the batched rules are built for at most this many entries
#: at a time (nodes × (1 + max degree) × d; 2²⁰ float32 entries = 4 MiB): the rules make a few
#: passes over them, which run fastest while a chunk stays in cache (benchmarks/bench_gossip.py)
_CHUNK_ENTRIES = 1 << 20


def gossip_step(x: torch.Tensor, adj: np.ndarray, w: np.ndarray, merging: list[int], defense: Any,
                messages: Callable[[int, list[int], list[int]], torch.Tensor] | None = None,
                byzantine: set[int] | frozenset[int] = frozenset(), *, rnd: int = 0,
                generator: torch.Generator | None = None, states: dict[int, dict] | None = None) -> StepResult:
    """One synchronous gossip step on the models ``x`` ``(n, d)``: each node of ``merging`` calls
    ``defense`` on its rows centred on its model (its zero row first, weight W_ii; then its honest
    neighbours, then its Byzantine ones, each in increasing order) and moves by the aggregate. A
    neighbour in ``byzantine`` sends what ``messages(i, honest_neighbours, byzantine_neighbours)``
    returns for it (``(k, d)`` models), the others their models. Nodes not merging keep their models.

    Batched over the nodes, as the clients' training is:

    * ``mean`` (:class:`defenses.basic.Mean`) is one matrix product, x ← W x for every merging node
      at once, with each Byzantine neighbour's column replaced, edge by edge, by what it sent that
      node (the weights renormalised over the row as ``Mean`` does). It equals the per-node rule up
      to rounding: the per-node rule sums W_ij (x_j − x_i), the product Σ_j W_ij x_j (float32:
      |Δ| ≲ 1e-6 · max|x|). A non-finite row (which ``Mean`` rejects) or a non-finite result sends
      those nodes through the per-node rule.
    * a rule with ``decide_batch`` (:mod:`defenses.gossip`: ClippedGossip, CS+, IOS) gets every
      neighbourhood at once, padded to (nodes × (1 + max degree) × d) with a mask (in chunks of
      nodes), and must decide each exactly as ``decide`` does (up to the summation order).
    * ``median``, ``trimmed_mean``, ``krum`` and ``multi_krum`` (``variant = "scores"``) take the same
      padded path through their batched forms (:mod:`defenses._gossip_batch`), which give the
      per-node rule's models bit for bit; a node they cannot settle (e.g. an exact tie between
      different rows under Krum) is left to the rule itself (``BatchDecision.undecided``).
    * any other rule (``geometric_median``, ``centered_clipping`` …) is called node by node; a node
      whose neighbourhood the rule refuses (an :class:`~redteam.errors.InvalidParameter`, e.g. Krum
      with too few neighbours) or whose aggregate is non-finite keeps its model, and ``refused``
      says why.

    The attack's ``messages`` are asked for in the order of ``merging`` in every path."""
    res = StepResult(x.clone())
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    hoods = [_neighbourhood(adj, i, byzantine) for i in merging]
    batched = _batched_rule(defense)
    if _is_plain_mean(defense):
        sent = _all_messages(x, merging, hoods, messages)
        _mean_step(x, w, merging, hoods, sent, defense, res, rnd, gen, states)
    elif batched is not None and _batch_ready(batched):
        sent = _all_messages(x, merging, hoods, messages)
        _batched_step(x, w, merging, hoods, sent, batched, res, states, defense=defense, rnd=rnd, gen=gen)
    else:
        for i, (hon, byz) in zip(merging, hoods):
            got = _sent(x, i, hon, byz, messages) if byz else None
            _merge_node(x, w, i, hon, byz, got, defense, res, rnd, gen, states)
    return res


def _is_plain_mean(defense: Any) -> bool:
    try:
        from defenses.basic import Mean
    except ImportError:  # pragma: no cover - the built-in rules are installed with redteam
        return False
    return type(defense) is Mean


def _neighbourhood(adj: np.ndarray, i: int, byzantine: set[int] | frozenset[int]) -> tuple[list[int], list[int]]:
    nbrs = np.flatnonzero(adj[i]).tolist()
    return [j for j in nbrs if j not in byzantine], [j for j in nbrs if j in byzantine]


def _sent(x: torch.Tensor, i: int, hon: list[int], byz: list[int],
          messages: Callable[[int, list[int], list[int]], torch.Tensor] | None) -> torch.Tensor:
    sent = messages(i, hon, byz) if messages is not None else x[byz]
    if tuple(sent.shape) != (len(byz), x.shape[1]):
        raise RedteamError(f"gossip: the attack sent node {i} rows of shape {tuple(sent.shape)}, "
                           f"expected {(len(byz), x.shape[1])}")
    return sent.to(x.dtype)


def _all_messages(x: torch.Tensor, merging: list[int], hoods: list[tuple[list[int], list[int]]],
                  messages: Callable[[int, list[int], list[int]], torch.Tensor] | None
                  ) -> dict[int, torch.Tensor]:
    return {i: _sent(x, i, hon, byz, messages) for i, (hon, byz) in zip(merging, hoods) if byz}


def _merge_node(x: torch.Tensor, w: np.ndarray, i: int, hon: list[int], byz: list[int], sent: torch.Tensor | None,
                defense: Any, res: StepResult, rnd: int, gen: torch.Generator, states: dict[int, dict] | None) -> None:
    """Node ``i`` calls ``defense`` on its centred rows (``sent``: its Byzantine neighbours' models)."""
    xi = x[i]
    parts = [torch.zeros_like(xi).unsqueeze(0), x[hon] - xi]
    if byz:
        parts.append(sent - xi)
    rows = torch.cat(parts)
    ids = (i, *hon, *byz)
    weights = torch.tensor([w[i, i], *(w[i, j] for j in hon), *(w[i, j] for j in byz)], dtype=x.dtype,
                           device=x.device)
    ctx = server_context(gen, rnd=rnd, weights=weights, global_params=xi, state=(states or {}).get(i, {}),
                         client_ids=ids, own_row=0)
    called = call_defense(defense, rows, ctx, check_finite=False)
    if called.decision is None:  # e.g. Krum on a neighbourhood too small for it
        res.refused[i] = f"node {i} kept its model: {called.refused}"
        return
    dec = called.decision
    if states is not None:
        states[i] = dict(dec.state)
    agg = dec.aggregate.to(x.dtype)
    if not bool(torch.isfinite(agg).all()):
        res.refused[i] = f"node {i} kept its model: non-finite aggregate"
        return
    res.models[i] = xi + agg
    for k in range(1, len(ids)):
        ok = bool(dec.accepted[k])
        j = ids[k]
        res.accepted[j] = res.accepted.get(j, True) and ok
        if not ok:
            res.rejected.setdefault(j, f"node {i}: {dec.reasons.get(k, 'rejected')}")


def _mean_step(x: torch.Tensor, w: np.ndarray, merging: list[int], hoods: list[tuple[list[int], list[int]]],
               sent: dict[int, torch.Tensor], defense: Any, res: StepResult, rnd: int, gen: torch.Generator,
               states: dict[int, dict] | None) -> None:
    """Plain gossip as one matrix product (:func:`gossip_step`)."""
    if not merging:
        return
    n = x.shape[0]
    idx = torch.as_tensor(merging, dtype=torch.long, device=x.device)
    support = np.zeros((len(merging), n), dtype=bool)  # the node and its neighbours, as the per-node rule reads W
    for r, (i, (hon, byz)) in enumerate(zip(merging, hoods)):
        support[r, [i, *hon, *byz]] = True
    # W's rows (Mean weighted by the context's weights), or weight 1 on each row (the plain mean)
    full = np.where(support, w[merging] if defense.weighted else 1.0, 0.0)
    total = torch.as_tensor(full.sum(1), dtype=x.dtype, device=x.device)  # Mean's Σ w over the node's rows
    m = full.copy()
    for r, (_, byz) in enumerate(hoods):
        m[r, byz] = 0.0  # a Byzantine neighbour's column: replaced by what it sent this node
    out = torch.as_tensor(m, dtype=x.dtype, device=x.device) @ x
    # a sum is finite only if every entry is (a finite sum that overflows just takes the per-node path)
    finite = bool(torch.isfinite(x.sum()))
    attacked = [(r, i, byz) for r, (i, (_, byz)) in enumerate(zip(merging, hoods)) if byz]
    if attacked:  # every Byzantine edge's message, weighted, added to its row in one go
        msgs = torch.cat([sent[i] for _, i, _ in attacked])
        finite = finite and bool(torch.isfinite(msgs.sum()))
        coef = torch.as_tensor(np.concatenate([full[r, byz] for r, _, byz in attacked]), dtype=x.dtype,
                               device=x.device)
        rows_of = torch.as_tensor(np.concatenate([[r] * len(byz) for r, _, byz in attacked]), dtype=torch.long,
                                  device=x.device)
        out.index_add_(0, rows_of, msgs * coef[:, None])
    out = out / total[:, None]
    if not finite:  # Mean rejects non-finite rows: every node by the per-node rule
        for i, (hon, byz) in zip(merging, hoods):
            _merge_node(x, w, i, hon, byz, sent.get(i), defense, res, rnd, gen, states)
        return
    bad = ~torch.isfinite(out.sum(1))
    ok_rows = (~bad).nonzero().flatten()
    res.models[idx[ok_rows]] = out[ok_rows]
    slow = set(bad.nonzero().flatten().tolist())
    for r, (i, (hon, byz)) in enumerate(zip(merging, hoods)):
        if r in slow:  # e.g. rows near the float32 overflow: Mean's own float64 path
            _merge_node(x, w, i, hon, byz, sent.get(i), defense, res, rnd, gen, states)
            continue
        if states is not None:
            states[i] = {}
        for j in (*hon, *byz):
            res.accepted.setdefault(j, True)


def _batched_rule(defense: Any) -> Any:
    """What decides every neighbourhood at once: the rule itself when it has ``decide_batch``, the
    batched form of a server rule (:func:`defenses._gossip_batch.batched_form`), or ``None``."""
    if defense.decide_batch is not None:
        return defense
    try:
        from defenses._gossip_batch import batched_form
    except ImportError:  # pragma: no cover - the built-in rules are installed with redteam
        return None
    return batched_form(defense)


def _batch_ready(defense: Any) -> bool:
    """Whether the rule's batched form can run (its parameters are set); a rule that would refuse
    every neighbourhood is left to the per-node path, which records the refusal node by node."""
    return bool(defense.batch_ready())


def _batched_step(x: torch.Tensor, w: np.ndarray, merging: list[int], hoods: list[tuple[list[int], list[int]]],
                  sent: dict[int, torch.Tensor], batched: Any, res: StepResult,
                  states: dict[int, dict] | None, *, defense: Any = None, rnd: int = 0,
                  gen: torch.Generator | None = None) -> None:
    """Every merging node's neighbourhood padded to (nodes × K × d), K = 1 + the largest degree,
    decided by ``batched.decide_batch`` in chunks of nodes (:func:`gossip_step`); the nodes it
    leaves ``undecided`` are merged by ``defense`` (the rule itself) node by node. The records
    (accepted, rejected, refused, state) are written node by node in the order of ``merging``,
    as the per-node loop writes them. ``batched.chunk_entries``, where set, replaces the chunk
    size; with ``batched.sort_by_degree`` the chunks take the nodes by degree, each padded to its
    own largest degree only (a form whose per-node results do not depend on the padding)."""
    if not merging:
        return
    defense = batched if defense is None else defense
    gen = gen if gen is not None else torch.Generator().manual_seed(0)
    d = x.shape[1]
    entries = batched.chunk_entries or _CHUNK_ENTRIES
    degree = [len(hon) + len(byz) for hon, byz in hoods]
    chunks: list[tuple[list[int], int]] = []  # (positions in merging, K)
    if batched.sort_by_degree:
        cur: list[int] = []
        for p in sorted(range(len(merging)), key=lambda q: degree[q]):  # stable: merging order within a degree
            if cur and (len(cur) + 1) * (1 + degree[p]) * d > entries:
                chunks.append((cur, 1 + degree[cur[-1]]))
                cur = []
            cur.append(p)
        chunks.append((cur, 1 + degree[cur[-1]]))
    else:
        k_max = 1 + max(degree)
        chunk = max(1, entries // max(1, k_max * d))
        chunks = [(list(range(s, min(s + chunk, len(merging)))), k_max) for s in range(0, len(merging), chunk)]
    buf = torch.empty((max(len(pos) * k for pos, k in chunks), d), dtype=x.dtype, device=x.device)
    records: dict[int, Any] = {}  # position in merging → what to write for that node (None: the rule's own)
    for pos, k_max in chunks:
        nodes = [merging[p] for p in pos]
        part = [hoods[p] for p in pos]
        c = len(nodes)
        src = np.array([[i] * k_max for i in nodes])  # padding points at the node itself
        valid = np.zeros((c, k_max), dtype=bool)
        wt = np.zeros((c, k_max))
        ids = np.full((c, k_max), -1)
        byz_slots: list[tuple[int, int, int]] = []  # (row, first slot, count)
        for r, (i, (hon, byz)) in enumerate(zip(nodes, part)):
            nb = [i, *hon, *byz]
            src[r, :len(nb)] = nb
            valid[r, :len(nb)] = True
            wt[r, :len(nb)] = w[i, nb]
            ids[r, :len(nb)] = nb
            if byz:
                byz_slots.append((r, 1 + len(hon), len(byz)))
        node_idx = torch.as_tensor(nodes, dtype=torch.long, device=x.device)
        xi = x[node_idx]
        # (c, K, d), into one buffer for every chunk (a fresh tensor per chunk costs more than the gather)
        rows = torch.index_select(x, 0, torch.as_tensor(src.ravel(), dtype=torch.long, device=x.device),
                                  out=buf[:c * k_max]).view(c, k_max, d)
        for r, k0, kb in byz_slots:
            rows[r, k0:k0 + kb] = sent[nodes[r]]
        rows.sub_(xi[:, None, :])
        rows[:, 0] = 0  # the node's own row (x_i − x_i)
        vmask = torch.as_tensor(valid, device=x.device)
        if not valid.all():
            rows[~vmask] = 0  # padding (x_i − x_i, but not when x_i is not finite)
        dec = batched.decide_batch(rows, torch.as_tensor(wt, dtype=x.dtype, device=x.device), vmask, own_row=0)
        agg = dec.aggregate.to(x.dtype)
        fin = torch.isfinite(agg).all(1)
        undecided = dec.undecided
        if undecided:
            fin[list(undecided)] = False  # not written here: the rule merges those nodes itself
        new = xi + agg
        okr = fin.nonzero().flatten()
        res.models[node_idx[okr]] = new[okr]
        fin_l = fin.tolist()
        acc = (dec.accepted | ~vmask).cpu().numpy()
        for r, p in enumerate(pos):
            if r in undecided:
                records[p] = None
                continue
            row_ids = ids[r, 1:][valid[r, 1:]].tolist()
            row_ok = acc[r, 1:][valid[r, 1:]].tolist()
            why = {k: dec.reasons.get((r, k), "rejected") for k, ok in enumerate(row_ok, start=1) if not ok}
            records[p] = (dec.states[r], fin_l[r], row_ids, row_ok, why)
    for p, i in enumerate(merging):  # the records, in the loop's order
        rec = records[p]
        if rec is None:
            hon, byz = hoods[p]
            _merge_node(x, w, i, hon, byz, sent.get(i), defense, res, rnd, gen, states)
            continue
        state, finite, row_ids, row_ok, why = rec
        if states is not None:
            states[i] = dict(state)
        if not finite:
            res.refused[i] = f"node {i} kept its model: non-finite aggregate"
            continue
        for k, (j, ok) in enumerate(zip(row_ids, row_ok), start=1):
            res.accepted[j] = res.accepted.get(j, True) and ok
            if not ok:
                res.rejected.setdefault(j, f"node {i}: {why[k]}")


@dataclass
class GossipPlacement:
    """The gossip regime's answers to :func:`~.setup.build_setup`: the graph and the Byzantine
    nodes placed on it (``[gossip] placement``), each honest node's rule sized for its
    neighbourhood, and no server (no root sample)."""

    scenario: Scenario
    support: Support = GOSSIP
    streams: tuple[str, ...] = STREAMS
    adj: np.ndarray | None = None

    def check_workload(self, workload: Any) -> None:
        return None

    def place(self, n: int, rng: Any) -> list[int]:
        g = self.scenario.gossip
        f = g.attackers
        topo = rng["topology"]
        if g.placement == "everywhere":
            bad = sorted(rng["roles"].choice(n, size=f, replace=False).tolist()) if f else []
            honest = [i for i in range(n) if i not in set(bad)]
            sub = graphs.build_graph(g.topology, len(honest), topo, probability=g.probability, rows=g.rows,
                                     bridges=g.bridges)
            adj = np.zeros((n, n), dtype=bool)
            adj[np.ix_(honest, honest)] = sub
            for b_ in bad:
                adj[b_, honest] = adj[honest, b_] = True
        else:
            adj = graphs.build_graph(g.topology, n, topo, probability=g.probability, rows=g.rows, bridges=g.bridges)
            if g.placement == "hubs":
                deg = adj.sum(1)
                bad = sorted(sorted(range(n), key=lambda i: (-int(deg[i]), i))[:f])
            else:
                bad = sorted(rng["roles"].choice(n, size=f, replace=False).tolist()) if f else []
        self.adj = adj
        return bad

    def defense_sizes(self, malicious: list[int]) -> tuple[int | None, int | None]:
        assert self.adj is not None
        honest = [i for i in range(self.adj.shape[0]) if i not in set(malicious)]
        honest_deg = int(self.adj[honest].sum(1).max()) if honest else 0
        return self.scenario.gossip.attackers, honest_deg + 1

    def root_size(self, pool: int, defense: Any) -> int | None:
        return None


class GossipRun:
    """A gossip graph built from a scenario with ``[gossip]``; ``run()`` executes all rounds."""

    def __init__(self, scenario: Scenario, *, device: str = "cpu", attack: PluginSpec | None = None,
                 warmup_dir: str | None = None, start: torch.Tensor | None = None) -> None:
        if scenario.gossip is None:
            raise InvalidParameter("GossipRun needs a scenario with a [gossip] section")
        self.scenario = scenario
        self.g = scenario.gossip
        placement = GossipPlacement(scenario)
        su = build_setup(scenario, placement, device=device, attack=attack, warmup_dir=warmup_dir, start=start)
        adopt(self, su)
        self._ran = False
        self.n = scenario.federation.clients
        assert placement.adj is not None
        self.adj = placement.adj
        self.honest = [i for i in range(self.n) if not self.is_malicious[i]]
        part = su.partition
        assert part is not None
        self.data = part.data
        self.phases = (self.data, self.data)
        if not scenario.window.is_full and part.clean_data is not part.data:
            self.phases = (part.clean_data, self.data)
        self.final_models: torch.Tensor | None = None

    # ------------------------------------------------------------------ messages
    def _messages(self, rnd: int, step: int, x: torch.Tensor, adj: np.ndarray, w: np.ndarray,
                  spectral: tuple[torch.Tensor, torch.Tensor], attack_state: dict
                  ) -> Callable[[int, list[int], list[int]], torch.Tensor]:
        lap, fied = spectral
        pos = {h: k for k, h in enumerate(self.honest)}
        honest_models = x[self.honest]
        dt = x.dtype

        def send(i: int, hon: list[int], byz: list[int]) -> torch.Tensor:
            xi = x[i]
            if Surface.GOSSIP in self.attack.surfaces:
                ctx = GossipContext(
                    round=rnd, step=step, target=i, target_model=xi, neighbours=tuple(hon), neighbour_models=x[hon],
                    neighbour_weights=torch.tensor([w[i, j] for j in hon], dtype=dt, device=x.device),
                    self_weight=float(w[i, i]), attackers=tuple(byz),
                    attacker_weights=torch.tensor([w[i, j] for j in byz], dtype=dt, device=x.device),
                    own_models=x[byz], honest=tuple(self.honest), honest_models=honest_models, laplacian=lap,
                    fiedler=fied, position=pos[i], generator=self.torch_rng["attack"], state=attack_state,
                    defense=self.defense)
                return self.attack.craft_gossip(ctx)
            if Surface.UPDATES in self.attack.surfaces:
                ids = (i, *hon, *byz)
                rows = torch.cat([torch.zeros_like(xi).unsqueeze(0), x[hon] - xi, x[byz] - xi])
                mal_rows = tuple(range(1 + len(hon), len(ids)))
                own = rows[list(mal_rows)]
                visible = rows[: 1 + len(hon)] if self.attack.omniscient else own
                actx = AttackContext(
                    round=rnd, n_clients=len(ids), malicious=tuple(byz), own_updates=own, visible_updates=visible,
                    global_params=xi, generator=self.torch_rng["attack"], num_classes=self.num_classes,
                    weights=torch.tensor([w[i, j] for j in ids], dtype=dt, device=x.device),
                    malicious_rows=mal_rows, attack_state=attack_state,
                    visible_clients=ids[: 1 + len(hon)] if self.attack.omniscient else tuple(byz))
                crafted = self.attack.craft_updates(actx)
                if tuple(crafted.shape) != tuple(own.shape):
                    raise RedteamError(f"attack {self.attack_spec.name!r}: craft_updates returned shape "
                                       f"{tuple(crafted.shape)}, expected {tuple(own.shape)}")
                return xi + crafted.to(dt)
            return x[byz]  # a data attack: its (poisoned) model

        return send

    # ------------------------------------------------------------------ one run
    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
        if self._ran:
            raise RedteamError("this GossipRun has already run; build a new one for another run")
        self._ran = True
        sc, g = self.scenario, self.g
        n = self.n
        x = self.params0.unsqueeze(0).expand(n, -1).clone()
        nodes = torch.arange(n, device=self.device)
        records: list[RoundRecord] = []
        attack_state: dict = {}
        node_states: dict[int, dict] = {}
        t_run = time.perf_counter()
        start = self.setup.start_record()
        dim = self.spec.dim
        for rnd in range(sc.federation.rounds):
            t0 = time.perf_counter()
            acting = sc.window.active(rnd) and bool(self.attack.surfaces)
            data = self.phases[int(acting)]
            adj = graphs.drop_edges(self.adj, g.churn, self.rng["churn"]) if g.churn else self.adj
            w = graphs.mixing_matrix(adj, g.mixing)
            gap = graphs.spectral_gap(w)
            if acting and self.malicious and g.byzantine_degree == "one":  # the largest weight MH gives them
                claimed = adj.sum(1)
                claimed[self.malicious] = 1
                w = graphs.mixing_matrix(adj, g.mixing, claimed)
            # local training: every node from its own model, batched over the nodes
            x = self.trainer.train(x, data, nodes, self.local, self.torch_rng["train"], states=self.states)
            hs = self.honest
            adj_h = adj[np.ix_(hs, hs)]
            lap = graphs.laplacian(adj_h, w[np.ix_(hs, hs)])
            spectral = (torch.as_tensor(lap, dtype=x.dtype, device=self.device),
                        torch.as_tensor(graphs.fiedler_vector(lap), dtype=x.dtype, device=self.device))
            byz = frozenset(self.malicious) if acting else frozenset()
            merging = [i for i in range(n) if i not in byz]
            accepted_all: dict[int, bool] = {}
            rejected: dict[int, str] = {}
            refused: dict[int, str] = {}
            t_def = 0.0
            for step in range(g.steps):
                send = self._messages(rnd, step, x, adj, w, spectral, attack_state) if byz else None
                t1 = time.perf_counter()
                res = gossip_step(x, adj, w, merging, self.defense, send, byz, rnd=rnd,
                                  generator=self.torch_rng["defense"], states=node_states)
                t_def += time.perf_counter() - t1
                x = res.models
                for j, ok in res.accepted.items():
                    accepted_all[j] = accepted_all.get(j, True) and ok
                for j, why in res.rejected.items():
                    rejected.setdefault(j, why)
                refused.update(res.refused)
            # evaluation: each honest node's model
            accs, losses = [], []
            for i in hs:
                a, l_ = self.trainer.evaluate(x[i], self.test_x, self.test_y)
                accs.append(a)
                losses.append(l_)
            lap_unit = graphs.laplacian(adj_h)
            extra: dict[str, Any] = {"gossip": {
                "worst_accuracy": min(accs), "worst_loss": max(losses) if all(map(math.isfinite, losses)) else None,
                "consensus_distance": consensus_distance(x[hs]),
                "spectral_gap": gap,
                "algebraic_connectivity": graphs.algebraic_connectivity(lap_unit),
                "edges": int(adj.sum() // 2),
            }}
            if refused:
                extra["gossip"]["refused"] = dict(sorted(refused.items()))
            extra.update(_mean_over_nodes([self.setup.probes.evaluate(self.trainer, x[i]) for i in hs]))
            extra.update(standard_extra(self.setup, rnd, active=sc.window.active(rnd), start=start))
            isolated = {i: "no edge this round (churn)" for i in range(n) if not adj[i].any()}
            mean_loss = sum(losses) / len(losses)
            rec = record(
                rnd, sum(accs) / len(accs), mean_loss if math.isfinite(mean_loss) else float("inf"),
                accepted=[bool(accepted_all.get(i, False)) for i in range(n)],
                malicious=[bool(self.is_malicious[i]) and acting for i in range(n)],
                participating=[True] * n, dropped=isolated, rejected=rejected,
                bytes_on_wire=4 * dim * int(adj.sum()) * g.steps, started=t0, defense_time_s=t_def, extra=extra)
            records.append(rec)
            if on_round is not None:
                on_round(rec)
        self.final_models = x
        self.final_params = x[self.honest].mean(0)
        return result_of(self.setup, records, time.perf_counter() - t_run)


def _mean_over_nodes(per_node: list[dict[str, Any]]) -> dict[str, Any]:
    """Each probe's figure (ASR, false-trigger rate …) averaged over the honest nodes, in node order;
    a figure by kind (a dict) averaged kind by kind."""
    if not per_node or not per_node[0]:
        return {}
    out: dict[str, Any] = {}
    for key, first in per_node[0].items():
        if isinstance(first, dict):
            out[key] = {k: sum(d[key][k] for d in per_node) / len(per_node) for k in first}
        else:
            out[key] = sum(d[key] for d in per_node) / len(per_node)
    return out
