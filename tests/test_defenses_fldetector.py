"""FLDetector (Zhang et al., KDD 2022): L-BFGS product, gap statistic, 2-means, detection by client id."""

from __future__ import annotations

import math

import pytest
import torch

from defenses.fldetector import FLDetector, _split_costs, gap_says_clusters, lbfgs_hvp, two_means_split
from defenses.median import Median
from redteam.errors import InvalidParameter
from redteam.pipeline import Pipeline
from redteam.types import ServerContext


def test_lbfgs_one_pair_by_hand():
    # s = (1, 0), y = (2, 0): σ = yᵀs/sᵀs = 2; m = 1 so L = 0, D = sᵀy = 2, M = [[σsᵀs, 0], [0, −D]]
    # = [[2, 0], [0, −2]].
    # v = (1, 1): q = [σsᵀv; yᵀv] = [2; 2], p = M⁻¹q = [1; −1],
    #   Ĥv = σv − (σs·1 + y·(−1)) = (2, 2) − ((2, 0) − (2, 0)) = (2, 2).
    # v = (0, 1): q = [0; 0] -> Ĥv = σv = (0, 2).
    s = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    assert lbfgs_hvp(s, y, torch.tensor([1.0, 1.0], dtype=torch.float64)).tolist() == pytest.approx([2.0, 2.0])
    assert lbfgs_hvp(s, y, torch.tensor([0.0, 1.0], dtype=torch.float64)).tolist() == pytest.approx([0.0, 2.0])


