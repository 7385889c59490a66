"""Spot-check replay inside the round (issue 25 §1, defenses/spot_check.py): the engine's replay
of a peer's local training, the filter on hand-made rows, the cheats it catches in a real
federation, the scenarios it refuses, and the metrics."""

from __future__ import annotations

import math

import pytest
import torch

from defenses.spot_check import SpotCheck
from redteam.errors import InvalidParameter
from redteam.federation.loop import Federation
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.scenario import Scenario, parse_scenario
from redteam.scoring import summarize, verification_metrics
from redteam.testing import RowReplay
from redteam.types import ClientData, RoundRecord, ServerContext


def doc_of(attack: str = "none", defense: dict | None = None, **fed) -> dict:
    return {
        "scenario": {"name": "spot", "seed": 0},
        "workload": {"name": "digits"},
        "federation": {"clients": 8, "malicious_fraction": 0.25, "rounds": 3, "local_steps": 4,
                       "batch_size": 16, "lr": 0.1, "partition": "iid", **fed},
        "attack": {"name": attack},
        "defense": {"pipeline": [defense or {"name": "spot_check", "fraction": 1.0}, {"name": "mean"}]},
    }


def scenario(attack: str = "none", defense: dict | None = None, **fed) -> Scenario:
    return parse_scenario(doc_of(attack, defense, **fed))


# ------------------------------------------------------------------ the engine's replay
def _toy_trainer() -> tuple[BatchedTrainer, StackedData]:
    from redteam.federation.builders import build_workload
    from redteam.federation.params import ParamSpec

    wl = build_workload("digits", {})
    model = wl.build_model(torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    clients = [ClientData(torch.rand(20 + 7 * i, 64, generator=g), torch.randint(0, 10, (20 + 7 * i,), generator=g))
               for i in range(5)]
    return BatchedTrainer(wl, model, ParamSpec.of(model)), StackedData.stack(clients)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cfg", [LocalTraining(steps=6, batch_size=8, lr=0.1),
                                 LocalTraining(steps=6, batch_size=8, lr=0.1, prox_mu=0.3, weight_decay=0.01),
                                 LocalTraining(epochs=1.0, batch_size=8, lr=0.1)])
def test_replay_recomputes_a_participant_within_float_rounding(cfg, threads):
    """Replaying rows [3, 0] of a 4-client call gives those clients' trained parameters: the
    same batches (the call's generator state), the same steps; only the batched products'
    rounding may differ (measured: ≤ 1e-6 of the update here, against the default tol 1e-4)."""
    torch.set_num_threads(threads)
    trainer, data = _toy_trainer()
    w = trainer.spec.flatten(trainer.model).detach()
    part = torch.tensor([4, 1, 2, 0])
    gen = torch.Generator().manual_seed(7)
    state = gen.get_state()
    local = trainer.train(w, data, part, cfg, gen)
    draws = cfg.steps if cfg.epochs is None else int(math.ceil(cfg.epochs * int(data.sizes[part].max()) / cfg.batch_size))
    again = trainer.replay(w, data, part, cfg, state, [3, 0], draws=draws)
    for k, row in enumerate([3, 0]):
        ref = local[row] - w
        rel = float((again[k] - local[row]).norm() / ref.norm())
        assert rel <= 1e-6, rel
    # a wrong batch stream (another generator state) is far off: the check has teeth
    other = torch.Generator().manual_seed(8).get_state()
    wrong = trainer.replay(w, data, part, cfg, other, [3], draws=draws)
    assert float((wrong[0] - local[3]).norm() / (local[3] - w).norm()) > 0.05


def test_replay_refuses_a_stateful_procedure():
    trainer, data = _toy_trainer()
    w = trainer.spec.flatten(trainer.model).detach()
    with pytest.raises(ValueError, match="only SGD"):
        trainer.replay(w, data, torch.tensor([0]), LocalTraining(optimizer="adamw"),
                       torch.Generator().get_state(), [0], draws=1)


# ------------------------------------------------------------------ the filter, by hand
def _ctx(rows: torch.Tensor, honest: torch.Tensor, ids=(10, 11, 12), state=None, rnd=0) -> ServerContext:
    return ServerContext.default(rows, client_ids=tuple(ids), replay_work=RowReplay(tuple(ids), honest),
                                 state=dict(state or {}), round=rnd)


