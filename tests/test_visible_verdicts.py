"""Two verdicts that used to be silent.

1. Language-model metrics (bits per byte, perplexity, their increases, the false-trigger
   rate) are functions of the final loss, so `redteam run --json` listed them for digits
   and synthetic runs, and an ``[[expect]]`` row could check them on a classifier. Now a
   run lists them only for a language-model workload (``input_kind == "tokens"``) and a
   row naming one for a classifier cell is refused when the file is loaded.
2. RLR, DnC and the trimmed mean go on through rounds thinned by churn, saying so only in
   ``Decision.state``. Now each such round's record carries a one-line note
   (``RoundRecord.defense_notes``, ``"notes"`` per round in the JSON).
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import hypothesis  # noqa: F401  (before pytester's in-process run: see tests/test_pytest_plugin.py)
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import redteam.report.applicable
import redteam.runner.matrix_run
import redteam.workloads.digits  # noqa: F401
from defenses.dnc import DnC
from redteam.cli import main
from redteam.errors import InvalidScenario
from redteam.federation.builders import build_defense
from redteam.federation.loop import Federation
from redteam.matrix import expand
from redteam.merge import degradation_notes
from redteam.matrix import load_matrix
from redteam.scenario import PluginSpec, parse_scenario
from redteam.scoring import LANGUAGE_MODEL_METRICS, summarize
from redteam.types import RoundRecord

pytest_plugins = ["pytester"]

LM = sorted(LANGUAGE_MODEL_METRICS)

# b = f = 2 (malicious_fraction 0.25 of 8); seed 0's churn leaves 8, 5, 3, 3 clients online
CHURNED_TRIMMED = """
[scenario]
name = "churned"
seed = 0
[workload]
name = "digits"
[federation]
clients = 8
rounds = 4
local_steps = 2
lr = 0.2
malicious_fraction = 0.25
[transport.network]
churn_leave = 0.5
churn_join = 0.2
[attack]
name = "sign_flip"
[defense]
name = "trimmed_mean"
"""


def _run_json(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> dict:
    sc, out = tmp_path / "s.toml", tmp_path / "out.json"
    sc.write_text(text)
    assert main(["run", str(sc), "--json", str(out), "--quiet"]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


# ------------------------------------------------------------ 1. redteam run --json


def test_run_json_of_a_classifier_has_no_language_model_metrics_and_notes_thinned_rounds(tmp_path, capsys):
    # Pins both halves end to end through `redteam run --json`:
    # * digits is a classifier: none of the language-model metrics is listed (before: all five,
    #   e.g. final_bits_per_byte = final_loss / ln 2 of a 10-class cross-entropy); the loss-based
    #   metrics any workload has stay;
    # * the trimmed mean with b = f = 2 needs 2b < n, i.e. n ≥ 5 updates. A round with n < 5
    #   trims ⌊(n − 1)/2⌋ per side (n = 3: 1) and its record says
    #   "trimmed_mean: b reduced from 2 to 1 (3 updates)"; a round with n ≥ 5 has no note.
    #   With no transport loss every online client's update reaches the defense, so n is the
    #   number of participating clients. Both runs (the baseline keeps b = 2: the scenario's
    #   count) see the same churn.
    doc = _run_json(tmp_path, CHURNED_TRIMMED, capsys)
    assert [r["attack"] for r in doc["runs"]] == ["none", "sign_flip"]
    for run in doc["runs"]:
        m = run["metrics"]
        assert not [k for k in LM if k in m], sorted(m)
        assert "final_loss" in m and "rounds_to_target_loss" in m and "final_accuracy" in m
        thinned = 0
        for r in run["rounds"]:
            n = sum(r["participating"])
            if n < 5:
                thinned += 1
                assert r["notes"] == [f"trimmed_mean: b reduced from 2 to {(n - 1) // 2} ({n} updates)"], r
            else:
                assert r["notes"] == [], r
        assert 0 < thinned < len(run["rounds"])  # the churn thins some rounds, not all


def _tiny_text_corpus(root: Path) -> Path:
    for g in range(4):
        d = root / f"pkg{g}"
        d.mkdir(parents=True)
        (d / "mod.py").write_text(f"def f{g}(x):\n    return x * {g} + {g * g}\n" * 8)
    return root


def test_run_json_of_a_language_model_keeps_its_metrics(tmp_path, capsys):
    # Pins: the `text` workload (input_kind "tokens") keeps the metrics, and bits per byte is
    # the final loss (nats per byte) over ln 2, perplexity e^loss, as defined in scoring.
    corpus = _tiny_text_corpus(tmp_path / "corpus")
    doc = _run_json(tmp_path, textwrap.dedent(f"""
        [scenario]
        name = "tiny-lm"
        seed = 0
        [workload]
        name = "text"
        text_dir = {json.dumps(str(corpus))}
        context = 8
        width = 16
        layers = 1
        heads = 2
        [federation]
        clients = 2
        rounds = 1
        local_steps = 1
        batch_size = 4
        lr = 0.01
        local_optimizer = "adamw"
        [attack]
        name = "sign_flip"
        """), capsys)
    for run in doc["runs"]:
        m = run["metrics"]
        assert {"final_bits_per_byte", "final_perplexity", "false_trigger_rate"} <= set(m)
        assert m["final_bits_per_byte"] == pytest.approx(m["final_loss"] / math.log(2))
        assert m["final_perplexity"] == pytest.approx(math.exp(m["final_loss"]))
    assert {"bits_per_byte_increase", "perplexity_increase"} <= set(doc["runs"][1]["metrics"])


# ------------------------------------------------------------ 1. [[expect]] rows

def _doc(extra: str) -> str:
    return textwrap.dedent("""
        [scenario]
        name = "rows"
        seed = 0
        [workload]
        name = "digits"
        [federation]
        clients = 4
        rounds = 1
        [matrix]
        attacks = ["none", "sign_flip"]
        """) + textwrap.dedent(extra)


ROW = """
[[expect]]
attack = "sign_flip"
metric = "final_perplexity"
max = 20.0
"""


def test_language_model_row_on_a_classifier_is_refused_at_load(tmp_path):
    # Pins: the row would pass or fail on e^(a 10-class cross-entropy); loading the file
    # refuses it in one line naming the file, the row (#1), the cell and the workload.
    path = tmp_path / "rows.toml"
    path.write_text(_doc("""
        [[expect]]
        metric = "accuracy_drop"
        max = 1.0
        """ + ROW))
    with pytest.raises(InvalidScenario) as err:
        load_matrix(path)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("rows.toml: [[expect]] #2: metric = 'final_perplexity' is a language-model metric, "
                          "but the row applies to cell mean[sign_flip] whose workload 'digits' is not a language "
                          "model"), msg
    # the same document with the row on accuracy loads
    path.write_text(_doc(ROW.replace("final_perplexity", "final_loss")))
    assert len(load_matrix(path)[1].expectations) == 1


def test_with_a_workload_axis_the_row_is_judged_per_cell(tmp_path):
    # Pins the per-cell rule: with workload.name ∈ {digits, text}, a row naming
    # false_trigger_rate that also applies to the digits cells is refused (hint: narrow it by
    # workload.name); the same row narrowed to "workload.name" = "text" loads.
    text = _doc('[matrix.settings]\n"workload.name" = ["digits", "text"]\n')
    row = '[[expect]]\nattack = "sign_flip"\nmetric = "false_trigger_rate"\nmax = 0.1\n'
    import tomllib

    with pytest.raises(InvalidScenario, match=r"^m\.toml: \[\[expect\]\] #1: .* cell mean\[sign_flip,name=digits\] "
                                              r"whose workload 'digits' .*\"workload\.name\" = \"text\""):
        expand(tomllib.loads(text + row), "m.toml")
    narrowed = row + '"workload.name" = "text"\n'
    mx = expand(tomllib.loads(text + narrowed), "m.toml")
    [exp] = mx.expectations
    assert [c.id for c in mx.cells if exp.matches(c)] == ["mean[sign_flip,name=text]"]
    # collection (check_plugins=False) stays torch-free and does not judge: the first run does
    assert expand(tomllib.loads(text + row), "m.toml", check_plugins=False).expectations


def test_shipped_scenarios_still_load():
    # every shipped file's rows (scenarios/llm.toml names false_trigger_rate on text cells)
    root = Path(__file__).resolve().parent.parent / "scenarios"
    files = sorted([*root.glob("*.toml"), *root.glob("literature/*.toml")])
    files = [f for f in files if "[limits]" not in f.read_text()]  # limits.toml is no scenario
    assert any(f.name == "llm.toml" for f in files) and len(files) >= 8
    for f in files:
        load_matrix(f)


def test_pytest_item_of_a_refused_row_fails_with_the_one_line_error(pytester):
    # the pytest plugin collects the cells (no torch), then the file's first run refuses it
    pytester.makeini("[pytest]\n")
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "lmrow.toml").write_text(_doc(ROW))
    res = pytester.runpytest("-q", "-p", "no:cacheprovider", "scenarios/lmrow.toml")
    res.assert_outcomes(failed=1)
    line = ("InvalidScenario: lmrow.toml: [[expect]] #1: metric = 'final_perplexity' is a language-model metric, "
            "but the row applies to cell mean[sign_flip] whose workload 'digits' is not a language model")
    assert line in res.stdout.str()
    # nothing ran, so the reproduce block must not say the cell's runs are stored
    assert "in the store already" not in res.stdout.str() and "once the error above is fixed" in res.stdout.str()


# ------------------------------------------------------------ 2. notes, by hand


def test_notes_of_rlr_and_dnc_decisions():
    # RLR: rows (1, 1) and (2, −1); θ = 3 > n = 2, so no coordinate's |vote| (2 and 0) reaches
    # θ and both coordinates are flipped (leftovers test: aggregate (−1.5, −0)).
    rlr = build_defense(PluginSpec("rlr", {"theta": 3}), most_updates=8)
    dec = rlr(torch.tensor([[1.0, 1.0], [2.0, -1.0]]))
    assert degradation_notes(rlr, dec.state, dec.accepted) == [
        "rlr: θ = 3 is above the round's n = 2 updates: the sign of all 2 coordinates flipped"]
    # DnC f = 5, c = 1 on 5 rows: ⌊c·f⌋ = 5 removals would leave none; 4 removed, 1 kept
    dnc = DnC(f=5)
    dec = dnc(torch.tensor([[0.0], [1.0], [2.0], [3.0], [10.0]]))
    assert degradation_notes(dnc, dec.state, dec.accepted) == [
        "dnc: ⌊c·f⌋ removals with f = 5 would leave none of the 5 updates: removed 4, kept the lowest-scored one"]
    # f = 1 removes 1 of 5: ran as configured, no note
    dec = DnC(f=1)(torch.tensor([[0.0], [1.0], [2.0], [3.0], [10.0]]))
    assert degradation_notes(DnC(f=1), dec.state, dec.accepted) == []


def test_notes_name_the_pipeline_stage_and_the_merge_node():
    # norm_bound → trimmed_mean(b = 2) on 3 rows: the filter keeps all three (norms 1, 2, 3
    # ≤ 10), the trimmed mean can trim ⌊(3 − 1)/2⌋ = 1 per side.
    pipe = build_defense([PluginSpec("norm_bound", {"bound": 10.0}), PluginSpec("trimmed_mean", {"b": 2})])
    dec = pipe(torch.tensor([[1.0], [2.0], [3.0]]))
    assert dec.aggregate.tolist() == pytest.approx([2.0])  # the median of 1, 2, 3
    assert degradation_notes(pipe, dec.state, dec.accepted, "group 1") == [
        "trimmed_mean (pipeline stage 1, group 1): b reduced from 2 to 1 (3 updates)"]
    # a rule may word its own degradation
    assert degradation_notes(pipe.stages[0], {"degraded": "ran on half the rows"}, 4) == [
        "norm_bound: ran on half the rows"]


def test_hierarchical_churned_run_notes_name_the_group():
    # 20 clients in 4 bottom groups; b = f = 2 needs ≥ 5 updates in a group: churn thins
    # groups below that and each such group's note names it (n < 5 there).
    sc = parse_scenario({
        "scenario": {"seed": 0}, "workload": {"name": "digits"},
        "federation": {"clients": 20, "rounds": 3, "local_steps": 1, "malicious_fraction": 0.1},
        "transport": {"network": {"churn_leave": 0.5, "churn_join": 0.2}},
        "attack": {"name": "sign_flip"}, "defense": {"name": "trimmed_mean"},
        "hierarchy": {"fan_out": 4, "depth": 2, "upper_defense": {"name": "mean"}}})
    res = Federation(sc).run()
    notes = [n for r in res.records for n in r.defense_notes]
    assert notes, [sum(r.participating) for r in res.records]
    import re

    for note in notes:
        m = re.fullmatch(r"trimmed_mean \(group (\d)\): b reduced from 2 to (\d) \((\d) updates\)", note)
        assert m and int(m[3]) < 5 and int(m[2]) == (int(m[3]) - 1) // 2, note
    assert res.records[0].defense_notes == []  # round 0: all 20 online, 5 per group


# ------------------------------------------------------------ summarize, as a property


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0.01, 20)), min_size=1, max_size=5),
       st.lists(st.tuples(st.floats(0, 1), st.floats(0.01, 20)), min_size=1, max_size=5))
def test_a_classifier_summary_is_the_full_one_less_the_language_model_metrics(attacked, clean):
    # whatever the records: the classifier's summary drops exactly LANGUAGE_MODEL_METRICS and
    # every other value is the same as when the kind is unknown (None keeps everything)
    def recs(pairs):
        return [RoundRecord(i, a, loss, [True, True], [False, True], [True, True]) for i, (a, loss) in enumerate(pairs)]

    full = summarize(recs(attacked), recs(clean))
    lm = summarize(recs(attacked), recs(clean), is_language_model=True)
    cls = summarize(recs(attacked), recs(clean), is_language_model=False)
    assert set(full) - set(cls) == LANGUAGE_MODEL_METRICS and set(cls) <= set(full)
    assert lm.keys() == full.keys()
    for k, v in cls.items():
        assert v == full[k] or (isinstance(v, float) and math.isnan(v) and math.isnan(full[k])), k
