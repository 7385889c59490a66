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

Reference figures from DESIGN.md (a widely used library, n = 100, d = 10⁶, this
machine): mean 27 ms, coordinate median 2.3 s, trimmed mean 2.3 s, Krum 0.72 s,
geometric median (3 iterations) 1.3 s, centered clipping 0.29 s; NNM ~31 GiB.

The first row, the float32 Gram matrix x·xᵀ (one matmul), is the floor of every rule that
needs all pairwise distances: they cannot be faster than it without skipping pairs.

``--byzfl`` also runs that library's timing script (``bench_byzfl.py`` in the reference-bench
directory named by ``$PA_REFERENCE_DIR``; not part of this repository) in its own virtual environment (``$PA_VENV``, default ``pa-venv`` in
the temp dir; built by ``setup.sh`` there) as a subprocess, right after our cells, and
prints, per (n, d), one side-by-side table: our rule, ByzFL's, their ratio, and
our time over the Gram's. The two sets of figures come from the same minutes of the same
machine. This project never imports it. (ByzFL's script uses f = n // 5; for the rules
timed here the work does not depend on f.)

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


def bench(names: list[str] | None, ns: list[int], ds: list[int], repeats_small: int, repeats_large: int
          ) -> dict[str, dict[tuple[int, int], float]]:
    """Print the table; return the median seconds per (label, (n, d))."""
    gen = torch.Generator().manual_seed(0)
    cols = [(n, d) for d in ds for n in ns]
    rows: dict[str, dict[tuple[int, int], str]] = {}
    secs: dict[str, dict[tuple[int, int], float]] = {}
    for d in ds:
        for n in ns:
            x = torch.randn(n, d, generator=gen)
            g0 = x.mean(dim=0) + 0.1 * torch.randn(d, generator=gen)
            ctx = ServerContext.default(x, root_update=lambda g0=g0: g0)
            repeats = repeats_small if d < 10**6 else repeats_large
            gram = (GRAM, lambda x, ctx: x @ x.T)
            for label, dfn in [gram, *defenses_for(n)]:
                key = label.split(" ")[0]
                if names and key not in names and label != GRAM:
                    continue
                call = lambda dfn=dfn, x=x, ctx=ctx: dfn(x, ctx)  # noqa: E731
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
                cell = f"{med * 1e3:.1f} ms" if med < 1 else f"{med:.2f} s"
                if peak is not None:
                    cell += f" / {peak:.0f} MiB"
                rows.setdefault(label, {})[(n, d)] = cell
                secs.setdefault(label, {})[(n, d)] = med
                print(f"# {label} n={n} d={d}: {cell}", file=sys.stderr, flush=True)
            del x
    header = "| defense | " + " | ".join(f"n={n}, d=10^{len(str(d)) - 1}" for n, d in cols) + " |"
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, float32, CPU; "
          "cell = median wall time (d=10^6: / peak RSS growth)\n")
    print(header)
    print("|" + "---|" * (len(cols) + 1))
    for label, cells in rows.items():
        print(f"| {label} | " + " | ".join(cells.get(c, "") for c in cols) + " |")
    return secs


def _fmt(sec: float) -> str:
    return f"{sec * 1e3:.1f} ms" if sec < 1 else f"{sec:.2f} s"


#: the reference-bench directory (ByzFL's timing script, its setup.sh): $PA_REFERENCE_DIR, outside the repository
REFERENCE = os.environ.get("PA_REFERENCE_DIR", "")
BYZFL_NAMES = {"mean": "Average", "median": "Median", "trimmed_mean": "TrMean", "krum": "Krum",
               "multi_krum": "MultiKrum", "geometric_median": "GeometricMedian",
               "centered_clipping": "CenteredClipping", "nnm": "NNM"}


