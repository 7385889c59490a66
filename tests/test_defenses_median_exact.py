"""Coordinate-wise median, trimmed mean and Bulyan's coordinate phase, bit for bit against a
plain reference: ``torch.sort`` of the column (NaN as +inf), then the pick, the midpoint
½·s[k] + ½·s[k+1], or the trimmed mean's float64 sums over the two sorted halves of the rows
(clamped to [s[b], s[n−1−b]]) exactly as ``defenses.median`` defines them. Before issue 23 the
rules ran a bitonic network; the reference reproduced that implementation bit for bit on these
inputs (one chunk, one thread), except the sign of a zero median where -0.0 and +0.0 meet in the
middle, which the network left to the order of its min/max calls and which stays unspecified.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from defenses._common import order_statistics, sorted_reduce, trimmed_means32
from defenses.krum import _closest_to_median_mean
from defenses.median import coordinate_median, trimmed_mean

F32_MAX = 3.4028234663852886e38
SPECIAL = {
    torch.float32: [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, -7.25, 1e-45, -1e-45, 3e-44, -1e-40, 1.1754942e-38,
                    1e-30, -1e-30, 1e30, -1e30, 1e38, -1e38, F32_MAX, -F32_MAX, 16777217.0, 0.1],
    torch.float64: [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -7.25, 5e-324, -5e-324, 1e-310, 2.2250738585072014e-308,
                    1e-200, -1e200, 1e300, -1e300, 1.7976931348623157e308, -1.7976931348623157e308, 0.1,
                    9007199254740993.0],
}


def _column_values(dtype: torch.dtype, nonfinite: bool) -> st.SearchStrategy[float]:
    width = 32 if dtype == torch.float32 else 64
    parts = [st.sampled_from(SPECIAL[dtype]), st.floats(width=width, allow_nan=False, allow_infinity=False),
             st.integers(-3, 3).map(float)]  # ties
    if nonfinite:
        parts.append(st.sampled_from([math.nan, math.inf, -math.inf]))
    return st.one_of(*parts)


@st.composite
def matrices(draw, nonfinite: bool = False, max_n: int = 24, max_d: int = 9):
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    n = draw(st.integers(1, max_n))
    d = draw(st.integers(1, max_d))
    values = draw(st.lists(_column_values(dtype, nonfinite), min_size=n * d, max_size=n * d))
    return torch.tensor(values, dtype=dtype).reshape(n, d)


def _prepared(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x, nan=math.inf, posinf=math.inf, neginf=-math.inf)


def ref_median(x: torch.Tensor, even_rule: str = "midpoint") -> torch.Tensor:
    n = x.shape[0]
    s = torch.sort(_prepared(x), dim=0).values
    k = (n - 1) // 2
    return s[k] if n % 2 or even_rule == "lower" else 0.5 * s[k] + 0.5 * s[k + 1]


def ref_trimmed_mean(x: torch.Tensor, b: int) -> torch.Tensor:
    n = x.shape[0]
    p = (n + 1) // 2
    keep = n - 2 * b
    y = _prepared(x)
    lo_half, hi_half = torch.sort(y[:p], dim=0).values, torch.sort(y[p:], dim=0).values
    if b == 0:
        total = lo_half.to(torch.float64).sum(dim=0) + hi_half.to(torch.float64).sum(dim=0)
    else:
        s = torch.sort(y, dim=0).values
        lo, hi = s[b], s[n - 1 - b]
        total = torch.clamp(lo_half, lo, hi).to(torch.float64).sum(dim=0)
        total += torch.clamp(hi_half, lo, hi).to(torch.float64).sum(dim=0)
        total -= b * (lo.to(torch.float64) + hi.to(torch.float64))
    return (total / keep).to(x.dtype)


def same_bits(got: torch.Tensor, want: torch.Tensor, *, zero_sign: bool = True) -> bool:
    """Equal bit for bit (any NaN equal to any NaN; -0.0 equal to +0.0 unless ``zero_sign``)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    ints = torch.int32 if got.dtype == torch.float32 else torch.int64
    ok = (got.view(ints) == want.view(ints)) | (torch.isnan(got) & torch.isnan(want))
    if not zero_sign:
        ok |= (got == 0) & (want == 0)
    return bool(ok.all())


@settings(max_examples=150, deadline=None)
@given(x=matrices(nonfinite=True), even_rule=st.sampled_from(["midpoint", "lower"]))
@example(x=torch.tensor([[-0.0, 0.0], [0.0, -0.0], [1.0, -1.0]]), even_rule="midpoint")
@example(x=torch.tensor([[F32_MAX], [F32_MAX], [-1.0], [F32_MAX]]), even_rule="midpoint")  # ½a + ½b: no overflow
@example(x=torch.tensor([[1e-45], [1e-45]]), even_rule="midpoint")  # ½ of the least subnormal rounds to 0
@example(x=torch.tensor([[math.inf], [-math.inf]]), even_rule="midpoint")  # ½·inf + ½·(−inf) is NaN in both
def test_median_matches_sort_then_pick(x, even_rule):
    before = x.clone()
    got = coordinate_median(x, even_rule)
    want = ref_median(x, even_rule)
    # equal values, a NaN equal to a NaN (torch.equal says NaN ≠ NaN: a midpoint of ±inf is NaN in both)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    assert same_bits(got, want, zero_sign=False)
    assert same_bits(x, before)  # not mutated


