"""What running a redteam cell through Flower costs beside running it natively: one attacked cell
(sign flip ×4 by 2 of 10 clients against the trimmed mean, b = 2) of the digits federation, in
redteam's own engine and as a ``[flower]`` scenario cell (the Flower regime, as ``redteam matrix``
runs it: examples/flower_quickstart/scenario.toml, redteam's defense as a ``DefenseStrategy``, its
attack as an ``AttackMod``) on Flower's in-process engine (``engine = "local"``, the default) and,
with ``--engines local,ray``, on Flower's simulation engine (Ray), measured interleaved in one
process (issue 38).

    python benchmarks/bench_flower_engine.py                          # 10 clients, 5 rounds, 3 passes, local engine
    python benchmarks/bench_flower_engine.py --engines local,ray      # and on Ray

Needs Flower (``pip install "redteam[flower]"``). **One federation shape**, two trainers: the
scenario of :func:`bench_vs_flower.scenario_doc` (scikit-learn's digits, MLP 64-64-10, 10 local SGD
steps of batch 16 at lr 0.1, Dirichlet(0.5) label skew there, Dirichlet(1.0) in the example) with
that cell's attack and defense and codec ``none``; the Flower side is the example app with the
same model, steps, batch and learning rate. The two do the same amount of training per round, not
the same arithmetic (their partitions and batches differ), so accuracies are printed but not
compared.

Per pass and side: the **cell** wall time (redteam: ``Federation`` built and run, evaluation every
round; Flower: the ``FlowerRun`` built and run, the app's factory, and on Ray the engine's start
and stop, included), and the
**steady round** (rounds 2..R: each side's ``RoundRecord.wall_time_s``; for Flower, from the
strategy's ``configure_train`` to the server's evaluation). The ratios Flower ÷ redteam are per pass, then the median over passes;
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


def flower(clients: int, rounds: int, f: int, seed: int, engine: str, ray_cpus: int) -> dict:
    """The same cell as a ``[flower]`` scenario (examples/flower_quickstart/scenario.toml), run by
    redteam's Flower regime (``FlowerRun``) on ``engine``, as ``redteam matrix`` runs it."""
    from redteam.federation.regimes import make_run
    from redteam.scenario import load_document, parse_scenario

    path = os.path.join(os.path.dirname(HERE), "examples", "flower_quickstart", "scenario.toml")
    doc = load_document(path)
    for key in ("matrix", "expect"):
        doc.pop(key, None)
    doc["scenario"]["seed"] = seed
    doc["federation"] = {"clients": clients, "malicious_fraction": f / clients, "rounds": rounds}
    doc["flower"] = {**doc["flower"], "engine": engine, "ray_cpus": ray_cpus,
                     "params": {**doc["flower"]["params"], "local_steps": 10, "batch": 16, "lr": 0.1}}
    doc["attack"] = {"name": "sign_flip", "scale": 4.0}
    doc["defense"] = {"name": "trimmed_mean", "b": f}
    sc = parse_scenario(doc, file="scenario.toml", base_dir=os.path.dirname(path))
    t = time.perf_counter()
    res = make_run(sc).run()
    wall = time.perf_counter() - t
    steady = [r.wall_time_s for r in res.records[1:]]
    return {"cell_s": wall, "round_s": statistics.median(steady), "accuracy": res.records[-1].accuracy,
            "startup_s": wall - sum(r.wall_time_s for r in res.records)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--malicious", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engines", default="local", help="the Flower engines to time, comma-separated: local, ray")
    ap.add_argument("--ray-cpus", type=int, default=2, help="Ray CPUs (one ClientApp actor each)")
    args = ap.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in ("local", "ray") for e in engines):
        raise SystemExit(f"--engines {args.engines!r}: expected local, ray or both (comma-separated)")
    if args.rounds < 3:
        raise SystemExit("--rounds must be ≥ 3 (rounds 2..R are the steady ones)")
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {args.clients} clients ({args.malicious} malicious), "
          f"{args.rounds} rounds, {args.reps} passes", flush=True)
    rows = []
    for rep in range(args.reps):
        sides = [("redteam", lambda: native(args.clients, args.rounds, args.malicious, args.seed))]
        sides += [(f"flower-{e}", lambda e=e: flower(args.clients, args.rounds, args.malicious, args.seed, e,
                                                     args.ray_cpus)) for e in engines]
        got = {}
        for name, fn in (sides if rep % 2 == 0 else sides[::-1]):
            load = os.getloadavg()[0]
            got[name] = {**fn(), "load": load}
            g = got[name]
            print(f"pass {rep}  {name:13s} cell {g['cell_s']:7.2f} s  steady round {g['round_s'] * 1e3:8.1f} ms  "
                  f"accuracy {g['accuracy']:.3f}  (load before {load:.2f})", flush=True)
        rows.append(got)
    for e in engines:
        cell = statistics.median(r[f"flower-{e}"]["cell_s"] / r["redteam"]["cell_s"] for r in rows)
        rnd = statistics.median(r[f"flower-{e}"]["round_s"] / r["redteam"]["round_s"] for r in rows)
        start = statistics.median(r[f"flower-{e}"]["startup_s"] for r in rows)
        print(f"\nFlower regime, engine {e!r} ÷ redteam native (median over {args.reps} passes): cell {cell:.2f}×, "
              f"steady round {rnd:.2f}×; its set-up and start-up (cell − its rounds) {start:.2f} s")


if __name__ == "__main__":
    main()
