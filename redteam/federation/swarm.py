"""Model-parallel training by untrusted peers: a SWARM pipeline (issue 21).

SWARM parallelism (Ryabinin, Dettmers, Diskin & Borzunov, "SWARM Parallelism: Training Large
Models Can Be Surprisingly Communication-Efficient", ICML 2023) splits the *model* into pipeline
stages, each served by a pool of peers; every micro-batch is routed through one peer per stage,
forward then backward, and the peers of a stage synchronise their replicas after the round. Lu et
al., "Exploring the Robustness of Pipeline-Parallelism-Based Decentralized Training" (ICML 2024)
attack such pipelines from a stage: tampered activations on the forward pass, tampered gradients
on the backward pass, and lazy peers that skip their compute.

The regime (``[pipeline]`` in a scenario; see :mod:`.regimes`) shares the round's shape and its
outputs with the data-parallel federation: the same workload (the ``text`` byte-level transformer,
cut into ``stages`` groups of layers), the same attack and defense registries, the same
:class:`~redteam.types.RoundRecord` per round (the "clients" are the peers: ids
``stage · peers_per_stage + k``), the same store, reports and ``[[expect]]`` rows. What differs is
who trains what and who merges whose updates:

* **routing** — ``"swarm"``: SWARM's stochastic wiring, each hop to a peer of the stage drawn with
  probability proportional to its advertised throughput (log-normal speeds, ``throughput_sigma``,
  from the run's network stream; an attacker may overstate its own: routing capture); ``"flow"``:
  a centralised greedy stand-in for the flow optimisation of GWTF (Blagoev, Cox, Decouchant &
  Chen, "Go With The Flow: Churn-Tolerant Decentralized Training of Large Language Models", arXiv
  2509.21221), which minimises the largest cost of any micro-batch's flow: each hop goes to the
  peer of the stage that would finish it first by the advertised speeds and its measured uplink,
  balancing the round's load (GWTF's decentralised simulated annealing is not modelled);
  ``"round_robin"``: peers in turn (it ignores reputation). A banned peer gets no more traffic.
  Links (``bandwidth_mbps`` > 0): each hop's sends cost its sender the latency plus the bytes over
  its uplink, in simulated time.
* **one round** — ``micro_batches`` micro-batches of ``micro_batch_size`` windows each, drawn from
  the training pool by the run's training stream; each goes forward through its route (a malicious
  peer's :meth:`~redteam.types.Attack.tamper_activation` decides what it sends on) and backward
  (its :meth:`~redteam.types.Attack.tamper_gradient` what it sends back), and every peer
  accumulates the gradients of the micro-batches it served.
* **stage sync** — each peer's update is one SGD step of ``[federation] lr`` on the mean gradient
  of its micro-batches; the stage's updates are merged by the scenario's ``[defense]`` (any
  registered rule, weighted by micro-batches served), so the robust aggregators still apply *within*
  a stage. With ``mean`` and honest peers the round is exactly one SGD step on the mean loss of the
  round's micro-batches, as a single process would take (``tests/test_swarm.py``). With ``[pipeline]
  optimizer = "adam"`` the stage applies instead one Adam step (Kingma & Ba, ICLR 2015, bias
  corrected, β = (0.9, 0.999), ε = 10⁻⁸, step size ``lr``) on the merged gradient −merged/lr, each
  stage keeping its own moments (SWARM trains with an adaptive optimizer); a stage that kept its
  parameters in a round does not advance its moments.
* **checks** — ``[pipeline] checks`` (or a stage of the ``[defense]`` pipeline; ``acts_at =
  "pipeline"``, :mod:`defenses.pipeline_checks`): ``verify_hop`` on every hop (a redundant
  recomputation decides there), optionally ``verify_backward`` on the gradient each peer sends
  back and ``verify_loss`` on the last stage's micro-batch loss, and ``audit_round`` at the round's
  end, before the stages sync (a commitment audit, the activation monitor's judgement). A peer
  that fails ``strikes`` checks is banned for the rest of the run (``extra["pipeline"]
  ["banned_at"]`` records the micro-batch) and its update is left out of its stage's sync; with
  ``reputation_penalty`` < 1 each failure also lowers its routing weight.
* **warm start and stage updates** — ``[scenario] warmup_rounds`` / ``start_from`` as in the
  data-parallel regime (the warm-up is this pipeline, honest and unchecked); a malicious peer's
  stage update passes through :meth:`~redteam.types.Attack.tamper_stage_update`, which sees a
  :class:`~redteam.types.PipelineView` (the stage backdoor prepares there), and a targeted
  attack's ASR is recorded every round.

Deterministic under the seed; the attack (``Surface.PIPELINE``) acts only in the attack window.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InvalidParameter, RedteamError
from ..pipeline import PipelineCheck
from ..scenario import PluginSpec, Scenario
from ..topology import PIPELINE, Support
from ..types import PipelineView, RoundRecord, StageContext
from .rounds import RunResult, adopt, call_defense, record, result_of, server_context, standard_extra
from .setup import build_setup

__all__ = ["SwarmRun", "PipelinePlacement", "CheckView", "PeerInfo", "stage_of_parameter", "STREAMS"]

#: the pipeline regime's random streams
STREAMS = ("split", "roles", "init", "train", "network", "attack", "defense", "checks", "churn", "links")


def stage_of_parameter(name: str, layers: int, stages: int) -> int:
    """Which stage holds parameter ``name`` of the byte transformer: the embeddings go with the
    first stage, the final norm and the head with the last, and the blocks are cut into ``stages``
    contiguous groups as evenly as possible (the first ``layers % stages`` groups one larger)."""
    if name.startswith(("tok.", "pos.")):
        return 0
    if name.startswith(("ln_f.", "head.")):
        return stages - 1
    i = int(name.split(".")[1])
    base, extra = divmod(layers, stages)
    bounds = np.cumsum([base + (1 if s < extra else 0) for s in range(stages)])
    return int(np.searchsorted(bounds, i, side="right"))


@dataclass
class _Peer:
    pid: int
    stage: int
    speed: float
    malicious: bool
    served: int = 0
    flags: int = 0
    busy: float = 0.0  # simulated seconds of compute this round
    planned: float = 0.0  # the flow router's estimate of that, from advertised speeds
    down: str = ""  # why it left this round (crashed, or left before the sync): its round's work is lost
    banned_at: int | None = None
    reputation: float = 1.0  # the router's trust: lowered by failed checks, raised by passed ones
    uplink_mbps: float = math.inf  # its upload bandwidth (inf: links not modelled)
    grad: torch.Tensor | None = None


@dataclass
class PipelinePlacement:
    """The pipeline regime's answers to :func:`~.setup.build_setup`: the ``text`` transformer with
    a layer for every stage, the attackers drawn from the attacker stage's pool, each stage's rule
    sized for its peers, and no server (the peers draw micro-batches from the whole pool)."""

    scenario: Scenario
    support: Support = PIPELINE
    streams: tuple[str, ...] = STREAMS

    def check_workload(self, workload: Any) -> None:
        pl = self.scenario.pipeline
        name = self.scenario.workload.name
        if name not in self.support.workloads:
            raise InvalidParameter(f"[pipeline]: the pipeline regime cuts the 'text' transformer into stages; "
                                   f"workload {name!r} is not one")
        layers = int(workload.layers)
        if layers < pl.stages:
            raise InvalidParameter(f"[pipeline].stages = {pl.stages}: the transformer has {layers} layers; every stage "
                                   "needs one (raise [workload] layers or lower stages)")

    def place(self, n: int, rng: Any) -> list[int]:
        pl = self.scenario.pipeline
        P = pl.peers_per_stage
        if not pl.attackers:
            return []
        return sorted(pl.attacker_stage * P + int(k) for k in rng["roles"].choice(P, size=pl.attackers, replace=False))

    def defense_sizes(self, malicious: list[int]) -> tuple[int | None, int | None]:
        return len(malicious), self.scenario.pipeline.peers_per_stage

    def root_size(self, pool: int, defense: Any) -> int | None:
        return None


@dataclass(frozen=True)
class PeerInfo:
    """What a pipeline check may know of a peer: its id, its stage, whether (and from which
    micro-batch) it is banned. Never whether it is malicious."""

    pid: int
    stage: int
    banned_at: int | None


class CheckView:
    """What the pipeline regime shows its checks (:class:`redteam.pipeline.PipelineCheck`): the
    round, the peers' public state, a stage's forward, and :meth:`verifier_agrees` — the answer of
    the peer drawn to verify a hop, which the engine gives as that peer would: honestly, or, for a
    peer whose attack colludes (``Attack.colluding_verifiers``) verifying an accomplice, yes."""

    def __init__(self, run: "SwarmRun") -> None:
        self._run = run

    @property
    def current_round(self) -> int:
        return self._run.current_round

    @property
    def peers(self) -> list[PeerInfo]:
        return [PeerInfo(p.pid, p.stage, p.banned_at) for p in self._run.peers]

    def stage_forward(self, stage: int, inp: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        return self._run.stage_forward(stage, inp, flat)

    def verifier_agrees(self, stage: int, verifier: int, peer: int, inp: torch.Tensor, flat: torch.Tensor,
                        test: Callable[[torch.Tensor], bool]) -> bool:
        """Peer ``verifier``'s answer on ``peer``'s hop of ``stage`` (input ``inp``, stage
        parameters ``flat``): an honest verifier recomputes the stage's output and applies
        ``test`` to it; one whose attack colludes (``Attack.colluding_verifiers``) vouches for an
        accomplice without computing. The check learns only the answer."""
        run = self._run
        v, p = run.peers[verifier], run.peers[peer]
        if v.malicious and p.malicious and run.attack.colluding_verifiers:
            return True  # the accomplice vouches
        return bool(test(run.stage_forward(stage, inp, flat)))


class SwarmRun:
    """A SWARM pipeline built from a scenario with ``[pipeline]``; ``run()`` executes all rounds."""

    def __init__(self, scenario: Scenario, *, device: str = "cpu", attack: PluginSpec | None = None,
                 warmup_dir: str | None = None, start: torch.Tensor | None = None) -> None:
        if scenario.pipeline is None:
            raise InvalidParameter("SwarmRun needs a scenario with a [pipeline] section")
        from .loop import run_warmup

        self.scenario = scenario
        self.pl = pl = scenario.pipeline
        # the model round 0 starts from: the workload's initial model, a model file or a shared
        # clean warm-up of the same pipeline ([scenario] start_from / warmup_rounds; .warmup)
        su = build_setup(scenario, PipelinePlacement(scenario), device=device, attack=attack, warmup_dir=warmup_dir,
                         start=start, compute_warmup=run_warmup(SwarmRun), partition=False)
        adopt(self, su)
        self._ran = False
        layers = int(self.workload.layers)
        self.train_x, self.train_y = su.dataset.train_x.to(self.device), su.dataset.train_y.to(self.device)
        self.model = su.model
        # the stage of each parameter, and each stage's slice of the flat vector (contiguous)
        stage_of = [stage_of_parameter(n, layers, pl.stages) for n in self.spec.names]
        offs = np.concatenate([[0], np.cumsum(self.spec.numels)])
        self.slices: list[slice] = []
        for s in range(pl.stages):
            idx = [i for i, st in enumerate(stage_of) if st == s]
            if idx != list(range(idx[0], idx[-1] + 1)):
                raise RedteamError(f"stage {s}'s parameters are not contiguous in the model's order")
            self.slices.append(slice(int(offs[idx[0]]), int(offs[idx[-1] + 1])))
        self.stage_names = [[n for n, st in zip(self.spec.names, stage_of) if st == s] for s in range(pl.stages)]
        # per stage, computed once: split sizes, shapes, and each block's (full name, name in the block)
        index = {n: i for i, n in enumerate(self.spec.names)}
        self._layout = []
        for names in self.stage_names:
            blocks: dict[int, list[tuple[str, str]]] = {}
            for n in names:
                if n.startswith("blocks."):
                    blocks.setdefault(int(n.split(".")[1]), []).append((n, n.split(".", 2)[2]))
            self._layout.append(([self.spec.numels[index[n]] for n in names],
                                 [self.spec.shapes[index[n]] for n in names], sorted(blocks.items())))
        # peers: ids stage * P + k; the attackers are drawn from the attacker stage's pool (setup)
        P = pl.peers_per_stage
        self.n_peers = pl.stages * P
        bad = set(su.malicious)
        speeds = np.exp(self.rng["network"].normal(0.0, pl.throughput_sigma, self.n_peers)) if pl.throughput_sigma \
            else np.ones(self.n_peers)
        self.peers = [_Peer(p, p // P, float(speeds[p]), p in bad) for p in range(self.n_peers)]
        # links: each peer's uplink (log-normal around bandwidth_mbps) and the latency of a message,
        # from their own stream: turning links on changes no routing or churn draw
        self._act_bytes = pl.micro_batch_size * self.train_x.shape[1] * int(self.workload.width) * 4
        if pl.bandwidth_mbps > 0:
            bw = pl.bandwidth_mbps * np.exp(self.rng["links"].normal(0.0, pl.bandwidth_sigma, self.n_peers))
            for peer, b in zip(self.peers, bw):
                peer.uplink_mbps = float(b)
        from ..registry import DEFENSES

        # the hop checks: [pipeline] checks, and any stage of the [defense] pipeline that is one (as
        # signed_chunks is for the data-parallel regime), so a matrix's defenses axis can put "with"
        # beside "without"
        self.checks = [DEFENSES.create(c.name, c.params) for c in pl.checks]
        self.checks += [st for st in self.defense.parts() if st.acts_at == "pipeline"]
        for c in self.checks:
            if not isinstance(c, PipelineCheck):
                raise InvalidParameter(f"[pipeline] check {type(c).__name__} acts at the pipeline but is not a "
                                       "redteam.pipeline.PipelineCheck (the hop checks' interface)")
        self.check_view = CheckView(self)
        self._stage_state: dict[int, dict] = {}
        self.current_round = 0
        self._prev: dict[int, torch.Tensor] = {}
        self._adam: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}  # each stage's (m, v, steps)
        self._causal = torch.ones(self.train_x.shape[1], self.train_x.shape[1], dtype=torch.bool,
                                  device=self.device).tril()
        # what a peer knows of the training it joined (offline attacks read it; never modified)
        self.view = PipelineView(params0=self.params0.detach(), slices=tuple(self.slices), loss=self.full_loss,
                                 data_x=self.train_x, data_y=self.train_y, peers_per_stage=pl.peers_per_stage)

    # ------------------------------------------------------------------ one stage
    def stage_forward(self, s: int, h: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """Stage ``s`` of the transformer with its parameters ``flat`` (its slice) on input ``h``."""
        from torch.func import functional_call

        numels, shapes, blocks = self._layout[s]
        named = {n: t.reshape(shape) for n, t, shape in zip(self.stage_names[s], torch.split(flat, numels), shapes)}
        m = self.model
        if s == 0:
            t = h.shape[-1]
            h = (functional_call(m.tok, {"weight": named["tok.weight"]}, (h,))
                 + functional_call(m.pos, {"weight": named["pos.weight"]}, (torch.arange(t, device=h.device),)))
        causal = self._causal[: h.shape[1], : h.shape[1]]
        for i, names in blocks:
            h = functional_call(m.blocks[i], {short: named[full] for full, short in names}, (h, causal))
        if s == self.pl.stages - 1:
            h = functional_call(m.ln_f, {"weight": named["ln_f.weight"], "bias": named["ln_f.bias"]}, (h,))
            h = functional_call(m.head, {"weight": named["head.weight"], "bias": named["head.bias"]}, (h,))
        return h

    def full_loss(self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The whole model's mean next-byte loss with parameters ``flat`` (targets −100 masked),
        through the stages in turn: differentiable in ``flat``."""
        h = x
        for s, sl in enumerate(self.slices):
            h = self.stage_forward(s, h, flat[sl])
        return F.cross_entropy(h.reshape(-1, h.shape[-1]), y.reshape(-1), ignore_index=-100)

    def _judge(self, peer: _Peer, verdict: Any, strikes: int, flagged: dict[int, str], hop: int) -> int:
        """Apply a check's verdict on one of ``peer``'s hops: the verifier's recomputation costs
        it a forward; a failure is a strike (``strikes`` of them ban the peer, from micro-batch
        ``hop`` on) and lowers its reputation; a pass restores some. Returns 1 if recomputed."""
        pl = self.pl
        if verdict.recomputed and verdict.verifier is not None:  # a forward on the verifier
            v = self.peers[verdict.verifier]
            v.busy += pl.hop_time_s / 3 / v.speed
        if verdict.failed:
            peer.flags += 1
            peer.reputation *= pl.reputation_penalty
            flagged[peer.pid] = verdict.reason
            if peer.flags >= strikes and peer.banned_at is None:
                peer.banned_at = hop
        elif verdict.recomputed:
            peer.reputation = min(1.0, peer.reputation + pl.reputation_recovery)
        return int(verdict.recomputed)

    def _backward_watch(self, s: int, peer: _Peer, received: dict, watchers: list, memory: dict,
                        flagged: dict[int, str], hop: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """A hook on stage ``s``'s input: the gradient ``peer`` sends back (after any tampering),
        shown with the one it received to each backward monitor; it becomes what stage s − 1 received."""
        def watch(g: torch.Tensor) -> torch.Tensor:
            got = received.get(s)
            if got is not None:
                for check in watchers:
                    verdict = check.verify_backward(self.check_view, s, PeerInfo(peer.pid, peer.stage, peer.banned_at),
                                                    got, g, memory.setdefault(id(check), {}))
                    self._judge(peer, verdict, check.strikes, flagged, hop)
            received[s - 1] = g
            return g

        return watch

    def _step(self, s: int, merged: torch.Tensor, lr: float) -> torch.Tensor:
        """The change stage ``s`` applies for its merged update: the update itself (SGD), or one
        Adam step on the merged gradient ``−merged / lr`` (bias-corrected, the stage's moments)."""
        if self.pl.optimizer == "sgd":
            return merged
        b1, b2, eps = 0.9, 0.999, 1e-8
        g = -merged / lr
        m, v, t = self._adam.get(s, (torch.zeros_like(g), torch.zeros_like(g), 0))
        m, v, t = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g, t + 1
        self._adam[s] = (m, v, t)
        return -lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)

    def send_time(self, peer: _Peer) -> float:
        """Simulated seconds for ``peer`` to send one micro-batch's activations (or their
        gradient) to the next (previous) stage: the latency plus the bytes over its uplink."""
        pl = self.pl
        return pl.latency_ms / 1000.0 + (self._act_bytes * 8 / (peer.uplink_mbps * 1e6) if pl.bandwidth_mbps > 0 else 0.0)

    def hop_cost(self, peer: _Peer, stage: int, speed: float) -> float:
        """Simulated seconds one hop keeps ``peer`` of ``stage`` busy at compute speed ``speed``:
        its forward and backward, and the sends they make (forward to the next stage unless it
        is the last; the gradient back unless it is the first)."""
        sends = int(stage < self.pl.stages - 1) + int(stage > 0)
        return self.pl.hop_time_s / speed + sends * self.send_time(peer)

    # ------------------------------------------------------------------ routing
    def _route(self, s: int, hop: int, active: bool) -> _Peer | None:
        pool = [p for p in self.peers if p.stage == s and p.banned_at is None and not p.down]
        if not pool:
            return None
        if self.pl.routing == "round_robin":
            return pool[hop % len(pool)]
        # what each peer advertises: a malicious one, while the attack acts, may overstate it
        w = np.array([float(self.attack.advertise_throughput(p.speed)) if (active and p.malicious) else p.speed
                      for p in pool])
        if not np.all(np.isfinite(w)) or w.sum() <= 0:
            raise RedteamError(f"attack {self.attack_spec.name!r}: advertise_throughput gave {w.tolist()}")
        w = w * np.array([max(p.reputation, 1e-6) for p in pool])  # the router trusts a flagged peer less
        if w.sum() <= 0:
            w = np.ones(len(pool))
        if self.pl.routing == "flow":  # the peer that would finish this hop first, by what peers advertise
            finish = [p.planned + (self.hop_cost(p, s, float(wk)) if wk > 0 else math.inf) for p, wk in zip(pool, w)]
            k = int(np.argmin(finish))
            pool[k].planned = finish[k]
            return pool[k]
        return pool[int(self.rng["network"].choice(len(pool), p=w / w.sum()))]

    # ------------------------------------------------------------------ one run
    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
        if self._ran:
            raise RedteamError("this SwarmRun has already run; build a new one for another run")
        self._ran = True
        sc, pl = self.scenario, self.pl
        params = self.params0.clone()
        lr = sc.federation.lr
        records: list[RoundRecord] = []
        attack_state: dict = {}
        t_run = time.perf_counter()
        start_info = self.setup.start_record()  # the model the run starts from, as evaluated before round 0
        act_bytes = self._act_bytes
        hop_count = 0
        check_memory: dict[int, dict] = {}  # each check's memory for the run (a monitor's running statistics)
        watchers = [c for c in self.checks if c.watches_backward]
        loss_watchers = [c for c in self.checks if c.watches_loss]
        for rnd in range(sc.federation.rounds):
            t0 = time.perf_counter()
            self.current_round = rnd  # what the checks read (a monitor's statistics are per round)
            active = sc.window.active(rnd) and bool(self.attack.surfaces)
            for p in self.peers:
                p.served, p.grad, p.down, p.busy, p.planned = 0, None, "", 0.0, 0.0
            lost = rerouted = 0
            flagged: dict[int, str] = {}
            acted: dict[int, int] = {}  # malicious peer → hops it served while the attack acted
            completed = 0  # micro-batches that went through every stage
            recomputed = 0
            leaves = {}  # the round's replicas: one leaf per (peer) on its stage's slice
            for mb in range(pl.micro_batches):
                idx = torch.randint(0, self.train_x.shape[0], (pl.micro_batch_size,), generator=self.torch_rng["train"])
                x, y = self.train_x[idx.to(self.device)], self.train_y[idx.to(self.device)]
                route = [self._route(s, hop_count, active) for s in range(pl.stages)]
                if any(r is None for r in route):
                    break  # a stage with no peer left: the pipeline is down for the rest of the round
                h: torch.Tensor = x
                received: dict[int, torch.Tensor] = {}  # the gradient each stage's peer got back (monitors)
                dropped_mb = False
                for s, peer in enumerate(route):
                    # churn: an honest peer may crash on this hop; its round's work is lost with it
                    while pl.churn and not peer.malicious and self.rng["churn"].random() < pl.churn:
                        peer.down = f"crashed at micro-batch {hop_count} (churn)"
                        nxt = self._route(s, hop_count, active) if pl.crash_tolerance else None
                        if nxt is None:
                            dropped_mb = True
                            break
                        peer, rerouted = nxt, rerouted + 1
                    if dropped_mb:
                        break
                    leaf = leaves.get(peer.pid)
                    if leaf is None:
                        leaf = leaves[peer.pid] = params[self.slices[s]].detach().clone().requires_grad_(True)
                    inp = h
                    out = self.stage_forward(s, inp, leaf)
                    ctx = StageContext(rnd, s, pl.stages, peer.pid, hop_count, self.torch_rng["attack"], attack_state)
                    acting = active and peer.malicious
                    sent = self.attack.tamper_activation(out, inp, ctx) if acting else out
                    if acting and s > 0 and inp.requires_grad:
                        inp.register_hook(lambda g, c=ctx: self.attack.tamper_gradient(g, c))
                    if watchers and s > 0 and inp.requires_grad:  # after the tampering: what was sent back
                        inp.register_hook(self._backward_watch(s, peer, received, watchers, check_memory, flagged,
                                                                 hop_count))
                    for check in self.checks:
                        verdict = check.verify_hop(self.check_view, s, PeerInfo(peer.pid, peer.stage, peer.banned_at),
                                                   inp, sent, params[self.slices[s]],
                                                   self.rng["checks"], check_memory.setdefault(id(check), {}))
                        recomputed += self._judge(peer, verdict, check.strikes, flagged, hop_count)
                    peer.served += 1
                    if not (acting and self.attack.skips_compute):
                        peer.busy += pl.hop_time_s / peer.speed
                    peer.busy += (int(s < pl.stages - 1) + int(s > 0)) * self.send_time(peer)  # its sends
                    if acting:
                        acted[peer.pid] = acted.get(peer.pid, 0) + 1
                    h = sent
                    last = peer  # who served the last stage (a re-routed hop included)
                if dropped_mb:  # lost with a crashed peer (no crash tolerance, or no peer left in the stage)
                    lost += 1
                    hop_count += 1
                    continue
                completed += 1
                if watchers and h.requires_grad:
                    h.register_hook(lambda g: received.__setitem__(pl.stages - 1, g))
                loss = F.cross_entropy(h.reshape(-1, h.shape[-1]), y.reshape(-1))
                for check in loss_watchers:  # the last stage's output, judged by its loss
                    self._judge(last, check.verify_loss(self.check_view, pl.stages - 1,
                                                        PeerInfo(last.pid, last.stage, last.banned_at),
                                                        float(loss.detach()),
                                                             check_memory.setdefault(id(check), {})),
                                check.strikes, flagged, hop_count)
                if loss.requires_grad:  # a lazy last stage replaying a stale output cuts the graph
                    loss.backward()
                hop_count += 1
            # deferred checks (a commitment audit) judge the round's hops before the stages sync
            for check in self.checks:
                if check.audits:
                    for pid, verdict in check.audit_round(self.check_view, lambda st: params[self.slices[st]],
                                                          self.rng["checks"], check_memory.setdefault(id(check), {})):
                        recomputed += self._judge(self.peers[pid], verdict, check.strikes, flagged, hop_count)
            # stage sync: each peer's SGD step on its mean gradient, merged by the defense
            accepted = [False] * self.n_peers
            rejected: dict[int, str] = {}
            refused: dict[int, str] = {}
            new = params.clone()
            # a crash-timing attacker leaves just before the sync: its stage loses its round's work
            if active and self.attack.leaves_before_sync:
                for p in self.peers:
                    if p.malicious and p.served and not p.down:
                        p.down = "left just before the stage sync"
                        acted[p.pid] = acted.get(p.pid, 0)
            for s in range(pl.stages):
                members = [p for p in self.peers if p.stage == s and p.served > 0 and p.banned_at is None
                           and not p.down]
                for p in self.peers:
                    if p.stage == s and p.served > 0 and p.banned_at is not None:
                        rejected[p.pid] = f"banned at micro-batch {p.banned_at}: {flagged.get(p.pid, 'failed checks')}"
                if not members:
                    continue
                rows = []
                for p in members:
                    g = leaves[p.pid].grad
                    g = torch.zeros_like(leaves[p.pid]) if g is None else g
                    row = (-lr * g / p.served).detach()
                    if active and p.malicious:  # what it submits at the sync (a stage backdoor's injection)
                        sctx = StageContext(rnd, s, pl.stages, p.pid, hop_count, self.torch_rng["attack"], attack_state,
                                            self.view)
                        got = self.attack.tamper_stage_update(row, sctx)
                        if not isinstance(got, torch.Tensor) or got.shape != row.shape:
                            raise RedteamError(f"attack {self.attack_spec.name!r}: tamper_stage_update returned "
                                               f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}, "
                                               "not the stage's "
                                               f"{tuple(row.shape)}")
                        row = got.detach().to(row.dtype)
                    rows.append(row)
                upd = torch.stack(rows)
                w = torch.tensor([float(p.served) for p in members], device=self.device)
                ctx = server_context(self.torch_rng["defense"], rnd=rnd, weights=w, global_params=params[self.slices[s]],
                                     previous_update=self._prev.get(s), state=self._stage_state.get(s, {}),
                                     client_ids=[p.pid for p in members])
                called = call_defense(self.defense, upd, ctx, check_finite=False)
                if called.decision is None:  # e.g. Krum with fewer peers this round than it needs
                    refused[s] = f"stage {s} kept its parameters: {called.refused}"
                    continue
                dec = called.decision
                self._stage_state[s] = dict(dec.state)  # each stage's rule keeps its own memory
                agg = dec.aggregate.to(params.dtype)
                if bool(torch.isfinite(agg).all()):
                    new[self.slices[s]] = params[self.slices[s]] + self._step(s, agg, lr)
                    self._prev[s] = agg.detach()
                else:
                    refused[s] = f"stage {s} kept its parameters: non-finite aggregate"
                for k, p in enumerate(members):
                    ok = bool(dec.accepted[k])
                    accepted[p.pid] = ok
                    if not ok:
                        rejected[p.pid] = dec.reasons.get(k, "rejected")
            params = new
            acc, loss_v = self.trainer.evaluate(params, self.test_x, self.test_y)
            extra: dict[str, Any] = self.setup.probes.evaluate(self.trainer, params)
            extra["pipeline"] = {
                "served": {p.pid: p.served for p in self.peers if p.served},
                "flagged": dict(sorted(flagged.items())),
                "banned_at": {p.pid: p.banned_at for p in self.peers if p.banned_at is not None},
                "acted": dict(sorted(acted.items())),
                "recomputed_hops": recomputed,
                "hops": sum(p.served for p in self.peers),
                "lost_micro_batches": lost,
                "rerouted_hops": rerouted,
                "departed": {p.pid: p.down for p in self.peers if p.down},
                "lost_hops": sum(p.served for p in self.peers if p.down),
                "completed": completed,
            }
            if refused:
                extra["pipeline"]["refused"] = refused
            # simulated time: peers work in parallel, each on its own hops in turn; the round lasts
            # as long as its busiest peer (a lazy peer that skips its compute is never busy)
            makespan = max((p.busy for p in self.peers), default=0.0)
            working = [p for p in self.peers if p.served or p.busy]
            extra["pipeline"]["sim_time_s"] = makespan
            extra["pipeline"]["idle_share"] = (1.0 - sum(p.busy for p in working) / (len(working) * makespan)
                                               if working and makespan > 0 else None)
            extra.update(standard_extra(self.setup, rnd, active=sc.window.active(rnd), start=start_info))
            participating = [p.served > 0 or (p.banned_at is not None and p.pid in rejected) for p in self.peers]
            rec = record(
                rnd, acc, loss_v, accepted=accepted, malicious=[p.malicious and active for p in self.peers],
                participating=participating, dropped={p.pid: p.down for p in self.peers if p.down and p.served},
                rejected=rejected,
                # an activation forward and its gradient back over each of the stages − 1 links
                bytes_on_wire=2 * act_bytes * (pl.stages - 1) * completed, sim_time_s=makespan, started=t0,
                extra=extra)
            records.append(rec)
            if on_round is not None:
                on_round(rec)
        self.final_params = params
        return result_of(self.setup, records, time.perf_counter() - t_run)
