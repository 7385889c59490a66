"""SparseFed (Panda et al., AISTATS 2022): clipping, global top-k, error feedback."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from defenses.sparsefed import SparseFed, top_k_split
from redteam.errors import InvalidParameter
from redteam.types import ServerContext

# Three updates, L = 2.5: (3, 4, 0) has norm 5 -> scaled by 1/2 to (1.5, 2, 0); (0, 0, 1) and
# (1, 0, 0) have norm 1 and stay. Mean g = ((1.5 + 1)/3, 2/3, 1/3) = (5/6, 2/3, 1/3).
X = torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)


def test_round_one_and_two_by_hand():
    rule = SparseFed(bound=2.5, k=1)
    # round 1: e = g = (5/6, 2/3, 1/3); top-1 is coordinate 0 -> Δ = (5/6, 0, 0), e = (0, 2/3, 1/3)
    one = rule(X)
    assert one.aggregate.tolist() == pytest.approx([5 / 6, 0.0, 0.0])
    assert one.state["error"].tolist() == pytest.approx([0.0, 2 / 3, 1 / 3])
    assert one.state["clipped"] == 1 and one.weights.tolist() == pytest.approx([1 / 6, 1 / 3, 1 / 3])
    # round 2, same updates: e = (5/6, 4/3, 2/3); top-1 is coordinate 1 -> Δ = (0, 4/3, 0)
    two = rule(X, ServerContext.default(X, state=one.state))
    assert two.aggregate.tolist() == pytest.approx([0.0, 4 / 3, 0.0])
    assert two.state["error"].tolist() == pytest.approx([5 / 6, 0.0, 2 / 3])


def test_sum_and_k_fraction():
    # reduce = "sum": g = 3 × the mean = (2.5, 2, 1); k = ⌈0.5·3⌉ = 2 -> Δ = (2.5, 2, 0)
    dec = SparseFed(bound=2.5, k_fraction=0.5, reduce="sum")(X)
    assert dec.state["k"] == 2
    assert dec.aggregate.tolist() == pytest.approx([2.5, 2.0, 0.0])
    assert dec.state["error"].tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_top_k_split_keeps_the_largest_magnitudes():
    delta, rest = top_k_split(torch.tensor([0.5, -3.0, 2.0, 0.25]), 2)
    assert delta.tolist() == [0.0, -3.0, 2.0, 0.0] and rest.tolist() == [0.5, 0.0, 0.0, 0.25]


def test_nonfinite_rejected_huge_rows_clipped():
    x = torch.cat([X, torch.tensor([[math.nan, 0.0, 0.0]], dtype=torch.float64)])
    dec = SparseFed(bound=2.5, k=1)(x)
    assert dec.reasons == {3: "non-finite update"} and dec.accepted.tolist() == [True, True, True, False]
    # n = 4 rows in the mean (the rejected one contributes 0): (2.5/4, 0, 0)
    assert dec.aggregate.tolist() == pytest.approx([2.5 / 4, 0.0, 0.0])
    big = torch.full((4, 5), 3.0e38)
    assert bool(torch.isfinite(SparseFed()(big).aggregate).all())


def test_parameters_and_state_are_checked():
    with pytest.raises(InvalidParameter, match=r"SparseFed.bound = 0: must be a finite number > 0"):
        SparseFed(bound=0)
    with pytest.raises(InvalidParameter, match=r"SparseFed.k_fraction = 1.5"):
        SparseFed(k_fraction=1.5)
    with pytest.raises(InvalidParameter, match=r"SparseFed.reduce = 'max'"):
        SparseFed(reduce="max")
    with pytest.raises(InvalidParameter, match=r"ctx.state\['error'\] has shape \(2,\), expected \(3,\)"):
        SparseFed()(X, ServerContext.default(X, state={"error": torch.zeros(2)}))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), d=st.integers(1, 20), k=st.integers(1, 20), rounds=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_error_feedback_loses_nothing(n, d, k, rounds, seed):
    # Σ applied Δ_r + final error = Σ round aggregates g_r (every clipped coordinate is applied eventually)
    g = torch.Generator().manual_seed(seed)
    rule = SparseFed(bound=1.0, k=k)
    state: dict = {}
    applied = torch.zeros(d, dtype=torch.float64)
    total = torch.zeros(d, dtype=torch.float64)
    for _ in range(rounds):
        x = torch.randn(n, d, generator=g, dtype=torch.float64) * 2
        scale = (1.0 / x.norm(dim=1)).clamp(max=1.0)
        total += (x * scale[:, None]).mean(dim=0)
        dec = rule(x, ServerContext.default(x, state=state))
        assert int((dec.aggregate != 0).sum()) <= min(k, d)
        applied += dec.aggregate
        state = dec.state
    assert torch.allclose(applied + state["error"], total, atol=1e-10)


def test_float64_rows_near_overflow_are_clipped_like_any_other():
    # (3, 4, 0)·2¹⁰²⁰ has norm 5·2¹⁰²⁰ (its square overflows float64): clipped to 2.5 -> (1.5, 2, 0)
    big = X.clone()
    big[0] *= 2.0**1020
    dec = SparseFed(bound=2.5, k=3)(big)
    assert dec.aggregate.tolist() == pytest.approx([5 / 6, 2 / 3, 1 / 3])
