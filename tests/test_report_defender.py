"""The defender's summary (issue 11 §1, issue 18 §1): per defense its clean accuracy, its cost
against plain ``mean``, its worst accuracy under attack and worst ASR (with the attack), detection
only where the rule can reject, and a ranking by harm (the larger of the learnable accuracy lost
from the best clean defense and the worst ASR). Every expected figure is worked by hand from the
synthetic rows below, never read back from the code. tests/test_defender_answer.py holds the
cases of issue 18 (a non-learning defense, a leaky one, noise, ties, language models)."""

import json
import re
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redteam.cli import main
from redteam.report import load_report, report_from_rows, to_json, to_markdown
from redteam.report.defender import (
    NO_REJECT,
    RANK_RULE,
    defender_columns,
    defender_notes,
)
from redteam.report.html import render_html
from redteam.runner.store import PlanRow, ResultsStore
from redteam.types import RoundRecord

FR = "federation.malicious_fraction"


def rounds(final, rejected=None, n=4):
    """Two rounds; the last one's accuracy is ``final``; ``rejected``: client ids flagged in round 1."""
    rej = {str(i): "norm" for i in (rejected or ())}
    acc = [str(i) not in rej for i in range(n)]
    return [{"round": 0, "accuracy": 0.5, "loss": 1.0, "accepted": [True] * n, "participating": [True] * n,
             "malicious": [False] * n, "rejected": {}},
            {"round": 1, "accuracy": final, "loss": 0.5, "accepted": acc, "participating": [True] * n,
             "malicious": [False] * n, "rejected": rej}]


def row(attack, defense, rep, clean, settings=None, finished=True, base_rejected=None, **metrics):
    """One plan row: the attacked run's metrics and the baseline's rounds (final accuracy ``clean``)."""
    s = settings or {}
    tail = ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in s.items())
    return {"cell_id": f"{defense}[{attack}{',' + tail if tail else ''}]", "attack": attack, "defense": defense,
            "settings": s, "replicate": rep, "seed": 10 + rep, "finished": finished,
            "metrics": metrics if finished else None, "rounds": rounds(0.5) if finished else None,
            "baseline_rounds": rounds(clean, base_rejected)}


# Clean (baseline) final accuracy per defense and seed:
#   mean 0.90, 0.92 → 0.910; median 0.78, 0.80 → 0.790; norm_bound 0.90, 0.90 → 0.900; krum 0.86, 0.88 → 0.870
# Cost vs mean = 0.910 − clean: median +0.120, norm_bound +0.010, krum +0.040.
CLEAN = {"mean": (0.90, 0.92), "median": (0.78, 0.80), "norm_bound": (0.90, 0.90), "krum": (0.86, 0.88)}
# Per (defense, attack): accuracy_drop, asr, recall, fpr, tp, fp (the same in both seeds).
# mean/median weigh everything: tp = fp = 0, recall 0, precision undefined.
CELLS = {
    ("mean", "sign_flip"): (0.50, None, 0.0, 0.0, 0, 0),
    ("mean", "backdoor"): (0.02, 0.90, 0.0, 0.0, 0, 0),
    ("median", "sign_flip"): (0.10, None, 0.0, 0.0, 0, 0),
    ("median", "backdoor"): (0.05, 0.20, 0.0, 0.0, 0, 0),
    ("norm_bound", "sign_flip"): (0.01, None, 1.0, 0.05, 8, 2),
    ("norm_bound", "backdoor"): (0.03, 0.60, 0.0, 0.02, 0, 1),
    ("krum", "sign_flip"): (0.03, None, 0.5, 0.10, 4, 4),
    ("krum", "backdoor"): (0.03, 0.10, 0.5, 0.10, 4, 4),
}


