"""agr_tailored's selection search against Krum, Multi-Krum and Bulyan (issue 19, item 2).

Shejwalkar & Houmansadr's released notebooks (vrt1shjwlkr/NDSS21-Model-Poisoning,
cifar10/release-fedsgd-alexnet-mkrum.ipynb and ...-bulyan.ipynb, the cells "Code for our
AGR-tailored attack on Multi-krum / Bulyan") attack the Krum family with ``our_attack_mkrum``:
f identical copies of model_re − λ·deviation placed before the benign gradients, λ = 3,
λ_fail = λ, λ_succ = 0; while |λ_succ − λ| > 1e-5: if their iterative ``multi_krum`` picks
all f copies (``np.sum(krum_candidate < n_attackers) == n_attackers``) then λ_succ = λ,
λ += λ_fail/2, else λ −= λ_fail/2; λ_fail /= 2; send model_re − λ_succ·deviation.

Reference values come from hand derivations (1-D, in the comments) and from
:func:`release_attack`, a NumPy transcription of that loop and of the notebooks'
``multi_krum`` written from the release, not from attacks/tailored.py. Its one knob,
``self_in_score``: the released ``multi_krum`` sums the n − f − 2 smallest entries of a
sorted distance row that includes the row's zero distance to itself (n − f − 3 others);
our Krum (the paper's) sums n − f − 2 *other* rows, so the comparisons with our defenses
use ``self_in_score=False``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import redteam
from redteam.types import AttackContext

from attacks.tailored import DamageOracle, SelectionOracle


def ctx_for(honest, f, defense, mal_first=True) -> AttackContext:
    honest = torch.as_tensor(np.asarray(honest), dtype=torch.float32)
    h, d = honest.shape
    n = h + f
    mal = tuple(range(f)) if mal_first else tuple(range(h, n))  # the release puts them first
    return AttackContext(
        round=0, n_clients=n, malicious=mal, own_updates=torch.zeros(f, d), visible_updates=honest,
        global_params=torch.zeros(d), generator=torch.Generator().manual_seed(0), defense=defense,
    )


# -- the release, transcribed ----------------------------------------------------------------

def krum_scores_np(rows: np.ndarray, f: int, neighbours: int, self_in_score: bool) -> np.ndarray:
    dist = np.sort(((rows[:, None, :] - rows[None, :, :]) ** 2).sum(-1), axis=1)
    return dist[:, :neighbours].sum(1) if self_in_score else dist[:, 1:neighbours + 1].sum(1)


def lowest(scores: np.ndarray, rows: np.ndarray) -> int:
    """argmin of ``scores``; an exact tie between different rows goes to the smaller Σⱼ xⱼ, then
    Σⱼ j·xⱼ (j from 1), then the lower position — our Krum's documented tie rule (defenses/krum.py,
    "Ties"), where the release's ``torch.argsort(scores)[0]`` takes the lower position. It matters in
    Bulyan's last steps: with one neighbour, two mutually nearest rows always tie."""
    tied = np.flatnonzero(scores == scores.min())
    j = np.arange(1, rows.shape[1] + 1)
    keys = [(rows[i].sum(), (rows[i] * j).sum(), i) for i in tied]
    return min(keys)[2]


def release_multi_krum(rows: np.ndarray, f: int, picks: int | None = None, self_in_score: bool = True,
                       clamp: bool = False) -> list[int]:
    """The notebooks' ``multi_krum(all_updates, n_attackers, multi_k=True)``: pick the lowest
    score, remove it, re-score the rest, while more than 2f + 2 rows remain (or ``picks``
    times, Bulyan's θ; ``clamp``: at least one neighbour, as our Bulyan's last steps)."""
    remaining = list(range(rows.shape[0]))
    chosen: list[int] = []
    while (len(remaining) > 2 * f + 2) if picks is None else len(chosen) < picks:
        k = len(remaining) - 2 - f
        if clamp:
            k = min(max(k, 1), len(remaining) - 1)
        scores = krum_scores_np(rows[remaining], f, k, self_in_score)
        chosen.append(remaining.pop(lowest(scores, rows[remaining])))
    return chosen


