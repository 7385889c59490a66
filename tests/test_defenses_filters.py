"""Validation filters: cosine, sanity, z-score, loss check."""

from __future__ import annotations

import math

import pytest
import torch

from defenses.cosine import CosineFilter
from defenses.loss_check import LossCheck
from defenses.median import Median
from defenses.sanity import Sanity, ZScore, norm_zscores
from redteam.errors import InvalidParameter
from redteam.pipeline import Pipeline
from redteam.types import ServerContext

X4 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 1.0]])


def test_cosine_against_previous_update():
    # r = (1, 0): cosines 1, 0, −1, 1/√2
    ctx = ServerContext.default(X4, previous_update=torch.tensor([1.0, 0.0]))
    dec = CosineFilter(against="previous", threshold=0.0)(X4, ctx)
    assert dec.accepted.tolist() == [True, True, False, True]
    assert "cosine -1 to the previous reference < threshold 0" in dec.reasons[2]
    # the filter alone averages what it kept: ((1,0) + (0,1) + (1,1))/3
    assert dec.aggregate.tolist() == pytest.approx([2 / 3, 2 / 3])
    dec = CosineFilter(against="previous", threshold=0.5)(X4, ctx)
    assert dec.accepted.tolist() == [True, False, False, True]
    assert dec.state["cosine"] == pytest.approx([1.0, 0.0, -1.0, 1 / math.sqrt(2)])


def test_cosine_against_median():
    # coordinate median: column 0 sorted −1 0 1 1 → 0.5; column 1 sorted 0 0 1 1 → 0.5
    # r = (0.5, 0.5): cosines 1/√2, 1/√2, −1/√2, 1
    dec = CosineFilter(against="median", threshold=0.0)(X4)
    assert dec.state["cosine"] == pytest.approx([1 / math.sqrt(2), 1 / math.sqrt(2), -1 / math.sqrt(2), 1.0])
    assert dec.accepted.tolist() == [True, True, False, True]


def test_cosine_against_root_update_and_missing_root():
    ctx = ServerContext.default(X4, root_update=lambda: torch.tensor([0.0, 1.0]))
    dec = CosineFilter(against="root", threshold=0.1)(X4, ctx)
    # cosines to (0, 1): 0, 1, 0, 1/√2
    assert dec.accepted.tolist() == [False, True, False, True]
    with pytest.raises(InvalidParameter, match="root dataset"):
        CosineFilter(against="root")(X4)
    with pytest.raises(InvalidParameter, match="length 2"):
        CosineFilter(against="root")(X4, ServerContext.default(X4, root_update=lambda: torch.zeros(3)))


def test_cosine_round_zero_accepts_finite_and_rejects_nonfinite():
    x = torch.cat([X4, torch.tensor([[float("nan"), 0.0]])])
    dec = CosineFilter(against="previous")(x)
    assert dec.accepted.tolist() == [True, True, True, True, False]
    assert dec.state["reference"] is None and dec.reasons == {4: "non-finite update"}


def test_cosine_zero_update_has_cosine_zero():
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    ctx = ServerContext.default(x, previous_update=torch.tensor([1.0, 0.0]))
    assert CosineFilter(against="previous", threshold=0.0)(x, ctx).accepted.tolist() == [True, True]
    assert CosineFilter(against="previous", threshold=0.01)(x, ctx).accepted.tolist() == [False, True]


def test_cosine_bad_parameters():
    with pytest.raises(InvalidParameter, match="CosineFilter.threshold = 1.5"):
        CosineFilter(threshold=1.5)
    with pytest.raises(InvalidParameter, match="CosineFilter.against = 'mean'"):
        CosineFilter(against="mean")
    assert CosineFilter.reference and isinstance(CosineFilter.reference, str)


def test_sanity_rejects_nonfinite_size_and_large_entries():
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[1.0, 2.0], [nan, inf], [0.5, -9.0], [0.0, 0.0]])
    dec = Sanity()(x)
    assert dec.accepted.tolist() == [True, False, True, True]
    assert dec.reasons == {1: "non-finite update (2 NaN/Inf entries)"}
    dec = Sanity(max_abs=5.0)(x)
    assert dec.accepted.tolist() == [True, False, False, True]
    assert dec.reasons[2] == "max |Δ| = 9 > max_abs 5"
    ctx = ServerContext.default(x, global_params=torch.zeros(3))
    dec = Sanity()(x, ctx)
    assert not dec.accepted.any() and dec.reasons[0] == "update has 2 entries, the model has 3"
    assert Sanity()(torch.ones(2, 2, dtype=torch.int64)).accepted.tolist() == [False, False]
    with pytest.raises(InvalidParameter, match="Sanity.max_abs = 0"):
        Sanity(max_abs=0.0)


