"""3DFed (``3dfed``) against the plain pixel ``backdoor`` on digits: clean accuracy, ASR, how many
malicious rows each defense admits, and whether 3DFed's indicator feedback matches the server.

    PYTHONPATH=$PWD python benchmarks/strength_3dfed.py --defenses flame,multi_krum,krum,mean --seeds 0,1,2

20 clients, 4 malicious (malicious_fraction 0.2), 30 rounds, the federation's defaults otherwise.
One JSON line per (seed, defense, attack): ``acc`` and ``asr`` averaged over the last 5 rounds,
``mal_accepted`` / ``honest_accepted`` the share of those rows admitted over the attack's rounds,
and for 3dfed ``indicator`` = rows whose feedback label (a/c = admitted, r = rejected) matched
the server's decision over the rounds it read feedback, and ``weak_from`` the round it decided
the server adds noise (its feedback is ignored from then on). A defense takes parameters as
``name:key=value;key=value`` (e.g. ``flame:space=models``); ``--window 10:30`` starts the attack
at round 10 (the released MNIST config's ``poison_epoch``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import attacks.threedfed as T
from redteam.federation.loop import Federation
from redteam.scenario import parse_scenario

_LOG: dict[int, tuple] = {}
_craft = T.ThreeDFed.craft_updates


def _logged(self, ctx):  # what 3dfed read each round, for the indicator check
    out = _craft(self, ctx)
    rec = ctx.attack_state[T.STATE_KEY]["records"][-1]
    _LOG[ctx.round] = (rec["labels"], rec["weak"], list(ctx.malicious))
    return out


def _defense(spec: str) -> dict:
    name, _, rest = spec.partition(":")
    return {"name": name, **dict(kv.split("=") for kv in rest.split(";") if kv)}


def run(attack: str, defense: str, seed: int, rounds: int, window: str | None) -> dict:
    _LOG.clear()
    atk = {"name": attack, **({"window": window} if window else {})}
    sc = parse_scenario({"scenario": {"seed": seed}, "workload": {"name": "digits"},
                         "federation": {"clients": 20, "malicious_fraction": 0.2, "rounds": rounds},
                         "attack": atk, "defense": _defense(defense)})
    t = time.time()
    recs = Federation(sc).run().records
    lo = int(window.split(":")[0]) if window else 0
    mal = [sum(r.accepted[i] for i, m in enumerate(r.malicious) if m) / max(1, sum(r.malicious)) for r in recs[lo:]]
    hon = [sum(r.accepted[i] for i, m in enumerate(r.malicious) if not m) / max(1, r.malicious.count(False))
           for r in recs[lo:]]
    last = recs[-5:]
    out = {"attack": attack, "defense": defense, "seed": seed, "window": window,
           "acc": round(sum(r.accuracy for r in last) / len(last), 4),
           "asr": round(sum(r.extra["asr"] for r in last) / len(last), 4),
           "mal_accepted": round(sum(mal) / len(mal), 4), "honest_accepted": round(sum(hon) / len(hon), 4),
           "secs": round(time.time() - t, 1)}
    if attack == "3dfed":
        agree = total = 0
        weak_from = None
        for rnd, (labels, weak, _) in sorted(_LOG.items()):
            if weak and weak_from is None:
                weak_from = rnd
            if labels and rnd - 1 in _LOG:
                truth = [recs[rnd - 1].accepted[c] for c in _LOG[rnd - 1][2]]
                agree += sum(t == (lab != "r") for t, lab in zip(truth, labels))
                total += len(truth)
        out.update(indicator=f"{agree}/{total}", weak_from=weak_from)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacks", default="3dfed,backdoor")
    ap.add_argument("--defenses", default="flame,multi_krum,krum,mean")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--window", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    T.ThreeDFed.craft_updates = _logged
    for seed in (int(s) for s in a.seeds.split(",")):
        for defense in a.defenses.split(","):
            for attack in a.attacks.split(","):
                print(json.dumps(run(attack, defense, seed, a.rounds, a.window)), flush=True)


if __name__ == "__main__":
    main()
