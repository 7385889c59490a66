"""A scenario declares the metric its defender cares about (issue 33 §6): ``[matrix]
defender_metric = "cheat_reward_ratio"``. A rewarding validator's cheats want payment, not damage,
so the defender's summary must rank by what they are paid, not by harm. The synthetic rows below
make the two rankings disagree: ``gauntlet`` keeps the model best but pays the cheats about a fair
share; ``spot_check`` costs accuracy but pays them almost nothing. Every expected figure is worked
by hand from these rows."""

import json
import textwrap

import pytest

from redteam.cli import main
from redteam.errors import InvalidScenario
from redteam.matrix import check_defender_metric, defender_metrics, expand
from redteam.report import report_from_rows, to_json, to_markdown
from redteam.report.defender import defender_columns, defender_notes
from redteam.report.html import default_html_metrics, render_html
from redteam.scoring import HIGHER_IS_BETTER

DOC = {"matrix": {"defender_metric": "cheat_reward_ratio"}}


def _rounds(final, n=4):
    return [{"round": 0, "accuracy": 0.1, "loss": 2.3, "accepted": [True] * n, "participating": [True] * n,
             "malicious": [False] * n, "rejected": {}},
            {"round": 1, "accuracy": final, "loss": 0.5, "accepted": [True] * n, "participating": [True] * n,
             "malicious": [False] * n, "rejected": {}}]


def _row(attack, defense, rep, clean, **metrics):
    return {"cell_id": f"{defense}[{attack}]", "attack": attack, "defense": defense, "settings": {},
            "replicate": rep, "seed": 10 + rep, "finished": True, "metrics": metrics, "rounds": _rounds(0.5),
            "baseline_rounds": _rounds(clean)}


# Clean accuracy per defense and seed (the baseline's last round): both 0.90, 0.92.
# Per (defense, attack), per seed: (accuracy drop, cheat_reward_ratio).
CELLS = {
    ("gauntlet", "sybil"): ((0.01, 0.86), (0.03, 0.90)),  # ratio mean 0.88
    ("gauntlet", "stale_rider"): ((0.02, 0.90), (0.02, 0.92)),  # ratio mean 0.91 ← gauntlet's worst
    ("spot_check", "sybil"): ((0.20, 0.04), (0.22, 0.06)),  # ratio mean 0.05; drop mean 0.21 ← worst accuracy
    ("spot_check", "stale_rider"): ((0.10, 0.07), (0.12, 0.09)),  # ratio mean 0.08 ← spot_check's worst
}


def rows_of(cells=CELLS, metric="cheat_reward_ratio"):
    out = []
    for (d, a), seeds in cells.items():
        for rep, (drop, value) in enumerate(seeds):
            clean = (0.90, 0.92)[rep]
            out.append(_row(a, d, rep, clean, accuracy_drop=drop, final_accuracy=clean - drop,
                            **{metric: value}, recall=0.0, tp=0, fp=0))
    return out


def test_without_a_declaration_harm_picks_the_gauntlet():
    (g,) = report_from_rows(rows_of()).defenders.groups
    assert g.ranked_by is None and [r.defense for r in g.rows] == ["gauntlet", "spot_check"]
    assert g.headline[0].startswith("Pick: gauntlet, harm")


