"""DeepSight and FLARE against the pixel backdoor on 8×8 digits, beside ``mean`` and ``flame``.

    PYTHONPATH=. python benchmarks/detectors_digits.py                      # 4 defenses × seeds 0, 1, 2
    PYTHONPATH=. python benchmarks/detectors_digits.py --defense '{"name": "flare", "scoring": "top_half"}'

20 clients, 4 malicious (``malicious_fraction = 0.2``), 30 rounds, the server's root sample 64
images; attack ``backdoor`` (2×2 corner trigger, target 0, half of the attackers' data) in rounds
10–29. Printed per run: final clean accuracy, final ASR, and detection over the attack window
(a judged update is *flagged* when it was not accepted; positives are the malicious clients).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def run(defense: dict, seed: int, rounds: int = 30, window: str = "10:30") -> dict:
    import torch

    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario
    from redteam.scoring import detection

    torch.set_num_threads(1)
    sc = parse_scenario({"scenario": {"seed": seed}, "workload": {"name": "digits"},
                         "federation": {"clients": 20, "malicious_fraction": 0.2, "rounds": rounds,
                                        "root_samples": 64},
                         "attack": {"name": "backdoor", "target": 0, "window": window},
                         "defense": defense})
    t = time.time()
    recs = Federation(sc).run().records
    det = detection([r for r in recs if r.round >= int(window.split(":")[0])])
    return {"defense": json.dumps(defense), "seed": seed, "accuracy": recs[-1].accuracy,
            "asr": recs[-1].extra.get("asr"), "precision": det.precision, "recall": det.recall,
            "fpr": det.fpr, "seconds": round(time.time() - t, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--defense", action="append", help="a defense table as JSON (repeatable); default: "
                    "mean, flame, deepsight, flare")
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args(argv)
    defenses = [json.loads(d) for d in args.defense] if args.defense else \
        [{"name": n} for n in ("mean", "flame", "deepsight", "flare")]
    for d in defenses:
        rows = [run(d, int(s)) for s in args.seeds.split(",")]
        for r in rows:
            print(json.dumps(r), flush=True)

        def mean(key: str) -> str:
            vals = [r[key] for r in rows if r[key] is not None]
            return f"{statistics.fmean(vals):.3f}" if vals else "n/a"

        print(f"# {json.dumps(d)}: accuracy {mean('accuracy')}, ASR {mean('asr')}, precision {mean('precision')}, "
              f"recall {mean('recall')}, fpr {mean('fpr')}", flush=True)


if __name__ == "__main__":
    main()
