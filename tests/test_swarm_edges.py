"""The pipeline regime's edges, worked by hand (issue 39: the mutation audit of the pipeline):
the redundant recomputation's tolerance, the commitment audit's verifier, the activation
monitor's threshold, stage size, EMA and warm-up, the ban after strikes, the stage split, the
router, and the sign / scale / noise tampers. Each check and attack is called directly with a
stand-in view, so these run in milliseconds; ``tests/test_swarm.py`` runs them in the regime."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from attacks.pipeline import ActivationTamper, CrashAtSync, GradientTamper, LazyPeer
from defenses.pipeline_checks import ActivationCommitment, ActivationMonitor, RedundantRecompute, commitment
from redteam.errors import InvalidParameter
from redteam.federation.swarm import SwarmRun, _Peer, stage_of_parameter
from redteam.pipeline import HopVerdict
from redteam.types import StageContext


@dataclass(frozen=True)
class _Info:
    pid: int
    stage: int
    banned_at: int | None = None


class _View:
    """A stand-in for the regime's CheckView: stage s computes 2·input, verifiers are honest."""

    def __init__(self, peers, current_round=0):
        self.peers = peers
        self.current_round = current_round
        self.asked: list[tuple[int, int]] = []

    def verifier_agrees(self, stage, verifier, peer, inp, flat, test):
        self.asked.append((verifier, peer))
        return bool(test(2 * inp))


PEERS = [_Info(0, 0), _Info(1, 0), _Info(2, 0), _Info(3, 1, banned_at=4), _Info(4, 1), _Info(5, 1)]


def _always():  # a stream whose draws are all 0: every sampled check fires, the first candidate verifies
    return SimpleNamespace(random=lambda: 0.0, integers=lambda n: 0)


# ------------------------------------------------------------------ redundant recomputation
def test_recompute_tolerance_is_on_the_largest_gap_against_the_largest_output():
    """ref = 2·inp = (3, 0, 0, 0): the bound is tolerance·(1 + max|ref|) = 0.25·4 = 1. A gap of
    exactly 1 on one value passes (on the bound); the next float over fails. A mean |Δ| (0.25)
    or a mean |ref| (bound 0.4375) would judge these differently."""
    check = RedundantRecompute(fraction=1.0, tolerance=0.25)
    inp = torch.tensor([1.5, 0.0, 0.0, 0.0])
    ref = 2 * inp
    on = ref + torch.tensor([0.0, 1.0, 0.0, 0.0])
    over = ref + torch.tensor([0.0, 1.0 + 2.0 ** -23, 0.0, 0.0])  # the next float32
    v = check.verify_hop(_View(PEERS), 1, PEERS[4], inp, on, torch.zeros(1), _always())
    assert v == HopVerdict(False, True, verifier=5)  # peer 3 is banned: 5 verifies 4
    v = check.verify_hop(_View(PEERS), 1, PEERS[4], inp, over, torch.zeros(1), _always())
    assert v.failed and v.recomputed and v.verifier == 5
    assert v.reason == "redundant recompute by peer 5: max |Δ| = 1 > 1"
    # one value off by 1.5, the rest exact: failed (the mean gap, 0.375, is under the bound)
    spike = ref + torch.tensor([0.0, 0.0, 1.5, 0.0])
    assert check.verify_hop(_View(PEERS), 1, PEERS[4], inp, spike, torch.zeros(1), _always()).failed


def test_recompute_default_tolerance_is_1e_minus_4():
    """Default tolerance 1e-4: bound 4e-4 here; a gap of 3.5e-4 passes, 4.5e-4 fails (a looser
    or tighter default, by 2× or 10×, flips one of them)."""
    check = RedundantRecompute(fraction=1.0)
    inp = torch.tensor([1.5, 0.0], dtype=torch.float64)
    for gap, failed in ((3.5e-4, False), (4.5e-4, True)):
        sent = 2 * inp + torch.tensor([0.0, gap], dtype=torch.float64)
        assert check.verify_hop(_View(PEERS), 0, PEERS[0], inp, sent, torch.zeros(1), _always()).failed is failed


def test_recompute_samples_its_fraction_and_needs_another_peer():
    inp = torch.ones(2)
    bad = torch.zeros(2)
    # the draw 0.25 is not under fraction 0.25: unchecked; 0.2499 is
    for draw, checked in ((0.25, False), (0.2499, True)):
        rng = SimpleNamespace(random=lambda d=draw: d, integers=lambda n: 0)
        v = RedundantRecompute(fraction=0.25).verify_hop(_View(PEERS), 0, PEERS[0], inp, bad, torch.zeros(1), rng)
        assert v.recomputed is checked and v.failed is checked
    assert RedundantRecompute(fraction=0.0).verify_hop(_View(PEERS), 0, PEERS[0], inp, bad, torch.zeros(1),
                                                       _always()) == HopVerdict(False, False)
    alone = [_Info(0, 0), _Info(1, 1), _Info(2, 0, banned_at=0)]  # its stage's other peer is banned
    assert RedundantRecompute(fraction=1.0).verify_hop(_View(alone), 0, alone[0], inp, bad, torch.zeros(1),
                                                       _always()) == HopVerdict(False, False)
    v = RedundantRecompute(fraction=1.0).verify_hop(_View(PEERS), 0, PEERS[0], inp, torch.zeros(3),
                                                    torch.zeros(1), _always())
    assert v.failed and v.reason == "redundant recompute: output shape (3,) != (2,)"


