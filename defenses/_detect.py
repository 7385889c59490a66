"""Small shared pieces of the update-space backdoor detectors RFLBAT, Multi-Metrics and
AlignIns (private: not a plugin, not public API).

* :func:`kept_mean` — the (optionally sample-weighted) mean of the kept rows, each row
  first multiplied by its own factor (AlignIns' clipping), as a convex combination (finite
  rows never overflow), with the per-client weights the aggregate used.
* :func:`canonical_order` — the rows ordered by their content alone (fingerprints
  Σⱼxⱼ, Σⱼ j·xⱼ; ties: position), so that a rule drawing random numbers per row position
  (k-means++ seeding) decides the same for every ordering of the clients.
* :func:`exact_count` — ⌊p·n⌋ for a decimal fraction p, without the binary rounding of
  p·n (0.29·100 is 28.999999999999996 in floating point).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING

from redteam.types import ServerContext, sample_weights

from ._common import combine
from ._stats import row_fingerprints

if TYPE_CHECKING:
    import torch


def kept_mean(updates: "torch.Tensor", ok: "torch.Tensor", kept: "torch.Tensor", ctx: ServerContext,
              weighted: bool, scales: "torch.Tensor | None" = None) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(aggregate ``(d,)``, weights ``(n,)``): Σᵢ pᵢ·sᵢ·xᵢ over the kept rows with pᵢ = wᵢ/Σ_kept w
    (wᵢ the context's sample counts when ``weighted``, else 1) and sᵢ = ``scales`` (default 1).
    Zeros (and zero weights) when nothing is kept."""
    import torch

    n, d = updates.shape
    base = sample_weights(ctx, n, updates).to(torch.float64) if weighted else \
        torch.ones(n, dtype=torch.float64, device=updates.device)
    base = torch.where(kept, base.clamp_min(0.0), torch.zeros_like(base))
    total = float(base.sum())
    if not total > 0:
        if not bool(kept.any()):
            return torch.zeros(d, dtype=updates.dtype, device=updates.device), torch.zeros_like(base).to(updates.dtype)
        base = kept.to(torch.float64)  # every kept client weighs 0: fall back to the plain mean
        total = float(base.sum())
    p = base / total
    if scales is not None:
        p = p * scales.to(device=p.device, dtype=torch.float64)
    w = p.to(updates.dtype)
    return combine(w, updates, ok, convex=True), w


def canonical_order(rows: "torch.Tensor") -> "torch.Tensor":
    """Row indices sorted by the rows' content (fingerprints), then position (identical rows)."""
    import torch

    keys = row_fingerprints(rows)
    order = torch.arange(rows.shape[0], device=rows.device)
    for col in (keys[:, 1], keys[:, 0]):  # least significant key first
        order = order[torch.argsort(col[order].to(order.device), stable=True)]
    return order


def exact_count(p: float, n: int) -> int:
    """⌊p·n⌋ with p read as the decimal it was written as (``Fraction(repr(p))``)."""
    return math.floor(Fraction(repr(float(p))) * n)
