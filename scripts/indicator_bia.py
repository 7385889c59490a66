"""BackdoorIndicator on a short real run: 20 clients, 4 malicious, 30 rounds, ``backdoor`` target 0
in rounds 10–29; prints clean accuracy, ASR, detection counts (all rounds, and rounds 10–29) and the
backdoor indicator accuracy (BIA) of honest and malicious rows, read from each round's
``Decision.state["bia"]``.

Usage: PYTHONPATH=. python scripts/indicator_bia.py SEED DEFENSE [param=JSON ...]
  ``WL='{"name": "mnist5k"}'`` picks another workload (default digits); ``FED='{"local_epochs": 2}'``
  overrides [federation] keys. Example: ``python scripts/indicator_bia.py 0 indicator start_round=10``.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    import defenses.indicator as di
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    seed, name = int(argv[0]), argv[1]
    params = {k: json.loads(v) for k, v in (a.split("=", 1) for a in argv[2:])}
    log: list[tuple[int, tuple[int, ...], list]] = []
    decide = di.BackdoorIndicator.decide

    def recording(self, updates, ctx):  # the BIA of every row, as the rule computed it
        dec = decide(self, updates, ctx)
        log.append((ctx.round, tuple(ctx.client_ids), list(dec.state["bia"])))
        return dec

    di.BackdoorIndicator.decide = recording
    workload = {"name": "digits", **json.loads(os.environ.get("WL", "{}"))}
    fed = {"clients": 20, "malicious_fraction": 0.2, "rounds": 30, **json.loads(os.environ.get("FED", "{}"))}
    sc = parse_scenario({"scenario": {"seed": seed}, "workload": workload, "federation": fed,
                         "attack": {"name": "backdoor", "target": 0, "window": "10:30"},
                         "defense": {"name": name, **params}})
    t0 = time.time()
    res = Federation(sc).run()
    counts = {"all": [0, 0, 0], "window": [0, 0, 0]}  # true positives, false positives, false negatives
    for rec in res.records:
        for acc, mal, took_part in zip(rec.accepted, rec.malicious, rec.participating):
            if not took_part:
                continue
            for key in ("all", "window") if rec.round >= 10 else ("all",):
                c = counts[key]
                c[0] += mal and not acc
                c[1] += (not mal) and not acc
                c[2] += mal and acc
    tp, fp, fn = counts["all"]
    last = res.records[-1]
    print(json.dumps({"defense": name, "params": params, "workload": workload, "seed": seed,
                      "accuracy": round(last.accuracy, 4), "asr": round(last.extra.get("asr"), 4),
                      "tp_fp_fn": counts["all"], "window_tp_fp_fn": counts["window"],
                      "precision": tp / (tp + fp) if tp + fp else None, "recall": tp / (tp + fn) if tp + fn else None,
                      "seconds": round(time.time() - t0, 1)}))
    if not log:
        return
    mal = {c for c, m in enumerate(last.malicious) if m}
    groups: dict[str, list[float]] = {"honest": [], "honest, rounds 10-29": [], "malicious, rounds 10-29": []}
    for rnd, ids, bia in log:
        for c, v in zip(ids, bia):
            if v is None:
                continue
            if c in mal and rnd >= 10:
                groups["malicious, rounds 10-29"].append(v)
            else:
                groups["honest"].append(v)
                if rnd >= 10:
                    groups["honest, rounds 10-29"].append(v)
    for key, vals in groups.items():
        if vals:
            vals.sort()
            print(f"  BIA {key}: n={len(vals)} median={vals[len(vals) // 2]:.3f} min={vals[0]:.3f} max={vals[-1]:.3f}")
    for rnd, ids, bia in log:
        if rnd in (10, 11, 15, 20, 29):
            print(f"   round {rnd:2d}", " ".join(("*" if c in mal else "") + f"{v:.2f}"
                                                 for c, v in zip(ids, bia) if v is not None))
    print("  broadcast_shift rounds 0/10/29:", [round(res.records[k].extra.get("broadcast_shift", -1.0), 3)
                                                for k in (0, 10, 29)])


if __name__ == "__main__":
    main(sys.argv[1:])
