"""Attacks on the training surface: neurotoxin (per-step mask), constrain_and_scale, edge_case, dba.

Toy: a bias-free linear model w ∈ R², every sample x = (1, 1) with target 2 and a squared
loss, so the "backdoor" loss is (w₀ + w₁ − 2)², reachable through either coordinate. The
real batched trainer runs it with the attack's TrainingHook. Expected values are derived by
hand in the comments.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import AttackContext, ClientData, Surface, TrainingHook

from attacks.compression import ball_projection
from attacks.training import anomaly_loss


class ToyWorkload:
    """Squared error of a scalar output; enough of a workload for the trainer."""

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((out.squeeze(-1) - y) ** 2).mean()

    def correct(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (out.squeeze(-1) - y).abs() < 0.5


def toy_trainer() -> BatchedTrainer:
    model = torch.nn.Linear(2, 1, bias=False)
    return BatchedTrainer(ToyWorkload(), model, ParamSpec.of(model))


TOY_DATA = StackedData.stack([ClientData(torch.ones(8, 2), torch.full((8,), 2.0))])


def train_toy(hook: TrainingHook | None, steps: int = 40, lr: float = 0.1, g0=(0.0, 0.0)) -> torch.Tensor:
    g = torch.tensor(g0)
    local = toy_trainer().train(g, TOY_DATA, torch.tensor([0]), LocalTraining(steps=steps, batch_size=4, lr=lr),
                                torch.Generator().manual_seed(0), hook=hook, hook_rows=[0] if hook else None)
    return local[0] - g


def ctx_for(own, *, previous=None, visible=None, n=4, **kw) -> AttackContext:
    own = torch.as_tensor(own, dtype=torch.float32)
    f, d = own.shape
    return AttackContext(
        round=1, n_clients=n, malicious=tuple(range(n - f, n)), own_updates=own,
        visible_updates=own if visible is None else torch.as_tensor(visible, dtype=torch.float32),
        global_params=torch.zeros(d), generator=torch.Generator().manual_seed(0),
        previous_update=None if previous is None else torch.as_tensor(previous, dtype=torch.float32), **kw,
    )


def toy_loss(delta: torch.Tensor) -> float:
    return float((delta.sum() - 2.0) ** 2)


# -- Neurotoxin --------------------------------------------------------------------------

def test_neurotoxin_per_step_reaches_the_backdoor_optimum_after_training_does_not():
    # previous global update (1, 0): top ⌈0.5·2⌉ = 1 coordinate by magnitude is w₀, masked.
    # Per step: g = 2(w₀ + w₁ − 2)·(1, 1) ⊙ (0, 1) → only w₁ moves, w₁ ← w₁ − 0.2(w₁ − 2),
    #   |w₁ − 2| = 2·0.8⁴⁰ ≈ 2.7e-4: w → (0, 2), loss ≈ 0 — the optimum, through w₁ alone.
    # After training: free SGD moves both equally, s = w₀ + w₁ ← s − 0.4(s − 2) → w = (1, 1);
    #   zeroing w₀'s change leaves (0, 1): loss (1 − 2)² = 1.
    ctx = ctx_for([[0.0, 0.0]], previous=[1.0, 0.0])
    per_step = redteam.attack("neurotoxin", topk_fraction=0.5)
    hook = per_step.training_hook(ctx)
    assert hook.grad_mask.tolist() == [0.0, 1.0]
    delta = train_toy(hook)
    assert delta[0].item() == 0.0 and delta[1].item() == pytest.approx(2.0, abs=1e-3)
    assert toy_loss(delta) < 1e-6
    assert torch.equal(per_step.craft_updates(dataclasses.replace(ctx, own_updates=delta[None])), delta[None])

    after = redteam.attack("neurotoxin", topk_fraction=0.5, masking="after_training")
    assert after.training_hook(ctx) is None and after.surfaces == (Surface.UPDATES,)
    free = train_toy(None)
    assert torch.allclose(free, torch.tensor([1.0, 1.0]), atol=1e-4)
    sent = after.craft_updates(dataclasses.replace(ctx, own_updates=free[None]))[0]
    assert sent[0].item() == 0.0 and sent[1].item() == pytest.approx(1.0, abs=1e-4)
    assert toy_loss(sent) == pytest.approx(1.0, abs=1e-3)


def test_neurotoxin_mask_sources_and_projection():
    # previous update (5, −1, 0.5, −4, 2), top ⌈0.4·5⌉ = 2 → coordinates 0 and 3 masked
    ctx = ctx_for([[1.0] * 5], previous=[5.0, -1.0, 0.5, -4.0, 2.0],
                  visible=[[0.0, 4.0, 0.0, 0.0, 1.0], [0.0, 2.0, 0.0, -1.0, 1.0]])
    hook = redteam.attack("neurotoxin", topk_fraction=0.4).training_hook(ctx)
    assert hook.grad_mask.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0] and hook.project is None
    # clean-gradient stand-in: mean of the honest rows (0, 3, 0, −0.5, 1) → coordinates 1 and 4
    nt = redteam.attack("neurotoxin", topk_fraction=0.4, mask_from="clean_gradient")
    assert nt.omniscient and nt.training_hook(ctx).grad_mask.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]
    # round 0: no estimate, nothing to mask and no projection → no hook
    assert redteam.attack("neurotoxin").training_hook(ctx_for([[1.0, 1.0]])) is None
    own_lr = redteam.attack("neurotoxin", lr=0.05, steps=7).training_hook(ctx)
    assert own_lr.lr == 0.05 and own_lr.steps == 7 and own_lr.grad_mask is not None
    with pytest.raises(InvalidParameter, match=r"Neurotoxin\.steps = 0"):
        redteam.attack("neurotoxin", steps=0)
    # norm bound: every step projects onto ‖w − G‖ ≤ 0.5; the toy's free optimum (1, 1) has
    # norm √2, so training ends on the sphere, along (1, 1): (0.3536, 0.3536)
    hook = redteam.attack("neurotoxin", norm_bound=0.5).training_hook(ctx_for([[0.0, 0.0]]))
    delta = train_toy(hook)
    assert torch.allclose(delta, torch.full((2,), 0.5 / math.sqrt(2)), atol=1e-5)
    # after training, the masked update is scaled down to the bound: (3, 4) → (0.3, 0.4)
    out = redteam.attack("neurotoxin", masking="after_training", norm_bound=0.5).craft_updates(ctx_for([[3.0, 4.0]]))
    assert torch.allclose(out, torch.tensor([[0.3, 0.4]]), atol=1e-6)


def test_ball_projection_worked_example():
    # G = (1, 1); rows (4, 5) (distance 5 → scaled to 2: (1 + 1.2, 1 + 1.6)) and (1.5, 1) (inside)
    proj = ball_projection(2.0)(torch.tensor([[4.0, 5.0], [1.5, 1.0]]), torch.tensor([1.0, 1.0]))
    assert torch.allclose(proj, torch.tensor([[2.2, 2.6], [1.5, 1.0]]))


# -- constrain-and-scale ------------------------------------------------------------------

def test_constrain_and_scale_trains_the_anomaly_objective_then_scales():
    # α = 0.5 → extra = ((1 − α)/α)·‖w − G‖ = ‖w‖. By symmetry w = (t, t):
    #   (2t − 2)² + √2·t, derivative 4(2t − 2) + √2 = 0 → t = 1 − √2/8 ≈ 0.82322 (vs t = 1 unconstrained)
    extra = anomaly_loss(1.0)
    assert extra(torch.tensor([3.0, 4.0]), torch.zeros(2), None, None).item() == pytest.approx(5.0)
    cas = redteam.attack("constrain_and_scale")
    hook = cas.training_hook(ctx_for([[0.0, 0.0]]))
    delta = train_toy(hook, steps=400, lr=0.02)
    assert torch.allclose(delta, torch.full((2,), 1 - math.sqrt(2) / 8), atol=1e-3)
    assert redteam.attack("constrain_and_scale", alpha=1.0).training_hook(ctx_for([[0.0, 0.0]])).extra_loss is None
    # scale: n = 4, η = 1 → γ = 4: (3, 4) → (12, 16), norm 20; capped at S = 10 → (6, 8)
    ctx = ctx_for([[3.0, 4.0]])
    assert torch.allclose(cas.craft_updates(ctx), torch.tensor([[12.0, 16.0]]))
    capped = redteam.attack("constrain_and_scale", norm_bound=10.0).craft_updates(ctx)
    assert torch.allclose(capped, torch.tensor([[6.0, 8.0]]), atol=1e-5)
    assert float(capped.norm()) <= 10.0
    with pytest.raises(InvalidParameter, match=r"ConstrainAndScale\.alpha = 0"):
        redteam.attack("constrain_and_scale", alpha=0)


# -- edge case -------------------------------------------------------------------------------

def test_edge_case_data_and_pgd():
    # 2×2 images; sample of class 7 [[1, 2], [3, 4]] rotated a quarter turn → [[2, 4], [1, 3]]
    atk = redteam.attack("edge_case", image_shape=(2, 2), eps=1.0)
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [9.0, 9.0, 9.0, 9.0]])
    y = torch.tensor([7, 3])
    out = atk.poison_data(ClientData(x, y), 0, torch.Generator().manual_seed(0))
    assert out.x.tolist() == [[1, 2, 3, 4], [9, 9, 9, 9], [2, 4, 1, 3]] and out.y.tolist() == [7, 3, 1]
    # no source-class sample: nothing to poison
    same = atk.poison_data(ClientData(x[1:], y[1:]), 0, torch.Generator().manual_seed(0))
    assert same.y.tolist() == [3]
    tx, ty = atk.targeted_test(x, y)
    assert tx.tolist() == [[2, 4, 1, 3]] and ty.tolist() == [1]
    # PGD: every step projects onto ‖w − G‖ ≤ 1; the toy optimum (1, 1) lies outside → ends at
    # (1, 1)/√2, and starting from G = (1, −1) the ball is around G
    delta = train_toy(atk.training_hook(ctx_for([[0.0, 0.0]])), g0=(1.0, -1.0))
    assert float(delta.norm()) <= 1.0 + 1e-6 and float(delta.norm()) == pytest.approx(1.0, abs=1e-5)
    assert redteam.attack("edge_case", eps=None).training_hook(ctx_for([[0.0, 0.0]])) is None
    with pytest.raises(InvalidParameter, match=r"EdgeCase\.target = 7"):
        redteam.attack("edge_case", target=7)


# -- DBA ----------------------------------------------------------------------------------------

def test_dba_local_triggers_and_full_trigger_at_test_time():
    # 8×8 images of zeros; default local triggers: bars (0,0–1), (0,4–5), (2,0–1), (2,4–5)
    atk = redteam.attack("dba", fraction=1.0, assignment="client_mod")
    x = torch.zeros(3, 64)
    y = torch.tensor([5, 6, 0])
    out = atk.poison_data(ClientData(x, y), 6, torch.Generator().manual_seed(0))  # 6 mod 4 = part 2
    lit = out.x[0].reshape(8, 8).nonzero().tolist()
    assert lit == [[2, 0], [2, 1]] and out.y.tolist() == [0, 0, 0]
    # the paper's assignment: the i-th attacker poisoned (ascending ids in the trainer) gets part i
    ranked = redteam.attack("dba")
    assert [ranked.part_of(c) for c in (4, 6, 11, 12, 13, 6)] == [0, 1, 2, 3, 0, 1]
    assert ranked == redteam.attack("dba") and hash(ranked) == hash(redteam.attack("dba"))  # memory not a parameter
    # test time: the non-target samples with all 8 pixels of the global trigger
    tx, ty = atk.targeted_test(x, y)
    assert tx.shape == (2, 64) and int(tx[0].sum()) == 8 and ty.tolist() == [0, 0]
    parts = atk.targeted_parts(x, y)
    assert sorted(parts) == ["part0", "part1", "part2", "part3"]
    assert parts["part1"][0][0].reshape(8, 8).nonzero().tolist() == [[0, 4], [0, 5]]
    with pytest.raises(InvalidParameter, match=r"DBA\.local_triggers\[1\]"):
        redteam.attack("dba", local_triggers=[[[0, 0]], [[9, 9]]])


# -- in the trainer ------------------------------------------------------------------------------

def _scenario(attack: dict, defense: str = "mean", rounds: int = 2):
    from redteam.scenario import parse_scenario

    return parse_scenario({
        "scenario": {"seed": 0}, "workload": {"name": "digits"},
        "federation": {"clients": 8, "rounds": rounds, "malicious_fraction": 0.25, "local_steps": 3},
        "attack": attack, "defense": {"name": defense},
    })


def test_compose_backdoor_with_per_step_neurotoxin_runs_in_the_trainer():
    from redteam.federation.loop import Federation

    sc = _scenario({"name": "compose", "attacks": [{"name": "backdoor", "target": 0},
                                                   {"name": "neurotoxin", "topk_fraction": 0.5}]})
    res = Federation(sc).run()
    assert len(res.records) == 2 and all("asr" in r.extra for r in res.records)
    with pytest.raises(InvalidParameter, match=r"at most one part may shape the local training"):
        redteam.attack("compose", attacks=[{"name": "neurotoxin"}, {"name": "constrain_and_scale"}]) \
            .training_hook(ctx_for([[0.0, 0.0]]))


def test_dba_run_reports_asr_per_local_trigger():
    from redteam.federation.loop import Federation

    res = Federation(_scenario({"name": "dba"})).run()
    last = res.records[-1].extra
    assert 0.0 <= last["asr"] <= 1.0
    assert sorted(last["asr_parts"]) == ["part0", "part1", "part2", "part3"]
    # 8 clients, 2 malicious: ranks 0 and 1 → local triggers 0 and 1 are the ones trained
    fed = Federation(_scenario({"name": "dba"}))
    assert fed.attack.part_of(fed.malicious[0]) == 0 and fed.attack.part_of(fed.malicious[1]) == 1