#: our label's first word → (ByzFL aggregator name, a substring its variant must contain)
BYZFL_PAIRS = {"mean": ("Average", ""), "median": ("Median", ""), "trimmed_mean": ("TrMean", ""),
               "krum": ("Krum", ""), "multi_krum": ("MultiKrum", ""),
               "geometric_median": ("GeometricMedian", "T=3"), "centered_clipping": ("CenteredClipping", "L=1"),
               "nnm": ("NNM", "")}
#: which of our rows a ByzFL figure stands beside (same iterations / same L)
BYZFL_ROW = {"geometric_median": "geometric_median (3 iterations)", "centered_clipping": "centered_clipping (L = 1)"}


def run_byzfl(names: list[str] | None, ns: list[int], ds: list[int]) -> list[dict] | None:
    """The reference library's timings for the same cells, from its own venv (if built)."""
    venv = os.environ.get("PA_VENV", os.path.join(tempfile.gettempdir(), "pa-venv"))
    python = os.path.join(venv, "bin", "python")
    if not REFERENCE or not os.path.isdir(REFERENCE):
        print("\n(ByzFL skipped: set PA_REFERENCE_DIR to the reference-bench directory that holds bench_byzfl.py)")
        return None
    if not os.path.exists(python):
        print(f"\n(ByzFL: no venv at {venv}; build it with `bash {REFERENCE}/setup.sh`)")
        return None
    aggs = sorted({BYZFL_NAMES[k] for k in (names or BYZFL_NAMES) if k in BYZFL_NAMES})
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "byzfl.json")
        cmd = [python, "bench_byzfl.py", "--backends", "torch", "--n", *map(str, ns), "--d", *map(str, ds),
               "--json", out]
        if aggs:
            cmd += ["--aggs", *aggs]
        print("\nByzFL, same machine, just after (its own venv, a subprocess; f = n // 5 there):\n", flush=True)
        subprocess.run(cmd, cwd=REFERENCE, check=False, stdout=subprocess.DEVNULL)
        if not os.path.exists(out):
            print("(ByzFL's timing script wrote no results)")
            return None
        with open(out) as fh:
            return json.load(fh).get("results", [])


def side_by_side(secs: dict[str, dict[tuple[int, int], float]], byzfl: list[dict] | None,
                 cols: list[tuple[int, int]]) -> None:
    """One table per (n, d): our rule, ByzFL's, their ratio, and our time over the Gram's."""
    for n, d in cols:
        gram = secs.get(GRAM, {}).get((n, d))
        print(f"\nn = {n}, d = {d:,}: side by side (float32 Gram x·xᵀ = {_fmt(gram) if gram else '-'})\n")
        print("| rule | redteam | ByzFL | ByzFL / redteam | redteam / Gram |")
        print("|---|---|---|---|---|")
        for label, cells in secs.items():
            if label == GRAM or (n, d) not in cells:
                continue
            ours = cells[(n, d)]
            key = label.split(" ")[0]
            ref = "-"
            ratio = "-"
            if byzfl is not None and key in BYZFL_PAIRS and BYZFL_ROW.get(key, label) == label:
                name, variant = BYZFL_PAIRS[key]
                for cell in byzfl:
                    if (cell.get("agg", "").split("(")[0] == name and variant in cell.get("agg", "")
                            and cell.get("n") == n and cell.get("d") == d):
                        if "median" in cell:
                            ref, ratio = _fmt(cell["median"]), f"{cell['median'] / ours:.1f}×"
                        else:
                            ref = str(cell.get("error", "-"))[:60]
                        break
            over = f"{ours / gram:.2f}×" if gram else "-"
            print(f"| {label} | {_fmt(ours)} | {ref} | {ratio} | {over} |")


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
    ap.add_argument("--byzfl", action="store_true", help="then time ByzFL on the same cells (its venv, a subprocess)")
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
    secs = bench(names, ns, ds, 7, args.repeats)
    byzfl = run_byzfl(names, ns, ds) if args.byzfl else None
    side_by_side(secs, byzfl, [(n, d) for d in ds for n in ns])


if __name__ == "__main__":
    main()
