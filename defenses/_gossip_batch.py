"""Server rules applied to every gossip neighbourhood at once (issue 26 §1; private).

In the ``[gossip]`` regime each honest node i calls the scenario's rule on its rows centred on its
own model (its zero row first, then x_j − x_i for each neighbour; :mod:`redteam.federation.gossip`).
For ``median``, ``trimmed_mean``, ``krum`` and ``multi_krum`` (``variant = "scores"``) the forms
here decide every merging node of a chunk at once, over the padded neighbourhoods
``rows`` ``(m, K, d)`` with the validity mask ``valid`` ``(m, K)`` that
:func:`redteam.federation.gossip._batched_step` builds, and give **the same models, bit for bit**,
as the rule called node by node. A node they cannot vouch for is left to the rule itself
(``BatchDecision.undecided``: the step calls the rule on that node's rows, in its turn). None of
the four reads the weights (the node's row of W): they ignore sample counts on a server too, and
the own zero row is a row like any other.

* **median** — the rows are screened as the rule screens them (a row with a NaN/±Inf entry is
  rejected, "non-finite update"); the nodes with the same number n' of finite rows are laid side by
  side, as the columns of one ``(n', nodes · d)`` matrix, and the rule's own kernel
  (:func:`defenses.median.coordinate_median`, then :func:`defenses._common.finite_or_refuse`) runs
  once on it. A column's order statistics and their midpoint depend on that column alone, so each
  node gets what its own call gives, whatever the kernel does inside.
* **trimmed mean** — the same screening and grouping; the kept values' sum is the one figure that
  depends on the order of a float64 summation, and the rule's order depends on where a column
  falls in its kernel's tiles. So the columns are sorted and summed here (any order), and a column
  is trusted only where every order gives the same aggregate: the sum is exact in any order, or
  (sum ± the largest rounding any order can make)/(n − 2b) rounds to one value in the rows' dtype
  (:class:`_TrimmedMeanForm`). float32 rows pass nearly always; float64 rows of full precision
  never (their nodes go to the rule).
* **Krum / Multi-Krum** — per node, the squared distances of its rows from one batched Gram
  product (float32 rows: column blocks of 256 multiplied in float32 and summed in float64; float64
  rows, or float32 under a reduced-precision matmul mode: float64), padding and non-finite rows
  infinitely far, every distance with a rigorous rounding bound; a row's score is the sum of its
  k smallest distances to the other rows, with f, k and m resolved per node by the rule's own
  helpers (the defaults the rule uses on that neighbourhood). The node's selection is the m lowest
  scores, copies (rows equal entry for entry) in the order of their slots, as the rule orders them.
  The rule selects what exact arithmetic selects wherever the scores either side of its cut are
  apart by more than its own bounds (≤ 1e-9 relative after its float64 refinement); so a node is
  decided here only where the score intervals either side of its cut are apart by more than 1e-8
  of the scores (copies straddling the cut counted as one row, as the rule shares their weight).
  A node a float32 Gram leaves open gets a float64 Gram; what is still open (an exact tie between
  different rows, which the rule breaks by the rows' content; float64 rows outside [2⁻³⁰⁰, 2⁵⁰⁰],
  which it rescales; fewer than k finite rows; a neighbourhood the rule refuses) goes to the rule.
  The aggregate is the rule's: Krum's selected row itself; Multi-Krum's
  :func:`defenses._common.combine` of the node's rows with the rule's weights (1/m per selected
  row, shared among copies), called on that node's rows.

What is not the rule's: Krum's and Multi-Krum's ``Decision.state["scores"]`` (and the scores quoted
in Krum's rejection reasons) are, for a node decided here, the sums of the computed distances
(within the bound above of the exact scores); the rule reports the midpoints of its own rounding
intervals, which can be far wider (beside a row of 1e30 in float32, 1e56). Multi-Krum's
``state["selected"]`` lists the same rows, by score. Only these exact types take a batched form (a
subclass may override ``decide``); Multi-Krum's ``"iterative"`` variant runs node by node.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from redteam.errors import InvalidParameter

from ._common import combine, finite_or_refuse
from .gossip import BatchDecision
from .krum import Krum, MultiKrum, _krum_f, _neighbours
from .median import Median, TrimmedMean, coordinate_median

if TYPE_CHECKING:
    import torch

__all__ = ["batched_form"]

#: entries (nodes × K × d) of the padded neighbourhoods built per chunk for these forms: the
#: rules' kernels tile the columns themselves, so a chunk need not fit in cache; bigger chunks
#: make fewer calls (16 MiB of float32 rows)
CHUNK_ENTRIES = 1 << 22
#: a node is decided here only when the score intervals at its cut are this far apart, relative
#: to the scores (the rule's own bounds after refinement: ≤ 1e-9, see the module docstring)
MARGIN = 1e-8
_U32 = 2.0 ** -24
_U64 = 2.0 ** -53
_ETA32 = 2.0 ** -149
_ETA64 = 2.0 ** -1074
_TINY64 = 2.0 ** -300
_HUGE64 = 2.0 ** 500
#: columns per float32 block of the Gram product (the rounding bound grows with it)
_BLOCK = 256


def _gamma(k: int, u: float) -> float:
    return k * u / (1.0 - k * u)


def batched_form(defense: Any) -> "_Form | None":
    """The batched neighbourhood form of ``defense`` (exactly a ``Median``, ``TrimmedMean``,
    ``Krum`` or ``MultiKrum`` with ``variant = "scores"``), or ``None``."""
    kind = type(defense)
    if kind is Median:
        return _MedianForm(defense)
    if kind is TrimmedMean:
        return _TrimmedMeanForm(defense)
    if kind is Krum:
        return _KrumForm(defense, multi=False)
    if kind is MultiKrum and defense.variant == "scores":
        return _KrumForm(defense, multi=True)
    return None


def _finite_slots(rows: "torch.Tensor", valid: "torch.Tensor") -> "torch.Tensor":
    """``(m, K)``: valid slots whose row has every entry finite (as :func:`finite_rows` screens:
    the row sums first, the flagged rows entry by entry)."""
    import torch

    ok = torch.isfinite(rows.sum(-1))
    flagged = (valid & ~ok).nonzero()
    if flagged.numel():
        r, k = flagged[:, 0], flagged[:, 1]
        ok[r, k] = torch.isfinite(rows[r, k]).all(-1)
    return ok & valid


class _Form:
    """A rule's batched form: :meth:`decide_batch` as the batched gossip step calls it."""

    chunk_entries = CHUNK_ENTRIES
    #: a node's result does not depend on the padding: the step may group the nodes by degree
    sort_by_degree = True

    def __init__(self, rule: Any) -> None:
        self.rule = rule

    def batch_ready(self) -> bool:
        return True

    def decide_batch(self, rows: "torch.Tensor", weights: "torch.Tensor", valid: "torch.Tensor",
                     own_row: int | None = 0) -> BatchDecision:  # pragma: no cover - abstract
        raise NotImplementedError


