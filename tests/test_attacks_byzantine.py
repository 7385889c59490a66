"""Worked examples and parameter errors: gaussian, nonfinite, alie, ipm, mimic, free_rider, sybil.

Every expected value below is derived by hand in the comment next to it.
"""

from __future__ import annotations

import math

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.types import AttackContext

from attacks.alie import ALIE, alie_z


def make_ctx(honest, own, *, n=None, seed=0, **kw) -> AttackContext:
    honest = torch.as_tensor(honest, dtype=torch.float32)
    own = torch.as_tensor(own, dtype=torch.float32)
    f = own.shape[0]
    n = n if n is not None else honest.shape[0] + f
    return AttackContext(
        round=kw.pop("round", 0), n_clients=n, malicious=tuple(range(n - f, n)),
        own_updates=own, visible_updates=honest, global_params=torch.zeros(own.shape[1]),
        generator=torch.Generator().manual_seed(seed), **kw,
    )


# -- ALIE ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "n, f, paper, impl",
    [
        # s = ⌊25/2 + 1⌋ − 5 = 8: Φ⁻¹(17/25 = 0.68) ≈ 0.468, Φ⁻¹(12/20 = 0.6) ≈ 0.253
        (25, 5, 0.468, 0.253),
        # s = 26 − 12 = 14: Φ⁻¹(36/50 = 0.72) ≈ 0.583, Φ⁻¹(24/38) ≈ 0.336
        (50, 12, 0.583, 0.336),
        # s = 51 − 20 = 31: Φ⁻¹(0.69) ≈ 0.496, Φ⁻¹(49/80) ≈ 0.286
        (100, 20, 0.496, 0.286),
    ],
)
def test_alie_z_both_forms(n, f, paper, impl):
    assert alie_z(n, f, "paper") == pytest.approx(paper, abs=1e-3)
    assert alie_z(n, f, "implementation") == pytest.approx(impl, abs=1e-3)
    assert redteam.attack("alie").z_value(n, f) == pytest.approx(paper, abs=1e-3)
    assert redteam.attack("alie", z="implementation").z_value(n, f) == pytest.approx(impl, abs=1e-3)


def test_alie_worked_example_explicit_z():
    # honest columns (1, 3, 5) and (0, 2, 4): μ = (3, 2), σ(ddof=1) = (2, 2)
    ctx = make_ctx([[1, 0], [3, 2], [5, 4]], [[9, 9], [9, 9]])
    out = redteam.attack("alie", z=1.5).craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[6.0, 5.0], [6.0, 5.0]]))  # μ + 1.5σ
    out = redteam.attack("alie", z=1.5, sign=-1).craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[0.0, -1.0], [0.0, -1.0]]))  # μ − 1.5σ
    # ddof = 0: σ = √(8/3) ≈ 1.63299, μ + 1.5σ = 3 + 2.44949
    out = redteam.attack("alie", z=1.5, ddof=0).craft_updates(ctx)
    assert out[0, 0].item() == pytest.approx(3 + 1.5 * math.sqrt(8 / 3), rel=1e-6)


def test_alie_derived_z_from_context():
    # n = 5, f = 2: s = ⌊3.5⌋ − 2 = 1, paper z = Φ⁻¹(4/5) ≈ 0.841621; μ = 3, σ = 2
    ctx = make_ctx([[1.0], [3.0], [5.0]], [[0.0], [0.0]])
    out = redteam.attack("alie").craft_updates(ctx)
    assert out[0, 0].item() == pytest.approx(3 + 0.841621 * 2, abs=1e-5)


def test_alie_own_knowledge_uses_only_own_rows():
    # own rows (0, 4): μ = 2, σ = 2√2; z = 1 → 2 + 2√2
    ctx = make_ctx([[100.0], [200.0], [300.0]], [[0.0], [4.0]])
    atk = redteam.attack("alie", z=1.0, knowledge="own")
    assert atk.omniscient is False and redteam.attack("alie").omniscient is True
    assert atk.craft_updates(ctx)[1, 0].item() == pytest.approx(2 + 2 * math.sqrt(2), rel=1e-6)


