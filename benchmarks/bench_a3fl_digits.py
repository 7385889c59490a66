"""A3FL against the plain pixel backdoor on ``digits``: clean accuracy and ASR under a defense.

    python benchmarks/bench_a3fl_digits.py                         # mean, median, krum; seeds 0-2; cheap search
    python benchmarks/bench_a3fl_digits.py --defenses mean median --search authors
    python benchmarks/bench_a3fl_digits.py --control               # + each trigger's ASR on the no-attack model

The federation: 20 clients (Dirichlet 0.5), 3 of them malicious (``malicious_fraction = 0.15``),
40 rounds, the federation's defaults otherwise (10 local steps of 16, lr 0.1); the attack acts
in rounds 10-39 (``window = "10:40"``), after a clean start. Both attacks: target 2, a 3×3 patch
in the bottom-right corner (rows and columns 5-7), 31.25 % of the attackers' training items:
``a3fl`` stamps ⌊0.3125·16⌋ = 5 of every batch of 16 with its optimised trigger;
``backdoor`` stamps the same patch in white (1.0) on 31.25 % of the attackers' samples once.
``--search cheap`` is :data:`attacks.a3fl.CHEAP_SEARCH`; ``--search authors`` the authors' 200
outer epochs with a copy rebuilt every epoch (about 2.5 CPU-seconds per attacked round).
``--control`` also runs the federation with no attack and scores, on its final model, the last
A3FL trigger and the white patch: how much of an ASR the trigger gets without any poisoning.
Each line is one run (JSON); the summary gives mean ± population standard deviation over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from attacks.a3fl import CHEAP_SEARCH, A3FL
from redteam.federation.loop import Federation
from redteam.scenario import parse_scenario

PATCH = [[r, c] for r in range(5, 8) for c in range(5, 8)]


def scenario(attack: dict | None, defense: str, seed: int) -> dict:
    sc = {"scenario": {"seed": seed}, "workload": {"name": "digits"},
          "federation": {"clients": 20, "malicious_fraction": 0.15, "rounds": 40}, "defense": {"name": defense}}
    if attack is not None:
        sc["attack"] = {**attack, "window": "10:40"}
    return sc


def attack_spec(name: str, search: str) -> dict:
    if name == "backdoor":
        return {"name": "backdoor", "target": 2, "fraction": 0.3125, "trigger": PATCH}
    spec = {"name": "a3fl", "target": 2, "trigger_size": 3, "trigger_position": [5, 5], "poison_fraction": 0.3125}
    return {**spec, **(CHEAP_SEARCH if search == "cheap" else {})}


def run(name: str, defense: str, seed: int, search: str) -> dict:
    t = time.process_time()
    fed = Federation(parse_scenario(scenario(attack_spec(name, search), defense, seed)))
    recs = fed.run().records
    asr = [r.extra["asr"] for r in recs]
    out = {"attack": name, "defense": defense, "seed": seed, "accuracy": recs[-1].accuracy, "asr": asr[-1],
           "asr_last5": sum(asr[-5:]) / 5, "cpu_s": round(time.process_time() - t, 1)}
    if name == "a3fl":
        out["trigger"] = [round(v, 2) for v in fed.attack.trigger.reshape(8, 8)[5:, 5:].reshape(-1).tolist()]
    return out


def control(defense: str, seed: int, trigger: list[float]) -> dict:
    fed = Federation(parse_scenario(scenario(None, defense, seed)))
    fed.run()
    probe = A3FL(target=2, trigger_size=3, trigger_position=(5, 5), image_shape=(8, 8))
    out = {"attack": "none", "defense": defense, "seed": seed}
    idx = torch.tensor([r * 8 + c for r, c in PATCH])
    for label, patch in (("a3fl_trigger_asr", trigger), ("white_patch_asr", [1.0] * 9)):
        t = torch.full((64,), 0.5)
        t[idx] = torch.tensor(patch)
        probe._memory["trigger"] = t
        x, y = probe.targeted_test(fed.test_x, fed.test_y)
        out[label] = fed.trainer.evaluate(fed.final_params, x, y)[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--defenses", nargs="+", default=["mean", "median", "krum"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--search", choices=["cheap", "authors"], default="cheap")
    ap.add_argument("--control", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for d in args.defenses:
        for s in args.seeds:
            for name in ("a3fl", "backdoor"):
                rows.append(run(name, d, s, args.search))
                print(json.dumps(rows[-1]), flush=True)
            if args.control:
                rows.append(control(d, s, rows[-2]["trigger"]))
                print(json.dumps(rows[-1]), flush=True)
    print(f"\nsummary ({args.search} search; mean ± sd over seeds {args.seeds})")
    for d in args.defenses:
        for name in ("a3fl", "backdoor", "none"):
            sel = [r for r in rows if r["defense"] == d and r["attack"] == name]
            if not sel:
                continue
            keys = ("a3fl_trigger_asr", "white_patch_asr") if name == "none" else ("accuracy", "asr")
            cells = [f"{k} {statistics.mean(r[k] for r in sel):.3f} ± {statistics.pstdev(r[k] for r in sel):.3f}"
                     for k in keys]
            print(f"  {d:8s} {name:9s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
