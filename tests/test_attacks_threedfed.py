"""3DFed (Li et al., IEEE S&P 2023; attacks/threedfed.py): worked examples of its modules.

Every expected number is derived by hand in the comments or by an independent transcription of
the released rule written here (not by calling the module's code): the indicator feedback rule
(``read_indicator``), the adaptive tuning (``adaptive_tuning``), the indicator choice
(``design_indicator``), the noise-mask step (``noise_mask_design``) and the decoy model
(``decoy_model_design`` / ``compute_decoy_param_loss``) of github.com/haoyangliASTAPLE/3DFed.
"""

from __future__ import annotations

import math

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer
from redteam.types import AttackContext, ClientData

from attacks.threedfed import (ThreeDFed, adapt, decoy_positions, implant, noise_masks, read_feedback,
                               select_indicators, train_decoy)


# ---------------------------------------------------------------- (1) the indicator feedback
def test_feedback_of_a_hand_built_aggregate():
    # 5 rows, equal weights: malicious rows 0, 1, 2 carry indicators of value v = 0.02, 0.01, 0.03
    # at their own coordinate; the honest rows 3, 4 hold 0 there. The server admits rows
    # 0, 2, 3, 4, rejects row 1 and clips row 2 to half: Δg = (row0 + 0.5·row2 + row3 + row4)/4.
    # ρ₀ = (0.02/4)/0.02 = 0.25, ρ₁ = 0/0.01 = 0, ρ₂ = (0.5·0.03/4)/0.03 = 0.125.
    # τ = 1e-4, 0.8·max ρ = 0.2: row 0 accepted (0.25 > 0.2), row 1 rejected (0 ≤ τ),
    # row 2 clipped (τ < 0.125 ≤ 0.2).
    rows = torch.zeros(5, 3, dtype=torch.float64)
    rows[0, 0], rows[1, 1], rows[2, 2] = 0.02, 0.01, 0.03
    change = (rows[0] + 0.5 * rows[2] + rows[3] + rows[4]) / 4
    values = torch.tensor([0.02, 0.01, 0.03], dtype=torch.float64)
    fb = change[torch.tensor([0, 1, 2])] / values
    assert fb.tolist() == pytest.approx([0.25, 0.0, 0.125])
    assert read_feedback(fb, 1e-4, 0.8) == (["a", "r", "c"], False)


def test_feedback_boundaries():
    # on the clip line (0.2 = 0.8·0.25 exactly in binary) → clipped; on the threshold → rejected
    assert read_feedback(torch.tensor([0.25, 0.2, 1e-4, 1.0001e-4], dtype=torch.float64), 1e-4, 0.8) \
        == (["a", "c", "r", "c"], False)
    # a share of exactly 1 (the only accepted row) is no noise; above 1 or below −τ is
    assert read_feedback(torch.tensor([1.0, -1e-4], dtype=torch.float64), 1e-4, 0.8) == (["a", "r"], False)
    assert read_feedback(torch.tensor([0.2, 1.0 + 1e-9], dtype=torch.float64), 1e-4, 0.8) == ([], True)
    assert read_feedback(torch.tensor([0.2, -1.01e-4], dtype=torch.float64), 1e-4, 0.8) == ([], True)
    # implant: ×1e5, a zero becomes the floor
    assert implant(torch.tensor([2e-8, 0.0, -1e-7], dtype=torch.float64), 1e5, 1e-2).tolist() \
        == pytest.approx([2e-3, 1e-2, -1e-2])


# ---------------------------------------------------------------- a small real model
class _CE:
    def loss(self, out, y):
        return torch.nn.functional.cross_entropy(out, y)

    def correct(self, out, y):
        return out.argmax(-1) == y


def _mlp_view(seed=0, hidden=8):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    spec = ParamSpec.of(model)
    return BatchedTrainer(_CE(), model, spec).view(10, (16,)), spec.flatten(model).detach()


def _data(seed, n=24):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 16, generator=g)
    x[:, 0] = 0.0  # a pixel that is always dark: its first-layer weights never get a gradient
    y = torch.randint(0, 10, (n,), generator=g)
    return ClientData(x, y)


