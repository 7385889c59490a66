"""IBA (Nguyen et al., NeurIPS 2023): the bounded trigger, one generator step against an
independent transcription of the authors' loss and optimiser step, the PGD ball, the poisoned
share of a batch, the two-phase schedule, parameter errors and the contract kit."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from attacks.iba import IBA, generate, init_generator
from redteam.errors import InvalidParameter
from redteam.testing import check_attack
from redteam.testing.builders import make_attack_context

torch.set_num_threads(1)


def _built(atk: IBA, input_shape=(16,), seed: int = 0) -> IBA:
    atk.build(input_shape, torch.Generator().manual_seed(seed))
    return atk


def _saturate(atk: IBA, sign: float) -> None:
    """Make G(x) = sign·1 everywhere: every conv 0, the last normalisation's shift ±50, so the
    pre-tanh map is the constant ±50 and tanh(±50) rounds to ±1 exactly."""
    p = atk._memory["params"]
    for k in p:
        if not k.startswith("out.norm"):
            p[k] = torch.zeros_like(p[k])
    p["out.norm.weight"] = torch.zeros_like(p["out.norm.weight"])
    p["out.norm.bias"] = torch.full_like(p["out.norm.bias"], 50.0 * sign)


# ---------------------------------------------------------------- the bounded trigger
def test_trigger_is_clip_of_x_plus_eps_g_and_reaches_the_bound_exactly():
    # ε = 1/4 and pixels on a 1/16 grid: every sum is exact in float32.
    atk = _built(IBA(eps=0.25, eps_min=0.25, image_shape=(4, 4)))
    x = (torch.arange(32, dtype=torch.float32) % 17 / 16).reshape(2, 16)  # 0, 1/16, …, 1
    _saturate(atk, +1.0)
    up = atk.apply(x)
    # by hand: x + 1/4 below the top, 1 from x = 3/4 on (the clip)
    want = torch.where(x <= 0.75, x + 0.25, torch.ones_like(x))
    assert torch.equal(up, want)
    assert float((up - x).abs().max()) == 0.25  # the bound, reached exactly
    _saturate(atk, -1.0)
    down = atk.apply(x)
    assert torch.equal(down, torch.where(x >= 0.25, x - 0.25, torch.zeros_like(x)))
    assert float((down - x).abs().max()) == 0.25


def test_a_learned_generator_stays_strictly_inside_the_bound_in_any_layout():
    atk = _built(IBA(eps=0.3, image_shape=(1, 8, 8)), (64,), seed=3)
    x = torch.rand(5, 64, generator=torch.Generator().manual_seed(1))
    t = atk.apply(x)
    assert float((t - x).abs().max()) < 0.3 and float(t.min()) >= 0.0 and float(t.max()) <= 1.0
    # the same images as (N, 1, 8, 8) get the same trigger
    assert torch.equal(atk.apply(x.reshape(5, 1, 8, 8)).reshape(5, 64), t)
    # an explicit ε scales the same G: (T_ε − x) = ε·G away from the clip
    mid = torch.full((1, 64), 0.5)
    g = atk.apply(mid, eps=0.1) - mid
    assert torch.allclose(atk.apply(mid, eps=0.2) - mid, 2 * g, atol=1e-6)


def test_image_shape_is_read_from_the_model_when_unset():
    assert IBA().shape_for((64,)) == (1, 8, 8)
    assert IBA().shape_for((3, 32, 32)) == (3, 32, 32)
    assert IBA().shape_for((28, 28)) == (1, 28, 28)
    assert IBA(image_shape=(8, 8)).shape_for((64,)) == (1, 8, 8)
    with pytest.raises(InvalidParameter, match=r"IBA\.image_shape = None: .*no square image"):
        IBA().shape_for((60,))
    with pytest.raises(InvalidParameter, match=r"IBA\.image_shape = \(4, 4\): has 16 values"):
        IBA(image_shape=(4, 4)).shape_for((64,))


# ---------------------------------------------------------------- one generator step
def _tiny_model():
    g = torch.Generator().manual_seed(11)
    flat = torch.randn(16 * 3 + 3, generator=g, dtype=torch.float32)

    def forward(flat, x):
        return x.reshape(x.shape[0], 16) @ flat[:48].reshape(16, 3) + flat[48:]

    return flat, forward


def _authors_loss(params, flat, forward, x, eps, target):
    """The authors' ``_train_attack_model`` loss, written out: CE(f(clip(x + ε·G(x), 0, 1)), target)
    with the cross-entropy as −mean(logit_target − logsumexp(logits))."""
    img = x.reshape(x.shape[0], 1, 4, 4)
    atk = torch.clamp(img + eps * generate(params, img), 0.0, 1.0).reshape(x.shape[0], 16)
    logits = forward(flat, atk)
    return -(logits[:, target] - torch.logsumexp(logits, dim=1)).mean()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_generator_step_matches_the_authors_loss_and_optimiser(optimizer):
    flat, forward = _tiny_model()
    x = torch.rand(6, 16, generator=torch.Generator().manual_seed(5))
    lr = 0.05
    atk = _built(IBA(target=1, eps=0.3, image_shape=(4, 4), width=2, optimizer=optimizer, lr=lr, epochs=1, batch=6))
    before = {k: v.clone() for k, v in atk._memory["params"].items()}
    asr = atk.train_generator(forward, flat, x, 0.3)
    # the transcription: one step on the whole (single) batch
    p = {k: v.clone().requires_grad_(True) for k, v in before.items()}
    loss = _authors_loss(p, flat, forward, x, 0.3, 1)
    grads = torch.autograd.grad(loss, list(p.values()))
    for (k, v), g in zip(before.items(), grads):
        if optimizer == "sgd":  # torch SGD, momentum 0.9, weight decay 1e-4: the first step is a plain one
            want = v - lr * (g + 1e-4 * v)
            assert torch.allclose(atk._memory["params"][k], want, atol=1e-6), k
        else:  # Adam's first step: m̂ = g, v̂ = g², so lr·g/(|g| + 1e-8), a step of ±lr where g ≠ 0
            want = v - lr * g / (g.abs() + 1e-8)
            # (a conv bias followed by the normalisation has a zero gradient up to rounding, where
            # the sign of that rounding decides Adam's step: compared where the gradient is real)
            real = g.abs() > 1e-5
            assert bool(real.any()) or k.endswith(".bias"), k
            assert torch.allclose(atk._memory["params"][k][real], want[real], atol=1e-6), k
    # the returned ASR is that of the stepped generator on every item
    p2 = atk._memory["params"]
    img = x.reshape(6, 1, 4, 4)
    out = forward(flat, torch.clamp(img + 0.3 * generate(p2, img), 0, 1).reshape(6, 16))
    assert asr == pytest.approx(float((out.argmax(1) == 1).float().mean()))


def test_generator_training_stops_at_stop_asr():
    # a model that sends everything to class 1: the ASR is 1 before any step, so with stop_asr
    # nothing is trained, without it every epoch runs
    def forward(flat, x):
        return torch.tensor([0.0, 5.0, 0.0]).expand(x.shape[0], 3) + 0 * x.sum(1, keepdim=True)

    x = torch.rand(4, 16)
    for stop, changed in ((0.7, False), (None, True)):
        atk = _built(IBA(target=1, image_shape=(4, 4), width=2, stop_asr=stop, epochs=2, lr=0.5))
        before = {k: v.clone() for k, v in atk._memory["params"].items()}
        assert atk.train_generator(forward, torch.zeros(1), x, 0.3) == 1.0
        same = all(torch.equal(before[k], v) for k, v in atk._memory["params"].items())
        assert same != changed  # weight decay moves the weights even at zero loss gradient


# ---------------------------------------------------------------- PGD
def test_projection_keeps_a_row_on_the_ball_and_scales_one_outside_onto_it():
    g = torch.tensor([1.0, -2.0])
    rows = torch.stack([g + torch.tensor([0.6, 0.8]),     # ‖·‖ = 1: on the boundary, stays
                        g + torch.tensor([3.0, 4.0]),     # ‖·‖ = 5: scaled by 1/5
                        g + torch.tensor([0.3, 0.0])])    # inside
    out = IBA(radius=1.0).projector(1.0)(rows, g)
    assert torch.equal(out[0], rows[0]) and torch.equal(out[2], rows[2])
    assert torch.allclose(out[1], g + torch.tensor([0.6, 0.8]), atol=1e-6)
    assert float(torch.linalg.vector_norm(out[1] - g)) == pytest.approx(1.0, abs=1e-6)


def test_projection_frequency_follows_the_authors_rule():
    # k = 3 over 5 steps: projected after steps 0 and 3 (t mod 3 = 0) and 4 (the last), not 1 and 2
    proj = IBA(radius=1.0, project_frequency=3, steps=5).projector(1.0)
    g = torch.zeros(2)
    far = torch.tensor([[3.0, 4.0]])
    hit = [not torch.equal(proj(far, g), far) for _ in range(5)]
    assert hit == [True, False, False, True, True]


def test_radius_and_eps_schedules():
    atk = IBA(eps=0.4, eps_min=0.1, eps_decay=0.5, radius=2.0, radius_decay=0.5)
    assert atk.eps_at(7) == 0.4 and atk.radius_at(7) == 2.0  # before poisoning starts
    atk._memory["start"] = 2
    assert atk.eps_at(2) == 0.4 and atk.eps_at(3) == pytest.approx(0.2) and atk.eps_at(4) == pytest.approx(0.1)
    assert atk.eps_at(9) == 0.1  # the floor eps_min
    assert atk.radius_at(5) == pytest.approx(2.0 * 0.5 ** 3)
    assert IBA(radius=None).radius_at(3) is None and IBA(radius="none").radius_at(3) is None


# ---------------------------------------------------------------- poisoned share of a batch
@pytest.mark.parametrize("frac,b,k", [(0.3125, 10, 3), (0.5, 16, 8), (0.29, 100, 29), (1.0, 4, 4), (0.1, 5, 0)])
def test_poison_batch_replaces_the_first_floor_pb_items(frac, b, k):
    atk = _built(IBA(target=7, poison_fraction=frac, image_shape=(8, 8)), (64,))
    x = torch.rand(2, b, 64, generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 7, (2, b), generator=torch.Generator().manual_seed(3))
    px, py = atk.poisoner(0.3)(x, y)
    assert px.shape == x.shape and py.dtype == y.dtype
    assert torch.equal(py[:, :k], torch.full((2, k), 7)) and torch.equal(py[:, k:], y[:, k:])
    assert torch.equal(px[:, k:], x[:, k:])
    if k:
        assert torch.equal(px[:, :k], atk.apply(x[:, :k].reshape(-1, 64), eps=0.3).reshape(2, k, 64))
        assert bool((px[:, :k] != x[:, :k]).any())


def test_poison_batch_keeps_an_image_layout():
    atk = _built(IBA(poison_fraction=0.5), (1, 4, 4))
    x = torch.rand(3, 4, 1, 4, 4)
    px, py = atk.poisoner(0.2)(x, torch.ones(3, 4, dtype=torch.long))
    assert px.shape == x.shape and torch.equal(py[:, :2], torch.zeros(3, 2, dtype=torch.long))
    assert float((px - x).abs().max()) <= 0.2


def test_targeted_test_triggers_the_non_target_images():
    atk = IBA(target=2, image_shape=(4, 4))
    x, y = torch.rand(6, 16), torch.tensor([2, 0, 1, 2, 5, 3])
    tx, ty = atk.targeted_test(x, y)  # before any generator: the clean images
    assert torch.equal(tx, x[[1, 2, 4, 5]]) and torch.equal(ty, torch.full((4,), 2))
    _built(atk)
    atk._memory["eps"] = 0.15
    tx, ty = atk.targeted_test(x, y)
    assert torch.equal(tx, atk.apply(x[[1, 2, 4, 5]], eps=0.15)) and torch.equal(ty, torch.full((4,), 2))


# ---------------------------------------------------------------- the round
def test_the_two_phases_and_determinism():
    ctx = make_attack_context(0, 6, 2, 40, model=True)
    # first phase: the generator trains but the attackers train honestly until it reaches start_asr
    waiting = IBA(start_asr=1.0, epochs=1)
    assert waiting.training_hook(ctx) is None
    assert waiting._memory["start"] is None and len(waiting._memory["trained"]) == 1
    # start_asr = 0 (BackFed): poisoning from the first round
    a, b = IBA(start_asr=0.0, epochs=1), IBA(start_asr=0.0, epochs=1)
    ha = a.training_hook(dataclasses.replace(ctx, generator=torch.Generator().manual_seed(9)))
    hb = b.training_hook(dataclasses.replace(ctx, generator=torch.Generator().manual_seed(9)))
    assert ha.poison_batch is not None and ha.project is not None and a._memory["start"] == 0
    for k, v in a._memory["params"].items():  # same seed, same generator
        assert torch.equal(v, b._memory["params"][k])
    # retrain_every = 2: retrained in rounds 0 and 2 of the poisoning phase, not in round 1
    for r in (1, 2):
        a.training_hook(dataclasses.replace(ctx, round=r, generator=torch.Generator().manual_seed(9)))
    assert [r for r, _ in a._memory["trained"]] == [0, 2]
    # a new run (a fresh attack_state) starts a fresh generator
    a.training_hook(dataclasses.replace(ctx, attack_state={}, generator=torch.Generator().manual_seed(4)))
    assert [r for r, _ in a._memory["trained"]] == [0]


def test_a_federation_runs_iba_and_scores_the_current_trigger():
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    sc = parse_scenario({"scenario": {"seed": 0}, "workload": {"name": "digits"},
                         "federation": {"clients": 6, "malicious_fraction": 0.34, "rounds": 2, "local_steps": 2},
                         "attack": {"name": "iba", "start_asr": 0.0, "epochs": 1, "width": 4, "retrain_every": 1}})
    fed = Federation(sc)
    res = fed.run()
    assert fed.attack.image_shape in ([8, 8], (8, 8))  # filled in from the workload
    assert [r for r, _ in fed.attack._memory["trained"]] == [0, 1] and fed.attack._memory["start"] == 0
    assert all("asr" in r.extra for r in res.records)


# ---------------------------------------------------------------- parameters
@pytest.mark.parametrize("params,field", [
    ({"eps": 0}, "eps"), ({"eps": 0.1, "eps_min": 0.2}, "eps_min"), ({"eps_decay": 1.0}, "eps_decay"),
    ({"input_range": (1.0, 0.0)}, "input_range"), ({"image_shape": (0, 8)}, "image_shape"),
    ({"width": 0}, "width"), ({"optimizer": "rmsprop"}, "optimizer"), ({"lr": -1.0}, "lr"),
    ({"epochs": 0}, "epochs"), ({"batch": 0}, "batch"), ({"stop_asr": 1.5}, "stop_asr"),
    ({"start_asr": -0.1}, "start_asr"), ({"retrain_every": 0}, "retrain_every"),
    ({"poison_fraction": 0.0}, "poison_fraction"), ({"local_lr": math.inf}, "local_lr"), ({"steps": 0}, "steps"),
    ({"radius": -1.0}, "radius"), ({"radius": "off"}, "radius"), ({"radius_decay": 1.0}, "radius_decay"),
    ({"target": -1}, "target"),
    ({"project_frequency": 2}, "project_frequency"), ({"project_frequency": 0}, "project_frequency"),
])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(InvalidParameter, match=rf"IBA\.{field} = "):
        IBA(**params)


def test_a_target_outside_the_model_is_refused_at_the_first_round():
    ctx = make_attack_context(0, 6, 2, 40, model=True, num_classes=10)
    with pytest.raises(InvalidParameter, match=r"IBA\.target = 10: must be a class of the model \(0 … 9\)"):
        IBA(target=10).training_hook(ctx)


def test_generator_sizes():
    # width w on C channels: 3·3·C·w + 3·3·w·2w + 3·3·3w·w + w·C weights, biases, and a scale and
    # shift per normalised channel
    def count(c, w):
        return sum(v.numel() for v in init_generator(c, w, torch.Generator()).values())

    assert count(1, 16) == 9 * 16 + 9 * 16 * 32 + 9 * 48 * 16 + 16 + 3 * (16 + 32 + 16 + 1)
    assert count(3, 8) == 9 * 3 * 8 + 9 * 8 * 16 + 9 * 24 * 8 + 8 * 3 + 3 * (8 + 16 + 8 + 3)


def test_contract_kit():
    check_attack("iba")
