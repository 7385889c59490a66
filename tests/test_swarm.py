"""The model-parallel pipeline regime (issue 21): SWARM routing over stage pools, stage-peer
attacks, redundant recomputation, and the pipeline's metrics."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from redteam.errors import InvalidParameter, InvalidScenario
from redteam.federation.swarm import SwarmRun, stage_of_parameter
from redteam.scenario import parse_scenario
from redteam.scoring import summarize

DOC = {"scenario": {"seed": 0},
       "workload": {"name": "text", "context": 16, "width": 16, "layers": 3, "heads": 2, "max_bytes": 60000},
       "federation": {"rounds": 3, "lr": 0.5},
       "pipeline": {"stages": 3, "peers_per_stage": 3, "micro_batches": 6, "micro_batch_size": 8,
                    "attackers": 1, "attacker_stage": 1},
       "attack": "none", "defense": "mean"}


def doc(attack="none", checks=None, **pipeline):
    d = copy.deepcopy(DOC)
    d["attack"] = attack
    d["pipeline"].update(pipeline)
    if checks is not None:
        d["pipeline"]["checks"] = checks
    return d


def run(d):
    r = SwarmRun(parse_scenario(d))
    return r, r.run()


def test_stages_cut_the_layers_evenly():
    assert [stage_of_parameter(f"blocks.{i}.qkv.weight", 5, 3) for i in range(5)] == [0, 0, 1, 1, 2]
    assert stage_of_parameter("tok.weight", 5, 3) == 0 and stage_of_parameter("head.bias", 5, 3) == 2


@pytest.mark.parametrize("routing", ["swarm", "flow", "round_robin"])
def test_honest_pipeline_is_one_sgd_step_on_the_round_micro_batches(routing):
    """Each stage's peers merged by the sample-weighted mean: every round is exactly the SGD step
    a single process takes on the mean loss of the round's micro-batches (same batches: the run's
    training stream), whatever the routing."""
    d = doc(routing=routing)
    r, res = run(d)
    ref = SwarmRun(parse_scenario(d))  # a fresh copy: its training stream at the start
    params = ref.params0.clone()
    model, spec = ref.model, ref.spec
    pl = ref.pl
    for _ in range(d["federation"]["rounds"]):
        flat = params.clone().requires_grad_(True)
        losses = []
        for _ in range(pl.micro_batches):
            idx = torch.randint(0, ref.train_x.shape[0], (pl.micro_batch_size,), generator=ref.torch_rng["train"])
            out = functional_call(model, spec.unflatten(flat), (ref.train_x[idx],))
            losses.append(F.cross_entropy(out.reshape(-1, out.shape[-1]), ref.train_y[idx].reshape(-1)))
        (g,) = torch.autograd.grad(torch.stack(losses).mean(), flat)
        params = params - d["federation"]["lr"] * g
    assert torch.allclose(r.final_params, params, rtol=1e-4, atol=1e-6), float((r.final_params - params).abs().max())
    served = res.records[-1].extra["pipeline"]["served"]
    assert sum(served.values()) == pl.micro_batches * pl.stages


def test_adam_pipeline_is_torch_adam_on_the_round_micro_batches():
    """optimizer = "adam": with mean and honest peers each round is one step of torch.optim.Adam
    (default betas and eps) on the mean loss of the round's micro-batches; the stages' moments
    together are Adam's moments over the whole model, since Adam is coordinate-wise."""
    d = doc()
    d["pipeline"]["optimizer"] = "adam"
    d["federation"]["lr"] = 0.01
    r, _ = run(d)
    ref = SwarmRun(parse_scenario(d))
    flat = ref.params0.clone().requires_grad_(True)
    opt = torch.optim.Adam([flat], lr=0.01)
    pl = ref.pl
    for _ in range(d["federation"]["rounds"]):
        losses = []
        for _ in range(pl.micro_batches):
            idx = torch.randint(0, ref.train_x.shape[0], (pl.micro_batch_size,), generator=ref.torch_rng["train"])
            out = functional_call(ref.model, ref.spec.unflatten(flat), (ref.train_x[idx],))
            losses.append(F.cross_entropy(out.reshape(-1, out.shape[-1]), ref.train_y[idx].reshape(-1)))
        opt.zero_grad()
        torch.stack(losses).mean().backward()
        opt.step()
    assert torch.allclose(r.final_params, flat.detach(), rtol=1e-4, atol=1e-5), \
        float((r.final_params - flat.detach()).abs().max())
    sgd = SwarmRun(parse_scenario(doc()))  # the second code path: SGD moves differently
    sgd.run()
    assert not torch.allclose(sgd.final_params, r.final_params, atol=1e-4)


