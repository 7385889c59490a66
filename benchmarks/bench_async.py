"""The asynchronous server beside the synchronous round of the same scenario: wall time per server
step and per client update merged.

    python benchmarks/bench_async.py                         # scenarios/async.toml's base, 1 thread
    python benchmarks/bench_async.py --clients 100 --k 10    # more clients, another buffer
    python benchmarks/bench_async.py --steps 40 --repeats 3 --threads 2

Both runs are built from ``scenarios/async.toml`` without its ``[matrix]`` (digits, MLP 64-64-10,
``--clients`` clients (20), 5 local steps of batch 16, no attack, the ``mean`` defense):

* **sync**: the scenario without ``[async]`` (:class:`redteam.federation.loop.Federation`): each
  round every client trains (one batched call over all of them), then encode, chunk, transport,
  verify, merge, server step, evaluate. ``--steps`` rounds.
* **async**: the scenario with ``[async] buffer_size = --k`` (5)
  (:class:`redteam.federation.asyncrun.AsyncRun`): ``--steps`` server steps of K updates each
  (the event simulation, one batched training call per model version — about K clients each —
  the defense over the buffer, the server step, evaluate).
* **async, K = n, equal times**: ``[async] buffer_size`` = every client and σ = 0 for compute,
  links and jitter: the setting in which the asynchronous run is the synchronous one, update for
  update (``tests/test_async.py``); it measures the regime's own overhead against the sync loop
  doing the same arithmetic.

Each way: one untimed warm-up run, then the median of ``--repeats`` timed ``run()`` calls, each on a
freshly built run object (construction untimed). The table gives seconds per step and client
updates merged per second (sync: clients × rounds; async: K × steps). The two regimes do different
work per step (a sync round merges n updates, an async step K), so the per-update rate is the
comparable figure. Nothing is asserted.

Measured
--------
See docs/regimes.md, "Asynchronous server", for the figures measured on this machine.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import cpu_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import statistics

    import torch

    from redteam.federation.loop import Federation
    from redteam.federation.regimes import make_run
    from redteam.scenario import parse_scenario

    torch.set_num_threads(args.threads)
    root = Path(__file__).resolve().parent.parent
    with open(root / "scenarios" / "async.toml", "rb") as f:
        doc = tomllib.load(f)
    for key in ("matrix", "expect"):
        doc.pop(key, None)
    doc["attack"] = {"name": "none"}
    doc["defense"] = {"name": "mean"}
    doc["federation"].update(clients=args.clients, rounds=args.steps, malicious_fraction=0.0)
    base = {k: v for k, v in doc.items() if k != "async"}
    asyn = copy.deepcopy(doc)
    asyn["async"]["buffer_size"] = args.k
    equal = copy.deepcopy(doc)
    equal["async"].update(buffer_size=args.clients, jitter=0.0)
    equal["transport"] = {"network": {"compute_sigma": 0.0, "bandwidth_sigma": 0.0, "latency_sigma": 0.0}}
    base_equal = {k: v for k, v in equal.items() if k != "async"}

    ways = [
        ("sync", lambda: Federation(parse_scenario(base)), args.clients),
        (f"async, K = {args.k}", lambda: make_run(parse_scenario(asyn)), args.k),
        ("sync, equal times", lambda: Federation(parse_scenario(base_equal)), args.clients),
        (f"async, K = n = {args.clients}, equal times", lambda: make_run(parse_scenario(equal)), args.clients),
    ]
    for _, build, _ in ways:  # warm-up
        build().run()
    times: dict[str, list[float]] = {name: [] for name, _, _ in ways}
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits every way
        for name, build, _ in ways:
            run = build()
            t = time.perf_counter()
            run.run()
            times[name].append(time.perf_counter() - t)
    print(f"{cpu_name()}, torch {torch.__version__}, {args.threads} thread(s); {args.clients} clients, "
          f"{args.steps} steps, median of {args.repeats}")
    print("| way | s / run | ms / step | updates merged / s |")
    print("|---|---|---|---|")
    for name, _, per_step in ways:
        s = statistics.median(times[name])
        print(f"| {name} | {s:.3f} | {1000 * s / args.steps:.1f} | {per_step * args.steps / s:.0f} |")


if __name__ == "__main__":
    main()
