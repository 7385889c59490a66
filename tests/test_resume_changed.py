"""One store, one definition (issue 18 §4, part 3): `--resume` after the scenario file
changed refuses, one line per difference, unless `--recompute-changed`, which computes
the changed and added cells only; an unchanged file resumes as before."""

from __future__ import annotations

import json
import sqlite3
import textwrap

import pytest

from redteam.cli import main
from redteam.runner.matrix_run import DefinitionChanged, run_matrix
from redteam.runner.store import ResultsStore, StoreError

BASE = textwrap.dedent(
    """\
    [scenario]
    name = "resume"
    seed = 2
    [workload]
    name = "synthetic"
    samples = 200
    [federation]
    clients = 4
    rounds = 2
    malicious_fraction = 0.25
    [matrix]
    attacks = ["sign_flip", { name = "gaussian", std = 3.0, label = "noise" }]
    defenses = ["mean"]
    seeds = 1
    """
)


def _snapshot(out):
    with ResultsStore(out, create=False) as st:
        return st.canonical_dump(), st.plan(), st.meta("scenario_doc")


@pytest.fixture
def filled(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(BASE)
    s = run_matrix(f, tmp_path / "out")
    assert s.computed == 3  # one baseline (shared) + sign_flip + noise
    return f, tmp_path / "out"


def _matrix(capsys, *argv):
    code = main(["matrix", *map(str, argv), "--quiet"])
    out, err = capsys.readouterr()
    return code, out, err


def test_unchanged_file_resumes_as_before(filled, capsys):
    f, out = filled
    code, stdout, err = _matrix(capsys, f, "--out", out, "--resume")
    assert code == 0, err
    assert "3 runs (0 computed, 3 already in the store)" in stdout


def test_resume_after_an_edit_refuses_naming_each_change(filled, capsys):
    f, out = filled
    before = _snapshot(out)
    f.write_text(BASE.replace("std = 3.0", "std = 2.0"))  # one cell's definition
    code, stdout, err = _matrix(capsys, f, "--out", out, "--resume")
    assert code == 2  # a refusal, as "already holds results" is
    lines = err.splitlines()
    assert lines[0].startswith("redteam: error: ") and "another definition" in lines[0]
    assert "--recompute-changed" in lines[0]
    assert "  - cell changed: mean[noise] (its scenario differs, so its runs are new ones)" in lines
    assert "  - matrix.attacks[1].std: 3.0 → 2.0" in lines
    assert not any("sign_flip" in ln for ln in lines[1:])  # the unchanged cell is not named
    assert len(lines) == 3  # the headline, then one line per difference
    assert _snapshot(out) == before  # nothing written: not the meta, not the plan


def test_added_and_removed_cells_and_changed_keys_are_named(filled, capsys):
    f, out = filled
    f.write_text(BASE.replace('"sign_flip", ', '"ipm", ').replace("rounds = 2", "rounds = 2\nlr = 0.05"))
    code, _, err = _matrix(capsys, f, "--out", out, "--resume")
    assert code == 2
    lines = err.splitlines()[1:]
    assert "  - federation.lr: added (= 0.05)" in lines
    assert "  - cell added: mean[ipm]" in lines
    assert "  - cell removed: mean[sign_flip]" in lines
    assert "  - cell changed: mean[noise] (its scenario differs, so its runs are new ones)" in lines


def test_recompute_changed_computes_only_the_changed_cell(filled, capsys):
    f, out = filled
    with ResultsStore(out, create=False) as st:
        old_keys = st.finished_keys()
        sign_flip = next(r for r in st.plan() if r.cell_id == "mean[sign_flip]")
    f.write_text(BASE.replace("std = 3.0", "std = 2.0"))
    code, stdout, err = _matrix(capsys, f, "--out", out, "--recompute-changed")
    assert code == 0, err
    assert "3 runs (1 computed, 2 already in the store)" in stdout  # noise only; baseline and sign_flip kept
    with ResultsStore(out, create=False) as st:
        keys = st.finished_keys()
        plan = st.plan()
        assert json.loads(st.meta("scenario_doc"))["matrix"]["attacks"][1]["std"] == 2.0
    assert old_keys < keys and len(keys) == 4  # the old noise run stays in the store ...
    assert next(r for r in plan if r.cell_id == "mean[sign_flip]") == sign_flip
    noise = next(r for r in plan if r.cell_id == "mean[noise]")
    assert noise.run_key in keys - old_keys
    # ... but out of every report: the report reads the planned (new) run
    assert main(["report", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["cell_id"] for c in doc["cells"]] == ["mean[sign_flip]", "mean[noise]"]
    with ResultsStore(out, create=False) as st:
        new = st.run(noise.run_key)["metrics"]["final_accuracy"]
    assert doc["cells"][1]["metrics"]["final_accuracy"]["mean"] == pytest.approx(new)
    # the store now holds the new definition: a plain --resume goes on
    code, stdout, err = _matrix(capsys, f, "--out", out, "--resume")
    assert code == 0 and "3 runs (0 computed" in stdout, err


def test_python_api_raises_with_every_change_on_one_line(filled):
    f, out = filled
    f.write_text(BASE.replace("seeds = 1", "seeds = 2"))
    with pytest.raises(DefinitionChanged) as ei:
        run_matrix(f, out, resume=True)
    assert isinstance(ei.value, StoreError)
    text = str(ei.value)
    assert "\n" not in text and "matrix.seeds: 1 → 2" in text
    assert "cell mean[sign_flip]: replicates [0] → [0, 1]" in text
    s = run_matrix(f, out, recompute_changed=True)  # implies --resume
    assert s.computed == 3  # replicate 1: its baseline, sign_flip and noise


def test_same_file_but_other_runs_planned_refuses(filled, capsys):
    # the file did not change, but a cell's concrete scenario did (e.g. a plugin's default
    # in a newer redteam): the stored plan's keys differ from the ones planned now
    f, out = filled
    con = sqlite3.connect(out / "results.sqlite")
    con.execute("UPDATE plan SET run_key = 'elsewhere' WHERE cell_id = 'mean[noise]'")
    con.commit()
    con.close()
    code, _, err = _matrix(capsys, f, "--out", out, "--resume")
    assert code == 2
    assert err.splitlines()[1:] == ["  - cell changed: mean[noise] (its scenario differs, so its runs are new ones)"]


def test_a_store_without_finished_runs_takes_any_definition(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text(BASE)
    ResultsStore(tmp_path / "out").close()  # an empty store: nothing to mix with
    code, stdout, err = _matrix(capsys, f, "--out", tmp_path / "out", "--resume")
    assert code == 0, err
    assert "3 computed" in stdout
