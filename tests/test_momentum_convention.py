"""Issue 19 items 4 and 10: what a malicious client sends under worker momentum
(``[federation] malicious_momentum``), and what a round with no contributor does
(``[federation] empty_round``). Expected values are derived by hand in the comments.

The release (epfml/byzantine-robust-noniid-optimizer, ``utils.py: initialize_worker``):
honest workers are ``MomentumWorker``s (PyTorch momentum m ← βm + g, sent as the gradient);
the bit-flipping worker (``codes/attacks/bitflipping.py``) and the label-flipping worker
(``codes/attacks/labelflipping.py``) are ``ByzantineWorker(TorchWorker)``s with no momentum:
they send their fresh gradient (negated, or on flipped labels). ALIE, IPM and mimic craft
from the honest workers' ``get_gradient()``, i.e. their momenta."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from redteam.errors import InvalidScenario
from redteam.federation import stages
from redteam.federation.loop import Federation
from redteam.federation.server_opt import EMPTY_ROUNDS, FedAdam, FedAvg, Nesterov
from redteam.federation.state import ClientStates, apply_momentum
from redteam.scenario import parse_scenario
from redteam.types import Attack, AttackContext, Surface


def _ids(*c):
    return torch.tensor(c, dtype=torch.long)


def _doc(attack="none", defense="mean", **fed):
    return {"scenario": {"seed": 1}, "workload": {"name": "digits", "hidden": 8},
            "federation": {"clients": 6, "rounds": 3, "local_steps": 1, "batch_size": 4, "lr": 0.1,
                           "malicious_fraction": 0.34, "partition": "iid", **fed},
            "attack": attack, "defense": defense}


# ------------------------------------------------------------------ apply_momentum, raw rows
@pytest.mark.parametrize("form", ["sgd", "ema"])
def test_raw_rows_send_the_fresh_term_and_keep_no_state(form):
    # β = 0.5, clients 0 (honest) and 1 (raw). Round 1: Δ = (2, 4) for both; round 2: Δ = (6, 0).
    # sgd: honest m1 = (2, 4), m2 = 0.5·(2, 4) + (6, 0) = (7, 2); raw sends Δ: (2, 4), (6, 0).
    # ema: honest m1 = 0.5·(2, 4) = (1, 2), m2 = 0.5·(6, 0) + 0.5·(1, 2) = (3.5, 1);
    #      raw sends (1 − β)·Δ: (1, 2), (3, 0).
    s = ClientStates(2, torch.device("cpu"))
    raw = torch.tensor([False, True])
    d1 = torch.tensor([[2.0, 4.0], [2.0, 4.0]])
    d2 = torch.tensor([[6.0, 0.0], [6.0, 0.0]])
    out1 = apply_momentum(s, _ids(0, 1), d1, 0.5, form, raw)
    out2 = apply_momentum(s, _ids(0, 1), d2, 0.5, form, raw)
    if form == "sgd":
        want1, want2 = [[2.0, 4.0], [2.0, 4.0]], [[7.0, 2.0], [6.0, 0.0]]
    else:
        want1, want2 = [[1.0, 2.0], [1.0, 2.0]], [[3.5, 1.0], [3.0, 0.0]]
    assert out1.tolist() == want1 and out2.tolist() == want2
    # the raw client's momentum row is never written: zeros, as a client that never took part
    assert s.tensors["momentum"][1].tolist() == [0.0, 0.0]
    assert s.tensors["momentum"][0].tolist() == want2[0]


def test_raw_rows_leave_the_honest_rows_bit_identical():
    g = torch.Generator().manual_seed(0)
    deltas = [torch.randn(5, 7, generator=g) for _ in range(3)]
    a, b = ClientStates(5, torch.device("cpu")), ClientStates(5, torch.device("cpu"))
    raw = torch.tensor([False, True, False, True, False])
    for d in deltas:
        plain = apply_momentum(a, _ids(0, 1, 2, 3, 4), d, 0.9, "ema")
        mixed = apply_momentum(b, _ids(0, 1, 2, 3, 4), d, 0.9, "ema", raw)
        assert torch.equal(plain[~raw], mixed[~raw])
        assert torch.equal(mixed[raw], (1.0 - 0.9) * d[raw])
    # β = 0: the deltas themselves, raw rows or not
    two = deltas[0][:2]
    assert apply_momentum(a, _ids(0, 1), two, 0.0, "ema", torch.tensor([True, True])) is two


# ------------------------------------------------------------------ in the federation
@dataclasses.dataclass(frozen=True, slots=True)
class _Spy(Attack):
    """Sends its own rows unchanged (an attack that acts), recording each round's context."""

    surfaces = (Surface.UPDATES,)
    omniscient = True
    seen: list = dataclasses.field(default_factory=list)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        self.seen.append(ctx)
        return ctx.own_updates


