"""Decisions on the pairwise kernel's intervals (private; re-exported by ``_pairwise``).

Krum-type scores (the sum of a row's k smallest distances to other rows) bounded from
the per-pair intervals of :class:`~defenses._distances.PairwiseDistances`, made exact
for the rows a decision cannot settle, and tie classes in which every value carries
its *own* error bound (so no other value can widen a tie).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ._distances import PairwiseDistances

__all__ = ["k_smallest_sum_bounds", "resolve_k_smallest_sums", "tie_classes"]


def k_smallest_sum_bounds(pd: PairwiseDistances, k: int, alive: "torch.Tensor | None" = None
                          ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Bounds (L, U) on every row's sum of its ``k`` smallest distances to *other*
    alive rows (the Krum score). The sum of the k smallest entries is monotone in every
    entry, so the sums of the lower and upper ends bound it. Rows not alive get +inf."""
    import torch

    n = pd.approx.shape[0]
    if alive is None:
        alive = torch.ones(n, dtype=torch.bool, device=pd.approx.device)
    if k <= 0:
        z = torch.where(alive, torch.zeros(n, dtype=torch.float64, device=alive.device),
                        torch.full((n,), math.inf, dtype=torch.float64, device=alive.device))
        return z, z.clone()
    off = ~alive[None, :] | torch.eye(n, dtype=torch.bool, device=alive.device)
    lo = pd.lower.masked_fill(off, math.inf)
    hi = pd.upper.masked_fill(off, math.inf)
    low = torch.topk(lo, k, dim=1, largest=False).values.sum(dim=1)
    high = torch.topk(hi, k, dim=1, largest=False).values.sum(dim=1)
    dead = ~alive
    low[dead] = math.inf
    high[dead] = math.inf
    return low, high


def resolve_k_smallest_sums(pd: PairwiseDistances, k: int, rows: "torch.Tensor",
                            alive: "torch.Tensor | None" = None, every_row: bool = False
                            ) -> tuple[PairwiseDistances, "torch.Tensor", "torch.Tensor"]:
    """Make the k-smallest sums of ``rows`` (indices) exact up to float64 rounding.

    The pairs (i, j) that may be among row i's k nearest (lower end ≤ the k-th smallest
    upper end) are refined. Returns the refined distances and, for every row, the
    score and its error bound (only meaningful for ``rows``; others keep their
    approximate score and bound). When many pairs need it, one float64 Gram pass
    refines them: of ``rows`` only, or of every row with ``every_row`` (for callers that
    will ask again about other rows, as iterative Krum does: one pass instead of two)."""
    import torch

    n = pd.approx.shape[0]
    if alive is None:
        alive = torch.ones(n, dtype=torch.bool, device=pd.approx.device)
    if k > 0 and rows.numel():
        off = ~alive[None, :] | torch.eye(n, dtype=torch.bool, device=alive.device)
        hi = pd.upper.masked_fill(off, math.inf)
        cut = torch.topk(hi, k, dim=1, largest=False).values[:, -1]
        need = (pd.lower <= cut[:, None]) & ~off
        sel = torch.zeros(n, dtype=torch.bool, device=alive.device)
        sel[rows] = True
        # pairs not pinned down yet (an exact distance keeps the underflow term pd.floor in its
        # bound: one that underflowed is not refined again at every step of iterative Krum)
        loose = pd.error > 1e-9 * pd.approx + pd.floor
        need = need & sel[:, None] & loose
        if int(need.sum()) > n:  # many pairs: one float64 Gram centred on the best candidate
            mid = (pd.lower + pd.upper).masked_fill(off, math.inf)
            best = rows[int(torch.argmin(torch.topk(mid[rows], k, dim=1, largest=False).values.sum(dim=1)))]
            # the candidates' rows only, the first time; every row once that did not suffice
            # (Bulyan's iterative steps meet new candidates at every step)
            pd = pd.recentred(int(best), None if pd.passes or every_row else rows)
            hi = pd.upper.masked_fill(off, math.inf)
            cut = torch.topk(hi, k, dim=1, largest=False).values[:, -1]
            need = (pd.lower <= cut[:, None]) & ~off & sel[:, None]
            need = need & (pd.error > 1e-9 * pd.approx + pd.floor)  # what the Gram could not pin down
        pd = pd.refine(need)
    low, high = k_smallest_sum_bounds(pd, k, alive)
    score = 0.5 * (low + high)
    err = 0.5 * (high - low)
    return pd, torch.where(torch.isfinite(score), score, high), torch.nan_to_num(err, nan=0.0)


def tie_classes(values: "torch.Tensor", errors: "torch.Tensor") -> "torch.Tensor":
    """Tie class of every value: sorted values whose intervals [v − e, v + e] overlap
    their predecessor's share a class (+inf values share one). Each interval is the
    value's own error bound, so no other value can widen it."""
    import torch

    vals, idx = torch.sort(values, stable=True)
    e = errors[idx]
    step = torch.zeros_like(vals, dtype=torch.int64)
    if vals.numel() > 1:
        gap = vals[1:] - vals[:-1]
        both_inf = torch.isinf(vals[1:]) & torch.isinf(vals[:-1])
        step[1:] = ((gap > e[1:] + e[:-1]) & ~both_inf).to(torch.int64)
    classes = torch.empty_like(step)
    classes[idx] = torch.cumsum(step, 0)
    return classes
