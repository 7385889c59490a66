"""The fixtures of the redteam pytest plugin (``redteam.pytest_plugin`` registers them).

``redteam_registries``, ``redteam_federation``, ``run_cell``, ``attack_vs_all_defenses``,
``redteam_ledger``, ``check_attack``, ``check_defense``: see each docstring and
docs/pytest-plugin.md. Nothing heavy is imported until a fixture is used.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import pytest

from ._pytest_state import _RUNS, _SessionRuns

__all__ = ["SMALL_SCENARIO", "CellMetrics", "DefenseTable", "Registries"]

#: The default scenario of the fixtures: synthetic data, 8 clients (2 malicious), 3 rounds.
SMALL_SCENARIO: dict[str, Any] = {
    "scenario": {"name": "pytest", "seed": 0},
    "workload": {"name": "synthetic", "samples": 800},
    "federation": {"clients": 8, "malicious_fraction": 0.25, "rounds": 3, "local_steps": 5, "partition": "iid"},
}


def _state(request: pytest.FixtureRequest) -> _SessionRuns:
    return request.config.stash[_RUNS]


class Registries(NamedTuple):
    """The three plugin registries (``redteam.registry``)."""

    ATTACKS: Any
    DEFENSES: Any
    WORKLOADS: Any


class CellMetrics(dict):
    """Metrics of one cell, averaged over seeds (``None`` where undefined for every seed);
    ``per_seed`` holds each seed's own metrics."""

    def __init__(self, means: Mapping[str, Any], per_seed: list[dict[str, Any]], label: str) -> None:
        super().__init__(means)
        self.per_seed = per_seed
        self.label = label


class DefenseTable(dict):
    """``defense name → CellMetrics`` for one attack; ``skipped`` maps the defenses that
    could not run with default parameters to the reason."""

    def __init__(self, attack: str) -> None:
        super().__init__()
        self.attack = attack
        self.skipped: dict[str, str] = {}

    def table(self, metrics: Sequence[str] = ("accuracy_drop", "final_accuracy", "recall", "fpr")) -> str:
        rows = [("defense", *metrics)] + [(d, *(_fmt(m.get(k)) for k in metrics)) for d, m in self.items()]
        rows += [(d, f"skipped: {why}") for d, why in self.skipped.items()]
        return "\n".join([f"attack {self.attack}", *_columns(rows, indent="  ")])


class _Registrations:
    """Plugin instances/classes registered at run time by a fixture, undone at teardown."""

    def __init__(self) -> None:
        self.added: list[tuple[Any, str]] = []

    def table(self, obj: Any, registry: Any, what: str) -> dict[str, Any]:
        """A name, table, class or instance → a scenario table ``{"name": ..., **params}``."""
        if isinstance(obj, str):
            return {"name": obj}
        if isinstance(obj, Mapping):
            if "name" not in obj and "pipeline" not in obj:
                raise pytest.UsageError(f"{what} = {obj!r}: a table needs a 'name'")
            return dict(obj)
        cls = obj if isinstance(obj, type) else type(obj)
        params: dict[str, Any] = {}
        if not isinstance(obj, type) and dataclasses.is_dataclass(obj):
            params = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}
        name = next((n for n in registry.names() if _loads_as(registry, n, cls)), None)
        if name is None:
            name = f"{cls.__module__}.{cls.__qualname__}"
            registry.register(name, cls)
            self.added.append((registry, name))
        return {"name": name, **params}

    def undo(self) -> None:
        for registry, name in reversed(self.added):
            registry.unregister(name)
        self.added.clear()


def _loads_as(registry: Any, name: str, cls: type) -> bool:
    try:
        return registry.get(name) is cls
    except Exception:  # a broken third-party plugin is not ours to report here
        return False


