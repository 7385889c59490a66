"""Geometric median, centered clipping and static clipping: worked examples and errors."""

from __future__ import annotations

import math

import pytest
import torch

from defenses.clipping import CenteredClipping, Clip, distances_to
from defenses.geomed import GeometricMedian
from redteam.errors import InvalidParameter
from redteam.pipeline import Pipeline
from redteam.types import ServerContext

F64 = torch.float64


def test_geomed_square_plus_outlier_closed_form():
    # Corners (0,0) (2,0) (0,2) (2,2) and an outlier (20,20). By symmetry the median
    # is (t, t). F'(t) = -√2 + 2·(2t − 2)/√((2−t)² + t²) = 0  ⇒  4(t−1)² = (t−1)² + 1
    # ⇒ t = 1 + 1/√3 ≈ 1.57735.
    x = torch.tensor([[0, 0], [2, 0], [0, 2], [2, 2], [20, 20]], dtype=F64)
    dec = GeometricMedian(tol=1e-14, nu=1e-12)(x)
    t = 1 + 1 / math.sqrt(3)
    # The stopping rule is on the objective F, which is flat (quadratic) at the
    # optimum: F within 1e-12 relative, the point within ~1e-6.
    best = sum(math.dist((t, t), p) for p in x.tolist()) / 5  # α normalised to sum 1
    assert dec.state["objective"] == pytest.approx(best, rel=1e-12)
    assert dec.aggregate.tolist() == pytest.approx([t, t], abs=2e-6)
    assert dec.state["converged"] and dec.state["iterations"] > 3
    assert float(dec.weights.sum()) == pytest.approx(1.0)


def test_geomed_one_dimension_is_the_weighted_median():
    x = torch.tensor([[0.0], [1.0], [10.0]], dtype=F64)
    # equal weights: the 1-D geometric median is the median, 1
    assert GeometricMedian(tol=1e-14, nu=1e-12)(x).aggregate.item() == pytest.approx(1.0, abs=1e-6)
    # sample weights 1, 1, 3: the point holding more than half the weight, 10
    ctx = ServerContext.default(x, weights=torch.tensor([1.0, 1.0, 3.0], dtype=F64))
    assert GeometricMedian(tol=1e-14, nu=1e-12)(x, ctx).aggregate.item() == pytest.approx(10.0, abs=1e-6)
    # weighted=False ignores the counts
    assert GeometricMedian(tol=1e-14, nu=1e-12, weighted=False)(x, ctx).aggregate.item() == pytest.approx(
        1.0, abs=1e-6)


def test_geomed_iteration_cap_and_zero_init():
    x = torch.tensor([[0, 0], [2, 0], [0, 2], [2, 2], [20, 20]], dtype=F64)
    dec = GeometricMedian(max_iter=1, tol=0.0, init="zero")(x)
    assert dec.state["iterations"] == 1 and not dec.state["converged"]
    # One Weiszfeld step from z = 0 (ν = 1e-6): β = 1/max(ν, ‖xᵢ‖) = 1e6, 1/2, 1/2, 1/√8, 1/√800.
    # Each coordinate: (1/2·2 + 2/√8 + 20/√800) / (1e6 + ...) = (1 + 0.7071 + 0.7071)/1e6 ≈ 2.41e-6.
    expect = (1 + 2 / math.sqrt(8) + 20 / math.sqrt(800)) / (1e6 + 1 + 1 / math.sqrt(8) + 1 / math.sqrt(800))
    assert dec.aggregate.tolist() == pytest.approx([expect, expect], rel=1e-9)


def test_geomed_drops_nonfinite_rows():
    x = torch.tensor([[0.0], [1.0], [float("nan")], [10.0]])
    dec = GeometricMedian()(x)
    assert dec.accepted.tolist() == [True, True, False, True]
    assert dec.reasons == {2: "non-finite update"}
    assert dec.aggregate.item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("kw, name", [({"tol": -1.0}, "tol"), ({"max_iter": 0}, "max_iter"),
                                      ({"nu": 0.0}, "nu"), ({"init": "median"}, "init")])
def test_geomed_bad_parameters(kw, name):
    with pytest.raises(InvalidParameter, match=f"GeometricMedian.{name}"):
        GeometricMedian(**kw)


# Centered clipping, τ = 1, v₀ = 0, rows (3,4), (0,0.5), (−6,8):
#   ‖x₁‖ = 5 → (0.6, 0.8); ‖x₂‖ = 0.5 ≤ τ → (0, 0.5); ‖x₃‖ = 10 → (−0.6, 0.8)
#   v₁ = (0, 2.1)/3 = (0, 0.7)
CC_X = torch.tensor([[3.0, 4.0], [0.0, 0.5], [-6.0, 8.0]], dtype=F64)


