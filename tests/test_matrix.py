"""Scenario matrices: expansion, per-cell seeds, expectations, include, the resumable store."""

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from redteam.errors import InvalidScenario
from redteam.matrix import derive_seed, expand
from redteam.runner.matrix_run import plan_units, run_matrix
from redteam.runner.store import ResultsStore, StoreError
from redteam.matrix import load_matrix
from redteam.scenario import load_document

BASE = {
    "scenario": {"name": "t", "seed": 7},
    "workload": {"name": "synthetic", "samples": 600},
    "federation": {"clients": 6, "rounds": 2, "malicious_fraction": 1 / 3},
}


def _doc(**extra):
    d = {k: dict(v) for k, v in BASE.items()}
    d.update(extra)
    return d


def test_expansion_ids_and_counts():
    m = expand(_doc(matrix={
        "attacks": ["sign_flip", {"name": "gaussian", "std": 2.0}],
        "defenses": ["mean", {"label": "nb+med", "pipeline": [{"name": "norm_bound"}, {"name": "median"}]}],
        "seeds": 3,
        "settings": {"federation.malicious_fraction": [0.2, 0.4]},
    }), "x.toml")
    assert len(m) == 2 * 2 * 2 and m.seeds == (0, 1, 2)
    ids = [c.id for c in m.cells]
    assert "mean[sign_flip,malicious_fraction=0.2]" in ids
    assert "nb+med[gaussian(std=2.0),malicious_fraction=0.4]" in ids
    assert len(set(ids)) == len(ids)


def test_cell_seed_ignores_attack_and_defense_and_other_cells():
    # the seed depends on (scenario seed, settings, replicate) only
    s = derive_seed(7, (("federation.malicious_fraction", 0.2),), 0)
    assert s == derive_seed(7, (("federation.malicious_fraction", 0.2),), 0)
    assert s != derive_seed(7, (("federation.malicious_fraction", 0.4),), 0)
    assert s != derive_seed(8, (("federation.malicious_fraction", 0.2),), 0)
    small = expand(_doc(matrix={"attacks": ["sign_flip"], "defenses": ["mean"]}), "x")
    big = expand(_doc(matrix={"attacks": ["sign_flip", "ipm"], "defenses": ["mean", "median"]}), "x")
    rows_small, _, _ = plan_units(small, 7, "x")
    rows_big, _, _ = plan_units(big, 7, "x")
    by_id = {r.cell_id: r for r in rows_big}
    for r in rows_small:  # adding cells changed nothing about the existing one
        assert by_id[r.cell_id].seed == r.seed and by_id[r.cell_id].run_key == r.run_key


def test_baselines_shared_across_attacks():
    m = expand(_doc(matrix={"attacks": ["none", "sign_flip", "ipm"], "defenses": ["mean", "median"], "seeds": 2}), "x")
    rows, baselines, attacked = plan_units(m, 7, "x")
    assert len(baselines) == 2 * 2  # defenses × seeds
    assert len(attacked) == 2 * 2 * 2  # (sign_flip, ipm) × defenses × seeds; 'none' is its baseline
    none_rows = [r for r in rows if r.attack == "none"]
    assert all(r.run_key == r.baseline_key for r in none_rows)


@pytest.mark.parametrize(
    "matrix,msg",
    [
        ({"attacks": []}, "[matrix].attacks = []: must be a non-empty list"),
        ({"attacks": ["sing_flip"]}, "did you mean 'sign_flip'"),
        ({"attacks": ["ipm", "ipm"]}, "duplicate labels"),
        ({"seeds": 0}, "[matrix].seeds = 0"),
        ({"settings": {"clients": [1, 2]}}, "must be a key path"),
        ({"settings": {"federation.clients": [4, -1]}}, "[federation].clients = -1"),
        ({"bogus": 1}, "unknown key 'bogus'"),
    ],
)
def test_matrix_errors(matrix, msg):
    with pytest.raises(InvalidScenario) as ei:
        expand(_doc(matrix=matrix), "x.toml")
    assert msg in str(ei.value)


@pytest.mark.parametrize(
    "expect,msg",
    [
        ({"metric": "accuracy_dorp", "max": 1}, "did you mean 'accuracy_drop'"),
        ({"metric": "asr"}, "needs 'min' and/or 'max'"),
        ({"metric": "asr", "max": 1, "attack": "alie"}, "names no matrix attack"),
        ({"metric": "asr", "max": 1, "colour": "red"}, "unknown key 'colour'"),
        ({"metric": "asr", "max": "high"}, "max = 'high': must be a number"),
    ],
)
def test_expectation_errors(expect, msg):
    with pytest.raises(InvalidScenario) as ei:
        expand(_doc(matrix={"attacks": ["ipm"]}, expect=[expect]), "x.toml")
    assert msg in str(ei.value)


