"""The compiled sorting network (defenses/_sortnet.py, issue 23 §1): the values it returns are the
sorted values, bit for bit, for every row count it takes, special values included; the median,
trimmed mean and Bulyan give the same bits through it as through numpy's sort; and it steps aside
where it does not apply."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from defenses import _sortnet
from defenses._common import closest_to_median_means, order_statistics, sorted_reduce, trimmed_means32
from defenses.krum import _closest_to_median_mean
from defenses.median import coordinate_median, trimmed_mean

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(_sortnet._kernels() is None, reason="numba is not installed")


@pytest.fixture(autouse=True)
def _small_inputs_take_the_network(monkeypatch):
    monkeypatch.setattr(_sortnet, "MIN_VALUES", 0)
    monkeypatch.delenv("REDTEAM_SORTNET", raising=False)


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    """Compile (or load) both key widths once, outside any hypothesis deadline."""
    old = _sortnet.MIN_VALUES
    _sortnet.MIN_VALUES = 0
    try:
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(5, 70, dtype=dtype)
            _sortnet.order_statistics(x, (2,))
            _sortnet.sorted_rows(x, None, 0, 70, torch.empty(5, 70, dtype=dtype))
        _sortnet.trimmed_means32(torch.randn(5, 70), 1, 1e-12)
    finally:
        _sortnet.MIN_VALUES = old


def _reference(x: np.ndarray) -> np.ndarray:
    return np.sort(np.where(np.isnan(x), np.inf, x), axis=0)


def _same_bits_up_to_zero_sign(a: torch.Tensor, b: np.ndarray) -> bool:
    a = a.numpy()
    zero = (a == 0) & (b == 0)
    width = np.int32 if a.dtype == np.float32 else np.int64
    return bool(np.array_equal(np.where(zero, 0, a.view(width)), np.where(zero, 0, b.view(width))))


def _awkward(rng: np.random.Generator, n: int, d: int, dtype) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(dtype)
    u = rng.random(x.shape)
    info = np.finfo(dtype)
    for lo, value in [(0.0, np.nan), (0.02, np.inf), (0.04, -np.inf), (0.06, 0.0), (0.08, -0.0),
                      (0.10, info.max), (0.12, -info.max), (0.14, info.smallest_subnormal),
                      (0.16, -info.smallest_subnormal)]:
        x[(u >= lo) & (u < lo + 0.02)] = value
    x[:, :3] = x[:1, :3]  # columns of one repeated value
    return x


ROW_COUNTS = [2, 3, 7, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 80, 81, 100, 127, 128, 129, 200, 255, 256]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", ROW_COUNTS)
def test_every_rank_and_every_row_count_is_the_sorted_value(n, dtype):
    rng = np.random.default_rng(n)
    d = 64 * 3 + 37  # three whole tiles and a partial one
    x = _awkward(rng, n, d, dtype)
    ref = _reference(x)
    xt = torch.from_numpy(x)
    ranks = tuple(sorted({0, 1, (n - 1) // 2, n // 2, n - 2, n - 1}))
    got = _sortnet.order_statistics(xt, ranks)
    assert _same_bits_up_to_zero_sign(got, ref[list(ranks)])
    full = torch.empty(n, d - 5, dtype=xt.dtype)
    _sortnet.sorted_rows(xt, None, 5, d, full)
    assert _same_bits_up_to_zero_sign(full, ref[:, 5:])
    rows = torch.from_numpy(rng.permutation(n)[:max(2, n - 3)])
    part = torch.empty(rows.numel(), d, dtype=xt.dtype)
    _sortnet.sorted_rows(xt, rows, 0, d, part)
    assert _same_bits_up_to_zero_sign(part, _reference(x[rows.numpy()]))


def test_a_column_worked_by_hand():
    # NaN sorts, and comes back, as +inf; −0.0 before +0.0; −inf first
    col = [3.0, float("nan"), 0.0, -0.0, float("-inf"), 1e-45, -2.5]
    x = torch.tensor(col, dtype=torch.float32)[:, None].repeat(1, 130).contiguous()
    out = torch.empty(7, 130)
    _sortnet.sorted_rows(x, None, 0, 130, out)
    want = [float("-inf"), -2.5, -0.0, 0.0, float(np.float32(1e-45)), 3.0, float("inf")]  # 2⁻¹⁴⁹, a subnormal
    assert out[:, 0].tolist() == want
    assert [np.signbit(v) for v in out[:, 129].numpy()] == [True, True, True, False, False, False, False]
    assert torch.equal(out, out[:, :1].expand(7, 130))


@settings(deadline=None, max_examples=60)
@given(hnp.arrays(np.float32, st.tuples(st.integers(2, 70), st.integers(1, 150)),
                  elements=st.floats(width=32, allow_nan=True, allow_infinity=True)),
       st.data())
def test_order_statistics_are_the_sorted_values(x, data):
    n = x.shape[0]
    ranks = tuple(sorted(set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4)))))
    got = _sortnet.order_statistics(torch.from_numpy(x), ranks)
    assert _same_bits_up_to_zero_sign(got, _reference(x)[list(ranks)])


@pytest.mark.parametrize("threads", [1, 2])
def test_the_rules_give_the_bits_of_numpys_sort(monkeypatch, threads):
    """Median, trimmed mean and Bulyan through the network against REDTEAM_SORTNET=0 (numpy's
    sort of transposed tiles): the same tensors (torch.equal: a median's zero may differ in sign)."""
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(3)
        for n, d in [(10, 3000), (25, 9000), (100, 4100), (51, 20000)]:
            x = torch.randn(n, d, generator=g)
            x[0, :50] = float("nan")
            x[1, 50:90] = float("inf")
            x[2:, 90:100] = 0.0
            x64 = x.double()
            sel = torch.randperm(n, generator=g)[: n - 2 * (n // 5)]  # Bulyan's θ rows, f = n // 5

            def rules():
                return [coordinate_median(x), coordinate_median(x64), trimmed_mean(x, n // 10),
                        trimmed_mean(x64, n // 5), sorted_reduce(x, lambda s: s[n // 3]),
                        sorted_reduce(x, lambda s: _closest_to_median_mean(s, sel.numel() - 2 * (n // 5)), rows=sel)]

            got = rules()
            monkeypatch.setenv("REDTEAM_SORTNET", "0")
            want = rules()
            monkeypatch.delenv("REDTEAM_SORTNET")
            for a, b in zip(got, want):
                assert torch.equal(a, b)
    finally:
        torch.set_num_threads(1)


def test_trimmed_means_settle_the_same_columns():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, 5000, generator=g) * torch.logspace(-30, 30, 5000)
    x[:, :100] = torch.randint(-3, 4, (40, 100), generator=g).float()  # exact sums
    means, settled = trimmed_means32(x, 5)
    import os

    os.environ["REDTEAM_SORTNET"] = "0"
    try:
        means0, settled0 = trimmed_means32(x, 5)
    finally:
        del os.environ["REDTEAM_SORTNET"]
    assert torch.equal(settled, settled0)
    assert torch.equal(means[settled], means0[settled])
    assert settled[:100].all()


def test_it_steps_aside_where_it_does_not_apply(monkeypatch):
    x = torch.randn(20, 100)
    assert _sortnet.usable(x, 20)
    assert not _sortnet.usable(x, 1)
    assert not _sortnet.usable(torch.randn(257, 100), 257)
    assert not _sortnet.usable(x.half(), 20)
    assert not _sortnet.usable(x.T, 100)  # not contiguous
    monkeypatch.setenv("REDTEAM_SORTNET", "0")
    assert not _sortnet.usable(x, 20)
    monkeypatch.delenv("REDTEAM_SORTNET")
    monkeypatch.setattr(_sortnet, "MIN_VALUES", 1 << 20)
    assert not _sortnet.usable(x, 20)
    assert _sortnet.usable(x, 20, values=1 << 20)
    # without numba: numpy's sort, same answer
    monkeypatch.setattr(_sortnet, "MIN_VALUES", 0)
    want = order_statistics(x, (3, 10))
    monkeypatch.setitem(_sortnet._state, "mod", None)
    assert not _sortnet.usable(x, 20)
    assert torch.equal(order_statistics(x, (3, 10)), want)


def test_the_kernels_module_is_what_the_generator_writes():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_sortnet.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kind", ["gaussian", "heavy", "symmetric integers", "infinite rows", "near float32 max"])
@pytest.mark.parametrize("theta,f", [(7, 1), (18, 4), (40, 9), (80, 20), (131, 30)])
def test_bulyans_phase_has_the_bits_of_sorted_reduce(monkeypatch, kind, theta, f):
    """The compiled phase against torch's reduce on numpy's sort, column for column, on inputs
    that settle and on inputs that send chunks back to torch (spreads that are not finite,
    means near zero that the bound cannot settle)."""
    g = torch.Generator().manual_seed(theta)
    n, d = theta + 5, 4096 + 70
    x = torch.randn(n, d, generator=g)
    if kind == "heavy":
        x = x * torch.exp(4 * torch.randn(n, d, generator=g))
    elif kind == "symmetric integers":
        x = torch.randint(-3, 4, (n, d), generator=g).float()
    elif kind == "infinite rows":
        x[0, : d // 2] = float("inf")
        x[1, 100:200] = float("nan")
        x[2, 300:] = float("-inf")
    elif kind == "near float32 max":
        x[:, :50] = 3.0e38 * torch.sign(torch.randn(n, 50, generator=g))
    sel = torch.randperm(n, generator=g)[:theta]
    beta = theta - 2 * f

    def reduce(s):
        return _closest_to_median_mean(s, beta)

    got = closest_to_median_means(x, sel, beta, reduce)
    monkeypatch.setenv("REDTEAM_SORTNET", "0")
    want = sorted_reduce(x, reduce, rows=sel)
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want) or (torch.isnan(got) == torch.isnan(want)).all() and torch.equal(
        torch.nan_to_num(got), torch.nan_to_num(want))


def test_bulyans_phase_settles_ordinary_columns_in_one_pass():
    x = torch.randn(60, 5000, generator=torch.Generator().manual_seed(1))
    out = torch.empty(5000)
    assert _sortnet.bulyan32(x, torch.arange(50), 30, 0, 5000, out, 1024).tolist() == [True] * 5
    x[0, 2050] = float("inf")
    x[1:, 2050] = float("inf")  # every spread of column 2050 is inf − inf
    assert _sortnet.bulyan32(x, torch.arange(50), 30, 0, 5000, out, 1024).tolist() == [True, True, False, True, True]


def test_bulyans_phase_on_two_threads_with_a_chunk_sent_back(monkeypatch):
    """Chunks go to threads of our own; one of them (a column of +inf and −inf) takes torch's
    path afterwards; the whole still has sorted_reduce's bits."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(140, 3 * 4096 + 5, generator=g)
    x[:60, 5000] = float("inf")
    x[60:, 5000] = float("-inf")
    sel = torch.arange(3, 134)
    beta = sel.numel() - 60

    def reduce(s):
        return _closest_to_median_mean(s, beta)

    torch.set_num_threads(2)
    try:
        got = closest_to_median_means(x, sel, beta, reduce)
    finally:
        torch.set_num_threads(1)
    monkeypatch.setenv("REDTEAM_SORTNET", "0")
    want = sorted_reduce(x, reduce, rows=sel)
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    assert torch.equal(torch.isnan(got), torch.isnan(want))


def test_the_shared_pool_is_started_again_in_a_forked_child(monkeypatch):
    first = _sortnet.pool(2)
    assert _sortnet.pool(2) is first
    monkeypatch.setattr(_sortnet.os, "getpid", lambda: -1)  # as a child process sees it
    child = _sortnet.pool(2)
    assert child is not first
    assert child.submit(lambda: 7).result(timeout=10) == 7


def test_a_network_that_does_not_compile_falls_back_to_numpy_and_says_so(monkeypatch):
    x = torch.randn(20, 100)
    want = order_statistics(x, (3, 10))
    k = _sortnet._kernels()

    def broken(*args, **kwargs):
        raise RuntimeError("LLVM ERROR: cannot select\nmore detail")

    monkeypatch.setattr(k, "order_stats", broken)
    monkeypatch.delitem(_sortnet._state, "compiled:torch.float32", raising=False)
    with pytest.warns(RuntimeWarning, match="does not run here .*LLVM ERROR: cannot select.*sort with numpy"):
        assert not _sortnet.usable(x, 20)
    assert torch.equal(order_statistics(x, (3, 10)), want)
    monkeypatch.delitem(_sortnet._state, "compiled:torch.float32")  # the next test compiles again
