"""Envelope attacks (attacks/envelope.py): exact one-line errors, the edges of every accepted
range, cosine evasion's reference choices and the adaptive search's view of the round —
what mutation testing found unpinned."""

from __future__ import annotations

import math

import pytest
import torch

from attacks.envelope import (
    Adaptive,
    CosineEvasion,
    NormEvasion,
    NormHug,
    cone_direction,
)
from redteam.errors import InvalidParameter
from redteam.types import AttackContext, Decision

BAD = [
    (NormHug, {"bound": 0}, "NormHug.bound = 0: must be a finite number > 0"),
    (NormHug, {"bound": True}, "NormHug.bound = True: must be a finite number > 0"),
    (NormHug, {"knowledge": "all"}, ("NormHug.knowledge = 'all': must be 'omniscient' (all honest updates "
                                     "of the round) or 'own' (only the malicious clients' own honest updates)")),
    (NormEvasion, {"bound": -1.0}, "NormEvasion.bound = -1.0: must be a finite number > 0"),
    (NormEvasion, {"bound": math.inf}, "NormEvasion.bound = inf: must be a finite number > 0"),
    (NormEvasion, {"margin": 0}, "NormEvasion.margin = 0: must be in (0, 1]"),
    (NormEvasion, {"margin": 1.5}, "NormEvasion.margin = 1.5: must be in (0, 1]"),
    (NormEvasion, {"margin": True}, "NormEvasion.margin = True: must be in (0, 1]"),
    (CosineEvasion, {"threshold": 1.0}, "CosineEvasion.threshold = 1.0: must be in (−1, 1)"),
    (CosineEvasion, {"threshold": -1.0}, "CosineEvasion.threshold = -1.0: must be in (−1, 1)"),
    (CosineEvasion, {"threshold": True}, "CosineEvasion.threshold = True: must be in (−1, 1)"),
    (CosineEvasion, {"against": "x"}, "CosineEvasion.against = 'x': must be 'median', 'mean' or 'previous'"),
    (CosineEvasion, {"target": "x"}, "CosineEvasion.target = 'x': must be 'reverse' or 'own'"),
    (CosineEvasion, {"bound": 0.0}, "CosineEvasion.bound = 0.0: must be a finite number > 0"),
    (CosineEvasion, {"slack": 0.01}, "CosineEvasion.slack = 0.01: must be in [0, 0.01)"),
    (CosineEvasion, {"slack": -1e-9}, "CosineEvasion.slack = -1e-09: must be in [0, 0.01)"),
    (CosineEvasion, {"slack": True}, "CosineEvasion.slack = True: must be in [0, 0.01)"),
    (Adaptive, {"attack": ""}, "Adaptive.attack = '': must be the name of a registered attack"),
    (Adaptive, {"attack": 3}, "Adaptive.attack = 3: must be the name of a registered attack"),
    (Adaptive, {"params": []}, "Adaptive.params = []: must be a table of the wrapped attack's parameters"),
    (Adaptive, {"params": {"scale": -1}}, ("Adaptive.params = {'scale': -1}: SignFlip.scale = -1.0: "
                                           "must be a finite number > 0")),
    (Adaptive, {"anchor": "x"}, "Adaptive.anchor = 'x': must be 'zero' or 'own'"),
    (Adaptive, {"max_scale": 0.5}, "Adaptive.max_scale = 0.5: must be a finite number ≥ 1"),
    (Adaptive, {"max_scale": True}, "Adaptive.max_scale = True: must be a finite number ≥ 1"),
    (Adaptive, {"max_scale": math.inf}, "Adaptive.max_scale = inf: must be a finite number ≥ 1"),
    (Adaptive, {"steps": 0}, "Adaptive.steps = 0: must be an integer in [1, 200]"),
    (Adaptive, {"steps": 201}, "Adaptive.steps = 201: must be an integer in [1, 200]"),
    (Adaptive, {"steps": True}, "Adaptive.steps = True: must be an integer in [1, 200]"),
    (Adaptive, {"steps": 2.0}, "Adaptive.steps = 2.0: must be an integer in [1, 200]"),
]


