"""NormBound (Sun et al., arXiv:1911.07963): every branch pinned to worked examples.

The rows below use Pythagorean triples, so every norm is an exact small integer and
every expected value is derived by hand in the comment beside it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import redteam
from defenses.norm import NORM_RTOL, NormBound, l2_norms, within_bound
from redteam.errors import InvalidParameter
from redteam.types import AttackContext, ServerContext


def _run(defense, rows, weights=None):
    x = torch.tensor(rows, dtype=torch.float32) if not isinstance(rows, torch.Tensor) else rows
    ctx = ServerContext.default(x) if weights is None else ServerContext.default(
        x, weights=torch.tensor(weights, dtype=x.dtype))
    return defense(x, ctx)


# -- reject mode ------------------------------------------------------------------------
def test_reject_static_bound_worked_example():
    # M = 5. ‖[3,4]‖ = 5 sits exactly on the bound: accepted (the rule is ‖Δ‖ ≤ M).
    # ‖[6,8]‖ = 10 > 5: rejected. ‖[0,1]‖ = 1: accepted.
    # aggregate = sample-weighted mean of the accepted rows, weights (1, 1, 2):
    #   (1·[3,4] + 2·[0,1]) / 3 = [1, 2]
    dec = _run(NormBound(bound=5.0, mode="reject"), [[3, 4], [6, 8], [0, 1]], weights=[1, 1, 2])
    assert dec.accepted.tolist() == [True, False, True]
    assert dec.reasons == {1: "norm 10 > bound 5"}
    assert dec.state == {"bound": 5.0}
    torch.testing.assert_close(dec.aggregate, torch.tensor([1.0, 2.0]))


def test_reject_keeps_rows_unchanged_and_just_over_is_rejected():
    # M = 5; [3, 4.0001] has norm √(9 + 16.0008…) ≈ 5.00008 > 5: rejected, and nothing is
    # rescaled in reject mode: the aggregate is the accepted row itself.
    dec = _run(NormBound(bound=5.0, mode="reject"), [[3, 4.0001], [0, 2]])
    assert dec.accepted.tolist() == [False, True]
    torch.testing.assert_close(dec.aggregate, torch.tensor([0.0, 2.0]))


def test_reject_tolerance_edge_in_float64():
    # One coordinate: ‖[x]‖ = |x| exactly. The rule accepts ‖Δ‖ ≤ M·(1 + NORM_RTOL):
    # x = M·(1 + NORM_RTOL) is accepted (≤, not <); the next float64 above it is rejected.
    m = 2.0
    edge = m * (1.0 + NORM_RTOL)
    above = math.nextafter(edge, math.inf)
    x = torch.tensor([[edge], [above], [m]], dtype=torch.float64)
    dec = NormBound(bound=m, mode="reject")(x, ServerContext.default(x))
    assert dec.accepted.tolist() == [True, False, True]
    assert within_bound(torch.tensor([edge, above], dtype=torch.float64), m).tolist() == [True, False]


def test_reject_float32_row_one_ulp_beyond_is_rejected():
    # [3, 4] scaled by (1 + 2⁻²²) has norm 5·(1 + 2.4e-7) in float64 (the scale is exact
    # in float32 for these small integers), far beyond the 1e-9 tolerance: rejected.
    s = 1.0 + 2.0 ** -22
    dec = _run(NormBound(bound=5.0, mode="reject"), [[3 * s, 4 * s], [3, 4]])
    assert dec.accepted.tolist() == [False, True]


# -- clip mode (the paper's form) -------------------------------------------------------
def test_clip_static_bound_worked_example():
    # M = 5: Δ ← Δ·min(1, M/‖Δ‖).
    #   [6, 8]  (‖·‖ = 10) × 5/10 = [3, 4]
    #   [0, 10] (‖·‖ = 10) × 5/10 = [0, 5]
    #   [1, 0]  (‖·‖ = 1)  × 1    = [1, 0]   (under the bound: untouched, never scaled up)
    # every row accepted; equal weights: ([3,4] + [0,5] + [1,0]) / 3 = [4/3, 3]
    dec = _run(NormBound(bound=5.0, mode="clip"), [[6, 8], [0, 10], [1, 0]])
    assert dec.accepted.tolist() == [True, True, True]
    assert dec.reasons == {}
    torch.testing.assert_close(dec.aggregate, torch.tensor([4 / 3, 3.0]))
    res = NormBound(bound=5.0).filter(torch.tensor([[6.0, 8.0], [0.0, 10.0], [1.0, 0.0]]), None)
    torch.testing.assert_close(res.updates, torch.tensor([[3.0, 4.0], [0.0, 5.0], [1.0, 0.0]]))


def test_clip_is_the_default_mode():
    assert NormBound().mode == "clip"


# -- adaptive bound M = k · median ‖Δⱼ‖ ----------------------------------------------------
def test_adaptive_bound_is_multiplier_times_lower_median_not_mean():
    # norms 1, 2, 3, 10; lower median (torch's convention for an even count) = 2;
    # M = 1.2 · 2 = 2.4. Then 3 > 2.4 and 10 > 2.4 are rejected.
    # (The mean 4 would give M = 4.8 and accept the 3; the midpoint median 2.5 would give
    # M = 3.0 and accept it too.)
    rows = [[1, 0], [0, 2], [3, 0], [0, 10]]
    dec = _run(NormBound(multiplier=1.2, mode="reject"), rows)
    assert dec.accepted.tolist() == [True, True, False, False]
    assert dec.state["bound"] == pytest.approx(2.4, rel=1e-12)


def test_adaptive_bound_odd_count_clip():
    # norms 1, 2, 10 → median 2 → M = 2; clip [0, 10] to [0, 2]. (Mean 13/3 would clip to
    # [0, 4.33].) Aggregate: ([1,0] + [0,2] + [0,2]) / 3 = [1/3, 4/3].
    dec = _run(NormBound(multiplier=1.0), [[1, 0], [0, 2], [0, 10]])
    assert dec.state["bound"] == pytest.approx(2.0)
    torch.testing.assert_close(dec.aggregate, torch.tensor([1 / 3, 4 / 3]))


def test_adaptive_bound_ignores_nonfinite_rows():
    # finite norms 5, 1, 2 → median 2 → M = 2: the NaN row is rejected as non-finite and
    # does not enter the median (torch.median with a NaN would return NaN).
    rows = [[math.nan, 0], [3, 4], [0, 1], [0, 2]]
    dec = _run(NormBound(multiplier=1.0, mode="reject"), rows)
    assert dec.accepted.tolist() == [False, False, True, True]
    assert dec.reasons[0] == "non-finite update"
    assert dec.reasons[1] == "norm 5 > bound 2"
    torch.testing.assert_close(dec.aggregate, torch.tensor([0.0, 1.5]))


def test_adaptive_bound_with_no_finite_norm_falls_back_to_static():
    nb = NormBound(bound=7.0, multiplier=2.0)
    assert nb.threshold(torch.tensor([math.nan, math.inf], dtype=torch.float64)) == 7.0
    assert nb.threshold(torch.tensor([1.0, 3.0, 4.0], dtype=torch.float64)) == 6.0
    assert NormBound(bound=7.0).threshold(torch.tensor([100.0], dtype=torch.float64)) == 7.0


# -- non-finite rows ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["clip", "reject"])
def test_nonfinite_rows_are_rejected_and_never_reach_the_aggregate(mode):
    # rows 0 and 2 are non-finite; the aggregate is the mean of [0,1] and [1,0] (both
    # under M = 5): [0.5, 0.5], never NaN.
    rows = [[math.inf, 0], [0, 1], [0, math.nan], [1, 0]]
    dec = _run(NormBound(bound=5.0, mode=mode), rows)
    assert dec.accepted.tolist() == [False, True, False, True]
    assert dec.reasons == {0: "non-finite update", 2: "non-finite update"}
    torch.testing.assert_close(dec.aggregate, torch.tensor([0.5, 0.5]))


# -- the shared norm routine ----------------------------------------------------------------
def test_l2_norms_over_and_underflow_in_float32():
    # float32 squares of 3e20 overflow and of 3e-30 underflow; the norms are still
    # 5e20 and 5e-30 (re-measured with float64 accumulation).
    # (float32's own norm gives inf, 0 and 5.29e-23 for the first three rows)
    x = torch.tensor([[3e20, 4e20], [3e-30, 4e-30], [3e-23, 4e-23], [3.0, 4.0]], dtype=torch.float32)
    got = l2_norms(x, near=1.0)
    assert got.dtype == torch.float64
    ref = [math.hypot(float(a), float(b)) for a, b in x.tolist()]
    assert got.tolist() == pytest.approx(ref, rel=1e-12)
    dec = NormBound(bound=1e21, mode="reject")(x, ServerContext.default(x))
    assert dec.accepted.tolist() == [True] * 4


def test_l2_norms_accumulate_across_column_blocks():
    # 2·65536 + 3 columns of ones (three float64 blocks): ‖x‖ = √131075 exactly rounded;
    # the row of 0.5s has half of it. Both with and without ``near``.
    d = 2 * 65536 + 3
    x = torch.ones(2, d)
    x[1] = 0.5
    want = [math.sqrt(d), 0.5 * math.sqrt(d)]
    assert l2_norms(x).tolist() == pytest.approx(want, rel=1e-15)
    assert l2_norms(x, near=math.sqrt(d)).tolist() == pytest.approx(want, rel=1e-7)
    assert float(l2_norms(x, near=math.sqrt(d))[0]) == pytest.approx(want[0], rel=1e-15)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_l2_norms_other_dtypes(dtype):
    # always float64 out; 2049 ones: √2049 = 45.265881…, which float16 cannot hold
    x = torch.tensor([[3.0, 4.0], [0.0, 0.5]], dtype=dtype)
    assert l2_norms(x).tolist() == [5.0, 0.5]
    assert l2_norms(x, near=5.0).tolist() == [5.0, 0.5]
    y = torch.ones(1, 2049, dtype=dtype)
    for got in (l2_norms(y), l2_norms(y, near=1.0)):
        assert got.dtype == torch.float64 and float(got[0]) == pytest.approx(math.sqrt(2049), rel=1e-15)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_reject_and_clip_in_other_dtypes(dtype):
    # M = 5: [3,4] on the bound (accepted), [6,8] over (rejected / clipped to [3,4])
    x = torch.tensor([[3.0, 4.0], [6.0, 8.0]], dtype=dtype)
    dec = NormBound(bound=5.0, mode="reject")(x, ServerContext.default(x))
    assert dec.accepted.tolist() == [True, False]
    res = NormBound(bound=5.0).filter(x, None)
    assert res.updates.dtype == dtype
    assert res.updates.tolist() == [[3.0, 4.0], [3.0, 4.0]]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), d=st.integers(1, 300), bound=st.floats(0.01, 1e4),
       n=st.integers(1, 6))
def test_l2_norms_near_the_bound_are_float64_exact(seed, d, bound, n):
    # rows scaled to within a few float32 ulps of the bound: the measured norm equals the
    # exactly rounded Euclidean norm (math.fsum of the float64 squares) to 1e-15.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True) * bound
    x = x.to(torch.float32)
    got = l2_norms(x, near=bound)
    for i, row in enumerate(x.tolist()):
        exact = math.sqrt(math.fsum(v * v for v in row))
        assert float(got[i]) == pytest.approx(exact, rel=1e-14)
    dec = NormBound(bound=bound, mode="reject")(x, ServerContext.default(x))
    assert dec.accepted.tolist() == [float(v) <= bound * (1 + NORM_RTOL) for v in got]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), d=st.integers(1, 64), bound=st.floats(0.1, 10.0))
def test_clip_property(seed, d, bound):
    # after clipping every row is within the bound up to float32 rounding; rows under
    # the bound are untouched; rows over it keep their direction.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, d, generator=g) * torch.logspace(-2, 2, 8)[:, None]
    res = NormBound(bound=bound).filter(x, None)
    before = l2_norms(x)
    after = l2_norms(res.updates)
    assert bool((after <= bound * (1 + 1e-6)).all())
    under = before <= bound
    assert torch.equal(res.updates[under], x[under])
    over = ~under
    if bool(over.any()):
        torch.testing.assert_close(after[over], torch.full_like(after[over], bound), rtol=1e-6, atol=0)
        cos = torch.nn.functional.cosine_similarity(res.updates[over], x[over], dim=1)
        torch.testing.assert_close(cos, torch.ones_like(cos))


# -- the boundary an attack and the rule share ------------------------------------------------
def _hug(d, seed, bound, f=4, n=20):
    g = torch.Generator().manual_seed(seed)
    honest = torch.randn(n, d, generator=g) * 0.05
    ctx = AttackContext(round=0, n_clients=n, malicious=tuple(range(f)), own_updates=honest[:f],
                        visible_updates=honest[f:], global_params=torch.zeros(d), generator=g)
    rows = redteam.attack("norm_hug", bound=bound).craft_updates(ctx)
    return torch.cat([rows, honest[f:]])


def test_norm_hug_rows_are_accepted_at_a_realistic_dimension():
    # 4,810 parameters (the digits MLP), float32 rows built exactly on M = 1.5. Before the
    # shared routine about a fifth of these rows were rejected ("norm 1.5 > bound 1.5"):
    # the rule measured a float32-accumulated norm, the attack a float64 one. The test
    # also checks that it exercises that case: some rows' float32 norm exceeds M.
    bound, f = 1.5, 4
    fast_over = 0
    for seed in range(20):
        full = _hug(4810, seed, bound)
        fast_over += int((torch.linalg.vector_norm(full[:f], dim=1).double() > bound).sum())
        dec = NormBound(bound=bound, mode="reject")(full, ServerContext.default(full))
        assert bool(dec.accepted[:f].all()), dec.reasons
        assert float(l2_norms(full[:f], near=bound).max()) <= bound
        assert float(l2_norms(full[:f], near=bound).min()) >= bound * (1 - 1e-6)  # on the bound
    assert fast_over > 0


def test_norm_hug_rows_accepted_at_several_bounds_and_a_larger_model():
    # the same agreement at other scales of M and at d = 50,000 (several float64 blocks
    # of the exact re-measurement).
    for bound in (0.1, 1.0, 3.7):
        full = _hug(50_000, 7, bound, f=3, n=10)
        dec = NormBound(bound=bound, mode="reject")(full, ServerContext.default(full))
        assert bool(dec.accepted[:3].all()), dec.reasons


def test_rows_fitted_to_an_adaptive_bound_are_accepted():
    # M = 2 × the lower median of the round's norms. 11 honest rows and 8 rows fitted to
    # exactly M (float64 measure, float32 rows): the median is the 10th smallest norm of
    # 19, an honest row, so M is known before the fitted rows are built. The rule must
    # locate M from the median's exact norm and judge the fitted rows exactly: all 8 in.
    from attacks._common import fit_norm

    g = torch.Generator().manual_seed(3)
    honest = torch.randn(11, 4810, generator=g) * 0.05
    m = 2.0 * float(torch.sort(l2_norms(honest)).values[9])
    fitted = fit_norm(torch.randn(8, 4810, generator=g, dtype=torch.float64), m, honest)
    full = torch.cat([honest, fitted])
    dec = NormBound(multiplier=2.0, mode="reject")(full, ServerContext.default(full))
    assert dec.state["bound"] == pytest.approx(m, rel=1e-14)
    assert dec.accepted.tolist() == [True] * 19, dec.reasons


# -- parameters ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, name", [
    ({"bound": 0}, "bound"), ({"bound": -1.0}, "bound"), ({"bound": math.nan}, "bound"),
    ({"bound": math.inf}, "bound"), ({"bound": True}, "bound"), ({"bound": "1"}, "bound"),
    ({"multiplier": 0.0}, "multiplier"), ({"multiplier": math.inf}, "multiplier"),
    ({"multiplier": "2"}, "multiplier"), ({"mode": "drop"}, "mode"),
])
def test_bad_parameters_are_one_line_errors(kw, name):
    with pytest.raises(InvalidParameter) as ei:
        redteam.defense("norm_bound", **kw)
    msg = str(ei.value)
    assert name in msg and "\n" not in msg


@pytest.mark.parametrize("kw, msg", [
    ({"bound": 0}, "NormBound.bound = 0: must be a finite number > 0"),
    ({"multiplier": -1.0}, "NormBound.multiplier = -1.0: must be a finite number > 0 (or unset)"),
    ({"mode": "x"}, "NormBound.mode = 'x': must be 'clip' or 'reject'"),
])
def test_direct_construction_messages(kw, msg):
    with pytest.raises(InvalidParameter) as ei:
        NormBound(**kw)
    assert str(ei.value) == msg