# ------------------------------------------------------------------ commitment audit
def test_commitment_audit_recomputes_each_kept_hop_on_another_peer_and_empties_the_log():
    check = ActivationCommitment(fraction=1.0)
    mem: dict = {}
    inp = torch.tensor([1.0, 2.0])
    view = _View(PEERS)
    check.verify_hop(view, 1, PEERS[4], inp, 2 * inp, torch.zeros(1), _always(), mem)  # honest
    check.verify_hop(view, 1, PEERS[5], inp, 2 * inp + 1e-3, torch.zeros(1), _always(), mem)  # off
    assert [(s, p) for s, p, _, _ in mem["log"]] == [(1, 4), (1, 5)]
    out = check.audit_round(view, lambda s: torch.zeros(1), _always(), mem)
    assert out[0] == (4, HopVerdict(False, True, verifier=5))
    assert out[1][0] == 5 and out[1][1].failed and out[1][1].recomputed and out[1][1].verifier == 4  # not 5, not 3
    assert view.asked == [(5, 4), (4, 5)] and mem["log"] == []
    assert check.audit_round(view, lambda s: torch.zeros(1), _always(), mem) == []


def test_commitment_rounds_to_the_bits_it_names():
    assert commitment(torch.tensor([1.0]), 1) == commitment(torch.tensor([1.4]), 1) != commitment(
        torch.tensor([1.6]), 1)
    for bits in (10, 24):  # −0 commits as +0; 0 and ±1 stay apart
        assert commitment(torch.tensor([-0.0]), bits) == commitment(torch.tensor([0.0]), bits)
        assert len({commitment(torch.tensor([v]), bits) for v in (0.0, 1.0, -1.0)}) == 3


# ------------------------------------------------------------------ activation monitor
def _round(mon, mem, view, values, kind="forward", stage=0):
    """One round of ``kind`` statistics: peer → its hops' values at ``stage``; audited."""
    mb = 0
    for pid, vals in values.items():
        for v in vals:
            mb += 1
            mem.setdefault("hops", []).append((kind, mb, stage, pid, v))
            mem.setdefault("route", {})[mb] = {stage: pid}
    return dict(mon.audit_round(view, None, None, mem))


def test_monitor_flags_past_the_threshold_not_on_it():
    """Medians 0, 0.25, 1.25: the stage's median is 0.25, so the third peer deviates by exactly
    1.0 (binary-exact): on the default threshold it passes; with a threshold one step under, it
    is flagged, and its reason gives the EMA."""
    view = _View(PEERS)
    vals = {0: [0.0], 1: [0.25], 2: [1.25]}
    out = _round(ActivationMonitor(), {}, view, vals)
    assert not any(v.failed for v in out.values()) and sorted(out) == [0, 1, 2]
    out = _round(ActivationMonitor(threshold=0.96875), {}, view, vals)
    assert [p for p, v in out.items() if v.failed] == [2]
    assert out[2].reason == ("activation monitor (forward): the EMA of its log-ratio's deviation from stage 0's "
                             "median is 1 (|·| > 0.96875)")


def test_monitor_judges_a_stage_only_with_three_peers():
    view = _View(PEERS)
    assert _round(ActivationMonitor(), {}, view, {0: [0.0], 1: [9.0]}) == {}  # two peers: not judged
    out = _round(ActivationMonitor(), {}, view, {0: [0.0], 1: [0.0], 2: [9.0]})
    assert [p for p, v in out.items() if v.failed] == [2]
    # a peer's value is the median of its hops: one wild hop of three does not move it
    out = _round(ActivationMonitor(), {}, view, {0: [0.0], 1: [0.0], 2: [0.0, 9.0, 0.5]})
    assert not any(v.failed for v in out.values())


def test_monitor_ema_and_warmup_across_rounds():
    """momentum 0.25: EMA = 0.25·old + 0.75·dev after the first round (which takes dev as is);
    warm-up 2 judges a peer from its second measured round."""
    view, mem = _View(PEERS), {}
    mon = ActivationMonitor(momentum=0.25, warmup=2, threshold=1.5)
    out = _round(mon, mem, view, {0: [0.0], 1: [0.0], 2: [2.0]})
    assert mem["ema"][("forward", 2)] == (2.0, 1) and not out[2].failed  # past 1.5, but in its warm-up
    out = _round(mon, mem, view, {0: [0.0], 1: [0.0], 2: [1.5]})
    assert mem["ema"][("forward", 2)] == (1.625, 2) and out[2].failed  # 0.25·2 + 0.75·1.5
    out = _round(mon, mem, view, {0: [0.0], 1: [0.0], 2: [-1.0]})
    assert mem["ema"][("forward", 2)] == (0.25 * 1.625 - 0.75, 3) and not out[2].failed


def test_monitor_loss_has_its_own_threshold_and_banned_peers_are_left_out():
    view = _View(PEERS)
    vals = {0: [0.0], 1: [0.0], 2: [0.5]}
    assert not _round(ActivationMonitor(), {}, view, vals)[2].failed  # forward: 0.5 ≤ 1
    assert _round(ActivationMonitor(), {}, view, vals, kind="loss")[2].failed  # loss: 0.5 > 0.3
    # stage 1: peer 3 is banned, so only two judged peers remain: not judged
    assert _round(ActivationMonitor(), {}, view, {3: [9.0], 4: [0.0], 5: [5.0]}, stage=1) == {}


