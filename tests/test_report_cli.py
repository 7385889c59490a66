"""``redteam report`` end to end: formats, --fail-if exit codes, bad input, the HTML page, and
the summary `redteam matrix` prints (on a real, tiny synthetic matrix)."""

import base64
import csv
import io
import json
import re
import textwrap
import tomllib
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings, strategies as st

from redteam.cli import main
from redteam.report import load_report, toml_dump
from redteam.runner.store import PlanRow, ResultsStore
from redteam.types import RoundRecord

FR = "federation.malicious_fraction"
DOC = {"scenario": {"name": "hand", "seed": 1}, "workload": {"name": "synthetic"},
       "federation": {"clients": 4, "rounds": 2},
       "matrix": {"attacks": ["none", "sign_flip"], "defenses": ["mean", "krum"], "seeds": 2,
                  "settings": {FR: [0.25, 0.5]}},
       "expect": [{"attack": "sign_flip", "defense": "krum", "metric": "accuracy_drop", "max": 0.05}]}

# accuracy drop of sign_flip per (defense, fraction), per seed (hand-picked)
DROPS = {("mean", 0.25): (0.10, 0.20), ("mean", 0.5): (0.30, 0.50),
         ("krum", 0.25): (0.00, 0.02), ("krum", 0.5): (0.04, 0.06)}


def _rounds(accs, malicious=(False, True, False, False)):
    return [RoundRecord(i, a, 1.0 - a, [True] * 4, list(malicious), [True] * 4, bytes_on_wire=1000).to_dict()
            for i, a in enumerate(accs)]


def make_store(path):
    """A store with hand-made metrics: 2 attacks × 2 defenses × 2 fractions × 2 seeds."""
    plan, pos = [], 0
    with ResultsStore(path) as store:
        for frac in (0.25, 0.5):
            for defense in ("mean", "krum"):
                for attack in ("none", "sign_flip"):
                    cell = f"{defense}[{attack},malicious_fraction={frac}]"
                    for rep in (0, 1):
                        bkey = f"b-{defense}-{frac}-{rep}"
                        key = bkey if attack == "none" else f"a-{defense}-{frac}-{rep}"
                        plan.append(PlanRow(cell, rep, attack, defense, {FR: frac}, 10 + rep, key, bkey, pos))
                        base = _rounds([0.6, 0.8], malicious=(False,) * 4)
                        if attack == "none":
                            metrics = {"accuracy_drop": 0.0, "final_accuracy": 0.8, "asr": None, "recall": None,
                                       "fpr": 0.0, "tp": 0, "fp": 0, "tn": 8, "fn": 0}
                            rounds, baseline = base, True
                        else:
                            drop = DROPS[(defense, frac)][rep]
                            metrics = {"accuracy_drop": drop, "final_accuracy": 0.8 - drop, "asr": None,
                                       "recall": 1.0 if defense == "krum" else 0.0, "fpr": 0.0,
                                       "envelope_norm": 0.9 if defense == "mean" else None}
                            rounds, baseline = _rounds([0.5, 0.8 - drop]), False
                        store.put_run(run_key=key, baseline=baseline, cell_id=cell, attack=attack, defense=defense,
                                      settings={FR: frac}, replicate=rep, seed=10 + rep, scenario_digest=key,
                                      metrics=metrics, rounds=rounds, versions={"redteam": "0.1.0"}, wall_time_s=0.1)
                        if attack != "none":
                            store.put_run(run_key=bkey, baseline=True, cell_id=f"{defense}[none]", attack="none",
                                          defense=defense, settings={FR: frac}, replicate=rep, seed=10 + rep,
                                          scenario_digest=bkey, metrics={"accuracy_drop": 0.0}, rounds=base,
                                          versions={"redteam": "0.1.0"}, wall_time_s=0.1)
                    pos += 1
        store.set_plan(plan)
        store.set_meta(scenario_name="hand", scenario_file="hand.toml", scenario_doc=DOC,
                       versions={"redteam": "0.1.0", "torch": "2.13.0+cpu", "python": "3.11"},
                       reproduce=f"redteam matrix hand.toml --out {path}",
                       expectations=[{"metric": "accuracy_drop", "max": 0.05, "min": None, "attack": "sign_flip",
                                      "defense": "krum", "settings": [], "index": 0}])
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("rep") / "out")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------- formats


def test_default_table(store, capsys):
    code, out, err = run(capsys, "report", store)
    assert code == 0, err
    assert "accuracy_drop · malicious_fraction=0.25" in out and "accuracy_drop · malicious_fraction=0.5" in out
    # sign_flip vs mean at 0.25: seeds 0.1, 0.2 → 0.150 ± 12.706·0.05 = 0.635
    assert re.search(r"sign_flip\s+│\s+0\.150 ± 0\.635\s+│\s+0\.010 ± 0\.127", out)
    assert "16/16 runs finished" in out