class _Coordinatewise(_Form):
    """Median and trimmed mean: the nodes with the same number of finite rows side by side."""

    def _kernel(self, packed: "torch.Tensor", n: int) -> tuple["torch.Tensor", "torch.Tensor | None"]:
        """(aggregate ``(D,)`` of the columns of ``packed`` ``(n, D)``, columns it may not be
        trusted on or ``None``)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _state(self, n: int) -> dict[str, Any]:
        return {}

    def decide_batch(self, rows: "torch.Tensor", weights: "torch.Tensor", valid: "torch.Tensor",
                     own_row: int | None = 0) -> BatchDecision:
        import torch

        m, k_max, d = rows.shape
        ok = _finite_slots(rows, valid)
        reasons = {(r, k): "non-finite update" for r, k in (valid & ~ok).nonzero().tolist()}
        agg = torch.zeros(m, d, dtype=rows.dtype, device=rows.device)
        counts = ok.sum(1).tolist()
        states = [self._state(int(c)) for c in counts]
        undecided: set[int] = set()
        groups: dict[int, list[int]] = {}
        for r, c in enumerate(counts):
            if c:  # no finite row: the rule returns zeros
                groups.setdefault(int(c), []).append(r)
        ok_np = ok.cpu().numpy()
        flat = rows.reshape(m * k_max, d)
        for n, members in groups.items():
            # row s of the packed matrix: the s-th finite row of every member, side by side
            idx = [[r * k_max + k for k in ok_np[r].nonzero()[0].tolist()] for r in members]
            order = torch.as_tensor(idx, dtype=torch.long, device=rows.device).T.reshape(-1)
            packed = flat.index_select(0, order).view(n, len(members) * d)
            out, untrusted = self._kernel(packed, n)
            try:
                out = finite_or_refuse(self.rule, out, packed)
            except InvalidParameter:  # a node whose sums overflow float64: the rule refuses it itself
                untrusted = ~torch.isfinite(out) if untrusted is None else untrusted | ~torch.isfinite(out)
            if untrusted is not None:
                bad = untrusted.view(len(members), d).any(1).tolist()
                undecided.update(r for r, no in zip(members, bad) if no)
            agg[members] = out.view(len(members), d).to(rows.dtype)
        return BatchDecision(aggregate=agg, accepted=ok, reasons=reasons, states=states,
                             undecided=frozenset(undecided))


class _MedianForm(_Coordinatewise):
    """The rule's own kernel on the side-by-side columns: order statistics and their midpoint are
    computed column by column, so each node's columns come out as in its own call."""

    def _kernel(self, packed: "torch.Tensor", n: int) -> tuple["torch.Tensor", "torch.Tensor | None"]:
        return coordinate_median(packed, self.rule.even_rule), None