def _ctx(view, params, rnd, f=3, n=5, state=None, seed=0):
    return AttackContext(round=rnd, n_clients=n, malicious=tuple(range(f)), malicious_rows=tuple(range(f)),
                         own_updates=torch.zeros(f, params.numel()), visible_updates=torch.zeros(f, params.numel()),
                         global_params=params, generator=torch.Generator().manual_seed(seed), num_classes=10,
                         weights=torch.ones(n), attack_state=state if state is not None else {},
                         model=view, own_data=tuple(_data(i) for i in range(f)))


FAST = dict(image_shape=[4, 4], poison_steps=2, benign_steps=1, batch_size=32)


def test_feedback_read_from_the_next_global_model():
    view, g0 = _mlp_view()
    atk = ThreeDFed(**FAST)
    state: dict = {}
    sent = atk.craft_updates(_ctx(view, g0, 0, state=state))
    rec = state["3dfed"]["records"][-1]
    pos, val = rec["positions"], rec["values"]
    # each row's indicator is its own coordinate, holding the planted value
    assert len(set(pos.tolist())) == 3 and torch.equal(sent[torch.arange(3), pos], val)
    # the server: 2 honest zero rows; row 0 admitted, row 1 rejected, row 2 clipped to half:
    # Δg = (row0 + 0.5·row2 + 0 + 0)/4 → ρ = (1/4 + x, x', 1/8 + x'') where the x are the other
    # rows' own (1e5 times smaller) values at a row's indicator: labels a, r, c as above
    g1 = g0 + (sent[0] + 0.5 * sent[2]) / 4
    atk.craft_updates(_ctx(view, g1, 1, state=state, seed=1))
    assert state["3dfed"]["records"][-1]["labels"] == ["a", "r", "c"]
    # a repeated call of round 1 restarts from round 0's record: same labels
    atk.craft_updates(_ctx(view, g1, 1, state=state, seed=1))
    assert state["3dfed"]["records"][-1]["labels"] == ["a", "r", "c"]
    # a round the attackers skipped: no feedback is read in round 3
    atk.craft_updates(_ctx(view, g1, 3, state=state, seed=2))
    assert state["3dfed"]["records"][-1]["labels"] is None


def test_all_rejected_adds_a_decoy_and_noise_makes_it_weak():
    view, g0 = _mlp_view()
    atk = ThreeDFed(**FAST)
    state: dict = {}
    atk.craft_updates(_ctx(view, g0, 0, state=state))
    # every malicious row rejected: the global model moves only by the honest rows (zeros) →
    # ρ = 0 for all → rule: no a/c among the backdoor rows, no decoy accepted → k = 0 + 1
    out = atk.craft_updates(_ctx(view, g0.clone(), 1, state=state, seed=1))
    rec = state["3dfed"]["records"][-1]
    assert rec["labels"] == ["r", "r", "r"] and rec["k"] == 1 and rec["n_backdoor"] == 2
    assert out.shape == (3, g0.numel())
    # noise on the global model (a server's DP noise) gives ρ < −τ somewhere: weak DP, α = 0.1
    pos = rec["positions"]
    g2 = g0.clone()
    g2[pos] -= 1.0
    atk.craft_updates(_ctx(view, g2, 2, state=state, seed=2))
    rec = state["3dfed"]["records"][-1]
    assert rec["weak"] and rec["alpha"] == [0.1, 0.1] and rec["labels"] == []


# ---------------------------------------------------------------- (2) the adaptive tuning
def _mid(a, b):
    return (a + b) / 2  # a deterministic "uniform draw": the midpoint


