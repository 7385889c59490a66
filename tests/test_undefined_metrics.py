"""A metric that cannot be computed is undefined with its reason, never a crash (issue 22 §2).

The general rule behind the mean_ci fix: whatever a metric's arithmetic does on a run's legal
but extreme values (overflow, division by zero, a math-domain error, NaN or ±inf), the run
is recorded with that metric ``None`` and the reason under ``metrics["undefined"]``, the
matrix goes on, and ``redteam report`` opens the store in every format and says why.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

import redteam.scoring as scoring
from redteam.scoring import UNDEFINED, mean_ci, summarize, undefined_reasons
from redteam.types import RoundRecord

R0 = RoundRecord(round=0, accuracy=0.5, loss=1.0, accepted=[True, False], malicious=[False, True],
                 participating=[True, True], rejected={1: "x"}, sim_time_s=1.0)
R1 = RoundRecord(round=1, accuracy=0.9, loss=0.5, accepted=[True, True], malicious=[False, True],
                 participating=[True, True], sim_time_s=2.0)


@pytest.mark.parametrize("error", [OverflowError("int too large to convert to float"),
                                   ZeroDivisionError("float division by zero"),
                                   ValueError("math domain error"),
                                   FloatingPointError("overflow encountered")])
def test_a_metric_that_raises_is_undefined_with_its_reason(monkeypatch, error):
    def boom(records):
        raise error

    monkeypatch.setattr(scoring, "envelope", boom)
    out = summarize([R0, R1], [R0, R1])
    for key in ("envelope_norm", "envelope_cos", "envelope_cos_margin"):
        assert out[key] is None
        assert out[UNDEFINED][key] == f"could not be computed: {type(error).__name__}: {error}"
    # the rest of the run's metrics are kept
    assert out["final_accuracy"] == 0.9 and out["recall"] == 0.5 and out["sim_time_s"] == 3.0
    assert out["accuracy_drop"] == 0.0 and set(out[UNDEFINED]) == {"envelope_norm", "envelope_cos",
                                                                    "envelope_cos_margin"}


def test_a_group_that_raises_only_takes_its_own_metrics(monkeypatch):
    def boom(records, *a, **k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(scoring, "pipeline_metrics", boom)
    monkeypatch.setattr(scoring, "detection", boom)
    out = summarize([R0, R1])
    assert out["idle_share"] is None and "ZeroDivisionError" in out[UNDEFINED]["idle_share"]
    assert out["tp"] is None and out["precision"] is None and "tp" in out[UNDEFINED]
    assert out["final_accuracy"] == 0.9 and "final_accuracy" not in out[UNDEFINED]


@pytest.mark.parametrize("value, says", [(math.inf, "left float64's range"), (-math.inf, "left float64's range"),
                                         (math.nan, "gave NaN")])
def test_a_metric_that_is_not_finite_is_undefined_with_its_reason(monkeypatch, value, says):
    monkeypatch.setattr(scoring, "attack_success_rate", lambda records: value)
    out = summarize([R0, R1])
    assert out["asr"] is None and says in out[UNDEFINED]["asr"]


def test_a_simulated_time_past_float64_is_undefined_not_inf():
    huge = RoundRecord(round=0, accuracy=0.5, loss=1.0, accepted=[True], malicious=[False], participating=[True],
                       sim_time_s=1.7e308)
    out = summarize([huge, dataclasses.replace(huge, round=1)])  # 1.7e308 + 1.7e308 = inf
    assert out["sim_time_s"] is None and "float64's range" in out[UNDEFINED]["sim_time_s"]
    assert out["final_accuracy"] == 0.5


def test_undefined_reasons_reads_old_and_odd_stores():
    assert undefined_reasons({"asr": None}) == {}  # a store written before reasons were kept
    assert undefined_reasons({"undefined": "junk"}) == {}
    assert undefined_reasons(None) == {}
    assert undefined_reasons({"undefined": {"asr": "why", "x": 3}}) == {"asr": "why"}


def test_an_interval_past_float64_has_no_ends_but_a_mean():
    ci = mean_ci([1.7e308, -1.7e308, 1.7e308])
    assert ci["mean"] == pytest.approx(1.7e308 / 3) and ci["lo"] is None and ci["hi"] is None
    assert "float64" in ci["undefined"] and ci["n"] == 3
    assert mean_ci([1.0, 2.0])["lo"] == pytest.approx(1.5 - 12.706 * 0.5)


# ---------------------------------------------------------------- the matrix and the report

SCENARIO = textwrap.dedent(
    """\
    [scenario]
    name = "extreme"
    seed = 1
    [workload]
    name = "synthetic"
    samples = 200
    [federation]
    clients = 4
    rounds = 1
    malicious_fraction = 0.25
    [transport.network]
    # legal values: simulated times of 1e308 ms and more, past float64 once summed
    latency_ms = 1.7e308
    latency_sigma = 50.0
    bandwidth_mbps = 1e-300
    compute_s_per_step = 1.7e308
    [matrix]
    attacks = ["ipm"]
    defenses = ["mean"]
    seeds = 1
    """
)


def _cli(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-W", "ignore", "-m", "redteam.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _report_everything(out, tmp_path, *, subprocess_table=False):
    """Every format of ``redteam report`` opens the store; the texts, by format (the table
    through a real ``redteam report`` process when asked, the rest through its ``main``)."""
    from redteam.cli import main

    got = {}
    for fmt in ("table", "md", "json", "csv", "html"):
        dest = tmp_path / f"report.{fmt}"
        args = ["report", str(out), "--format", fmt, "--metric", "sim_time_s,accuracy_drop,envelope_norm",
                "--out", str(dest)]
        if subprocess_table and fmt == "table":
            res = _cli(*args, cwd=tmp_path)
            assert res.returncode == 0, (fmt, res.stdout[-2000:], res.stderr[-2000:])
        else:
            assert main(args) == 0, fmt
        got[fmt] = dest.read_text()
    return got


def test_extreme_network_values_through_the_matrix_cli_and_the_report(tmp_path):
    (tmp_path / "m.toml").write_text(SCENARIO)
    res = _cli("matrix", "m.toml", "--out", "out", "--quiet", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    from redteam.runner.store import ResultsStore

    with ResultsStore(tmp_path / "out", create=False) as st:
        runs = st.results()
    assert runs and all(r["finished"] for r in runs)
    for r in runs:
        m = r["metrics"]
        assert m["sim_time_s"] is None and "float64's range" in m[UNDEFINED]["sim_time_s"]
        assert m["final_accuracy"] is not None  # the rest of the run is reported
    got = _report_everything(tmp_path / "out", tmp_path, subprocess_table=True)
    assert "sim_time_s undefined for mean[ipm]: not a finite number (inf)" in got["table"]
    assert "sim_time_s undefined for mean" in got["md"] and "sim_time_s undefined for mean" in got["html"]
    cell = json.loads(got["json"])["cells"][0]
    assert cell["metrics"]["sim_time_s"]["mean"] is None and "float64" in cell["undefined"]["sim_time_s"]


def test_a_metric_that_raises_in_the_matrix_is_recorded_and_reported(tmp_path, monkeypatch):
    from redteam.runner.matrix_run import run_matrix

    def boom(records):
        raise OverflowError("(34, 'Numerical result out of range')")

    monkeypatch.setattr(scoring, "envelope", boom)
    (tmp_path / "m.toml").write_text(SCENARIO.replace("latency_ms = 1.7e308", "latency_ms = 40.0")
                                     .replace("compute_s_per_step = 1.7e308", "compute_s_per_step = 0.01")
                                     .replace("bandwidth_mbps = 1e-300", "bandwidth_mbps = 50.0"))
    summary = run_matrix(tmp_path / "m.toml", tmp_path / "out", workers=1)
    assert summary.computed == summary.total == 2
    got = _report_everything(tmp_path / "out", tmp_path)
    assert "envelope_norm undefined for mean[ipm]: could not be computed: OverflowError" in got["table"]
    assert "(1 of 1 seed)" in got["table"]
    assert "OverflowError" in json.loads(got["json"])["cells"][0]["undefined"]["envelope_norm"]