def test_include_merges_and_detects_cycles(tmp_path):
    (tmp_path / "base.toml").write_text('[workload]\nname = "synthetic"\n[federation]\nclients = 6\nrounds = 9\n')
    (tmp_path / "child.toml").write_text('include = "base.toml"\n[federation]\nrounds = 2\n')
    base, m, doc = load_matrix(tmp_path / "child.toml")
    assert base.federation.clients == 6 and base.federation.rounds == 2 and base.workload.name == "synthetic"
    (tmp_path / "a.toml").write_text('include = "b.toml"\n')
    (tmp_path / "b.toml").write_text('include = "a.toml"\n')
    with pytest.raises(InvalidScenario, match="include cycle"):
        load_matrix(tmp_path / "a.toml")
    (tmp_path / "c.toml").write_text('include = "missing.toml"\n')
    with pytest.raises(InvalidScenario, match="included from c.toml"):
        load_matrix(tmp_path / "c.toml")


MATRIX_TOML = textwrap.dedent(
    """\
    [scenario]
    name = "kill"
    seed = 1
    [workload]
    name = "synthetic"
    samples = 600
    [federation]
    clients = 6
    rounds = 3
    malicious_fraction = 0.34
    [matrix]
    attacks = ["sign_flip", "ipm", { name = "gaussian", std = 3.0 }]
    defenses = ["mean", "median"]
    seeds = 2
    """
)


def test_store_refuses_without_resume_and_reads_plan(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX_TOML.replace('["sign_flip", "ipm", { name = "gaussian", std = 3.0 }]', '["ipm"]'))
    s = run_matrix(f, tmp_path / "out")
    assert s.total == s.computed == 2 * 2 * 2  # (baseline + ipm) × 2 defenses × 2 seeds
    with pytest.raises(StoreError, match="--resume"):
        run_matrix(f, tmp_path / "out")
    again = run_matrix(f, tmp_path / "out", resume=True)
    assert again.computed == 0
    with ResultsStore(tmp_path / "out", create=False) as st:
        res = st.results()
        assert [r["cell_id"] for r in res] == ["mean[ipm]", "mean[ipm]", "median[ipm]", "median[ipm]"]
        assert all(r["finished"] and "accuracy_drop" in r["metrics"] for r in res)
    with pytest.raises(StoreError, match="no results store"):
        ResultsStore(tmp_path / "nothing", create=False)
    (tmp_path / "junk.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a redteam results store"):
        ResultsStore(tmp_path / "junk.sqlite")


def test_kill_at_a_random_point_then_resume_equals_uninterrupted(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX_TOML)
    ref = tmp_path / "ref"
    run_matrix(f, ref)
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "redteam.cli", "matrix", str(f), "--out", str(killed), "--quiet"]
    rng = random.Random(os.getpid())
    total = 2 * 2 + 3 * 2 * 2
    # a random point of progress (not of time: the runs are fast, and a random delay after
    # the first few could outlast the whole matrix), then kill -9 within a run's length
    target = rng.randint(2, total - 4)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (killed / "results.sqlite").exists():
            try:
                with ResultsStore(killed) as st:
                    if len(st.finished_keys()) >= target:
                        break
            except StoreError:
                pass
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.05))
    assert proc.poll() is None, "the matrix finished before it could be killed: nothing was tested"
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # the driver died by the kill, not by finishing
    with ResultsStore(killed) as st:
        partial = len(st.finished_keys())
    assert 2 <= partial < total  # interrupted part-way
    subprocess.run(cmd + ["--resume"], check=True, stdout=subprocess.DEVNULL, timeout=600)
    with ResultsStore(ref) as a, ResultsStore(killed) as b:
        assert a.canonical_dump() == b.canonical_dump()
        assert len(b.finished_keys()) == 2 * 2 + 3 * 2 * 2


def test_two_concurrent_runs_do_not_corrupt_one_store(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX_TOML.replace('seeds = 2', 'seeds = 1'))
    out = tmp_path / "shared"
    ResultsStore(out).close()
    cmd = [sys.executable, "-m", "redteam.cli", "matrix", str(f), "--out", str(out), "--quiet", "--resume"]
    a = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    b = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert a.wait(timeout=600) == 0, a.stderr.read()
    assert b.wait(timeout=600) == 0, b.stderr.read()
    ref = tmp_path / "ref"
    run_matrix(f, ref)
    with ResultsStore(ref) as x, ResultsStore(out) as y:
        assert x.canonical_dump() == y.canonical_dump()


