"""Report aggregation: cells × seeds → mean and 95 % interval, convergence, breakdown fraction,
envelope utilisation, expectations, and the writers' formatting. Expected values are worked by hand."""

import csv
import io
import json
import math
import statistics

import pytest
from hypothesis import given, settings, strategies as st

from redteam.report import (
    REPORT_METRICS,
    aggregate_cells,
    breakdown,
    check_expectations,
    convergence,
    envelope_utilisation,
    report_from_rows,
    to_csv,
    to_json,
    to_markdown,
)
from redteam.report.aggregate import ReportError, resolve_metrics
from redteam.report.tables import cell_text, fmt_stat, fmt_value
from redteam.scoring import mean_ci

FR = "federation.malicious_fraction"


def row(cell_id, attack="a", defense="d", settings=None, rep=0, finished=True, rounds=None, base=None, **metrics):
    return {
        "cell_id": cell_id, "attack": attack, "defense": defense, "settings": settings or {}, "replicate": rep,
        "seed": 100 + rep, "finished": finished, "metrics": metrics if finished else None,
        "rounds": rounds if finished else None, "baseline_rounds": base if finished else None,
    }


def rec(i, acc):
    return {"round": i, "accuracy": acc, "loss": 1.0}


# ------------------------------------------------------------------ mean and CI


def test_three_seeds_mean_and_t_interval_by_hand():
    # drops 0.1, 0.2, 0.3: mean 0.2, s = 0.1, se = 0.1/√3 = 0.0577350, t(0.975, 2) = 4.303
    # half-width = 4.303 × 0.0577350 = 0.248434
    rows = [row("c", rep=i, accuracy_drop=v) for i, v in enumerate((0.1, 0.2, 0.3))]
    (c,) = aggregate_cells(rows)
    s = c.metrics["accuracy_drop"]
    assert s.n == 3 and c.planned == 3 and c.finished == 3
    assert s.mean == pytest.approx(0.2)
    assert s.half_width == pytest.approx(0.248434, abs=1e-6)
    assert s.lo == pytest.approx(-0.048434, abs=1e-6) and s.hi == pytest.approx(0.448434, abs=1e-6)
    assert fmt_stat("accuracy_drop", s) == "0.200 ± 0.248"


def test_two_seeds_use_t_with_one_degree_of_freedom():
    # 0.4, 0.6: mean 0.5, s = √0.02 = 0.141421, se = 0.1, t(0.975, 1) = 12.706 → ± 1.2706
    rows = [row("c", rep=0, recall=0.4), row("c", rep=1, recall=0.6)]
    s = aggregate_cells(rows)[0].metrics["recall"]
    assert mean_ci([0.4, 0.6])["hi"] == pytest.approx(0.5 + 1.2706)
    # shown clamped to the values a recall can take (issue 24 §1)
    assert s.mean == pytest.approx(0.5) and (s.lo, s.hi) == (0.0, 1.0) and s.half_width == pytest.approx(0.5)


def test_undefined_values_are_skipped_and_single_value_has_no_half_width():
    rows = [row("c", rep=0, asr=None), row("c", rep=1, asr=0.5), row("c", rep=2, asr=None)]
    (c,) = aggregate_cells(rows)
    s = c.metrics["asr"]
    assert (s.mean, s.lo, s.hi, s.n) == (0.5, 0.5, 0.5, 1)
    assert s.half_width is None and fmt_stat("asr", s) == "0.500"
    assert c.metrics["precision"].mean is None and c.value("precision") is None  # absent everywhere
    assert fmt_stat("precision", c.metrics["precision"]) == "—"


def test_unfinished_seeds_are_counted_but_not_averaged():
    rows = [row("c", rep=0, fpr=0.25), row("c", rep=1, fpr=0.75), row("c", rep=2, finished=False)]
    (c,) = aggregate_cells(rows)
    assert (c.planned, c.finished) == (3, 2)
    assert c.value("fpr") == pytest.approx(0.5)
    assert cell_text(c, "fpr").endswith("*")  # some seeds not finished
    (none_done,) = aggregate_cells([row("x", finished=False)])
    assert cell_text(none_done, "fpr") == "…"


