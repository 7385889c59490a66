"""Coordinate-wise median and trimmed mean: worked examples, the sorting kernel, errors."""

from __future__ import annotations

import math

import pytest
import torch

from defenses._common import sorted_reduce
from defenses.median import Median, TrimmedMean, coordinate_median, trimmed_mean
from redteam.errors import InvalidParameter


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_median_worked_example_even_n():
    x = t([[1, 10], [3, -2], [2, 5], [100, 0]])
    # column 0 sorted: 1 2 3 100 -> midpoint (2 + 3)/2 = 2.5, lower 2
    # column 1 sorted: -2 0 5 10 -> midpoint (0 + 5)/2 = 2.5, lower 0
    dec = Median()(x)
    assert dec.aggregate.tolist() == [2.5, 2.5]
    assert dec.accepted.all()
    assert Median(even_rule="lower")(x).aggregate.tolist() == [2.0, 0.0]


def test_median_worked_example_odd_n_ignores_outliers():
    x = t([[1, -7], [5, 1e30], [2, 0]])
    # column 0: 1 2 5 -> 2 ; column 1: -7 0 1e30 -> 0
    assert Median()(x).aggregate.tolist() == [2.0, 0.0]


def test_median_rejects_nonfinite_rows_and_takes_the_rest():
    nan, inf = float("nan"), float("inf")
    x = t([[nan, 1], [1, -inf], [2, 3], [3, 4], [inf, nan], [5, 6], [6, 7]])
    # rows 0, 1, 4 hold NaN/±inf: rejected. Finite rows 2, 3, 5, 6:
    # column 0: 2 3 5 6 -> (3 + 5)/2 = 4 ; column 1: 3 4 6 7 -> (4 + 6)/2 = 5
    dec = Median()(x)
    assert dec.aggregate.tolist() == [4.0, 5.0]
    assert dec.accepted.tolist() == [False, False, True, True, False, True, True]
    assert dec.reasons == {0: "non-finite update", 1: "non-finite update", 4: "non-finite update"}
    # trimmed mean, b = 1 on the 4 finite rows: (3 + 5)/2 = 4, (4 + 6)/2 = 5
    assert TrimmedMean(b=1)(x).aggregate.tolist() == [4.0, 5.0]


def test_trimmed_mean_worked_example():
    x = t([[1, -50], [2, 0], [3, 1], [4, 2], [100, 3]])
    # b = 1: column 0 drops 1 and 100 -> (2+3+4)/3 = 3; column 1 drops -50 and 3 -> (0+1+2)/3 = 1
    dec = TrimmedMean(b=1)(x)
    assert dec.aggregate.tolist() == [3.0, 1.0]
    assert dec.state["b"] == 1
    # b = 0 is the plain mean: (1+2+3+4+100)/5 = 22, (-50+0+1+2+3)/5 = -8.8
    assert torch.allclose(TrimmedMean(b=0)(x).aggregate, t([22.0, -8.8]))


def test_trimmed_mean_unset_b_is_refused_not_the_median():
    # issue 8 §3: no silent fallback to the median; b comes from the user or the scenario
    x = t([[1], [2], [30], [40]])
    with pytest.raises(InvalidParameter, match=r"TrimmedMean\.b = None: is unset"):
        TrimmedMean()(x)
    # n = 4, b = 1 -> mean of 2 and 30 = 16
    dec = TrimmedMean(b=1)(x)
    assert dec.state["b"] == 1 and dec.aggregate.tolist() == [16.0]


def test_trimmed_mean_huge_values_do_not_cancel_honest_ones():
    x = t([[1e30], [1.0], [2.0], [3.0], [-1e30]])
    # b = 1 drops ±1e30 exactly; (1+2+3)/3 = 2 with no cancellation
    assert TrimmedMean(b=1)(x).aggregate.tolist() == [2.0]


@pytest.mark.parametrize("n, b, kept", [(4, 2, 1), (5, 3, 2), (2, 1, 0), (1, 1, 0)])
def test_trimmed_mean_in_a_round_too_small_for_b_trims_what_it_can(n, b, kept):
    # A round thinned by churn (or by screening) below 2b + 1 updates must not kill the
    # run: it drops ⌊(n − 1)/2⌋ per side (the median, for odd n) and says so. By hand:
    # rows 1, 2, 30, 40, 50 (first n of them): n = 4, b → 1: mean(2, 30) = 16; n = 5, b → 2:
    # the median 30; n = 2, b → 0: mean(1, 2) = 1.5; n = 1: the row itself.
    x = t([[1], [2], [30], [40], [50]])[:n]
    dec = TrimmedMean(b=b)(x)
    assert dec.state["b"] == kept and dec.state["b_reduced_from"] == b
    assert dec.aggregate.tolist() == [{4: 16.0, 5: 30.0, 2: 1.5, 1: 1.0}[n]]


@pytest.mark.parametrize("n, b", [(4, 2), (5, 3), (2, 1), (1, 1)])
def test_trimmed_mean_refuses_at_setup_a_b_no_round_can_hold(n, b):
    with pytest.raises(InvalidParameter, match=r"TrimmedMean\.b = %d: must satisfy 2b < n, and a round has at most "
                                               r"n = %d" % (b, n)):
        TrimmedMean(b=b).check_capacity(n)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_trimmed_mean_bad_b_type(bad):
    with pytest.raises(InvalidParameter, match="TrimmedMean.b"):
        TrimmedMean(b=bad)


def test_median_bad_even_rule():
    with pytest.raises(InvalidParameter, match="Median.even_rule = 'upper'"):
        Median(even_rule="upper")


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16, 17, 33, 64, 100])
def test_sorting_network_matches_sort(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 5000, generator=g)
    x[0, :7] = x[-1, :7]  # some exact ties
    out = sorted_reduce(x, lambda s: s.clone().T.reshape(-1)[: s.shape[1]])  # shape check only
    assert out.shape == (5000,)
    ref = torch.sort(x, dim=0).values
    for k in sorted({0, (n - 1) // 2, n - 1}):
        assert torch.equal(sorted_reduce(x, lambda s, k=k: s[k]), ref[k])
    k = (n - 1) // 2
    mid = ref[k] if n % 2 else 0.5 * ref[k] + 0.5 * ref[k + 1]
    assert torch.equal(coordinate_median(x), mid)
    for b in {0, n // 4, (n - 1) // 2}:
        expect = ref[b:n - b].double().mean(0).float()
        assert torch.allclose(trimmed_mean(x, b), expect, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_sorting_network_other_dtypes(dtype):
    x = torch.randn(9, 300, generator=torch.Generator().manual_seed(0)).to(dtype)
    out = coordinate_median(x)
    assert out.dtype == dtype
    assert torch.equal(out, torch.sort(x, dim=0).values[4])


def test_median_does_not_mutate_input():
    x = torch.randn(6, 20000, generator=torch.Generator().manual_seed(1))
    x[2, 3] = math.nan
    before = x.clone()
    Median()(x)
    TrimmedMean(b=2)(x)
    assert torch.equal(torch.nan_to_num(x, nan=7.0), torch.nan_to_num(before, nan=7.0))
