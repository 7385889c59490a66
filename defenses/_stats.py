"""Small numerics shared by DnC, FLAME, FLDetector, RLR, SignGuard and SparseFed (private).

* :func:`convex_mean` — Σ pᵢxᵢ with pᵢ = wᵢ/Σw over the kept rows: a convex
  combination, so finite rows never overflow however large (a plain Σwᵢxᵢ/Σw with
  sample counts as weights overflows float32 for entries near its maximum).
* :func:`clip_scales` — the factor min(1, S/‖xᵢ‖) of clipping a row to norm S.
* :func:`order_low_first` — rows ordered by their scores' tie classes (the rule's own, each
  score with its own rounding), ties broken by the rows' content (:func:`row_fingerprints`),
  never by their position, so a rule that keeps the k lowest is symmetric in the clients.
* :func:`midpoint_median` — the statistical median of a 1-D tensor (mean of the two
  middle values for an even count).
* :func:`safe_norms` — float64 row norms that stay finite for finite rows whose squares
  overflow even float64 (entries near 1.8e308): rescaled per row, saturating at the
  float64 maximum.
* :func:`saturate` — clamp a float64 result into the finite range of the output dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._common import combine, row_norms

if TYPE_CHECKING:
    import torch


def convex_mean(updates: "torch.Tensor", weights: "torch.Tensor", finite: "torch.Tensor | None" = None) -> "torch.Tensor":
    """Σᵢ (wᵢ/Σw)·xᵢ over the rows with wᵢ ≠ 0; zeros when every weight is 0.

    ``weights`` are non-negative ``(n,)``; rows with weight 0 (e.g. non-finite ones)
    never enter the product.
    """
    import torch

    w = weights.to(device=updates.device, dtype=torch.float64)
    total = float(w.sum())
    if not total > 0:
        return torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device)
    return combine((w / total).to(updates.dtype), updates, finite)


def clip_scales(norms: "torch.Tensor", bound: float) -> "torch.Tensor":
    """min(1, bound/‖xᵢ‖) per row (float64); 1 for zero rows, 0 for infinite norms."""
    import torch

    safe = norms.clamp_min(1e-300)
    return torch.where(norms > bound, bound / safe, torch.ones_like(norms))


def row_fingerprints(updates: "torch.Tensor", block: int = 1 << 16) -> "torch.Tensor":
    """``(n, 2)`` float64: Σⱼ xⱼ and Σⱼ j·xⱼ of every row (non-finite entries as 0), of the
    rows scaled by one exact power of two (2⁻ᵉ with 2ᵉ above the largest finite |x|), so sums
    of rows near float64's range do not overflow to ±inf and tie (a row at −1.7e308 and
    another at −1.8e308 once both summed to −inf, and their position decided). They depend on
    a row's values only, never on its position among the clients."""
    import math

    import torch

    n, d = updates.shape
    out = torch.zeros(n, 2, dtype=torch.float64, device=updates.device)
    big = 0.0
    for start in range(0, d, block):
        blk = updates[:, start:start + block]
        if blk.numel():
            big = max(big, float(torch.nan_to_num(blk.abs().to(torch.float64), nan=0.0, posinf=0.0).max()))
    scale = math.ldexp(1.0, -math.frexp(big)[1]) if big > 0 else 1.0  # exact: a power of two
    for start in range(0, d, block):
        blk = torch.nan_to_num(updates[:, start:start + block].to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
        blk = blk * scale
        pos = torch.arange(start + 1, start + 1 + blk.shape[1], dtype=torch.float64, device=updates.device)
        out[:, 0] += blk.sum(dim=1)
        out[:, 1] += blk @ pos
    return out


def order_low_first(classes: "torch.Tensor", updates: "torch.Tensor") -> "torch.Tensor":
    """Row indices by ascending tie class (``classes``: the rank of each row's score, rows whose
    scores are equal up to rounding sharing one); rows of one class ranked by their
    fingerprints (Σⱼxⱼ, Σⱼ j·xⱼ), then position (identical rows)."""
    import torch

    order = torch.argsort(classes, stable=True)
    ranked = classes[order]
    if classes.shape[0] > 1 and bool((ranked[1:] == ranked[:-1]).any()):
        keys = row_fingerprints(updates).to(classes.device)
        order = torch.arange(classes.shape[0], device=classes.device)
        for col in (keys[:, 1], keys[:, 0], classes):  # least significant key first
            order = order[torch.argsort(col[order], stable=True)]
    return order


def saturate(x: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
    """``x`` converted to ``dtype``, values beyond its finite range clamped to ± its maximum."""
    import torch

    big = torch.finfo(dtype).max
    return x.clamp(-big, big).to(dtype)


def midpoint_median(values: "torch.Tensor") -> float:
    """Median of a 1-D tensor; the mean of the two middle values for an even count; 0 if empty."""
    import torch

    s = torch.sort(values.to(torch.float64)).values
    k = int(s.shape[0])
    if k == 0:
        return 0.0
    return float(s[k // 2]) if k % 2 else float(0.5 * s[k // 2 - 1] + 0.5 * s[k // 2])


def safe_norms(updates: "torch.Tensor", finite: "torch.Tensor") -> "torch.Tensor":
    """‖xᵢ‖₂ (float64) of every row; rows with ``finite`` True always get a finite norm.

    :func:`~defenses._common.row_norms` first; a finite row whose norm came out
    non-finite (its squares overflow float64) is measured as sᵢ·‖xᵢ/sᵢ‖ with
    sᵢ = maxⱼ|xᵢⱼ|, and a true norm beyond the float64 range saturates at its maximum.
    """
    import torch

    norms = row_norms(updates)
    redo = finite & ~torch.isfinite(norms)
    if bool(redo.any()):
        idx = redo.nonzero().flatten()
        rows = updates.index_select(0, idx).to(torch.float64)
        top = rows.abs().amax(dim=1, keepdim=True)
        big = torch.finfo(torch.float64).max
        norms[idx] = (top.squeeze(1) * torch.linalg.vector_norm(rows / top, dim=1)).clamp(max=big)
    return norms


def power_of_two_below(value: float) -> float:
    """2⁻ᵏ with 2ᵏ ≥ ``value`` (> 0): scaling by it is exact and brings ``value`` to ≤ 1."""
    import math

    return math.ldexp(1.0, -math.frexp(value)[1])


def filtered_mean_decision(res: "Any", updates: "torch.Tensor", ctx: "Any") -> "Any":
    """The Decision of a detector that filters, then averages the accepted rows FedAvg-style
    (sample-weighted; non-finite rows out): FLDetector's and Snowball's base rule."""
    from redteam.types import Decision, sample_weights

    from ._common import finite_rows

    w = sample_weights(ctx, updates.shape[0], updates) * res.accepted.to(updates.dtype)
    total = w.sum()
    return Decision(aggregate=convex_mean(updates, w, finite_rows(updates)), accepted=res.accepted,
                    weights=w / total if float(total) > 0 else w, reasons=dict(res.reasons), state=dict(res.state))