def _cc_step(v):
    # one iteration written out: v + (1/n) Σ (xᵢ − v)·min(1, τ/‖xᵢ − v‖), τ = 1
    out = list(v)
    for x in CC_X.tolist():
        diff = [x[0] - v[0], x[1] - v[1]]
        norm = math.hypot(*diff)
        scale = min(1.0, 1.0 / norm)
        out[0] += diff[0] * scale / 3
        out[1] += diff[1] * scale / 3
    return out


def test_centered_clipping_first_round_by_hand():
    dec = CenteredClipping(tau=1.0, n_iter=1)(CC_X)
    assert dec.aggregate.tolist() == pytest.approx([0.0, 0.7], abs=1e-12)
    assert torch.equal(dec.state["previous"], dec.aggregate)
    # weights wᵢ = min(1, τ/‖xᵢ‖)/n = (1/5, 1, 1/10)/3
    assert dec.weights.tolist() == pytest.approx([1 / 15, 1 / 3, 1 / 30])


def test_centered_clipping_two_iterations_and_state():
    # second iteration from (0, 0.7): ‖(3, 3.3)‖ = √19.89, ‖(0, −0.2)‖ = 0.2, ‖(−6, 7.3)‖ = √89.29
    v2 = _cc_step(_cc_step([0.0, 0.0]))
    assert v2 == pytest.approx([0.0125694, 1.1374941], abs=1e-6)
    assert CenteredClipping(tau=1.0, n_iter=2)(CC_X).aggregate.tolist() == pytest.approx(v2, abs=1e-12)
    # the same number from one iteration started at the previous aggregate (explicit state)
    first = CenteredClipping(tau=1.0, n_iter=1)(CC_X)
    ctx = ServerContext.default(CC_X, state=first.state)
    again = CenteredClipping(tau=1.0, n_iter=1)(CC_X, ctx)
    assert again.aggregate.tolist() == pytest.approx(v2, abs=1e-12)
    assert again.state["start_coefficient"] == pytest.approx(1 - (1 / math.sqrt(19.89) + 1 + 1 / math.sqrt(89.29)) / 3)


def test_centered_clipping_state_through_a_pipeline():
    pipe = Pipeline((Clip(bound=100.0), CenteredClipping(tau=1.0)))
    first = pipe(CC_X)
    assert set(first.state) == {"1"}
    second = pipe(CC_X, ServerContext.default(CC_X, state=first.state))
    assert second.aggregate.tolist() == pytest.approx(_cc_step(_cc_step([0.0, 0.0])), abs=1e-12)


def test_centered_clipping_nonfinite_rows_contribute_nothing():
    x = torch.cat([CC_X, torch.tensor([[float("nan"), 1.0]], dtype=F64)])
    dec = CenteredClipping(tau=1.0)(x)
    # same clipped sum (0, 2.1) but divided by n = 4
    assert dec.aggregate.tolist() == pytest.approx([0.0, 2.1 / 4], abs=1e-12)
    assert dec.accepted.tolist() == [True, True, True, False]


def test_centered_clipping_bad_state_and_parameters():
    with pytest.raises(InvalidParameter, match="CenteredClipping.tau = -1"):
        CenteredClipping(tau=-1.0)
    with pytest.raises(InvalidParameter, match="CenteredClipping.n_iter = 0"):
        CenteredClipping(n_iter=0)
    ctx = ServerContext.default(CC_X, state={"previous": torch.zeros(5)})
    with pytest.raises(InvalidParameter, match=r"shape \(2,\)"):
        CenteredClipping()(CC_X, ctx)


def test_clip_worked_example():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.5]])
    rows, w = Clip(bound=1.0).transform(x, torch.ones(2), ServerContext.default(x))
    # ‖(3,4)‖ = 5 → ×1/5 = (0.6, 0.8); ‖(0,0.5)‖ = 0.5 ≤ 1 unchanged
    assert rows.flatten().tolist() == pytest.approx([0.6, 0.8, 0.0, 0.5])
    # alone it is followed by the sample-weighted mean: ((0.6,0.8) + (0,0.5))/2
    assert Clip(bound=1.0)(x).aggregate.tolist() == pytest.approx([0.3, 0.65])
    with pytest.raises(InvalidParameter, match="Clip.bound = 0"):
        Clip(bound=0)


def test_distances_to_matches_direct_norms():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 40000, generator=g)
    v = torch.randn(40000, generator=g)
    ref = torch.linalg.vector_norm((x.double() - v.double()), dim=1)
    assert torch.allclose(distances_to(x, v), ref, rtol=1e-6)
