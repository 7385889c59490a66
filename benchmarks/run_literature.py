"""Run a literature table (scenarios/literature/) and print it beside the published numbers.

    python benchmarks/run_literature.py karimireddy            # runs both files, prints the table
    python benchmarks/run_literature.py shejwalkar --workers 2
    python benchmarks/run_literature.py sun --no-run --out results/literature   # reprint from the stores

Each table's scenario files run with ``redteam matrix FILE --out OUT/<file stem>
--executor process --workers N`` (``--resume`` when the store exists, so an interrupted
run continues); then the stores are read and the table printed as Markdown (the
tables of docs/literature.md are this output). ``--store DIR`` reads extra
stores (e.g. from a run of a subset of a table's cells) instead of running anything.

Published numbers. Karimireddy, He & Jaggi (ICLR 2022) show their MNIST runs with worker
momentum as curves (their exp3), not a table; the numbers beside ours are the mean of the
last 5 per-epoch test accuracies of seed 0 at β = 0.9 read from the run logs the authors
released with their code (``epfml/byzantine-robust-noniid-optimizer``,
``outputs/exp3/all/<agg>_<attack>_0.9_s<0|2>_seed0/stats``), the statistic their table
scripts compute. Shejwalkar & Houmansadr and Sun et al. are compared on their stated
qualitative findings (no numbers of theirs on digits exist to compare with).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LIT = ROOT / "scenarios" / "literature"

TABLES = {
    "karimireddy": ["karimireddy.toml", "karimireddy_seed1.toml"],
    "shejwalkar": ["shejwalkar.toml"],
    "sun": ["sun.toml"],
}

# Karimireddy et al.'s released MNIST logs (seed 0, worker momentum 0.9): mean of the last
# five per-epoch test accuracies (%), without bucketing (s = 0) and with bucketing (s = 2).
# Avg was not run against attacks in that experiment. Key: (attack label, aggregator label).
KARIMIREDDY_PUBLISHED: dict[tuple[str, str], tuple[float, float]] = {
    ("alie", "krum"): (11.37, 10.12), ("alie", "cm"): (9.82, 95.04),
    ("alie", "rfa"): (11.37, 97.29), ("alie", "cc"): (98.19, 98.06),
    ("ipm", "krum"): (9.82, 35.83), ("ipm", "cm"): (34.74, 59.63),
    ("ipm", "rfa"): (16.20, 96.28), ("ipm", "cc"): (97.77, 97.81),
    ("bit_flip", "krum"): (10.12, 56.19), ("bit_flip", "cm"): (42.30, 65.89),
    ("bit_flip", "rfa"): (82.82, 97.02), ("bit_flip", "cc"): (97.80, 97.76),
    ("label_flip", "krum"): (1.07, 45.76), ("label_flip", "cm"): (57.16, 69.53),
    ("label_flip", "rfa"): (95.85, 97.52), ("label_flip", "cc"): (97.76, 97.83),
    ("mimic", "krum"): (20.00, 59.04), ("mimic", "cm"): (57.33, 74.16),
    ("mimic", "rfa"): (83.54, 97.24), ("mimic", "cc"): (97.90, 97.93),
}
AGGREGATORS = ("avg", "krum", "cm", "rfa", "cc")
ATTACKS = ("alie", "ipm", "bit_flip", "label_flip", "mimic")


def run_file(path: Path, out: Path, workers: int) -> None:
    cmd = ["redteam", "matrix", str(path), "--out", str(out), "--executor", "process",
           "--workers", str(workers), "--quiet"]
    if (out / "results.sqlite").exists():
        cmd.append("--resume")
    print("$", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=False)


def load(store: Path) -> list[dict[str, Any]]:
    """Every finished run of a results store: attack, defense, settings, replicate, metrics."""
    db = store / "results.sqlite"
    if not db.exists():
        raise SystemExit(f"run_literature: no results store at {db}")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT attack, defense, settings, replicate, baseline, metrics FROM runs").fetchall()
    finally:
        con.close()
    return [{"attack": a, "defense": d, "settings": json.loads(s), "replicate": r, "baseline": bool(b),
             "metrics": json.loads(m)} for a, d, s, r, b, m in rows]


def _cells(rows: list[dict[str, Any]], metric: str) -> dict[tuple[str, str, tuple], list[float]]:
    """(attack, defense, settings) → the metric's value per replicate (baselines as attack 'none')."""
    out: dict[tuple[str, str, tuple], dict[int, float]] = defaultdict(dict)
    for r in rows:
        v = r["metrics"].get(metric)
        if v is None:
            continue
        attack = "none" if r["baseline"] else r["attack"]
        out[(attack, r["defense"], tuple(sorted(r["settings"].items())))][r["replicate"]] = float(v)
    return {k: [v[i] for i in sorted(v)] for k, v in out.items()}