def test_swarm_routing_follows_throughput_and_is_deterministic():
    d = doc(micro_batches=60, throughput_sigma=1.0)
    a, ra = run(d)
    b, rb = run(d)
    assert [x.extra for x in ra.records] == [x.extra for x in rb.records]
    served: dict = {}
    for rec in ra.records:
        for p, k in rec.extra["pipeline"]["served"].items():
            served[p] = served.get(p, 0) + k
    stage1 = sorted((a.peers[p].speed, served.get(p, 0)) for p in range(3, 6))
    assert stage1[-1][1] > stage1[0][1]  # the fastest peer of a stage takes more traffic than the slowest


def test_stage_attacks_hurt_an_unchecked_pipeline():
    d = doc()
    d["federation"]["rounds"] = 4
    _, base = run(d)
    b = base.records[-1].loss
    for attack in ({"name": "lazy_peer"}, {"name": "activation_tamper", "kind": "sign"}):
        dd = copy.deepcopy(d)
        dd["attack"] = attack
        _, res = run(dd)
        assert res.records[-1].loss > b + 0.01, (attack, res.records[-1].loss, b)
    dd = copy.deepcopy(d)
    dd["attack"] = {"name": "gradient_tamper", "kind": "scale", "strength": -20.0}
    _, res = run(dd)
    assert res.records[-1].loss != b  # the first stage trained on the tampered gradient


def test_redundant_recompute_bans_a_tamperer_at_its_first_checked_hop():
    checks = [{"name": "redundant_recompute", "fraction": 1.0, "tolerance": 0.0}]
    r, res = run(doc({"name": "activation_tamper", "kind": "noise", "strength": 0.5}, checks=checks))
    m = summarize(res.records)
    assert m["detection_latency"] == 1 and m["undetected_attackers"] == 0
    assert m["recall"] == 1.0 and m["fpr"] == 0.0  # honest peers match bit for bit on one device
    banned = {p for rec in res.records for p in rec.extra["pipeline"]["banned_at"]}
    assert banned == set(r.malicious)
    assert m["check_overhead"] == pytest.approx(1.0)


def test_honest_pipeline_under_checks_flags_nobody():
    r, res = run(doc("none", checks=[{"name": "redundant_recompute", "fraction": 1.0, "tolerance": 0.0}]))
    assert all(not rec.extra["pipeline"]["flagged"] for rec in res.records)


def test_recompute_misses_gradient_tampering_and_colluding_verifiers():
    checks = [{"name": "redundant_recompute", "fraction": 1.0}]
    _, res = run(doc({"name": "gradient_tamper"}, checks=checks))
    assert summarize(res.records)["undetected_attackers"] == 1  # a forward check cannot see the backward pass
    _, res = run(doc({"name": "lazy_peer"}, checks=checks, peers_per_stage=2, attackers=2))
    assert summarize(res.records)["undetected_attackers"] == 2  # each vouches for the other


def test_sampled_checks_catch_a_lazy_peer_later_and_cheaper():
    full, sampled = ({"name": "redundant_recompute", "fraction": f} for f in (1.0, 0.25))
    _, a = run(doc({"name": "lazy_peer"}, checks=[full], micro_batches=12))
    _, b = run(doc({"name": "lazy_peer"}, checks=[sampled], micro_batches=12))
    ma, mb = summarize(a.records), summarize(b.records)
    assert mb["check_overhead"] < ma["check_overhead"]
    assert mb["detection_latency"] is None or mb["detection_latency"] >= ma["detection_latency"]