def test_cells_keep_plan_order_and_settings():
    rows = [row("d[b]", attack="b"), row("d[a]", attack="a", settings={FR: 0.2}), row("d[b]", attack="b", rep=1)]
    cells = aggregate_cells(rows)
    assert [c.cell_id for c in cells] == ["d[b]", "d[a]"]
    assert cells[1].settings == ((FR, 0.2),) and cells[0].planned == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(-1e3, 1e3)), min_size=1, max_size=8))
def test_mean_is_the_arithmetic_mean_of_defined_values_and_inside_its_interval(values):
    rows = [row("c", rep=i, final_loss=v) for i, v in enumerate(values)]
    s = aggregate_cells(rows)[0].metrics["final_loss"]
    defined = [v for v in values if v is not None]
    assert s.n == len(defined)
    if not defined:
        assert s.mean is None
        return
    assert s.mean == pytest.approx(statistics.fmean(defined), abs=1e-9)
    assert s.lo <= s.mean + 1e-9 and s.mean <= s.hi + 1e-9
    rev = aggregate_cells(list(reversed(rows)))[0].metrics["final_loss"]
    assert rev.mean == pytest.approx(s.mean, abs=1e-9)  # the order of seeds does not matter


# ------------------------------------------------------------------ convergence


def test_convergence_is_the_seed_mean_per_round():
    rows = [
        row("c", rep=0, rounds=[rec(1, 0.6), rec(0, 0.5)], base=[rec(0, 0.9), rec(1, 1.0)]),
        row("c", rep=1, rounds=[rec(0, 0.7), rec(1, 0.8)], base=[rec(0, 0.7), rec(1, 0.8)]),
        row("c", rep=2, finished=False),
    ]
    (c,) = convergence(rows)
    assert c.attacked == pytest.approx((0.6, 0.7)) and c.baseline == pytest.approx((0.8, 0.9))
    assert c.seeds == 2


# ------------------------------------------------------------- breakdown fraction


def _axis_cells(drops, asrs=None, attack="a", extra=None):
    asrs = asrs or [None] * len(drops)
    out = []
    for f, d, a in zip((0.1, 0.2, 0.3), drops, asrs):
        s = {FR: f, **(extra or {})}
        out.append(row(f"d[{attack},{f},{extra}]", attack=attack, settings=s, accuracy_drop=d, asr=a))
    return out


def test_breakdown_fraction_by_hand():
    cells = aggregate_cells(_axis_cells([0.01, 0.08, 0.2]))
    (r,) = breakdown(cells)  # margin 0.05: 0.08 at 0.2 is the first drop above it
    assert r.fraction == 0.2 and r.axis == FR and r.settings == ()
    assert [p[0] for p in r.points] == [0.1, 0.2, 0.3]
    assert breakdown(cells, accuracy_margin=0.1)[0].fraction == 0.3
    assert breakdown(cells, accuracy_margin=0.25)[0].fraction is None  # never breaks on the axis


def test_breakdown_by_asr_level_and_groups_by_other_settings():
    cells = aggregate_cells(
        _axis_cells([0.0, 0.0, 0.0], [0.6, 0.7, 0.9], extra={"data.alpha": 1.0})
        + _axis_cells([0.0, 0.0, 0.0], [0.1, 0.3, 0.55], extra={"data.alpha": 0.1})
        + _axis_cells([0.5, 0.5, 0.5], attack="none")  # the no-attack cells are left out
    )
    rows = {r.settings: r.fraction for r in breakdown(cells)}
    assert rows == {(("data.alpha", 1.0),): 0.1, (("data.alpha", 0.1),): 0.3}
    assert {r.settings: r.fraction for r in breakdown(cells, asr_level=0.8)} == {
        (("data.alpha", 1.0),): 0.3, (("data.alpha", 0.1),): None}


def test_no_fraction_axis_no_breakdown():
    assert breakdown(aggregate_cells([row("c", accuracy_drop=0.9)])) == ()


# ------------------------------------------------------------ envelope utilisation


def test_envelope_is_the_worst_case_over_seeds():
    rows = [
        row("c", rep=0, envelope_norm=0.8, envelope_cos=0.3, envelope_cos_margin=0.2),
        row("c", rep=1, envelope_norm=0.95, envelope_cos=0.1, envelope_cos_margin=0.0),
        row("c", rep=2, envelope_norm=None, envelope_cos=None, envelope_cos_margin=None),
        row("e", envelope_norm=None),  # nothing measured: not listed
    ]
    (e,) = envelope_utilisation(rows)
    assert (e.cell_id, e.norm, e.cos, e.cos_margin) == ("c", 0.95, 0.1, 0.0)


