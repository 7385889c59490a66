"""`redteam run` shows "n/a (does not reject)" for a defense that flagged nothing in any run,
as the matrix report does, not a recall of 0.000 (issue 24 §1)."""

from __future__ import annotations

import io

from rich.console import Console

from redteam.cli import main
from redteam.report.run_table import flags_nothing, print_run_table

TINY = """\
[scenario]
name = "t"
seed = 1
[workload]
name = "synthetic"
samples = 300
[federation]
clients = 4
rounds = 2
malicious_fraction = 0.25
[attack]
name = "sign_flip"
[defense]
name = "DEFENSE"
"""


def _doc(tp: int, fp: int, base_fp: int = 0) -> dict:
    def run(baseline: bool, tp: int, fp: int) -> dict:
        fn, tn = (0 if baseline else 2) - (0 if baseline else tp), 6 - fp
        m = {"final_accuracy": 0.8, "accuracy_drop": 0.0, "rounds_to_target": None, "bytes_on_wire": 10,
             "dropped_updates": 0, "rejected_updates": tp + fp, "tp": tp, "fp": fp, "tn": tn, "fn": fn,
             "precision": tp / (tp + fp) if tp + fp else None, "recall": None if baseline else tp / 2,
             "fpr": fp / 6}
        return {"attack": "none" if baseline else "ipm", "defense": "d", "baseline": baseline, "metrics": m,
                "malicious": [0], "rounds": [{}] * 2}
    return {"scenario": {"name": "x", "seed": 0, "spec": {"workload": {"name": "synthetic"},
                                                           "federation": {"clients": 4, "rounds": 2,
                                                                          "target_accuracy": 0.9}}},
            "runs": [run(True, 0, base_fp), run(False, tp, fp)]}


def _table(doc: dict) -> str:
    buf = io.StringIO()
    print_run_table(Console(file=buf, width=200, color_system=None), doc)
    return buf.getvalue()


def test_a_rule_that_flags_nothing_reads_n_a():
    assert flags_nothing(_doc(0, 0))
    text = _table(_doc(0, 0))
    row = next(line for line in text.splitlines() if "ipm" in line)
    assert "n/a (does not reject)" in row and "0.000" not in row.split("│")[-3]
    assert "flagged no update in any run" in text


def test_a_rule_that_flagged_anything_anywhere_keeps_its_figures():
    assert not flags_nothing(_doc(0, 0, base_fp=1))  # flagged an honest update in the baseline: a miss is a miss
    row = next(line for line in _table(_doc(0, 0, base_fp=1)).splitlines() if "ipm" in line)
    assert "n/a" not in row and "0.000" in row
    assert not flags_nothing(_doc(1, 0))
    doc = _doc(0, 0)
    del doc["runs"][0]["metrics"]["tp"]  # counts unknown: no claim
    assert not flags_nothing(doc)


def test_redteam_run_mean_shows_n_a_and_krum_its_recall(tmp_path, capsys):
    f = tmp_path / "t.toml"
    f.write_text(TINY.replace("DEFENSE", "mean"))
    assert main(["run", str(f), "--quiet", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "sign_flip" in line)
    assert "n/a (does not reject)" in row and "/ 0.000" not in row
    f.write_text(TINY.replace("DEFENSE", "krum"))
    assert main(["run", str(f), "--quiet", "--device", "cpu"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "sign_flip" in line)
    assert "n/a" not in row and "1.000" in row
