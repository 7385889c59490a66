"""Shared numerics of the built-in defenses (private: not a plugin, not public API).

* :func:`sq_distances` — all pairwise squared L2 distances through a float64 Gram
  matrix ‖xᵢ‖² + ‖xⱼ‖² − 2⟨xᵢ, xⱼ⟩, accumulated over column chunks so that no float64
  copy of the whole ``(n, d)`` matrix and no ``(n, n, d)`` tensor is ever built.
* :func:`sorted_reduce` — sort every coordinate's ``n`` values and reduce them,
  chunk by chunk. On CPU, float32/float64 columns of 2 … 256 rows and at least 2²⁰
  values are sorted by the compiled bitonic network of :mod:`defenses._sortnet` (numba;
  16 rows in vector registers per comparator), smaller or taller ones, or all of them
  without numba, by numpy on a transposed tile (SIMD sorting networks on short rows);
  other dtypes by a bitonic network of elementwise min/max over whole rows; elsewhere it
  calls ``torch.sort``. NaN sorts as
  +inf, so a non-finite row acts as an extreme value, never as a poison that spreads to
  every coordinate. :func:`halves_reduce` sorts only the two halves of the rows and
  :func:`kth_of_two` reads any order statistic off them (the trimmed mean's cut points).
  :func:`order_statistics` (the median) and :func:`trimmed_means32` (the float32 trimmed
  mean, with a proof per column that it has the halves' bits) take the same network where
  it applies, else sort tiles of columns by numpy; both on threads of our own, every op
  below ATen's grain: no OpenMP parallel region per op.
* :func:`finite_rows`, :func:`row_norms`, :func:`combine` — row screening, float64
  norms and weighted sums that a zero-weight NaN row cannot spoil.
* :func:`rescale_pow2`, :func:`rescale_rows_pow2` — exact power-of-two rescaling of rows
  whose squares would underflow (float64 entries below 2⁻³⁰⁰: at 1e-170 every squared
  distance is 0) or overflow, before distances or cosines are taken: a power of two
  changes no rounding, so a decision on the rescaled rows is the one on the rows, and
  it does not change when every row is multiplied by 2ᵏ. Rows inside the window are
  returned as they are (the same tensor: results there are bit for bit as before).
* small validation helpers that raise :func:`~redteam.types.param_error` messages.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

from redteam._omp import workers
from redteam._rows import finite_rows  # noqa: F401 - the defenses' screen, shared with the engine
from redteam.types import ServerContext, param_error

if TYPE_CHECKING:
    import torch

#: Columns per float64 block when accumulating a Gram matrix (bounded temporary memory).
GRAM_CHUNK = 16384

#: float64 rows whose largest |entry| is below this are rescaled (by an exact power of two)
#: before their products are taken: squared differences of entries down to 2⁻²⁰⁰ of the
#: largest stay normal numbers above it, and at 1e-170 every square underflows to 0
TINY64 = 2.0 ** -300
#: … and above this (squares near 2¹⁰⁰⁰, summed over the columns, overflow float64)
HUGE64 = 2.0 ** 500
#: float32 rows multiplied in float32 (the pairwise kernel's cosines): below 2⁻⁴⁰ the
#: float32 products of the entries underflow
TINY32 = 2.0 ** -40
#: the smallest positive float64 (subnormal): the underflow error of one float64 product
ETA64 = 2.0 ** -1074


# -- parameter checks -----------------------------------------------------------------
def check_count(obj: Any, name: str, v: Any, *, allow_none: bool = True, minimum: int = 0) -> None:
    """``v`` is an int ≥ ``minimum`` (or ``None`` when allowed)."""
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        opt = " (or unset)" if allow_none else ""
        raise param_error(obj, name, v, f"must be an integer ≥ {minimum}{opt}")


def check_number(obj: Any, name: str, v: Any, *, low: float = -math.inf, low_open: bool = False,
                 high: float = math.inf, allow_none: bool = False) -> None:
    """``v`` is a finite real number in [low, high] (or (low, high] when ``low_open``)."""
    if v is None and allow_none:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok:
        ok = (v > low if low_open else v >= low) and v <= high
    if not ok:
        lo = "" if low == -math.inf else (f" > {low:g}" if low_open else f" ≥ {low:g}")
        hi = "" if high == math.inf else f" and ≤ {high:g}"
        opt = " (or unset)" if allow_none else ""
        raise param_error(obj, name, v, f"must be a finite number{lo}{hi}{opt}")


def check_choice(obj: Any, name: str, v: Any, choices: tuple[str, ...]) -> None:
    if v not in choices:
        raise param_error(obj, name, v, "must be one of " + ", ".join(repr(c) for c in choices))


# -- context helpers ------------------------------------------------------------------
def generator_of(ctx: ServerContext) -> "torch.Generator":
    """The round's generator; a fresh CPU generator seeded 0 when the context has none."""
    import torch

    if ctx.generator is not None:
        return ctx.generator
    return torch.Generator(device="cpu").manual_seed(0)


