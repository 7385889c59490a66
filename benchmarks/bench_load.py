"""The robust aggregators on a shared machine: idle against two busy background processes, at 1
and 2 intra-op threads (issue 23 §2).

    python benchmarks/bench_load.py                   # n = 100, d = 10⁵ (a couple of minutes on 2 cores)
    python benchmarks/bench_load.py --d 1000000 --repeats 3
    python benchmarks/bench_load.py --rules median multi_krum --busy 2

For each rule and thread count the script times the rule on the same float32 input (n rows,
``torch.randn`` seeded 0) twice: with the machine as it is ("idle"), then beside ``--busy``
processes spinning ``while True: pass`` that it starts and stops itself (the way the project's
thread policy was measured). It reports the median wall time of the repeats in each state, the
ratio loaded ÷ idle, and what the CPU share explains: with B busy processes on C cores a
process running T threads gets about min(T, C·T / (T + B)) cores instead of min(T, C), so a
rule whose ratio is far above that bound loses time to waiting threads, not to the lost share.
That bound holds when nothing else runs: the busy processes are started in the caller's session
(with the kernel's autogroup scheduling on, its scheduling group), so on a machine where other
sessions are busy too the whole group gets less, and the column says less. The load average
before and after each state is printed, with a warning when the "idle" state was not idle.

OpenMP reads ``OMP_WAIT_POLICY`` once, when torch loads; ``import redteam`` sets it to
``PASSIVE`` unless it is set, so this script imports redteam first, and prints the policy the
runtime really runs under (``redteam._omp.policy_in_force``), not the variable's value.
Spinning waits, for comparison: ``OMP_WAIT_POLICY=ACTIVE python benchmarks/bench_load.py``.

Rules: ``median``, ``trimmed_mean`` (b = 10), ``krum`` and ``multi_krum`` (f = 10), ``bulyan``
(f = 10) and ``geometric_median``, called as a defense on the rows (``ServerContext.default``).
The 1-minute load average before each state, the CPU model and the versions are printed.
Nothing is asserted: this is a measurement.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Callable

import redteam  # noqa: F401  (before torch: OMP_WAIT_POLICY is read when torch loads)
import torch
from redteam import _omp

from _timing import cpu_name

RULES = ("median", "trimmed_mean", "krum", "multi_krum", "bulyan", "geometric_median")


def _rule(name: str, f: int) -> Callable[[torch.Tensor], object]:
    from redteam.registry import DEFENSES
    from redteam.types import ServerContext

    params = {"median": {}, "trimmed_mean": {"b": f}, "krum": {"f": f}, "multi_krum": {"f": f}, "bulyan": {"f": f},
              "geometric_median": {}}[name]
    rule = DEFENSES.create(name, params)

    def call(x: torch.Tensor) -> object:
        return rule(x, ServerContext.default(x))

    return call


def _times(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _share(threads: int, busy: int, cores: int) -> float:
    """The slowdown the CPU share explains: cores available idle ÷ cores got beside ``busy``."""
    idle = min(threads, cores)
    loaded = min(threads, cores * threads / (threads + busy))
    return idle / loaded


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def _autogroup() -> str:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return "on" if f.read().strip() == "1" else "off"
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="rows (clients) per call")
    ap.add_argument("--d", type=int, default=100_000, help="coordinates per row")
    ap.add_argument("--f", type=int, default=10, help="f of Krum, Multi-Krum and Bulyan; b of the trimmed mean")
    ap.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES, help="the rules to time")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="intra-op thread counts to time")
    ap.add_argument("--busy", type=int, default=2, help="busy background processes in the loaded state")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per rule, thread count and state")
    ap.add_argument("--states", nargs="+", default=["idle", "loaded"], choices=["idle", "loaded"],
                    help="which states to time (both by default)")
    args = ap.parse_args()

    cores = os.cpu_count() or 1
    x = torch.randn(args.n, args.d, generator=torch.Generator().manual_seed(0))
    calls = {r: _rule(r, args.f) for r in args.rules}
    print(f"n = {args.n}, d = {args.d}, float32; {cpu_name()}, {cores} cores; torch {torch.__version__}, "
          f"python {sys.version.split()[0]}")
    print(f"OpenMP wait policy in force: {_omp.policy_in_force()}; autogroup scheduling {_autogroup()}")
    if _omp.spinning():
        print(f"  (the robust rules run on redteam's own threads then; {_omp.ADVICE})")
    results: dict[tuple[str, int, str], list[float]] = {}
    for state in args.states:
        procs = []
        if state == "loaded":
            procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
            time.sleep(2.0)
        try:
            before = os.getloadavg()[0]
            print(f"{state}: before, {_load()}" + (f" ({args.busy} busy processes running)" if procs else ""))
            if state == "idle" and before > 0.5:
                print(f"  warning: the machine is not idle (load {before:.2f} before the 'idle' state): the "
                      "'share explains' column assumes it is, and the loaded state shares the machine too")
            for r in args.rules:
                for t in args.threads:
                    torch.set_num_threads(t)
                    results[(r, t, state)] = _times(lambda: calls[r](x), args.repeats)
            print(f"{state}: after, {_load()}")
        finally:
            for p in procs:
                p.kill()
                p.wait()
    print(f"\nOpenMP wait policy in force: {_omp.policy_in_force()}")
    print(f"{'rule':18} {'threads':>7} {'idle ms':>10} {'loaded ms':>10} {'loaded/idle':>12} {'share explains':>15}")
    for r in args.rules:
        for t in args.threads:
            ms = {s: statistics.median(results[(r, t, s)]) * 1e3 for s in args.states}
            idle, loaded = ms.get("idle"), ms.get("loaded")
            ratio = f"{loaded / idle:>11.2f}×" if idle and loaded else f"{'—':>12}"
            print(f"{r:18} {t:>7} {idle or float('nan'):>10.1f} {loaded or float('nan'):>10.1f} {ratio} "
                  f"{_share(t, args.busy, cores):>14.2f}×")


if __name__ == "__main__":
    main()
