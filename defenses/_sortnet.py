"""Coordinate-wise order statistics by a compiled bitonic sorting network (issue 23 §1).

The median, the trimmed mean and Bulyan's coordinate phase need, for each of d coordinates,
some order statistics of its n values. On CPU the columns of the ``(n, d)`` update matrix are
taken 64 at a time into a tile of ``16·nb × 64`` integer keys (nb blocks of 16 rows, a power of
two), sorted down the rows by Batcher's bitonic network, and the wanted rows read off. numba
compiles the network's fixed pieces (``_sortnet_kernels.py``, written by
``scripts/gen_sortnet.py``) so that each block of 16 rows sits in vector registers and every
comparator is one min and one max over 16 columns. At n = 100, d = 10⁶ on one core the median
takes about 5× the time of ``x.sum()`` (one read of the input), against ~15× for numpy's sort
of transposed tiles and ~45× for the earlier network of torch ops.

* **Keys.** A float's bits b become the signed integer ``b ^ ((b >> 31) & 0x7FFFFFFF)`` (63 and
  the 64-bit mask for float64): integer order is then the float order, −0.0 before +0.0, and
  the map is its own inverse. NaN becomes the key of +inf, so a NaN sorts, and comes back, as
  +inf (as everywhere in ``defenses._common``).
* **Padding.** Rows n … 16·nb − 1 hold +inf. The network sorts ascending with +inf staying in
  place: at each merge level the group holding the last real block merges ascending and its
  siblings alternate from it (any two halves sorted in opposite directions form a bitonic
  sequence), so blocks of padding only are never touched.
* **Pruning.** For order statistics only the blocks holding the wanted ranks get the last
  merge's final four layers.
* **Threads.** Columns are split into spans over as many Python threads as the caller's
  intra-op count (:func:`redteam._omp.workers`, also while a rule holds torch at one; the
  kernels release the GIL); no OpenMP region is opened.

Results are the sorted values exactly (a sorting network only moves values), so they equal
numpy's sort bit for bit, except that −0.0 and +0.0 are ordered here (numpy leaves equal
values in any order): a median where both meet may differ in the sign of zero only.

Used where it pays and is available: CPU, float32 or float64, 2 ≤ n ≤ 256 rows, at least
:data:`MIN_VALUES` values, numba importable and able to compile the network (checked once per
dtype; a failure is said once as a warning), and ``REDTEAM_SORTNET`` not set to ``0``.
The first call in a new environment compiles the kernels (some seconds; numba caches them on
disk in a directory of the user's own, ``~/.cache/redteam/numba`` or ``$NUMBA_CACHE_DIR``, never
beside this file: a cache file is a pickle, see ``_numba_cache``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from redteam._omp import workers

#: below this many values (n·d) numpy's sort of transposed tiles is used: no compilation for
#: small inputs, and the tile set-up is not worth it there
MIN_VALUES = 1 << 20
#: the most rows the network takes (16 blocks of 16: the largest ``cascade`` kernel)
MAX_ROWS = 256
#: tiles of 64 columns loaded per pass over the rows: 2 KiB read from each row at a time
#: (interleaved timings at n = 100, d = 10⁶, 1 thread: 1 tile 99 ms, 4 tiles 93, 8 tiles 91, 16 tiles 95)
STRIPS = 8

_state: dict[str, Any] = {}


def _kernels() -> Any:
    """The compiled drivers (the module ``_sortnet_drivers``), or None without numba."""
    if "mod" not in _state:
        try:
            from . import _sortnet_drivers

            _state["mod"] = _sortnet_drivers
        except ImportError:
            _state["mod"] = None
    return _state["mod"]


def usable(x: Any, n: int, values: "int | None" = None) -> bool:
    """The network sorts ``n`` rows of ``x`` (a contiguous CPU torch tensor) here; ``values``: the
    size of the whole job (default n · columns), compared with :data:`MIN_VALUES`."""
    import torch

    if os.environ.get("REDTEAM_SORTNET", "1").strip() == "0":
        return False
    size = n * x.shape[1] if values is None else values
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and 2 <= n <= MAX_ROWS
            and size >= MIN_VALUES and x.is_contiguous() and _kernels() is not None and _compiled(x.dtype))


def _compiled(dtype: Any) -> bool:
    """numba is there and compiles (or loads) the network for this dtype: checked once per dtype
    on a 2 × 64 input, with float32's trimmed-mean and Bulyan drivers too (so a first call is one
    pause, said on stderr when it is long, and later ones none; one process at a time compiles:
    :func:`defenses._numba_cache.first_use`). A failure (an LLVM or platform problem, not a
    missing numba) is said once, as a RuntimeWarning, and the rules sort with numpy instead."""
    key = f"compiled:{dtype}"
    if key not in _state:
        k = _kernels()
        ok = k is not None
        if ok:
            import torch

            from ._numba_cache import first_use

            f32 = dtype == torch.float32
            first = [k.order_stats] + ([k.trimmed32, k.bulyan32] if f32 else [])
            try:
                with first_use(f"the sorting network for {str(dtype).replace('torch.', '')}", first):
                    order_statistics(torch.zeros(2, 64, dtype=dtype), (0,))
                    if f32:
                        trimmed_means32(torch.zeros(4, 64), 1, 0.0)
                        bulyan32(torch.zeros(5, 64), torch.arange(5), 3, 0, 64, torch.empty(64), 64)
            except Exception as e:  # noqa: BLE001 - any compile or run failure: fall back, say why
                import warnings

                warnings.warn(f"redteam: the compiled sorting network does not run here ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); the median, the trimmed mean and "
                              "Bulyan sort with numpy instead (REDTEAM_SORTNET=0 chooses that without this check)",
                              RuntimeWarning, stacklevel=3)
                ok = False
        _state[key] = ok
    return bool(_state[key])


def _constants(dtype: Any) -> tuple[Any, Any, Any, Any]:
    """(key dtype, float dtype, mask, key of +inf) for float32 / float64 data."""
    if dtype == np.float32:
        return np.int32, np.float32, np.int32(0x7FFFFFFF), np.int32(0x7F800000)
    return np.int64, np.float64, np.int64(0x7FFFFFFFFFFFFFFF), np.int64(0x7FF0000000000000)


def _blocks(n: int) -> tuple[int, int]:
    real = (n + 15) // 16
    nb = 1
    while nb < real:
        nb *= 2
    return real, nb


def _spans(d: int, threads: int) -> list[tuple[int, int]]:
    """Column spans, multiples of 64 wide, ~4 per thread (a descheduled thread holds up less)."""
    if threads <= 1:
        return [(0, d)]
    pieces = min(threads * 4, max(1, d // 4096))
    step = -(-d // pieces)
    step = -(-step // 64) * 64
    return [(s, min(s + step, d)) for s in range(0, d, step)]


def pool(threads: int) -> Any:
    """A shared executor of ``threads`` threads for the compiled kernels (they release the GIL):
    started once per process and thread count (starting threads on every call cost more than a
    median of 10⁷ values). Only leaf work may be submitted to it (nothing that waits on it)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    key = (os.getpid(), threads)  # a forked child has the object but not its threads
    with _state.setdefault("lock", threading.Lock()):
        if _state.get("pool_key") != key:
            _state["pool"] = ThreadPoolExecutor(threads, thread_name_prefix="redteam-sortnet")
            _state["pool_key"] = key
        return _state["pool"]


