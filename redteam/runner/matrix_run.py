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
  (``--ray-address``); needs the optional extra ``redteam[ray]``.
"""

from __future__ import annotations

import copy
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import InvalidParameter, InvalidScenario, RedteamError
from ..matrix import Matrix, derive_seed
from ..scenario import parse_scenario
from ..scoring import summarize
from ..types import RoundRecord
from .store import PlanRow, ResultsStore, StoreError

__all__ = ["Unit", "plan_units", "run_matrix", "execute_unit", "EXECUTORS", "MatrixSummary"]

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


def plan_units(matrix: Matrix, scenario_seed: int, file: str) -> tuple[list[PlanRow], list[Unit], list[Unit]]:
    """The plan rows, the distinct baseline units and the distinct attacked units."""
    rows: list[PlanRow] = []
    baselines: dict[str, Unit] = {}
    attacked: dict[str, Unit] = {}
    for pos, cell in enumerate(matrix.cells):
        for rep in matrix.seeds:
            seed = derive_seed(scenario_seed, cell.settings, rep)
            doc = copy.deepcopy(dict(cell.doc))
            doc.setdefault("scenario", {})
            doc["scenario"] = {**doc["scenario"], "seed": seed}
            bdoc = copy.deepcopy(doc)
            bdoc["attack"] = {"name": "none"}
            sc = parse_scenario(doc, file=file)
            bsc = parse_scenario(bdoc, file=file)
            key, bkey = sc.digest(), bsc.digest()
            tgt = sc.federation.target_accuracy
            rows.append(PlanRow(cell.id, rep, cell.attack, cell.defense, cell.settings_dict, seed, key, bkey, pos))
            baselines.setdefault(
                bkey, Unit(bkey, True, f"{cell.defense}[none]", "none", cell.defense, cell.settings_dict, rep, seed,
                           bdoc, tgt, file)
            )
            if key != bkey:
                attacked.setdefault(
                    key, Unit(key, False, cell.id, cell.attack, cell.defense, cell.settings_dict, rep, seed, doc, tgt,
                           file)
                )
    return rows, list(baselines.values()), list(attacked.values())


def execute_unit(doc: dict[str, Any], device: str = "cpu", threads: str | int | None = None,
                 where: str = "<cell>", parallel_runs: int = 1) -> dict[str, Any]:
    """Run one concrete scenario document; return its round records (as dicts). A plugin
    parameter error is re-raised naming ``where`` (file and matrix cell) and the section.
    ``threads`` is the thread policy (:mod:`.threads`: ``"auto"``, an integer, or ``None`` for
    the default), ``parallel_runs`` how many runs share this machine's cores."""
    from ..federation.loop import Federation
    from .single import _versions, plugin_errors_located
    from .threads import run_threads

    sc = parse_scenario(doc, file="<cell>")
    t = time.perf_counter()
    with plugin_errors_located(sc, where):
        fed = Federation(sc, device=device)
        with run_threads(fed, threads, parallel_runs):
            res = fed.run()
    return {
        "records": [r.to_dict() for r in res.records],
        "wall_time_s": time.perf_counter() - t,
        "versions": _versions(),
    }


# ------------------------------------------------------------------------ executors


Phases = list[list[Unit]]


def _local(phases: Phases, device: str, workers: int, ray_address: str | None,
           policy: str | int | None = None) -> Iterator[tuple[Unit, dict]]:
    for phase in phases:
        for u in phase:
            yield u, execute_unit(u.doc, device, policy, u.where, 1)


