"""Time every built-in defense at n ∈ {10, 50, 100} clients and d ∈ {10⁴, 10⁶} on CPU.

    python benchmarks/bench_aggregators.py            # full table (a few minutes)
    python benchmarks/bench_aggregators.py --quick    # d = 10⁴ only
    python benchmarks/bench_aggregators.py --only krum,median --n 100 --d 1000000

Each cell is the median wall time of ``--repeats`` calls after one warm-up call, on
float32 updates drawn from N(0, 1) with a seeded generator. Robust rules that take f
use f = n // 10 (Bulyan needs n ≥ 4f + 3, so f = 1 at n = 10). On a shared machine,
intra-op threads fight other processes for the cores; ``--threads 1`` gives steadier
figures there. The "peak" column is
the largest resident-memory growth above the pre-call level (after handing freed heap
pages back with ``malloc_trim``) seen by a 1 ms sampler thread during the warm-up call
(d = 10⁶ only; MiB; a lower bound, the sampler can miss a short spike; the input
itself, n × d × 4 bytes, is not counted). Output is a markdown table on stdout.

Reference figures of a widely used Byzantine-robustness library (n = 100, d = 10⁶ float32,
this 2-core CPU machine; the project's speed targets): mean 27 ms, coordinate median
2.3 s, trimmed mean 2.3 s, Krum 0.72 s, geometric median (3 iterations) 1.3 s, centered
clipping 0.29 s; NNM ~31 GiB.

The first row, the float32 Gram matrix x·xᵀ (one matmul), is the floor of every rule that
needs all pairwise distances: they cannot be faster than it without skipping pairs.

``--byzfl`` also times ByzFL 0.0.11, the library a user would otherwise pick, on the same
inputs: ``benchmarks/reference/byzfl_timing.py`` (our script, next to this one) in the
reference venv (``$REDTEAM_BENCH_VENV``, default ``/tmp/redteam-bench-venv``, built by
``bash benchmarks/reference/setup.sh``), a subprocess; this project never imports ByzFL. Every
cell's input is ``torch.randn((n, d))`` from a generator seeded with 0, on both sides. Each of
our rows that ByzFL has is matched by exact name and arguments (``byzfl_spec``): Average,
Median, TrMean / Krum / MultiKrum / NNM+Average with our f = n // 10, GeometricMedian with our
ν = 1e-6 and our iteration count (T = 3 beside the 3-iteration row; beside the
to-convergence row, T = the iterations ours took on that input), CenteredClipping with our
τ = 10 and L. The two sides are interleaved cell by cell (ours first on even cells, ByzFL's
first on odd ones); one table per (n, d) gives both sides' min / median / max, the 1-minute
load average around each, ByzFL ÷ redteam of the medians, and our time over the Gram's. The
ratio is not printed where the two loads differ by more than ``--load-bound`` (default 0.5):
on a shared 2-core machine a ratio taken under different loads measures the load, not the
code.

Distance rules (Krum, Multi-Krum, Bulyan, NNM, FoolsGold) share ``defenses/_pairwise``:
float32 Gram blocks with a per-pair rounding bound, exact float64 work only for the
rows a decision cannot settle, so their time depends on how close the decision is
(Gaussian rows at d = 10⁶ put Multi-Krum's m-th and (m+1)-th scores ~1e-5 apart:
one float64 pass over the candidates' rows; Bulyan's iterative Krum and NNM's neighbour
sets need one float64 pass over every row).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

import torch

from defenses.basic import Mean
from defenses.clipping import CenteredClipping, Clip
from defenses.cosine import CosineFilter
from defenses.dp import DPNoise
from defenses.foolsgold import FoolsGold
from defenses.dnc import DnC
from defenses.flame import FLAME
from defenses.fldetector import FLDetector
from defenses.rlr import RLR
from defenses.signguard import SignGuard
from defenses.sparsefed import SparseFed
from defenses.fltrust import FLTrust
from defenses.geomed import GeometricMedian
from defenses.krum import Bulyan, Krum, MultiKrum
from defenses.median import Median, TrimmedMean
from defenses.mixing import NNM, Bucketing
from defenses.norm import NormBound
from defenses.sanity import Sanity, ZScore
from redteam.pipeline import Pipeline
from redteam.types import ServerContext


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc), so RSS growth measures this call."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_rss_growth(fn: Callable[[], object]) -> float:
    """Largest RSS growth (MiB) observed while ``fn`` runs, sampled every ms."""
    _release_free_memory()
    base = _rss_bytes()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.001)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    peak[0] = max(peak[0], _rss_bytes())
    return (peak[0] - base) / 2**20


def defenses_for(n: int) -> list[tuple[str, object]]:
    """(label, defense) pairs; labels are the same for every n (f = n // 10)."""
    f = n // 10
    fb = min(f, (n - 3) // 4)
    return [
        ("mean", Mean()),
        ("median", Median()),
        ("trimmed_mean (b = n/10)", TrimmedMean(b=f)),
        ("krum (f = n/10)", Krum(f=f)),
        ("multi_krum (f = n/10, m = n−f)", MultiKrum(f=f)),
        ("bulyan (f = n/10)", Bulyan(f=fb)),
        ("geometric_median (to convergence)", GeometricMedian()),
        ("geometric_median (3 iterations)", GeometricMedian(max_iter=3, tol=0.0)),
        ("centered_clipping (L = 1)", CenteredClipping(tau=10.0, n_iter=1)),
        ("centered_clipping (L = 3)", CenteredClipping(tau=10.0, n_iter=3)),
        ("nnm (f = n/10) → mean", NNM(f=f)),
        ("bucketing (s = 2) → median", Pipeline((Bucketing(s=2), Median()))),
        ("clip → mean", Clip(bound=1.0)),
        ("dp_noise", DPNoise(sigma=0.025)),
        ("norm_bound (reject, 2×median norm)", NormBound(multiplier=2.0, mode="reject")),
        ("cosine_filter (median reference)", CosineFilter(against="median", threshold=0.0)),
        ("sanity", Sanity()),
        ("zscore", ZScore()),
        ("fltrust", FLTrust()),
        ("foolsgold (first round)", FoolsGold()),
        ("dnc (f = n/10, b = 10⁴, 1 iteration)", DnC(f=f)),
        ("flame (λ = 0.001)", FLAME()),
        ("fldetector (window of 10 pairs full; peak includes building that state)", WarmFLDetector(FLDetector())),
        ("rlr (θ = ⌈2n/5⌉, the bare call)", RLR()),
        ("signguard (10 % of coordinates)", SignGuard()),
        ("sparsefed (L = 1, k = 1 % of d)", SparseFed()),
    ]


class WarmFLDetector:
    """FLDetector timed in a round after its warm-up: a synthetic state with a full window
    of (Δw, Δg) pairs and every client's previous update (built once per input shape)."""

    def __init__(self, detector: FLDetector) -> None:
        self.detector = detector
        self.key: tuple[int, int] | None = None
        self.extra: dict = {}

    def __call__(self, x: torch.Tensor, ctx: ServerContext):
        import dataclasses

        n, d = x.shape
        if self.key != (n, d):
            g = torch.Generator().manual_seed(1)
            m = self.detector.window
            state = {"ids": list(range(n)), "rows": x + 0.01 * torch.randn(n, d, generator=g),
                     "distances": {i: [1.0 / n] * (m - 1) for i in range(n)}, "flagged": {},
                     "s": 0.01 * torch.randn(m, d, generator=g), "y": 0.01 * torch.randn(m, d, generator=g),
                     "w_last": torch.zeros(d), "pending_dw": 0.01 * torch.randn(d, generator=g),
                     "g_last": 0.01 * torch.randn(d, generator=g)}
            self.extra = {"state": state, "global_params": 0.01 * torch.randn(d, generator=g),
                          "previous_update": 0.01 * torch.randn(d, generator=g)}
            self.key = (n, d)
        return self.detector(x, dataclasses.replace(ctx, **self.extra))


GRAM = "float32 Gram x·xᵀ (one matmul: the distance rules' floor)"

#: the reference scripts (our code) next to this file, and their venv (reference/setup.sh)
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference")
DEFAULT_VENV = "/tmp/redteam-bench-venv"


def byzfl_spec(label: str, n: int, gm_iterations: int) -> str | None:
    """The ByzFL aggregator (exact name and arguments, ``reference/byzfl_timing.py --agg``)
    that does the work of our row ``label`` at n clients, or None. Same f as ours (n // 10);
    the geometric median with our ν = 1e-6 and our iteration count (3, or what ours took to
    converge on this input); centered clipping with our τ = 10 and L."""
    f = n // 10
    return {
        "mean": "Average",
        "median": "Median",
        "trimmed_mean (b = n/10)": f"TrMean:f={f}",
        "krum (f = n/10)": f"Krum:f={f}",
        "multi_krum (f = n/10, m = n−f)": f"MultiKrum:f={f}",
        "geometric_median (to convergence)": f"GeometricMedian:T={gm_iterations},nu=1e-6",
        "geometric_median (3 iterations)": "GeometricMedian:T=3,nu=1e-6",
        "centered_clipping (L = 1)": "CenteredClipping:L=1,tau=10",
        "centered_clipping (L = 3)": "CenteredClipping:L=3,tau=10",
        "nnm (f = n/10) → mean": f"NNM+Average:f={f}",
    }.get(label)


def run_byzfl(specs: list[str], n: int, d: int, repeats: int, threads: int) -> dict[str, dict]:
    """ByzFL's timings of ``specs`` on this cell's input (same seed), from its own venv."""
    python = os.path.join(os.environ.get("REDTEAM_BENCH_VENV", DEFAULT_VENV), "bin", "python")
    if not specs:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "byzfl.json")
        cmd = [python, "byzfl_timing.py", "--n", str(n), "--d", str(d), "--seed", str(CELL_SEED),
               "--repeats", str(repeats), "--json", out, *(a for s in specs for a in ("--agg", s))]
        if threads:
            cmd += ["--threads", str(threads)]
        p = subprocess.run(cmd, cwd=REFERENCE, check=False, capture_output=True, text=True)
        if not os.path.exists(out):
            tail = (p.stderr or p.stdout).strip().splitlines()[-2:]
            print(f"# ByzFL n={n} d={d} wrote no results: {' / '.join(tail)}", file=sys.stderr)
            return {}
        with open(out) as fh:
            cells = json.load(fh).get("results", [])
    for c in cells:
        print(f"# ByzFL {c['agg']} n={n} d={d}: {_fmt(c['median']) if 'median' in c else c.get('error')}",
              file=sys.stderr, flush=True)
    return {c["agg"]: c for c in cells}


#: every cell's input is torch.randn((n, d)) from a generator seeded with this (ByzFL's too)
CELL_SEED = 0


def bench(names: list[str] | None, ns: list[int], ds: list[int], repeats_small: int, repeats_large: int,
          byzfl: bool = False, threads: int = 0) -> tuple[dict[str, dict[tuple[int, int], dict]], dict]:
    """Print the table; return per (label, (n, d)) our figures (min / median / max seconds, load
    before and after) and, with ``byzfl``, ByzFL's per (n, d) keyed by our label.

    With ``byzfl`` the two sides are interleaved cell by cell: on even cells ours run first,
    on odd cells ByzFL's (a subprocess in its venv) does, on the same input."""
    cols = [(n, d) for d in ds for n in ns]
    rows: dict[str, dict[tuple[int, int], str]] = {}
    secs: dict[str, dict[tuple[int, int], dict]] = {}
    theirs: dict[tuple[int, int], dict[str, dict]] = {}
    for ci, (n, d) in enumerate(cols):
        gen = torch.Generator().manual_seed(CELL_SEED)
        x = torch.randn((n, d), generator=gen)
        g0 = x.mean(dim=0) + 0.1 * torch.randn(d, generator=gen)
        ctx = ServerContext.default(x, root_update=lambda g0=g0: g0)
        repeats = repeats_small if d < 10**6 else repeats_large
        gram = (GRAM, lambda x, ctx: x @ x.T)
        chosen = [(label, dfn) for label, dfn in [gram, *defenses_for(n)]
                  if not names or label.split(" ")[0] in names or label == GRAM]

        def ours() -> None:
            for label, dfn in chosen:
                call = lambda dfn=dfn, x=x, ctx=ctx: dfn(x, ctx)  # noqa: E731
                load0 = os.getloadavg()[0]
                if d >= 10**6:
                    peak = peak_rss_growth(call)
                else:
                    call()
                    peak = None
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t0)
                med = statistics.median(times)
                cell = _fmt(med)
                if peak is not None:
                    cell += f" / {peak:.0f} MiB"
                rows.setdefault(label, {})[(n, d)] = cell
                secs.setdefault(label, {})[(n, d)] = {"min": min(times), "median": med, "max": max(times),
                                                      "load_before": load0, "load_after": os.getloadavg()[0]}
                print(f"# {label} n={n} d={d}: {cell}", file=sys.stderr, flush=True)

        def reference() -> None:
            gm = GeometricMedian()(x, ctx).state.get("iterations", 0)  # untimed: our iteration count here
            specs = {label: byzfl_spec(label, n, max(1, int(gm))) for label, _ in chosen}
            specs = {k: v for k, v in specs.items() if v}
            got = run_byzfl(sorted(set(specs.values())), n, d, repeats, threads)
            theirs[(n, d)] = {label: {"spec": spec, **got.get(spec, {"error": "no result"})}
                              for label, spec in specs.items()}

        for side in ((ours, reference) if ci % 2 == 0 else (reference, ours)) if byzfl else (ours,):
            side()
        del x
    header = "| defense | " + " | ".join(f"n={n}, d=10^{len(str(d)) - 1}" for n, d in cols) + " |"
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, float32, CPU; "
          "cell = median wall time (d=10^6: / peak RSS growth)\n")
    print(header)
    print("|" + "---|" * (len(cols) + 1))
    for label, cells in rows.items():
        print(f"| {label} | " + " | ".join(cells.get(c, "") for c in cols) + " |")
    return secs, theirs