@pytest.mark.parametrize("change,msg", [
    ({"workload": {"name": "digits"}}, "text"),
    ({"pipeline": {"stages": 4}}, "layers"),
    ({"pipeline": {"attacker_stage": 3}}, "must be a stage"),
    ({"pipeline": {"attackers": 4}}, "more than the stage"),
    ({"pipeline": {"checks": [{"name": "median"}]}}, "not a pipeline check"),
    ({"federation": {"clients_per_round": 2}}, "does not apply to \\[pipeline\\]"),
    ({"pipeline": {"reputation_penalty": 0.0}}, "must be in \\(0, 1\\]"),
    ({"attack": "sign_flip"}, "acts on updates.* which the \\[pipeline\\] regime does not model"),
])
def test_bad_pipeline_scenarios_are_one_clear_line(change, msg):
    d = copy.deepcopy(DOC)
    for k, v in change.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict) and k != "workload":
            d[k].update(v)
        else:
            d[k] = v
    with pytest.raises((InvalidScenario, InvalidParameter), match=msg):
        SwarmRun(parse_scenario(d))


def test_cli_runs_a_pipeline_scenario(tmp_path):
    from redteam.cli import main

    p = tmp_path / "pl.toml"
    p.write_text("""
[workload]
name = "text"
context = 16
width = 16
layers = 2
heads = 2
max_bytes = 40000
[federation]
rounds = 2
lr = 0.5
[pipeline]
stages = 2
peers_per_stage = 2
micro_batches = 4
micro_batch_size = 4
attackers = 1
checks = [{ name = "redundant_recompute", fraction = 1.0 }]
[attack]
name = "lazy_peer"
""")
    out = tmp_path / "o.json"
    assert main(["run", str(p), "--json", str(out)]) == 0
    import json

    m = json.loads(out.read_text())["runs"][1]["metrics"]
    assert m["detection_latency"] is not None and m["undetected_attackers"] == 0


def test_routing_capture_draws_the_stage_traffic():
    """Advertising 20× its throughput, the lazy peer takes most of its stage's micro-batches."""
    def share(advertise):
        r, res = run(doc({"name": "lazy_peer", "advertise": advertise}, micro_batches=30, throughput_sigma=0.0))
        (bad,) = r.malicious
        served = [rec.extra["pipeline"]["served"] for rec in res.records]
        return sum(s.get(bad, 0) for s in served) / (30 * len(served))
    honest, captured = share(1.0), share(20.0)
    assert 0.15 < honest < 0.55 and captured > 0.8


def test_stage_rules_keep_memory_and_server_data_rules_are_refused():
    d = doc("none")
    d["defense"] = {"name": "centered_clipping", "tau": 0.5}
    r, res = run(d)
    assert set(r._stage_state) == {0, 1, 2} and all(r._prev[s] is not None for s in range(3))
    d["defense"] = "fltrust"
    with pytest.raises(InvalidParameter, match="server-held data"):
        SwarmRun(parse_scenario(d))


def test_pipeline_only_plugins_are_refused_in_the_data_parallel_regime():
    from redteam.federation.loop import Federation

    base = {"workload": {"name": "digits"}, "federation": {"clients": 4, "rounds": 1, "malicious_fraction": 0.25}}
    with pytest.raises(InvalidParameter, match="needs a \\[pipeline\\]"):
        Federation(parse_scenario({**base, "attack": "lazy_peer"}))
    with pytest.raises(InvalidParameter, match="needs a \\[pipeline\\]"):
        Federation(parse_scenario({**base, "defense": {"pipeline": [{"name": "redundant_recompute"}, {"name": "mean"}]}}))


def test_churn_with_and_without_crash_tolerance():
    """Honest peers crash on 15 % of hops: re-routing (GWTF's crash tolerance) keeps the micro-batches
    that a pipeline without it loses; a crashed peer's work for the round is lost either way."""
    def lost(tolerance):
        d = doc("none", churn=0.15, crash_tolerance=tolerance, micro_batches=12)
        _, res = run(d)
        m = summarize(res.records)
        rer = sum(rec.extra["pipeline"]["rerouted_hops"] for rec in res.records)
        return m["lost_micro_batches"], rer, m["lost_work"], res.records
    lt, rt, wt, recs = lost(True)
    lf, rf, wf, _ = lost(False)
    assert rf == 0 and rt > 0 and lf > lt
    assert wt > 0 and any(rec.dropped for rec in recs)
    assert all("crashed" in why for rec in recs for why in rec.dropped.values())


