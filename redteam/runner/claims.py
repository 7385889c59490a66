"""Sharing one results store between several ``redteam matrix`` processes.

Two drivers started on one ``--out`` (by hand, by a scheduler that retried, by two
users) used to compute every run each. Now each driver claims a run in the store before
it computes it, and skips the runs another live driver has claimed; both end with the
whole matrix in the store, each having computed a share.

Tables (in the store, created on open; old stores get them the first time a writer
opens them):

* ``owners``: one row per driver that holds claims: a random token, its process id, its
  host name, the identity of its machine and process namespace (``node``: the boot id
  and the pid namespace, so that a pid is only ever compared on the machine it belongs
  to), the process's start time (so that a reused pid is not mistaken for it) and a
  heartbeat refreshed every :data:`HEARTBEAT_S` seconds by a thread of its own;
* ``claims``: run key → owner token.

A claim is *stale*, and taken over by the next driver that wants the run, when its
owner's row is gone, when its owner ran on this node and that process is gone (killed,
``kill -9`` included, or its pid now belongs to another process), or when its heartbeat
is older than :data:`STALE_S` seconds (another machine sharing the store, or a stopped
process) or more than :data:`CLOCK_SKEW_S` seconds in the future. An owner row that no
driver writes (a heartbeat or pid that is not a number, NULL, infinite or out of range:
a damaged or hostile store) counts as a dead driver, so that no row can hold a claim
forever and stall ``--resume``. A claim never gates a result: results are written with ``INSERT OR IGNORE``
(the first writer of a key wins, and both computed the same thing), so a claim wrongly
judged stale costs a duplicate computation, never a result.

A driver releases its claims (and its owner row) when it ends, normally or by an
exception; one killed leaves them behind, stale at once for drivers on its machine.
"""

from __future__ import annotations

import math
import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal

from .outputs import terminal_safe

if TYPE_CHECKING:
    from .store import ResultsStore

__all__ = ["Claims", "WorkQueue", "Owner", "live_owners", "owner_alive", "HEARTBEAT_S", "STALE_S", "CLOCK_SKEW_S", "POLL_S", "node_id", "process_start"]

#: How often a driver refreshes its heartbeat (seconds).
HEARTBEAT_S = 10.0
#: A claim whose owner's heartbeat is older than this is stale (seconds).
STALE_S = 120.0
#: A heartbeat at most this far in the future is another machine's clock running ahead
#: (seconds); further ahead, it can only be forged, and its claims are stale.
CLOCK_SKEW_S = 30.0
#: How often a driver waiting for another one's runs looks again (seconds).
POLL_S = 0.5

Outcome = Literal["mine", "finished", "taken"]


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def node_id() -> str:
    """This machine's boot and this process's pid namespace: pids compare only within one."""
    try:
        ns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        ns = ""
    return f"{_read('/proc/sys/kernel/random/boot_id')}:{ns}"


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first); None if unreadable."""
    raw = _read(f"/proc/{pid}/stat")
    if not raw or ")" not in raw:
        return None
    return raw.rsplit(")", 1)[1].split()


def process_start(pid: int) -> str:
    """An identity of the process ``pid``'s start (its start time in clock ticks since
    boot, on Linux); empty where unknown."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else ""


