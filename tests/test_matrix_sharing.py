"""Several ``redteam matrix`` drivers on one ``--out`` share the work (issue 22 §7).

Each driver claims a run in the store before computing it and skips the runs another
live driver claimed; a driver that died (``kill -9``) leaves claims that the others take
over. ``redteam report`` reads a store that is being written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from redteam.runner.claims import Claims, live_owners, node_id, process_start
from redteam.runner.matrix_run import plan_units, run_matrix
from redteam.runner.store import ResultsStore
from redteam.matrix import load_matrix

SCENARIO = textwrap.dedent(
    """\
    [scenario]
    name = "share"
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
TOTAL = 2 * 2 + 3 * 2 * 2  # baselines (defenses × seeds) + attacked runs


def _cmd(f, out, *extra):
    return [sys.executable, "-m", "redteam.cli", "matrix", str(f), "--out", str(out), "--quiet", *extra]


def _computed(text: str) -> int:
    m = re.search(r"(\d+) runs \((\d+) computed", text)
    assert m, text
    assert int(m.group(1)) == TOTAL
    return int(m.group(2))


def test_two_drivers_on_one_out_compute_each_run_once(tmp_path):
    """Before: both computed all 16 runs (32 computations for 16 results)."""
    f = tmp_path / "m.toml"
    f.write_text(SCENARIO)
    out = tmp_path / "shared"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    a = subprocess.Popen(_cmd(f, out, "--resume"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    b = subprocess.Popen(_cmd(f, out, "--resume"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    ref = tmp_path / "ref"  # alone on its store, computed here while the pair runs (this process is idle)
    run_matrix(f, ref)
    out_a, err_a = a.communicate(timeout=600)
    out_b, err_b = b.communicate(timeout=600)
    assert a.returncode == 0, err_a
    assert b.returncode == 0, err_b
    assert _computed(out_a) + _computed(out_b) == TOTAL
    with ResultsStore(ref) as x, ResultsStore(out) as y:
        assert x.canonical_dump() == y.canonical_dump()
        # every claim and owner row is released by a driver that ends
        assert y._db.execute("SELECT COUNT(*) FROM claims").fetchone() == (0,)
        assert y._db.execute("SELECT COUNT(*) FROM owners").fetchone() == (0,)


def _first_runs(f, out, n):
    """The store at ``out`` with the plan of ``f`` and the keys of its first ``n`` baselines."""
    base, matrix, _ = load_matrix(f)
    rows, b_units, _ = plan_units(matrix, base.seed, f.name)
    return [u.run_key for u in b_units[:n]]


def _fake_owner(store, token, pid, *, node=None, started=None, heartbeat=None, keys=()):
    with store._tx():
        store._db.execute("INSERT INTO owners VALUES (?, ?, ?, ?, ?, ?)",
                          (token, pid, "elsewhere", node_id() if node is None else node,
                           process_start(pid) if started is None else started,
                           time.time() if heartbeat is None else heartbeat))
        store._db.executemany("INSERT INTO claims VALUES (?, ?)", [(k, token) for k in keys])


def test_claims_of_a_killed_driver_are_taken_over(tmp_path):
    """A driver killed with kill -9 leaves its claims behind: the next one computes those runs."""
    f = tmp_path / "m.toml"
    f.write_text(SCENARIO)
    keys = _first_runs(f, tmp_path / "o", 2)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is gone (and reaped)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while time.time() < deadline and not open(f"/proc/{zombie.pid}/stat").read().split(")")[-1].split()[0] == "Z":
        time.sleep(0.05)  # exited, not reaped: kill -9'd and its parent has not waited yet
    with ResultsStore(tmp_path / "o") as st:
        _fake_owner(st, "dead", dead.pid, keys=keys[:1])
        _fake_owner(st, "zombie", zombie.pid, keys=keys[1:])
        assert live_owners(st) == []
    s = run_matrix(f, tmp_path / "o", resume=True)
    zombie.wait()
    assert s.computed == TOTAL
    with ResultsStore(tmp_path / "o") as st:
        assert keys[0] in st.finished_keys() and keys[1] in st.finished_keys()
        assert st._db.execute("SELECT COUNT(*) FROM owners").fetchone() == (0,)


def test_a_reused_pid_or_an_old_heartbeat_does_not_hold_a_claim(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(SCENARIO)
    keys = _first_runs(f, tmp_path / "o", 2)
    with ResultsStore(tmp_path / "o") as st:
        # this very process, but "started" at another time: its pid was reused
        _fake_owner(st, "reused", os.getpid(), started="1", keys=keys[:1])
        # another machine (its pid means nothing here) that stopped beating long ago
        _fake_owner(st, "gone", 1, node="other-machine", heartbeat=time.time() - 3600, keys=keys[1:])
        assert live_owners(st) == []
    assert run_matrix(f, tmp_path / "o", resume=True).computed == TOTAL


def test_a_live_driver_is_waited_for_then_taken_over_when_it_dies(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(SCENARIO)
    keys = _first_runs(f, tmp_path / "o", 1)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with ResultsStore(tmp_path / "o") as st:
            _fake_owner(st, "live", holder.pid, keys=keys)
            assert [o.pid for o in live_owners(st)] == [holder.pid]
        seen: list[str] = []
        result: list[object] = []

        def go() -> None:
            result.append(run_matrix(f, tmp_path / "o", resume=True,
                                     on_progress=lambda d, t, label: seen.append(label)))

        t = threading.Thread(target=go)
        t.start()
        deadline = time.time() + 300
        while time.time() < deadline and not any(s.startswith("waiting for 1 run(s)") for s in seen):
            time.sleep(0.05)
        assert any(f"another redteam matrix (pid {holder.pid})" in s for s in seen), seen
        time.sleep(1.0)
        assert t.is_alive()  # the live driver's run is not computed twice
        with ResultsStore(tmp_path / "o") as st:
            assert keys[0] not in st.finished_keys()
    finally:
        holder.kill()
        holder.wait()
    t.join(timeout=300)
    assert not t.is_alive() and result[0].computed == TOTAL


def test_without_resume_a_store_being_filled_names_the_other_driver(tmp_path, capsys):
    from redteam.cli import main

    f = tmp_path / "m.toml"
    f.write_text(SCENARIO)
    out = tmp_path / "o"
    run_matrix(f, out)
    with ResultsStore(out) as st:
        _fake_owner(st, "live", os.getppid())
    assert main(["matrix", str(f), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert f"is being filled by another redteam matrix (pid {os.getppid()})" in err[0] and "--resume" in err[0]


def test_report_reads_a_store_while_a_driver_writes_it(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(SCENARIO.replace("rounds = 3", "rounds = 6"))
    out = tmp_path / "o"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    w = subprocess.Popen(_cmd(f, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    reads = 0
    try:
        deadline = time.time() + 300
        # two reads while it writes show it; each read is a fresh process (imports and all), so
        # reading on would only take the driver's CPU
        while w.poll() is None and time.time() < deadline and reads < 2:
            if (out / "results.sqlite").exists():
                r = subprocess.run([sys.executable, "-m", "redteam.cli", "report", str(out), "--format", "json"],
                                   capture_output=True, text=True, env=env, timeout=300)
                assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
                reads += 1 if w.poll() is None else 0
            time.sleep(0.1)
        w.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        if w.poll() is None:
            w.kill()
        w.wait()
    assert w.returncode == 0, w.stderr.read()
    if reads == 0:
        pytest.skip("the matrix finished before a report could read it while it was written")


@pytest.mark.parametrize("pid,node,beat", [
    (1, "other-machine", 1e6),  # a heartbeat a week and a half in the future: never stale before
    (1, "other-machine", float("inf")),
    (1, "other-machine", "soon"),  # text where a time belongs: a traceback before
    ("one", "other-machine", 0.0),  # text where a pid belongs
    (2**62, None, 0.0),  # this machine, a pid no process can have (os.kill overflows)
    (None, "other-machine", 0.0),
    ("7", "other-machine", "now"),  # numbers as text, in a table without column types
    (1, "other-machine", None),
])
def test_a_hostile_owner_row_holds_no_claim(tmp_path, pid, node, beat):
    """An ``owners`` row no driver writes (a future or non-numeric heartbeat, a non-numeric
    or impossible pid) counts as a dead driver: its claims are taken, nothing waits on it.
    The store is someone else's: its ``owners`` table has no column types or constraints."""
    with ResultsStore(tmp_path / "o") as st:
        with st._tx():
            st._db.execute("DROP TABLE owners")
            st._db.execute("CREATE TABLE owners (owner PRIMARY KEY, pid, host, node, started, heartbeat)")
            st._db.execute("INSERT INTO owners VALUES ('hostile', ?, 'elsewhere', ?, '', ?)",
                           (pid, node_id() if node is None else node,
                            time.time() + beat if isinstance(beat, float) else
                            str(time.time()) if beat == "now" else beat))
            st._db.execute("INSERT INTO claims VALUES ('k', 'hostile')")
        assert live_owners(st) == []
        with Claims(st) as c:
            assert c.holder("k") is None
            assert c.claim("k") == "mine"
        assert st._db.execute("SELECT COUNT(*) FROM owners").fetchone() == (0,)


def test_a_heartbeat_seconds_ahead_is_clock_skew_not_a_dead_driver(tmp_path):
    with ResultsStore(tmp_path / "o") as st:
        _fake_owner(st, "ahead", 1, node="other-machine", heartbeat=time.time() + 5, keys=["k"])
        assert [o.token for o in live_owners(st)] == ["ahead"]
        with Claims(st) as c:
            assert c.claim("k") == "taken"
