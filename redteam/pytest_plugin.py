"""``pytest -m attacks``: scenario expectations as test items, and fixtures for attack tests.

Registered through the ``pytest11`` entry point, so it is active wherever redteam is
installed, and inert unless used: importing it imports neither torch nor the engine,
and collecting a scenario file reads it with ``tomllib`` and checks its structure and
plugin names without instantiating a plugin (no torch either). Parameter validation of
the plugins, and the runs, happen when the first item of a file runs.

What becomes a test item: every matrix cell of a scenario file that at least one
``[[expect]]`` row applies to, named after the cell (``envelope.toml::krum[alie]``) and
marked ``attacks``. Scenario files are the ``*.toml`` files

* under ``scenarios/`` of the rootdir and under the paths the ini option
  ``redteam_scenarios`` names, when pytest walks them; when pytest was given no paths
  (it uses ``testpaths``) those directories are *added* to the collection only if the
  ``-m`` expression names ``attacks`` or ``--redteam`` is given (so a plain ``pytest``
  does not start long matrices, and ``pytest -m attacks`` finds them);
* given explicitly on the command line (``pytest path/to/file.toml``).

An item runs its cell's no-attack baselines and attacked runs for every seed, caching
each run by its key in one results store per scenario file (a session temp directory,
or ``--redteam-out DIR`` to keep and resume them), and checks the expectations on the
metrics averaged over seeds (``over = "interval"``: their 95 % interval). A comparative row
(``better_than`` / ``at_least_as_bad_as``) is an item of its left cell, which also runs the
seeds of the cell it is compared with. A failure shows a table of each expectation (mean,
95 % interval, per-seed values, bound; a comparative row's other cell on the line below)
and the commands that reproduce it. The terminal summary shows the attacks × defenses
table of the session.

Fixtures (defined in :mod:`redteam._pytest_fixtures`, registered here):
``redteam_registries``, ``redteam_federation``, ``run_cell``, ``attack_vs_all_defenses``,
``redteam_ledger``, ``check_attack``, ``check_defense``.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import hashlib
import json
import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import pytest

from ._pytest_fixtures import (  # noqa: F401  (the fixtures: pytest finds them on this module)
    SMALL_SCENARIO,
    CellMetrics,
    DefenseTable,
    Registries,
    _columns,
    _fmt,
    _means,
    attack_vs_all_defenses,
    check_attack,
    check_defense,
    redteam_federation,
    redteam_ledger,
    redteam_registries,
    run_cell,
)
from ._pytest_state import _RUNS, _SessionRuns

if TYPE_CHECKING:
    from .matrix import Cell, Expectation

__all__ = [
    "SMALL_SCENARIO",
    "CanFailItem",
    "CellItem",
    "CellMetrics",
    "DefenseTable",
    "ExpectationFailed",
    "Registries",
    "ScenarioFile",
]

_CONTEXT_METRICS = ("final_accuracy", "accuracy_drop")

#: the environment variable that sets ``--redteam-workers``
WORKERS_ENV = "REDTEAM_PYTEST_WORKERS"
#: the most worker processes the plugin starts unless told otherwise
MAX_DEFAULT_WORKERS = 4


def _test_processes() -> int:
    """How many test processes share this machine's cores (pytest-xdist's ``-n``; 1 without it)."""
    raw = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def _workers(config: pytest.Config) -> int:
    v = config.getoption("redteam_workers", None) or os.environ.get(WORKERS_ENV)
    if v is None:
        cores = os.cpu_count() or 1
        # under pytest-xdist (-n N) the N test processes share the cores: each keeps at least
        # two workers (or one per core, if fewer), so that a scenario file left running alone
        # at the end of the session still uses the machine
        return max(min(2, cores), min(MAX_DEFAULT_WORKERS, cores // _test_processes()))
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise pytest.UsageError(f"--redteam-workers / {WORKERS_ENV} = {v!r}: must be an integer ≥ 1")
    return n


# ------------------------------------------------------------------------------ hooks


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("redteam", "redteam scenario expectations (pytest -m attacks)")
    g.addoption("--redteam", action="store_true", default=False,
                help="add the scenario directories to the collection even without -m attacks")
    g.addoption("--redteam-out", metavar="DIR", default=None,
                help="keep each scenario file's results store under DIR and resume from it in later sessions "
                     "(keys are the concrete scenarios, not the code: delete DIR after changing the engine)")
    g.addoption("--redteam-metric", metavar="METRIC", default=None,
                help="metric of the terminal summary table (default: accuracy_drop; final_bits_per_byte for a "
                     "language-model scenario, in its own unit)")
    g.addoption("--redteam-device", metavar="DEVICE", default="cpu", help="device of the runs (cpu, cuda, auto)")
    g.addoption("--redteam-workers", metavar="N", default=None,
                help="processes that run a scenario cell's seeds side by side (default: env "
                     f"{WORKERS_ENV}, else the machine's cores, at most {MAX_DEFAULT_WORKERS}; 1 = in this process). "
                     "The results do not depend on it")
    parser.addini("redteam_scenarios", type="paths", default=[],
                  help="files or directories of scenario files, besides <rootdir>/scenarios")
    parser.addini("redteam_can_fail", type="linelist", default=[],
                  help="scenario files (globs, matched like redteam_marks; 'true' or '*': every file) that get one "
                       "more item, <file>::can_fail, after their cells: it re-judges every [[expect]] row on the "
                       "stored runs with the attack removed and the defense replaced by mean, and fails on a row "
                       "that holds either way without saying why (redteam.can_fail)")
    parser.addini("redteam_marks", type="linelist", default=[],
                  help="lines 'GLOB: mark [mark ...]': extra marks for the items of matching scenario files "
                       "(matched against the file name and its rootdir-relative path)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "attacks: scenario expectations collected by the redteam pytest plugin (pytest -m attacks)"
    )
    state = _State(config)
    config.stash[_STATE] = state
    config.stash[_RUNS] = state  # what the fixtures use (redteam._pytest_state)
    config.pluginmanager.register(_Relay(state), "redteam-xdist-relay")
    for p in state.roots:
        if p != state.default_root and not p.exists():
            config.issue_config_time_warning(
                pytest.PytestConfigWarning(f"redteam_scenarios: {p} does not exist"), stacklevel=2)
    if config.args_source != pytest.Config.ArgsSource.ARGS and (
        config.getoption("redteam") or re.search(r"\battacks\b", config.getoption("markexpr") or "")
    ):
        config.args.extend(str(p) for p in state.roots if p.exists())


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.close()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> "ScenarioFile | None":
    if file_path.suffix != ".toml":
        return None
    state = parent.config.stash.get(_STATE, None)
    if state is None:
        return None
    p = file_path.resolve()
    # pytest walks a directory once per command-line path inside it (``pytest s/a.toml
    # s/b.toml``): the same parent asking again gets the same node; another parent (the
    # file reached a second way, e.g. testpaths and an added root) gets none.
    known = state.files.get((parent.nodeid, file_path))
    if known is not None:
        return known
    if p in state.seen or not (p in state.explicit or any(p.is_relative_to(r) for r in state.roots)):
        return None
    state.seen.add(p)
    node = state.files[(parent.nodeid, file_path)] = ScenarioFile.from_parent(parent, path=file_path)
    return node


@dataclasses.dataclass
class _Relayed:
    """What the summary shows of a cell that ran in a pytest-xdist worker (its report's
    ``user_properties``), in the controller that prints the summary."""

    file: str
    row: str
    defense: str
    metrics: dict[str, Any]
    status: str


def _plain(v: Any) -> Any:
    """A metric as the xdist channel carries it (numbers, text, None)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


