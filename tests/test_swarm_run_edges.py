"""The pipeline regime's loop on the smallest pipeline that still is one (issue 39: the
mutation audit of ``SwarmRun.run`` / ``__init__`` / ``_step`` / ``full_loss`` and
``PipelinePlacement``): a 2-layer, width-8 byte transformer cut into 2 stages of 2 peers, 2
micro-batches of 2 windows of 4 bytes, round-robin routing, 1–3 rounds. Each run takes a few
hundredths of a second on one thread, so the loop's records can be worked by hand: which peer
served which hop, the simulated time (hop time / speed + latency per send, reset every round),
the bytes on the wire, who was flagged, banned, rejected or departed, and the model itself,
against a reference SGD / Adam step computed here on the whole model (``functional_call`` on
the workload's own ``ByteTransformer``, not the regime's stage split)."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from redteam.errors import InvalidParameter, RedteamError
from redteam.federation.swarm import PipelinePlacement, SwarmRun
from redteam.scenario import parse_scenario

# 2 stages × 2 peers; peers 0, 1 serve stage 0 and 2, 3 stage 1. Round robin: micro-batch k
# (counted over the whole run) goes to pool[k % 2] of every stage, so in each round of two
# micro-batches the first goes 0 → 2 and the second 1 → 3.
DOC = {"scenario": {"seed": 0},
       "workload": {"name": "text", "context": 4, "width": 8, "layers": 2, "heads": 1, "max_bytes": 2000},
       "federation": {"rounds": 2, "lr": 0.5},
       "pipeline": {"stages": 2, "peers_per_stage": 2, "micro_batches": 2, "micro_batch_size": 2,
                    "attackers": 0, "attacker_stage": 1, "routing": "round_robin", "latency_ms": 5.0},
       "attack": "none", "defense": "mean"}
HOP, LAT = 0.01, 0.005  # the default hop_time_s; latency_ms = 5
ACT_BYTES = 2 * 4 * 8 * 4  # micro_batch_size × context × width × 4 bytes (float32)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Two threads on this tiny model cost 50× more than one (thread hand-offs)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def doc(attack="none", checks=None, rounds=None, defense=None, **pipeline):
    d = copy.deepcopy(DOC)
    d["attack"] = attack
    d["pipeline"].update(pipeline)
    if checks is not None:
        d["pipeline"]["checks"] = checks
    if rounds is not None:
        d["federation"]["rounds"] = rounds
    if defense is not None:
        d["defense"] = defense
    return d


def build(d):
    return SwarmRun(parse_scenario(d))


def batches(d, rounds=None):
    """The micro-batches of each round, as the run draws them: its training stream, fresh."""
    ref = build(d)
    pl = ref.pl
    out = []
    for _ in range(rounds if rounds is not None else d["federation"]["rounds"]):
        rnd = []
        for _ in range(pl.micro_batches):
            idx = torch.randint(0, ref.train_x.shape[0], (pl.micro_batch_size,), generator=ref.torch_rng["train"])
            rnd.append((ref.train_x[idx], ref.train_y[idx]))
        out.append(rnd)
    return ref, out


def whole_loss(ref, flat, x, y):
    """The whole model's next-byte loss at ``flat``: the workload's own forward, not the stages."""
    out = functional_call(ref.model, ref.spec.unflatten(flat), (x,))
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=-100)


def grads(ref, params, rnd):
    """Each micro-batch's gradient of its loss, on the whole model."""
    out = []
    for x, y in rnd:
        flat = params.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(whole_loss(ref, flat, x, y), flat)
        out.append(g)
    return out


def test_honest_rounds_are_the_sgd_step_on_the_round_micro_batches_and_records_by_hand():
    """Mean of the peers' SGD steps = one SGD step on the mean loss of the round's micro-batches
    (each stage's two peers served one micro-batch each). The records, by hand: every peer
    served once a round; 4 hops, 2 completed; bytes = 2 directions × 256 bytes × 1 link × 2
    micro-batches; each peer was busy hop / speed plus one send of 5 ms (a two-stage pipeline
    has one link), and that is reset every round (the same sim time in both rounds)."""
    d = doc()
    r = build(d)
    speeds = [p.speed for p in r.peers]
    seen = []
    res = r.run(on_round=seen.append)
    assert seen == res.records
    ref, bs = batches(d)
    params = ref.params0.clone()
    for k, rnd in enumerate(bs):
        g0, g1 = grads(ref, params, rnd)
        params = params - 0.5 * (g0 + g1) / 2
        rec = res.records[k]
        with torch.no_grad():
            test_loss = float(whole_loss(ref, params, ref.test_x, ref.test_y))
        assert rec.loss == pytest.approx(test_loss, rel=1e-4)
        assert rec.round == k
        pl = rec.extra["pipeline"]
        assert pl["served"] == {0: 1, 1: 1, 2: 1, 3: 1}
        assert (pl["hops"], pl["completed"], pl["lost_micro_batches"], pl["rerouted_hops"], pl["lost_hops"]) == \
            (4, 2, 0, 0, 0)
        assert pl["flagged"] == pl["banned_at"] == pl["acted"] == pl["departed"] == {}
        assert pl["recomputed_hops"] == 0 and "refused" not in pl
        assert rec.accepted == rec.participating == [True] * 4
        assert rec.malicious == [False] * 4 and rec.rejected == {} and rec.dropped == {}
        assert rec.bytes_on_wire == 2 * ACT_BYTES * 1 * 2 == 1024
        busy = [HOP / s + LAT for s in speeds]
        assert rec.sim_time_s == pytest.approx(max(busy), rel=1e-12)
        assert pl["sim_time_s"] == rec.sim_time_s
        assert pl["idle_share"] == pytest.approx(1 - sum(busy) / (4 * max(busy)), rel=1e-9)
    assert torch.allclose(r.final_params, params, rtol=1e-4, atol=1e-6), float((r.final_params - params).abs().max())
    assert res.records[0].loss != res.records[1].loss


