"""Seed intervals stay within what a metric can be (issue 24 §1: a recall shown as
[-1.499, 2.949]): rates in [0, 1], counts and times ≥ 0; an undefined metric stays undefined."""

from __future__ import annotations

import pytest

from redteam.report.aggregate import aggregate_cells
from redteam.scoring import METRICS, mean_ci, metric_range


def test_mean_ci_clamps_to_bounds_and_keeps_the_rest():
    raw = mean_ci([0.0, 0.0, 1.0])
    assert raw["lo"] < 0 and raw["hi"] > 1  # the t-interval of three seeds leaves [0, 1]
    ci = mean_ci([0.0, 0.0, 1.0], bounds=(0.0, 1.0))
    assert ci["mean"] == pytest.approx(1 / 3) and (ci["lo"], ci["hi"]) == (0.0, 1.0) and ci["n"] == 3
    assert mean_ci([5.0, 1.0, 0.0], bounds=(0.0, None))["lo"] == 0.0
    assert mean_ci([5.0, 1.0, 0.0], bounds=(0.0, None))["hi"] == raw_hi(5.0, 1.0, 0.0)
    inner = mean_ci([0.4, 0.5, 0.6], bounds=(0.0, 1.0))
    assert inner == mean_ci([0.4, 0.5, 0.6])  # an interval inside the range is untouched
    assert mean_ci([None, None], bounds=(0.0, 1.0)) == {"mean": None, "lo": None, "hi": None, "n": 0}
    big = mean_ci([1.7e308, -1.7e308, 1.7e308], bounds=(0.0, None))
    assert big["lo"] is None and big["hi"] is None and "undefined" in big  # still undefined, with its reason


def raw_hi(*xs: float) -> float:
    return mean_ci(list(xs))["hi"]


def test_rates_and_counts_have_ranges():
    for m in ("recall", "precision", "fpr", "asr", "final_accuracy", "f1"):
        assert metric_range(m) == (0.0, 1.0), m
    for m in ("tp", "fp", "tn", "fn", "bytes_on_wire", "rejected_updates", "dropped_updates"):
        assert metric_range(m) == (0.0, None), m
    assert metric_range("bits_per_byte_increase") == (None, None)  # a change: either sign
    assert set(metric_range.__globals__["METRIC_RANGES"]) <= set(METRICS) | {"tp", "fp", "tn", "fn"}


def test_report_cells_show_clamped_intervals():
    rows = [{"cell_id": "c", "attack": "ipm", "defense": "krum", "settings": {}, "finished": True,
             "metrics": {"recall": r, "fpr": f, "rejected_updates": n, "accuracy_drop": d}}
            for r, f, n, d in ((0.0, 0.0, 0, 0.01), (0.0, 0.0, 0, 0.02), (1.0, 0.9, 12, 0.5))]
    (cell,) = aggregate_cells(rows)
    for m in ("recall", "fpr"):
        s = cell.metrics[m]
        assert 0.0 <= s.lo <= s.mean <= s.hi <= 1.0, (m, s)
    assert cell.metrics["rejected_updates"].lo == 0.0 and cell.metrics["rejected_updates"].hi > 4
    s = cell.metrics["accuracy_drop"]
    assert -1.0 <= s.lo < 0 and s.hi <= 1.0


def test_a_clamped_interval_is_shown_as_its_ends():
    from redteam.report.tables import fmt_stat

    rows = [{"cell_id": "c", "attack": "ipm", "defense": "krum", "settings": {}, "finished": True,
             "metrics": {"recall": r, "final_accuracy": a}} for r, a in ((0.0, 0.5), (0.0, 0.6), (1.0, 0.7))]
    (cell,) = aggregate_cells(rows)
    assert fmt_stat("recall", cell.metrics["recall"]) == "0.333 [0.000, 1.000]"
    assert fmt_stat("final_accuracy", cell.metrics["final_accuracy"]).startswith("0.600 ± ")  # inside [0, 1]