def rows_of(cells=CELLS, clean=CLEAN, settings=None):
    out = []
    for (d, a), (drop, asr, rec, fpr, tp, fp) in cells.items():
        for rep in (0, 1):
            prec = tp / (tp + fp) if tp + fp else None
            out.append(row(a, d, rep, clean[d][rep], settings, accuracy_drop=drop, asr=asr, recall=rec, fpr=fpr,
                           precision=prec, tp=tp, fp=fp, final_accuracy=clean[d][rep] - drop))
    return out


def by_defense(group):
    return {r.defense: r for r in group.rows}


def test_worked_example_ranking_cost_worst_case_and_detection():
    report = report_from_rows(rows_of())
    (g,) = report.defenders.groups
    assert g.reference == "mean" and g.attacks == ("sign_flip", "backdoor") and g.targeted == ("backdoor",)
    rows = by_defense(g)
    # clean: mean of the two seeds; interval with 2 seeds: s = √((0.01² + 0.01²)/1) = 0.014142, se = 0.01,
    # half-width = t(0.975, 1) · 0.01 = 0.12706
    assert rows["mean"].clean.mean == pytest.approx(0.91) and rows["mean"].clean.half_width == pytest.approx(0.12706)
    assert rows["norm_bound"].clean.half_width == pytest.approx(0.0)
    assert rows["median"].cost == pytest.approx(0.12) and rows["krum"].cost == pytest.approx(0.04)
    assert rows["norm_bound"].cost == pytest.approx(0.01) and rows["mean"].cost == pytest.approx(0.0)
    # worst case: the larger of the two attacks' drops; krum's tie (0.03, 0.03) names the first in matrix order
    assert (rows["mean"].worst_drop, rows["mean"].worst_drop_attack) == (pytest.approx(0.5), "sign_flip")
    assert (rows["norm_bound"].worst_drop, rows["norm_bound"].worst_drop_attack) == (pytest.approx(0.03), "backdoor")
    assert rows["krum"].worst_drop_attack == "sign_flip"
    # worst ASR: only the targeted attack (backdoor) has one
    assert (rows["mean"].worst_asr, rows["mean"].worst_asr_attack) == (pytest.approx(0.9), "backdoor")
    # worst accuracy under attack (clean − drop per seed, seed mean): mean 0.41 (sign_flip), median 0.69
    # (sign_flip), norm_bound 0.87 (backdoor: 0.90 − 0.03), krum 0.84 (sign_flip first of a tie)
    assert rows["mean"].worst_quality.mean == pytest.approx(0.41) and rows["mean"].worst_quality_attack == "sign_flip"
    assert rows["norm_bound"].worst_quality.mean == pytest.approx(0.87)
    assert rows["norm_bound"].worst_quality_attack == "backdoor"
    # harm, best clean 0.91 (mean), no untrained level in these rows → floor 0:
    #   mean max(0.50/0.91, 0.9) = 0.9; median max(0.22/0.91 = 0.2418, 0.2) = 0.2418;
    #   norm_bound max(0.04/0.91, 0.6) = 0.6; krum max(0.07/0.91 = 0.0769, 0.1) = 0.1
    assert rows["mean"].harm == pytest.approx(0.9) and rows["median"].harm == pytest.approx(0.22 / 0.91)
    assert rows["norm_bound"].harm == pytest.approx(0.6) and rows["krum"].harm == pytest.approx(0.1)
    # the leaky norm_bound (best drop, ASR 0.6) is not the pick: krum, median, norm_bound, mean
    assert [r.defense for r in g.rows] == ["krum", "median", "norm_bound", "mean"]
    assert [r.rank for r in g.rows] == [1, 2, 3, 4]
    # detection: mean and median never flagged anything → n/a; norm_bound's worst recall is backdoor's 0.0
    assert report.defenders.non_rejecting == {"mean", "median"}
    assert (rows["norm_bound"].worst_recall, rows["norm_bound"].worst_recall_attack) == (0.0, "backdoor")
    assert (rows["norm_bound"].worst_fpr, rows["norm_bound"].worst_fpr_attack) == (pytest.approx(0.05), "sign_flip")
    assert rows["median"].worst_recall is None and not rows["median"].rejects

    header, body = defender_columns(g, report.defenders)
    assert header == ["#", "defense", "harm ↓", "clean accuracy ↑", "cost vs mean", "worst under attack ↑",
                      "worst drop", "worst ASR ↓", "worst recall ↑", "worst FPR ↓"]
    assert body[2] == ["3", "norm_bound", "0.60", "0.900 ± 0.000", "+0.010", "0.870 (backdoor)", "+0.030 (backdoor)",
                       "0.600 (backdoor)", "0.000 (backdoor)", "0.050 (sign_flip)"]
    assert body[1] == ["≈1", "median", "0.24 [0.20, 0.38]", "0.790 ± 0.127", "+0.120", "0.690 (sign_flip)",
                       "+0.100 (sign_flip)", "0.200 (backdoor)", NO_REJECT, NO_REJECT]
    # noise, two seeds (t(0.975, 1) · 0.01 = 0.127 on every accuracy): krum's harm interval is
    # [max(0, 0.1), max((0.91 − 0.967)/0.91 → 0, (0.91 − 0.713)/0.91 = 0.216, 0.1)] = [0.1, 0.216];
    # median's [max(0.102, 0.2), max(0.381, 0.2)] = [0.2, 0.381] overlaps it → "≈1"; norm_bound's
    # ASR 0.6 (no spread) and mean's 0.9 do not
    assert g.seeds == 2 and [r.tied_with_leader for r in g.rows] == [False, True, False, False]
    assert g.rows[1].harm_lo == pytest.approx(0.2) and g.rows[1].harm_hi == pytest.approx((0.91 - 0.69 + 0.12706) / 0.91)
    assert g.headline[1] == "Indistinguishable from krum at 95 % over 2 seeds: median."
    assert g.headline[0] == ("Pick: krum, harm 0.10 (worst accuracy under attack 0.840 (sign_flip); "
                             "worst ASR 0.100 (backdoor); clean 0.870; flags the attackers in 2 of 2 attacks "
                             "(recall ≥ 0.5)).")
    assert body[3][4] == "reference"