def pid_alive(pid: int, started: str = "") -> bool:
    """Whether the process ``pid`` of this node exists, is not a zombie, and (when
    ``started`` is given and known here) is the same process that started then."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    fields = _stat(pid)
    if fields is None:
        return True  # no /proc: existence is all we know
    if fields[0] in ("Z", "X"):
        return False  # killed, not yet reaped by its parent
    return not started or len(fields) <= 19 or fields[19] == started


@dataclass(frozen=True, slots=True)
class Owner:
    """A driver holding claims, as another driver sees it."""

    token: str
    pid: int
    host: str
    node: str
    started: str
    heartbeat: float
    #: False for a row no driver writes (see :func:`_owner_row`): never alive
    valid: bool = True

    def describe(self) -> str:
        """``pid N`` on this machine, ``pid N on HOST`` elsewhere."""
        return f"pid {self.pid}" + ("" if self.node == node_id() else f" on {terminal_safe(self.host)}")


def owner_alive(o: Owner, node: str, stale_s: float = STALE_S) -> bool:
    """Whether the driver ``o`` still counts as computing what it claimed, seen from the
    node ``node``: its heartbeat is recent, and where it ran on this node, its process
    is still there."""
    age = time.time() - o.heartbeat
    if not o.valid or age > stale_s or age < -CLOCK_SKEW_S:
        return False
    if o.node and o.node == node:
        return pid_alive(o.pid, o.started)
    return True


def _owners(db: sqlite3.Connection, where: str = "", args: tuple = ()) -> list[Owner]:
    rows = db.execute(f"SELECT owner, pid, host, node, started, heartbeat FROM owners {where}", args).fetchall()
    return [_owner_row(*r) for r in rows]


def _owner_row(token: Any, pid: Any, host: Any, node: Any, started: Any, heartbeat: Any) -> Owner:
    """An ``owners`` row as an :class:`Owner`. A driver writes an integer pid and a finite
    float heartbeat; anything else (text, NULL, a blob, infinity, a pid beyond what
    ``os.kill`` takes) is a row no driver wrote: it is kept, marked ``valid=False`` (a
    dead driver, whose claims any driver may take and whose row it removes), never an
    error, so that a damaged or hostile store cannot stop a driver."""
    ok_pid = type(pid) is int and 0 < pid < 2**31
    ok_beat = type(heartbeat) in (int, float) and math.isfinite(heartbeat)
    return Owner(token, pid if ok_pid else 0, str(host), str(node), str(started),
                 float(heartbeat) if ok_beat else -math.inf, valid=ok_pid and ok_beat)


def live_owners(store: "ResultsStore") -> list[Owner]:
    """The live drivers that hold claims on ``store`` now (none for an old store)."""
    try:
        return [o for o in _owners(store._db) if owner_alive(o, node_id())]
    except sqlite3.Error:
        return []


class Claims:
    """This driver's claims on the runs of the store ``store`` (see the module docstring).

    :meth:`claim` takes a run for this driver; :meth:`close` releases everything (also on
    exceptions: use it as a context manager)."""

    def __init__(self, store: "ResultsStore", *, heartbeat_s: float = HEARTBEAT_S, stale_s: float = STALE_S) -> None:
        self.store = store
        self._db = store._db
        self.token = uuid.uuid4().hex
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.node = node_id()
        self.started = process_start(self.pid)
        self.stale_s = stale_s
        self._stop = threading.Event()
        with store._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO owners (owner, pid, host, node, started, heartbeat) VALUES (?, ?, ?, ?, ?, ?)",
                (self.token, self.pid, self.host, self.node, self.started, time.time()))
        self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), name="redteam-claims-heartbeat",
                                      daemon=True)
        self._beat.start()

    # -- liveness -----------------------------------------------------------------------
    def _heartbeat(self, every: float) -> None:
        con = None
        try:
            con = sqlite3.connect(self.store.path, timeout=30.0, isolation_level=None)
            while not self._stop.wait(every):
                try:
                    con.execute("UPDATE owners SET heartbeat = ? WHERE owner = ?", (time.time(), self.token))
                except sqlite3.Error:
                    pass  # busy, or the disk is full: the next beat tries again
        except sqlite3.Error:
            pass
        finally:
            if con is not None:
                con.close()

    def alive(self, o: Owner) -> bool:
        """Whether the owner ``o`` still counts as computing what it claimed."""
        return o.token == self.token or owner_alive(o, self.node, self.stale_s)

    def _owner(self, token: str) -> Owner | None:
        found = _owners(self._db, "WHERE owner = ?", (token,))
        return found[0] if found else None

    # -- claims -------------------------------------------------------------------------
    def claim(self, run_key: str) -> Outcome:
        """Take ``run_key`` for this driver: ``"mine"`` (compute it), ``"finished"`` (the
        store holds it) or ``"taken"`` (a live driver computes it now)."""
        with self.store._tx():
            if self._db.execute("SELECT 1 FROM runs WHERE run_key = ?", (run_key,)).fetchone():
                return "finished"
            row = self._db.execute("SELECT owner FROM claims WHERE run_key = ?", (run_key,)).fetchone()
            if row is not None and row[0] != self.token:
                holder = self._owner(row[0])
                if holder is not None and self.alive(holder):
                    return "taken"
                if holder is not None:  # a dead driver: all its claims are free now
                    self._db.execute("DELETE FROM claims WHERE owner = ?", (holder.token,))
                    self._db.execute("DELETE FROM owners WHERE owner = ?", (holder.token,))
            self._db.execute("INSERT OR REPLACE INTO claims (run_key, owner) VALUES (?, ?)", (run_key, self.token))
            return "mine"

    def holder(self, run_key: str) -> Owner | None:
        """The live driver that holds ``run_key`` (None: nobody)."""
        row = self._db.execute("SELECT owner FROM claims WHERE run_key = ?", (run_key,)).fetchone()
        if row is None:
            return None
        o = self._owner(row[0])
        return o if o is not None and self.alive(o) else None

    def close(self) -> None:
        """Release this driver's claims and its owner row; stop the heartbeat."""
        self._stop.set()
        self._beat.join(timeout=5.0)
        try:
            with self.store._tx():
                self._db.execute("DELETE FROM claims WHERE owner = ?", (self.token,))
                self._db.execute("DELETE FROM owners WHERE owner = ?", (self.token,))
        except sqlite3.Error:
            pass  # (a full disk): the claims stay behind, stale at once for this machine

    def __enter__(self) -> "Claims":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkQueue:
    """One phase's units, handed out as this driver claims them.

    :meth:`take` returns the next unit to compute, or ``None`` when nothing is free now;
    :attr:`done` is then True when every unit of the phase is finished or handed out to
    this driver, False when some are being computed by another live driver (wait, with
    :meth:`wait`, and take again: a driver that died leaves its runs to this one).
    ``finished_elsewhere`` counts the units another driver finished meanwhile."""

    def __init__(self, units: Iterable[Any], claims: Claims | None, poll_s: float = POLL_S,
                 on_wait: Callable[[list[Owner], int], None] | None = None) -> None:
        self.units: list[Any] = list(units)
        self.claims = claims
        self.poll_s = poll_s
        self.on_wait = on_wait
        self._next = 0
        self._held: list[Any] = []
        self.done = not self.units
        self.finished_elsewhere = 0

    def _try(self, u: Any) -> Outcome:
        if self.claims is None:
            return "mine"
        return self.claims.claim(u.run_key)

    def take(self) -> Any:
        while self._next < len(self.units):
            u = self.units[self._next]
            self._next += 1
            got = self._try(u)
            if got == "mine":
                return u
            if got == "taken":
                self._held.append(u)
            else:
                self.finished_elsewhere += 1
        for u in list(self._held):  # another driver's runs: finished since, or is it gone?
            got = self._try(u)
            if got == "taken":
                continue
            self._held.remove(u)
            if got == "mine":
                return u
            self.finished_elsewhere += 1
        self.done = not self._held
        return None

    def wait(self) -> None:
        """Sleep a poll interval (calling ``on_wait`` with the drivers being waited for)."""
        if self.on_wait is not None and self.claims is not None:
            holders: dict[str, Owner] = {}
            for u in self._held:
                o = self.claims.holder(u.run_key)
                if o is not None:
                    holders[o.token] = o
            self.on_wait(list(holders.values()), len(self._held))
        time.sleep(self.poll_s)