class _Relay:
    """In the controller of a pytest-xdist run, rebuild the summary's rows (cells, stores, the
    can-fail lines) from the reports the workers send; a report of this process has no ``node``
    and is left alone (the items wrote to the state themselves)."""

    def __init__(self, state: "_State") -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if getattr(report, "node", None) is None:
            return
        for key, value in report.user_properties:
            if key == "redteam_outcome" and isinstance(value, dict):
                self.state.outcomes.append(_Relayed(value["file"], value["row"], value["defense"],
                                                    dict(value["metrics"]), value["status"]))
                if value.get("store"):
                    self.state.stores.setdefault(value["file"], Path(value["store"]))
            elif key == "redteam_can_fail" and isinstance(value, dict):
                self.state.can_fail[value["file"]] = list(value["lines"])


def _relay_outcome(item: pytest.Item, outcome: "_Outcome", store: Path | None) -> None:
    """Attach what the summary shows of ``outcome`` to ``item``'s report (for pytest-xdist)."""
    item.user_properties.append(("redteam_outcome", {
        "file": outcome.file, "row": outcome.row, "defense": outcome.defense, "status": outcome.status,
        "metrics": {k: _plain(v) for k, v in outcome.metrics.items()},
        "store": None if store is None else str(store)}))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None or not (state.outcomes or state.python_results):
        return
    chosen = config.getoption("redteam_metric")
    metric = chosen or "accuracy_drop"
    tr = terminalreporter
    tr.write_sep("=", f"redteam: attacks × defenses ({metric})")
    by_file: dict[str, list[_Outcome]] = {}
    for o in state.outcomes:
        by_file.setdefault(o.file, []).append(o)
    for file, outs in by_file.items():
        # a language model's file in bits per byte (its runs carry it; a classifier's never do)
        lm = any(o.metrics.get("final_bits_per_byte") is not None for o in outs)
        metric = chosen or ("final_bits_per_byte" if lm else "accuracy_drop")
        shown = "" if metric == (chosen or "accuracy_drop") else f" [{metric}]"
        tr.write_line(f"{file}{shown}  (✓ every expectation holds, ✗ one fails, ! error)")
        cells = {(o.row, o.defense): _fmt(o.metrics.get(metric)) + " " + {"passed": "✓", "failed": "✗"}.get(
            o.status, "!") for o in outs}
        for line in _grid(cells, [o.row for o in outs], [o.defense for o in outs]):
            tr.write_line("  " + line)
        store = state.stores.get(file)
        if store is not None:
            tr.write_line(f"  results: redteam report {shlex.quote(str(store))}")
        if file in state.can_fail:
            tr.write_line("  can each row fail? (attack → none from the baselines, defense → mean from the mean cell)")
            for line in state.can_fail[file]:
                tr.write_line("    " + line.split("#", 1)[-1])
    metric = chosen or "accuracy_drop"
    if state.python_results:
        tr.write_line("run_cell / attack_vs_all_defenses")
        cells = {(a, d): _fmt(m.get(metric)) for a, d, m in state.python_results}
        for line in _grid(cells, [a for a, _, _ in state.python_results], [d for _, d, _ in state.python_results]):
            tr.write_line("  " + line)


