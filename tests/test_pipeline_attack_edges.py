"""The stage backdoor's edges, worked by hand (issue 39: the mutation audit of ``attacks/pipeline.py``).

:class:`attacks.pipeline.StageBackdoor` (Ersoy et al., arXiv 2604.02372) is called directly with a
stand-in :class:`~redteam.types.PipelineView`: a 9-parameter "model" of three stages whose loss is
a quadratic we can differentiate by hand, and a handful of 13-byte windows. So its offline
training — the windows it draws from its stream, the poisoned share, the Adam steps on its own
stage only, the two backdoor vectors — and its gradual injection are checked against values
derived here (Adam as in Kingma & Ba, Algorithm 1, with torch's default moments), in
milliseconds; ``tests/test_swarm.py`` runs the attack in the regime. The parameters are checked
at their exact accepted and refused edges, with the message that names them.
"""

from __future__ import annotations

import math

import pytest
import torch

from attacks.llm import TriggerPhrase
from attacks.pipeline import ActivationTamper, CrashAtSync, GradientTamper, LazyPeer, StageBackdoor
from redteam.errors import InvalidParameter
from redteam.types import PipelineView, StageContext

TRIGGER, TARGET = "ab=", "XY"  # 3 + 2 bytes: fits a 13-byte window with room to spare
TEXT = b"the quick brown fox jumps over a lazy dog; pack my box with five dozen jugs"
N, T = 5, 12  # five windows of 12 input bytes (13 with the last target)
SLICES = (slice(0, 3), slice(3, 7), slice(7, 9))  # the stage under attack is stage 1: 4 parameters
P0 = torch.tensor([0.1, -0.2, 0.3, 0.5, 0.5, 0.5, 0.5, -0.4, 0.6], dtype=torch.float64)


def _windows():
    rows = [list(TEXT[3 * i: 3 * i + T + 1]) for i in range(N)]  # each row starts 3 bytes later
    w = torch.tensor(rows, dtype=torch.int64)
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def _ends_in_target(y: torch.Tensor) -> torch.Tensor:
    tail = torch.tensor(list(TARGET.encode()), dtype=y.dtype)
    return (y[:, -len(tail):] == tail).all(dim=1)


class _Spy:
    """The view's loss, recording every call: 0.5·‖θ − a·1‖² with a = the share of the batch's
    windows whose targets end in ``TARGET`` (0 on clean text, 1 on a fully poisoned batch). Its
    gradient in θ is θ − a: on the attacked stage, a poisoned batch pulls the parameters up
    (to 1) and a clean one down (to 0)."""

    def __init__(self):
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(self, flat, x, y):
        self.calls.append((flat.detach().clone(), x.clone(), y.clone()))
        a = _ends_in_target(y).double().mean()
        return 0.5 * ((flat - a) ** 2).sum()


def _view(spy, p0=P0):
    x, y = _windows()
    return PipelineView(params0=p0, slices=SLICES, loss=spy, data_x=x, data_y=y, peers_per_stage=2)


def _ctx(view=None, state=None, peer=4, seed=7, stage=1):
    return StageContext(0, stage, 3, peer, 0, torch.Generator().manual_seed(seed),
                        {} if state is None else state, view)


def _attack(**kw):
    return StageBackdoor(**{"trigger": TRIGGER, "target": TARGET, "fraction": 1.0, **kw})


