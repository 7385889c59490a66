"""Scenario matrices: ``[matrix]`` axes expand a scenario into cells; ``[[expect]]`` rows
state what must hold for them.

::

    [matrix]
    attacks  = ["sign_flip", { name = "alie", z = "paper" }]
    defenses = ["mean", { name = "krum", f = 4 }, { label = "nb+median",
                pipeline = [{ name = "norm_bound", bound = 2.0 }, { name = "median" }] }]
    seeds    = 2                               # or an explicit list: [0, 1]
    [matrix.settings]                          # any scalar setting, by its key path
    "federation.malicious_fraction" = [0.1, 0.2]

    [[expect]]
    attack = "alie"            # filters: attack, defense (labels), any setting key
    defense = "krum"
    metric = "accuracy_drop"   # see redteam.scoring.METRICS
    max = 0.05                 # and/or min

A row naming a language-model metric (``final_bits_per_byte``, ``final_perplexity``, their
increases, ``false_trigger_rate``: :data:`redteam.scoring.LANGUAGE_MODEL_METRICS`) is judged
per cell: it is refused when loading the file if any cell it applies to runs a workload
that is not a language model (``input_kind`` other than ``"tokens"``, e.g. ``digits``),
since the number it would check means nothing there; with a ``workload.name`` axis,
narrow the row to the language-model cells (``"workload.name" = "text"``). A workload
whose kind cannot be told (a plugin that does not load) is not refused. The check needs
the workload classes, so it runs with ``check_plugins`` (``redteam matrix``, and the pytest
plugin's first run of the file; collection stays torch-free).

A **cell** is one (attack, defense, settings) combination; it runs once per seed
(replicate). A cell's seed is derived from the scenario seed, its settings and the
replicate index — not from its attack or defense — so every attack and defense of the
same settings sees the same data, the same initial model and the same network, the
no-attack baseline is shared by all attacks under one defense, and adding a cell
changes no other cell.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .errors import InvalidScenario
from .scenario_limits import Limits, shown

__all__ = ["Cell", "Expectation", "Matrix", "expand", "derive_seed", "parse_expectations"]


@dataclass(frozen=True, slots=True)
class Cell:
    """One (attack, defense, settings) combination, with its concrete scenario per seed."""

    attack: str  # label
    defense: str  # label
    settings: tuple[tuple[str, Any], ...]
    doc: Mapping[str, Any] = field(compare=False, hash=False, repr=False)  # raw TOML-like dict

    @property
    def id(self) -> str:
        """``krum[alie]`` or ``krum[alie,malicious_fraction=0.2]``."""
        parts = [self.attack] + [f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in self.settings]
        return f"{self.defense}[{','.join(parts)}]"

    @property
    def settings_dict(self) -> dict[str, Any]:
        return dict(self.settings)

    def baseline_key(self) -> str:
        """Runs sharing this key share one no-attack baseline per seed."""
        return f"{self.defense}|{json.dumps(self.settings, sort_keys=True)}"


@dataclass(frozen=True, slots=True)
class Expectation:
    metric: str
    min: float | None = None
    max: float | None = None
    attack: str | None = None
    defense: str | None = None
    settings: tuple[tuple[str, Any], ...] = ()
    index: int = 0

    def matches(self, cell: Cell) -> bool:
        if self.attack is not None and self.attack != cell.attack:
            return False
        if self.defense is not None and self.defense != cell.defense:
            return False
        cs = cell.settings_dict
        for k, v in self.settings:
            key = _resolve_setting(k, cs)
            if key is None or cs[key] != v:
                return False
        return True

    def check(self, value: float | None) -> str | None:
        """None if the expectation holds for ``value``; else why not."""
        if value is None:
            return f"{self.metric} is undefined (null) for this cell"
        if value != value:  # NaN compares false with every bound: fail closed
            return f"{self.metric} is NaN for this cell"
        if self.min is not None and value < self.min:
            return f"{self.metric} = {value:.4g} < min {self.min:g}"
        if self.max is not None and value > self.max:
            return f"{self.metric} = {value:.4g} > max {self.max:g}"
        return None

    def describe(self) -> str:
        bounds = []
        if self.min is not None:
            bounds.append(f"≥ {self.min:g}")
        if self.max is not None:
            bounds.append(f"≤ {self.max:g}")
        return f"{self.metric} {' and '.join(bounds)}"


@dataclass(frozen=True, slots=True)
class Matrix:
    cells: tuple[Cell, ...]
    seeds: tuple[int, ...]
    expectations: tuple[Expectation, ...]

    def __len__(self) -> int:
        return len(self.cells)


def _short(v: Any) -> str:
    return json.dumps(v) if isinstance(v, str) and not v.isidentifier() else str(v)


def _resolve_setting(key: str, settings: Mapping[str, Any]) -> str | None:
    if key in settings:
        return key
    hits = [k for k in settings if k.rsplit(".", 1)[-1] == key]
    return hits[0] if len(hits) == 1 else None


def derive_seed(scenario_seed: int, settings: Sequence[tuple[str, Any]], replicate: int) -> int:
    """A 63-bit seed from the scenario seed, the cell's settings and the replicate index."""
    blob = json.dumps([scenario_seed, sorted(settings), replicate], sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big") >> 1


def _entry_label(entry: Any, kind: str, where: str, i: int) -> tuple[str, dict[str, Any]]:
    """A matrix entry (name or table) → (label, scenario table for [attack]/[defense])."""
    if isinstance(entry, str):
        return entry, {"name": entry}
    if not isinstance(entry, Mapping):
        raise InvalidScenario(f"{where}: [matrix].{kind}[{i}] = {shown(entry)}: must be a name or a table")
    table = dict(entry)
    label = table.pop("label", None)
    if label is not None and not isinstance(label, str):
        raise InvalidScenario(f"{where}: [matrix].{kind}[{i}].label = {shown(label)}: must be a string")
    if "pipeline" in table:
        stages = table["pipeline"]
        if not isinstance(stages, list) or not stages or not all(
            isinstance(st, Mapping) and isinstance(st.get("name"), str) for st in stages
        ):
            raise InvalidScenario(
                f"{where}: [matrix].{kind}[{i}].pipeline = {shown(stages)}: must be a non-empty list of tables "
                "with a string 'name'"
            )
        if label is None:
            names = [s.get("name", "?") if isinstance(s, Mapping) else str(s) for s in table["pipeline"] or []]
            label = "+".join(names)
        return label, table
    if "name" not in table:
        raise InvalidScenario(f"{where}: [matrix].{kind}[{i}] needs a 'name' (or, for defenses, a 'pipeline')")
    if not isinstance(table["name"], str):
        raise InvalidScenario(f"{where}: [matrix].{kind}[{i}].name = {shown(table['name'])}: must be a string")
    if label is None:
        params = {k: v for k, v in table.items() if k != "name"}
        label = table["name"] if not params else table["name"] + "(" + ",".join(
            f"{k}={_short(v)}" for k, v in sorted(params.items())) + ")"
    return label, table


def _set_path(doc: dict[str, Any], path: str, value: Any, where: str = "<scenario>") -> None:
    parts = path.split(".")
    node = doc
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise InvalidScenario(f"{where}: [matrix].settings key {shown(path)}: {p!r} is not a table in the scenario")
    node[parts[-1]] = value


def expand(
    doc: Mapping[str, Any], where: str, *, check_plugins: bool = True, limits: Limits | None = None
) -> Matrix:
    """Expand a raw scenario document with ``[matrix]`` into cells (validated later).

    ``check_plugins=False`` checks the structure only (no plugin is instantiated, so
    nothing imports torch): what the pytest plugin does at collection time. The number
    of cells and of seeds is checked against ``limits`` (default: ``Limits.from_env()``)
    from the axis lengths, before any cell is built.
    """
    from .scenario import parse_scenario

    limits = limits if limits is not None else Limits.from_env()
    base = {k: copy.deepcopy(v) for k, v in doc.items() if k not in ("matrix", "expect", "include")}
    mx = doc.get("matrix", {})
    if not isinstance(mx, Mapping):
        raise InvalidScenario(f"{where}: [matrix] must be a table")
    allowed = ("attacks", "defenses", "seeds", "settings")
    for k in mx:
        if k not in allowed:
            raise InvalidScenario(f"{where}: [matrix] has unknown key {k!r} (allowed: {', '.join(allowed)})")

    def axis(key: str, fallback: Any) -> list[tuple[str, dict[str, Any]]]:
        entries = mx.get(key)
        if entries is None:
            return [fallback]
        if not isinstance(entries, list) or not entries:
            raise InvalidScenario(f"{where}: [matrix].{key} = {entries!r}: must be a non-empty list")
        out = [_entry_label(e, key, where, i) for i, e in enumerate(entries)]
        labels = [lbl for lbl, _ in out]
        dup = sorted({lbl for lbl in labels if labels.count(lbl) > 1})
        if dup:
            raise InvalidScenario(f"{where}: [matrix].{key} has duplicate labels {dup}; give each a 'label'")
        return out

    def plain(table: Any, kind: str) -> tuple[str, dict[str, Any]]:
        # without a matrix axis the scenario's own slot is the single entry, labelled by name
        _, tab = _entry_label(table, kind, where, 0)
        if "pipeline" in tab:
            return _entry_label(table, kind, where, 0)
        return tab["name"], tab

    attacks = axis("attacks", plain(base.get("attack", {"name": "none"}), "attack"))
    defenses = axis("defenses", plain(base.get("defense", {"name": "mean"}), "defense"))

    seeds_spec = mx.get("seeds", 1)
    if isinstance(seeds_spec, bool) or not (
        (isinstance(seeds_spec, int) and seeds_spec >= 1)
        or (isinstance(seeds_spec, list) and seeds_spec and all(isinstance(s, int) and s >= 0 for s in seeds_spec))
    ):
        raise InvalidScenario(
            f"{where}: [matrix].seeds = {shown(seeds_spec)}: must be a count ≥ 1 or a list of replicate indices ≥ 0"
        )
    n_seeds = seeds_spec if isinstance(seeds_spec, int) else len(seeds_spec)
    if n_seeds > limits.max_seeds:
        raise InvalidScenario(
            f"{where}: [matrix].seeds = {shown(seeds_spec)}: {n_seeds} replicates, more than the cap of "
            f"{limits.max_seeds} (REDTEAM_MAX_SEEDS raises it)"
        )
    seeds = tuple(range(seeds_spec)) if isinstance(seeds_spec, int) else tuple(seeds_spec)

    settings_tab = mx.get("settings", {})
    if not isinstance(settings_tab, Mapping):
        raise InvalidScenario(f"{where}: [matrix].settings must be a table of key path = [values]")
    axes: list[tuple[str, list[Any]]] = []
    for path, values in settings_tab.items():
        if not isinstance(values, list) or not values:
            raise InvalidScenario(f"{where}: [matrix].settings.{path!r} = {shown(values)}: must be a non-empty list")
        if any(isinstance(v, (dict, list)) for v in values):
            raise InvalidScenario(f"{where}: [matrix].settings.{path!r}: values must be scalars")
        if "." not in path:
            raise InvalidScenario(
                f"{where}: [matrix].settings key {path!r}: must be a key path like 'federation.malicious_fraction'"
            )
        axes.append((path, values))

    n_cells = len(attacks) * len(defenses)
    for _, vals in axes:
        n_cells *= len(vals)
    if n_cells > limits.max_cells:
        sizes = " × ".join(str(x) for x in (len(attacks), len(defenses), *(len(v) for _, v in axes)))
        raise InvalidScenario(
            f"{where}: [matrix] expands to {sizes} = {n_cells} cells, more than the cap of {limits.max_cells} "
            "(REDTEAM_MAX_CELLS raises it)"
        )
    cells: list[Cell] = []
    combos = list(itertools.product(*[[(p, v) for v in vals] for p, vals in axes])) or [()]
    for combo in combos:
        for di, (d_label, d_table) in enumerate(defenses):
            for ai, (a_label, a_table) in enumerate(attacks):
                cdoc = copy.deepcopy(base)
                cdoc["attack"] = copy.deepcopy(a_table)
                cdoc["defense"] = copy.deepcopy(d_table)
                for path, value in combo:  # after the axes, so "attack.x" / "defense.x" sweep too
                    _set_path(cdoc, path, value, where)
                cell = Cell(a_label, d_label, tuple(combo), cdoc)
                try:
                    parse_scenario(cdoc, file=where, check_plugins=check_plugins, limits=limits)
                except InvalidScenario as exc:
                    text = str(exc)  # an error in a [matrix] entry is labelled with that entry
                    for sec, entry in ((f"{where}: [attack]", f"{where}: [matrix].attacks[{ai}]"),
                                       (f"{where}: [defense]", f"{where}: [matrix].defenses[{di}]")):
                        if text.startswith(sec):
                            text = entry + text[len(sec):]
                    raise InvalidScenario(f"{text} (in matrix cell {cell.id})") from None
                cells.append(cell)
    rows = doc.get("expect", [])
    if isinstance(rows, list) and len(rows) > limits.max_expectations:  # each row is matched against every cell
        raise InvalidScenario(
            f"{where}: [[expect]] has {len(rows)} rows, more than the cap of {limits.max_expectations} "
            "(REDTEAM_MAX_EXPECTATIONS raises it)"
        )
    def kind_of(name: str) -> bool | None:  # imported only when a row names a language-model metric
        from .report.applicable import workload_is_language_model

        return workload_is_language_model(name)

    exps = parse_expectations(rows, where, cells, workload_is_language_model=kind_of if check_plugins else None)
    return Matrix(tuple(cells), seeds, exps)


def _workload_of(cell: Cell) -> Any:
    wl = cell.doc.get("workload")
    if wl is None:
        from .scenario import WorkloadSpec

        return WorkloadSpec().name
    return wl if isinstance(wl, str) else wl.get("name") if isinstance(wl, Mapping) else None


def _refuse_classifier_cells(exp: Expectation, loc: str, cells: Sequence[Cell],
                             is_lm: Callable[[str], bool | None]) -> None:
    """A language-model metric row must not apply to a cell whose workload is known not to be one."""
    for cell in cells:
        if not exp.matches(cell):
            continue
        name = _workload_of(cell)
        if isinstance(name, str) and is_lm(name) is False:
            axis = any(k == "workload.name" for c in cells for k, _ in c.settings)
            hint = ('narrow the row to the language-model cells ("workload.name" = "text") or name another metric'
                    if axis else "name another metric (final_loss, accuracy_drop, rounds_to_target_loss …)")
            raise InvalidScenario(
                f"{loc}: metric = {exp.metric!r} is a language-model metric, but the row applies to cell "
                f"{cell.id} whose workload {name!r} is not a language model (input_kind is not \"tokens\"), "
                f"where it means nothing; {hint}")


def parse_expectations(rows: Any, where: str, cells: Sequence[Cell], *,
                       workload_is_language_model: Callable[[str], bool | None] | None = None,
                       ) -> tuple[Expectation, ...]:
    """The ``[[expect]]`` rows, validated against the cells. ``workload_is_language_model``
    (a workload name → ``True``/``False``/``None`` if unknown), when given, refuses a row
    naming a language-model metric that applies to a cell whose workload is not one."""
    from .scoring import LANGUAGE_MODEL_METRICS, METRICS

    if not isinstance(rows, list):
        raise InvalidScenario(f"{where}: [[expect]] must be an array of tables")
    attacks = {c.attack for c in cells}
    defenses = {c.defense for c in cells}
    setting_keys = {k for c in cells for k, _ in c.settings}
    out = []
    for i, row in enumerate(rows):
        loc = f"{where}: [[expect]] #{i + 1}"
        if not isinstance(row, Mapping):
            raise InvalidScenario(f"{loc}: must be a table")
        row = dict(row)
        for k, v in row.items():
            if not isinstance(v, (str, int, float, bool)):
                raise InvalidScenario(f"{loc}: {k} = {shown(v)}: must be a string, number or boolean")
        metric = row.pop("metric", None)
        if metric is None:  # name a misspelt key ("metirc") rather than "metric = None"
            import difflib

            keys = ["metric", "min", "max", "attack", "defense"]
            stray = [k for k in row if k not in keys and not any(k == s or s.rsplit(".", 1)[-1] == k
                                                                  for s in setting_keys)]
            close = difflib.get_close_matches(stray[0], keys, n=1) if stray else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidScenario(f"{loc}: unknown key {stray[0]!r}{hint}" if stray else f"{loc}: needs 'metric'")
        if metric not in METRICS:
            import difflib

            close = difflib.get_close_matches(str(metric), list(METRICS), n=2)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise InvalidScenario(f"{loc}: metric = {metric!r}: unknown metric{hint} (known: {', '.join(METRICS)})")
        lo, hi = row.pop("min", None), row.pop("max", None)
        for name, v in (("min", lo), ("max", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise InvalidScenario(f"{loc}: {name} = {repr(v)[:60]}: must be a number")
            if v is not None and v != v:  # a nan bound holds for every value: a check that cannot fail
                raise InvalidScenario(f"{loc}: {name} = nan: must be a number, not nan")
        if lo is None and hi is None:
            raise InvalidScenario(f"{loc}: needs 'min' and/or 'max'")
        attack, defense = row.pop("attack", None), row.pop("defense", None)
        if attack is not None and attack not in attacks:
            raise InvalidScenario(f"{loc}: attack = {attack!r} names no matrix attack (have: {', '.join(sorted(attacks))})")
        if defense is not None and defense not in defenses:
            raise InvalidScenario(
                f"{loc}: defense = {defense!r} names no matrix defense (have: {', '.join(sorted(defenses))})"
            )
        settings = []
        for k, v in row.items():
            if not any(k == s or s.rsplit(".", 1)[-1] == k for s in setting_keys):
                raise InvalidScenario(
                    f"{loc}: unknown key {k!r} (filters: attack, defense, or a matrix setting: "
                    f"{', '.join(sorted(setting_keys)) or 'none'})"
                )
            settings.append((k, v))
        exp = Expectation(metric, None if lo is None else float(lo), None if hi is None else float(hi),
                          attack, defense, tuple(settings), i)
        if not any(exp.matches(c) for c in cells):
            raise InvalidScenario(f"{loc}: matches no cell of the matrix")
        if workload_is_language_model is not None and metric in LANGUAGE_MODEL_METRICS:
            _refuse_classifier_cells(exp, loc, cells, workload_is_language_model)
        out.append(exp)
    return tuple(out)


def check_cell(cell: Cell, metrics: Mapping[str, Any], expectations: Sequence[Expectation]) -> list[str]:
    """Failure messages of every expectation that applies to ``cell`` (empty = all hold)."""
    fails = []
    for e in expectations:
        if e.matches(cell):
            why = e.check(metrics.get(e.metric))
            if why is not None:
                fails.append(f"expect #{e.index + 1} ({e.describe()}): {why}")
    return fails


