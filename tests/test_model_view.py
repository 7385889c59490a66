"""The engine's white-box views: ``ModelView`` (what ``needs_model`` attacks and model-inspecting
defenses read), ``TrainingHook.poison_batch`` (on-the-fly poisoning), and the trigger that is
asked again before every evaluation (``dynamic_trigger``)."""

from __future__ import annotations

import pytest
import torch

from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import ClientData, TrainingHook


class _CE:
    def loss(self, out, y):
        return torch.nn.functional.cross_entropy(out, y)

    def correct(self, out, y):
        return out.argmax(-1) == y


class _Sq:
    def loss(self, out, y):
        return ((out.squeeze(-1) - y) ** 2).mean()

    def correct(self, out, y):
        return (out.squeeze(-1) - y).abs() < 0.5


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def test_view_forward_features_and_layout():
    model = _mlp()
    spec = ParamSpec.of(model)
    view = BatchedTrainer(_CE(), model, spec).view(2, (4,))
    flat = spec.flatten(model)
    x = torch.randn(5, 4)
    assert torch.allclose(view.forward(flat, x), model(x))
    # the penultimate representation: the input of the last linear layer (after the ReLU)
    assert torch.allclose(view.features(flat, x), torch.relu(model[0](x)))
    assert view.head == ("2.weight", "2.bias")
    # layout: 4·3 + 3 = 15 entries before the head, which holds 3·2 + 2 = 8
    assert view.layers[0] == ("0.weight", 0, 12, (3, 4)) and view.dim == 23
    assert view.head_span() == slice(15, 23)
    assert torch.equal(flat[view.span("2.bias")], model[2].bias.detach())
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        view.span("nope")
    # another row is another model: zero weights give zero logits and chance accuracy on a split label set
    assert torch.equal(view.forward(torch.zeros(23), x), torch.zeros(5, 2))
    assert view.accuracy(flat, x, model(x).argmax(-1)) == 1.0


def test_view_features_need_a_linear_head():
    model = torch.nn.Sequential(torch.nn.Conv1d(1, 1, 1))
    view = BatchedTrainer(_CE(), model, ParamSpec.of(model)).view(0, (1, 3))
    assert view.head == ()
    with pytest.raises(ValueError, match="no linear output layer"):
        view.features(ParamSpec.of(model).flatten(model), torch.zeros(2, 1, 3))


def _train(hook, steps=60):
    model = torch.nn.Linear(2, 1, bias=False)
    trainer = BatchedTrainer(_Sq(), model, ParamSpec.of(model))
    data = StackedData.stack([ClientData(torch.ones(8, 2), torch.full((8,), 2.0))] * 2)
    out = trainer.train(torch.zeros(2), data, torch.tensor([0, 1]), LocalTraining(steps=steps, batch_size=4, lr=0.1),
                        torch.Generator().manual_seed(0), hook=hook, hook_rows=[1] if hook else None)
    return out


def test_poison_batch_rewrites_only_the_hooked_rows():
    # loss (w₀ + w₁ − y)² on x = (1, 1): the honest row converges to w₀ + w₁ = 2; the hooked
    # row trains on the targets its poison_batch gives (−1), so it converges to w₀ + w₁ = −1
    seen = []

    def poison(x, y):
        seen.append(tuple(x.shape))
        return x, torch.full_like(y, -1.0)

    out = _train(TrainingHook(poison_batch=poison))
    assert float(out[0].sum()) == pytest.approx(2.0, abs=1e-4)
    assert float(out[1].sum()) == pytest.approx(-1.0, abs=1e-4)
    assert seen[0] == (1, 4, 2) and len(seen) == 60  # (f, B, *input), every step
    # without a hook both rows are honest
    assert torch.allclose(_train(None), _train(TrainingHook()))


def test_poison_batch_must_keep_shapes():
    with pytest.raises(ValueError, match="poison_batch returned"):
        _train(TrainingHook(poison_batch=lambda x, y: (x[:, :2], y[:, :2])), steps=1)
    with pytest.raises(Exception, match="poison_batch"):
        TrainingHook(poison_batch=3)


# ---- end to end: a federation hands the views to the plugins that ask for them ----------------

from dataclasses import dataclass, field  # noqa: E402
from typing import ClassVar  # noqa: E402

from redteam.registry import ATTACKS, DEFENSES  # noqa: E402
from redteam.types import Attack, Decision, Defense, Surface  # noqa: E402


@dataclass(frozen=True, slots=True)
class _Stamper(Attack):
    """Stamps a trigger whose value changes every round (the round number), on every batch."""

    seen: dict = field(default_factory=dict, compare=False, repr=False)
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRAINING,)
    needs_model: ClassVar[bool] = True
    dynamic_trigger: ClassVar[bool] = True

    def training_hook(self, ctx):
        self.seen.setdefault("views", []).append((ctx.model is not None, len(ctx.own_data), ctx.round))
        self.seen["value"] = float(ctx.round)
        flat = ctx.global_params
        # the view computes what the model computes: the loss of the round's model on own data
        self.seen.setdefault("losses", []).append(float(ctx.model.loss(ctx.model.forward(flat, ctx.own_data[0].x),
                                                                       ctx.own_data[0].y)))

        def poison(x, y):
            x = x.clone()
            x[..., 0] = self.seen["value"]
            return x, torch.zeros_like(y)

        return TrainingHook(poison_batch=poison)

    def targeted_test(self, x, y):
        x = x[y != 0].clone()
        x[..., 0] = self.seen.get("value", -1.0)
        return x, torch.zeros(x.shape[0], dtype=y.dtype)


@dataclass(frozen=True, slots=True)
class _Peek(Defense):
    """A mean that records what the server's views hold."""

    seen: dict = field(default_factory=dict, compare=False, repr=False)

    def decide(self, updates, ctx):
        m = ctx.model
        self.seen.setdefault("feat", []).append(tuple(m.features(ctx.global_params + updates[0], ctx.root_data[0]).shape)
                                                if ctx.root_data is not None else None)
        return Decision(aggregate=updates.mean(0), accepted=torch.ones(updates.shape[0], dtype=torch.bool))


def test_a_federation_gives_the_views_and_asks_the_trigger_again():
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    ATTACKS.register("_stamper_for_test", _Stamper)
    DEFENSES.register("_peek_for_test", _Peek)
    try:
        sc = parse_scenario({"scenario": {"seed": 0}, "workload": {"name": "digits"},
                             "federation": {"clients": 6, "malicious_fraction": 0.34, "rounds": 3, "root_samples": 16},
                             "attack": {"name": "_stamper_for_test"}, "defense": {"name": "_peek_for_test"}})
        fed = Federation(sc)
        res = fed.run()
    finally:
        ATTACKS.unregister("_stamper_for_test")
        DEFENSES.unregister("_peek_for_test")
    atk, dfn = fed.attack, fed.defense
    assert atk.seen["views"] == [(True, 2, 0), (True, 2, 1), (True, 2, 2)]
    # round 0's model is the initial one: its loss on the attacker's data is about ln 10
    assert atk.seen["losses"][0] == pytest.approx(2.30, abs=0.15)
    # the probes follow the trigger the attacker holds: round r is scored with value r
    assert fed.probes.targeted[0][0, 0] == 2.0
    assert all("asr" in r.extra for r in res.records)
    # the server's view: 16 root images, the digits MLP's hidden width
    assert dfn.seen["feat"][0][0] == 16
