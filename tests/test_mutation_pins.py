"""Issue 19, "tests that can fail here": survivors of the mutation audit of attacks/ and
defenses/, each pinned by a case worked by hand from the paper's formula (the arithmetic is
in the comments; nothing here is read back from the code under test).

* constrain-and-scale (Bagdasaryan et al., AISTATS 2020, §4): the boost γ under the server's
  sample-weighted mean is W/(w_a·η) (the attacker's weight share undone), and the training
  objective is L = α·L_class + (1 − α)·‖w − G‖ at α ≠ 0.5.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import redteam
from redteam.federation.params import ParamSpec
from redteam.federation.server_opt import FedAvg
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import AttackContext, ClientData, ServerContext


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


# =============================================== constrain-and-scale: γ with unequal weights

def _cas_ctx(own, *, weights, rows, n=4, lr=1.0, defense=None, ids=None) -> AttackContext:
    own = torch.as_tensor(own, dtype=torch.float32)
    return AttackContext(
        round=2, n_clients=n, malicious=tuple(ids or rows), malicious_rows=tuple(rows), own_updates=own,
        visible_updates=torch.zeros(n - own.shape[0], own.shape[1]), global_params=torch.zeros(own.shape[1]),
        generator=_gen(), server_lr=lr, weights=None if weights is None else torch.tensor(weights), defense=defense,
    )


def test_constrain_and_scale_boost_undoes_the_attackers_sample_weight_share():
    # Sample counts (10, 20, 30, 40), W = 100; the attacker is client 7 at row 1 (w_a = 20:
    # share 1/5); η = 0.5; its trained delta X − G = (1, −2); honest deltas 0.
    # Server step: G' = G + η·Σ w_i Δ_i / W = G + 0.5·(20/100)·γ·(1, −2). Landing on X needs
    # 0.1·γ = 1 → γ = W/(w_a·η) = 100/(20·0.5) = 10: the row (10, −20).
    # Wrong shares give other rows: n/η = 8 → (8, −16); w of row 0 or of client 7's index
    # (which does not exist) → 20 or an error; W/w_a without η → 5.
    mean = redteam.defense("mean")  # sample-weighted
    ctx = _cas_ctx([[1.0, -2.0]], weights=[10.0, 20.0, 30.0, 40.0], rows=[1], ids=[7], lr=0.5, defense=mean)
    cas = redteam.attack("constrain_and_scale")  # weighting = "defense", norm_bound = "defense" (mean: no bound)
    row = cas.craft_updates(ctx)
    assert torch.allclose(row, torch.tensor([[10.0, -20.0]]))
    updates = torch.zeros(4, 2)
    updates[1] = row[0]
    agg = mean(updates, ServerContext.default(updates, weights=ctx.weights)).aggregate
    landed, _ = FedAvg(lr=0.5).step(torch.zeros(2), agg, {})
    assert torch.allclose(landed, torch.tensor([1.0, -2.0]))  # G' = X
    # explicit "samples" gives the same; "uniform" (and the unweighted mean under "defense")
    # is the paper's n/η = 4/0.5 = 8
    assert torch.allclose(redteam.attack("constrain_and_scale", weighting="samples").craft_updates(ctx), row)
    assert torch.allclose(redteam.attack("constrain_and_scale", weighting="uniform").craft_updates(ctx),
                          torch.tensor([[8.0, -16.0]]))
    unweighted = dataclasses.replace(ctx, defense=redteam.defense("mean", weighted=False))
    assert torch.allclose(cas.craft_updates(unweighted), torch.tensor([[8.0, -16.0]]))


def test_constrain_and_scale_two_attackers_with_unequal_weights_each_undo_their_own_share():
    # rows 0 and 2 of weights (10, 20, 30, 40), W = 100, η = 1, two attackers share the
    # replacement (each γ/f, f = 2): γ₀ = 100/(10·1)/2 = 5, γ₂ = 100/(30·1)/2 = 5/3.
    # Deltas (1, 0) and (0, 3) → (5, 0) and (0, 5). Aggregate: (10·(5, 0) + 30·(0, 5))/100
    # = (0.5, 1.5) = the mean of the two deltas — together they replace the model once.
    ctx = _cas_ctx([[1.0, 0.0], [0.0, 3.0]], weights=[10.0, 20.0, 30.0, 40.0], rows=[0, 2],
                   defense=redteam.defense("mean"))
    out = redteam.attack("constrain_and_scale").craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[5.0, 0.0], [0.0, 5.0]]))
    agg = (10.0 * out[0] + 30.0 * out[1]) / 100.0
    assert torch.allclose(agg, torch.tensor([0.5, 1.5]))


def test_constrain_and_scale_caps_the_weighted_boost_at_the_servers_bound():
    # A lone norm_bound filter aggregates with the default sample-weighted mean, so the
    # boost is W/(w_a·η) = 100/(20·0.5) = 10: (1, −2) → (10, −20), norm 10√5 ≈ 22.36 > 12,
    # so the row is scaled onto the bound S = 12: 12·(1, −2)/√5 = (5.3666, −10.7331).
    # (Uncapped, or capped at the n/η row's norm, or not scaled at all, all differ.)
    nb = redteam.defense("norm_bound", bound=12.0)
    ctx = _cas_ctx([[1.0, -2.0]], weights=[10.0, 20.0, 30.0, 40.0], rows=[1], lr=0.5, defense=nb)
    out = redteam.attack("constrain_and_scale").craft_updates(ctx)
    assert torch.allclose(out, torch.tensor([[12 / math.sqrt(5), -24 / math.sqrt(5)]]), atol=1e-5)
    assert float(torch.linalg.vector_norm(out.double())) <= 12.0
    # a row under the bound is left alone: (0.1, −0.2)·10 = (1, −2), norm √5 < 12
    small = redteam.attack("constrain_and_scale").craft_updates(dataclasses.replace(
        ctx, own_updates=torch.tensor([[0.1, -0.2]])))
    assert torch.allclose(small, torch.tensor([[1.0, -2.0]]), atol=1e-6)
    # norm_bound = "none": never capped, whatever the defense holds
    free = redteam.attack("constrain_and_scale", norm_bound="none").craft_updates(ctx)
    assert torch.allclose(free, torch.tensor([[10.0, -20.0]]))
    # a fixed S = 5 wins over the defense's 12: 5·(1, −2)/√5 = (√5, −2√5)
    fixed = redteam.attack("constrain_and_scale", norm_bound=5.0).craft_updates(ctx)
    assert torch.allclose(fixed, torch.tensor([[math.sqrt(5), -2 * math.sqrt(5)]]), atol=1e-5)


def test_constrain_and_scale_explicit_boost_and_an_adaptive_bound():
    # An explicit boost is sent as given, whatever the weights: γ = 3 → (1, −2)·3 = (3, −6)
    # (the derived W/(w_a·η) would be 10).
    ctx = _cas_ctx([[1.0, -2.0]], weights=[10.0, 20.0, 30.0, 40.0], rows=[1], lr=0.5, defense=redteam.defense("mean"))
    assert torch.allclose(redteam.attack("constrain_and_scale", boost=3.0).craft_updates(ctx),
                          torch.tensor([[3.0, -6.0]]))
    # An adaptive norm bound (multiplier k = 2: M = k × the median norm of the round), read by
    # the white-box attacker from the rows it sees: visible norms 1, 2, 3 (rows (1, 0),
    # (0, 2), (3, 0)) → median 2 → S = 4. The boosted row (10, −20) is capped to
    # 4·(1, −2)/√5.
    nb = redteam.defense("norm_bound", multiplier=2.0)
    vis = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    ctx = dataclasses.replace(ctx, defense=nb, visible_updates=vis)
    cas = redteam.attack("constrain_and_scale")
    assert cas.cap(ctx) == pytest.approx(4.0)
    assert torch.allclose(cas.craft_updates(ctx), torch.tensor([[4 / math.sqrt(5), -8 / math.sqrt(5)]]), atol=1e-5)


def test_constrain_and_scale_parameter_messages():
    from attacks.training import ConstrainAndScale
    from redteam.errors import InvalidParameter

    cases = [
        (dict(alpha=1.5), r"ConstrainAndScale\.alpha = 1\.5: must be in \(0, 1\]$"),
        (dict(lr=-1.0), r"ConstrainAndScale\.lr = -1\.0: must be a finite number > 0, or unset$"),
        (dict(steps=0), r"ConstrainAndScale\.steps = 0: must be an integer ≥ 1, or unset \(the federation's\)$"),
        (dict(boost=-2.0), r"ConstrainAndScale\.boost = -2\.0: must be a finite number > 0, or unset$"),
        (dict(weighting="x"), r"ConstrainAndScale\.weighting = 'x': must be 'defense', 'uniform' or 'samples'$"),
        (dict(norm_bound=-1.0), r"ConstrainAndScale\.norm_bound = -1\.0: must be a finite number > 0, "
                                r"'defense' \(read the server's norm bound\) or 'none'$"),
    ]
    for kw, msg in cases:
        with pytest.raises(InvalidParameter, match=msg):
            ConstrainAndScale(**kw)
    ok = ConstrainAndScale(alpha=1.0, lr=0.1, steps=1, boost=2.0, weighting="uniform", norm_bound="none")
    assert ok.alpha == 1.0 and ok.cap(_cas_ctx([[1.0, 0.0]], weights=None, rows=[3])) is None


# =============================================== constrain-and-scale: the loss at α = 0.2

class _ToyWorkload:
    """Squared error of a scalar output: L_class(w) = (w₀ + w₁ − 2)² for x = (1, 1), y = 2."""

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((out.squeeze(-1) - y) ** 2).mean()

    def correct(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (out.squeeze(-1) - y).abs() < 0.5


def _train_toy(hook, steps: int, lr: float) -> torch.Tensor:
    model = torch.nn.Linear(2, 1, bias=False)
    trainer = BatchedTrainer(_ToyWorkload(), model, ParamSpec.of(model))
    data = StackedData.stack([ClientData(torch.ones(8, 2), torch.full((8,), 2.0))])
    g = torch.zeros(2)
    local = trainer.train(g, data, torch.tensor([0]), LocalTraining(steps=steps, batch_size=4, lr=lr),
                          _gen(), hook=hook, hook_rows=[0])
    return local[0] - g


def test_constrain_and_scale_loss_at_alpha_0_2_weights_the_anomaly_term_by_1_minus_alpha():
    # The paper: L = α·L_class + (1 − α)·‖w − G‖. The hook adds its extra loss to the class
    # loss, so it must be L/α's extra term: ((1 − α)/α)·‖w − G‖ = (0.8/0.2)·‖w − G‖ = 4‖w − G‖.
    # At w − G = (3, 4): 4·5 = 20 (inverted α/(1 − α) = 0.25 → 1.25; (1 − α) alone → 4; α → 1).
    cas = redteam.attack("constrain_and_scale", alpha=0.2)
    ctx = _cas_ctx([[0.0, 0.0]], weights=None, rows=[3])
    hook = cas.training_hook(ctx)
    assert hook.extra_loss(torch.tensor([3.0, 4.0]), torch.zeros(2), None, None).item() == pytest.approx(20.0)
    assert hook.extra_loss(torch.tensor([4.0, 5.0]), torch.tensor([1.0, 1.0]), None, None).item() == \
        pytest.approx(20.0)  # measured from G, not from 0
    # its gradient at w − G = (3, 4): 4·(3, 4)/5 = (2.4, 3.2)
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    hook.extra_loss(w, torch.zeros(2), None, None).backward()
    assert torch.allclose(w.grad, torch.tensor([2.4, 3.2]))
    # the minimiser on the toy, G = 0, by symmetry w = (t, t):
    #   α·(2t − 2)² + (1 − α)·√2·t, d/dt: 0.2·4(2t − 2) + 0.8·√2 = 0 → 2t − 2 = −√2
    #   → t = 1 − √2/2 ≈ 0.29289. (Inverted weights 0.25‖w‖ would give t = 1 − √2/32 ≈ 0.9558;
    #   α = 0.5's weight 1 gives 1 − √2/8 ≈ 0.8232.) GD per coordinate contracts by 1 − 4·lr.
    delta = _train_toy(hook, steps=400, lr=0.02)
    assert torch.allclose(delta, torch.full((2,), 1 - math.sqrt(2) / 2), atol=1e-3)
    # α = 0.8: weight 0.25 → t = 1 − √2/32
    hook8 = redteam.attack("constrain_and_scale", alpha=0.8).training_hook(ctx)
    assert hook8.extra_loss(torch.tensor([3.0, 4.0]), torch.zeros(2), None, None).item() == pytest.approx(1.25)
    assert torch.allclose(_train_toy(hook8, steps=400, lr=0.02), torch.full((2,), 1 - math.sqrt(2) / 32), atol=1e-3)


def test_constrain_and_scale_hook_carries_the_attackers_lr_and_steps():
    # lr 0.05 and 3 steps on the toy with α = 1 (no anomaly term): per coordinate
    # t ← t − 0.05·2(2t − 2): t₁ = 0.2, t₂ = 0.2 − 0.1·(−1.6) = 0.36, t₃ = 0.36 + 0.1·1.28 = 0.488
    hook = redteam.attack("constrain_and_scale", alpha=1.0, lr=0.05, steps=3).training_hook(
        _cas_ctx([[0.0, 0.0]], weights=None, rows=[3]))
    assert hook.extra_loss is None and hook.lr == 0.05 and hook.steps == 3
    assert torch.allclose(_train_toy(hook, steps=1, lr=0.5), torch.full((2,), 0.488), atol=1e-6)


# =============================================== RLR (Ozdayi et al., AAAI 2021): survivors of the run

def test_rlr_decision_weights_are_the_normalised_sample_weights():
    # X below, weights (1, 2, 3, 4) summing to 0.5 after ×0.05: w/W = (0.1, 0.2, 0.3, 0.4) either way.
    # Aggregate, θ = 3: column signs (+ + + +) Σ = 4 keeps, (− + − +) Σ = 0 and (+ − 0 +) Σ = 1 flip;
    # weighted mean: col 0 0.1·1 + 0.2·2 + 0.3·1 + 0.4·3 = 2.0; col 1 −0.1 + 0.2 − 0.6 + 0.4 = −0.1;
    # col 2 0.2 − 0.2 + 0 + 0.4 = 0.4 → (2.0, 0.1, −0.4).
    from defenses.rlr import RLR

    x = torch.tensor([[1.0, -1.0, 2.0], [2.0, 1.0, -1.0], [1.0, -2.0, 0.0], [3.0, 1.0, 1.0]])
    for scale in (1.0, 0.05):  # W = 10 and W = 0.5 (a total below 1 is still normalised)
        ctx = ServerContext.default(x, weights=scale * torch.tensor([1.0, 2.0, 3.0, 4.0]))
        dec = RLR(theta=3)(x, ctx)
        assert dec.aggregate.tolist() == pytest.approx([2.0, 0.1, -0.4], abs=1e-6)
        assert dec.weights.tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])
    # no weights in the context: equal weights (ones), normalised to 1/4 each
    bare = ServerContext(round=0, n_clients=4)
    dec = RLR(theta=3)(x, bare)
    assert dec.weights.tolist() == pytest.approx([0.25] * 4)
    assert dec.aggregate.tolist() == pytest.approx([1.75, 0.25, -0.5])


def test_rlr_votes_and_mean_leave_a_non_finite_row_out():
    # rows (1, −1), (1, 3) and a row (−inf, +inf), θ = 2. Finite rows only: votes (2, 0) →
    # column 0 keeps, column 1 flips; mean (1, 1) → aggregate (1, −1). Had the infinite row
    # voted (sgn = −1, +1): votes (1, 1), both flip → (−1, −1); had it entered the mean with
    # weight 0: 0·inf = NaN. It is rejected with weight 0 and its reason. (A NaN row has
    # sgn(NaN) = 0 in torch: it could not change a vote, so it would not show the leak.)
    from defenses.rlr import RLR

    for bad in ([float("-inf"), float("inf")], [float("nan"), float("inf")]):
        x = torch.tensor([[1.0, -1.0], [1.0, 3.0], bad])
        dec = RLR(theta=2)(x)
        assert dec.aggregate.tolist() == pytest.approx([1.0, -1.0])
        assert dec.accepted.tolist() == [True, True, False] and dec.reasons == {2: "non-finite update"}
        assert dec.weights.tolist() == pytest.approx([0.5, 0.5, 0.0])
    # every row non-finite: the aggregate and the weights are zeros (no NaN from 0/0)
    dec = RLR(theta=1)(torch.full((2, 2), float("inf")))
    assert dec.aggregate.tolist() == [0.0, 0.0] and dec.weights.tolist() == [0.0, 0.0]


def test_rlr_degradation_note_names_theta_n_and_the_flipped_count():
    # θ = 5 > n = 3: no coordinate can reach 5 votes, so all d = 2 are flipped
    from defenses.rlr import RLR

    rlr = RLR(theta=5)
    dec = rlr(torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]))
    assert dec.state == {"theta": 5, "n": 3, "theta_above_n": True, "flipped": 2}
    assert rlr.degradation(dec.state, 3) == \
        "θ = 5 is above the round's n = 3 updates: the sign of all 2 coordinates flipped"
    assert rlr.degradation({"theta": 2, "n": 3, "theta_above_n": False, "flipped": 0}, 3) is None
    assert rlr.degradation({}, 3) is None


# =============================================== DnC (Shejwalkar & Houmansadr, NDSS 2021): survivors

def test_dnc_weighted_decision_weights_are_normalised():
    # f = 0 → ⌊c·f⌋ = 0 removals; weighted = true with sample weights (1, 2, 3, 4)·s: the
    # decision weights are w/W = (0.1, 0.2, 0.3, 0.4) whatever W (10 or 0.5), and the aggregate
    # the weighted mean of the RLR example's rows: (2.0, −0.1, 0.4).
    from defenses.dnc import DnC

    x = torch.tensor([[1.0, -1.0, 2.0], [2.0, 1.0, -1.0], [1.0, -2.0, 0.0], [3.0, 1.0, 1.0]])
    for scale in (1.0, 0.05):
        ctx = ServerContext.default(x, weights=scale * torch.tensor([1.0, 2.0, 3.0, 4.0]))
        dec = DnC(f=0, weighted=True)(x, ctx)
        assert dec.accepted.all()
        assert dec.weights.tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])
        assert dec.aggregate.tolist() == pytest.approx([2.0, -0.1, 0.4], abs=1e-6)
    # weights absent from the context: equal
    dec = DnC(f=0, weighted=True)(x, ServerContext(round=0, n_clients=4))
    assert dec.weights.tolist() == pytest.approx([0.25] * 4)
    # every row non-finite: no weight to normalise, zeros (not 0/0 = NaN)
    dec = DnC(f=0)(torch.full((2, 3), float("inf")))
    assert dec.weights.tolist() == [0.0, 0.0] and not dec.accepted.any()


def test_dnc_removals_never_take_the_last_update_and_say_so():
    # ⌊c·f⌋ removals, at most n − 1 (one update always survives): f = 3, c = 1 → 3 wanted;
    # n = 3 → 2; n = 1 → 0; n = 5 → 3. f unset: (n − 1)//2.
    from defenses.dnc import DnC

    dnc = DnC(f=3)
    assert dnc.removals(3) == (3, 2) and dnc.removals(1) == (3, 0) and dnc.removals(5) == (3, 3)
    assert DnC().removals(7) == (3, 3) and DnC(f=2, c=1.5).removals(9) == (2, 3)
    x = torch.tensor([[1.0, 0.0], [0.0, 5.0], [-4.0, 1.0]])
    dec = dnc(x)
    assert int(dec.accepted.sum()) == 1
    assert dec.state["removed"] == 2 and dec.state["f"] == 3 and dec.state["short"] is True
    assert dnc.degradation(dec.state, 1) == ("⌊c·f⌋ removals with f = 3 would leave none of the 3 updates: "
                                             "removed 2, kept the lowest-scored one")
    # an ordinary round (f = 1 of n = 4: ⌊1·1⌋ = 1 removal, made) is not short and has no note
    y = torch.tensor([[1.0, 0.0], [1.1, 0.1], [0.9, -0.1], [-9.0, 9.0]])
    ok = DnC(f=1)(y)
    assert ok.state["removed"] == 1 and ok.state["short"] is False
    assert DnC(f=1).degradation(ok.state, 3) is None
    assert dnc.degradation({"short": True}, 1) is None  # no removal count: no note


def test_dnc_parameter_checks():
    from defenses.dnc import DnC
    from redteam.errors import InvalidParameter

    assert DnC(c=0.5).c == 0.5  # any c > 0 … (a lower limit of 1 would refuse it)
    for name in ("b", "niters"):
        with pytest.raises(InvalidParameter, match=rf"DnC\.{name} = None"):
            DnC(**{name: None})
    with pytest.raises(InvalidParameter, match=r"DnC\.f = 'x'"):
        DnC(f="x")


# =============================================== FLDetector (Zhang et al., KDD 2022): residual norms

def test_fldetector_residual_norms_follow_both_index_maps():
    # ‖prev[srcᵢ] + hv − cur[selᵢ]‖ per pair. prev rows p0 = (1, 0), p1 = (0, 1), p2 = (2, 2);
    # cur rows c0 = (0, 0), c1 = (1, 1), c2 = (5, 5); hv = (0.5, 0).
    # src = (1, 2, 0), sel = (2, 0, 1) (full-length permutations, no fixed point):
    #   ‖(0.5, 1) − (5, 5)‖ = √(20.25 + 16) = √36.25; ‖(2.5, 2) − 0‖ = √10.25; ‖(1.5, 0) − (1, 1)‖ = √1.25.
    # Identity maps: ‖p0 + hv − c0‖ = 1.5, ‖p1 + hv − c1‖ = ‖(−0.5, 0)‖ = 0.5, ‖p2 + hv − c2‖ = ‖(−2.5, −3)‖ = √15.25.
    from defenses.fldetector import _residual_norms

    prev = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    cur = torch.tensor([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]])
    hv = torch.tensor([0.5, 0.0])
    for dt in (torch.float32, torch.float64):
        out = _residual_norms(prev.to(dt), torch.tensor([1, 2, 0]), hv.to(dt), cur.to(dt), torch.tensor([2, 0, 1]))
        assert out.dtype == torch.float64
        assert out.tolist() == pytest.approx([math.sqrt(36.25), math.sqrt(10.25), math.sqrt(1.25)])
        ident = torch.arange(3)
        assert _residual_norms(prev.to(dt), ident, hv.to(dt), cur.to(dt), ident).tolist() == \
            pytest.approx([1.5, 0.5, math.sqrt(15.25)])
        # a shorter selection: pairs (src, sel) = (2, 1) and (0, 2): √3.25 and √37.25
        two = _residual_norms(prev.to(dt), torch.tensor([2, 0]), hv.to(dt), cur.to(dt), torch.tensor([1, 2]))
        assert two.tolist() == pytest.approx([math.sqrt(3.25), math.sqrt(37.25)])


def test_fldetector_residual_norms_in_float32_do_not_under_or_overflow():
    # float32 squares of 1e-25 (1e-50) and of 3e30 (9e60) leave float32's range; the exact
    # norms are √2·1e-25 and ‖(3e30, 4e30)‖ = 5e30, and a residual of exactly 0 stays 0.
    from defenses.fldetector import _residual_norms

    prev = torch.tensor([[1e-25, 1e-25], [3e30, 4e30], [1.0, 2.0], [0.0, 0.0]], dtype=torch.float32)
    cur = torch.zeros(4, 2, dtype=torch.float32)
    cur[2] = torch.tensor([1.0, 2.0])
    idx = torch.arange(4)
    out = _residual_norms(prev, idx, torch.zeros(2), cur, idx)
    assert out[0].item() == pytest.approx(math.sqrt(2) * float(prev[0, 0].double()), rel=1e-6, abs=0.0)
    assert out[1].item() == pytest.approx(math.hypot(float(prev[1, 0].double()), float(prev[1, 1].double())), rel=1e-6)
    assert out[2].item() == 0.0 and out[3].item() == 0.0


# =============================================== ByzFL's optimal ALIE: μ and σ with ddof

def test_optimal_alie_mean_and_sigma_with_ddof():
    # honest rows (1, 0), (3, 4), (5, 8): μ = (3, 4); squared deviations per column
    # (4 + 0 + 4, 16 + 0 + 16) = (8, 32): σ with ddof 1 = √(8/2), √(32/2) = (2, 4); ddof 0:
    # √(8/3), √(32/3). sign −1 (default) negates σ.
    from attacks.tailored import OptimalALIE
    from redteam.errors import InvalidParameter

    x = torch.tensor([[1.0, 0.0], [3.0, 4.0], [5.0, 8.0]])
    mu, s = OptimalALIE()._base(x)
    assert mu.tolist() == pytest.approx([3.0, 4.0]) and s.tolist() == pytest.approx([-2.0, -4.0])
    mu, s = OptimalALIE(ddof=0, sign=1)._base(x)
    assert s.tolist() == pytest.approx([math.sqrt(8 / 3), math.sqrt(32 / 3)])
    # σ needs more rows than ddof: 3 rows with ddof 3 is refused, with ddof 2 it is √(8/1), √(32/1)
    with pytest.raises(InvalidParameter, match=r"OptimalALIE\.ddof = 3: σ needs more than ddof honest updates, got 3$"):
        OptimalALIE(ddof=3)._base(x)
    assert OptimalALIE(ddof=2, sign=1)._base(x)[1].tolist() == pytest.approx([math.sqrt(8), math.sqrt(32)])
