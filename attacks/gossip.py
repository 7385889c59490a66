"""Topology-aware attacks of serverless gossip (``Surface.GOSSIP``; the ``[gossip]`` regime,
:mod:`redteam.federation.gossip`).

A Byzantine node of a gossip graph sends each honest neighbour its own message, built from what it
knows of the graph (:class:`~redteam.types.GossipContext`; omniscient and colluding, as in the
papers). Each attack here sends honest node i, from each of its Byzantine neighbours, the model

    x_i + scale · v_i

for a direction v_i that uses the graph:

* :class:`Dissensus` — He, Karimireddy & Jaggi ("Byzantine-Robust Decentralized Learning via
  ClippedGossip", arXiv 2202.01545, Sec. 5): v_i = Σ_{j honest} W_ij (x_i − x_j) / δ_i, the node's
  own Laplacian row applied to the honest models, divided by its Byzantine weight δ_i = Σ_{b Byz}
  W_ib. Under plain gossip node i then moves by (1 − scale) Σ_j W_ij (x_j − x_i): ``scale = 1``
  freezes it (no mixing), ``scale > 1`` pushes it away from its neighbours.
* :class:`Spectral` — Gaucher, Dieuleveut & Hendrikx ("Unified Breakdown Analysis for Byzantine
  Robust Gossip", ICML 2025): v_i = (μ₂ / δ_i) · u_i · Σ_k u_k x_k, with u the Fiedler vector of
  the honest subgraph's Laplacian L (weighted by W) and μ₂ its eigenvalue — the honest models'
  component along the graph's slowest-mixing mode, fed back with the node's own sign and weight
  on that mode. It feeds the mode that gossip damps least (on the two-worlds graph: the
  difference between the two halves). Under plain gossip the honest models move by
  X ← X − L X + scale · μ₂ · u uᵀX, so their Fiedler component is multiplied by
  1 + (scale − 1) μ₂ per step: ``scale = 1`` holds it still, ``scale > 1`` makes it grow. (The
  authors send x_i + c · u_i uᵀX and search c by line search against the rule; the μ₂/δ_i
  normalisation here makes ``scale`` mean the same on every graph.)

Both act in every gossip step of the attack window; outside it the Byzantine nodes gossip their
own models, as honest nodes do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.types import Attack, GossipContext, Surface, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["Dissensus", "Spectral"]


def _check_scale(obj: object, v: float) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v == v or abs(v) == float("inf"):
        raise param_error(obj, "scale", v, "must be a finite number")


@dataclass(frozen=True, slots=True)
class Dissensus(Attack):
    """Send x_i + scale · Σ_j W_ij (x_i − x_j) / δ_i to honest node i (module docstring)."""

    scale: float = 1.5
    surfaces: ClassVar[tuple[str, ...]] = (Surface.GOSSIP,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "gossip: push each honest neighbour away from its neighbours' consensus (dissensus)"
    reference: ClassVar[str] = "He, Karimireddy & Jaggi, arXiv 2202.01545 (2022)"

    def validate_scale(self, v: float) -> None:
        _check_scale(self, v)

    def craft_gossip(self, ctx: GossipContext) -> "torch.Tensor":
        k = len(ctx.attackers)
        x = ctx.target_model
        delta = float(ctx.attacker_weights.sum())
        if ctx.neighbour_models.shape[0] == 0 or delta <= 0:
            return x.unsqueeze(0).expand(k, -1).clone()
        w = ctx.neighbour_weights.to(x.dtype)
        v = (w[:, None] * (x.unsqueeze(0) - ctx.neighbour_models)).sum(0) / delta
        return (x + self.scale * v).unsqueeze(0).expand(k, -1).clone()


@dataclass(frozen=True, slots=True)
class Spectral(Attack):
    """Send x_i + scale · (μ₂/δ_i) · u_i (uᵀX) to honest node i, u the honest subgraph's Fiedler
    vector and μ₂ its eigenvalue (module docstring)."""

    scale: float = 2.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.GOSSIP,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "gossip: feed the honest models' Fiedler-vector component back (spectral attack)"
    reference: ClassVar[str] = "Gaucher, Dieuleveut & Hendrikx, ICML 2025 (arXiv 2410.10418)"

    def validate_scale(self, v: float) -> None:
        _check_scale(self, v)

    def craft_gossip(self, ctx: GossipContext) -> "torch.Tensor":
        import torch

        x = ctx.target_model
        k = len(ctx.attackers)
        delta = float(ctx.attacker_weights.sum())
        lap = ctx.laplacian.to(torch.float64)
        if delta <= 0 or lap.shape[0] < 2:
            return x.unsqueeze(0).expand(k, -1).clone()
        mu2 = float(torch.linalg.eigvalsh(lap)[1])
        u = ctx.fiedler.to(device=x.device, dtype=x.dtype)
        mode = u @ ctx.honest_models.to(x.dtype)  # (d,): the honest models' Fiedler component
        v = (mu2 / delta) * u[ctx.position] * mode
        return (x + self.scale * v).unsqueeze(0).expand(k, -1).clone()
