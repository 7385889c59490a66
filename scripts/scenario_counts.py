"""The cells and runs of each shipped scenario, counted by ``redteam matrix --dry-run``'s own
planner (:func:`redteam.runner.matrix_run.plan_matrix`), not by hand; ``--check`` compares them
with the "runs" column of the shipped-scenarios table in ``docs/scenarios.md``.

    python scripts/scenario_counts.py            # one line per scenario file
    python scripts/scenario_counts.py --check    # exit 1, naming each row that disagrees

A row names its file in the first column (`` `scenarios/NAME.toml` ``, one file) and starts its
last column with ``N cells × S seeds = R runs`` (R counts the no-attack baselines too; a time
may follow after a comma). Rows naming several files are left alone.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scenarios.md"
_ROW = re.compile(r"^\| `(scenarios/[\w./-]+\.toml)` \|.*\| ([^|]*) \|$")


def counts(path: Path) -> str:
    """``N cells × S seeds = R runs`` for the scenario file ``path`` (the distinct runs a matrix
    computes: every cell per seed, and the baselines they share)."""
    from redteam.runner.matrix_run import plan_matrix

    with tempfile.TemporaryDirectory() as tmp:
        plan = plan_matrix(path, Path(tmp) / "out")  # nothing is written: the store is only read
    seeds = sorted({len(c.seeds) for c in plan.cells})
    s = "–".join(map(str, seeds))
    return f"{len(plan.cells)} cells × {s} seed{'' if seeds == [1] else 's'} = {plan.total} runs"


def check(doc: Path = DOC) -> list[str]:
    """The table rows of ``doc`` whose runs column does not start with :func:`counts`."""
    wrong = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m is None:
            continue
        want = counts(ROOT / m.group(1))
        if not m.group(2).startswith(want):
            wrong.append(f"{m.group(1)}: the table says {m.group(2)!r}; the planner counts {want!r}")
    return wrong


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with docs/scenarios.md's table")
    args = ap.parse_args()
    if args.check:
        wrong = check()
        for w in wrong:
            print(w)
        return 1 if wrong else 0
    for f in sorted((ROOT / "scenarios").glob("*.toml")):
        try:
            print(f"scenarios/{f.name}: {counts(f)}")
        except Exception as exc:  # noqa: BLE001 - a file of another kind (limits.toml): say so, go on
            print(f"scenarios/{f.name}: not a matrix scenario ({type(exc).__name__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
