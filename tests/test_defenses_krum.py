"""Krum, Multi-Krum and Bulyan: hand-computed examples, tie-breaking, bounds."""

from __future__ import annotations

import pytest
import torch

from defenses._common import sq_distances
from defenses.krum import Bulyan, Krum, MultiKrum, _closest_to_median_mean, krum_scores
from redteam.errors import InvalidParameter


def col(*values):
    return torch.tensor([[float(v)] for v in values])


# Five 1-D points 0, 1, 2, 10, 11 with f = 1 -> n - f - 2 = 2 neighbours.
# Squared distances and the two smallest to *other* points:
#   0: 1 (to 1), 4 (to 2)            -> 5
#   1: 1 (to 0), 1 (to 2)            -> 2
#   2: 1 (to 1), 4 (to 0)            -> 5
#  10: 1 (to 11), 64 (to 2)          -> 65
#  11: 1 (to 10), 81 (to 2)          -> 82
FIVE = col(0, 1, 2, 10, 11)


def test_krum_scores_by_hand():
    scores = krum_scores(sq_distances(FIVE), 2)
    assert scores.tolist() == [5.0, 2.0, 5.0, 65.0, 82.0]


def test_krum_picks_lowest_score():
    dec = Krum(f=1)(FIVE)
    assert dec.aggregate.tolist() == [1.0]
    assert dec.accepted.tolist() == [False, True, False, False, False]
    assert dec.weights.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert dec.state["neighbours"] == 2 and dec.state["selected"] == [1]
    assert set(dec.reasons) == {0, 2, 3, 4} and "score 65;" in dec.reasons[3]


def test_multi_krum_mean_of_m_best():
    # default m = n - f = 4: scores 2, 5, 5, 65 -> points 1, 0, 2, 10 -> (0+1+2+10)/4 = 3.25
    dec = MultiKrum(f=1)(FIVE)
    assert dec.aggregate.tolist() == [3.25]
    assert dec.accepted.tolist() == [True, True, True, True, False]
    assert dec.state["m"] == 4
    # m = 3 -> (0+1+2)/3 = 1
    assert MultiKrum(f=1, m=3)(FIVE).aggregate.tolist() == [1.0]


def test_exact_ties_break_on_the_rows_values_not_on_other_rows():
    # m = 2: point 1 (score 2), then a tie 0 vs 2 (score 5). The tie goes to the smaller
    # Σx (0 < 2), not to a key other clients move (such as the total distance to all
    # rows, which a far outlier can tilt either way): (1 + 0)/2 = 0.5, in any order.
    assert MultiKrum(f=1, m=2)(FIVE).aggregate.tolist() == [0.5]
    assert MultiKrum(f=1, m=2)(FIVE.flip(0)).aggregate.tolist() == [0.5]
    # neighbours = 1: every score is 1 (each point has a neighbour at distance 1); the
    # smallest Σx is point 0.
    assert Krum(f=1, neighbours=1)(FIVE).aggregate.tolist() == [0.0]


def test_multi_krum_iterative_variant():
    # Six points 0 1 2 3 10 11, f = 1, iterative: at most n - 2f - 2 = 2 picks.
    # Step 1 (6 left, 3 neighbours): 0->1+4+9=14, 1->1+1+4=6, 2->1+1+4=6, 3->14, 10->114, 11->146;
    #   tie 1 vs 2 (exact): the smaller Σx, 1.
    # Step 2 (5 left: 0 2 3 10 11, 2 neighbours): 0->4+9=13, 2->1+4=5, 3->1+9=10 -> 2.
    x = col(0, 1, 2, 3, 10, 11)
    dec = MultiKrum(f=1, variant="iterative")(x)
    assert dec.state["selected"] == [1, 2]
    assert dec.aggregate.tolist() == [1.5]
    with pytest.raises(InvalidParameter, match=r"MultiKrum.m = 3: must be ≤ n − 2f − 2 = 2"):
        MultiKrum(f=1, m=3, variant="iterative")(x)


