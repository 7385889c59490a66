"""Snowball and CRFL against the pixel backdoor on ``digits``, next to the plain mean.

20 clients (4 malicious), 30 rounds, Dirichlet(0.5) data, the ``backdoor`` attack (target 0)
inside the window 10:30. Per run: the final round's clean accuracy and attack success rate, the
largest ASR of the window, and the detection over the window's rounds (TPR: malicious rows
rejected; FPR: honest rows rejected). One line per (defense, seed), then the mean over seeds.
``--certify M``: after each CRFL run, parameter smoothing of its final model on the clean test split
(``defenses.crfl.certify``, σ = 0.01, α = 0.001, M copies; the setting of this run: T = 30,
t_adv = 10, R = 4 of 20, γ = 1, η = 0.2, τ = 10, q_B/n_B = 8/16)::

    PYTHONPATH=$PWD python benchmarks/snowball_crfl_digits.py --seeds 0 1 2 --certify 1000
    PYTHONPATH=$PWD python benchmarks/snowball_crfl_digits.py --defenses snowball \\
        --snowball '{"vae_hidden": 64, "vae_latent": 32, "vae_initial": 50, "vae_tuning": 10}'
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def run(defense: dict, seed: int, rounds: int = 30, window: str = "10:30", certify_m: int = 0) -> dict:
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
    fed = Federation(parse_scenario(doc))
    res = fed.run()
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
    out = {"defense": defense["name"], "seed": seed, "accuracy": last.accuracy, "asr": last.extra.get("asr"),
           "max_asr": max(asrs) if asrs else None, "tpr": tp / max(tp + fn, 1), "fpr": fp / max(fp + tn, 1),
           "seconds": time.time() - start}
    if certify_m and defense["name"] == "crfl":
        from defenses.crfl import CertifySetting, certify
        from redteam.federation.stages import model_view

        setting = CertifySetting(rounds=rounds, attack_round=lo, attackers=4, clients=20, scale=1.0, lr=0.2,
                                 local_steps=10, poison_per_batch=8, batch_size=16)
        cert = certify(model_view(fed), fed.final_params, fed.test_x, fed.test_y, sigma=0.01, M=certify_m,
                       alpha=0.001, setting=setting, generator=torch.Generator().manual_seed(seed))
        radii = cert.radius[cert.radius > 0]
        out.update(smoothed_accuracy=float(cert.correct.float().mean()), certified_accuracy=cert.certified_accuracy(),
                   median_radius=float(radii.median()) if radii.numel() else 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--defenses", nargs="+", default=["mean", "snowball", "crfl"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--snowball", default="{}", help="Snowball parameters (JSON)")
    ap.add_argument("--crfl", default="{}", help="CRFL parameters (JSON)")
    ap.add_argument("--certify", type=int, default=0, metavar="M", help="certify CRFL's final models with M copies")
    args = ap.parse_args()
    torch.set_num_threads(1)
    extra = {"snowball": json.loads(args.snowball), "crfl": json.loads(args.crfl)}
    rows = []
    for name in args.defenses:
        for seed in args.seeds:
            row = run({"name": name, **extra.get(name, {})}, seed, args.rounds, certify_m=args.certify)
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
