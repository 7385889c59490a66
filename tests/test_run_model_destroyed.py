"""A run whose model was destroyed says so (issue 18 §4, part 4): `redteam run`'s row reads
"model destroyed (non-finite loss from round k)" instead of an accuracy, one warning line
follows the table, and the JSON says ``model_destroyed`` with the round; exit status 0."""

from __future__ import annotations

import io
import json
import math
import textwrap

from rich.console import Console

from redteam.cli import main
from redteam.report.aggregate import model_broke
from redteam.report.run_table import print_run_table
from redteam.runner.single import model_destroyed_round
from redteam.types import RoundRecord

# Finite but huge Gaussian rows (σ = 3e37) from 1 of 4 clients under a plain mean: the
# round loop refuses the first step that would overflow the model, but the next mean is a
# finite model whose logits differ by more than float32 holds, so its loss is +inf from
# round 2 on. (The `nonfinite` attack does not get this far: its NaN rows are dropped
# before aggregation.)
BOOM = textwrap.dedent(
    """\
    [scenario]
    name = "boom"
    seed = 3
    [workload]
    name = "synthetic"
    samples = 300
    [federation]
    clients = 4
    rounds = 3
    malicious_fraction = 0.25
    [attack]
    name = "gaussian"
    std = 3e37
    [defense]
    name = "mean"
    """
)


def _rec(rnd: int, loss: float, **extra: object) -> RoundRecord:
    return RoundRecord(round=rnd, accuracy=0.5, loss=loss, accepted=[], malicious=[], participating=[],
                       extra=dict(extra))


def test_destroyed_round_is_where_the_non_finite_tail_starts():
    inf, nan = math.inf, math.nan
    assert model_destroyed_round([_rec(0, 1.0), _rec(1, 0.9)]) is None
    assert model_destroyed_round([]) is None
    assert model_destroyed_round([_rec(0, 1.0), _rec(1, inf), _rec(2, nan)]) == 2  # 1-based
    assert model_destroyed_round([_rec(0, inf), _rec(1, 0.5), _rec(2, inf)]) == 3  # the tail, not a blip
    assert model_destroyed_round([_rec(0, inf), _rec(1, 0.5)]) is None  # recovered: the last loss is finite
    assert model_destroyed_round([_rec(0, 1.0), _rec(1, 1.0, model_nonfinite=True), _rec(2, 1.0)]) == 2


def _doc(destroyed: int | None) -> dict:
    metrics = {"final_accuracy": 0.25, "accuracy_drop": 0.5, "rounds_to_target": None, "bytes_on_wire": 10,
               "dropped_updates": 0, "rejected_updates": 0, "precision": None, "recall": None, "fpr": 0.0}
    run = {"attack": "gaussian", "defense": "mean", "baseline": False, "metrics": metrics, "malicious": [0],
           "rounds": [{}] * 3, "model_destroyed": destroyed is not None, "model_destroyed_round": destroyed}
    base = {**run, "attack": "none", "baseline": True, "model_destroyed": False, "model_destroyed_round": None}
    return {"scenario": {"name": "x", "seed": 0, "spec": {"workload": {"name": "synthetic"},
                                                           "federation": {"clients": 4, "rounds": 3,
                                                                          "target_accuracy": 0.9}}},
            "runs": [base, run]}


def _table(doc: dict) -> str:
    buf = io.StringIO()
    print_run_table(Console(file=buf, width=200, color_system=None), doc)
    return buf.getvalue()


def test_row_of_a_destroyed_model_says_so():
    text = _table(_doc(2))
    row = next(line for line in text.splitlines() if "gaussian" in line)
    assert "model destroyed (non-finite loss from round 2)" in row and "25.0%" not in row
    base = next(line for line in text.splitlines() if "baseline" in line)
    assert "25.0%" in base  # the baseline's model is fine: its accuracy is shown
    assert "model destroyed" not in _table(_doc(None))


def test_redteam_run_on_a_destroyed_model(tmp_path, capsys):
    f = tmp_path / "boom.toml"
    f.write_text(BOOM)
    out = tmp_path / "boom.json"
    code = main(["run", str(f), "--json", str(out), "--quiet", "--device", "cpu"])
    stdout, stderr = capsys.readouterr()
    assert code == 0  # a measurement, not a failure of the command
    doc = json.loads(out.read_text())
    base, attacked = doc["runs"]
    losses = [r["loss"] for r in attacked["rounds"]]
    assert losses[0] is not None and losses[1:] == [None, None], losses  # the premise: inf (null) from round 2
    assert attacked["model_destroyed"] is True and attacked["model_destroyed_round"] == 2
    assert base["model_destroyed"] is False and base["model_destroyed_round"] is None
    assert model_broke({"metrics": attacked["metrics"], "rounds": attacked["rounds"]})  # the reports' rule agrees
    row = next(line for line in stdout.splitlines() if line.startswith("│ gaussian"))
    assert "model destroyed (non-finite loss from round 2)" in " ".join(row.split())
    warnings = [line for line in stderr.splitlines() if line.startswith("redteam: warning:")]
    assert len(warnings) == 1 and "gaussian vs mean" in warnings[0] and "from round 2 of 3" in warnings[0]