def row_norms(updates: "torch.Tensor", chunk: int = GRAM_CHUNK) -> "torch.Tensor":
    """‖xᵢ‖₂ of every row, as float64.

    float32 rows take the fast float32 norm; rows where its squares could have
    overflowed (result ≥ 1e18 or non-finite) or underflowed (result < 1e-15) are
    recomputed in float64 block by block, as are rows of any other dtype. float64 rows
    whose norm came out below 2⁻⁴⁸⁰ (squares that may have underflowed: a row of
    1e-170 has norm 0 in plain float64) are measured again as 2⁻ᵏ·‖2ᵏxᵢ‖ with 2ᵏ an
    exact power of two bringing the row's largest entry near 1.
    """
    import torch

    if updates.dtype == torch.float64:
        out = torch.linalg.vector_norm(updates, dim=1)
        low = out < 2.0 ** -480
        if bool(low.any()):
            rows = low.nonzero().flatten()
            sub = updates.index_select(0, rows)
            scaled, k = rescale_rows_pow2(sub, low=2.0 ** -400, high=math.inf, target=0)
            if k is not None:
                out[rows] = times_pow2(torch.linalg.vector_norm(scaled, dim=1), -k)
        return out
    if updates.dtype == torch.float32:
        out = torch.linalg.vector_norm(updates, dim=1).to(torch.float64)
        redo = ~torch.isfinite(out) | (out >= 1e18) | (out < 1e-15)
        if not bool(redo.any()):
            return out
        rows = redo.nonzero().flatten()
        out[rows] = _row_norms64(updates.index_select(0, rows), chunk)
        return out
    return _row_norms64(updates, chunk)


def _row_norms64(updates: "torch.Tensor", chunk: int) -> "torch.Tensor":
    import torch

    n, d = updates.shape
    acc = torch.zeros(n, dtype=torch.float64, device=updates.device)
    for start in range(0, d, chunk):
        block = updates[:, start:start + chunk].to(torch.float64)
        acc += (block * block).sum(dim=1)
    return acc.sqrt()


def combine(weights: "torch.Tensor", updates: "torch.Tensor", finite: "torch.Tensor | None" = None, *,
            convex: bool = False, what: str = "the aggregate") -> "torch.Tensor":
    """Σᵢ wᵢ xᵢ over the rows with wᵢ ≠ 0 only, so that a non-finite row with weight 0
    cannot turn the result into NaN (0·NaN = NaN in a plain matrix product).
    ``finite`` is :func:`finite_rows` of ``updates`` when the caller has it already.

    Finite in, finite out: the fast product runs in the updates' dtype; where it
    overflows from finite rows (entries near ±3.4e38 in float32) it is recomputed in
    float64, column block by column block. A result outside the dtype's range is
    clamped when ``convex`` (weights ≥ 0 summing to at most 1: the exact value lies
    within the rows' range, so only rounding can leave it) and refused with
    :class:`~redteam.errors.InvalidParameter` otherwise (the rule: a finite input whose
    exact aggregate is not representable is refused, never returned as ±inf)."""
    import torch

    w = weights.to(device=updates.device, dtype=updates.dtype)
    ok = finite_rows(updates) if finite is None else finite
    if bool(ok.all()):
        rows, wu, out = updates, weights, w @ updates
    else:
        used = (w != 0).nonzero().flatten()
        rows, wu = updates.index_select(0, used), weights.index_select(0, used)
        out = w.index_select(0, used) @ rows
    if bool(torch.isfinite(out).all()) or not bool(ok[(weights != 0).nonzero().flatten()].all()):
        return out
    return safe_sum(wu, rows, convex=convex, what=what)


def safe_sum(weights: "torch.Tensor", rows: "torch.Tensor", *, convex: bool, what: str) -> "torch.Tensor":
    """Σᵢ wᵢ xᵢ of finite rows accumulated in float64 by column blocks, cast back to the
    rows' dtype (clamped when ``convex``, refused when out of range otherwise)."""
    import torch

    from redteam.errors import InvalidParameter

    w64 = weights.to(device=rows.device, dtype=torch.float64)
    d = rows.shape[1]
    out = torch.empty(d, dtype=torch.float64, device=rows.device)
    for start in range(0, d, GRAM_CHUNK):
        out[start:start + GRAM_CHUNK] = w64 @ rows[:, start:start + GRAM_CHUNK].to(torch.float64)
    big = torch.finfo(rows.dtype).max
    if convex:
        return out.clamp(-big, big).to(rows.dtype)
    peak = float(out.abs().max()) if d else 0.0
    if not peak <= big:
        raise InvalidParameter(f"{what} is not representable in {str(rows.dtype).removeprefix('torch.')}: "
                               f"its exact value reaches {peak:.4g} (largest finite {big:.4g}); the updates "
                               "are finite but too large for this rule")
    return out.to(rows.dtype)


def finite_or_refuse(obj: Any, agg: "torch.Tensor", rows: "torch.Tensor") -> "torch.Tensor":
    """The aggregate of finite rows, or a clear error where it overflowed (float64 input)."""
    import torch

    from redteam.errors import InvalidParameter

    if bool(torch.isfinite(agg).all()) or rows.shape[0] == 0:
        return agg
    big = torch.finfo(rows.dtype).max
    if rows.dtype == torch.float32:  # float64 sums: only rounding at the edge of the range
        return torch.nan_to_num(agg, posinf=big, neginf=-big)
    raise InvalidParameter(f"{type(obj).__name__}: the updates are finite but their sums overflow "
                           f"{str(rows.dtype).removeprefix('torch.')} (entries up to "
                           f"{float(rows.abs().max()):.4g}); rescale the updates")


# -- exact power-of-two rescaling -------------------------------------------------------
def finite_peak(x: "torch.Tensor", finite: "torch.Tensor | None" = None) -> float:
    """The largest |entry| of the finite rows of ``x`` (``finite``: their mask, when known); 0 if none."""
    import torch

    ok = finite_rows(x) if finite is None else finite
    rows = x if bool(ok.all()) else x[ok]
    if rows.numel() == 0:
        return 0.0
    lo, hi = torch.aminmax(rows)
    return max(abs(float(lo)), abs(float(hi)))