def _fixed_training(fed, monkeypatch):
    """Local training replaced by fixed deltas Δ(c, r) = (c+1)(r+1)·0.001·1."""
    calls = {"r": 0}

    def fixed(params, data, clients, cfg, gen, **kw):
        r = calls["r"]
        calls["r"] += 1
        scale = (clients.to(torch.float32) + 1)[:, None] * (r + 1) * 1e-3
        return params + scale * torch.ones_like(params)

    monkeypatch.setattr(fed.trainer, "train", fixed)


# β = 0.5, Δ(c, r) = (c+1)(r+1)·0.001. Coefficients of (c+1)·0.001 for rounds 0, 1, 2:
#   sgd momentum: m0 = 1, m1 = 0.5·1 + 2 = 2.5, m2 = 0.5·2.5 + 3 = 4.25;  sgd raw: Δ = 1, 2, 3
#   ema momentum: m0 = 0.5·1 = 0.5, m1 = 0.5·2 + 0.5·0.5 = 1.25, m2 = 0.5·3 + 0.5·1.25 = 2.125;
#   ema raw: (1 − β)·Δ = 0.5, 1, 1.5
COEF = {("sgd", "momentum"): [1.0, 2.5, 4.25], ("sgd", "raw"): [1.0, 2.0, 3.0],
        ("ema", "momentum"): [0.5, 1.25, 2.125], ("ema", "raw"): [0.5, 1.0, 1.5]}


@pytest.mark.parametrize("form", ["sgd", "ema"])
@pytest.mark.parametrize("convention", ["raw", "momentum"])
def test_what_the_malicious_clients_send_by_hand(monkeypatch, form, convention):
    fed = Federation(parse_scenario(_doc(client_momentum=0.5, momentum_form=form,
                                         malicious_momentum=convention)))
    spy = _Spy()
    fed.attack, fed.omniscient = spy, True
    _fixed_training(fed, monkeypatch)
    fed.run()
    assert len(spy.seen) == 3
    for r, ctx in enumerate(spy.seen):
        own = torch.tensor([(c + 1) * COEF[(form, convention)][r] * 1e-3 for c in ctx.malicious])
        honest = torch.tensor([(c + 1) * COEF[(form, "momentum")][r] * 1e-3 for c in ctx.visible_clients])
        assert torch.allclose(ctx.own_updates[:, 0], own, rtol=1e-5), (r, ctx.own_updates[:, 0], own)
        # the honest clients send their momentum whatever the malicious convention
        assert torch.allclose(ctx.visible_updates[:, 0], honest, rtol=1e-5), (r, ctx.visible_updates[:, 0])


def test_default_is_the_release_raw_convention():
    assert parse_scenario(_doc()).federation.malicious_momentum == "raw"
    assert parse_scenario(_doc()).federation.empty_round == "skip"


def _records(doc):
    res = Federation(parse_scenario(doc)).run()
    return [(r.accuracy, r.loss, r.accepted) for r in res.records]


@pytest.mark.parametrize("attack", [{"name": "alie"}, {"name": "ipm", "epsilon": 0.1}, {"name": "mimic"}])
def test_omniscient_crafting_attacks_are_unaffected(attack):
    # ALIE, IPM and mimic craft from the honest clients' sent vectors (their momenta), so the
    # malicious clients' own momentum convention changes nothing, bit for bit
    raw = _records(_doc(attack=attack, defense="median", client_momentum=0.9, momentum_form="ema",
                        malicious_momentum="raw"))
    mom = _records(_doc(attack=attack, defense="median", client_momentum=0.9, momentum_form="ema",
                        malicious_momentum="momentum"))
    assert raw == mom


def test_no_attack_keeps_the_would_be_attackers_honest():
    # under attack "none" the would-be attackers are honest clients: they keep their momentum
    # under either convention (the two runs are the same, bit for bit)
    assert _records(_doc(client_momentum=0.9, malicious_momentum="raw")) == \
        _records(_doc(client_momentum=0.9, malicious_momentum="momentum"))


@pytest.mark.parametrize("attack", [{"name": "sign_flip", "variant": "own"}, {"name": "label_flip"}])
def test_bit_flip_and_label_flip_follow_the_convention(attack):
    # their sent rows are the malicious clients' own: the convention changes the run ...
    raw = _records(_doc(attack=attack, client_momentum=0.9, momentum_form="ema", malicious_momentum="raw"))
    mom = _records(_doc(attack=attack, client_momentum=0.9, momentum_form="ema", malicious_momentum="momentum"))
    assert raw != mom
    # ... but not at β = 0, where the fresh term is the delta itself
    assert _records(_doc(attack=attack, malicious_momentum="raw")) == \
        _records(_doc(attack=attack, malicious_momentum="momentum"))