@pytest.mark.parametrize("cls, kw, msg", BAD)
def test_bad_parameters_exact_messages(cls, kw, msg):
    with pytest.raises(InvalidParameter) as ei:
        cls(**kw)
    assert str(ei.value) == msg


def test_unknown_wrapped_attack_names_the_field_and_suggests():
    with pytest.raises(InvalidParameter) as ei:
        Adaptive(attack="sign_flp")
    assert str(ei.value).startswith("Adaptive.attack = 'sign_flp': unknown attack 'sign_flp'; did you mean 'sign_flip'")


@pytest.mark.parametrize("cls, kw", [
    (NormEvasion, {"margin": 1}), (NormEvasion, {"margin": 1e-9}),
    (CosineEvasion, {"threshold": -0.999}), (CosineEvasion, {"threshold": 0.999}),
    (CosineEvasion, {"slack": 0}), (CosineEvasion, {"slack": 0.00999}), (CosineEvasion, {"bound": None}),
    (CosineEvasion, {"against": "mean"}), (CosineEvasion, {"against": "previous"}), (CosineEvasion, {"target": "own"}),
    (NormHug, {"knowledge": "own"}), (Adaptive, {"anchor": "own"}),
    (Adaptive, {"max_scale": 1}), (Adaptive, {"steps": 1}), (Adaptive, {"steps": 200}),
])
def test_range_edges_are_accepted(cls, kw):
    obj = cls(**kw)
    for k, v in kw.items():
        assert getattr(obj, k) == v


def test_adaptive_hash_depends_on_its_parameters():
    a = Adaptive(params={"scale": 2.0})
    assert hash(a) == hash(Adaptive(params={"scale": 2.0}))
    assert len({hash(a), hash(Adaptive(params={"scale": 3.0})), hash(Adaptive(anchor="own")),
                hash(Adaptive(steps=5)), hash(Adaptive(max_scale=10.0)), hash(Adaptive())}) == 6


# -- behaviour the mutants showed untested ------------------------------------------------------------
def _actx(own, visible, *, previous=None, rows=(), n=None, weights=None, defense=None):
    own = torch.tensor(own, dtype=torch.float64)
    visible = torch.tensor(visible, dtype=torch.float64)
    n = n if n is not None else own.shape[0] + visible.shape[0]
    return AttackContext(round=3, n_clients=n, malicious=tuple(rows) or tuple(range(own.shape[0])),
                         malicious_rows=tuple(rows), own_updates=own, visible_updates=visible,
                         global_params=torch.zeros(own.shape[1], dtype=torch.float64),
                         generator=torch.Generator().manual_seed(0), weights=weights,
                         previous_update=previous, defense=defense)


VISIBLE = [[1.0, 0.0], [3.0, 0.0], [2.0, 6.0]]  # mean [2, 2]; coordinate (lower) median [2, 0]


@pytest.mark.parametrize("against, previous, ref", [
    ("mean", None, [2.0, 2.0]),
    ("median", None, [2.0, 0.0]),
    ("previous", [0.0, 5.0], [0.0, 5.0]),
    ("previous", None, [2.0, 0.0]),  # round 0: no previous update, falls back to the median
    ("median", [0.0, 5.0], [2.0, 0.0]),  # a previous update is ignored unless asked for
])
def test_cosine_evasion_reference(against, previous, ref):
    ctx = _actx([[1.0, 1.0]], VISIBLE, previous=None if previous is None else torch.tensor(previous))
    got = CosineEvasion(against=against).ref_vector(ctx)
    assert got.tolist() == ref


def test_cosine_evasion_without_a_reference_keeps_its_target():
    # all-zero honest rows: the reference is 0, nothing to evade: target "own" [0.3, 0.4]
    # comes back unchanged (direction [0.6, 0.8] times its length 0.5)
    ctx = _actx([[0.3, 0.4]], [[0.0, 0.0], [0.0, 0.0]])
    out = CosineEvasion(target="own").craft_updates(ctx)
    torch.testing.assert_close(out, torch.tensor([[0.3, 0.4]], dtype=torch.float64))
    # "reverse" of a zero reference is a zero row
    assert CosineEvasion().craft_updates(ctx).abs().sum() == 0