def release_attack(honest32: np.ndarray, f: int, selects_all, dev_type: str = "unit_vec",
                   lamda: float = 3.0, tol: float = 1e-5) -> tuple[float, np.ndarray]:
    """``our_attack_mkrum``: (λ_succ, the crafted row). ``selects_all(rows, f)`` is the test
    on the matrix with the f copies first. Rows are float32 as sent, distances in float64."""
    x = honest32.astype(np.float64)
    mu = x.mean(0)
    dev = {"unit_vec": lambda: mu / np.linalg.norm(mu), "sign": lambda: np.sign(mu),
           "std": lambda: x.std(0, ddof=1)}[dev_type]()
    lam_fail, succ = lamda, 0.0
    while abs(succ - lamda) > tol:
        mal = (mu - lamda * dev).astype(np.float32).astype(np.float64)
        if selects_all(np.concatenate([np.repeat(mal[None], f, 0), x]), f):
            succ = lamda
            lamda = lamda + lam_fail / 2
        else:
            lamda = lamda - lam_fail / 2
        lam_fail = lam_fail / 2
    return succ, mu - succ * dev


def iterative_mk_test(self_in_score: bool):
    return lambda rows, f: sum(i < f for i in release_multi_krum(rows, f, self_in_score=self_in_score)) == f


def krum_test(server_f):  # the paper's Krum objective: Krum's one choice is a malicious copy
    def test(rows, f):
        n = rows.shape[0]
        ff = (n - 3) // 2 if server_f is None else server_f
        return lowest(krum_scores_np(rows, ff, n - ff - 2, False), rows) < f
    return test


def multi_krum_scores_test(server_f):  # Multi-Krum (scores): the m = n − f lowest hold all copies
    def test(rows, f):
        n = rows.shape[0]
        ff = (n - 3) // 2 if server_f is None else server_f
        m = n - ff
        scores = krum_scores_np(rows, ff, n - ff - 2, False)
        j = np.arange(1, rows.shape[1] + 1)
        best = np.lexsort((np.arange(n), rows @ j, rows.sum(1), scores))[:m]  # the tie rule of lowest()
        return int((best < f).sum()) == min(f, m)
    return test


def bulyan_test(server_f):  # Bulyan's selection: θ = n − 2f iterative Krum picks hold all copies
    def test(rows, f):
        n = rows.shape[0]
        ff = (n - 3) // 4 if server_f is None else server_f
        return sum(i < f for i in release_multi_krum(rows, ff, picks=n - 2 * ff, self_in_score=False,
                                                     clamp=True)) == f
    return test


def random_case(seed: int, need: int = 2):
    """(honest float32 (h, d), f, dev_type), n = h + f ≥ ``need``·f + 3 (2: Krum / Multi-Krum's
    2f + 2 < n; 4: Bulyan's n ≥ 4f + 3)."""
    rng = np.random.default_rng(seed)
    f = int(rng.integers(1, 4))
    n = int(rng.integers(need * f + 3, need * f + 9))
    d = int(rng.integers(2, 8))
    honest = (rng.normal(size=(n - f, d)) * 0.3 + rng.normal(size=d)).astype(np.float32)
    return honest, f, ("unit_vec", "sign", "std")[seed % 3]


# -- hand-derived 1-D cases --------------------------------------------------------------------

S = 1.2  # honest s·(1, 2, 3, 4, 5): μ = 3s, unit_vec p = +1, the crafted value x = 3s − γ
HONEST_1D = [[S * k] for k in (1, 2, 3, 4, 5)]


