"""The asynchronous server (issue 26 §2): staleness bookkeeping on a hand-made timeline, the
synchronous round recovered bit for bit, batched training per version, the staleness attacks'
effects and the staleness-aware filters' decisions on hand-worked examples."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from attacks.stale import StaleReplay, TimedDelay, VersionLie
from defenses.staleness import AFLGuard, ZenoPlusPlus
from redteam.errors import InvalidParameter, InvalidScenario
from redteam.federation import stages
from redteam.federation.asyncrun import AsyncRun, staleness_weight
from redteam.federation.loop import Federation
from redteam.federation.regimes import make_run
from redteam.scenario import parse_scenario
from redteam.types import AsyncContext, AsyncSend, AttackContext, ServerContext

FLAT = {"compute_sigma": 0.0, "bandwidth_sigma": 0.0, "latency_sigma": 0.0}


def _doc(**over):
    doc = {"scenario": {"seed": 3}, "workload": {"name": "digits"},
           "federation": {"clients": 6, "rounds": 3, "local_steps": 2, "partition": "iid"},
           "transport": {"network": dict(FLAT)}}
    for k, v in over.items():
        doc[k] = {**doc.get(k, {}), **v}
    return doc


def _timeline(run: AsyncRun, compute: list[float]) -> AsyncRun:
    """Job durations by hand: ``compute[i]`` seconds per local step, instant links."""
    net = run.fed.network
    net.compute_s = np.asarray(compute, dtype=np.float64)
    net.bytes_per_s = np.full(len(compute), np.inf)
    net.latency_s = np.zeros(len(compute))
    return run


# ------------------------------------------------------------------ weights


def test_staleness_weights_by_hand():
    """FedBuff's polynomial s(τ) = (1 + τ)^−a: a = 0.5 gives 1, 1/2, 1/3 at τ = 0, 3, 8; constant is 1."""
    assert staleness_weight(0) == 1.0
    assert staleness_weight(3, "polynomial", 0.5) == pytest.approx(0.5)
    assert staleness_weight(8, "polynomial", 0.5) == pytest.approx(1 / 3)
    assert staleness_weight(1, "polynomial", 1.0) == pytest.approx(0.5)
    assert staleness_weight(7, "constant") == 1.0
    with pytest.raises(InvalidParameter, match="τ = -1"):
        staleness_weight(-1)


# ------------------------------------------------------------------ bookkeeping


def test_versions_staleness_and_times_on_a_hand_made_timeline():
    """Three clients at 1, 2 and 3 s per step (one step each), K = 1, instant links:

    t=1  c0 (base 0) arrives, server at 0: τ = 0 → step 0 → version 1; c0 restarts from 1 (ready at 2)
    t=2  c1 (base 0): τ = 1 → step 1 → v2;  c0 (base 1): τ = 1 → step 2 → v3 (arrivals in start order)
    t=3  c2 (base 0): τ = 3 → step 3 → v4;  c0 (base 3, started at 2): τ = 1 → step 4 → v5
    """
    sc = parse_scenario(_doc(federation={"clients": 3, "rounds": 5, "local_steps": 1},
                             **{"async": {"buffer_size": 1, "staleness": "polynomial", "exponent": 0.5}}))
    run = _timeline(make_run(sc), [1.0, 2.0, 3.0])
    recs = run.run().records
    info = [r.extra["async"] for r in recs]
    assert [i["clients"] for i in info] == [[0], [1], [0], [2], [0]]
    assert [i["staleness"] for i in info] == [[0], [1], [1], [3], [1]]
    assert [i["version"] for i in info] == [1, 2, 3, 4, 5]
    assert [i["time_s"] for i in info] == [1.0, 2.0, 2.0, 3.0, 3.0]
    assert [r.sim_time_s for r in recs] == [1.0, 1.0, 0.0, 1.0, 0.0]
    for i in info:  # K = 1: the merged update is s(τ)·Δ (FedBuff's scale on the one row)
        assert i["weights"] == [pytest.approx(1 / math.sqrt(1 + i["staleness"][0]))]
        assert i["scale"] == pytest.approx(i["weights"][0])
    assert [r.participating for r in recs][3] == [False, False, True]
    assert [j.base for j in run.jobs[:6]] == [0, 0, 0, 1, 3, 3]


def test_max_staleness_drops_the_late_update_and_says_why():
    sc = parse_scenario(_doc(federation={"clients": 3, "rounds": 4, "local_steps": 1},
                             **{"async": {"buffer_size": 1, "max_staleness": 2}}))
    recs = _timeline(make_run(sc), [1.0, 2.0, 3.0]).run().records
    # at t=3 c2 (base 0) arrives at version 3: τ = 3 > 2, dropped; then c0 (base 3) is step 3
    r3 = recs[3]
    assert r3.extra["async"]["clients"] == [0] and r3.extra["async"]["stale_dropped"] == 1
    assert r3.dropped == {2: "stale: τ = 3 > max_staleness = 2"}
    assert r3.participating[2] and not r3.accepted[2] and r3.rejected[2].startswith("stale")