def test_the_declared_metric_ranks_and_names_the_pick():
    report = report_from_rows(rows_of(), meta={"scenario_doc": DOC})
    summary = report.defenders
    (g,) = summary.groups
    assert summary.metric == "cheat_reward_ratio" and g.ranked_by == "cheat_reward_ratio"
    # the worst seed mean over the attacks, lower is better so the largest: gauntlet 0.91 (stale_rider),
    # spot_check 0.08 (stale_rider); the accuracy ranking (harm) would have put gauntlet first
    rows = {r.defense: r for r in g.rows}
    assert rows["gauntlet"].declared.mean == pytest.approx(0.91)
    assert rows["gauntlet"].declared_attack == "stale_rider"
    assert rows["spot_check"].declared.mean == pytest.approx(0.08)
    assert rows["spot_check"].declared_attack == "stale_rider"
    assert rows["spot_check"].harm > rows["gauntlet"].harm  # harm disagrees
    assert [r.defense for r in g.rows] == ["spot_check", "gauntlet"] and [r.rank for r in g.rows] == [1, 2]
    # 2 seeds: the interval is t(0.975, 1) · 0.01 = 0.127 around each mean, clamped at 0 below:
    # spot_check [0, 0.207], gauntlet [0.783, 1.037]: they do not overlap, so no "≈1"
    lead = rows["spot_check"].declared
    assert lead.lo == pytest.approx(0.0) and lead.hi == pytest.approx(0.08 + 0.12706, abs=1e-4)
    assert not rows["gauntlet"].tied_with_leader
    head = g.headline[0]
    assert head.startswith("Pick: spot_check, worst cheat_reward_ratio 0.080 [0.000, 0.207] (stale_rider): "
                           "ranked by cheat_reward_ratio (lower is better) because this scenario declares it "
                           "its defender metric ([matrix] defender_metric)")
    assert "harm 0.23" in head  # kept as context: spot_check's worst accuracy 0.70 of the best clean 0.91

    header, body = defender_columns(g, summary)
    assert header[:4] == ["#", "defense", "worst cheat_reward_ratio ↓", "harm ↓"]
    assert "clean accuracy ↑" in header  # clean quality stays as context
    assert body[0][:3] == ["1", "spot_check", "0.080 [0.000, 0.207] (stale_rider)"]
    assert body[1][:3] == ["2", "gauntlet", "0.910 [0.783, 1.037] (stale_rider)"]
    notes = defender_notes(g, summary)
    assert notes[1].startswith("Ranked by cheat_reward_ratio, the metric this scenario declares its defender "
                               "cares about ([matrix] defender_metric), not by harm")
    assert any(n.startswith("≈1 = its cheat_reward_ratio interval") for n in notes)


def test_every_format_follows_the_declaration():
    report = report_from_rows(rows_of(), meta={"scenario_doc": DOC, "scenario_name": "v"})
    md = to_markdown(report, ["accuracy_drop"])
    assert "**Pick: spot\\_check" in md or "**Pick: spot_check" in md
    assert "| worst cheat_reward_ratio ↓ |" in md
    doc = json.loads(to_json(report, ["accuracy_drop"]))
    d = doc["defenders"]
    assert d["defender_metric"] == {"metric": "cheat_reward_ratio", "higher_is_better": False,
                                    "declared_by": "[matrix] defender_metric"}
    assert d["groups"][0]["ranked_by"] == "cheat_reward_ratio"
    first = d["groups"][0]["defenses"][0]
    assert first["defense"] == "spot_check" and first["rank"] == 1
    assert first["defender_metric"]["mean"] == pytest.approx(0.08)
    assert first["defender_metric"]["attack"] == "stale_rider"
    # the heatmaps draw the declared metric first; the page's summary picks by it
    assert default_html_metrics(report)[0] == "cheat_reward_ratio"
    page = render_html(report)
    assert page.index("<h3>cheat_reward_ratio</h3>") < page.index("<h3>accuracy_drop</h3>")
    assert "<strong>Pick: spot_check, worst cheat_reward_ratio" in page