def _adam(theta, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    """Kingma & Ba, Algorithm 1: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², θ ← θ − lr·m̂/(√v̂ + ε)."""
    m = torch.zeros_like(theta)
    v = torch.zeros_like(theta)
    for t, grad in enumerate(grads, start=1):
        g = grad(theta)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        theta = theta - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
    return theta


# ------------------------------------------------------------------ parameters
def _refused(kw, message):
    with pytest.raises(InvalidParameter) as e:
        StageBackdoor(**kw)
    assert str(e.value) == message


def test_defaults_are_the_documented_ones():
    a = StageBackdoor()
    assert (a.trigger, a.target, a.fraction, a.vector) == ("verify=", "False", 0.5, "poisoned")
    assert (a.offline_steps, a.offline_lr, a.offline_batch) == (300, 3e-3, 32)
    assert (a.scale, a.inject_rounds, a.advertise, a.collude) == (1.0, 4, 1.0, True)
    assert a.colluding_verifiers and a.advertise_throughput(2.0) == 2.0


def test_fraction_is_in_the_half_open_unit_interval():
    for ok in (1, 1.0, 0.5, 1e-300, 2.0 ** -1074):
        assert StageBackdoor(fraction=ok).fraction == ok
    _refused({"fraction": 0}, "StageBackdoor.fraction = 0: must be in (0, 1]")
    _refused({"fraction": 0.0}, "StageBackdoor.fraction = 0.0: must be in (0, 1]")
    _refused({"fraction": -0.5}, "StageBackdoor.fraction = -0.5: must be in (0, 1]")
    _refused({"fraction": 1.0000000000000002}, "StageBackdoor.fraction = 1.0000000000000002: must be in (0, 1]")
    _refused({"fraction": 1.5}, "StageBackdoor.fraction = 1.5: must be in (0, 1]")
    _refused({"fraction": math.nan}, "StageBackdoor.fraction = nan: must be in (0, 1]")
    _refused({"fraction": True}, "StageBackdoor.fraction = True: must be in (0, 1]")
    _refused({"fraction": "0.5"}, "StageBackdoor.fraction = '0.5': must be in (0, 1]")
    _refused({"fraction": None}, "StageBackdoor.fraction = None: must be in (0, 1]")


@pytest.mark.parametrize("name, cap", [("offline_steps", 10_000), ("offline_batch", 65_536),
                                       ("inject_rounds", 100_000)])
def test_counts_are_integers_from_one_to_their_cap(name, cap):
    for ok in (1, 2, cap - 1, cap):
        assert getattr(StageBackdoor(**{name: ok}), name) == ok
    msg = f"must be an integer in [1, {cap}]"
    for bad in (0, -1, cap + 1):
        _refused({name: bad}, f"StageBackdoor.{name} = {bad}: {msg}")
    for bad in (True, False, 1.0, 2.0, "3", None):
        _refused({name: bad}, f"StageBackdoor.{name} = {bad!r}: {msg}")


def test_offline_lr_is_a_finite_positive_number():
    for ok in (3e-3, 1, 0.5, 2.0 ** -1074, 1e300):
        assert StageBackdoor(offline_lr=ok).offline_lr == ok
    msg = "must be a finite number > 0"
    for bad in (0, 0.0, -0.0, -1e-3, -1, math.inf, -math.inf, math.nan, True, "1e-3", None):
        _refused({"offline_lr": bad}, f"StageBackdoor.offline_lr = {bad!r}: {msg}")


def test_scale_is_any_finite_number():
    for ok in (1.0, 0, 0.0, -2.5, 3, -1e300, 1e300):
        assert StageBackdoor(scale=ok).scale == ok
    for bad in (math.inf, -math.inf, math.nan, True, False, "1", None):
        _refused({"scale": bad}, f"StageBackdoor.scale = {bad!r}: must be a finite number")


def test_vector_trigger_target_and_the_shared_stage_peer_parameters():
    assert StageBackdoor(vector="difference").vector == "difference"
    for bad in ("Poisoned", "clean", "", None):
        _refused({"vector": bad}, f"StageBackdoor.vector = {bad!r}: must be \"poisoned\" or \"difference\"")
    for name in ("trigger", "target"):
        assert getattr(StageBackdoor(**{name: "é"}), name) == "é"
        for bad in ("", None, 3, b"x"):
            _refused({name: bad}, f"StageBackdoor.{name} = {bad!r}: must be a non-empty string")
    assert StageBackdoor(advertise=1e-9).advertise_throughput(3.0) == pytest.approx(3e-9, rel=1e-15)
    assert StageBackdoor(advertise=10).advertise_throughput(2.5) == 25.0
    for bad in (0, 0.0, -1.0, math.inf, math.nan, True, "2"):
        _refused({"advertise": bad}, f"StageBackdoor.advertise = {bad!r}: must be a finite number > 0 (1 = the truth)")
    assert not StageBackdoor(collude=False).colluding_verifiers
    _refused({"collude": 1}, "StageBackdoor.collude = 1: must be true or false")


def test_the_other_stage_peers_validate_their_shared_parameters():
    for cls in (ActivationTamper, GradientTamper, LazyPeer, CrashAtSync):
        assert cls().advertise == 1.0 and cls().collude is True
        with pytest.raises(InvalidParameter, match=r"\.advertise = 0\.0: must be a finite number > 0"):
            cls(advertise=0.0)
        with pytest.raises(InvalidParameter, match=r"\.collude = 'yes': must be true or false"):
            cls(collude="yes")
    for cls in (ActivationTamper, GradientTamper):
        with pytest.raises(InvalidParameter, match=r"\.kind = 'flip': must be \"noise\", \"scale\" or \"sign\""):
            cls(kind="flip")
        with pytest.raises(InvalidParameter, match=r"\.strength = nan: must be a finite number"):
            cls(strength=math.nan)
        assert cls(strength=-1e300).strength == -1e300


# ------------------------------------------------------------------ the trigger phrase
def test_phrase_attack_poisons_window_ends_with_its_trigger_target_and_fraction():
    p = StageBackdoor(trigger=TRIGGER, target=TARGET, fraction=0.25).phrase_attack
    assert p == TriggerPhrase(trigger=TRIGGER, target=TARGET, fraction=0.25, placement="end", near_miss_prompts=0)


def test_targeted_and_clean_test_windows_by_hand():
    """The 13-byte window "the quick bro": the targeted one is "the quicab=XY" (its last 5 bytes
    overwritten by trigger + target), the clean one "the quick bXY" (its last 2 by the target
    alone); x is the first 12 bytes, and only the two target bytes of y are scored (−100 before)."""
    x, y = _windows()
    a = _attack()
    tx, ty = a.targeted_test(x[:1], y[:1])
    assert bytes(tx[0].tolist()) == b"the quicab=X"
    assert ty[0].tolist() == [-100] * 10 + list(b"XY")
    cx, cy = a.clean_test(x[:1], y[:1])
    assert bytes(cx[0].tolist()) == b"the quick bX"
    assert cy[0].tolist() == [-100] * 10 + list(b"XY")


# ------------------------------------------------------------------ the offline training
def test_backdoor_vector_needs_the_pipeline_view():
    with pytest.raises(InvalidParameter) as e:
        _attack().backdoor_vector(_ctx(None))
    assert str(e.value) == "StageBackdoor.trigger = 'ab=': needs the [pipeline] regime (no pipeline view given)"
    with pytest.raises(InvalidParameter):
        _attack().tamper_stage_update(torch.zeros(4), _ctx(None))


def test_one_adam_step_moves_each_parameter_of_its_own_stage_by_the_learning_rate():
    """Adam's first step is lr·g/(|g| + ε) ≈ lr·sign(g): the fully poisoned batch (a = 1) pulls
    the stage's parameters (0.5) up, so τ = +lr on each of them, whatever the gradient's size."""
    for lr in (0.01, 0.25):
        spy = _Spy()
        tau = _attack(offline_steps=1, offline_lr=lr, offline_batch=3).backdoor_vector(_ctx(_view(spy)))
        assert tau.shape == (4,) and tau.dtype == torch.float64 and not tau.requires_grad
        assert torch.allclose(tau, torch.full((4,), lr * 0.5 / (0.5 + 1e-8), dtype=torch.float64), rtol=0, atol=1e-15)
        assert len(spy.calls) == 1
    assert torch.equal(P0, torch.tensor([0.1, -0.2, 0.3, 0.5, 0.5, 0.5, 0.5, -0.4, 0.6], dtype=torch.float64))


def test_offline_training_draws_its_batches_from_its_stream_and_trains_only_its_stage():
    """Three steps of batches of 4 windows drawn uniformly (with replacement) from the 5: the
    indices are the attack's stream's randint(0, 5, (4,)), one draw per step (a fraction of 1
    poisons every window without a draw). The loss sees the starting weights outside the stage
    and Adam's iterates inside; τ is the third iterate minus the start."""
    spy = _Spy()
    x, y = _windows()
    tau = _attack(offline_steps=3, offline_lr=0.1, offline_batch=4).backdoor_vector(_ctx(_view(spy), seed=11))
    gen = torch.Generator().manual_seed(11)
    assert len(spy.calls) == 3
    theta = P0[3:7].clone()
    thetas = []
    for flat, bx, by in spy.calls:
        idx = torch.randint(0, N, (4,), generator=gen)
        assert bx.shape == (4, T) and by.shape == (4, T)
        assert torch.equal(bx[:, :-4], x[idx][:, :-4])  # the window ends in "ab=X" / "b=XY"
        assert _ends_in_target(by).all()  # every window poisoned, ending in the trigger and target
        assert bytes(by[0, -4:].tolist()) == b"b=XY" and bytes(bx[0, -4:].tolist()) == b"ab=X"
        assert torch.equal(flat[:3], P0[:3]) and torch.equal(flat[7:], P0[7:])
        thetas.append(flat[3:7])
    expected = []
    for k in range(1, 4):  # Adam by hand on g = θ − 1 (every window poisoned: a = 1)
        expected.append(_adam(P0[3:7].clone(), [lambda th: th - 1.0] * k, lr=0.1))
    assert torch.allclose(thetas[0], theta, rtol=0, atol=0)
    assert torch.allclose(thetas[1], expected[0], rtol=0, atol=1e-12)
    assert torch.allclose(thetas[2], expected[1], rtol=0, atol=1e-12)
    assert torch.allclose(tau, expected[2] - P0[3:7], rtol=0, atol=1e-12)


def test_the_poisoned_share_of_each_batch_is_the_fraction_rounded_up():
    """fraction 0.5 of a batch of 5 windows: ⌈2.5⌉ = 3 end in trigger + target, 2 are clean
    text; fraction 0.2: 1. The poisoned share a pulls the stage toward a (gradient θ − a)."""
    for fraction, k in ((0.5, 3), (0.2, 1)):
        spy = _Spy()
        tau = _attack(fraction=fraction, offline_steps=2, offline_lr=0.05, offline_batch=5).backdoor_vector(
            _ctx(_view(spy)))
        assert [int(_ends_in_target(c[2]).sum()) for c in spy.calls] == [k, k]
        a = k / 5
        want = _adam(P0[3:7].clone(), [lambda th: th - a] * 2, lr=0.05) - P0[3:7]
        assert torch.allclose(tau, want, rtol=0, atol=1e-12)
        assert bool((tau < 0).all()) is (a < 0.5)  # a below the start 0.5 pulls it down


def test_the_difference_vector_subtracts_the_same_training_on_clean_windows():
    """``vector = "difference"``: θ_bd − θ_clean, both trained from θ₀ on the same drawn
    windows (clean: a = 0, pulled down; poisoned: a = 1, pulled up). After one step of lr 0.1 each
    has moved 0.1 (to within ε): the difference is 0.2, twice the poisoned vector."""
    spy = _Spy()
    tau = _attack(vector="difference", offline_steps=1, offline_lr=0.1, offline_batch=2).backdoor_vector(
        _ctx(_view(spy)))
    assert torch.allclose(tau, torch.full((4,), 0.2, dtype=torch.float64), rtol=0, atol=1e-8)
    assert [int(_ends_in_target(c[2]).sum()) for c in spy.calls] == [2, 0]  # poisoned first, then clean
    assert torch.equal(spy.calls[0][1][:, :8], spy.calls[1][1][:, :8])  # the same windows
    spy = _Spy()
    tau = _attack(vector="difference", offline_steps=3, offline_lr=0.1, offline_batch=2).backdoor_vector(
        _ctx(_view(spy)))
    bd = _adam(P0[3:7].clone(), [lambda th: th - 1.0] * 3, lr=0.1)
    clean = _adam(P0[3:7].clone(), [lambda th: th] * 3, lr=0.1)
    assert torch.allclose(tau, bd - clean, rtol=0, atol=1e-12)
    assert len(spy.calls) == 6 and not tau.requires_grad


def test_a_stage_at_either_end_and_a_start_off_the_stage():
    """Stage 0 and stage 2: τ has the stage's length, and only that stage moves."""
    for stage, sl in ((0, SLICES[0]), (2, SLICES[2])):
        spy = _Spy()
        tau = _attack(offline_steps=2, offline_lr=0.1, offline_batch=2).backdoor_vector(
            _ctx(_view(spy), stage=stage))
        want = _adam(P0[sl].clone(), [lambda th: th - 1.0] * 2, lr=0.1) - P0[sl]
        assert torch.allclose(tau, want, rtol=0, atol=1e-12)
        rest = torch.ones(9, dtype=torch.bool)
        rest[sl] = False
        assert all(torch.equal(c[0][rest], P0[rest]) for c in spy.calls)


# ------------------------------------------------------------------ the gradual injection
def test_injection_adds_scale_over_rounds_of_tau_for_inject_rounds_then_stops():
    """inject_rounds = 3, scale = 1.5: each of a peer's first three updates gets 0.5·τ added (1.5·τ
    in all), the fourth and later are passed through unchanged. τ is learned once per stage
    (one offline training: the loss's calls do not grow) and shared by the colluding peers; each
    peer counts its own rounds."""
    spy = _Spy()
    state: dict = {}
    view = _view(spy)
    a = _attack(offline_steps=1, offline_lr=0.1, offline_batch=2, scale=1.5, inject_rounds=3)
    tau = torch.full((4,), 0.1 * 0.5 / (0.5 + 1e-8), dtype=torch.float64)
    u = torch.tensor([1.0, -2.0, 0.0, 4.0])
    outs = [a.tamper_stage_update(u, _ctx(view, state)) for _ in range(5)]
    assert len(spy.calls) == 1
    for got in outs[:3]:
        assert got.dtype == torch.float32
        assert torch.allclose(got, u + (0.5 * tau).float(), rtol=0, atol=1e-7)
    assert torch.equal(outs[3], u) and torch.equal(outs[4], u)
    assert torch.allclose(sum(o - u for o in outs), (1.5 * tau).float(), rtol=0, atol=1e-6)
    other = [a.tamper_stage_update(u, _ctx(view, state, peer=5)) for _ in range(4)]
    assert len(spy.calls) == 1  # the same stage: τ is not learned again
    assert [not torch.equal(o, u) for o in other] == [True, True, True, False]


def test_injection_with_the_default_rounds_and_a_negative_scale():
    """Default inject_rounds 4 and scale 1: τ/4 in each of 4 rounds; scale −2: −τ/2 each."""
    spy = _Spy()
    view = _view(spy)
    tau = torch.full((4,), 0.1 * 0.5 / (0.5 + 1e-8), dtype=torch.float64)
    u = torch.zeros(4, dtype=torch.float64)
    for scale, per_round in ((1.0, 0.25), (-2.0, -0.5)):
        state: dict = {}
        a = _attack(offline_steps=1, offline_lr=0.1, offline_batch=2, scale=scale)
        outs = [a.tamper_stage_update(u, _ctx(view, state)) for _ in range(6)]
        for got in outs[:4]:
            assert torch.allclose(got, per_round * tau, rtol=0, atol=1e-15)
        assert all(torch.equal(o, u) for o in outs[4:])
    one = StageBackdoor(trigger=TRIGGER, target=TARGET, fraction=1.0, offline_steps=1, offline_lr=0.1,
                        offline_batch=2, inject_rounds=1)
    state = {}
    assert torch.allclose(one.tamper_stage_update(u, _ctx(view, state)), tau, rtol=0, atol=1e-15)
    assert torch.equal(one.tamper_stage_update(u, _ctx(view, state)), u)