class _Spy:
    """A reject-mode norm bound M = 2 that records the matrices and contexts it is shown."""

    def __init__(self):
        self.calls = []

    def __call__(self, full, ctx):
        self.calls.append((full.clone(), ctx))
        ok = torch.linalg.vector_norm(full, dim=1) <= 2.0
        return Decision(aggregate=full.mean(dim=0), accepted=ok)


def test_adaptive_search_sees_the_round_as_the_server_would():
    # two malicious clients at rows 1 and 3 of 4; own rows [0.3, 0.4] (norm 0.5): sign_flip
    # sends −[0.3, 0.4]; the largest accepted strength under ‖·‖ ≤ 2 is s = 4 (2 / 0.5),
    # reached by doubling 1 → 2 → 4 (accepted) → 8 (rejected), then bisection in [4, 8].
    spy = _Spy()
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    ctx = _actx([[0.3, 0.4], [0.3, 0.4]], [[1.0, 0.0], [0.0, 1.0]], rows=(1, 3), weights=w, defense=spy,
                previous=torch.tensor([0.5, 0.5], dtype=torch.float64))
    out = Adaptive(attack="sign_flip").craft_updates(ctx)
    torch.testing.assert_close(out, torch.tensor([[-1.2, -1.6], [-1.2, -1.6]], dtype=torch.float64))
    strengths = [float(torch.linalg.vector_norm(full[1])) / 0.5 for full, _ in spy.calls]
    assert strengths[:4] == pytest.approx([1.0, 2.0, 4.0, 8.0])
    assert len(spy.calls) == 4 + 30  # then 30 bisection steps (the default)
    full, sctx = spy.calls[0]
    # honest rows at their own positions, the malicious rows at theirs
    assert full[0].tolist() == [1.0, 0.0] and full[2].tolist() == [0.0, 1.0]
    assert sctx.round == 3 and sctx.client_ids == (0, 1, 2, 3) and sctx.n_clients == 4
    assert torch.equal(sctx.weights, w) and torch.equal(sctx.global_params, ctx.global_params)
    assert torch.equal(sctx.previous_update, ctx.previous_update) and sctx.generator is not None
    # every probe of one round sees the same randomness
    assert len({c.generator.initial_seed() for _, c in spy.calls}) == 1


def test_adaptive_appends_malicious_rows_when_positions_are_unknown():
    # 3 rows in the round but the malicious client's position (7) is outside it: honest
    # rows first, then the malicious one; weights of the wrong length are not passed on
    spy = _Spy()
    ctx = _actx([[0.3, 0.4]], [[1.0, 0.0], [0.0, 1.0]], rows=(7,), weights=torch.ones(5, dtype=torch.float64),
                defense=spy)
    Adaptive(attack="sign_flip", steps=1).craft_updates(ctx)
    full, sctx = spy.calls[0]
    assert full[:2].tolist() == [[1.0, 0.0], [0.0, 1.0]] and full[2].tolist() == pytest.approx([-0.3, -0.4])
    assert sctx.weights.tolist() == [1.0, 1.0, 1.0]  # the default equal weights


def test_adaptive_max_scale_caps_the_doubling():
    # nothing is ever rejected (M = 2 ≫ 1e-3 · 8): doubling stops at max_scale = 5 (1 → 2 → 4 → 5)
    spy = _Spy()
    ctx = _actx([[0.0003, 0.0004]], [[1.0, 0.0]], rows=(1,), defense=spy)
    out = Adaptive(attack="sign_flip", max_scale=5.0).craft_updates(ctx)
    torch.testing.assert_close(out, torch.tensor([[-0.0015, -0.002]], dtype=torch.float64))
    assert len(spy.calls) == 4