def test_adaptive_tuning_worked_examples():
    # two full groups, both accepted: candidates sorted (0.3, 0.6) → α_g = U(0.3, 0.6) → 0.45
    assert adapt([["a", "a"], ["a", "a"]], [], [0.6, 0.3], 0, False, 2, 0.0, _mid) == (
        [pytest.approx(0.45), pytest.approx(0.45)], 0)
    # only group 0 accepted: α_g = U(0.6, 0.7) → 0.65 for both
    assert adapt([["a", "a"], ["r", "c"]], [], [0.6, 0.3], 0, False, 2, 0.0, _mid) == (
        [pytest.approx(0.65), pytest.approx(0.65)], 0)
    # no group has ≥ 0.8·2 = 1.6 acceptances: α_g = U(alpha_min, 1) → 0.6 with alpha_min = 0.2
    assert adapt([["c", "a"], ["r", "a"]], [], [0.6, 0.3], 0, False, 2, 0.2, _mid) == ([0.6, 0.6], 0)
    # boundary: group of 5 with 4 = 0.8·5 acceptances counts as accepted; the other not → U(0.4, 0.5)
    assert adapt([["a", "a", "a", "a", "r"], ["a", "a", "a", "c", "c"]], [], [0.4, 0.9], 0, False, 5, 0.0,
                 _mid) == ([pytest.approx(0.45), pytest.approx(0.45)], 0)


def test_adaptive_tuning_single_group_decoys_and_clamps():
    # one full group (and a partial one, never judged): not accepted → every α redrawn
    assert adapt([["r", "a"], ["a"]], [], [0.7, 0.2], 0, False, 2, 0.0, _mid) == ([0.5, 0.5], 0)
    # accepted → kept
    assert adapt([["a", "a"], ["r"]], [], [0.7, 0.2], 0, False, 2, 0.0, _mid) == ([0.7, 0.2], 0)
    # decoys: k = 1, all rejected → k − 0 + 1 = 2; two of three decoys accepted → 3 − 2 = 1 and
    # no increment (a decoy was accepted); a clipped backdoor row also blocks the increment
    assert adapt([["r", "r"]], ["r"], [0.5], 1, False, 2, 0.0, _mid)[1] == 2
    assert adapt([["r", "r"]], ["a", "a", "r"], [0.5], 3, False, 2, 0.0, _mid)[1] == 1
    assert adapt([["r", "c"]], ["r"], [0.5], 1, False, 2, 0.0, _mid)[1] == 1
    assert adapt([["r", "r"]], ["a"], [0.5], 0, False, 2, 0.0, _mid)[1] == 0  # max(0 − 1, 0)
    # clamps: a draw of 1 becomes 0.99, of 0 becomes 0.01
    assert adapt([["r", "r"]], [], [0.5, 0.5], 0, False, 2, 0.0, lambda a, b: 1.0)[0] == [0.99, 0.99]
    assert adapt([["r", "r"]], [], [0.5], 0, False, 2, 0.0, lambda a, b: 0.0)[0] == [0.01]
    # weak DP: α = 0.1 everywhere, k kept
    assert adapt([], [], [0.5, 0.8], 2, True, 2, 0.0, _mid) == ([0.1, 0.1], 2)


# ---------------------------------------------------------------- indicator choice and masks
def test_indicator_choice_by_hand():
    # analog |Δ| + |Δ_benign| and curvature per coordinate of the layer
    analog = torch.tensor([0.5, 0.0, 0.0, 0.2, 0.1, 0.0, 0.3], dtype=torch.float64)
    curv = torch.tensor([0.0, 0.4, -0.1, 0.0, 0.0, 0.1, 0.0], dtype=torch.float64)
    # count 2, 2 candidates per row → 4 candidates with the smallest analog: 1, 2, 5 (zeros) and 4
    # (0.1); their |curvature| 0.4, 0.1, 0.1, 0 → 4 first, then the tie 2 / 5 (same analog) by position
    assert select_indicators(analog, curv, 2, 2).tolist() == [4, 2]
    # count 3: 6 candidates 1, 2, 5, 4, 3, 6; the zero-curvature ones 4, 3, 6 (by analog) win
    assert select_indicators(analog, curv, 3, 2).tolist() == [4, 3, 6]
    # one candidate per row: 1 and 2 only (earliest zeros) → |curv| 0.1 < 0.4
    assert select_indicators(analog, curv, 2, 1).tolist() == [2, 1]


