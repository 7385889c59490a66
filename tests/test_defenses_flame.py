"""FLAME (Nguyen et al., USENIX Security 2022): clustering, adaptive clipping, noise."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from defenses.flame import FLAME, cosine_distances
from redteam.errors import InvalidParameter
from redteam.types import ServerContext

# Five 2-D updates: three along +x (norms 1, 2, 4), one along +y (norm 3), one along −y (norm 5).
# Cosine distances: 0 among the three +x rows, 1 between +x and ±y, 2 between +y and −y.
# HDBSCAN (min_samples 1: mutual reachability = distance) with min cluster size ⌊5/2⌋ + 1 = 3:
# the +x rows join at distance 0, the ±y rows only at distance 1, so the three +x rows are
# the cluster and the ±y rows outliers.
# Clipping bound S = median of all five norms {1, 2, 4, 3, 5} = 3: the norm-4 row is scaled by 3/4.
# Aggregate (λ = 0) = (1/3)·((1, 0) + (2, 0) + (3, 0)) = (2, 0); weights 1/3, 1/3, (3/4)/3 = 1/4.
FIVE = torch.tensor([[1.0, 0.0], [2.0, 0.0], [4.0, 0.0], [0.0, 3.0], [0.0, -5.0]])


def test_worked_example_without_noise():
    dec = FLAME(lam=0.0)(FIVE)
    assert dec.accepted.tolist() == [True, True, True, False, False]
    assert dec.aggregate.tolist() == pytest.approx([2.0, 0.0])
    assert dec.weights.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 4, 0.0, 0.0])
    assert dec.state["bound"] == pytest.approx(3.0) and dec.state["min_cluster_size"] == 3
    assert dec.state["labels"][3] == -1 and dec.state["labels"][4] == -1
    assert set(dec.reasons) == {3, 4} and "outlier to HDBSCAN" in dec.reasons[3]


def test_noise_is_lambda_times_the_bound_from_the_context_generator():
    # σ = λ·S = 0.001 · 3 = 0.003; the noise is N(0, σ²) drawn from ctx.generator (float32)
    ctx = ServerContext.default(FIVE, generator=torch.Generator().manual_seed(7))
    dec = FLAME()(FIVE, ctx)
    z = torch.randn(2, generator=torch.Generator().manual_seed(7))
    assert dec.state["sigma"] == pytest.approx(0.003)
    assert dec.aggregate.tolist() == pytest.approx([2.0 + 0.003 * float(z[0]), 0.003 * float(z[1])], abs=1e-6)


def test_noise_standard_deviation_over_many_coordinates():
    # 6 rows: 4 copies of one direction with norms 1..4, 2 opposite. S = median(1, 2, 3, 4, 5, 6) = 3.5
    g = torch.Generator().manual_seed(0)
    base = torch.randn(20000, generator=g)
    base = base / base.norm()
    x = torch.stack([base * k for k in (1.0, 2.0, 3.0, 4.0)] + [-base * 5.0, -base * 6.0])
    dec = FLAME(lam=0.01)(x)
    # admitted: the four aligned rows, clipped to 3.5 -> (1 + 2 + 3 + 3.5)/4 = 2.375 along base
    assert dec.accepted.tolist() == [True] * 4 + [False] * 2
    resid = dec.aggregate.double() - 2.375 * base.double()
    assert float(resid.std()) == pytest.approx(0.01 * 3.5, rel=0.03)


def test_model_space_cosines_match_materialised_models():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 9, generator=g, dtype=torch.float64)
    glob = torch.randn(9, generator=g, dtype=torch.float64)
    ctx = ServerContext.default(x, global_params=glob)
    via = cosine_distances(FLAME(space="models")._gram(x, ctx))
    w = x + glob
    cos = (w @ w.T) / (w.norm(dim=1)[:, None] * w.norm(dim=1)[None, :])
    expected = 1.0 - cos
    expected.fill_diagonal_(0.0)
    assert torch.allclose(via, expected, atol=1e-12)
    with pytest.raises(InvalidParameter, match="ctx.global_params is needed"):
        FLAME(space="models")(x.float())


def test_cosine_distance_of_zero_rows():
    # a zero row: distance 1 to a non-zero row (cosine 0), 0 to another zero row
    x = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    assert cosine_distances(x @ x.T).tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]


def test_nonfinite_rejected_and_huge_rows_finite():
    x = torch.cat([FIVE, torch.tensor([[math.inf, 0.0]])])
    dec = FLAME(lam=0.0)(x)
    assert dec.reasons[5] == "non-finite update"
    # the five finite rows are FLAME's n: the same decision as above
    assert dec.accepted.tolist() == [True, True, True, False, False, False]
    assert dec.aggregate.tolist() == pytest.approx([2.0, 0.0])
    big = torch.full((5, 4), 3.0e38)
    big[0, 0] = 2.9e38
    out = FLAME(lam=1.0)(big)  # σ = S ≈ 6e38: saturates instead of overflowing
    assert bool(torch.isfinite(out.aggregate).all())


def test_single_update_and_parameters():
    one = FLAME(lam=0.0)(torch.tensor([[1.0, 2.0]]))
    assert one.accepted.tolist() == [True] and one.aggregate.tolist() == [1.0, 2.0]
    with pytest.raises(InvalidParameter, match=r"FLAME.lam = -0.1: must be a finite number ≥ 0"):
        FLAME(lam=-0.1)
    with pytest.raises(InvalidParameter, match=r"FLAME.space = 'weights'"):
        FLAME(space="weights")
    with pytest.raises(InvalidParameter, match=r"FLAME.min_cluster_size = 1"):
        FLAME(min_cluster_size=1)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 14), d=st.integers(1, 8), dup=st.booleans(), seed=st.integers(0, 2**16))
def test_the_admitted_cluster_is_always_a_majority(n, d, dup, seed):
    # min cluster size ⌊n/2⌋ + 1 > n/2: the only cluster is the root, and HDBSCAN labels the
    # points still in it when it dissolves into parts smaller than that size -> at least that many
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    if dup:
        x[: n // 2] = x[0].clone()
    dec = FLAME(lam=0.0)(x)
    assert int(dec.accepted.sum()) >= n // 2 + 1


def test_float64_rows_near_overflow_decide_like_their_rescaled_copies():
    # cosines ignore scale and the clipping scales with the rows: the worked example × 2¹⁰²⁰
    # (entries up to 5·2¹⁰²⁰ ≈ 5.6e307, whose Gram products overflow float64)
    big = FIVE.double() * 2.0**1020
    dec = FLAME(lam=0.0)(big)
    assert dec.accepted.tolist() == [True, True, True, False, False]
    assert (dec.aggregate / 2.0**1020).tolist() == pytest.approx([2.0, 0.0])
    assert FLAME(lam=0.0, space="models")(big, ServerContext.default(big, global_params=big[0].clone())).n_accepted >= 3