def test_the_tiny_pipeline_learns_better_than_a_uniform_guess():
    """Ten rounds at lr 1 on the tiny task: the test loss falls round after round (mostly) and
    ends well under a uniform guess over 256 bytes (ln 256 = 5.545 nats), where it started."""
    d = doc(rounds=10, micro_batches=4, micro_batch_size=4)
    d["federation"]["lr"] = 1.0
    r = build(d)
    res = r.run()
    losses = [rec.loss for rec in res.records]
    with torch.no_grad():
        start = float(whole_loss(r, r.params0, r.test_x, r.test_y))
    assert abs(start - math.log(256)) < 0.05  # GPT-2's small init: close to uniform
    assert losses[-1] < math.log(256) - 0.5, losses
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= 7, losses


def test_adam_stages_are_torch_adam_over_three_rounds():
    """optimizer = "adam": three rounds are three steps of torch.optim.Adam (β = (0.9, 0.999),
    ε = 1e-8) on the round's mean loss; one step could not tell β's apart (its bias-corrected
    step is ±lr whatever β), three can. SGD takes another path."""
    d = doc(rounds=3, optimizer="adam")
    d["federation"]["lr"] = 0.01
    r = build(d)
    r.run()
    ref, bs = batches(d)
    flat = ref.params0.clone().requires_grad_(True)
    opt = torch.optim.Adam([flat], lr=0.01)
    for rnd in bs:
        opt.zero_grad()
        torch.stack([whole_loss(ref, flat, x, y) for x, y in rnd]).mean().backward()
        opt.step()
    assert torch.allclose(r.final_params, flat.detach(), rtol=1e-4, atol=2e-5), \
        float((r.final_params - flat.detach()).abs().max())
    assert set(r._adam) == {0, 1} and all(t == 3 for _, _, t in r._adam.values())
    sgd = doc(rounds=3)
    sgd["federation"]["lr"] = 0.01
    s = build(sgd)
    s.run()
    assert not torch.allclose(s.final_params, r.final_params, atol=1e-5)


def test_step_is_the_merged_update_for_sgd_and_bias_corrected_adam_by_hand():
    """_step on a stand-in: SGD returns the merged update as it is. Adam on g = −merged/lr:
    after two steps with g₁ = 1, g₂ = 3 (lr 0.5): m = 0.1·0.9 + 0.3 = 0.39, v = 0.001·0.999 +
    0.009 = 0.009999, m̂ = 0.39/0.19, v̂ = 0.009999/0.001999; step −lr·m̂/(√v̂ + 1e-8)."""
    ns = SimpleNamespace(pl=SimpleNamespace(optimizer="sgd"), _adam={})
    u = torch.tensor([0.25, -2.0], dtype=torch.float64)
    assert SwarmRun._step(ns, 0, u, 0.5) is u
    ns.pl.optimizer = "adam"
    lr = 0.5
    first = SwarmRun._step(ns, 1, torch.tensor([-lr * 1.0], dtype=torch.float64), lr)
    assert float(first) == pytest.approx(-lr * 1.0 / (1.0 + 1e-8), rel=1e-12)
    second = SwarmRun._step(ns, 1, torch.tensor([-lr * 3.0], dtype=torch.float64), lr)
    m_hat = (0.9 * 0.1 + 0.1 * 3.0) / (1 - 0.9 ** 2)
    v_hat = (0.999 * 0.001 + 0.001 * 9.0) / (1 - 0.999 ** 2)
    assert float(second) == pytest.approx(-lr * m_hat / (math.sqrt(v_hat) + 1e-8), rel=1e-12)
    m, v, t = ns._adam[1]
    assert t == 2 and float(m) == pytest.approx(0.39, rel=1e-12) and float(v) == pytest.approx(0.009999, rel=1e-12)
    assert 0 not in ns._adam  # stage 0 took no Adam step
    # a negative gradient: the moments' signs (m follows g, v does not)
    ns2 = SimpleNamespace(pl=SimpleNamespace(optimizer="adam"), _adam={})
    SwarmRun._step(ns2, 0, torch.tensor([lr * 2.0], dtype=torch.float64), lr)
    m, v, t = ns2._adam[0]
    assert float(m) == pytest.approx(-0.2, rel=1e-12) and float(v) == pytest.approx(0.004, rel=1e-12) and t == 1


def test_full_loss_is_the_whole_models_mean_next_byte_loss_with_masked_targets():
    """full_loss through the stages = the whole model's cross-entropy, by hand: the mean of
    −log softmax(logits)[target] over the targets that are not −100 (byte 100 is a target like
    any other), differentiable in the flat vector."""
    r = build(doc())
    x = r.train_x[:3]
    y = r.train_y[:3].clone()
    y[0, 0], y[1, 2], y[2, 1] = -100, -100, 100
    flat = r.params0.clone().requires_grad_(True)
    got = r.full_loss(flat, x, y)
    with torch.no_grad():
        logits = _loaded(r)(x)
        logp = torch.log_softmax(logits.double(), dim=-1)
        keep = [(b, t) for b in range(3) for t in range(4) if int(y[b, t]) != -100]
        want = -sum(float(logp[b, t, int(y[b, t])]) for b, t in keep) / len(keep)
    assert len(keep) == 10
    assert float(got.detach()) == pytest.approx(want, rel=1e-5)
    (g,) = torch.autograd.grad(got, flat)
    assert torch.isfinite(g).all() and float(g.abs().sum()) > 0
    for s, sl in enumerate(r.slices):  # every stage's parameters get a gradient
        assert float(g[sl].abs().sum()) > 0, s


def _loaded(r):
    """The workload's model with the run's starting parameters loaded (a copy)."""
    m = copy.deepcopy(r.model)
    torch.nn.utils.vector_to_parameters(r.params0.clone(), m.parameters())
    return m


def test_stage_slices_cover_the_flat_vector_in_order():
    r = build(doc())
    n = r.params0.numel()
    assert r.slices[0].start == 0 and r.slices[0].stop == r.slices[1].start and r.slices[1].stop == n
    assert r.stage_names[0][:2] == ["tok.weight", "pos.weight"] and r.stage_names[0][-1] == "blocks.0.out.bias"
    assert r.stage_names[1][0] == "blocks.1.ln1.weight" and r.stage_names[1][-2:] == ["head.weight", "head.bias"]
    assert [p.stage for p in r.peers] == [0, 0, 1, 1] and [p.pid for p in r.peers] == [0, 1, 2, 3]
    assert r.n_peers == 4 and r._act_bytes == ACT_BYTES
    # stage_forward of each stage in turn is the model's forward
    with torch.no_grad():
        h = r.stage_forward(1, r.stage_forward(0, r.train_x[:2], r.params0[r.slices[0]]), r.params0[r.slices[1]])
        assert torch.allclose(h, _loaded(r)(r.train_x[:2]), atol=1e-5)
        assert torch.allclose(r.check_view.stage_forward(0, r.train_x[:2], r.params0[r.slices[0]]),
                              r.stage_forward(0, r.train_x[:2], r.params0[r.slices[0]]))
    assert r.current_round == 0 and r._prev == {} and r._stage_state == {}