@dataclasses.dataclass(frozen=True, slots=True)
class _FlipSpy(Attack):
    """Bit flip (−own) that records the rows it flips."""

    surfaces = (Surface.UPDATES,)
    seen: list = dataclasses.field(default_factory=list)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        self.seen.append((ctx.own_updates.clone(), ctx.visible_updates.clone()))
        return -ctx.own_updates


@pytest.mark.parametrize("convention", ["raw", "momentum"])
def test_ema_at_lr_is_the_release_pytorch_form_at_lr_times_one_minus_beta(convention):
    # The release: PyTorch momentum m ← βm + g at lr η_s, the bit flipper sends −g. One local
    # SGD step gives Δ = −lr·g, so with momentum_form "sgd" at lr η_s every sent row is −η_s ×
    # the release's vector; with "ema" at lr η_e = η_s / (1 − β) an honest row is
    # (1 − β)·Σβᵏ(−η_e g) = −η_s Σβᵏ g: the same row — and the raw attacker's row must be
    # (1 − β)·Δ = −η_s g for the two runs to be the same run. (Sending Δ under "ema" would make
    # it 1/(1 − β) = 10× the release's size relative to the honest rows.)
    beta, eta_s = 0.9, 0.02
    spies = {}
    for form, lr in (("sgd", eta_s), ("ema", eta_s / (1 - beta))):
        fed = Federation(parse_scenario(_doc(client_momentum=beta, momentum_form=form, lr=lr,
                                             malicious_momentum=convention, rounds=4)))
        fed.attack, fed.omniscient = _FlipSpy(), True
        spies[form] = fed.attack
        fed.run()
    for r, ((own_s, vis_s), (own_e, vis_e)) in enumerate(zip(spies["sgd"].seen, spies["ema"].seen)):
        scale = own_s.abs().max()
        assert torch.allclose(own_s, own_e, rtol=1e-3, atol=1e-4 * scale), (r, (own_s - own_e).abs().max(), scale)
        assert torch.allclose(vis_s, vis_e, rtol=1e-3, atol=1e-4 * vis_s.abs().max()), r


def test_raw_row_is_the_momentum_row_less_its_history_in_real_training():
    # Real training, "ema", β = 0.9. Round 0 sends the same under both conventions (a
    # momentum from zero is the fresh term), so round 1 starts from the same model and the
    # same Δ₁: the momentum row m₁ = (1 − β)Δ₁ + β·m₀ exceeds the raw row (1 − β)Δ₁ by exactly
    # β × the round-0 row.
    seen = {}
    for convention in ("raw", "momentum"):
        fed = Federation(parse_scenario(_doc(client_momentum=0.9, momentum_form="ema", malicious_momentum=convention)))
        fed.attack, fed.omniscient = _FlipSpy(), True
        seen[convention] = fed.attack.seen
        fed.run()
    (raw0, hon_raw0), (mom0, hon_mom0) = seen["raw"][0], seen["momentum"][0]
    assert torch.equal(raw0, mom0) and torch.equal(hon_raw0, hon_mom0)
    (raw1, hon_raw1), (mom1, hon_mom1) = seen["raw"][1], seen["momentum"][1]
    assert torch.equal(hon_raw1, hon_mom1)  # the honest clients are the same in both runs
    assert torch.allclose(mom1 - raw1, 0.9 * raw0, atol=1e-7)
    assert not torch.allclose(mom1, raw1, atol=1e-7)


def test_malicious_momentum_is_validated():
    with pytest.raises(InvalidScenario, match=r"malicious_momentum = \"ema\": expected one of \"raw\", \"momentum\""):
        parse_scenario(_doc(malicious_momentum="ema"))
    with pytest.raises(InvalidScenario, match=r"empty_round = \"zero\": expected one of \"skip\", \"momentum\""):
        parse_scenario(_doc(empty_round="zero"))
    with pytest.raises(InvalidScenario, match="empty_round"):
        parse_scenario(_doc(empty_round=True))


# ------------------------------------------------------------------ empty rounds
def _bare(opt, rule):
    return SimpleNamespace(server_opt=opt, scenario=SimpleNamespace(federation=SimpleNamespace(empty_round=rule)))


def test_empty_round_names_match_the_scenario_key():
    import typing

    from redteam.scenario import FederationSpec

    assert typing.get_args(typing.get_type_hints(FederationSpec)["empty_round"]) == EMPTY_ROUNDS
    assert EMPTY_ROUNDS[0] == "skip"