def test_a_higher_is_better_metric_ranks_the_other_way():
    # The same per-cell values under two names: recall (higher is better) and fpr (lower is better).
    # A: 0.30 (sybil), 0.95 (stale_rider); B: 0.60, 0.99 (both seeds alike).
    # recall: a defense's worst is its smallest → A 0.30, B 0.60: B first.
    # fpr: its worst is its largest → A 0.95, B 0.99: A first. The direction comes from the table.
    assert HIGHER_IS_BETTER["recall"] is True and HIGHER_IS_BETTER["fpr"] is False
    values = {("A", "sybil"): 0.30, ("A", "stale_rider"): 0.95, ("B", "sybil"): 0.60, ("B", "stale_rider"): 0.99}
    rows = []
    for (d, a), v in values.items():
        for rep in (0, 1):
            clean = (0.90, 0.92)[rep]
            rows.append(_row(a, d, rep, clean, accuracy_drop=0.01, final_accuracy=clean - 0.01, recall=v, fpr=v,
                             tp=4, fp=4))

    def summary(metric):
        return report_from_rows(rows, meta={"scenario_doc": {"matrix": {"defender_metric": metric}}}).defenders

    up = summary("recall")
    (g,) = up.groups
    by = {r.defense: r for r in g.rows}
    assert (by["A"].declared.mean, by["A"].declared_attack) == (pytest.approx(0.30), "sybil")
    assert (by["B"].declared.mean, by["B"].declared_attack) == (pytest.approx(0.60), "sybil")
    assert [r.defense for r in g.rows] == ["B", "A"]
    assert g.headline[0].startswith("Pick: B, worst recall 0.600 (sybil): ranked by recall (higher is better)")
    assert defender_columns(g, up)[0][2] == "worst recall ↑"

    down = summary("fpr")
    (g,) = down.groups
    by = {r.defense: r for r in g.rows}
    assert (by["A"].declared.mean, by["A"].declared_attack) == (pytest.approx(0.95), "stale_rider")
    assert (by["B"].declared.mean, by["B"].declared_attack) == (pytest.approx(0.99), "stale_rider")
    assert [r.defense for r in g.rows] == ["A", "B"]
    assert g.headline[0].startswith("Pick: A, worst fpr 0.950 (stale_rider): ranked by fpr (lower is better)")
    assert defender_columns(g, down)[0][2] == "worst fpr ↓"

    plain = report_from_rows(rows).defenders
    assert defender_columns(plain.groups[0], plain)[0][2] == "harm ↓"  # undeclared: no such column


def test_overlapping_intervals_are_indistinguishable_and_a_non_learner_stays_unranked():
    # C: ratio seeds 0.10, 0.50 (mean 0.30, interval [0, 2.84]) overlaps spot_check's [0, 0.207] → ≈1.
    # "idle" pays nothing (0.0) but its clean accuracy (0.12, 0.12) closes under 20 % of the gap between
    # the best clean 0.91 and the untrained level 0.1 recorded in round 0: it does not train, so it is
    # listed apart and never the pick, whatever it pays
    cells = dict(CELLS)
    cells[("C", "sybil")] = ((0.02, 0.10), (0.02, 0.50))
    rows = rows_of(cells)
    for rep in (0, 1):
        r = _row("sybil", "idle", rep, 0.12, accuracy_drop=0.0, final_accuracy=0.12, cheat_reward_ratio=0.0,
                 recall=0.0, tp=0, fp=0)
        rows.append(r)
    for r in rows:  # the untrained level: the initial model's accuracy in every baseline's first round
        r["baseline_rounds"][0]["extra"] = {"untrained": {"accuracy": 0.1, "chance_accuracy": 0.1}}
    (g,) = report_from_rows(rows, meta={"scenario_doc": DOC}).defenders.groups
    assert [(r.defense, r.rank_text) for r in g.rows] == [("spot_check", "1"), ("C", "≈1"), ("gauntlet", "3"),
                                                          ("idle", "—")]
    assert g.headline[1] == "Indistinguishable from spot_check in cheat_reward_ratio at 95 % over 2 seeds: C."
    assert any(h.startswith("Does not train here") and "idle" in h for h in g.headline)


def test_undefined_everywhere_falls_back_to_harm_and_says_so():
    doc = {"matrix": {"defender_metric": "rounds_to_catch"}}  # no spot-check rounds in these rows
    (g,) = report_from_rows(rows_of(), meta={"scenario_doc": doc}).defenders.groups
    assert g.ranked_by is None and [r.defense for r in g.rows] == ["gauntlet", "spot_check"]
    assert g.headline[0] == ("rounds_to_catch (this scenario's defender metric, [matrix] defender_metric) is "
                             "undefined in every attacked cell here: ranked by harm instead.")
    # a store whose recorded value is not a metric (hand-edited): harm, with one line saying why
    (g,) = report_from_rows(rows_of(), meta={"scenario_doc": {"matrix": {"defender_metric": "nope"}}}).defenders.groups
    assert g.ranked_by is None and g.headline[0].startswith("The stored scenario's [matrix] defender_metric = ")


# ------------------------------------------------------------------------- the key, at parse time