# ---------------------------------------------------------------------- collection


class ScenarioFile(pytest.File):
    """A scenario file; its items are the cells that some ``[[expect]]`` row applies to."""

    def collect(self) -> Iterator["CellItem"]:
        from .matrix import expand
        from .scenario import load_document, parse_scenario

        name = self.path.name
        doc = load_document(self.path)
        if not doc.get("expect"):
            # nothing to check; a file that declares what it needs (a paper-scale literature file)
            # still shows up, as one item skipped with the reason, instead of collecting nothing
            info = doc.get("scenario")
            if isinstance(info, Mapping) and info.get("requires"):
                missing = _unmet(doc, self.path.parent)
                why = "; ".join(missing) if missing else "no [[expect]] row: nothing to check"
                yield UncheckedItem.from_parent(self, name="requires", reason=f"{name}: {why}")
            return
        parse_scenario(doc, file=name, check_plugins=False)
        matrix = expand(doc, name, check_plugins=False)
        _check_names(matrix.cells, name)
        marks = self.config.stash[_STATE].marks_for(self.path, self.config.rootpath)
        unmet: list[str] = []
        checked: dict[str, list[str]] = {}  # cells that share their requirements and workload share the check
        for cell in matrix.cells:
            exps = tuple(e for e in matrix.expectations if e.matches(cell))
            if not exps:
                continue
            item = CellItem.from_parent(self, name=cell.id, cell=cell, expectations=exps, seeds=matrix.seeds)
            for m in ("attacks", *marks):
                item.add_marker(m)
            info = cell.doc.get("scenario")
            what = json.dumps([info.get("requires") if isinstance(info, Mapping) else None, cell.doc.get("workload")],
                              sort_keys=True, default=str)
            if what not in checked:  # [scenario] requires: a dataset, a GPU, a package
                checked[what] = _unmet(cell.doc, self.path.parent)
            missing = checked[what]
            if missing:
                item.unmet = f"{name}: " + "; ".join(missing)
                unmet.append(item.unmet)
            yield item
        if self.config.stash[_STATE].can_fail_for(self.path, self.config.rootpath):
            check = CanFailItem.from_parent(self, name="can_fail")
            for m in ("attacks", *marks):
                check.add_marker(m)
            check.unmet = unmet[0] if unmet else None
            yield check

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        from .errors import RedteamError

        if isinstance(excinfo.value, RedteamError):
            return f"{type(excinfo.value).__name__}: {excinfo.value}"
        return super().repr_failure(excinfo)