def test_markdown_json_csv(store, capsys, tmp_path):
    code, md, _ = run(capsys, "report", store, "--format", "md", "--metric", "accuracy_drop,recall")
    assert code == 0 and "## recall" in md and "| sign_flip | 0.150 ± 0.635 | 0.010 ± 0.127 |" in md
    assert "## Breakdown fraction (malicious_fraction)" in md
    code, js, _ = run(capsys, "report", store, "--format", "json")
    doc = json.loads(js)
    cells = {c["cell_id"]: c for c in doc["cells"]}
    assert cells["krum[sign_flip,malicious_fraction=0.5]"]["metrics"]["accuracy_drop"]["mean"] == pytest.approx(0.05)
    # breakdown (margin 0.05): mean breaks at 0.25 (0.15 > 0.05); krum never (0.01, 0.05 not > 0.05)
    bd = {r["defense"]: r["breakdown_fraction"] for r in doc["breakdown"]["rows"]}
    assert bd == {"mean": 0.25, "krum": None}
    out = tmp_path / "r.csv"
    code, _, err = run(capsys, "report", store, "--format", "csv", "--metric", "accuracy_drop", "--out", out)
    assert code == 0 and "wrote" in err
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 8 and set(rows[0]) >= {"cell_id", FR, "accuracy_drop", "accuracy_drop_lo"}


def test_breakdown_margin_option(store, capsys):
    _, js, _ = run(capsys, "report", store, "--format", "json", "--margin", "0.02")
    bd = {r["defense"]: r["breakdown_fraction"] for r in json.loads(js)["breakdown"]["rows"]}
    assert bd == {"mean": 0.25, "krum": 0.5}  # krum: 0.05 at 0.5 exceeds 0.02


# ------------------------------------------------------------------------- fail-if


def test_fail_if_names_every_offending_cell(store, capsys):
    code, out, err = run(capsys, "report", store, "--fail-if", "accuracy_drop > 0.12 or fpr > 0.5")
    assert code == 1 and out  # the table is still printed
    assert "2 of 8 cell(s) fail" in err
    assert "mean[sign_flip,malicious_fraction=0.25]: accuracy_drop = 0.150, fpr = 0.000" in err
    assert "mean[sign_flip,malicious_fraction=0.5]: accuracy_drop = 0.400, fpr = 0.000" in err
    assert "krum[" not in err


def test_fail_if_passes_and_null_is_false(store, capsys):
    code, _, err = run(capsys, "report", store, "--fail-if", "accuracy_drop > 0.9", "--format", "csv")
    assert code == 0 and "no cell fails" in err
    code, _, _ = run(capsys, "report", store, "--fail-if", "asr > 0")  # asr undefined everywhere
    assert code == 0
    code, _, err = run(capsys, "report", store, "--fail-if", "recall < 0.5")  # null recall of 'none' cells
    assert code == 1 and "none" not in err and err.count("mean[sign_flip") == 2


# ----------------------------------------------------------------------- bad input


def _one_line_error(code, err):
    assert code == 2
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("redteam: error:")
    return lines[0]


def test_bad_input_is_one_line_exit_2(store, capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert "no results store here" in _one_line_error(*run(capsys, "report", tmp_path / "empty")[::2])
    assert "no such directory" in _one_line_error(*run(capsys, "report", tmp_path / "nope")[::2])
    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "results.sqlite").write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 20)
    assert "not a redteam results store" in _one_line_error(*run(capsys, "report", bad)[::2])
    msg = _one_line_error(*run(capsys, "report", store, "--metric", "acc_drop")[::2])
    assert "did you mean 'accuracy_drop'" in msg
    msg = _one_line_error(*run(capsys, "report", store, "--fail-if", "__import__('os').system('true')")[::2])
    assert "function call" in msg
    assert "syntax error" in _one_line_error(*run(capsys, "report", store, "--fail-if", "asr >")[::2])
    msg = _one_line_error(*run(capsys, "report", store, "--fail-if", "asrr > 0")[::2])
    assert "did you mean 'asr'" in msg
    assert "cannot write" in _one_line_error(
        *run(capsys, "report", store, "--format", "md", "--out", tmp_path / "no" / "dir" / "x.md")[::2])


def test_store_with_unreadable_rows(tmp_path, capsys):
    path = make_store(tmp_path / "s")
    import sqlite3

    con = sqlite3.connect(path / "results.sqlite")
    con.execute("UPDATE runs SET metrics = '{not json' WHERE run_key LIKE 'a-%'")
    con.commit()
    con.close()
    assert "corrupt results store" in _one_line_error(*run(capsys, "report", path)[::2])