def test_norm_zscores_by_hand():
    norms = torch.tensor([1.0, 1.1, 0.9, 1.0, 10.0], dtype=torch.float64)
    # robust: median 1; |dev| 0 .1 .1 0 9 → sorted 0 0 .1 .1 9 → MAD .1 → scale .14826
    z = norm_zscores(norms, "robust")
    assert z.tolist() == pytest.approx([0.0, 0.1 / 0.14826, -0.1 / 0.14826, 0.0, 9 / 0.14826])
    # plain: mean 2.8; squared devs 3.24 2.89 3.61 3.24 51.84 → sum 64.82 → var 16.205 (ddof 1)
    z = norm_zscores(norms, "plain", ddof=1)
    assert z[4].item() == pytest.approx(7.2 / math.sqrt(16.205))  # ≈ 1.789: the outlier masks itself
    # zero scale: equal norms → 0, any other → ±inf
    assert norm_zscores(torch.tensor([2.0, 2.0, 2.0, 3.0]), "robust").tolist() == [0, 0, 0, math.inf]


def test_zscore_filter_robust_vs_plain():
    x = torch.tensor([[1.0], [1.1], [0.9], [1.0], [10.0]])
    robust = ZScore(threshold=3.0)(x)
    assert robust.accepted.tolist() == [True, True, True, True, False]
    assert "z-score 60.7 > 3" in robust.reasons[4]
    assert ZScore(threshold=3.0, statistic="plain")(x).accepted.all()
    # two-sided catches a near-zero update too
    y = torch.tensor([[1.0], [1.1], [0.9], [1.0], [0.0]])
    assert ZScore(threshold=3.0)(y).accepted.all()
    assert ZScore(threshold=3.0, side="both")(y).accepted.tolist() == [True, True, True, True, False]


def test_zscore_bad_parameters_and_nonfinite():
    with pytest.raises(InvalidParameter, match="ZScore.threshold = 0"):
        ZScore(threshold=0.0)
    with pytest.raises(InvalidParameter, match="ZScore.statistic = 'mad'"):
        ZScore(statistic="mad")
    x = torch.tensor([[1.0], [float("inf")], [1.0]])
    dec = ZScore()(x)
    assert dec.accepted.tolist() == [True, False, True]


def _quadratic_loss(target):
    # L(w + Δ) = ‖Δ − target‖² with w = 0
    calls = []

    def evaluate(deltas):
        calls.append(deltas.clone())
        return ((deltas - target) ** 2).sum(dim=1)

    return evaluate, calls


def test_loss_check_worked_example():
    target = torch.tensor([1.0, 1.0])
    evaluate, calls = _quadratic_loss(target)
    x = torch.tensor([[1.0, 1.0], [0.5, 0.5], [-1.0, 0.0], [2.0, 2.0], [float("nan"), 0.0]])
    ctx = ServerContext.default(x, evaluate_loss=evaluate)
    # L(w) = 2; candidates: 0, 0.5, 4 + 1 = 5, 2 (equal: kept), NaN row never evaluated
    dec = LossCheck()(x, ctx)
    assert dec.accepted.tolist() == [True, True, False, True, False]
    assert dec.reasons[2] == "loss 5 > current 2 + ε 0" and dec.reasons[4] == "non-finite update"
    assert len(calls) == 1 and calls[0].shape == (5, 2) and torch.isfinite(calls[0]).all()
    assert calls[0][0].tolist() == [0.0, 0.0]
    # ε = 3 lets the 5 through; batches of 2 give the same answer in 3 calls
    calls.clear()
    dec = LossCheck(epsilon=3.0, batch_size=2)(x, ctx)
    assert dec.accepted.tolist() == [True, True, True, True, False]
    assert [c.shape[0] for c in calls] == [2, 2, 1]


def test_loss_check_needs_server_data_and_sane_losses():
    x = torch.zeros(2, 2)
    with pytest.raises(InvalidParameter, match="held-out data"):
        LossCheck()(x)
    bad = ServerContext.default(x, evaluate_loss=lambda d: torch.zeros(1))
    with pytest.raises(InvalidParameter, match="one loss per candidate"):
        LossCheck()(x, bad)
    with pytest.raises(InvalidParameter, match="LossCheck.epsilon = -1"):
        LossCheck(epsilon=-1.0)
    with pytest.raises(InvalidParameter, match="LossCheck.batch_size = 0"):
        LossCheck(batch_size=0)


def test_filters_compose_in_a_pipeline_with_reasons():
    target = torch.tensor([1.0, 1.0])
    evaluate, _ = _quadratic_loss(target)
    x = torch.tensor([[1.0, 1.0], [float("nan"), 1.0], [0.9, 1.1], [-5.0, -5.0], [1.1, 0.9]])
    ctx = ServerContext.default(x, evaluate_loss=evaluate, root_update=lambda: target)
    pipe = Pipeline((Sanity(), CosineFilter(against="root", threshold=0.5), LossCheck(), Median()))
    dec = pipe(x, ctx)
    assert dec.accepted.tolist() == [True, False, True, False, True]
    assert dec.reasons[1].startswith("non-finite") and dec.reasons[3].startswith("cosine -1")
    assert dec.aggregate.tolist() == pytest.approx([1.0, 1.0])
