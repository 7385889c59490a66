"""Surface.TRAINING: the malicious clients shape their own local training step by step.

Toy model out = w·x, x = (1, 1), y = 1, loss ½(out − y)², global w = 0, local lr 0.1.
One plain step: g = (w·x − y)·x = (−1, −1), w = (0.1, 0.1). Each test derives the hooked
rows' result by hand; row 0 is honest, rows 1 and 2 carry the hook."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from _toy import toy
from redteam.errors import InvalidParameter
from redteam.federation.loop import Federation
from redteam.federation.training import LocalTraining
from redteam.scenario import parse_scenario
from redteam.types import Attack, AttackContext, Surface, TrainingHook

CFG = LocalTraining(steps=1, batch_size=1, lr=0.1)
ALL = torch.arange(3)


def _run(hook, cfg=CFG):
    trainer, data, w0 = toy(d=2, n=3)
    return trainer.train(w0, data, ALL, cfg, torch.Generator().manual_seed(0), hook=hook, hook_rows=[1, 2],
                         hook_generator=torch.Generator().manual_seed(1))


def test_no_hook_is_plain_sgd():
    assert torch.allclose(_run(None), torch.full((3, 2), 0.1))


def test_grad_mask_shared_and_per_row():
    # mask (1, 0): g = (−1, 0) → w = (0.1, 0); per-row masks (0, 1) and (0.5, 0.5)
    out = _run(TrainingHook(grad_mask=torch.tensor([1.0, 0.0])))
    assert torch.allclose(out, torch.tensor([[0.1, 0.1], [0.1, 0.0], [0.1, 0.0]]))
    out = _run(TrainingHook(grad_mask=torch.tensor([[0.0, 1.0], [0.5, 0.5]])))
    assert torch.allclose(out, torch.tensor([[0.1, 0.1], [0.0, 0.1], [0.05, 0.05]]))


def test_projection_onto_l2_ball_after_each_step():
    # radius 0.05 around w_g = 0: (0.1, 0.1) has norm 0.1414 → scaled to 0.05/√2 = 0.035355 each
    def ball(w, wg):
        diff = w - wg
        norm = torch.linalg.vector_norm(diff, dim=1, keepdim=True)
        return wg + diff * torch.clamp(0.05 / norm, max=1.0)

    out = _run(TrainingHook(project=ball))
    assert torch.allclose(out[1:], torch.full((2, 2), 0.05 / 2 ** 0.5))
    assert torch.allclose(out[0], torch.full((2,), 0.1))


def test_extra_loss_gradient_is_added():
    # extra = 0.5·Σw → its gradient (0.5, 0.5): g = (−0.5, −0.5) → w = (0.05, 0.05)
    out = _run(TrainingHook(extra_loss=lambda w, wg, x, y: 0.5 * w.sum()))
    assert torch.allclose(out[1:], torch.full((2, 2), 0.05))
    # a proximal extra loss ½λ‖w − w_g‖² is 0 (and its gradient 0) at the first step from w_g
    out = _run(TrainingHook(extra_loss=lambda w, wg, x, y: 2.0 * ((w - wg) ** 2).sum()))
    assert torch.allclose(out, torch.full((3, 2), 0.1))


def test_own_lr_and_more_steps():
    # lr 0.2: w = (0.2, 0.2)
    assert torch.allclose(_run(TrainingHook(lr=0.2))[1:], torch.full((2, 2), 0.2))
    # 3 steps at lr 0.1: w1 = 0.1; out = 0.2, g = −0.8 → w2 = 0.18; out = 0.36, g = −0.64 → w3 = 0.244
    out = _run(TrainingHook(steps=3))
    assert torch.allclose(out[1:], torch.full((2, 2), 0.244))
    assert torch.allclose(out[0], torch.full((2,), 0.1))
    # fewer steps than the federation's: 1 of 3 → (0.1, 0.1), while the honest row takes 3
    out = _run(TrainingHook(steps=1), dataclasses.replace(CFG, steps=3))
    assert torch.allclose(out[1:], torch.full((2, 2), 0.1)) and torch.allclose(out[0], torch.full((2,), 0.244))


def test_hook_validation():
    with pytest.raises(InvalidParameter, match="TrainingHook.lr"):
        TrainingHook(lr=-1.0)
    with pytest.raises(InvalidParameter, match="TrainingHook.steps"):
        TrainingHook(steps=0)
    with pytest.raises(InvalidParameter, match="TrainingHook.project"):
        TrainingHook(project=3)


# ------------------------------------------------------------------ in the federation
@dataclasses.dataclass(frozen=True, slots=True)
class _Shaper(Attack):
    """Freezes every parameter but the first 10 and trains 4 extra steps at a tiny lr."""

    surfaces = (Surface.TRAINING, Surface.UPDATES)
    omniscient = True
    log: list = dataclasses.field(default_factory=list)

    def training_hook(self, ctx: AttackContext) -> TrainingHook:
        d = ctx.global_params.shape[0]
        mask = torch.zeros(d)
        mask[:10] = 1.0
        self.log.append(("hook", ctx.round, ctx.own_updates.clone()))
        return TrainingHook(grad_mask=mask, steps=6, lr=0.01)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        self.log.append(("craft", ctx.round, ctx.own_updates.clone(), ctx.visible_updates.clone()))
        return ctx.own_updates


def _doc():
    return {"scenario": {"seed": 3}, "workload": {"name": "digits", "hidden": 8},
            "federation": {"clients": 6, "rounds": 2, "local_steps": 2, "batch_size": 4, "lr": 0.1,
                           "malicious_fraction": 0.34, "partition": "iid"},
            "attack": "none", "defense": "mean"}


def _with(attack):
    fed = Federation(parse_scenario(_doc()))
    fed.attack, fed.omniscient = attack, True
    return fed


def test_federation_hook_shapes_only_malicious_rows_and_keeps_honest_batches():
    shaper = _Shaper()
    _with(shaper).run()
    plain = _NoHook()
    _with(plain).run()
    crafts = [e for e in shaper.log if e[0] == "craft"]
    plain_crafts = [e for e in plain.log if e[0] == "craft"]
    # round 0: honest rows (visible) identical bit for bit: the hook changed no honest batch
    assert torch.equal(crafts[0][3], plain_crafts[0][3])
    own = crafts[0][2]
    assert torch.count_nonzero(own[:, 10:]) == 0 and torch.count_nonzero(own[:, :10]) > 0
    # the hook sees last round's own (sent) rows: zeros in round 0, round 0's in round 1
    hooks = [e for e in shaper.log if e[0] == "hook"]
    assert torch.count_nonzero(hooks[0][2]) == 0
    assert torch.equal(hooks[1][2], crafts[0][2])


@dataclasses.dataclass(frozen=True, slots=True)
class _NoHook(Attack):
    surfaces = (Surface.UPDATES,)
    omniscient = True
    log: list = dataclasses.field(default_factory=list)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        self.log.append(("craft", ctx.round, ctx.own_updates.clone(), ctx.visible_updates.clone()))
        return ctx.own_updates


def test_bad_hook_is_a_clear_error():
    from redteam.errors import RedteamError

    @dataclasses.dataclass(frozen=True, slots=True)
    class Bad(Attack):
        surfaces = (Surface.TRAINING,)

        def training_hook(self, ctx):
            return TrainingHook(grad_mask=torch.ones(3))

    fed = _with(Bad())
    with pytest.raises(RedteamError, match="grad_mask has shape"):
        fed.run()


@dataclasses.dataclass(frozen=True, slots=True)
class _Constrained(Attack):
    """Constrain-and-scale shape on digits: an anomaly term pulling toward the global model,
    then a projection onto an L2 ball of radius 0.05 around it after every step."""

    surfaces = (Surface.TRAINING, Surface.UPDATES)
    log: list = dataclasses.field(default_factory=list)

    def training_hook(self, ctx: AttackContext) -> TrainingHook:
        def anomaly(w, wg, x, y):
            return 10.0 * ((w - wg) ** 2).sum()

        def ball(w, wg):
            diff = w - wg
            return wg + diff * torch.clamp(0.05 / torch.linalg.vector_norm(diff, dim=1, keepdim=True), max=1.0)

        return TrainingHook(extra_loss=anomaly, project=ball)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        self.log.append(ctx.own_updates.clone())
        return ctx.own_updates


def test_federation_extra_loss_and_projection_on_a_real_model():
    atk = _Constrained()
    _with(atk).run()
    for own in atk.log:  # every malicious delta lies in the ball (float32 rounding aside)
        assert float(torch.linalg.vector_norm(own, dim=1).max()) <= 0.05 + 1e-6
        assert float(torch.linalg.vector_norm(own, dim=1).min()) > 0


# ------------------------------------------------------------------ every round, not only round 0
@dataclasses.dataclass(frozen=True, slots=True)
class _QuietShaper(Attack):
    """The _Shaper's hook (mask, 6 steps, lr 0.01), but it sends zero rows: the server then
    sees the same malicious rows with and without the hook, so the global model can only
    drift apart between the two runs if an honest update does."""

    surfaces = (Surface.TRAINING, Surface.UPDATES)
    omniscient = True
    log: list = dataclasses.field(default_factory=list)

    def training_hook(self, ctx: AttackContext) -> TrainingHook:
        d = ctx.global_params.shape[0]
        mask = torch.zeros(d)
        mask[:10] = 1.0
        return TrainingHook(grad_mask=mask, steps=6, lr=0.01)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        self.log.append((ctx.round, ctx.global_params.clone(), ctx.own_updates.clone(), ctx.visible_updates.clone()))
        return torch.zeros_like(ctx.own_updates)


@dataclasses.dataclass(frozen=True, slots=True)
class _QuietNoHook(Attack):
    surfaces = (Surface.UPDATES,)
    omniscient = True
    log: list = dataclasses.field(default_factory=list)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        self.log.append((ctx.round, ctx.global_params.clone(), ctx.own_updates.clone(), ctx.visible_updates.clone()))
        return torch.zeros_like(ctx.own_updates)


def test_hook_never_touches_honest_batches_in_any_round():
    # 4 rounds, 6 clients, 2 malicious. Both runs send zero malicious rows, so if the hook
    # leaves every honest client's batches (and generator draws) alone, the honest rows and
    # the global model are bit-identical in every round; the malicious rows differ in every
    # round (masked: nothing past coordinate 10 moves, while plain training moves it).
    doc = _doc()
    doc["federation"]["rounds"] = 4
    hooked, plain = _QuietShaper(), _QuietNoHook()
    for atk in (hooked, plain):
        fed = Federation(parse_scenario(doc))
        fed.attack, fed.omniscient = atk, True
        fed.run()
    assert [e[0] for e in hooked.log] == [e[0] for e in plain.log] == [0, 1, 2, 3]
    for (r, g_h, own_h, honest_h), (_, g_p, own_p, honest_p) in zip(hooked.log, plain.log):
        assert torch.equal(g_h, g_p), f"round {r}: the global models differ"
        assert honest_h.shape[0] == 4 and torch.equal(honest_h, honest_p), f"round {r}: an honest update differs"
        assert own_h.shape[0] == 2 and not torch.equal(own_h, own_p), f"round {r}: the hook changed nothing"
        assert torch.count_nonzero(own_h[:, 10:]) == 0 and torch.count_nonzero(own_p[:, 10:]) > 0
    # the honest rows do change from round to round (the model moves): not a trivial equality
    assert not torch.equal(hooked.log[0][3], hooked.log[-1][3])
