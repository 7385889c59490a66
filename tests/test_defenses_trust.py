"""FLTrust and FoolsGold: worked examples from the papers' formulas, state, errors."""

from __future__ import annotations

import math

import pytest
import torch

from defenses.fltrust import FLTrust
from defenses.foolsgold import FoolsGold, foolsgold_weights
from defenses.sanity import Sanity
from redteam.errors import InvalidParameter
from redteam.pipeline import Pipeline
from redteam.types import ServerContext

F64 = torch.float64


def test_fltrust_worked_example():
    # g₀ = (1, 0), ‖g₀‖ = 1.
    #   (2, 0):  cos 1   → TS 1,   normalised (1, 0)
    #   (0, 3):  cos 0   → TS 0
    #   (3, 4):  cos 0.6 → TS 0.6, normalised (0.6, 0.8)
    #   (−1, 0): cos −1  → TS 0
    # aggregate = (1·(1,0) + 0.6·(0.6,0.8)) / 1.6 = (1.36, 0.48)/1.6 = (0.85, 0.3)
    x = torch.tensor([[2.0, 0.0], [0.0, 3.0], [3.0, 4.0], [-1.0, 0.0]], dtype=F64)
    ctx = ServerContext.default(x, root_update=lambda: torch.tensor([1.0, 0.0], dtype=F64))
    dec = FLTrust()(x, ctx)
    assert dec.aggregate.tolist() == pytest.approx([0.85, 0.3])
    assert dec.accepted.tolist() == [True, False, True, False]
    assert dec.state["trust"] == pytest.approx([1.0, 0.0, 0.6, 0.0])
    # effective weights TSᵢ·‖g₀‖/‖xᵢ‖/ΣTS = (1/2, 0, 0.6/5, 0)/1.6
    assert dec.weights.tolist() == pytest.approx([0.5 / 1.6, 0.0, 0.12 / 1.6, 0.0])
    assert "cosine -1" in dec.reasons[3]
    # without magnitude normalisation: (1·(2,0) + 0.6·(3,4))/1.6 = (3.8, 2.4)/1.6
    assert FLTrust(normalize=False)(x, ctx).aggregate.tolist() == pytest.approx([3.8 / 1.6, 2.4 / 1.6])


def test_fltrust_root_norm_sets_the_scale_and_all_distrusted_gives_zero():
    x = torch.tensor([[10.0, 0.0], [0.0, -1.0]])
    ctx = ServerContext.default(x, root_update=lambda: torch.tensor([0.5, 0.0]))
    assert FLTrust()(x, ctx).aggregate.tolist() == pytest.approx([0.5, 0.0])
    ctx = ServerContext.default(x, root_update=lambda: torch.tensor([-1.0, 1.0]))
    dec = FLTrust()(x, ctx)  # cosines −1/√2 and −1/√2 → nobody trusted
    assert dec.aggregate.tolist() == [0.0, 0.0] and not dec.accepted.any()


def test_fltrust_without_root_data_is_a_clear_error():
    with pytest.raises(InvalidParameter, match="FLTrust needs the server's root update"):
        FLTrust()(torch.ones(3, 2))


def test_fltrust_in_a_pipeline_gets_the_root_update():
    x = torch.tensor([[1.0, 0.0], [float("nan"), 0.0], [0.0, 1.0]])
    ctx = ServerContext.default(x, root_update=lambda: torch.tensor([2.0, 0.0]))
    dec = Pipeline((Sanity(), FLTrust()))(x, ctx)
    assert dec.accepted.tolist() == [True, False, False]
    assert dec.aggregate.tolist() == pytest.approx([2.0, 0.0])


def test_foolsgold_identical_sybils_get_zero_weight():
    # (1,0) twice and (0,1): cs₁₂ = 1, others 0 → v = (1, 1, 0);
    # pardoning for client 3 multiplies by 0/1; α = 1 − max cs = (0, 0, 1) → /max → (0, 0, 1)
    # → 1 becomes 0.99 → logit ln(99) + 0.5 ≈ 5.1 → clipped to 1; ln 0 → −inf → 0.
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    dec = FoolsGold()(x)
    assert dec.weights.tolist() == [0.0, 0.0, 1.0]
    assert dec.accepted.tolist() == [False, False, True]
    assert dec.aggregate.tolist() == [0.0, 1.0]
    assert "too similar" in dec.reasons[0]


