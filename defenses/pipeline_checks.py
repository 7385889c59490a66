"""Checks of a model-parallel pipeline's hops (``acts_at = "pipeline"``; the ``[pipeline]``
regime's ``checks``, :mod:`redteam.federation.swarm`).

:class:`RedundantRecompute` is Lu et al.'s redundancy defense ("Exploring the Robustness of
Pipeline-Parallelism-Based Decentralized Training", ICML 2024): a sampled fraction of the hops
is computed again by another peer of the same stage, from the same input with the same
parameters (within a round every replica of a stage holds the round's parameters), and the two
outputs are compared within a tolerance for non-deterministic kernels. A peer whose output
differs is flagged; after ``strikes`` flags it is banned from the router for the rest of the run.
The verifier is any other active peer of the stage, and the check takes its answer
(``view.recompute``): if the verifier is an attacker whose attack colludes (the attack's
``collude``, default true), it vouches for its accomplice, so a stage whose other peers are all
colluding attackers is unchecked. The check itself never learns who is malicious.
The recomputation costs one extra stage forward per checked hop: the run reports how many
(``extra["pipeline"]["recomputed_hops"]``).

:class:`ActivationCommitment` is the commit-and-audit alternative: every hop's output is
committed to (a SHA-256 of the output rounded to ``bits`` significant bits), a sampled fraction of
the commitments is kept with the hop's input, and at the end of the round — before the stages
synchronise — another peer of the stage recomputes each kept hop and compares digests. Proof of
Learning (Jia, Yaghini, Choquette-Choo, Dullerud, Thudi, Chandrasekaran & Papernot, "Proof-of-
Learning: Definitions and Practice", IEEE S&P 2021) verifies training the same way: the prover
logs, the verifier recomputes a sample of the logged steps and compares within a tolerance;
Verde (Arun, Soni, Vidal, Weng, Bonneau & Isik, Gensyn, 2025) compares hashes of outputs, which
needs kernels that give the same bits on every peer (its RepOps). Here the rounding is that
tolerance: ``bits = 24`` keeps every float32 bit (bit equality), fewer bits forgive honest kernels
that sum in another order — except where a value sits at a rounding boundary, so an honest peer
can still fail (the false positives this rule trades for a hash). Its difference from
:class:`RedundantRecompute` is *when*: the audit is deferred to the round's end, so a cheating
peer is banned only after its round's hops (its detection latency is larger), while the honest
path pays one hash per hop and no waiting for a verifier.

:class:`ActivationMonitor` recomputes nothing. SENTINEL (Dolatabadi et al., "SENTINEL: Stagewise
Integrity Verification for Pipeline Parallel Decentralized Training", arXiv 2603.03592, 2026)
monitors inter-stage activations and gradients with exponential moving averages instead of
duplicating work; its exact statistics were not available to us, so this is a monitor of our own
in that spirit, named for what it does rather than for the paper. Per hop it measures how much
the stage changed what it was given — forward, RMS(output − input) / RMS(input) (the stage's
share of the residual stream; at the first stage, whose input is tokens, RMS(output)); backward,
RMS(gradient sent back) / RMS(gradient received) — keeps an EMA of each log-ratio per peer, and
flags a peer whose EMA is more than ``threshold`` (natural-log units) from the median EMA of its
stage's peers (itself included, so that with an honest majority the median is an honest peer's). The comparison is across the stage's peers, not against the peer's
own past: an EMA against its own history flags every honest peer while training makes the
activations grow several-fold, and one against the stage's pooled history is captured by a fast
attacker that serves most of the stage's hops (both measured). What it needs instead is an
honest majority among each stage's judged peers; a stage with fewer than three judged peers is
not judged.

In the aggregation path (a stage's ``[defense]``) a check accepts every update unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from redteam.pipeline import HopVerdict, PipelineCheck
from redteam.types import param_error

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["RedundantRecompute", "ActivationCommitment", "ActivationMonitor", "HopVerdict", "commitment"]


@dataclass(frozen=True, slots=True)
class _HopCheck(PipelineCheck):
    """What the pipeline checks share: the checks of ``strikes`` and ``fraction`` (where a check
    has them); in the aggregation path (a stage's ``[defense]``) every update is accepted unchanged."""

    def validate_strikes(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "strikes", v, "must be an integer ≥ 1")

    def validate_fraction(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise param_error(self, "fraction", v, "must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class RedundantRecompute(_HopCheck):
    """Recompute a sampled ``fraction`` of hops on another peer of the stage (module docstring).

    * ``fraction``: the share of hops checked (default 0.25);
    * ``tolerance``: outputs agree when max |a − b| ≤ tolerance × (1 + max |b|) (default 1e-4:
      float32 kernels that sum in another order; 0 demands bit equality);
    * ``strikes``: failed checks before the peer is banned (default 1).
    """

    fraction: float = 0.25
    tolerance: float = 1e-4
    strikes: int = 1
    summary: ClassVar[str] = "Pipeline: recompute a sampled fraction of hops on another stage peer; ban mismatches"
    reference: ClassVar[str] = "Lu et al., ICML 2024 (redundant computation)"

    def validate_tolerance(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise param_error(self, "tolerance", v, "must be a finite number ≥ 0")

    def verify_hop(self, view: Any, stage: int, peer: Any, inp: "torch.Tensor", sent: "torch.Tensor",
                   stage_params: "torch.Tensor", rng: "np.random.Generator", memory: dict | None = None) -> HopVerdict:
        """Check one hop: ``peer`` of ``stage`` sent ``sent`` for input ``inp`` (``memory``: the
        check's own dict for the run, for checks that keep statistics; ``view.current_round``: the round)."""
        import torch

        if self.fraction <= 0 or rng.random() >= self.fraction:
            return HopVerdict(False, False)
        others = [p for p in view.peers if p.stage == stage and p.pid != peer.pid and p.banned_at is None]
        if not others:
            return HopVerdict(False, False)
        verifier = others[int(rng.integers(len(others)))]
        got = sent.detach()
        why: list[str] = []

        def matches(ref: "torch.Tensor") -> bool:  # what an honest verifier checks on its recomputation
            if got.shape != ref.shape:
                why.append(f"redundant recompute: output shape {tuple(got.shape)} != {tuple(ref.shape)}")
                return False
            gap = float((got - ref).abs().max()) if ref.numel() else 0.0
            bound = self.tolerance * (1.0 + float(ref.abs().max()) if ref.numel() else 1.0)
            if not gap <= bound:
                why.append(f"redundant recompute by peer {verifier.pid}: max |Δ| = {gap:.3g} > {bound:.3g}")
                return False
            return True

        with torch.no_grad():  # the verifier's answer (a colluding accomplice vouches)
            ok = view.verifier_agrees(stage, verifier.pid, peer.pid, inp.detach(), stage_params.detach(), matches)
        if not ok:
            return HopVerdict(True, True, why[0] if why else "redundant recompute: mismatch", verifier.pid)
        return HopVerdict(False, True, verifier=verifier.pid)


def commitment(t: "torch.Tensor", bits: int) -> str:
    """SHA-256 (hex) of ``t`` with each value rounded to ``bits`` significant bits (float32 has
    24, the leading one implicit: ``bits`` ≥ 24 keeps every bit), its shape included: what a peer
    commits to for an output. −0 commits as +0 and every NaN alike, at every setting."""
    import hashlib

    import torch

    x = t.detach().to("cpu", torch.float32).contiguous()
    if bits < 24:
        m, e = torch.frexp(x)  # m in [0.5, 1): bits significant bits are m · 2^bits rounded
        scale = float(2 ** bits)
        x = torch.ldexp(torch.round(m * scale) / scale, e)
    x = torch.where(x == 0, torch.zeros_like(x), x)
    x = torch.where(torch.isnan(x), torch.full_like(x, float("nan")), x)
    h = hashlib.sha256(repr(tuple(x.shape)).encode())
    h.update(x.numpy().tobytes())
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class ActivationCommitment(_HopCheck):
    """Commit to every hop's output; audit a sampled ``fraction`` at the round's end (module docstring).

    * ``fraction``: the share of hops audited (default 0.25);
    * ``bits``: significant bits kept before hashing, in [1, 24] (default 24: every float32 bit,
      bit equality, Verde's convention; fewer forgive reordered float sums, at the rounding
      boundaries' risk);
    * ``strikes``: failed audits before the peer is banned (default 1).
    """

    fraction: float = 0.25
    bits: int = 24
    strikes: int = 1
    summary: ClassVar[str] = "Pipeline: commit to each hop's output (SHA-256); audit a sample at the round's end"
    reference: ClassVar[str] = "Jia et al., IEEE S&P 2021 (Proof-of-Learning); Arun et al., 2025 (Verde)"

    def validate_bits(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 24:
            raise param_error(self, "bits", v, "must be an integer in [1, 24] (24: every float32 bit)")

    audits: ClassVar[bool] = True

    def verify_hop(self, view: Any, stage: int, peer: Any, inp: "torch.Tensor", sent: "torch.Tensor",
                   stage_params: "torch.Tensor", rng: "np.random.Generator", memory: dict | None = None) -> HopVerdict:
        """Take the hop's commitment; keep it with its input when the hop is sampled for audit
        Nothing is decided on the hop itself (:meth:`audit_round` decides)."""
        if memory is None or self.fraction <= 0 or rng.random() >= self.fraction:
            return HopVerdict(False, False)
        memory.setdefault("log", []).append((stage, peer.pid, inp.detach(), commitment(sent, self.bits)))
        return HopVerdict(False, False)

    def audit_round(self, view: Any, stage_params: Any, rng: "np.random.Generator",
                    memory: dict) -> list[tuple[int, HopVerdict]]:
        """Recompute the round's kept hops on another peer of each one's stage and compare
        digests; ``stage_params(s)`` gives stage ``s``'s parameters of the round. Returns
        ``(peer, verdict)`` per audited hop; the log is emptied."""
        import torch

        out: list[tuple[int, HopVerdict]] = []
        log, memory["log"] = memory.get("log", []), []
        for stage, pid, inp, digest in log:
            others = [p for p in view.peers if p.stage == stage and p.pid != pid and p.banned_at is None]
            if not others:
                continue
            verifier = others[int(rng.integers(len(others)))]
            with torch.no_grad():  # the auditor's answer (a colluding accomplice vouches)
                ok = view.verifier_agrees(stage, verifier.pid, pid, inp, stage_params(stage).detach(),
                                          lambda ref: commitment(ref, self.bits) == digest)
            if not ok:
                out.append((pid, HopVerdict(True, True, f"commitment audit by peer {verifier.pid}: the hop's output "
                                                        f"does not match its recomputation ({self.bits} bits)",
                                            verifier.pid)))
            else:
                out.append((pid, HopVerdict(False, True, verifier=verifier.pid)))
        return out


def _log_ratio(num: "torch.Tensor", den: "torch.Tensor | None") -> float:
    import math

    import torch

    rms = float(num.detach().to(torch.float64).pow(2).mean().sqrt()) if num.numel() else 0.0
    base = 1.0 if den is None else (float(den.detach().to(torch.float64).pow(2).mean().sqrt()) if den.numel() else 0.0)
    if not (math.isfinite(rms) and math.isfinite(base)):
        return math.inf
    return math.log(max(rms, 1e-30)) - math.log(max(base, 1e-30))


@dataclass(frozen=True, slots=True)
class ActivationMonitor(_HopCheck):
    """Flag a stage peer whose activation (and gradient) statistics stray from its stage's other
    peers' in the same rounds (module docstring).

    Each hop's log-ratios are kept for the round. At the round's end, before the stages
    synchronise, each stage with three or more peers that served hops this round gets its
    reference: the median over those peers of their round's mean log-ratio (each peer counts
    once, however much traffic it drew, so a fast attacker cannot become the reference); a peer's
    deviation from it feeds an EMA across rounds, and a peer whose EMA strays more than
    ``threshold`` is flagged. Honest peers of a stage hold the same parameters within a round, so
    their deviations stay near 0 while training moves every statistic.

    * ``momentum``: the EMA's β over rounds, in [0, 1) (default 0.5);
    * ``threshold``: how far, in natural-log units, the EMA of a peer's deviation may go
      (default 1.0: a factor e ≈ 2.7 in the ratio);
    * ``warmup``: rounds a peer must have been measured in before it is judged (default 1);
    * ``backward``: monitor the gradients sent back too (default true);
    * ``strikes``: flags before the peer is banned (default 1).

    Beside the two log-ratios it keeps, at the last stage, the log of each micro-batch's loss
    (negated logits have the same RMS; their loss differs: ``loss_threshold``), and for every
    hop that owed a gradient back, whether one came (a peer that cuts the graph sends none).
    Stages are judged in the order each statistic flows, and hops that went through a peer
    already flagged upstream are left out of its receivers' statistics.

    * ``loss_threshold``: the same for the last stage's log-loss (default 0.3).

    The defaults are our calibration, not a paper's: on ``scenarios/pipeline.toml`` (6 seeds) no
    honest peer's EMA went past 0.09 without an attack and 0.58 under one (a sign-flipping peer
    upstream disturbs the last stage's gradients), nor its log-loss EMA past 0.14, while the
    attacking peer's reached 64–67 (lazy), 1.2–2.2 (sign-flipped activations) and 3.0 (a ×−20
    gradient: log 20); activation noise of 0.5 × RMS stays under the threshold (0.34–0.96).

    Blind spots, measured (4 seeds): a sign-flipped gradient (the statistics are magnitudes); a
    last-stage sign flip is caught in 2 of 4 seeds (in the others training collapses before the
    loss separates); a ×100 activation from the first stage can get honest downstream peers
    banned (FPR 0.012–0.028 in 3 of 4 seeds) in a round where too few first-stage peers served to
    judge the attacker first.
    """

    momentum: float = 0.5
    threshold: float = 1.0
    loss_threshold: float = 0.3
    warmup: int = 1
    backward: bool = True
    strikes: int = 1
    watches_loss: ClassVar[bool] = True
    audits: ClassVar[bool] = True
    summary: ClassVar[str] = "Pipeline: flag peers whose activation/gradient statistics stray from their stage peers'"
    reference: ClassVar[str] = "in the spirit of SENTINEL (Dolatabadi et al., arXiv 2603.03592); our own statistics"

    @property
    def watches_backward(self) -> bool:  # type: ignore[override]
        return bool(self.backward)

    def validate_momentum(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            raise param_error(self, "momentum", v, "must be in [0, 1)")

    def validate_threshold(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise param_error(self, "threshold", v, "must be a finite number > 0 (natural-log units)")

    def validate_loss_threshold(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise param_error(self, "loss_threshold", v, "must be a finite number > 0 (natural-log units)")

    def validate_warmup(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000:
            raise param_error(self, "warmup", v, "must be an integer in [1, 1000000]")

    def validate_backward(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "backward", v, "must be true or false")

    @staticmethod
    def _keep(memory: dict | None, kind: str, stage: int, peer: Any, value: float) -> None:
        """One hop's statistic, with the micro-batch it belongs to (its route is kept too)."""
        if memory is not None:
            memory.setdefault("hops", []).append((kind, memory.get("mb", 0), stage, peer.pid, value))

    def verify_hop(self, view: Any, stage: int, peer: Any, inp: "torch.Tensor", sent: "torch.Tensor",
                   stage_params: "torch.Tensor", rng: "np.random.Generator", memory: dict | None = None) -> HopVerdict:
        """Keep the hop's forward log-ratio for the round's judgement (:meth:`audit_round`); a hop
        whose input was already non-finite says nothing about this peer and is skipped."""
        import torch

        if memory is None:
            return HopVerdict(False, False)
        if stage == 0:  # a new micro-batch (hops arrive stage by stage)
            memory["mb"] = memory.get("mb", 0) + 1
        memory.setdefault("route", {}).setdefault(memory["mb"], {})[stage] = peer.pid
        if inp.is_floating_point() and not bool(torch.isfinite(inp).all()):
            return HopVerdict(False, False)
        if inp.is_floating_point() and inp.shape == sent.shape:
            value = _log_ratio(sent - inp, inp)
        else:  # the first stage: tokens in, activations out
            value = _log_ratio(sent, None)
        self._keep(memory, "forward", stage, peer, value)
        if stage > 0 and inp.requires_grad and self.backward:  # a gradient is owed back for this hop
            memory.setdefault("owed", {})[(memory["mb"], stage)] = peer.pid
        return HopVerdict(False, False)

    def verify_backward(self, view: Any, stage: int, peer: Any, grad_received: "torch.Tensor",
                        grad_sent: "torch.Tensor", memory: dict) -> HopVerdict:
        """Keep the hop's backward log-ratio (the gradient the peer sent back against the one it
        received) for the round's judgement; a non-finite received gradient is skipped."""
        import torch

        if self.backward:
            memory.setdefault("paid", set()).add((memory.get("mb", 0), stage))
            if bool(torch.isfinite(grad_received).all()):
                self._keep(memory, "backward", stage, peer, _log_ratio(grad_sent, grad_received))
        return HopVerdict(False, False)

    def verify_loss(self, view: Any, stage: int, peer: Any, loss: float, memory: dict) -> HopVerdict:
        """The last stage's peer: keep the log of the micro-batch's loss computed from its output
        (a sign or magnitude test cannot see negated logits; their loss can)."""
        import math

        if math.isfinite(loss) and loss > 0:
            self._keep(memory, "loss", stage, peer, math.log(loss))
        return HopVerdict(False, False)

    def audit_round(self, view: Any, stage_params: Any, rng: "np.random.Generator",
                    memory: dict) -> list[tuple[int, HopVerdict]]:
        """Judge the round's statistics (class docstring); returns ``(peer, verdict)`` for each
        peer measured this round; the round's values are emptied.

        Stages are judged in the order the statistic flows — forward statistics and the loss
        from the first stage on, backward statistics from the last stage back — and a hop whose
        micro-batch went through a peer already flagged upstream of it (in that order) is left
        out: tampered input must not make its honest receivers look like outliers."""
        import math
        import statistics

        hops, memory["hops"] = memory.get("hops", []), []
        route, memory["route"] = memory.get("route", {}), {}
        owed, memory["owed"] = memory.get("owed", {}), {}
        paid, memory["paid"] = memory.get("paid", set()), set()
        memory["mb"] = 0
        # a hop owed a gradient back that never got one (a peer that cut the graph): log(share paid)
        for (mb, stage), pid in owed.items():
            hops.append(("backward_share", mb, stage, pid, 0.0 if (mb, stage) in paid else math.log(1e-3)))
        ema: dict = memory.setdefault("ema", {})
        verdicts: dict[int, HopVerdict] = {}
        flagged: set[int] = {p.pid for p in view.peers if p.banned_at is not None}
        n_stages = 1 + max((st for r in route.values() for st in r), default=0)
        for kind in ("forward", "loss", "backward", "backward_share"):
            downstream = kind in ("backward", "backward_share")
            order = range(n_stages - 1, -1, -1) if downstream else range(n_stages)
            rows = [h for h in hops if h[0] == kind]
            for stage in order:
                per_peer: dict[int, list[float]] = {}
                for _, mb, st, pid, value in rows:
                    if st != stage or view.peers[pid].banned_at is not None:
                        continue
                    r = route.get(mb, {})
                    before = [r[t] for t in r if (t > st if downstream else t < st)]
                    if any(q in flagged for q in before):
                        continue  # its input went through a flagged peer
                    per_peer.setdefault(pid, []).append(value)
                if len(per_peer) < 3:
                    continue
                medians = {pid: (statistics.median(v) if all(math.isfinite(x) for x in v) else math.inf)
                           for pid, v in per_peer.items()}
                finite = [m for m in medians.values() if math.isfinite(m)]
                if len(finite) < len(medians) / 2:
                    continue
                ref = statistics.median(finite)
                limit = self.loss_threshold if kind == "loss" else self.threshold
                for pid, m in sorted(medians.items()):
                    dev = m - ref
                    old, n = ema.get((kind, pid), (0.0, 0))
                    new = dev if n == 0 else self.momentum * old + (1 - self.momentum) * dev
                    ema[(kind, pid)] = (new, n + 1)
                    if n + 1 >= self.warmup and not abs(new) <= limit:
                        flagged.add(pid)
                        verdicts[pid] = HopVerdict(True, False, f"activation monitor ({kind}): the EMA of its "
                                                                f"log-ratio's deviation from stage {stage}'s median "
                                                                f"is {new:.3g} (|·| > {limit:g})")
                    else:
                        verdicts.setdefault(pid, HopVerdict(False, False))
        return sorted(verdicts.items())
