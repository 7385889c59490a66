"""A stored warm-up is verified by content before it is reused (issue 35 §1).

Its SHA-256 (and size) is kept in the results store when it is written, a file whose bytes
are not those is recomputed (never trusted, whatever key its metadata names), and every
run records the digest of the model it started from: the warm-up's and the ``start_from``
file's."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import textwrap

import pytest
import torch

from redteam.federation import warmup as warmup_mod
from redteam.federation.loop import Federation
from redteam.runner.matrix_run import run_matrix
from redteam.runner.single import run_scenario
from redteam.runner.store import ResultsStore
from redteam.scenario import parse_scenario


def _doc(**scenario):
    return {"scenario": {"seed": 3, "warmup_rounds": 2, **scenario},
            "workload": {"name": "synthetic", "samples": 200},
            "federation": {"clients": 4, "rounds": 1, "local_steps": 1, "batch_size": 8, "malicious_fraction": 0.25},
            "attack": "none", "defense": "mean"}


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _new_process(monkeypatch):
    """What another process sees: no warm-up in memory."""
    monkeypatch.setattr(warmup_mod, "_MEMO", type(warmup_mod._MEMO)())


@pytest.fixture(autouse=True)
def _empty_memo(monkeypatch):
    _new_process(monkeypatch)


def _matrix_out(tmp_path):
    out = tmp_path / "out"
    ResultsStore(out).close()
    return out


def test_a_warmup_file_with_its_key_but_other_weights_is_recomputed(tmp_path, monkeypatch):
    """Before: a file carrying the right key in its metadata was loaded whatever its weights."""
    folder = _matrix_out(tmp_path) / "warmups"
    a = Federation(parse_scenario(_doc()), warmup_dir=str(folder))
    (f,) = folder.glob("*.safetensors")
    written = _sha(f)
    warmup_mod.save_model_file(f, torch.zeros_like(a.params0), a.spec, {"redteam_warmup_key": f.stem})
    tampered = _sha(f)
    _new_process(monkeypatch)
    b = Federation(parse_scenario(_doc()), warmup_dir=str(folder))
    assert torch.equal(b.params0, a.params0)
    w = b.setup.start_info["warmup"]
    assert w["reused"] is False and w["replaced"] == {"file_sha256": tampered, "store_sha256": written}
    assert w["sha256"] == written == _sha(f)  # recomputed and written again: the same bytes


def test_the_digest_is_kept_in_the_results_store_and_checked(tmp_path, monkeypatch):
    out = _matrix_out(tmp_path)
    a = Federation(parse_scenario(_doc()), warmup_dir=str(out / "warmups"))
    (f,) = (out / "warmups").glob("*.safetensors")
    with sqlite3.connect(out / "results.sqlite") as con:
        row = con.execute("SELECT sha256, bytes FROM warmups WHERE key = ?", (f.stem,)).fetchone()
    con.close()
    assert row == (_sha(f), f.stat().st_size) and a.setup.start_info["warmup"]["sha256"] == row[0]
    assert not (out / "warmups" / "results.sqlite").exists()  # the matrix's own store keeps it
    _new_process(monkeypatch)
    b = Federation(parse_scenario(_doc()), warmup_dir=str(out / "warmups"))
    assert b.setup.start_info["warmup"]["reused"] is True and b.setup.start_info["warmup"]["sha256"] == row[0]
    assert torch.equal(b.params0, a.params0)


def test_a_warmup_file_no_store_recorded_is_recomputed(tmp_path, monkeypatch):
    """Someone else's warm-up folder, copied in: the right name and key, its own weights."""
    mine = tmp_path / "mine"
    a = Federation(parse_scenario(_doc()), warmup_dir=str(mine))
    (f,) = mine.glob("*.safetensors")
    assert (mine / "results.sqlite").is_file()  # a folder of one's own keeps its digests in a store in it
    shared = tmp_path / "shared"
    shared.mkdir()
    warmup_mod.save_model_file(shared / f.name, torch.ones_like(a.params0), a.spec, {"redteam_warmup_key": f.stem})
    _new_process(monkeypatch)
    b = Federation(parse_scenario(_doc()), warmup_dir=str(shared))
    assert torch.equal(b.params0, a.params0) and b.setup.start_info["warmup"]["reused"] is False
    # a planted link in place of the file is not read either
    (shared / f.name).unlink()
    (shared / f.name).symlink_to(f)
    _new_process(monkeypatch)
    c = Federation(parse_scenario(_doc()), warmup_dir=str(shared))
    assert torch.equal(c.params0, a.params0) and not (shared / f.name).is_symlink()


MATRIX = textwrap.dedent(
    """\
    [scenario]
    name = "start"
    seed = 2
    warmup_rounds = 2
    start_from = "m.safetensors"
    [workload]
    name = "synthetic"
    samples = 200
    [federation]
    clients = 4
    rounds = 1
    local_steps = 1
    batch_size = 8
    malicious_fraction = 0.25
    [matrix]
    attacks = ["sign_flip"]
    defenses = ["mean"]
    seeds = 1
    """
)


def test_every_stored_run_records_what_it_started_from(tmp_path):
    fed = Federation(parse_scenario(_doc(warmup_rounds=0)))
    warmup_mod.save_model_file(tmp_path / "m.safetensors", fed.params_init + 0.01, fed.spec)
    (tmp_path / "m.toml").write_text(MATRIX)
    run_matrix(tmp_path / "m.toml", tmp_path / "out")
    (w,) = (tmp_path / "out" / "warmups").glob("*.safetensors")
    with ResultsStore(tmp_path / "out") as st:
        rows = st._db.execute("SELECT baseline, versions FROM runs").fetchall()
    assert sorted(b for b, _ in rows) == [0, 1]
    for _, versions in rows:
        v = json.loads(versions)
        assert v["start_from_sha256"] == _sha(tmp_path / "m.safetensors") and v["warmup_sha256"] == _sha(w)


def test_a_single_run_records_what_it_started_from(tmp_path):
    fed = Federation(parse_scenario(_doc(warmup_rounds=0)))
    warmup_mod.save_model_file(tmp_path / "m.safetensors", fed.params_init + 0.01, fed.spec)
    doc = _doc(start_from="m.safetensors")
    doc["attack"] = "sign_flip"
    out = run_scenario(parse_scenario(doc, base_dir=tmp_path))
    starts = [r["start"] for r in out["runs"]]
    assert len(starts) == 2 and starts[0] == starts[1]
    assert starts[0]["start_from_sha256"] == _sha(tmp_path / "m.safetensors")
    assert len(starts[0]["warmup_sha256"]) == 64
