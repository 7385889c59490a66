"""Backdoor detectors on a small real run: digits, 20 clients (4 malicious), 30 rounds, attack window 10:30: clean accuracy, ASR and
detection precision/recall of rflbat / multi_metrics / alignins vs mean, over seeds."""
import json, sys, time
import torch
torch.set_num_threads(1)
from redteam.federation.loop import Federation
from redteam.scenario import parse_scenario

BACKDOOR = {"name": "backdoor", "target": 0, "fraction": 0.5, "window": "10:30"}
REPLACE = {"name": "compose", "attacks": [{"name": "backdoor", "target": 0, "fraction": 0.5},
                                          {"name": "model_replacement"}], "window": "10:30"}
DEFENSES = {
    "mean": {"name": "mean"},
    "rflbat": {"name": "rflbat"},
    "multi_metrics": {"name": "multi_metrics"},
    "multi_metrics[pairwise]": {"name": "multi_metrics", "features": "pairwise"},
    "alignins": {"name": "alignins"},
    "alignins[mean_update]": {"name": "alignins", "tda_reference": "mean_update"},
}


def run(attack, defense, seed):
    sc = parse_scenario({
        "scenario": {"seed": seed},
        "workload": {"name": "digits"},
        "federation": {"clients": 20, "rounds": 30, "partition": "dirichlet", "alpha": 0.5, "lr": 0.2,
                       "malicious_fraction": 0.2},
        "attack": attack, "defense": defense,
    })
    recs = Federation(sc).run().records
    tp = fp = fn = 0
    for r in recs[10:30]:
        for c, m in enumerate(r.malicious):
            rej = not r.accepted[c]
            tp += m and rej
            fp += (not m) and rej
            fn += m and not rej
    # false positives outside the window (attackers honest there too)
    fp_clean = sum((not r.accepted[c]) for r in recs[:10] for c in range(len(r.accepted)))
    n_clean = sum(len(r.accepted) for r in recs[:10])
    last = recs[-1]
    return {"acc": last.accuracy, "asr": last.extra.get("asr"), "tp": tp, "fp": fp, "fn": fn,
            "fpr_before": fp_clean / n_clean}


def table(rows):
    """Per (attack, defense): final clean accuracy and ASR (mean ± sd over seeds), detection
    precision and recall pooled over the window's rounds, rejection rate before the window."""
    import statistics as st
    from collections import defaultdict

    groups = defaultdict(list)
    for r in rows:
        groups[(r["attack"], r["defense"])].append(r)
    print(f"{'attack':9} {'defense':24} {'clean acc':>13} {'ASR':>13} {'prec':>5} {'recall':>6} {'rej<10':>6}")
    for (a, d), rs in groups.items():
        acc, asr = [r["acc"] for r in rs], [r["asr"] for r in rs]
        tp, fp, fn = (sum(r[k] for r in rs) for k in ("tp", "fp", "fn"))
        prec = f"{tp / (tp + fp):5.2f}" if tp + fp else "    —"
        sd = (lambda v: st.stdev(v) if len(v) > 1 else 0.0)
        print(f"{a:9} {d:24} {st.mean(acc):.3f}±{sd(acc):.3f} {st.mean(asr):.3f}±{sd(asr):.3f} {prec} "
              f"{tp / (tp + fn):6.2f} {st.mean(r['fpr_before'] for r in rs):6.2f}")


if __name__ == "__main__":
    # python scripts/bench_backdoor_detectors.py [seeds, default 0,1,2]
    seeds = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "0,1,2").split(",")]
    rows = []
    for attack, spec in (("backdoor", BACKDOOR), ("replace", REPLACE)):
        for which, defense in DEFENSES.items():
            for s in seeds:
                t = time.time()
                out = run(spec, defense, s)
                out.update(defense=which, attack=attack, seed=s, secs=round(time.time() - t, 1))
                print(json.dumps(out), file=sys.stderr, flush=True)
                rows.append(out)
    table(rows)