def test_krum_hand_example():
    # n = 7: 5 honest, f = 2 copies of x, Krum(f = 2) scores n − f − 2 = 3 nearest others.
    # 0 < γ < s (2s < x < 3s): score(x) = 0 (the other copy) + γ² + (s − γ)²;
    #   score(3s) = 2γ² + s² (x, x, 2s or 4s) > score(x) ⇔ 2sγ > 0;
    #   score(2s) = 2(s − γ)² + s² > score(x) ⇔ γ < s.  Similarly for s < γ < 2s (x between s
    #   and 2s, a = x − s): score(x) = a² + (s − a)² beats score(s) = 2a² + s², score(2s) = 2(s − a)² + s².
    # γ > 2s (x < s, b = s − x > 0): score(x) = b² + (s + b)² > score(s) = 2b² + s² ⇔ 2sb > 0: fails.
    # So Krum picks a copy iff 0 < γ < 2s = 2.4 (γ = s: x = 2s, a tie with an honest copy).
    krum = redteam.defense("krum", f=2)
    ctx = ctx_for(HONEST_1D, 2, krum)
    oracle = SelectionOracle(ctx)
    for g in np.linspace(0.05, 4.0, 80):
        if abs(g - S) > 1e-3 and abs(g - 2 * S) > 1e-3:
            assert oracle.passes(torch.tensor([3 * S - g], dtype=torch.float64)) == (g < 2 * S), g
    # the release's halving search from λ = 3: 3 ✗, 1.5 ✓, 2.25 ✓, 2.625 ✗, 2.4375 ✗, 2.34375 ✓ …
    # converging to 2.4 from below, within the tolerance 1e-5
    atk = redteam.attack("agr_tailored")
    g, mu, p = atk.gamma(ctx)
    assert 2 * S - 3e-5 < g < 2 * S and mu.item() == pytest.approx(3 * S) and p.item() == 1.0
    out = atk.craft_updates(ctx)
    assert out.shape == (2, 1) and out[0, 0] == out[1, 0]
    assert out[0, 0].item() == pytest.approx(S, abs=3e-5)  # x = 3s − γ → s from above
    assert krum(torch.cat([out, torch.tensor(HONEST_1D, dtype=torch.float32)])).state["selected"][0] < 2


def test_multi_krum_hand_example_where_the_damage_search_does_nothing():
    # n = 6: 5 honest, f = 1 copy x, Multi-Krum(f = 1): 3 nearest others, m = n − f = 5 kept,
    # so exactly one row is dropped, the worst score. For γ ≥ 2s (x ≤ s):
    #   score(x) = (γ − 2s)² + (γ − s)² + γ² = 3γ² − 6sγ + 5s² (its nearest: s, 2s, 3s);
    #   score(5s) = s² + 4s² + 9s² = 14s² ((2s + γ)² ≥ 16s² is never among its 3 nearest);
    #   score(s) = s² + (γ − 2s)² + 4s² ≤ 14s² for γ ≤ 5s; the others are lower.
    # x is dropped iff 3γ² − 6sγ + 5s² > 14s² ⇔ (γ − 3s)(γ + s) > 0 ⇔ γ > 3s = 3.6.
    mk = redteam.defense("multi_krum", f=1)
    ctx = ctx_for(HONEST_1D, 1, mk)
    oracle = SelectionOracle(ctx)
    for g in np.linspace(0.05, 6.0, 120):
        if abs(g - 3 * S) > 1e-3:
            assert oracle.passes(torch.tensor([3 * S - g], dtype=torch.float64)) == (g < 3 * S), g
    g, _, _ = redteam.attack("agr_tailored").gamma(ctx)
    assert 3 * S - 3e-5 < g < 3 * S
    # selected (5s dropped): the aggregate is the mean of x ≈ 0 and s … 4s, 10s/5 = 2s; its distance
    # from μ = 3s is s = 1.2 (less γ's shortfall from 3s, divided by 5)
    dmg = DamageOracle(ctx)
    row = redteam.attack("agr_tailored").craft_updates(ctx)
    assert float(dmg.damage(row.double())[0]) == pytest.approx(S, abs=1e-4)
    # the damage search (what agr_tailored did for every rule before): L(10) > L_prev = −1 gives
    # γ_succ = 10; every later probe (15, 12.5, 11.25, …) is dropped too, so L ties, never beats the
    # previous probe, and γ steps down towards 10: γ = 10, x = 3.6 − 10 = −6.4, which Multi-Krum
    # drops; the 5 honest rows are kept and the aggregate is μ itself: damage 0.
    atk = redteam.attack("agr_tailored", objective="damage")
    gd, _, _ = atk.gamma(ctx)
    assert gd == 10.0
    rowd = atk.craft_updates(ctx)
    assert rowd.item() == pytest.approx(3 * S - 10)
    assert float(dmg.damage(rowd.double())[0]) == pytest.approx(0.0, abs=1e-6)
    assert oracle.selected(rowd[0]) == 0


