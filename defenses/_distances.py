"""The pairwise kernel's result and its exact stage (private; re-exported by ``_pairwise``).

:class:`PairwiseDistances` (squared distances with a per-pair error bound, refined exactly
where a decision needs it), :func:`exact_sq_distances`, :func:`scaled_sq_distances` (each
pair at its own power-of-two scale) and :func:`underflow_term`: what
both :mod:`defenses._pairwise` (the approximate stage) and :mod:`defenses._ranking` (the
decisions on the intervals) use, kept apart so that ``_ranking`` does not import
``_pairwise``, which re-exports both. See :mod:`defenses._pairwise` for the bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ._common import ETA64

if TYPE_CHECKING:
    from collections.abc import Mapping
    from fractions import Fraction

    import torch

__all__ = ["PairwiseDistances", "exact_sq_distances", "scaled_sq_distances", "underflow_term"]

U64 = 2.0 ** -53


def _gamma(k: int, u: float) -> float:
    return k * u / (1.0 - k * u)


#: columns per float64 block of :meth:`PairwiseDistances.recentred` (≤ 4 MB per 100 rows)
RECENTRE_STEP = 1 << 12


@dataclass(frozen=True, slots=True)
class PairwiseDistances:
    """Squared distances of the rows of ``rows`` with a per-pair error bound.

    * ``approx`` ``(n, n)`` float64: D̂ᵢⱼ, symmetric, zero diagonal, +inf for pairs
      with a non-finite row;
    * ``error`` ``(n, n)`` float64: |D̂ᵢⱼ − ‖xᵢ − xⱼ‖²| ≤ errorᵢⱼ (0 where exact);
    * ``finite`` ``(n,)`` bool: rows whose every entry is finite;
    * ``group`` ``(n,)`` int64: the smallest index of a row bitwise equal to row i
      (non-finite rows are their own group).

    ``rows`` are the input rows, or — for float64 rows beyond ~2⁵⁰⁰ whose squares would
    overflow, or below 2⁻³⁰⁰ whose squares would underflow (at 1e-170 every distance
    was 0 and every score tied) — the input times 2^``exponent`` (exact), distances in
    those units (``exponent`` is 0 otherwise; ``source`` is then the input itself, whose
    tiny rows the common power of two may have pushed into underflow). float64 bounds
    include the underflow of the products (at most 2⁻¹⁰⁷⁴ each), so a distance that
    underflowed is never taken as exact.
    """

    rows: "torch.Tensor"
    approx: "torch.Tensor"
    error: "torch.Tensor"
    finite: "torch.Tensor"
    group: "torch.Tensor"
    passes: int = 0  # float64 passes over the rows made so far by :meth:`recentred`
    exponent: int = 0  # rows = input·2^exponent (exact power-of-two rescaling), 0: the input
    source: "torch.Tensor | None" = None  # the input rows when ``rows`` are rescaled (else None)
    #: squared distances of the input rows taken pair by pair at each pair's own scale, as exact
    #: rationals of float64 results, keyed (i, j) with i < j: filled where an underflow tie needs them
    scaled: "Mapping[tuple[int, int], Fraction] | None" = None
    keys: "torch.Tensor | None" = None  # content keys ``(n, 2)`` of ``rows``, once a tie needed them

    @property
    def floor(self) -> float:
        """The absolute underflow term of a float64 distance of these rows (0 for float32 rows,
        whose differences and squares are normal float64 numbers)."""
        return underflow_term(self.rows)

    @property
    def lower(self) -> "torch.Tensor":
        return (self.approx - self.error).clamp_min(0.0)

    @property
    def upper(self) -> "torch.Tensor":
        return self.approx + self.error

    def refine(self, mask: "torch.Tensor") -> "PairwiseDistances":
        """A copy where the pairs in ``mask`` (``(n, n)`` bool; symmetrised here) are
        recomputed from their difference rows in float64. Pairs already exact, on the
        diagonal, between copies of one row or with a non-finite row are skipped."""
        import torch

        mask = (mask | mask.T) & (self.error > 0)
        mask = torch.triu(mask, diagonal=1)
        if not bool(mask.any()):
            return self
        # one representative per group: copies share their distances
        i, j = mask.nonzero(as_tuple=True)
        gi, gj = self.group[i], self.group[j]
        lo, hi = torch.minimum(gi, gj), torch.maximum(gi, gj)
        key = torch.unique(lo * self.rows.shape[0] + hi)
        ri, rj = key // self.rows.shape[0], key % self.rows.shape[0]
        vals = exact_sq_distances(self.rows, ri, rj)
        n = self.rows.shape[0]
        table = torch.full((n, n), -1.0, dtype=torch.float64, device=self.approx.device)
        table[ri, rj] = vals
        table[rj, ri] = vals
        # every pair whose groups were computed takes the value (copies included)
        full = table[self.group[:, None], self.group[None, :]]
        got = (full >= 0) & (self.error > 0)
        d = self.rows.shape[1]
        approx = torch.where(got, full, self.approx)
        error = torch.where(got, full * ((d + 3) * U64) + self.floor, self.error)
        return replace(self, approx=approx, error=error)

    def recentred(self, centre: int, rows: "torch.Tensor | None" = None) -> "PairwiseDistances":
        """A copy where the pairs of ``rows`` (indices; default every row) with every row
        are recomputed through float64 inner products of the rows minus row ``centre``
        (block by block; the differences of float32 values are exact in float64). Its
        bound, 1.5·(γ_d + 4u)·(‖xᵢ − x_c‖ + ‖xⱼ − x_c‖)² with u = 2⁻⁵³, is relative to
        the distances *from row c*: rows far from c widen only their own pairs. Cheaper
        than difference rows once many pairs need refining; pairs already known more
        tightly keep their bound."""
        import torch

        x, ok = self.rows, self.finite
        n, d = x.shape
        idx = ok.nonzero().flatten()
        if idx.numel() == 0:
            return self
        sub = idx if rows is None else rows[ok[rows]]
        every = rows is None
        pos = torch.full((n,), -1, dtype=torch.long, device=idx.device)
        pos[idx] = torch.arange(idx.numel(), device=idx.device)
        c = x[centre].to(torch.float64)
        m = int(idx.numel())
        g = torch.zeros(int(sub.numel()), m, dtype=torch.float64, device=x.device)
        sq = torch.zeros(m, dtype=torch.float64, device=x.device)
        # one float64 buffer, reused: a fresh float64 copy per block costs page faults,
        # and a block that stays in cache is cheap to read again for the product
        step = RECENTRE_STEP
        buf = torch.empty(m, min(step, d), dtype=torch.float64, device=x.device)
        rows_sub = pos[sub]
        for start in range(0, d, step):
            blk = x[:, start:start + step]
            blk = blk.index_select(0, idx) if m < n else blk
            b = buf[:, :blk.shape[1]]
            b.copy_(blk)  # exact: float32 → float64 (or a float64 copy: the caller's rows stay)
            b.sub_(c[start:start + step])
            if every:  # all rows: the squared norms are the Gram diagonal
                g.addmm_(b, b.T)
            else:
                sq += torch.linalg.vector_norm(b, dim=1).square()
                g.addmm_(b.index_select(0, rows_sub), b.T)
        if every:
            sq = torch.diagonal(g).clamp_min(0.0).clone()
        dist = (sq[pos[sub]][:, None] + sq[None, :] - 2.0 * g).clamp_min_(0.0)
        norm = sq.sqrt()
        err = 1.5 * (_gamma(max(d, 1), U64) + 4 * U64) * (norm[pos[sub]][:, None] + norm[None, :]).square()
        err = err + self.floor
        approx, error = self.approx.clone(), self.error.clone()
        cur_a, cur_e = approx[sub[:, None], idx[None, :]], error[sub[:, None], idx[None, :]]
        better = err < cur_e
        new_a, new_e = torch.where(better, dist, cur_a), torch.where(better, err, cur_e)
        approx[sub[:, None], idx[None, :]] = new_a
        error[sub[:, None], idx[None, :]] = new_e
        approx[idx[:, None], sub[None, :]] = new_a.T
        error[idx[:, None], sub[None, :]] = new_e.T
        same = self.group[:, None] == self.group[None, :]
        approx = torch.where(same, torch.zeros_like(approx), approx)
        error = torch.where(same, torch.zeros_like(error), error)
        return replace(self, approx=approx, error=error, passes=self.passes + 1)

    def refine_rows(self, rows: "torch.Tensor") -> "PairwiseDistances":
        """Every pair with a row in ``rows`` (indices or a bool mask) made exact."""
        import torch

        n = self.rows.shape[0]
        sel = torch.zeros(n, dtype=torch.bool, device=self.approx.device)
        sel[rows] = True
        return self.refine(sel[:, None].expand(n, n).clone())


def exact_sq_distances(x: "torch.Tensor", i: "torch.Tensor", j: "torch.Tensor",
                       chunk: int = 1 << 22) -> "torch.Tensor":
    """‖x_iₚ − x_jₚ‖² for the pairs (iₚ, jₚ), from the difference rows in float64.

    Relative error ≤ (d + 2)·2⁻⁵³ for float32 (or float64) rows: the difference of two
    float32 values is exact in float64 and every summand is non-negative. Work is
    bounded to about ``chunk`` float64 values at a time.
    """
    import torch

    p = int(i.shape[0])
    d = int(x.shape[1])
    out = torch.zeros(p, dtype=torch.float64, device=x.device)
    if p == 0 or d == 0:
        return out
    cols = max(1024, min(d, chunk // max(p, 1)))
    pairs = max(1, chunk // cols)
    for ps in range(0, p, pairs):
        ii, jj = i[ps:ps + pairs], j[ps:ps + pairs]
        for start in range(0, d, cols):
            a = x[ii, start:start + cols].to(torch.float64)
            a -= x[jj, start:start + cols].to(torch.float64)
            out[ps:ps + pairs] += (a * a).sum(dim=1)
    return out


def scaled_sq_distances(x: "torch.Tensor", i: "torch.Tensor", j: "torch.Tensor", chunk: int = 1 << 14
                        ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """‖x_iₚ − x_jₚ‖² for the pairs (iₚ, jₚ) of finite rows as sₚ·2^(2eₚ) (``s`` float64, ``e``
    int64), each pair at its own scale: its difference row times 2^−eₚ, the power of two that
    brings its largest entry into [½, 1), so no square underflows and no sum overflows whatever
    the other rows' scale. One pass over the columns, the scale of each pair raised as larger
    entries come (the earlier sum rescaled by an exact power of two, as LAPACK's scaled sums of
    squares do); a block whose difference overflows float64 is taken from the rows halved.
    Relative error ≤ (d + 3)·2⁻⁵³, as :func:`exact_sq_distances`; about ``chunk`` float64
    values at a time (a block that stays in the cache)."""
    import torch

    from ._common import times_pow2

    p, d = int(i.shape[0]), int(x.shape[1])
    s = torch.zeros(p, dtype=torch.float64, device=x.device)
    e = torch.full((p,), -1100, dtype=torch.int64, device=x.device)  # below every float64 exponent
    if p == 0 or d == 0:
        return s, e
    n = int(x.shape[0])
    cols = max(64, min(d, chunk // max(n, 1)))
    pairs = max(1, chunk // cols)
    for start in range(0, d, cols):
        blk = x[:, start:start + cols].to(torch.float64)  # every row's block once, then the pairs from it
        for ps in range(0, p, pairs):
            acc, top = s[ps:ps + pairs], e[ps:ps + pairs]
            a, b = blk.index_select(0, i[ps:ps + pairs]), blk.index_select(0, j[ps:ps + pairs])
            diff = a - b
            peak = diff.abs().amax(dim=1)
            half = ~torch.isfinite(peak)  # the difference of two finite rows overflowed: halve them
            if bool(half.any()):
                diff[half] = a[half] * 0.5 - b[half] * 0.5
                peak = diff.abs().amax(dim=1)
            ours = torch.where(peak > 0, torch.frexp(peak).exponent.to(torch.int64) + half.to(torch.int64),
                               torch.full_like(top, -1100))
            new = torch.maximum(top, ours)
            acc.copy_(times_pow2(acc, 2 * (top - new)))
            scaled = times_pow2(diff, half.to(torch.int64) - new)
            acc += (scaled * scaled).sum(dim=1)
            top.copy_(new)
    return s, torch.where(s > 0, e, torch.zeros_like(e))


def underflow_term(x: "torch.Tensor") -> float:
    """Bound on what underflow adds to a float64 squared distance of rows of ``x``: each of
    the (≤ 4d) products or squares behind it rounds by at most 2⁻¹⁰⁷⁵; 0 for rows of a
    narrower dtype (their products are exact or normal in float64)."""
    import torch

    return 4.0 * x.shape[1] * ETA64 if x.dtype == torch.float64 else 0.0