def test_monitor_forward_statistic_by_hand():
    """Stage > 0: log RMS(out − in) − log RMS(in); stage 0 (tokens in): log RMS(out). The hop is
    kept with its micro-batch (stage 0 opens a new one) and a gradient is owed back for it."""
    mon, mem, view = ActivationMonitor(), {}, _View(PEERS)
    tokens = torch.tensor([[1, 2]])
    mon.verify_hop(view, 0, PEERS[0], tokens, torch.full((1, 2, 2), 3.0), None, None, mem)
    inp = torch.ones(1, 2, 2, requires_grad=True)
    mon.verify_hop(view, 1, PEERS[4], inp, inp.detach() + 2.0, None, None, mem)
    assert mem["hops"] == [("forward", 1, 0, 0, pytest.approx(math.log(3.0))),
                           ("forward", 1, 1, 4, pytest.approx(math.log(2.0)))]
    assert mem["route"] == {1: {0: 0, 1: 4}} and mem["owed"] == {(1, 1): 4}
    mon.verify_hop(view, 1, PEERS[5], torch.full((1, 2, 2), float("nan")), inp.detach(), None, None, mem)
    assert len(mem["hops"]) == 2  # a non-finite input says nothing of this peer
    mon.verify_loss(view, 2, PEERS[0], math.e, mem)
    mon.verify_loss(view, 2, PEERS[0], 0.0, mem)  # log 0: not kept
    assert mem["hops"][2:] == [("loss", 1, 2, 0, 1.0)]
    mon.verify_backward(view, 1, PEERS[4], torch.full((2,), 2.0), torch.full((2,), 8.0), mem)
    assert mem["hops"][3] == ("backward", 1, 1, 4, pytest.approx(math.log(4.0))) and mem["paid"] == {(1, 1)}
    mon.verify_backward(view, 1, PEERS[4], torch.full((2,), float("inf")), torch.ones(2), mem)
    assert len(mem["hops"]) == 4


def test_monitor_counts_a_gradient_never_sent_back():
    """A hop that owed a gradient and got none counts log(1e-3) against its peer."""
    mem: dict = {}
    mem["owed"] = {(1, 1): 3, (2, 1): 4, (3, 1): 5}
    mem["paid"] = {(2, 1), (3, 1)}
    mem["route"] = {1: {1: 3}, 2: {1: 4}, 3: {1: 5}}
    peers = [_Info(0, 0), _Info(1, 0), _Info(2, 0), _Info(3, 1), _Info(4, 1), _Info(5, 1)]
    out = dict(ActivationMonitor().audit_round(_View(peers), None, None, mem))
    assert [p for p, v in out.items() if v.failed] == [3] and "backward_share" in out[3].reason
    assert mem["ema"][("backward_share", 3)] == (pytest.approx(math.log(1e-3)), 1)


