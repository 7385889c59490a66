"""RFLBAT (arXiv:2201.03772), Multi-Metrics (ICCV 2023) and AlignIns (CVPR 2025): worked
examples derived by hand or by an independent transcription of the published formulas
written here (never by calling the implementation), thresholds, clear backdoor clusters,
parameter errors and the plugin contract."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from defenses.alignins import AlignIns
from defenses.multi_metrics import MultiMetrics
from defenses.rflbat import RFLBAT, gap_statistic, kmeans
from redteam.errors import InvalidParameter
from redteam.testing import check_defense
from redteam.types import ServerContext


def _ctx(x, **kw):
    return ServerContext.default(x, **kw)


# ----------------------------------------------------------------------------- AlignIns
# Six updates in 6 coordinates, sparsity 0.7: k = ⌊0.7·6⌋ = 4 inspected coordinates per row.
# Every row's four largest |entries| are columns 0–3 (magnitudes 4, 3, 2, 1 — row 2 is twice
# (4, 3, −2, 1, ½, −¼)); columns 4–5 are smaller.
#   signs on columns 0–3:  r0 + − − −   r1 + + + −   r2 + + − +   r3 − + + +   r4 + + + +   r5 + + + +
#   column sign sums (0–3): +4, +4, +2, +2 -> principal sign + on all four
#   MPSA = share of the four that are +: (1/4, 3/4, 3/4, 3/4, 1, 1)
#   median = 3/4 (midpoint of 3/4, 3/4); mean = 4.5/6 = 3/4; population variance
#   = ((1/2)² + 2·(1/4)²)/6 = (3/8)/6 = 1/16 -> std = 1/4 (every step exact in binary)
#   MZ(MPSA) = |x − 3/4| / (1/4) = (2, 0, 0, 0, 1, 1)
# TDA with θ = (1, 1, 1, 1, 0, 0): cos = (signed sum of columns 0–3)/(‖row‖·2), signed sums
#   (−2, 8, 6·2, 2, 10, 10) over norms (n, n, 2n, n, n, n), n = √30.3125 -> ∝ (−2, 8, 6, 2, 10, 10)
#   median 7, mean 17/3, E[x²] = 154/3, std = √(154/3 − 289/9) = √173/3 (in those units)
#   -> MZ(TDA) = (9, 1, 1, 5, 3, 3)·3/√173 ≈ (2.05, 0.23, 0.23, 1.14, 0.68, 0.68)
# Benign: MZ(MPSA) < 1 and MZ(TDA) < 1 (strict). Row 0 fails both, row 3 fails TDA, and rows 4
# and 5 sit exactly ON λ_s = 1 — the authors' test is mz < λ (np.argwhere(mz < λ)), so a score
# on the threshold is an outlier: they are removed although they agree with the majority
# everywhere (the MZ-score is two-sided). Benign {1, 2}: norms n and 2n, the lower median is n,
# so row 2 is halved; aggregate (equal weights) = (r1 + r2/2)/2 = (4, 3, 0, 0, 0, 0).
ALIGN = torch.tensor([
    [4.0, -3.0, -2.0, -1.0, 0.5, 0.25],
    [4.0, 3.0, 2.0, -1.0, -0.5, 0.25],
    [8.0, 6.0, -4.0, 2.0, 1.0, -0.5],
    [-4.0, 3.0, 2.0, 1.0, 0.5, -0.25],
    [4.0, 3.0, 2.0, 1.0, -0.5, -0.25],
    [4.0, 3.0, 2.0, 1.0, 0.5, 0.25],
], dtype=torch.float64)
THETA = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)


def _mz(values):
    med = statistics.median(values)
    sd = statistics.pstdev(values)
    return [abs(v - med) / sd for v in values]


def test_alignins_worked_example_tda_mpsa_mz_and_the_row_on_the_threshold():
    dec = AlignIns(sparsity=0.7)(ALIGN, _ctx(ALIGN, global_params=THETA))
    st = dec.state
    assert st["k"] == 4
    assert st["mpsa"] == [0.25, 0.75, 0.75, 0.75, 1.0, 1.0]
    assert st["mz_mpsa"] == [2.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # exact: rows 4, 5 exactly on λ_s
    rows = ALIGN.tolist()
    tda = [sum(r[c] * THETA[c].item() for c in range(6))
           / (math.sqrt(sum(v * v for v in r)) * math.sqrt(4.0)) for r in rows]
    assert st["tda"] == pytest.approx(tda, abs=1e-12)
    assert st["mz_tda"] == pytest.approx(_mz(tda), abs=1e-9)
    assert st["mz_tda"][3] == pytest.approx(15 / math.sqrt(173), abs=1e-9)  # > 1: row 3 out
    assert dec.accepted.tolist() == [False, True, True, False, False, False]
    assert dec.aggregate.tolist() == pytest.approx([4.0, 3.0, 0.0, 0.0, 0.0, 0.0], abs=1e-12)
    assert st["bound"] == pytest.approx(math.sqrt(30.3125))
    assert "MPSA 1 ≥ λ_s = 1" in dec.reasons[4] and "TDA" not in dec.reasons[4]
    assert "TDA" in dec.reasons[3] and "MPSA" not in dec.reasons[3]
    assert "MPSA" in dec.reasons[0] and "TDA" in dec.reasons[0]


def test_alignins_just_above_the_threshold_and_the_other_conventions():
    ctx = _ctx(ALIGN, global_params=THETA)
    # λ_s a hair above 1: rows 4 and 5 (MZ = 1) are now inside; their MZ(TDA) ≈ 0.68 < 1
    dec = AlignIns(sparsity=0.7, lambda_s=1.0 + 1e-9)(ALIGN, ctx)
    assert dec.accepted.tolist() == [False, True, True, False, True, True]
    # benign norms n, 2n, n, n: lower median n (the code's torch.median); midpoint also n here
    assert dec.state["bound"] == pytest.approx(math.sqrt(30.3125))
    # midpoint median of {n, 2n} (the worked example's benign pair) = 1.5n: row 2 scaled by 3/4
    mid = AlignIns(sparsity=0.7, clip_median="midpoint")(ALIGN, ctx)
    r1, r2 = ALIGN[1], ALIGN[2]
    assert mid.aggregate.tolist() == pytest.approx(((r1 + 0.75 * r2) / 2).tolist(), abs=1e-12)
    # no clipping: the plain mean of rows 1 and 2
    raw = AlignIns(sparsity=0.7, clip=False)(ALIGN, ctx)
    assert raw.aggregate.tolist() == pytest.approx(((r1 + r2) / 2).tolist(), abs=1e-12)
    # sample weights 1 and 3 on the benign pair (weighted, the authors' FedAvg)
    w = torch.tensor([1.0, 1.0, 3.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    wd = AlignIns(sparsity=0.7)(ALIGN, _ctx(ALIGN, global_params=THETA, weights=w))
    assert wd.aggregate.tolist() == pytest.approx(((r1 + 3 * 0.5 * r2) / 4).tolist(), abs=1e-12)
    # the refusal without the global model, and the updates-only reading
    with pytest.raises(InvalidParameter, match="ctx.global_params"):
        AlignIns()(ALIGN)
    mean_ref = AlignIns(sparsity=0.7, tda_reference="mean_update")(ALIGN)
    mu = ALIGN.mean(dim=0)
    tda = (ALIGN @ mu / (ALIGN.norm(dim=1) * mu.norm())).tolist()
    assert mean_ref.state["tda"] == pytest.approx(tda, abs=1e-12)


def test_alignins_two_clients_sit_on_the_threshold_and_copies_pass():
    # n = 2: each value lies exactly one (population) standard deviation from the midpoint
    # median, so both MZ-scores are 1 = λ: both removed, the aggregate is 0 (as in the code)
    x = torch.tensor([[1.0, 2.0, -1.0], [-3.0, 0.5, 2.0]])
    dec = AlignIns(tda_reference="mean_update")(x)
    assert dec.accepted.tolist() == [False, False] and dec.aggregate.tolist() == [0.0, 0.0, 0.0]
    # copies of one update: no spread, every MZ-score 0 (the code divides 0 by 0 and drops all)
    same = torch.tensor([[0.5, -1.0, 2.0]] * 4)
    dec = AlignIns()(same, _ctx(same, global_params=torch.ones(3)))
    assert dec.accepted.all() and dec.aggregate.tolist() == pytest.approx([0.5, -1.0, 2.0])


# ------------------------------------------------------------------------- Multi-Metrics
# Four updates in ℝ³ on the global model w₀ = (1, 0, 0); p = 0.3 keeps ⌊0.3·4⌋ = 1.
W0 = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
MM = torch.tensor([[0.5, 0.1, 0.0], [0.4, -0.2, 0.1], [0.6, 0.0, -0.1], [-1.0, 2.0, 1.0]], dtype=torch.float64)


def _whitened(x):
    """The paper's δᵢ = √(xᵢᵀ Σ⁻¹ xᵢ), Σ = numpy's sample covariance (as the authors' code)."""
    x = np.asarray(x, dtype=np.float64)
    inv = np.linalg.inv(np.cov(x.T))
    return [math.sqrt(float(t @ inv @ t)) for t in x]


def test_multi_metrics_worked_example_paper_features():
    rows = MM.tolist()
    w0 = W0.tolist()
    feats = []
    for r in rows:
        w = [a + b for a, b in zip(w0, r)]
        cos = sum(a * b for a, b in zip(w0, w)) / (math.sqrt(sum(a * a for a in w0)) * math.sqrt(sum(a * a for a in w)))
        feats.append((sum(abs(v) for v in r), math.sqrt(sum(v * v for v in r)), cos))
    x = [[sum(abs(fi[c] - fj[c]) for fj in feats) for c in range(3)] for fi in feats]
    dec = MultiMetrics()(MM, _ctx(MM, global_params=W0))
    np.testing.assert_allclose(dec.state["features"], x, rtol=1e-12)
    scores = _whitened(x)
    assert dec.state["scores"] == pytest.approx(scores, rel=1e-9)
    best = min(range(4), key=lambda i: scores[i])
    assert dec.accepted.tolist() == [i == best for i in range(4)]
    assert dec.aggregate.tolist() == pytest.approx(rows[best])
    assert dec.state["kept"] == 1 and "not among the 1 lowest of 4" in dec.reasons[3]


def test_multi_metrics_worked_example_pairwise_features_of_the_code():
    # the released code: Σⱼ (1 − cos(wᵢ, wⱼ))², Σⱼ ‖wᵢ − wⱼ‖₁, Σⱼ |‖wᵢ‖ − ‖wⱼ‖| on the models wᵢ = w₀ + Δᵢ
    models = (MM + W0).numpy()
    x = []
    for i, a in enumerate(models):
        c = m = ln = 0.0
        for j, b in enumerate(models):
            if i != j:
                c += (1 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) ** 2
                m += np.abs(a - b).sum()
                ln += abs(np.linalg.norm(a) - np.linalg.norm(b))
        x.append([c, m, ln])
    dec = MultiMetrics(features="pairwise")(MM, _ctx(MM, global_params=W0))
    np.testing.assert_allclose(dec.state["features"], x, rtol=1e-9)
    scores = _whitened(x)
    assert dec.state["scores"] == pytest.approx(scores, rel=1e-7)
    assert dec.accepted.tolist() == [i == int(np.argmin(scores)) for i in range(4)]
    # on the updates themselves (the AlignIns authors' re-implementation): no w₀ needed
    upd = MultiMetrics(features="pairwise", space="updates")(MM)
    u = MM.numpy()
    assert upd.state["features"][3][1] == pytest.approx(sum(np.abs(u[3] - u[j]).sum() for j in range(3)))


def test_multi_metrics_selection_count_and_copies():
    # ⌊p·n⌋ read as a decimal: 0.29·100 is 28.999999999999996 in binary, the code keeps 28
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 5, generator=g, dtype=torch.float64)
    dec = MultiMetrics(p=0.29, features="pairwise", space="updates")(x)
    assert dec.n_accepted == 29
    # n = 3: ⌊0.9⌋ = 0 in the code (its average of nothing fails); at least one is kept
    assert MultiMetrics(features="pairwise", space="updates")(x[:3]).n_accepted == 1
    with pytest.raises(InvalidParameter, match="ctx.global_params"):
        MultiMetrics()(x)