def test_a_run_runs_once_and_a_scenario_without_pipeline_is_refused():
    r = build(doc(rounds=1))
    r.run()
    with pytest.raises(RedteamError, match="^this SwarmRun has already run; build a new one for another run$"):
        r.run()
    plain = parse_scenario({"workload": {"name": "digits"}, "federation": {"clients": 4, "rounds": 1}})
    with pytest.raises(InvalidParameter, match=r"^SwarmRun needs a scenario with a \[pipeline\] section$"):
        SwarmRun(plain)


def test_deterministic_under_the_seed_and_another_seed_differs():
    d = doc(routing="swarm", throughput_sigma=1.0, micro_batches=4)
    a, b = build(d), build(d)
    ra, rb = a.run(), b.run()
    assert [x.extra["pipeline"] for x in ra.records] == [x.extra["pipeline"] for x in rb.records]
    assert [x.loss for x in ra.records] == [x.loss for x in rb.records]
    assert torch.equal(a.final_params, b.final_params)
    d["scenario"]["seed"] = 1
    c = build(d)
    c.run()
    assert not torch.equal(a.final_params, c.final_params)
    assert [p.speed for p in a.peers] != [p.speed for p in c.peers]


# ------------------------------------------------------------------ workload checks and placement
def _placement(stages=3, name="text", attackers=0, attacker_stage=1, P=3):
    sc = SimpleNamespace(pipeline=SimpleNamespace(stages=stages, attackers=attackers, attacker_stage=attacker_stage,
                                                  peers_per_stage=P),
                         workload=SimpleNamespace(name=name))
    return PipelinePlacement(sc)


def test_check_workload_needs_the_text_transformer_with_a_layer_per_stage():
    _placement(3).check_workload(SimpleNamespace(layers=3))  # one layer per stage: enough
    _placement(2).check_workload(SimpleNamespace(layers=5))
    with pytest.raises(InvalidParameter) as e:
        _placement(3).check_workload(SimpleNamespace(layers=2))
    assert str(e.value) == ("[pipeline].stages = 3: the transformer has 2 layers; every stage needs one "
                            "(raise [workload] layers or lower stages)")
    with pytest.raises(InvalidParameter) as e:
        _placement(3, name="digits").check_workload(SimpleNamespace(layers=8))
    assert str(e.value) == ("[pipeline]: the pipeline regime cuts the 'text' transformer into stages; "
                            "workload 'digits' is not one")


def test_placement_draws_attackers_from_the_attacker_stage_and_sizes_each_stage_rule():
    rng = {"roles": SimpleNamespace(choice=lambda n, size, replace: np.array([2, 0][:size]))}
    assert _placement(attackers=2, attacker_stage=2, P=3).place(9, rng) == [6, 8]
    assert _placement(attackers=1, attacker_stage=1, P=4).place(12, rng) == [6]
    assert _placement(attackers=0).place(9, rng) == []
    pp = _placement(P=5)
    assert pp.defense_sizes([3, 4]) == (2, 5) and pp.root_size(10, None) is None


# ------------------------------------------------------------------ attacks in the loop
def test_a_lazy_last_stage_peer_costs_no_compute_and_its_acts_are_counted():
    """A lazy peer in the last stage (one link: one send per hop) is busy only for its sends
    (5 ms per hop), never for the hop's compute; honest peers, all at speed 1, for 10 ms + 5 ms
    per hop. 4 micro-batches: each peer serves 2 hops a round, the lazy one acts on both."""
    d = doc({"name": "lazy_peer"}, micro_batches=4, attackers=1)
    r = build(d)
    (m,) = r.malicious
    assert m in (2, 3)
    for p in r.peers:
        p.speed = 0.05 if p.pid == m else 1.0  # computing, it would take 0.2 s a hop
    res = r.run()
    for rec in res.records:
        pl = rec.extra["pipeline"]
        assert pl["acted"] == {m: 2} and pl["served"] == {0: 2, 1: 2, 2: 2, 3: 2}
        assert rec.sim_time_s == pytest.approx(2 * (HOP + LAT), rel=1e-12)
        busy = [2 * (HOP + LAT)] * 3 + [2 * LAT]
        assert pl["idle_share"] == pytest.approx(1 - sum(busy) / (4 * 2 * (HOP + LAT)), rel=1e-9)
        assert rec.malicious == [p == m for p in range(4)]
        assert rec.accepted == [True] * 4  # unchecked, mean: its update is merged
        assert pl["flagged"] == {} and pl["departed"] == {}


def test_gradient_tamper_scales_the_gradient_the_previous_stage_trains_on():
    """A ×−20 gradient from the stage-1 attacker: the stage-0 peer of its micro-batch trains on
    −20 × its true gradient (the backward is linear in what is sent back); stage 1 itself and
    the other micro-batch are honest. The stage-0 slice after one round, by hand."""
    d = doc({"name": "gradient_tamper", "kind": "scale", "strength": -20.0}, rounds=1, attackers=1)
    r = build(d)
    (m,) = r.malicious
    r.run()
    ref, (rnd,) = batches(d)
    g = grads(ref, ref.params0, rnd)
    k = m - 2  # its micro-batch in round robin
    s0, s1 = ref.slices
    want0 = ref.params0[s0] - 0.5 * (g[0][s0] * (-20.0 if k == 0 else 1.0) + g[1][s0] * (-20.0 if k == 1 else 1.0)) / 2
    want1 = ref.params0[s1] - 0.5 * (g[0][s1] + g[1][s1]) / 2
    assert torch.allclose(r.final_params[s1], want1, rtol=1e-4, atol=1e-6)
    assert torch.allclose(r.final_params[s0], want0, rtol=1e-4, atol=1e-6)


