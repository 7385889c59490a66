"""Chameleon vs plain pixel backdoor on digits: durability after the attack window (attacks/chameleon.py).

Usage: PYTHONPATH=$PWD python scripts/chameleon_durability.py CONFIGS SEEDS MAL_FRACTION ROUNDS WINDOW AFTER_K > out.jsonl
(WL=cnn for the digits CNN); then python scripts/chameleon_durability_summary.py out.jsonl ..."""
import sys, json, time, torch
torch.set_num_threads(1)
from redteam.scenario import parse_scenario
from redteam.federation.loop import Federation
from redteam.scoring import durability

WL = __import__("os").environ.get("WL", "mlp")
PAT = [[-4, -2], [-3, -3], [-2, -4], [-2, -2]]
CONFIGS = {
    "backdoor": {"name": "backdoor", "trigger": PAT, "target": 2},
    "chameleon": {"name": "chameleon"},
    "cham_baseline": {"name": "chameleon", "contrastive_epochs": 0, "freeze_encoder": False, "head_epochs": 5,
                      "head_lr": 0.1, "head_gamma": 0.01},
    "chameleon_emnist": {"name": "chameleon", "contrastive_lr": 0.05, "contrastive_gamma": 0.005, "fac_scale_weight": 3.0},
    "cham_v1": {"name": "chameleon", "contrastive_lr": 0.05, "contrastive_gamma": 0.005, "fac_scale_weight": 3.0,
                "head_epochs": 5, "head_lr": 0.1, "head_gamma": 0.01},
    "cham_v2": {"name": "chameleon", "contrastive_lr": 0.05, "contrastive_gamma": 0.005, "fac_scale_weight": 3.0,
                "head_epochs": 5, "head_lr": 0.1, "head_gamma": 0.01, "freeze_encoder": False},
    "backfed_cham": {"name": "chameleon", "poison_fraction": 0.3125, "noise": 0.0, "fac_scale_weight": 2.0,
                     "contrastive_lr": 0.015, "contrastive_gamma": 0.3, "head_lr": 0.05, "head_epochs": 6,
                     "head_gamma": 0.1, "freeze_encoder": False, "batches_per_epoch": None, "norm_bound": None},
    "backfed_base": {"name": "chameleon", "poison_fraction": 0.3125, "noise": 0.0, "contrastive_epochs": 0,
                     "head_lr": 0.05, "head_epochs": 6,
                     "head_gamma": 0.1, "freeze_encoder": False, "batches_per_epoch": None, "norm_bound": None},
    "backdoor+mr": {"name": "compose", "attacks": [{"name": "backdoor", "trigger": PAT, "target": 2},
                                                    {"name": "model_replacement"}]},
}

def run(cfg, seed, mal, rounds, window, k):
    atk = dict(CONFIGS[cfg]); atk.update(window=window, after_k=k)
    sc = parse_scenario({"scenario": {"seed": seed}, "workload": {"name": "digits", "model": WL},
                         "federation": {"clients": 20, "malicious_fraction": mal, "rounds": rounds},
                         "attack": atk})
    res = Federation(sc).run()
    asr = [round(r.extra.get("asr", float("nan")), 3) for r in res.records]
    acc = [round(r.accuracy, 3) for r in res.records]
    out = {}
    for th in (0.5, 0.25):
        dur = durability(res.records, after_k=k, threshold=th)
        out[th] = dur
    return asr, acc, out

if __name__ == "__main__":
    cfgs = sys.argv[1].split(",")
    seeds = [int(s) for s in sys.argv[2].split(",")]
    mal = float(sys.argv[3]); rounds = int(sys.argv[4]); window = sys.argv[5]; k = int(sys.argv[6])
    for cfg in cfgs:
        for s in seeds:
            t = time.time()
            asr, acc, d = run(cfg, s, mal, rounds, window, k)
            print(json.dumps({"cfg": cfg, "seed": s, "secs": round(time.time() - t, 1), "asr": asr, "acc": acc,
                              "d50": d[0.5], "d25": d[0.25]}), flush=True)