# --------------------------------------------------------------------------------- RFLBAT
# Eight updates in ℝ⁴ that lie in the plane spanned by the orthonormal u = (0.6, 0.8, 0, 0) and
# v = (0, 0, 0.8, −0.6): Δᵢ = aᵢu + bᵢv. Their PCA plane is that plane, so the 2-D points are
# the (aᵢ, bᵢ) up to a rotation, reflection and translation, none of which changes a distance:
# EDᵢ = Σⱼ ‖(aᵢ, bᵢ) − (aⱼ, bⱼ)‖, computed here from (a, b) alone.
AB = [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (0.5, 0.5), (2.0, 0.0), (0.0, 2.0), (20.0, 20.0)]
U = torch.tensor([0.6, 0.8, 0.0, 0.0], dtype=torch.float64)
V = torch.tensor([0.0, 0.0, 0.8, -0.6], dtype=torch.float64)
PLANE = torch.stack([a * U + b * V for a, b in AB])


def _ed(points):
    return [sum(math.dist(p, q) for q in points) for p in points]


def test_rflbat_pca_points_and_both_outlier_passes():
    # k_max = 1 keeps one cluster, so both passes can be followed by hand; ε₁ = 2, ε₂ = 1.5
    dec = RFLBAT(eps1=2.0, eps2=1.5, k_max=1)(PLANE)
    st = dec.state
    order = st["rows"]  # the canonical (content) order the state lists the points in
    pts = [st["points"][order.index(i)] for i in range(8)]
    got = [[math.dist(p, q) for q in pts] for p in pts]
    want = [[math.dist(p, q) for q in AB] for p in AB]
    np.testing.assert_allclose(got, want, atol=1e-12)  # the PCA plane keeps every distance
    ed1 = _ed(AB)
    assert [st["ed1"][order.index(i)] for i in range(8)] == pytest.approx(ed1, abs=1e-10)
    thr1 = 2.0 * statistics.median(ed1)
    assert st["threshold1"] == pytest.approx(thr1)
    first = [e < thr1 for e in ed1]
    assert first == [True] * 7 + [False]  # the far point: ED ≈ 184 ≥ 2 × median ≈ 2 × 33
    rest = [p for p, keep in zip(AB, first) if keep]
    ed2 = _ed(rest)
    thr2 = 1.5 * statistics.median(ed2)
    second = [e < thr2 for e in ed2]
    assert st["threshold2"] == pytest.approx(thr2)
    expected = [p in {q for q, s in zip(rest, second) if s} for p in AB]
    assert dec.accepted.tolist() == expected
    assert expected == [True, True, True, True, True, False, False, False]  # (2, 0), (0, 2) go in pass 2
    assert "first pass" in dec.reasons[7] and "second pass" in dec.reasons[5]
    assert dec.aggregate.tolist() == pytest.approx(PLANE[:5].mean(dim=0).tolist(), abs=1e-12)