class CanFailItem(pytest.Item):
    """``<file>::can_fail``: every row of the file re-judged on the stored runs with its attack
    removed and its defense replaced by ``mean`` (:mod:`redteam.can_fail`); it fails on a row that
    holds either way without saying why. Runs after the file's cells, from their stored runs
    (the cells the rows apply to are run first if they are not stored yet)."""

    unmet: str | None = None

    def runtest(self) -> None:
        from .can_fail import HELD, rejudge, render

        if self.unmet:
            pytest.skip(self.unmet)
        state = self.config.stash[_STATE]
        run = state.file_run(self.path)
        reports = rejudge(run.expectations, run.cells, run.stored_seeds, run.stored_baselines)
        lines = render(reports, self.path.name)
        state.can_fail[state.display(self.path)] = lines
        self.user_properties.append(("redteam_can_fail", {"file": state.display(self.path), "lines": lines}))
        bad = [r for r in reports if r.holds_regardless]
        if bad:
            held = [ln for ln in lines if HELD.upper() in ln]
            raise CanFailError(
                f"{len(bad)} [[expect]] row(s) of {self.path.name} hold with the attack removed or the defense "
                "replaced by mean, so they cannot show what they claim:\n  " + "\n  ".join(held)
                + "\nMake each row one that can fail (pair a bound with a row the attack or defense moves, "
                "compare with the mean cell, or bound another metric), or say why it may hold that way with "
                'can_hold_without_attack = "..." / can_hold_without_defense = "..." on the row.')

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CanFailError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.path.name}::{self.name}"


class CanFailError(AssertionError):
    """Rows of a scenario file that hold with their attack removed or their defense replaced."""


class UncheckedItem(pytest.Item):
    """The one item of a scenario file with ``[scenario] requires`` and no ``[[expect]]`` row:
    it skips, saying what this machine lacks (or that the file has nothing to check)."""

    def __init__(self, *, reason: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.reason = reason
        self.add_marker("attacks")

    def runtest(self) -> None:
        pytest.skip(self.reason)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.path.name}::{self.name}"


def _unmet(doc: Mapping[str, Any], base_dir: str | Path = "") -> list[str]:
    from .requirements import unmet
    from .scenario import resolve_workload_paths

    info = doc.get("scenario")
    requires = info.get("requires", []) if isinstance(info, Mapping) else []
    workload = doc.get("workload")
    params = resolve_workload_paths(workload if isinstance(workload, Mapping) else {}, base_dir)
    return unmet([r for r in requires if isinstance(r, str)] if isinstance(requires, list) else [], params)


