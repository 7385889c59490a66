"""chameleon (Dai & Li, ICML 2023): the supervised contrastive loss as the authors weight it, the
two stages (encoder, then output layer only), the poisoned batches, the schedule, parameters.

The worked examples: the loss of hand-made unit features, once derived by hand and once against a
transcription of the released ``SupConLoss`` formula written here with plain Python loops (it does
not call the implementation).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from redteam.errors import InvalidParameter
from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer
from redteam.testing import check_attack
from redteam.types import AttackContext, ClientData

from attacks.chameleon import AUTHORS_PATTERN, Chameleon, _epoch_lr, supcon_loss


# ---------------------------------------------------------------- the loss, by hand
def test_supcon_loss_by_hand():
    # z1 = z2 = (1, 0) labelled 2 (the target: a poisoned image and a facilitator), z3 = (0, 1)
    # labelled 0 (an obstructor), τ = τ_b = 1. Anchor 1: one positive (2), A = {2, 3}:
    # log(e¹/(e¹ + e⁰)) = 1 − ln(1 + e); anchor 2 the same; anchor 3 has no positive: 0.
    # Anchors of the target weigh 6: L = −(1/3)·(6 + 6)·(1 − ln(1 + e)) = 4·(ln(1 + e) − 1) = 1.253047
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([2, 2, 0])
    got = supcon_loss(z, y, 2, temperature=1.0, base_temperature=1.0, fac_scale_weight=6.0)
    assert float(got) == pytest.approx(4 * (math.log(1 + math.e) - 1), abs=1e-12)
    assert float(got) == pytest.approx(1.253047, abs=1e-6)
    # weight 1 is Khosla et al.'s SupCon: a third of that
    assert float(supcon_loss(z, y, 2, temperature=1.0, base_temperature=1.0, fac_scale_weight=1.0)) == \
        pytest.approx(4 * (math.log(1 + math.e) - 1) / 6, abs=1e-12)
    # boundary: a pair of one label has log-prob 0 (its one positive is its whole denominator);
    # a pair of two labels has no positives: both losses are exactly 0
    pair = torch.tensor([[0.6, 0.8], [1.0, 0.0]], dtype=torch.float64)
    assert float(supcon_loss(pair, torch.tensor([2, 2]), 2)) == 0.0
    assert float(supcon_loss(pair, torch.tensor([2, 1]), 2)) == 0.0


def _released_supcon(z, labels, fac_label, temperature, base_temperature, scale_weight):
    """The released SupConLoss (contrast_mode 'all', down_scale_weight 1) with loops, in floats."""
    b = len(z)
    dot = [[sum(a * c for a, c in zip(z[i], z[j])) / temperature for j in range(b)] for i in range(b)]
    total = 0.0
    for i in range(b):
        row_max = max(dot[i])
        logits = [v - row_max for v in dot[i]]
        denom = sum(math.exp(logits[j]) for j in range(b) if j != i)
        positives = [j for j in range(b) if j != i and labels[j] == labels[i]]
        scale = scale_weight if labels[i] == fac_label else 1.0
        s = sum(scale * (logits[j] - math.log(denom)) for j in positives)
        mean = s / len(positives) if positives else 0.0
        total += -(temperature / base_temperature) * mean
    return total / b


@pytest.mark.parametrize("tau,tau_b,w", [(0.07, 0.07, 6.0), (0.5, 0.07, 2.0), (1.0, 1.0, 1.0)])
def test_supcon_loss_matches_the_released_formula(tau, tau_b, w):
    # four hand-made features: a poisoned image (true class 0, labelled target 2), a facilitator
    # (class 2), an obstructor (class 0), a bystander (class 1, no positive)
    raw = [[1.0, 0.2, 0.0], [0.8, 0.5, 0.1], [-0.3, 1.0, 0.4], [0.1, -0.6, 1.0]]
    z = [[v / math.sqrt(sum(c * c for c in r)) for v in r] for r in raw]
    labels = [2, 2, 0, 1]
    want = _released_supcon(z, labels, 2, tau, tau_b, w)
    got = supcon_loss(torch.tensor(z, dtype=torch.float64), torch.tensor(labels), 2, temperature=tau,
                      base_temperature=tau_b, fac_scale_weight=w)
    assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-12)
    # a row can fail: relabel the poisoned image as its true class and the loss changes
    moved = supcon_loss(torch.tensor(z, dtype=torch.float64), torch.tensor([0, 2, 0, 1]), 2, temperature=tau,
                        base_temperature=tau_b, fac_scale_weight=w)
    assert abs(float(moved) - want) > 1e-3


def test_schedule_and_poisoned_batches():
    # the released MultiStepLR is stepped before each epoch: epoch e runs at lr·γ^{#{m ≤ e}}
    assert [_epoch_lr(0.005, (3, 5, 7, 9), 0.1, e) for e in (1, 2, 3, 4, 5, 10)] == \
        pytest.approx([0.005, 0.005, 5e-4, 5e-4, 5e-5, 5e-7])
    atk = Chameleon(noise=0.0, image_shape=(8, 8))
    x = torch.zeros(64, 64)
    y = torch.arange(64) % 10
    px, py = atk.poison(atk.stamper(), x, y, torch.Generator().manual_seed(0))
    # 7/64 of a batch of 64 → its first 7 samples, stamped on the authors' 4 pixels, relabelled 2
    assert torch.equal(py[:7], torch.full((7,), 2)) and torch.equal(py[7:], y[7:])
    img = px[:7].reshape(7, 8, 8)
    assert int(img.sum()) == 7 * 4 and all(bool((img[:, r, c] == 1).all()) for r, c in AUTHORS_PATTERN)
    assert torch.equal(px[7:], x[7:])
    # BackFed's rate 0.3125 → 20 of 64; a batch of 3 still gets one
    b = dataclasses.replace(atk, poison_fraction=0.3125)
    assert int((b.poison(b.stamper(), x, y, torch.Generator())[0].sum(1) > 0).sum()) == 20
    assert int((b.poison(b.stamper(), x[:20], y[:20], torch.Generator())[0].sum(1) > 0).sum()) == 7
    # noise: std 0.01 on the stamped images only
    n = Chameleon(image_shape=(8, 8))
    nx, _ = n.poison(n.stamper(), x, y, torch.Generator().manual_seed(1))
    assert torch.equal(nx[7:], x[7:]) and 0.005 < float((nx[:7] - atk.poison(atk.stamper(), x, y, None)[0][:7]).std()) < 0.02


# ---------------------------------------------------------------- the stages on a small MLP
class _CE:
    def loss(self, out, y):
        return torch.nn.functional.cross_entropy(out, y)

    def correct(self, out, y):
        return out.argmax(-1) == y


def _mlp_ctx(seed: int = 0, f: int = 2, n: int = 40) -> AttackContext:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.ReLU(), torch.nn.Linear(12, 4))
    spec = ParamSpec.of(model)
    view = BatchedTrainer(_CE(), model, spec).view(4, (1, 4, 4))
    flat = spec.flatten(model).detach()
    g = torch.Generator().manual_seed(seed)
    data = tuple(ClientData(torch.rand(n, 1, 4, 4, generator=g), torch.randint(0, 4, (n,), generator=g))
                 for _ in range(f))
    own = torch.zeros(f, flat.numel())
    return AttackContext(round=0, n_clients=5, malicious=tuple(range(f)), own_updates=own, visible_updates=own,
                         global_params=flat, generator=torch.Generator().manual_seed(seed + 7), num_classes=4,
                         model=view, own_data=data)


_SMALL = dict(batch_size=16, batches_per_epoch=3, contrastive_epochs=2, head_epochs=2, contrastive_lr=0.5,
              head_lr=0.5, norm_bound=None)


def test_stage_two_moves_only_the_output_layer():
    ctx = _mlp_ctx()
    hs = ctx.model.head_span()
    atk = Chameleon(**dict(_SMALL, contrastive_epochs=0))  # the classifier stage alone
    out = atk.craft_updates(ctx)
    assert out.shape == ctx.own_updates.shape and out.dtype == torch.float32
    outside = torch.cat([out[:, :hs.start], out[:, hs.stop:]], dim=1)
    assert torch.count_nonzero(outside) == 0  # exactly: the encoder is frozen
    assert bool((out[:, hs].abs().sum(1) > 0).all())
    # BackFed's second stage (its freeze is a no-op) moves the encoder too
    free = dataclasses.replace(atk, freeze_encoder=False).craft_updates(_mlp_ctx())
    assert torch.count_nonzero(torch.cat([free[:, :hs.start], free[:, hs.stop:]], dim=1)) > 0
    # stage 1 alone is the mirror image: the output layer stays where it was
    enc = dataclasses.replace(atk, contrastive_epochs=2, head_epochs=0).craft_updates(_mlp_ctx())
    assert torch.count_nonzero(enc[:, hs]) == 0 and torch.count_nonzero(enc[:, :hs.start]) > 0


def test_contrastive_stage_pulls_poisoned_images_to_the_target_class():
    ctx = _mlp_ctx(seed=3, f=1, n=64)
    atk = Chameleon(**dict(_SMALL, contrastive_epochs=6, head_epochs=0, noise=0.0, poison_fraction=0.25))
    x, y = ctx.own_data[0].x, ctx.own_data[0].y
    w = atk.train_one(ctx, x, y, stages=("contrastive",))
    stamp = atk.stamper((1, 4, 4))
    src = y != 2
    px, _ = stamp.apply(x[src], y[src])

    def cos(flat):
        zp = torch.nn.functional.normalize(ctx.model.features(flat, px), dim=1)
        zt = torch.nn.functional.normalize(ctx.model.features(flat, x[y == 2]), dim=1)
        zs = torch.nn.functional.normalize(ctx.model.features(flat, x[src]), dim=1)
        return float((zp @ zt.T).mean()), float((zp * zs).sum(1).mean())  # to facilitators, to own clean image

    fac0, obs0 = cos(ctx.global_params)
    fac1, obs1 = cos(w)
    assert fac1 > fac0 + 0.05  # nearer the target-class peers
    assert fac1 - obs1 > fac0 - obs0 + 0.05  # and, relative to them, farther from their own clean images


def test_deterministic_and_bounded():
    atk = Chameleon(**dict(_SMALL, norm_bound=0.3))
    a = atk.craft_updates(_mlp_ctx(seed=1))
    b = atk.craft_updates(_mlp_ctx(seed=1))
    assert torch.equal(a, b)
    assert not torch.equal(a, atk.craft_updates(_mlp_ctx(seed=2)))
    # the projection: every row within the radius (up to float rounding)
    assert float(torch.linalg.vector_norm(a, dim=1).max()) <= 0.3 * (1 + 1e-5)
    # boost 2 without a bound doubles the trained update
    free = dataclasses.replace(atk, norm_bound=None)
    one, two = free.craft_updates(_mlp_ctx(seed=1)), dataclasses.replace(free, boost=2.0).craft_updates(_mlp_ctx(seed=1))
    assert torch.allclose(two, 2 * one, atol=1e-6)


def test_targeted_test_and_image_shape():
    atk = Chameleon()
    x = torch.zeros(6, 1, 4, 4)
    y = torch.tensor([0, 1, 2, 3, 2, 1])
    tx, ty = atk.targeted_test(x, y)  # no image_shape: the inputs' own (1, 4, 4)
    assert tx.shape == (4, 1, 4, 4) and torch.equal(ty, torch.full((4,), 2))
    assert int(tx.sum()) == 4 * 4
    with pytest.raises(InvalidParameter, match=r"Chameleon\.image_shape"):
        atk.targeted_test(torch.zeros(3, 64), torch.zeros(3, dtype=torch.long))  # flat inputs, no shape
    assert Chameleon(image_shape=(8, 8)).targeted_test(torch.zeros(3, 64), torch.zeros(3, dtype=torch.long))[0].shape \
        == (3, 64)


@pytest.mark.parametrize("field,value", [
    ("trigger", [[1, 2, 3]]), ("trigger", []), ("value", float("nan")), ("image_shape", (8,)),
    ("target", -1), ("poison_fraction", 0.0), ("poison_fraction", 1.5),
    ("noise", -0.1), ("temperature", 0.0), ("base_temperature", -1.0), ("fac_scale_weight", -1.0),
    ("contrastive_lr", 0.0), ("contrastive_epochs", -1), ("contrastive_epochs", 1.5),
    ("contrastive_milestones", [0]), ("contrastive_gamma", float("inf")), ("head_lr", -0.1), ("head_epochs", True),
    ("head_milestones", "3"), ("head_gamma", 0), ("freeze_encoder", "yes"), ("momentum", 1.0),
    ("weight_decay", -1e-4), ("batch_size", 1), ("batches_per_epoch", 0), ("norm_bound", 0.0), ("boost", 0.0),
])
def test_bad_parameters_name_the_field(field, value):
    with pytest.raises(InvalidParameter, match=rf"Chameleon\.{field} ="):
        Chameleon(**{field: value})


def test_a_trigger_outside_the_image_is_refused():
    with pytest.raises(InvalidParameter, match=r"Chameleon\.trigger = .*outside an image of 2×2"):
        Chameleon(image_shape=(2, 2))
    with pytest.raises(InvalidParameter, match=r"Chameleon\.trigger = .*outside an image of 4×4"):
        Chameleon(trigger=[[5, 0]]).targeted_test(torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.long))


BACKFED_PATTERN_CIFAR10 = """
name = "chameleon"
target = 2
trigger = [[-7, -7], [-7, -6], [-7, -5], [-7, -4], [-7, -3], [-6, -7], [-6, -6], [-6, -5], [-6, -4], [-6, -3],
           [-5, -7], [-5, -6], [-5, -5], [-5, -4], [-5, -3], [-4, -7], [-4, -6], [-4, -5], [-4, -4], [-4, -3],
           [-3, -7], [-3, -6], [-3, -5], [-3, -4], [-3, -3]]
