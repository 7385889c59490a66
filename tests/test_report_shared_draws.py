"""A figure drawn from a stream that does not depend on the attack is one sample (issue 33 §7).

A pipeline check's ``detection_latency`` is set by which hops the check recomputes, drawn from
the defense's own stream: every attack it catches gets the same per-seed values, one draw
repeated in every attack row, which reads like several independent confirmations. The reports
mark those cells ``†`` and say, under the table, that they are one sample. The rows below are
synthetic: ``lazy`` and ``activation_sign`` share the per-seed latencies (7, 1, 2), while
``gradient_scale`` differs in one seed (7, 1, 4)."""

import html
import io
import json

from rich.console import Console

from redteam.report import report_from_rows, to_json, to_markdown
from redteam.report.aggregate import SHARED_MARK, shared_draws
from redteam.report.html import render_html
from redteam.report.tables import print_tables

LATENCY = {"lazy": (7.0, 1.0, 2.0), "activation_sign": (7.0, 1.0, 2.0), "gradient_scale": (7.0, 1.0, 4.0)}
NOTE = ("detection_latency under recompute: the same per-seed values for lazy, activation_sign (a draw that does "
        "not depend on the attack, e.g. the defense's own sampling): one sample of 3 seeds, not 2 confirmations")


def _rounds(n=4):
    return [{"round": 0, "accuracy": 0.5, "loss": 1.0, "accepted": [True] * n, "participating": [True] * n,
             "malicious": [False] * n, "rejected": {}}]


def row(attack, rep, settings=None, defense="recompute", finished=True, **metrics):
    s = settings or {}
    tail = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in s.items())
    return {"cell_id": f"{defense}[{attack}{',' + tail if tail else ''}]", "attack": attack, "defense": defense,
            "settings": s, "replicate": rep, "seed": 100 + rep, "finished": finished,
            "metrics": metrics if finished else None, "rounds": _rounds() if finished else None,
            "baseline_rounds": _rounds()}


def rows_of(latency=LATENCY, settings=None, defense="recompute"):
    # accuracy_drop differs per attack and seed (never shared); recall is 1.0 everywhere (constant:
    # a saturated measure, never marked)
    return [row(a, rep, settings, defense, detection_latency=v, accuracy_drop=0.01 * (i + 1) + 0.001 * rep,
                recall=1.0, tp=4, fp=0)
            for i, (a, vals) in enumerate(latency.items()) for rep, v in enumerate(vals)]


def test_two_attacks_with_the_same_per_seed_values_share_one_draw():
    (d,) = shared_draws(rows_of())
    assert (d.metric, d.defense, d.attacks) == ("detection_latency", "recompute", ("lazy", "activation_sign"))
    assert d.cell_ids == ("recompute[lazy]", "recompute[activation_sign]")
    assert d.replicates == (0, 1, 2) and d.values == (7.0, 1.0, 2.0)
    assert d.note() == NOTE


def test_the_table_marks_the_two_and_names_them_not_the_third():
    report = report_from_rows(rows_of())
    assert report.shared_cells("detection_latency") == {"recompute[lazy]", "recompute[activation_sign]"}
    assert report.shared_notes("detection_latency") == [f"{SHARED_MARK} {NOTE}"]
    assert report.shared_notes("accuracy_drop") == [] and report.shared_notes("recall") == []
    console = Console(file=io.StringIO(), width=400, color_system=None)
    print_tables(console, report, ["detection_latency", "recall"])
    text = console.file.getvalue()
    lines = text.splitlines()
    by_attack = {a: next(ln for ln in lines if ln.startswith(f"│ {a} ")) for a in LATENCY}
    # lazy and activation_sign: mean 3.33 (the same draw); gradient_scale 4 — only the first two marked
    assert SHARED_MARK in by_attack["lazy"] and SHARED_MARK in by_attack["activation_sign"]
    assert SHARED_MARK not in by_attack["gradient_scale"]
    note = [ln for ln in lines if ln.startswith(SHARED_MARK)]
    assert note == [f"{SHARED_MARK} {NOTE}"]
    assert "gradient_scale" not in note[0]
    # the recall grid (1.0 in every seed of every attack) carries no marker and no note
    recall = text[text.index("recall: "):]
    assert SHARED_MARK not in recall