def test_one_noise_mask_step_by_hand():
    # one group of 2, one neuron row of 2 entries: Δ = (0.5, −0.25); masks start at ±(0.1, 0.2)
    # (already centred). α = 0.5, (c_u, c_n, c_l) = (0.1, 0.08, 0.1), λ = 1, lr 0.1, no momentum.
    delta = torch.tensor([[0.5, -0.25]], dtype=torch.float64)
    init = torch.tensor([[[0.1, 0.2]], [[-0.1, -0.2]]], dtype=torch.float64)
    out = noise_masks(delta, 2, 0.5, init, 1, 0.1, 0.0, 0.0, (0.1, 0.08, 0.1), 0.1)
    # member 0: Δ + n = (0.6, −0.05), ‖·‖₁ = 0.65 → ∂(c_u/‖·‖₁) = −0.1·sign/0.65² = (−0.2367, +0.2367);
    # ∂c_n‖n‖ = 0.08·n/‖n‖ = 0.08·(0.1, 0.2)/0.22361 = (0.035777, 0.071554); Σn = 0 → no Lagrange
    # term (its gradient at 0 is 0). g = [0.5·(ups + norm)]/(1 + 1).
    exp = []
    for n in ([0.1, 0.2], [-0.1, -0.2]):
        s = [delta[0, 0].item() + n[0], delta[0, 1].item() + n[1]]
        l1 = abs(s[0]) + abs(s[1])
        nn_ = math.hypot(*n)
        g = [(0.5 * (-0.1 * math.copysign(1, s[i]) / l1 ** 2) + 0.5 * 0.08 * n[i] / nn_) / 2 for i in range(2)]
        exp.append([n[i] - 0.1 * g[i] for i in range(2)])
    assert out.reshape(2, 2).tolist() == [pytest.approx(e, abs=1e-12) for e in exp]
    # with 30 steps the Lagrange term keeps the group's masks nearly cancelling in a sum
    g = torch.Generator().manual_seed(0)
    init = torch.randn(2, 8, 51, generator=g, dtype=torch.float64) * 0.05  # 8 neurons of 50 inputs + bias
    d = torch.randn(8, 51, generator=g, dtype=torch.float64) * 0.05
    m = noise_masks(d, 2, 0.7, init, 30, 0.1, 0.9, 5e-4, (0.1, 0.08, 0.1), 0.1)
    assert float(m.sum(0).norm()) < 0.05 * float(m[0].norm())
    # and they raise the update energy (‖Δ_j + n_j‖₁) of the chosen rows
    assert bool(((d + m[0]).abs().sum(-1) > d.abs().sum(-1)).all())


# ---------------------------------------------------------------- (3) decoy models
def test_decoy_positions_by_hand():
    gap = torch.tensor([0.3, 0.0, 0.2, 0.0, 0.1], dtype=torch.float64)
    # the smallest gaps, earliest first among ties; indicators excluded
    assert decoy_positions(gap, 2).tolist() == [1, 3]
    assert decoy_positions(gap, 3, torch.tensor([1])).tolist() == [3, 4, 2]
    assert decoy_positions(gap, 9, torch.tensor([0, 1, 2, 3])).tolist() == [4]


def _decoy_by_hand(w0, steps, lr, mu, wd, thr):
    """The decoy coordinate alone (its clean-loss gradient is 0: a dead input): loss term
    (−10·|w − 0| while |w| ≤ thr, else 1e-10·|w|)/2, slope +1 at 0, torch SGD momentum."""
    w, buf = w0, 0.0
    for _ in range(steps):
        s = 1.0 if w >= 0 else -1.0
        g = (-10.0 * s if abs(w) <= thr else 1e-10 * s) / 2 + wd * w
        buf = mu * buf + g
        w = w - lr * buf
    return w