def test_crash_at_sync_with_routing_capture_wastes_its_stage():
    def work(advertise):
        _, res = run(doc({"name": "crash_at_sync", "advertise": advertise}, micro_batches=12, throughput_sigma=0.0))
        return summarize(res.records)["lost_work"]
    plain, captured = work(1.0), work(20.0)
    assert 0.0 < plain < 0.2 and captured > 0.25  # one stage of three is a third of the hops


def test_simulated_time_throughput_and_idle_share():
    """Peers work in parallel and a round lasts as long as the busiest: routing capture piles the
    stage's work on one peer (lower throughput), recomputation adds work (lower throughput)."""
    def metrics(attack="none", **kw):
        _, res = run(doc(attack, micro_batches=12, **kw))
        m = summarize(res.records)
        assert all(rec.sim_time_s > 0 for rec in res.records) and 0.0 <= m["idle_share"] < 1.0
        return m["pipeline_throughput"]
    honest = metrics()
    assert metrics({"name": "activation_tamper", "advertise": 20.0}) < honest
    assert metrics(checks=[{"name": "redundant_recompute", "fraction": 0.5}]) < honest


def test_flow_routing_balances_heterogeneous_peers_and_is_captured_by_a_false_advertisement():
    def throughput(routing, attack="none"):
        _, res = run(doc(attack, micro_batches=12, routing=routing, throughput_sigma=1.0))
        return summarize(res.records)["pipeline_throughput"]
    flow, swarm, rr = throughput("flow"), throughput("swarm"), throughput("round_robin")
    assert flow > swarm > rr  # the load-balancing router beats proportional wiring beats turns
    assert throughput("flow", {"name": "activation_tamper", "advertise": 20.0}) < flow


# ---------------------------------------------------------------- warm-up, backdoor, commitments, reputation

def test_pipeline_starts_from_its_own_clean_warm_up():
    """warmup_rounds under [pipeline]: the same pipeline with no attacker and no checks, run for
    R rounds; round 0 of every cell starts from its final model."""
    d = doc({"name": "lazy_peer"}, checks=[{"name": "redundant_recompute"}])
    d["scenario"]["warmup_rounds"] = 2
    r, res = run(d)
    clean = doc()
    clean["federation"]["rounds"] = 2
    clean["pipeline"]["attackers"] = 0
    c, _ = run(clean)
    assert torch.equal(r.params0, c.final_params)
    assert res.records[0].extra["start"]["warmup"]["rounds"] == 2
    assert not torch.equal(r.params0, r.params_init)


def test_warm_up_can_pre_train_with_its_own_optimizer_and_step():
    """warmup_optimizer / warmup_lr: the warm-up is the clean pipeline run with that optimizer and
    step size (pre-training), the attacked rounds with the run's (post-training); unset, the
    run's own. Either key without a warm-up is refused by name."""
    d = doc()
    d["scenario"]["warmup_rounds"] = 2
    d["pipeline"].update(warmup_optimizer="adam", warmup_lr=0.01)
    r, _ = run(d)
    pre = doc()
    pre["federation"].update(rounds=2, lr=0.01)
    pre["pipeline"].update(attackers=0, optimizer="adam")
    c, _ = run(pre)
    assert torch.equal(r.params0, c.final_params)
    same = doc()
    same["scenario"]["warmup_rounds"] = 2
    assert not torch.equal(SwarmRun(parse_scenario(same)).params0, r.params0)
    bad = doc()
    bad["pipeline"]["warmup_lr"] = 0.01
    with pytest.raises(InvalidScenario, match=r"\[pipeline\].warmup_lr.*there is none"):
        parse_scenario(bad)


