"""Worked examples for the optimised Byzantine attacks: min_max, min_sum, fang_trim, fang_krum.

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.types import AttackContext

from attacks.minmax import gamma_search


def make_ctx(honest, own, *, n=None, seed=0, **kw) -> AttackContext:
    honest = torch.as_tensor(honest, dtype=torch.float32)
    own = torch.as_tensor(own, dtype=torch.float32)
    f = own.shape[0]
    n = n if n is not None else honest.shape[0] + f
    return AttackContext(
        round=0, n_clients=n, malicious=tuple(range(n - f, n)), own_updates=own,
        visible_updates=honest, global_params=torch.zeros(own.shape[1]),
        generator=torch.Generator().manual_seed(seed), **kw,
    )


# -- the γ search ------------------------------------------------------------------------

def test_gamma_search_trace():
    # passes iff γ ≤ 2: tries 10 ✗, 5 ✗, 2.5 ✗, 1.25 ✓, 1.875 ✓, 2.1875 ✗, 2.03125 ✗, 1.953125 ✓ …
    tried = []

    def passes(g):
        tried.append(g)
        return g <= 2

    g = gamma_search(passes, 10.0, 1e-5)
    assert tried[:8] == [10, 5, 2.5, 1.25, 1.875, 2.1875, 2.03125, 1.953125]
    assert 2 - 1e-4 < g <= 2
    # nothing passes: γ halves towards 0 and the result is 0 (x_b = μ)
    assert gamma_search(lambda g: False, 10.0, 1e-5) == 0.0


# -- Min-Max / Min-Sum -----------------------------------------------------------------------

BENIGN_1D = [[0.0], [2.0], [4.0]]  # μ = 2, unit_vec p = 1, σ(ddof=1) = 2


def test_min_max_worked_example():
    # bound = max pairwise² = (4 − 0)² = 16; farthest benign from 2 − γ is 4: (γ + 2)² ≤ 16 → γ = 2
    ctx = make_ctx(BENIGN_1D, [[0.0], [0.0]])
    atk = redteam.attack("min_max")
    g, mu, p = atk.gamma(ctx.visible_updates)
    assert g == pytest.approx(2.0, abs=1e-4) and g <= 2.0
    out = atk.craft_updates(ctx)
    assert out.shape == (2, 1) and torch.allclose(out, torch.zeros(2, 1), atol=1e-4)
    # std: p = σ = 2, (2 − 2γ − 4)² ≤ 16 → γ = 1, x_b = 0 again
    assert redteam.attack("min_max", dev_type="std").gamma(ctx.visible_updates)[0] == pytest.approx(1.0, abs=1e-4)
    # sign: p = sign(2) = 1, as unit_vec in 1-D
    assert redteam.attack("min_max", dev_type="sign").gamma(ctx.visible_updates)[0] == pytest.approx(2.0, abs=1e-4)


def test_min_max_unit_vec_2d():
    # benign (0,0), (6,8): μ = (3,4), p = (0.6, 0.8); diameter² = 100;
    # farthest is (6,8) at distance 5 + γ ≤ 10 → γ = 5, x_b = (0, 0)
    ctx = make_ctx([[0.0, 0.0], [6.0, 8.0]], [[1.0, 1.0]])
    out = redteam.attack("min_max").craft_updates(ctx)
    assert torch.allclose(out, torch.zeros(1, 2), atol=1e-4)


def test_min_sum_worked_example():
    # benign scores Σ_j (x_i − x_j)²: 0 → 20, 2 → 8, 4 → 20; the candidate's sum is
    # (2 − γ)² + γ² + (2 + γ)² = 8 + 3γ².
    ctx = make_ctx(BENIGN_1D, [[0.0]])
    # released code: ≤ min = 8 → γ = 0, x_b = μ = 2
    assert torch.allclose(redteam.attack("min_sum").craft_updates(ctx), torch.tensor([[2.0]]))
    # paper text: ≤ max = 20 → 3γ² ≤ 12 → γ = 2, x_b = 0
    out = redteam.attack("min_sum", score_bound="max").craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[0.0]]), atol=1e-4)


def test_min_max_std_sign_issue_example():
    # Issue 8 §3's example. Honest deltas (1, 1), (2, 3), (3, 2): μ = (2, 2); σ with ddof = 1
    # (torch.std, as the released code): column (1, 2, 3) → Σ(x − 2)² = 2, /2 = 1; column
    # (1, 3, 2) likewise → σ = (1, 1). Benign squared distances: (1,1)–(2,3) = 1 + 4 = 5,
    # (1,1)–(3,2) = 5, (2,3)–(3,2) = 2 → bound max = 5.
    # std_sign = +1 (released μ_g − γσ_g carried to deltas): x = (2 + γ, 2 + γ);
    #   ‖x − (1,1)‖² = 2(1 + γ)², ‖x − (2,3)‖² = ‖x − (3,2)‖² = γ² + (γ − 1)², the first is the
    #   max for γ ≥ 0; 2(1 + γ)² ≤ 5 → γ* = √2.5 − 1 ≈ 0.58114, x ≈ (2.58114, 2.58114).
    ctx = make_ctx([[1.0, 1.0], [2.0, 3.0], [3.0, 2.0]], [[0.0, 0.0]])
    atk = redteam.attack("min_max", dev_type="std")
    g, _, _ = atk.gamma(ctx.visible_updates)
    assert math.sqrt(2.5) - 1 - 1e-4 < g <= math.sqrt(2.5) - 1
    out = atk.craft_updates(ctx)
    assert torch.allclose(out, torch.full((1, 2), 1 + math.sqrt(2.5)), atol=1e-4)
    assert torch.allclose(out, torch.tensor([[2.581, 2.581]]), atol=1e-3)
    # std_sign = −1 (μ − γσ literally on deltas): x = (2 − γ, 2 − γ); now (2,3) and (3,2)
    #   are the far ones: γ² + (1 + γ)² ≤ 5 → γ² + γ − 2 ≤ 0 → γ* = 1, x = (1, 1), a copy
    #   of the first honest row (‖x − (1,1)‖² = 2(1 − γ)² = 0 ≤ 5).
    neg = redteam.attack("min_max", dev_type="std", std_sign=-1).craft_updates(ctx)
    assert torch.allclose(neg, torch.tensor([[1.0, 1.0]]), atol=1e-4)
    # Min-Sum, released min bound: benign sums (1,1) → 5 + 5 = 10, (2,3) → 5 + 2 = 7,
    #   (3,2) → 7: bound 7. Candidate (2 + γ, 2 + γ): 2(1 + γ)² + 2(γ² + (γ − 1)²) = 6γ² + 4
    #   ≤ 7 → γ* = √0.5, x = 2 + √0.5 ≈ 2.7071 (the sum is symmetric in ±γ: −1 gives 2 − √0.5).
    ms = redteam.attack("min_sum", dev_type="std").craft_updates(ctx)
    assert torch.allclose(ms, torch.full((1, 2), 2 + math.sqrt(0.5)), atol=1e-4)
    ms_neg = redteam.attack("min_sum", dev_type="std", std_sign=-1).craft_updates(ctx)
    assert torch.allclose(ms_neg, torch.full((1, 2), 2 - math.sqrt(0.5)), atol=1e-4)
    # unit_vec flips with the space: p = μ/‖μ‖ = (1, 1)/√2, x = μ − γp moves towards (1,1) and
    #   beyond: x = (2 − t, 2 − t), t = γ/√2; far rows (2,3),(3,2): t² + (1 + t)² ≤ 5 → t = 1.
    uv = redteam.attack("min_max").craft_updates(ctx)
    assert torch.allclose(uv, torch.tensor([[1.0, 1.0]]), atol=1e-4)
    with pytest.raises(InvalidParameter, match=r"MinMax\.std_sign = 0"):
        redteam.attack("min_max", std_sign=0)


def test_min_max_errors():
    with pytest.raises(InvalidParameter, match=r"parameter 'dev_type' = 'gauss'"):
        redteam.attack("min_max", dev_type="gauss")
    from attacks.minmax import MinMax, MinSum

    with pytest.raises(InvalidParameter, match=r"MinMax\.dev_type = 'gauss'"):
        MinMax(dev_type="gauss")
    with pytest.raises(InvalidParameter, match=r"MinMax\.gamma_init = 0"):
        MinMax(gamma_init=0)
    with pytest.raises(InvalidParameter, match=r"MinSum\.tol = -1"):
        MinSum(tol=-1)
    with pytest.raises(InvalidParameter, match=r"MinSum\.score_bound = 'mean'"):
        MinSum(score_bound="mean")


# -- Fang trim ---------------------------------------------------------------------------------

# columns: c0 (1,3,2) mean 2 > 0, min 1 > 0      → push down into [1/2, 1]
#          c1 (−1,−2,−3) mean −2 < 0, max −1 ≤ 0 → push up into [−1, −1/2]
#          c2 (−2,4,4) mean 2 > 0, min −2 ≤ 0     → push down into [−4, −2]
#          c3 (1,−4,−3) mean −2 < 0, max 1 > 0    → push up into [1, 2]
TRIM = [[1.0, -1.0, -2.0, 1.0], [3.0, -2.0, 4.0, -4.0], [2.0, -3.0, 4.0, -3.0]]


def test_fang_trim_intervals_full_knowledge():
    low, high = redteam.attack("fang_trim").intervals(torch.tensor(TRIM))
    assert low.tolist() == [0.5, -1.0, -4.0, 1.0]
    assert high.tolist() == [1.0, -0.5, -2.0, 2.0]
    ctx = make_ctx(TRIM, torch.zeros(400, 4))
    out = redteam.attack("fang_trim").craft_updates(ctx)
    lo, hi = torch.tensor([0.5, -1.0, -4.0, 1.0]), torch.tensor([1.0, -0.5, -2.0, 2.0])
    assert bool(((out >= lo) & (out <= hi)).all())
    # 400 uniform draws per coordinate reach within 2 % of both ends of each interval
    span = hi - lo
    assert bool(((out.min(dim=0).values - lo) < 0.02 * span).all())
    assert bool(((hi - out.max(dim=0).values) < 0.02 * span).all())
    # b = 4 widens: c0 → [1/4, 1], c3 → [1, 4]
    low4, high4 = redteam.attack("fang_trim", b=4.0).intervals(torch.tensor(TRIM))
    assert low4[0].item() == 0.25 and high4[3].item() == 4.0


def test_fang_trim_model_space_differs_from_delta_space():
    # global model w_Re = (1, −1). c0 deltas (0.5, 1, 1.5): mean > 0 → push down.
    #   model space (paper): models (1.5, 2, 2.5), min 1.5 > 0 → [1.5/2, 1.5] = [0.75, 1.5],
    #   minus w_Re → deltas [−0.25, 0.5]; delta space: min 0.5 > 0 → [0.25, 0.5].
    # c1 deltas (−1, −2, −3): mean < 0 → push up. model (−2, −3, −4), max −2 ≤ 0 → [−2, −1],
    #   minus w_Re → [−1, 0]; delta space: max −1 ≤ 0 → [−1, −0.5].
    rows = torch.tensor([[0.5, -1.0], [1.0, -2.0], [1.5, -3.0]])
    g = torch.tensor([1.0, -1.0])
    low, high = redteam.attack("fang_trim").intervals(rows, g)
    assert low.tolist() == [-0.25, -1.0] and high.tolist() == [0.5, 0.0]
    dlow, dhigh = redteam.attack("fang_trim", space="delta").intervals(rows, g)
    assert dlow.tolist() == [0.25, -1.0] and dhigh.tolist() == [0.5, -0.5]
    ctx = dataclasses.replace(make_ctx(rows, torch.zeros(50, 2)), global_params=g)
    out = redteam.attack("fang_trim").craft_updates(ctx)
    assert bool(((out >= torch.tensor([-0.25, -1.0])) & (out <= torch.tensor([0.5, 0.0]))).all())
    assert float(out[:, 0].min()) < 0.25  # outside the delta-space interval: a different attack
    with pytest.raises(InvalidParameter, match=r"'space' = 'weights'"):
        redteam.attack("fang_trim", space="weights")


def test_fang_trim_partial_knowledge():
    # own rows (0, 0), (2, −4): μ = (1, −2), σ = (√2, 2√2); c0 down: [μ − 4σ, μ − 3σ], c1 up: [μ + 3σ, μ + 4σ]
    low, high = redteam.attack("fang_trim", knowledge="own").intervals(torch.tensor([[0.0, 0.0], [2.0, -4.0]]))
    r2 = math.sqrt(2)
    assert low.tolist() == pytest.approx([1 - 4 * r2, -2 + 6 * r2])
    assert high.tolist() == pytest.approx([1 - 3 * r2, -2 + 8 * r2])


def test_fang_trim_bad_b():
    with pytest.raises(InvalidParameter, match=r"FangTrim\.b = 1\.0: must be a finite number > 1"):
        redteam.attack("fang_trim", b=1.0)


# -- Fang Krum ---------------------------------------------------------------------------------

def test_fang_krum_worked_example():
    # benign t·(1,1,1,1), t ∈ {1,3,5,7}; n = 6, f = 2, d = 4 (√d = 2), Euclidean distance 2|Δt|.
    # λ₀: n − f − 2 = 2 nearest benign: best sum is 4 + 4 = 8 (t = 3 or 5), divided by
    # (n − 2f − 1)·√d = 2 → 4; plus max ‖x_i‖/√d = 14/2 = 7 → λ₀ = 11.
    # Krum (2 neighbours, squared, in units of 4Δt²): a crafted copy scores (1 + λ)²
    # (the other copy at 0 plus t = 1); the best benign scores 4 + 4 = 8. It wins iff
    # (1 + λ)² < 8: 11 ✗, 5.5 ✗, 2.75 ✗, 1.375 ✓ → crafted rows = −1.375·(1,1,1,1).
    benign = torch.tensor([1.0, 3.0, 5.0, 7.0])[:, None] * torch.ones(1, 4)
    atk = redteam.attack("fang_krum")
    assert atk.lambda0(benign, 6, 2) == pytest.approx(11.0)
    lam, won, _ = atk.search(benign, 6, 2)
    assert lam == 1.375 and won
    out = atk.craft_updates(make_ctx(benign, torch.zeros(2, 4)))
    assert torch.equal(out, torch.full((2, 4), -1.375))


def test_fang_krum_never_selected_goes_to_threshold():
    # identical benign rows (1,1,1,1): every benign Krum score is 0, so no crafted row ever
    # wins; λ₀ = 0 + 2/2 = 1 is halved to 2⁻¹⁷ ≈ 7.6e-6, the first value ≤ 1e-5.
    lam, won, _ = redteam.attack("fang_krum").search(torch.ones(4, 4), 5, 1)
    assert lam == 2.0 ** -17 and not won


def test_fang_krum_errors():
    with pytest.raises(InvalidParameter, match=r"FangKrum\.threshold = 0"):
        redteam.attack("fang_krum", threshold=0)
    # n = 4, f = 2: n − 2f − 1 = −1 < 1
    ctx = make_ctx([[1.0], [2.0]], [[0.0], [0.0]])
    with pytest.raises(InvalidParameter, match=r"FangKrum: f = 2 malicious of n = 4: λ₀ needs n − 2f − 1 ≥ 1"):
        redteam.attack("fang_krum").craft_updates(ctx)


def test_fang_krum_refuses_distances_that_overflow_instead_of_halving_forever():
    # Benign rows of size ~10³⁰⁰: their squared distances (~10⁶⁰⁰) overflow float64, so λ₀
    # is not finite; λ ← λ/2 never reaches the threshold and the search looped forever.
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1e300
    ctx = AttackContext(round=0, n_clients=6, malicious=(0,), malicious_rows=(0,), own_updates=x[:1],
                        visible_updates=x[1:], global_params=torch.zeros(3, dtype=torch.float64),
                        generator=torch.Generator().manual_seed(0), num_classes=10)
    with pytest.raises(InvalidParameter, match=r"FangKrum: λ₀ = .* is not finite"):
        redteam.attack("fang_krum").craft_updates(ctx)