BASE = {"scenario": {"name": "t", "seed": 0}, "workload": {"name": "synthetic", "samples": 200},
        "federation": {"clients": 4, "rounds": 2, "malicious_fraction": 0.25},
        "matrix": {"attacks": ["sign_flip"], "defenses": ["mean", "median"]}}


def _with(value):
    return {**BASE, "matrix": {**BASE["matrix"], "defender_metric": value}}


def test_the_key_is_read_and_checked_when_the_file_loads():
    assert expand(_with("cheat_reward_ratio"), "t.toml", check_plugins=False).defender_metric == "cheat_reward_ratio"
    assert expand(BASE, "t.toml", check_plugins=False).defender_metric is None
    with pytest.raises(InvalidScenario) as e:
        expand(_with("cheat_reward_ration"), "t.toml", check_plugins=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith('t.toml: [matrix].defender_metric = "cheat_reward_ration": unknown metric')
    assert "did you mean 'cheat_reward_ratio'" in msg and "valid: " in msg
    assert all(m in msg for m in defender_metrics())
    # a metric with no direction has no worst case to rank by; a number is not a name
    with pytest.raises(InvalidScenario, match=r"bytes_on_wire.*has no direction.*valid: "):
        expand(_with("bytes_on_wire"), "t.toml", check_plugins=False)
    with pytest.raises(InvalidScenario, match=r"= 3: must be a metric name"):
        check_defender_metric(3, "t.toml")
    # the valid names are the metrics with a direction, no more
    assert set(defender_metrics()) <= set(HIGHER_IS_BETTER) and "bytes_on_wire" not in defender_metrics()
    # a misspelt key is still an unknown key, and the message lists the new one
    bad = {**BASE, "matrix": {**BASE["matrix"], "defender_metrics": "recall"}}
    with pytest.raises(InvalidScenario, match=r"\[matrix\] has unknown key 'defender_metrics' \(allowed: .*"
                                              r"defender_metric\)"):
        expand(bad, "t.toml", check_plugins=False)


def test_a_language_model_metric_is_refused_on_a_classifier():
    with pytest.raises(InvalidScenario, match=r"final_bits_per_byte.* is a language-model metric"):
        expand(_with("final_bits_per_byte"), "t.toml")


def _tiny(*, rounds: int, defenses: str, metric: str) -> str:
    """A four-client synthetic matrix under a sign flip that declares ``metric``."""
    return textwrap.dedent(f"""
        [scenario]
        name = "tiny"
        seed = 3
        [workload]
        name = "synthetic"
        samples = 200
        [federation]
        clients = 4
        rounds = {rounds}
        malicious_fraction = 0.25
        [matrix]
        attacks = ["sign_flip"]
        defenses = {defenses}
        defender_metric = "{metric}"
        """)


def test_the_cli_refuses_a_typo_in_one_line(tmp_path, capsys):
    f = tmp_path / "t.toml"
    f.write_text(_tiny(rounds=2, defenses='["mean"]', metric="cheat_reward_ration"))
    assert main(["matrix", str(f), "--dry-run", "--no-probe"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("redteam: error:")
    assert "[matrix].defender_metric" in err and "cheat_reward_ratio" in err


def test_shipped_verification_scenario_declares_the_reward_ratio():
    import tomllib
    from pathlib import Path

    path = Path(__file__).parent.parent / "scenarios" / "verification.toml"
    doc = tomllib.loads(path.read_text())
    assert doc["matrix"]["defender_metric"] == "cheat_reward_ratio"


def test_end_to_end_a_matrix_ranks_by_its_declared_metric(tmp_path, capsys):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(_tiny(rounds=3, defenses='["mean", "median"]', metric="final_accuracy"))
    out = tmp_path / "out"
    assert main(["matrix", str(scenario), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "worst final_accuracy ↑" in text and "ranked by final_accuracy (higher is better)" in text
    # the declared metric's table comes before the default one
    assert text.index("final_accuracy: clean test accuracy") < text.index("accuracy_drop: baseline final")
    assert main(["report", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    g = doc["defenders"]["groups"][0]
    assert g["ranked_by"] == "final_accuracy"
    first, second = g["defenses"]
    assert first["defender_metric"]["mean"] >= second["defender_metric"]["mean"]