def test_every_format_says_so():
    report = report_from_rows(rows_of(), meta={"scenario_name": "pl"})
    md = to_markdown(report, ["detection_latency"])
    assert f"- {SHARED_MARK} detection\\_latency under recompute" not in md  # md_text leaves inner underscores
    assert f"- {SHARED_MARK} {NOTE}" in md
    assert md.count(SHARED_MARK) == 2 + 1  # two cells, one note
    doc = json.loads(to_json(report, ["detection_latency", "accuracy_drop"]))
    assert doc["shared_draws"] == [{
        "metric": "detection_latency", "defense": "recompute", "settings": {},
        "attacks": ["lazy", "activation_sign"], "cell_ids": ["recompute[lazy]", "recompute[activation_sign]"],
        "replicates": [0, 1, 2], "values": [7.0, 1.0, 2.0], "note": NOTE}]
    cells = {c["cell_id"]: c["shared_draws"] for c in doc["cells"]}
    assert cells["recompute[lazy]"] == {"detection_latency": ["recompute[lazy]", "recompute[activation_sign]"]}
    assert cells["recompute[gradient_scale]"] == {}
    page = render_html(report, ["detection_latency"])
    escaped = html.escape(NOTE)  # the page escapes text (the apostrophe too)
    heat = page[page.index('id="heatmaps"'):page.index('id="fraction"')]
    assert escaped in heat
    everything = page[page.index('id="metrics"'):page.index('id="seeds"')]
    assert escaped in everything and everything.count(f"{SHARED_MARK}</td>") == 2


def test_one_attack_alone_has_no_note():
    report = report_from_rows(rows_of({"lazy": (7.0, 1.0, 2.0)}))
    assert report.shared == ()
    console = Console(file=io.StringIO(), width=400, color_system=None)
    print_tables(console, report, ["detection_latency"])
    assert SHARED_MARK not in console.file.getvalue()
    assert json.loads(to_json(report, ["detection_latency"]))["shared_draws"] == []


def test_what_is_not_one_draw():
    # different seeds finished (activation_sign's seed 2 has not): not the same seeds, not marked
    rows = rows_of()
    for r in rows:
        if r["attack"] == "activation_sign" and r["replicate"] == 2:
            r.update(finished=False, metrics=None)
    assert shared_draws(rows) == ()
    # one seed: nothing can be told
    assert shared_draws([r for r in rows_of() if r["replicate"] == 0]) == ()
    # constant over the seeds (a saturated measure): not marked, whatever the attacks
    assert shared_draws(rows_of({"lazy": (2.0, 2.0, 2.0), "activation_sign": (2.0, 2.0, 2.0)})) == ()
    # the same values under two defenses, or in two settings groups, are not compared with each other
    two_defenses = rows_of({"lazy": (7.0, 1.0, 2.0)}) + rows_of({"lazy": (7.0, 1.0, 2.0)}, defense="commit")
    assert shared_draws(two_defenses) == ()
    groups = (rows_of({"lazy": (7.0, 1.0, 2.0)}, settings={"pipeline.fraction": 0.25})
              + rows_of({"activation_sign": (7.0, 1.0, 2.0)}, settings={"pipeline.fraction": 0.5}))
    assert shared_draws(groups) == ()


def test_a_settings_group_is_named_in_the_note():
    (d,) = shared_draws(rows_of(settings={"pipeline.fraction": 0.25}))
    assert d.settings == (("pipeline.fraction", 0.25),)
    assert d.note().startswith("detection_latency under recompute (fraction=0.25): the same per-seed values")