def test_crash_at_sync_loses_its_stage_work_and_is_recorded_as_departed():
    """The attacker serves its micro-batch, then leaves just before the sync: its stage's update
    is the honest peer's alone (its one micro-batch's step), the record names it departed and
    dropped, its hops lost, and it is not accepted though it took part."""
    d = doc({"name": "crash_at_sync"}, rounds=1, attackers=1)
    r = build(d)
    (m,) = r.malicious
    res = r.run()
    (rec,) = res.records
    pl = rec.extra["pipeline"]
    why = "left just before the stage sync"
    assert pl["departed"] == {m: why} and rec.dropped == {m: why}
    assert pl["lost_hops"] == 1 and pl["acted"] == {m: 1} and pl["completed"] == 2
    assert rec.accepted == [p != m for p in range(4)] and rec.participating == [True] * 4
    ref, (rnd,) = batches(d)
    g = grads(ref, ref.params0, rnd)
    s0, s1 = ref.slices
    h = 5 - m  # the honest stage-1 peer, and its micro-batch h − 2
    assert torch.allclose(r.final_params[s1], ref.params0[s1] - 0.5 * g[h - 2][s1], rtol=1e-4, atol=1e-6)
    assert torch.allclose(r.final_params[s0], ref.params0[s0] - 0.5 * (g[0][s0] + g[1][s0]) / 2, rtol=1e-4, atol=1e-6)


def test_outside_the_attack_window_the_attacker_is_honest_and_not_counted():
    d = doc({"name": "crash_at_sync"}, rounds=2, attackers=1)
    d["attack"]["window"] = "1:"
    r = build(d)
    res = r.run()
    (m,) = r.malicious
    first, second = res.records
    assert first.extra["pipeline"]["departed"] == {} and first.malicious == [False] * 4
    assert first.extra["pipeline"]["acted"] == {} and first.accepted == [True] * 4
    assert second.extra["pipeline"]["departed"] == {m: "left just before the stage sync"}
    assert second.malicious == [p == m for p in range(4)]


def test_recompute_bans_the_tamperer_at_its_hop_and_leaves_its_update_out():
    """redundant_recompute at fraction 1, tolerance 0: every hop with another unbanned peer in its
    stage is recomputed. The noise tamperer m (stage 1) fails at its first hop (micro-batch m − 2)
    and is banned from there; after it the stage has one peer, whose hops nobody can verify.
    Round 0 recomputes 3 hops (m = 2) or 4 (m = 3); round 1 only stage 0's 2. The banned peer's
    update is left out (rejected, not accepted); in round 1 it serves nothing and is not judged."""
    checks = [{"name": "redundant_recompute", "fraction": 1.0, "tolerance": 0.0}]
    d = doc({"name": "activation_tamper", "kind": "noise", "strength": 0.5}, checks=checks, attackers=1)
    r = build(d)
    (m,) = r.malicious
    res = r.run()
    first, second = res.records
    pl = first.extra["pipeline"]
    assert pl["banned_at"] == {m: m - 2} and set(pl["flagged"]) == {m}
    assert pl["flagged"][m].startswith("redundant recompute by peer ")
    assert pl["recomputed_hops"] == (3 if m == 2 else 4)
    assert first.rejected == {m: f"banned at micro-batch {m - 2}: {pl['flagged'][m]}"}
    assert first.accepted == [p != m for p in range(4)] and first.participating == [True] * 4
    assert pl["served"][5 - m] == (2 if m == 2 else 1)
    pl2 = second.extra["pipeline"]
    assert pl2["banned_at"] == {m: m - 2} and pl2["flagged"] == {} and pl2["recomputed_hops"] == 2
    assert pl2["served"] == {0: 1, 1: 1, 5 - m: 2}
    assert second.rejected == {} and second.participating == [p != m for p in range(4)]
    assert second.accepted == [p != m for p in range(4)]


def test_detached_activations_register_no_hooks():
    """A lazy stage-0 peer (shapes differ there: it replays its last output, detached, from its
    second hop) hands stage 1 an input that needs no gradient; a lazy last stage hands the loss
    one. Neither the gradient tamper's hook, nor a backward monitor's, nor the loss's backward
    may then be attempted (each would raise). Peers 0 and 1 are both made malicious here (one
    peer a stage): the second's hooks are the acting-peer ones."""
    for attacker_stage in (0, 1):
        d = doc({"name": "lazy_peer"}, checks=[{"name": "activation_monitor"}], peers_per_stage=1, attackers=1,
                attacker_stage=attacker_stage, micro_batches=3, rounds=1)
        r = build(d)
        assert r.malicious == [attacker_stage]
        res = r.run()
        assert res.records[0].extra["pipeline"]["completed"] == 3
    d = doc({"name": "lazy_peer"}, peers_per_stage=1, attackers=1, attacker_stage=0, micro_batches=3, rounds=1)
    r = build(d)
    r.peers[1].malicious = True
    res = r.run()
    assert res.records[0].extra["pipeline"]["acted"] == {0: 3, 1: 3}


def test_churn_loses_or_reroutes_hops_and_the_books_balance():
    """Honest peers crash on half their hops. Without crash tolerance a crash loses the
    micro-batch; with it the hop goes to the stage's other peer (if that one is up). Either way
    completed + lost = micro-batches, the hops are the served ones, and a crashed peer's hops
    are lost work."""
    out = {}
    for tol in (False, True):
        r = build(doc(churn=0.5, crash_tolerance=tol, micro_batches=6, rounds=2))
        res = r.run()
        for rec in res.records:
            pl = rec.extra["pipeline"]
            # a stage with every peer down ends the round early: its remaining micro-batches are never drawn
            assert pl["completed"] + pl["lost_micro_batches"] <= 6
            assert pl["hops"] == sum(pl["served"].values())
            assert pl["lost_hops"] == sum(pl["served"].get(p, 0) for p in pl["departed"])
            assert all(w.startswith("crashed at micro-batch ") and w.endswith(" (churn)")
                       for w in pl["departed"].values())
            assert rec.dropped == {p: w for p, w in pl["departed"].items() if pl["served"].get(p)}
            assert rec.bytes_on_wire == 2 * ACT_BYTES * pl["completed"]
        out[tol] = [rec.extra["pipeline"] for rec in res.records]
    assert all(pl["rerouted_hops"] == 0 for pl in out[False])
    assert sum(pl["rerouted_hops"] for pl in out[True]) > 0
    assert sum(pl["lost_micro_batches"] for pl in out[False]) > 0
    assert sum(pl["completed"] for pl in out[False]) > 0 and sum(pl["completed"] for pl in out[True]) > 0


