"""BackdoorIndicator (Li & Dai, USENIX Security 2024) and the engine's broadcast hook
(``Defense.prepares_broadcast`` / ``broadcast``): the indicator statistic and the threshold
decision on hand-made predictions, the planting objective against a hand-written gradient, what
the round builds on the broadcast model, parameter errors, and the regimes that refuse it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch

from defenses.indicator import BackdoorIndicator, indicator_accuracy, indicator_labels
from redteam.errors import InvalidParameter
from redteam.types import Decision, Defense, ModelView, ServerContext

C = 10


# -- the statistic ------------------------------------------------------------------------
def test_indicator_accuracy_worked_example():
    # labels 0 ×4, 1 ×4, 2 ×2; the model gets 3/4 of label 0, 4/4 of label 1, 0/2 of label 2
    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    pred = torch.tensor([0, 0, 0, 5, 1, 1, 1, 1, 0, 0])
    assert indicator_accuracy(pred, y, 3, "max_label") == (1.0, 1)
    assert indicator_accuracy(pred, y, 3, "overall") == (pytest.approx(7 / 10), -1)
    # one wrong answer in label 1: labels 0 and 1 tie at 3/4, the lower label is named
    pred[4] = 2
    assert indicator_accuracy(pred, y, 3, "max_label") == (0.75, 0)
    # a label with no sample (class 3 of 4) is skipped, not read as 0/0
    assert indicator_accuracy(pred, y, 4, "max_label") == (0.75, 0)


def test_indicator_labels_are_even_over_the_classes_and_fixed_by_the_seed():
    y = indicator_labels(768, 10, seed=0)
    # 768 = 76·10 + 8: labels 0…7 carry 77 samples, 8 and 9 carry 76 (the release's assignment)
    assert torch.bincount(y, minlength=10).tolist() == [77] * 8 + [76] * 2
    assert torch.equal(y, indicator_labels(768, 10, seed=0))
    assert not torch.equal(y, indicator_labels(768, 10, seed=1))


# -- the threshold decision on hand-made indicator accuracies --------------------------------
def _keeper_view(x_ind: torch.Tensor, y_ind: torch.Tensor) -> ModelView:
    """A model whose row (C,) says, per label c, how many of that label's indicator samples it
    still classifies as c: sample j (label c, rank r among label c's samples) is answered c when
    r < row[c], else c + 1 (mod C)."""
    flat_x = x_ind.reshape(x_ind.shape[0], -1).to(torch.float64)
    rank = torch.zeros_like(y_ind)
    for c in range(C):
        where = (y_ind == c).nonzero().flatten()
        rank[where] = torch.arange(where.numel())

    def forward(flat, x):
        xs = x.reshape(x.shape[0], -1).to(torch.float64)
        j = (xs[:, None, :] == flat_x[None, :, :]).all(-1).to(torch.int64).argmax(1)
        lab, r = y_ind[j], rank[j]
        pred = torch.where(r.to(flat.dtype) < flat[lab], lab, (lab + 1) % C)
        return torch.nn.functional.one_hot(pred, C).to(flat.dtype) * 10.0

    return ModelView(forward=forward, loss=lambda out, y: torch.nn.functional.cross_entropy(out, y),
                     features=lambda flat, x: x.reshape(x.shape[0], -1), layers=(("w", 0, C, (C,)),),
                     head=("w",), input_shape=(1, 4, 4), num_classes=C)


def _keeper_ctx(defense: BackdoorIndicator, n: int) -> ServerContext:
    probe = ServerContext(round=0, model=ModelView(forward=None, loss=None, features=None, layers=(), head=(),
                                                   input_shape=(1, 4, 4), num_classes=C))
    x, y = defense.indicator_set(probe, torch.float64, "cpu")
    return ServerContext.default(torch.zeros(n, C, dtype=torch.float64), global_params=torch.zeros(C,
                                 dtype=torch.float64), model=_keeper_view(x, y))


def test_threshold_decision_worked_example():
    # 100 noise samples in batches of 10: exactly 10 indicator samples per label
    d = BackdoorIndicator(threshold=0.9, ood_source="noise", match_root=False, ood_samples=100, batch_size=10)
    rows = torch.tensor([
        [3, 4, 2, 5, 3, 4, 1, 2, 3, 4],  # honest, erased: BIA 5/10 = 0.5 (label 3)      -> kept
        [8, 2, 2, 2, 2, 2, 2, 2, 2, 2],  # 8/10 on label 0: 0.8 < 0.9                      -> kept
        [9, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # 9/10 on label 0: exactly on the threshold       -> flagged
        [2, 2, 2, 2, 2, 2, 10, 2, 2, 2],  # a backdoor to label 6 keeps all 10: 1.0        -> flagged
    ], dtype=torch.float64)
    ctx = _keeper_ctx(d, 4)
    dec = d(rows, ctx)
    assert dec.state["bia"] == pytest.approx([0.5, 0.8, 0.9, 1.0])
    assert dec.state["label"] == [3, 0, 0, 6]
    assert dec.accepted.tolist() == [True, True, False, False]
    # the plain mean of the two accepted rows (the release's unweighted aggregation)
    assert dec.aggregate.tolist() == pytest.approx(((rows[0] + rows[1]) / 2).tolist())
    assert dec.weights.tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0])
    assert "indicator accuracy 0.9000 (label 0) ≥ threshold 0.9" in dec.reasons[2]
    # statistic "overall": the plain indicator accuracy, (sum of the row) / 100
    dec_o = BackdoorIndicator(threshold=0.3, statistic="overall", ood_source="noise", match_root=False,
                              ood_samples=100, batch_size=10)(rows, ctx)
    assert dec_o.state["bia"] == pytest.approx([0.31, 0.26, 0.18, 0.28])
    assert dec_o.accepted.tolist() == [False, True, True, True]


def test_rounds_before_start_round_accept_every_finite_row():
    d = BackdoorIndicator(start_round=3, ood_source="noise", match_root=False, ood_samples=100, batch_size=10)
    rows = torch.tensor([[10.0] * C, [1.0] * C, [math.nan] * C], dtype=torch.float64)
    ctx = _keeper_ctx(d, 3)
    dec = d(rows, ServerContext.default(rows, global_params=ctx.global_params, model=ctx.model, round=2))
    assert dec.accepted.tolist() == [True, True, False] and dec.state["bia"] == [None, None, None]
    assert dec.aggregate.tolist() == pytest.approx([5.5] * C)
    assert d(rows, ServerContext.default(rows, global_params=ctx.global_params, model=ctx.model,
                                         round=3)).accepted.tolist() == [False, True, False]


def test_without_a_model_view_it_refuses():
    rows = torch.zeros(2, 5)
    with pytest.raises(InvalidParameter, match="needs the model"):
        BackdoorIndicator(ood_source="noise")(rows, ServerContext.default(rows, global_params=torch.zeros(5)))


# -- the planting (broadcast) -------------------------------------------------------------
def _linear_view() -> ModelView:
    def forward(flat, x):
        w = flat[: 16 * C].reshape(16, C)
        return x.reshape(x.shape[0], 16).to(flat.dtype) @ w + flat[16 * C:]

    return ModelView(forward=forward, loss=lambda out, y: torch.nn.functional.cross_entropy(out, y),
                     features=lambda flat, x: x.reshape(x.shape[0], 16), layers=(("w", 0, 17 * C, (17 * C,)),),
                     head=("w",), input_shape=(1, 4, 4), num_classes=C)


def test_planting_two_steps_match_the_hand_written_gradient():
    # one batch of 20 noise samples, 2 epochs, no momentum: w₁ = G − η(∇CE(G) + λG) (the norm term
    # has gradient 0 at w = G), w₂ = w₁ − η(∇CE(w₁) + (μ/2)(w₁ − G)/‖w₁ − G‖ + λw₁);
    # ∇CE of a linear softmax: Xᵀ(softmax(XW + b) − onehot(y))/B for W, the column mean for b
    eta, mu, lam = 0.3, 0.4, 0.01
    d = BackdoorIndicator(ood_source="noise", match_root=False, ood_samples=20, batch_size=20, epochs=2, lr=eta,
                          momentum=0.0, weight_decay=lam, mu=mu, milestones=(1,), lr_gamma=1.0)
    view = _linear_view()
    G = torch.randn(17 * C, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 0.1
    ctx = ServerContext(round=0, global_params=G, model=view)
    x, y = d.indicator_set(ctx, torch.float64, "cpu")
    X = x.reshape(20, 16)

    def grad_ce(w):
        W, b = w[: 16 * C].reshape(16, C), w[16 * C:]
        p = torch.softmax(X @ W + b, dim=1) - torch.nn.functional.one_hot(y, C).to(torch.float64)
        return torch.cat([(X.T @ p / 20).reshape(-1), p.mean(0)])

    w1 = G - eta * (grad_ce(G) + lam * G)
    w2 = w1 - eta * (grad_ce(w1) + (mu / 2) * (w1 - G) / torch.linalg.vector_norm(w1 - G) + lam * w1)
    got = d.broadcast(G, ctx)
    assert torch.allclose(got, w2, atol=1e-12)
    # before start_round, or with no epochs, the global model is sent unchanged
    assert torch.equal(BackdoorIndicator(ood_source="noise", start_round=1).broadcast(G, ctx), G)
    assert torch.equal(BackdoorIndicator(ood_source="noise", epochs=0).broadcast(G, ctx), G)


def test_planting_teaches_the_indicator_and_projection_bounds_the_shift():
    d = BackdoorIndicator(ood_source="noise", match_root=False, ood_samples=40, batch_size=20, epochs=60, lr=0.5,
                          mu=0.0, weight_decay=0.0, momentum=0.9)
    view = _linear_view()
    G = torch.zeros(17 * C, dtype=torch.float64)
    ctx = ServerContext(round=0, global_params=G, model=view)
    x, y = d.indicator_set(ctx, torch.float64, "cpu")
    planted = d.broadcast(G, ctx)
    assert view.accuracy(G, x, y) <= 0.2 < 0.9 <= view.accuracy(planted, x, y)
    # the planted model keeps the indicator: its own row (zero delta) is flagged at the default threshold
    dec = BackdoorIndicator(ood_source="noise", match_root=False, ood_samples=40, batch_size=20)(
        torch.zeros(1, 17 * C, dtype=torch.float64), ServerContext.default(torch.zeros(1, 1), global_params=planted,
                                                                          model=view))
    assert dec.accepted.tolist() == [False]
    proj = BackdoorIndicator(ood_source="noise", match_root=False, ood_samples=40, batch_size=20, epochs=60, lr=0.5,
                             mu=0.0, weight_decay=0.0, projection_norm=0.25).broadcast(G, ctx)
    assert float(torch.linalg.vector_norm(proj - G)) == pytest.approx(0.25, rel=1e-9)


# -- the engine: what a round builds on the broadcast model -------------------------------------
@dataclass(frozen=True, slots=True)
class _Shift(Defense):
    """Sends the global model with its output bias raised by 0.5; averages the rows; records."""

    seen: dict = field(default_factory=dict, compare=False, repr=False)
    prepares_broadcast: ClassVar[bool] = True

    def broadcast(self, params, ctx):
        out = params.clone()
        out[ctx.model.span(ctx.model.layers[-1][0])] += 0.5
        self.seen.setdefault("in", []).append(params.clone())
        self.seen.setdefault("out", []).append(out.clone())
        self.seen.setdefault("ctx", []).append((ctx.round, ctx.client_ids, ctx.root_data is not None))
        return out

    def decide(self, updates, ctx):
        agg = updates.mean(0)
        self.seen.setdefault("global", []).append(ctx.global_params.clone())
        self.seen.setdefault("rows", []).append(updates.clone())
        self.seen.setdefault("agg", []).append(agg.clone())
        return Decision(aggregate=agg, accepted=torch.ones(updates.shape[0], dtype=torch.bool))


def test_the_round_trains_from_and_steps_from_the_broadcast_model():
    from redteam.federation.loop import Federation
    from redteam.registry import DEFENSES
    from redteam.scenario import parse_scenario

    DEFENSES.register("_shift_for_test", _Shift)
    try:
        sc = parse_scenario({"scenario": {"seed": 0}, "workload": {"name": "digits"},
                             "federation": {"clients": 4, "rounds": 3, "root_samples": 16},
                             "defense": {"name": "_shift_for_test"}})
        fed = Federation(sc)
        res = fed.run()
    finally:
        DEFENSES.unregister("_shift_for_test")
    seen = fed.defense.seen
    bias = slice(int(fed.spec.dim) - 10, int(fed.spec.dim))
    assert [c[0] for c in seen["ctx"]] == [0, 1, 2] and seen["ctx"][0][1] == (0, 1, 2, 3) and seen["ctx"][0][2]
    assert torch.equal(seen["in"][0], fed.params0)
    for r in range(3):
        # the defense sees the model sent as ctx.global_params
        assert torch.equal(seen["global"][r], seen["out"][r])
        # the clients trained from it: their output-bias deltas are small, not the −0.5 that training
        # from the unshifted model would show against the sent one
        assert float(seen["rows"][r][:, bias].abs().max()) < 0.2
        # the server stepped from the sent model: next global = sent + aggregate (FedAvg, η = 1)
        nxt = seen["in"][r + 1] if r < 2 else fed.final_params
        assert torch.allclose(nxt, seen["out"][r] + seen["agg"][r], atol=1e-6)
        assert res.records[r].extra["broadcast_shift"] == pytest.approx(0.5 * math.sqrt(10), rel=1e-5)


# -- parameters, regimes, contract ---------------------------------------------------------
@pytest.mark.parametrize("params, match", [
    ({"threshold": 1.5}, r"BackdoorIndicator.threshold = 1.5: must be a finite number ≥ 0 and ≤ 1"),
    ({"threshold": -0.1}, r"BackdoorIndicator.threshold = -0.1"),
    ({"statistic": "mean"}, r"BackdoorIndicator.statistic = 'mean': must be one of 'max_label', 'overall'"),
    ({"ood_source": "cifar100"}, r"BackdoorIndicator.ood_source = 'cifar100'"),
    ({"ood_samples": 0}, r"BackdoorIndicator.ood_samples = 0: must be an integer ≥ 1"),
    ({"ood_samples": 50, "batch_size": 64}, r"BackdoorIndicator.batch_size = 64: must be ≤ ood_samples = 50"),
    ({"epochs": -1}, r"BackdoorIndicator.epochs = -1"),
    ({"lr": 0.0}, r"BackdoorIndicator.lr = 0.0: must be a finite number > 0"),
    ({"momentum": 1.0}, r"BackdoorIndicator.momentum = 1.0: must be in \[0, 1\)"),
    ({"milestones": [0, 10]}, r"BackdoorIndicator.milestones = \[0, 10\]: must be a list of integers ≥ 1"),
    ({"mu": math.nan}, r"BackdoorIndicator.mu = nan"),
    ({"projection_norm": 0.0}, r"BackdoorIndicator.projection_norm = 0.0"),
    ({"start_round": -2}, r"BackdoorIndicator.start_round = -2"),
    ({"weighted": "yes"}, r"BackdoorIndicator.weighted = 'yes': must be true or false"),
])
def test_bad_parameters_name_the_field(params, match):
    with pytest.raises(InvalidParameter, match=match):
        BackdoorIndicator(**params)


def test_an_input_that_is_no_image_is_refused_by_name():
    rows = torch.zeros(1, 5)
    view = ModelView(forward=None, loss=None, features=None, layers=(), head=(), input_shape=(7,), num_classes=2)
    with pytest.raises(InvalidParameter, match=r"BackdoorIndicator.ood_source = 'fashion_mnist': cannot build the "
                                               r"indicator set: input shape \(7,\) is not an image"):
        BackdoorIndicator()(rows, ServerContext.default(rows, global_params=torch.zeros(5), model=view))


@pytest.mark.parametrize("regime", ["ASYNC", "GOSSIP", "PIPELINE"])
def test_regimes_without_a_broadcast_refuse_it(regime):
    import redteam.topology as topo
    from redteam.registry import ATTACKS

    support = getattr(topo, regime)
    none = ATTACKS.get("none")()
    with pytest.raises(InvalidParameter, match=(
            r"\[defense\] indicator: BackdoorIndicator prepares the model the server sends each round's clients "
            rf"\(prepares_broadcast\), and the {re.escape(support.label)} regime has no such broadcast; it runs in "
            r"the data-parallel regime")):
        topo.check_plugins(support, "none", none, BackdoorIndicator(), defense_label="indicator")
    topo.check_plugins(topo.DATA_PARALLEL, "none", none, BackdoorIndicator(), defense_label="indicator")


def test_an_upper_defense_may_not_prepare_the_broadcast():
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    sc = parse_scenario({"workload": {"name": "digits"}, "federation": {"clients": 8, "rounds": 1},
                         "hierarchy": {"depth": 2, "fan_out": 2, "upper_defense": {"name": "indicator"}}})
    with pytest.raises(InvalidParameter, match=r"\[hierarchy\].upper_defense: a rule that prepares the model"):
        Federation(sc)


def test_check_defense_passes():
    from redteam.testing import check_defense

    report = check_defense("indicator", max_examples=4)
    assert report.examples > 0
