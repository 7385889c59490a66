"""The quickstart app attacked by sign flip and ALIE, defended by redteam's trimmed mean (as a Flower
strategy) and by Flower's own FedTrimmedAvg, side by side, every cell in Flower's simulation engine.

    python examples/flower_quickstart/compare.py                       # 10 clients, 2 malicious, 5 rounds, seeds 0-2
    python examples/flower_quickstart/compare.py --seeds 1 --rounds 2  # a quick look
    python examples/flower_quickstart/compare.py --json cells.json     # and every cell's accuracy curve

Partitions 0 and 1 (of 10) are malicious: sign flip (×4) runs in their ClientApp through redteam's
``AttackMod``; ALIE, which crafts from every honest update of the round, runs through the
server-side ``ColludingAttack`` stand-in. redteam's trimmed mean drops b = f = 2 values per side;
Flower's ``FedTrimmedAvg(beta=0.2)`` drops ⌊0.2·10⌋ = 2: the same rule. Every cell's no-attack
baseline has the same seed (partition, initial model, minibatches). The table gives, per cell, the
final test accuracy and the drop from the baseline of the same seed and defense: the mean over
seeds with a 95 % Student-t interval.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import quickstart_app as Q  # noqa: E402

#: (label, attack, its parameters, colluding)
ATTACKS = [("none", "none", {}, False), ("sign_flip", "sign_flip", {"scale": 4.0}, False),
           ("alie", "alie", {}, True)]


def defenses(clients: int, f: int) -> list[tuple[str, str, dict]]:
    """(label, defense, parameters): redteam's trimmed mean wrapped, and Flower's own."""
    return [(f"redteam trimmed_mean(b={f})", "trimmed_mean", {"b": f}),
            (f"Flower FedTrimmedAvg(beta={f / clients:g})", "flower:FedTrimmedAvg", {"beta": f / clients})]


def interval(xs: list[float]) -> str:
    """mean ± half-width of the 95 % Student-t interval (n ≤ 10 seeds)."""
    t975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return f"{m:.3f}"
    return f"{m:.3f} ± {t975.get(len(xs), 2.0) * statistics.stdev(xs) / math.sqrt(len(xs)):.3f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--malicious", type=int, default=2, help="partitions 0..m-1 are malicious")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--ray-cpus", type=int, default=2)
    ap.add_argument("--json", help="write every cell's accuracy curve here")
    args = ap.parse_args(argv)
    mal = tuple(range(args.malicious))
    cells: list[dict] = []
    for seed in range(args.seeds):
        setup = Q.Setup(clients=args.clients, rounds=args.rounds, seed=seed)
        for dlabel, defense, dparams in defenses(args.clients, args.malicious):
            for alabel, attack, aparams, colluding in ATTACKS:
                t = time.perf_counter()
                out = Q.run(setup, defense, dparams, attack, aparams, malicious=mal if attack != "none" else (),
                            colluding=colluding, ray_cpus=args.ray_cpus)
                cells.append({"seed": seed, "defense": dlabel, "attack": alabel, "accuracy": out.accuracy,
                              "wall_s": time.perf_counter() - t})
                print(f"seed {seed}  {dlabel:34s} {alabel:10s} accuracy {out.accuracy[-1]:.3f}  "
                      f"({cells[-1]['wall_s']:.0f} s)", file=sys.stderr, flush=True)
    final = {(c["seed"], c["defense"], c["attack"]): c["accuracy"][-1] for c in cells}
    seeds = range(args.seeds)
    print(f"\n{args.clients} clients ({args.malicious} malicious), {args.rounds} rounds, seeds 0-{args.seeds - 1}: "
          "final test accuracy and its drop from the no-attack baseline (mean ± 95 % t interval over seeds)\n")
    print(f"| {'attack':10s} | {'defense':34s} | accuracy        | drop            |")
    print(f"|{'-' * 12}|{'-' * 36}|-----------------|-----------------|")
    for alabel, *_ in ATTACKS:
        for dlabel, *_ in defenses(args.clients, args.malicious):
            acc = [final[(s, dlabel, alabel)] for s in seeds]
            drop = [final[(s, dlabel, "none")] - final[(s, dlabel, alabel)] for s in seeds]
            print(f"| {alabel:10s} | {dlabel:34s} | {interval(acc):15s} | "
                  f"{(interval(drop) if alabel != 'none' else '—'):15s} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "cells": cells}, fh, indent=1)


if __name__ == "__main__":
    main()