#: How often a process-pool worker checks that its driver is still alive (seconds).
PARENT_CHECK_S = 1.0


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
        pending = {pool.submit(execute_unit, u.doc, device, policy, u.where, workers): u for u in phase}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
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
    if not ray.is_initialized():
        if ray_address:
            ray.init(address=ray_address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        # a cluster's nodes are not this machine: one thread per task there unless told otherwise
        if ray_address and policy in (None, "auto"):
            policy = 1
        task = ray.remote(num_cpus=1)(execute_unit)
        for phase in phases:
            refs = {task.remote(u.doc, device, policy, u.where, workers): u for u in phase}
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1)
                for ref in done:
                    u = refs.pop(ref)
                    yield u, ray.get(ref)
    finally:
        if started:
            ray.shutdown()


_EXEC: dict[str, Callable[..., Iterator[tuple[Unit, dict]]]] = {"local": _local, "process": _process, "ray": _ray}


# ---------------------------------------------------------------------------- driver


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
) -> MatrixSummary:
    """Expand the scenario at ``path``, run what the store at ``out`` lacks, write results.

    ``threads`` is the intra-op thread policy of each run (:mod:`.threads`; ``None``: the
    ``REDTEAM_THREADS`` environment variable, else ``auto``).

    ``on_progress(done, total, label)`` is called before each run starts (label = the
    run) and after each finishes.
    """
    from ..scenario import load_matrix
    from .single import _versions

    from .outputs import check_output_dir

    if executor not in EXECUTORS:
        raise InvalidParameter(f"--executor = {executor!r}: must be one of {', '.join(EXECUTORS)}")
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidParameter(f"--workers = {workers!r}: must be an integer ≥ 1")
    from .threads import default_policy, parse_threads

    threads = default_policy() if threads is None else parse_threads(threads)
    p = Path(path)
    base, matrix, doc = load_matrix(p)
    if not doc:
        raise InvalidScenario(f"{p}: the scenario file is empty (no tables); see README.md, \"Scenario files\"")
    rows, b_units, a_units = plan_units(matrix, base.seed, p.name)
    check_output_dir(out, option="--out")
    if executor != "ray":  # a Ray cluster's workers may have devices this driver lacks
        from ..federation.loop import resolve_device

        resolve_device(device)  # --device cuda without a GPU: an error now, not after the store is made

    store = ResultsStore(out)
    try:
        finished = store.finished_keys()
        planned = {r.run_key for r in rows} | {r.baseline_key for r in rows}
        if finished and not resume:
            raise StoreError(
                f"{store.path} already holds results; pass --resume to continue it, or choose another --out"
            )
        if resume:
            store.check_integrity()  # a damaged run must not count as finished
        store.set_meta(
            scenario_file=str(p),
            scenario_name=base.name,
            scenario_doc=doc,
            scenario_digest=base.digest(),
            versions=_versions(),
            expectations=[_exp_dict(e) for e in matrix.expectations],
            reproduce=f"redteam matrix {shlex.quote(str(p))} --out {shlex.quote(str(out))}",
        )
        store.set_plan(rows)
        todo_b = [u for u in b_units if u.run_key not in finished]
        todo_a = [u for u in a_units if u.run_key not in finished]
        total = len(planned)
        done = len(planned & finished)
        t0 = time.perf_counter()
        computed = 0
        run = _EXEC[executor]

        def report(label: str) -> None:
            if on_progress:
                on_progress(done, total, label)

        phases = [p for p in (todo_b, todo_a) if p]
        if phases:
            report(_label(phases[0][0]))
        for unit, result in run(phases, device, workers, ray_address, threads):
            _record(store, unit, result)
            done += 1
            computed += 1
            report(_label(unit))
        return MatrixSummary(store.path, total, computed, total - computed, time.perf_counter() - t0)
    finally:
        store.close()


def _label(u: Unit) -> str:
    return ("baseline " if u.baseline else "") + u.cell_id + f" seed {u.replicate}"


def _exp_dict(e: Any) -> dict[str, Any]:
    return {"metric": e.metric, "min": e.min, "max": e.max, "attack": e.attack, "defense": e.defense,
            "settings": list(e.settings), "index": e.index}


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
                        is_language_model=workload_is_language_model(name) if isinstance(name, str) else None)
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