def test_rflbat_a_point_exactly_on_the_threshold_is_removed():
    # three collinear updates at 0, 1, 3 along u: ED = (4, 3, 5), median 4; ε₁ = 1.25 puts the
    # third exactly on ε₁·median = 5. Both released codes keep ED < ε·median: it is removed.
    x = torch.stack([0.0 * U, 1.0 * U, 3.0 * U])
    on = RFLBAT(eps1=1.25, eps2=10.0, k_max=1)(x)
    assert on.accepted.tolist() == [True, True, False] and "first pass" in on.reasons[2]
    above = RFLBAT(eps1=1.25 * (1 + 1e-9), eps2=10.0, k_max=1)(x)
    assert above.accepted.tolist() == [True, True, True]


def test_rflbat_kmeans_and_gap_statistic_on_two_blobs():
    # two tight, far-apart blobs: the gap statistic picks 2 and k-means separates them
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 2, generator=g, dtype=torch.float64) * 0.05
    b = torch.randn(6, 2, generator=g, dtype=torch.float64) * 0.05 + torch.tensor([5.0, 5.0], dtype=torch.float64)
    pts = torch.cat([a, b])
    k, gaps, s = gap_statistic(pts, 9, 5, torch.Generator().manual_seed(0))
    assert k == 2 and gaps[0] < gaps[1] - s[1]
    labels, centres, w = kmeans(pts[None], 2, torch.Generator().manual_seed(0))
    lab = labels[0].tolist()
    assert len(set(lab[:6])) == 1 and len(set(lab[6:])) == 1 and lab[0] != lab[6]
    # W = Σ distance to own centre (not squared), as in both released gap statistics
    own = centres[0][labels[0]]
    assert float(w[0]) == pytest.approx(float((pts - own).norm(dim=1).sum()))


