"""The serverless gossip regime (issue 26 §1): graphs and mixing weights, consensus at the rate the
spectral gap predicts, the robust rules on hand-worked examples, the topology-aware attacks, the
breakdown point of CS+ on the two-worlds graph, and the regime's records and metrics."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from attacks.gossip import Dissensus, Spectral
from defenses.basic import Mean
from defenses.gossip import IOS, ClippedGossip, CSPlus
from redteam.errors import InvalidScenario
from redteam.federation import graphs
from redteam.federation.gossip import GossipRun, consensus_distance, gossip_step
from redteam.federation.regimes import make_run
from redteam.registry import DEFENSES
from redteam.scenario import parse_scenario
from redteam.scoring import summarize
from redteam.types import GossipContext, ServerContext

# ------------------------------------------------------------------ graphs and mixing

# a hand-made graph: the path 0 – 1 – 2 plus the pendant 3 on node 1 (degrees 1, 3, 1, 1)
HAND = np.zeros((4, 4), dtype=bool)
for a, b in ((0, 1), (1, 2), (1, 3)):
    HAND[a, b] = HAND[b, a] = True


def test_metropolis_hastings_weights_by_hand():
    """W_ij = 1/(1 + max(deg_i, deg_j)): every edge touches node 1 (degree 3), so each is 1/4;
    W_11 = 1 − 3/4 = 1/4 and the leaves keep 3/4."""
    w = graphs.mixing_matrix(HAND)
    want = np.array([[.75, .25, 0, 0], [.25, .25, .25, .25], [0, .25, .75, 0], [0, .25, 0, .75]])
    assert np.allclose(w, want)
    assert np.allclose(w, w.T) and np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1) and (w >= 0).all()


@pytest.mark.parametrize("topology,kw", [("ring", {}), ("torus", {}), ("exponential", {}), ("complete", {}),
                                         ("two_worlds", {"bridges": 2}), ("erdos_renyi", {"probability": 0.4})])
@pytest.mark.parametrize("mixing", ["metropolis_hastings", "uniform"])
def test_every_topology_is_connected_with_doubly_stochastic_weights(topology, kw, mixing):
    adj = graphs.build_graph(topology, 12, np.random.default_rng(0), **kw)
    assert (adj == adj.T).all() and not adj.diagonal().any() and graphs.is_connected(adj)
    w = graphs.mixing_matrix(adj, mixing)
    assert np.allclose(w, w.T) and np.allclose(w.sum(1), 1) and (w >= -1e-12).all()
    assert 0 < graphs.spectral_gap(w) <= 1


def test_topologies_by_hand():
    assert graphs.build_graph("ring", 5).sum(1).tolist() == [2] * 5
    assert graphs.build_graph("torus", 12).sum(1).tolist() == [4] * 12  # 3 × 4 grid, periodic
    ex = graphs.build_graph("exponential", 8)  # i ± 1, 2, 4
    assert sorted(np.flatnonzero(ex[0]).tolist()) == [1, 2, 4, 6, 7]
    tw = graphs.build_graph("two_worlds", 10, bridges=2)  # cliques {0..4}, {5..9}; i ↔ 5 + i, 5 + (i + 1) % 5
    assert sorted(np.flatnonzero(tw[0]).tolist()) == [1, 2, 3, 4, 5, 6]
    assert int(tw[:5, 5:].sum()) == 10
    # the Fiedler vector of the two-worlds graph separates its halves
    u = graphs.fiedler_vector(graphs.laplacian(tw))
    assert (np.sign(u[:5]) == np.sign(u[0])).all() and (np.sign(u[5:]) == -np.sign(u[0])).all()


def test_ring_of_four_spectrum_by_hand():
    """A 4-ring under MH: W = 1/3 on the edges and the diagonal; eigenvalues 1, 1/3, 1/3, −1/3, so
    the gap is 2/3. μ₂ of its Laplacian (eigenvalues 0, 2, 2, 4) is 2."""
    adj = graphs.build_graph("ring", 4)
    assert np.allclose(graphs.mixing_matrix(adj), np.where(adj | np.eye(4, dtype=bool), 1 / 3, 0))
    assert graphs.spectral_gap(graphs.mixing_matrix(adj)) == pytest.approx(2 / 3)
    assert graphs.algebraic_connectivity(graphs.laplacian(adj)) == pytest.approx(2.0)


@pytest.mark.parametrize("topology", ["ring", "torus", "exponential", "two_worlds"])
def test_gossip_reaches_consensus_at_the_rate_of_the_spectral_gap(topology):
    """Without attackers and without training, t steps of plain gossip shrink the consensus
    distance by at most (1 − gap)^(2t) and keep the mean; asymptotically by that rate exactly."""
    adj = graphs.build_graph(topology, 12, bridges=2)
    w = graphs.mixing_matrix(adj)
    rho = 1 - graphs.spectral_gap(w)
    x = torch.randn(12, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mean0, d0 = x.mean(0), consensus_distance(x)
    t = 30
    for _ in range(t):
        x = gossip_step(x, adj, w, list(range(12)), Mean()).models
    assert torch.allclose(x.mean(0), mean0, atol=1e-12)
    assert consensus_distance(x) <= rho ** (2 * t) * d0 * (1 + 1e-9)
    # the asymptotic per-step factor is rho² (the slowest mode dominates)
    d1 = consensus_distance(x)
    x2 = gossip_step(x, adj, w, list(range(12)), Mean()).models
    assert consensus_distance(x2) / d1 == pytest.approx(rho ** 2, rel=1e-3)


def test_gossip_step_with_mean_is_the_matrix_product():
    adj = graphs.build_graph("exponential", 9)
    w = graphs.mixing_matrix(adj)
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.allclose(gossip_step(x, adj, w, list(range(9)), Mean()).models, torch.as_tensor(w) @ x)


# ------------------------------------------------------------------ the robust rules, by hand

# node i with self-weight and four neighbours, all weights 1/5; differences 0 (itself), 1, 2, 3, 10
ROWS = torch.tensor([[0.0], [1.0], [2.0], [3.0], [10.0]], dtype=torch.float64)
CTX = ServerContext.default(ROWS, own_row=0)


def test_cs_plus_worked_example():
    """b = 1: δ = 1/5, and the rows whose cumulative weight (nearest first) stays ≤ 1 − 2δ = 3/5
    are 0, 1, 2, so τ = 2: the two farthest (3 and 10) are clipped to 2 and the move is
    (0 + 1 + 2 + 2 + 2)/5 = 1.4 (the plain mean would move 3.2). Signs are kept: with −2 in place of
    2, the move is (0 + 1 − 2 + 2 + 2)/5 = 0.6."""
    dec = CSPlus(b=1)(ROWS, CTX)
    assert dec.state["tau"] == pytest.approx(2.0) and float(dec.aggregate) == pytest.approx(1.4)
    assert dec.accepted.all()
    rows = ROWS.clone()
    rows[2] = -2.0
    assert float(CSPlus(b=1)(rows, CTX).aggregate) == pytest.approx(0.6)
    # b = 0: nothing to tolerate, the plain mean; b = 3: 2δ ≥ the neighbours' weight, τ = 0 (stay)
    assert float(CSPlus(b=0)(ROWS, CTX).aggregate) == pytest.approx(3.2)
    assert float(CSPlus(b=3)(ROWS, CTX).aggregate) == pytest.approx(0.0)


def test_clipped_gossip_worked_example():
    """He et al.'s radius: the nearest rows holding weight 1 − δ = 4/5 are 0, 1, 2, 3, so
    τ² = (1/5)(0 + 1 + 4 + 9)/(1/5) = 14 and only 10 is clipped, to √14: the move is
    (6 + √14)/5. The release's second-largest rule: τ = 3, the move (0 + 1 + 2 + 3 + 3)/5 = 1.8.
    A fixed τ = 1: (0 + 1 + 1 + 1 + 1)/5 = 0.8."""
    dec = ClippedGossip(b=1)(ROWS, CTX)
    assert dec.state["tau"] == pytest.approx(math.sqrt(14))
    assert float(dec.aggregate) == pytest.approx((6 + math.sqrt(14)) / 5)
    assert float(ClippedGossip(b=1, tau_rule="second_largest")(ROWS, CTX).aggregate) == pytest.approx(1.8)
    assert float(ClippedGossip(b=1, tau=1.0)(ROWS, CTX).aggregate) == pytest.approx(0.8)


def test_ios_worked_example():
    """b = 1: the mean of all five is 3.2; the farthest from it is 10 (6.8 away), dropped; the move
    is (0 + 1 + 2 + 3)/4 = 1.5. b = 2: then the mean is 1.5 and the farthest of the neighbours is
    3 (1.5 away, the node's own 0 is as far but never dropped): (0 + 1 + 2)/3 = 1."""
    dec = IOS(b=1)(ROWS, CTX)
    assert float(dec.aggregate) == pytest.approx(1.5)
    assert dec.accepted.tolist() == [True, True, True, True, False] and 4 in dec.reasons
    assert float(IOS(b=2)(ROWS, CTX).aggregate) == pytest.approx(1.0)


def test_robust_rules_reject_nonfinite_rows_and_refuse_unset_b():
    rows = ROWS.clone()
    rows[3] = float("nan")
    for rule in (CSPlus(b=1), ClippedGossip(b=1), IOS(b=1)):
        dec = rule(rows, CTX)
        assert torch.isfinite(dec.aggregate).all() and not bool(dec.accepted[3]) and 3 in dec.reasons
        with pytest.raises(Exception, match="b = None"):
            type(rule)()(ROWS, CTX)


# ------------------------------------------------------------------ the topology-aware attacks


def _ctx(x: torch.Tensor, adj: np.ndarray, w: np.ndarray, honest: list[int], target: int, byz: list[int]):
    hon = [j for j in np.flatnonzero(adj[target]) if j not in byz]
    lap = graphs.laplacian(adj[np.ix_(honest, honest)], w[np.ix_(honest, honest)])
    return GossipContext(
        round=0, step=0, target=target, target_model=x[target], neighbours=tuple(hon), neighbour_models=x[hon],
        neighbour_weights=torch.tensor([w[target, j] for j in hon], dtype=x.dtype), self_weight=float(w[target, target]),
        attackers=tuple(byz), attacker_weights=torch.tensor([w[target, j] for j in byz], dtype=x.dtype),
        own_models=x[byz], honest=tuple(honest), honest_models=x[honest], laplacian=torch.as_tensor(lap),
        fiedler=torch.as_tensor(graphs.fiedler_vector(lap)), position=honest.index(target),
        generator=torch.Generator().manual_seed(0))


def _run_attack(attack, adj, w, x, byz, steps, rule=None):
    honest = [i for i in range(x.shape[0]) if i not in byz]

    for _ in range(steps):
        def send(i, hon, b, x=x):
            return attack.craft_gossip(_ctx(x, adj, w, honest, i, list(b)))

        x = gossip_step(x, adj, w, honest, rule or Mean(), send, frozenset(byz)).models
    return x


def test_dissensus_freezes_or_reverses_the_attacked_nodes():
    """A 5-ring with node 4 Byzantine: nodes 0 and 3 each have one Byzantine neighbour. Under plain
    gossip a node moves by Σ_honest W_ij (x_j − x_i) + δ (m − x_i); dissensus sends
    m = x_i + ε Σ_honest W_ij (x_i − x_j)/δ, so the move is (1 − ε) Σ_honest W_ij (x_j − x_i):
    ε = 1 freezes nodes 0 and 3, ε = 2 moves them away from their honest neighbour by as much as
    honest gossip would have moved them towards it."""
    adj = graphs.build_graph("ring", 5)
    w = graphs.mixing_matrix(adj)
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [7.0]], dtype=torch.float64)
    frozen = _run_attack(Dissensus(scale=1.0), adj, w, x, [4], 1)
    assert frozen[0, 0] == pytest.approx(0.0) and frozen[3, 0] == pytest.approx(3.0)
    assert frozen[1, 0] == pytest.approx(1.0) and frozen[2, 0] == pytest.approx(2.0)  # (0+1+2)/3, (1+2+3)/3
    pushed = _run_attack(Dissensus(scale=2.0), adj, w, x, [4], 1)
    assert pushed[0, 0] == pytest.approx(-1 / 3) and pushed[3, 0] == pytest.approx(3 + 1 / 3)
    # over many steps the honest nodes never agree: their consensus distance grows
    honest = [0, 1, 2, 3]
    far = _run_attack(Dissensus(scale=2.0), adj, w, x, [4], 20)
    calm = _run_attack(Dissensus(scale=0.0), adj, w, x, [4], 20)  # ε = 0: the Byzantine node echoes x_i
    assert consensus_distance(far[honest]) > 10 * consensus_distance(x[honest])
    assert consensus_distance(calm[honest]) < 0.1 * consensus_distance(x[honest])