# -------------------------------------------------------------------- expectations


def test_expectations_checked_on_seed_means():
    rows = [row("d[a]", rep=i, accuracy_drop=v) for i, v in enumerate((0.1, 0.3))] + [
        row("d[b]", attack="b", accuracy_drop=0.01)]
    cells = aggregate_cells(rows)
    exps = [{"metric": "accuracy_drop", "max": 0.15, "min": None, "attack": None, "defense": "d", "settings": [],
             "index": 0}]
    res = {r.cell_id: r for r in check_expectations(cells, exps)}
    assert res["d[a]"].value == pytest.approx(0.2)
    assert res["d[a]"].failure == "accuracy_drop = 0.2 > max 0.15"
    assert res["d[b]"].failure is None and res["d[b]"].description == "accuracy_drop ≤ 0.15"


# ------------------------------------------------------------------------ writers


def _report():
    rows = [row("d[a]", rep=i, settings={FR: 0.2}, accuracy_drop=v, asr=None, bytes_on_wire=17280)
            for i, v in enumerate((0.1, 0.2, 0.3))]
    rows.append(row("d[b|x]", attack="b|x", settings={FR: 0.2}, accuracy_drop=0.05))
    meta = {"scenario_name": "hand", "versions": {"redteam": "0.1.0"}, "reproduce": "redteam matrix s.toml --out r",
            "expectations": [{"metric": "accuracy_drop", "max": 0.15, "index": 0}]}
    return report_from_rows(rows, source="/tmp/r/results.sqlite", meta=meta)


def test_markdown_table_rows_and_escaping():
    md = to_markdown(_report(), ["accuracy_drop"])
    assert "### malicious_fraction=0.2" in md
    assert "| a | 0.200 ± 0.248 |" in md
    assert "| b\\|x | 0.050 |" in md  # a pipe in a label cannot break the table
    assert "FAILS: accuracy_drop = 0.2 > max 0.15" in md
    assert "redteam matrix s.toml --out r" in md


def test_json_document():
    doc = json.loads(to_json(_report(), ["accuracy_drop", "asr"]))
    assert doc["format"] == "redteam.report/v1" and doc["scenario"]["name"] == "hand"
    a = doc["cells"][0]
    assert a["settings"] == {FR: 0.2} and a["seeds_planned"] == 3
    assert a["metrics"]["accuracy_drop"]["mean"] == pytest.approx(0.2)
    assert a["metrics"]["accuracy_drop"]["hi"] == pytest.approx(0.448434, abs=1e-6)
    assert a["metrics"]["asr"] == {"mean": None, "lo": None, "hi": None, "n": 0}
    assert doc["expectations"][0]["holds"] is False


def test_csv_one_row_per_cell():
    rows = list(csv.DictReader(io.StringIO(to_csv(_report(), ["accuracy_drop", "asr"]))))
    assert [r["cell_id"] for r in rows] == ["d[a]", "d[b|x]"]
    assert rows[0][FR] == "0.2" and rows[0]["seeds_finished"] == "3"
    assert float(rows[0]["accuracy_drop"]) == pytest.approx(0.2)
    assert float(rows[0]["accuracy_drop_lo"]) == pytest.approx(-0.048434, abs=1e-6)
    assert rows[0]["asr"] == "" and rows[0]["asr_n"] == "0"  # undefined → empty
    assert rows[1]["accuracy_drop_n"] == "1"


def test_value_formatting():
    assert fmt_value("bytes_on_wire", 17280) == "17,280"
    assert fmt_value("accuracy_drop", 0.05) == "0.050"
    assert fmt_value("asr", None) == "—" and fmt_value("asr", math.nan) == "—"
    assert fmt_value("wall_time_per_round_s", 0.012345) == "0.0123"


def test_resolve_metrics():
    assert resolve_metrics(["asr,recall", "fpr", "asr"]) == ["asr", "recall", "fpr"]
    assert set(REPORT_METRICS) >= {"tp", "fp", "tn", "fn", "accuracy_drop"}
    with pytest.raises(ReportError, match=r"--metric 'acc_drop': unknown metric; did you mean 'accuracy_drop'"):
        resolve_metrics(["acc_drop"])