def pow2_exponent(peak: float, *, low: float = TINY64, high: float = HUGE64, target: int = 400) -> int:
    """k with peak·2ᵏ in [2^(target − 1), 2^target) when ``peak`` lies outside
    [low, high]; 0 when it lies inside (or is 0 or not finite): nothing to rescale."""
    if not (peak > 0 and math.isfinite(peak)) or low <= peak <= high:
        return 0
    return target - math.frexp(peak)[1]


def times_pow2(x: "torch.Tensor", k: "int | torch.Tensor") -> "torch.Tensor":
    """``x``·2ᵏ (``k`` an int, or per row an integer tensor ``(n,)``), in ``x``'s dtype,
    in steps of at most 2^±1000 taken in float64 so that no factor over- or underflows:
    exact wherever the result is a normal number (and for every scaling up of finite
    values that stays finite)."""
    import torch

    out = x if x.dtype == torch.float64 else x.to(torch.float64)
    if isinstance(k, int):
        while k:
            step = max(-1000, min(1000, k))
            out = out * math.ldexp(1.0, step)
            k -= step
    else:
        kk = k.to(device=x.device, dtype=torch.int64)
        shape = (-1,) + (1,) * (x.dim() - 1)
        two = torch.tensor(2.0, dtype=torch.float64, device=x.device)
        while bool((kk != 0).any()):
            step = kk.clamp(-1000, 1000)
            out = out * torch.pow(two, step.to(torch.float64)).reshape(shape)
            kk = kk - step
    return out if out.dtype == x.dtype else out.to(x.dtype)


def rescale_pow2(x: "torch.Tensor", *, finite: "torch.Tensor | None" = None, low: float = TINY64,
                 high: float = HUGE64, target: int = 400) -> tuple["torch.Tensor", int]:
    """(``x``·2ᵏ, k): the rows times one power of two that brings their largest finite
    |entry| into [2^(target − 1), 2^target) when it lies outside [low, high]; ``x``
    itself and 0 otherwise. Distances and cosines of the result are those of ``x`` in
    units of 2ᵏ (2²ᵏ for squares), with the same rounding, so a decision taken on them
    is the decision on ``x`` and does not change when ``x`` is scaled by a power of two."""
    k = pow2_exponent(finite_peak(x, finite), low=low, high=high, target=target)
    return (times_pow2(x, k), k) if k else (x, 0)


def rescale_rows_pow2(x: "torch.Tensor", *, low: float, high: float, target: int = 0
                      ) -> tuple["torch.Tensor", "torch.Tensor | None"]:
    """(rows rescaled, k ``(n,)`` int64 or ``None``): every row whose largest |entry| lies
    outside [low, high] multiplied by its own power of two 2^kᵢ, bringing that entry into
    [2^(target − 1), 2^target) (exact); the other rows (and zero or non-finite ones) as
    they are. Cosines do not depend on a row's scale, so they may be taken on the result.
    ``None`` (and ``x`` itself) when no row needs it."""
    import torch

    if x.numel() == 0:
        return x, None
    lo, hi = torch.aminmax(x, dim=1)  # no copy of x; a non-finite row gives a non-finite peak
    peak = torch.maximum(lo.abs(), hi.abs()).to(torch.float64)
    out_of = torch.isfinite(peak) & (peak > 0) & ((peak < low) | (peak > high))
    if not bool(out_of.any()):
        return x, None
    k = torch.where(out_of, target - torch.frexp(peak).exponent.to(torch.int64),
                    torch.zeros_like(peak, dtype=torch.int64))
    return times_pow2(x, k), k


# -- distances -------------------------------------------------------------------------
def gram64(x: "torch.Tensor", chunk: int = 8192) -> "torch.Tensor":
    """⟨xᵢ, xⱼ⟩ for all pairs, in float64, accumulated over column blocks.

    Each block is converted to float64 on its own, into one reused buffer (bounded
    memory). The rows are split in two halves and only the upper block triangle
    (top·allᵀ, bottom·bottomᵀ) is multiplied, which saves a quarter of the flops; the
    lower part is mirrored.
    """
    import torch

    n, d = x.shape
    g = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    h = n // 2
    # one reused float64 buffer (a fresh copy per block costs page faults); float64
    # input is read in place
    buf = torch.empty(n, min(chunk, d), dtype=torch.float64, device=x.device) if x.dtype != torch.float64 else None
    for start in range(0, d, chunk):
        block = x[:, start:start + chunk]
        if buf is not None:
            block = buf[:, :block.shape[1]].copy_(block)
        if h == 0:
            g.addmm_(block, block.T)
            continue
        g[:h].addmm_(block[:h], block.T)
        g[h:, h:].addmm_(block[h:], block[h:].T)
    if h:
        g[h:, :h] = g[:h, h:].T
    return g


def sq_distances(x: "torch.Tensor") -> "torch.Tensor":
    """``(n, n)`` float64 matrix of ‖xᵢ − xⱼ‖², exactly symmetric, zero diagonal.

    Pairs involving a non-finite row (or whose distance overflows float64) are +inf,
    so such a row is nobody's neighbour and has an infinite score in Krum-type rules.
    """
    import torch

    g = gram64(x)
    sq = torch.diagonal(g)
    dist = (sq[:, None] + sq[None, :] - 2.0 * g).clamp_min_(0.0)
    dist = 0.5 * (dist + dist.T)  # rounding in the Gram product is not symmetric
    dist = torch.where(torch.isfinite(dist), dist, torch.full_like(dist, math.inf))
    bad = ~torch.isfinite(sq)
    dist[bad, :] = math.inf
    dist[:, bad] = math.inf
    dist.fill_diagonal_(0.0)
    return dist


