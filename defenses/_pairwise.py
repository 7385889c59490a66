"""One pairwise kernel for the distance and similarity rules (private, but a stable API).

Krum, Multi-Krum, Bulyan, NNM, FoolsGold and the clustering rules all start from the
``(n, n)`` matrix of squared distances ‖xᵢ − xⱼ‖² (or inner products) of the ``(n, d)``
update rows. At n = 100, d = 10⁶ that is one Gram matrix, ~2·10¹⁰ multiply-adds: fast in
float32, twice as slow (plus a float64 copy of every block) in float64. But float32
loses the small distances that ALIE-style attacks live in. This kernel computes in
float32 *and says how wrong it may be*, then recomputes exactly only what a decision
needs:

1. **Approximate stage** (:func:`pairwise`). Columns are taken in blocks of
   ``BLOCK`` = 256; within each block the rows are centred on the block's mean (a
   translation, so distances do not change, but the norms that bound the rounding
   shrink from ‖xᵢ‖ to the spread), multiplied in float32 (batched, up to ``GROUP``
   blocks per call), the call's block products summed in float32 by halving (a
   bounded number of roundings, ``TREE_DEPTH``) and the calls' sums in float64. If
   anything overflowed float32, the groups are redone with an overflowing group in
   float64. Then Dᵢⱼ = Gᵢᵢ + Gⱼⱼ − 2Gᵢⱼ in float64.
2. **Error bound**, per pair, rigorous for any summation order the BLAS picks (with
   IEEE float32 products: under a reduced-precision matmul mode, TF32 or bf16, float32
   rows take the float64 tier instead; see ``_float32_products_ieee``): a
   float32 dot product of c terms is off by at most γ_c·Σ|aₖbₖ| ≤ γ_c‖a‖‖b‖
   (γ_c = c·u/(1 − c·u), u = 2⁻²⁴; Higham, *Accuracy and Stability of Numerical
   Algorithms*, 2nd ed., §3.1), the halving sum of the block products adds at most
   t = ``TREE_DEPTH`` roundings (γ_t times the sum of their magnitudes), the centring
   rounds every entry by at most u, and underflow adds at most 2⁻¹⁴⁹ per product. So

       |Dᵢⱼ − D̂ᵢⱼ| ≤ Eᵢⱼ = κ·(‖aᵢ‖ + ‖aⱼ‖)² + A,
       κ = 1.5·(γ_256 + γ_t·(1 + γ_256) + 2.1u + 10⁻¹²),

   with aᵢ the centred rows and A the (tiny) underflow term. Eᵢⱼ depends on rows i and
   j only (and on the block means, which far rows can move: that costs refinement
   time, never correctness).
3. **Exact stage** (:meth:`PairwiseDistances.refine`): the pairs a decision cannot
   settle from the intervals [D̂ − E, D̂ + E] are recomputed from the difference rows
   in float64 (xᵢ − xⱼ is exact in float64 for float32 inputs, the squares and the
   sum of non-negative terms have relative error ≤ (d + 2)·2⁻⁵³). Their new bound is
   relative to their own value, so no other row can widen it.

Rows that are bitwise identical are found (a pair whose interval contains 0 is compared
entry by entry) and get distance exactly 0 to each other and one group id
(``PairwiseDistances.group``), so rules can treat copies of one update as one.
A row with a NaN/±Inf entry is infinitely far from every other row (exactly: error 0).

Public functions: :func:`pairwise`, :func:`sq_distances` (a dense float64 matrix,
refined to a relative tolerance), :func:`gram` (inner products with their bound),
:func:`cosine_similarities`, :func:`exact_sq_distances` (given pairs), and the decision
helpers :func:`k_smallest_sum_bounds`, :func:`resolve_k_smallest_sums`,
:func:`tie_classes` (defined in ``_ranking``, re-exported here; :class:`PairwiseDistances`,
:func:`exact_sq_distances` and :func:`underflow_term` are defined in ``_distances``, likewise
re-exported). When many pairs need refining, :meth:`PairwiseDistances.recentred`
recomputes them through one float64 Gram matrix of the rows minus a candidate row
(bounds relative to distances from it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ._common import TINY32, TINY64, rescale_pow2, rescale_rows_pow2

# the result type and the exact stage live in ._distances (._ranking uses them without
# importing this module); they are part of this API
from ._distances import (RECENTRE_STEP, U64, PairwiseDistances, _gamma,  # noqa: F401
                         exact_sq_distances, underflow_term)

if TYPE_CHECKING:
    import torch

__all__ = [
    "BLOCK",
    "PairwiseDistances",
    "pairwise",
    "sq_distances",
    "gram",
    "cosine_similarities",
    "exact_sq_distances",
    "k_smallest_sum_bounds",
    "resolve_k_smallest_sums",
    "tie_classes",
]

#: columns per float32 block: the rounding bound grows with the block length
BLOCK = 256
#: blocks multiplied per batched call (BLOCK × GROUP columns of every row at a time)
GROUP = 256
U32 = 2.0 ** -24
#: the smallest positive float32 (subnormal): the underflow error of one product
ETA32 = 2.0 ** -149
#: float32 roundings on any entry's way through the halving sum of a group's block
#: products (≤ 2 per level: the pairwise add, and the odd one folded into the first)
TREE_DEPTH = 2 * math.ceil(math.log2(GROUP)) + 2
#: relative factor of the approximate stage's bound (see the module docstring)
KAPPA = 1.5 * (_gamma(BLOCK, U32) + _gamma(TREE_DEPTH, U32) * (1 + _gamma(BLOCK, U32)) + 2.1 * U32 + 1e-12)


def _float32_products_ieee(device: "torch.device") -> bool:
    """Whether float32 matmuls on ``device`` multiply in IEEE float32, as the bound assumes.
    Not under a reduced-precision mode (``torch.set_float32_matmul_precision("high")`` or
    ``"medium"``, ``allow_tf32``: TF32 on CUDA, TF32/bf16 through oneDNN on CPU), which
    rounds the factors to 10 or 7 mantissa bits; then the float64 tier is used. A state
    that cannot be read counts as not IEEE."""
    import torch

    try:
        if device.type == "cuda":
            return not torch.backends.cuda.matmul.allow_tf32
        mode = getattr(getattr(getattr(torch.backends, "mkldnn", None), "matmul", None), "fp32_precision", None)
        if mode is not None and mode != "none":
            return mode == "ieee"
        return torch.get_float32_matmul_precision() == "highest"
    except Exception:  # noqa: BLE001 - e.g. legacy and new precision APIs mixed: be safe
        return False


def _finite_rows(x: "torch.Tensor") -> "torch.Tensor":
    import torch

    ok = torch.isfinite(x.sum(dim=1)) if x.shape[1] else torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    if not bool(ok.all()):
        flagged = (~ok).nonzero().flatten()
        ok[flagged] = torch.isfinite(x.index_select(0, flagged)).all(dim=1)
    return ok


def _group(n: int) -> int:
    """Blocks per batched product: ``GROUP``, fewer when n² products would not fit in ~40 MB."""
    return max(1, min(GROUP, (10 << 20) // max(n * n, 1)))


def _worth_centring(x: "torch.Tensor") -> bool:
    """Whether centring on the column means would shrink the rows' norms (and so the
    rounding bound) noticeably: estimated on evenly spaced blocks of columns.
    Only speed depends on this answer (a looser bound means more exact refinement)."""
    import torch

    n, d = x.shape
    if n < 2:
        return False
    # up to 64 blocks, and at most an eighth of the columns (small d: the estimate must
    # cost much less than the Gram it is for)
    blocks = min(64, max(d // (8 * BLOCK), 1))
    starts = torch.linspace(0, max(d - BLOCK, 0), steps=blocks).long().unique()
    idx = (starts[:, None] + torch.arange(min(BLOCK, d))[None, :]).flatten().to(x.device)
    cols = x.index_select(1, idx).to(torch.float64)
    total = float(cols.square().sum()) / n
    mean_sq = float(cols.mean(dim=0).square().sum())
    return mean_sq > 0.1 * total


def _tree_sum(prod: "torch.Tensor") -> "torch.Tensor":
    """Σ over the first dimension of ``prod`` (nb, n, n), in place, by halving: float32
    additions, at most ``TREE_DEPTH`` roundings on any entry's way (so its error is
    ≤ γ_TREE_DEPTH·Σ|terms|, folded into ``KAPPA``), returned widened to float64."""
    import torch

    m = prod.shape[0]
    while m > 1:
        h = m // 2
        prod[:h] += prod[h:2 * h]
        if m % 2:
            prod[0] += prod[m - 1]
        m = h
    return prod[0].to(torch.float64)


def _own_threads(x: "torch.Tensor") -> int:
    """Threads of our own for the Gram's groups: the caller's count while a rule holds torch at
    one intra-op thread (:func:`redteam._omp.rule_threads`, on CPU), else 1 (torch's own)."""
    from redteam._omp import own_threads, workers

    return workers() if own_threads() and x.device.type == "cpu" else 1


def _block_gram(x: "torch.Tensor", centre: bool, careful: bool) -> "torch.Tensor":
    """Σ over column blocks of ``BLOCK`` of (block − its row mean, if ``centre``)·(…)ᵀ, in
    float32 products of one block each, summed as the module docstring says; float64.

    Without ``careful``, nothing is checked: a non-finite entry of ``x`` or a float32
    overflow (in a product or in the halving sum) leaves a non-finite entry in the
    result (a row's own Gram entry sums the squares of its entries), and the caller
    redoes the work ``careful``-ly: a group whose float32 product overflows while its
    entries are finite is then redone in float64, and groups are summed in float64.
    """
    import torch

    n, d = x.shape
    g = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    if n == 0 or d == 0:
        return g
    full = (d // BLOCK) * BLOCK
    per = _group(n)
    threads = _own_threads(x)
    if threads > 1:  # a rule held at one torch thread (redteam._omp): groups spread over our threads
        per = max(1, min(per, -(-(full // BLOCK) // (4 * threads))))
    step = BLOCK * per

    def group(start: int) -> "torch.Tensor":
        stop = min(start + step, full)
        nb = (stop - start) // BLOCK
        blk = x[:, start:stop].reshape(n, nb, BLOCK).transpose(0, 1)  # (nb, n, BLOCK) view
        a = blk - blk.mean(dim=1, keepdim=True) if centre else blk
        prod = torch.bmm(a, a.transpose(1, 2))
        if careful and not bool(torch.isfinite(prod).all()) and bool(torch.isfinite(blk).all()):
            a64 = blk.to(torch.float64)  # float32 overflow: this group in float64
            a64 = a64 - a64.mean(dim=1, keepdim=True) if centre else a64
            prod = torch.bmm(a64, a64.transpose(1, 2))
        return prod.to(torch.float64).sum(dim=0) if careful else _tree_sum(prod)

    starts = range(0, full, step)
    if threads > 1 and len(starts) > 1:
        from redteam._omp import one_thread

        from ._sortnet import pool

        def task(start: int) -> "torch.Tensor":
            one_thread()
            return group(start)

        parts = pool(threads).map(task, starts)
    else:
        parts = map(group, starts)
    for part in parts:  # summed in column order, whoever computed them
        g += part
    if full < d:
        b = x[:, full:]
        a = b - b.mean(dim=0) if centre else b
        prod = a @ a.T
        if careful and not bool(torch.isfinite(prod).all()) and bool(torch.isfinite(b).all()):
            a64 = b.to(torch.float64)
            a64 = a64 - a64.mean(dim=0) if centre else a64
            prod = a64 @ a64.T
        g += prod.to(torch.float64)
    return g


def _centred_gram(x: "torch.Tensor", careful: bool = False) -> tuple["torch.Tensor", float]:
    """The Gram matrix of the rows centred block by block (float64), and the absolute
    underflow term A. float32 input: :func:`_block_gram` (``careful`` as there); float64
    input is multiplied in float64."""
    import torch

    n, d = x.shape
    if x.dtype != torch.float32 or not _float32_products_ieee(x.device):
        # float64 (or lower-precision) input, or float32 matmuls in a reduced-precision
        # mode: float64 blocks (float32 values are exact there), centred the same way
        g = torch.zeros(n, n, dtype=torch.float64, device=x.device)
        step = BLOCK * GROUP
        for start in range(0, d, step):
            b = x[:, start:start + step].to(torch.float64)
            b = b - b.mean(dim=0)
            g.addmm_(b, b.T)
        return g, underflow_term(x)
    return _block_gram(x, _worth_centring(x), careful), 4.0 * d * ETA32


def _duplicate_groups(x: "torch.Tensor", suspect: "torch.Tensor", finite: "torch.Tensor") -> "torch.Tensor":
    """Group ids (smallest member index) of bitwise-equal rows among suspected pairs."""
    import torch

    n = x.shape[0]
    group = torch.arange(n, device=x.device)
    if not bool(suspect.any()):
        return group
    cand = torch.triu(suspect, diagonal=1) & finite[:, None] & finite[None, :]
    assigned = [False] * n
    pairs = cand.nonzero().tolist()
    by_row: dict[int, list[int]] = {}
    for a, b in pairs:
        by_row.setdefault(a, []).append(b)
    for a in sorted(by_row):
        if assigned[a]:
            continue
        for b in by_row[a]:
            if not assigned[b] and torch.equal(x[a], x[b]):
                group[b] = a
                assigned[b] = True
    return group


def pairwise(x: "torch.Tensor") -> PairwiseDistances:
    """Approximate squared distances of the rows of ``x`` ``(n, d)`` with their bounds.

    Nothing is refined yet: decide what you can from ``lower`` / ``upper`` and call
    :meth:`PairwiseDistances.refine` for the pairs you cannot.
    """
    import torch

    n, d = x.shape
    dev = x.device
    source = x
    g = None
    ieee = _float32_products_ieee(dev)
    if x.dtype == torch.float32 and ieee:  # the usual case: one unchecked pass, checked once at the end
        g, absolute = _centred_gram(x)
        if bool(torch.isfinite(g).all()):
            finite = torch.ones(n, dtype=torch.bool, device=dev)
            all_ok, rows = True, x
        else:
            g = None
    exponent = 0
    if g is None:
        finite = _finite_rows(x)
        all_ok = bool(finite.all())
        rows = x if all_ok else x[finite]
        if x.dtype == torch.float64 and rows.numel():
            # float64 rows past ~1e154 overflow their own squares, rows below ~1e-90 underflow
            # them (at 1e-170 every distance was 0, every score tied, and the tie went to
            # the content keys, which the sender sets): work on the rows times a power of two
            # (exact), so distances and decisions are those of x, in scaled units
            x, exponent = rescale_pow2(x, finite=finite)
            if exponent:
                rows = x if all_ok else x[finite]
        g, absolute = _centred_gram(rows, careful=True)
    sq = torch.diagonal(g).clamp_min(0.0)
    dist = (sq[:, None] + sq[None, :] - 2.0 * g).clamp_min_(0.0)
    dist = 0.5 * (dist + dist.T)
    norm = sq.sqrt()
    kappa = KAPPA if rows.dtype == torch.float32 and ieee else 1.5 * (_gamma(BLOCK * GROUP, U64) + 4 * U64)
    err = kappa * (norm[:, None] + norm[None, :]).square() + absolute
    if not all_ok:
        full_d = torch.full((n, n), math.inf, dtype=torch.float64, device=dev)
        full_e = torch.zeros(n, n, dtype=torch.float64, device=dev)
        idx = finite.nonzero().flatten()
        full_d[idx[:, None], idx[None, :]] = dist
        full_e[idx[:, None], idx[None, :]] = err
        dist, err = full_d, full_e
    dist.fill_diagonal_(0.0)
    err.fill_diagonal_(0.0)
    suspect = (dist <= err) & torch.isfinite(dist)
    suspect.fill_diagonal_(False)
    group = _duplicate_groups(x, suspect, finite)
    same = group[:, None] == group[None, :]
    dist = torch.where(same, torch.zeros_like(dist), dist)
    err = torch.where(same, torch.zeros_like(err), err)
    return PairwiseDistances(rows=x, approx=dist, error=err, finite=finite, group=group, exponent=exponent,
                             source=source if exponent else None)


def sq_distances(x: "torch.Tensor", rtol: float = 1e-9) -> "torch.Tensor":
    """Dense ``(n, n)`` float64 squared distances, each within ``rtol`` of its own value
    (pairs the float32 bound cannot promise that for are recomputed exactly)."""
    pd = pairwise(x)
    loose = pd.error > rtol * pd.approx
    return pd.refine(loose).approx


def gram(x: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """Inner products ⟨xᵢ, xⱼ⟩ ``(n, n)`` float64 and a bound on their error.

    Uncentred (cosines need the origin). float32 rows: :func:`_block_gram`, whose bound
    is 1.5·(γ_BLOCK + γ_t·(1 + γ_BLOCK) + 10⁻¹²)·‖xᵢ‖‖xⱼ‖ + A (t = ``TREE_DEPTH``); other
    rows in float64. Non-finite rows give non-finite entries in their row and column
    (callers screen rows first).
    """
    import torch

    n, d = x.shape
    step = BLOCK * _group(n)
    if x.dtype == torch.float32 and _float32_products_ieee(x.device):
        g = _block_gram(x, centre=False, careful=False)
        if not bool(torch.isfinite(g).all()):
            g = _block_gram(x, centre=False, careful=True)
        u = _gamma(BLOCK, U32) + _gamma(TREE_DEPTH, U32) * (1 + _gamma(BLOCK, U32))
    else:
        g = torch.zeros(n, n, dtype=torch.float64, device=x.device)
        for start in range(0, d, step):
            b64 = x[:, start:start + step].to(torch.float64)
            g.addmm_(b64, b64.T)
        u = _gamma(step, U64)
    norm = torch.diagonal(g).clamp_min(0.0).sqrt()
    err = 1.5 * (u + 1e-12) * norm[:, None] * norm[None, :] + 2.0 * d * ETA32
    return g, err


def cosine_similarities(x: "torch.Tensor") -> "torch.Tensor":
    """cos(xᵢ, xⱼ) ``(n, n)`` float64 in [−1, 1]; 0 where either row is zero or
    non-finite. The diagonal is 1 for non-zero finite rows.

    A cosine does not depend on either row's scale: rows whose products would underflow
    (float32 rows below 2⁻⁴⁰, float64 rows below 2⁻³⁰⁰) or overflow float64 (above 2⁴⁰⁰)
    are first multiplied by their own power of two (exact), so such a row keeps its
    direction instead of counting as a zero row."""
    import torch

    if x.dtype == torch.float32:
        x, _ = rescale_rows_pow2(x, low=TINY32, high=math.inf)
    elif x.dtype == torch.float64:  # squares of rows up to 2⁴⁰⁰ summed over d ≤ 2²⁰⁰ columns stay finite
        x, _ = rescale_rows_pow2(x, low=TINY64, high=2.0 ** 400)
    ok = _finite_rows(x)
    rows = x if bool(ok.all()) else torch.where(ok[:, None], x, torch.zeros_like(x))
    g, _ = gram(rows)
    norm = torch.diagonal(g).clamp_min(0.0).sqrt()
    denom = norm[:, None] * norm[None, :]
    cos = torch.where(denom > 0, g / denom.clamp_min(1e-300), torch.zeros_like(g)).clamp(-1.0, 1.0)
    diag = (norm > 0).to(cos.dtype)
    cos.diagonal().copy_(diag)
    return cos


# the decision helpers live in ._ranking (module size); they are part of this API
from ._ranking import k_smallest_sum_bounds, resolve_k_smallest_sums, tie_classes  # noqa: E402