def _check_names(cells: Sequence["Cell"], where: str) -> None:
    """Plugin names against the entry points (no plugin is loaded, so no torch)."""
    from .errors import InvalidScenario
    from .registry import ATTACKS, DEFENSES, WORKLOADS

    known = {r.kind: r.names() for r in (ATTACKS, DEFENSES, WORKLOADS)}

    def check(table: Any, path: str, kind: str, cell: "Cell") -> None:
        name = table if isinstance(table, str) else table.get("name") if isinstance(table, Mapping) else None
        if kind == "defense" and isinstance(name, str) and name.startswith("flower:") and "flower" in cell.doc:
            return  # one of Flower's own strategies, checked with the scenario's [flower] section
        if isinstance(name, str) and name not in known[kind]:
            close = difflib.get_close_matches(name, known[kind], n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise InvalidScenario(f"{where}: {path}.name = {name!r}: unknown {kind}{hint} "
                                  f"(known: {', '.join(known[kind])}) (in matrix cell {cell.id})")

    for cell in cells:
        d = cell.doc
        check(d.get("workload"), "[workload]", "workload", cell)
        check(d.get("attack"), "[attack]", "attack", cell)
        dfn = d.get("defense")
        stages = dfn["pipeline"] if isinstance(dfn, Mapping) and isinstance(dfn.get("pipeline"), list) else [dfn]
        for i, s in enumerate(stages):
            check(s, "[defense]" if len(stages) == 1 and stages[0] is dfn else f"[defense].pipeline[{i}]",
                  "defense", cell)
        h = d.get("hierarchy")
        if isinstance(h, Mapping):
            check(h.get("upper_defense"), "[hierarchy].upper_defense", "defense", cell)


# ----------------------------------------------------------------------- the items


class ExpectationFailed(AssertionError):
    """A cell's metrics (means over seeds) broke at least one of its expectations."""

    def __init__(self, outcome: "_Outcome") -> None:
        super().__init__("; ".join(outcome.failures))
        self.outcome = outcome


class CellItem(pytest.Item):
    """One matrix cell with the expectations that apply to it; runs all its seeds."""

    def __init__(self, *, cell: "Cell", expectations: tuple["Expectation", ...], seeds: tuple[int, ...],
                 **kw: Any) -> None:
        super().__init__(**kw)
        self.cell = cell
        self.expectations = expectations
        self.seeds = seeds
        self.outcome: _Outcome | None = None
        self.unmet: str | None = None  # what [scenario] requires that this machine lacks

    def runtest(self) -> None:
        if self.unmet:
            pytest.skip(self.unmet)
        state = self.config.stash[_STATE]
        try:
            outcome = state.file_run(self.path).run_cell(self.cell, self.expectations)
        except Exception:
            self._keep(state, _Outcome(state.display(self.path), self.cell, {}, [], [], [], "error"))
            raise
        self.outcome = outcome
        if outcome.failures:
            outcome.status = "failed"
        self._keep(state, outcome)
        if outcome.failures:
            raise ExpectationFailed(outcome)

    def _keep(self, state: "_State", outcome: "_Outcome") -> None:
        """The outcome into this session's summary, and onto the report for an xdist controller."""
        state.outcomes.append(outcome)
        _relay_outcome(self, outcome, state.stores.get(outcome.file))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        from .errors import RedteamError

        exc = excinfo.value
        if isinstance(exc, ExpectationFailed):
            return exc.outcome.render() + "\n" + self.reproduce()
        if isinstance(exc, RedteamError):  # nothing ran (a bad file or plugin parameter): nothing is stored
            return f"{type(exc).__name__}: {exc}\n\n" + self.reproduce(stored=False)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.path.name}::{self.name}"

    def reproduce(self, stored: bool = True) -> str:
        """The commands that rerun this cell, and the whole matrix with a report
        (``stored``: whether this cell's runs reached the store)."""
        state = self.config.stash[_STATE]
        here = self.config.invocation_params.dir
        try:
            rel = os.path.relpath(self.path, here)
        except ValueError:  # another drive
            rel = str(self.path)
        store = state.stores.get(state.display(self.path)) or state.store_dir(self.path)
        q = shlex.quote
        why = "# this cell's runs are in the store already" if stored else "# once the error above is fixed"
        return ("reproduce:\n"
                f"  pytest {q(f'{rel}::{self.name}')}\n"
                f"  redteam matrix {q(rel)} --out {q(str(store))} --resume   {why}\n"
                f"  redteam report {q(str(store))}")