def _run(work: Any, spans: list[tuple[int, int]], threads: int) -> None:
    """``work(start, stop)`` for every span: here, or on the shared :func:`pool`."""
    if len(spans) == 1 or threads <= 1:
        for s in spans:
            work(*s)
        return
    for f in [pool(threads).submit(work, *s) for s in spans]:
        f.result()


def _prepare(x: Any, rows: Any) -> tuple[Any, Any, int, int, tuple[Any, ...]]:
    """(keys of x, flat; row indices, uint64; n; d; constants)."""
    import torch

    data = x.detach().numpy()
    consts = _constants(data.dtype)
    keys = data.reshape(-1).view(consts[0])
    if rows is None:
        idx = np.arange(data.shape[0], dtype=np.uint64)
    else:
        idx = rows.to(torch.int64).numpy().astype(np.uint64)
    return keys, idx, int(idx.shape[0]), int(data.shape[1]), consts


def _buffers(nb: int, consts: tuple[Any, ...]) -> Any:
    return np.empty(STRIPS * nb * 16 * 64, dtype=consts[0])


def order_statistics(x: Any, ranks: tuple[int, ...], rows: Any = None) -> Any:
    """``(len(ranks), d)`` tensor: row i holds every column's ``ranks[i]``-th smallest value
    (0-based) among the rows ``rows`` of ``x`` (all rows by default); NaN as +inf."""
    import torch

    k = _kernels()
    keys, idx, n, d, consts = _prepare(x, rows)
    real, nb = _blocks(n)
    wanted = np.array(ranks, dtype=np.uint64)
    last = np.zeros(nb, dtype=np.bool_)
    last[wanted // 16] = True
    out = torch.empty(len(ranks), d, dtype=x.dtype)
    out_keys = out.numpy().reshape(-1).view(consts[0])
    threads = workers()

    def work(start: int, stop: int) -> None:
        k.order_stats(keys, idx, np.uint64(d), wanted, last, out_keys, np.uint64(d), np.uint64(0), np.uint64(start),
                      np.uint64(stop), _buffers(nb, consts), np.uint64(nb), consts[2], consts[3])

    _run(work, _spans(d, threads), threads)
    return out


def sorted_rows(x: Any, rows: Any, start: int, stop: int, out: Any, threads: int = 1) -> None:
    """``out`` ``(n, stop − start)`` (a contiguous tensor) ← columns ``start … stop − 1`` of the rows
    ``rows`` of ``x`` (all rows if None), each column sorted ascending; NaN as +inf; on
    ``threads`` threads of :func:`pool`."""
    k = _kernels()
    keys, idx, n, d, consts = _prepare(x, rows)
    real, nb = _blocks(n)
    width = stop - start
    out_keys = out.numpy().reshape(-1).view(consts[0])
    every = np.arange(n, dtype=np.uint64)
    finish = np.ones(nb, dtype=np.bool_)

    def work(lo: int, hi: int) -> None:
        k.order_stats(keys, idx, np.uint64(d), every, finish, out_keys, np.uint64(width), np.uint64(start),
                      np.uint64(start + lo), np.uint64(start + hi), _buffers(nb, consts), np.uint64(nb),
                      consts[2], consts[3])

    _run(work, _spans(width, threads), threads)


def trimmed_means32(x: Any, b: int, slack: float) -> tuple[Any, Any]:
    """(means, settled) as ``defenses._common.trimmed_means32`` computes them for float32 ``x``
    (its docstring gives the test, which holds for any order of the additions)."""
    import torch

    k = _kernels()
    keys, idx, n, d, consts = _prepare(x, None)
    real, nb = _blocks(n)
    means = torch.empty(d, dtype=torch.float32)
    settled = torch.empty(d, dtype=torch.bool)
    means_np, settled_np = means.numpy(), settled.numpy()
    threads = workers()
    last = np.zeros(nb, dtype=np.bool_)
    last[[b // 16, (n - 1 - b) // 16]] = True  # the blocks of the cut points

    def work(start: int, stop: int) -> None:
        bufs = _buffers(nb, consts)
        k.trimmed32(keys, idx, np.uint64(d), np.uint64(b), means_np, settled_np, np.uint64(start),
                    np.uint64(stop), bufs, bufs.view(np.float32), np.uint64(nb), float(slack), last)

    _run(work, _spans(d, threads), threads)
    return means, settled


def bulyan32(x: Any, rows: Any, beta: int, start: int, stop: int, out: Any, chunk: int) -> Any:
    """``out[start:stop]`` ← Bulyan's coordinate phase on float32 ``x``'s rows ``rows``
    (:func:`defenses._sortnet_drivers.bulyan32`), on this thread, in one compiled call; a bool
    array, one entry per chunk of ``chunk`` columns from ``start``: False where the chunk must
    instead take torch's path (a spread not finite, or a mean whose float32 bits the bound cannot
    settle)."""
    k = _kernels()
    keys, idx, n, d, consts = _prepare(x, rows)
    real, nb = _blocks(n)
    flags = np.zeros((-(-(stop - start) // chunk), 2), dtype=np.int8)
    bufs = _buffers(nb, consts)
    k.bulyan32(keys, idx, np.uint64(d), np.uint64(beta), out.numpy(), flags, np.uint64(start),
               np.uint64(stop), bufs, bufs.view(np.float32), np.uint64(nb), np.uint64(chunk))
    return ~flags.any(axis=1)
