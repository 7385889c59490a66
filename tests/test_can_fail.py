"""Can each [[expect]] row fail (issue 39; redteam/can_fail.py): every row re-judged on stored
runs with its attack removed (the cells' no-attack baselines) and its defense replaced by the
matrix's plain mean cell; a row that holds either way is reported unless it says why. Worked on
synthetic per-seed metrics, then through the pytest plugin's ``<file>::can_fail`` item."""

from __future__ import annotations

import textwrap

import pytest

# imported before the pytester in-process run (tests/test_pytest_plugin.py says why)
import redteam.federation.loop  # noqa: F401
import redteam.runner.matrix_run  # noqa: F401
from redteam.can_fail import EXCUSED, FAILED, HELD, NOT_STORED, SAME, UNDEFINED, rejudge, render
from redteam.errors import InvalidScenario
from redteam.matrix import expand

pytest_plugins = ["pytester"]


def _matrix(rows: list[dict], defenses=("mean", "norm_bound"), attacks=("none", "sign_flip")):
    doc = {"scenario": {"name": "t", "seed": 1}, "workload": {"name": "synthetic"},
           "federation": {"clients": 6, "malicious_fraction": 0.34, "rounds": 2},
           "matrix": {"attacks": list(attacks), "defenses": list(defenses), "seeds": 2}, "expect": rows}
    return expand(doc, "t.toml", check_plugins=False)


# per cell id: (attacked per-seed metrics, baseline per-seed metrics); a filter that catches the
# flip (recall 1, fpr 0.05) and flags nobody without an attack; mean flags nobody
RUNS = {
    "norm_bound[sign_flip]": ([{"recall": 1.0, "fpr": 0.05, "precision": 0.9, "accuracy_drop": 0.02}] * 2,
                              [{"recall": None, "fpr": 0.0, "precision": None, "accuracy_drop": 0.0}] * 2),
    "mean[sign_flip]": ([{"recall": 0.0, "fpr": 0.0, "precision": None, "accuracy_drop": 0.5}] * 2,
                        [{"recall": None, "fpr": 0.0, "precision": None, "accuracy_drop": 0.0}] * 2),
    "norm_bound[none]": ([{"recall": None, "fpr": 0.0, "accuracy_drop": 0.0}] * 2,) * 2,
    "mean[none]": ([{"recall": None, "fpr": 0.0, "accuracy_drop": 0.0}] * 2,) * 2,
}


def _rejudge(rows, runs=RUNS, **kw):
    m = _matrix(rows, **kw)
    return rejudge(m.expectations, m.cells, lambda c: runs.get(c.id, (None, None))[0],
                   lambda c: runs.get(c.id, (None, None))[1])


def _status(report):
    return [v.status for v in report.without_attack], [v.status for v in report.with_mean]


def test_an_fpr_bound_holds_without_attack_and_without_defense():
    """fpr ≤ 0.1 on norm_bound: 0.0 with no attack, 0.0 under mean: it shows nothing either way."""
    (r,) = _rejudge([{"attack": "sign_flip", "defense": "norm_bound", "metric": "fpr", "max": 0.1}])
    assert _status(r) == ([HELD], [HELD])
    assert r.holds_regardless == ["attack → none on norm_bound[sign_flip]", "defense → mean on norm_bound[sign_flip]"]
    line = render([r], "t.toml")
    assert line == ["t.toml#1 fpr ≤ 0.1 (sign_flip, norm_bound): attack → none: HELD on norm_bound[sign_flip]",
                    "t.toml#1 fpr ≤ 0.1 (sign_flip, norm_bound): defense → mean: HELD on norm_bound[sign_flip]"]


def test_a_recall_row_fails_both_ways_and_an_fpr_row_may_say_why():
    rows = [{"attack": "sign_flip", "defense": "norm_bound", "metric": "recall", "min": 0.8},
            {"attack": "sign_flip", "defense": "norm_bound", "metric": "fpr", "max": 0.1,
             "can_hold_without_attack": "a cost bound: no honest client flagged, with or without the attack",
             "can_hold_without_defense": "paired with row 1 (recall ≥ 0.8), which fails under mean"}]
    recall, fpr = _rejudge(rows)
    # without attackers recall is undefined: the row fails closed there, which says nothing either way
    assert _status(recall) == ([UNDEFINED], [FAILED])
    assert "recall is undefined (null)" in recall.without_attack[0].why
    assert "recall = 0 < min 0.8" in recall.with_mean[0].why
    assert _status(fpr) == ([EXCUSED], [EXCUSED]) and not fpr.holds_regardless
    assert fpr.with_mean[0].why.startswith("paired with row 1")


def test_every_attacker_caught_holds_vacuously_without_attackers():
    """undetected_attackers is undefined with nobody attacking (it would fail the row closed); the
    re-judge reads it as the count it is, 0, so "≤ 0" holds without the attack; "≥ 1" fails."""
    runs = {"norm_bound[sign_flip]": ([{"undetected_attackers": 0}] * 2, [{"undetected_attackers": None}] * 2),
            "mean[sign_flip]": ([{"undetected_attackers": 1}] * 2, [{"undetected_attackers": None}] * 2)}
    caught, missed = _rejudge([{"attack": "sign_flip", "defense": "norm_bound", "metric": "undetected_attackers",
                                "max": 0},
                               {"attack": "sign_flip", "defense": "norm_bound", "metric": "undetected_attackers",
                                "min": 1}], runs)
    assert _status(caught) == ([HELD], [FAILED]) and _status(missed) == ([FAILED], [HELD])
    assert "undetected_attackers = 0 < min 1" in missed.without_attack[0].why