def test_mean_absent_no_target_no_filter_say_so_in_one_line_each():
    cells = {k: v for k, v in CELLS.items() if k[0] == "median" and k[1] == "sign_flip"}
    report = report_from_rows(rows_of(cells))
    (g,) = report.defenders.groups
    assert g.reference is None and g.rows[0].cost is None
    header, body = defender_columns(g, report.defenders)
    # only the columns the matrix has data for
    assert header == ["#", "defense", "harm ↓", "clean accuracy ↑", "worst under attack ↑", "worst drop"]
    # alone, median is the best clean (0.79): harm = (0.79 − 0.69) / 0.79 = 0.1266
    assert body == [["1", "median", "0.13 [0.00, 0.29]", "0.790 ± 0.127", "0.690 (sign_flip)", "+0.100 (sign_flip)"]]
    notes = defender_notes(g, report.defenders)
    assert "cost vs mean: n/a (mean not in the matrix)." in notes
    assert "worst ASR: n/a (no targeted attack in the matrix)." in notes
    assert "detection: n/a (no defense in the matrix rejects updates)." in notes
    assert notes[1] == "R" + RANK_RULE[1:] + "."


def test_only_the_baseline_ranks_by_clean_accuracy():
    # attack "none" only: no worst case; mean 0.91 > median 0.79
    cells = {("median", "none"): (0.0, None, None, 0.0, 0, 0), ("mean", "none"): (0.0, None, None, 0.0, 0, 0)}
    report = report_from_rows(rows_of(cells))
    (g,) = report.defenders.groups
    assert g.attacks == () and [r.defense for r in g.rows] == ["mean", "median"]
    header, _ = defender_columns(g, report.defenders)
    assert "worst under attack ↑" not in header and "harm ↓" not in header
    assert "worst case: n/a (no attack in the matrix, only the no-attack baseline)." in defender_notes(
        g, report.defenders)