class _TrimmedMeanForm(_Coordinatewise):
    """The trimmed mean sums a column's kept values in float64, and the rule's order of summation
    is not the same for every column: torch's float64 sum over the rows of a tile adds a column in
    an order that depends on where the column falls in the tile and on the tile's width (grouping
    the nodes' columns side by side and calling :func:`defenses.median.trimmed_mean` moved float64
    results by an ulp). So each column's kept values are sorted and summed here, in any order, and
    a column is trusted only where every order gives the rule's aggregate:

    * the sum is **exact** in any order: every partial sum is a multiple of the kept values'
      smallest unit 2^u and stays below 2^(u + 53) (n·max|kept| < 2^(u + 53); for float32 values,
      whose unit exceeds min|kept|·2⁻²⁴, n·max ≤ min·2²⁸ suffices, as :mod:`defenses._common`
      notes); or
    * the aggregate **rounds the same** at both ends of the interval the rule's sum may lie in: any
      order of its ≤ n + 2 float64 terms (the n clamped values, then −b·(lo + hi)), each at most
      max|kept|, lands within (n + 4)·(n + 2b)·2⁻⁵²·max|kept| of the exact sum, and so does this
      one; where (sum ± twice that)/(n − 2b), rounded to the rows' dtype, is one number, it is the
      rule's aggregate. For float32 rows that is nearly every column (at n = 15 the slack is about
      2⁻¹⁸·max|kept|/|mean| of a float32 step).

    A node with a column that is neither (float64 rows of full precision: always; float32 rows:
    rarely) is left to the rule, node by node. The sort is numpy's, a cache-sized tile at a time."""

    def batch_ready(self) -> bool:
        return self.rule.b is not None  # unset: the rule refuses every node, node by node

    def _kernel(self, packed: "torch.Tensor", n: int) -> tuple["torch.Tensor", "torch.Tensor | None"]:
        import torch

        b = self.rule.resolve_b(n)
        dim = packed.shape[1]
        out = torch.empty(dim, dtype=packed.dtype, device=packed.device)
        bad = torch.empty(dim, dtype=torch.bool, device=packed.device)
        if packed.device.type != "cpu" or packed.dtype not in (torch.float32, torch.float64):
            return out.zero_(), bad.fill_(True)
        width = max(256, (1 << 16) // max(n, 1))  # a tile and its transpose stay in cache
        cols = torch.empty(width, n, dtype=packed.dtype)
        for start in range(0, dim, width):
            c = min(width, dim - start)
            tile = cols[:c]
            tile.copy_(packed[:, start:start + c].T)
            tile.numpy().sort(axis=1)  # every column's values in order (they are finite)
            out[start:start + c], bad[start:start + c] = _trimmed_tile(tile.T.contiguous(), b)
        return out, bad

    def _state(self, n: int) -> dict[str, Any]:
        if n == 0:
            return {"b": 0}
        b = self.rule.resolve_b(n)
        state: dict[str, Any] = {"b": b}
        if b < int(self.rule.b or 0):
            state["b_reduced_from"] = int(self.rule.b or 0)
        return state


def _trimmed_tile(s: "torch.Tensor", b: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(aggregate, untrusted) of the trimmed mean over the columns of ``s`` ``(n, c)``, sorted per
    column (see :class:`_TrimmedMeanForm`)."""
    import torch

    n = s.shape[0]
    keep = n - 2 * b
    kept = s[b:n - b]
    total = kept.to(torch.float64).sum(0) + 0.0  # any order (+0.0: a zero sum is +0, as the rule's)
    peak = torch.maximum(kept[0].abs(), kept[-1].abs()).to(torch.float64)  # sorted: max|kept| at an end
    if s.dtype == torch.float32:
        size = kept.abs()
        smallest = torch.where(size > 0, size, torch.full_like(size, math.inf)).amin(0).to(torch.float64)
        exact = peak * n <= smallest * 2.0 ** 28
    else:  # the kept values' smallest unit: 2^(exponent − 53 + the mantissa's lowest set bit)
        mant, expo = torch.frexp(kept)
        whole = (mant * 2.0 ** 53).to(torch.int64)
        low = torch.frexp((whole & -whole).to(torch.float64)).exponent - 1
        unit = torch.where(kept != 0, expo - 53 + low, torch.full_like(expo, 1 << 20)).amin(0)
        exact = (peak == 0) | (torch.log2((peak * n).clamp_min(1e-300)) < (unit + 53).to(torch.float64))
    mean = (total / keep).to(s.dtype)
    doubt = ~exact
    if bool(doubt.any()):
        # the interval the rule's sum may lie in (its order and this one: ≤ n + 2 terms of size ≤
        # max|kept| each), widened for the rounding of the bound itself: trusted where both ends
        # round to the same aggregate
        cols = doubt.nonzero().flatten()
        t = total[cols]
        slack = peak[cols] * ((2 * n + 8) * (n + 2 * b) * 2.0 ** -52 * (1 + 2.0 ** -40)) + 2.0 ** -1070
        doubt[cols] = ((t - slack) / keep).to(s.dtype) != ((t + slack) / keep).to(s.dtype)
    return mean, doubt


# ---------------------------------------------------------------------------- Krum
def _gram32(rows: "torch.Tensor", counts: list[int]) -> tuple["torch.Tensor", float, float]:
    """Gram matrices ``(m, K, K)`` float64 of float32 rows (node r's first ``counts[r]`` rows; 0
    elsewhere): ``_BLOCK`` columns at a time in float32, the blocks summed in float64; with
    (relative factor, absolute term) of the squared-distance bound (see :func:`_distances`)."""
    import torch

    m, k_max, d = rows.shape
    g = torch.zeros(m, k_max, k_max, dtype=torch.float64, device=rows.device)
    nb = d // _BLOCK
    full = nb * _BLOCK
    for r, n in enumerate(counts):  # a node's blocks as one batch (uniform batch stride: no copy)
        if nb:
            blk = rows[r, :n, :full].view(n, nb, _BLOCK).transpose(0, 1)
            g[r, :n, :n] = torch.bmm(blk, blk.transpose(1, 2)).to(torch.float64).sum(0)
        if full < d:
            tail = rows[r, :n, full:]
            g[r, :n, :n] += (tail @ tail.T).to(torch.float64)
    # a block's float32 product: γ_BLOCK; the float64 sum of nb + 1 blocks: γ_(nb+1) (u = 2⁻⁵³);
    # the distance's own three float64 operations and the norms read off the diagonal: 4u and 1.5×;
    # float32 products may underflow (2⁻¹⁴⁹ each, 4d of them per distance)
    rel = 1.5 * (_gamma(_BLOCK, _U32) + _gamma(nb + 1, _U64) * (1 + _gamma(_BLOCK, _U32)) + 4 * _U64 + 1e-12)
    return g, rel, 4.0 * d * _ETA32


def _gram64(rows: "torch.Tensor", counts: list[int]) -> tuple["torch.Tensor", float, float]:
    """Gram matrices ``(m, K, K)`` in float64 (the rows converted exactly; the padding is 0) and
    their bound terms."""
    import torch

    d = rows.shape[2]
    r64 = rows if rows.dtype == torch.float64 else rows.to(torch.float64)
    g = torch.bmm(r64, r64.transpose(1, 2))
    rel = 1.5 * (_gamma(max(d, 1), _U64) + 4 * _U64 + 1e-12)
    return g, rel, 4.0 * d * _ETA64


def _distances(g: "torch.Tensor", rel: float, absolute: float, ok: "torch.Tensor"
               ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(D̂, E) ``(m, K, K)``: squared distances from the Gram matrices and a bound with
    |D̂ − ‖xₐ − x_b‖²| ≤ E; pairs with a row not in ``ok`` at +inf (bound 0), the diagonal 0."""
    import torch

    sq = torch.diagonal(g, dim1=1, dim2=2).clamp_min(0.0)
    dist = (sq[:, :, None] + sq[:, None, :] - 2.0 * g).clamp_min_(0.0)
    dist = 0.5 * (dist + dist.transpose(1, 2))
    norm = sq.sqrt()
    err = rel * (norm[:, :, None] + norm[:, None, :]).square() + absolute
    pair = ok[:, :, None] & ok[:, None, :]
    dist = torch.where(pair, dist, torch.full_like(dist, math.inf))
    err = torch.where(pair, err, torch.zeros_like(err))
    eye = torch.eye(dist.shape[1], dtype=torch.bool, device=dist.device)
    dist = dist.masked_fill(eye, 0.0)
    err = err.masked_fill(eye, 0.0)
    return dist, err


def _copies(rows: "torch.Tensor", dist: "torch.Tensor", err: "torch.Tensor", ok: "torch.Tensor",
            nodes: list[int]) -> "torch.Tensor":
    """``(len(nodes), K)`` int64: the smallest slot holding a row equal (entry for entry) to each
    slot's row, as the rule's pairwise kernel groups copies; only pairs whose distance interval
    contains 0 are compared."""
    import torch

    c, k_max = dist.shape[0], dist.shape[1]
    group = torch.arange(k_max, device=dist.device).repeat(c, 1)
    suspect = (dist <= err) & ok[:, :, None] & ok[:, None, :]
    suspect = torch.triu(suspect, diagonal=1)
    if not bool(suspect.any()):
        return group
    by_node: dict[int, dict[int, list[int]]] = {}
    for q, a, b in suspect.nonzero().tolist():
        by_node.setdefault(q, {}).setdefault(a, []).append(b)
    for q, by_row in by_node.items():
        x = rows[nodes[q]]
        assigned = [False] * k_max
        for a in sorted(by_row):
            if assigned[a]:
                continue
            for b in by_row[a]:
                if not assigned[b] and torch.equal(x[a], x[b]):
                    group[q, b] = a
                    assigned[b] = True
    return group


class _KrumForm(_Form):
    """Krum (``multi = False``) or Multi-Krum with ``variant = "scores"``."""

    def __init__(self, rule: Any, multi: bool) -> None:
        super().__init__(rule)
        self.multi = multi

    def _params(self, n: int) -> tuple[int, int, int]:
        """(f, k, m) for a neighbourhood of n rows, as the rule resolves them (raises as it does)."""
        rule = self.rule
        f = _krum_f(rule, rule.f, n)
        k = _neighbours(rule, rule.neighbours, n, f)
        if not self.multi:
            return f, k, 1
        m = n - f if rule.m is None else rule.m
        if m > n:
            raise InvalidParameter("m > n")
        return f, k, m

    def decide_batch(self, rows: "torch.Tensor", weights: "torch.Tensor", valid: "torch.Tensor",
                     own_row: int | None = 0) -> BatchDecision:
        import torch

        from ._pairwise import _float32_products_ieee

        m_nodes, k_max, d = rows.shape
        ok = _finite_slots(rows, valid)
        n_all = valid.sum(1).tolist()
        params: dict[int, tuple[int, int, int]] = {}
        undecided: set[int] = set()
        for r, n in enumerate(n_all):
            try:
                params[r] = self._params(int(n))
            except InvalidParameter:  # the rule refuses this neighbourhood: it says so itself
                undecided.add(r)
        if rows.dtype == torch.float64:  # rows the rule would rescale by a power of two
            peak = torch.where(ok[:, :, None], rows, torch.zeros((), dtype=rows.dtype, device=rows.device)
                               ).abs().amax(dim=(1, 2)).tolist()
            undecided.update(r for r, p in enumerate(peak) if p > 0 and not _TINY64 <= p <= _HUGE64)
        todo = [r for r in range(m_nodes) if r not in undecided]
        # non-finite rows zeroed for the products (their distances are set to +inf); padding is 0
        x = rows if not bool((valid & ~ok).any()) else torch.where(
            ok[:, :, None], rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
        picks: dict[int, tuple[list[int], list[float], "torch.Tensor"]] = {}
        fast = rows.dtype == torch.float32 and _float32_products_ieee(rows.device)
        for gram in ((_gram32, _gram64) if fast else (_gram64,)):
            if not todo:
                break
            sel = torch.as_tensor(todo, dtype=torch.long, device=rows.device)
            sub = x.index_select(0, sel) if len(todo) < m_nodes else x
            g, rel, absolute = gram(sub, [int(n_all[r]) for r in todo])
            overflow = (~torch.isfinite(g).flatten(1).all(1)).tolist()  # float32 products past 3.4e38
            ok_sub = ok.index_select(0, sel)
            dist, err = _distances(g, rel, absolute, ok_sub)
            group = _copies(rows, dist, err, ok_sub, todo)
            done = self._select(dist, err, group, ok_sub, [params[r] for r in todo], d)
            done = [None if bad else pick for pick, bad in zip(done, overflow)]
            for q, r in enumerate(todo):
                if done[q] is not None:
                    picks[r] = done[q]
            todo = [r for r in todo if r not in picks]
        undecided.update(todo)
        return self._decisions(rows, ok, n_all, params, picks, undecided)

    def _select(self, dist: "torch.Tensor", err: "torch.Tensor", group: "torch.Tensor", ok: "torch.Tensor",
                params: list[tuple[int, int, int]], d: int) -> list[Any]:
        """Per node: (selected slots, scores, copy groups) when the intervals settle its selection,
        else ``None``."""
        import numpy as np
        import torch

        c, k_max = ok.shape
        if c == 0:
            return []
        # copies take their representative's distances (equal in exact arithmetic), 0 to each other
        gi = group[:, :, None].expand(c, k_max, k_max)
        gj = group[:, None, :].expand(c, k_max, k_max)
        dist = dist.gather(1, gi).gather(2, gj)
        err = err.gather(1, gi).gather(2, gj)
        eye = torch.eye(k_max, dtype=torch.bool, device=dist.device)
        lower = (dist - err).clamp_min(0.0).masked_fill(eye, math.inf)
        upper = (dist + err).masked_fill(eye, math.inf)
        kk = torch.as_tensor([max(p[1], 1) - 1 for p in params], dtype=torch.long, device=dist.device)
        at = kk[:, None, None].expand(c, k_max, 1)
        low = torch.sort(lower, dim=2).values.cumsum(2).gather(2, at).squeeze(2)
        high = torch.sort(upper, dim=2).values.cumsum(2).gather(2, at).squeeze(2)
        # the reported score: the sum of the k smallest computed distances (a point estimate; the
        # rule reports its intervals' midpoints, which are no closer to the exact score)
        point = torch.sort(dist.masked_fill(eye, math.inf), dim=2).values.cumsum(2).gather(2, at).squeeze(2)
        low_n, high_n, ok_n, grp = low.cpu().numpy(), high.cpu().numpy(), ok.cpu().numpy(), group.cpu().numpy()
        point_n = point.cpu().numpy()
        # the rule's refined scores are within max(1e-9, (d + 3)·2⁻⁵³) of their value, plus the
        # underflow of float64 products (4d·2⁻¹⁰⁷⁴ per distance)
        rel = max(MARGIN, 16.0 * (d + 3) * _U64)
        absolute = 32.0 * k_max * max(d, 1) * _ETA64
        out: list[Any] = []
        for q, (_, k, m) in enumerate(params):
            cand = np.flatnonzero(ok_n[q])
            lo, hi = low_n[q, cand], high_n[q, cand]
            if cand.size == 0 or not np.isfinite(hi).all():
                out.append(None)  # no finite row, or rows with fewer than k finite others
                continue
            mid = 0.5 * (lo + hi)
            order = np.argsort(mid, kind="stable")  # equal scores (copies): the lower slot first
            take = min(m, cand.size)
            ins = np.zeros(cand.size, dtype=bool)
            ins[order[:take]] = True
            # the margin: the rule's own intervals (≤ 1e-9 of the scores) cannot meet across the cut
            slack = rel * hi + absolute
            lo_m, hi_m = lo - slack, hi + slack
            g = grp[q, cand]
            straddle = g[order[take - 1]] if take < cand.size and g[order[take - 1]] == g[order[take]] else -1
            other = g != straddle
            top_in = hi_m[ins & other].max(initial=-math.inf)
            bottom_out = lo_m[~ins & other].min(initial=math.inf)
            settled = top_in < bottom_out
            if straddle >= 0:  # one row's copies on both sides: apart from everything else
                member = np.flatnonzero(~other)[0]
                settled = settled and top_in < lo_m[member] and hi_m[member] < bottom_out
            if not settled:
                out.append(None)
                continue
            scores = np.full(k_max, math.inf)
            scores[cand] = point_n[q, cand]
            out.append((cand[order[:take]].tolist(), scores, grp[q]))
        return out

    def _decisions(self, rows: "torch.Tensor", ok: "torch.Tensor", n_all: list[int],
                   params: dict[int, tuple[int, int, int]], picks: dict[int, Any], undecided: set[int]
                   ) -> BatchDecision:
        import numpy as np
        import torch

        m_nodes, k_max, d = rows.shape
        agg = torch.zeros(m_nodes, d, dtype=rows.dtype, device=rows.device)
        accepted = torch.zeros(m_nodes, k_max, dtype=torch.bool, device=rows.device)
        reasons: dict[tuple[int, int], str] = {}
        states: list[dict[str, Any]] = [{} for _ in range(m_nodes)]
        ok_n = ok.cpu().numpy()
        for r, (chosen, scores, grp) in picks.items():
            n = int(n_all[r])
            f, k, m = params[r]
            grp = grp[:n]
            picked = np.bincount(grp[chosen], minlength=n)
            size = np.bincount(grp, minlength=n)
            w = torch.as_tensor(picked[grp] / size[grp] / len(chosen), dtype=torch.float64,
                                device=rows.device).to(rows.dtype)  # the rule's weights (its _credit)
            acc = w > 0
            accepted[r, :n] = acc
            score_list = [float(s) for s in scores[:n]]
            for j in np.flatnonzero(~ok_n[r, :n]).tolist():
                reasons[(r, j)] = "non-finite update"
            rejected = (~acc).nonzero().flatten().tolist()
            if self.multi:
                mine = rows[r, :n]
                if mine.data_ptr() % 64:  # as aligned as the rule's own rows (BLAS may read it by alignment)
                    mine = mine.clone()
                agg[r] = combine(w, mine, ok[r, :n].clone(), convex=True)
                for j in rejected:
                    reasons.setdefault((r, j), f"not among the {len(chosen)} updates selected by Multi-Krum")
                states[r] = {"f": f, "m": m, "neighbours": k, "scores": score_list, "selected": list(chosen)}
            else:
                best = chosen[0]
                agg[r] = rows[r, best]
                for j in rejected:
                    reasons.setdefault((r, j), f"not selected by Krum (score {score_list[j]:.6g}; "
                                               f"the selected update scored {score_list[best]:.6g})")
                states[r] = {"f": f, "neighbours": k, "scores": score_list, "selected": [best]}
        return BatchDecision(aggregate=agg, accepted=accepted, reasons=reasons, states=states,
                             undecided=frozenset(undecided))
