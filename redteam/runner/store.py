"""The results store: one SQLite file, the source of truth for reports.

Tables:

* ``meta``: the scenario (raw document and digest), package versions, creation time;
* ``plan``: the cells × replicates of the current matrix, each with the key of its
  attacked run and of its baseline run;
* ``runs``: one row per finished run (attacked or baseline) — its metrics, per-round
  records, the concrete scenario's digest and the package versions.
* ``owners`` and ``claims``: which ``redteam matrix`` driver computes which run now, so
  that several drivers on one store share the work (:mod:`.claims`); never read by
  reports, and added to an older store the first time a writer opens it.
* ``warmups``: the SHA-256 and size of each warm-up file written to the warm-up directory
  that belongs to the store (``<out>/warmups``), recorded when the file is written and
  checked before it is reused (:mod:`redteam.federation.warmup`); added like ``owners``.

Crash safety: a run's row is written in one transaction when the run has finished, and
only then; a process killed at any moment (``kill -9`` included) leaves either the whole
row or nothing; a full disk fails the transaction that needed the space, never an earlier
one, and ``redteam matrix`` then stops with one line saying what the store holds
(:func:`disk_full_error`, read-only and checked). Resume: a run whose key is already in
``runs`` is never recomputed.
Keys are the SHA-256 of the concrete scenario a run executed (seed, attack, defense,
settings), so a changed scenario can never be mistaken for a finished one. WAL mode and
a busy timeout let two processes use one store without corrupting it (``INSERT OR
IGNORE``: the first writer of a key wins).

Opening: an existing file is first looked at read-only and must already be a redteam
store (a zero-length file, another SQLite database or anything else is refused, never
silently initialised). A new store is built under a temporary name beside the target
and linked into place only when complete, so a concurrent opener sees either no file
or a whole store. :meth:`ResultsStore.check_integrity` (run by ``--resume``) asks
SQLite to verify every page and then parses every stored run, so a damaged store is
reported instead of being counted as finished.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import RedteamError
from .outputs import DiskFull, disk_full_path, is_disk_full, sanitize, terminal_safe

__all__ = ["ResultsStore", "PlanRow", "StoreError", "StoreView", "STORE_NAME", "read_store", "store_file",
           "connect_readonly", "json_or_none", "store_state", "disk_full_error", "warmup_digest"]

STORE_NAME = "results.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS plan (
    cell_id TEXT NOT NULL,
    replicate INTEGER NOT NULL,
    attack TEXT NOT NULL,
    defense TEXT NOT NULL,
    settings TEXT NOT NULL,
    seed INTEGER NOT NULL,
    run_key TEXT NOT NULL,
    baseline_key TEXT NOT NULL,
    position INTEGER NOT NULL,
    PRIMARY KEY (cell_id, replicate)
);
CREATE TABLE IF NOT EXISTS runs (
    run_key TEXT PRIMARY KEY,
    baseline INTEGER NOT NULL,
    cell_id TEXT NOT NULL,
    attack TEXT NOT NULL,
    defense TEXT NOT NULL,
    settings TEXT NOT NULL,
    replicate INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    scenario_digest TEXT NOT NULL,
    metrics TEXT NOT NULL,
    rounds TEXT NOT NULL,
    versions TEXT NOT NULL,
    wall_time_s REAL NOT NULL,
    finished_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS owners (
    owner TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    node TEXT NOT NULL,
    started TEXT NOT NULL,
    heartbeat REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS claims (run_key TEXT PRIMARY KEY, owner TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS warmups (
    key TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    written REAL NOT NULL
);
"""


class StoreError(RedteamError):
    """The results store is missing, unreadable or not a redteam store."""


_TABLES = {"meta", "plan", "runs"}


def connect_readonly(db: Path) -> sqlite3.Connection:
    """A read-only connection to the SQLite file ``db`` that leaves nothing behind.

    A read-only open of a WAL database creates its ``-wal`` and ``-shm`` files when
    they are missing and, unable to remove them, leaves them there. They are missing
    exactly when no connection has the database open and none crashed, so the file is
    then read as ``immutable`` (no side files); otherwise (a writer is running, or one
    was killed and left a log) it is opened ``mode=ro``, which reads the log too."""
    uri = db.resolve().as_uri()
    wal = db.with_name(db.name + "-wal")
    mode = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    return sqlite3.connect(f"{uri}?{mode}", uri=True)


