"""One huge row must not steer the distance and projection rules (issue 35 §5).

Honest rows of ordinary size (23 rows of N(0, 1)·0.01, d = 1000), one "anchor" row 10¹² to
10³⁰⁰ times larger, and one payload row. Before, the single power of two that brings the
largest entry into range pushed the honest rows' squared distances into underflow (Krum,
Multi-Krum and Bulyan refused the round: one row could deny every round), and DnC's scores of
all the other rows fell within one relative 10⁻⁹ of each other (the anchor sets their common
size, their differences are 10⁻¹² of it), a tie its content rule broke by the fingerprints
the payload sets: the payload was kept although its exact score ranks second.

Each decision is compared with one computed here by hand in exact or well-conditioned
arithmetic: Krum-type scores from float64 distances of the honest rows at their own scale
(the anchor is nobody's neighbour), DnC's ranking from the rows' projections on the anchor's
direction (with a margin far above what the rest of the rows can turn the top singular
vector by), FLAME's and FoolsGold's decisions on the rows each scaled by its own power of
two (cosines do not depend on a row's scale).
"""

from __future__ import annotations

import math

import pytest
import torch

from defenses.dnc import DnC
from defenses.flame import FLAME
from defenses.foolsgold import FoolsGold
from defenses.krum import Bulyan, Krum, MultiKrum
from redteam.types import ServerContext

N_HONEST, D = 23, 1000
ANCHOR, PAYLOAD = N_HONEST, N_HONEST + 1