def test_stage_backdoor_vector_backdoors_the_starting_model_and_is_injected_gradually():
    """Offline, the stage's backdoor vector τ (trained on the stage alone, from the starting
    weights) plants the trigger: ASR at θ₀ + τ is far above θ₀'s. Online, the peer adds
    scale · τ / inject_rounds to its first inject_rounds updates, then nothing."""
    from redteam.registry import ATTACKS
    from redteam.types import StageContext

    d = doc({"name": "stage_backdoor"})
    d["workload"]["width"] = 32  # width 16 cannot hold the trigger in its middle block at all
    r = SwarmRun(parse_scenario(d))
    a = ATTACKS.create("stage_backdoor", {"offline_steps": 150, "offline_lr": 1e-2, "scale": 2.0,
                                          "inject_rounds": 2})
    tx, ty = a.targeted_test(r.test_x, r.test_y)
    state: dict = {}
    ctx = StageContext(0, 1, 3, 4, 0, torch.Generator().manual_seed(0), state, r.view)
    tau = a.backdoor_vector(StageContext(0, 1, 3, 4, 0, torch.Generator().manual_seed(0), {}, r.view))
    sl = r.slices[1]
    backdoored = r.params0.clone()
    backdoored[sl] += tau
    assert r.trainer.evaluate(backdoored, tx, ty)[0] >= 0.9 > 0.1 >= r.trainer.evaluate(r.params0, tx, ty)[0]
    assert torch.equal(r.params0, r.view.params0)  # the offline training did not touch the run's model
    u = torch.zeros(sl.stop - sl.start)
    first, second, third = (a.tamper_stage_update(u, ctx) for _ in range(3))
    assert torch.allclose(first, tau) and torch.allclose(second, tau) and torch.equal(third, u)


def test_stage_backdoor_hops_are_honest_so_recomputation_never_flags_it():
    checks = [{"name": "redundant_recompute", "fraction": 1.0}]
    _, res = run(doc({"name": "stage_backdoor", "offline_steps": 20}, checks=checks))
    m = summarize(res.records)
    assert m["undetected_attackers"] == 1 and m["fpr"] == 0.0
    assert all("asr" in rec.extra for rec in res.records)


def test_commitment_digest_keeps_the_bits_it_says():
    from defenses.pipeline_checks import commitment

    x = torch.tensor([1.0, -3.5, 0.3])
    one_ulp = torch.nextafter(x, torch.full_like(x, 10.0))
    assert commitment(x, 24) == commitment(x.clone(), 24) != commitment(one_ulp, 24)
    assert commitment(torch.tensor([0.0, float("nan")]), 24) == commitment(torch.tensor([-0.0, -float("nan")]), 24)
    # bits counts significant bits: 1 and 1 + 2⁻²³ (the next float32) differ at 24, agree at 23
    nxt = torch.tensor([1.0 + 2.0 ** -23])
    assert commitment(torch.tensor([1.0]), 24) != commitment(nxt, 24)
    assert commitment(torch.tensor([1.0]), 23) == commitment(nxt, 23)
    assert commitment(x, 10) == commitment(one_ulp, 10)  # one ulp does not cross a 10-bit boundary here
    assert commitment(x, 10) != commitment(x * 1.01, 10)
    assert commitment(torch.tensor([0.0]), 10) == commitment(torch.tensor([-0.0]), 10)
    assert commitment(x, 24) != commitment(x.reshape(3, 1), 24)  # the shape is committed too


def test_commitment_audit_bans_a_lazy_peer_at_the_round_end():
    """The deferred audit catches what the recomputation catches, but only once the round's hops
    are done: the ban comes at the end of the round, after the lazy peer served its traffic, and
    its update is left out of that round's sync."""
    _, res = run(doc({"name": "lazy_peer"}, checks=[{"name": "activation_commitment", "fraction": 1.0}]))
    m = summarize(res.records)
    assert m["undetected_attackers"] == 0 and m["fpr"] == 0.0
    first = res.records[0]
    pid = res.malicious[0]
    assert first.extra["pipeline"]["banned_at"][pid] == 6  # micro_batches: the round's end
    assert "commitment audit" in first.rejected[pid]
    assert first.accepted[pid] is False
    _, eager = run(doc({"name": "lazy_peer"}, checks=[{"name": "redundant_recompute", "fraction": 1.0}]))
    assert m["detection_latency"] >= summarize(eager.records)["detection_latency"]
    _, grad = run(doc({"name": "gradient_tamper"}, checks=[{"name": "activation_commitment", "fraction": 1.0}]))
    assert summarize(grad.records)["undetected_attackers"] == 1  # forward commitments cannot see the backward


def test_reputation_starves_a_flagged_peer_before_its_ban():
    """With three strikes to a ban, a router that trusts a flagged peer less sends it less
    traffic in the meantime."""
    served = {}
    for penalty in (1.0, 0.05):
        _, res = run(doc({"name": "lazy_peer"}, checks=[{"name": "redundant_recompute", "fraction": 1.0,
                                                          "strikes": 3}],
                         micro_batches=12, reputation_penalty=penalty))
        pid = res.malicious[0]
        served[penalty] = sum(rec.extra["pipeline"]["served"].get(pid, 0) for rec in res.records)
    assert served[0.05] < served[1.0]


