"""Reports treat names as data (Markdown escaped, CSV formulas neutralised) and a
``--fail-if`` gate fails closed on a cell whose model broke (issue 9 §2, §4)."""

from __future__ import annotations

import csv
import io
import math

import pytest

from redteam.cli import main
from redteam.report.formats import to_csv, to_markdown
from redteam.report.load import load_report
from redteam.runner.store import PlanRow, ResultsStore
from redteam.types import RoundRecord


def _rounds(accs, loss=0.5, extra=None):
    out = []
    for i, a in enumerate(accs):
        r = RoundRecord(i, a, loss, [True] * 4, [False, True, False, False], [True] * 4, bytes_on_wire=10).to_dict()
        if extra and i == len(accs) - 1:
            r["extra"] = dict(extra)
        out.append(r)
    return out


def make_store(path, cells):
    """``cells``: (attack, defense, metrics, rounds) per cell, one seed each, one shared baseline."""
    plan = []
    with ResultsStore(path) as st:
        st.put_run(run_key="base", baseline=True, cell_id="mean[none]", attack="none", defense="mean", settings={},
                   replicate=0, seed=1, scenario_digest="base", metrics={"accuracy_drop": 0.0},
                   rounds=_rounds([0.5, 0.8]), versions={}, wall_time_s=0.1)
        for pos, (attack, defense, metrics, rounds) in enumerate(cells):
            cell = f"{defense}[{attack}]"
            key = f"k{pos}"
            st.put_run(run_key=key, baseline=False, cell_id=cell, attack=attack, defense=defense, settings={},
                       replicate=0, seed=1, scenario_digest=key, metrics=metrics, rounds=rounds, versions={},
                       wall_time_s=0.1)
            plan.append(PlanRow(cell, 0, attack, defense, {}, 1, key, "base", pos))
        st.set_plan(plan)
        st.set_meta(scenario_name="*evil* <b>name</b>", reproduce="redteam matrix 'a ```b' --out x")
    return path


HOSTILE_ATTACK = "=HYPERLINK(\"http://x\")|[click](javascript:alert(1))"
HOSTILE_DEFENSE = "@SUM(1+1)*_<img src=x>_\nrow"


@pytest.fixture
def hostile(tmp_path):
    m = {"accuracy_drop": 0.1, "asr": None, "final_accuracy": 0.7, "final_loss": 0.6}
    return make_store(tmp_path / "s", [(HOSTILE_ATTACK, HOSTILE_DEFENSE, m, _rounds([0.5, 0.7], 0.6)),
                                       ("-2+3", "mean", m, _rounds([0.5, 0.7], 0.6))])


def test_markdown_escapes_every_label(hostile):
    from redteam.report.formats import md_text

    md = to_markdown(load_report(hostile), ["accuracy_drop"])
    # by hand: md_text escapes Markdown punctuation with "\" and <, & as entities
    assert md_text("a|b*c_[x](y)<i>&") == "a\\|b\\*c\\_\\[x\\](y)&lt;i>&amp;"
    assert md_text("sign_flip 0.25 _x_") == "sign_flip 0.25 \\_x\\_"  # intraword _ is literal in CommonMark
    assert "# redteam report: \\*evil\\* &lt;b>name&lt;/b>" in md
    assert "<img" not in md and "<b>" not in md and "\\[click\\](javascript" in md
    assert md_text(HOSTILE_ATTACK) in md and md_text(HOSTILE_DEFENSE) in md
    # the newline in the defense label does not split a table row
    table = [ln for ln in md.splitlines() if ln.startswith("| attack")][0]
    assert table.count("|") - table.count("\\|") == 4  # 3 columns: 4 unescaped bars
    # the reproduce command holds ``` so the fence is longer
    assert "````\nredteam matrix 'a ```b' --out x\n````" in md


def test_csv_neutralises_formula_prefixes_and_keeps_numbers(hostile):
    from redteam.report.formats import csv_safe

    rows = list(csv.reader(io.StringIO(to_csv(load_report(hostile), ["accuracy_drop"]))))
    header, cells = rows[0], rows[1:]
    by_attack = {r[header.index("attack")]: r for r in cells}
    assert "'" + HOSTILE_ATTACK in by_attack and "'-2+3" in by_attack
    row = by_attack["'" + HOSTILE_ATTACK]
    assert row[header.index("defense")] == "'" + HOSTILE_DEFENSE
    assert row[header.index("cell_id")].startswith("'@SUM")
    assert float(row[header.index("accuracy_drop")]) == 0.1  # numbers stay numbers
    assert [csv_safe(v) for v in ("=1", "+1", "-1", "@1", "\t1", "\r1", "a=1", -0.5, 3)] == [
        "'=1", "'+1", "'-1", "'@1", "'\t1", "'\r1", "a=1", -0.5, 3]