def test_grid_selection_sends_the_largest_passing_grid_point():
    # Multi-Krum example above (passes iff γ < 3.6); grid (0, 2·3]: 0.375·k, k = 1 … 16:
    # 3.375 passes, 3.75 fails → γ = 3.375
    ctx = ctx_for(HONEST_1D, 1, redteam.defense("multi_krum", f=1))
    g, _, _ = redteam.attack("agr_tailored", search="grid").gamma(ctx)
    assert g == 3.375
    # nothing passes (released test with 2f + 2 ≥ n) → γ = 0, the row is μ
    ctx2 = ctx_for(HONEST_1D[:2], 1, redteam.defense("krum", f=0))
    for search in ("grid", "released"):
        atk = redteam.attack("agr_tailored", search=search, selection_test="released")
        assert atk.gamma(ctx2)[0] == 0.0
        assert atk.craft_updates(ctx2).item() == pytest.approx(1.5 * S)


# -- against the release's loop ----------------------------------------------------------------

@pytest.mark.parametrize("seed", range(12))
def test_matches_the_released_loop_with_iterative_multi_krum(seed):
    # MultiKrum(variant="iterative", f = attackers) is the released test itself (but for the
    # neighbour count, see the module docstring); selection_test="released" applies it whatever the
    # server's Krum-family rule. std_sign = −1: the release's literal model_re − λσ on these rows.
    # n ≥ 3f + 3, so the n − 2f − 2 picks have room for all f copies (with fewer, the released test
    # can never pass, while the defense test asks for as many copies as there are picks).
    honest, f, dev = random_case(seed, need=3)
    g_ref, row_ref = release_attack(honest, f, iterative_mk_test(self_in_score=False), dev)
    cases = [({}, redteam.defense("multi_krum", f=f, variant="iterative")),
             ({"selection_test": "released"}, redteam.defense("krum")),
             ({"selection_test": "released"}, redteam.defense("bulyan") if honest.shape[0] + f >= 4 * f + 3
              else redteam.defense("multi_krum"))]
    for extra, defense in cases:
        atk = redteam.attack("agr_tailored", dev_type=dev, std_sign=-1, **extra)
        for mal_first in (True, False):
            ctx = ctx_for(honest, f, defense, mal_first)
            g, _, _ = atk.gamma(ctx)
            assert g == g_ref, (extra, type(defense).__name__, mal_first)
            out = atk.craft_updates(ctx)
            assert torch.allclose(out.double(), torch.as_tensor(row_ref)[None].expand(f, -1), rtol=0, atol=1e-6)


def test_the_neighbour_count_changes_the_released_loop():
    # the release's score (self included: one neighbour fewer) gives another λ here; documented,
    # not reproduced (our Krum is the paper's)
    honest, f, dev = random_case(0)
    a, _ = release_attack(honest, f, iterative_mk_test(self_in_score=False), dev)
    b, _ = release_attack(honest, f, iterative_mk_test(self_in_score=True), dev)
    assert a != b


@pytest.mark.parametrize("seed", range(9))
@pytest.mark.parametrize("rule", ["krum", "multi_krum", "bulyan"])
def test_defense_test_matches_each_rules_own_selection(seed, rule):
    # the released loop with the paper's selection of each rule as the test, against our defenses
    need = 4 if rule == "bulyan" else 2
    honest, f, dev = random_case(100 + seed, need)
    server_f = None if seed % 2 else f
    kw = {} if server_f is None else {"f": server_f}
    test = {"krum": krum_test, "multi_krum": multi_krum_scores_test, "bulyan": bulyan_test}[rule](server_f)
    g_ref, row_ref = release_attack(honest, f, test, dev)
    atk = redteam.attack("agr_tailored", dev_type=dev, std_sign=-1)
    ctx = ctx_for(honest, f, redteam.defense(rule, **kw), mal_first=bool(seed % 3))
    g, _, _ = atk.gamma(ctx)
    assert g == g_ref
    assert torch.allclose(atk.craft_updates(ctx)[0].double(), torch.as_tensor(row_ref), rtol=0, atol=1e-6)


