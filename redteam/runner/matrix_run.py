"""Run a scenario matrix into a results store, resumably, on one of three executors.

Every cell runs once per seed, each with its no-attack baseline of the same seed and
settings; baselines are shared (one per defense × settings × seed). Work is done in two
phases — all baselines, then all attacked runs — and each run is one unit of work whose
result is written to the store the moment it finishes (the driver does all writing).

Executors:

* ``local``: one run after another in this process;
* ``process``: a pool of worker processes on this machine (``--workers``, default the
  number of cores), each limited to ``cores / workers`` torch threads;
* ``ray``: each run is a Ray task, on a local Ray instance or an existing cluster
  (``--ray-address``); needs the optional extra ``redteam[ray]``. A local instance is
  stopped by :mod:`.ray_reaper` when its driver dies without stopping it (``kill -9``).

:func:`plan_matrix` is ``--dry-run``: the cells, each run's seed, what the store at
``--out`` already holds (read without writing), what a run would compute; :func:`probe`
times one round of one run for an estimate.

One store, one definition: ``--resume`` compares the scenario document and the plan the
store was filled from with the file's current ones (:func:`definition_changes`) and
refuses (:class:`DefinitionChanged`, one line per difference) when they differ, unless
``recompute_changed``: then the changed and added cells are computed (their runs have new
keys), the unchanged ones kept, and the plan replaced, so runs no longer planned stay in
the store but outside every report (reports read planned runs only).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import InvalidParameter, InvalidScenario, RedteamError
from ..matrix import Matrix, replicate_seeds
from ..requirements import unmet
from ..scenario import baseline_attack, durability_params, parse_scenario
from ..scoring import summarize
from ..types import RoundRecord
from .claims import Claims, Owner, WorkQueue, live_owners
from .single import sanitize
from .outputs import is_disk_full
from .store import PlanRow, ResultsStore, StoreError, StoreView, disk_full_error, read_store

__all__ = ["Unit", "plan_units", "run_matrix", "execute_unit", "EXECUTORS", "MatrixSummary", "MatrixPlan",
           "CellPlan", "Probe", "plan_matrix", "probe", "definition_changes", "DefinitionChanged",
           "reproduce_command"]

EXECUTORS = ("local", "process", "ray")


@dataclass(frozen=True)
class Unit:
    run_key: str
    baseline: bool
    cell_id: str
    attack: str
    defense: str
    settings: dict[str, Any]
    replicate: int
    seed: int
    doc: dict[str, Any] = field(repr=False)
    target_accuracy: float = 0.9
    file: str = ""
    rounds: int = 1

    @property
    def where(self) -> str:
        """``FILE: [matrix] cell ID seed N`` for error messages."""
        return f"{self.file or 'scenario'}: [matrix] cell {self.cell_id} seed {self.replicate}"


@dataclass
class MatrixSummary:
    store: Path
    total: int
    computed: int
    skipped: int
    wall_time_s: float


def plan_units(matrix: Matrix, scenario_seed: int, file: str, base_dir: str | Path | None = None,
               warmup_dir: str | Path | None = None) -> tuple[list[PlanRow], list[Unit], list[Unit]]:
    """The plan rows, the distinct baseline units and the distinct attacked units.

    ``base_dir`` (the scenario file's directory: relative ``start_from`` paths) and
    ``warmup_dir`` (where shared warm-ups are kept) travel with each unit's document under
    the private key ``_run``, read by :func:`execute_unit`; they are not part of any run key."""
    rows: list[PlanRow] = []
    baselines: dict[str, Unit] = {}
    attacked: dict[str, Unit] = {}
    for pos, cell in enumerate(matrix.cells):
        for rep in matrix.seeds:
            doc = copy.deepcopy(dict(cell.doc))
            doc.setdefault("scenario", {})
            seeds = replicate_seeds(scenario_seed, cell.settings, rep, doc["scenario"])
            seed = seeds["seed"]
            doc["scenario"] = {**doc["scenario"], **seeds}
            bdoc = copy.deepcopy(doc)
            bdoc["attack"] = baseline_attack(bdoc.get("attack"))
            sc = parse_scenario(doc, file=file, base_dir=base_dir or "")
            bsc = parse_scenario(bdoc, file=file, base_dir=base_dir or "")
            key, bkey = sc.digest(), bsc.digest()
            tgt, n_rounds = sc.federation.target_accuracy, sc.federation.rounds
            if base_dir is not None or warmup_dir is not None:
                run = {"base_dir": str(base_dir or ""), "warmup_dir": str(warmup_dir) if warmup_dir else None}
                doc["_run"], bdoc["_run"] = run, dict(run)
            rows.append(PlanRow(cell.id, rep, cell.attack, cell.defense, cell.settings_dict, seed, key, bkey, pos))
            baselines.setdefault(
                bkey, Unit(bkey, True, f"{cell.defense}[none]", "none", cell.defense, cell.settings_dict, rep, seed,
                           bdoc, tgt, file, n_rounds)
            )
            if key != bkey:
                attacked.setdefault(
                    key, Unit(key, False, cell.id, cell.attack, cell.defense, cell.settings_dict, rep, seed, doc, tgt,
                           file, n_rounds)
                )
    return rows, list(baselines.values()), list(attacked.values())


#: where a matrix keeps its shared warm-ups, under its --out directory
WARMUP_DIR = "warmups"


def prepare_warmups(units: list[Unit], device: str, report: Callable[[str], None] | None = None) -> int:
    """Compute each distinct warm-up of ``units`` once, into its warm-up directory (so that
    parallel workers read it instead of each computing it); returns how many were computed."""
    from ..federation.loop import resolve_device
    from ..federation.regimes import make_run
    from ..federation.warmup import warmup_is_stored, warmup_key

    seen: set[str] = set()
    made = 0
    for u in units:
        doc = dict(u.doc)
        run = doc.pop("_run", None) or {}
        if not int(doc.get("scenario", {}).get("warmup_rounds", 0) or 0) or not run.get("warmup_dir"):
            continue
        sc = parse_scenario(doc, file="<cell>", base_dir=run.get("base_dir") or "")
        from ..federation.builders import build_workload

        source = build_workload(sc.workload.name, sc.workload_params).load(sc.seed).source
        key = warmup_key(sc, resolve_device(device), source)
        if key in seen or warmup_is_stored(Path(run["warmup_dir"]), key):
            seen.add(key)
            continue
        seen.add(key)
        if report is not None:
            seed = sc.seed if sc.scenario.warmup_seed is None else sc.scenario.warmup_seed
            report(f"warm-up ({sc.scenario.warmup_rounds} rounds, seed {seed})")
        make_run(sc, device=device, warmup_dir=run["warmup_dir"])  # building the run computes its warm-up
        made += 1
    return made


def execute_unit(doc: dict[str, Any], device: str = "cpu", threads: str | int | None = None,
                 where: str = "<cell>", parallel_runs: int = 1) -> dict[str, Any]:
    """Run one concrete scenario document; return its round records (as dicts). A plugin
    parameter error is re-raised naming ``where`` (file and matrix cell) and the section.
    ``threads`` is the thread policy (:mod:`.threads`: ``"auto"``, an integer, or ``None`` for
    the default), ``parallel_runs`` how many runs share this machine's cores."""
    from ..federation.regimes import make_run
    from ..federation.warmup import start_digests
    from .single import _versions, plugin_errors_located
    from .threads import run_threads

    doc = dict(doc)
    run = doc.pop("_run", None) or {}
    sc = parse_scenario(doc, file="<cell>", base_dir=run.get("base_dir") or "")
    t = time.perf_counter()
    with plugin_errors_located(sc, where):
        fed = make_run(sc, device=device, warmup_dir=run.get("warmup_dir"))
        with run_threads(fed, threads, parallel_runs):
            res = fed.run()
    start = res.records[0].extra.get("start") if res.records else None
    return {
        "records": [r.to_dict() for r in res.records],
        "wall_time_s": time.perf_counter() - t,
        "versions": {**_versions(), **start_digests(start)},  # and what the run started from
    }


# ------------------------------------------------------------------------ executors


#: The phases of a matrix (baselines, then attacked runs), each a queue of the units this
#: driver may compute (:class:`~.claims.WorkQueue`: it claims each unit in the store as it
#: hands it out, and holds back those another live driver computes). An executor takes
#: from a phase while it has room, waits while the phase's only remaining units are
#: another driver's, and ends the phase when :attr:`~.claims.WorkQueue.done` and nothing
#: of its own is in flight, so that a phase's runs are all in the store before the next.
Phases = list[WorkQueue]


def _local(phases: Phases, device: str, workers: int, ray_address: str | None,
           policy: str | int | None = None) -> Iterator[tuple[Unit, dict]]:
    for phase in phases:
        while True:
            u = phase.take()
            if u is not None:
                yield u, execute_unit(u.doc, device, policy, u.where, 1)
            elif phase.done:
                break
            else:
                phase.wait()


#: How often a process-pool worker checks that its driver is still alive (seconds).
PARENT_CHECK_S = 1.0


#: the most characters of a scenario file kept in the store as written (the report shows them)
SOURCE_CHARS = 200_000


def scenario_source(path: Path) -> dict[str, Any]:
    """The scenario file as written, for the report (``{"text": …, "truncated": bool}``; the text
    is None when the file cannot be read back)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {"text": None, "truncated": False}
    return {"text": text[:SOURCE_CHARS], "truncated": len(text) > SOURCE_CHARS}


def _init_worker(threads: int, parent: int | None = None) -> None:
    if parent is not None:  # first: importing torch takes seconds on a busy machine
        _exit_with_parent(parent)
    import torch

    torch.set_num_threads(threads)


def _exit_with_parent(parent: int, interval: float = PARENT_CHECK_S) -> None:
    """Exit this worker as soon as the driver ``parent`` is gone (``kill -9`` included:
    no message can be sent then, so the worker watches its own parent id, which changes
    to a reaper's when the parent dies). Without this a worker whose driver was killed
    lives on, holding its memory, forever."""
    import threading

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(interval)

    threading.Thread(target=watch, name="redteam-parent-watch", daemon=True).start()


def _process(phases: Phases, device: str, workers: int, ray_address: str | None,
             policy: str | int | None = None) -> Iterator[tuple[Unit, dict]]:
    """One pool for all phases; a phase is submitted once the previous one was consumed
    (so the baselines are in the store before the attacked runs that need them)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // workers)
    ctx = mp.get_context("spawn")  # no fork after torch has started its thread pools
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(threads, os.getpid())) as pool:
        try:
            yield from _drain(pool, phases, device, policy, workers)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # fail now, not after the queue
            raise


def _drain(pool: Any, phases: Phases, device: str, policy: str | int | None,
           workers: int) -> Iterator[tuple[Unit, dict]]:
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    for phase in phases:
        pending: dict[Any, Unit] = {}
        while True:
            while len(pending) < workers:  # keep every worker busy, claiming one unit at a time
                u = phase.take()
                if u is None:
                    break
                pending[pool.submit(execute_unit, u.doc, device, policy, u.where, workers)] = u
            if not pending:
                if phase.done:
                    break
                phase.wait()
                continue
            # while another driver holds some of the phase, look again now and then (it may die)
            done, _ = wait(pending, timeout=None if phase.done else phase.poll_s, return_when=FIRST_COMPLETED)
            for fut in done:
                u = pending.pop(fut)
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    raise RedteamError(
                        "a worker process died (out of memory, or killed); finished runs are in the "
                        "store: rerun with --resume"
                    ) from None
                yield u, result


def _ray(phases: Phases, device: str, workers: int, ray_address: str | None,
         policy: str | int | None = None) -> Iterator[tuple[Unit, dict]]:
    try:
        import ray
    except ImportError:
        raise RedteamError("the ray executor needs Ray: pip install 'redteam[ray]'") from None
    started = False
    reaper = None
    if not ray.is_initialized():
        if ray_address:
            try:
                ray.init(address=ray_address, log_to_driver=False)
            except (ConnectionError, ValueError) as exc:  # nothing there, or not a Ray address
                raise RedteamError(f"--ray-address {ray_address}: cannot use a Ray cluster there "
                                   f"({type(exc).__name__}: {str(exc).strip()})") from None
        else:  # a local instance: stopped by the reaper should this driver die without stopping it
            reaper = _start_reaper()
            try:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            except BaseException:
                _stop_reaper(reaper)
                raise
        started = True
    try:
        # a cluster's nodes are not this machine: one thread per task there unless told otherwise
        if ray_address and policy in (None, "auto"):
            policy = 1
        task = ray.remote(num_cpus=1)(execute_unit)
        for phase in phases:
            refs: dict[Any, Unit] = {}
            while True:
                while len(refs) < workers:
                    u = phase.take()
                    if u is None:
                        break
                    refs[task.remote(u.doc, device, policy, u.where, workers)] = u
                if not refs:
                    if phase.done:
                        break
                    phase.wait()
                    continue
                done, _ = ray.wait(list(refs), num_returns=1, timeout=None if phase.done else phase.poll_s)
                for ref in done:
                    u = refs.pop(ref)
                    yield u, ray.get(ref)
    finally:
        if started:
            ray.shutdown()
        if reaper is not None:
            _stop_reaper(reaper)


def _start_reaper() -> Any:
    """Start :mod:`.ray_reaper` for this driver (``None`` where it cannot run: no /proc)."""
    import subprocess
    import sys

    if not os.path.isdir("/proc/self"):
        return None
    script = Path(__file__).with_name("ray_reaper.py")
    try:
        return subprocess.Popen([sys.executable, str(script), str(os.getpid())], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True)
    except OSError:
        return None


def _stop_reaper(reaper: Any) -> None:
    """Tell the reaper that Ray was stopped by this driver (it exits touching nothing)."""
    if reaper is None:
        return
    try:
        reaper.stdin.write(b"done\n")
        reaper.stdin.close()
    except OSError:
        pass
    try:
        reaper.wait(timeout=10)
    except Exception:
        reaper.kill()
        reaper.wait()


_EXEC: dict[str, Callable[..., Iterator[tuple[Unit, dict]]]] = {"local": _local, "process": _process, "ray": _ray}


# ---------------------------------------------------------------------------- driver


def _prepare(path: str | Path, out: str | Path, executor: str, workers: int | None, device: str,
             threads: str | int | None) -> tuple[Path, Any, Any, dict[str, Any], int, str | int]:
    """What a matrix run checks before any work (and ``--dry-run`` too): the executor,
    the worker count, the thread policy, the scenario, ``--out`` and ``--device``.
    Returns the path, the base scenario, the matrix, the raw document, the workers and the
    thread policy."""
    from ..matrix import load_matrix
    from .outputs import check_output_dir
    from .threads import default_policy, parse_threads

    if executor not in EXECUTORS:
        raise InvalidParameter(f"--executor = {executor!r}: must be one of {', '.join(EXECUTORS)}")
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidParameter(f"--workers = {workers!r}: must be an integer ≥ 1")
    policy = default_policy() if threads is None else parse_threads(threads)
    p = Path(path)
    base, matrix, doc = load_matrix(p)
    if not doc:
        raise InvalidScenario(f"{p}: the scenario file is empty (no tables); see docs/scenarios.md")
    check_output_dir(out, option="--out")
    if executor != "ray":  # a Ray cluster's workers may have devices this driver lacks
        from ..federation.loop import resolve_device

        resolve_device(device)  # --device cuda without a GPU: an error now, not after the store is made
    return p, base, matrix, doc, workers, policy


def run_matrix(
    path: str | Path,
    out: str | Path,
    *,
    executor: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    resume: bool = False,
    device: str = "cpu",
    on_progress: Callable[[int, int, str], None] | None = None,
    threads: str | int | None = None,
    recompute_changed: bool = False,
) -> MatrixSummary:
    """Expand the scenario at ``path``, run what the store at ``out`` lacks, write results.

    ``threads`` is the intra-op thread policy of each run (:mod:`.threads`; ``None``: the
    ``REDTEAM_THREADS`` environment variable, else ``auto``).

    ``resume`` continues a store that holds results, refusing with
    :class:`DefinitionChanged` when the scenario's definition changed since the store was
    filled; ``recompute_changed`` (implies ``resume``) accepts the change: the changed and
    added cells are computed, the unchanged ones kept.

    ``on_progress(done, total, label)`` is called before each run starts (label = the
    run) and after each finishes.
    """
    from .single import _versions

    resume = resume or recompute_changed
    p, base, matrix, doc, workers, threads = _prepare(path, out, executor, workers, device, threads)
    rows, b_units, a_units = plan_units(matrix, base.seed, p.name, base_dir=p.parent,
                                        warmup_dir=Path(out) / WARMUP_DIR)
    missing = unmet(base.scenario.requires, base.workload_params)
    if missing:
        raise RedteamError(f"{p}: " + "; ".join(missing) + " ([scenario] requires)")

    store = ResultsStore(out)
    claims: Claims | None = None
    full: BaseException | None = None  # a full disk: said once the store is closed and checked
    try:
        finished = store.finished_keys()
        planned = {r.run_key for r in rows} | {r.baseline_key for r in rows}
        if finished and not resume:
            others = live_owners(store)
            if others:
                raise StoreError(
                    f"{store.path} is being filled by another redteam matrix ({_owners_text(others)}); pass --resume "
                    "to share its work (each run is computed once, by one of them), or choose another --out")
            raise StoreError(
                f"{store.path} already holds results; pass --resume to continue it, or choose another --out"
            )
        if resume:
            store.check_integrity()  # a damaged run must not count as finished
        if finished:  # one store, one definition: never mix the runs of two silently
            stored = store.meta("scenario_doc")
            changes = definition_changes(_json_or_none(stored), store.plan(), doc, rows)
            if changes and not recompute_changed:
                raise DefinitionChanged(store.path, p, changes)
        store.set_meta(
            scenario_file=str(p),
            scenario_name=base.name,
            scenario_doc=doc,
            scenario_digest=base.digest(),
            scenario_source=scenario_source(p),
            versions=_versions(),
            expectations=[_exp_dict(e) for e in matrix.expectations],
            reproduce=f"redteam matrix {shlex.quote(str(p))} --out {shlex.quote(str(out))}",
        )
        store.set_plan(rows)  # the plan is replaced: runs no longer planned leave every report
        todo_b = [u for u in b_units if u.run_key not in finished]
        todo_a = [u for u in a_units if u.run_key not in finished]
        total = len(planned)
        done = len(planned & finished)
        t0 = time.perf_counter()
        computed = 0
        run = _EXEC[executor]

        claims = Claims(store)  # other drivers on this store skip what this one claims, and the reverse
        phases: list[WorkQueue] = []

        def report(label: str) -> None:
            if on_progress:  # done: in the store when this driver began, computed since, by it or by others
                on_progress(done + computed + sum(q.finished_elsewhere for q in phases), total, label)

        last_wait: list[str] = [""]

        def waiting(owners: list[Owner], n: int) -> None:  # said once per change, not at every look
            label = f"waiting for {n} run(s) that another redteam matrix ({_owners_text(owners)}) is computing"
            if label != last_wait[0]:
                last_wait[0] = label
                report(label)

        phases = [WorkQueue(p, claims, on_wait=waiting) for p in (todo_b, todo_a) if p]
        if phases:
            report(_label(phases[0].units[0]))
        if executor != "local":  # shared warm-ups once, here, before workers would each compute them
            prepare_warmups(todo_b + todo_a, device, lambda label: report(label))
        for unit, result in run(phases, device, workers, ray_address, threads):
            _record(store, unit, result)
            computed += 1
            report(_label(unit))
        return MatrixSummary(store.path, total, computed, total - computed, time.perf_counter() - t0)
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        full = exc
    finally:
        if claims is not None:
            claims.close()
        try:
            store.close()
        except sqlite3.Error:
            if full is None:
                raise
    raise disk_full_error(full, store.path) from None


def _owners_text(owners: list[Owner]) -> str:
    return ", ".join(o.describe() for o in owners) or "a process that just ended"


# ------------------------------------------------------------ one store, one definition


class DefinitionChanged(StoreError):
    """``--resume`` on a store filled from another definition of the scenario.

    ``headline`` is the one-line reason, ``details`` one line per difference (what the
    command line prints under it); ``str()`` holds both, on one line."""

    def __init__(self, store: Path, scenario: Path, changes: list[str]) -> None:
        from .outputs import terminal_safe

        self.changes = list(changes)
        self.headline = (
            f"{terminal_safe(store)} was filled from another definition of {terminal_safe(scenario)} "
            f"({len(self.changes)} difference(s), listed below); --resume would mix the runs of two definitions "
            "in one store: pass --recompute-changed to compute the changed and added cells and keep the others "
            "(runs no longer planned stay in the store, outside every report), or choose another --out")
        self.details = [f"- {c}" for c in self.changes]
        super().__init__(self.headline.replace(", listed below", "") + ": " + "; ".join(self.changes))


#: At most this many differences are listed (the rest counted in one line).
MAX_CHANGES_SHOWN = 30


def _json_or_none(raw: str | None) -> Any:
    from .store import json_or_none

    return json_or_none(raw)


def _normal(doc: Any) -> Any:
    """``doc`` as the store keeps it (JSON: NaN/inf as null, unknown objects as text)."""
    return json.loads(json.dumps(sanitize(doc), sort_keys=True))


def _flatten(doc: Any, path: str = "") -> dict[str, Any]:
    """``{"federation.rounds": 3, "matrix.attacks[1].std": 3.0, ...}``: tables and arrays
    flattened to key paths, so a difference names the value that differs."""
    if isinstance(doc, dict) and doc:
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out.update(_flatten(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(doc, list) and doc:
        out = {}
        for i, v in enumerate(doc):
            out.update(_flatten(v, f"{path}[{i}]"))
        return out
    return {path: doc} if path else {}


def _by_cell(rows: Any) -> dict[str, dict[int, tuple[str, str]]]:
    out: dict[str, dict[int, tuple[str, str]]] = {}
    for r in rows:
        out.setdefault(r.cell_id, {})[r.replicate] = (r.run_key, r.baseline_key)
    return out


def definition_changes(old_doc: Any, old_plan: Any, new_doc: dict[str, Any], new_plan: Any) -> list[str]:
    """What differs between the definition a store was filled from (its scenario document
    and plan) and the current one, one line per difference: each key path of the document
    added, removed or changed, then each cell added, removed or changed (a cell whose runs'
    keys differ: its concrete scenario changed, e.g. a setting, a default or the seed).
    Empty: the same definition. An ``old_doc`` of ``None`` (not recorded) compares the
    plans only."""
    from ..scenario_limits import shown

    lines: list[str] = []
    if old_doc is not None:
        old, new = _flatten(_normal(old_doc)), _flatten(_normal(new_doc))
        for key, value in new.items():
            if key not in old:
                lines.append(f"{key}: added (= {shown(value)})")
            elif old[key] != value:
                lines.append(f"{key}: {shown(old[key])} → {shown(value)}")
        lines += [f"{key}: removed (was {shown(value)})" for key, value in old.items() if key not in new]
    before, after = _by_cell(old_plan), _by_cell(new_plan)
    for cell, reps in after.items():
        was = before.get(cell)
        if was is None:
            lines.append(f"cell added: {cell}")
        elif any(rep in was and was[rep] != keys for rep, keys in reps.items()):
            lines.append(f"cell changed: {cell} (its scenario differs, so its runs are new ones)")
        elif set(reps) != set(was):
            lines.append(f"cell {cell}: replicates {sorted(was)} → {sorted(reps)}")
    lines += [f"cell removed: {cell}" for cell in before if cell not in after]
    if len(lines) > MAX_CHANGES_SHOWN:
        rest = len(lines) - (MAX_CHANGES_SHOWN - 1)
        lines = lines[: MAX_CHANGES_SHOWN - 1] + [f"… and {rest} more difference(s)"]
    return lines


# --------------------------------------------------------------------------- dry run


@dataclass(frozen=True)
class CellPlan:
    """One cell as ``--dry-run`` shows it: its seeds (replicate, the seed its runs use)
    and how many of its runs (attacked and baseline, per replicate) the store holds."""

    cell_id: str
    attack: str
    defense: str
    settings: dict[str, Any]
    seeds: tuple[tuple[int, int], ...]
    runs: int
    finished: int


@dataclass(frozen=True)
class MatrixPlan:
    """What ``redteam matrix`` would do, found without running or writing anything."""

    scenario: Path
    name: str
    has_matrix: bool
    out: Path
    store: Path | None  # the existing store at --out (None: a run would create it)
    cells: tuple[CellPlan, ...]
    baselines: int  # distinct baseline runs planned
    attacked: int  # distinct attacked runs planned
    finished: int  # planned runs already in the store
    todo: tuple[Unit, ...]  # the runs a run would compute, baselines first
    store_runs: int  # finished runs in the store, planned or not
    resume: bool
    changes: tuple[str, ...]  # definition changes since the store was filled
    executor: str
    workers: int  # runs at a time on this executor
    recompute_changed: bool = False

    @property
    def total(self) -> int:
        return self.baselines + self.attacked

    @property
    def refusal(self) -> str | None:
        """Why a run with these options would refuse to start (``None``: it would run)."""
        if self.store_runs and self.changes and not self.recompute_changed:
            return ("the scenario's definition changed since the store was filled: a run needs --recompute-changed, "
                    "which computes the changed and added cells (the runs to compute below); --resume refuses "
                    "(or choose another --out)")
        if self.store_runs and not self.resume:
            return "the store already holds results: a run needs --resume (or another --out)"
        return None


def plan_matrix(
    path: str | Path,
    out: str | Path,
    *,
    executor: str = "local",
    workers: int | None = None,
    device: str = "cpu",
    threads: str | int | None = None,
    resume: bool = False,
    recompute_changed: bool = False,
) -> MatrixPlan:
    """``redteam matrix --dry-run``: the cells, the seed of each run (as :func:`plan_units`
    gives it to the run), what the store at ``out`` already holds (read without writing;
    none is created) and what a run with these options would compute. Checks what a run
    checks first (scenario, executor, workers, ``--out``, ``--device``)."""
    resume = resume or recompute_changed
    p, base, matrix, doc, workers, _ = _prepare(path, out, executor, workers, device, threads)
    rows, b_units, a_units = plan_units(matrix, base.seed, p.name, base_dir=p.parent)
    view: StoreView | None = read_store(out)
    finished = view.finished if view is not None else frozenset()
    changes: list[str] = []
    if view is not None and finished:
        changes = definition_changes(view.meta_json("scenario_doc"), view.plan, doc, rows)
    cells: dict[str, dict[str, Any]] = {}
    for r in rows:
        c = cells.setdefault(r.cell_id, {"row": r, "seeds": [], "keys": set()})
        c["seeds"].append((r.replicate, r.seed))
        c["keys"] |= {r.run_key, r.baseline_key}
    plans = tuple(
        CellPlan(cid, c["row"].attack, c["row"].defense, dict(c["row"].settings), tuple(c["seeds"]),
                 len(c["keys"]), len(c["keys"] & finished))
        for cid, c in cells.items()
    )
    todo = tuple(u for u in (*b_units, *a_units) if u.run_key not in finished)
    planned = {u.run_key for u in (*b_units, *a_units)}
    return MatrixPlan(
        scenario=p, name=base.name, has_matrix="matrix" in doc, out=Path(out),
        store=view.path if view is not None else None, cells=plans, baselines=len(b_units), attacked=len(a_units),
        finished=len(planned & finished), todo=todo, store_runs=len(finished), resume=resume,
        changes=tuple(changes), executor=executor, workers=1 if executor == "local" else workers,
        recompute_changed=recompute_changed,
    )


@dataclass(frozen=True)
class Probe:
    """A short run, timed twice: the first time pays what a process pays once (imports,
    kernels, caches: ``warmup_s``, its excess over the second), the second is the
    measurement, ``seconds`` in all for ``rounds`` rounds, of which ``round_s`` is its last
    round (training, defense, evaluation) and ``setup_s`` the rest (data, model, network, and
    what the first round costs beyond the others: an attack that trains something once per
    run, a cache filled at first use). ``warmups``: the rounds of each distinct warm-up the
    plan's runs start from (``[scenario] warmup_rounds``), counted at ``round_s`` a round."""

    label: str
    seconds: float
    setup_s: float
    round_s: float
    warmup_s: float = 0.0
    rounds: int = 1
    warmups: tuple[int, ...] = ()

    def run_seconds(self, rounds: int) -> float:
        """The estimated wall time of a run of ``rounds`` rounds (warm)."""
        return self.setup_s + self.round_s * rounds


def probe(plan: MatrixPlan, *, device: str = "cpu", threads: str | int | None = None) -> Probe | None:
    """Run the plan's first cell (its attacked run; its baseline when its attack is
    ``none``) with the scenario's settings, on ``device``, twice: once for one round (the
    warm-up a fresh process pays once), then for two rounds (one when the run has one), the
    run timed; ``None`` when nothing is left to compute. The second round is the per-round
    time; what the first costs beyond it is counted once per run. Nothing is written."""
    if not plan.todo:
        return None
    first = plan.cells[0].cell_id
    unit = next((u for u in plan.todo if u.cell_id == first and not u.baseline),
                next((u for u in plan.todo if not u.baseline), plan.todo[0]))
    doc = copy.deepcopy(unit.doc)
    n = 2 if unit.rounds >= 2 else 1
    # the attack window (which may open later) and the warm-up are left out (the warm-up's
    # rounds are counted at the per-round time: Probe.warmups)
    if isinstance(doc.get("attack"), dict):
        doc["attack"] = {k: v for k, v in doc["attack"].items() if k not in ("window", "every")}
    if isinstance(doc.get("scenario"), dict):
        doc["scenario"] = {k: v for k, v in doc["scenario"].items() if k not in ("warmup_rounds", "warmup_seed")}
    if isinstance(doc.get("pipeline"), dict):  # what sets the warm-up goes with it
        doc["pipeline"] = {k: v for k, v in doc["pipeline"].items() if k not in ("warmup_optimizer", "warmup_lr")}
    label = f"{'baseline ' if unit.baseline else ''}{unit.cell_id} seed {unit.replicate}"
    times = []
    for rounds in (1, n):
        doc["federation"] = {**doc.get("federation", {}), "rounds": rounds}
        t = time.perf_counter()
        result = execute_unit(doc, device, threads, unit.where, plan.workers)
        times.append(time.perf_counter() - t)
    seconds = times[1]
    walls = [max(float(r.get("wall_time_s") or 0.0), 0.0) for r in result["records"]]
    round_s = min(walls[-1] if walls else 0.0, seconds / n)
    return Probe(label, seconds, seconds - n * round_s, round_s, max(0.0, times[0] - (seconds - (n - 1) * round_s)),
                 rounds=n, warmups=plan_warmups(plan))


def plan_warmups(plan: MatrixPlan) -> tuple[int, ...]:
    """The rounds of each distinct warm-up the plan's runs to compute start from (a matrix
    computes each once; those a store may already hold are counted too)."""
    from ..federation.warmup import warmup_scenario

    seen: dict[str, int] = {}
    for u in plan.todo:
        doc = dict(u.doc)
        run = doc.pop("_run", None) or {}
        info = doc.get("scenario")
        if not isinstance(info, dict) or not info.get("warmup_rounds"):
            continue
        sc = parse_scenario(doc, file="<cell>", base_dir=run.get("base_dir") or "")
        seen.setdefault(warmup_scenario(sc).digest(), int(sc.scenario.warmup_rounds))
    return tuple(seen.values())


def estimate_seconds(plan: MatrixPlan, probe_: Probe) -> float:
    """Wall time of the plan's runs to compute, from a probe: each run's setup plus its
    rounds at the probe's per-round time, and the rounds of the warm-ups they start from,
    divided among the workers, plus the start-up each worker process pays once."""
    if not plan.todo:
        return 0.0
    work = sum(probe_.run_seconds(u.rounds) for u in plan.todo) + probe_.round_s * sum(probe_.warmups)
    return probe_.warmup_s + work / max(1, min(plan.workers, len(plan.todo)))


def reproduce_command(file: str | None, cell_id: str, seed: int, has_matrix: bool = True) -> str:
    """The ``redteam run`` command that reruns one run of a matrix cell (its attacked run
    and the no-attack baseline of the same seed): ``--cell`` picks the cell of the file's
    ``[matrix]``, ``--seed`` the seed that run used."""
    target = shlex.quote(file) if file else "SCENARIO"
    cell = f" --cell {shlex.quote(cell_id)}" if has_matrix else ""
    return f"redteam run {target}{cell} --seed {seed}"


def _label(u: Unit) -> str:
    return ("baseline " if u.baseline else "") + u.cell_id + f" seed {u.replicate}"


def _exp_dict(e: Any) -> dict[str, Any]:
    """An ``[[expect]]`` row as the store's meta keeps it (``Expectation.from_dict`` reads it back)."""
    return e.to_dict()


def _record(store: ResultsStore, unit: Unit, result: dict[str, Any]) -> None:
    records = [RoundRecord.from_dict(r) for r in result["records"]]
    if unit.baseline:
        baseline = records
    else:
        b = store.baseline_of(unit.run_key)
        baseline = [RoundRecord.from_dict(r) for r in b["rounds"]] if b else None
    from ..report.applicable import workload_is_language_model

    from ..scenario import WorkloadSpec

    name = unit.doc.get("workload", {}).get("name", WorkloadSpec().name)  # the scenario's default when unset
    metrics = summarize(records, baseline, target_accuracy=unit.target_accuracy,
                        last_k=int(unit.doc.get("federation", {}).get("last_k", 1)),
                        is_language_model=workload_is_language_model(name) if isinstance(name, str) else None,
                        **durability_params(unit.doc))
    store.put_run(
        run_key=unit.run_key,
        baseline=unit.baseline,
        cell_id=unit.cell_id,
        attack=unit.attack,
        defense=unit.defense,
        settings=unit.settings,
        replicate=unit.replicate,
        seed=unit.seed,
        scenario_digest=unit.run_key,
        metrics=metrics,
        rounds=result["records"],
        versions=result["versions"],
        wall_time_s=result["wall_time_s"],
    )