def test_a_pipeline_that_never_completes_keeps_its_parameters():
    """churn 0.95 and no crash tolerance: (nearly) every micro-batch dies with a crashed peer;
    a stage whose every serving peer crashed has no member at the sync and keeps its slice."""
    r = build(doc(churn=0.95, crash_tolerance=False, micro_batches=2, rounds=1))
    res = r.run()
    pl = res.records[0].extra["pipeline"]
    assert pl["completed"] == 0 and pl["lost_micro_batches"] == 2 and res.records[0].bytes_on_wire == 0
    assert torch.equal(r.final_params, r.params0)
    assert res.records[0].accepted == [False] * 4


def test_a_stage_rule_that_refuses_keeps_the_stage_and_says_so():
    """Krum needs more peers than a stage of two has: each stage keeps its parameters, and the
    record says which and why."""
    r = build(doc(defense={"name": "krum", "f": 1}, rounds=1))
    res = r.run()
    pl = res.records[0].extra["pipeline"]
    assert set(pl["refused"]) == {0, 1}
    assert all(pl["refused"][s].startswith(f"stage {s} kept its parameters: ") for s in (0, 1))
    assert torch.equal(r.final_params, r.params0)


def test_non_finite_updates_are_rejected_by_the_stage_rule_with_its_reason():
    """An attacker in the last stage scaling its logits by 1e38 (past float32's range) makes its
    micro-batch's loss, and so its own and its stage-0 partner's gradients, non-finite: mean
    rejects both rows with its reason, and each stage moves by its other peer's step alone."""
    d = doc({"name": "activation_tamper", "kind": "scale", "strength": 1e38}, rounds=1, attackers=1)
    r = build(d)
    (m,) = r.malicious
    res = r.run()
    (rec,) = res.records
    k = m - 2  # its micro-batch, and the stage-0 peer that served it
    assert rec.rejected == {k: "non-finite update", m: "non-finite update"}
    assert rec.accepted == [p not in (k, m) for p in range(4)]
    assert "refused" not in rec.extra["pipeline"]
    ref, (rnd,) = batches(d)
    g = grads(ref, ref.params0, rnd)
    s0, s1 = ref.slices
    assert torch.allclose(r.final_params[s0], ref.params0[s0] - 0.5 * g[1 - k][s0], rtol=1e-4, atol=1e-6)
    assert torch.allclose(r.final_params[s1], ref.params0[s1] - 0.5 * g[1 - k][s1], rtol=1e-4, atol=1e-6)


def test_a_colluding_verifier_vouches_only_for_an_accomplice():
    """CheckView.verifier_agrees: a malicious verifier whose attack colludes says yes for a
    malicious peer without computing; for an honest peer it recomputes like anyone (here the
    test rejects every output, so a recomputation answers no); an honest verifier always
    recomputes; without collusion nobody vouches."""
    from redteam.federation.swarm import CheckView

    calls = []

    def forward(stage, inp, flat):
        calls.append(stage)
        return 2 * inp

    peers = [SimpleNamespace(malicious=m) for m in (True, True, False)]
    run = SimpleNamespace(peers=peers, attack=SimpleNamespace(colluding_verifiers=True), stage_forward=forward)
    view = CheckView(run)
    no = lambda out: False  # noqa: E731
    assert view.verifier_agrees(1, 0, 1, torch.ones(1), torch.zeros(1), no) is True and calls == []
    assert view.verifier_agrees(1, 0, 2, torch.ones(1), torch.zeros(1), no) is False and calls == [1]
    assert view.verifier_agrees(1, 2, 0, torch.ones(1), torch.zeros(1), no) is False and calls == [1, 1]
    assert view.verifier_agrees(1, 2, 0, torch.ones(1), torch.zeros(1), lambda out: bool(out[0] == 2)) is True
    run.attack.colluding_verifiers = False
    assert view.verifier_agrees(1, 0, 1, torch.ones(1), torch.zeros(1), no) is False


def test_churn_crashes_are_rerouted_or_lost_one_for_one():
    """Each crash takes a distinct peer down for the round (a down peer gets no more hops): it is
    either re-routed (crash tolerance, another peer up) or loses its micro-batch. So per round
    rerouted + lost = the peers departed."""
    for tol in (False, True):
        r = build(doc(churn=0.4, crash_tolerance=tol, micro_batches=6, rounds=3, peers_per_stage=3))
        res = r.run()
        for rec in res.records:
            pl = rec.extra["pipeline"]
            assert pl["rerouted_hops"] + pl["lost_micro_batches"] == len(pl["departed"]), pl
        assert sum(len(rec.extra["pipeline"]["departed"]) for rec in res.records) > 0


def test_an_attacker_that_computes_is_busy_for_its_compute():
    """A crash-at-sync attacker does its hop's compute (it only leaves at the sync): at speed 0.05
    its hop takes 0.2 s plus its send, the round's makespan."""
    r = build(doc({"name": "crash_at_sync"}, rounds=1, attackers=1))
    (m,) = r.malicious
    for p in r.peers:
        p.speed = 0.05 if p.pid == m else 1.0
    res = r.run()
    assert res.records[0].sim_time_s == pytest.approx(HOP / 0.05 + LAT, rel=1e-12)