def check_store_file(db: Path) -> None:
    """Refuse, without writing to it, an existing file that is not a redteam store:
    empty, not SQLite, or without the store's tables (opening it read-write would add
    them to any SQLite file)."""
    if not db.is_file():
        raise StoreError(f"{db}: not a regular file, not a redteam results store")
    if db.stat().st_size == 0:
        raise StoreError(f"{db}: is an empty file, not a redteam results store (remove it or choose another --out)")
    try:
        con = connect_readonly(db)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{db}: not a redteam results store ({exc})") from None
    missing = _TABLES - tables
    if missing:
        raise StoreError(f"{db}: not a redteam results store (missing tables: {', '.join(sorted(missing))}); "
                         "remove it or choose another --out")


def _create_store(p: Path) -> None:
    """Build an empty store beside ``p`` and link it into place (atomic: a concurrent
    opener sees no file or a whole store; if another process won the race, its store
    is used).

    It is built with a rollback journal, so that a successful COMMIT leaves the whole
    store in the one file that is linked (with a write-ahead log, the last close folds the
    log into the file, and on a full disk it cannot: the file linked was a malformed
    store that every later run refused); the first writer to open it turns WAL on."""
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".new")
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(f"disk full while creating the results store {terminal_safe(p)}: nothing was written; "
                           "free space and run again") from None
        raise StoreError(f"{p}: cannot create the results store ({exc.strerror or exc})") from None
    os.close(fd)
    try:
        con = sqlite3.connect(tmp, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=DELETE")
            con.execute("BEGIN")
            for stmt in _SCHEMA.strip().split(";"):
                if stmt.strip():
                    con.execute(stmt)
            con.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            con.execute("COMMIT")
        finally:
            con.close()
        try:
            os.link(tmp, p)
        except FileExistsError:
            pass  # created meanwhile by another process: checked like any existing file
        except OSError:  # no hard links on this file system: a plain rename, unless taken
            if not p.exists():
                os.replace(tmp, p)
    except (OSError, sqlite3.Error) as exc:
        if is_disk_full(exc) or _no_space(p.parent):  # SQLite may say "disk I/O error"
            raise DiskFull(f"disk full while creating the results store {terminal_safe(p)}: nothing was written; "
                           "free space and run again") from None
        raise StoreError(f"{p}: cannot create the results store ({exc})") from None
    finally:
        for side in (tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"):
            if os.path.exists(side):
                os.unlink(side)
    check_store_file(p)


def _no_space(directory: Path) -> bool:
    """Whether the file system of ``directory`` has (next to) no space left for us."""
    try:
        st = os.statvfs(directory)
    except (OSError, AttributeError):
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


@dataclass(frozen=True, slots=True)
class PlanRow:
    cell_id: str
    replicate: int
    attack: str
    defense: str
    settings: dict[str, Any]
    seed: int
    run_key: str
    baseline_key: str
    position: int


def store_file(path: str | Path) -> Path:
    """The store file of ``path``: ``path`` itself if it ends in ``.sqlite``, else
    ``path/results.sqlite`` (nothing is created)."""
    p = Path(path)
    return p if p.suffix == ".sqlite" else p / STORE_NAME


class ResultsStore:
    """Open (creating if asked) the store at ``path`` (a directory or a ``.sqlite`` file)."""

    def __init__(self, path: str | Path, *, create: bool = True, readonly: bool = False) -> None:
        p = Path(path)
        if p.suffix != ".sqlite":
            if create and not readonly:
                p.mkdir(parents=True, exist_ok=True)
            p = p / STORE_NAME
        if (not create or readonly) and not p.exists():
            raise StoreError(f"{p}: no results store here (run `redteam matrix SCENARIO --out DIR` first)")
        if p.exists():
            check_store_file(p)
        else:
            _create_store(p)
        self.path = p
        if readonly:  # a reader (redteam report) writes nothing: no schema statement, no journal mode
            try:
                self._db = connect_readonly(p)
                v = self.meta("schema_version")
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{p}: not a redteam results store ({exc})") from None
            if v != str(SCHEMA_VERSION):
                raise StoreError(f"{p}: store schema version {v}, this redteam reads {SCHEMA_VERSION}")
            return
        try:
            self._db = sqlite3.connect(p, timeout=60.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._tx():
                for stmt in _SCHEMA.strip().split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                self._db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            v = self.meta("schema_version")
        except sqlite3.DatabaseError as exc:
            if is_disk_full(exc) or _no_space(p.parent):  # SQLite may say "disk I/O error"
                if getattr(self, "_db", None) is not None:
                    self._db.close()
                raise disk_full_error(exc, p) from None
            raise StoreError(f"{p}: not a redteam results store ({exc})") from None
        if v != str(SCHEMA_VERSION):
            raise StoreError(f"{p}: store schema version {v}, this redteam reads {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # SQLite already rolled it back (a full disk does): the first error is the one to tell
            raise
        try:
            self._db.execute("COMMIT")
        except BaseException:
            try:
                self._db.execute("ROLLBACK")  # a failed COMMIT (disk full) can leave the transaction open
            except sqlite3.Error:
                pass
            raise

    def check_integrity(self) -> None:
        """Raise :class:`StoreError` unless SQLite finds every page intact and every
        stored run parses (what ``--resume`` relies on to skip finished runs)."""
        try:
            problems = [r[0] for r in self._db.execute("PRAGMA integrity_check(20)")]
            if problems != ["ok"]:
                more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
                raise StoreError(f"{self.path}: the store is damaged: {problems[0]}{more}; its results "
                                 "cannot be trusted: start a new --out (redteam report may still read part of it)")
            for key, metrics, rounds in self._db.execute("SELECT run_key, metrics, rounds FROM runs"):
                try:
                    ok = isinstance(json.loads(metrics), dict) and isinstance(json.loads(rounds), list)
                except (TypeError, ValueError):
                    ok = False
                if not ok:
                    raise StoreError(f"{self.path}: the store is damaged: run {str(key)[:16]}… does not parse; "
                                     "start a new --out")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: the store is damaged ({exc}); start a new --out") from None

    # -- meta -----------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, **items: Any) -> None:
        with self._tx():
            for k, v in items.items():
                val = v if isinstance(v, str) else json.dumps(sanitize(v), sort_keys=True)
                self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (k, val))

    # -- warm-ups -------------------------------------------------------------------
    def put_warmup(self, key: str, sha256: str, size: int) -> None:
        """Record the SHA-256 and size of the warm-up file just written under ``key``."""
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO warmups (key, sha256, bytes, written) VALUES (?, ?, ?, ?)",
                             (key, sha256, int(size), time.time()))

    # -- plan -----------------------------------------------------------------------
    def set_plan(self, rows: Sequence[PlanRow]) -> None:
        """Replace the plan with ``rows`` (results of earlier plans stay in ``runs``)."""
        with self._tx():
            self._db.execute("DELETE FROM plan")
            self._db.executemany(
                "INSERT INTO plan VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (r.cell_id, r.replicate, r.attack, r.defense, json.dumps(r.settings, sort_keys=True),
                     r.seed, r.run_key, r.baseline_key, r.position)
                    for r in rows
                ],
            )

    def plan(self) -> list[PlanRow]:
        rows = self._db.execute(
            "SELECT cell_id, replicate, attack, defense, settings, seed, run_key, baseline_key, position "
            "FROM plan ORDER BY position, replicate"
        ).fetchall()
        return [PlanRow(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7], r[8]) for r in rows]

    # -- runs -----------------------------------------------------------------------
    def finished_keys(self) -> set[str]:
        return {r[0] for r in self._db.execute("SELECT run_key FROM runs")}

    def put_run(
        self,
        *,
        run_key: str,
        baseline: bool,
        cell_id: str,
        attack: str,
        defense: str,
        settings: dict[str, Any],
        replicate: int,
        seed: int,
        scenario_digest: str,
        metrics: dict[str, Any],
        rounds: list[dict[str, Any]],
        versions: dict[str, str],
        wall_time_s: float,
    ) -> bool:
        """Record a finished run; ``False`` if that key was already there (first wins)."""
        with self._tx():
            cur = self._db.execute(
                "INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_key, int(baseline), cell_id, attack, defense, json.dumps(settings, sort_keys=True),
                    replicate, seed, scenario_digest, json.dumps(sanitize(metrics), sort_keys=True),
                    json.dumps(sanitize(rounds)), json.dumps(versions, sort_keys=True), wall_time_s, time.time(),
                ),
            )
            return cur.rowcount == 1

    def run(self, run_key: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT run_key, baseline, cell_id, attack, defense, settings, replicate, seed, scenario_digest, "
            "metrics, rounds, versions, wall_time_s FROM runs WHERE run_key = ?",
            (run_key,),
        ).fetchone()
        if row is None:
            return None
        return {
            "run_key": row[0], "baseline": bool(row[1]), "cell_id": row[2], "attack": row[3],
            "defense": row[4], "settings": json.loads(row[5]), "replicate": row[6], "seed": row[7],
            "scenario_digest": row[8], "metrics": json.loads(row[9]), "rounds": json.loads(row[10]),
            "versions": json.loads(row[11]), "wall_time_s": row[12],
        }

    def baseline_of(self, run_key: str) -> dict[str, Any] | None:
        """The finished baseline run planned for the attacked run ``run_key``."""
        row = self._db.execute("SELECT baseline_key FROM plan WHERE run_key = ? LIMIT 1", (run_key,)).fetchone()
        return self.run(row[0]) if row else None

    def results(self, *, with_rounds: bool = False) -> list[dict[str, Any]]:
        """The plan joined with its finished runs, in plan order (unfinished: no metrics)."""
        out = []
        for p in self.plan():
            run = self.run(p.run_key)
            base = self.run(p.baseline_key)
            item: dict[str, Any] = {
                "cell_id": p.cell_id, "attack": p.attack, "defense": p.defense, "settings": p.settings,
                "replicate": p.replicate, "seed": p.seed, "finished": run is not None,
                "metrics": run["metrics"] if run else None,
            }
            if with_rounds:
                item["rounds"] = run["rounds"] if run else None
                item["baseline_rounds"] = base["rounds"] if base else None
            out.append(item)
        return out

    def canonical_dump(self) -> list[tuple]:
        """Every finished run's content minus timings, in key order (for equality checks)."""
        rows = self._db.execute(
            "SELECT run_key, baseline, cell_id, attack, defense, settings, replicate, seed, "
            "scenario_digest, metrics, rounds FROM runs ORDER BY run_key"
        ).fetchall()
        out = []
        for r in rows:
            metrics = {k: v for k, v in json.loads(r[9]).items() if "time" not in k}
            rounds = [{k: v for k, v in rd.items() if "time" not in k} for rd in json.loads(r[10])]
            out.append((*r[:9], json.dumps(metrics, sort_keys=True), json.dumps(rounds, sort_keys=True)))
        return out