def test_activation_monitor_catches_forward_and_backward_tampering_without_recomputing():
    """The monitor compares each peer's activation and gradient statistics with its stage's other
    peers: a lazy peer (forward) and a ×−20 gradient (backward, which no forward check sees) are
    flagged; an honest pipeline is not; nothing is recomputed."""
    mon = [{"name": "activation_monitor"}]
    for attack in ({"name": "lazy_peer"}, {"name": "gradient_tamper", "kind": "scale", "strength": -20.0}):
        _, res = run(doc(attack, checks=mon, micro_batches=12))
        m = summarize(res.records)
        assert m["undetected_attackers"] == 0 and m["fpr"] == 0.0, (attack, m)
        assert m["check_overhead"] == 0.0
    d = doc(checks=mon, micro_batches=12)
    d["pipeline"]["attackers"] = 0
    _, res = run(d)
    assert not any(rec.extra["pipeline"]["flagged"] for rec in res.records)


def test_activation_monitor_needs_an_honest_majority_in_the_stage():
    """Two lazy peers of three: the stage's median is theirs, so the honest peer is the outlier."""
    _, res = run(doc({"name": "lazy_peer"}, checks=[{"name": "activation_monitor"}],
                     micro_batches=12, attackers=2))
    m = summarize(res.records)
    assert m["undetected_attackers"] == 2 and m["fpr"] > 0


def test_links_cost_simulated_time_and_flow_routes_around_a_slow_uplink():
    """A hop's sends take latency + bytes / uplink (worked by hand: 8 windows × 16 bytes × width
    16 × 4 bytes = 8,192 bytes, 0.065536 s at 1 Mbit/s, + 5 ms). With heterogeneous uplinks the
    flow router, which knows them, keeps more micro-batches per simulated second than SWARM's
    throughput-proportional wiring, and both are slower than with free links."""
    r = SwarmRun(parse_scenario(doc(bandwidth_mbps=1.0, latency_ms=5.0)))
    assert r.send_time(r.peers[0]) == pytest.approx(0.005 + 8192 * 8 / 1e6, rel=1e-12)
    assert r.hop_cost(r.peers[4], 1, 2.0) == pytest.approx(0.01 / 2.0 + 2 * (0.005 + 0.065536))
    tput = {}
    for routing in ("swarm", "flow"):
        _, res = run(doc(routing=routing, bandwidth_mbps=2.0, bandwidth_sigma=1.5, latency_ms=1.0, micro_batches=12))
        tput[routing] = summarize(res.records)["pipeline_throughput"]
    _, free = run(doc(routing="flow", micro_batches=12))
    assert tput["flow"] > tput["swarm"]
    assert summarize(free.records)["pipeline_throughput"] > tput["flow"]


def test_activation_monitor_sees_a_last_stage_peer_that_cuts_the_graph():
    """A stale last stage sends no gradient back: its hops that owed one count against it."""
    _, res = run(doc({"name": "lazy_peer", "mode": "stale"}, checks=[{"name": "activation_monitor"}],
                     micro_batches=12, attacker_stage=2))
    m = summarize(res.records)
    assert m["undetected_attackers"] == 0 and m["fpr"] == 0.0


def test_a_composed_attack_runs_in_the_pipeline_regime():
    """A composition with no targeted part: no ASR test set, and no crash (it raised AttributeError)."""
    r, res = run(doc({"name": "compose", "attacks": [{"name": "none"}]}))
    assert r.setup.probes.targeted is None and len(res.records) == 3


def test_pipeline_cells_that_differ_only_in_who_attacks_share_one_warm_up():
    from redteam.federation.warmup import warmup_key

    keys = set()
    for stage, penalty in ((1, 1.0), (2, 0.5), (0, 1.0)):
        d = doc({"name": "lazy_peer"}, attacker_stage=stage, reputation_penalty=penalty)
        d["scenario"]["warmup_rounds"] = 2
        keys.add(warmup_key(parse_scenario(d), torch.device("cpu")))
    assert len(keys) == 1