# ---------------------------------------------------------------------- clear backdoors
def _backdoor_round(seed=0, d=200):
    """16 honest updates (a shared direction plus client noise) and 4 attackers that add the
    same strong push on 20 weights (one trigger) and are nearly identical to each other."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(d, generator=g)
    base = 0.3 * torch.randn(d, generator=g)
    honest = base + 0.5 * torch.randn(16, d, generator=g)
    trig = torch.zeros(d)
    trig[:20] = 3.0
    bad = base + trig + 0.1 * torch.randn(4, d, generator=g)
    x = torch.cat([honest, bad])
    return x, _ctx(x, global_params=theta, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("defense", [RFLBAT(), MultiMetrics(), MultiMetrics(features="pairwise"), AlignIns(),
                                     AlignIns(tda_reference="mean_update")], ids=repr)
def test_a_clear_backdoor_cluster_is_rejected(defense):
    x, ctx = _backdoor_round()
    dec = defense(x, ctx)
    assert not dec.accepted[16:].any(), dec.accepted.tolist()
    assert dec.accepted[:16].any()
    assert all(i in dec.reasons for i in range(16, 20))


def test_rflbat_rejects_the_self_similar_cluster_and_says_so():
    x, ctx = _backdoor_round()
    dec = RFLBAT()(x, ctx)
    st = dec.state
    assert st["k"] >= 2
    chosen = st["chosen"]
    assert st["cluster_cosine"][chosen] == min(st["cluster_cosine"])
    assert any("not the kept cluster" in dec.reasons[i] for i in range(16, 20))


def test_decisions_do_not_depend_on_client_order():
    x, ctx = _backdoor_round()
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(5))
    for defense in (RFLBAT(), MultiMetrics(), AlignIns()):
        a = defense(x, ctx)
        ctx_p = ServerContext.default(x[perm], global_params=ctx.global_params, generator=torch.Generator().manual_seed(1))
        b = defense(x[perm], ctx_p)
        assert b.accepted.tolist() == a.accepted[perm].tolist()
        assert torch.allclose(a.aggregate, b.aggregate, atol=1e-6)


# ------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("cls, field, value", [
    (RFLBAT, "eps1", 0.0), (RFLBAT, "eps2", -1.0), (RFLBAT, "k_max", 0), (RFLBAT, "gap_samples", 0),
    (RFLBAT, "n_init", 1.5), (RFLBAT, "max_iter", 0), (RFLBAT, "weighted", "yes"),
    (MultiMetrics, "p", 0.0), (MultiMetrics, "p", 1.5), (MultiMetrics, "features", "cosine"),
    (MultiMetrics, "space", "weights"), (MultiMetrics, "weighted", 1),
    (AlignIns, "lambda_c", 0.0), (AlignIns, "lambda_s", math.inf), (AlignIns, "sparsity", 0.0),
    (AlignIns, "sparsity", 1.2), (AlignIns, "tda_reference", "global"), (AlignIns, "clip", None),
    (AlignIns, "clip_median", "upper"), (AlignIns, "weighted", "no"),
])
def test_bad_parameters_name_the_field(cls, field, value):
    with pytest.raises(InvalidParameter, match=rf"{cls.__name__}\.{field} = "):
        cls(**{field: value})


@pytest.mark.parametrize("name", ["rflbat", "multi_metrics", "alignins"])
def test_contract(name):
    check_defense(name)
