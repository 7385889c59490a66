"""What running a redteam cell through Flower costs beside running it natively: one attacked cell
(sign flip ×4 by 2 of 10 clients against the trimmed mean, b = 2) of the digits federation, in
redteam's own engine and in Flower's simulation engine (Ray) through redteam's Flower integration
(``DefenseStrategy`` + ``AttackMod``, examples/flower_quickstart), measured interleaved in one
process (issue 38).

    python benchmarks/bench_flower_engine.py                     # 10 clients, 5 rounds, 3 passes
    python benchmarks/bench_flower_engine.py --clients 10 --rounds 5 --reps 3

Needs Flower (``pip install "redteam[flower]"``). **One federation shape**, two trainers: the
scenario of :func:`bench_vs_flower.scenario_doc` (scikit-learn's digits, MLP 64-64-10, 10 local SGD
steps of batch 16 at lr 0.1, Dirichlet(0.5) label skew there, Dirichlet(1.0) in the example) with
that cell's attack and defense and codec ``none``; the Flower side is the example app with the
same model, steps, batch and learning rate. The two do the same amount of training per round, not
the same arithmetic (their partitions and batches differ), so accuracies are printed but not
compared.

Per pass and side: the **cell** wall time (redteam: ``Federation`` built and run, evaluation every
round; Flower: ``run_simulation`` called to returned, Ray's start and stop included), and the
**steady round** (rounds 2..R: redteam's ``RoundRecord.wall_time_s``; Flower's time between two
server-side evaluations). The ratios Flower ÷ redteam are per pass, then the median over passes;
passes alternate the order of the sides, and the 1-minute load average is printed before each
run. The first pass of redteam's side includes compiling its sorting network (numba) and Flower's
its imports in the Ray actors; the medians are over all passes. Nothing here is asserted; the
machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "flower_quickstart"))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from _timing import cpu_name  # noqa: E402
from bench_vs_flower import scenario_doc  # noqa: E402


def native(clients: int, rounds: int, f: int, seed: int) -> dict:
    import torch

    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    doc = scenario_doc(clients, rounds, seed)
    doc["federation"]["malicious_fraction"] = f / clients
    doc["attack"] = {"name": "sign_flip", "scale": 4.0}
    doc["defense"] = {"name": "trimmed_mean", "b": f}
    torch.set_num_threads(1)
    t = time.perf_counter()
    res = Federation(parse_scenario(doc), device="cpu").run()
    wall = time.perf_counter() - t
    steady = [r.wall_time_s for r in res.records[1:]]
    return {"cell_s": wall, "round_s": statistics.median(steady), "accuracy": res.records[-1].accuracy}


def flower(clients: int, rounds: int, f: int, seed: int, ray_cpus: int) -> dict:
    import quickstart_app as Q

    setup = Q.Setup(clients=clients, rounds=rounds, seed=seed, local_steps=10, batch=16, lr=0.1)
    t = time.perf_counter()
    out = Q.run(setup, "trimmed_mean", {"b": f}, "sign_flip", {"scale": 4.0}, malicious=tuple(range(f)),
                ray_cpus=ray_cpus)
    wall = time.perf_counter() - t
    steady = [b - a for a, b in zip(out.times[1:], out.times[2:])]
    return {"cell_s": wall, "round_s": statistics.median(steady), "accuracy": out.accuracy[-1],
            "startup_s": out.times[1] - t}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--malicious", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ray-cpus", type=int, default=2, help="Ray CPUs (one ClientApp actor each)")
    args = ap.parse_args(argv)
    if args.rounds < 3:
        raise SystemExit("--rounds must be ≥ 3 (rounds 2..R are the steady ones)")
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {args.clients} clients ({args.malicious} malicious), "
          f"{args.rounds} rounds, {args.reps} passes", flush=True)
    rows = []
    for rep in range(args.reps):
        sides = [("redteam", lambda: native(args.clients, args.rounds, args.malicious, args.seed)),
                 ("flower", lambda: flower(args.clients, args.rounds, args.malicious, args.seed, args.ray_cpus))]
        got = {}
        for name, fn in (sides if rep % 2 == 0 else sides[::-1]):
            load = os.getloadavg()[0]
            got[name] = {**fn(), "load": load}
            g = got[name]
            print(f"pass {rep}  {name:8s} cell {g['cell_s']:7.2f} s  steady round {g['round_s'] * 1e3:8.1f} ms  "
                  f"accuracy {g['accuracy']:.3f}  (load before {load:.2f})", flush=True)
        rows.append(got)
    cell = statistics.median(r["flower"]["cell_s"] / r["redteam"]["cell_s"] for r in rows)
    rnd = statistics.median(r["flower"]["round_s"] / r["redteam"]["round_s"] for r in rows)
    start = statistics.median(r["flower"]["startup_s"] for r in rows)
    print(f"\nFlower engine ÷ redteam native (median over {args.reps} passes): cell {cell:.1f}×, "
          f"steady round {rnd:.1f}×; Flower's start-up (call to the end of round 1) {start:.1f} s")


if __name__ == "__main__":
    main()
