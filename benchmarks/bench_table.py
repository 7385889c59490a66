"""How long a paper's table takes at full length, where the time goes, and what batching the
cells would buy (issue 13 §4), measured on this machine in one run.

    python benchmarks/bench_table.py                                  # the Karimireddy table
    python benchmarks/bench_table.py scenarios/literature/karimireddy.toml scenarios/literature/karimireddy_seed1.toml \\
        --sample 8 --rounds 20 --full-rounds 600 --workers 2

What it does, all in this process and in this order:

1. **Plan**: the matrix files' runs exactly as ``redteam matrix`` plans them (attacked cells and
   their distinct no-attack baselines; ``plan_units``).
2. **Sample**: ``--sample`` runs spread evenly over that plan (every k-th), each run for
   ``--rounds`` rounds in-process with one intra-op thread (what each worker of
   ``--executor process`` does), ``--repeats`` times, interleaved (every sampled run once per
   pass, the order reversed on odd passes). Per run and pass: the round's CPU time of this
   thread (``time.thread_time``: with one thread it is the work done, which another process's
   load does not stretch) and its wall time, each split into local training
   (``BatchedTrainer.train``, timed by a wrapper installed here) and everything else (attack,
   encode, chunk, transport, receive, defense, server step, evaluation).
3. **Batching the cells**: the same model's batched gradient step (``vmap(grad(loss))``, what
   local training spends its time in) for ``n`` clients (one run) and for ``R·n`` clients
   (R runs stacked as one batch), per client, for R in ``--stack``, in CPU time, the sizes
   interleaved within each of 15 repeats (median, min, max); and whether the stacked gradients
   are bitwise those of the runs one by one.
4. **Projection** to the full table (every planned run, ``--full-rounds`` rounds, ``--workers``
   processes), from the CPU time (the median over passes of the sample's mean, and the range
   over passes): one by one as measured; with the cells' training stacked at the R whose median
   is best (training × that per-client ratio, the rest unchanged); and the floor that stacking
   cannot go below (the training alone at that ratio, with nothing else in the round). The
   projection assumes ``--workers`` idle cores; the wall-time columns show what this machine's
   load did to the sample.

Nothing here is asserted. The machine is shared: the CPU model and the load average before and
after are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [str(ROOT / "scenarios/literature/karimireddy.toml"),
           str(ROOT / "scenarios/literature/karimireddy_seed1.toml")]


def plan(files: list[str]) -> list:
    from redteam.runner.matrix_run import plan_units
    from redteam.matrix import load_matrix

    units = []
    for f in files:
        base, matrix, _ = load_matrix(f)
        _, baselines, attacked = plan_units(matrix, base.seed, Path(f).name)
        units += baselines + attacked
    return units


class TrainTimer:
    """Wraps ``BatchedTrainer.train`` to add up the wall and CPU seconds spent in it."""

    def __init__(self) -> None:
        from redteam.federation.training import BatchedTrainer

        self.cls = BatchedTrainer
        self.orig = BatchedTrainer.train
        self.wall = 0.0
        self.cpu = 0.0
        timer = self

        def train(self_, *a, **k):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return timer.orig(self_, *a, **k)
            finally:
                timer.wall += time.perf_counter() - t
                timer.cpu += time.thread_time() - c

        BatchedTrainer.train = train  # type: ignore[method-assign]

    def close(self) -> None:
        self.cls.train = self.orig  # type: ignore[method-assign]


def time_run(unit, rounds: int) -> dict[str, float]:
    """Per round of one run, shortened: wall / cpu (whole round), train_wall / train_cpu; clients."""
    import copy

    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    doc = copy.deepcopy(unit.doc)
    doc.setdefault("federation", {})["rounds"] = rounds
    fed = Federation(parse_scenario(doc, file="<bench>"), device="cpu")
    timer = TrainTimer()
    try:
        t, c = time.perf_counter(), time.thread_time()
        fed.run()
        wall, cpu = time.perf_counter() - t, time.thread_time() - c
    finally:
        timer.close()
    return {"wall": wall / rounds, "cpu": cpu / rounds, "train_wall": timer.wall / rounds,
            "train_cpu": timer.cpu / rounds, "clients": int(fed.scenario.federation.clients)}


def stacking(unit, stacks: list[int], repeats: int = 15) -> tuple[dict[int, list[float]], bool]:
    """Per-client CPU seconds of one batched gradient step at n·R clients, every repeat (the
    sizes interleaved within each); bitwise check at the largest R (stacked vs one run's n at a
    time)."""
    import copy

    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    doc = copy.deepcopy(unit.doc)
    doc.setdefault("federation", {})["rounds"] = 1
    fed = Federation(parse_scenario(doc, file="<bench>"), device="cpu")
    n = int(fed.scenario.federation.clients)
    b = fed.local.batch_size
    gen = torch.Generator().manual_seed(0)
    grads = fed.trainer._grads  # the batched gradient step local training runs every step
    inputs = {}
    for r in [1, *stacks]:
        m = n * r
        params = fed.params0[None].expand(m, -1).clone() + 0.01 * torch.randn(m, fed.params0.numel(), generator=gen)
        idx = torch.randint(0, fed.data.x.shape[0], (m, b), generator=gen)
        inputs[r] = (params, fed.data.x[idx], fed.data.y[idx])
        grads(*inputs[r])  # warm-up
    out: dict[int, list[float]] = {r: [] for r in inputs}
    for _ in range(repeats):
        for r, (params, xb, yb) in inputs.items():
            c = time.thread_time()
            grads(params, xb, yb)
            out[r].append((time.thread_time() - c) / (n * r))
    params, xb, yb = inputs[max(stacks)]
    whole = grads(params, xb, yb)
    parts = torch.cat([grads(params[i:i + n], xb[i:i + n], yb[i:i + n]) for i in range(0, params.shape[0], n)])
    return out, bool(torch.equal(whole, parts))


def fmt(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def spread(values: list[float], scale: float = 1e3, digits: int = 1) -> str:
    """'median (min–max)' of ``values`` × ``scale``."""
    m, lo, hi = statistics.median(values) * scale, min(values) * scale, max(values) * scale
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _timing import cpu_name

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", default=DEFAULT, help="matrix files (default: the Karimireddy table)")
    ap.add_argument("--sample", type=int, default=8, help="runs timed (spread over the plan)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="passes over the sample, interleaved (default 3)")
    ap.add_argument("--full-rounds", type=int, default=600, help="the table's length (the paper: 600 iterations)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes the table would run on")
    ap.add_argument("--stack", default="4,10,20", help="runs stacked into one batch (comma-separated R)")
    args = ap.parse_args()
    if args.sample < 1 or args.rounds < 1 or args.repeats < 1 or args.workers < 1:
        ap.error("--sample, --rounds, --repeats and --workers must be ≥ 1")
    try:
        stacks = [int(v) for v in args.stack.split(",") if v]
    except ValueError:
        ap.error(f"--stack {args.stack!r}: expected comma-separated integers, e.g. 4,10,20")
    if not stacks or min(stacks) < 2:
        ap.error("--stack: each R must be ≥ 2")
    torch.set_num_threads(1)
    units = plan(args.files)
    k = max(1, len(units) // max(args.sample, 1))
    sample = units[::k][: args.sample]
    load0 = os.getloadavg()[0]
    print(f"plan: {len(units)} runs in {', '.join(Path(f).name for f in args.files)}; "
          f"timing {len(sample)} of them for {args.rounds} rounds each, {args.repeats} passes (1 thread); "
          f"load {load0:.2f}", file=sys.stderr)
    time_run(sample[0], 2)  # warm-up: lazy initialisation and first-call costs are not the table's
    passes: list[list[dict[str, float]]] = []
    for p in range(args.repeats):
        order = list(range(len(sample)))[:: -1 if p % 2 else 1]
        got: dict[int, dict[str, float]] = {}
        for i in order:
            got[i] = time_run(sample[i], args.rounds)
            print(f"  pass {p + 1} {sample[i].cell_id:<40} CPU {got[i]['cpu'] * 1e3:6.1f} ms/round "
                  f"(training {got[i]['train_cpu'] * 1e3:6.1f}), wall {got[i]['wall'] * 1e3:6.1f}", file=sys.stderr)
        passes.append([got[i] for i in range(len(sample))])
    per_client, same = stacking(sample[0], stacks)
    load1 = os.getloadavg()[0]
    n = passes[0][0]["clients"]

    def mean_of(key: str) -> list[float]:  # the sample's mean, one value per pass
        return [statistics.mean(r[key] for r in runs) for runs in passes]

    cpu, train = mean_of("cpu"), mean_of("train_cpu")
    wall, train_wall = mean_of("wall"), mean_of("train_wall")
    other = [c - t for c, t in zip(cpu, train)]
    other_wall = [w - t for w, t in zip(wall, train_wall)]
    one = statistics.median(per_client[1])
    best = min(per_client, key=lambda r: statistics.median(per_client[r]))
    gain = statistics.median(per_client[best]) / one
    runs_rounds = len(units) * args.full_rounds

    def project(per_round: list[float]) -> str:
        v = sorted(runs_rounds * x / args.workers for x in per_round)
        return f"{fmt(statistics.median(v))} ({fmt(v[0])}–{fmt(v[-1])})"

    print(f"\n{cpu_name()}; load average {load0:.2f} before, {load1:.2f} after; torch {torch.__version__}, "
          f"1 intra-op thread per run; median (min–max) over {args.repeats} passes\n")
    print(f"| per run and round ({n} clients, mean of {len(sample)} runs) | CPU ms | wall ms |\n|---|---|---|")
    print(f"| whole round | {spread(cpu)} | {spread(wall)} |")
    print(f"| local training | {spread(train)} | {spread(train_wall)} |")
    print(f"| everything else (attack, wire, defense, server step, evaluation) | {spread(other)} | {spread(other_wall)} |")
    print("\n| clients in one batched gradient step | per client, CPU ms | vs one run |\n|---|---|---|")
    for r, v in per_client.items():
        print(f"| {r} run{'s' if r > 1 else ''} × {n} = {r * n} | {spread(v, digits=3)} | {statistics.median(v) / one:.2f}× |")
    print(f"\nstacked gradients bitwise equal to one run at a time (R = {max(stacks)}): {same}")
    print(f"\n| the full table: {len(units)} runs × {args.full_rounds} rounds on {args.workers} idle processes, "
          f"from CPU time | time |")
    print("|---|---|")
    print(f"| one by one (measured per-round cost) | {project(cpu)} |")
    print(f"| cells' training stacked {best} at a time, the rest unchanged | "
          f"{project([t * gain + o for t, o in zip(train, other)])} |")
    print(f"| floor: stacked training alone, nothing else in the round | {project([t * gain for t in train])} |")
    print("| the issue's aim | 10 min |")


if __name__ == "__main__":
    main()
