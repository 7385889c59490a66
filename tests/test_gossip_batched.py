"""The batched gossip step (issue 26 §1) against the per-node loop it replaced.

:func:`reference_step` below is the original ``gossip_step`` (commit ca89b49), kept verbatim as
the reference: each honest node calls its rule on its centred rows, one node after another. The
batched step must give the same models, the same accepted / rejected / refused records and the
same per-node rule state, on several graphs, Byzantine placements, attacks, dtypes and rules:

* ``mean`` runs as one matrix product x ← W x with Byzantine columns replaced edge by edge. The
  loop sums W_ij (x_j − x_i), the product Σ_j W_ij x_j: the same number up to rounding, so the
  models agree to 1e-6 relative to the models' scale in float32 (each centred difference x_j − x_i
  and the sum are rounded once, |Δ| ≤ a few ulp of max|x|) and to 1e-12 in float64.
* ClippedGossip, CS+ and IOS run over a padded (nodes × (1 + max degree) × d) tensor. They take the
  rows' norms and weighted sums in the rows' dtype (the per-node rule first converts a node's rows
  to float64; for every node at once that copy would cost more than the rule) and the per-row
  figures (weights, radii) in float64, so with float32 models a radius moves by a few float32 ulps
  and the models agree to 1e-6 relative to their scale (radii to 1e-6 relative); with float64
  models only the summation order differs: 1e-12 (radii 1e-9).
* every other rule (median, trimmed mean, Krum …) still runs node by node: identical.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
import torch

from attacks.gossip import Dissensus, Spectral
from defenses.basic import Mean
from defenses.gossip import IOS, ClippedGossip, CSPlus
from redteam.errors import InvalidParameter, RedteamError
from redteam.federation import gossip as G
from redteam.federation import graphs
from redteam.federation.gossip import StepResult, gossip_step
from redteam.registry import DEFENSES
from redteam.types import GossipContext, ServerContext


def reference_step(x: torch.Tensor, adj: np.ndarray, w: np.ndarray, merging: list[int], defense: Any,
                   messages: Callable[[int, list[int], list[int]], torch.Tensor] | None = None,
                   byzantine: set[int] | frozenset[int] = frozenset(), *, rnd: int = 0,
                   generator: torch.Generator | None = None, states: dict[int, dict] | None = None) -> StepResult:
    """The per-node loop of commit ca89b49, verbatim."""
    out = x.clone()
    res = StepResult(out)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    for i in merging:
        nbrs = np.flatnonzero(adj[i]).tolist()
        hon = [j for j in nbrs if j not in byzantine]
        byz = [j for j in nbrs if j in byzantine]
        xi = x[i]
        parts = [torch.zeros_like(xi).unsqueeze(0), x[hon] - xi]
        if byz:
            sent = messages(i, hon, byz) if messages is not None else x[byz]
            if tuple(sent.shape) != (len(byz), x.shape[1]):
                raise RedteamError(f"gossip: the attack sent node {i} rows of shape {tuple(sent.shape)}, "
                                   f"expected {(len(byz), x.shape[1])}")
            parts.append(sent.to(x.dtype) - xi)
        rows = torch.cat(parts)
        ids = (i, *hon, *byz)
        weights = torch.tensor([w[i, i], *(w[i, j] for j in hon), *(w[i, j] for j in byz)], dtype=x.dtype,
                               device=x.device)
        ctx = ServerContext(round=rnd, n_clients=len(ids), weights=weights, global_params=xi, generator=gen,
                            state=(states or {}).get(i, {}), client_ids=ids, own_row=0)
        try:
            dec = defense(rows, ctx)
        except InvalidParameter as exc:  # e.g. Krum on a neighbourhood too small for it
            res.refused[i] = f"node {i} kept its model: {exc}"
            continue
        if states is not None:
            states[i] = dict(dec.state)
        agg = dec.aggregate.to(x.dtype)
        if not bool(torch.isfinite(agg).all()):
            res.refused[i] = f"node {i} kept its model: non-finite aggregate"
            continue
        out[i] = xi + agg
        for k in range(1, len(ids)):
            ok = bool(dec.accepted[k])
            j = ids[k]
            res.accepted[j] = res.accepted.get(j, True) and ok
            if not ok:
                res.rejected.setdefault(j, f"node {i}: {dec.reasons.get(k, 'rejected')}")
    return res


# ------------------------------------------------------------------ worlds


def world(kind: str, dtype: torch.dtype, d: int = 6, seed: int = 0):
    """(adjacency, W, models, Byzantine nodes) of a test world; the Byzantine nodes announce degree 1."""
    rng = np.random.default_rng(seed)
    if kind == "ring":
        adj, byz = graphs.build_graph("ring", 9), [4]
    elif kind == "erdos_renyi_hubs":
        adj = graphs.build_graph("erdos_renyi", 14, rng, probability=0.35)
        deg = adj.sum(1)
        byz = sorted(sorted(range(14), key=lambda i: (-int(deg[i]), i))[:3])
    elif kind == "two_worlds_everywhere":  # 10 honest nodes, 2 Byzantine nodes linked to all of them
        sub = graphs.build_graph("two_worlds", 10, bridges=2)
        adj = np.zeros((12, 12), dtype=bool)
        adj[:10, :10] = sub
        adj[10:, :10] = adj[:10, 10:] = True
        byz = [10, 11]
    elif kind == "complete_none":
        adj, byz = graphs.build_graph("complete", 7), []
    else:
        raise ValueError(kind)
    claimed = adj.sum(1)
    claimed[byz] = 1
    w = graphs.mixing_matrix(adj, degrees=claimed)
    x = torch.randn(adj.shape[0], d, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return adj, w, x, byz


def spectral_messages(attack, adj, w, x, byz):
    honest = [i for i in range(x.shape[0]) if i not in byz]
    lap = graphs.laplacian(adj[np.ix_(honest, honest)], w[np.ix_(honest, honest)])
    lap_t, fied = torch.as_tensor(lap, dtype=x.dtype), torch.as_tensor(graphs.fiedler_vector(lap), dtype=x.dtype)

    def send(i, hon, b):
        ctx = GossipContext(
            round=0, step=0, target=i, target_model=x[i], neighbours=tuple(hon), neighbour_models=x[hon],
            neighbour_weights=torch.tensor([w[i, j] for j in hon], dtype=x.dtype), self_weight=float(w[i, i]),
            attackers=tuple(b), attacker_weights=torch.tensor([w[i, j] for j in b], dtype=x.dtype),
            own_models=x[b], honest=tuple(honest), honest_models=x[honest], laplacian=lap_t, fiedler=fied,
            position=honest.index(i), generator=torch.Generator().manual_seed(0))
        return attack.craft_gossip(ctx)

    return send


def noise_messages(x, scale=5.0, nonfinite=False):
    """Each Byzantine neighbour of node i sends x_i + noise drawn from a generator seeded by i (so the
    two implementations, asking in the same order, get the same rows); optionally one NaN row."""
    calls: list[int] = []

    def send(i, hon, b):
        calls.append(i)
        g = torch.Generator().manual_seed(1000 + i)
        out = x[i] + scale * torch.randn(len(b), x.shape[1], generator=g, dtype=x.dtype)
        if nonfinite and i % 2 == 0:
            out[0, 0] = float("nan")
        return out

    send.calls = calls  # type: ignore[attr-defined]
    return send


RULES = {
    "mean": lambda b: Mean(),
    "mean_unweighted": lambda b: Mean(weighted=False),
    "clipped_gossip": lambda b: ClippedGossip(b=b),
    "clipped_second_largest": lambda b: ClippedGossip(b=b, tau_rule="second_largest"),
    "clipped_fixed": lambda b: ClippedGossip(b=b, tau=0.5),
    "cs_plus": lambda b: CSPlus(b=b),
    "ios": lambda b: IOS(b=b),
    "ios_two": lambda b: IOS(b=b + 1),
    "median": lambda b: DEFENSES.create("median", {}),
    "trimmed_mean": lambda b: DEFENSES.create("trimmed_mean", {"b": 1}),
    "krum": lambda b: DEFENSES.create("krum", {"f": 1}),
}


def assert_same(got: StepResult, want: StepResult, dtype: torch.dtype, st_got: dict, st_want: dict) -> None:
    scale = max(1.0, float(want.models.abs().max()))
    atol = (1e-6 if dtype == torch.float32 else 1e-12) * scale
    torch.testing.assert_close(got.models, want.models, rtol=0, atol=atol, equal_nan=True)
    assert got.accepted == want.accepted
    assert got.rejected == want.rejected
    assert got.refused == want.refused
    assert st_got.keys() == st_want.keys()
    for i in st_want:
        a, b = st_got[i], st_want[i]
        assert a.keys() == b.keys(), i
        for k in b:
            if isinstance(b[k], float):
                rel = 1e-6 if dtype == torch.float32 else 1e-9  # float32 rows: norms in float32
                assert a[k] == b[k] or a[k] == pytest.approx(b[k], rel=rel, abs=1e-12), (i, k)
            else:
                assert a[k] == b[k], (i, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["ring", "erdos_renyi_hubs", "two_worlds_everywhere", "complete_none"])
@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("attack", ["none", "dissensus", "spectral", "noise"])
def test_batched_step_equals_the_per_node_loop(rule, kind, dtype, attack):
    adj, w, x, byz = world(kind, dtype)
    b = max(1, len(byz))
    defense = RULES[rule](b)
    if attack == "none" or not byz:
        send, byzset = None, frozenset()
    elif attack == "noise":
        send, byzset = noise_messages(x), frozenset(byz)
    else:
        crafter = Dissensus(scale=2.0) if attack == "dissensus" else Spectral(factor="normalised", scale=2.0)
        send, byzset = spectral_messages(crafter, adj, w, x, byz), frozenset(byz)
    merging = [i for i in range(x.shape[0]) if i not in byzset]
    st_got: dict = {}
    st_want: dict = {}
    got = gossip_step(x, adj, w, merging, defense, send, byzset, states=st_got)
    want = reference_step(x, adj, w, merging, defense, send, byzset, states=st_want)
    assert_same(got, want, dtype, st_got, st_want)


@pytest.mark.parametrize("rule", ["mean", "clipped_gossip", "cs_plus", "ios", "median"])
def test_nonfinite_messages_are_screened_as_by_the_loop(rule):
    """Half the attacked nodes receive a NaN row: every rule rejects it with its reason, as the loop."""
    adj, w, x, byz = world("two_worlds_everywhere", torch.float32)
    defense = RULES[rule](2)
    send = noise_messages(x, nonfinite=True)
    merging = [i for i in range(x.shape[0]) if i not in byz]
    st_got: dict = {}
    st_want: dict = {}
    got = gossip_step(x, adj, w, merging, defense, send, frozenset(byz), states=st_got)
    want = reference_step(x, adj, w, merging, defense, send, frozenset(byz), states=st_want)
    assert_same(got, want, torch.float32, st_got, st_want)
    assert any("non-finite" in why for why in want.rejected.values())


@pytest.mark.parametrize("rule", ["mean", "cs_plus", "ios", "krum"])
def test_messages_are_asked_for_in_the_loops_order(rule):
    adj, w, x, byz = world("erdos_renyi_hubs", torch.float64)
    a, b_ = noise_messages(x), noise_messages(x)
    merging = [i for i in range(x.shape[0]) if i not in byz]
    gossip_step(x, adj, w, merging, RULES[rule](3), a, frozenset(byz))
    reference_step(x, adj, w, merging, RULES[rule](3), b_, frozenset(byz))
    assert a.calls == b_.calls and a.calls


def test_an_unset_b_is_refused_node_by_node_as_by_the_loop():
    adj, w, x, byz = world("ring", torch.float64)
    merging = [i for i in range(9) if i not in byz]
    for rule in (CSPlus(), ClippedGossip(), IOS()):
        got = gossip_step(x, adj, w, merging, rule, None, frozenset(byz))
        want = reference_step(x, adj, w, merging, rule, None, frozenset(byz))
        assert got.refused == want.refused and len(got.refused) == len(merging)
        assert torch.equal(got.models, x)


def test_a_wrong_message_shape_is_an_error():
    adj, w, x, byz = world("ring", torch.float64)
    for rule in (Mean(), CSPlus(b=1)):
        with pytest.raises(RedteamError, match="rows of shape"):
            gossip_step(x, adj, w, [0, 1, 2, 3, 5, 6, 7, 8], rule, lambda i, h, b: x[:3], frozenset(byz))


def test_chunks_of_nodes_give_the_same_step(monkeypatch):
    """The padded tensor is built a few nodes at a time when it would be large: same result."""
    adj, w, x, byz = world("erdos_renyi_hubs", torch.float64, d=40)
    merging = [i for i in range(x.shape[0]) if i not in byz]
    send = noise_messages(x)
    whole = gossip_step(x, adj, w, merging, CSPlus(b=3), send, frozenset(byz))
    monkeypatch.setattr(G, "_CHUNK_ENTRIES", 3 * 40 * 12)  # 3 nodes per chunk
    parts = gossip_step(x, adj, w, merging, CSPlus(b=3), send, frozenset(byz))
    assert torch.equal(parts.models, whole.models) and parts.accepted == whole.accepted


def test_float32_near_overflow_takes_means_float64_path():
    """Mean averages rows near the float32 overflow in float64; the product would overflow, so
    those nodes go through the per-node rule and come out finite, as in the loop."""
    adj = graphs.build_graph("ring", 5)
    w = graphs.mixing_matrix(adj)
    x = torch.full((5, 3), 3e38, dtype=torch.float32)
    got = gossip_step(x, adj, w, list(range(5)), Mean())
    want = reference_step(x, adj, w, list(range(5)), Mean())
    assert torch.isfinite(got.models).all()
    torch.testing.assert_close(got.models, want.models)


@pytest.mark.parametrize("rule", ["mean", "mean_unweighted", "clipped_gossip", "clipped_second_largest", "cs_plus",
                                  "ios"])
def test_the_batched_rules_never_go_node_by_node(rule, monkeypatch):
    """On finite inputs the batched paths decide every node: the per-node merge is never called."""
    adj, w, x, byz = world("two_worlds_everywhere", torch.float32)

    def per_node(*a, **k):
        raise AssertionError("per-node merge called")

    monkeypatch.setattr(G, "_merge_node", per_node)
    merging = [i for i in range(x.shape[0]) if i not in byz]
    res = gossip_step(x, adj, w, merging, RULES[rule](2), noise_messages(x), frozenset(byz))
    assert not res.refused and not torch.equal(res.models, x)


def test_the_worlds_exercise_clipping_and_dropping():
    """The equivalence above is not vacuous: the noise attack gets rows clipped (τ finite, below
    the farthest row) and dropped."""
    adj, w, x, byz = world("two_worlds_everywhere", torch.float64)
    merging = [i for i in range(x.shape[0]) if i not in byz]
    states: dict = {}
    gossip_step(x, adj, w, merging, CSPlus(b=2), noise_messages(x), frozenset(byz), states=states)
    assert all(0 < s["tau"] < math.inf for s in states.values())
    res = gossip_step(x, adj, w, merging, IOS(b=2), noise_messages(x), frozenset(byz), states=states)
    assert res.rejected and all(not res.accepted[b] for b in byz)
