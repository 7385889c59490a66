"""Snowball and CRFL against the pixel backdoor on ``digits``, next to the plain mean.

20 clients (4 malicious), 30 rounds, Dirichlet(0.5) data, the ``backdoor`` attack (target 0)
inside the window 10:30. Per run: the final round's clean accuracy and attack success rate, the
largest ASR of the window, and the detection over the window's rounds (TPR: malicious rows
rejected; FPR: honest rows rejected). One line per (defense, seed), then the mean over seeds::

    PYTHONPATH=$PWD python benchmarks/snowball_crfl_digits.py --seeds 0 1 2
    PYTHONPATH=$PWD python benchmarks/snowball_crfl_digits.py --defenses snowball \\
        --snowball '{"vae_hidden": 64, "vae_latent": 32, "vae_initial": 50, "vae_tuning": 10}'
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def run(defense: dict, seed: int, rounds: int = 30, window: str = "10:30") -> dict:
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    doc = {
        "scenario": {"seed": seed},
        "workload": {"name": "digits"},
        "federation": {"clients": 20, "malicious_fraction": 0.2, "rounds": rounds, "partition": "dirichlet",
                       "alpha": 0.5, "lr": 0.2},
        "attack": {"name": "backdoor", "target": 0, "fraction": 0.5, "window": window},
        "defense": defense,
    }
    start = time.time()
    res = Federation(parse_scenario(doc)).run()
    lo = int(window.split(":")[0])
    tp = fn = fp = tn = 0
    for r in res.records[lo:]:
        for acc, mal, part in zip(r.accepted, r.malicious, r.participating):
            if not part:
                continue
            if mal:
                tp, fn = tp + (not acc), fn + acc
            else:
                fp, tn = fp + (not acc), tn + acc
    last = res.records[-1]
    asrs = [r.extra.get("asr") for r in res.records[lo:] if r.extra.get("asr") is not None]
    return {"defense": defense["name"], "seed": seed, "accuracy": last.accuracy, "asr": last.extra.get("asr"),
            "max_asr": max(asrs) if asrs else None, "tpr": tp / max(tp + fn, 1), "fpr": fp / max(fp + tn, 1),
            "seconds": time.time() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--defenses", nargs="+", default=["mean", "snowball", "crfl"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--snowball", default="{}", help="Snowball parameters (JSON)")
    ap.add_argument("--crfl", default="{}", help="CRFL parameters (JSON)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    extra = {"snowball": json.loads(args.snowball), "crfl": json.loads(args.crfl)}
    rows = []
    for name in args.defenses:
        for seed in args.seeds:
            row = run({"name": name, **extra.get(name, {})}, seed, args.rounds)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"{'defense':10} {'acc':>6} {'asr':>6} {'maxASR':>6} {'TPR':>6} {'FPR':>6}  (mean over seeds {args.seeds})")
    for name in args.defenses:
        rs = [r for r in rows if r["defense"] == name]
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in ("accuracy", "asr", "max_asr", "tpr", "fpr")}
        print(f"{name:10} {mean['accuracy']:6.3f} {mean['asr']:6.3f} {mean['max_asr']:6.3f} {mean['tpr']:6.3f} "
              f"{mean['fpr']:6.3f}")


if __name__ == "__main__":
    main()
