"""Geometric median by the smoothed Weiszfeld algorithm (RFA).

Pillutla, Kakade & Harchaoui, "Robust Aggregation for Federated Learning", IEEE
Transactions on Signal Processing 70, 2022 (arXiv:1912.13445). The aggregate is the
point z minimising F(z) = Σᵢ αᵢ‖z − xᵢ‖, with αᵢ the clients' weights. Smoothed
Weiszfeld iterates

    βᵢ = αᵢ / max(ν, ‖z − xᵢ‖),        z ← Σᵢ βᵢ xᵢ / Σᵢ βᵢ,

from the weighted mean, and stops when the objective's relative change is at most
``tol`` (|F_prev − F| ≤ tol·F) or after ``max_iter`` steps.

Every iterate is a convex combination z = Σ cᵢ xᵢ (or zero), so ‖z − xᵢ‖² =
cᵀGc − 2(Gc)ᵢ + Gᵢᵢ with G the float64 Gram matrix of the updates: the whole
iteration runs on n × n numbers, and the d-dimensional aggregate is formed once.

Scale. Rows whose Gram matrix overflows float64 (entries near 1e154 and beyond) are
iterated on after an exact power-of-two rescaling, with ν rescaled alike: the same
iteration, so the same coefficients (before, such rows were refused). ν is an absolute
distance, so the rule is not scale-invariant below it: rows much smaller than ν (e.g.
1e-170 with ν = 1e-6) all sit within ν of each other and the result is their weighted
mean, as the smoothed algorithm specifies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, sample_weights

from ._common import (HUGE64, check_choice, check_count, check_number, combine, finite_or_refuse, finite_rows, gram64,
                      rescale_pow2)

if TYPE_CHECKING:
    import torch

__all__ = ["GeometricMedian", "weiszfeld"]


def weiszfeld(
    gram: "torch.Tensor",
    alpha: "torch.Tensor",
    *,
    nu: float,
    tol: float,
    max_iter: int,
    init: str = "mean",
) -> tuple["torch.Tensor", int, bool, float]:
    """Smoothed Weiszfeld on a Gram matrix.

    Returns ``(c, iterations, converged, objective)`` where the geometric median is
    ``c @ x`` (``c`` sums to 1; all zeros stands for the origin before any step).
    ``alpha`` must be non-negative with a positive sum.
    """
    import torch

    alpha = alpha / alpha.sum()
    diag = torch.diagonal(gram)

    def distances(c: "torch.Tensor") -> "torch.Tensor":
        gc = gram @ c
        return (c @ gc - 2.0 * gc + diag).clamp_min(0.0).sqrt()

    c = alpha.clone() if init == "mean" else torch.zeros_like(alpha)
    dist = distances(c)
    obj = float(alpha @ dist)
    converged = False
    it = 0
    while it < max_iter:
        it += 1
        beta = alpha / dist.clamp_min(nu)
        c = beta / beta.sum()
        dist = distances(c)
        prev, obj = obj, float(alpha @ dist)
        if abs(prev - obj) <= tol * obj:
            converged = True
            break
    return c, it, converged, obj


@dataclass(frozen=True, slots=True)
class GeometricMedian(Aggregator):
    """Geometric median (RFA, Pillutla et al. 2022) by smoothed Weiszfeld.

    * ``tol``: stop when |F_prev − F| ≤ tol·F (F the weighted sum of distances);
      the default runs to convergence rather than a fixed small number of steps;
    * ``max_iter``: the cap on iterations;
    * ``nu``: the smoothing ν, the smallest distance a weight divides by;
    * ``weighted``: αᵢ ∝ the clients' sample counts (the paper) or equal;
    * ``init``: ``"mean"`` (the weighted mean, as in the paper's code) or ``"zero"``.

    Rows with a non-finite entry are left out (and reported as rejected).
    ``Decision.state`` reports ``iterations``, ``converged`` and ``objective``
    (F with the αᵢ normalised to sum 1, i.e. the weighted mean distance; inf when that exceeds
    float64, as it can for rows near float64's largest value);
    ``Decision.weights`` are the final Weiszfeld coefficients cᵢ (aggregate = Σ cᵢ xᵢ).
    """

    tol: float = 1e-6
    max_iter: int = 1000
    nu: float = 1e-6
    weighted: bool = True
    init: Literal["mean", "zero"] = "mean"
    summary: ClassVar[str] = "Geometric median (RFA) by smoothed Weiszfeld, run to convergence"
    reference: ClassVar[str] = "Pillutla, Kakade & Harchaoui, IEEE TSP 2022"

    def validate_tol(self, v: float) -> None:
        check_number(self, "tol", v, low=0.0)

    def validate_max_iter(self, v: int) -> None:
        check_count(self, "max_iter", v, allow_none=False, minimum=1)

    def validate_nu(self, v: float) -> None:
        check_number(self, "nu", v, low=0.0, low_open=True)

    def validate_init(self, v: str) -> None:
        check_choice(self, "init", v, ("mean", "zero"))

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n = int(updates.shape[0])
        ok = finite_rows(updates)
        if self.weighted:
            alpha = sample_weights(ctx, n, updates).to(torch.float64).clamp_min(0.0)
        else:
            alpha = torch.ones(n, dtype=torch.float64, device=updates.device)
        alpha = torch.where(ok, alpha, torch.zeros_like(alpha))
        if float(alpha.sum()) <= 0:  # no usable weight: fall back to equal weights
            alpha = ok.to(torch.float64)
        reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        if not bool(ok.any()):
            zero = torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device)
            return Decision(aggregate=zero, accepted=ok, weights=torch.zeros_like(alpha).to(updates.dtype),
                            reasons=reasons, state={"iterations": 0, "converged": False, "objective": 0.0})
        rows = updates if bool(ok.all()) else torch.where(ok[:, None], updates, torch.zeros_like(updates))
        gram, nu, k = gram64(rows), self.nu, 0
        if not bool(torch.isfinite(gram).all()):
            # float64 rows whose products overflow: the iteration on the rows times 2ᵏ (exact)
            # with ν times 2ᵏ is the same iteration (distances and ν scale alike), in those units
            scaled, k = rescale_pow2(rows.to(torch.float64), low=0.0, high=HUGE64)
            if k:
                # ν in those units; the smallest subnormal if 2ᵏν underflows (ν must stay > 0)
                gram, nu = gram64(scaled), max(math.ldexp(self.nu, k), math.ulp(0.0))
        c, it, converged, obj = weiszfeld(gram, alpha, nu=nu, tol=self.tol, max_iter=self.max_iter, init=self.init)
        if k:
            # back in the rows' units; the weighted mean distance of rows near float64's top can
            # itself exceed the largest float64: it is then reported as inf (it is not finite there)
            try:
                obj = math.ldexp(obj, -k)
            except OverflowError:
                obj = math.inf
        w = c.to(updates.dtype)
        agg = combine(c, rows, convex=True) if bool(torch.isfinite(c).all()) else w @ rows
        return Decision(
            aggregate=finite_or_refuse(self, agg, rows),
            accepted=ok,
            weights=w,
            reasons=reasons,
            state={"iterations": it, "converged": converged, "objective": obj},
        )
