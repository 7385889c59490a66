"""The envelope attacks: norm_hug, norm_evasion, cosine_evasion and adaptive.

They must sit exactly on (or just inside) the validation rules they target.
"""

from __future__ import annotations

import math

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.types import AttackContext

from attacks.envelope import Adaptive, CosineEvasion, NormEvasion, cone_direction


def make_ctx(honest, own, *, seed=0, dtype=torch.float32, **kw) -> AttackContext:
    honest = torch.as_tensor(honest, dtype=dtype)
    own = torch.as_tensor(own, dtype=dtype)
    f = own.shape[0]
    n = honest.shape[0] + f
    return AttackContext(
        round=0, n_clients=n, malicious=tuple(range(n - f, n)), own_updates=own,
        visible_updates=honest, global_params=torch.zeros(own.shape[1]),
        generator=torch.Generator().manual_seed(seed), **kw,
    )


def cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.to(torch.float64), b.to(torch.float64)
    return (a @ b) / (torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b))


# -- norm_hug ---------------------------------------------------------------------------------

def test_norm_hug_worked_example():
    # ĝ = (3, 4), ‖ĝ‖ = 5, M = 2: −2·(0.6, 0.8) = (−1.2, −1.6)
    ctx = make_ctx([[3.0, 4.0], [3.0, 4.0]], [[0.0, 0.0]])
    out = redteam.attack("norm_hug", bound=2.0).craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[-1.2, -1.6]]))


def test_norm_hug_exactly_at_bound_and_reversed():
    g = torch.Generator().manual_seed(1)
    honest = torch.randn(7, 1000, generator=g) + 0.3
    ctx = make_ctx(honest, torch.randn(3, 1000, generator=g))
    m = 1.7
    out = redteam.attack("norm_hug", bound=m).craft_updates(ctx)
    norms = torch.linalg.vector_norm(out.to(torch.float64), dim=1)
    assert bool((norms <= m).all()) and torch.allclose(norms, torch.full((3,), m, dtype=torch.float64), rtol=1e-6)
    assert torch.allclose(cos(out, honest.mean(dim=0)), torch.full((3,), -1.0, dtype=torch.float64), atol=1e-6)
    # on the boundary, so a rejecting norm bound at M accepts every malicious row
    full = torch.cat([honest / torch.linalg.vector_norm(honest, dim=1, keepdim=True), out])
    dec = redteam.defense("norm_bound", bound=m, mode="reject")(full)
    assert dec.accepted.all()


def test_norm_hug_zero_mean_and_errors():
    ctx = make_ctx([[1.0, 0.0], [-1.0, 0.0]], [[5.0, 5.0]])
    assert torch.equal(redteam.attack("norm_hug").craft_updates(ctx), torch.zeros(1, 2))
    with pytest.raises(InvalidParameter, match=r"NormHug\.bound = 0\.0: must be a finite number > 0"):
        redteam.attack("norm_hug", bound=0)


# -- norm_evasion -------------------------------------------------------------------------------

def test_norm_evasion_scales_to_margin():
    ctx = make_ctx([[0.0, 0.0]], [[3.0, 4.0], [30.0, 40.0], [0.0, 0.0]])
    # margin · M = 0.5 · 10 = 5: (3,4) stays, (30,40) → (3,4), zero stays zero
    out = redteam.attack("norm_evasion", bound=10.0, margin=0.5).craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[3.0, 4.0], [3.0, 4.0], [0.0, 0.0]]))
    # margin 1: exactly at the bound → (6, 8)
    out = redteam.attack("norm_evasion", bound=10.0, margin=1.0).craft_updates(ctx)
    assert torch.allclose(out[:2], torch.tensor([[6.0, 8.0], [6.0, 8.0]]))
    assert bool((torch.linalg.vector_norm(out.to(torch.float64), dim=1) <= 10.0).all())
    with pytest.raises(InvalidParameter, match=r"NormEvasion\.margin = 1\.5: must be in \(0, 1\]"):
        NormEvasion(margin=1.5)


# -- cosine_evasion ------------------------------------------------------------------------------

def test_cosine_evasion_worked_example():
    # r = median of (1,0), (2,0), (3,0) = (2, 0); v = own = (0, 1); c = 0.5:
    # cos(v, r) = 0 < 0.5 → û = 0.5·(1, 0) + √0.75·(0, 1); × M = 2 → (1, √3)
    ctx = make_ctx([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]], [[0.0, 1.0]])
    atk = redteam.attack("cosine_evasion", threshold=0.5, target="own", bound=2.0, slack=0.0)
    out = atk.craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[1.0, math.sqrt(3.0)]]), atol=1e-6)
    # already inside the cone (cos((1,1), r) ≈ 0.707 ≥ 0.5): unchanged, norm kept when unbounded
    ctx2 = make_ctx([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]], [[1.0, 1.0]])
    out2 = redteam.attack("cosine_evasion", threshold=0.5, target="own").craft_updates(ctx2)
    assert torch.allclose(out2, torch.tensor([[1.0, 1.0]]))