def test_the_activation_monitor_judges_gradients_and_last_stage_losses_in_the_loop():
    """Three peers a stage (the monitor's minimum), six micro-batches. A ×−20 gradient from a
    stage-1 peer is seen by the backward watch (the gradient each peer sends back against the one
    it got). A last-stage peer scaling its logits by 1000 (the starting model's logits are close
    to 0, so a small scale leaves the loss near ln 256), with the forward threshold out of reach,
    is seen by the last stage's loss check alone. Each is flagged and banned, nobody else, by the
    statistic named; nothing is recomputed."""
    mon = [{"name": "activation_monitor"}]
    for attack, kind in (({"name": "gradient_tamper", "kind": "scale", "strength": -20.0}, "backward"),
                         ({"name": "activation_tamper", "kind": "scale", "strength": 1000.0}, "loss")):
        if kind == "loss":  # the forward statistic blind (threshold 100 nats): only the loss can tell
            mon = [{"name": "activation_monitor", "threshold": 100.0, "loss_threshold": 0.1}]
        r = build(doc(attack, checks=mon, peers_per_stage=3, attackers=1, micro_batches=6, rounds=2))
        (m,) = r.malicious
        res = r.run()
        flagged = {p: w for rec in res.records for p, w in rec.extra["pipeline"]["flagged"].items()}
        banned = {p for rec in res.records for p in rec.extra["pipeline"]["banned_at"]}
        assert flagged.keys() == banned == {m}, (attack, flagged)
        assert flagged[m].startswith(f"activation monitor ({kind}): "), flagged
        assert all(rec.extra["pipeline"]["recomputed_hops"] == 0 for rec in res.records)


def test_the_commitment_audit_recomputes_at_the_round_end_and_bans_there():
    """activation_commitment at fraction 1: every hop is logged, and audited at the round's end
    by another peer of its stage (both stages have two). The noise tamperer fails its audit: it
    is banned from micro-batch 2 (the round's end), its update left out of that round. Round 0
    recomputes all 4 hops; round 1 only stage 0's 2 (stage 1 has one peer left, unverifiable)."""
    checks = [{"name": "activation_commitment", "fraction": 1.0}]
    r = build(doc({"name": "activation_tamper", "kind": "noise", "strength": 0.5}, checks=checks, attackers=1))
    (m,) = r.malicious
    first, second = r.run().records
    assert first.extra["pipeline"]["banned_at"] == {m: 2} and first.extra["pipeline"]["recomputed_hops"] == 4
    assert first.accepted == [p != m for p in range(4)]
    assert second.extra["pipeline"]["recomputed_hops"] == 2


def test_a_pool_with_fewer_windows_than_the_context_still_runs():
    """1,024 bytes cut into 33-byte windows leave 28 training windows for a context of 32: the
    causal mask is context × context whatever the pool's size, and the round is still the
    whole model's SGD step."""
    d = doc(rounds=1)
    d["workload"].update(context=32, max_bytes=1024)
    r = build(d)
    assert r.train_x.shape == (28, 32) and r._causal.shape == (32, 32)
    assert torch.equal(r._causal, torch.ones(32, 32, dtype=torch.bool).tril())
    r.run()
    ref, (rnd,) = batches(d)
    g0, g1 = grads(ref, ref.params0, rnd)
    assert torch.allclose(r.final_params, ref.params0 - 0.5 * (g0 + g1) / 2, rtol=1e-4, atol=1e-6)


def test_the_result_names_the_run_and_its_wall_time():
    import time

    r = build(doc({"name": "lazy_peer"}, rounds=1, attackers=1))
    t0 = time.perf_counter()
    res = r.run()
    elapsed = time.perf_counter() - t0
    assert 0 < res.wall_time_s <= elapsed
    assert res.attack == "lazy_peer" and res.malicious == r.malicious and len(res.malicious) == 1
    assert res.wall_time_s >= sum(rec.wall_time_s for rec in res.records) * 0.99


def test_a_round_where_only_a_free_lazy_peer_worked_has_no_idle_share():
    """Latency 0, one peer a stage: the lazy stage-0 peer serves at no cost (no compute, free
    sends), then the honest stage-1 peer crashes (churn 0.95, no tolerance): nobody was busy,
    the round's makespan is 0 and the idle share undefined (None), not a division by zero."""
    d = doc({"name": "lazy_peer"}, peers_per_stage=1, attackers=1, attacker_stage=0, churn=0.95,
            crash_tolerance=False, latency_ms=0.0, micro_batches=1, rounds=1)
    r = build(d)
    (rec,) = r.run().records
    pl = rec.extra["pipeline"]
    assert pl["served"] == {0: 1} and pl["lost_micro_batches"] == 1 and pl["departed"].keys() == {1}
    assert rec.sim_time_s == 0.0 and pl["idle_share"] is None


def test_uplinks_are_log_normal_around_the_bandwidth_from_their_own_stream():
    """bandwidth_mbps = 2, bandwidth_sigma = 0.5: peer p's uplink is 2·exp(z_p), z the first 4
    normal(0, 0.5) draws of the links stream, which a run without links leaves untouched (so
    turning links on changes no speed). A round's busy time then adds, per send, 5 ms + 256
    bytes × 8 / (uplink · 10⁶) s."""
    plain = build(doc(rounds=1))
    z = plain.rng["links"].normal(0.0, 0.5, 4)
    d = doc(rounds=1, bandwidth_mbps=2.0, bandwidth_sigma=0.5)
    r = build(d)
    assert [p.uplink_mbps for p in r.peers] == pytest.approx(list(2.0 * np.exp(z)), rel=1e-12)
    assert [p.speed for p in r.peers] == [p.speed for p in plain.peers]
    assert all(p.uplink_mbps == math.inf for p in plain.peers)
    (rec,) = r.run().records
    busy = [HOP / p.speed + LAT + ACT_BYTES * 8 / (2.0 * math.exp(zp) * 1e6) for p, zp in zip(r.peers, z)]
    assert rec.sim_time_s == pytest.approx(max(busy), rel=1e-9)


def test_attackers_of_the_none_attack_never_act():
    """Attackers drawn, but the attack is "none" (no surface): the window is open, yet nobody
    acts, nobody is counted malicious in the record, and the round is honest SGD."""
    d = doc("none", rounds=1, attackers=1)
    r = build(d)
    assert len(r.malicious) == 1
    (rec,) = r.run().records
    assert rec.extra["pipeline"]["acted"] == {} and rec.malicious == [False] * 4
    ref, (rnd,) = batches(d)
    g0, g1 = grads(ref, ref.params0, rnd)
    assert torch.allclose(r.final_params, ref.params0 - 0.5 * (g0 + g1) / 2, rtol=1e-4, atol=1e-6)