def test_a_clean_cell_and_a_mean_cell_have_nothing_to_replace():
    rows = [{"attack": "none", "defense": "mean", "metric": "accuracy_drop", "max": 0.0},
            {"attack": "sign_flip", "defense": "mean", "metric": "accuracy_drop", "min": 0.3}]
    clean, hurt = _rejudge(rows)
    assert _status(clean) == ([SAME], [SAME])
    assert _status(hurt) == ([FAILED], [SAME])  # the drop is 0 against itself without the attack


def test_a_comparison_with_mean_needs_its_margin_once_the_defense_is_mean():
    """norm_bound's drop 0.02 vs mean's 0.5: better by 0.3 holds; with the defense replaced by mean
    it compares mean with itself (0 < 0.3: fails); with the attack removed both drops are 0. A
    margin of 0 would hold on those ties: it cannot fail."""
    row = {"attack": "sign_flip", "defense": "norm_bound", "metric": "accuracy_drop",
           "better_than": {"defense": "mean"}, "by": 0.3}
    (r,) = _rejudge([row])
    assert _status(r) == ([FAILED], [FAILED])
    (r0,) = _rejudge([{**row, "by": 0.0}])
    assert _status(r0) == ([HELD], [HELD])


def test_a_mean_cell_not_in_the_store_or_the_matrix_is_not_judged():
    row = [{"attack": "sign_flip", "defense": "norm_bound", "metric": "recall", "min": 0.8}]
    runs = {k: v for k, v in RUNS.items() if k != "mean[sign_flip]"}
    (r,) = _rejudge(row, runs)
    assert _status(r) == ([UNDEFINED], [NOT_STORED]) and "mean[sign_flip] is not in the store" in r.with_mean[0].why
    (r,) = _rejudge(row, defenses=("median", "norm_bound"))
    assert r.with_mean[0].status == NOT_STORED and "no plain mean cell" in r.with_mean[0].why


@pytest.mark.parametrize("why", ["", "because", 3, True])
def test_a_reason_must_say_why_in_words(why):
    with pytest.raises(InvalidScenario, match=r"#1: can_hold_without_attack = .*must say why"):
        _matrix([{"attack": "sign_flip", "defense": "norm_bound", "metric": "fpr", "max": 0.1,
                  "can_hold_without_attack": why}])


def test_a_misspelt_reason_key_is_named():
    with pytest.raises(InvalidScenario, match="did you mean 'can_hold_without_attack'"):
        _matrix([{"attack": "sign_flip", "defense": "norm_bound", "metric": "fpr", "max": 0.1,
                  "can_hold_without_atack": "a cost bound that holds either way"}])


# ------------------------------------------------------------------ the plugin's item

TINY = """
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
attacks = ["sign_flip"]
defenses = ["mean", "median"]
seeds = 1
[[expect]]
attack = "sign_flip"
defense = "median"
metric = "final_accuracy"
min = 0.0
"""


def test_the_can_fail_item_reports_a_row_that_holds_regardless(pytester):
    """t.toml's row holds with the attack removed (every model's accuracy is ≥ 0): its can_fail
    item fails and names it; u.toml is the same row saying why it may: its item passes. One
    session (an in-process pytester run cannot import the engine twice)."""
    pytester.makeini("[pytest]\nredteam_can_fail = true\n")
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "t.toml").write_text(textwrap.dedent(TINY))
    excused = TINY + 'can_hold_without_attack = "a floor every model meets (a fixture)"\n'
    (pytester.path / "scenarios" / "u.toml").write_text(textwrap.dedent(excused))
    res = pytester.runpytest("-q", "-rA", "-p", "no:cacheprovider", "-m", "attacks", "--redteam-workers=1")
    res.assert_outcomes(passed=3, failed=1)
    out = res.stdout.str()
    assert "FAILED scenarios/t.toml::can_fail" in out and "PASSED scenarios/u.toml::can_fail" in out
    assert out.splitlines()[0].startswith(".F..")  # each file: its cell, then its can_fail item
    assert "t.toml#1 final_accuracy ≥ 0 (sign_flip, median): attack → none: HELD on median[sign_flip]" in out
    assert "defense → mean: not stored on median[sign_flip]" in out  # mean[sign_flip]: no row runs it
    assert "final_accuracy ≥ 0 (sign_flip, median): attack → none: held (excused) on median[sign_flip]" in out


def test_the_ini_option_names_the_files_that_get_the_item(pytester):
    (pytester.path / "scenarios").mkdir()
    for f in ("t", "u"):
        (pytester.path / "scenarios" / f"{f}.toml").write_text(textwrap.dedent(TINY))
    for ini, want in (("u.toml", ["u"]), ("scenarios/t*", ["t"]), ("true", ["t", "u"]), ("false", []), ("", [])):
        pytester.makeini(f"[pytest]\nredteam_can_fail = {ini}\n")
        ids = pytester.runpytest("--collect-only", "-q", "-m", "attacks").outlines
        assert [i for i in ids if i.endswith("::can_fail")] == [f"scenarios/{f}.toml::can_fail" for f in want], ini
