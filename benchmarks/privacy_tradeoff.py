"""The privacy–utility trade-off of a ``[privacy]`` matrix, as a table and a plot.

    python benchmarks/privacy_tradeoff.py results/privacy_membership/results.sqlite docs/img/privacy_tradeoff.png

Reads a results store written by ``redteam matrix``, prints one markdown row per cell (defense,
settings): seed means with 95 % t-intervals of accuracy and of the privacy metrics, and ε. With a
second argument, draws membership AUC and accuracy against ε (the undefended cell at the right).
"""

from __future__ import annotations

import json
import math
import sqlite3
import sys
from collections import defaultdict

from redteam.scoring import mean_ci, metric_range

METRICS = ("final_accuracy", "asr", "reconstruction_psnr", "label_recovery", "mia_auc", "mia_tpr_at_1pct_fpr",
           "epsilon", "example_epsilon", "recall", "fpr")


def cells(db: str) -> dict[tuple[str, str, str], dict[str, list[float | None]]]:
    con = sqlite3.connect(db)
    out: dict[tuple[str, str, str], dict[str, list[float | None]]] = defaultdict(lambda: defaultdict(list))
    for attack, defense, settings, baseline, metrics in con.execute(
            "select attack, defense, settings, baseline, metrics from runs order by cell_id, replicate"):
        m = json.loads(metrics)
        key = (("none" if baseline else attack), defense, settings)
        for k in METRICS:
            out[key][k].append(m.get(k))
    return out


def fmt(ci: dict) -> str:
    if ci["mean"] is None:
        return "—"
    if ci["lo"] is None or ci["n"] < 2:
        return f"{ci['mean']:.3g}"
    return f"{ci['mean']:.3g} [{ci['lo']:.3g}, {ci['hi']:.3g}]"


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    data = cells(sys.argv[1])
    shown = [k for k in METRICS if any(any(v is not None for v in c[k]) for c in data.values())]
    print("| attack | defense | settings | " + " | ".join(shown) + " |")
    print("|---|---|---|" + "---|" * len(shown))
    for (attack, defense, settings), c in sorted(data.items()):
        row = [fmt(mean_ci(c[k], bounds=metric_range(k))) for k in shown]
        print(f"| {attack} | {defense} | {settings if settings != '{}' else ''} | " + " | ".join(row) + " |")
    if len(sys.argv) > 2:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        pts = []
        for (attack, defense, _), c in data.items():
            if attack != "none" or all(v is None for v in c["mia_auc"]):
                continue
            eps = [v for v in c["epsilon"] if v is not None]
            pts.append((eps[0] if eps else math.inf, defense, mean_ci(c["mia_auc"]), mean_ci(c["final_accuracy"])))
        pts.sort(key=lambda p: p[0])
        finite = [p[0] for p in pts if math.isfinite(p[0])]
        right = (max(finite) * 4) if finite else 1.0
        xs = [p[0] if math.isfinite(p[0]) else right for p in pts]
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for key, label, colour in ((2, "LiRA AUC (members vs held-out)", "tab:red"), (3, "clean accuracy", "tab:blue")):
            ys = [p[key]["mean"] for p in pts]
            err = [[p[key]["mean"] - (p[key]["lo"] if p[key]["lo"] is not None else p[key]["mean"]) for p in pts],
                   [(p[key]["hi"] if p[key]["hi"] is not None else p[key]["mean"]) - p[key]["mean"] for p in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label, color=colour)
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{p[0]:.3g}" if math.isfinite(p[0]) else "no DP" for p in pts])
        ax.set_xlabel("client-level ε at δ = 1e-5 (dp-accounting, RDP)")
        ax.set_ylim(0, 1)
        ax.legend(loc="lower right", fontsize=8)
        ax.set_title("DP-FedAvg on digits: membership leakage vs utility (3 seeds, 95 % CI)", fontsize=9)
        fig.tight_layout()
        fig.savefig(sys.argv[2], dpi=110)
        print(f"plot: {sys.argv[2]}")


if __name__ == "__main__":
    main()