def test_the_backward_watch_passes_each_gradient_on_to_the_stage_before():
    """Three stages of three peers: the ×−20 gradient of a middle-stage peer is judged against
    the gradient it received from stage 2, which stage 2's watch handed on (the last stage's
    comes from the loss). It is flagged by the backward statistic; nobody else is."""
    d = doc({"name": "gradient_tamper", "kind": "scale", "strength": -20.0}, checks=[{"name": "activation_monitor"}],
            stages=3, peers_per_stage=3, attackers=1, attacker_stage=1, micro_batches=6, rounds=2)
    d["workload"]["layers"] = 3
    r = build(d)
    (m,) = r.malicious
    assert 3 <= m <= 5
    res = r.run()
    flagged = {p: w for rec in res.records for p, w in rec.extra["pipeline"]["flagged"].items()}
    assert flagged.keys() == {m} and flagged[m].startswith("activation monitor (backward): "), flagged


class _StageUpdate:
    """The run's attack with its tamper_stage_update replaced (everything else delegated)."""

    def __init__(self, inner, fn):
        self._inner, self._fn, self.calls = inner, fn, []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def tamper_stage_update(self, row, ctx):
        self.calls.append((ctx.round, ctx.stage, ctx.peer))
        return self._fn(row, ctx)


def _identity_attacker(**kw):
    """A stage-1 attacker whose hops are honest: its gradient is scaled by exactly 1."""
    d = doc({"name": "gradient_tamper", "kind": "scale", "strength": 1.0}, attackers=1, **kw)
    return d, build(d)


def test_only_an_acting_attacker_submits_a_tampered_stage_update():
    """A stage update shifted by +1 in every coordinate: only the attacker's row, only in the
    attack's window. Round 0 (window open): stage 1 moves by the honest SGD step + 1/2 (mean of
    two rows, one shifted), stage 0 by the SGD step alone. With the window from round 1, round 0 is
    not tampered."""
    d, r = _identity_attacker(rounds=1)
    (m,) = r.malicious
    r.attack = _StageUpdate(r.attack, lambda row, ctx: row + 1.0)
    r.run()
    assert r.attack.calls == [(0, 1, m)]
    ref, (rnd,) = batches(d)
    g0, g1 = grads(ref, ref.params0, rnd)
    sgd = ref.params0 - 0.5 * (g0 + g1) / 2
    s0, s1 = ref.slices
    assert torch.allclose(r.final_params[s0], sgd[s0], rtol=1e-4, atol=1e-6)
    assert torch.allclose(r.final_params[s1], sgd[s1] + 0.5, rtol=1e-4, atol=1e-5)
    d["attack"]["window"] = "1:"
    d["federation"]["rounds"] = 2
    late = build(d)
    late.attack = _StageUpdate(late.attack, lambda row, ctx: row + 1.0)
    late.run()
    assert late.attack.calls == [(1, 1, m)]  # round 0 is outside the window


def test_a_stage_update_of_the_wrong_shape_is_refused_by_name():
    _, r = _identity_attacker(rounds=1)
    n = r.slices[1].stop - r.slices[1].start
    r.attack = _StageUpdate(r.attack, lambda row, ctx: row[:3])
    with pytest.raises(RedteamError) as e:
        r.run()
    assert str(e.value) == f"attack 'gradient_tamper': tamper_stage_update returned (3,), not the stage's ({n},)"
    _, r = _identity_attacker(rounds=1)
    r.attack = _StageUpdate(r.attack, lambda row, ctx: row.tolist())
    with pytest.raises(RedteamError, match=r"tamper_stage_update returned list, not the stage's"):
        r.run()


def test_a_crash_timing_attacker_that_served_nothing_has_nothing_to_leave():
    """One micro-batch a round, round robin: the attacker serves in one round of two. Only in
    that round does it leave before the sync; in the other it neither departs nor acts."""
    r = build(doc({"name": "crash_at_sync"}, attackers=1, micro_batches=1, rounds=2))
    (m,) = r.malicious
    res = r.run()
    served_in = m - 2  # round 0 routes hop 0 to peers 0, 2; round 1 hop 1 to peers 1, 3
    for k, rec in enumerate(res.records):
        pl = rec.extra["pipeline"]
        if k == served_in:
            assert pl["departed"] == {m: "left just before the stage sync"} and pl["acted"] == {m: 1}
        else:
            assert pl["departed"] == {} and pl["acted"] == {} and rec.dropped == {}


def test_the_checks_see_the_current_round():
    """CheckView.current_round is the round being run (the checks read it), at every hop and at
    the round's end."""
    r = build(doc(rounds=3))
    seen = []
    r.run(on_round=lambda rec: seen.append((rec.round, r.check_view.current_round)))
    assert seen == [(0, 0), (1, 1), (2, 2)]


def test_a_free_lazy_peer_still_counts_as_working_in_the_idle_share():
    """Latency 0, speeds 1: the honest peers are busy 2 × 10 ms a round, the lazy last-stage
    peer serves its 2 hops at no cost. It worked (it served), so the idle share is
    1 − 3 · 0.02 / (4 · 0.02) = 1/4, not 0 over the three busy peers."""
    r = build(doc({"name": "lazy_peer"}, attackers=1, micro_batches=4, rounds=1, latency_ms=0.0))
    for p in r.peers:
        p.speed = 1.0
    (rec,) = r.run().records
    assert rec.sim_time_s == pytest.approx(2 * HOP, rel=1e-12)
    assert rec.extra["pipeline"]["idle_share"] == pytest.approx(0.25, rel=1e-12)


class _HalfBroken:
    """A stage rule (a stand-in): the plain mean, with one coordinate of stage 1's aggregate NaN;
    its state counts its calls, and it records the state each call was given."""

    def __init__(self):
        self.given = []

    def __call__(self, rows, ctx):
        from redteam.types import Decision

        n = len(self.given)
        self.given.append(dict(ctx.state))
        agg = rows.mean(0).clone()
        if n % 2 == 1:
            agg[0] = float("nan")
        return Decision(agg, torch.ones(len(rows), dtype=torch.bool), state={"call": n})


