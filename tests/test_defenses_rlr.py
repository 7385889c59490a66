"""Robust learning rate (Ozdayi et al., AAAI 2021): sign votes, flipped coordinates."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from defenses.rlr import RLR, sign_votes
from redteam.errors import InvalidParameter
from redteam.types import ServerContext

# Four clients, three coordinates.
#   column 0: signs + + + +  -> Σ sgn = 4;  plain mean (1 + 2 + 1 + 3)/4 = 1.75
#   column 1: signs − + − +  -> Σ sgn = 0;  mean (−1 + 1 − 2 + 1)/4 = −0.25
#   column 2: signs + − 0 +  -> Σ sgn = 1;  mean (2 − 1 + 0 + 1)/4 = 0.5
X = torch.tensor([[1.0, -1.0, 2.0], [2.0, 1.0, -1.0], [1.0, -2.0, 0.0], [3.0, 1.0, 1.0]])


def test_sign_votes_by_hand():
    assert sign_votes(X).tolist() == [4, 0, 1]


def test_theta_three_flips_weak_coordinates():
    # θ = 3: |4| ≥ 3 keeps +η; |0| and |1| < 3 flip: (1.75, +0.25, −0.5)
    dec = RLR(theta=3)(X)
    assert dec.aggregate.tolist() == pytest.approx([1.75, 0.25, -0.5])
    assert dec.accepted.all() and dec.reasons == {} and dec.state == {"theta": 3, "n": 4, "theta_above_n": False,
                                                                    "flipped": 2}


def test_theta_one_and_default():
    # θ = 1: only column 1 (Σ sgn = 0) flips
    assert RLR(theta=1)(X).aggregate.tolist() == pytest.approx([1.75, 0.25, 0.5])
    # default θ = ⌈n/2⌉ = 2 for n = 4: columns 1 and 2 flip
    dec = RLR()(X)
    assert dec.state["theta"] == 2 and dec.aggregate.tolist() == pytest.approx([1.75, 0.25, -0.5])


def test_sample_weighted_mean_unweighted_votes():
    # weights (1, 1, 1, 5), Σ = 8: means (1 + 2 + 1 + 15)/8 = 19/8, (−1 + 1 − 2 + 5)/8 = 3/8,
    # (2 − 1 + 0 + 5)/8 = 3/4; votes are still one per client: columns 1 and 2 flip at θ = 2
    ctx = ServerContext.default(X, weights=torch.tensor([1.0, 1.0, 1.0, 5.0]))
    assert RLR(theta=2)(X, ctx).aggregate.tolist() == pytest.approx([19 / 8, -3 / 8, -0.75])
    assert RLR(theta=2, weighted=False)(X, ctx).aggregate.tolist() == pytest.approx([1.75, 0.25, -0.5])


def test_nonfinite_rows_neither_vote_nor_average():
    x = torch.cat([X, torch.tensor([[math.nan, 5.0, 5.0]])])
    dec = RLR(theta=3)(x)
    assert dec.accepted.tolist() == [True] * 4 + [False] and dec.reasons == {4: "non-finite update"}
    assert dec.aggregate.tolist() == pytest.approx([1.75, 0.25, -0.5])


def test_theta_above_the_round_flips_every_coordinate():
    # θ = 5 > n = 4 (a round thinned by churn): |Σ sgn| ≤ 4 < 5 on every column, so the paper's
    # rule gives −η everywhere: the aggregate is −mean = (−1.75, +0.25, −0.5), all 3 flipped
    dec = RLR(theta=5)(X)
    assert dec.aggregate.tolist() == pytest.approx([-1.75, 0.25, -0.5])
    assert dec.state == {"theta": 5, "n": 4, "theta_above_n": True, "flipped": 3}


def test_theta_bound_is_named():
    # the bound that can be known: θ above the most updates any round can have, refused at setup
    with pytest.raises(InvalidParameter, match=r"RLR.theta = 5: must be ≤ the 4 updates a round can have at most"):
        RLR(theta=5).check_capacity(4)
    RLR(theta=4).check_capacity(4)
    RLR().check_capacity(1)  # θ = ⌈n/2⌉ follows the round
    with pytest.raises(InvalidParameter, match=r"RLR.theta = 0: must be an integer ≥ 1"):
        RLR(theta=0)


def test_huge_rows_do_not_overflow():
    x = torch.full((5, 3), 3.0e38)
    ctx = ServerContext.default(x, weights=torch.full((5,), 100.0))
    assert bool(torch.isfinite(RLR()(x, ctx).aggregate).all())


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), d=st.integers(1, 30), theta=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_magnitudes_are_the_mean_and_signs_follow_the_vote(n, d, theta, seed):
    # θ may exceed n (a thinned round): the same formula, every coordinate flipped
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    dec = RLR(theta=theta, weighted=False)(x)
    mean = x.mean(dim=0)
    votes = torch.sign(x).sum(dim=0).abs()
    expected = torch.where(votes >= theta, mean, -mean)
    assert torch.allclose(dec.aggregate, expected, atol=1e-12)
    assert dec.state["flipped"] == int((votes < theta).sum())
    assert dec.state["theta_above_n"] == (theta > n)
