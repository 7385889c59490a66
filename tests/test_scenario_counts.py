"""docs/scenarios.md's table of shipped scenarios states each file's cells, seeds and runs as the
matrix planner counts them (issue 40 §5: "gossip, 8 cells" had 12)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("scenario_counts", ROOT / "scripts" / "scenario_counts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_shipped_scenarios_table_counts_what_the_planner_counts(tmp_path):
    sc = _script()
    assert sc.check() == []
    assert sc.counts(ROOT / "scenarios" / "gossip.toml") == "12 cells × 3 seeds = 48 runs"
    # a row that disagrees is named (the check can fail)
    stale = tmp_path / "scenarios.md"
    row = next(line for line in (ROOT / "docs" / "scenarios.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `scenarios/gossip.toml` |"))
    stale.write_text(row.replace("| 12 cells × 3 seeds = 48 runs,", "| 8 cells × 3 seeds = 48 runs,") + "\n",
                     encoding="utf-8")
    (wrong,) = sc.check(stale)
    assert wrong.startswith("scenarios/gossip.toml: the table says '8 cells × 3 seeds")