# ------------------------------------------------------------------ read-only view


@dataclass(frozen=True, slots=True)
class StoreView:
    """What a store holds, read without writing a byte (``redteam matrix --dry-run``,
    the reports' per-cell seeds): its meta values (raw text), its plan and the keys of
    its finished runs."""

    path: Path
    meta: dict[str, str]
    plan: tuple[PlanRow, ...]
    finished: frozenset[str]

    def meta_json(self, key: str) -> Any:
        """A meta value decoded from JSON (``None``: absent or not JSON)."""
        return json_or_none(self.meta.get(key))

    def seeds_by_cell(self) -> dict[str, list[tuple[int, int, bool]]]:
        """Per planned cell, in plan order: ``(replicate, seed, finished)`` of each of its
        runs, the seed being the one the run used (``[scenario].seed`` of its scenario)."""
        out: dict[str, list[tuple[int, int, bool]]] = {}
        for r in self.plan:
            out.setdefault(r.cell_id, []).append((r.replicate, r.seed, r.run_key in self.finished))
        return out


def read_store(path: str | Path) -> StoreView | None:
    """Read the store at ``path`` (a results directory or its ``.sqlite`` file) without
    writing to it or creating anything; ``None`` when there is none. A file that is not a
    redteam store, or one that cannot be read, is a :class:`StoreError`."""
    db = store_file(path)
    if not db.exists():
        return None
    check_store_file(db)
    try:
        con = connect_readonly(db)
        try:
            meta = {str(k): str(v) for k, v in con.execute("SELECT key, value FROM meta")}
            plan = tuple(
                PlanRow(r[0], int(r[1]), r[2], r[3], json.loads(r[4]), int(r[5]), r[6], r[7], int(r[8]))
                for r in con.execute(
                    "SELECT cell_id, replicate, attack, defense, settings, seed, run_key, baseline_key, position "
                    "FROM plan ORDER BY position, replicate"
                )
            )
            finished = frozenset(r[0] for r in con.execute("SELECT run_key FROM runs"))
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{db}: cannot read the results store ({exc})") from None
    except (ValueError, TypeError) as exc:
        raise StoreError(f"{db}: corrupt results store (unreadable plan row: {exc})") from None
    return StoreView(db, meta, plan, finished)