def test_alie_errors():
    with pytest.raises(InvalidParameter, match=r"ALIE\.z = 'papr': must be a number, 'paper' or 'implementation'"):
        ALIE(z="papr")
    with pytest.raises(InvalidParameter, match=r"parameter 'z' = 'papr'"):
        redteam.attack("alie", z="papr")
    with pytest.raises(InvalidParameter, match=r"sign = 2"):
        redteam.attack("alie", sign=2)
    with pytest.raises(InvalidParameter, match=r"ddof = -1"):
        redteam.attack("alie", ddof=-1)
    # n = 5, f = 3: s = ⌊3.5⌋ − 3 = 0 supporters: the attackers already hold a majority
    ctx = make_ctx([[1.0], [2.0]], [[0.0], [0.0], [0.0]])
    with pytest.raises(InvalidParameter, match=r"ALIE\.z = 'paper'.*f ≤ ⌊n/2⌋"):
        redteam.attack("alie").craft_updates(ctx)
    # one visible row cannot give a ddof = 1 standard deviation
    with pytest.raises(InvalidParameter, match=r"ddof = 1.*got 1"):
        redteam.attack("alie", z=1.0, knowledge="own").craft_updates(make_ctx([[1.0], [2.0]], [[0.0]]))


# -- IPM -------------------------------------------------------------------------------

def test_ipm_worked_example():
    # mean of (1, 2) and (3, 4) is (2, 3); −0.5 · (2, 3) = (−1, −1.5)
    ctx = make_ctx([[1, 2], [3, 4]], [[0, 0], [7, 7], [1, 1]])
    out = redteam.attack("ipm", epsilon=0.5).craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[-1.0, -1.5]] * 3))
    # own knowledge: mean of own rows (0,0), (7,7), (1,1) = (8/3, 8/3); × −0.5
    out = redteam.attack("ipm", epsilon=0.5, knowledge="own").craft_updates(ctx)
    assert torch.allclose(out, torch.full((3, 2), -4.0 / 3.0))


@pytest.mark.parametrize("eps", [0, -1.0, float("inf")])
def test_ipm_bad_epsilon(eps):
    with pytest.raises(InvalidParameter, match=r"IPM\.epsilon = .*must be a finite number > 0"):
        redteam.attack("ipm", epsilon=eps)


# -- Gaussian and non-finite -------------------------------------------------------------