def test_three_empty_rounds_under_skip_leave_nesterov_bit_identical():
    opt = Nesterov(lr=0.7, momentum=0.9)
    fed = _bare(opt, "skip")
    params = torch.tensor([0.25, -1.5, 3.0])
    state = opt.init(params)
    params, state, applied, ev = stages.server_step(fed, params, torch.ones(3), state, [0], [torch.ones(3)], [0])
    assert ev is None and bool(state["b"].abs().sum() > 0)
    before_p, before_b = params.clone(), state["b"].clone()
    for _ in range(3):
        params, state, applied, ev = stages.server_step(fed, params, torch.zeros(3), state, [], [], [])
        assert ev is None and torch.equal(applied, torch.zeros(3))
    assert torch.equal(params, before_p) and torch.equal(state["b"], before_b)


def test_empty_rounds_under_momentum_follow_the_stale_outer_momentum_by_hand():
    # Nesterov η = 0.7, μ = 0.9 from w = 0, b = 0. Round 1 Δ = 1 (g = −1): b = −1,
    # w = 0 − 0.7·(−1 + 0.9·(−1)) = 1.33. Empty round (g = 0): b = 0.9·(−1) = −0.9,
    # w = 1.33 − 0.7·(0.9·(−0.9)) = 1.33 + 0.567 = 1.897; again: b = −0.81,
    # w = 1.897 + 0.7·0.729 = 2.4073; again: b = −0.729, w = 2.4073 + 0.7·0.6561 = 2.86657.
    opt = Nesterov(lr=0.7, momentum=0.9)
    fed = _bare(opt, "momentum")
    params = torch.zeros(1, dtype=torch.float64)
    state = opt.init(params)
    params, state, *_ = stages.server_step(fed, params, torch.ones(1, dtype=torch.float64), state, [0],
                                           [torch.ones(1)], [0])
    assert params.item() == pytest.approx(1.33)
    for want in (1.897, 2.4073, 2.86657):
        params, state, applied, ev = stages.server_step(fed, params, torch.zeros(1, dtype=torch.float64), state,
                                                        [], [], [])
        assert ev is None and params.item() == pytest.approx(want)
    # FedAvg does not move on a zero update under either rule; FedAdam does under "momentum"
    p = torch.tensor([1.0])
    assert torch.equal(stages.server_step(_bare(FedAvg(), "momentum"), p, torch.zeros(1), {}, [], [], [])[0], p)
    adam = FedAdam(lr=0.1)
    st = {"m": torch.tensor([0.5]), "v": torch.tensor([0.25])}
    # m = 0.9·0.5 = 0.45, v = 0.99·0.25 = 0.2475: w = 1 + 0.1·0.45 / (√0.2475 + 0.001) = 1.0902723
    moved = stages.server_step(_bare(adam, "momentum"), p, torch.zeros(1), st, [], [], [])[0]
    assert moved.item() == pytest.approx(1 + 0.1 * 0.45 / (0.2475 ** 0.5 + 1e-3), rel=1e-6)
    kept, kept_st, *_ = stages.server_step(_bare(adam, "skip"), p, torch.zeros(1), st, [], [], [])
    assert torch.equal(kept, p) and kept_st is st


def _everyone_leaves(rule, opt="nesterov"):
    """Round 0 trains (Nesterov's buffer b ≠ 0); from round 1 every client has left (churn 1,
    no rejoin): rounds 1–3 have no contributor."""
    doc = _doc(rounds=4, server_optimizer=opt, server_lr=0.7, empty_round=rule)
    doc["transport"] = {"network": {"churn_leave": 1.0, "churn_join": 0.0}}
    fed = Federation(parse_scenario(doc))
    seen = []
    evaluate = fed.trainer.evaluate

    def spy(flat, x, y):
        seen.append(flat.clone())
        return evaluate(flat, x, y)

    fed.trainer.evaluate = spy
    res = fed.run()
    return res, seen[1:]  # seen[0]: the untrained reference of round 0


def test_federation_with_three_empty_rounds_keeps_the_model_under_skip():
    res, params = _everyone_leaves("skip")
    assert [sum(r.participating) for r in res.records] == [6, 0, 0, 0]
    assert [r.extra.get("empty_round") for r in res.records] == [None, "skip", "skip", "skip"]
    after_round0 = params[0]
    for p in params[1:4]:
        assert torch.equal(p, after_round0)
    assert len({r.loss for r in res.records}) == 1


def test_federation_with_three_empty_rounds_drifts_under_momentum():
    res, params = _everyone_leaves("momentum")
    assert [r.extra.get("empty_round") for r in res.records] == [None, "momentum", "momentum", "momentum"]
    # each empty round moves the model by −ημ²b along the stale buffer
    assert not torch.equal(params[1], params[0]) and not torch.equal(params[2], params[1])
    assert len({r.loss for r in res.records}) == 4
