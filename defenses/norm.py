"""L2 norm bounding of client updates.

Sun, Kairouz, Suresh & McMahan, "Can You Really Backdoor Federated Learning?",
arXiv:1911.07963 (2019): clip each update to norm at most M,
Δ ← Δ·min(1, M/‖Δ‖₂), then average. Deployed validators also use the *reject*
form (drop any update with ‖Δ‖₂ > M), and an adaptive bound M = k·median_j ‖Δ_j‖₂.
Both are named parameters here; the paper's form is ``mode="clip"`` with a static M.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext, param_error

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class NormBound(Filter):
    """Reject or clip updates whose L2 norm exceeds a bound.

    * ``bound``: the static bound M (used when ``multiplier`` is not set);
    * ``multiplier``: adaptive bound M = multiplier × median of this round's norms;
    * ``mode``: ``"clip"`` (Sun et al. 2019: scale down to M, accept) or ``"reject"``
      (drop the update, recording its norm and the bound).

    Non-finite updates are always rejected (their norm is not a number).
    """

    bound: float = 1.0
    multiplier: float | None = None
    mode: Literal["clip", "reject"] = "clip"
    summary: ClassVar[str] = "L2 norm bound: clip or reject updates with ‖Δ‖ > M (static or k·median)"
    reference: ClassVar[str] = "Sun et al., arXiv:1911.07963, 2019"

    def validate_bound(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise param_error(self, "bound", v, "must be a finite number > 0")

    def validate_multiplier(self, v: float | None) -> None:
        if v is not None and not (math.isfinite(v) and v > 0):
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

        from ._common import finite_rows, row_norms

        norms = row_norms(updates)  # float64, block by block
        finite = finite_rows(updates)
        m = self.threshold(torch.where(finite, norms, torch.full_like(norms, float("nan"))))
        reasons: dict[int, str] = {}
        for i in (~finite).nonzero().flatten().tolist():
            reasons[i] = "non-finite update"
        if self.mode == "reject":
            over = finite & (norms > m)
            for i in over.nonzero().flatten().tolist():
                reasons[i] = f"norm {float(norms[i]):.4g} > bound {m:.4g}"
            return FilterResult(updates=updates, accepted=finite & ~over, reasons=reasons,
                                state={"bound": m})
        scale = torch.clamp(m / norms.clamp_min(1e-30), max=1.0).to(updates.dtype)
        clipped = torch.where(finite[:, None], updates * scale[:, None], torch.zeros_like(updates))
        return FilterResult(updates=clipped, accepted=finite, reasons=reasons, state={"bound": m})