# -- sorting coordinates ----------------------------------------------------------------
def _bitonic(a: "torch.Tensor", b: "torch.Tensor", group: int) -> "torch.Tensor":
    """Sort every block of ``group`` consecutive rows of ``a`` ascending (dim 0).

    ``group`` is a power of two dividing ``a.shape[0]``. Classic bitonic network:
    stages of size 2, 4, … ``group``; below the last stage, blocks of ``size`` rows
    alternate direction (ascending, descending); each layer compares row i with row
    i + j inside its block. A layer is two or four elementwise min/max calls on
    strided views, ping-ponging between the buffers ``a`` and ``b``; the buffer that
    holds the sorted rows is returned.
    """
    import torch

    n_rows, c = a.shape
    src, dst = a, b
    size = 2
    while size <= group:
        j = size // 2
        while j >= 1:
            if size == group:  # last stage: every block ascending
                v = src.view(n_rows // (2 * j), 2, j, c)
                w = dst.view(n_rows // (2 * j), 2, j, c)
                torch.minimum(v[:, 0], v[:, 1], out=w[:, 0])
                torch.maximum(v[:, 0], v[:, 1], out=w[:, 1])
            else:
                shape = (n_rows // (2 * size), 2, size // (2 * j), 2, j, c)
                v = src.view(shape)
                w = dst.view(shape)
                # ascending blocks (index 0 along dim 1) put the min first ...
                torch.minimum(v[:, 0, :, 0], v[:, 0, :, 1], out=w[:, 0, :, 0])
                torch.maximum(v[:, 0, :, 0], v[:, 0, :, 1], out=w[:, 0, :, 1])
                # ... descending blocks put the max first
                torch.maximum(v[:, 1, :, 0], v[:, 1, :, 1], out=w[:, 1, :, 0])
                torch.minimum(v[:, 1, :, 0], v[:, 1, :, 1], out=w[:, 1, :, 1])
            src, dst = dst, src
            j //= 2
        size *= 2
    return src


def _pow2(k: int) -> int:
    return 1 << max(k - 1, 0).bit_length()


def _chunk_columns(rows: int) -> int:
    # the columns a reduce sees at once (the bitonic network's two ping-pong buffers of
    # rows × c values): unchanged, since a reduce's bits may depend on its chunk
    return max(2048, min(16384, (1 << 20) // max(rows, 1)))


#: ATen runs an elementwise op or a reduction over fewer elements than this on the calling
#: thread (``at::internal::GRAIN_SIZE``): a tile of at most this many values opens no
#: OpenMP parallel region, so tiles can be spread over threads of our own
_GRAIN = 32768


def _numpy_sorts(x: "torch.Tensor", n: int) -> bool:
    """Columns sorted by numpy: CPU float32/float64, non-empty. numpy sorts the short rows
    of a transposed tile with SIMD sorting networks (x86-simd-sort's AVX-512/AVX2 kernels
    on x86): at n = 100, ~1.5 ns a value, against tens of ns for ``torch.sort`` or
    ``torch.kthvalue`` along a row and ~9 ns for a bitonic network of ``torch.minimum`` /
    ``torch.maximum`` calls (each of its 21 layers streams the tile through the cache)."""
    import torch

    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and n > 0 and x.shape[1] > 0


def _tile_plan(n: int, d: int, unit: int = 16, chunk: "int | None" = None, *,
               split: bool = False) -> tuple[int, int, int]:
    """(columns per tile, threads, columns per op) for sorting ``n`` values in each of ``d``
    columns.

    With the caller's intra-op count (:func:`redteam._omp.workers`) > 1, tiles are spread over that
    many threads of our own
    (numpy's sort and torch's ops release the GIL), and every torch op covers at most
    :data:`_GRAIN` values: it runs where it is called, and no parallel region of a few
    microseconds waits on a thread that the machine's load has descheduled. The tiles are
    that small too, unless ``split`` (the caller cuts its torch ops into pieces of the
    third value; numpy's ops, one thread each, take the whole tile). With one thread, or
    when ``unit`` columns hold more than :data:`_GRAIN` values, one thread and wide tiles:
    fewer Python calls. The width is a multiple of ``unit``; with ``chunk`` (a power of two,
    a multiple of ``unit``), a power of two dividing it.
    """
    import torch

    def fit(most: int) -> int:
        if chunk is None:
            return max(unit, most // unit * unit)
        width = unit
        while width * 2 <= min(most, chunk):
            width *= 2
        return width

    wide = fit(max(unit, min(2048, (1 << 18) // max(n, 1))))
    threads = workers()
    if threads > 1 and unit * n <= _GRAIN:
        small = fit(_GRAIN // max(n, 1))
        width = wide if split else small
        threads = min(threads, -(-d // width) // 4)  # four tiles a thread at least
        if threads > 1:
            return width, threads, small
    return wide, 1, wide


def _load_tile(x: "torch.Tensor", rows: "torch.Tensor | None", start: int, tile: "torch.Tensor",
               cols: "torch.Tensor | None" = None) -> None:
    """``tile`` ``(n, c)`` ← columns ``start …`` of ``x`` (of its rows ``rows``, in that
    order), NaN replaced by +inf; and ``cols`` ``(c, n)`` ← its transpose (torch's blocked
    transpose of the contiguous tile: straight from ``x``, the strided reads are ~5× slower)."""
    import torch

    src = x[:, start:start + tile.shape[1]]
    if rows is None:
        torch.nan_to_num(src, nan=math.inf, posinf=math.inf, neginf=-math.inf, out=tile)
    else:  # gathered straight into the tile: no copy of the selected rows as a whole
        torch.index_select(src, 0, rows, out=tile)
        torch.nan_to_num(tile, nan=math.inf, posinf=math.inf, neginf=-math.inf, out=tile)
    if cols is not None:
        cols.copy_(tile.T)


def _each_tile(x: "torch.Tensor", n: int, work: Callable[..., None], *,
               unit: int = 16, chunk: "int | None" = None,
               needed: "Callable[[int, int], bool] | None" = None, load: bool = False) -> None:
    """Call ``work`` for every column tile of ``x`` (CPU), on :func:`_tile_plan`'s threads
    (``work`` must write only its own columns).

    ``load``: ``work(start, cols, cols_np, piece)`` with ``cols`` ``(c, n)`` holding columns
    ``start … start + c − 1`` of ``x`` transposed, NaN replaced by +inf, ``cols_np`` its numpy
    view, and ``piece`` the most columns a torch op of ``work`` may cover. Otherwise
    ``work(start, tile, cols, cols_np)`` with scratch buffers ``tile`` ``(n, c)`` and ``cols``
    that ``work`` fills (:func:`_load_tile`) and whose torch ops may cover the whole tile.
    Buffers are reused for the worker's next tile of the same width. With ``chunk``, no tile
    straddles a multiple of ``chunk``; ``needed(start, c)`` False skips the tile.
    """
    import threading

    import torch

    d = x.shape[1]
    width, threads, piece = _tile_plan(n, d, unit, chunk, split=load)
    step = d if chunk is None else chunk
    spans = ((t, min(width, end - t)) for s in range(0, d, step) for end in [min(s + step, d)]
             for t in range(s, end, width))
    lock = threading.Lock()

    def next_span() -> "tuple[int, int] | None":
        with lock:
            for start, c in spans:
                if needed is None or needed(start, c):
                    return start, c
            return None

    def run() -> None:
        buffers: dict[int, tuple[Any, ...]] = {}
        while (span := next_span()) is not None:
            start, c = span
            if c not in buffers:
                cols = torch.empty(c, n, dtype=x.dtype)
                pieces = [(j, min(piece, c - j)) for j in range(0, c, piece)]
                tiles = {w: torch.empty(n, w, dtype=x.dtype) for w in {w for _, w in pieces}}
                buffers[c] = (cols, cols.numpy(), pieces, tiles)
            cols, cols_np, pieces, tiles = buffers[c]
            if not load:
                work(start, tiles[c], cols, cols_np)
                continue
            for j, w in pieces:  # each piece's copy and transpose below the grain
                _load_tile(x, None, start + j, tiles[w], cols[j:j + w])
            work(start, cols, cols_np, piece)

    if threads == 1:
        run()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(run) for _ in range(threads)]:
            future.result()


def order_statistics(x: "torch.Tensor", ranks: tuple[int, ...]) -> "torch.Tensor":
    """``(len(ranks), d)``: row i holds, for every column, its ``ranks[i]``-th smallest value
    (0-based; NaN sorted as +inf, and returned as +inf). ``x`` is not changed."""
    import torch

    from . import _sortnet

    ranks = tuple(int(r) for r in ranks)
    n, d = x.shape
    if _sortnet.usable(x, n):
        return _sortnet.order_statistics(x, ranks)
    if not _numpy_sorts(x, n):
        return halves_reduce(x, lambda a, b: torch.stack([kth_of_two(a, b, r) for r in ranks]), lead=(len(ranks),))
    out = torch.empty(len(ranks), d, dtype=x.dtype)
    out_np = out.numpy()
    lo = min(ranks)
    picks: Any = slice(lo, lo + len(ranks)) if ranks == tuple(range(lo, lo + len(ranks))) else list(ranks)

    def work(start: int, cols: "torch.Tensor", cols_np: Any, piece: int) -> None:
        cols_np.sort(axis=1)
        out_np[:, start:start + cols_np.shape[0]] = cols_np[:, picks].T

    _each_tile(x, n, work, load=True)
    return out


def trimmed_means32(x: "torch.Tensor", b: int) -> "tuple[torch.Tensor, torch.Tensor]":
    """(means, settled), both ``(d,)``, for float32 ``x`` on CPU: per column, the mean of its
    sorted values of ranks b … n − 1 − b (NaN as +inf) summed in float64, as float32, and
    where that mean is, bit for bit, the one :func:`defenses.median.trimmed_mean` takes over
    its sorted halves (summed in another order, and with the clamped values).

    Let M = max(|s_b|, |s_{n−1−b}|): every kept and every clamped value lies in
    [s_b, s_{n−1−b}]. A column is settled when either holds:

    * the rounding cannot matter: any order of float64 additions of these values (the
      halves' sums, then − b·(s_b + s_{n−1−b})) stays within ε = (n + 2)²·2⁻⁵²·M of the exact
      sum, so after the division by keep = n − 2b the two means lie within
      3·(ε/keep + 2⁻⁵³·|mean|) of each other; where both ends of the interval
      mean ± 8·(ε/keep + 2⁻⁵³·|mean|) (computed in float64) have the same float32 bits,
      rounding is monotone, and so do the two means;
    * the sums are exact: with m the smallest nonzero |s_r|, b ≤ r ≤ n − 1 − b, every such
      value is a multiple of 2^u with 2^u > m·2⁻²⁴ (float32 keeps 24 significant bits;
      subnormals are multiples of 2⁻¹⁴⁹), and every partial sum is at most 2n·M: n·M ≤ m·2²⁸
      keeps them multiples of 2^u below 2^(u+53), exact in any order (checked only for the
      columns the first test leaves: those whose mean is near 0 or near a float32 midpoint).

    A non-finite M settles nothing; the unsettled columns must take the halves' path.
    """
    import numpy as np
    import torch

    from . import _sortnet

    n, d = x.shape
    keep = n - 2 * b
    slack = 8.0 * (n + 2) ** 2 * 2.0 ** -52 / keep  # reach = slack·M + 8·2⁻⁵³·|mean|
    if _sortnet.usable(x, n):
        means, settled = _sortnet.trimmed_means32(x, b, slack)
        return _settle_exact(x, b, means, settled)
    sums = torch.empty(d, dtype=torch.float64)
    means = torch.empty(d, dtype=x.dtype)
    settled = torch.empty(d, dtype=torch.bool)
    sums_np, means_np, settled_np = sums.numpy(), means.numpy(), settled.numpy()

    def work(start: int, cols: "torch.Tensor", cols_np: Any, piece: int) -> None:
        cols_np.sort(axis=1)
        end = start + cols.shape[0]
        for j in range(start, end, piece):
            torch.sum(cols[j - start:j - start + piece, b:n - b], dim=1, dtype=torch.float64,
                      out=sums[j:min(j + piece, end)])
        # per tile, in numpy: vectors of c values, in the cache (one op over all d would stream them)
        with np.errstate(invalid="ignore", over="ignore"):  # inf − inf, a float32 overflow: not settled
            mean = sums_np[start:end]
            mean += 0.0  # a zero sum is +0.0, as the halves' sums give
            mean /= keep
            means_np[start:end] = mean
            big = np.maximum(np.abs(cols_np[:, b]), np.abs(cols_np[:, n - 1 - b])).astype(np.float64)
            reach = np.abs(mean)
            reach *= 8.0 * 2.0 ** -53
            reach += slack * big
            low, high = (mean - reach).astype(np.float32), (mean + reach).astype(np.float32)
            settled_np[start:end] = (low.view(np.int32) == high.view(np.int32)) & np.isfinite(big)

    _each_tile(x, n, work, load=True)
    return _settle_exact(x, b, means, settled)


def _settle_exact(x: "torch.Tensor", b: int, means: "torch.Tensor", settled: "torch.Tensor"
                  ) -> "tuple[torch.Tensor, torch.Tensor]":
    """:func:`trimmed_means32`'s second test (exact sums) on the columns the first left unsettled."""
    import numpy as np
    import torch

    n = x.shape[0]
    rest = (~settled).nonzero().flatten()
    if rest.numel():  # the exact-sum test, on those columns sorted again
        cols = torch.nan_to_num(x.index_select(1, rest), nan=math.inf, posinf=math.inf, neginf=-math.inf)
        kept = np.sort(cols.T.contiguous().numpy(), axis=1)[:, b:n - b]
        size = np.abs(kept)
        with np.errstate(invalid="ignore", over="ignore"):
            smallest = np.min(size, axis=1, where=size > 0, initial=np.inf).astype(np.float64)
            big = np.maximum(size[:, 0], size[:, -1]).astype(np.float64)
            settled[rest] = torch.from_numpy(np.isfinite(big) & (big * n <= smallest * 2.0 ** 28))
    return means, settled


def _sort_segments(cols: Any, segments: list[slice]) -> None:
    """Sort, in place, every row of the numpy array ``cols`` within each slice of columns."""
    if len(segments) == 1:
        cols.sort(axis=1)
        return
    for seg in segments:
        cols[:, seg].sort(axis=1)


def _sorted_chunks(x: "torch.Tensor", rows: "torch.Tensor | None", n: int, bounds: list[int],
                   reduce: Callable[..., "torch.Tensor"], out: "torch.Tensor", c: int) -> "torch.Tensor":
    """:func:`_sorted_groups` on CPU float32/float64, ``reduce`` called on whole chunks."""
    import torch

    from . import _sortnet

    d = x.shape[1]
    segments = [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]
    if all(_sortnet.usable(x, hi - lo, n * d) for lo, hi in zip(bounds, bounds[1:])):
        picks = [torch.arange(lo, hi) if rows is None else rows[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
        buf = torch.empty(n, c, dtype=x.dtype)
        threads = workers() if c >= 4096 else 1
        for start in range(0, d, c):
            width = min(c, d - start)
            a = buf if width == c else torch.empty(n, width, dtype=x.dtype)
            for seg, pick in zip(segments, picks):
                _sortnet.sorted_rows(x, pick, start, start + width, a[seg], threads)
            out[..., start:start + width] = reduce(*[a[seg] for seg in segments])
        return out
    threads = _tile_plan(n, d)[1]
    pool = None
    if threads > 1:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(threads)
    try:
        buf_a = torch.empty(n, c, dtype=x.dtype)
        buf_b = torch.empty(c, n, dtype=x.dtype)
        for start in range(0, d, c):
            width = min(c, d - start)
            a = buf_a if width == c else torch.empty(n, width, dtype=x.dtype)
            b = buf_b if width == c else torch.empty(width, n, dtype=x.dtype)
            _load_tile(x, rows, start, a, b)
            b_np = b.numpy()
            if pool is None:
                _sort_segments(b_np, segments)
            else:
                step = -(-width // threads)
                for future in [pool.submit(_sort_segments, b_np[i:i + step], segments) for i in range(0, width, step)]:
                    future.result()
            a.copy_(b.T)
            out[..., start:start + width] = reduce(*[a[seg] for seg in segments])
    finally:
        if pool is not None:
            pool.shutdown()
    return out


def _sorted_groups(
    x: "torch.Tensor",
    splits: tuple[int, ...],
    reduce: Callable[..., "torch.Tensor"],
    out_dtype: "torch.dtype | None",
    rows: "torch.Tensor | None" = None,
    lead: tuple[int, ...] = (),
    columns: "torch.Tensor | None" = None,
    local: bool = False,
) -> "torch.Tensor":
    """Sort consecutive row groups of sizes ``splits`` per column; reduce chunk by chunk.

    ``reduce(*groups)`` receives each group's ``(size, c)`` values sorted ascending (NaN as
    +inf), contiguous, and returns ``(*lead, c)``. On CPU, ``reduce`` sees the chunks it
    always saw, :func:`_chunk_columns` wide: its results may depend on the chunk (torch
    sums a chunk's last columns in another order than the others, and a reduce may branch
    on the whole chunk, as Bulyan's does on an overflow). float32 and float64 columns are
    sorted by numpy on the chunk's transpose (:func:`_numpy_sorts`; the rows spread over
    :func:`_tile_plan`'s threads); other dtypes by a bitonic network (the groups padded
    with +inf to a common power of two and sorted together). Elsewhere ``torch.sort``.

    ``local``: ``reduce`` computes every column from that column alone (no branch on the
    chunk): float32/float64 chunks are then cut into tiles of a power of two ≥ 256 columns,
    each sorted and reduced on its own on those threads, with no chunk-wide op (a column
    sits at the same place in a block of 32 as in its chunk, and torch sums by such blocks:
    same bits). ``columns`` (bool ``(d,)``, with ``local``): only these columns are needed
    (the output is undefined elsewhere); tiles without one are skipped, and where they are
    few only they are sorted, the tile's other columns set to 0.
    """
    import torch

    if rows is not None and x.device.type != "cpu":
        x, rows = x.index_select(0, rows), None
    n, d = (x.shape[0] if rows is None else int(rows.numel())), x.shape[1]
    out = torch.empty(*lead, d, dtype=out_dtype or x.dtype, device=x.device)
    bounds = [0]
    for size in splits:
        bounds.append(bounds[-1] + size)
    if x.device.type != "cpu":
        for start in range(0, d, 1 << 20):
            if columns is not None and not bool(columns[start:start + (1 << 20)].any()):
                continue
            block = torch.nan_to_num(x[:, start:start + (1 << 20)], nan=math.inf, posinf=math.inf,
                                     neginf=-math.inf)
            parts = [torch.sort(block[lo:hi], dim=0).values for lo, hi in zip(bounds, bounds[1:])]
            out[..., start:start + block.shape[1]] = reduce(*parts)
        return out
    group = _pow2(max(splits))
    height = group * len(splits)
    c = _chunk_columns(height)
    if _numpy_sorts(x, n) and not local:
        return _sorted_chunks(x, rows, n, bounds, reduce, out, c)
    if _numpy_sorts(x, n):
        segments = [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]

        def needed(start: int, width: int) -> bool:
            return columns is None or bool(columns[start:start + width].any())

        def work(start: int, tile: "torch.Tensor", cols: "torch.Tensor", cols_np: Any) -> None:
            width = tile.shape[1]
            few = None if columns is None else columns[start:start + width].nonzero().flatten()
            if few is not None and few.numel() * 4 < width:  # sort those columns only; the others 0
                part = torch.empty(n, few.numel(), dtype=x.dtype)
                _load_tile(x[:, start:start + width].index_select(1, few), rows, 0, part)
                part_t = part.T.contiguous()
                _sort_segments(part_t.numpy(), segments)
                tile.zero_().index_copy_(1, few, part_t.T)
            else:
                _load_tile(x, rows, start, tile, cols)
                _sort_segments(cols_np, segments)
                tile.copy_(cols.T)
            out[..., start:start + width] = reduce(*[tile[seg] for seg in segments])

        _each_tile(x, n, work, unit=256, chunk=c, needed=needed)
        return out
    buf_a = torch.empty(height, c, dtype=x.dtype)
    buf_b = torch.empty(height, c, dtype=x.dtype)
    for start in range(0, d, c):
        width = min(c, d - start)
        if columns is not None and not bool(columns[start:start + width].any()):
            continue
        a = buf_a if width == c else torch.empty(height, width, dtype=x.dtype)
        b = buf_b if width == c else torch.empty(height, width, dtype=x.dtype)
        for g, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            top = g * group
            dst = a[top:top + hi - lo]
            if rows is None:
                torch.nan_to_num(x[lo:hi, start:start + width], nan=math.inf, posinf=math.inf,
                                 neginf=-math.inf, out=dst)
            else:  # gathered straight into the buffer: no copy of the selected rows as a whole
                torch.index_select(x[:, start:start + width], 0, rows[lo:hi], out=dst)
                torch.nan_to_num(dst, nan=math.inf, posinf=math.inf, neginf=-math.inf, out=dst)
            if hi - lo < group:
                a[top + hi - lo:top + group].fill_(math.inf)
        s = _bitonic(a, b, group) if group > 1 else a
        parts = [s[g * group:g * group + size] for g, size in enumerate(splits)]
        out[..., start:start + width] = reduce(*parts)
    return out


def closest_to_median_means(x: "torch.Tensor", rows: "torch.Tensor", beta: int,
                            reduce: Callable[["torch.Tensor"], "torch.Tensor"]) -> "torch.Tensor":
    """Bulyan's coordinate phase: ``sorted_reduce(x, reduce, rows=rows)`` with ``reduce``
    :func:`defenses.krum._closest_to_median_mean` at ``beta``, the same bits. On CPU float32 rows
    the network takes (:mod:`defenses._sortnet`) each chunk is sorted and reduced in one compiled
    pass; a chunk it cannot settle (a spread that is not finite, which torch compares in float64
    across the chunk, or a mean whose rounding the error bound leaves open) is sorted again and
    given to ``reduce``, chunk by chunk as :func:`sorted_reduce` does."""
    import torch

    from . import _sortnet

    n, d = int(rows.numel()), x.shape[1]
    if x.dtype != torch.float32 or not _sortnet.usable(x, n):
        return sorted_reduce(x, reduce, rows=rows)
    c = _chunk_columns(_pow2(n))
    out = torch.empty(d, dtype=x.dtype)
    count = -(-d // c)
    threads = min(workers(), count)
    # a run of whole chunks per thread, one compiled call each (the call releases the GIL; one
    # call per chunk made every chunk wait for the GIL on a busy machine)
    per = -(-count // threads)
    runs = [(i * c, min((i + per) * c, d)) for i in range(0, count, per)]
    if len(runs) > 1:
        parts = list(_sortnet.pool(threads).map(lambda r: _sortnet.bulyan32(x, rows, beta, r[0], r[1], out, c), runs))
    else:
        parts = [_sortnet.bulyan32(x, rows, beta, 0, d, out, c)]
    for (lo, _), settled in zip(runs, parts):
        for k in (~settled).nonzero()[0].tolist():
            start = lo + k * c
            stop = min(start + c, d)
            tile = torch.empty(n, stop - start, dtype=x.dtype)
            _sortnet.sorted_rows(x, rows, start, stop, tile)
            out[start:stop] = reduce(tile)
    return out


def sorted_reduce(
    x: "torch.Tensor",
    reduce: Callable[["torch.Tensor"], "torch.Tensor"],
    out_dtype: "torch.dtype | None" = None,
    rows: "torch.Tensor | None" = None,
    local: bool = False,
) -> "torch.Tensor":
    """Apply ``reduce`` to the coordinate-wise sorted values, chunk by chunk.

    ``reduce`` receives ``s`` of shape ``(n, c)`` whose column j holds coordinate j's
    values in ascending order (NaN sorted as +inf) and returns a ``(c,)`` tensor.
    The result ``(d,)`` is in ``out_dtype`` (default: ``x.dtype``). ``x`` is not changed.
    ``rows`` (indices): reduce over those rows of ``x`` only, as if ``x[rows]`` were given
    (without building that copy). ``local``: see :func:`_sorted_groups`.
    """
    return _sorted_groups(x, (x.shape[0] if rows is None else int(rows.numel()),), reduce, out_dtype, rows,
                          local=local)


def halves_reduce(
    x: "torch.Tensor",
    reduce: Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"],
    out_dtype: "torch.dtype | None" = None,
    lead: tuple[int, ...] = (),
    columns: "torch.Tensor | None" = None,
    local: bool = False,
) -> "torch.Tensor":
    """Like :func:`sorted_reduce`, but only the two halves of the rows are sorted.

    ``reduce(lo, hi)`` gets rows ``[0, ⌈n/2⌉)`` and ``[⌈n/2⌉, n)`` each sorted per
    column; :func:`kth_of_two` then finds any order statistic of the union without
    the final merge (a quarter of the sorting network for n = 100). ``lead``, ``columns``,
    ``local``: as for :func:`_sorted_groups`.
    """
    n = x.shape[0]
    p = (n + 1) // 2
    if n - p == 0:
        return _sorted_groups(x, (n,), lambda s: reduce(s, s[:0]), out_dtype, lead=lead, columns=columns, local=local)
    return _sorted_groups(x, (p, n - p), reduce, out_dtype, lead=lead, columns=columns, local=local)


def kth_of_two(a: "torch.Tensor", b: "torch.Tensor", k: int) -> "torch.Tensor":
    """The k-th smallest (0-based) per column of the union of sorted ``a`` and ``b``.

    With a[−1] = b[−1] = −∞ and a[i] = b[i] = +∞ past the end, the answer is
    minᵢ max(a[i − 1], b[k − i]) over i = 0 … k + 1: the i-th term is the largest
    of the k + 1 smallest values when exactly i of them come from ``a``.
    """
    import torch

    p, q = a.shape[0], b.shape[0]
    i0, i1 = max(0, k - q + 1), min(k + 1, p)  # other i give +∞ terms
    neg = torch.full_like(a[:1] if p else b[:1], -math.inf)
    a_pad = torch.cat([neg, a[:i1]])  # a_pad[i] = a[i − 1]
    b_pad = torch.cat([neg, b[:k + 1 - i0]])  # b_pad[j + 1] = b[j]
    terms = torch.maximum(a_pad[i0:i1 + 1], b_pad[k - i1 + 1:k - i0 + 2].flip(0))
    return terms.amin(dim=0)