def test_decoy_model_by_hand_and_against_torch_sgd():
    torch.manual_seed(3)
    lin = torch.nn.Linear(16, 10)
    with torch.no_grad():
        lin.weight[4, 0] = 0.0  # the decoy parameter: weight of the always-dark pixel 0 into class 4
    view = BatchedTrainer(_CE(), lin, ParamSpec.of(lin)).view(10, (16,))
    g0 = ParamSpec.of(lin).flatten(lin).detach()
    data = _data(0, n=40)
    p = 4 * 16 + 0  # row-major (out, in)
    epochs, bs, lr, mu, wd = 3, 16, 0.1, 0.9, 5e-4  # 3 batches per pass (16, 16, 8) → 9 steps
    benign = g0.clone()  # the benign model's value at p stays 0 (no gradient, decay of 0)
    gen = torch.Generator().manual_seed(7)
    dec = train_decoy(g0, benign, p, view, data.x, data.y, 3 * epochs, bs, lr, mu, wd, 10.0, gen)
    assert float(dec[p]) == pytest.approx(_decoy_by_hand(0.0, 9, lr, mu, wd, 10.0), rel=1e-6)
    # the rest of the decoy: SGD on CE/2 with the same batches, written out per tensor as
    # torch.optim.SGD defines it (d = ∇ + wd·p, b ← μb + d, p ← p − lr·b)
    wt, bt = lin.weight.detach().clone(), lin.bias.detach().clone()
    bw, bb = torch.zeros_like(wt), torch.zeros_like(bt)
    g = torch.Generator().manual_seed(7)
    for _ in range(epochs):
        perm = torch.randperm(40, generator=g)
        for s in range(0, 40, bs):
            i = perm[s: s + bs]
            wt.requires_grad_(True), bt.requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(data.x[i] @ wt.T + bt, data.y[i]) / 2
            gw, gb = torch.autograd.grad(loss, (wt, bt))
            with torch.no_grad():
                bw, bb = mu * bw + gw + wd * wt, mu * bb + gb + wd * bt
                wt, bt = wt - lr * bw, bt - lr * bb
    want = torch.cat([wt.detach().reshape(-1), bt.detach()])
    keep = torch.ones_like(want, dtype=torch.bool)
    keep[p] = False
    assert torch.allclose(dec[keep], want[keep], atol=1e-6)
    # the 9 steps cross the threshold (the push stops at |gap| > 10, momentum carries it on)
    assert _decoy_by_hand(0.0, 6, lr, mu, wd, 10.0) < 10.0 < _decoy_by_hand(0.0, 7, lr, mu, wd, 10.0)
    assert _decoy_by_hand(0.0, 9, lr, mu, wd, 10.0) != pytest.approx(_decoy_by_hand(0.0, 9, lr, mu, wd, 1e9))


def test_a_decoy_takes_the_principal_axis_from_the_backdoor_row():
    # the released PCA toy example: benign rows spread in [0, 1]², a backdoor row at (2, 0.5) is
    # alone at one end of the first principal axis; a decoy at (0.5, 3) takes the axis (it is
    # an outlier in one coordinate, as a decoy model with its 10-sized gap is), and on it the
    # backdoor row projects inside the benign range
    g = torch.Generator().manual_seed(0)
    benign = torch.rand(10, 2, generator=g, dtype=torch.float64)
    benign += torch.tensor([0.5, 0.5], dtype=torch.float64) - benign.mean(0)
    bd = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    decoy = torch.tensor([[0.5, 3.0]], dtype=torch.float64)

    def first_pc(rows):
        c = rows - rows.mean(0)
        return torch.linalg.svd(c, full_matrices=False).Vh[0], rows.mean(0)

    for rows, inside in ((torch.cat([bd, benign]), False), (torch.cat([bd, benign, decoy]), True)):
        v, mu = first_pc(rows)
        proj = (rows - mu) @ v
        lo, hi = float(proj[1:11].min()), float(proj[1:11].max())
        assert (lo <= float(proj[0]) <= hi) == inside