@dataclasses.dataclass
class _Outcome:
    file: str
    cell: "Cell"
    metrics: dict[str, Any]  # means over seeds
    per_seed: list[dict[str, Any]]
    # (expectation, mean_ci, why not, for a comparative row its other cell: (cell, mean_ci, per-seed metrics))
    checks: list[tuple["Expectation", dict[str, Any], str | None, "_Other | None"]]
    failures: list[str]
    status: str = "passed"

    @property
    def defense(self) -> str:
        return self.cell.defense

    @property
    def row(self) -> str:
        s = self.cell.id
        return s[len(self.cell.defense) + 1:-1]  # "alie" or "alie,malicious_fraction=0.2"

    def render(self) -> str:
        n = len(self.per_seed)
        head = (f"{self.cell.id} in {self.file}: {len(self.failures)} of {len(self.checks)} expectation(s) "
                f"failed; metrics are means over {n} seed{'s' if n != 1 else ''}:")
        rows = [("metric", "mean", "95% CI", "per seed", "bound", "")]
        shown = set()
        for e, ci, why, other in self.checks:
            bound = e.bound(None if other is None else other[0].id)
            rows.append(self._row(e.metric, ci, bound, "ok" if why is None else "FAIL"))
            if other is not None:  # the cell it is compared with, indented under it
                rows.append(self._row(e.metric, other[1], "", "", per_seed=other[2], label=f"  {other[0].id}"))
            shown.add(e.metric)
        for m in _CONTEXT_METRICS:
            if m not in shown and m in self.metrics:
                from .scoring import mean_ci, metric_range

                rows.append(self._row(m, mean_ci([s.get(m) for s in self.per_seed], bounds=metric_range(m)), "", ""))
        return "\n".join([*self.failures, "", head, *_columns(rows, indent="  ")]) + "\n"

    def _row(self, metric: str, ci: Mapping[str, Any], bound: str, verdict: str, *,
             per_seed: Sequence[Mapping[str, Any]] | None = None, label: str | None = None) -> tuple[str, ...]:
        interval = f"[{_fmt(ci['lo'])}, {_fmt(ci['hi'])}]" if ci.get("n", 0) > 1 else ""
        seeds = ", ".join(_fmt(s.get(metric)) for s in (self.per_seed if per_seed is None else per_seed))
        return label or metric, _fmt(ci["mean"]), interval, seeds, bound, verdict


#: A comparative row's other cell in an outcome: (cell, its mean_ci of the row's metric, its per-seed metrics).
_Other = tuple["Cell", dict[str, Any], list[dict[str, Any]]]


# ------------------------------------------------------------------- session state


