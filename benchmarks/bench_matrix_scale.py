"""A 1,000-run scenario matrix (attacks × defenses × malicious fractions × seeds) on the
process executor and on a local Ray instance, side by side, in the same run (issue 13 §3).

    python benchmarks/bench_matrix_scale.py                       # 1,000 attacked runs + 200 baselines
    python benchmarks/bench_matrix_scale.py --seeds 2             # 200 attacked runs (a quick look)
    python benchmarks/bench_matrix_scale.py --executors process   # without Ray

The matrix: 5 attacks (sign_flip, gaussian, alie, ipm, min_max) × 5 defenses (mean,
median, trimmed_mean, multi_krum, norm_bound) × 4 malicious fractions (0.1 … 0.4) × ``--seeds``
seeds (10: 1,000 attacked runs). In redteam's terms a *cell* is one (attack, defense,
malicious fraction) combination (100 of them) and each runs once per seed; every run also
needs its no-attack baseline (one per defense × fraction × seed, shared by the attacks:
200 more runs). One run is a tiny federation: ``synthetic`` (logistic regression, d = 84),
10 clients, ``--rounds`` rounds (2) of 5 local steps, dense codec, the simulated network.

Each executor writes its own results store (SQLite, the same format ``redteam matrix``
writes); the script checks that both stores hold the same results (timings aside) and
prints runs per second for each. Nothing is asserted in a test: this is a measurement.

The same matrix on a multi-node Ray cluster (results in the same kind of store, written
by the driver)::

    ray start --head                                   # on the head node
    ray start --address HEAD:6379                      # on each worker node
    redteam matrix FILE.toml --out results/big --executor ray --ray-address HEAD:6379

(``--ray-address auto`` joins the cluster this machine is already part of.) The script
writes FILE.toml with ``--write-scenario PATH`` so that command can be run as it is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

ATTACKS = ['{ name = "sign_flip", scale = 4.0, label = "sign_flip" }', '{ name = "gaussian", std = 1.0, label = "gaussian" }',
           '"alie"', '{ name = "ipm", epsilon = 0.5, label = "ipm" }', '"min_max"']
DEFENSES = ['"mean"', '"median"', '{ name = "trimmed_mean", b = 2, label = "trimmed_mean" }',
            '{ name = "multi_krum", f = 2, label = "multi_krum" }',
            '{ name = "norm_bound", multiplier = 2.0, mode = "reject", label = "norm_bound" }']
FRACTIONS = [0.1, 0.2, 0.3, 0.4]


def scenario(seeds: int, rounds: int) -> str:
    return f"""# written by benchmarks/bench_matrix_scale.py
[scenario]
name = "matrix-scale"
seed = 0
description = "{len(ATTACKS)} attacks x {len(DEFENSES)} defenses x {len(FRACTIONS)} malicious fractions x {seeds} seeds"

[workload]
name = "synthetic"

[federation]
clients = 10
malicious_fraction = 0.2
rounds = {rounds}
partition = "iid"
local_steps = 5
batch_size = 16
lr = 0.1

[transport]
codec = "none"

[attack]
name = "sign_flip"

[defense]
name = "mean"

[matrix]
attacks = [{", ".join(ATTACKS)}]
defenses = [{", ".join(DEFENSES)}]
seeds = {seeds}

[matrix.settings]
"federation.malicious_fraction" = {FRACTIONS}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--executors", nargs="+", default=["process", "ray"], choices=("local", "process", "ray"))
    ap.add_argument("--write-scenario", metavar="PATH", help="also write the matrix's scenario file here")
    args = ap.parse_args()

    from redteam.runner.matrix_run import run_matrix
    from redteam.runner.store import ResultsStore

    tmp = Path(tempfile.mkdtemp(prefix="bench-matrix-"))
    try:
        path = tmp / "matrix.toml"
        path.write_text(scenario(args.seeds, args.rounds))
        if args.write_scenario:
            shutil.copyfile(path, args.write_scenario)
        attacked = len(ATTACKS) * len(DEFENSES) * len(FRACTIONS) * args.seeds
        baselines = len(DEFENSES) * len(FRACTIONS) * args.seeds
        print(f"{attacked} attacked runs + {baselines} baselines = {attacked + baselines} runs; "
              f"{args.workers} workers on {os.cpu_count()} cores\n")
        print("| executor | runs | wall s | runs / s | load avg (start → end) |")
        print("|---|---|---|---|---|")
        dumps = {}
        for ex in args.executors:
            out = tmp / f"store-{ex}"
            load0 = os.getloadavg()[0]
            t = time.perf_counter()
            summary = run_matrix(path, out, executor=ex, workers=args.workers)
            wall = time.perf_counter() - t  # includes starting the pool / the Ray instance
            print(f"| {ex} | {summary.computed} | {wall:.1f} | {summary.computed / wall:.1f} | "
                  f"{load0:.1f} → {os.getloadavg()[0]:.1f} |", flush=True)
            store = ResultsStore(out)
            try:
                dumps[ex] = store.canonical_dump()
            finally:
                store.close()
        if len(dumps) > 1:
            first, *rest = dumps
            same = all(dumps[first] == dumps[ex] for ex in rest)
            print(f"\nresults identical across executors (timings aside): {'yes' if same else 'NO'} "
                  f"({len(dumps[first])} runs compared)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
