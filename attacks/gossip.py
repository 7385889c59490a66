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
  Robust Gossip", ICML 2025; code ``renaudgaucher/Byzantine-Robust-Gossip``,
  ``attacks/identical_sparse.py``): the direction v_i = u_i · Σ_k u_k x_k, with u the Fiedler
  vector of the honest subgraph's Laplacian L (weighted by W) — the honest models' component along
  the graph's slowest-mixing mode, fed back with the node's own sign and weight on that mode. It
  feeds the mode that gossip damps least (on the two-worlds graph: the difference between the two
  halves). Every Byzantine neighbour of node i sends x_i + c · v_i, the factor c chosen by
  ``factor``:

  - ``"line_search"`` (default; the authors' code searches the factor too, ``factor=-16`` there):
    c ≥ 0 maximising the squared distance between the node's model after its rule
    (``GossipContext.defense``; the weighted mean when unknown) and where honest gossip alone
    would take it, x_i − Σ_{j honest} W_ij (x_i − x_j), by their best-effort line search in
    ``evals`` evaluations (:func:`line_maximize`: from c = 0 with step 1, doubling the step while
    the score grows, then contracting it by 0.8 around the best c). The raw direction is theirs
    (no normalisation), and so is the search procedure; the *score* is not: their release scores a
    factor by a squared norm ‖x‖² of the resulting model, where this scores the displacement from
    honest gossip (our choice: it measures the harm to the node whatever the model's scale).
  - ``"raw"``: a fixed c = ``scale`` on the raw direction (their ``factor > 0``).
  - ``"normalised"``: c = ``scale`` · μ₂ / δ_i, μ₂ the eigenvalue of u and δ_i the node's Byzantine
    weight (our own convention, not the authors': it makes ``scale`` mean the same on every
    graph). Under plain gossip the honest models then move by X ← X − L X + scale · μ₂ · u uᵀX,
    so their Fiedler component is multiplied by 1 + (scale − 1) μ₂ per step: ``scale = 1`` holds
    it still, ``scale > 1`` makes it grow.

Both act in every gossip step of the attack window; outside it the Byzantine nodes gossip their
own models, as honest nodes do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.types import Attack, GossipContext, ServerContext, Surface, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["Dissensus", "Spectral", "line_maximize"]

FACTORS = ("line_search", "raw", "normalised")


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


def line_maximize(score: Callable[[float], float], evals: int = 16, start: float = 0.0, delta: float = 1.0,
                  ratio: float = 0.8) -> float:
    """A best-effort maximiser of ``score`` over c ≥ 0 in ``evals`` evaluations, the search of
    Gaucher et al.'s code (``tools/misc.py``, ``line_maximize``; written here from its description):
    from ``start``, try c + δ, doubling δ while the score improves; at the first step that does not
    improve, shrink δ by ``ratio`` and from then on probe δ towards the best c (back from above it,
    up from below it; never below 0), shrinking δ by ``ratio`` after each probe. Returns the best c."""
    best_c, best = start, score(start)
    evals -= 1
    probe = best_c
    while evals > 0:  # expansion
        probe = best_c + delta
        got = score(probe)
        evals -= 1
        if got > best:
            best_c, best = probe, got
            delta *= 2
        else:
            delta *= ratio
            break
    while evals > 0:  # contraction
        if probe < best_c:
            probe += delta
        else:
            c = probe - delta
            while c < 0:
                c = (c + probe) / 2
            probe = c
        got = score(probe)
        evals -= 1
        if got > best:
            best_c, best = probe, got
        delta *= ratio
    return best_c


@dataclass(frozen=True, slots=True)
class Spectral(Attack):
    """Send x_i + c · u_i (uᵀX) to honest node i, u the honest subgraph's Fiedler vector, c by
    ``factor``: ``"line_search"`` against the node's rule (default; the authors' search, our score),
    ``"raw"`` (c = ``scale``) or ``"normalised"`` (c = ``scale`` · μ₂/δ_i) (module docstring)."""

    factor: Literal["line_search", "raw", "normalised"] = "line_search"
    scale: float | None = None
    evals: int = 16
    surfaces: ClassVar[tuple[str, ...]] = (Surface.GOSSIP,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "gossip: feed the honest models' Fiedler-vector component back (spectral attack)"
    reference: ClassVar[str] = "Gaucher, Dieuleveut & Hendrikx, ICML 2025 (arXiv 2410.10418)"

    def validate_factor(self, v: str) -> None:
        if v not in FACTORS:
            raise param_error(self, "factor", v, f"must be one of {', '.join(map(repr, FACTORS))}")

    def validate_scale(self, v: float | None) -> None:
        if v is None:
            return
        if self.factor == "line_search":
            raise param_error(self, "scale", v, "is set, but factor = 'line_search' searches the factor; give "
                                                "factor = 'raw' or 'normalised' to fix it")
        _check_scale(self, v)

    def validate_evals(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "evals", v, "must be an integer ≥ 1")

    def _scale(self) -> float:
        return float(self.scale) if self.scale is not None else (2.0 if self.factor == "normalised" else 1.0)

    def craft_gossip(self, ctx: GossipContext) -> "torch.Tensor":
        import torch

        x = ctx.target_model
        k = len(ctx.attackers)
        delta = float(ctx.attacker_weights.sum())
        lap = ctx.laplacian.to(torch.float64)
        if delta <= 0 or lap.shape[0] < 2:
            return x.unsqueeze(0).expand(k, -1).clone()
        u = ctx.fiedler.to(device=x.device, dtype=x.dtype)
        mode = u @ ctx.honest_models.to(x.dtype)  # (d,): the honest models' Fiedler component
        v = u[ctx.position] * mode
        if self.factor == "normalised":
            mu2 = float(torch.linalg.eigvalsh(lap)[1])
            c = self._scale() * mu2 / delta
        elif self.factor == "raw":
            c = self._scale()
        else:
            c = line_maximize(_distance_after_rule(ctx, v), evals=self.evals)
        return (x + c * v).unsqueeze(0).expand(k, -1).clone()


def _distance_after_rule(ctx: GossipContext, v: "torch.Tensor") -> Callable[[float], float]:
    """c ↦ ‖(the target's model after its rule, every Byzantine neighbour sending x_i + c v) − (its
    model after honest gossip alone)‖²: our score for Gaucher et al.'s line search (their release scores
    a squared norm of the resulting model; module docstring)."""
    import torch

    x = ctx.target_model
    k = len(ctx.attackers)
    hon = ctx.neighbour_models.to(x.dtype) - x  # x_j − x_i
    wh = ctx.neighbour_weights.to(x.dtype)
    target = x + (wh[:, None] * hon).sum(0)
    weights = torch.cat([torch.tensor([ctx.self_weight], dtype=x.dtype, device=x.device), wh,
                         ctx.attacker_weights.to(x.dtype)])
    ids = (ctx.target, *ctx.neighbours, *ctx.attackers)

    def score(c: float) -> float:
        rows = torch.cat([torch.zeros_like(x).unsqueeze(0), hon, (c * v).unsqueeze(0).expand(k, -1)])
        if ctx.defense is None:  # the weighted mean (plain gossip)
            agg = (weights @ rows) / weights.sum()
        else:
            sctx = ServerContext(round=ctx.round, n_clients=len(ids), weights=weights, global_params=x,
                                 generator=torch.Generator(device="cpu").manual_seed(0), client_ids=ids, own_row=0)
            try:
                agg = ctx.defense(rows, sctx).aggregate.to(x.dtype)
            except InvalidParameter:  # a rule that refuses the neighbourhood: the node keeps its model
                agg = torch.zeros_like(x)
        gap = x + agg - target
        got = float(gap.to(torch.float64).pow(2).sum())
        return got if got == got else float("-inf")

    return score