class _FileRun:
    """One scenario file's validated matrix, run plan and results store."""

    def __init__(self, path: Path, display: str, out: Path, device: str,
                 execute: "Any | None" = None) -> None:
        from .runner.matrix_run import _exp_dict, plan_units, scenario_source
        from .runner.single import _versions
        from .runner.store import ResultsStore
        from .matrix import load_matrix

        base, matrix, doc = load_matrix(path)  # full validation: plugins are instantiated here
        rows, b_units, a_units = plan_units(matrix, base.seed, path.name, base_dir=path.parent,
                                            warmup_dir=Path(out) / "warmups")
        self.device = device
        self.execute = execute  # units → results, side by side (None: one after the other, here)
        self.rows: dict[str, list[Any]] = {}
        for r in rows:
            self.rows.setdefault(r.cell_id, []).append(r)
        self.units = {u.run_key: u for u in (*b_units, *a_units)}
        self.store = ResultsStore(out)
        self.store.set_meta(scenario_file=str(path), scenario_name=base.name, scenario_doc=doc,
                            scenario_digest=base.digest(), scenario_source=scenario_source(path),
                            versions=_versions(),
                            expectations=[_exp_dict(e) for e in matrix.expectations],
                            reproduce=f"redteam matrix {path} --out {out} --resume")
        self.store.set_plan(rows)
        self.file = display
        self.cells = matrix.cells
        self.expectations = matrix.expectations

    def seeds_of(self, cell: "Cell") -> list[dict[str, Any]]:
        """The per-seed metrics of ``cell``: its runs (and baselines) from the store, run first if missing."""
        from .runner.matrix_run import _record, execute_unit

        rows = self.rows[cell.id]
        finished = self.store.finished_keys()
        need = {k: self.units[k] for r in rows for k in (r.baseline_key, r.run_key) if k not in finished}
        for phase in (True, False):  # baselines first: an attacked run's warm-up and metrics read them
            units = [u for u in need.values() if u.baseline is phase]
            if self.execute is not None and len(units) > 1:
                for unit, result in zip(units, self.execute(units, self.device)):
                    _record(self.store, unit, result)
            else:  # in this test process, which shares the cores with the session's others
                for unit in units:
                    _record(self.store, unit, execute_unit(unit.doc, self.device, parallel_runs=_test_processes()))
        return [self.store.run(r.run_key)["metrics"] for r in rows]

    def _needed(self, cell: "Cell") -> bool:
        """Whether some row applies to ``cell`` or compares with it (its runs are the rows' to run)."""
        return any(e.matches(cell) or (e.comparative and any(e.partner(c, self.cells) is cell
                                                             for c in self.cells if e.matches(c)))
                   for e in self.expectations)

    def stored_seeds(self, cell: "Cell") -> list[dict[str, Any]] | None:
        """``cell``'s per-seed metrics: run first if a row needs the cell, else from the store only
        (None: not all there)."""
        if self._needed(cell):
            return self.seeds_of(cell)
        finished = self.store.finished_keys()
        rows = self.rows[cell.id]
        if any(r.run_key not in finished for r in rows):
            return None
        return [self.store.run(r.run_key)["metrics"] for r in rows]

    def stored_baselines(self, cell: "Cell") -> list[dict[str, Any]] | None:
        """The per-seed metrics of ``cell``'s no-attack baselines (run first if a row needs the cell)."""
        if self._needed(cell):
            self.seeds_of(cell)
        finished = self.store.finished_keys()
        rows = self.rows[cell.id]
        if any(r.baseline_key not in finished for r in rows):
            return None
        return [self.store.run(r.baseline_key)["metrics"] for r in rows]

    def run_cell(self, cell: "Cell", expectations: Sequence["Expectation"]) -> _Outcome:
        """Run ``cell``'s seeds, and for each comparative row the seeds of the cell it is
        compared with, and check the expectations."""
        from .matrix import check_cell
        from .scoring import mean_ci, metric_range

        per_seed = self.seeds_of(cell)
        means = _means(per_seed)
        partners: dict[int, tuple[Cell, list[dict[str, Any]]]] = {}
        checks: list[tuple[Expectation, dict[str, Any], str | None, _Other | None]] = []
        for e in expectations:
            ci = mean_ci([s.get(e.metric) for s in per_seed], bounds=metric_range(e.metric))
            if not e.comparative:
                why = e.check(ci["mean"]) if e.over == "mean" else e.judge(ci)
                checks.append((e, ci, why, None))
                continue
            other = e.partner(cell, self.cells)  # exactly one: checked when the file loaded
            if other is None:
                checks.append((e, ci, f"{e.metric}: {cell.id} has no partner cell", None))
                continue
            theirs = self.seeds_of(other)
            partners[e.index] = (other, theirs)
            oci = mean_ci([s.get(e.metric) for s in theirs], bounds=metric_range(e.metric))
            checks.append((e, ci, e.judge(ci, oci, left_id=cell.id, right_id=other.id), (other, oci, theirs)))
        fails = check_cell(cell, means, expectations, per_seed=per_seed, partners=partners)
        return _Outcome(self.file, cell, means, per_seed, checks, fails)

    def close(self) -> None:
        self.store.close()