def test_cone_direction_by_hand():
    # r = e₁, c = 0.5 (√(1 − c²) = √3/2).
    # targets inside the cone come back as their own unit vectors, whatever their length:
    #   [3, 4, 0] and [0.3, 0.4, 0] (cos 0.6 ≥ 0.5) → [0.6, 0.8, 0]
    # targets outside land on the cone in their own plane with r:
    #   [−1, 1, 0] → 0.5·e₁ + (√3/2)·e₂;  [−1, 0, 2] → 0.5·e₁ + (√3/2)·e₃
    h = 3 ** 0.5 / 2
    r = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    t = torch.tensor([[3.0, 4.0, 0.0], [0.3, 0.4, 0.0], [-1.0, 1.0, 0.0], [-1.0, 0.0, 2.0]],
                     dtype=torch.float64)
    want = torch.tensor([[0.6, 0.8, 0.0], [0.6, 0.8, 0.0], [0.5, h, 0.0], [0.5, 0.0, h]], dtype=torch.float64)
    torch.testing.assert_close(cone_direction(t, r, 0.5), want)


@pytest.mark.parametrize("fallback, want_dir", [
    ([1.0, 0.5, 0.0], [0.0, 1.0, 0.0]),  # its part ⊥ r, [0, 0.5, 0], normalised
    ([1.0, 2.0, 0.0], [0.0, 1.0, 0.0]),
    ([3.0, 0.0, 0.0], [0.0, 0.0, 0.0]),  # parallel to r: no orthogonal part, stays on r
])
def test_cone_direction_reverse_target_uses_the_fallback(fallback, want_dir):
    # target exactly −r: every direction ⊥ r is optimal; the fallback's orthogonal part is
    # used, so the row is 0.6·e₁ + 0.8·(that unit direction) for c = 0.6
    r = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    got = cone_direction(-r[None, :], r, 0.6, torch.tensor(fallback, dtype=torch.float64))
    want = 0.6 * r + 0.8 * torch.tensor(want_dir, dtype=torch.float64)
    torch.testing.assert_close(got[0], want)


def test_adaptive_anchor_own_interpolates_from_the_honest_rows():
    # anchor "own": rows own + s·(crafted − own) = own·(1 − 2s) for a sign flip; the probe at
    # s = 2 is −3·own (norm 1.5; with anchor "zero" it would be −2·own, norm 1.0). The search
    # ends on the bound: |1 − 2s|·0.5 = 2 → s = 2.5 → −4·own = [−1.2, −1.6].
    spy = _Spy()
    ctx = _actx([[0.3, 0.4]], [[1.0, 0.0]], rows=(1,), defense=spy)
    out = Adaptive(attack="sign_flip", anchor="own").craft_updates(ctx)
    torch.testing.assert_close(out, torch.tensor([[-1.2, -1.6]], dtype=torch.float64))
    assert float(torch.linalg.vector_norm(spy.calls[1][0][1])) == pytest.approx(1.5)


def test_adaptive_bisects_between_one_and_two():
    # own norm 1.5: s = 1 accepted (1.5 ≤ 2), s = 2 rejected (3 > 2) → bisection in [1, 2]
    # ends at s = 2/1.5 = 4/3: the row −(4/3)·[0.9, 1.2] = [−1.2, −1.6]
    ctx = _actx([[0.9, 1.2]], [[1.0, 0.0]], rows=(1,), defense=_Spy())
    out = Adaptive(attack="sign_flip").craft_updates(ctx)
    torch.testing.assert_close(out, torch.tensor([[-1.2, -1.6]], dtype=torch.float64))


def test_adaptive_wraps_a_non_omniscient_attack_with_its_own_view():
    # sign_flip(mean) is not omniscient: inside Adaptive it sees only the malicious rows'
    # own updates, mean([0.1, 0], [0.3, 0]) = [0.2, 0] → −[0.2, 0] each (not −mean(visible))
    ctx = _actx([[0.1, 0.0], [0.3, 0.0]], [[5.0, 5.0]], rows=(1, 2), defense=None)
    out = Adaptive(attack="sign_flip", params={"variant": "mean"}).craft_updates(ctx)
    torch.testing.assert_close(out, torch.tensor([[-0.2, 0.0], [-0.2, 0.0]], dtype=torch.float64))