def test_foolsgold_partial_similarity_by_hand():
    # x₁ = (1,0,0), x₂ = (1/2, √3/2, 0) (cos 1/2), x₃ = (0,0,1) orthogonal to both.
    # v = (1/2, 1/2, 0); no pardoning changes anything (cs₃ⱼ = 0).
    # α = (1/2, 1/2, 1) → /1 → (1/2, 1/2, 0.99) → logit: ln(1) + 0.5 = 0.5, 0.5, ≥1 → (0.5, 0.5, 1)
    x = torch.tensor([[1.0, 0.0, 0.0], [0.5, math.sqrt(3) / 2, 0.0], [0.0, 0.0, 1.0]], dtype=F64)
    dec = FoolsGold()(x)
    assert dec.state["alpha"] == pytest.approx([0.5, 0.5, 1.0])
    # normalised: (0.5·x₁ + 0.5·x₂ + x₃)/2 = (0.375, √3/8, 0.5)
    assert dec.aggregate.tolist() == pytest.approx([0.375, math.sqrt(3) / 8, 0.5])
    # κ = 2 doubles the logit: 2·0.5 = 1 → every weight 1 → the plain mean
    assert FoolsGold(kappa=2.0)(x).aggregate.tolist() == pytest.approx(x.mean(0).tolist())
    # the paper's literal sum Σ αᵢxᵢ
    assert FoolsGold(normalize=False)(x).aggregate.tolist() == pytest.approx([0.75, math.sqrt(3) / 4, 1.0])


def test_foolsgold_pardoning_by_hand():
    # x₁ = (1,0), x₂ = (0.6, 0.8), x₃ = (0,1): cs₁₂ = 0.6, cs₂₃ = 0.8, cs₁₃ = 0 → v = (0.6, 0.8, 0.8)
    # client 1 is pardoned: cs₁₂ ← 0.6·0.6/0.8 = 0.45 → α = (0.55, 0.2, 0.2)
    # /0.55 → (1, 4/11, 4/11) → logit(4/11) + 0.5 = ln(4/7) + 0.5 < 0 → (1, 0, 0)
    x = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], dtype=F64)
    assert foolsgold_weights(x).tolist() == pytest.approx([1.0, 0.0, 0.0])


def test_foolsgold_history_is_explicit_state():
    r1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    ctx1 = ServerContext.default(r1, client_ids=(10, 20, 30))
    d1 = FoolsGold()(r1, ctx1)
    assert d1.state["ids"] == [10, 20, 30] and torch.equal(d1.state["history"], r1)
    # round 2: clients 30 and 10 only, in another order
    r2 = torch.tensor([[2.0, 0.0], [0.0, 3.0]])
    ctx2 = ServerContext(n_clients=2, client_ids=(30, 10), state=d1.state)
    d2 = FoolsGold()(r2, ctx2)
    # history: 20 kept as is, then 30 → (1,1)+(2,0) = (3,1), 10 → (1,0)+(0,3) = (1,3)
    assert d2.state["ids"] == [20, 30, 10]
    assert d2.state["history"].tolist() == [[0.0, 1.0], [3.0, 1.0], [1.0, 3.0]]
    # the weights of round 2 come from the histories (3,1) and (1,3): cos = 6/10 = 0.6
    # v = (0.6, 0.6) → α = 0.4 each → /0.4 → 1 → 0.99 → weight 1 each → mean of r2
    assert d2.aggregate.tolist() == pytest.approx([1.0, 1.5])
    assert torch.equal(r1, torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))  # inputs untouched


def test_foolsgold_errors_and_nonfinite():
    with pytest.raises(InvalidParameter, match="FoolsGold.kappa = 0"):
        FoolsGold(kappa=0.0)
    x = torch.ones(2, 2)
    with pytest.raises(InvalidParameter, match="client_ids"):
        FoolsGold()(x, ServerContext(n_clients=2, client_ids=(1, 1)))
    y = torch.tensor([[1.0, 0.0], [float("nan"), 0.0], [0.0, 1.0]])
    dec = FoolsGold()(y)
    assert dec.accepted.tolist() == [True, False, True]
    assert dec.state["history"][1].tolist() == [0.0, 0.0]
    assert torch.isfinite(dec.aggregate).all()