# ---------------------------------------------------------------------------- HTML


class _Checker(HTMLParser):
    VOID = {"meta", "img", "br", "hr", "link", "input", "source", "col", "wbr"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.urls, self.images, self.ids = [], [], [], [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("src", "href"):
            if k in a:
                self.urls.append(a[k])
        if tag == "img":
            self.images.append(a.get("src", ""))
        if "id" in a:
            self.ids.add(a["id"])
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def test_html_is_self_contained_and_well_formed(store, capsys):
    code, out, _ = run(capsys, "report", store, "--format", "html")
    assert code == 0 and "report.html" in out
    page = (store / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    p = _Checker()
    p.feed(page)
    p.close()
    assert not p.errors and not p.stack
    assert not [u for u in p.urls if re.match(r"\s*(https?:)?//", u, re.I)]  # nothing from the network
    assert all(u.startswith(("#", "data:image/png;base64,")) for u in p.urls)
    assert not re.search(r"https?://", page)
    assert len(p.images) >= 3 + 2 + 1  # 3 heatmaps (accuracy_drop, recall, fpr), 2 convergence, 1 fraction plot
    for src in p.images:
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"expectations", "heatmaps", "convergence", "detection", "breakdown", "envelope", "scenario",
            "reproduce"} <= p.ids
    assert "<script" not in page.lower()
    assert "redteam matrix hand.toml --out" in page and "2.13.0+cpu" in page
    assert "krum[sign_flip,malicious_fraction=0.5]" in page  # expectation verdict (0.05 ≤ 0.05 holds)
    assert "[[expect]]" in page and "&quot;federation.malicious_fraction&quot; = [0.25, 0.5]" in page


def test_html_custom_out_and_metrics(store, capsys, tmp_path):
    out = tmp_path / "sub" / "r.html"
    code, _, _ = run(capsys, "report", store, "--format", "html", "--out", out, "--metric", "final_accuracy")
    assert code == 0
    page = out.read_text()
    assert "final_accuracy: clean test accuracy" in page and "heatmap of recall" not in page


def test_scenario_dump_reads_back_as_the_same_toml():
    assert tomllib.loads(toml_dump(DOC)) == DOC


_scalar = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                    st.text(max_size=12))
_key = st.text(min_size=0, max_size=8)
_doc = st.recursive(
    st.dictionaries(_key, _scalar, max_size=4),
    lambda inner: st.dictionaries(_key, st.one_of(_scalar, inner, st.lists(_scalar, max_size=3),
                                                  st.lists(inner, min_size=1, max_size=2)), max_size=4),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None)
@given(_doc)
def test_toml_dump_round_trips(doc):
    assert tomllib.loads(toml_dump(doc)) == doc


# ------------------------------------------------------- a real matrix, then reports


def test_matrix_prints_summary_and_writes_html(tmp_path, capsys):
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(textwrap.dedent(
        """
        [scenario]
        name = "tiny"
        seed = 5
        [workload]
        name = "synthetic"
        samples = 200
        [federation]
        clients = 4
        rounds = 2
        [matrix]
        # a comment, kept as written
        attacks = ["none", "sign_flip"]
        defenses = ["mean"]
        [matrix.settings]
        "federation.malicious_fraction" = [0.25]
        """
    ))
    out = tmp_path / "out"
    code, text, err = run(capsys, "matrix", scenario, "--out", out, "--quiet")
    assert code == 0, err
    assert "accuracy_drop · malicious_fraction=0.25" in text and "sign_flip" in text
    assert f"HTML report: {out / 'report.html'}" in text.replace("\n", "")
    assert (out / "report.html").stat().st_size > 10_000
    # said before the figures are drawn (issue 40 §4), on stderr
    assert f"redteam: writing the HTML report (2 cells, with figures) to {out / 'report.html'} ..." in err
    page = (out / "report.html").read_text(encoding="utf-8")
    # the scenario as written (comment and layout), not re-serialised; reruns in a column that wraps, whole
    assert ('<pre class="src">\n[scenario]\nname = &quot;tiny&quot;' in page
            and "# a comment, kept as written\nattacks = [&quot;none&quot;, &quot;sign_flip&quot;]" in page)
    assert re.search(r'<td class="cmd"><code>redteam run [^<]*--cell [^<]*--seed \d+[^<]*</code></td>', page)
    assert page.count('<div class="tw"><table') == page.count("<table")
    report = load_report(out)
    assert [c.finished for c in report.cells] == [1, 1]
    none = [c for c in report.cells if c.attack == "none"]
    assert all(c.value("accuracy_drop") == 0.0 for c in none)  # the baseline against itself
    curves = {c.cell_id: c for c in report.curves}
    assert all(len(c.attacked) == 2 and len(c.baseline) == 2 for c in curves.values())
    code, js, _ = run(capsys, "report", out, "--format", "json", "--fail-if", "final_accuracy > 2")
    assert code == 0 and json.loads(js)["scenario"]["name"] == "tiny"


def test_unfinished_cells_are_marked_and_fail_closed(tmp_path, capsys):
    path = make_store(tmp_path / "partial")
    with ResultsStore(path, create=False) as st:
        plan = st.plan()
        extra = PlanRow("median[sign_flip,malicious_fraction=0.25]", 0, "sign_flip", "median", {FR: 0.25}, 10,
                        "never-run", "never-run-b", 99)
        st.set_plan(plan + [extra])
    code, out, err = run(capsys, "report", path, "--fail-if", "accuracy_drop > 0.12")
    assert code == 1
    assert "16/17 runs finished" in out and "…" in out
    assert "1 cell(s) have no finished run" in err
    assert "median[sign_flip,malicious_fraction=0.25]: no finished run (fails closed)" in err.split("fail:")[1]
    # a gate that passes every finished cell still fails on the cell nothing can be said of
    code, _, err = run(capsys, "report", path, "--fail-if", "accuracy_drop > 10")
    assert code == 1 and "fails closed" in err


def test_print_summary_without_a_store_says_so(tmp_path):
    from rich.console import Console

    from redteam.report.cli import print_summary

    console = Console(file=io.StringIO(), width=120)
    assert print_summary(console, tmp_path).html is None
    assert "no report" in console.file.getvalue()


def test_labels_are_escaped_in_html_and_figures():
    from redteam.report import render_html, report_from_rows

    evil = "<script>alert(1)</script>$x^$"
    rows = [{"cell_id": f"mean[{evil}]", "attack": evil, "defense": "m&n", "settings": {"codec.name": "<u>"},
             "replicate": 0, "seed": 1, "finished": True, "metrics": {"accuracy_drop": 0.1},
             "rounds": [{"round": 0, "accuracy": 0.5}], "baseline_rounds": [{"round": 0, "accuracy": 0.6}]}]
    page = render_html(report_from_rows(rows, meta={"scenario_name": "<i>x</i>"}), ["accuracy_drop"])
    assert "<script" not in page and "<u>" not in page and "<i>x" not in page
    assert "&lt;script&gt;" in page and "&lt;i&gt;x" in page


def test_report_writes_nothing_to_the_store_it_reads(tmp_path, capsys):
    """issue 22 §7: `redteam report` opened the store for writing (schema statements, journal
    mode); a report is a reader: the file's bytes stay the same and no side file appears."""
    import hashlib

    path = make_store(tmp_path / "ro")
    db = path / "results.sqlite" if path.is_dir() else path
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    side = sorted(p.name for p in db.parent.iterdir())
    import sqlite3

    import redteam.runner.store as store_mod

    opened: list[str] = []
    real = sqlite3.connect

    def spy(target, *a, **k):
        opened.append(str(target))
        return real(target, *a, **k)

    import pytest as _pytest

    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_mod.sqlite3, "connect", spy)
        code, out, err = run(capsys, "report", path)
    assert code == 0, err
    assert opened and all("mode=ro" in t for t in opened), opened  # every connection read-only
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in db.parent.iterdir()) == side


def test_matrix_whose_html_report_cannot_be_written_exits_2_and_keeps_the_runs(tmp_path, capsys):
    """The runs are stored, but OUT/report.html cannot be written (here a directory stands in
    its place, as a full disk would stop it): `redteam matrix` says so on stderr, with the command
    that writes it later, and exits 2, not 0 (it printed "HTML report skipped" and exited 0)."""
    from redteam.runner.store import ResultsStore

    f = tmp_path / "m.toml"
    f.write_text('[scenario]\nname = "h"\nseed = 1\n[workload]\nname = "synthetic"\nsamples = 300\n'
                 '[federation]\nclients = 4\nrounds = 2\nmalicious_fraction = 0.25\n'
                 '[matrix]\nattacks = ["sign_flip"]\ndefenses = ["mean"]\nseeds = 1\n')
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)
    code, _, err = run(capsys, "matrix", f, "--out", out, "--quiet")
    assert code == 2, err
    assert "the runs are stored in" in err and "HTML report could not be written" in err
    assert f"redteam report {out} --format html" in err
    with ResultsStore(out, create=False) as st:
        assert len(st.finished_keys()) == 2  # the baseline and the attacked run