def test_a_row_that_differs_from_its_replay_is_rejected_with_the_figure_and_banned():
    honest = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    sent = honest.clone()
    sent[2] = torch.tensor([3.0, 4.5])  # ‖Δ‖ = 0.5 against ‖r‖ = 5: relative 0.1
    sent[1] = sent[1] * (1 + 1e-6)      # within the band
    d = SpotCheck(fraction=1.0)(sent, _ctx(sent, honest))
    assert d.accepted.tolist() == [True, True, False]
    assert "0.1 of the replay's norm" in d.reasons[2]
    assert torch.allclose(d.aggregate, (sent[0] + sent[1]) / 2)  # equal weights, the two accepted
    assert d.state["caught"] == {12: 0} and d.state["spot_check"] == {"checked": [10, 11, 12], "rows": 3}
    # next round: client 12 is banned without a replay, even when its row is honest now
    d2 = SpotCheck(fraction=1.0)(honest, _ctx(honest, honest, state=d.state, rnd=1))
    assert d2.accepted.tolist() == [True, True, False] and "caught by spot-check in round 0" in d2.reasons[2]
    assert d2.state["spot_check"]["checked"] == [10, 11]
    # ban = false: checked again, and accepted when honest
    d3 = SpotCheck(fraction=1.0, ban=False)(honest, _ctx(honest, honest, state=d.state, rnd=1))
    assert d3.accepted.tolist() == [True, True, True]


def test_the_choice_of_who_is_checked_follows_client_ids_not_row_order():
    honest = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    sent = honest + 1.0  # every row a cheat: the rejected ones are exactly the checked ones
    ids = (5, 9, 2, 14, 7, 3)
    d = SpotCheck(fraction=0.5)(sent, _ctx(sent, honest, ids=ids))
    perm = [3, 0, 5, 1, 4, 2]
    ids_p = tuple(ids[i] for i in perm)
    dp = SpotCheck(fraction=0.5)(sent[perm], _ctx(sent[perm], honest[perm], ids=ids_p))
    caught = {ids[i] for i in range(6) if not d.accepted[i]}
    assert caught == {ids_p[i] for i in range(6) if not dp.accepted[i]} and 0 < len(caught) < 6


def test_rounds_to_catch_is_geometric_with_mean_one_over_p():
    """Checked with probability p each round, a cheat is caught after a geometric number of
    rounds, mean 1/p (p = 0.25: 4): 400 independent cheats, the mean within its 99.9 % band
    (sd of the geometric √(1−p)/p = 3.46, of the mean 0.17)."""
    p, trials = 0.25, 400
    honest = torch.zeros(1, 2)
    sent = torch.ones(1, 2)
    took = []
    for t in range(trials):
        state: dict = {}
        for rnd in range(200):
            ctx = ServerContext.default(sent, client_ids=(0,), replay_work=RowReplay((0,), honest), state=state,
                                        round=rnd, generator=torch.Generator().manual_seed(1000 * t + rnd))
            state = dict(SpotCheck(fraction=p)(sent, ctx).state)
            if state["caught"]:
                took.append(rnd + 1)
                break
    mean = sum(took) / len(took)
    assert len(took) == trials and abs(mean - 1 / p) < 3.3 * math.sqrt(1 - p) / p / math.sqrt(trials), mean


def test_without_a_replay_oracle_it_says_what_it_needs():
    x = torch.ones(3, 2)
    with pytest.raises(InvalidParameter, match="replay_work"):
        SpotCheck()(x, ServerContext.default(x))
    with pytest.raises(InvalidParameter, match="upper_defense"):
        SpotCheck()(x, ServerContext.default(x, client_ids=(), replay_work=RowReplay((), x[:0])))


# ------------------------------------------------------------------ in a federation
def test_honest_peers_all_pass_when_every_peer_is_checked_every_round():
    res = Federation(scenario("none")).run()
    for r in res.records:
        assert r.rejected == {} and r.extra["spot_check"]["checked"] == list(range(8))
    m = summarize(res.records)
    assert m["verification_cost"] == 1.0 and m["fp"] == 0


@pytest.mark.parametrize("attack", ["lazy_scaled", "score_gaming", "copy_noise", "label_flip"])
def test_every_cheat_is_caught_the_first_time_it_is_checked(attack):
    res = Federation(scenario(attack)).run()
    bad = [c for c, m in enumerate(res.records[0].malicious) if m]
    assert set(res.records[0].extra["spot_check"]["caught"]) == set(bad)
    for c in bad:
        assert "spot-check: its update differs from its replay" in res.records[0].rejected[c]
    m = summarize(res.records)
    assert m["rounds_to_catch"] == 1.0 and m["uncaught_cheats"] == 0 and m["fp"] == 0 and m["recall"] == 1.0


@pytest.mark.parametrize("fed, named", [
    ({"local_optimizer": "adamw"}, "local_optimizer"),
    ({"sampling": "without_replacement"}, "sampling"),
    ({"client_momentum": 0.9}, "client_momentum"),
])
def test_a_scenario_that_cannot_be_replayed_is_refused_by_name(fed, named):
    with pytest.raises(InvalidParameter, match=named):
        Federation(scenario("none", **fed))


