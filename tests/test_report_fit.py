"""Tables never lose a number (issue 11 §1): at any terminal width every value is shown
whole (columns are stacked, headers wrap), never cut to "…"; progress in a log is plain
lines with done/total, elapsed, ETA and the step just finished."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from redteam.report.fit import FitColumn, fit_tables
from redteam.report.load import report_from_rows
from redteam.report.tables import print_tables
from redteam.runner.progress import PlainProgress


def _render(width, columns, rows, keep=1):
    con = Console(width=width, file=io.StringIO(), color_system=None)
    for _, t in fit_tables(width, columns, rows, keep=keep):
        con.print(t)
    return con.file.getvalue()


VALUES = ["0.150 ± 0.635", "144.6 KiB", "1.000 / 1.000", "-0.058*"]


@pytest.mark.parametrize("width", [30, 40, 60, 80, 120])
def test_no_value_is_ever_cut(width):
    columns = [FitColumn("attack \\ defense", "left")] + [FitColumn(f"defense number {i}") for i in range(9)]
    rows = [[f"attack_{r}", *[VALUES[(r + i) % 4] for i in range(9)]] for r in range(3)]
    out = _render(width, columns, rows)
    assert "…" not in out
    assert all(len(line) <= width for line in out.splitlines())
    # every value appears whole, on one line, as often as it is in the rows
    for v in VALUES:
        assert out.count(v) == sum(row.count(v) for row in rows)
    # the row labels are repeated in every stacked table
    n_tables = out.count("┏")
    assert out.count("attack_0") == n_tables


def test_one_table_when_it_fits_and_headers_unwrapped():
    columns = [FitColumn("attack", "left"), FitColumn("mean"), FitColumn("median")]
    out = _render(80, columns, [["sign_flip", "0.805", "0.276"]])
    assert out.count("┏") == 1 and "│ sign_flip │ 0.805 │  0.276 │" in out


def _report():
    rows = []
    for d in range(8):
        for a in ("sign_flip", "gaussian"):
            rows.append({"cell_id": f"defense_{d}[{a}]", "attack": a, "defense": f"defense_{d}", "settings": {},
                         "replicate": 0, "seed": 1, "finished": True,
                         "metrics": {"accuracy_drop": 0.123456 + d / 100}})
    return report_from_rows(rows)


def test_report_table_at_80_columns_stacks_instead_of_ellipsizing():
    con = Console(width=80, file=io.StringIO(), color_system=None)
    print_tables(con, _report(), ["accuracy_drop"])
    out = con.file.getvalue()
    body = out[out.index("accuracy_drop (defenses"):]
    assert "…" not in body  # the legend's "… not run yet" is above the tables
    for d in range(8):
        assert f"{0.123456 + d / 100:.3f}" in body
    assert "(defenses 1–" in body  # stacked, and the titles say which defenses each part shows


def test_run_table_at_80_columns(tmp_path):
    from redteam.cli import _print_table

    doc = {"scenario": {"name": "s", "seed": 0, "spec": {"workload": {"name": "digits"},
                                                         "federation": {"clients": 20, "rounds": 2,
                                                                        "target_accuracy": 0.85}}},
           "runs": [{"attack": a, "defense": "norm_bound", "baseline": a == "none", "malicious": [1, 2],
                     "metrics": {"final_accuracy": 0.582, "accuracy_drop": 0.058, "rounds_to_target": None,
                                 "bytes_on_wire": 148070, "dropped_updates": 0, "rejected_updates": 8,
                                 "precision": 1.0, "recall": 1.0, "fpr": 0.0}} for a in ("none", "sign_flip")]}
    con = Console(width=80, file=io.StringIO(), color_system=None)
    _print_table(con, doc)
    out = con.file.getvalue()
    assert "…" not in out and all(len(ln) <= 80 for ln in out.splitlines())
    for v in ("58.2%", "5.8%", "144.6 KiB", "1.000 / 1.000", "0.000", "none (baseline)"):
        assert v in out


def test_plain_progress_lines():
    t = [100.0]
    buf = io.StringIO()
    p = PlainProgress("matrix", "runs", interval=5.0, stream=buf, clock=lambda: t[0])
    p.update(2, 10, "first")          # resumed: 2 already done; nothing printed yet
    t[0] = 160.0
    p.update(3, 10, "a[x] seed 0")    # the first run here, 60 s with the process's warm-up: no ETA from it
    t[0] = 162.0
    p.update(4, 10, "b seed 0")       # 2 s after the last line: not due
    t[0] = 170.0
    p.update(5, 10, "c seed 0")       # 2 runs in 10 s since the first → 5 left: ETA 25 s
    t[0] = 190.0
    p.update(10, 10, "c seed 1")      # the last one is always printed
    lines = buf.getvalue().splitlines()
    assert lines == [
        "redteam: matrix 3/10 runs, 0:01:00 elapsed, ETA ?, just finished: a[x] seed 0",
        "redteam: matrix 5/10 runs, 0:01:10 elapsed, ETA 0:00:25, just finished: c seed 0",
        "redteam: matrix 10/10 runs, 0:01:30 elapsed, ETA 0:00:00, just finished: c seed 1",
    ]


def test_the_first_eta_leaves_out_the_first_runs_warm_up():
    """issue 40 §5: a 48-run matrix whose first run pays a 60 s warm-up and whose runs take 5 s:
    the old estimate at 1/48 (65 s × 47 ≈ 51 min) was ten times the 4 minutes left; no ETA is given
    until two runs have finished after the first, and then it is the runs' own rate."""
    from redteam.runner.progress import ETA_AFTER, Eta

    t = [0.0]
    eta = Eta(clock=lambda: t[0])
    eta.update(0)
    assert eta.text(0, 48) == "ETA ?"
    t[0] = 65.0
    eta.update(1)
    assert eta.text(1, 48) == "ETA ?" and ETA_AFTER == 2
    t[0] = 70.0
    eta.update(2)
    assert eta.text(2, 48) == "ETA ?"  # one run after the first: not yet
    t[0] = 75.0
    eta.update(3)
    assert eta.text(3, 48) == "ETA 0:03:45"  # 5 s a run × 45 left
    assert eta.text(48, 48) == "ETA 0:00:00"


def test_matrix_in_a_log_prints_plain_progress(tmp_path, capsys, monkeypatch):
    from redteam.cli import main

    monkeypatch.setenv("REDTEAM_PROGRESS_S", "0")
    f = tmp_path / "m.toml"
    f.write_text('[scenario]\nname = "p"\n[workload]\nname = "synthetic"\nsamples = 300\n[federation]\n'
                 'clients = 4\nrounds = 1\nmalicious_fraction = 0.25\n[matrix]\nattacks = ["sign_flip"]\n'
                 'defenses = ["mean"]\n')
    assert main(["matrix", str(f), "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("redteam: matrix ")]
    assert len(lines) == 2
    assert re.fullmatch(r"redteam: matrix 1/2 runs, \d:\d\d:\d\d elapsed, ETA \?, "
                        r"just finished: baseline mean\[none\] seed 0", lines[0])
    assert lines[1].startswith("redteam: matrix 2/2 runs") and lines[1].endswith("mean[sign_flip] seed 0")