# ------------------------------------------------------------------ the ban after strikes, the router
def _run_ns(**pl):
    defaults = dict(hop_time_s=0.3, reputation_penalty=0.5, reputation_recovery=0.125, routing="swarm",
                    stages=3, bandwidth_mbps=0.0, latency_ms=0.0)
    ns = SimpleNamespace(pl=SimpleNamespace(**{**defaults, **pl}),
                         peers=[_Peer(p, p // 3, 1.0 + p, False) for p in range(9)])
    ns.send_time = lambda peer: SwarmRun.send_time(ns, peer)
    ns.hop_cost = lambda peer, stage, speed: SwarmRun.hop_cost(ns, peer, stage, speed)
    return ns


def test_a_peer_is_banned_at_its_strikes_th_failure_from_that_hop():
    ns = _run_ns()
    peer, flagged = ns.peers[4], {}
    fail = HopVerdict(True, True, "bad", verifier=5)
    assert SwarmRun._judge(ns, peer, fail, 2, flagged, 7) == 1
    assert (peer.flags, peer.banned_at, peer.reputation, flagged) == (1, None, 0.5, {4: "bad"})
    assert ns.peers[5].busy == pytest.approx(0.3 / 3 / 6.0)  # the verifier's forward: a third of a hop
    SwarmRun._judge(ns, peer, HopVerdict(False, True, verifier=5), 2, flagged, 8)  # a pass: +0.125
    assert peer.reputation == 0.625 and peer.banned_at is None
    SwarmRun._judge(ns, peer, HopVerdict(True, False, "again"), 2, flagged, 9)  # second strike: banned at 9
    assert (peer.flags, peer.banned_at, peer.reputation) == (2, 9, 0.3125)
    SwarmRun._judge(ns, peer, fail, 2, flagged, 12)
    assert peer.banned_at == 9  # the first ban stands
    other = ns.peers[1]
    SwarmRun._judge(ns, other, HopVerdict(False, True, verifier=2), 1, flagged, 0)
    assert other.reputation == 1.0 and other.flags == 0  # recovery stops at 1
    assert SwarmRun._judge(ns, other, HopVerdict(False, False), 1, flagged, 0) == 0


def test_round_robin_and_flow_routes_skip_banned_and_departed_peers():
    ns = _run_ns(routing="round_robin")
    ns.peers[3].banned_at = 0
    assert [SwarmRun._route(ns, 1, h, False).pid for h in range(4)] == [4, 5, 4, 5]
    ns.peers[5].down = "crashed"
    assert SwarmRun._route(ns, 1, 0, False).pid == 4
    ns.peers[4].banned_at = 2
    assert SwarmRun._route(ns, 1, 0, False) is None  # nobody left in stage 1
    ns = _run_ns(routing="flow")
    ns.attack = SimpleNamespace(advertise_throughput=lambda s: 100 * s)
    ns.peers[3].malicious = True
    # hop cost 0.3 / speed (+ sends: free links): speeds 4, 5, 6; each hop goes to the earliest finish
    picks = [SwarmRun._route(ns, 1, h, False).pid for h in range(5)]
    assert picks == [5, 4, 3, 5, 4]  # 0.05, 0.06, 0.075, 0.1 (5 again), 0.12 (4 again)
    assert ns.peers[5].planned == pytest.approx(0.1)
    ns = _run_ns(routing="flow")
    ns.attack = SimpleNamespace(advertise_throughput=lambda s: 100 * s)
    ns.peers[3].malicious = True
    assert SwarmRun._route(ns, 1, 0, True).pid == 3  # while acting it advertises 400: captured


def test_swarm_routing_draws_in_proportion_to_advertised_speed_times_reputation():
    ns = _run_ns()
    seen = []
    ns.rng = {"network": SimpleNamespace(choice=lambda n, p: seen.append(p.tolist()) or 0)}
    ns.attack = SimpleNamespace(advertise_throughput=lambda s: 3 * s)
    ns.attack_spec = SimpleNamespace(name="a")
    ns.peers[4].malicious = True
    ns.peers[5].reputation = 0.5
    SwarmRun._route(ns, 1, 0, False)  # speeds 4, 5, 6 · reputation 1, 1, 0.5
    SwarmRun._route(ns, 1, 0, True)  # peer 4 advertises 15
    assert seen[0] == pytest.approx([4 / 12, 5 / 12, 3 / 12]) and seen[1] == pytest.approx([4 / 22, 15 / 22, 3 / 22])


def test_hop_cost_counts_one_send_at_either_end_and_two_inside():
    ns = _run_ns(bandwidth_mbps=1.0, latency_ms=100.0)
    ns._act_bytes = 0
    assert [SwarmRun.hop_cost(ns, ns.peers[0], s, 2.0) for s in range(3)] == pytest.approx([0.25, 0.35, 0.25])


def test_stage_split_gives_the_remainder_to_the_first_stages():
    # 7 layers in 3 stages: 3, 2, 2
    assert [stage_of_parameter(f"blocks.{i}.ff.weight", 7, 3) for i in range(7)] == [0, 0, 0, 1, 1, 2, 2]
    assert [stage_of_parameter(f"blocks.{i}.ff.weight", 4, 4) for i in range(4)] == [0, 1, 2, 3]
    assert stage_of_parameter("pos.weight", 7, 3) == 0 and stage_of_parameter("ln_f.bias", 7, 3) == 2


# ------------------------------------------------------------------ the tampers
def _ctx(seed=0, state=None, peer=4):
    return StageContext(0, 1, 3, peer, 0, torch.Generator().manual_seed(seed), {} if state is None else state)


def test_sign_scale_and_noise_tampers_by_hand():
    t = torch.tensor([[3.0, -4.0], [0.0, 5.0]])  # RMS = sqrt(50 / 4)
    assert torch.equal(ActivationTamper(kind="sign").tamper_activation(t, t, _ctx()), -t)
    assert torch.equal(GradientTamper().tamper_gradient(t, _ctx()), -t)  # its default: sign, ×1
    assert torch.equal(GradientTamper(kind="scale", strength=-2.5).tamper_gradient(t, _ctx()), -2.5 * t)
    noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(3))
    got = ActivationTamper(strength=0.5).tamper_activation(t, t, _ctx(3))  # its default: noise
    assert torch.allclose(got, t + 0.5 * math.sqrt(12.5) * noise, rtol=0, atol=1e-6)


def test_lazy_peer_forwards_its_input_or_replays_its_last_output():
    state: dict = {}
    inp, out1, out2 = torch.ones(2, 3), torch.full((2, 3), 2.0), torch.full((2, 3), 3.0)
    assert torch.equal(LazyPeer().tamper_activation(out1, inp, _ctx(state=state)), inp)
    stale = LazyPeer(mode="stale")
    assert torch.equal(stale.tamper_activation(out1, inp, _ctx(state=state)), out1)  # first hop: honest
    assert torch.equal(stale.tamper_activation(out2, inp, _ctx(state=state)), out1)  # then the last one
    assert torch.equal(stale.tamper_activation(out1, inp, _ctx(state=state, peer=5)), out1)  # per peer
    bigger = torch.full((4, 3), 5.0)  # a last output of another shape is never replayed
    assert torch.equal(stale.tamper_activation(bigger, inp, _ctx(state=state)), bigger)
    logits = torch.zeros(2, 5)  # another shape than its input: identity replays too
    assert torch.equal(LazyPeer().tamper_activation(logits, inp, _ctx(state={})), logits)


def test_stage_attackers_advertise_collude_and_crash_as_configured():
    assert ActivationTamper(advertise=4.0).advertise_throughput(2.5) == 10.0
    assert ActivationTamper().colluding_verifiers and not LazyPeer(collude=False).colluding_verifiers
    assert CrashAtSync.leaves_before_sync and LazyPeer.skips_compute
    for bad in ({"strength": float("nan")}, {"strength": float("inf")}, {"advertise": 0.0}, {"kind": "flip"}):
        with pytest.raises(InvalidParameter):
            ActivationTamper(**bad)


def test_monitor_with_non_finite_peers_and_upstream_flags():
    """A peer whose statistic is not finite deviates infinitely: flagged, while at most half the
    stage's peers are non-finite (else the stage is not judged). A hop whose micro-batch went
    through a peer flagged upstream is left out of its receivers' statistics."""
    view = _View(PEERS)
    out = _round(ActivationMonitor(), {}, view, {0: [0.0], 1: [0.0], 2: [math.inf]})
    assert [p for p, v in out.items() if v.failed] == [2]
    assert _round(ActivationMonitor(), {}, view, {0: [0.0], 1: [math.inf], 2: [math.inf]}) == {}
    peers = [_Info(p, p // 3) for p in range(6)]
    mem = {"hops": [("forward", 1, 0, 0, 9.0), ("forward", 2, 0, 1, 0.0), ("forward", 3, 0, 2, 0.0),
                    ("forward", 1, 1, 3, 9.0), ("forward", 2, 1, 4, 0.0), ("forward", 3, 1, 5, 0.0)],
           "route": {1: {0: 0, 1: 3}, 2: {0: 1, 1: 4}, 3: {0: 2, 1: 5}}}
    out = dict(ActivationMonitor().audit_round(_View(peers), None, None, mem))
    assert [p for p, v in out.items() if v.failed] == [0]  # 3 got 0's output: not judged (two peers left)
    assert 3 not in out and mem["hops"] == [] and mem["route"] == {} and mem["mb"] == 0


def test_log_ratio_floors_zero_and_flags_non_finite():
    from defenses.pipeline_checks import _log_ratio

    assert _log_ratio(torch.zeros(3), torch.ones(3)) == pytest.approx(math.log(1e-30))
    assert _log_ratio(torch.full((2,), 2.0), torch.full((2,), 0.5)) == pytest.approx(math.log(4.0))
    assert _log_ratio(torch.tensor([float("inf")]), None) == math.inf
    assert _log_ratio(torch.ones(1), torch.tensor([float("nan")])) == math.inf
    assert _log_ratio(torch.zeros(0), None) == pytest.approx(math.log(1e-30))
    assert _log_ratio(torch.ones(2), torch.zeros(0)) == pytest.approx(-math.log(1e-30))  # an empty reference


def test_pipeline_check_defaults_and_parameter_edges():
    assert (RedundantRecompute().fraction, RedundantRecompute().tolerance, RedundantRecompute().strikes) == (
        0.25, 1e-4, 1)
    assert (ActivationCommitment().fraction, ActivationCommitment().bits, ActivationCommitment().strikes) == (
        0.25, 24, 1)
    m = ActivationMonitor()
    assert (m.momentum, m.threshold, m.loss_threshold, m.warmup, m.backward, m.strikes) == (
        0.5, 1.0, 0.3, 1, True, 1)
    assert m.watches_backward and not ActivationMonitor(backward=False).watches_backward
    # the closed ends are accepted, the open ones refused
    RedundantRecompute(fraction=0.0, tolerance=0.0, strikes=1)
    RedundantRecompute(fraction=1.0)
    ActivationCommitment(bits=1)
    ActivationMonitor(momentum=0.0, warmup=1_000_000)
    for cls, bad in ((RedundantRecompute, {"fraction": 1.5}), (RedundantRecompute, {"fraction": True}),
                     (RedundantRecompute, {"fraction": -0.1}),
                     (RedundantRecompute, {"tolerance": -1e-9}), (RedundantRecompute, {"tolerance": math.inf}),
                     (RedundantRecompute, {"strikes": 0}), (RedundantRecompute, {"strikes": True}),
                     (ActivationCommitment, {"bits": 25}), (ActivationCommitment, {"bits": 0}),
                     (ActivationMonitor, {"momentum": 1.0}), (ActivationMonitor, {"threshold": 0.0}),
                     (ActivationMonitor, {"loss_threshold": 0.0}), (ActivationMonitor, {"warmup": 0}),
                     (ActivationMonitor, {"warmup": 1_000_001}), (ActivationMonitor, {"backward": 1}),
                     (ActivationMonitor, {"momentum": -0.5}), (ActivationMonitor, {"momentum": "0.5"}),
                     (ActivationMonitor, {"threshold": "1"}), (ActivationMonitor, {"threshold": math.inf}),
                     (ActivationMonitor, {"loss_threshold": "1"}), (ActivationMonitor, {"loss_threshold": math.inf}),
                     (ActivationMonitor, {"warmup": True}), (ActivationMonitor, {"warmup": 1.5}),
                     (RedundantRecompute, {"fraction": "1"}), (RedundantRecompute, {"tolerance": "0"}),
                     (RedundantRecompute, {"strikes": 1.5}), (ActivationCommitment, {"bits": 8.0}),
                     (ActivationCommitment, {"bits": True})):
        with pytest.raises(InvalidParameter):
            cls(**bad)


def test_monitor_verdicts_are_never_recomputations_and_skips_are_passes():
    view = _View(PEERS)
    out = _round(ActivationMonitor(), {}, view, {0: [0.0], 1: [0.0], 2: [9.0]})
    assert out[2].failed and not out[2].recomputed and out[0] == HopVerdict(False, False)
    mon = ActivationMonitor()
    nan = torch.full((1, 2, 2), float("nan"))
    assert mon.verify_hop(view, 1, PEERS[4], nan, nan, None, None, {"mb": 1}) == HopVerdict(False, False)
    assert mon.verify_hop(view, 1, PEERS[4], nan, nan, None, None, None) == HopVerdict(False, False)
    assert ActivationCommitment(fraction=0.0).verify_hop(view, 1, PEERS[4], nan, nan, None, _always(), {}) == \
        HopVerdict(False, False)
    assert ActivationCommitment.audits and ActivationMonitor.audits and ActivationMonitor.watches_loss
    assert not RedundantRecompute.audits and not RedundantRecompute.watches_loss


def test_monitor_judges_the_last_stage_and_a_stage_half_non_finite():
    view = _View(PEERS[:3] + [_Info(3, 1), _Info(4, 1), _Info(5, 1)])
    out = _round(ActivationMonitor(), {}, view, {3: [0.0], 4: [0.0], 5: [9.0]}, stage=1)
    assert [p for p, v in out.items() if v.failed] == [5]  # the last stage (1) is judged too
    four = [_Info(p, 0) for p in range(4)]
    out = _round(ActivationMonitor(), {}, _View(four), {0: [0.0], 1: [0.0], 2: [math.inf], 3: [math.inf]})
    assert sorted(p for p, v in out.items() if v.failed) == [2, 3]  # half finite is enough to judge


def test_monitor_statistics_at_the_last_stage_and_small_losses():
    mon, mem, view = ActivationMonitor(), {}, _View(PEERS)
    mon.verify_loss(view, 2, PEERS[0], 0.5, mem)  # before any hop: micro-batch 0
    assert mem["hops"] == [("loss", 0, 2, 0, pytest.approx(math.log(0.5)))]
    inp = torch.ones(1, 2, 2)
    logits = torch.full((1, 2, 5), 2.0)  # the last stage: another shape, judged by its output alone
    mem["mb"] = 3
    mon.verify_hop(view, 2, PEERS[0], inp, logits, None, None, mem)
    assert mem["hops"][1] == ("forward", 3, 2, 0, pytest.approx(math.log(2.0)))


def test_only_a_recomputation_costs_its_verifier_and_bad_advertisements_are_refused():
    from redteam.errors import RedteamError

    ns = _run_ns()
    SwarmRun._judge(ns, ns.peers[4], HopVerdict(True, False, "monitor", verifier=5), 1, {}, 0)
    assert ns.peers[5].busy == 0.0  # named but not recomputed: no forward on it
    ns = _run_ns()
    ns.attack_spec = SimpleNamespace(name="liar")
    ns.peers[4].malicious = True
    for lie in (math.inf, math.nan, -1e9):
        ns.attack = SimpleNamespace(advertise_throughput=lambda s, v=lie: v)
        with pytest.raises(RedteamError, match="attack 'liar': advertise_throughput gave"):
            SwarmRun._route(ns, 1, 0, True)
    slow = _run_ns()  # speeds summing under 1 are fine
    for p in slow.peers:
        p.speed = 0.1
    slow.rng = {"network": SimpleNamespace(choice=lambda n, p: 1)}
    assert SwarmRun._route(slow, 1, 0, False).pid == 4


def test_send_time_is_latency_plus_bits_over_the_uplink():
    ns = _run_ns(bandwidth_mbps=1.0, latency_ms=10.0)
    ns._act_bytes = 125_000  # 1,000,000 bits: one second at 1 Mbit/s
    ns.peers[0].uplink_mbps = 2.0
    assert SwarmRun.send_time(ns, ns.peers[0]) == pytest.approx(0.01 + 0.5)
    off = _run_ns(bandwidth_mbps=0.0, latency_ms=10.0)
    off._act_bytes = 125_000
    assert SwarmRun.send_time(off, off.peers[0]) == pytest.approx(0.01)  # links off: latency only


def test_tamper_defaults_and_parameter_types():
    assert (ActivationTamper().kind, ActivationTamper().strength, ActivationTamper().advertise) == ("noise", 1.0, 1.0)
    assert (GradientTamper().kind, GradientTamper().strength, LazyPeer().mode) == ("sign", 1.0, "identity")
    t = torch.tensor([1.0, -2.0])
    assert torch.equal(GradientTamper(kind="scale").tamper_gradient(t, _ctx()), t)  # ×1 by default
    ActivationTamper(strength=-3, advertise=1e-9)  # an int strength; any positive advertisement
    for bad in ({"strength": True}, {"strength": "1"}, {"strength": -math.inf}, {"advertise": math.inf},
                {"advertise": "2"},
                {"advertise": True}, {"collude": 1}):
        with pytest.raises(InvalidParameter):
            ActivationTamper(**bad)
    with pytest.raises(InvalidParameter):
        LazyPeer(mode="replay")


def test_router_edges_zero_advertisements_tiny_reputations_and_slow_peers():
    from redteam.errors import RedteamError

    ns = _run_ns()
    ns.attack_spec = SimpleNamespace(name="liar")
    ns.attack = SimpleNamespace(advertise_throughput=lambda s: 0.0)
    for p in ns.peers[3:6]:
        p.malicious = True
    with pytest.raises(RedteamError, match="advertise_throughput gave"):
        SwarmRun._route(ns, 1, 0, True)  # every peer of the stage advertises 0
    seen = []
    ns = _run_ns()
    ns.rng = {"network": SimpleNamespace(choice=lambda n, p: seen.append(p.tolist()) or 0)}
    ns.peers[3].reputation = 1e-9  # floored at 1e-6
    for p, speed in zip(ns.peers[3:6], (0.1, 0.2, 0.3)):  # slow peers: weights summing under 1
        p.speed = speed
    SwarmRun._route(ns, 1, 0, False)
    assert seen[0] == pytest.approx([0.1e-6 / 0.5000001, 0.2 / 0.5000001, 0.3 / 0.5000001], rel=1e-9)
    # flow: a peer advertising 0 is never chosen; slow ones still by their cost
    ns = _run_ns(routing="flow")
    ns.attack = SimpleNamespace(advertise_throughput=lambda s: 0.0)
    ns.peers[3].malicious = True
    for p, speed in zip(ns.peers[3:6], (0.5, 0.25, 0.5)):
        p.speed = speed
    assert [SwarmRun._route(ns, 1, h, True).pid for h in range(3)] == [5, 4, 5]  # 0.6, 1.2, 1.2 → 5 (tie: first)


def test_a_recomputed_pass_without_a_named_verifier_costs_nobody():
    ns = _run_ns()
    ns.peers[4].reputation = 0.5
    assert SwarmRun._judge(ns, ns.peers[4], HopVerdict(False, True), 1, {}, 0) == 1
    assert ns.peers[4].reputation == 0.625 and all(p.busy == 0.0 for p in ns.peers)


# ---- whole-module run of defenses/pipeline_checks.py (issue 39): its survivors, by hand ----
class _NoDraws:
    """A stream that must not be drawn from: a check with fraction 0 samples nothing (the
    checks share one stream in the regime, so a draw would move every later check's sample)."""

    def random(self):
        raise AssertionError("drew from the checks' stream")

    integers = random


def test_checks_with_fraction_zero_draw_nothing_and_the_audit_samples_below_its_fraction():
    inp = torch.ones(2)
    assert RedundantRecompute(fraction=0.0).verify_hop(_View(PEERS), 0, PEERS[0], inp, 3 * inp, torch.zeros(1),
                                                       _NoDraws()) == HopVerdict(False, False)
    mem: dict = {}
    assert ActivationCommitment(fraction=0.0).verify_hop(_View(PEERS), 0, PEERS[0], inp, inp, None, _NoDraws(),
                                                         mem) == HopVerdict(False, False)
    assert mem == {}
    # no memory (the aggregation path): nothing kept, nothing drawn
    assert ActivationCommitment(fraction=1.0).verify_hop(_View(PEERS), 0, PEERS[0], inp, inp, None, _NoDraws(),
                                                         None) == HopVerdict(False, False)
    # fraction 0.25: the draw 0.25 is not kept, 0.2499 is; a kept hop is decided later (a pass now)
    for draw, kept in ((0.25, 0), (0.2499, 1)):
        mem = {}
        rng = SimpleNamespace(random=lambda d=draw: d, integers=lambda n: 0)
        v = ActivationCommitment(fraction=0.25).verify_hop(_View(PEERS), 0, PEERS[0], inp, inp, None, rng, mem)
        assert v == HopVerdict(False, False) and len(mem.get("log", [])) == kept


def test_recompute_of_an_empty_output_and_of_negative_outputs():
    """An empty hop output matches an empty recomputation (gap 0). ref = 2·inp = (−3, 0) with
    tolerance 0.25: the bound is 0.25·(1 + max|ref|) = 1, so a gap of 1 passes (with max ref
    instead of max |ref| the bound would be 0.25)."""
    check = RedundantRecompute(fraction=1.0)
    empty = torch.zeros(0)
    assert check.verify_hop(_View(PEERS), 1, PEERS[4], empty, empty, torch.zeros(1), _always()) == HopVerdict(
        False, True, verifier=5)
    inp = torch.tensor([-1.5, 0.0])
    sent = 2 * inp + torch.tensor([0.0, 1.0])
    v = RedundantRecompute(fraction=1.0, tolerance=0.25).verify_hop(_View(PEERS), 1, PEERS[4], inp, sent,
                                                                    torch.zeros(1), _always())
    assert v == HopVerdict(False, True, verifier=5)


def test_commitment_hashes_the_rounded_value_and_every_nan_alike():
    """1.1 to 4 significant bits: 1.1 = 0.55·2¹, 0.55·2⁴ = 8.8 → 9, 9/16·2 = 1.125 — the
    commitment is the full-precision one of 1.125. 23 bits: 1 + 2⁻²³ = (2²² + ½)/2²²·… sits
    half-way, and torch.round rounds half to even → 1.0. A NaN with its sign bit set commits like NaN."""
    assert commitment(torch.tensor([1.1]), 4) == commitment(torch.tensor([1.125]), 24)
    assert commitment(torch.tensor([1.0 + 2.0 ** -23]), 23) == commitment(torch.tensor([1.0]), 24)
    assert commitment(torch.tensor([1.0 + 2.0 ** -23]), 24) != commitment(torch.tensor([1.0]), 24)
    nan = torch.tensor([float("nan")])
    assert (-nan).numpy().tobytes() != nan.numpy().tobytes()  # the sign bit differs
    for bits in (24, 10):
        assert commitment(-nan, bits) == commitment(nan, bits)


def test_log_ratio_is_of_root_mean_squares_and_a_nan_is_infinite():
    from defenses.pipeline_checks import _log_ratio

    # RMS(1, 7) = √((1 + 49)/2) = 5; RMS(2, 2) = 2
    assert _log_ratio(torch.tensor([1.0, 7.0]), torch.tensor([2.0, 2.0])) == pytest.approx(math.log(2.5))
    assert _log_ratio(torch.tensor([5.0, 5.0]), torch.tensor([1.0, 7.0])) == pytest.approx(0.0)
    assert _log_ratio(torch.tensor([float("nan")]), None) == math.inf


def test_pipeline_check_parameters_refuse_booleans():
    for cls, bad in ((RedundantRecompute, {"tolerance": True}), (ActivationMonitor, {"momentum": False}),
                     (ActivationMonitor, {"threshold": True}), (ActivationMonitor, {"loss_threshold": True})):
        with pytest.raises(InvalidParameter):
            cls(**bad)


def test_monitor_keeps_only_finite_inputs_and_owes_a_gradient_only_when_one_can_come():
    """A hop whose input is partly non-finite is skipped (as a wholly non-finite one); a gradient
    is owed back only for an input that requires grad, and only when the monitor watches
    gradients. Each hook answers a pass (HopVerdict(False, False)); the round decides."""
    view, ok = _View(PEERS), HopVerdict(False, False)
    mon, mem = ActivationMonitor(), {"mb": 1}
    part = torch.tensor([[[1.0, float("nan")], [1.0, 1.0]]])
    assert mon.verify_hop(view, 1, PEERS[4], part, part, None, None, mem) == ok and "hops" not in mem
    plain = torch.ones(1, 2, 2)  # no grad required: nothing can come back
    assert mon.verify_hop(view, 1, PEERS[4], plain, plain + 1.0, None, None, mem) == ok
    assert "owed" not in mem and mem["hops"] == [("forward", 1, 1, 4, 0.0)]
    mem = {"mb": 1}
    grad_in = torch.ones(1, 2, 2, requires_grad=True)
    assert ActivationMonitor(backward=False).verify_hop(view, 1, PEERS[4], grad_in, plain, None, None, mem) == ok
    assert "owed" not in mem and len(mem["hops"]) == 1
    # backward: a partly non-finite received gradient is skipped but counts as paid; before any
    # hop the micro-batch is 0
    mem = {}
    assert mon.verify_backward(view, 1, PEERS[4], torch.tensor([1.0, float("inf")]), torch.ones(2), mem) == ok
    assert "hops" not in mem and mem["paid"] == {(0, 1)}
    assert mon.verify_backward(view, 1, PEERS[4], torch.ones(2), torch.full((2,), 2.0), mem) == ok
    assert mem["hops"] == [("backward", 0, 1, 4, pytest.approx(math.log(2.0)))]
    # the loss: an infinite loss is not kept (nor 0); e is kept as 1
    assert mon.verify_loss(view, 2, PEERS[0], math.inf, mem) == ok and len(mem["hops"]) == 1
    assert mon.verify_loss(view, 2, PEERS[0], math.e, mem) == ok and mem["hops"][1][4] == 1.0


def _stage_peers(n_stages, banned=()):
    return [_Info(p, p // 3, banned_at=0 if p in banned else None) for p in range(3 * n_stages)]


def test_monitor_judges_later_stages_through_unflagged_upstream_peers_only():
    """Stage 0 (peers 0–2) all at 0; stage 1 (3–5) at (0, 0, 9), each hop routed through one
    stage-0 peer. Nobody upstream is flagged: stage 1 is judged and 5 flagged. With peer 0
    banned, its own hop is left out (stage 0 keeps two peers) and so is the hop it fed (to peer 3:
    stage 1 keeps two): neither stage is judged."""
    def mem():
        return {"hops": [("forward", 1, 0, 0, 0.0), ("forward", 2, 0, 1, 0.0), ("forward", 3, 0, 2, 0.0),
                         ("forward", 1, 1, 3, 0.0), ("forward", 2, 1, 4, 0.0), ("forward", 3, 1, 5, 9.0)],
                "route": {1: {0: 0, 1: 3}, 2: {0: 1, 1: 4}, 3: {0: 2, 1: 5}}}

    out = dict(ActivationMonitor().audit_round(_View(_stage_peers(2)), None, None, mem()))
    assert [p for p, v in out.items() if v.failed] == [5] and sorted(out) == [0, 1, 2, 3, 4, 5]
    out = dict(ActivationMonitor().audit_round(_View(_stage_peers(2, banned={0})), None, None, mem()))
    assert out == {}


def test_a_peer_flagged_on_one_statistic_is_still_judged_on_its_others():
    """Last stage 1, peers 3–5, one hop each. Forward (3 off by 9) flags 3; the loss (5 off by 5)
    and backward (4 off by 9) statistics still count 3's own hops — its *own* stage is not
    upstream of it — so each has three peers and flags 5 and 4."""
    hops = []
    for kind, values in (("forward", (9.0, 0.0, 0.0)), ("loss", (0.0, 0.0, 5.0)), ("backward", (0.0, 9.0, 0.0))):
        hops += [(kind, mb, 1, 2 + mb, v) for mb, v in zip((1, 2, 3), values)]
    mem = {"hops": hops, "route": {1: {1: 3}, 2: {1: 4}, 3: {1: 5}}}
    out = dict(ActivationMonitor().audit_round(_View(_stage_peers(2)), None, None, mem))
    assert {p: v.reason.split(")")[0] for p, v in out.items() if v.failed} == {
        3: "activation monitor (forward", 4: "activation monitor (backward", 5: "activation monitor (loss"}
    assert mem["ema"][("backward", 3)] == (0.0, 1) and mem["ema"][("loss", 3)] == (0.0, 1)


def test_monitor_a_peer_with_one_infinite_hop_is_infinite_and_the_middle_stage_is_judged_backward():
    """A peer's statistic is the median of its hops only when all are finite: (0, ∞, 0) is ∞
    (flagged), not 0. Three stages: the backward statistics of the middle stage are judged
    (stages 2, 1, 0 in turn)."""
    out = _round(ActivationMonitor(), {}, _View(PEERS), {0: [0.0, 0.0], 1: [0.0], 2: [0.0, math.inf, 0.0]})
    assert [p for p, v in out.items() if v.failed] == [2]
    mem = {"hops": [("backward", mb, 1, 2 + mb, v) for mb, v in zip((1, 2, 3), (0.0, 0.0, 9.0))],
           "route": {mb: {0: mb - 1, 1: 2 + mb, 2: 5 + mb} for mb in (1, 2, 3)}}
    out = dict(ActivationMonitor().audit_round(_View(_stage_peers(3)), None, None, mem))
    assert [p for p, v in out.items() if v.failed] == [5]