class _State(_SessionRuns):
    def __init__(self, config: pytest.Config) -> None:
        super().__init__()  # the records memo and the fixtures' rows (``memo``, ``python_results``)
        self.config = config
        self.default_root = (config.rootpath / "scenarios").resolve()
        self.roots = [self.default_root, *(Path(p).resolve() for p in config.getini("redteam_scenarios"))]
        here = config.invocation_params.dir
        self.explicit = set()
        if config.args_source == pytest.Config.ArgsSource.ARGS:
            for a in config.args:
                p = a.split("::", 1)[0]
                if p.endswith(".toml"):
                    self.explicit.add((here / p).resolve())
        self.marks = []
        for line in config.getini("redteam_marks"):
            glob, sep, names = line.partition(":")
            if not sep or not names.split():
                raise pytest.UsageError(f"redteam_marks line {line!r}: expected 'GLOB: mark [mark ...]'")
            self.marks.append((glob.strip(), names.split()))
        self.seen: set[Path] = set()
        self.files: dict[tuple[str, Path], ScenarioFile] = {}
        self.runs: dict[Path, _FileRun | BaseException] = {}
        self.stores: dict[str, Path] = {}
        self.outcomes: list[_Outcome] = []
        self.can_fail: dict[str, list[str]] = {}  # file → the can_fail item's lines
        self.workers = _workers(config)
        self._pool: Any = None

    def execute(self, units: Sequence[Any], device: str) -> list[dict[str, Any]]:
        """Run ``units`` side by side in this session's worker processes (started at first use,
        each with one intra-op thread per share of the cores); their results in order."""
        from .runner.matrix_run import execute_unit

        if self._pool is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            from .runner.matrix_run import _init_worker

            threads = max(1, (os.cpu_count() or 1) // self.workers)
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                             initializer=_init_worker, initargs=(threads, os.getpid()))
        futures = [self._pool.submit(execute_unit, u.doc, device, None, u.where, self.workers) for u in units]
        return [f.result() for f in futures]

    def marks_for(self, path: Path, rootpath: Path) -> list[str]:
        rel = path.resolve().relative_to(rootpath.resolve()).as_posix() if path.resolve().is_relative_to(
            rootpath.resolve()) else path.as_posix()
        return [m for glob, ms in self.marks if fnmatch.fnmatch(path.name, glob) or fnmatch.fnmatch(rel, glob)
                for m in ms]

    def can_fail_for(self, path: Path, rootpath: Path) -> bool:
        """Whether ``path`` gets a ``can_fail`` item (ini ``redteam_can_fail``)."""
        globs = [g.strip() for g in self.config.getini("redteam_can_fail") if g.strip()]
        if not globs or globs == ["false"]:
            return False
        if "true" in globs:
            return True
        rel = path.resolve().relative_to(rootpath.resolve()).as_posix() if path.resolve().is_relative_to(
            rootpath.resolve()) else path.as_posix()
        return any(fnmatch.fnmatch(path.name, g) or fnmatch.fnmatch(rel, g) for g in globs)

    def display(self, path: Path) -> str:
        """A scenario file as the summary names it: relative to the rootdir where possible."""
        p, root = path.resolve(), self.config.rootpath.resolve()
        return p.relative_to(root).as_posix() if p.is_relative_to(root) else str(p)

    def store_dir(self, path: Path) -> Path:
        tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
        out = self.config.getoption("redteam_out")
        if out:
            return Path(out).resolve() / f"{path.stem}-{tag}"
        factory = getattr(self.config, "_tmp_path_factory", None)
        if factory is not None:
            return factory.mktemp(f"redteam-{path.stem}")
        return Path(tempfile.mkdtemp(prefix=f"redteam-{path.stem}-"))

    def file_run(self, path: Path) -> _FileRun:
        key = path.resolve()
        if key not in self.runs:
            out = self.store_dir(path)
            self.stores[self.display(path)] = out
            try:
                self.runs[key] = _FileRun(path, self.display(path), out, self.config.getoption("redteam_device"),
                                          self.execute if self.workers > 1 else None)
            except Exception as exc:  # remembered: every item of the file fails with it, fast
                self.runs[key] = exc
        run = self.runs[key]
        if isinstance(run, BaseException):
            raise run
        return run

    def close(self) -> None:
        for run in self.runs.values():
            if isinstance(run, _FileRun):
                run.close()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


_STATE = pytest.StashKey[_State]()


# -------------------------------------------------------------------------- helpers


def _grid(cells: Mapping[tuple[str, str], str], rows: Sequence[str], cols: Sequence[str]) -> list[str]:
    """Attacks as rows, defenses as columns; transposed when there are many more defenses."""
    rs, cs = list(dict.fromkeys(rows)), list(dict.fromkeys(cols))
    if len(cs) > max(6, len(rs)):
        table = [("defense \\ attack", *rs)] + [(c, *(cells.get((r, c), "") for r in rs)) for c in cs]
    else:
        table = [("attack \\ defense", *cs)] + [(r, *(cells.get((r, c), "") for c in cs)) for r in rs]
    return _columns(table)