def _doc(regs: _Registrations, scenario: Any, attack: Any, defense: Any,
         overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    from .registry import ATTACKS, DEFENSES
    from .scenario import load_document

    if scenario is None:
        doc = copy.deepcopy(SMALL_SCENARIO)
    elif isinstance(scenario, (str, os.PathLike)):
        doc = {k: v for k, v in load_document(scenario).items() if k not in ("matrix", "expect")}
    elif isinstance(scenario, Mapping):
        doc = copy.deepcopy(dict(scenario))
    else:
        raise pytest.UsageError(f"scenario = {scenario!r}: expected a dict, a path or None (the small default)")
    if attack is not None:
        doc["attack"] = regs.table(attack, ATTACKS, "attack")
    if defense is not None:
        if isinstance(defense, (list, tuple)):
            doc["defense"] = {"pipeline": [regs.table(s, DEFENSES, "defense") for s in defense]}
        else:
            doc["defense"] = regs.table(defense, DEFENSES, "defense")
    for path, value in (overrides or {}).items():
        node = doc
        *parents, last = path.split(".")
        if not parents:
            raise pytest.UsageError(f"override {path!r}: expected a key path like 'federation.clients'")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    doc.setdefault("scenario", {})
    return doc


def _label(table: Any) -> str:
    if isinstance(table, Mapping) and "pipeline" in table:
        return "+".join(_label(s) for s in table["pipeline"])
    return table if isinstance(table, str) else str(table.get("name", "?")) if isinstance(table, Mapping) else "?"


def _run_cell(state: _SessionRuns, doc: dict[str, Any], seeds: int | Sequence[int], device: str,
              settings: Mapping[str, Any]) -> CellMetrics:
    from .matrix import replicate_seeds
    from .scenario import baseline_attack, parse_scenario
    from .report.applicable import workload_is_language_model
    from .scoring import summarize

    reps = range(seeds) if isinstance(seeds, int) else seeds
    base_seed = int(doc.get("scenario", {}).get("seed", 0))
    per_seed = []
    for rep in reps:
        d = copy.deepcopy(doc)
        table = d.get("scenario", {})
        d["scenario"] = {**table, **replicate_seeds(base_seed, tuple(settings.items()), rep, table)}
        b = {**copy.deepcopy(d), "attack": baseline_attack(d.get("attack"))}
        sc, bsc = parse_scenario(d, file="<run_cell>"), parse_scenario(b, file="<run_cell>")
        base = state.records(bsc, device)
        rec = base if sc.digest() == bsc.digest() else state.records(sc, device)
        per_seed.append(summarize(rec, base, target_accuracy=sc.federation.target_accuracy,
                                  last_k=sc.federation.last_k,
                                  is_language_model=workload_is_language_model(sc.workload.name),
                                  after_k=sc.window.after_k, lifespan_threshold=sc.window.lifespan_threshold))
    label = f"{_label(doc.get('defense', 'mean'))}[{_label(doc.get('attack', 'none'))}]"
    return CellMetrics(_means(per_seed), per_seed, label)


@pytest.fixture
def redteam_registries() -> Iterator[Registries]:
    """``ATTACKS``, ``DEFENSES``, ``WORKLOADS``; run-time ``register`` calls made during the
    test are undone afterwards."""
    from .registry import ATTACKS, DEFENSES, WORKLOADS

    regs = Registries(ATTACKS, DEFENSES, WORKLOADS)
    saved = [(r, dict(r._extra)) for r in regs]
    yield regs
    for r, extra in saved:
        for name in set(r._extra) | set(extra):
            r.unregister(name)
        for name, cls in extra.items():
            r.register(name, cls)


@pytest.fixture
def redteam_federation(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """A factory ``make(scenario=None, *, attack=None, defense=None, overrides=None,
    device="cpu", run=False)`` → a :class:`~redteam.federation.loop.Federation` (or, with
    ``run=True``, its :class:`~redteam.federation.loop.RunResult`).

    ``scenario``: a scenario dict or file (default :data:`SMALL_SCENARIO`); ``attack`` /
    ``defense``: a registry name, a table, or your own class/instance (registered for the
    test); ``defense`` may be a list (a pipeline); ``overrides``: ``{"federation.rounds": 5}``.
    """
    regs = _Registrations()
    request.addfinalizer(regs.undo)

    def make(scenario: Any = None, *, attack: Any = None, defense: Any = None,
             overrides: Mapping[str, Any] | None = None, device: str = "cpu", run: bool = False) -> Any:
        from .federation.regimes import make_run
        from .scenario import parse_scenario

        sc = parse_scenario(_doc(regs, scenario, attack, defense, overrides), file="<redteam_federation>")
        fed = make_run(sc, device=device)
        return fed.run() if run else fed

    return make


@pytest.fixture
def run_cell(request: pytest.FixtureRequest) -> Callable[..., CellMetrics]:
    """``run_cell(attack, defense="mean", settings=None, *, scenario=None, seeds=1,
    device="cpu")`` → :class:`CellMetrics`: the attacked runs and their no-attack
    baselines (seeds derived as in a matrix; runs cached for the session), metrics averaged
    over seeds. ``settings`` are key paths (``{"federation.malicious_fraction": 0.4}``)."""
    state = _state(request)
    regs = _Registrations()
    request.addfinalizer(regs.undo)

    def run(attack: Any, defense: Any = "mean", settings: Mapping[str, Any] | None = None, *,
            scenario: Any = None, seeds: int | Sequence[int] = 1, device: str = "cpu") -> CellMetrics:
        settings = dict(settings or {})
        doc = _doc(regs, scenario, attack, defense, settings)
        out = _run_cell(state, doc, seeds, device, settings)
        state.python_results.append((_label(doc["attack"]) + _settings_suffix(settings),
                                     _label(doc["defense"]), dict(out)))
        return out

    return run


@pytest.fixture
def attack_vs_all_defenses(request: pytest.FixtureRequest) -> Callable[..., DefenseTable]:
    """``attack_vs_all_defenses(attack, *, defenses=None, scenario=None, settings=None,
    seeds=1, device="cpu")`` → :class:`DefenseTable`: your attack (name, table, class or
    instance) against every registered defense (or those named) that builds with default
    parameters and runs on the scenario; the others are listed in ``.skipped``."""
    from .errors import RedteamError

    state = _state(request)
    regs = _Registrations()
    request.addfinalizer(regs.undo)

    def run(attack: Any, *, defenses: Sequence[str] | None = None, scenario: Any = None,
            settings: Mapping[str, Any] | None = None, seeds: int | Sequence[int] = 1,
            device: str = "cpu") -> DefenseTable:
        from .registry import ATTACKS, DEFENSES

        settings = dict(settings or {})
        atk = regs.table(attack, ATTACKS, "attack")
        out = DefenseTable(_label(atk))
        for name in (DEFENSES.names() if defenses is None else defenses):
            try:
                DEFENSES.create(name)  # a defense with a required parameter raises TypeError here
            except (RedteamError, TypeError) as exc:
                out.skipped[name] = f"no default parameters: {type(exc).__name__}: {exc}"
                continue
            try:
                out[name] = _run_cell(state, _doc(regs, scenario, atk, name, settings), seeds, device, settings)
            except RedteamError as exc:
                out.skipped[name] = f"{type(exc).__name__}: {exc}"
                continue
            state.python_results.append((out.attack + _settings_suffix(settings), name, dict(out[name])))
        return out

    return run


@pytest.fixture
def redteam_ledger(tmp_path: Path) -> Iterator[Any]:
    """A fresh, empty provenance ledger (``provenance.ledger.Ledger``) in ``tmp_path``, with
    a new Ed25519 log key (``ledger.log_public`` verifies its checkpoints)."""
    from provenance.keys import SigningKey
    from provenance.ledger import Ledger

    led = Ledger.init(tmp_path / "redteam-ledger.db", log_key=SigningKey.generate("ed25519"),
                      origin="redteam.pytest/ledger")
    yield led
    led.close()


@pytest.fixture
def check_attack() -> Callable[..., Any]:
    """:func:`redteam.testing.check_attack` (the attack contract kit)."""
    from .testing import check_attack as fn

    return fn


@pytest.fixture
def check_defense() -> Callable[..., Any]:
    """:func:`redteam.testing.check_defense` (the defense contract kit)."""
    from .testing import check_defense as fn

    return fn


# -------------------------------------------------------------------------- helpers


def _means(per_seed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    from .scoring import mean_ci

    keys = dict.fromkeys(k for s in per_seed for k in s)
    out: dict[str, Any] = {}
    for k in keys:
        vals = [s.get(k) for s in per_seed]
        if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in vals):
            out[k] = mean_ci(vals)["mean"]
    return out


def _settings_suffix(settings: Mapping[str, Any]) -> str:
    return "".join(f",{k.rsplit('.', 1)[-1]}={v}" for k, v in settings.items())


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _columns(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max(map(len, rows)))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows]