def test_k_equal_to_all_clients_with_equal_times_is_the_synchronous_round_bit_for_bit():
    """Every job takes the same time (σ = 0 everywhere, no jitter) and K = n: each step merges one
    update per client, all from the current version, trained in one batch: the synchronous run."""
    for fed_over in ({}, {"server_optimizer": "nesterov", "server_lr": 0.7}):
        doc = _doc(federation=fed_over)
        sync = Federation(parse_scenario(doc))
        ra = sync.run()
        for rule in ("constant", "polynomial"):
            arun = make_run(parse_scenario({**doc, "async": {"buffer_size": 6, "staleness": rule}}))
            rb = arun.run()
            assert torch.equal(sync.final_params, arun.final_params)
            assert [r.accuracy for r in ra.records] == [r.accuracy for r in rb.records]
            assert all(r.extra["async"]["staleness"] == [0] * 6 for r in rb.records)


def test_jobs_from_one_version_train_in_one_batched_call(monkeypatch):
    calls: list[list[int]] = []
    real = stages.train

    def spy(fed, rin, *a, **k):
        calls.append(rin.part_t.tolist())
        return real(fed, rin, *a, **k)

    monkeypatch.setattr(stages, "train", spy)
    sc = parse_scenario(_doc(federation={"clients": 4, "rounds": 3, "local_steps": 1},
                             **{"async": {"buffer_size": 2}}))
    _timeline(make_run(sc), [1.0, 1.0, 2.0, 2.0]).run()
    # version 0: all four clients (one call); c0, c1 arrive at t=1 (step 0), restart from v1 together;
    # c2, c3 arrive at t=2 with c0, c1 (ready at 2): c2, c3 make step 1; c0, c1 (base 1) step 2
    assert calls[0] == [0, 1, 2, 3]
    assert calls[1] == [0, 1]


# ------------------------------------------------------------------ attacks


def _attacked(attack: dict, compute: list[float], **asy) -> tuple[AsyncRun, list]:
    sc = parse_scenario(_doc(federation={"clients": 4, "rounds": 12, "local_steps": 1, "malicious_fraction": 0.25},
                             attack=attack, **{"async": {"buffer_size": 1, **asy}}))
    run = _timeline(make_run(sc), compute)
    return run, run.run().records


def test_version_lie_gets_weight_one_unless_the_server_keeps_its_own_books():
    probe = make_run(parse_scenario(_doc(federation={"clients": 4, "malicious_fraction": 0.25},
                                         **{"async": {"buffer_size": 1}})))
    bad = probe.fed.malicious[0]
    compute = [1.0] * 4
    compute[bad] = 3.5  # the attacker is the slow one: its update lands stale
    run, recs = _attacked({"name": "version_lie"}, compute)
    mine = [r.extra["async"] for r in recs if r.extra["async"]["clients"] == [bad]]
    assert mine and all(i["weights"] == [1.0] and i["staleness"] == [0] for i in mine)
    assert all(i["true_staleness"][0] > 0 and i["misclaimed"] == 1 for i in mine)
    run, recs = _attacked({"name": "version_lie"}, compute, trust_claims=False)
    mine = [r.extra["async"] for r in recs if r.extra["async"]["clients"] == [bad]]
    assert mine and all(i["staleness"] == i["true_staleness"] and i["weights"][0] < 1 for i in mine)


def test_version_lie_and_timed_delay_send_the_flipped_scaled_update():
    own = torch.tensor([[1.0, -2.0]])
    ctx = AttackContext(round=0, n_clients=3, malicious=(1,), own_updates=own, visible_updates=own,
                        global_params=torch.zeros(2), generator=torch.Generator())
    assert torch.equal(VersionLie(scale=2.0).craft_updates(ctx), torch.tensor([[-2.0, 4.0]]))
    assert torch.equal(TimedDelay(scale=3.0, flip=False).craft_updates(ctx), torch.tensor([[3.0, -6.0]]))


def _actx(**kw) -> AsyncContext:
    base = dict(client=1, trained_from=2, version=5, time_s=0.0, buffer_size=4, buffered=0, buffered_malicious=0,
                holding=(1,), attackers=(1, 3), max_staleness=None, state={})
    base.update(kw)
    return AsyncContext(**base)


