"""Coordinate-wise median, trimmed mean and Bulyan's coordinate phase: the three kernels this
project has had, against the memory read floor and ByzFL (issue 23 §1).

    python benchmarks/bench_median.py                       # n = 100, d = 10⁶ and n = 100, d = 10⁵; 1 and 2 threads
    python benchmarks/bench_median.py --cases 100x1000000 --threads 1 --repeats 7 --byzfl

Every variant runs on the same float32 input (``torch.randn`` seeded 0), interleaved: each
repeat times every variant at every thread count in turn, so that a change in the machine's
load hits them all alike. Per variant: median, min and max wall time of the repeats (after
one warm-up call each), the median CPU time of the process (``time.process_time``: on a loaded
machine, closer to the work done than the wall time; at 2 threads it adds up both), and the
wall median over the read floor's at the same thread count.

* read floors, one pass over the input (what any coordinate-wise rule must at least read):
  ``x.sum()`` (the whole tensor, contiguous), ``x.sum(0)`` (per coordinate) and ``copy``
  (``buf.copy_(x)`` into a buffer allocated once); "× floor" divides by the fastest of the three.
* ``torch ops``: the bitonic network of ``torch.minimum`` / ``torch.maximum`` calls this file
  keeps a copy of (``old_*`` below: ``defenses/_common.py`` and ``defenses/median.py`` before
  issue 23, unchanged).
* ``numpy tiles``: the project's rules with ``REDTEAM_SORTNET=0``: transposed tiles sorted by
  numpy (x86-simd-sort).
* ``network``: the project's rules as they run by default: the bitonic network compiled by numba
  (``defenses/_sortnet.py``), 16 rows in vector registers per comparator; for Bulyan the window
  search and its mean compiled in the same pass (``defenses._common.closest_to_median_means``).
* ``torch.median(dim=0)``: the library's own (the lower median), for reference.
* ``--byzfl``: ByzFL's ``Median`` and ``TrMean`` (f = b) on the same input in the reference venv
  (``benchmarks/reference/setup.sh``; ``bench_aggregators.py``'s runner), timed in its own process
  with the same thread count, before the repeats on even cases and after them on odd ones.

The 1-minute load average (``os.getloadavg``) before and after, the CPU model and the versions are
printed; on a shared machine, compare rows of one run only. Before the timings, the results are
compared (``torch.equal``; the median's zeros may differ in sign where -0.0 and +0.0 meet in
the middle, which torch.equal counts as equal). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import cpu_name  # noqa: E402
from defenses._common import closest_to_median_means  # noqa: E402
from defenses.krum import _closest_to_median_mean  # noqa: E402
from defenses.median import coordinate_median, trimmed_mean  # noqa: E402


# -- the old kernel (defenses/_common.py and defenses/median.py before issue 23) ----------------
def old_bitonic(a: torch.Tensor, b: torch.Tensor, group: int) -> torch.Tensor:
    n_rows, c = a.shape
    src, dst = a, b
    size = 2
    while size <= group:
        j = size // 2
        while j >= 1:
            if size == group:
                v = src.view(n_rows // (2 * j), 2, j, c)
                w = dst.view(n_rows // (2 * j), 2, j, c)
                torch.minimum(v[:, 0], v[:, 1], out=w[:, 0])
                torch.maximum(v[:, 0], v[:, 1], out=w[:, 1])
            else:
                shape = (n_rows // (2 * size), 2, size // (2 * j), 2, j, c)
                v = src.view(shape)
                w = dst.view(shape)
                torch.minimum(v[:, 0, :, 0], v[:, 0, :, 1], out=w[:, 0, :, 0])
                torch.maximum(v[:, 0, :, 0], v[:, 0, :, 1], out=w[:, 0, :, 1])
                torch.maximum(v[:, 1, :, 0], v[:, 1, :, 1], out=w[:, 1, :, 0])
                torch.minimum(v[:, 1, :, 0], v[:, 1, :, 1], out=w[:, 1, :, 1])
            src, dst = dst, src
            j //= 2
        size *= 2
    return src


def old_pow2(k: int) -> int:
    return 1 << max(k - 1, 0).bit_length()


def old_chunk_columns(rows: int) -> int:
    return max(2048, min(16384, (1 << 20) // max(rows, 1)))


def old_sorted_groups(x: torch.Tensor, splits: tuple[int, ...], reduce: Callable[..., torch.Tensor],
                      out_dtype: torch.dtype | None, rows: torch.Tensor | None = None) -> torch.Tensor:
    d = x.shape[1]
    out = torch.empty(d, dtype=out_dtype or x.dtype, device=x.device)
    bounds = [0]
    for size in splits:
        bounds.append(bounds[-1] + size)
    group = old_pow2(max(splits))
    height = group * len(splits)
    c = old_chunk_columns(height)
    buf_a = torch.empty(height, c, dtype=x.dtype)
    buf_b = torch.empty(height, c, dtype=x.dtype)
    for start in range(0, d, c):
        width = min(c, d - start)
        a = buf_a if width == c else torch.empty(height, width, dtype=x.dtype)
        b = buf_b if width == c else torch.empty(height, width, dtype=x.dtype)
        for g, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            top = g * group
            dst = a[top:top + hi - lo]
            if rows is None:
                torch.nan_to_num(x[lo:hi, start:start + width], nan=math.inf, posinf=math.inf,
                                 neginf=-math.inf, out=dst)
            else:
                torch.index_select(x[:, start:start + width], 0, rows[lo:hi], out=dst)
                torch.nan_to_num(dst, nan=math.inf, posinf=math.inf, neginf=-math.inf, out=dst)
            if hi - lo < group:
                a[top + hi - lo:top + group].fill_(math.inf)
        s = old_bitonic(a, b, group) if group > 1 else a
        parts = [s[g * group:g * group + size] for g, size in enumerate(splits)]
        out[start:start + width] = reduce(*parts)
    return out


def old_sorted_reduce(x: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor],
                      rows: torch.Tensor | None = None) -> torch.Tensor:
    return old_sorted_groups(x, (x.shape[0] if rows is None else int(rows.numel()),), reduce, None, rows)


def old_halves_reduce(x: torch.Tensor, reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    n = x.shape[0]
    p = (n + 1) // 2
    if n - p == 0:
        return old_sorted_groups(x, (n,), lambda s: reduce(s, s[:0]), None)
    return old_sorted_groups(x, (p, n - p), reduce, None)


def old_kth_of_two(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
    p, q = a.shape[0], b.shape[0]
    i0, i1 = max(0, k - q + 1), min(k + 1, p)
    neg = torch.full_like(a[:1] if p else b[:1], -math.inf)
    a_pad = torch.cat([neg, a[:i1]])
    b_pad = torch.cat([neg, b[:k + 1 - i0]])
    terms = torch.maximum(a_pad[i0:i1 + 1], b_pad[k - i1 + 1:k - i0 + 2].flip(0))
    return terms.amin(dim=0)


def old_coordinate_median(updates: torch.Tensor, even_rule: str = "midpoint") -> torch.Tensor:
    n = updates.shape[0]
    k = (n - 1) // 2
    if n % 2 == 1 or even_rule == "lower":
        return old_halves_reduce(updates, lambda a, b: old_kth_of_two(a, b, k))
    return old_halves_reduce(updates, lambda a, b: 0.5 * old_kth_of_two(a, b, k) + 0.5 * old_kth_of_two(a, b, k + 1))


def old_trimmed_mean(updates: torch.Tensor, b: int) -> torch.Tensor:
    n = updates.shape[0]
    keep = n - 2 * b

    def reduce(lo_half: torch.Tensor, hi_half: torch.Tensor) -> torch.Tensor:
        if b == 0:
            total = lo_half.to(torch.float64).sum(dim=0) + hi_half.to(torch.float64).sum(dim=0)
            return total / keep
        lo = old_kth_of_two(lo_half, hi_half, b)
        hi = old_kth_of_two(lo_half, hi_half, n - 1 - b)
        total = torch.clamp(lo_half, lo, hi).to(torch.float64).sum(dim=0)
        total += torch.clamp(hi_half, lo, hi).to(torch.float64).sum(dim=0)
        total -= b * (lo.to(torch.float64) + hi.to(torch.float64))
        return total / keep

    return old_halves_reduce(updates, reduce)


# -- timing -------------------------------------------------------------------------------------
def bulyan_sizes(n: int) -> tuple[int, int]:
    """(θ, β) of Bulyan at n clients with bench_aggregators.py's f = min(n/10, ⌊(n − 3)/4⌋)."""
    f = max(min(n // 10, (n - 3) // 4), 0)
    return n - 2 * f, n - 4 * f


def numpy_tiles(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with the compiled network switched off (REDTEAM_SORTNET=0)."""
    def run() -> object:
        os.environ["REDTEAM_SORTNET"] = "0"
        try:
            return fn()
        finally:
            del os.environ["REDTEAM_SORTNET"]
    return run


def rules(x: torch.Tensor, b: int) -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    """(label, the project's rule, the copy of the rule before issue 23)."""
    theta, beta = bulyan_sizes(x.shape[0])
    sel = torch.arange(theta)
    return [
        ("median", lambda: coordinate_median(x), lambda: old_coordinate_median(x)),
        ("median lower", lambda: coordinate_median(x, "lower"), lambda: old_coordinate_median(x, "lower")),
        (f"trimmed mean b={b}", lambda: trimmed_mean(x, b), lambda: old_trimmed_mean(x, b)),
        (f"bulyan phase θ={theta} β={beta}",
         lambda: closest_to_median_means(x, sel, beta, lambda s: _closest_to_median_mean(s, beta)),
         lambda: old_sorted_reduce(x, lambda s: _closest_to_median_mean(s, beta), rows=sel)),
    ]


def variants(x: torch.Tensor, b: int) -> list[tuple[str, Callable[[], object]]]:
    buf = torch.empty_like(x)
    cells: list[tuple[str, Callable[[], object]]] = [
        ("floor: x.sum()", lambda: x.sum()),
        ("floor: x.sum(0)", lambda: x.sum(0)),
        ("floor: buf.copy_(x)", lambda: buf.copy_(x)),
        ("torch.median(dim=0)", lambda: torch.median(x, dim=0)),
    ]
    for label, new, old in rules(x, b):
        if label == "median lower":
            continue
        cells += [(f"{label}: torch ops", old), (f"{label}: numpy tiles", numpy_tiles(new)),
                  (f"{label}: network", new)]
    return cells


def same_results(x: torch.Tensor, b: int) -> str:
    out = []
    for label, new, old in rules(x, b):
        want = old()
        same = torch.equal(new(), want) and torch.equal(numpy_tiles(new)(), want)
        out.append(f"{label} {'same' if same else 'DIFFERENT'}")
    return ", ".join(out)


def byzfl_rows(n: int, d: int, b: int, threads: int, repeats: int) -> dict[str, dict]:
    """ByzFL's Median and TrMean (f = b) on this case's input, {label: timings}, or {}."""
    from bench_aggregators import run_byzfl  # noqa: E402  (next to this file)

    got = run_byzfl(["Median", f"TrMean:f={b}"], n, d, repeats, threads)
    return {("ByzFL Median" if k == "Median" else f"ByzFL TrMean f={b}"): v for k, v in got.items()}


def run_case(n: int, d: int, threads: list[int], repeats: int, b: int | None, byzfl: bool = False,
             odd: bool = False) -> None:
    x = torch.randn((n, d), generator=torch.Generator().manual_seed(0))
    b = n // 10 if b is None else b
    before = torch.get_num_threads()
    torch.set_num_threads(threads[0])
    print(f"\n## n = {n}, d = {d:,} float32 ({n * d * 4 / 1e6:.0f} MB); results: {same_results(x, b)}\n")
    cells = variants(x, b)
    times: dict[tuple[int, str], list[float]] = {}
    cpu: dict[tuple[int, str], list[float]] = {}
    load0 = os.getloadavg()[0]
    theirs: dict[int, dict[str, dict]] = {}
    if byzfl and not odd:
        theirs = {t: byzfl_rows(n, d, b, t, repeats) for t in threads}
    for t in threads:  # warm-up, once per variant and thread count
        torch.set_num_threads(t)
        for _, fn in cells:
            fn()
    for _ in range(repeats):
        for t in threads:
            torch.set_num_threads(t)
            for label, fn in cells:
                start, start_cpu = time.perf_counter(), time.process_time()
                fn()
                times.setdefault((t, label), []).append(time.perf_counter() - start)
                cpu.setdefault((t, label), []).append(time.process_time() - start_cpu)
    if byzfl and odd:
        theirs = {t: byzfl_rows(n, d, b, t, repeats) for t in threads}
    load1 = os.getloadavg()[0]
    torch.set_num_threads(before)
    print(f"load average (1 min) {load0:.2f} before, {load1:.2f} after; {repeats} repeats, interleaved\n")
    print("| threads | variant | wall median ms | min | max | CPU ms | × floor |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for t in threads:
        floor = min(statistics.median(times[(t, label)]) for label, _ in cells if label.startswith("floor"))
        for label, _ in cells:
            v = times[(t, label)]
            med = statistics.median(v)
            print(f"| {t} | {label} | {med * 1e3:.1f} | {min(v) * 1e3:.1f} | {max(v) * 1e3:.1f} | "
                  f"{statistics.median(cpu[(t, label)]) * 1e3:.1f} | {med / floor:.1f} |")
        for label, c in theirs.get(t, {}).items():  # another process: wall time only
            if "median" in c:
                print(f"| {t} | {label} (own process) | {c['median'] * 1e3:.1f} | {c['min'] * 1e3:.1f} | "
                      f"{c['max'] * 1e3:.1f} | | {c['median'] / floor:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=["100x1000000", "100x100000"],
                    help="n×d cases (default: 100x1000000 100x100000)")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="intra-op thread counts (default: 1 2)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per variant after a warm-up (default 5)")
    ap.add_argument("--b", type=int, default=None, help="trimmed mean's b (default n // 10)")
    ap.add_argument("--byzfl", action="store_true",
                    help="also time ByzFL's Median and TrMean on the same input (needs the venv of "
                         "benchmarks/reference/setup.sh; $REDTEAM_BENCH_VENV chooses where)")
    args = ap.parse_args()
    cases = []
    for c in args.cases:
        try:
            n, d = (int(v) for v in c.lower().split("x"))
        except ValueError:
            ap.error(f"--cases {c!r}: expected N×D, e.g. 100x1000000")
        cases.append((n, d))
    print(f"# bench_median: {cpu_name()} ({os.cpu_count()} logical CPUs), torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}), numpy {np.__version__}, Python {platform.python_version()}")
    byzfl = args.byzfl
    if byzfl:
        from bench_aggregators import DEFAULT_VENV  # noqa: E402

        venv = os.environ.get("REDTEAM_BENCH_VENV", DEFAULT_VENV)
        if not os.path.exists(os.path.join(venv, "bin", "python")):
            print(f"(ByzFL skipped: no venv at {venv}; build it with `bash benchmarks/reference/setup.sh`)")
            byzfl = False
    for i, (n, d) in enumerate(cases):
        run_case(n, d, args.threads, args.repeats, args.b, byzfl=byzfl, odd=i % 2 == 1)


if __name__ == "__main__":
    main()
