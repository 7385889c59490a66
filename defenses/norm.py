"""L2 norm bounding of client updates.

Sun, Kairouz, Suresh & McMahan, "Can You Really Backdoor Federated Learning?",
arXiv:1911.07963 (2019): clip each update to norm at most M,
Δ ← Δ·min(1, M/‖Δ‖₂), then average. Deployed validators also use the *reject*
form (drop any update with ‖Δ‖₂ > M), and an adaptive bound M = k·median_j ‖Δ_j‖₂.
Both are named parameters here; the paper's form is ``mode="clip"`` with a static M.

Where the boundary is. A rule and an attack that sits on its boundary (``norm_hug``,
``norm_evasion``) must agree on it, so both measure norms with :func:`l2_norms` (the
float64-accumulated L2 norm) and the rule accepts ‖Δ‖ ≤ M·(1 + :data:`NORM_RTOL`).
The tolerance 1e-9 is far above the disagreement of two float64 summation orders
(≲ 1e-13 relative even at d = 10⁹) and far below one float32 ulp (1.2e-7 relative),
so a float32 row fitted to M is accepted and a row one float32 ulp beyond M is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["NORM_RTOL", "NormBound", "l2_norms", "within_bound"]

#: Relative tolerance of every norm bound: ‖Δ‖ ≤ M·(1 + NORM_RTOL) is within M.
NORM_RTOL: float = 1e-9

# Fast float32 norms closer than this (relative) to the bound are recomputed in float64:
# float32 accumulation over d coordinates errs by ~log2(d)·6e-8 relative (cascade sums),
# orders of magnitude below this window.
_NEAR = 1e-3
# columns per float64 block of the exact recomputation (bounded temporary memory)
_BLOCK = 1 << 16


def _exact_norms(rows: "torch.Tensor") -> "torch.Tensor":
    """Float64-accumulated L2 norms of ``rows`` ``(k, d)``, column block by block."""
    import torch

    acc = rows.new_zeros(rows.shape[0], dtype=torch.float64)
    for start in range(0, rows.shape[1], _BLOCK):
        block = rows[:, start:start + _BLOCK].to(torch.float64)
        acc += (block * block).sum(dim=1)
    return acc.sqrt()


def _fast_norms(updates: "torch.Tensor") -> "torch.Tensor":
    """float64 ``(n,)``: the float32 norm of float32 rows, the float64-accumulated norm of
    any other dtype. A float32 result that is not finite (the squares overflowed; a finite
    sum means no partial sum did) or below 1e-15 (squares near the float32 subnormal range
    lose digits) is re-measured exactly."""
    import torch

    if updates.dtype != torch.float32:
        return _exact_norms(updates)
    out = torch.linalg.vector_norm(updates, dim=1).to(torch.float64)
    return _redo(updates, out, ~torch.isfinite(out) | (out < 1e-15))


def _redo(updates: "torch.Tensor", out: "torch.Tensor", rows: "torch.Tensor") -> "torch.Tensor":
    if bool(rows.any()):
        idx = rows.nonzero().flatten()
        out[idx] = _exact_norms(updates.index_select(0, idx))
    return out


def l2_norms(updates: "torch.Tensor", near: float | None = None) -> "torch.Tensor":
    """‖xᵢ‖₂ of every row ``(n,)`` as float64: the norm every norm rule judges by.

    Without ``near`` every row is measured with float64 accumulation. With ``near``
    (the bound about to be applied), float32 rows take the fast float32 norm and only
    the rows where it cannot be trusted are re-measured with float64 accumulation: rows
    within a relative 1e-3 of ``near``, rows whose squares over- or underflowed. So at
    the bound the answer is always the float64-accumulated norm, whatever the dtype.
    """
    if near is None:
        return _exact_norms(updates)
    return _refine(updates, _fast_norms(updates), near)


def _refine(updates: "torch.Tensor", norms: "torch.Tensor", near: float) -> "torch.Tensor":
    """``norms`` with the rows within a relative ``_NEAR`` of ``near`` re-measured exactly."""
    return _redo(updates, norms, (norms - near).abs() <= _NEAR * abs(near))


def within_bound(norms: "torch.Tensor", bound: float) -> "torch.Tensor":
    """Bool mask: ``norms`` (from :func:`l2_norms`) at most ``bound``·(1 + NORM_RTOL).

    NaN norms are not within any bound."""
    return norms <= bound * (1.0 + NORM_RTOL)


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@dataclass(frozen=True, slots=True)
class NormBound(Filter):
    """Reject or clip updates whose L2 norm exceeds a bound.

    * ``bound``: the static bound M (used when ``multiplier`` is not set);
    * ``multiplier``: adaptive bound M = multiplier × median of this round's norms;
    * ``mode``: ``"clip"`` (Sun et al. 2019: scale down to M, accept) or ``"reject"``
      (drop the update, recording its norm and the bound).

    Non-finite updates are always rejected (their norm is not a number). Norms are
    those of :func:`l2_norms`, exact (float64-accumulated) at the median and at the
    bound, and a row is within M iff ‖Δ‖ ≤ M·(1 + NORM_RTOL).
    """

    bound: float = 1.0
    multiplier: float | None = None
    mode: Literal["clip", "reject"] = "clip"
    summary: ClassVar[str] = "L2 norm bound: clip or reject updates with ‖Δ‖ > M (static or k·median)"
    reference: ClassVar[str] = "Sun et al., arXiv:1911.07963, 2019"

    def validate_bound(self, v: float) -> None:
        if not _positive(v):
            raise param_error(self, "bound", v, "must be a finite number > 0")

    def validate_multiplier(self, v: float | None) -> None:
        if v is not None and not _positive(v):
            raise param_error(self, "multiplier", v, "must be a finite number > 0 (or unset)")

    def validate_mode(self, v: str) -> None:
        if v not in ("clip", "reject"):
            raise param_error(self, "mode", v, "must be 'clip' or 'reject'")

    def threshold(self, norms: "torch.Tensor") -> float:
        """The bound M in force for these norms."""
        import torch

        if self.multiplier is None:
            return float(self.bound)
        finite = norms[torch.isfinite(norms)]
        if finite.numel() == 0:
            return float(self.bound)
        # lower median, as torch.median defines it
        return float(self.multiplier * finite.median())

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        from ._common import finite_rows

        finite = finite_rows(updates)
        # the fast norms locate the bound; the rows near it are re-measured exactly (and,
        # for an adaptive bound, first the rows near the median, so that M is exact too)
        norms = _fast_norms(updates)
        if self.multiplier is not None:
            median = self.threshold(norms.masked_fill(~finite, math.nan)) / self.multiplier
            norms = _refine(updates, norms, median)
        norms = _refine(updates, norms, self.threshold(norms.masked_fill(~finite, math.nan)))
        m = self.threshold(norms.masked_fill(~finite, math.nan))
        reasons: dict[int, str] = {}
        for i in (~finite).nonzero().flatten().tolist():
            reasons[i] = "non-finite update"
        if self.mode == "reject":
            over = finite & ~within_bound(norms, m)
            for i in over.nonzero().flatten().tolist():
                reasons[i] = f"norm {float(norms[i]):.9g} > bound {m:.9g}"
            return FilterResult(updates=updates, accepted=finite & ~over, reasons=reasons,
                                state={"bound": m})
        scale = torch.clamp(m / norms.clamp_min(1e-30), max=1.0).to(updates.dtype)
        clipped = torch.where(finite[:, None], updates * scale[:, None], torch.zeros_like(updates))
        return FilterResult(updates=clipped, accepted=finite, reasons=reasons, state={"bound": m})