def test_krum_two_dimensional_with_far_attackers():
    honest = torch.tensor([[1.0, 1.0], [1.2, 0.9], [0.9, 1.1], [1.1, 1.0], [1.0, 0.8]])
    attackers = torch.tensor([[-50.0, -50.0], [-50.0, -50.0]])
    x = torch.cat([honest, attackers])
    dec = Krum(f=2)(x)
    assert int(dec.accepted.nonzero()) < 5
    assert Bulyan(f=1)(torch.cat([honest, attackers[:1], honest[:1] + 0.05])).aggregate.sub(1.0).abs().max() < 0.2


@pytest.mark.parametrize("f, n", [(2, 6), (2, 5), (1, 4), (0, 2)])
def test_krum_rejects_2f_plus_2_ge_n(f, n):
    with pytest.raises(InvalidParameter, match=r"Krum.f = %d: must satisfy 2f \+ 2 < n" % f) as err:
        Krum(f=f)(torch.zeros(n, 3))
    assert f"n = {n}" in str(err.value)
    with pytest.raises(InvalidParameter, match="MultiKrum.f"):
        MultiKrum(f=f)(torch.zeros(n, 3))


def test_krum_default_f_is_largest_allowed_and_needs_three():
    assert Krum()(torch.zeros(7, 2)).state["f"] == 2  # 2f + 2 < 7
    with pytest.raises(InvalidParameter, match="need n ≥ 3"):
        Krum()(torch.zeros(2, 2))


def test_krum_bad_parameters():
    with pytest.raises(InvalidParameter, match="Krum.f = -1"):
        Krum(f=-1)
    with pytest.raises(InvalidParameter, match="Krum.neighbours = 0"):
        Krum(neighbours=0)
    with pytest.raises(InvalidParameter, match=r"Krum.neighbours = 9: must be between 1 and n − 1 = 4"):
        Krum(f=1, neighbours=9)(torch.zeros(5, 2))
    with pytest.raises(InvalidParameter, match=r"MultiKrum.m = 6: must be ≤ n"):
        MultiKrum(f=1, m=6)(torch.zeros(5, 2))
    with pytest.raises(InvalidParameter, match="MultiKrum.variant"):
        MultiKrum(variant="ndss")


def test_krum_never_selects_nonfinite_row():
    x = col(0, 1, float("nan"), 2, float("inf"), 3, 4)
    dec = Krum(f=2)(x)
    assert float(dec.aggregate) in (1.0, 2.0, 3.0)
    dec = MultiKrum(f=2, m=5)(x)
    assert not dec.accepted[2] and not dec.accepted[4]
    assert torch.isfinite(dec.aggregate).all()


def test_closest_to_median_window_by_hand():
    s = torch.tensor([[0.0], [1.0], [2.0], [6.0], [10.0]])
    # median 2; distances 2 1 0 4 8 -> three closest 0 1 2 -> mean 1
    assert _closest_to_median_mean(s, 3).tolist() == [1.0]
    # even θ: 0 2 3 10, median 2.5, two closest 2 and 3 -> 2.5
    assert _closest_to_median_mean(torch.tensor([[0.0], [2.0], [3.0], [10.0]]), 2).tolist() == [2.5]
    # tie: 0 1 2 3 4, median 2, two closest are 2 and (1 or 3): the lower, 1 -> 1.5
    assert _closest_to_median_mean(torch.arange(5.0)[:, None], 2).tolist() == [1.5]


