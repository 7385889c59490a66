"""Aggregator-aware attacks (agr_tailored, alie_opt, ipm_opt): the defense is the oracle.

Expected values are derived by hand in the comments, and the ByzFL attacks are checked
against the worked examples printed in ByzFL's own documentation.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import redteam
from redteam.errors import InvalidParameter
from redteam.pipeline import Pipeline
from redteam.types import AttackContext

from attacks.tailored import DamageOracle, byzfl_line_search, released_search


def ctx_for(honest, f=1, defense=None, d=None, **kw) -> AttackContext:
    honest = torch.as_tensor(honest, dtype=torch.float32)
    h, dd = honest.shape
    n = h + f
    return AttackContext(
        round=0, n_clients=n, malicious=tuple(range(h, n)), own_updates=torch.zeros(f, dd),
        visible_updates=honest, global_params=torch.zeros(dd), generator=torch.Generator().manual_seed(0),
        defense=defense, **kw,
    )


# -- the two searches --------------------------------------------------------------------

def test_released_search_compares_with_the_previous_probe():
    # L(γ) = −(γ − 3)², γ₀ = step = 10, L_prev = −1:
    #   10: −49 < −1 → γ = 10 − 5 = 5 (step 5)        5: −4 > −49 → succ 5, γ = 5 + 2.5 = 7.5
    #   7.5: −20.25 < −4 → γ = 7.5 − 1.25 = 6.25      6.25: −10.56 > −20.25 → succ 6.25 (worse than 5!)
    #   γ = 6.25 + 0.625 = 6.875 …  — the released heuristic, not a best-so-far search
    tried = []

    def loss(g):
        tried.append(g)
        return -((g - 3.0) ** 2)

    g = released_search(loss, 10.0, 1e-5)
    assert tried[:6] == [10.0, 5.0, 7.5, 6.25, 6.875, 6.5625]
    assert 6.0 < g < 7.0


def test_byzfl_line_search_budget_and_directions():
    # increasing L: every probe improves, so all evals − 1 = 19 probes are expansions:
    # τ = 10 + 20 + 40 + … = 10·(2¹⁹ − 1)
    assert byzfl_line_search(lambda t: t, 20, 0.0, 10.0, 0.8) == 10.0 * (2**19 - 1)
    # L = −(τ − 25)²: 0 → 10 (better, δ = 20) → 30 (better, δ = 40) → 70 (worse: δ = 32, stop);
    # contraction probes 30 + 32·0.8^k, all worse than 30 (it never looks left of the best)
    calls = []

    def peak(t):
        calls.append(t)
        return -((t - 25.0) ** 2)

    assert byzfl_line_search(peak, 20, 0.0, 10.0, 0.8) == 30.0
    assert len(calls) == 20 and calls[:5] == [0.0, 10.0, 30.0, 70.0, 62.0]


# -- ByzFL's documented examples -------------------------------------------------------------

BYZFL_X = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]


def byzfl_pipeline():
    # ByzFL's example: pre_agg_list = [NNM(f=1), Clipping()] (static clipping, c = 2), TrMean(f=1)
    return Pipeline((redteam.defense("nnm", f=1), redteam.defense("clip", bound=2.0),
                     redteam.defense("trimmed_mean", b=1)))


def test_ipm_opt_reproduces_byzfl_documented_example():
    # ByzFL's docstring: Optimal_InnerProductManipulation(TrMean(f=1), [NNM(f=1), Clipping()], f=1)
    # on these rows gives −τ·μ = (−2.748779, −3.435974, −4.1231685), μ = (4, 5, 6), so
    # τ = 0.687194767 = 10·0.8¹²: the first probe (10) is worse than τ = 0, and the contraction
    # probes 8, 6.4, … 10·0.8ᵏ until one improves.
    out = redteam.attack("ipm_opt").craft_updates(ctx_for(BYZFL_X, defense=byzfl_pipeline()))
    assert torch.allclose(out, torch.tensor([[-2.748779, -3.435974, -4.1231685]]), atol=1e-5)
    assert torch.allclose(out, -10 * 0.8**12 * torch.tensor([[4.0, 5.0, 6.0]]), atol=1e-5)


def test_alie_opt_reproduces_byzfl_documented_example():
    # ByzFL's docstring: Optimal_ALittleIsEnough(...) on the same rows gives μ + τσ =
    # (12.919851, 13.919851, 14.919851); σ (ddof = 1) = 3 per coordinate. ByzFL adds τσ to the
    # vectors it is given, so fed our rows as they are this is sign = +1 (on delta rows that
    # ByzFL would see as gradients, −1, the default).
    out = redteam.attack("alie_opt", sign=1).craft_updates(ctx_for(BYZFL_X, defense=byzfl_pipeline()))
    assert torch.allclose(out, torch.tensor([[12.919851, 13.919851, 14.919851]]), atol=1e-4)
    neg = redteam.attack("alie_opt").craft_updates(ctx_for(BYZFL_X, defense=byzfl_pipeline()))
    # the default direction is μ − τσ: each coordinate moves by the same amount below μ
    shift = torch.tensor([4.0, 5.0, 6.0]) - neg[0]
    assert bool((shift > 0).all()) and torch.allclose(shift, shift[0].expand(3))


def test_ipm_opt_against_the_mean_uses_its_whole_budget():
    # no defense → the oracle is the mean. Honest 1-D (1, 2, 3), μ = 2, one attacker sending
    # −2τ: the mean is (6 − 2τ)/4 and its distance from μ is (2τ + 2)/4, increasing in τ, so
    # every probe improves: τ = 10·(2¹⁹ − 1) (test_byzfl_line_search_budget_and_directions).
    out = redteam.attack("ipm_opt").craft_updates(ctx_for([[1.0], [2.0], [3.0]]))
    assert out.item() == pytest.approx(-2 * 10.0 * (2**19 - 1))


# -- AGR-tailored -------------------------------------------------------------------------------

def test_agr_tailored_trimmed_mean_worked_example():
    # honest 1-D (1, 2, 3), f = 1, trimmed mean b = 1 over n = 4; unit_vec p = μ/|μ| = 1, so the
    # crafted value is x = 2 − γ. For 0 ≤ γ < 1, sorted (1, x, 2, 3) → TM = (x + 2)/2 and
    # L = γ/2; for γ ≥ 1, sorted (x, 1, 2, 3) → TM = 1.5 and L = 0.5 (flat).
    # Released search: L(10) = 0.5 > −1 → succ 10, then 15, 12.5, 11.25, … all tie at 0.5
    # (not > the previous probe) and step down towards 10: γ_succ = 10, x = −8.
    tm = redteam.defense("trimmed_mean", b=1)
    ctx = ctx_for([[1.0], [2.0], [3.0]], defense=tm)
    atk = redteam.attack("agr_tailored")
    g, mu, p = atk.gamma(ctx)
    assert g == 10.0 and mu.item() == 2.0 and p.item() == 1.0
    assert atk.craft_updates(ctx).item() == -8.0
    # grid search: γ ∈ {1.25, 2.5, …, 20} all give L = 0.5; the first maximiser is taken
    gg, _, _ = redteam.attack("agr_tailored", search="grid").gamma(ctx)
    assert gg == 1.25
    # the crafted row moves the defended aggregate by the maximal 0.5 (from 2 to 1.5)
    rows = torch.tensor([[1.0], [2.0], [3.0], [-8.0]])
    assert tm(rows).aggregate.item() == 1.5


def test_agr_tailored_std_sign_follows_the_released_code():
    # honest (1, 1), (2, 3), (3, 2): μ = (2, 2), σ = (1, 1) (test_attacks_optimized's issue
    # example); with std_sign = +1 the row is μ + γσ = (2 + γ)(1, 1) — above μ on both axes.
    ctx = ctx_for([[1.0, 1.0], [2.0, 3.0], [3.0, 2.0]], defense=redteam.defense("median"))
    out = redteam.attack("agr_tailored", dev_type="std").craft_updates(ctx)
    assert bool((out > 2.0).all()) and out[0, 0] == out[0, 1]
    down = redteam.attack("agr_tailored", dev_type="std", std_sign=-1).craft_updates(ctx)
    assert bool((down < 2.0).all())


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.integers(2, 6), b=st.integers(0, 2))
def test_batched_oracle_equals_one_call_per_candidate(seed, k, b):
    # coordinate-wise rules see the k probes side by side in one call; the result must be the
    # same as k separate calls
    g = torch.Generator().manual_seed(seed)
    honest = torch.randn(6, 3, generator=g)
    cands = torch.randn(k, 3, generator=g)
    for defense in (redteam.defense("trimmed_mean", b=b), redteam.defense("median")):
        oracle = DamageOracle(ctx_for(honest, f=2, defense=defense))
        batched = oracle.damage(cands)
        assert oracle.calls == 1
        single = torch.stack([oracle.damage(cands[j:j + 1])[0] for j in range(k)])
        assert torch.allclose(batched, single, atol=1e-6)


def test_batched_oracle_splits_large_batches(monkeypatch):
    # with room for 2 probes per call (n·d = 8·3 = 24 values, limit 48), 5 probes take 3 calls
    import attacks.tailored as t

    monkeypatch.setattr(t, "BATCH_ELEMENTS", 48)
    g = torch.Generator().manual_seed(3)
    honest, cands = torch.randn(6, 3, generator=g), torch.randn(5, 3, generator=g)
    oracle = DamageOracle(ctx_for(honest, f=2, defense=redteam.defense("median")))
    batched = oracle.damage(cands)
    assert oracle.calls == 3
    single = torch.stack([oracle.damage(cands[j:j + 1])[0] for j in range(5)])
    assert torch.allclose(batched, single, atol=1e-6)


@pytest.mark.parametrize("defense", ["geometric_median", "centered_clipping", "median"])
def test_accept_everyone_rules_are_moved(defense):
    # rules that accept every row give an acceptance search no signal; the damage search still
    # moves their aggregate away from μ, at least as far as sending μ itself (γ = 0) does
    g = torch.Generator().manual_seed(1)
    honest = torch.randn(8, 5, generator=g) * 0.1 + 1.0
    ctx = ctx_for(honest, f=3, defense=redteam.defense(defense))
    oracle = DamageOracle(ctx)
    mu = honest.double().mean(dim=0)
    at_mu = float(oracle.damage(mu[None, :])[0])
    for name in ("agr_tailored", "alie_opt", "ipm_opt"):
        row = redteam.attack(name).craft_updates(ctx)
        assert row.shape == (3, 5) and bool(torch.isfinite(row).all())
        assert float(oracle.damage(row[:1])[0]) >= at_mu - 1e-9


def test_parameter_errors():
    with pytest.raises(InvalidParameter, match=r"OptimalIPM\.ratio = 0\.5"):
        redteam.attack("ipm_opt", ratio=0.5)
    with pytest.raises(InvalidParameter, match=r"OptimalALIE\.sign = 0"):
        redteam.attack("alie_opt", sign=0)
    with pytest.raises(InvalidParameter, match=r"AGRTailored\.evals = 0"):
        redteam.attack("agr_tailored", evals=0)
    with pytest.raises(InvalidParameter, match=r"AGRTailored\.gamma_init = -1"):
        redteam.attack("agr_tailored", gamma_init=-1)
    with pytest.raises(InvalidParameter, match=r"no honest updates"):
        redteam.attack("ipm_opt").craft_updates(ctx_for(torch.zeros(0, 2)))