def test_gaussian_degenerate_and_statistics():
    ctx = make_ctx([[0.0, 0.0]], [[1.0, 2.0], [3.0, 4.0]])
    # σ = 0: every coordinate is exactly the mean
    assert torch.equal(redteam.attack("gaussian", mean=3.0, std=0.0).craft_updates(ctx), torch.full((2, 2), 3.0))
    out = redteam.attack("gaussian", mean=3.0, std=0.0, center="own").craft_updates(ctx)
    assert torch.equal(out, torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    # σ = 200 (the default): a 2 × 20000 sample has std within 3 %
    big = make_ctx(torch.zeros(1, 20000), torch.zeros(2, 20000))
    sample = redteam.attack("gaussian").craft_updates(big)
    assert sample.std().item() == pytest.approx(200.0, rel=0.03)
    assert abs(sample.mean().item()) < 5.0


def test_gaussian_bad_std():
    with pytest.raises(InvalidParameter, match=r"Gaussian\.std = -1\.0: must be a finite number ≥ 0"):
        redteam.attack("gaussian", std=-1.0)


def test_nonfinite_counts_and_base():
    own = torch.arange(20.0).reshape(2, 10)
    ctx = make_ctx(torch.zeros(1, 10), own)
    out = redteam.attack("nonfinite", fraction=0.5).craft_updates(ctx)
    nan = torch.isnan(out)
    assert nan.sum(dim=1).tolist() == [5, 5]  # ⌈0.5 · 10⌉ = 5 per row
    assert torch.equal(out[~nan], own[~nan])  # the rest is the own update
    # ⌈0.01 · 10⌉ = 1 coordinate, +Inf, on a zero base
    out = redteam.attack("nonfinite", value="inf", fraction=0.01, base="zero").craft_updates(ctx)
    assert (out == math.inf).sum(dim=1).tolist() == [1, 1]
    assert (out[torch.isfinite(out)] == 0).all()
    out = redteam.attack("nonfinite", value="-inf").craft_updates(ctx)
    assert (out == -math.inf).all()


@pytest.mark.parametrize("frac", [0, -0.1, 1.5])
def test_nonfinite_bad_fraction(frac):
    with pytest.raises(InvalidParameter, match=r"NonFinite\.fraction = .*must be in \(0, 1\]"):
        redteam.attack("nonfinite", fraction=frac)


def test_nonfinite_bad_value():
    with pytest.raises(InvalidParameter, match=r"must be one of 'nan', 'inf', '-inf'"):
        redteam.attack("nonfinite", value="zero")


# -- mimic, free rider, sybil -------------------------------------------------------------

def test_mimic_explicit_and_auto_target():
    honest = [[0.0, 0.0], [1.0, 0.0], [-5.0, 0.0]]
    ctx = make_ctx(honest, [[9.0, 9.0], [9.0, 9.0]])
    assert torch.equal(redteam.attack("mimic", target=1).craft_updates(ctx), torch.tensor([[1.0, 0.0]] * 2))
    # centred along the only varying axis: 4/3, 7/3, −11/3 → row 2 is the extreme one
    assert torch.equal(redteam.attack("mimic").craft_updates(ctx), torch.tensor([[-5.0, 0.0]] * 2))
    with pytest.raises(InvalidParameter, match=r"Mimic\.target = 3: must be < 3"):
        redteam.attack("mimic", target=3).craft_updates(ctx)
    with pytest.raises(InvalidParameter, match=r"Mimic\.target = -1"):
        redteam.attack("mimic", target=-1)


def _stateful_ctx(honest, own, ids, state, **kw):
    """An AttackContext with the engine's attack memory (``attack_state``) and visible ids."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(AttackContext)}
    cls = AttackContext
    if "attack_state" not in names:  # engines before the attack-memory fields: a test shim

        @dataclasses.dataclass(frozen=True)
        class WithState(AttackContext):
            attack_state: dict = dataclasses.field(default_factory=dict)
            visible_clients: tuple = ()

        cls = WithState
    honest = torch.as_tensor(honest, dtype=torch.float32)
    own = torch.as_tensor(own, dtype=torch.float32)
    return cls(round=kw.pop("round", 0), n_clients=5, malicious=(3, 4), own_updates=own,
               visible_updates=honest, global_params=torch.zeros(own.shape[1]),
               generator=torch.Generator().manual_seed(0), attack_state=state,
               visible_clients=tuple(ids), **kw)


def test_mimic_keeps_its_warmup_victim_by_client_id():
    own = [[9.0, 9.0], [9.0, 9.0]]
    # round 0 (warm-up): rows of clients 0, 1, 2 = (0,0), (1,0), (−5,0); centred x-coords
    # 4/3, 7/3, −11/3 → client 2 is the farthest along the top direction z = (−1, 0)
    state: dict = {}
    atk = redteam.attack("mimic")
    out0 = atk.craft_updates(_stateful_ctx([[0, 0], [1, 0], [-5, 0]], own, (0, 1, 2), state))
    assert torch.equal(out0, torch.tensor([[-5.0, 0.0]] * 2)) and state["mimic_victim"] == 2
    # round 1: clients 0, 1, 2 now send (10,0), (0,0), (3,0); re-picking would take client 0
    # (centred 17/3, −13/3, −4/3), but the victim is fixed after the 1-round warm-up: client 2
    later = [[10, 0], [0, 0], [3, 0]]
    out1 = atk.craft_updates(_stateful_ctx(later, own, (0, 1, 2), state, round=1))
    assert torch.equal(out1, torch.tensor([[3.0, 0.0]] * 2))
    # rows are matched by client id, not position: client 2 is the first visible row here
    out2 = atk.craft_updates(_stateful_ctx([[7, 7], [0, 0]], own, (2, 0), state, round=2))
    assert torch.equal(out2, torch.tensor([[7.0, 7.0]] * 2)) and state["mimic_victim"] == 2
    # warmup = 2: round 1 is still warm-up. z_1 (sign fixed by the farthest row, client 0)
    # is (1, 0); aligned with z̄ = (−1, 0) it flips to (−1, 0), so z̄ stays (−1, 0) and
    # i* = argmax −(17/3, −13/3, −4/3) = client 1, whose (0, 0) is copied from then on
    state2: dict = {}
    atk2 = redteam.attack("mimic", warmup=2)
    atk2.craft_updates(_stateful_ctx([[0, 0], [1, 0], [-5, 0]], own, (0, 1, 2), state2))
    out = atk2.craft_updates(_stateful_ctx(later, own, (0, 1, 2), state2, round=1))
    assert torch.equal(out, torch.zeros(2, 2)) and state2["mimic_victim"] == 1
    out = atk2.craft_updates(_stateful_ctx([[4, 4], [5, 5], [6, 6]], own, (0, 1, 2), state2, round=2))
    assert torch.equal(out, torch.tensor([[5.0, 5.0]] * 2))
    with pytest.raises(InvalidParameter, match=r"Mimic\.warmup = 0"):
        redteam.attack("mimic", warmup=0)


def test_free_rider_modes():
    prev = torch.tensor([0.5, -0.5])
    ctx = make_ctx([[1.0, 1.0]], [[3.0, 3.0], [4.0, 4.0]], previous_update=prev, round=3)
    assert torch.equal(redteam.attack("free_rider").craft_updates(ctx), torch.zeros(2, 2))
    assert torch.equal(redteam.attack("free_rider", mode="stale").craft_updates(ctx), prev.expand(2, 2))
    # round 0 has no previous global update: a stale rider sends zeros
    ctx0 = make_ctx([[1.0, 1.0]], [[3.0, 3.0]])
    assert torch.equal(redteam.attack("free_rider", mode="stale").craft_updates(ctx0), torch.zeros(1, 2))
    # disguise: σ_t = 2 · (3 + 1)^(−1) = 0.5
    big = make_ctx(torch.zeros(1, 20000), torch.zeros(2, 20000), round=3)
    out = redteam.attack("free_rider", noise_std=2.0, noise_decay=1.0).craft_updates(big)
    assert out.std().item() == pytest.approx(0.5, rel=0.03)
    with pytest.raises(InvalidParameter, match=r"FreeRider\.noise_std = -1\.0"):
        redteam.attack("free_rider", noise_std=-1.0)


def test_sybil_one_update_many_identities():
    ctx = make_ctx([[0.0, 0.0]], [[1.0, 2.0], [3.0, 6.0]])
    assert torch.equal(redteam.attack("sybil").craft_updates(ctx), torch.tensor([[2.0, 4.0]] * 2))
    assert torch.equal(redteam.attack("sybil", source="first").craft_updates(ctx), torch.tensor([[1.0, 2.0]] * 2))
    jittered = redteam.attack("sybil", jitter=0.1).craft_updates(ctx)
    assert not torch.equal(jittered[0], jittered[1])
    with pytest.raises(InvalidParameter, match=r"Sybil\.jitter = -0\.1"):
        redteam.attack("sybil", jitter=-0.1)


def test_mimic_direction_of_rows_near_the_float64_limit():
    # Honest rows s·(0, 0), s·(1, 0), s·(3, 0): μ = s·(4/3, 0), centred s·(−4/3, 0), s·(−1/3, 0),
    # s·(5/3, 0); the top direction is ±(1, 0), its sign set so that the farthest row
    # (row 2, 5/3) projects positively, so z = (1, 0) and the victim is row 2 — for s = 1
    # and for s = 10³⁰⁰, where the Gram (~10⁶⁰⁰) overflowed and eigh raised LinAlgError.
    from attacks.simple import mimic_target, top_direction

    base = torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    for s in (1.0, 1e300):
        assert torch.allclose(top_direction(base * s), torch.tensor([1.0, 0.0], dtype=torch.float64))
        assert mimic_target(base * s) == 2