# -- dispatch, effect, parameters ----------------------------------------------------------------

@pytest.mark.parametrize("name,objective", [("krum", "selection"), ("multi_krum", "selection"),
                                            ("bulyan", "selection"), ("median", "damage"),
                                            ("trimmed_mean", "damage"), ("geometric_median", "damage")])
def test_auto_objective_follows_the_release(name, objective):
    atk = redteam.attack("agr_tailored")
    assert atk.objective_for(redteam.defense(name)) == objective
    assert atk.objective_for(None) == "damage"
    assert redteam.attack("agr_tailored", objective="damage").objective_for(redteam.defense("krum")) == "damage"
    assert redteam.attack("agr_tailored", objective="selection").objective_for(None) == "selection"


def test_selection_moves_multi_krum_where_the_damage_search_does_not():
    # 15 Gaussian rounds, 20 honest + 5 attackers, Multi-Krum(f = 5) keeping m = n − f = 20:
    # the damage search's row is dropped in every round (the aggregate is μ: damage 0, the
    # reviewer's measurement), the selection search's copies are all kept and move it
    zero = 0
    for seed in range(15):
        g = torch.Generator().manual_seed(seed)
        honest = torch.randn(20, 30, generator=g) * 0.1 + torch.randn(30, generator=g) * 0.05
        mk = redteam.defense("multi_krum", f=5)
        ctx = ctx_for(honest.numpy(), 5, mk)
        dmg, sel = DamageOracle(ctx), SelectionOracle(ctx)
        old = redteam.attack("agr_tailored", objective="damage").craft_updates(ctx)
        new = redteam.attack("agr_tailored").craft_updates(ctx)
        assert sel.selected(new[0]) == 5
        d_old, d_new = float(dmg.damage(old[:1].double())[0]), float(dmg.damage(new[:1].double())[0])
        zero += d_old < 1e-6
        assert d_new > d_old + 1e-3, seed
    assert zero == 15


def test_no_defense_and_other_rules_with_selection():
    # no defense (the mean) accepts every row: every probe passes, γ → 2·gamma_init
    honest = [[1.0, 2.0], [2.0, 1.0], [1.5, 1.5], [1.2, 1.9]]
    g, _, _ = redteam.attack("agr_tailored", objective="selection").gamma(ctx_for(honest, 1, None))
    assert 6.0 - 3e-5 < g < 6.0
    # outside the Krum family the test is "every malicious row accepted": static clipping accepts
    # every row, so γ runs to the same cap
    g_clip, _, _ = redteam.attack("agr_tailored", objective="selection").gamma(
        ctx_for(honest, 1, redteam.defense("clip", bound=1.0)))
    assert g_clip == pytest.approx(g)


def test_parameter_errors():
    from redteam.errors import InvalidParameter

    from attacks.tailored import AGRTailored

    with pytest.raises(InvalidParameter, match=r"'objective' = 'best'"):
        redteam.attack("agr_tailored", objective="best")
    with pytest.raises(InvalidParameter, match=r"AGRTailored\.objective = 'best'"):
        AGRTailored(objective="best")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match=r"AGRTailored\.selection_test = 'paper'"):
        AGRTailored(selection_test="paper")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match=r"AGRTailored\.gamma_init = 0"):
        redteam.attack("agr_tailored", gamma_init=0)
    # an explicit gamma_init applies to either objective: the hand Multi-Krum case from 20
    # (the FEMNIST notebooks' start) still converges to 3.6 from below
    ctx = ctx_for(HONEST_1D, 1, redteam.defense("multi_krum", f=1))
    g, _, _ = redteam.attack("agr_tailored", gamma_init=20.0).gamma(ctx)
    assert 3 * S - 3e-5 < g < 3 * S