def test_decoy_rows_in_a_round():
    view, g0 = _mlp_view()
    atk = ThreeDFed(initial_decoys=1, **FAST)
    state: dict = {}
    out = atk.craft_updates(_ctx(view, g0, 0, state=state))
    rec = state["3dfed"]["records"][-1]
    assert rec["k"] == 1 and rec["n_backdoor"] == 2
    # the last row is the decoy; it carries the third indicator, the backdoor rows the first two.
    # Its decoy parameter is a first-layer weight of the always-dark pixel 0 (there both updates
    # get no gradient: |Δ − Δ_benign| = 0 there), not an indicator; the decoy trains one step
    # (benign_steps = 1): its gradient there is the push −10·(+1)/2 = −5 (a zero gap pushes
    # upwards; no clean-loss gradient, no weight decay), so it moves by lr·5 = 0.5
    pos = rec["positions"]
    assert torch.equal(out[torch.arange(3), pos], rec["values"])
    dec = out[2].clone()
    dec[pos[2]] = 0
    spot = int(dec[: 16 * 8].abs().argmax())
    assert spot % 16 == 0 and spot not in pos.tolist()
    assert float(dec[spot]) == pytest.approx(0.5, abs=1e-6)
    assert float(out[0, : 16 * 8].abs().max()) < 0.5
    # max_decoys caps k (at least one backdoor row remains by default: k ≤ f − 1)
    atk2 = ThreeDFed(initial_decoys=5, **FAST)
    state = {}
    atk2.craft_updates(_ctx(view, g0, 0, state=state))
    assert state["3dfed"]["records"][-1]["k"] == 2
    atk3 = ThreeDFed(initial_decoys=5, max_decoys=0, **FAST)
    state = {}
    atk3.craft_updates(_ctx(view, g0, 0, state=state))
    assert state["3dfed"]["records"][-1]["k"] == 0


def test_noise_masks_touch_only_non_target_output_rows():
    view, g0 = _mlp_view()
    # without masks (mask_coefficients zero and no noise) the backdoor rows are identical but for
    # their indicators; with them they differ only in the output layer, never in the target's row
    base = ThreeDFed(noise_std=0.0, mask_coefficients=(0.0, 0.0, 0.0), target=3, **FAST)
    out = base.craft_updates(_ctx(view, g0, 0))
    masked = ThreeDFed(target=3, **FAST).craft_updates(_ctx(view, g0, 0))
    d = 16 * 8 + 8
    head_w = slice(d, d + 80)
    diff = (masked - out).abs()
    assert float(diff[:, :d].max()) < 1e-5 < float(diff[:, head_w].max())
    assert float(diff[:, d + 3 * 8: d + 4 * 8].max()) == 0.0 and float(diff[:, d + 80 + 3].max()) == 0.0


# ---------------------------------------------------------------- parameters and contract
@pytest.mark.parametrize("field, value", [
    ("poison_steps", 0), ("benign_steps", 1.5), ("batch_size", 0), ("lr", 0), ("lr", float("nan")),
    ("momentum", 1.0), ("weight_decay", -1), ("weight_scale", 0.5), ("group_size", 0), ("num_neurons", 0),
    ("alpha_min", 1.0), ("lagrange_step", -0.1), ("mask_steps", -1), ("noise_std", -1.0),
    ("mask_coefficients", (0.1, 0.1)), ("loss_weights", (0.3, 0.0, 0.4)), ("loss_weights", (1, 1, -1)),
    ("num_candidates", 0), ("indicator_scale", 1.0), ("indicator_floor", 0.0), ("feedback_threshold", 1.0),
    ("clip_ratio", 0.0), ("decoy_threshold", 0), ("initial_decoys", -1), ("max_decoys", -2),
    ("target", -1), ("trigger", [[9, 9]]), ("image_shape", [0, 4]), ("value", float("inf")),
    ("indicator_layer", ""), ("decoy_layer", 3), ("data", "all"),
])
def test_bad_parameters_name_the_field(field, value):
    with pytest.raises(InvalidParameter, match=rf"ThreeDFed\.{field} = "):
        ThreeDFed(**{field: value})


def test_runtime_refusals_name_the_field():
    view, g0 = _mlp_view()
    with pytest.raises(InvalidParameter, match=r"ThreeDFed\.indicator_layer = 'nope'"):
        ThreeDFed(indicator_layer="nope", **FAST).craft_updates(_ctx(view, g0, 0))
    with pytest.raises(InvalidParameter, match=r"ThreeDFed\.target = 12"):
        ThreeDFed(target=12, **FAST).craft_updates(_ctx(view, g0, 0))


def test_registered_and_contract():
    atk = redteam.attack("3dfed")
    assert isinstance(atk, ThreeDFed) and atk.needs_model
    from redteam.testing import check_attack

    check_attack("3dfed", max_examples=6)
