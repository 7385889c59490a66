"""DnC (Shejwalkar & Houmansadr, NDSS 2021): hand-computed scores, removals, bounds."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from defenses.dnc import DnC, dnc_scores
from redteam.errors import InvalidParameter
from redteam.types import ServerContext

# Five 2-D points; b = 10 000 ≥ d, so every coordinate is used (no sampling).
#   mean μ = (12/5, 12/5) = (2.4, 2.4); centred rows:
#   (−2.4, −2.4), (−1.4, −2.4), (−2.4, −1.4), (−1.4, −1.4), (7.6, 7.6).
# The centred matrix is symmetric under swapping the two coordinates, so X̃ᵀX̃ = [[a, b], [b, a]]
# with b > 0 and the top right singular vector is v = (1, 1)/√2. Squared projections ⟨x̃ᵢ, v⟩²:
#   (−4.8)²/2 = 11.52, (−3.8)²/2 = 7.22, 7.22, (−2.8)²/2 = 3.92, (15.2)²/2 = 115.52.
FIVE = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [10.0, 10.0]])
SCORES = [11.52, 7.22, 7.22, 3.92, 115.52]


def test_scores_by_hand():
    assert dnc_scores(FIVE).tolist() == pytest.approx(SCORES, rel=1e-9)


def test_f1_removes_the_far_point():
    # c·f = 1: the highest score (115.52, row 4) goes; mean of rows 0–3 = (0.5, 0.5)
    dec = DnC(f=1)(FIVE)
    assert dec.accepted.tolist() == [True, True, True, True, False]
    assert dec.aggregate.tolist() == pytest.approx([0.5, 0.5])
    assert dec.state["removed"] == 1 and dec.state["good"] == [0, 1, 2, 3]
    assert dec.state["scores"][0] == pytest.approx(SCORES, rel=1e-9)
    assert set(dec.reasons) == {4} and "score 115.52" in dec.reasons[4]


def test_c_scales_the_removals_and_f_defaults_to_a_minority():
    # c = 2, f = 1 -> two removed: 115.52 (row 4) and 11.52 (row 0); mean of rows 1, 2, 3 = (2/3, 2/3)
    dec = DnC(f=1, c=2.0)(FIVE)
    assert dec.accepted.tolist() == [False, True, True, True, False]
    assert dec.aggregate.tolist() == pytest.approx([2 / 3, 2 / 3])
    # f unset -> ⌊(n − 1)/2⌋ = 2 with c = 1: the same two removed
    dflt = DnC()(FIVE)
    assert dflt.state["f"] == 2 and dflt.accepted.tolist() == dec.accepted.tolist()


def test_weighted_mean_of_the_good_set():
    # weights (1, 1, 1, 5, 1) over the good rows 0–3: ((1 + 0 + 5)/8, (0 + 1 + 5)/8) = (0.75, 0.75)
    ctx = ServerContext.default(FIVE, weights=torch.tensor([1.0, 1.0, 1.0, 5.0, 1.0]))
    assert DnC(f=1, weighted=True)(FIVE, ctx).aggregate.tolist() == pytest.approx([0.75, 0.75])
    assert DnC(f=1)(FIVE, ctx).aggregate.tolist() == pytest.approx([0.5, 0.5])  # the paper: plain mean


def test_nonfinite_rows_count_as_the_highest_scores():
    x = torch.cat([FIVE[:4], torch.tensor([[math.nan, 1.0]])])
    dec = DnC(f=1)(x)
    assert dec.accepted.tolist() == [True, True, True, True, False]
    assert dec.reasons == {4: "non-finite update (DnC scores it +inf)"}
    assert dec.aggregate.tolist() == pytest.approx([0.5, 0.5])


def test_huge_finite_rows_stay_finite():
    x = torch.full((6, 5), 3e38)
    x[::2] *= -1
    dec = DnC(f=1)(x)
    assert bool(torch.isfinite(dec.aggregate).all())


def test_bounds_are_named():
    # ⌊c·f⌋ = 5 removals can never leave a survivor of rounds of at most 5: refused at setup
    with pytest.raises(InvalidParameter, match=r"DnC.f = 5: removes ⌊c·f⌋ = 5 updates a round, but a round "
                                               r"has at most 5"):
        DnC(f=5).check_capacity(5)
    DnC(f=4).check_capacity(5)
    DnC().check_capacity(1)  # unset f follows the round
    with pytest.raises(InvalidParameter, match=r"DnC.b = 0: must be an integer ≥ 1"):
        DnC(b=0)
    with pytest.raises(InvalidParameter, match=r"DnC.niters = 0"):
        DnC(niters=0)
    with pytest.raises(InvalidParameter, match=r"DnC.c = -1"):
        DnC(c=-1)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 12), d=st.integers(3, 40), f=st.integers(0, 4), niters=st.integers(1, 3),
       b=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_good_set_is_the_intersection_of_each_iterations_lowest(n, d, f, niters, b, seed):
    f = min(f, (n - 1) // 2)
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    dec = DnC(f=f, b=b, niters=niters)(x)
    keep = torch.ones(n, dtype=torch.bool)
    for scores in dec.state["scores"]:
        s = torch.tensor(scores)
        kept = torch.zeros(n, dtype=torch.bool)
        kept[torch.argsort(s)[: n - f]] = True  # continuous random data: no ties
        keep &= kept
    assert dec.accepted.tolist() == keep.tolist()
    assert int(dec.accepted.sum()) >= n - niters * f
    # the intersection may be empty with several iterations: then no update (zeros)
    expected = x[keep].mean(dim=0) if bool(keep.any()) else torch.zeros(d)
    assert torch.allclose(dec.aggregate, expected, atol=1e-5)


def test_equal_scores_are_broken_by_content_not_position():
    # f = 3 keeps n − 3 = 2: the lowest score 3.92 (row 3, (1, 1)) and one of the tied 7.22 rows,
    # (1, 0) or (0, 1). Fingerprints Σⱼ j·xⱼ: (1, 0) -> 1, (0, 1) -> 2, so (1, 0) is kept:
    # mean of (1, 1) and (1, 0) = (1, 0.5), whatever the order of the rows.
    assert DnC(f=3)(FIVE).aggregate.tolist() == pytest.approx([1.0, 0.5])
    assert DnC(f=3)(FIVE.flip(0)).aggregate.tolist() == pytest.approx([1.0, 0.5])
    assert DnC(f=3)(FIVE[[2, 0, 4, 1, 3]]).aggregate.tolist() == pytest.approx([1.0, 0.5])


def test_nonfinite_rows_are_rejected_even_when_nothing_is_removed():
    # f = 0 removes nobody, but a non-finite row is never part of the mean
    x = torch.tensor([[1.0, 2.0], [math.inf, 0.0], [3.0, 4.0]])
    dec = DnC(f=0)(x)
    assert dec.accepted.tolist() == [True, False, True] and dec.aggregate.tolist() == pytest.approx([2.0, 3.0])


def test_float64_rows_near_overflow_rank_like_their_rescaled_copies():
    # scores scale with the square of the rows: a power-of-two rescaling keeps the ranking
    big = FIVE.double() * 2.0**1020  # entries up to 10·2¹⁰²⁰ ≈ 1.1e308: Gram products overflow
    dec = DnC(f=1)(big)
    assert dec.accepted.tolist() == [True, True, True, True, False]
    assert bool(torch.isfinite(dec.aggregate).all())


def test_a_far_outlier_cannot_turn_a_crafted_row_into_a_tie():
    # Issue 9 §1 (ties an attacker can widen), for DnC. Honest rows (1, 0), (0, 1), (−1, 0),
    # (0, −1), (0.5, 0.5); attacker rows O = (10¹², 0) and C = (−1000, 0); f = 2, so the two
    # highest scores go. By hand: the top singular vector is ≈ (1, 0) (x₁ spread 10¹², x₂
    # spread ≤ 2) and μ₁ = (10¹² − 1000 + 0.5)/7 ≈ 1.4286·10¹¹, so sᵢ ≈ (xᵢ₁ − μ₁)²:
    # O ≈ 7.3·10²³, C ≈ (μ₁ + 1000)², honest ≤ (μ₁ + 1)². C's score exceeds every honest
    # score by ≈ 2·μ₁·999 ≈ 2.9·10¹⁴, i.e. by 1.4·10⁻⁸ of itself (float64 resolves 10⁻¹⁶):
    # DnC removes O and C. A tie tolerance of 10⁻⁹ × the largest score (7.3·10¹⁴, set by O)
    # made C tie with the honest rows, and C's content (lowest Σx) then kept it.
    rows = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0], [0.5, 0.5],
                         [1e12, 0.0], [-1000.0, 0.0]], dtype=torch.float64)
    dec = DnC(f=2)(rows)
    assert dec.accepted.tolist() == [True] * 5 + [False, False]
    assert dec.aggregate.tolist() == pytest.approx([0.1, 0.1])


def test_tied_rows_near_float64_overflow_are_ranked_by_content_not_position():
    # two rows near float64's range whose DnC scores tie (n = 2: the projections are symmetric):
    # their fingerprints Σx once overflowed to −inf for both, and the position decided which one
    # was removed. Scaled by one power of two they differ, so either order removes the same row.
    from defenses.dnc import DnC
    from redteam.testing.builders import make_server_context

    x = torch.tensor([[-2.7563e307, -1.5618e308], [-1.6729e308, -1.7797e308]], dtype=torch.float64)
    dnc = DnC(f=1)
    a = dnc(x, make_server_context(x, 0)).accepted
    b = dnc(x[[1, 0]], make_server_context(x[[1, 0]], 0)).accepted[[1, 0]]
    assert a.tolist() == b.tolist() and int(a.sum()) == 1
