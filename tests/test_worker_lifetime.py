"""``kill -9`` of a ``--executor process`` driver does not leave its workers running:
each worker watches its parent and exits when the driver is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")

MATRIX = textwrap.dedent(
    """\
    [scenario]
    name = "orphans"
    seed = 5
    [workload]
    name = "synthetic"
    samples = 600
    [federation]
    clients = 8
    rounds = 400
    malicious_fraction = 0.25
    [matrix]
    attacks = ["sign_flip", "ipm"]
    defenses = ["mean", "median"]
    seeds = 2
    """
)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _workers(parent: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"spawn_main" in cmd:
            out.append(int(d.name))
    return out


def test_workers_exit_when_the_driver_is_killed(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX)
    cmd = [sys.executable, "-m", "redteam.cli", "matrix", str(f), "--out", str(tmp_path / "out"), "--quiet",
           "--executor", "process", "--workers", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env=env)
    workers: list[int] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and driver.poll() is None:
            workers = [w for w in _workers(driver.pid) if _alive(w)]
            if len(workers) == 2:
                break
            time.sleep(0.1)
        assert len(workers) == 2 and driver.poll() is None, "the driver did not start two workers"
        time.sleep(1.0)  # the workers are busy with their first runs
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.2)
        assert not [w for w in workers if _alive(w)], "workers outlived their killed driver"
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass


def _tree(root: int) -> dict[int, tuple[str, str]]:
    """pid → (start time, command line) of every live descendant of ``root``. A zombie (state Z:
    it has exited, and only its exit status waits to be collected) is not live: under Ray 2.55.1,
    which Flower's simulation extra pins, a stopped Python child of the driver stays unreaped after
    ``ray.shutdown()``; such an entry runs nothing and holds no memory."""
    procs: dict[int, tuple[int, str, str]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if fields[0] == "Z":
                continue
            procs[int(d.name)] = (int(fields[1]), fields[19], cmd)
    found: dict[int, tuple[str, str]] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, started, cmd) in procs.items():
            if ppid == parent and pid not in found:
                found[pid] = (started, cmd)
                todo.append(pid)
    return found


def _same_alive(pid: int, started: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"


def test_ray_processes_exit_when_the_driver_is_killed(tmp_path):
    """issue 22 §7: after a kill -9 of a --executor ray driver, Ray's agents
    (ray::DashboardAgent, ray::RuntimeEnvAgent) lived on for 60 to 120 s (they wait out a
    timeout reporting the raylet's death to the dead GCS). Now the driver's reaper stops
    every Ray process it started within seconds."""
    pytest.importorskip("ray")
    f = tmp_path / "m.toml"
    f.write_text(MATRIX)
    cmd = [sys.executable, "-m", "redteam.cli", "matrix", str(f), "--out", str(tmp_path / "out"), "--quiet",
           "--executor", "ray", "--workers", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env=env)
    procs: dict[int, tuple[str, str]] = {}
    try:
        deadline = time.time() + 180
        while time.time() < deadline and driver.poll() is None:
            procs = _tree(driver.pid)
            if sum("ray::execute_unit" in cmd for _, cmd in procs.values()) == 2:
                break
            time.sleep(0.2)
        assert driver.poll() is None and any("Agent" in c for _, c in procs.values()), "Ray did not start"
        time.sleep(1.0)
        procs = _tree(driver.pid)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        deadline = time.time() + 20
        while time.time() < deadline and any(_same_alive(p, s) for p, (s, _) in procs.items()):
            time.sleep(0.2)
        left = sorted(c[:60] for p, (s, c) in procs.items() if _same_alive(p, s))
        assert not left, f"Ray processes outlived their killed driver by 20 s: {left}"
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p, (s, _) in procs.items():
            if _same_alive(p, s):
                os.kill(p, signal.SIGKILL)


def test_a_ray_matrix_that_ends_leaves_no_process_behind(tmp_path):
    pytest.importorskip("ray")
    from redteam.runner.matrix_run import run_matrix

    f = tmp_path / "m.toml"
    f.write_text(MATRIX.replace("rounds = 400", "rounds = 1").replace('"ipm"', "").replace("seeds = 2", "seeds = 1"))
    before = set(_tree(os.getpid()))
    assert run_matrix(f, tmp_path / "out", executor="ray", workers=2).computed == 2 + 2
    deadline = time.time() + 30
    while time.time() < deadline and set(_tree(os.getpid())) - before:
        time.sleep(0.2)
    left = {p: c for p, (_, c) in _tree(os.getpid()).items() if p not in before}
    assert not left, f"left running: {left}"


def test_an_unreachable_ray_address_is_one_line(tmp_path, capsys, monkeypatch):
    """A --ray-address where no cluster answers was a ConnectionError traceback (after Ray's retries)."""
    ray = pytest.importorskip("ray")
    from redteam.cli import main

    def refuse(*a, **k):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.9:6379")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    f = tmp_path / "m.toml"
    f.write_text(MATRIX.replace("rounds = 400", "rounds = 1"))
    assert main(["matrix", str(f), "--out", str(tmp_path / "o"), "--executor", "ray", "--ray-address",
                 "10.0.0.9:6379", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ray-address 10.0.0.9:6379: cannot use a Ray cluster there" in err[0]
