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
   ``--executor process`` does). Per run: the round's wall time, split into local training
   (``BatchedTrainer.train``, timed by a wrapper installed here) and everything else (attack,
   encode, chunk, transport, receive, defense, server step, evaluation).
3. **Batching the cells**: the same model's batched gradient step (``vmap(grad(loss))``, what
   local training spends its time in) for ``n`` clients (one run) and for ``R·n`` clients
   (R runs stacked as one batch), per client, for R in ``--stack``; and whether the stacked
   gradients are bitwise those of the runs one by one.
4. **Projection** to the full table (every planned run, ``--full-rounds`` rounds, ``--workers``
   processes): one by one as measured; with the cells' training stacked at the best R measured
   (training × that per-client ratio, the rest unchanged); and the floor that stacking cannot
   go below (the training alone at that ratio, with nothing else in the round).

Nothing here is asserted. The machine is shared: the load average is printed.
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
    from redteam.scenario import load_matrix

    units = []
    for f in files:
        base, matrix, _ = load_matrix(f)
        _, baselines, attacked = plan_units(matrix, base.seed, Path(f).name)
        units += baselines + attacked
    return units


class TrainTimer:
    """Wraps ``BatchedTrainer.train`` to add up the seconds spent in it."""

    def __init__(self) -> None:
        from redteam.federation.training import BatchedTrainer

        self.cls = BatchedTrainer
        self.orig = BatchedTrainer.train
        self.seconds = 0.0
        timer = self

        def train(self_, *a, **k):
            t = time.perf_counter()
            try:
                return timer.orig(self_, *a, **k)
            finally:
                timer.seconds += time.perf_counter() - t

        BatchedTrainer.train = train  # type: ignore[method-assign]

    def close(self) -> None:
        self.cls.train = self.orig  # type: ignore[method-assign]


def time_run(unit, rounds: int) -> tuple[float, float, int]:
    """(wall seconds per round, training seconds per round, clients) of one run, shortened."""
    import copy

    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    doc = copy.deepcopy(unit.doc)
    doc.setdefault("federation", {})["rounds"] = rounds
    fed = Federation(parse_scenario(doc, file="<bench>"), device="cpu")
    timer = TrainTimer()
    try:
        t = time.perf_counter()
        fed.run()
        wall = time.perf_counter() - t
    finally:
        timer.close()
    return wall / rounds, timer.seconds / rounds, int(fed.scenario.federation.clients)


def stacking(unit, stacks: list[int], repeats: int = 15) -> tuple[dict[int, float], bool]:
    """Per-client seconds of one batched gradient step at n·R clients; bitwise check at the
    largest R (stacked vs one run's n at a time)."""
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
    out: dict[int, float] = {}
    same = True
    for r in [1, *stacks]:
        m = n * r
        params = fed.params0[None].expand(m, -1).clone() + 0.01 * torch.randn(m, fed.params0.numel(), generator=gen)
        idx = torch.randint(0, fed.data.x.shape[0], (m, b), generator=gen)
        xb, yb = fed.data.x[idx], fed.data.y[idx]
        grads(params, xb, yb)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            grads(params, xb, yb)
            times.append(time.perf_counter() - t)
        out[r] = min(times) / m  # the least disturbed of the repeats: a shared machine only adds
        if r == max(stacks):
            whole = grads(params, xb, yb)
            parts = torch.cat([grads(params[i:i + n], xb[i:i + n], yb[i:i + n]) for i in range(0, m, n)])
            same = bool(torch.equal(whole, parts))
    return out, same


def fmt(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", default=DEFAULT, help="matrix files (default: the Karimireddy table)")
    ap.add_argument("--sample", type=int, default=8, help="runs timed (spread over the plan)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per timed run")
    ap.add_argument("--full-rounds", type=int, default=600, help="the table's length (the paper: 600 iterations)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes the table would run on")
    ap.add_argument("--stack", default="4,10,20", help="runs stacked into one batch (comma-separated R)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    units = plan(args.files)
    k = max(1, len(units) // max(args.sample, 1))
    sample = units[::k][: args.sample]
    print(f"plan: {len(units)} runs in {', '.join(Path(f).name for f in args.files)}; "
          f"timing {len(sample)} of them for {args.rounds} rounds each (1 thread); load {os.getloadavg()[0]:.2f}",
          file=sys.stderr)
    time_run(sample[0], 2)  # warm-up: lazy initialisation and first-call costs are not the table's
    per_round, per_train = [], []
    for u in sample:
        wall, train, n = time_run(u, args.rounds)
        per_round.append(wall)
        per_train.append(train)
        print(f"  {u.cell_id:<40} {wall * 1e3:6.1f} ms/round, training {train * 1e3:6.1f} ms", file=sys.stderr)
    stacks = [int(v) for v in args.stack.split(",") if v]
    per_client, same = stacking(sample[0], stacks)
    wall = statistics.mean(per_round)
    train = statistics.mean(per_train)
    other = wall - train
    best = min(per_client, key=per_client.get)
    gain = per_client[best] / per_client[1]
    runs_rounds = len(units) * args.full_rounds
    one_by_one = runs_rounds * wall / args.workers
    stacked = runs_rounds * (train * gain + other) / args.workers
    floor = runs_rounds * train * gain / args.workers
    print(f"\nload average {os.getloadavg()[0]:.2f}; torch {torch.__version__}, 1 intra-op thread per run\n")
    print(f"| per run and round ({n} clients) | ms |\n|---|---|")
    print(f"| whole round (mean of {len(sample)} runs) | {wall * 1e3:.1f} |")
    print(f"| local training | {train * 1e3:.1f} |")
    print(f"| everything else (attack, wire, defense, server step, evaluation) | {other * 1e3:.1f} |")
    print("\n| clients in one batched gradient step | per client | vs one run |\n|---|---|---|")
    for r, s in per_client.items():
        print(f"| {r} run{'s' if r > 1 else ''} × {n} = {r * n} | {s * 1e3:.3f} ms | {s / per_client[1]:.2f}× |")
    print(f"\nstacked gradients bitwise equal to one run at a time (R = {max(stacks)}): {same}")
    print(f"\n| the full table: {len(units)} runs × {args.full_rounds} rounds on {args.workers} processes | time |")
    print("|---|---|")
    print(f"| one by one (measured per-round cost) | {fmt(one_by_one)} |")
    print(f"| cells' training stacked {best} at a time, the rest unchanged | {fmt(stacked)} |")
    print(f"| floor: stacked training alone, nothing else in the round | {fmt(floor)} |")
    print("| the issue's aim | 10 min |")


if __name__ == "__main__":
    main()
