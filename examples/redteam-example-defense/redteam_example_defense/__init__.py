"""An example third-party defense for redteam, registered through an entry point."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.pipeline import weighted_mean
from redteam.types import Decision, Defense, ServerContext, param_error, sample_weights

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class ClippedMean(Defense):
    """Clip every update to L2 norm ``radius``, then take the sample-weighted mean.

    Norm-difference clipping as in Sun, Kairouz, Suresh & McMahan, "Can You Really
    Backdoor Federated Learning?" (arXiv:1911.07963, 2019): a boosted update keeps its
    direction but not its size. A row with a NaN/Inf entry is rejected.
    """

    radius: float = 1.0
    summary: ClassVar[str] = "Clip each update to norm radius, then average"
    reference: ClassVar[str] = "Sun, Kairouz, Suresh & McMahan, arXiv:1911.07963, 2019"

    def validate_radius(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise param_error(self, "radius", v, "must be a finite number > 0")

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        finite = torch.isfinite(updates).all(dim=1)
        x = torch.where(finite[:, None], updates, 0).to(torch.float64)
        # ‖x‖ = peak · ‖x / peak‖, never overflowing, even for rows near float64's largest value
        peak = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-300)
        unit = x / peak
        norm = unit.norm(dim=1, keepdim=True)
        clipped = torch.where(peak * norm > self.radius, unit * (self.radius / norm), x)
        w = sample_weights(ctx, len(x), x) * finite
        return Decision(
            aggregate=weighted_mean(clipped, w).to(updates.dtype),
            accepted=finite,
            weights=w.to(updates.dtype),
            reasons={i: "non-finite update" for i in (~finite).nonzero().flatten().tolist()},
        )