def _two_worlds(b: int, bridges: int = 2, half: int = 5):
    """Gaucher et al.'s setting: two cliques of ``half`` honest nodes joined by ``bridges`` edges per
    node, and b Byzantine nodes linked to every honest node; the halves start at −1 and +1."""
    n_h = 2 * half
    sub = graphs.build_graph("two_worlds", n_h, bridges=bridges)
    adj = np.zeros((n_h + b, n_h + b), dtype=bool)
    adj[:n_h, :n_h] = sub
    adj[n_h:, :n_h] = adj[:n_h, n_h:] = True
    claimed = adj.sum(1)
    claimed[n_h:] = 1  # the Byzantine nodes understate their degree: weight 1/(1 + deg_i), as in the regime
    w = graphs.mixing_matrix(adj, degrees=claimed)
    x = torch.cat([torch.full((half, 1), -1.0), torch.full((half, 1), 1.0), torch.zeros((b, 1))]).to(torch.float64)
    x[:n_h] += 0.01 * torch.randn(n_h, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return adj, w, x, list(range(n_h, n_h + b)), list(range(n_h))


def test_spectral_attack_holds_or_grows_the_fiedler_component():
    """Under plain gossip the honest models move by X ← X − L X + scale · μ₂ · u uᵀX, so the
    spectral attack multiplies their Fiedler component uᵀX by exactly 1 + (scale − 1) μ₂ per step:
    scale = 1 holds the two worlds' difference still, scale = 2 makes it grow by 1 + μ₂ (here
    μ₂ = 1/2: ×1.5 per step), and with scale = 0 (Byzantine nodes echoing each x_i) gossip merges
    the halves."""
    adj, w, x, byz, honest = _two_worlds(b=1)
    lap = graphs.laplacian(adj[np.ix_(honest, honest)], w[np.ix_(honest, honest)])
    u = torch.as_tensor(graphs.fiedler_vector(lap))
    mu2 = graphs.algebraic_connectivity(lap)
    assert mu2 == pytest.approx(0.5)  # the honest edges weigh 1/8 (degree 7); μ₂ of the unit Laplacian is 4
    c0 = float(u @ x[honest, 0])
    for scale, factor in ((1.0, 1.0), (2.0, 1.5), (0.0, 0.5)):
        one = _run_attack(Spectral(factor="normalised", scale=scale), adj, w, x, byz, 1)
        assert float(u @ one[honest, 0]) == pytest.approx(factor * c0, rel=1e-9)

    def gap(m):
        return float(m[5:10].mean() - m[:5].mean())

    assert abs(gap(_run_attack(Spectral(factor="normalised", scale=0.0), adj, w, x, byz, 30))) < 0.05 * abs(gap(x))
    assert abs(gap(_run_attack(Spectral(factor="normalised", scale=2.0), adj, w, x, byz, 10))) > 10 * abs(gap(x))


@pytest.mark.parametrize("b,robust", [(1, True), (2, False), (3, False)])
def test_cs_plus_breakdown_on_two_worlds_matches_the_bridges(b, robust):
    """The breakdown point, checked on a worked example. In the two-worlds graph each honest node
    has ``bridges`` = 2 honest neighbours in the other half and b Byzantine ones. With b ≥ 2 the
    Byzantine nodes can show each half a copy of itself where the other half should be, so no rule
    can tell the halves' true values apart (the indistinguishability behind Gaucher et al.'s
    topology-dependent breakdown bound); CS+ clips the farthest 2b neighbours, which are then all
    the other half's: the halves stop mixing. With b = 1 < 2, CS+ keeps unclipped bridges and the
    honest nodes reach consensus despite the spectral attack."""
    adj, w, x, byz, honest = _two_worlds(b=b)
    out = _run_attack(Spectral(factor="normalised", scale=2.0), adj, w, x, byz, 60, rule=CSPlus(b=b))
    halves = float(out[5:10].mean() - out[:5].mean())
    if robust:
        assert abs(halves) < 0.05 and consensus_distance(out[honest]) < 1e-3
    else:
        assert abs(halves) > 1.0


# ------------------------------------------------------------------ the regime

DOC = {"scenario": {"seed": 0}, "workload": {"name": "digits"},
       "federation": {"clients": 8, "rounds": 3, "local_steps": 3, "batch_size": 16, "lr": 0.1, "partition": "iid"},
       "gossip": {"topology": "ring", "attackers": 1, "steps": 1}, "attack": "none", "defense": "mean"}


def doc(attack="none", defense="mean", **gossip):
    d = copy.deepcopy(DOC)
    d["attack"], d["defense"] = attack, defense
    d["gossip"].update(gossip)
    return d


def test_make_run_picks_the_gossip_regime_and_records_its_metrics():
    r = make_run(parse_scenario(doc()))
    assert isinstance(r, GossipRun)
    res = r.run()
    assert len(res.records) == 3
    g = res.records[-1].extra["gossip"]
    assert g["worst_accuracy"] <= res.records[-1].accuracy
    assert g["spectral_gap"] == pytest.approx(graphs.spectral_gap(graphs.mixing_matrix(graphs.build_graph("ring", 8))))
    m = summarize(res.records, res.records)
    assert m["worst_honest_accuracy"] == g["worst_accuracy"] and m["consensus_distance"] == g["consensus_distance"]
    assert m["spectral_gap"] == pytest.approx(g["spectral_gap"])
    # deterministic under the seed
    again = make_run(parse_scenario(doc())).run()
    assert [x.accuracy for x in again.records] == [x.accuracy for x in res.records]


def test_regime_graph_gossip_only_reaches_consensus():
    """Gossip only (no training), on the regime's own graph and rule, from scattered models: the
    consensus distance falls at least as fast as (1 − gap)^(2t)."""
    r = GossipRun(parse_scenario(doc(attackers=0, topology="torus")))
    x0 = r.params0.unsqueeze(0) + 0.1 * torch.randn(8, r.params0.numel(), generator=torch.Generator().manual_seed(0))
    w = graphs.mixing_matrix(r.adj)
    x = x0.clone()
    for _ in range(20):
        x = gossip_step(x, r.adj, w, list(range(8)), r.defense).models
    rho = 1 - graphs.spectral_gap(w)
    assert consensus_distance(x) <= rho ** 40 * consensus_distance(x0) * 1.001 + 1e-12


@pytest.mark.parametrize("attack", ["dissensus", "spectral", "sign_flip", "alie", "label_flip"])
def test_attacks_run_in_the_regime_and_hurt_plain_gossip(attack):
    base = make_run(parse_scenario(doc(attack)), attack=parse_scenario(doc()).attack).run()
    hit = make_run(parse_scenario(doc(attack))).run()
    assert hit.malicious == base.malicious and len(hit.malicious) == 1
    rec = hit.records[-1]
    assert rec.malicious[hit.malicious[0]] and sum(rec.malicious) == 1
    if attack in ("dissensus", "sign_flip"):
        assert rec.extra["gossip"]["consensus_distance"] > base.records[-1].extra["gossip"]["consensus_distance"]


def test_ios_rejections_are_scored_as_detections():
    res = make_run(parse_scenario(doc("dissensus", {"name": "ios"}, topology="complete", placement="everywhere"))).run()
    m = summarize(res.records)
    assert m["tp"] > 0 and m["recall"] == pytest.approx(1.0)


def test_placements_and_churn():
    hubs = GossipRun(parse_scenario(doc(topology="erdos_renyi", probability=0.5, placement="hubs", attackers=2)))
    deg = hubs.adj.sum(1)
    assert min(deg[hubs.malicious]) >= max(np.delete(deg, hubs.malicious))
    every = GossipRun(parse_scenario(doc(topology="ring", placement="everywhere", attackers=2)))
    for b_ in every.malicious:
        assert every.adj[b_, every.honest].all()
    churn = make_run(parse_scenario(doc(topology="complete", churn=0.5))).run()
    edges = [r.extra["gossip"]["edges"] for r in churn.records]
    assert len(set(edges)) > 1 and max(edges) < 28


@pytest.mark.parametrize("bad,match", [
    ({"gossip": {"attackers": 8}}, "attackers"),
    ({"gossip": {"topology": "star"}}, "topology"),
    ({"federation": {"clients": 8, "malicious_fraction": 0.25}}, "malicious_fraction"),
    ({"gossip": {"topology": "two_worlds", "bridges": 5}}, "bridges"),
    ({"gossip": {"topology": "torus", "rows": 3}}, "rows"),
    ({"pipeline": {}}, "two regimes"),
])
def test_gossip_section_is_validated(bad, match):
    d = doc()
    for k, v in bad.items():
        d.setdefault(k, {}).update(v)
    with pytest.raises(InvalidScenario, match=match):
        parse_scenario(d)


def test_scenarios_without_gossip_keep_their_digest():
    d = {"federation": {"clients": 4}}
    assert "gossip" not in parse_scenario(d).to_dict()


# ------------------------------------------------------------------ today's rules on a neighbourhood
# The path 0 – 1 – 2 with node 3 hanging on node 1 (HAND above); node 3 is Byzantine and sends
# node 1 the model (100, −100). Honest models x0 = (0, 4), x1 = (1, 1), x2 = (3, 0).
NEIGH_X = torch.tensor([[0.0, 4.0], [1.0, 1.0], [3.0, 0.0], [7.0, 7.0]], dtype=torch.float64)
NEIGH_W = graphs.mixing_matrix(HAND)


def _neigh_step(rule, states=None):
    def send(i, hon, byz):
        return torch.tensor([[100.0, -100.0]], dtype=torch.float64)

    return gossip_step(NEIGH_X, HAND, NEIGH_W, [0, 1, 2], rule, send, frozenset({3}), states=states)


def test_coordinate_median_over_a_neighbourhood_by_hand():
    """Node 1 sees its own model and x0, x2 and the Byzantine (100, −100): four values per
    coordinate, so the midpoint median. Coordinate 1: 0, 1, 3, 100 → (1 + 3)/2 = 2; coordinate 2:
    −100, 0, 1, 4 → (0 + 1)/2 = 0.5. The median is translation-equivariant, so the centred rows
    the node passes give the same model: node 1 → (2, 0.5), the Byzantine outlier ignored. The
    leaves 0 and 2 see two models each, the midpoint of which is their mean: (0.5, 2.5) and (2, 0.5)."""
    res = _neigh_step(DEFENSES.create("median", {}))
    want = torch.tensor([[0.5, 2.5], [2.0, 0.5], [2.0, 0.5], [7.0, 7.0]], dtype=torch.float64)
    assert torch.allclose(res.models, want, atol=1e-12)
    assert not res.refused and res.accepted == {0: True, 1: True, 2: True, 3: True}


def test_trimmed_mean_over_a_neighbourhood_by_hand_and_thinned_on_the_leaves():
    """b = 1 on node 1's four values: drop the extremes per coordinate, average the middle two —
    (1 + 3)/2 = 2 and (0 + 1)/2 = 0.5, as the median. The leaves have two rows, too few to trim one
    per side (2b < n fails): the rule trims as much as the neighbourhood holds (b = 0, the mean)
    and says so in the node's state (b_reduced_from = 1)."""
    states: dict = {}
    res = _neigh_step(DEFENSES.create("trimmed_mean", {"b": 1}), states)
    want = torch.tensor([[0.5, 2.5], [2.0, 0.5], [2.0, 0.5], [7.0, 7.0]], dtype=torch.float64)
    assert torch.allclose(res.models, want, atol=1e-12)
    assert states[1] == {"b": 1}
    assert states[0] == states[2] == {"b": 0, "b_reduced_from": 1}


def test_krum_refuses_a_neighbourhood_too_small_and_the_node_keeps_its_model():
    """Krum with f = 0 needs 2f + 2 < n rows: node 1 has four and scores each value by the squared
    distances to its 2 nearest others — x1: 10 + 5 = 15, x0: 10 + 25 = 35, x2: 5 + 25 = 30, the
    Byzantine value ~2·10⁴ — so it selects its own model (it stays at (1, 1)) and rejects the
    rest. The leaves have two rows: Krum refuses them, they keep their models, and the step says
    why; with f = 1 (2f + 2 = 4 rows are not enough) node 1 is refused too."""
    res = _neigh_step(DEFENSES.create("krum", {"f": 0}))
    assert torch.equal(res.models, NEIGH_X)
    assert set(res.refused) == {0, 2}
    assert all("kept its model" in why and "2f + 2 < n" in why for why in res.refused.values())
    assert res.accepted == {0: False, 2: False, 3: False}
    assert "not selected by Krum" in res.rejected[3]
    res = _neigh_step(DEFENSES.create("krum", {"f": 1}))
    assert torch.equal(res.models, NEIGH_X) and set(res.refused) == {0, 1, 2} and not res.accepted


@pytest.mark.parametrize("defense", ["median", {"name": "trimmed_mean", "b": 1}, "krum"])
def test_todays_rules_run_on_a_small_graph(defense):
    """Each rule merges every honest node of a 3 × 3 torus (five rows each: Krum's f is the largest
    the neighbourhood allows, 1) under a sign-flip node; the honest nodes come closer together than
    training alone leaves them (no merging: the same run with a rule every node refuses)."""
    d = doc("sign_flip", defense, topology="torus", rows=3)
    d["federation"]["clients"] = 9
    res = make_run(parse_scenario(d)).run()
    assert len(res.records) == 3
    for rec in res.records:
        assert math.isfinite(rec.accuracy) and "refused" not in rec.extra["gossip"]
    apart = copy.deepcopy(d)
    apart["defense"] = {"name": "krum", "f": 2}  # 2f + 2 = 6 > 5 rows: every node refuses, nobody merges
    alone = make_run(parse_scenario(apart)).run()
    assert all(len(r.extra["gossip"]["refused"]) == 8 for r in alone.records)
    merged, apart_ = (r.records[-1].extra["gossip"]["consensus_distance"] for r in (res, alone))
    assert merged < apart_


def test_the_regime_records_each_node_whose_neighbourhood_krum_refuses():
    """An Erdős–Rényi graph with nodes of several degrees, Krum with f = 1 (needs 1 + degree > 4):
    exactly the nodes of degree ≤ 3 are refused in every round, each with Krum's reason."""
    d = doc("none", {"name": "krum", "f": 1}, topology="erdos_renyi", probability=0.35, attackers=0)
    d["federation"]["clients"] = 10
    run = GossipRun(parse_scenario(d))
    deg = run.adj.sum(1)
    small = {i for i in range(10) if deg[i] <= 3}
    assert small and len(small) < 10  # the graph has both kinds of node
    for rec in run.run().records:
        refused = rec.extra["gossip"]["refused"]
        assert set(refused) == small
        assert all("kept its model" in why and "2f + 2 < n" in why for why in refused.values())


# ------------------------------------------------------------------ the spectral attack's factor


def test_line_maximize_by_hand():
    """The authors' search on c ↦ −(c − 5)²: from 0 with step 1, doubling — 1, 3, 7 (worse: 7 is
    past the peak; step 4·0.8 = 3.2) — then probing towards the best c = 3 and contracting:
    7 − 3.2 = 3.8 (better), then from below … it ends within a small step of 5 in 16 evaluations.
    A score that never improves returns the start; a monotone one keeps doubling (c = 2¹⁵ − 1)."""
    from attacks.gossip import line_maximize

    seen = []

    def peak(c):
        seen.append(c)
        return -(c - 5.0) ** 2

    best = line_maximize(peak)
    assert seen[:5] == [0.0, 1.0, 3.0, 7.0, pytest.approx(3.8)] and len(seen) == 16
    assert abs(best - 5.0) < 0.3
    assert line_maximize(lambda c: -c) == 0.0
    assert line_maximize(lambda c: c) == 2 ** 15 - 1


def test_spectral_factor_options():
    """``raw`` sends x_i + scale · u_i uᵀX; ``normalised`` scales it by μ₂/δ_i (on the two-worlds graph
    μ₂ = 1/2 and δ_i = W_ib, so the two differ by that ratio); ``line_search`` (the default, as the
    authors' code) picks c against the node's rule: against plain gossip the distance to the honest
    target grows with c, so the search keeps doubling, and CS+ caps what any c achieves."""
    adj, w, x, byz, honest = _two_worlds(b=1)
    ctx = _ctx(x, adj, w, honest, 0, byz)
    lap = graphs.laplacian(adj[np.ix_(honest, honest)], w[np.ix_(honest, honest)])
    u = torch.as_tensor(graphs.fiedler_vector(lap))
    v = u[0] * (u @ x[honest])
    raw = Spectral(factor="raw", scale=3.0).craft_gossip(ctx)
    assert torch.allclose(raw[0], x[0] + 3.0 * v)
    norm = Spectral(factor="normalised", scale=3.0).craft_gossip(ctx)
    assert torch.allclose(norm[0], x[0] + 3.0 * 0.5 / float(w[0, byz[0]]) * v)
    free = Spectral().craft_gossip(ctx)  # no rule known: the weighted mean
    assert torch.allclose(free[0], x[0] + (2 ** 15 - 1) * v)
    import dataclasses

    capped = Spectral().craft_gossip(dataclasses.replace(ctx, defense=CSPlus(b=1)))
    assert float((capped[0] - x[0]).norm()) < float((free[0] - x[0]).norm())
    with pytest.raises(Exception, match="line_search"):
        Spectral(scale=2.0)
    with pytest.raises(Exception, match="factor"):
        Spectral(factor="fixed")


def test_spectral_line_search_runs_in_the_regime_against_the_nodes_rule():
    """In the regime the attack searches against the [defense] rule the nodes use (GossipContext.defense)."""
    hit = make_run(parse_scenario(doc("spectral", "cs_plus", topology="complete", placement="everywhere"))).run()
    base = make_run(parse_scenario(doc("none", "cs_plus", topology="complete", placement="everywhere"))).run()
    assert len(hit.records) == 3 and all(math.isfinite(r.accuracy) for r in hit.records)
    spread = [r.records[-1].extra["gossip"]["consensus_distance"] for r in (hit, base)]
    assert spread[0] != spread[1]


@pytest.mark.parametrize("announced, expect_claimed", [("one", True), ("true", False)])
def test_byzantine_degree_is_a_named_choice(monkeypatch, announced, expect_claimed):
    """In the attack window the Byzantine nodes announce degree 1 (the largest Metropolis–Hastings
    weight each honest neighbour can give them) unless [gossip] byzantine_degree = "true"."""
    seen = []
    real = graphs.mixing_matrix

    def spy(adj, mixing="metropolis_hastings", claimed=None):
        seen.append(None if claimed is None else list(map(int, claimed)))
        return real(adj, mixing, claimed)

    monkeypatch.setattr(graphs, "mixing_matrix", spy)
    r = make_run(parse_scenario(doc({"name": "sign_flip"}, byzantine_degree=announced)))
    r.run()
    lied = [c for c in seen if c is not None]
    assert bool(lied) == expect_claimed
    if lied:
        assert all(c[m] == 1 for c in lied for m in r.malicious)