def test_a_filter_that_fired_anywhere_keeps_its_figures_everywhere():
    # norm_bound rejects nothing at fraction 0.1 (recall 0, tp = fp = 0) but does at 0.4: its 0.000 at 0.1
    # is a miss, not "n/a". median rejects nothing in attacked runs, but one baseline round rejected
    # client 2 (an integrity check, say): detection there is not vacuous either. mean never rejects.
    rows = []
    for frac, nb in ((0.1, (0.02, None, 0.0, 0.0, 0, 0)), (0.4, (0.04, None, 1.0, 0.0, 8, 0))):
        cells = {("mean", "ipm"): (0.3, None, 0.0, 0.0, 0, 0), ("norm_bound", "ipm"): nb,
                 ("median", "ipm"): (0.1, None, 0.0, 0.0, 0, 0)}
        rows += rows_of(cells, settings={FR: frac})
    rows[-1]["baseline_rounds"] = rounds(0.79, rejected=[2])
    report = report_from_rows(rows)
    assert report.defenders.non_rejecting == {"mean"}
    g01, g04 = report.defenders.groups
    assert g01.settings == ((FR, 0.1),) and g04.settings == ((FR, 0.4),)
    nb01 = by_defense(g01)["norm_bound"]
    assert nb01.rejects and nb01.worst_recall == 0.0 and nb01.worst_recall_attack == "ipm"
    assert by_defense(g01)["median"].rejects and by_defense(g01)["median"].worst_recall == 0.0


def test_unfinished_cells_are_starred_and_ranked_after_complete_ones():
    rows = rows_of()
    # norm_bound's backdoor cell: seed 1 not finished → still worst 0.03 over what finished, but incomplete
    for r in rows:
        if r["defense"] == "norm_bound" and r["attack"] == "backdoor" and r["replicate"] == 1:
            r.update(finished=False, metrics=None, rounds=None)
    report = report_from_rows(rows)
    (g,) = report.defenders.groups
    assert [r.defense for r in g.rows] == ["krum", "median", "mean", "norm_bound"]
    _, body = defender_columns(g, report.defenders)
    assert body[3][5] == "0.870* (backdoor)"
    assert any(n.startswith("* = some attacked cells") for n in defender_notes(g, report.defenders))


def test_every_format_carries_the_summary_first():
    report = report_from_rows(rows_of(), meta={"scenario_name": "hand"})
    md = to_markdown(report, ["accuracy_drop", "recall"])
    assert md.index("## Defender's summary") < md.index("## accuracy_drop")
    assert "| 3 | norm\\_bound |" not in md and "| 3 | norm_bound | 0.60 | 0.900 ± 0.000 | +0.010 |" in md
    assert "| 4 | mean | 0.90 | 0.910 ± 0.127 | reference |" in md
    assert md.index("Pick: krum") < md.index("| 1 | krum |")
    # the recall grid: mean and median read n/a (with a one-line legend), the filters keep their numbers
    recall = md[md.index("## recall"):]
    assert "| sign\\_flip | n/a | n/a | 1.000 ± 0.000 | 0.500 ± 0.000 |" not in recall  # md_text leaves sign_flip
    assert "| sign_flip | n/a | n/a | 1.000 ± 0.000 | 0.500 ± 0.000 |" in recall
    assert "n/a = the defense does not reject: mean, median" in recall
    assert "| sign_flip | 0.500 ± 0.000 | 0.100 ± 0.000 |" in md  # accuracy_drop grid untouched
    doc = json.loads(to_json(report, ["accuracy_drop"]))
    d = {x["defense"]: x for x in doc["defenders"]["groups"][0]["defenses"]}
    assert d["median"]["cost_vs_reference"] == pytest.approx(0.12) and d["median"]["worst_recall"] is None
    assert d["median"]["rejects"] is False and d["norm_bound"]["worst_recall"] == {"value": 0.0, "attack": "backdoor"}
    assert doc["defenders"]["rank_rule"] == RANK_RULE
    assert d["krum"]["rank"] == 1 and d["krum"]["harm"]["value"] == pytest.approx(0.1)
    assert doc["defenders"]["groups"][0]["quality"]["metric"] == "final_accuracy_last_k"
    assert doc["defenders"]["groups"][0]["headline"][0].startswith("Pick: krum")
    page = render_html(report, ["accuracy_drop"])
    assert page.index('id="defenders"') < page.index('id="expectations"')
    # the detection table: rows of mean/median say n/a instead of recall 0.000
    det = page[page.index('id="detection"'):page.index('id="breakdown"')]
    assert det.count(f"<td>{NO_REJECT}</td>") == 4 * 4  # 4 cells (mean, median × 2 attacks) × 4 rates
    assert "<td>1.000 ± 0.000</td>" in det  # norm_bound vs sign_flip keeps its recall (2 equal seeds)