def test_timed_delay_holds_until_the_colluders_gather_after_a_step():
    td = TimedDelay()
    assert td.async_send(_actx()) == AsyncSend(hold=True)  # 1 of 2 attackers holding
    assert td.async_send(_actx(holding=(1, 3), buffered=2)) == AsyncSend(hold=True)  # buffer not empty
    state: dict = {}
    assert td.async_send(_actx(holding=(1, 3), state=state)) is None  # both, right after a step: go
    assert td.async_send(_actx(client=3, holding=(3,), buffered=1, state=state)) is None  # its colluder follows
    assert TimedDelay(target_version=9).async_send(_actx(holding=(1, 3))) == AsyncSend(hold=True)
    # about to go stale: released at once
    assert td.async_send(_actx(max_staleness=3)) is None


def test_timed_delay_lands_the_colluders_in_one_buffer():
    """4 clients, 2 attackers, K = 2: without timing the attackers' rows land wherever their speed
    puts them; with it, both in the same buffer (a majority of its K rows)."""
    probe = make_run(parse_scenario(_doc(federation={"clients": 4, "malicious_fraction": 0.5},
                                         **{"async": {"buffer_size": 2}})))
    bad = probe.fed.malicious
    compute = [1.0, 1.0, 1.0, 1.0]
    compute[bad[0]], compute[bad[1]] = 1.3, 2.9  # the attackers finish at different times

    def run(name):
        sc = parse_scenario(_doc(federation={"clients": 4, "rounds": 12, "local_steps": 1, "malicious_fraction": 0.5},
                                 attack={"name": name}, **{"async": {"buffer_size": 2}}))
        return [r.extra["async"]["malicious_rows"] for r in _timeline(make_run(sc), compute).run().records]

    apart, together = run("sign_flip"), run("timed_delay")
    assert all(m in (0, 2) for m in together)  # they always land as a pair
    assert together.count(2) > apart.count(2) and 1 in apart


def test_stale_replay_resends_the_old_update_by_hand():
    sr = StaleReplay(boost=2.0)
    state: dict = {}

    def ctx(rnd, rows):
        own = torch.tensor(rows)
        return AttackContext(round=rnd, n_clients=4, malicious=(1, 3), own_updates=own, visible_updates=own,
                             global_params=torch.zeros(2), generator=torch.Generator(), attack_state=state)

    first = [[1.0, 0.0], [0.0, 1.0]]
    assert torch.equal(sr.craft_updates(ctx(0, first)), 2 * torch.tensor(first))
    assert torch.equal(sr.craft_updates(ctx(3, [[5.0, 5.0], [6.0, 6.0]])), 2 * torch.tensor(first))
    lagged = StaleReplay(lag=2)
    state.clear()
    rows = {r: [[float(r), 0.0], [0.0, float(r)]] for r in range(5)}
    out = [lagged.craft_updates(ctx(r, rows[r])) for r in range(5)]
    assert torch.equal(out[4], torch.tensor(rows[2])) and torch.equal(out[1], torch.tensor(rows[0]))
    assert sr.async_send(_actx()) == AsyncSend(claimed_version=5)


def test_stale_replay_claims_fresh_and_is_never_dropped_as_stale():
    probe = make_run(parse_scenario(_doc(federation={"clients": 4, "malicious_fraction": 0.25},
                                         **{"async": {"buffer_size": 1}})))
    bad = probe.fed.malicious[0]
    compute = [1.0] * 4
    compute[bad] = 3.5
    _, honest = _attacked({"name": "none"}, compute, max_staleness=2)
    _, replay = _attacked({"name": "stale_replay"}, compute, max_staleness=2)
    assert any(bad in r.dropped for r in honest)  # honestly, its update is too stale
    assert not any(bad in r.dropped for r in replay)
    assert any(r.extra["async"]["clients"] == [bad] and r.malicious[bad] for r in replay)


# ------------------------------------------------------------------ defenses


def _ctx(rows: torch.Tensor, server: list[float]) -> ServerContext:
    return ServerContext.default(rows, root_update=lambda: torch.tensor(server, dtype=rows.dtype))


ROWS = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)


def test_zeno_plus_plus_by_hand():
    """g_s = (1, 0), so ‖v‖ = 1. Normalised candidates (1, 0), (0, 1), (−1, 0), (1, 1)/√2; with γ = 1,
    ρ = 0.1 the scores ⟨v, u⟩ − ρ‖u‖² are 0.9, −0.1, −1.1, 0.607: ε = 0 keeps rows 0 and 3 and
    merges (1, 0) and (1, 1)/√2: (0.854, 0.354); ε = 0.2 lets −0.1 through too."""
    dec = ZenoPlusPlus(lr=1.0, rho=0.1, eps=0.0)(ROWS, _ctx(ROWS, [1.0, 0.0]))
    assert dec.accepted.tolist() == [True, False, False, True]
    assert dec.state["scores"] == pytest.approx([0.9, -0.1, -1.1, 1 / math.sqrt(2) - 0.1])
    r = 1 / math.sqrt(2)
    assert dec.aggregate.tolist() == pytest.approx([(1 + r) / 2, r / 2])
    assert "score -0.1 < −γε = -0" in dec.reasons[1]
    assert ZenoPlusPlus(lr=1.0, rho=0.1, eps=0.2)(ROWS, _ctx(ROWS, [1.0, 0.0])).accepted.tolist() == \
        [True, True, False, True]
    # unnormalised: ⟨s, x⟩ − ρ‖x‖² = 2 − 0.4, −0.1, −1 − 0.1, 1 − 0.2
    raw = ZenoPlusPlus(lr=1.0, rho=0.1, normalize=False)(ROWS, _ctx(ROWS, [1.0, 0.0]))
    assert raw.state["scores"] == pytest.approx([1.6, -0.1, -1.1, 0.8])
    assert raw.aggregate.tolist() == pytest.approx([1.5, 0.5])