@pytest.mark.parametrize("executor", ["process", "ray"])
def test_parallel_executors_match_local(tmp_path, executor):
    if executor == "ray":
        pytest.importorskip("ray")
    f = tmp_path / "m.toml"
    f.write_text(MATRIX_TOML.replace("seeds = 2", "seeds = 1").replace(', { name = "gaussian", std = 3.0 }', ""))
    run_matrix(f, tmp_path / "local")
    s = run_matrix(f, tmp_path / executor, executor=executor, workers=2)
    assert s.computed == 2 + 2 * 2
    with ResultsStore(tmp_path / "local") as a, ResultsStore(tmp_path / executor) as b:
        ra, rb = a.results(with_rounds=True), b.results(with_rounds=True)
        assert [r["cell_id"] for r in ra] == [r["cell_id"] for r in rb]
        for x, y in zip(ra, rb):
            assert [r["accuracy"] for r in x["rounds"]] == pytest.approx([r["accuracy"] for r in y["rounds"]], abs=1e-9)
            assert [r["accepted"] for r in x["rounds"]] == [r["accepted"] for r in y["rounds"]]


def test_settings_under_attack_and_defense_really_sweep():
    m = expand(_doc(defense={"name": "norm_bound", "bound": 1.0},
                    matrix={"attacks": ["sign_flip"], "settings": {"defense.bound": [1.0, 5.0]}}), "x")
    assert [c.doc["defense"]["bound"] for c in m.cells] == [1.0, 5.0]


def test_malicious_fraction_that_rounds_to_no_client_is_an_error():
    with pytest.raises(InvalidScenario, match="gives no malicious client among 4"):
        expand(_doc(federation={"clients": 4, "malicious_fraction": 0.1}), "x.toml")


def test_a_classifier_matrix_stores_no_language_model_metrics(tmp_path):
    # bits per byte and perplexity are functions of a language model's loss: a synthetic
    # (classifier) run's store must not hold them (a report hid them, the store kept them)
    from redteam.scoring import LANGUAGE_MODEL_METRICS

    f = tmp_path / "m.toml"
    f.write_text(MATRIX_TOML.replace('["sign_flip", "ipm", { name = "gaussian", std = 3.0 }]', '["ipm"]')
                 .replace("seeds = 2", "seeds = 1").replace('["mean", "median"]', '["mean"]'))
    run_matrix(f, tmp_path / "out")
    with ResultsStore(tmp_path / "out") as st:
        rows = st.results()
    assert rows and all("final_loss" in r["metrics"] for r in rows)
    assert all(not (set(r["metrics"]) & set(LANGUAGE_MODEL_METRICS)) for r in rows)


@pytest.mark.parametrize("where", ["setting", "expect_key", "expect_attack", "expect_metric"])
def test_a_long_name_is_cut_in_the_error_not_echoed_whole(tmp_path, where):
    """A 5,000-character key or name in a matrix file gives a one-line error that quotes its start
    (it echoed all 5,000 characters)."""
    from redteam.errors import InvalidScenario

    k = "x" * 5000
    head = ('[scenario]\nname = "a"\nseed = 1\n[workload]\nname = "synthetic"\n[federation]\nclients = 4\n'
            'rounds = 1\n[matrix]\nseeds = 1\nattacks = ["sign_flip"]\ndefenses = ["mean"]\n')
    tail = {"setting": f'[matrix.settings]\n"{k}" = [1, 2]\n',
            "expect_key": f'[[expect]]\nattack = "sign_flip"\n"{k}" = 1\nmetric = "asr"\nmax = 1\n',
            "expect_attack": f'[[expect]]\nattack = "{k}"\nmetric = "asr"\nmax = 1\n',
            "expect_metric": f'[[expect]]\nattack = "sign_flip"\nmetric = "{k}"\nmax = 1\n'}[where]
    f = tmp_path / "m.toml"
    f.write_text(head + tail)
    with pytest.raises(InvalidScenario) as info:
        expand(load_document(f), str(f))
    msg = str(info.value)
    # one line that quotes the name's start (an unknown metric's line also lists the known ones)
    assert "\n" not in msg and "x" * 40 in msg and "x" * 100 not in msg and "…" in msg, msg[:200]
