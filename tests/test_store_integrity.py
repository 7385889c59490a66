"""The results store is never silently wrong: a damaged store is reported by --resume,
an existing file that is not a store is refused, and a store appears atomically."""

from __future__ import annotations

import shlex
import sqlite3
import textwrap

import pytest

from redteam.cli import main
from redteam.runner.matrix_run import run_matrix
from redteam.runner.store import ResultsStore, StoreError

MATRIX = textwrap.dedent(
    """\
    [scenario]
    name = "integrity"
    seed = 2
    [workload]
    name = "synthetic"
    samples = 300
    [federation]
    clients = 4
    rounds = 6
    malicious_fraction = 0.25
    [matrix]
    attacks = ["sign_flip", "ipm"]
    defenses = ["mean"]
    seeds = 1
    """
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    d = tmp_path_factory.mktemp("store")
    f = d / "m.toml"
    f.write_text(MATRIX)
    run_matrix(f, d / "out")
    return f, d / "out"


def _copy(src, dst):
    dst.mkdir()
    with sqlite3.connect(src / "results.sqlite") as a, sqlite3.connect(dst / "results.sqlite") as b:
        a.backup(b)
    b.close()
    return dst


def _corrupt_a_runs_page(db):
    """Overwrite one page that holds a run's metrics (table data, not the key index)."""
    data = bytearray(db.read_bytes())
    page = data[16] << 8 | data[17]
    page = 65536 if page == 1 else page
    hits = [i for i in range(page, len(data), page) if b"final_accuracy" in data[i:i + page]]
    assert hits, "no page with run metrics found"
    i = hits[0]
    data[i:i + page] = bytes([0x0D]) + (bytes(range(256)) * (page // 256))[: page - 1]  # leaf type, garbage
    db.write_bytes(bytes(data))


def test_resume_reports_a_damaged_store_instead_of_skipping_its_runs(finished, tmp_path, capsys):
    f, out = finished
    bad = _copy(out, tmp_path / "bad")
    with ResultsStore(bad) as st:
        assert len(st.finished_keys()) == 3  # the key index is intact: today's resume believed it
    _corrupt_a_runs_page(bad / "results.sqlite")
    code = main(["matrix", str(f), "--out", str(bad), "--resume", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "damaged" in err and err.count("\n") == 1


def test_resume_of_an_intact_store_checks_and_computes_nothing(finished, tmp_path):
    f, out = finished
    good = _copy(out, tmp_path / "good")
    s = run_matrix(f, good, resume=True)
    assert s.computed == 0 and s.skipped == 3


def test_a_row_that_does_not_parse_is_damage(finished, tmp_path):
    _, out = finished
    bad = _copy(out, tmp_path / "bad")
    with sqlite3.connect(bad / "results.sqlite") as con:
        con.execute("UPDATE runs SET rounds = '[{\"round\": 0,' WHERE rowid = 1")
    con.close()
    with ResultsStore(bad) as st, pytest.raises(StoreError, match="does not parse"):
        st.check_integrity()


@pytest.mark.parametrize("content", [b"", None])
def test_an_existing_empty_or_tableless_file_is_refused_not_initialised(tmp_path, content):
    db = tmp_path / "out" / "results.sqlite"
    db.parent.mkdir()
    if content is None:  # some other SQLite database
        with sqlite3.connect(db) as con:
            con.execute("CREATE TABLE notes (x TEXT)")
        con.close()
    else:
        db.write_bytes(content)
    before = db.read_bytes()
    with pytest.raises(StoreError, match="empty file|missing tables"):
        ResultsStore(tmp_path / "out")
    with pytest.raises(StoreError, match="empty file|missing tables"):
        ResultsStore(db)
    assert db.read_bytes() == before  # nothing was added to it


def test_a_new_store_is_complete_when_it_appears(tmp_path):
    with ResultsStore(tmp_path / "new") as st:
        assert st.meta("schema_version") == "1"
    assert sorted(p.name for p in (tmp_path / "new").iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        "results.sqlite"]
    ResultsStore(tmp_path / "new").close()  # reopening an existing store is fine


def test_stored_reproduce_command_is_shell_quoted(tmp_path):
    f = tmp_path / "my scenario; rm -rf x.toml"
    f.write_text(MATRIX.replace("rounds = 6", "rounds = 1").replace('["sign_flip", "ipm"]', '["sign_flip"]'))
    out = tmp_path / "out $(id)"
    run_matrix(f, out)
    with ResultsStore(out) as st:
        cmd = st.meta("reproduce")
    assert shlex.split(cmd) == ["redteam", "matrix", str(f), "--out", str(out)]