# ------------------------------------------------------------- end to end, real store and CLI


def test_report_cli_prints_the_summary_first_and_json_has_defenders(tmp_path, capsys):
    path = tmp_path / "out"
    plan = []
    with ResultsStore(path) as store:
        for pos, (d, a) in enumerate((("mean", "sign_flip"), ("median", "sign_flip"))):
            bkey, key = f"b-{d}", f"a-{d}"
            plan.append(PlanRow(f"{d}[{a}]", 0, a, d, {}, 10, key, bkey, pos))
            clean, drop = (0.9, 0.5) if d == "mean" else (0.8, 0.1)
            base = [RoundRecord(i, x, 1.0, [True] * 4, [False] * 4, [True] * 4).to_dict()
                    for i, x in enumerate((0.5, clean))]
            att = [RoundRecord(i, x, 1.0, [True] * 4, [False, True, False, False], [True] * 4).to_dict()
                   for i, x in enumerate((0.5, clean - drop))]
            store.put_run(run_key=bkey, baseline=True, cell_id=f"{d}[none]", attack="none", defense=d, settings={},
                          replicate=0, seed=10, scenario_digest=bkey, metrics={"accuracy_drop": 0.0}, rounds=base,
                          versions={}, wall_time_s=0.1)
            store.put_run(run_key=key, baseline=False, cell_id=f"{d}[{a}]", attack=a, defense=d, settings={},
                          replicate=0, seed=10, scenario_digest=key,
                          metrics={"accuracy_drop": drop, "final_accuracy": clean - drop, "recall": 0.0, "tp": 0,
                                   "fp": 0}, rounds=att,
                          versions={}, wall_time_s=0.1)
        store.set_plan(plan)
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    # median: worst accuracy 0.7 against mean's 0.4; harm from the best clean 0.9 (floor 0): median
    # 0.2/0.9 = 0.22, mean 0.5/0.9 = 0.56; median costs 0.9 − 0.8 = +0.100 clean accuracy
    assert out.index("Defender's summary") < out.index("accuracy_drop")
    assert out.index("One seed:") < out.index("Pick: median")
    assert re.search(r"1 median\s+0\.22\s+0\.800\s+\+0\.100\s+0\.700 \(sign_flip\)", out)
    assert "cost vs mean = what the defense pays in clean accuracy" in out
    assert "recall ↑" not in out.split("accuracy_drop")[0]
    assert main(["report", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [x["defense"] for x in doc["defenders"]["groups"][0]["defenses"]] == ["median", "mean"]


def test_matrix_end_of_run_prints_the_summary(tmp_path, capsys):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(textwrap.dedent(
        """
        [scenario]
        name = "tiny"
        seed = 3
        [workload]
        name = "synthetic"
        samples = 200
        [federation]
        clients = 4
        rounds = 3
        malicious_fraction = 0.25
        [matrix]
        attacks = ["sign_flip"]
        defenses = ["mean", "median"]
        """
    ))
    out = tmp_path / "out"
    assert main(["matrix", str(scenario), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert text.index("Defender's summary") < text.index("HTML report")
    report = load_report(out)
    (g,) = report.defenders.groups
    with ResultsStore(out, create=False) as store:
        base = {r["defense"]: r["baseline_rounds"][-1]["accuracy"] for r in store.results(with_rounds=True)}
    # the clean accuracy is the baseline run's last-round accuracy; the cost is mean's minus median's
    rows = by_defense(g)
    assert rows["median"].clean.mean == pytest.approx(base["median"])
    assert rows["median"].cost == pytest.approx(base["mean"] - base["median"])
    assert report.defenders.non_rejecting == {"mean", "median"}


@pytest.mark.parametrize("width", [80, 200])
def test_terminal_summary_fits_the_width_and_cuts_no_word(width):
    import io

    from rich.console import Console

    from redteam.report.defender import print_defenders
    from redteam.report.tables import _markup

    rows = rows_of({(d.replace("krum", "centered_clipping"), a): v for (d, a), v in CELLS.items()},
                   clean={**CLEAN, "centered_clipping": CLEAN["krum"]})
    report = report_from_rows(rows)
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=True)
    print_defenders(console, report.defenders, _markup)
    text = console.file.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
    # every label and figure is whole: no column folded a word to fit (median's cost 0.910 − 0.790)
    for word in ("centered_clipping", "norm_bound", "sign_flip", "backdoor", "+0.120", "reference", "reject)"):
        assert word in text
    # at 200 columns a worst case reads "value (attack)" on one line; at 80 the attack goes below it,
    # the worst drop is left out, and the notes say so instead of describing it
    assert ("0.500 (sign_flip)" in text) == (width == 200)
    assert ("worst drop" in text.split("Quality here")[0]) == (width == 200)
    assert ("is left out at this width" in text) == (width == 80)


def test_a_summary_written_to_a_file_or_pipe_keeps_every_column():
    """issue 40 §4: not a terminal (a file, a pipe, a CI log): no screen to fit, so the table keeps
    its worst drop column and one line per row, whatever the console's width."""
    import io

    from rich.console import Console

    from redteam.report.defender import print_defenders
    from redteam.report.tables import _markup

    report = report_from_rows(rows_of(CELLS, clean=CLEAN))
    console = Console(file=io.StringIO(), width=80, color_system=None)
    assert not console.is_terminal
    print_defenders(console, report.defenders, _markup)
    text = console.file.getvalue()
    table = text.split("Quality here")[0]
    assert "worst drop" in table and "0.500 (sign_flip)" in table and "left out" not in text
    assert "'worst drop' is from the defense's own baseline" in text
    assert max(len(line) for line in table.splitlines()) > 80 and console.width == 80  # given back


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(-0.2, 0.9, allow_nan=False), min_size=3, max_size=3), min_size=2, max_size=4),
       st.lists(st.floats(0.3, 1.0, allow_nan=False), min_size=4, max_size=4))