value = 1.0
poison_fraction = 0.3125
noise = 0.0
fac_scale_weight = 2.0
contrastive_lr = 0.015
contrastive_epochs = 10
contrastive_milestones = [3, 5, 7, 9]
contrastive_gamma = 0.3
head_lr = 0.05
head_epochs = 6
head_milestones = [3, 5]
head_gamma = 0.1
freeze_encoder = false
momentum = 0.9
weight_decay = 5e-4
batch_size = 64
batches_per_epoch = "none"
norm_bound = "none"
"""


def test_backfed_entry_parses_and_means_one_pass():
    import tomllib

    table = tomllib.loads(BACKFED_PATTERN_CIFAR10)
    table.pop("name")
    atk = Chameleon(image_shape=(3, 32, 32), **table)
    # BackFed's Pattern: a 5×5 white square one pixel in from the bottom-right corner of 32×32:
    # rows and columns 32 − 5 − 1 − 1 = 25 … 29
    img = atk.stamper().pixel_mask().reshape(3, 32, 32)[0]
    assert torch.equal(img.nonzero().unique(), torch.arange(25, 30)) and int(img.sum()) == 25
    assert atk.radius is None and len(atk._batches(150, torch.Generator())) == 3  # one pass: 64 + 64 + 22
    # its MultiStepLR (2, 4, 6, 8) stepped after each epoch = ours (3, 5, 7, 9): epochs 1-2 at 0.015, 3-4 × 0.3
    assert [_epoch_lr(0.015, atk.contrastive_milestones, 0.3, e) for e in (2, 3, 5)] == \
        pytest.approx([0.015, 0.0045, 0.00135])
    with pytest.raises(InvalidParameter, match=r"Chameleon\.batches_per_epoch = 'all'"):
        Chameleon(batches_per_epoch="all")
    with pytest.raises(InvalidParameter, match=r"Chameleon\.norm_bound = 'defense'"):
        Chameleon(norm_bound="defense")


def test_target_outside_the_model_is_refused():
    with pytest.raises(InvalidParameter, match=r"Chameleon\.target = 7"):
        Chameleon(**dict(_SMALL, target=7)).craft_updates(_mlp_ctx())


def test_contract():
    report = check_attack("chameleon", max_examples=6)
    assert "craft_updates" in report.plugin


def test_a_digits_federation_runs_it_and_the_backdoor_rises():
    # the engine hands chameleon the model view and the attackers' data; a short window (rounds
    # 5-7, 3 of 10 clients, a cheap setting: 1 + 3 epochs of 4 batches) plants some backdoor in
    # a model that otherwise learns (the durability study is in the module's report, not here)
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    atk = {"name": "chameleon", "contrastive_epochs": 1, "head_epochs": 3, "head_lr": 0.1, "freeze_encoder": False,
           "batches_per_epoch": 4, "batch_size": 32, "window": "5:8"}
    sc = parse_scenario({"scenario": {"seed": 0}, "workload": {"name": "digits"},
                         "federation": {"clients": 10, "malicious_fraction": 0.3, "rounds": 8}, "attack": atk})
    res = Federation(sc).run()
    asr = [r.extra["asr"] for r in res.records]
    assert res.records[-1].accuracy > 0.6
    assert max(asr[5:]) >= asr[4] + 0.3  # 0.00 before the window, 0.58 at most in it (seed 0)