def _fmt(sec: float) -> str:
    return f"{sec * 1e3:.1f} ms" if sec < 1 else f"{sec:.2f} s"


def _spread(c: dict) -> str:
    return f"{_fmt(c['min'])} / {_fmt(c['median'])} / {_fmt(c['max'])}"


def _load(c: dict) -> float:
    return (c["load_before"] + c["load_after"]) / 2


def side_by_side(secs: dict[str, dict[tuple[int, int], dict]], theirs: dict, cols: list[tuple[int, int]],
                 bound: float) -> None:
    """One table per (n, d): our rule and ByzFL's (min / median / max), the load average around
    each, ByzFL ÷ redteam where the two loads differ by at most ``bound``, our time over the Gram's."""
    for n, d in cols:
        g = secs.get(GRAM, {}).get((n, d))
        print(f"\nn = {n}, d = {d:,}: side by side, interleaved (float32 Gram x·xᵀ = "
              f"{_fmt(g['median']) if g else '-'}; min / median / max; load = mean of the 1-minute load "
              "average before and after)\n")
        print("| rule | redteam | ByzFL (exact name) | ByzFL | ByzFL ÷ redteam (medians) | load redteam / ByzFL "
              "| redteam / Gram |")
        print("|---|---|---|---|---|---|---|")
        for label, cells in secs.items():
            if label == GRAM or (n, d) not in cells:
                continue
            ours = cells[(n, d)]
            ref = theirs.get((n, d), {}).get(label)
            spec = ref["spec"] if ref else "-"
            their, ratio, loads = "-", "-", f"{_load(ours):.2f} / -"
            if ref and "median" in ref:
                their = _spread(ref)
                loads = f"{_load(ours):.2f} / {_load(ref):.2f}"
                if abs(_load(ours) - _load(ref)) > bound:
                    ratio = f"not printed (loads differ by > {bound:g})"
                else:
                    ratio = f"{ref['median'] / ours['median']:.2f}×"
            elif ref:
                their = str(ref.get("error", "-"))[:70]
            over = f"{ours['median'] / g['median']:.2f}×" if g else "-"
            print(f"| {label} | {_spread(ours)} | {spec} | {their} | {ratio} | {loads} | {over} |")