def test_property_worst_case_is_a_cell_and_rank_one_has_the_least_harm(drops, cleans):
    # defenses d0..dk × attacks a0..a2, one seed: each row's worst case is one of its own cells and none
    # is worse; harm = (best clean − worst under attack) / best clean (no untrained level: floor 0); the
    # ranking never puts a larger harm (one seed: in steps of ONE_SEED_STEP) above a smaller one, and
    # equal keys share a rank
    defenses = [f"d{i}" for i in range(len(drops))]
    rows = [row(f"a{j}", d, 0, cleans[i], accuracy_drop=v, final_accuracy=cleans[i] - v, recall=0.0, tp=0, fp=0)
            for i, d in enumerate(defenses) for j, v in enumerate(drops[i])]
    (g,) = report_from_rows(rows).defenders.groups
    best = max(cleans[: len(defenses)])
    for r in g.rows:
        i = defenses.index(r.defense)
        under = [cleans[i] - v for v in drops[i]]
        assert r.worst_quality.mean == pytest.approx(min(under))
        assert r.worst_drop in drops[i] and all(v <= r.worst_drop for v in drops[i])
        assert r.clean.mean == cleans[i] and r.cost is None  # no "mean" here
        assert r.harm == pytest.approx(min(1.0, max(0.0, (best - min(under)) / best)))
    from redteam.report.defender import ONE_SEED_STEP

    def step(v):
        return round(v / ONE_SEED_STEP)

    harms = [step(r.harm) for r in g.rows]
    assert harms == sorted(harms) and g.rows[0].rank == 1
    for a, b in zip(g.rows, g.rows[1:]):
        assert (a.rank == b.rank) == (step(a.harm) == step(b.harm) and step(a.clean.mean) == step(b.clean.mean))