def mixed(times: float, scale: float = 0.01, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    """23 honest rows N(0, 1)·scale, the anchor (a random direction â, entries ~scale·times)
    and the payload: the honest mean moved along −â to one honest spread below the lowest
    honest projection on â, plus a part orthogonal to â of length 100·scale whose entries sum
    to a large negative value (the smallest fingerprint Σx of all rows: a tie broken by
    content keeps it)."""
    g = torch.Generator().manual_seed(seed)
    honest = torch.randn(N_HONEST, D, generator=g, dtype=torch.float64)
    a = torch.randn(D, generator=g, dtype=torch.float64)
    a_hat = a / a.norm()
    mean = honest.mean(dim=0)
    low = float((honest @ a_hat).min()) - 1.0
    ones = torch.ones(D, dtype=torch.float64)
    ones = ones - (ones @ a_hat) * a_hat
    payload = mean + (low - float(mean @ a_hat)) * a_hat - 100.0 * ones / ones.norm()
    rows = torch.cat([honest, a[None, :] * times, payload[None, :]])
    if math.log2(scale) < -1000:  # beyond one ldexp factor
        rows = torch.ldexp(torch.ldexp(rows, torch.tensor(-1000)), torch.tensor(round(math.log2(scale)) + 1000))
    else:
        rows = rows * scale
    assert bool(torch.isfinite(rows).all())
    return rows.to(dtype)


def ctx(x: torch.Tensor) -> ServerContext:
    return ServerContext.default(x, generator=torch.Generator().manual_seed(0))


#: (anchor factor, honest scale, dtype): the cases below
CASES = [
    (1e12, 0.01, torch.float64),
    (1e150, 0.01, torch.float64),
    (1e300, 0.01, torch.float64),  # one power of two for all: the honest distances underflow
    (1e306, 0.01, torch.float64),  # the anchor's distances beyond float64
    (1e150, 1e-170, torch.float64),  # round two's tiny rows, next to a row of 1e-20
    (1e12, 0.01, torch.float32),
]
IDS = ["1e12", "1e150", "1e300", "1e306", "tiny-1e150", "float32-1e12"]


# ---------------------------------------------------------------- the references, by hand
def honest_distances(x: torch.Tensor) -> torch.Tensor:
    """Squared distances in float64 of the rows brought to unit scale by one exact power of two
    chosen from the honest rows: the honest pairs are then ordinary float64 numbers (relative
    error ~d·2⁻⁵³), pairs with the anchor may overflow to +inf (it is nobody's neighbour)."""
    x = x.to(torch.float64)
    k = -math.frexp(float(x[:N_HONEST].abs().max()))[1]
    y = torch.ldexp(torch.ldexp(x, torch.tensor(k // 2)), torch.tensor(k - k // 2))
    diff = y[:, None, :] - y[None, :, :]
    with torch.no_grad():
        dist = (diff * diff).sum(dim=2)
    return torch.nan_to_num(dist, nan=math.inf)


def krum_order(x: torch.Tensor, dist: torch.Tensor, alive: list[int], k: int) -> list[int]:
    """Alive rows by their Krum score (sum of the k smallest distances to other alive rows),
    exact ties (mutual nearest neighbours) by the smaller Σⱼxⱼ, then Σⱼ j·xⱼ (the rule's content
    keys); asserts that every other pair of scores is clear-cut (10⁻⁹ apart)."""
    scores = {}
    for i in alive:
        others = sorted(float(dist[i, j]) for j in alive if j != i)
        scores[i] = sum(others[:k])
    x = x.to(torch.float64)
    keys = {i: (float(x[i].sum()), float((x[i] * torch.arange(1, D + 1, dtype=torch.float64)).sum())) for i in alive}
    order = sorted(alive, key=lambda i: (scores[i], keys[i]))
    finite = [scores[i] for i in order if math.isfinite(scores[i])]
    assert all(b == a or b - a > 1e-9 * b for a, b in zip(finite, finite[1:])), "the reference must be clear-cut"
    return order


def iterative_krum(x: torch.Tensor, dist: torch.Tensor, n: int, f: int, count: int, clamp: bool) -> list[int]:
    alive, chosen = list(range(n)), []
    for _ in range(count):
        r = len(alive)
        k = max(r - f - 2, 1) if clamp else r - f - 2
        best = krum_order(x, dist, alive, min(k, r - 1))[0]
        chosen.append(best)
        alive.remove(best)
    return chosen


def dnc_removed(x: torch.Tensor) -> set[int]:
    """DnC with ⌊c·f⌋ = 2 removals, by hand. The centred rows are the anchor's part, a rank-one
    matrix along â of norm ≈ ‖a‖, plus the rest, of norm ≤ ‖X_honest‖ + ‖payload‖; so the top
    right singular vector v is within ε = 2·‖rest‖/‖anchor part‖ of ±â (Wedin), and each
    projection ⟨xᵢ − μ, v⟩ is ⟨xᵢ, â⟩ − ⟨μ, â⟩ within ‖xᵢ‖·ε plus a shift common to all rows.
    ⟨μ, â⟩ is dominated by the anchor (≈ ‖a‖/25 > 0), so the rows other than the anchor score
    (⟨μ, â⟩ − ⟨xᵢ, â⟩)²: the highest is the lowest projection on â. Removed: the anchor and
    that row, when its projection is below every other by far more than 2·‖xᵢ‖·ε."""
    x = x.to(torch.float64)
    k = -math.frexp(float(x[:N_HONEST].abs().max()))[1]
    y = torch.ldexp(torch.ldexp(x, torch.tensor(k // 2)), torch.tensor(k - k // 2))  # honest rows ~1
    a = x[ANCHOR] / float(x[ANCHOR].abs().max())
    a_hat = a / a.norm()
    rest = torch.cat([y[:ANCHOR], y[PAYLOAD:]])
    peak = float(x[ANCHOR].abs().max())  # the anchor is ‖a‖·peak·2ᵏ in these units (may exceed float64)
    eps = 2.0 * float(torch.linalg.matrix_norm(rest, ord=2)) / (0.9 * float(a.norm())) * math.ldexp(1.0 / peak, -k)
    proj = rest @ a_hat
    order = torch.argsort(proj)
    lowest, second = int(order[0]), int(order[1])
    margin = float(proj[second] - proj[lowest])
    assert margin > 100 * 2 * float(rest.norm(dim=1).max()) * eps, "the reference must be clear-cut"
    return {ANCHOR, lowest if lowest < ANCHOR else PAYLOAD}


def per_row(x: torch.Tensor) -> torch.Tensor:
    """Every row times its own power of two (exact), bringing its largest entry into [½, 1)."""
    out = []
    for r in x.to(torch.float64):
        k = -math.frexp(float(r.abs().max()))[1]
        out.append(torch.ldexp(torch.ldexp(r, torch.tensor(k // 2)), torch.tensor(k - k // 2)))
    return torch.stack(out).to(x.dtype)


# ---------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("times,scale,dtype", CASES, ids=IDS)
def test_krum_picks_the_exact_winner_next_to_a_huge_row(times, scale, dtype):
    x = mixed(times, scale, dtype)
    n, f = x.shape[0], 2
    want = krum_order(x, honest_distances(x), list(range(n)), n - f - 2)
    dec = Krum(f=f)(x, ctx(x))  # refused before for 1e300 and tiny-1e150 ("underflow float64")
    assert dec.state["selected"] == want[:1]
    assert not bool(dec.accepted[PAYLOAD]) and not bool(dec.accepted[ANCHOR])


@pytest.mark.parametrize("times,scale,dtype", CASES, ids=IDS)
def test_multi_krum_keeps_the_exact_set_next_to_a_huge_row(times, scale, dtype):
    x = mixed(times, scale, dtype)
    n, f = x.shape[0], 2
    want = krum_order(x, honest_distances(x), list(range(n)), n - f - 2)
    dec = MultiKrum(f=f)(x, ctx(x))
    assert sorted(dec.state["selected"]) == sorted(want[:n - f])
    assert dec.accepted.tolist() == [i in want[:n - f] for i in range(n)]
    assert PAYLOAD not in dec.state["selected"] and ANCHOR not in dec.state["selected"]
    it = MultiKrum(f=f, variant="iterative")(x, ctx(x))
    assert it.state["selected"] == iterative_krum(x, honest_distances(x), n, f, n - 2 * f - 2, clamp=False)


@pytest.mark.parametrize("times,scale,dtype", CASES, ids=IDS)
def test_bulyan_selects_the_exact_rows_next_to_a_huge_row(times, scale, dtype):
    x = mixed(times, scale, dtype)
    n, f = x.shape[0], 2
    dec = Bulyan(f=f)(x, ctx(x))
    assert dec.state["selected"] == iterative_krum(x, honest_distances(x), n, f, n - 2 * f, clamp=True)
    assert not bool(dec.accepted[PAYLOAD]) and not bool(dec.accepted[ANCHOR])


@pytest.mark.parametrize("times,scale,dtype", CASES, ids=IDS)
def test_dnc_removes_the_exact_outliers_next_to_a_huge_row(times, scale, dtype):
    # before: every score but the anchor's in one 10⁻⁹ tie class, broken by the fingerprints,
    # and the payload (the lowest Σx) was kept although its exact score ranks 2nd of 25
    x = mixed(times, scale, dtype)
    removed = dnc_removed(x)
    assert removed == {ANCHOR, PAYLOAD}
    dec = DnC(f=2)(x, ctx(x))
    assert {i for i in range(x.shape[0]) if not bool(dec.accepted[i])} == removed
    assert dec.state["tie_kept"] == [[]]


@pytest.mark.parametrize("times,scale,dtype", CASES, ids=IDS)
def test_cosine_rules_decide_as_on_rows_at_their_own_scale(times, scale, dtype):
    x = mixed(times, scale, dtype)
    ref = per_row(x)
    assert FLAME()(x, ctx(x)).accepted.tolist() == FLAME()(ref, ctx(ref)).accepted.tolist()
    # FoolsGold: two near-copies of the payload (Sybils) next to the anchor
    g = torch.Generator().manual_seed(3)
    syb = x[PAYLOAD].to(torch.float64) * (1.0 + 1e-4 * torch.randn(2, D, generator=g, dtype=torch.float64))
    y = torch.cat([x, syb.to(x.dtype)])
    want = FoolsGold()(per_row(y), ctx(y)).state["alpha"]
    got = FoolsGold()(y, ctx(y)).state["alpha"]
    assert got == pytest.approx(want, abs=1e-9)
    assert got[PAYLOAD:] == [0.0, 0.0, 0.0]


def test_pair_scaled_distances_are_exact_across_the_whole_float64_range():
    # rows from the subnormal range to the edge of overflow (a difference of ±1.7e308 overflows
    # and is taken halved): every squared distance within (d + 3)·2⁻⁵³ of the exact rational
    from fractions import Fraction

    from defenses._distances import scaled_sq_distances

    x = torch.tensor([[3e-320, -1e-321, 0.0, 5e-324], [1e-170, 2e-170, -3e-171, 0.0],
                      [1.7e308, -1e300, 1.0, 0.0], [-1.7e308, 1e300, 0.0, 2.0], [0.01, -0.02, 0.03, 0.0]],
                     dtype=torch.float64)
    i, j = torch.triu_indices(5, 5, offset=1)
    s, e = scaled_sq_distances(x, i, j)
    for p, (a, b) in enumerate(zip(i.tolist(), j.tolist())):
        exact = sum((Fraction(u) - Fraction(v)) ** 2 for u, v in zip(x[a].tolist(), x[b].tolist()))
        got = Fraction(float(s[p])) * Fraction(2) ** (2 * int(e[p]))
        assert abs(got - exact) <= exact * Fraction(7 * 2.0 ** -53), (a, b)


def test_dnc_ranks_rows_whose_lengths_exceed_float64_like_their_scaled_copies():
    # entries near float64's largest: the rows' lengths (and their tie tolerances) are beyond
    # float64, kept as exact rationals (a float conversion raised OverflowError)
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(11, 6, generator=g, dtype=torch.float64) * 2 - 1) * 1.7e308
    for f in (1, 3, 5):
        got = DnC(f=f)(x, ctx(x))
        ref = DnC(f=f)(torch.ldexp(x, torch.tensor(-1000)), ctx(x))
        assert got.accepted.tolist() == ref.accepted.tolist() and bool(torch.isfinite(got.aggregate).all())