def store_state(db: Path) -> tuple[int | None, str | None]:
    """What the store file ``db`` holds, read without writing a byte: the number of its
    finished runs (``None``: it cannot be read now) and, when it is not intact, why
    (``None``: SQLite's quick check finds every page intact)."""
    if not db.exists():
        return 0, "no results store was created"
    try:
        con = connect_readonly(db)
        try:
            problems = [str(r[0]) for r in con.execute("PRAGMA quick_check(5)")]
            n = int(con.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error as exc:
        return None, str(exc)
    return n, None if problems == ["ok"] else "SQLite's check reports: " + "; ".join(problems)


def _from_sqlite(exc: BaseException | None) -> bool:
    seen: list[BaseException] = []
    while exc is not None and all(exc is not e for e in seen):
        if isinstance(exc, sqlite3.Error):
            return True
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(exc: BaseException, db: Path, writing: str | Path | None = None) -> DiskFull:
    """The one-line error for a disk that filled up while a matrix wrote to the store
    ``db``: what was being written, and what the store holds now (checked)."""
    path = writing or disk_full_path(exc) or (db if _from_sqlite(exc) else None)
    if path is not None:
        where = f"disk full while writing {terminal_safe(path)}"
    else:  # a library that names no file (safetensors writing a warm-up): its own words
        where = f"disk full while writing under {terminal_safe(db.parent)} ({terminal_safe(exc)})"
    store = terminal_safe(db)
    n, problem = store_state(db)
    if n is None:  # a read-only look needs the log's index, which a full disk may have cut short
        return DiskFull(f"{where}: the results store {store} cannot be read while the disk is full ({problem}); "
                        "each finished run was committed on its own: free space and re-run with --resume, "
                        "which checks the store first")
    if problem is None:
        return DiskFull(f"{where}: the results store {store} is intact with {n} finished run(s); "
                        "free space and re-run with --resume")
    return DiskFull(f"{where}: the results store {store} holds {n} finished run(s), but {terminal_safe(problem)}; "
                    "free space and re-run with --resume, which refuses a damaged store (then start a new --out)")


def json_or_none(raw: str | None) -> Any:
    """``raw`` decoded from JSON; ``None`` when absent or not JSON."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def warmup_digest(db: Path, key: str) -> tuple[str, int] | None:
    """The SHA-256 and size recorded for the warm-up ``key`` in the store file ``db``
    (read-only); ``None`` when there is no store, no such record (an older store) or a
    record no writer of this module makes."""
    if not db.is_file():
        return None
    try:
        con = connect_readonly(db)
        try:
            row = con.execute("SELECT sha256, bytes FROM warmups WHERE key = ?", (key,)).fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    if row is None or not isinstance(row[0], str) or type(row[1]) is not int or row[1] < 0:
        return None
    return row[0], row[1]
