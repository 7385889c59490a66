"""Stop the local Ray instance a ``redteam matrix --executor ray`` driver started, when
that driver dies without stopping it (``kill -9``, the OOM killer).

Ray ties its head processes (GCS, raylet) to the driver that started them, and its
workers die with the raylet, but its per-node agents (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``) first try to report the raylet's death to the GCS, which is
dead too, and wait out a 60-second timeout doing so: minutes of stray processes after
every killed matrix (issue 22 §7).

This script runs beside the driver, as a process of its own (a new session, ignoring
SIGINT and SIGHUP, so a Ctrl-C or a closed terminal reaches the driver, which then stops
Ray itself). It is started with the driver's pid and reads its standard input, a pipe
from the driver:

* every :data:`POLL_S` seconds it records the driver's descendants that look like Ray's
  (a ``ray`` in their command line) and were not already there when it started;
* ``done`` on the pipe (the driver stopped Ray itself): it exits, touching nothing;
* end of file without ``done``, or the driver gone: it sends SIGTERM to every recorded
  process still alive (the same process: its start time is checked, so a reused pid is
  left alone), SIGKILL after :data:`GRACE_S` seconds to what remains, and exits.

It imports nothing from redteam (it is run by path) so that it starts in milliseconds.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_S = 0.5
GRACE_S = 1.0


def _stat(pid: int) -> tuple[int, str, str] | None:
    """(parent pid, start time, state) of ``pid``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[-1].split()
    try:
        return int(fields[1]), fields[19], fields[0]
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _processes() -> dict[int, tuple[int, str, str]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def _descendants(root: int) -> dict[int, str]:
    """pid → start time of every live descendant of ``root``."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, str] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in found or pid not in procs:
            continue
        found[pid] = procs[pid][1]
        todo.extend(children.get(pid, ()))
    return found


def _alive(pid: int, started: str) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == started and st[2] not in ("Z", "X")


def _signal_all(tracked: dict[int, str], sig: int) -> int:
    n = 0
    for pid, started in tracked.items():
        if _alive(pid, started):
            try:
                os.kill(pid, sig)
                n += 1
            except OSError:
                pass
    return n


def main(argv: list[str]) -> int:
    driver = int(argv[1])
    me = os.getpid()
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    drv = _stat(driver)
    if drv is None:
        return 0
    driver_started = drv[1]
    before = set(_descendants(driver))  # not Ray's: the driver's other children, this script
    tracked: dict[int, str] = {}
    while True:
        ready, _, _ = select.select([0], [], [], POLL_S)
        if ready:
            data = os.read(0, 64)
            if b"done" in data:
                return 0
            if not data:
                break  # the driver is gone (or dropped the pipe) without stopping Ray
        if not _alive(driver, driver_started):
            break
        for pid, started in _descendants(driver).items():
            if pid != me and pid not in before and pid not in tracked and "ray" in _cmdline(pid):
                tracked[pid] = started
    for pid, started in list(tracked.items()):  # what they started since the last look
        if _alive(pid, started):
            tracked.update((d, s) for d, s in _descendants(pid).items() if d != me and "ray" in _cmdline(d))
    if _signal_all(tracked, signal.SIGTERM):
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(_alive(p, s) for p, s in tracked.items()):
            time.sleep(0.05)
        _signal_all(tracked, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