def test_aflguard_by_hand():
    """g_s = (1, 0), λ = 1: ‖Δ − g_s‖ of (1.5, 0), (0, 1), (−1, 0), (1, 0.9), (2, 0) is 0.5, √2, 2,
    0.9, 1 — rows 0, 3 and 4 (on the bound) are kept and averaged."""
    rows = torch.tensor([[1.5, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 0.9], [2.0, 0.0]], dtype=torch.float64)
    dec = AFLGuard(lam=1.0)(rows, _ctx(rows, [1.0, 0.0]))
    assert dec.accepted.tolist() == [True, False, False, True, True]
    assert dec.state["distances"] == pytest.approx([0.5, math.sqrt(2), 2.0, 0.9, 1.0])
    assert dec.aggregate.tolist() == pytest.approx([4.5 / 3, 0.3])
    assert "> λ‖g_s‖ = 1" in dec.reasons[1]
    assert AFLGuard(lam=2.0)(rows, _ctx(rows, [1.0, 0.0])).accepted.tolist() == [True, True, True, True, True]


def test_staleness_filters_need_server_data():
    with pytest.raises(InvalidParameter, match="root update"):
        ZenoPlusPlus()(ROWS, ServerContext.default(ROWS))
    with pytest.raises(InvalidParameter, match="root update"):
        AFLGuard()(ROWS, ServerContext.default(ROWS))


def test_zeno_rejects_the_lying_attacker_in_a_run():
    probe = make_run(parse_scenario(_doc(federation={"clients": 4, "malicious_fraction": 0.25},
                                         **{"async": {"buffer_size": 1}})))
    bad = probe.fed.malicious[0]
    sc = parse_scenario(_doc(federation={"clients": 4, "rounds": 6, "local_steps": 1, "malicious_fraction": 0.25},
                             attack={"name": "version_lie", "scale": 2.0}, defense={"name": "zeno_pp"},
                             **{"async": {"buffer_size": 1}}))
    recs = _timeline(make_run(sc), [1.0, 1.3, 1.7, 2.1]).run().records
    judged = [r for r in recs if r.malicious[bad]]
    assert judged and not any(r.accepted[bad] for r in judged)


# ------------------------------------------------------------------ scenario


def test_async_section_validation():
    with pytest.raises(InvalidScenario, match="two regimes"):
        parse_scenario({"async": {}, "gossip": {}})
    with pytest.raises(InvalidScenario, match="clients_per_round"):
        parse_scenario({"async": {}, "federation": {"clients_per_round": 3}})
    with pytest.raises(InvalidScenario, match=r"\[transport\].codec"):
        parse_scenario({"async": {}, "transport": {"codec": "int8"}})
    with pytest.raises(InvalidScenario, match=r"\[async\].buffer_size = 0"):
        parse_scenario({"async": {"buffer_size": 0}})
    with pytest.raises(InvalidScenario, match="did you mean 'buffer_size'"):
        parse_scenario({"async": {"buffer_sise": 2}})
    with pytest.raises(InvalidScenario, match=r"\[async\].staleness"):
        parse_scenario({"async": {"staleness": "exponential"}})
    plain = parse_scenario({})
    assert "asynchronous" not in plain.to_dict()  # earlier scenarios keep their digest
    assert parse_scenario({"async": {}}).digest() != plain.digest()


def test_every_record_has_the_run_shape():
    sc = parse_scenario(_doc(federation={"clients": 6, "rounds": 4, "malicious_fraction": 0.34},
                             attack={"name": "timed_delay"}, transport={"network": {"compute_sigma": 0.5}},
                             **{"async": {"buffer_size": 2, "jitter": 0.3}}))
    res = make_run(sc).run()
    assert len(res.records) == 4
    for r in res.records:
        assert len(r.accepted) == len(r.malicious) == len(r.participating) == 6
        assert r.extra["async"]["rows"] == 2 and math.isfinite(r.accuracy)
    assert copy.deepcopy(res.records[0].to_dict())["extra"]["async"]["version"] == 1
