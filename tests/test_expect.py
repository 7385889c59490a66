"""The [[expect]] evaluator: which cells a row applies to, and when it holds (fail closed)."""

from __future__ import annotations

import math

import pytest

from redteam.errors import InvalidScenario
from redteam.matrix import Cell, Expectation, check_cell, expand

BASE = {
    "scenario": {"name": "t", "seed": 7},
    "workload": {"name": "synthetic", "samples": 600},
    "federation": {"clients": 6, "rounds": 2, "malicious_fraction": 1 / 3},
}


def _matrix(expect, **matrix):
    doc = {k: dict(v) for k, v in BASE.items()}
    doc["matrix"] = matrix or {"attacks": ["ipm", "sign_flip"], "defenses": ["mean", "median"],
                               "settings": {"federation.malicious_fraction": [0.2, 0.4]}}
    doc["expect"] = expect
    return expand(doc, "x.toml", check_plugins=False)


def _cell(attack="ipm", defense="mean", **settings):
    return Cell(attack, defense, tuple(sorted(settings.items())), {})


# -- when an expectation holds ------------------------------------------------------------
def test_bounds_are_inclusive():
    e = Expectation("recall", min=0.5, max=0.75)
    assert e.check(0.5) is None and e.check(0.75) is None and e.check(0.6) is None
    assert e.check(0.4999) == "recall = 0.4999 < min 0.5"
    assert e.check(0.7501) == "recall = 0.7501 > max 0.75"


def test_one_sided_bounds():
    assert Expectation("asr", max=0.1).check(-5.0) is None
    assert Expectation("asr", max=0.1).check(0.2) is not None
    assert Expectation("asr", min=0.1).check(1e9) is None
    assert Expectation("asr", min=0.1).check(0.0) is not None


def test_an_undefined_metric_fails():
    # null (e.g. recall with no malicious client judged) cannot satisfy any bound
    why = Expectation("recall", max=1.0).check(None)
    assert why == "recall is undefined (null) for this cell"


def test_a_nan_metric_fails():
    # NaN compares false with everything: without a check it would pass every bound
    assert Expectation("final_accuracy", min=0.0).check(math.nan) is not None
    assert Expectation("final_accuracy", max=1.0).check(math.nan) is not None


def test_check_cell_reports_missing_and_failing_metrics():
    exps = (
        Expectation("recall", min=0.9, index=0),
        Expectation("asr", max=0.1, attack="ipm", index=1),
        Expectation("accuracy_drop", max=0.05, defense="median", index=2),
    )
    cell = _cell()
    # recall missing from the metrics → undefined → fails; asr 0.05 holds; the third row
    # is for another defense and does not apply
    fails = check_cell(cell, {"asr": 0.05, "accuracy_drop": 0.9}, exps)
    assert fails == ["expect #1 (recall ≥ 0.9): recall is undefined (null) for this cell"]
    assert check_cell(cell, {"recall": 0.95, "asr": 0.5}, exps) == [
        "expect #2 (asr ≤ 0.1): asr = 0.5 > max 0.1"]
    assert check_cell(cell, {"recall": 1.0, "asr": 0.0}, exps) == []


def test_describe():
    assert Expectation("f1", min=0.5, max=1).describe() == "f1 ≥ 0.5 and ≤ 1"
    assert Expectation("f1", max=0.25).describe() == "f1 ≤ 0.25"


# -- which cells a row applies to ----------------------------------------------------------
def test_matches_by_attack_defense_and_setting_suffix():
    e = Expectation("asr", max=1, attack="ipm", defense="median",
                    settings=(("malicious_fraction", 0.2),))
    assert e.matches(_cell("ipm", "median", **{"federation.malicious_fraction": 0.2}))
    assert not e.matches(_cell("sign_flip", "median", **{"federation.malicious_fraction": 0.2}))
    assert not e.matches(_cell("ipm", "mean", **{"federation.malicious_fraction": 0.2}))
    assert not e.matches(_cell("ipm", "median", **{"federation.malicious_fraction": 0.4}))
    # the full key path works too; a setting the cell does not have never matches
    full = Expectation("asr", max=1, settings=(("federation.malicious_fraction", 0.4),))
    assert full.matches(_cell(**{"federation.malicious_fraction": 0.4}))
    assert not full.matches(_cell(**{"federation.rounds": 3}))
    # an ambiguous suffix (two settings ending in ".rounds") matches nothing
    amb = Expectation("asr", max=1, settings=(("rounds", 3),))
    assert not amb.matches(_cell(**{"federation.rounds": 3, "transport.rounds": 3}))
    assert Expectation("asr", max=1).matches(_cell())


def test_parsed_rows_apply_to_the_cells_they_name():
    m = _matrix([{"metric": "asr", "max": 0.5, "attack": "ipm", "malicious_fraction": 0.4},
                 {"metric": "recall", "min": 0}])
    first, second = m.expectations
    assert (first.metric, first.min, first.max, first.attack, first.index) == ("asr", None, 0.5, "ipm", 0)
    hit = [c.id for c in m.cells if first.matches(c)]
    assert sorted(hit) == ["mean[ipm,malicious_fraction=0.4]", "median[ipm,malicious_fraction=0.4]"]
    assert all(second.matches(c) for c in m.cells) and second.index == 1
    assert isinstance(first.max, float)
    assert (second.metric, second.min, second.max, second.attack, second.defense) == ("recall", 0.0, None, None, None)
    assert isinstance(second.min, float)


def test_parsed_bounds_and_filters_are_all_kept():
    # a row with both bounds and every kind of filter: nothing is dropped on the way
    m = _matrix([{"metric": "fpr", "min": 0.25, "max": 1, "attack": "sign_flip", "defense": "median",
                  "federation.malicious_fraction": 0.2}])
    (e,) = m.expectations
    assert (e.min, e.max, e.attack, e.defense) == (0.25, 1.0, "sign_flip", "median")
    assert e.settings == (("federation.malicious_fraction", 0.2),)
    assert [c.id for c in m.cells if e.matches(c)] == ["median[sign_flip,malicious_fraction=0.2]"]
    assert e.check(0.2) == "fpr = 0.2 < min 0.25" and e.check(1.5) == "fpr = 1.5 > max 1"


@pytest.mark.parametrize("bound", ["min", "max"])
def test_a_nan_bound_is_an_error(bound):
    # a NaN bound would hold for every value: a check that cannot fail
    with pytest.raises(InvalidScenario) as ei:
        _matrix([{"metric": "asr", bound: math.nan}])
    assert str(ei.value) == f"x.toml: [[expect]] #1: {bound} = nan: must be a number, not nan"


@pytest.mark.parametrize("expect, msg", [
    ({"metric": "recal", "min": 1}, "did you mean 'recall'"),
    ({"metric": "zzzz", "min": 1}, "unknown metric (known: final_accuracy"),
    ({"metric": "asr", "min": True}, "must be a number"),
    ({"metric": "asr", "max": 1, "defense": "krum"}, "names no matrix defense"),
    ({"metric": "asr", "max": 1, "malicious_fraction": 0.3}, "matches no cell"),
    ("asr", "must be a table"),
])
def test_bad_rows_are_one_line_errors(expect, msg):
    with pytest.raises(InvalidScenario) as ei:
        _matrix([expect])
    assert msg in str(ei.value) and "\n" not in str(ei.value)
    assert "x.toml: [[expect]] #1" in str(ei.value)


def test_expect_must_be_an_array_of_tables():
    with pytest.raises(InvalidScenario, match=r"\[\[expect\]\] must be an array of tables"):
        _matrix({"metric": "asr"})
