"""A3FL (Zhang et al., NeurIPS 2023): the adversarially adaptive trigger (attacks/a3fl.py).

Worked examples:

* one trigger step on a two-pixel, two-class linear classifier, derived by hand (the sign of the
  gradient, the untouched pixel outside the mask, sign(0) = 0, the clamp), and the adversarial
  copy's term flipping the step at the λ where the two gradients cancel;
* the same step and the adversarial copy on a random linear model, against a transcription in
  this file of the authors' ``search_trigger`` / ``get_adv_model`` (github.com/hfzhang31/A3FL,
  fl_utils/attacker.py) written with ``torch.nn`` modules and ``torch.optim.SGD``;
* the on-the-fly poisoning (⌊f·B⌋ items per batch, flat and (C, H, W) layouts), the ASR test set,
  the search's schedule (copies rebuilt every ``adv_every`` epochs, never at epoch 0; BackFed's stop
  rule), the warm start across rounds, the contract kit, and bad parameters.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from redteam.errors import InvalidParameter
from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer
from redteam.testing import check_attack, make_attack_context
from redteam.testing.builders import toy_model_view

from attacks.a3fl import A3FL


class _CE:
    def loss(self, out, y):
        return torch.nn.functional.cross_entropy(out, y)

    def correct(self, out, y):
        return out.argmax(-1) == y


def _view(model: torch.nn.Module, classes: int, shape: tuple[int, ...]):
    return BatchedTrainer(_CE(), model, ParamSpec.of(model)).view(classes, shape)


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


# ---- one trigger step by hand --------------------------------------------------------------
# Images of 1×1×2 pixels; the trigger is pixel 0 (size 1 at (0, 0)). The classifier
# z = W x + b with W = [[0, 0], [a, 0]], b = 0: class 1 reads pixel 0 with weight a, class 0 reads
# nothing. Target 1. On the stamped item x' = (t₀, x₁): z = (0, a·t₀), p₁ = σ(a·t₀), and
# ∂CE/∂t₀ = (p₁ − 1)·a. For a = 1, t₀ = 0.5: p₁ = σ(0.5) = 0.6225, ∂ = −0.3775 < 0, so
# t₀ ← 0.5 − α·sign(−0.3775) = 0.5 + α = 0.51. Pixel 1 is outside the mask: gradient 0, unchanged.

def _hand_view():
    return _view(torch.nn.Linear(2, 2), 2, (2,))


def _flat(a: float) -> torch.Tensor:
    # flat layout: weight (2 × 2, row-major), then bias (2)
    return torch.tensor([0.0, 0.0, a, 0.0, 0.0, 0.0], dtype=torch.float64)


HAND = dict(target=1, trigger_size=1, trigger_position=(0, 0), image_shape=(1, 1, 2), trigger_lr=0.01)
X1 = torch.tensor([[0.2, 0.7]], dtype=torch.float64)
Y1 = torch.tensor([0])


def test_trigger_step_by_hand():
    a = A3FL(**HAND)
    t0 = torch.tensor([0.5, 0.5], dtype=torch.float64)
    new, hits = a.trigger_step(_hand_view(), _flat(1.0), t0, X1, Y1)
    assert new.tolist() == pytest.approx([0.51, 0.5], abs=1e-12)
    assert hits == 1  # z = (0, 0.5): argmax 1 = the target
    # a pixel whose gradient is exactly 0 does not move (sign(0) = 0): a = 0 reads nothing
    same, hits0 = a.trigger_step(_hand_view(), _flat(0.0), t0, X1, Y1)
    assert same.tolist() == [0.5, 0.5]
    assert hits0 == 0  # z = (0, 0): a tie; argmax takes the first class, 0 ≠ target 1
    # clamp on the boundary: with hi = 0.5 the step up to 0.51 stays at exactly 0.5
    capped, _ = a.trigger_step(_hand_view(), _flat(1.0), t0, X1, Y1, bounds=(0.0, 0.5))
    assert capped.tolist() == [0.5, 0.5]
    # a negative weight: ∂ = (σ(−0.5) − 1)·(−1) = 0.6225 > 0, so t₀ goes down to 0.49
    down, _ = a.trigger_step(_hand_view(), _flat(-1.0), t0, X1, Y1)
    assert down.tolist() == pytest.approx([0.49, 0.5], abs=1e-12)


def test_adversarial_term_flips_the_step_at_the_hand_threshold():
    # copy θ' with a = −3: p₁' = σ(−1.5) = 0.18243, ∂' = (p₁' − 1)·(−3) = 2.45272. The step is the
    # sign of ∂ + λ·w·∂' (K = 1 copy): with w = 1 it flips where λ = 0.37754 / 2.45272 = 0.15393.
    main = (_sigmoid(0.5) - 1.0) * 1.0
    adv = (_sigmoid(-1.5) - 1.0) * -3.0
    assert main == pytest.approx(-0.377541, abs=1e-6) and adv == pytest.approx(2.452723, abs=1e-6)
    lam_star = -main / adv
    assert lam_star == pytest.approx(0.153927, abs=1e-6)
    t0 = torch.tensor([0.5, 0.5], dtype=torch.float64)
    copies = [(_flat(-3.0), 1.0)]
    for lam, expect in ((0.01, 0.51), (0.15, 0.51), (0.16, 0.49), (0.2, 0.49)):
        new, _ = A3FL(**HAND, adv_lambda=lam).trigger_step(_hand_view(), _flat(1.0), t0, X1, Y1, copies)
        assert float(new[0]) == pytest.approx(expect, abs=1e-12), lam
    # the weight w scales the copy's term the same way: λ = 0.2 with w = 0.5 is λw = 0.1 < λ*
    new, _ = A3FL(**HAND, adv_lambda=0.2).trigger_step(_hand_view(), _flat(1.0), t0, X1, Y1, [(_flat(-3.0), 0.5)])
    assert float(new[0]) == pytest.approx(0.51, abs=1e-12)


# ---- the authors' update, transcribed ----------------------------------------------------------

IMG = (1, 3, 3)
PARAMS = dict(target=2, trigger_size=2, trigger_position=(1, 1), image_shape=IMG, trigger_lr=0.01,
              adv_lambda=0.3, adv_lr=0.05, adv_momentum=0.9, adv_weight_decay=5e-4, search_batch=64)


def _random_setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(9, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    x = torch.rand(10, *IMG, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (10,), generator=g)
    return model, x, y


def _authors_mask():
    m = torch.zeros(1, *IMG, dtype=torch.float64)
    m[:, :, 1:3, 1:3] = 1  # mask[:, :, 2:2+size, 2:2+size] with our position (1, 1)
    return m


def _authors_step(model, adv_model, adv_w, lam, count, t, x, y, target, alpha):
    # fl_utils/attacker.py, Attacker.search_trigger, the body of `for inputs, labels in dl:`
    m = _authors_mask()
    ce = torch.nn.CrossEntropyLoss()
    t = t.clone().requires_grad_()
    inputs = t * m + (1 - m) * x
    labels = y.clone()
    labels[:] = target
    loss = ce(model(inputs), labels)
    if adv_model is not None:
        loss = loss + lam * adv_w * ce(adv_model(inputs), labels) / count
    loss.backward()
    new_t = t - alpha * t.grad.sign()
    return torch.clamp(new_t.detach(), min=-2, max=2)


def test_trigger_step_matches_the_authors_update():
    model, x, y = _random_setup(0)
    adv_model, _, _ = _random_setup(1)
    a = A3FL(**PARAMS)
    view = _view(model, 3, IMG)
    flat_g = ParamSpec.of(model).flatten(model).double()
    flat_adv = ParamSpec.of(adv_model).flatten(adv_model).double()
    t = torch.full((9,), 0.5, dtype=torch.float64)
    for w in (0.7, -0.4):
        ours, _ = a.trigger_step(view, flat_g, t, x, y, [(flat_adv, w)], bounds=(-2.0, 2.0))
        theirs = _authors_step(model, adv_model, w, PARAMS["adv_lambda"], 1, t.reshape(1, *IMG), x, y, 2, 0.01)
        assert torch.equal(ours, theirs.reshape(-1))
        # only the 2×2 patch moved, each pixel by exactly α
        moved = (ours - t).abs().reshape(IMG)
        assert torch.allclose(moved[0, 1:, 1:], torch.full((2, 2), 0.01, dtype=torch.float64))
        assert float(moved[0, 0].abs().sum() + moved[0, :, 0].abs().sum()) == 0.0
    # several steps in a row stay equal, the clamp included (α = 0.5 reaches ±2 quickly)
    big = A3FL(**{**PARAMS, "trigger_lr": 0.5})
    ours_t, theirs_t = t.clone(), t.reshape(1, *IMG).clone()
    for _ in range(6):
        ours_t, _ = big.trigger_step(view, flat_g, ours_t, x, y, bounds=(-2.0, 2.0))
        theirs_t = _authors_step(model, None, 0, 0, 1, theirs_t, x, y, 2, 0.5)
    assert torch.equal(ours_t, theirs_t.reshape(-1))
    assert float(ours_t.abs().max()) == 2.0


def _authors_adv_model(model, x, y, t, epochs, lr, momentum, wd):
    # fl_utils/attacker.py, Attacker.get_adv_model (one batch per epoch: the dataloader holds x)
    adv_model = copy.deepcopy(model)
    adv_model.train()
    ce = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(adv_model.parameters(), lr=lr, momentum=momentum, weight_decay=wd)
    m = _authors_mask()
    for _ in range(epochs):
        inputs = t * m + (1 - m) * x
        loss = ce(adv_model(inputs), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return adv_model


@pytest.mark.parametrize("epochs", [1, 3])
def test_adversarial_copy_matches_the_authors_sgd(epochs):
    model, x, y = _random_setup(2)
    a = A3FL(**PARAMS, adv_epochs=epochs, adv_weight="params")
    view = _view(model, 3, IMG)
    spec = ParamSpec.of(model)
    flat_g = spec.flatten(model).double()
    t = torch.rand(9, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ours, w = a.adversarial_copy(view, flat_g, t, x, y, torch.Generator().manual_seed(0))
    theirs = _authors_adv_model(model, x, y, t.reshape(1, *IMG), epochs, 0.05, 0.9, 5e-4)
    flat_theirs = spec.flatten(theirs).double()
    assert torch.allclose(ours, flat_theirs, atol=1e-6, rtol=0)  # the view runs float32 parameters
    assert not torch.allclose(ours, flat_g)  # it moved
    # "params" (BackFed): cos of the weight matrices (the model has no convolution kernels)
    cos = torch.nn.functional.cosine_similarity(theirs[1].weight.detach().reshape(-1), model[1].weight.detach().reshape(-1), dim=0)
    assert w == pytest.approx(float(cos), abs=1e-6)
    # "grads" (the authors): cos of the copy's last gradient and the global model's accumulated one
    ref = torch.randn(flat_g.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    _, wg = A3FL(**PARAMS, adv_epochs=epochs, adv_weight="grads").adversarial_copy(
        view, flat_g, t, x, y, torch.Generator().manual_seed(0), grad_sum=ref)
    last = _authors_adv_model(model, x, y, t.reshape(1, *IMG), epochs - 1, 0.05, 0.9, 5e-4) if epochs > 1 else model
    probe = copy.deepcopy(last)
    m = _authors_mask()
    torch.nn.CrossEntropyLoss()(probe(t.reshape(1, *IMG) * m + (1 - m) * x), y).backward()
    ref_w = ref[view.span("1.weight")]
    cos_g = torch.nn.functional.cosine_similarity(probe[1].weight.grad.reshape(-1), ref_w, dim=0)
    assert wg == pytest.approx(float(cos_g), abs=1e-5)
    # "none": w = 1
    _, w1 = A3FL(**PARAMS, adv_epochs=epochs, adv_weight="none").adversarial_copy(
        view, flat_g, t, x, y, torch.Generator().manual_seed(0))
    assert w1 == 1.0


def test_grad_sum_accumulates_the_global_models_backdoor_gradient():
    model, x, y = _random_setup(3)
    view = _view(model, 3, IMG)
    flat_g = ParamSpec.of(model).flatten(model).double()
    acc = torch.zeros_like(flat_g)
    t = torch.full((9,), 0.5, dtype=torch.float64)
    A3FL(**PARAMS).trigger_step(view, flat_g, t, x, y, grad_sum=acc)
    probe = copy.deepcopy(model)
    m = _authors_mask()
    torch.nn.CrossEntropyLoss()(probe(t.reshape(1, *IMG) * m + (1 - m) * x), torch.full_like(y, 2)).backward()
    expect = torch.cat([probe[1].weight.grad.reshape(-1), probe[1].bias.grad])
    assert torch.allclose(acc, expect, atol=1e-6)


# ---- the search's schedule -------------------------------------------------------------------

@pytest.mark.parametrize("epochs, every, models, built", [
    (3, 1, 1, 2),   # rebuilt at epochs 1 and 2, never at 0 (the authors' `iter != 0`)
    (3, 2, 1, 1),   # epoch 2 only
    (2, 2, 1, 0),   # BackFed's dm_adv_K = outer epochs: never
    (3, 1, 2, 4),   # two copies each time
    (3, 1, 0, 0),   # no copies at all
])
def test_copies_are_rebuilt_every_adv_every_epochs(epochs, every, models, built):
    model, x, y = _random_setup(4)
    a = A3FL(**{**PARAMS, "outer_epochs": epochs, "adv_every": every, "adv_models": models, "adv_epochs": 1})
    _, info = a.search(_view(model, 3, IMG), ParamSpec.of(model).flatten(model).double(), x, y,
                       torch.Generator().manual_seed(0))
    assert info["copies"] == built and info["epochs"] == epochs


def test_stop_rule_stops_once_the_rate_exceeds_it():
    # the hand model with a = 5 labels every stamped item with the target at t₀ = 0.5 (z₁ = 2.5 > 0)
    x = torch.rand(6, 2, dtype=torch.float64)
    y = torch.zeros(6, dtype=torch.long)
    a = A3FL(**HAND, outer_epochs=5, stop_asr=0.7, search_batch=4)
    _, info = a.search(_hand_view(), _flat(5.0), x, y, torch.Generator().manual_seed(0))
    assert info["rate"] == 1.0 and info["epochs"] == 1
    # on the threshold: a = 0 gives ties (argmax 0 ≠ target 1), a rate of 0, and 0 > 0 is false
    _, info0 = A3FL(**HAND, outer_epochs=3, stop_asr=0.0).search(_hand_view(), _flat(0.0), x, y,
                                                                torch.Generator().manual_seed(0))
    assert info0["rate"] == 0.0 and info0["epochs"] == 3
    # without a stop rule the search runs every epoch
    _, full = A3FL(**HAND, outer_epochs=5).search(_hand_view(), _flat(5.0), x, y, torch.Generator().manual_seed(0))
    assert full["epochs"] == 5


def test_search_fraction_stamps_only_the_first_items_of_a_search_batch():
    # BackFed's search batches: only ⌊f·B⌋ items are stamped, the others keep their labels. With
    # one batch of 4 and f = 0.5, the two clean items are labelled 0 and the hand model's clean
    # logits are z = (0, a·x₀): hits count them as labelled.
    x = torch.tensor([[0.9, 0.0], [0.9, 0.0], [-0.9, 0.0], [-0.9, 0.0]], dtype=torch.float64)
    y = torch.zeros(4, dtype=torch.long)
    new, hits = A3FL(**HAND, search_fraction=0.5).trigger_step(
        _hand_view(), _flat(1.0), torch.tensor([0.5, 0.5], dtype=torch.float64), x, y)
    # stamped (t₀ = 0.5 → class 1 = target): 2 hits; clean x₀ = −0.9 → z = (0, −0.9) → class 0 = label: 2 hits
    assert hits == 4
    assert new.tolist() == pytest.approx([0.51, 0.5], abs=1e-12)


# ---- poisoning and the ASR test set ----------------------------------------------------------

@pytest.mark.parametrize("fraction, batch, k", [(0.3125, 7, 2), (0.5, 4, 2), (0.3125, 3, 0), (1.0, 5, 5),
                                                (0.25, 64, 16), (0.3125, 64, 20)])
def test_poison_batch_stamps_floor_fraction_items(fraction, batch, k):
    a = A3FL(target=3, trigger_size=2, trigger_position=(6, 6), image_shape=(8, 8), poison_fraction=fraction)
    trig = torch.arange(64, dtype=torch.float32) / 64
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, batch, 64, generator=g)
    y = torch.randint(0, 10, (2, batch), generator=g)
    x0, y0 = x.clone(), y.clone()
    px, py = a.poison_batch(x, y, trig)
    assert px.shape == x.shape and py.shape == y.shape and px.dtype == x.dtype and py.dtype == y.dtype
    assert torch.equal(py[:, :k], torch.full((2, k), 3)) and torch.equal(py[:, k:], y[:, k:])
    assert torch.equal(px[:, k:], x[:, k:])
    patch = torch.tensor([54, 55, 62, 63])  # rows 6-7, cols 6-7 of 8×8
    if k:
        assert torch.equal(px[:, :k][..., patch], trig[patch].expand(2, k, 4))
        rest = torch.ones(64, dtype=torch.bool)
        rest[patch] = False
        assert torch.equal(px[:, :k][..., rest], x[:, :k][..., rest])
    assert torch.equal(x, x0) and torch.equal(y, y0)  # the inputs were not written


def test_poison_batch_and_test_in_channel_layout():
    a = A3FL(target=1, trigger_size=2, trigger_position=(0, 1), image_shape=(3, 4, 4), poison_fraction=0.5)
    x = torch.zeros(1, 4, 3, 4, 4)
    y = torch.zeros(1, 4, dtype=torch.long)
    px, py = a.poison_batch(x, y, torch.full((48,), 0.7))
    expect = torch.zeros(3, 4, 4)
    expect[:, 0:2, 1:3] = 0.7
    assert torch.equal(px[0, 0], expect) and torch.equal(px[0, 1], expect) and torch.equal(px[0, 2:], x[0, 2:])
    assert py.tolist() == [[1, 1, 0, 0]]
    # the same images flattened give the same stamp
    pf, _ = a.poison_batch(x.reshape(1, 4, 48), y, torch.full((48,), 0.7))
    assert torch.equal(pf.reshape(px.shape), px)


def test_targeted_test_excludes_the_target_class():
    a = A3FL(target=2, trigger_size=2, trigger_position=(0, 0), image_shape=(8, 8), trigger_init=0.9)
    x = torch.zeros(6, 64)
    y = torch.tensor([0, 2, 1, 2, 5, 9])
    tx, ty = a.targeted_test(x, y)
    assert tx.shape == (4, 64) and ty.tolist() == [2, 2, 2, 2]
    assert torch.equal(tx[:, [0, 1, 8, 9]], torch.full((4, 4), 0.9))
    assert float(tx.sum()) == pytest.approx(4 * 4 * 0.9)
    # a test set of only the target class gives an empty set
    ex, ey = a.targeted_test(x[:2], torch.tensor([2, 2]))
    assert ex.shape == (0, 64) and ey.numel() == 0


def test_stamp_refuses_the_wrong_image_size():
    a = A3FL(image_shape=(8, 8), trigger_size=2, trigger_position=(0, 0))
    with pytest.raises(InvalidParameter, match="image_shape.*49 values per sample, expected 64"):
        a.targeted_test(torch.zeros(3, 49), torch.zeros(3, dtype=torch.long))


# ---- the hook: search, memory, warm start ------------------------------------------------------

def _ctx(seed=0, rnd=0):
    return make_attack_context(seed, 6, 2, 40, model=True, round=rnd)


CHEAP = dict(target=1, trigger_size=2, trigger_position=(1, 1), image_shape=(1, 4, 4), outer_epochs=2,
             adv_every=1, adv_epochs=1, search_batch=8)


def test_training_hook_searches_remembers_and_warm_starts():
    a = A3FL(**CHEAP)
    c0 = _ctx(0)
    assert torch.equal(a.trigger, torch.full((16,), 0.5))  # before any search: trigger_init
    hook = a.training_hook(c0)
    t1 = a.trigger.clone()
    assert not torch.equal(t1, torch.full((16,), 0.5, dtype=t1.dtype))
    m = a.mask()
    assert torch.equal(t1[m == 0], torch.full((12,), 0.5, dtype=t1.dtype))  # only the patch moves
    lo, hi = a._memory["bounds"]
    assert float(t1.min()) >= lo and float(t1.max()) <= hi  # "data": the attackers' input range
    assert a._memory["last_search"]["epochs"] == 2 and a._memory["last_search"]["copies"] == 1
    # the hook stamps this round's trigger
    xb = torch.zeros(2, 4, 1, 4, 4, dtype=t1.dtype)
    px, py = hook.poison_batch(xb, torch.zeros(2, 4, dtype=torch.long))
    assert torch.equal(px[0, 0].reshape(-1), (t1 * m).to(px.dtype)) and py[:, 0].tolist() == [1, 1]
    # the next round starts from t1: the same search from t1 by hand gives the same trigger
    c1 = _ctx(1, rnd=1)
    state = c1.generator.get_state()
    a.training_hook(c1)
    g = torch.Generator().manual_seed(0)
    g.set_state(state)
    d = c1.own_data[0]
    expect, _ = a.search(c1.model, c1.global_params, d.x, d.y, g, start=t1, bounds=(lo, hi))
    assert torch.equal(a.trigger, expect)
    # the ASR test follows the held trigger
    tx, _ = a.targeted_test(torch.zeros(3, 1, 4, 4), torch.tensor([0, 1, 2]))
    assert torch.equal(tx[0].reshape(-1), (a.trigger * m).to(tx.dtype))


def test_training_hook_passes_lr_and_steps_and_skips_without_data():
    a = A3FL(**{**CHEAP, "outer_epochs": 0}, lr=0.05, steps=7)
    hook = a.training_hook(_ctx(2))
    assert hook.lr == 0.05 and hook.steps == 7
    assert torch.equal(a.trigger, torch.full((16,), 0.5))  # no search: the first trigger
    import dataclasses
    # no data of its own: no search, the held trigger is stamped
    b = A3FL(**CHEAP)
    hook = b.training_hook(dataclasses.replace(_ctx(2), own_data=()))
    assert hook.poison_batch is not None and "last_search" not in b._memory
    # no model view (a regime that gives none): a clear refusal
    with pytest.raises(InvalidParameter, match="no model view"):
        A3FL(**CHEAP).training_hook(dataclasses.replace(_ctx(2), model=None))


def test_search_on_all_uses_every_attackers_data():
    c = _ctx(3)
    first, allv = A3FL(**CHEAP, adv_models=0), A3FL(**CHEAP, adv_models=0, search_on="all")
    import dataclasses

    first.training_hook(c)
    allv.training_hook(dataclasses.replace(c, generator=torch.Generator().manual_seed(3)))
    assert not torch.equal(first.trigger, allv.trigger)


def test_the_contract_kit_passes():
    report = check_attack("a3fl", params=dict(CHEAP), max_examples=3)
    assert "a3fl" in report.plugin


def test_a_short_federation_scores_the_held_trigger():
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    sc = parse_scenario({"scenario": {"seed": 0}, "workload": {"name": "digits"},
                         "federation": {"clients": 6, "malicious_fraction": 0.34, "rounds": 2},
                         "attack": {"name": "a3fl", "trigger_size": 2, "trigger_position": [6, 6],
                                    "outer_epochs": 2, "adv_epochs": 1}})
    fed = Federation(sc)
    res = fed.run()
    atk = fed.attack
    assert tuple(atk.image_shape) == (8, 8)  # filled in from the workload
    assert atk._memory["last_search"]["round"] == 1
    assert all("asr" in r.extra for r in res.records)
    probe = fed.probes.targeted[0]
    assert torch.equal(probe[0, [54, 55, 62, 63]], atk.trigger[[54, 55, 62, 63]].to(probe.dtype))
    # the memory is the instance's, and every run builds its own: a new run starts from trigger_init
    again = Federation(sc).attack
    assert again is not atk and torch.equal(again.trigger, torch.full((64,), 0.5))


def test_inside_compose_it_is_given_the_model_and_scored_on_its_latest_trigger():
    # compose asks for the model when a part does (needs_model) and re-reads the trigger before
    # each evaluation when a part re-optimises one (dynamic_trigger): A3FL boosted by model
    # replacement searches as it does alone. Before: the composite declared neither, so the part
    # was refused ("no model view") and the ASR would have read the first trigger.
    from redteam.federation.loop import Federation
    from redteam.registry import ATTACKS
    from redteam.scenario import parse_scenario

    a3fl = {"name": "a3fl", "trigger_size": 2, "trigger_position": [6, 6], "outer_epochs": 2, "adv_epochs": 1}
    sc = parse_scenario({"scenario": {"seed": 0}, "workload": {"name": "digits"},
                         "federation": {"clients": 6, "malicious_fraction": 0.34, "rounds": 2},
                         "attack": {"name": "compose", "attacks": [a3fl, {"name": "model_replacement"}]}})
    fed = Federation(sc)
    assert fed.attack.needs_model and fed.attack.dynamic_trigger
    res = fed.run()
    part = fed.attack.parts[0]
    assert part._memory["last_search"]["round"] == 1
    assert not torch.equal(part.trigger, torch.full((64,), 0.5))  # it searched
    assert all("asr" in r.extra for r in res.records)
    probe = fed.probes.targeted[0]
    assert torch.equal(probe[0, [54, 55, 62, 63]], part.trigger[[54, 55, 62, 63]].to(probe.dtype))
    # two static parts: neither flag
    static = ATTACKS.create("compose", {"attacks": ({"name": "backdoor", "target": 0}, {"name": "model_replacement"})})
    assert not static.needs_model and not static.dynamic_trigger


# ---- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("target", -1), ("target", 1.5), ("trigger_size", 0), ("trigger_position", [1]), ("trigger_position", [-1, 0]),
    ("image_shape", [8]), ("image_shape", [0, 8]), ("trigger_init", float("nan")), ("clamp", [1.0, 0.0]),
    ("clamp", "pixels"), ("poison_fraction", 0.0), ("poison_fraction", 1.5), ("search_fraction", 0),
    ("trigger_lr", 0.0), ("outer_epochs", -1), ("search_batch", 0), ("search_on", "second"), ("stop_asr", 1.0),
    ("adv_every", 0), ("adv_epochs", 0), ("adv_models", -1), ("adv_lambda", -0.1), ("adv_lr", 0),
    ("adv_momentum", 1.0), ("adv_weight_decay", -1e-4), ("adv_weight", "cosine"), ("lr", 0), ("steps", 0),
])
def test_bad_parameters_name_the_field(name, value):
    with pytest.raises(InvalidParameter, match=rf"A3FL\.{name} = "):
        A3FL(**{name: value})


def test_a_patch_that_does_not_fit_names_the_position():
    with pytest.raises(InvalidParameter, match=r"A3FL\.trigger_position = \[4, 4\].*5×5 patch.*8×8"):
        A3FL(image_shape=(8, 8), trigger_position=(4, 4))
    A3FL(image_shape=(8, 8), trigger_position=(3, 3))  # the boundary: rows and columns 3-7 fit


def test_defaults_are_the_authors_cifar10_config():
    # main/configs/config.yaml of github.com/hfzhang31/A3FL; the copies' weight is the paper's (params)
    a = A3FL()
    assert (a.target, a.trigger_size, tuple(a.trigger_position), a.trigger_init, a.poison_fraction) == (2, 5, (2, 2), 0.5, 0.25)
    assert (a.trigger_lr, a.outer_epochs, a.adv_every, a.adv_epochs, a.adv_models, a.adv_lambda) == (0.01, 200, 1, 5, 1, 0.01)
    assert (a.adv_lr, a.adv_momentum, a.adv_weight_decay, a.search_batch, a.adv_weight) == (0.01, 0.9, 5e-4, 64, "params")
    m = a.mask().reshape(3, 32, 32)
    assert int(m.sum()) == 75 and float(m[:, 2:7, 2:7].sum()) == 75


def test_similarity_averages_over_the_kernels_else_the_weight_matrices():
    from redteam.types import ModelView

    def view(layers):
        return ModelView(forward=None, loss=None, features=None, layers=layers, head=(layers[-1][0],),
                         input_shape=(1,))

    # a matrix (0-3), a bias (4-5), a conv kernel (6-17), a bias (18-19), a 3-D kernel (20-27): the
    # kernels only (the authors' layers named `conv`). u = 1 everywhere; v = +1 / −1 halves on the
    # first kernel (cos 0), 2 on the second (cos 1), and junk elsewhere: the mean is 0.5.
    layers = (("a", 0, 4, (2, 2)), ("b", 4, 6, (2,)), ("c", 6, 18, (2, 1, 2, 3)), ("d", 18, 20, (2,)),
              ("e", 20, 28, (2, 2, 2)))
    u = torch.ones(28, dtype=torch.float64)
    v = torch.full((28,), -7.0, dtype=torch.float64)
    v[6:12], v[12:18], v[20:28] = 1.0, -1.0, 2.0
    assert A3FL().layer_cosine(u, v, view(layers)) == pytest.approx(0.5, abs=1e-12)
    # no kernels: the weight matrices (a and f), not the biases: cos 1 on a, −1 on f → 0
    mats = (("a", 0, 4, (2, 2)), ("b", 4, 6, (2,)), ("f", 6, 10, (2, 2)))
    w = torch.tensor([1, 2, 3, 4, 9, 9, -1, -1, -1, -1], dtype=torch.float64)
    assert A3FL().layer_cosine(torch.tensor([1, 2, 3, 4, 0, 0, 1, 1, 1, 1.0], dtype=torch.float64), w,
                               view(mats)) == pytest.approx(0.0, abs=1e-12)
    # a zero vector: torch's eps keeps it finite (0)
    assert A3FL().layer_cosine(torch.zeros(10, dtype=torch.float64), w, view(mats)) == 0.0