@settings(max_examples=200, deadline=None)
@given(x=matrices(nonfinite=True))
@example(x=torch.tensor([[1e30], [1.0], [-1e30], [3.0], [7.0]]))  # inexact: the halves' order decides
@example(x=torch.tensor([[1.0], [-1.0], [2.0 ** -40], [5.0], [-5.0]]))  # mean near 0, no exactness proof
def test_trimmed_mean_matches_sorted_halves_bit_for_bit(x):
    for b in range((x.shape[0] - 1) // 2 + 1):
        assert same_bits(trimmed_mean(x, b), ref_trimmed_mean(x, b)), b


@settings(max_examples=60, deadline=None)
@given(x=matrices(max_n=30, max_d=6), data=st.data())
def test_bulyan_coordinate_phase_matches_sort(x, data):
    n = x.shape[0]
    rows = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n), label="rows"))
    beta = data.draw(st.integers(1, len(rows)), label="beta")
    sel = torch.tensor(rows, dtype=torch.long)
    got = sorted_reduce(x, lambda s: _closest_to_median_mean(s, beta), rows=sel)
    want = _closest_to_median_mean(torch.sort(_prepared(x[sel]), dim=0).values, beta).to(x.dtype)
    assert same_bits(got, want)


@settings(max_examples=60, deadline=None)
@given(x=matrices(nonfinite=True), data=st.data())
def test_order_statistics_are_sort_picks(x, data):
    n = x.shape[0]
    ranks = tuple(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4), label="ranks"))
    got = order_statistics(x, ranks)
    want = torch.sort(_prepared(x), dim=0).values[list(ranks)]
    assert torch.equal(got, want)


def test_trimmed_mean_takes_the_halves_where_the_direct_sum_could_round_otherwise():
    # column 0: kept values -1, 2⁻⁴⁰, 1: the mean 2⁻⁴⁰/3 is near 0 (its float32 rounding is not
    # settled by an error bound) and 1 and 2⁻⁴⁰ lie 40 binary orders apart (no proof that the
    # sum is exact): recomputed over the sorted halves. Column 1: plain values, settled.
    x = torch.tensor([[1.0, 1.0], [-1.0, 2.0], [2.0 ** -40, 3.0], [5.0, 4.0], [-5.0, 5.0]])
    _, settled = trimmed_means32(x, 1)
    assert settled.tolist() == [False, True]
    assert same_bits(trimmed_mean(x, 1), ref_trimmed_mean(x, 1))
    # b = 0 over 1e30, 1, -1e30, 3, 7: the halves sum (-1e30 + 1) + 1e30 = 0, then + 10: mean 2
    y = torch.tensor([[1e30], [1.0], [-1e30], [3.0], [7.0]])
    assert trimmed_means32(y, 0)[1].tolist() == [False]
    assert trimmed_mean(y, 0).tolist() == [2.0] == ref_trimmed_mean(y, 0).tolist()
    # among 3,000 columns: only the unsettled ones are sorted again, in their tile
    z = torch.randn(5, 3000, generator=torch.Generator().manual_seed(5))
    z[:, 1234] = x[:, 0]
    z[:, 2999] = y[:, 0]
    _, settled = trimmed_means32(z, 1)
    assert not settled[1234] and int((~settled).sum()) < 10
    assert same_bits(trimmed_mean(z, 1), ref_trimmed_mean(z, 1))
    assert same_bits(trimmed_mean(z, 0), ref_trimmed_mean(z, 0))


@pytest.mark.threads(2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_many_tiles_on_two_threads(dtype):
    # wide enough for the tiles to be spread over two threads of our own; values on a grid of
    # quarters (with ties and zeros of both signs) so that every float64 sum is exact and the
    # reference's order of summation cannot differ from any chunking's
    g = torch.Generator().manual_seed(23)
    x = (torch.randint(-40, 41, (21, 20011), generator=g).to(dtype) / 4)
    x[3, ::7] = -0.0
    x[:, 5] = 0.0
    assert torch.get_num_threads() == 2
    for rule in ("midpoint", "lower"):
        assert torch.equal(coordinate_median(x, rule), ref_median(x, rule))
    for b in (0, 3, 10):
        assert same_bits(trimmed_mean(x, b), ref_trimmed_mean(x, b))
    sel = torch.arange(2, 19)
    assert same_bits(sorted_reduce(x, lambda s: _closest_to_median_mean(s, 9), rows=sel),
                     _closest_to_median_mean(torch.sort(x[sel], dim=0).values, 9).to(dtype))
