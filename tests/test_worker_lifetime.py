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