def test_lbfgs_two_pairs_recover_a_diagonal_hessian():
    # H = diag(2, 3); pairs s₁ = (1, 0), y₁ = (2, 0); s₂ = (0, 1), y₂ = (0, 3).
    # σ = y₂ᵀs₂/s₂ᵀs₂ = 3; SᵀS = I; A = SᵀY = diag(2, 3) so L = 0, D = diag(2, 3);
    # M = [[3I, 0], [0, −D]]. v = (1, 1): q = [3Sᵀv; Yᵀv] = [3, 3, 2, 3], p = [1, 1, −1, −1];
    # Ĥv = 3v − (3S ᵀp₁ + Yᵀp₂) = (3, 3) − ((3, 3) − (2, 3)) = (2, 3) = Hv.
    s = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([[2.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    assert lbfgs_hvp(s, y, torch.tensor([1.0, 1.0], dtype=torch.float64)).tolist() == pytest.approx([2.0, 3.0])
    # a degenerate history (s = 0) predicts no change
    assert lbfgs_hvp(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(2)).tolist() == [0.0, 0.0]


def test_split_costs_and_two_means_by_hand():
    # x = (0, 1, 10): W₁ = 0 + 1 + 100 − 11²/3 = 60.667; split after 0: 0 + (1 + 100 − 11²/2) = 40.5;
    # split after 1: (0 + 1 − 1²/2) + 0 = 0.5
    w1, costs = _split_costs(torch.tensor([[0.0, 1.0, 10.0]], dtype=torch.float64))
    assert float(w1[0]) == pytest.approx(60 + 2 / 3)
    assert costs[0].tolist() == pytest.approx([40.5, 0.5])
    assert two_means_split(torch.tensor([0.52, 0.1, 0.5, 0.12, 0.11])).tolist() == [True, False, True, False, False]


def test_gap_statistic_separates_two_groups_only():
    g = torch.Generator().manual_seed(0)
    two = torch.tensor([0.10, 0.11, 0.12, 0.10, 0.11, 0.50, 0.52, 0.51])
    assert gap_says_clusters(two, 10, g)[0]
    one = torch.linspace(0.0, 1.0, 10)
    assert not gap_says_clusters(one, 10, g)[0]
    assert not gap_says_clusters(torch.full((6,), 0.2), 10, g)[0]  # no spread: one cluster


def _run(detector, rounds=8, n=10, d=20, malicious=(7, 8, 9), shuffle=False, seed=0):
    """A quadratic problem: honest client i's delta is −lr·A(w − cᵢ); the malicious send noise.
    Returns the per-round decisions (rows may be shuffled; client ids travel with them)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.linspace(0.5, 2.0, d)
    c = 1.0 + 0.1 * torch.randn(n, d, generator=g)
    w = torch.zeros(d)
    state, prev, out = {}, None, []
    for t in range(rounds):
        x = -0.1 * (w - c) * a + 0.001 * torch.randn(n, d, generator=g)
        for i in malicious:
            x[i] = 0.3 * torch.randn(d, generator=g)
        order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
        ids = tuple(int(i) for i in order)
        ctx = ServerContext.default(x[order], global_params=w.clone(), previous_update=prev, state=state,
                                    round=t, client_ids=ids)
        dec = detector(x[order], ctx)
        out.append((ids, dec))
        state, prev = dec.state, dec.aggregate
        w = w + prev
    return out


def _rejected_ids(ids, dec):
    return {ids[i] for i in (~dec.accepted).nonzero().flatten().tolist()}


def test_detects_inconsistent_clients_after_the_window_fills():
    # window 3: pairs exist from round 2 on (needs w_{t−1}, w_{t−2}, g^{t−1}, g^{t−2}), 3 pairs in round 4
    out = _run(FLDetector(window=3))
    for t in range(4):
        assert out[t][1].accepted.all(), t
    assert out[4][1].state["pairs"] == 3 and out[4][1].state["clusters"] == 2
    assert _rejected_ids(*out[4]) == {7, 8, 9}
    assert "high-score cluster" in out[4][1].reasons[7]
    # persistent (the paper removes detected clients): still rejected later, with the round named
    assert _rejected_ids(*out[7]) == {7, 8, 9}
    assert out[7][1].reasons[8] == "FLDetector: flagged in round 4 and removed"


def test_memory_is_keyed_by_client_id_not_row():
    plain = _run(FLDetector(window=3))
    shuffled = _run(FLDetector(window=3), shuffle=True)
    assert [_rejected_ids(*r) for r in plain] == [_rejected_ids(*r) for r in shuffled]


def test_per_round_flags_and_composition():
    out = _run(FLDetector(window=3, persistent=False), rounds=6)
    assert _rejected_ids(*out[4]) == {7, 8, 9}
    piped = _run(Pipeline((FLDetector(window=3), Median())), rounds=6)
    assert _rejected_ids(*piped[5]) == {7, 8, 9}


def test_without_global_params_nobody_is_scored():
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    state = {}
    for t in range(5):
        dec = FLDetector(window=1)(x, ServerContext.default(x, state=state, round=t))
        state = dec.state
        assert dec.accepted.all() and dec.state["scored"] == []


def test_nonfinite_rows_and_bad_ids():
    x = torch.tensor([[1.0, 2.0], [math.inf, 0.0], [3.0, 4.0]])
    dec = FLDetector()(x)
    assert dec.accepted.tolist() == [True, False, True] and dec.reasons == {1: "non-finite update"}
    assert dec.aggregate.tolist() == pytest.approx([2.0, 3.0])
    assert dec.state["ids"] == [0, 2]
    with pytest.raises(InvalidParameter, match=r"ctx.client_ids must name each of the 3 updates once"):
        FLDetector()(x, ServerContext.default(x, client_ids=(1, 1, 2)))
    with pytest.raises(InvalidParameter, match=r"FLDetector.window = 0"):
        FLDetector(window=0)


def test_gap_statistic_on_scores_one_ulp_apart_is_one_cluster_not_a_crash():
    # Scores 0.1, 0.1 and the next float above 0.1: they differ by rounding only, so one
    # cluster (as exactly equal scores are). W₁ computed as Σx² − (Σx)²/m cancels to 0 or
    # below here, and log(0) raised "math domain error" from inside a federation round
    # (seen with FLDetector(window = 2) against ipm_opt under churn).
    g = torch.Generator().manual_seed(0)
    for base in (0.1, 0.2, 1 / 7):
        x = torch.tensor([base, base, math.nextafter(base, 1.0)], dtype=torch.float64)
        assert gap_says_clusters(x, 10, g)[0] is False


def test_two_means_is_translation_invariant():
    # k-means costs are sums of squared deviations from cluster means, unchanged by adding
    # a constant: 10⁸ + the by-hand example above splits the same way, {0.52, 0.5} on top.
    # Uncentred running sums of squares (≈ 5·10¹⁶, rounding ≈ 8) lose the 0.1-sized gaps.
    x = torch.tensor([0.52, 0.1, 0.5, 0.12, 0.11], dtype=torch.float64) + 1e8
    assert two_means_split(x).tolist() == [True, False, True, False, False]


# ---- the release's conventions, pinned (github.com/zaixizhang/FLDetector at 18bdb0f) ----------------

def _scripted(detector, rows_by_round, rounds_ids):
    """Rounds whose L-BFGS product is exactly zero: the global model moves by e₀ every round and the
    previous global update is the same vector P each round, so every pair has Δg = 0 (σ = 0, Ĥv = 0)
    and client i's distance is ‖its last row − its row now‖, normalised over the round's clients."""
    d = rows_by_round[0].shape[1]
    e0, p = torch.zeros(d), torch.full((d,), 0.5)
    e0[0] = 1.0
    state, out = {}, []
    for t, (x, ids) in enumerate(zip(rows_by_round, rounds_ids)):
        ctx = ServerContext.default(x, global_params=t * e0, previous_update=p, state=state, round=t,
                                    client_ids=tuple(ids))
        dec = detector(x, ctx)
        out.append(dec)
        state = dec.state
    return out


def _moves(base, steps):
    """Rows base + cumulative steps along e₁ (client c moves by steps[t][c] in round t)."""
    rows, pos = [], torch.zeros(len(steps[0]))
    for st in steps:
        pos = pos + torch.tensor(st, dtype=torch.float32)
        x = base.clone()
        x[:, 1] += pos
        rows.append(x)
    return rows


def test_score_window_full_waits_for_n_distances_available_averages_what_it_has():
    # 4 clients, window N = 2. Distances exist from round 2 (the first round with a pair).
    # Client moves (‖row_t − row_{t−1}‖): round 2: (1, 1, 1, 1) -> normalised (¼, ¼, ¼, ¼);
    # round 3: (1, 1, 1, 5) -> (⅛, ⅛, ⅛, ⅝).
    # "full": nobody holds 2 distances in round 2 (no test); in round 3 the scores are the means
    #   (¼ + ⅛)/2 = 0.1875 three times and (¼ + ⅝)/2 = 0.4375.
    # "available": round 2 already tests on the one distance each holds: (¼, ¼, ¼, ¼), one cluster.
    base = torch.zeros(4, 3)
    steps = [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 5]]
    rows, ids = _moves(base, steps), [(0, 1, 2, 3)] * 4
    full = _scripted(FLDetector(window=2), rows, ids)
    avail = _scripted(FLDetector(window=2, score_window="available"), rows, ids)
    assert full[2].state["decided"] == [] and "scores" not in full[2].state
    assert avail[2].state["decided"] == [0, 1, 2, 3]
    assert avail[2].state["scores"] == pytest.approx([0.25] * 4) and avail[2].state["clusters"] == 1
    assert full[3].state["scores"] == pytest.approx([0.1875, 0.1875, 0.1875, 0.4375])
    assert avail[3].state["scores"] == pytest.approx([0.1875, 0.1875, 0.1875, 0.4375])  # the same once N are held


def test_score_window_differs_for_a_client_that_missed_a_round():
    # client 3 sits out round 2 (partial participation), so in round 3 it holds one distance,
    # ‖row_3 − its row of round 1‖ = 5 (it moved by 0 then 5; its remembered row is round 1's).
    # Round 2 (clients 0-2, moves 1, 1, 1): (⅓, ⅓, ⅓). Round 3 (moves 1, 1, 1, 5): (⅛, ⅛, ⅛, ⅝).
    # "full" (N = 2): clients 0-2 hold 2 distances, client 3 one: only 0-2 enter, scores (⅓ + ⅛)/2.
    # "available": client 3 enters with its one distance ⅝.
    base = torch.zeros(4, 3)
    rows = _moves(base, [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 5]])
    rows[2] = rows[2][:3]
    ids = [(0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2), (0, 1, 2, 3)]
    full = _scripted(FLDetector(window=2), rows, ids)
    avail = _scripted(FLDetector(window=2, score_window="available"), rows, ids)
    third = (1 / 3 + 1 / 8) / 2
    assert full[3].state["decided"] == [0, 1, 2]
    assert full[3].state["scores"] == pytest.approx([third] * 3)
    assert avail[3].state["decided"] == [0, 1, 2, 3]
    assert avail[3].state["scores"] == pytest.approx([third] * 3 + [0.625])


def test_start_after_delays_the_first_distance():
    # the release records distances only from e > 20 (CIFAR-10): with start_after = 2 round 2 records
    # none, so with N = 1 the first test is in round 3 on round 3's distances alone
    base = torch.zeros(4, 3)
    rows = _moves(base, [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 5]])
    ids = [(0, 1, 2, 3)] * 4
    out = _scripted(FLDetector(window=1, start_after=2), rows, ids)
    assert out[2].state["scored"] == [] and "scores" not in out[2].state
    assert out[3].state["scores"] == pytest.approx([0.125, 0.125, 0.125, 0.625])
    with pytest.raises(InvalidParameter, match=r"FLDetector.start_after = -1"):
        FLDetector(start_after=-1)
    with pytest.raises(InvalidParameter, match=r"FLDetector.score_window = 'mean'"):
        FLDetector(score_window="mean")
    with pytest.raises(InvalidParameter, match=r"FLDetector.gap_reference = 'x'"):
        FLDetector(gap_reference="x")


def _best_split_cost(v):
    """Optimal 2-means within-cluster sum of squares of a list, by trying every split (brute force)."""
    v = sorted(v)

    def sse(a):
        m = sum(a) / len(a)
        return sum((x - m) ** 2 for x in a)

    return min(sse(v[:j]) + sse(v[j:]) for j in range(1, len(v)))


@pytest.mark.parametrize("reference", ["mean_of_logs", "log_of_mean"])
def test_gap_statistic_both_averages_against_a_transcription(reference):
    # the gap of k = 1 and k = 2, recomputed here in plain Python from the same uniform reference draws:
    # Tibshirani et al. average log W*; the release (detection1) takes log of the mean W*
    scores = torch.tensor([0.10, 0.12, 0.11, 0.30, 0.13, 0.33], dtype=torch.float64)
    b, seed = 10, 3
    many, info = gap_says_clusters(scores, b, torch.Generator().manual_seed(seed), reference)
    lo, hi = float(scores.min()), float(scores.max())
    refs = (lo + (hi - lo) * torch.rand(b, 6, generator=torch.Generator().manual_seed(seed),
                                        dtype=torch.float64)).tolist()
    v = scores.tolist()
    w1 = sum((x - sum(v) / 6) ** 2 for x in v)
    w2 = _best_split_cost(v)
    r1 = [sum((x - sum(r) / 6) ** 2 for x in r) for r in refs]
    r2 = [_best_split_cost(r) for r in refs]
    if reference == "mean_of_logs":
        gap1 = sum(math.log(x) for x in r1) / b - math.log(w1)
        gap2 = sum(math.log(x) for x in r2) / b - math.log(w2)
    else:
        gap1 = math.log(sum(r1) / b) - math.log(w1)
        gap2 = math.log(sum(r2) / b) - math.log(w2)
    logs2 = [math.log(x) for x in r2]
    mu = sum(logs2) / b
    s2 = math.sqrt(sum((x - mu) ** 2 for x in logs2) / b) * math.sqrt(1 + 1 / b)
    assert info["gap1"] == pytest.approx(gap1, rel=1e-9) and info["gap2"] == pytest.approx(gap2, rel=1e-9)
    assert info["s2"] == pytest.approx(s2, rel=1e-9)
    assert many == (gap1 < gap2 - s2)
    # log of a mean ≥ mean of logs (Jensen): the release's gaps are never smaller
    if reference == "log_of_mean":
        lower, _ = gap_says_clusters(scores, b, torch.Generator().manual_seed(seed), "mean_of_logs")[1], None
        assert gap1 >= lower["gap1"] - 1e-12 and gap2 >= lower["gap2"] - 1e-12
