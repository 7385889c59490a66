"""Checks of a model-parallel pipeline's hops (``acts_at = "pipeline"``; the ``[pipeline]``
regime's ``checks``, :mod:`redteam.federation.swarm`).

:class:`RedundantRecompute` is Lu et al.'s redundancy defense ("Exploring the Robustness of
Pipeline-Parallelism-Based Decentralized Training", ICML 2024): a sampled fraction of the hops
is computed again by another peer of the same stage, from the same input with the same
parameters (within a round every replica of a stage holds the round's parameters), and the two
outputs are compared within a tolerance for non-deterministic kernels. A peer whose output
differs is flagged; after ``strikes`` flags it is banned from the router for the rest of the run.
The verifier is any other active peer of the stage: if it is an attacker too, it covers for its
accomplice (the attackers collude), so a stage whose other peers are all attackers is unchecked.
The recomputation costs one extra stage forward per checked hop: the run reports how many
(``extra["pipeline"]["recomputed_hops"]``).

In the aggregation path (a stage's ``[defense]``) a check accepts every update unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext, param_error

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["RedundantRecompute", "HopVerdict"]


@dataclass(frozen=True, slots=True)
class HopVerdict:
    failed: bool
    recomputed: bool
    reason: str = ""
    verifier: int | None = None  # the peer that recomputed the hop


@dataclass(frozen=True, slots=True)
class RedundantRecompute(Filter):
    """Recompute a sampled ``fraction`` of hops on another peer of the stage (module docstring).

    * ``fraction``: the share of hops checked (default 0.25);
    * ``tolerance``: outputs agree when max |a − b| ≤ tolerance × (1 + max |b|) (default 1e-4:
      float32 kernels that sum in another order; 0 demands bit equality);
    * ``strikes``: failed checks before the peer is banned (default 1).
    """

    fraction: float = 0.25
    tolerance: float = 1e-4
    strikes: int = 1
    acts_at: ClassVar[str] = "pipeline"
    screens_nonfinite: ClassVar[bool] = False  # checks hops, not update values: `sanity` screens those
    summary: ClassVar[str] = "Pipeline: recompute a sampled fraction of hops on another stage peer; ban mismatches"
    reference: ClassVar[str] = "Lu et al., ICML 2024 (redundant computation)"

    def validate_fraction(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise param_error(self, "fraction", v, "must be in [0, 1]")

    def validate_tolerance(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise param_error(self, "tolerance", v, "must be a finite number ≥ 0")

    def validate_strikes(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "strikes", v, "must be an integer ≥ 1")

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        n = int(updates.shape[0])
        return FilterResult(updates=updates, accepted=torch.ones(n, dtype=torch.bool, device=updates.device))

    def verify_hop(self, run: Any, stage: int, peer: Any, inp: "torch.Tensor", sent: "torch.Tensor",
                   stage_params: "torch.Tensor", rng: "np.random.Generator", memory: dict | None = None) -> HopVerdict:
        """Check one hop: ``peer`` of ``stage`` sent ``sent`` for input ``inp`` (``memory``: the
        check's own dict for the run, for checks that keep statistics; ``run.current_round``: the round)."""
        import torch

        if self.fraction <= 0 or rng.random() >= self.fraction:
            return HopVerdict(False, False)
        others = [p for p in run.peers if p.stage == stage and p.pid != peer.pid and p.banned_at is None]
        if not others:
            return HopVerdict(False, False)
        verifier = others[int(rng.integers(len(others)))]
        if verifier.malicious and peer.malicious:
            return HopVerdict(False, True, verifier=verifier.pid)  # the accomplice vouches for it
        with torch.no_grad():
            ref = run.stage_forward(stage, inp.detach(), stage_params.detach())
            got = sent.detach()
            if got.shape != ref.shape:
                return HopVerdict(True, True, f"redundant recompute: output shape {tuple(got.shape)} "
                                              f"!= {tuple(ref.shape)}", verifier.pid)
            gap = float((got - ref).abs().max()) if ref.numel() else 0.0
            bound = self.tolerance * (1.0 + float(ref.abs().max()) if ref.numel() else 1.0)
        if not gap <= bound:
            return HopVerdict(True, True, f"redundant recompute by peer {verifier.pid}: max |Δ| = {gap:.3g} "
                                          f"> {bound:.3g}", verifier.pid)
        return HopVerdict(False, True, verifier=verifier.pid)