def _pct(vals: list[float] | None) -> str:
    if not vals:
        return "…"
    s = f"{100 * mean(vals):.1f}"
    return s if len(vals) == 1 else f"{s} ({len(vals)} seeds)"


def karimireddy(rows: list[dict[str, Any]]) -> str:
    cells = _cells(rows, "final_accuracy_last_k")
    lines = []
    for beta in (0.9, 0.0):
        key = (("federation.client_momentum", beta),)
        if not any(k[2] == key for k in cells):
            continue
        pub = " | authors' MNIST logs (β = 0.9, seed 0)" if beta == 0.9 else ""
        lines.append(f"\nworker momentum β = {beta}: test accuracy (%), mean of the last 5 evaluations "
                     f"(digits, ours){pub}\n")
        head = "| attack | aggregator | ours | ours + bucketing |"
        lines.append(head + (" published | published + bucketing |" if beta == 0.9 else ""))
        lines.append("|---|---|---:|---:|" + ("---:|---:|" if beta == 0.9 else ""))
        for attack in ("none", *ATTACKS):
            for agg in AGGREGATORS:
                plain = cells.get((attack, agg, key))
                buck = cells.get((attack, f"bucketing+{agg}", key))
                row = f"| {attack} | {agg} | {_pct(plain)} | {_pct(buck)} |"
                if beta == 0.9:
                    pub = KARIMIREDDY_PUBLISHED.get((attack, agg))
                    row += f" {pub[0]:.1f} | {pub[1]:.1f} |" if pub else " — | — |"
                lines.append(row)
    return "\n".join(lines)


def grid(rows: list[dict[str, Any]], metric: str, scale: float = 100.0) -> str:
    """Attacks × defenses of one metric, one table per settings combination."""
    cells = _cells(rows, metric)
    settings = sorted({k[2] for k in cells})
    attacks = list(dict.fromkeys(k[0] for k in sorted(cells, key=lambda k: k[0] != "none")))
    defenses = list(dict.fromkeys(r["defense"] for r in rows))
    lines = []
    for st in settings:
        label = ", ".join(f"{k.rsplit('.', 1)[-1]} = {v}" for k, v in st) or "all cells"
        lines.append(f"\n{metric} ({label})\n")
        lines.append("| attack | " + " | ".join(defenses) + " |")
        lines.append("|---|" + "---:|" * len(defenses))
        for a in attacks:
            vals = [cells.get((a, d, st)) for d in defenses]
            lines.append(f"| {a} | " + " | ".join(
                "…" if not v else f"{scale * mean(v):.1f}" for v in vals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table", choices=sorted(TABLES))
    p.add_argument("--out", type=Path, default=Path("results/literature"), help="stores go to OUT/<file stem>")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-run", action="store_true", help="only read the stores and print")
    p.add_argument("--store", type=Path, action="append", default=[], help="read this store too (no run)")
    a = p.parse_args(argv)
    stores = list(a.store)
    if not a.store:
        for name in TABLES[a.table]:
            out = a.out / Path(name).stem
            if not a.no_run:
                run_file(LIT / name, out, a.workers)
            stores.append(out)
    rows = [r for s in stores for r in load(s)]
    if a.table == "karimireddy":
        print(karimireddy(rows))
    elif a.table == "shejwalkar":
        print(grid(rows, "final_accuracy_last_k"))
        print(grid(rows, "accuracy_drop"))
    else:
        print(grid(rows, "asr"))
        print(grid(rows, "final_accuracy_last_k"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