def test_a_partly_non_finite_stage_aggregate_is_refused_and_each_stage_keeps_its_rule_state():
    """Stage 1's aggregate has one NaN: the stage keeps its parameters (all of them), with the
    reason; stage 0 takes its SGD step. Each stage's rule gets back the state it returned for
    that stage the round before (stage 0 its call 0, stage 1 its call 1), and the stage's last
    merged step is kept as the previous update: the change of its slice."""
    d = doc(rounds=2)
    r = build(d)
    rule = _HalfBroken()
    r.defense = rule
    res = r.run()
    assert rule.given == [{}, {}, {"call": 0}, {"call": 1}]
    assert r._stage_state == {0: {"call": 2}, 1: {"call": 3}}
    for rec in res.records:
        assert rec.extra["pipeline"]["refused"] == {1: "stage 1 kept its parameters: non-finite aggregate"}
    s0, s1 = r.slices
    assert torch.equal(r.final_params[s1], r.params0[s1])
    ref, bs = batches(d)
    params = ref.params0.clone()
    for rnd in bs:
        before = params.clone()
        g0, g1 = grads(ref, params, rnd)
        params[s0] = params[s0] - 0.5 * (g0[s0] + g1[s0]) / 2
    assert torch.allclose(r.final_params[s0], params[s0], rtol=1e-4, atol=1e-6)
    assert set(r._prev) == {0} and torch.allclose(r._prev[0], params[s0] - before[s0], rtol=1e-3, atol=1e-6)


def test_speeds_are_log_normal_from_the_network_stream():
    """throughput_sigma = 0.5: peer p's speed is exp(z_p), z the first 4 normal(0, 0.5) draws of
    the network stream, which a run with sigma 0 (all speeds 1) leaves untouched."""
    flat = build(doc(throughput_sigma=0.0))
    assert [p.speed for p in flat.peers] == [1.0] * 4
    z = flat.rng["network"].normal(0.0, 0.5, 4)
    r = build(doc(throughput_sigma=0.5))
    assert [p.speed for p in r.peers] == pytest.approx(list(np.exp(z)), rel=1e-12)


def test_placement_draws_distinct_attackers():
    """As many attackers as the stage has peers: every peer of the stage, each once, whatever
    the roles stream (drawn without replacement)."""
    for seed in range(6):
        rng = {"roles": np.random.default_rng(seed)}
        assert _placement(attackers=3, attacker_stage=1, P=3).place(9, rng) == [3, 4, 5]


def test_a_backward_check_failure_bans_the_sender_at_its_hop():
    """A stand-in backward check that fails every gradient peer 2 sends back (and passes the
    rest): in round 0 peer 2 serves micro-batch 0, so it is flagged with the check's reason and
    banned from hop 0, its update left out; nobody else is touched. Each call saw the gradient
    the peer received (from the loss) beside the one it sent."""
    from redteam.pipeline import HopVerdict, PipelineCheck

    class Veto(PipelineCheck):
        watches_backward = True
        seen: list = []

        def verify_hop(self, view, stage, peer, inp, sent, stage_params, rng, memory=None):
            return HopVerdict(False, False)

        def verify_backward(self, view, stage, peer, grad_received, grad_sent, memory):
            Veto.seen.append((stage, peer.pid, tuple(grad_received.shape), tuple(grad_sent.shape)))
            return HopVerdict(peer.pid == 2, False, "veto" if peer.pid == 2 else "")

    r = build(doc(rounds=1))
    r.checks.append(Veto())
    (rec,) = r.run().records
    pl = rec.extra["pipeline"]
    assert pl["flagged"] == {2: "veto"} and pl["banned_at"] == {2: 0}
    assert rec.rejected == {2: "banned at micro-batch 0: veto"} and rec.accepted == [True, True, False, True]
    assert Veto.seen == [(1, 2, (2, 4, 256), (2, 4, 8)), (1, 3, (2, 4, 256), (2, 4, 8))]


def test_a_check_in_the_defense_pipeline_acts_at_the_hops():
    """redundant_recompute as a stage of the [defense] pipeline (beside mean) is a hop check like
    one under [pipeline] checks: the noise tamperer is banned at its first hop."""
    d = doc({"name": "activation_tamper", "kind": "noise", "strength": 0.5}, attackers=1, rounds=1,
            defense={"pipeline": [{"name": "redundant_recompute", "fraction": 1.0, "tolerance": 0.0},
                                  {"name": "mean"}]})
    r = build(d)
    (m,) = r.malicious
    assert [type(c).__name__ for c in r.checks] == ["RedundantRecompute"]
    (rec,) = r.run().records
    assert rec.extra["pipeline"]["banned_at"] == {m: m - 2}


def test_a_link_under_one_megabit_is_still_a_link():
    plain = build(doc(rounds=1))
    z = plain.rng["links"].normal(0.0, 0.5, 4)
    r = build(doc(rounds=1, bandwidth_mbps=0.5, bandwidth_sigma=0.5))
    assert [p.uplink_mbps for p in r.peers] == pytest.approx(list(0.5 * np.exp(z)), rel=1e-12)


def test_stage_forward_masks_the_future_also_without_the_fused_kernel(monkeypatch):
    """The CPU's fused attention builds its own causal mask; the plain path uses the stage's,
    cut to the input's length. On 3 of the 4 bytes, unfused, the stages still compute the
    workload's forward (which builds its own mask)."""
    import redteam.workloads.text as text

    monkeypatch.setattr(text, "_FUSED", False)
    r = build(doc())
    x = r.train_x[:2, :3]
    with torch.no_grad():
        h = r.stage_forward(1, r.stage_forward(0, x, r.params0[r.slices[0]]), r.params0[r.slices[1]])
        assert torch.allclose(h, _loaded(r)(x), atol=1e-5)


def test_a_lost_micro_batch_still_counts_as_a_hop_index():
    """churn 0.95, no tolerance: peer 0 crashes on micro-batch 0 and loses it; micro-batch 1 (its
    index advances all the same) goes to peer 1, which crashes too. Each departure names its own
    micro-batch."""
    r = build(doc(churn=0.95, crash_tolerance=False, micro_batches=2, rounds=1))
    (rec,) = r.run().records
    assert rec.extra["pipeline"]["departed"] == {0: "crashed at micro-batch 0 (churn)",
                                                 1: "crashed at micro-batch 1 (churn)"}