@pytest.mark.parametrize("c", [0.0, 0.1, 0.3, 0.9])
def test_cosine_evasion_reverse_sits_on_the_threshold(c):
    g = torch.Generator().manual_seed(2)
    honest = torch.randn(9, 500, generator=g) + 0.5
    ctx = make_ctx(honest, torch.randn(2, 500, generator=g))
    out = redteam.attack("cosine_evasion", threshold=c, bound=1.5).craft_updates(ctx)
    ref = honest.median(dim=0).values
    got = cos(out, ref)
    assert bool((got >= c).all()) and torch.allclose(got, torch.full((2,), c, dtype=torch.float64), atol=1e-5)
    norms = torch.linalg.vector_norm(out.to(torch.float64), dim=1)
    assert bool((norms <= 1.5).all()) and torch.allclose(norms, torch.full((2,), 1.5, dtype=torch.float64), rtol=1e-6)
    # the best anti-alignment the cone allows: cos(u, −r) = −c, never larger
    assert torch.allclose(cos(out, -ref), torch.full((2,), -c, dtype=torch.float64), atol=1e-5)


def test_cone_direction_is_optimal_against_random_feasible_directions():
    g = torch.Generator().manual_seed(3)
    d, c = 6, 0.4
    r = torch.randn(d, generator=g, dtype=torch.float64)
    v = torch.randn(1, d, generator=g, dtype=torch.float64)
    v = v - 1.5 * (v @ r) / (r @ r) * r  # push v outside the cone
    u = cone_direction(v, r, c)[0]
    assert float(cos(u, r)) == pytest.approx(c, abs=1e-12)
    best = float(cos(u, v[0]))
    cands = torch.randn(20000, d, generator=g, dtype=torch.float64)
    feasible = cands[cos(cands, r) >= c]
    assert feasible.shape[0] > 100
    assert float(cos(feasible, v[0]).max()) <= best + 1e-12


def test_cosine_evasion_errors():
    with pytest.raises(InvalidParameter, match=r"CosineEvasion\.threshold = 1\.0: must be in \(−1, 1\)"):
        CosineEvasion(threshold=1.0)
    with pytest.raises(InvalidParameter, match=r"CosineEvasion\.bound = -2\.0"):
        CosineEvasion(bound=-2.0)
    with pytest.raises(InvalidParameter, match=r"CosineEvasion\.against = 'root'"):
        CosineEvasion(against="root")  # type: ignore[arg-type]


# -- adaptive -------------------------------------------------------------------------------------

HONEST = [[0.1, 0.1], [0.2, 0.0], [0.0, 0.3], [0.1, 0.2]]


def test_adaptive_ends_just_inside_norm_bound():
    # sign_flip(own) = −(0.3, 0.4), norm 0.5; bound 1.7 → the largest accepted scale is 3.4
    defense = redteam.defense("norm_bound", bound=1.7, mode="reject")
    ctx = make_ctx(HONEST, [[0.3, 0.4]], defense=defense)
    out = redteam.attack("adaptive").craft_updates(ctx)
    norm = float(torch.linalg.vector_norm(out.to(torch.float64)))
    # just inside the bound; "inside" is decided by the defense itself (the float32 row's
    # norm may exceed 1.7 by one ulp of the float64 computation and still be accepted)
    assert 1.7 - 1e-6 <= norm <= 1.7 + 1e-12
    assert cos(out[0], torch.tensor([0.3, 0.4])).item() == pytest.approx(-1.0)
    full = torch.cat([torch.tensor(HONEST), out])
    assert defense(full).accepted.all()
    assert not defense(torch.cat([torch.tensor(HONEST), out * 1.001])).accepted[-1]


def test_adaptive_shrinks_an_attack_that_is_too_strong():
    # ipm with ε = 100: −100·mean(HONEST) = −(10, 15) has norm ≈ 18.03 > 1 → scaled to norm 1
    defense = redteam.defense("norm_bound", bound=1.0, mode="reject")
    ctx = make_ctx(HONEST, [[0.3, 0.4], [0.0, 0.1]], defense=defense)
    out = redteam.attack("adaptive", attack="ipm", params={"epsilon": 100.0}).craft_updates(ctx)
    norms = torch.linalg.vector_norm(out.to(torch.float64), dim=1)
    assert bool((norms <= 1.0 + 1e-6).all()) and bool((norms >= 1.0 - 1e-6).all())  # float32 rows
    assert defense(torch.cat([torch.tensor(HONEST), out])).accepted.all()
    assert cos(out[0], torch.tensor([-0.1, -0.15])).item() == pytest.approx(1.0)


def test_adaptive_anchor_own_and_without_defense():
    # anchor own: rows = own + s·(−own − own) = (1 − 2s)·own; bound 1.5, ‖own‖ = 0.5 → 1 − 2s = −3, s = 2
    defense = redteam.defense("norm_bound", bound=1.5, mode="reject")
    ctx = make_ctx(HONEST, [[0.3, 0.4]], defense=defense)
    out = redteam.attack("adaptive", anchor="own").craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[-0.9, -1.2]]), atol=1e-6)
    # no defense in the context: the wrapped attack unchanged
    plain = make_ctx(HONEST, [[0.3, 0.4]])
    assert torch.equal(redteam.attack("adaptive").craft_updates(plain), torch.tensor([[-0.3, -0.4]]))


def test_adaptive_declares_itself_and_errors():
    assert Adaptive.adaptive is True and Adaptive.omniscient is True
    with pytest.raises(InvalidParameter, match=r"Adaptive\.attack = 'sing_flip': unknown attack 'sing_flip'"):
        Adaptive(attack="sing_flip")
    with pytest.raises(InvalidParameter, match=r"Adaptive\.params = \{'variant': 'x'\}"):
        Adaptive(params={"variant": "x"})
    with pytest.raises(InvalidParameter, match=r"Adaptive\.max_scale = 0\.5: must be a finite number ≥ 1"):
        Adaptive(max_scale=0.5)
    with pytest.raises(InvalidParameter, match=r"Adaptive\.steps = 0"):
        Adaptive(steps=0)