def test_a_lossy_codec_is_refused_by_name():
    doc = doc_of("none")
    doc["transport"] = {"codec": "int8"}
    with pytest.raises(InvalidParameter, match="codec"):
        Federation(parse_scenario(doc))


@pytest.mark.parametrize("section, table", [("gossip", {"topology": "ring", "attackers": 1, "steps": 1}),
                                            ("async", {"buffer_size": 2})])
def test_other_regimes_refuse_it_by_name(section, table):
    from redteam.federation.regimes import make_run

    doc = doc_of("none")
    doc["federation"].pop("malicious_fraction")
    doc[section] = table
    with pytest.raises(InvalidParameter, match=rf"\[{section}\] regime"):
        make_run(parse_scenario(doc))


# ------------------------------------------------------------------ metrics by hand
def _rec(rnd: int, mal: list[bool], part: list[bool], spot: dict | None) -> RoundRecord:
    return RoundRecord(round=rnd, accuracy=0.5, loss=1.0, accepted=[True] * len(mal), malicious=mal,
                       participating=part, extra={} if spot is None else {"spot_check": spot})


def test_verification_metrics_by_hand():
    # 4 clients, 1 and 3 malicious; client 3 skips round 1; 1 caught in round 2, 3 never
    mal = [False, True, False, True]
    recs = [
        _rec(0, mal, [True] * 4, {"checked": [0], "rows": 4, "caught": {}}),
        _rec(1, mal, [True, True, True, False], {"checked": [2], "rows": 3, "caught": {}}),
        _rec(2, mal, [True] * 4, {"checked": [1, 2], "rows": 4, "caught": {"1": 2}}),
        _rec(3, mal, [True] * 4, {"checked": [], "rows": 4, "caught": {"1": 2}}),
    ]
    m = verification_metrics(recs)
    assert m == {"verification_cost": 4 / 15, "rounds_to_catch": 3.0, "uncaught_cheats": 1}
    assert verification_metrics([_rec(0, mal, [True] * 4, None)]) == {
        "verification_cost": None, "rounds_to_catch": None, "uncaught_cheats": None}


def test_sybils_sharing_one_computation_pay_for_one():
    """Sybils (source = "first"): the first identity trains honestly and the others send its
    update. A replay of each identity on its own assigned data passes the one that did the
    work and catches every copy."""
    doc = doc_of("sybil", malicious_fraction=0.5, rounds=1)  # 4 identities
    doc["attack"]["source"] = "first"
    res = Federation(parse_scenario(doc)).run()
    rec = res.records[0]
    bad = [c for c, m in enumerate(rec.malicious) if m]
    caught = set(rec.extra["spot_check"]["caught"])
    assert len(bad) == 4 and len(caught) == 3 and caught < set(bad)
    assert [c for c in bad if c not in caught] == [c for c in bad if rec.accepted[c]]


def test_a_smaller_batch_is_less_work_and_a_replay_sees_it():
    """TrainingHook(batch=k): the hooked row's gradient comes from the first k items of the batch
    it drew (checked by hand on one SGD step), so the honest stream is unchanged; a peer training
    on 4 of 16 items per step with the honest step count and no scaling is caught by a replay."""
    from redteam.types import TrainingHook

    trainer, data = _toy_trainer()
    w = trainer.spec.flatten(trainer.model).detach()
    cfg = LocalTraining(steps=1, batch_size=8, lr=0.1)
    part = torch.tensor([1, 3])
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    got = trainer.train(w, data, part, cfg, gen, hook=TrainingHook(batch=3), hook_rows=[1],
                        hook_generator=torch.Generator().manual_seed(9))
    g2 = torch.Generator()
    g2.set_state(state)
    u = torch.rand((2, 8), generator=g2, dtype=torch.float64)
    idx = data.offsets[part][:, None] + torch.floor(u * data.sizes[part][:, None]).to(torch.int64)
    by_hand = w - 0.1 * trainer._grads(w[None], data.x[idx[1:2, :3]], data.y[idx[1:2, :3]])[0]
    honest = w - 0.1 * trainer._grads(w[None], data.x[idx[0:1]], data.y[idx[0:1]])[0]
    assert torch.allclose(got[1], by_hand, rtol=0, atol=1e-6) and torch.allclose(got[0], honest, rtol=0, atol=1e-6)

    doc = doc_of("lazy_scaled")
    doc["attack"].update({"steps": 4, "scale": 1.0, "batch": 4})
    rec = Federation(parse_scenario(doc)).run().records[0]
    bad = [c for c, m in enumerate(rec.malicious) if m]
    assert set(rec.extra["spot_check"]["caught"]) == set(bad)