def test_bulyan_worked_example():
    # n = 7, f = 1 -> θ = 5, β = 3. Points 0 1 2 5 8 100 -100.
    # Iterative Krum (r left, r - f - 2 neighbours, at least 1):
    #  r=7, k=4: 0->1+4+25+64=94, 1->1+1+16+49=67, 2->1+4+9+36=50, 5->9+9+16+25=59, 8->158 -> pick 2
    #  r=6, k=3 (0 1 5 8 ±100): 0->1+25+64=90, 1->1+16+49=66, 5->9+16+25=50, 8->9+49+64=122 -> pick 5
    #  r=5, k=2 (0 1 8 ±100): 0->1+64=65, 1->1+49=50, 8->49+64=113 -> pick 1
    #  r=4, k=1 (0 8 ±100): 0->64, 8->64 tie; totals 64+10000+10000 vs 64+8464+11664 -> pick 0
    #  r=3, k=max(0,1)=1 (8 ±100): 8->8464, 100->8464 tie; totals 20128 vs 48464 -> pick 8
    # Selected values 0 1 2 5 8; median 2; the 3 closest are 2, 1, 0 -> mean 1.
    x = col(0, 1, 2, 5, 8, 100, -100)
    dec = Bulyan(f=1)(x)
    assert dec.state["selected"] == [2, 3, 1, 0, 4]
    assert dec.state["theta"] == 5 and dec.state["beta"] == 3
    assert dec.aggregate.tolist() == [1.0]
    assert dec.accepted.tolist() == [True, True, True, True, True, False, False]
    # The answer does not depend on the order of the clients.
    perm = torch.tensor([6, 3, 0, 5, 1, 4, 2])
    assert Bulyan(f=1)(x[perm]).aggregate.tolist() == [1.0]


@pytest.mark.parametrize("f, n", [(1, 6), (2, 10), (3, 14)])
def test_bulyan_refuses_n_below_4f_plus_3(f, n):
    with pytest.raises(InvalidParameter, match=r"Bulyan.f = %d: must satisfy n ≥ 4f \+ 3 \(n = %d" % (f, n)):
        Bulyan(f=f)(torch.zeros(n, 2))


def test_bulyan_default_f():
    dec = Bulyan()(torch.randn(11, 4, generator=torch.Generator().manual_seed(0)))
    assert dec.state["f"] == 2 and dec.state["theta"] == 7 and dec.state["beta"] == 3
    with pytest.raises(InvalidParameter, match="need n ≥ 3"):
        Bulyan()(torch.zeros(2, 2))


def test_distances_are_float64_accurate_for_nearby_large_vectors():
    # Float32 vectors of norm 32·√1000 ≈ 1012 that differ by 2⁻¹⁰ in one coordinate
    # (32 + 2⁻¹⁰ is exact in float32): the squared distance is 2⁻²⁰ ≈ 9.5e-7, about
    # 1e-12 of the squared norms, below float32 resolution but not float64's.
    base = torch.full((1, 1000), 32.0)
    x = torch.cat([base, base, base])
    x[1, 0] += 2.0 ** -10
    d = sq_distances(x)
    assert d[0, 1].item() == pytest.approx(2.0 ** -20, rel=1e-3)
    assert d[0, 2].item() == 0.0


def test_exact_ties_between_different_rows_do_not_depend_on_order():
    # Rows a, a, b, b (a = 4/3, b = 8/3), Krum with f = 0 → 2 neighbours: every score is
    # 0 + 16/9 and every total 32/9, so only the rows' values can decide: Σx picks a.
    rows = torch.tensor([[4 / 3], [4 / 3], [8 / 3], [8 / 3]])
    for perm in ([0, 1, 2, 3], [2, 3, 0, 1], [2, 0, 3, 1]):
        assert Krum(f=0)(rows[perm]).aggregate.tolist() == pytest.approx([4 / 3])
    # same for the boundary of Multi-Krum's m best and for Bulyan's iterative selection
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, -1.0], [-1.0, 0.0], [0.0, 0.0]])
    outs = {tuple(MultiKrum(f=1, m=2)(x[list(p)]).aggregate.tolist())
            for p in ([0, 1, 2, 3, 4], [3, 2, 1, 0, 4], [4, 1, 3, 0, 2])}
    assert len(outs) == 1


def test_tie_classes_use_each_values_own_bound():
    from defenses._pairwise import tie_classes

    # 1.0 ± 1e-12 and 1.0 + 1e-13 ± 1e-12 overlap: one class; 2.0 is its own class even
    # though a huge value (1e30) is present: its bound (1e20) is its own, nobody else's.
    # Infinities share one class.
    v = torch.tensor([2.0, 1.0 + 1e-13, float("inf"), 1.0, float("inf"), 1e30], dtype=torch.float64)
    e = torch.tensor([1e-12, 1e-12, 0.0, 1e-12, 0.0, 1e20], dtype=torch.float64)
    assert tie_classes(v, e).tolist() == [1, 0, 3, 0, 3, 2]