@pytest.mark.parametrize("width", [60, 200])
def test_hostile_labels_stay_text_in_the_terminal_summary(width):
    import io

    from rich.console import Console

    from redteam.report.defender import print_defenders
    from redteam.report.tables import _markup

    attack, defense = "[bold]a\ntk\x1b[2J", "d[red]\nrow"
    report = report_from_rows([row(attack, defense, 0, 0.8, accuracy_drop=0.25, recall=0.0, tp=0, fp=0)])
    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_defenders(console, report.defenders, _markup)
    text = console.file.getvalue()
    # brackets printed as brackets, control characters (the newline too) as escapes, each label in one piece
    assert "\x1b" not in text and "[bold]a\\ntk\\x1b[2J" in text
    assert "d[red]\\nrow" in text


def test_the_reference_is_found_under_its_matrix_label():
    # { name = "mean", label = "fedavg" } is plain mean: median's cost = 0.91 − 0.79 = +0.120 against it;
    # { name = "mean", weighted = false } is another rule, not the reference
    cells = {(d, "sign_flip"): CELLS[("mean" if d == "fedavg" else d, "sign_flip")] for d in ("fedavg", "median")}
    clean = {"fedavg": CLEAN["mean"], "median": CLEAN["median"]}
    doc = {"matrix": {"defenses": [{"name": "mean", "label": "fedavg"}, "median"]}}
    summary = report_from_rows(rows_of(cells, clean), meta={"scenario_doc": doc}).defenders
    (g,) = summary.groups
    assert summary.reference == "fedavg" and g.reference == "fedavg"
    assert by_defense(g)["median"].cost == pytest.approx(0.12)
    assert defender_columns(g, summary)[0][4] == "cost vs fedavg"
    other = {"matrix": {"defenses": [{"name": "mean", "weighted": False, "label": "fedavg"}, "median"]}}
    summary = report_from_rows(rows_of(cells, clean), meta={"scenario_doc": other}).defenders
    assert summary.groups[0].reference is None
    assert "cost vs mean: n/a (mean not in the matrix)." in defender_notes(summary.groups[0], summary)


def test_an_fpr_of_zero_names_no_attack():
    # norm_bound flags malicious updates only (fp = 0 in both cells): its worst FPR is 0 and no attack caused it
    cells = {("norm_bound", "sign_flip"): (0.01, None, 1.0, 0.0, 8, 0),
             ("norm_bound", "ipm"): (0.02, None, 0.5, 0.0, 4, 0)}
    summary = report_from_rows(rows_of(cells)).defenders
    (g,) = summary.groups
    (r,) = g.rows
    assert (r.worst_fpr, r.worst_fpr_attack) == (0.0, None)
    assert (r.worst_recall, r.worst_recall_attack) == (0.5, "ipm")
    assert defender_columns(g, summary)[1][0][-1] == "0.000"