def gram_variants(n: int, d: int, repeats: int = 5) -> None:
    """The one float32 product x·xᵀ against products that exploit its symmetry by splitting
    the rows in p parts and computing only the p(p+1)/2 blocks on and below the diagonal
    (fewer flops, smaller products)."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0))

    def split(parts: int) -> Callable[[], object]:
        size = -(-n // parts)

        def call() -> torch.Tensor:
            g = torch.empty(n, n)
            for p in range(parts):
                rows_p = x[p * size:(p + 1) * size]
                for q in range(p + 1):
                    g[p * size:(p + 1) * size, q * size:(q + 1) * size] = rows_p @ x[q * size:(q + 1) * size].T
            return g
        return call

    print(f"\nfloat32 Gram of ({n}, {d:,}) rows, {torch.get_num_threads()} threads (min of {repeats}):\n")
    print("| product | flops | time |\n|---|---|---|")
    for parts in (1, 2, 4):
        call = split(parts)
        call()
        best = min(_timed(call) for _ in range(repeats))
        share = (parts * (parts + 1) / 2) / parts**2
        k = parts * (parts + 1) // 2
        print(f"| rows in {parts} part{'s' if parts > 1 else ''} ({k} product{'s' if k > 1 else ''}) | "
              f"{share:.0%} | {_fmt(best)} |")
    # Krum against the Gram, interleaved call by call (both see the same moments of the machine)
    ctx = ServerContext.default(x)
    krum = Krum(f=n // 10)
    krum(x, ctx)
    gram_t, krum_t = [], []
    for _ in range(repeats):
        gram_t.append(_timed(lambda: x @ x.T))
        krum_t.append(_timed(lambda: krum(x, ctx)))
    g, k = statistics.median(gram_t), statistics.median(krum_t)
    print(f"\ninterleaved, medians of {repeats}: Gram {_fmt(g)}, Krum (f = n/10) {_fmt(k)}: {k / g:.2f}× the Gram "
          f"(load {os.getloadavg()[0]:.1f})")


def _timed(call: Callable[[], object]) -> float:
    t = time.perf_counter()
    call()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="d = 10^4 only")
    ap.add_argument("--only", default="", help="comma-separated registry-style names (first word of the label)")
    ap.add_argument("--n", default="10,50,100")
    ap.add_argument("--d", default="10000,1000000")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per cell at d = 10^6 (7 at smaller d)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--byzfl", action="store_true",
                    help="also time ByzFL's matching rules on the same inputs, interleaved cell by cell "
                         "(benchmarks/reference/byzfl_timing.py in its venv, a subprocess)")
    ap.add_argument("--load-bound", type=float, default=0.5,
                    help="largest difference of the two sides' load averages for which ByzFL ÷ redteam is printed")
    ap.add_argument("--gram-variants", action="store_true",
                    help="only time the Gram matrix as one product and split to exploit its symmetry")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ds = [10**4] if args.quick else [int(v) for v in args.d.split(",")]
    names = [s for s in args.only.split(",") if s] or None
    ns = [int(v) for v in args.n.split(",")]
    if args.gram_variants:
        gram_variants(ns[-1], ds[-1])
        return
    byzfl = args.byzfl
    python = os.path.join(os.environ.get("REDTEAM_BENCH_VENV", DEFAULT_VENV), "bin", "python")
    if byzfl and not os.path.exists(python):
        print(f"(ByzFL skipped: no venv at {os.path.dirname(os.path.dirname(python))}; build it with "
              "`bash benchmarks/reference/setup.sh` ($REDTEAM_BENCH_VENV chooses where))")
        byzfl = False
    print(f"load average {os.getloadavg()[0]:.2f} at start", file=sys.stderr)
    secs, theirs = bench(names, ns, ds, 7, args.repeats, byzfl=byzfl, threads=args.threads)
    if byzfl:
        side_by_side(secs, theirs, [(n, d) for d in ds for n in ns], args.load_bound)


if __name__ == "__main__":
    main()