# ------------------------------------------------------------------- fail closed


def test_model_broke_reads_the_flag_and_a_nonfinite_final_loss():
    from redteam.report.aggregate import model_broke

    ok = {"metrics": {"final_loss": 0.5}, "rounds": _rounds([0.5, 0.6])}
    assert not model_broke(ok)
    assert model_broke({"metrics": {"final_loss": None}, "rounds": _rounds([0.5, 0.6])})  # NaN is stored as null
    assert model_broke({"metrics": {"final_loss": math.inf}})
    assert model_broke({"metrics": {}, "rounds": _rounds([0.5, 0.6], extra={"model_nonfinite": True})})
    assert model_broke({"metrics": {}, "rounds": _rounds([0.5]), "baseline_rounds": _rounds([0.1], loss=None)})
    assert not model_broke({"metrics": {}, "rounds": _rounds([0.5], extra={"model_nonfinite": False})})


def test_fail_if_fails_closed_when_the_model_broke(tmp_path, capsys):
    fine = {"accuracy_drop": 0.01, "final_loss": 0.4}
    # the broken run's accuracy_drop is small (a NaN model can score anything): the gate
    # "accuracy_drop > 0.05" alone would pass it
    broken = {"accuracy_drop": 0.0, "final_loss": None}
    flagged = {"accuracy_drop": 0.02, "final_loss": 0.4}
    store = make_store(tmp_path / "s", [
        ("sign_flip", "mean", fine, _rounds([0.5, 0.8], 0.4)),
        ("ipm", "mean", broken, _rounds([0.5, 0.8], None)),
        ("alie", "mean", flagged, _rounds([0.5, 0.8], 0.4, extra={"model_nonfinite": True})),
    ])
    code = main(["report", str(store), "--fail-if", "accuracy_drop > 0.05", "--format", "csv"])
    err = capsys.readouterr().err
    assert code == 1
    assert "2 of 3 cell(s) fail" in err
    assert "mean[ipm]: the model broke" in err and "mean[alie]: the model broke" in err
    assert "mean[sign_flip]" not in err
    # without the broken cells the same gate passes
    store2 = make_store(tmp_path / "s2", [("sign_flip", "mean", fine, _rounds([0.5, 0.8], 0.4))])
    assert main(["report", str(store2), "--fail-if", "accuracy_drop > 0.05", "--format", "csv"]) == 0


def test_html_report_command_is_shell_quoted(tmp_path):
    import html
    import re
    import shlex

    from redteam.report.html import render_html

    m = {"accuracy_drop": 0.1, "final_loss": 0.5}
    out = make_store(tmp_path / "my out $(id)", [("sign_flip", "mean", m, _rounds([0.5, 0.7]))])
    page = render_html(load_report(out), ["accuracy_drop"])
    cmd = [html.unescape(x) for x in re.findall(r"redteam report [^\n<]*", page)]
    assert [shlex.split(c) for c in cmd] == [["redteam", "report", str(out)]]


def test_the_defenders_markdown_header_escapes_the_reference_label():
    """issue 22 §3: "cost vs LABEL" names the reference defense by its matrix label; rendered with
    python-markdown (MkDocs' renderer), an unescaped label ran as a script."""
    import markdown

    from redteam.report import report_from_rows
    from redteam.report.formats import to_markdown
    from test_defender_answer import cell_rows

    evil = '<script>alert(1)</script>'
    rows = cell_rows(evil, "alie", [0.9], [0.5]) + cell_rows("median", "alie", [0.85], [0.7])
    rep = report_from_rows(rows, meta={"scenario_doc": {"matrix": {"defenses": [{"name": "mean", "label": evil},
                                                                               "median"]}}})
    md = to_markdown(rep, ["accuracy_drop"])
    assert any("cost vs" in line for line in md.splitlines())
    html = markdown.markdown(md, extensions=["tables"])
    assert "<script" not in html
