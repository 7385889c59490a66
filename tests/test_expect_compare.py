"""[[expect]] rows that compare cells (better_than / at_least_as_bad_as) and rows judged on the
seed interval (over = "interval"): parsing, refusals, verdicts on hand-made metric values (no
training), the report's rows from a store's meta, and one pytest -m attacks session.

Values are chosen by hand so each verdict is known; the pytest session's expected failure
is fixed by construction (an accuracy lies in [0, 1], so no cell's accuracy can beat another's
by 1.5, and every cell's can beat another's by −1.5).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
from hypothesis import assume, given, strategies as st

from redteam.errors import InvalidScenario
from redteam.matrix import Cell, Expectation, check_cell, expand
from redteam.report import report_from_rows, to_json, to_markdown
from redteam.runner.matrix_run import _exp_dict
from redteam.scoring import HIGHER_IS_BETTER, METRICS, mean_ci, metric_direction

BASE = {
    "scenario": {"name": "t", "seed": 7},
    "workload": {"name": "synthetic", "samples": 600},
    "federation": {"clients": 6, "rounds": 2, "malicious_fraction": 1 / 3},
}
MOM = "federation.client_momentum"


def _matrix(expect, seeds=2, attacks=("ipm", "sign_flip"), defenses=("mean", "median"), momenta=(0.0, 0.9)):
    doc = {k: dict(v) for k, v in BASE.items()}
    doc["matrix"] = {"attacks": list(attacks), "defenses": list(defenses), "seeds": seeds,
                     "settings": {MOM: list(momenta)}}
    doc["expect"] = expect
    return expand(doc, "x.toml", check_plugins=False)


def _refused(expect, **kw) -> str:
    with pytest.raises(InvalidScenario) as ei:
        _matrix(expect, **kw)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("x.toml: [[expect]] #1: "), msg
    return msg


def _cell(attack="ipm", defense="median", mom=0.9):
    return Cell(attack, defense, ((MOM, mom),), {})


CC_ROW = {"metric": "final_accuracy", "attack": "ipm", "defense": "median", "client_momentum": 0.9,
          "better_than": {"defense": "mean"}, "by": 0.05}


def _run_row(row, left_seeds, right_seeds, **kw):
    """The failures check_cell reports for ``row``'s one left cell, given both cells' per-seed values."""
    m = _matrix([row], **kw)
    (e,) = m.expectations
    (left,) = [c for c in m.cells if e.matches(c)]
    right = e.partner(left, m.cells)
    assert right is not None
    mine = [{e.metric: v} for v in left_seeds]
    theirs = [{e.metric: v} for v in right_seeds]
    means = {e.metric: mean_ci(left_seeds)["mean"]}
    return left, right, check_cell(left, means, m.expectations, per_seed=mine, partners={e.index: (right, theirs)})


# -- the direction mapping ----------------------------------------------------------------
def test_metric_directions():
    for m in ("final_accuracy", "final_accuracy_last_k", "recall", "precision", "f1", "tn", "tp"):
        assert metric_direction(m) == "higher", m
    for m in ("accuracy_drop", "asr", "fpr", "final_loss", "final_bits_per_byte", "final_perplexity",
              "bits_per_byte_increase", "perplexity_increase", "false_trigger_rate", "rounds_to_target",
              "slowdown_rounds", "rejected_updates", "dropped_updates", "wall_time_per_round_s",
              "defense_time_per_round_s"):
        assert metric_direction(m) == "lower", m
    for m in ("bytes_on_wire", "envelope_norm", "envelope_cos", "envelope_cos_margin", "no_such_metric"):
        assert metric_direction(m) is None, m
    assert set(HIGHER_IS_BETTER) - {"tn", "tp", "fp", "fn"} <= set(METRICS)


# -- parsing and pairing --------------------------------------------------------------------
def test_comparative_row_pairs_each_left_cell_with_its_partner():
    m = _matrix([{"metric": "final_accuracy", "defense": "median", "better_than": {"defense": "mean"}}])
    (e,) = m.expectations
    pairs = {c.id: e.partner(c, m.cells).id for c in m.cells if e.matches(c)}
    assert pairs == {  # same attack and momentum on both sides: only the defense is replaced
        "median[ipm,client_momentum=0.0]": "mean[ipm,client_momentum=0.0]",
        "median[sign_flip,client_momentum=0.0]": "mean[sign_flip,client_momentum=0.0]",
        "median[ipm,client_momentum=0.9]": "mean[ipm,client_momentum=0.9]",
        "median[sign_flip,client_momentum=0.9]": "mean[sign_flip,client_momentum=0.9]",
    }
    assert e.describe() == "final_accuracy(median) ≥ final_accuracy(mean)"


def test_a_setting_selector_applies_to_both_sides_unless_replaced():
    m = _matrix([CC_ROW, {"metric": "final_accuracy", "defense": "median", "client_momentum": 0.0,
                          "at_least_as_bad_as": {"client_momentum": 0.9}}])
    same, moved = m.expectations
    left = [c for c in m.cells if same.matches(c)]
    assert [c.id for c in left] == ["median[ipm,client_momentum=0.9]"]
    assert same.partner(left[0], m.cells).id == "mean[ipm,client_momentum=0.9]"
    assert same.describe() == "final_accuracy(median) ≥ final_accuracy(mean) + 0.05"
    # replacing the setting compares momentum 0 with momentum 0.9 of the same defense and attack
    pairs = {c.id: moved.partner(c, m.cells).id for c in m.cells if moved.matches(c)}
    assert pairs == {"median[ipm,client_momentum=0.0]": "median[ipm,client_momentum=0.9]",
                     "median[sign_flip,client_momentum=0.0]": "median[sign_flip,client_momentum=0.9]"}
    assert moved.describe() == "final_accuracy(client_momentum=0.0) ≤ final_accuracy(client_momentum=0.9)"


def test_stored_rows_round_trip():
    m = _matrix([dict(CC_ROW, over="interval"), {"metric": "asr", "max": 0.1, "over": "interval"},
                 {"metric": "asr", "attack": "ipm", "at_least_as_bad_as": {"attack": "sign_flip"}, "by": -0.5}])
    for e in m.expectations:
        stored = json.loads(json.dumps(_exp_dict(e)))  # as the results store's meta keeps it
        assert Expectation.from_dict(stored) == e
    d = _exp_dict(m.expectations[0])
    assert d["better_than"] == {"defense": "mean"}
    assert (d["over"], d["by"]) == ("interval", 0.05)
    # a store written before these keys existed reads as a plain mean row
    old = {"metric": "asr", "min": None, "max": 0.1, "attack": None, "defense": None, "settings": [], "index": 0}
    assert Expectation.from_dict(old) == Expectation("asr", max=0.1)


@pytest.mark.parametrize("row, msg", [
    ({"metric": "bytes_on_wire", "defense": "median", "better_than": {"defense": "mean"}},
     "metric 'bytes_on_wire' has no direction"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"defense": "krum"}},
     "better_than.defense = 'krum' names no matrix defense"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"attack": "alie"}},
     "better_than.attack = 'alie' names no matrix attack"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"momentum": 0.9}},
     "better_than.momentum is not a key of the other cell"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"defense": "mean"}, "momentum": 0.9},
     "unknown key 'momentum'"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"client_momentum": 0.5}},
     "better_than = { federation.client_momentum = 0.5 } matches no cell of the matrix"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"defense": "mean"},
      "at_least_as_bad_as": {"defense": "mean"}}, "has both better_than and at_least_as_bad_as"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"defense": "mean"}, "min": 0.5},
     "takes a margin 'by', not min/max"),
    ({"metric": "final_accuracy", "min": 0.5, "by": 0.1}, "a margin needs better_than or at_least_as_bad_as"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"defense": "mean"}, "by": "x"},
     'by = "x": must be a finite number'),
    ({"metric": "final_accuracy", "defense": "median", "better_than": {"defense": "mean"}, "by": math.nan},
     "must be a finite number"),
    ({"metric": "final_accuracy", "defense": "median", "better_than": "mean"}, "must be a table naming the other"),
    ({"metric": "final_accuracy", "min": 0.5, "over": "median"}, 'over = "median": must be "mean"'),
])
def test_bad_comparative_rows_are_one_line_errors(row, msg):
    assert msg in _refused([row])


def test_the_left_and_right_cells_must_pair_one_to_one():
    # no left defense: every defense is a left cell, so mean is compared with itself
    assert "compares cell mean[ipm,client_momentum=0.0] with itself" in _refused(
        [{"metric": "final_accuracy", "better_than": {"defense": "mean"}}])
    # the row names no momentum but the table replaces it: both momenta of median pair with
    # the same momentum-0.9 cell
    msg = _refused([{"metric": "final_accuracy", "defense": "median", "attack": "ipm",
                     "better_than": {"defense": "mean", "client_momentum": 0.9}}])
    assert ("left cells median[ipm,client_momentum=0.0] and median[ipm,client_momentum=0.9] both pair with "
            "mean[ipm,client_momentum=0.9], which cannot be paired one-to-one") in msg


def test_a_left_cell_without_a_partner_is_refused():
    # the other attack's cells have the other defense only under one momentum: a matrix never
    # looks like that, so build the cells by hand and parse against them
    from redteam.matrix import parse_expectations

    cells = [_cell("ipm", "median", 0.0), _cell("ipm", "median", 0.9), _cell("ipm", "mean", 0.9)]
    with pytest.raises(InvalidScenario) as ei:
        parse_expectations([{"metric": "final_accuracy", "defense": "median", "better_than": {"defense": "mean"}}],
                           "x.toml", cells)
    assert str(ei.value) == (
        'x.toml: [[expect]] #1: better_than = { defense = "mean" }: left cell median[ipm,client_momentum=0.0] has '
        "no partner among the cells it names (mean[ipm,client_momentum=0.9]); a partner must have the same "
        "remaining settings")


def test_an_interval_row_with_one_seed_is_refused():
    msg = _refused([{"metric": "final_accuracy", "min": 0.5, "over": "interval"}], seeds=1)
    assert msg == ('x.toml: [[expect]] #1: over = "interval" needs ≥ 2 seeds, but the matrix has seeds = 1: the '
                   '95 % interval of one seed is undefined (raise [matrix].seeds or use over = "mean")')
    assert _matrix([{"metric": "final_accuracy", "min": 0.5, "over": "interval"}], seeds=[3, 5]).expectations
    assert "needs ≥ 2 seeds" in _refused([dict(CC_ROW, over="interval")], seeds=[4])


# -- verdicts on hand-made values ---------------------------------------------------------
def test_comparative_row_holds_and_fails_when_the_cells_swap():
    left, right, fails = _run_row(CC_ROW, [0.80, 0.84], [0.70, 0.74])
    assert fails == []  # 0.82 ≥ 0.72 + 0.05
    _, _, fails = _run_row(CC_ROW, [0.70, 0.74], [0.80, 0.84])
    assert fails == [
        "expect #1 (final_accuracy(median) ≥ final_accuracy(mean) + 0.05): final_accuracy: "
        f"{left.id} = 0.72 vs {right.id} = 0.82; needs {left.id} ≥ {right.id} + 0.05 (seed means)"]
    # the margin counts: 0.76 is better than 0.72, but not by 0.05
    assert _run_row(CC_ROW, [0.75, 0.77], [0.70, 0.74])[2] != []
    # a negative margin: "no worse than the other by more than 0.05"
    assert _run_row(dict(CC_ROW, by=-0.05), [0.68, 0.70], [0.70, 0.74])[2] == []
    assert _run_row(dict(CC_ROW, by=-0.05), [0.60, 0.62], [0.70, 0.74])[2] != []


def test_lower_is_better_metrics_compare_the_other_way():
    row = {"metric": "asr", "attack": "ipm", "defense": "median", "client_momentum": 0.9,
           "better_than": {"defense": "mean"}, "by": 0.1}
    assert _run_row(row, [0.1, 0.2], [0.5, 0.6])[2] == []  # median's lower ASR is better by 0.4
    fails = _run_row(row, [0.5, 0.6], [0.1, 0.2])[2]
    assert len(fails) == 1 and fails[0].startswith("expect #1 (asr(median) ≤ asr(mean) - 0.1): asr: ")
    worse = dict(row, at_least_as_bad_as=row["better_than"], by=0.0)
    del worse["better_than"]
    assert _run_row(worse, [0.5, 0.6], [0.1, 0.2])[2] == []
    assert _run_row(worse, [0.1, 0.2], [0.5, 0.6])[2] != []


def test_interval_comparison_fails_when_the_intervals_overlap_though_the_means_hold():
    row = dict(CC_ROW, by=0.0, over="interval")
    # means 0.80 vs 0.70 (better), but two spread seeds make both intervals wide
    fails = _run_row(row, [0.60, 1.00], [0.50, 0.90])[2]
    assert len(fails) == 1 and "needs lo of median[ipm,client_momentum=0.9] > hi of mean[" in fails[0]
    assert _run_row(dict(row, over="mean"), [0.60, 1.00], [0.50, 0.90])[2] == []
    # tight seeds: separated intervals hold
    assert _run_row(row, [0.80, 0.81, 0.80], [0.70, 0.71, 0.70], seeds=3)[2] == []
    # and the margin applies to the gap between the intervals
    assert _run_row(dict(row, by=0.2), [0.80, 0.81, 0.80], [0.70, 0.71, 0.70], seeds=3)[2] != []


def test_interval_bound_fails_when_the_interval_crosses_it():
    e = Expectation("final_accuracy", min=0.7, over="interval")
    spread = mean_ci([0.6, 1.0])  # mean 0.8 ≥ 0.7, interval reaches far below
    assert Expectation("final_accuracy", min=0.7).judge(spread) is None
    why = e.judge(spread)
    assert why is not None and why.startswith("final_accuracy 95 % interval [") and "reaches below min 0.7" in why
    assert e.judge(mean_ci([0.80, 0.81, 0.80])) is None
    assert Expectation("asr", max=0.1, over="interval").judge(mean_ci([0.0, 0.2])) is not None
    assert e.describe() == "final_accuracy ≥ 0.7 [interval]"


def test_interval_rows_fail_closed_without_two_seeds():
    e = Expectation("final_accuracy", min=0.0, over="interval")
    why = e.judge(mean_ci([0.9]))
    assert why == ('final_accuracy: over = "interval" needs values from ≥ 2 seeds; this cell has 1, so its 95 % '
                   "interval is undefined")
    assert e.judge(mean_ci([0.9, None])) is not None  # a seed without a value does not count
    row = dict(CC_ROW, over="interval")
    assert "mean[ipm,client_momentum=0.9] has 1" in _run_row(row, [0.8, 0.81], [0.1, None])[2][0]


def test_a_comparative_row_without_its_partner_fails_closed():
    m = _matrix([CC_ROW])
    (left,) = [c for c in m.cells if m.expectations[0].matches(c)]
    fails = check_cell(left, {"final_accuracy": 0.9}, m.expectations, per_seed=[{"final_accuracy": 0.9}])
    assert fails == ["expect #1 (final_accuracy(median) ≥ final_accuracy(mean) + 0.05): final_accuracy: "
                     "its partner cell has no results to compare"]
    _, _, fails = _run_row(CC_ROW, [0.9, 0.9], [None, None])
    assert fails and "undefined (null) for mean[ipm,client_momentum=0.9]" in fails[0]


@given(st.floats(-10, 10, allow_nan=False), st.floats(-10, 10, allow_nan=False),
       st.sampled_from(["final_accuracy", "asr"]))
def test_better_than_and_at_least_as_bad_as_are_complements(a, b, metric):
    assume(a != b)
    base = {"metric": metric, "defense": "median", "min": None, "max": None, "attack": None, "settings": [],
            "index": 0, "by": 0.0}
    better = Expectation.from_dict(base | {"better_than": {"defense": "mean"}})
    worse = Expectation.from_dict(base | {"at_least_as_bad_as": {"defense": "mean"}})
    left, right = {"mean": a, "lo": a, "hi": a, "n": 1}, {"mean": b, "lo": b, "hi": b, "n": 1}
    holds = [e.judge(left, right) is None for e in (better, worse)]
    assert holds in ([True, False], [False, True])
    assert holds[0] == ((a > b) if metric == "final_accuracy" else (a < b))


# -- reports: the stored rows against a store's cells ---------------------------------------
def _rows(values):
    """Store rows for cells (defense, seed values of final_accuracy) under attack ipm."""
    out = []
    for d, vals in values.items():
        for rep, v in enumerate(vals):
            out.append({"cell_id": f"{d}[ipm]", "attack": "ipm", "defense": d, "settings": {}, "replicate": rep,
                        "seed": rep, "finished": True, "metrics": {"final_accuracy": v}, "rounds": None,
                        "baseline_rounds": None})
    return out


def _report(values, row):
    cells = [Cell("ipm", d, (), {}) for d in values]
    from redteam.matrix import parse_expectations

    exps = parse_expectations([row], "x.toml", cells, seeds=[0, 1])
    meta = {"expectations": [_exp_dict(e) for e in exps]}
    return report_from_rows(_rows(values), source="/tmp/r/results.sqlite", meta=meta)


def test_report_checks_comparative_rows_both_ways():
    row = {"metric": "final_accuracy", "defense": "cc", "better_than": {"defense": "avg"}, "by": 0.05}
    rep = _report({"cc": [0.80, 0.84], "avg": [0.70, 0.74]}, row)
    (res,) = rep.expectations
    assert (res.cell_id, res.other_cell_id, res.failure) == ("cc[ipm]", "avg[ipm]", None)
    assert res.description == "final_accuracy(cc) ≥ final_accuracy(avg) + 0.05"
    assert res.value == pytest.approx(0.82) and res.other_value == pytest.approx(0.72)
    swapped = _report({"cc": [0.70, 0.74], "avg": [0.80, 0.84]}, row)
    (res,) = swapped.expectations
    assert res.failure is not None and "cc[ipm] = 0.72 vs avg[ipm] = 0.82" in res.failure
    assert json.loads(to_json(swapped, ["final_accuracy"]))["expectations"][0]["holds"] is False
    assert "0 of 1 hold" in to_markdown(swapped, ["final_accuracy"])
    # over = "interval": the means hold, the overlapping intervals do not
    wide = _report({"cc": [0.60, 1.00], "avg": [0.50, 0.90]}, dict(row, by=0.0, over="interval"))
    (res,) = wide.expectations
    assert res.failure is not None and "final_accuracy(cc) ≥ final_accuracy(avg) [interval]" == res.description
    tight = _report({"cc": [0.60, 1.00], "avg": [0.50, 0.90]}, dict(row, by=0.0))
    assert tight.expectations[0].failure is None


def test_report_fails_closed_when_the_partner_has_no_finished_seed():
    row = {"metric": "final_accuracy", "defense": "cc", "better_than": {"defense": "avg"}}
    cells = [Cell("ipm", d, (), {}) for d in ("cc", "avg")]
    from redteam.matrix import parse_expectations

    meta = {"expectations": [_exp_dict(e) for e in parse_expectations([row], "x.toml", cells)]}
    rows = _rows({"cc": [0.8], "avg": [0.7]})
    rows[1] = dict(rows[1], finished=False, metrics=None)
    (res,) = report_from_rows(rows, source="/tmp/r/results.sqlite", meta=meta).expectations
    assert res.failure == "final_accuracy: its partner cell avg[ipm] has no finished seed"


# -- pytest -m attacks ----------------------------------------------------------------------
SCENARIO = """
[scenario]
name = "tiny"
seed = 7
[workload]
name = "synthetic"
samples = 400
[federation]
clients = 6
malicious_fraction = 0.34
rounds = 2
local_steps = 2
partition = "iid"
[matrix]
attacks = ["none", "sign_flip"]
defenses = ["mean"]
seeds = 2
# holds by construction: an accuracy is never below another's - 1.5
[[expect]]
attack = "sign_flip"
metric = "final_accuracy"
better_than = { attack = "none" }
by = -1.5
# fails by construction: no accuracy beats another's by 1.5
[[expect]]
attack = "none"
metric = "final_accuracy"
better_than = { attack = "sign_flip" }
by = 1.5
# holds: the no-attack cell is its own baseline, so its drop is exactly 0 on every seed
[[expect]]
attack = "none"
metric = "accuracy_drop"
max = 0.0
over = "interval"
"""


def test_pytest_item_of_a_comparative_row_runs_the_other_cell_and_names_both(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "c.toml").write_text(textwrap.dedent(SCENARIO))
    keep = tmp_path / "keep"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", f"--redteam-out={keep}",
            "-m", "attacks", "-rA"]
    # only the failing item: it must run sign_flip's seeds too, though no item of it is selected
    out = subprocess.run([*args, "scenarios/c.toml::mean[none]"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=300)
    text = out.stdout
    assert out.returncode == 1, text + out.stderr
    assert "1 failed" in text and "FAILED scenarios/c.toml::mean[none]" in text, text
    lines = text.splitlines()
    at = lines.index(next(ln for ln in lines if ln.startswith("_") and " c.toml::mean[none] " in ln))
    first = lines[at + 1]
    assert first.startswith("expect #2 (final_accuracy(none) ≥ final_accuracy(sign_flip) + 1.5): final_accuracy: "
                            "mean[none] = "), first
    assert " vs mean[sign_flip] = " in first and first.endswith(
        "; needs mean[none] ≥ mean[sign_flip] + 1.5 (seed means)")
    assert lines[at + 3] == ("mean[none] in scenarios/c.toml: 1 of 2 expectation(s) failed; "
                             "metrics are means over 2 seeds:")
    table = lines[at + 5:at + 8]
    assert table[0].split()[0] == "final_accuracy"
    assert table[0].split()[-5:] == ["≥", "mean[sign_flip]", "+", "1.5", "FAIL"]
    row = table[1].split()  # the other cell, below: its mean, interval and both seeds
    assert row[0] == "mean[sign_flip]" and len(row) == 6 and row[2].startswith("[") and row[3].endswith("]")
    assert float(row[1]) == pytest.approx((float(row[4].rstrip(",")) + float(row[5])) / 2, abs=1e-3)
    assert table[2].split()[0] == "accuracy_drop" and table[2].split()[-4:] == ["≤", "0", "[interval]", "ok"]

    # the whole file: the other items hold; the store's meta keeps the rows for redteam report
    out = subprocess.run(args + ["scenarios/c.toml"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert "1 failed, 1 passed" in out.stdout, out.stdout + out.stderr
    from redteam.report import load_report

    rep = load_report(next(keep.glob("c-*")))
    verdicts = {(r.index, r.cell_id, r.other_cell_id): r.failure is None for r in rep.expectations}
    assert verdicts == {(0, "mean[sign_flip]", "mean[none]"): True, (1, "mean[none]", "mean[sign_flip]"): False,
                        (2, "mean[none]", None): True}


def test_collection_refuses_a_one_seed_interval_row(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "scenarios").mkdir()
    text = textwrap.dedent(SCENARIO).replace("seeds = 2", "seeds = 1")
    (tmp_path / "scenarios" / "c.toml").write_text(text)
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                          "scenarios/c.toml"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode != 0
    assert ('InvalidScenario: c.toml: [[expect]] #3: over = "interval" needs ≥ 2 seeds, but the matrix has '
            "seeds = 1") in out.stdout, out.stdout + out.stderr
