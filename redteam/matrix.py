"""Scenario matrices: ``[matrix]`` axes expand a scenario into cells; ``[[expect]]`` rows
state what must hold for them.

::

    [matrix]
    attacks  = ["sign_flip", { name = "alie", z = "paper" }]
    defenses = ["mean", { name = "krum", f = 4 }, { label = "nb+median",
                pipeline = [{ name = "norm_bound", bound = 2.0 }, { name = "median" }] }]
    seeds    = 2                               # or an explicit list: [0, 1]
    defender_metric = "cheat_reward_ratio"     # optional: what the defender's summary ranks by
    [matrix.settings]                          # any scalar setting, by its key path
    "federation.malicious_fraction" = [0.1, 0.2]

    [[expect]]
    attack = "alie"            # filters: attack, defense (labels), any setting key
    defense = "krum"
    metric = "accuracy_drop"   # see redteam.scoring.METRICS
    max = 0.05                 # and/or min
    over = "interval"          # optional: the whole 95 % seed interval, not the mean (≥ 2 seeds)

    [[expect]]                 # a comparative row: cc's cell against avg's
    attack = "bit_flip"
    defense = "cc"             # the left cell(s)
    metric = "final_accuracy_last_k"
    better_than = { defense = "avg" }   # the other cell: the row's selectors with these replaced
    by = 0.05                  # margin in the metric's units (default 0; may be negative)

A **comparative row** (``better_than`` or ``at_least_as_bad_as``, a table of the keys that
name the other cell: ``attack``, ``defense``, a setting) compares each cell it matches (the
left) with the one cell that matches the row's selectors with those keys replaced *and*
has the same remaining attack, defense and settings (its partner; a setting selector of
the row applies to both sides unless the table replaces it). "Better" follows the
metric's direction (:func:`redteam.scoring.metric_direction`; a metric without one is
refused): with the seed means, ``better_than`` holds when left − right ≥ ``by`` in the
better direction and ``at_least_as_bad_as`` when left − right ≤ ``by`` (no better than the
other by more than ``by``). With ``over = "interval"`` the intervals must be separated:
``better_than`` needs the left's worse end beyond the right's better end by more than
``by`` (higher is better: left lo > right hi + by), ``at_least_as_bad_as`` the left's better
end within ``by`` of the right's worse end (left hi ≤ right lo + by). A row whose left cells
cannot each be paired with exactly one partner, one-to-one, is refused when the file
loads, as is ``over = "interval"`` with ``seeds = 1``; a seed statistic that is missing
(a null metric, fewer than two seeds with a value for an interval) fails closed.

A row naming a language-model metric (``final_bits_per_byte``, ``final_perplexity``, their
increases, ``false_trigger_rate``, ``near_miss_trigger_rate``: :data:`redteam.scoring.LANGUAGE_MODEL_METRICS`) is judged
per cell: it is refused when loading the file if any cell it applies to runs a workload
that is not a language model (``input_kind`` other than ``"tokens"``, e.g. ``digits``),
since the number it would check means nothing there; with a ``workload.name`` axis,
narrow the row to the language-model cells (``"workload.name" = "text"``). A workload
whose kind cannot be told (a plugin that does not load) is not refused. The check needs
the workload classes, so it runs with ``check_plugins`` (``redteam matrix``, and the pytest
plugin's first run of the file; collection stays torch-free).

``defender_metric`` (optional) names the metric the defender cares about in this scenario
(e.g. ``cheat_reward_ratio`` for a rewarding validator, whose cheats want payment, not
damage): the defender's summary then ranks the defenses by their worst seed mean of it over
the attacks instead of by harm (:mod:`redteam.report.defender`), and the HTML report draws its
heatmap first. It must be a metric of :data:`redteam.scoring.METRICS` with a direction
(:data:`redteam.scoring.HIGHER_IS_BETTER`), which says which end is worst; it changes no run.

A **cell** is one (attack, defense, settings) combination; it runs once per seed
(replicate). A cell's seed is derived from the scenario seed, its settings and the
replicate index — not from its attack or defense — so every attack and defense of the
same settings sees the same data, the same initial model and the same network, the
no-attack baseline is shared by all attacks under one defense, and adding a cell
changes no other cell. A scenario's warm-up (``[scenario] warmup_rounds``) is seeded by the
scenario seed and the replicate alone (:func:`replicate_seeds`): cells whose settings leave the
warm-up unchanged start each replicate from the same pre-trained model.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .errors import InvalidScenario
from .scenario_limits import Limits, shown

__all__ = ["Cell", "Expectation", "Matrix", "expand", "derive_seed", "replicate_seeds", "parse_expectations",
           "defender_metrics", "check_defender_metric", "MATRIX_KEYS"]

#: The keys ``[matrix]`` reads; any other is refused.
MATRIX_KEYS = ("attacks", "defenses", "seeds", "settings", "defender_metric")


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


#: The keys of a comparative row that name the other cell.
COMPARISONS = ("better_than", "at_least_as_bad_as")
#: an [[expect]] row's reasons for holding with its attack removed / its defense replaced by mean
HOLD_KEYS = ("can_hold_without_attack", "can_hold_without_defense")
OVER = ("mean", "interval")


@dataclass(frozen=True, slots=True)
class Expectation:
    """One ``[[expect]]`` row: a bound on a metric (``min``/``max``), or, with ``compare``,
    a comparison of each matching (left) cell with its partner cell (module docstring).

    ``over = "mean"`` judges the seed mean; ``"interval"`` the whole two-sided 95 %
    Student-t interval of the seeds (:func:`redteam.scoring.mean_ci`). ``other`` holds the
    keys of the ``better_than`` / ``at_least_as_bad_as`` table: ``("attack", label)``,
    ``("defense", label)`` or (full setting key path, value)."""

    metric: str
    min: float | None = None
    max: float | None = None
    attack: str | None = None
    defense: str | None = None
    settings: tuple[tuple[str, Any], ...] = ()
    index: int = 0
    over: str = "mean"
    compare: str | None = None  # "better_than" | "at_least_as_bad_as"
    other: tuple[tuple[str, Any], ...] = ()
    by: float = 0.0
    #: why the row may hold with the attack removed / the defense replaced by ``mean``
    #: (``can_hold_without_attack`` / ``can_hold_without_defense``; :mod:`redteam.can_fail`)
    hold_without_attack: str | None = None
    hold_without_defense: str | None = None

    @property
    def comparative(self) -> bool:
        return self.compare is not None

    def matches(self, cell: Cell) -> bool:
        """Whether the row applies to ``cell`` (for a comparative row: as its left cell)."""
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

    # -- comparative rows: the other cell ---------------------------------------------
    def right(self) -> "Expectation":
        """The selector of the other cells: this row's, with the ``other`` keys replaced."""
        o = dict(self.other)
        replaced = [k for k in o if k not in ("attack", "defense")]
        kept = tuple((k, v) for k, v in self.settings
                     if not any(k == r or r.rsplit(".", 1)[-1] == k for r in replaced))
        return Expectation(self.metric, attack=o.get("attack", self.attack), defense=o.get("defense", self.defense),
                           settings=kept + tuple((k, o[k]) for k in replaced), index=self.index)

    def pair_key(self, cell: Cell) -> tuple[Any, ...]:
        """What a left cell and its partner share: everything the ``other`` table does not replace."""
        o = dict(self.other)
        return (None if "attack" in o else cell.attack, None if "defense" in o else cell.defense,
                tuple(sorted(((k, v) for k, v in cell.settings if k not in o), key=lambda kv: kv[0])))

    def partners(self, cell: Cell, cells: Sequence[Cell]) -> list[Cell]:
        """The cells ``cell`` is compared with: they match :meth:`right` and share its :meth:`pair_key`."""
        if not self.comparative:
            return []
        sel, key = self.right(), self.pair_key(cell)
        return [c for c in cells if sel.matches(c) and self.pair_key(c) == key]

    def partner(self, cell: Cell, cells: Sequence[Cell]) -> Cell | None:
        """The one cell ``cell`` is compared with (``None``: none, or not exactly one)."""
        found = self.partners(cell, cells)
        return found[0] if len(found) == 1 else None

    # -- verdicts ---------------------------------------------------------------------
    def check(self, value: float | None) -> str | None:
        """None if the (non-comparative) expectation holds for the seed mean ``value``; else why not."""
        if value is None:
            return f"{self.metric} is undefined (null) for this cell"
        if value != value:  # NaN compares false with every bound: fail closed
            return f"{self.metric} is NaN for this cell"
        if self.min is not None and value < self.min:
            return f"{self.metric} = {value:.4g} < min {self.min:g}"
        if self.max is not None and value > self.max:
            return f"{self.metric} = {value:.4g} > max {self.max:g}"
        return None

    def judge(self, left: Mapping[str, Any] | None, right: Mapping[str, Any] | None = None, *,
              left_id: str = "this cell", right_id: str = "the other cell") -> str | None:
        """None if the row holds; else why not. ``left`` / ``right`` are seed statistics
        ``{"mean", "lo", "hi", "n"}`` (:func:`redteam.scoring.mean_ci`) of the row's cell and,
        for a comparative row, of its partner (``None``: not available — fails closed)."""
        if not self.comparative:
            if self.over == "mean":
                return self.check(None if left is None else left.get("mean"))
            why = self._interval_missing(left, "this cell")
            if why is not None:
                return why
            assert left is not None
            lo, hi = left["lo"], left["hi"]
            if self.min is not None and lo < self.min:
                return (f"{self.metric} 95 % interval {_iv(left)} (n = {left['n']}) reaches below min {self.min:g}"
                        f" (its lower end {lo:.4g} must be ≥ {self.min:g})")
            if self.max is not None and hi > self.max:
                return (f"{self.metric} 95 % interval {_iv(left)} (n = {left['n']}) reaches above max {self.max:g}"
                        f" (its upper end {hi:.4g} must be ≤ {self.max:g})")
            return None
        for stat, cid in ((left, left_id), (right, right_id)):
            if stat is None:
                return f"{self.metric}: {cid} has no results to compare"
            if self.over == "interval":
                why = self._interval_missing(stat, cid)
            else:
                mean = stat.get("mean")
                why = (f"{self.metric} is undefined (null) for {cid}" if mean is None else
                       f"{self.metric} is NaN for {cid}" if mean != mean else None)
            if why is not None:
                return why
        assert left is not None and right is not None
        return self._compare(left, right, left_id, right_id)

    def _interval_missing(self, stat: Mapping[str, Any] | None, cid: str) -> str | None:
        n = 0 if stat is None else int(stat.get("n") or 0)
        if stat is None or stat.get("mean") is None or n < 2:
            return (f"{self.metric}: over = \"interval\" needs values from ≥ 2 seeds; {cid} has {n}, "
                    "so its 95 % interval is undefined")
        if stat.get("lo") is None or stat.get("hi") is None:  # mean_ci: ends past float64's range
            return f"{self.metric}: the 95 % interval of {cid} is undefined ({stat.get('undefined') or 'no ends'})"
        return None

    def _compare(self, left: Mapping[str, Any], right: Mapping[str, Any], left_id: str, right_id: str) -> str | None:
        from .scoring import metric_direction

        s = 1.0 if metric_direction(self.metric) != "lower" else -1.0
        better = self.compare == "better_than"
        if self.over == "mean":
            a, b = left["mean"], right["mean"]
            adv = s * (a - b)
            ok = adv >= self.by if better else adv <= self.by
            if ok:
                return None
            return (f"{self.metric}: {left_id} = {a:.4g} vs {right_id} = {b:.4g}; needs "
                    f"{left_id} {self._op()} {right_id}{self._margin()} (seed means)")
        # the interval: better_than needs the left's worst end past the right's best end by
        # more than `by`; at_least_as_bad_as needs the left's best end within `by` of the right's worst
        if better:
            a, b = (left["lo"], right["hi"]) if s > 0 else (left["hi"], right["lo"])
            ok = s * (a - b) > self.by
            ends = ("lo", "hi") if s > 0 else ("hi", "lo")
            op = ">" if s > 0 else "<"
        else:
            a, b = (left["hi"], right["lo"]) if s > 0 else (left["lo"], right["hi"])
            ok = s * (a - b) <= self.by
            ends = ("hi", "lo") if s > 0 else ("lo", "hi")
            op = "≤" if s > 0 else "≥"
        if ok:
            return None
        return (f"{self.metric}: {left_id} {_ci(left)} vs {right_id} {_ci(right)}; needs {ends[0]} of {left_id} "
                f"{op} {ends[1]} of {right_id}{self._margin()} ({a:.4g} {op} {b:.4g}{self._margin()})")

    def _op(self) -> str:
        from .scoring import metric_direction

        higher = metric_direction(self.metric) != "lower"
        return ("≥" if higher else "≤") if self.compare == "better_than" else ("≤" if higher else "≥")

    def _margin(self) -> str:
        """`` + 0.05`` (higher is better) / `` - 0.05`` (lower), the margin in the better direction."""
        from .scoring import metric_direction

        if self.by == 0:
            return ""
        signed = self.by if metric_direction(self.metric) != "lower" else -self.by
        return f" {'+' if signed > 0 else '-'} {abs(signed):g}"

    def side_labels(self) -> tuple[str, str]:
        """Short names of the two sides of a comparative row: ``("cc", "avg")``."""
        left, right = [], []
        for k, v in self.other:
            if k in ("attack", "defense"):
                mine = self.attack if k == "attack" else self.defense
                left.append("*" if mine is None else str(mine))
                right.append(str(v))
            else:  # a setting: the row's own value of it, if it names one
                short = k.rsplit(".", 1)[-1]
                own = [sv for sk, sv in self.settings if sk in (k, short)]
                left.append(f"{short}={_short(own[0]) if own else '*'}")
                right.append(f"{short}={_short(v)}")
        return ",".join(left), ",".join(right)

    def describe(self) -> str:
        tail = " [interval]" if self.over == "interval" else ""
        if self.comparative:
            lft, rgt = self.side_labels()
            return f"{self.metric}({lft}) {self._op()} {self.metric}({rgt}){self._margin()}{tail}"
        bounds = []
        if self.min is not None:
            bounds.append(f"≥ {self.min:g}")
        if self.max is not None:
            bounds.append(f"≤ {self.max:g}")
        return f"{self.metric} {' and '.join(bounds)}{tail}"

    def bound(self, right_id: str | None = None) -> str:
        """The row without its metric: ``≤ 0.2``, ``≥ avg[ipm] + 0.05 [interval]``."""
        if not self.comparative:
            return self.describe()[len(self.metric) + 1:]
        tail = " [interval]" if self.over == "interval" else ""
        return f"{self._op()} {right_id or self.side_labels()[1]}{self._margin()}{tail}"

    # -- stored form (the results store's meta) ---------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` reads it back (and the dicts of older stores)."""
        d: dict[str, Any] = {"metric": self.metric, "min": self.min, "max": self.max, "attack": self.attack,
                             "defense": self.defense, "settings": [list(s) for s in self.settings],
                             "index": self.index, "over": self.over}
        if self.compare is not None:
            d[self.compare] = dict(self.other)
            d["by"] = self.by
        for key, why in ((HOLD_KEYS[0], self.hold_without_attack), (HOLD_KEYS[1], self.hold_without_defense)):
            if why is not None:
                d[key] = why
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Expectation":
        compare = next((k for k in COMPARISONS if d.get(k) is not None), None)
        other = tuple((str(k), v) for k, v in dict(d[compare]).items()) if compare else ()
        return cls(metric=d["metric"], min=d.get("min"), max=d.get("max"), attack=d.get("attack"),
                   defense=d.get("defense"), settings=tuple((str(s[0]), s[1]) for s in d.get("settings") or ()),
                   index=int(d.get("index", 0)), over=str(d.get("over") or "mean"), compare=compare, other=other,
                   by=float(d.get("by") or 0.0), hold_without_attack=d.get(HOLD_KEYS[0]),
                   hold_without_defense=d.get(HOLD_KEYS[1]))


def _iv(stat: Mapping[str, Any]) -> str:
    return f"[{stat['lo']:.4g}, {stat['hi']:.4g}]"


def _ci(stat: Mapping[str, Any]) -> str:
    """``0.645 [0.61, 0.68]`` (mean and interval)."""
    return f"{stat['mean']:.4g} {_iv(stat)}"


@dataclass(frozen=True, slots=True)
class Matrix:
    cells: tuple[Cell, ...]
    seeds: tuple[int, ...]
    expectations: tuple[Expectation, ...]
    defender_metric: str | None = None  # [matrix] defender_metric: what the defender's summary ranks by

    def __len__(self) -> int:
        return len(self.cells)


def _echo(v: Any, width: int = 60) -> str:
    """A name from the scenario file as an error message quotes it: its repr, cut to ``width``
    characters (a 5,000-character key is not echoed whole)."""
    r = repr(v) if not isinstance(v, str) or len(v) <= 4 * width else repr(v[: 4 * width])
    return r if len(r) <= width else r[: width - 1] + "…"


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


def replicate_seeds(scenario_seed: int, settings: Sequence[tuple[str, Any]], replicate: int,
                    table: Mapping[str, Any]) -> dict[str, int]:
    """The ``[scenario]`` keys a matrix replicate sets in the cell's ``table``: ``seed``
    (:func:`derive_seed` of the scenario seed, the cell's settings and the replicate) and, for a
    scenario with a warm-up whose file does not set one, ``warmup_seed`` from the scenario seed and
    the replicate alone. Cells that differ only in settings the warm-up ignores (where the attacker
    sits, the post-training step size) then start from the same pre-trained model in each
    replicate: the comparison between them is paired, and the warm-up is computed once. Left out
    where it equals ``seed`` (a matrix with no settings), so such runs keep their keys."""
    seed = derive_seed(scenario_seed, settings, replicate)
    out = {"seed": seed}
    if isinstance(table, Mapping) and table.get("warmup_rounds", 0) and table.get("warmup_seed") is None:
        warm = derive_seed(scenario_seed, (), replicate)
        if warm != seed:
            out["warmup_seed"] = warm
    return out


def defender_metrics() -> list[str]:
    """The metrics ``[matrix] defender_metric`` may name: those of :data:`redteam.scoring.METRICS`
    that have a direction (:data:`redteam.scoring.HIGHER_IS_BETTER`), in that table's order; a
    metric with no direction (``bytes_on_wire``, the envelope figures) has no worst case to rank by."""
    from .scoring import HIGHER_IS_BETTER, METRICS

    return [m for m in METRICS if m in HIGHER_IS_BETTER]


def check_defender_metric(value: Any, where: str) -> str:
    """``value`` as a ``[matrix] defender_metric``, or a one-line :class:`InvalidScenario` that
    names the key and lists the valid metrics (with the closest ones first, for a typo)."""
    import difflib

    from .scoring import METRICS

    valid = defender_metrics()
    key = f"{where}: [matrix].defender_metric = {shown(value)}"
    if not isinstance(value, str):
        raise InvalidScenario(f"{key}: must be a metric name (a string); valid: {', '.join(valid)}")
    if value in valid:
        return value
    if value in METRICS:
        raise InvalidScenario(f"{key}: has no direction (neither higher nor lower is better), so no worst case to "
                              f"rank defenses by; valid: {', '.join(valid)}")
    close = difflib.get_close_matches(value.lower(), valid, n=2)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise InvalidScenario(f"{key}: unknown metric{hint} (valid: {', '.join(valid)})")


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
    cap = Limits.from_env().max_label_chars
    if isinstance(label, str) and len(label) > cap:
        raise InvalidScenario(f"{where}: [matrix].{kind}[{i}].label: {len(label)} characters, more than the cap of "
                              f"{cap} (REDTEAM_MAX_LABEL_CHARS raises it)")
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
            raise InvalidScenario(f"{where}: [matrix].settings key {shown(path)}: {_echo(p)} is not a table in the scenario")
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
    from .scenario import inherit_window, parse_scenario

    limits = limits if limits is not None else Limits.from_env()
    base = {k: copy.deepcopy(v) for k, v in doc.items() if k not in ("matrix", "expect", "include")}
    mx = doc.get("matrix", {})
    if not isinstance(mx, Mapping):
        raise InvalidScenario(f"{where}: [matrix] must be a table")
    for k in mx:
        if k not in MATRIX_KEYS:
            raise InvalidScenario(f"{where}: [matrix] has unknown key {_echo(k)} (allowed: {', '.join(MATRIX_KEYS)})")
    defender_metric = check_defender_metric(mx["defender_metric"], where) if "defender_metric" in mx else None

    def axis(key: str, fallback: Any) -> list[tuple[str, dict[str, Any]]]:
        entries = mx.get(key)
        if entries is None:
            return [fallback]
        if not isinstance(entries, list) or not entries:
            raise InvalidScenario(f"{where}: [matrix].{key} = {shown(entries)}: must be a non-empty list")
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
    if isinstance(seeds_spec, list) and len(set(seeds_spec)) != len(seeds_spec):
        dup = sorted({s for s in seeds_spec if seeds_spec.count(s) > 1})
        raise InvalidScenario(f"{where}: [matrix].seeds = {shown(seeds_spec)}: replicate indices must be distinct "
                              f"(repeated: {', '.join(map(str, dup[:5]))}); a repeated index is the same run")
    seeds = tuple(range(seeds_spec)) if isinstance(seeds_spec, int) else tuple(seeds_spec)

    settings_tab = mx.get("settings", {})
    if not isinstance(settings_tab, Mapping):
        raise InvalidScenario(f"{where}: [matrix].settings must be a table of key path = [values]")
    axes: list[tuple[str, list[Any]]] = []
    for path, values in settings_tab.items():
        if not isinstance(values, list) or not values:
            raise InvalidScenario(f"{where}: [matrix].settings.{_echo(path)} = {shown(values)}: must be a non-empty list")
        if any(isinstance(v, (dict, list)) for v in values):
            raise InvalidScenario(f"{where}: [matrix].settings.{_echo(path)}: values must be scalars")
        if "." not in path:
            raise InvalidScenario(
                f"{where}: [matrix].settings key {_echo(path)}: must be a key path like 'federation.malicious_fraction'"
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
                cdoc["attack"] = inherit_window(copy.deepcopy(a_table), base.get("attack"))
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

    exps = parse_expectations(rows, where, cells, workload_is_language_model=kind_of if check_plugins else None,
                              seeds=seeds)
    if defender_metric is not None and check_plugins:
        _refuse_classifier_metric(defender_metric, cells, kind_of, where)
    return Matrix(tuple(cells), seeds, exps, defender_metric)


def _refuse_classifier_metric(metric: str, cells: Sequence[Cell], is_lm: Callable[[str], bool | None],
                              where: str) -> None:
    """A language-model ``defender_metric`` on a matrix with a cell whose workload is known not to be one."""
    from .scoring import LANGUAGE_MODEL_METRICS

    if metric not in LANGUAGE_MODEL_METRICS:
        return
    for cell in cells:
        name = _workload_of(cell)
        if isinstance(name, str) and is_lm(name) is False:
            raise InvalidScenario(
                f"{where}: [matrix].defender_metric = {shown(metric)} is a language-model metric, but cell {cell.id} "
                f"runs workload {_echo(name)}, which is not a language model (input_kind is not \"tokens\"): the "
                "ranking would mean nothing there; name another metric")


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
                f"{loc}: metric = {_echo(exp.metric)} is a language-model metric, but the row applies to cell "
                f"{cell.id} whose workload {_echo(name)} is not a language model (input_kind is not \"tokens\"), "
                f"where it means nothing; {hint}")


def parse_expectations(rows: Any, where: str, cells: Sequence[Cell], *,
                       workload_is_language_model: Callable[[str], bool | None] | None = None,
                       seeds: Sequence[int] | None = None,
                       ) -> tuple[Expectation, ...]:
    """The ``[[expect]]`` rows, validated against the cells. ``workload_is_language_model``
    (a workload name → ``True``/``False``/``None`` if unknown), when given, refuses a row
    naming a language-model metric that applies to a cell whose workload is not one.
    ``seeds`` (the matrix's replicates), when given, refuses ``over = "interval"`` with
    fewer than two. A comparative row (``better_than`` / ``at_least_as_bad_as``) is refused
    unless its metric has a direction and every left cell has exactly one partner cell,
    each partner serving one left cell."""
    from .scoring import LANGUAGE_MODEL_METRICS, METRICS, metric_direction

    if not isinstance(rows, list):
        raise InvalidScenario(f"{where}: [[expect]] must be an array of tables")
    attacks = {c.attack for c in cells}
    defenses = {c.defense for c in cells}
    setting_keys = {k for c in cells for k, _ in c.settings}
    row_keys = ["metric", "min", "max", "attack", "defense", "over", *COMPARISONS, "by", *HOLD_KEYS]
    out = []
    for i, row in enumerate(rows):
        loc = f"{where}: [[expect]] #{i + 1}"
        if not isinstance(row, Mapping):
            raise InvalidScenario(f"{loc}: must be a table")
        row = dict(row)
        for k, v in row.items():
            if k in COMPARISONS:
                if not isinstance(v, Mapping) or not v:
                    raise InvalidScenario(f"{loc}: {k} = {shown(v)}: must be a table naming the other cell, "
                                          f'e.g. {k} = {{ defense = "mean" }}')
            elif not isinstance(v, (str, int, float, bool)):
                raise InvalidScenario(f"{loc}: {k} = {shown(v)}: must be a string, number or boolean")
        metric = row.pop("metric", None)
        if metric is None:  # name a misspelt key ("metirc") rather than "metric = None"
            import difflib

            stray = [k for k in row if k not in row_keys and not any(k == s or s.rsplit(".", 1)[-1] == k
                                                                      for s in setting_keys)]
            close = difflib.get_close_matches(stray[0], row_keys, n=1) if stray else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidScenario(f"{loc}: unknown key {_echo(stray[0])}{hint}" if stray else f"{loc}: needs 'metric'")
        if metric not in METRICS:
            import difflib

            close = difflib.get_close_matches(str(metric), list(METRICS), n=2)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise InvalidScenario(f"{loc}: metric = {_echo(metric)}: unknown metric{hint} (known: {', '.join(METRICS)})")
        lo, hi = row.pop("min", None), row.pop("max", None)
        for name, v in (("min", lo), ("max", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise InvalidScenario(f"{loc}: {name} = {repr(v)[:60]}: must be a number")
            if v is not None and v != v:  # a nan bound holds for every value: a check that cannot fail
                raise InvalidScenario(f"{loc}: {name} = nan: must be a number, not nan")
        over = row.pop("over", "mean")
        if over not in OVER:
            raise InvalidScenario(f'{loc}: over = {shown(over)}: must be "mean" (the seed mean) or "interval" '
                                  "(the whole 95 % interval of the seeds)")
        if over == "interval" and seeds is not None and len(seeds) < 2:
            raise InvalidScenario(f'{loc}: over = "interval" needs ≥ 2 seeds, but the matrix has seeds = '
                                  f"{len(seeds)}: the 95 % interval of one seed is undefined (raise [matrix].seeds "
                                  'or use over = "mean")')
        given = [k for k in COMPARISONS if k in row]
        if len(given) > 1:
            raise InvalidScenario(f"{loc}: has both better_than and at_least_as_bad_as; a row makes one comparison")
        compare = given[0] if given else None
        other_tab = row.pop(compare) if compare else None
        by = row.pop("by", None)
        if compare is None:
            if by is not None:
                raise InvalidScenario(f"{loc}: by = {shown(by)}: a margin needs better_than or at_least_as_bad_as")
            if lo is None and hi is None:
                raise InvalidScenario(f"{loc}: needs 'min' and/or 'max' (or better_than / at_least_as_bad_as)")
        else:
            if lo is not None or hi is not None:
                raise InvalidScenario(f"{loc}: {compare} compares two cells; it takes a margin 'by', not min/max "
                                      "(write the bound as a row of its own)")
            if by is not None and (isinstance(by, bool) or not isinstance(by, (int, float)) or by != by
                                   or by in (float("inf"), float("-inf"))):
                raise InvalidScenario(f"{loc}: by = {shown(by)}: must be a finite number (the margin, in the "
                                      "metric's units)")
            if metric_direction(metric) is None:
                raise InvalidScenario(f"{loc}: {compare}: metric {_echo(metric)} has no direction (neither higher nor "
                                      "lower is better in general), so one cell cannot be better than another on it; "
                                      "bound it with min/max instead")
        holds = [row.pop(k, None) for k in HOLD_KEYS]
        for k, why in zip(HOLD_KEYS, holds):
            if why is not None and (not isinstance(why, str) or len(why.strip()) < 10):
                raise InvalidScenario(f"{loc}: {k} = {shown(why)}: must say why the row may hold that way, in "
                                      'words (a string of at least 10 characters, e.g. "a learning check: the clean '
                                      'model must learn whatever the attack")')
        attack, defense = row.pop("attack", None), row.pop("defense", None)
        if attack is not None and attack not in attacks:
            raise InvalidScenario(f"{loc}: attack = {_echo(attack)} names no matrix attack (have: {', '.join(sorted(attacks))})")
        if defense is not None and defense not in defenses:
            raise InvalidScenario(
                f"{loc}: defense = {_echo(defense)} names no matrix defense (have: {', '.join(sorted(defenses))})"
            )
        settings = []
        for k, v in row.items():
            if not any(k == s or s.rsplit(".", 1)[-1] == k for s in setting_keys):
                import difflib

                close = difflib.get_close_matches(k, row_keys, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise InvalidScenario(
                    f"{loc}: unknown key {_echo(k)} (filters: attack, defense, or a matrix setting: "
                    f"{', '.join(sorted(setting_keys)) or 'none'}){hint}"
                )
            settings.append((k, v))
        other = _parse_other(other_tab, compare, loc, attacks, defenses, setting_keys) if compare else ()
        exp = Expectation(metric, None if lo is None else float(lo), None if hi is None else float(hi),
                          attack, defense, tuple(settings), i, over, compare, other,
                          0.0 if by is None else float(by), holds[0], holds[1])
        if not any(exp.matches(c) for c in cells):
            raise InvalidScenario(f"{loc}: matches no cell of the matrix")
        if compare:
            _check_pairs(exp, loc, cells)
        if workload_is_language_model is not None and metric in LANGUAGE_MODEL_METRICS:
            _refuse_classifier_cells(exp, loc, cells, workload_is_language_model)
            if compare:
                _refuse_classifier_cells(exp.right(), loc, cells, workload_is_language_model)
        out.append(exp)
    return tuple(out)


def _parse_other(tab: Mapping[str, Any], compare: str, loc: str, attacks: set[str], defenses: set[str],
                 setting_keys: set[str]) -> tuple[tuple[str, Any], ...]:
    """The ``better_than`` / ``at_least_as_bad_as`` table → (key, value) pairs, setting keys as full paths."""
    out: list[tuple[str, Any]] = []
    for k, v in tab.items():
        if not isinstance(v, (str, int, float, bool)):
            raise InvalidScenario(f"{loc}: {compare}.{k} = {shown(v)}: must be a string, number or boolean")
        if k == "attack" and v not in attacks:
            raise InvalidScenario(f"{loc}: {compare}.attack = {_echo(v)} names no matrix attack "
                                  f"(have: {', '.join(sorted(attacks))})")
        if k == "defense" and v not in defenses:
            raise InvalidScenario(f"{loc}: {compare}.defense = {_echo(v)} names no matrix defense "
                                  f"(have: {', '.join(sorted(defenses))})")
        if k in ("attack", "defense"):
            out.append((k, v))
            continue
        full = [s for s in setting_keys if k == s or s.rsplit(".", 1)[-1] == k]
        if len(full) != 1:
            what = (f"is ambiguous (matrix settings {', '.join(sorted(full))}; write the full key path)" if full
                    else f"is not a key of the other cell (attack, defense, or a matrix setting: "
                         f"{', '.join(sorted(setting_keys)) or 'none'})")
            raise InvalidScenario(f"{loc}: {compare}.{k} {what}")
        out.append((full[0], v))
    keys = [k for k, _ in out]
    if len(set(keys)) != len(keys):
        raise InvalidScenario(f"{loc}: {compare} names one setting twice ({', '.join(sorted(keys))})")
    return tuple(out)


def _check_pairs(exp: Expectation, loc: str, cells: Sequence[Cell]) -> None:
    """Every left cell has exactly one partner, no partner serves two left cells, no cell itself."""
    compare = exp.compare
    other = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in exp.other) + " }"
    left = [c for c in cells if exp.matches(c)]
    right = [c for c in cells if exp.right().matches(c)]
    if not right:
        raise InvalidScenario(f"{loc}: {compare} = {other} matches no cell of the matrix")
    used: dict[str, str] = {}
    for c in left:
        found = exp.partners(c, cells)
        if not found:
            raise InvalidScenario(
                f"{loc}: {compare} = {other}: left cell {c.id} has no partner among the cells it names "
                f"({', '.join(r.id for r in right)}); a partner must have the same remaining settings")
        if len(found) > 1:
            raise InvalidScenario(
                f"{loc}: {compare} = {other}: left cell {c.id} pairs with several cells "
                f"({', '.join(r.id for r in found)}); narrow the row or name more keys in {compare}")
        p = found[0]
        if p.id == c.id:
            raise InvalidScenario(f"{loc}: {compare} = {other}: compares cell {c.id} with itself; name the row's "
                                  f"left side (e.g. its defense) so the two sides differ")
        if p.id in used:
            raise InvalidScenario(
                f"{loc}: {compare} = {other}: left cells {used[p.id]} and {c.id} both pair with {p.id}, which "
                "cannot be paired one-to-one; narrow the row (name the left side's "
                f"{', '.join(k.rsplit('.', 1)[-1] for k, _ in exp.other)})")
        used[p.id] = c.id


def check_cell(cell: Cell, metrics: Mapping[str, Any], expectations: Sequence[Expectation], *,
               per_seed: Sequence[Mapping[str, Any]] | None = None,
               partners: Mapping[int, tuple[Cell, Sequence[Mapping[str, Any]]]] | None = None) -> list[str]:
    """Failure messages of every expectation that applies to ``cell`` (empty = all hold).

    ``metrics`` are the cell's seed means; ``per_seed`` its per-seed metrics (an
    ``over = "interval"`` row needs them: without them it sees one value and fails
    closed); ``partners`` maps a comparative row's index to its other cell and that cell's
    per-seed metrics (a comparative row without one fails closed)."""
    from .scoring import mean_ci, metric_range

    def stat(seeds: Sequence[Mapping[str, Any]] | None, m: str) -> dict[str, Any]:
        if seeds is not None:  # clamped to the metric's range, as the reports show it
            return mean_ci([s.get(m) for s in seeds], bounds=metric_range(m))
        v = metrics.get(m)
        return {"mean": v, "lo": v, "hi": v, "n": 0 if v is None else 1}

    fails = []
    for e in expectations:
        if not e.matches(cell):
            continue
        if e.comparative:
            got = (partners or {}).get(e.index)
            right = None if got is None else mean_ci([s.get(e.metric) for s in got[1]],
                                                     bounds=metric_range(e.metric))
            why = e.judge(stat(per_seed, e.metric), right, left_id=cell.id,
                          right_id="its partner cell" if got is None else got[0].id)
        elif e.over == "mean":
            why = e.check(metrics.get(e.metric))
        else:
            why = e.judge(stat(per_seed, e.metric))
        if why is not None:
            fails.append(f"expect #{e.index + 1} ({e.describe()}): {why}")
    return fails


def load_matrix(path: "str | Path", *, limits: Limits | None = None) -> "tuple[Any, Matrix, dict[str, Any]]":
    """Read a scenario file and expand its ``[matrix]`` (a file without one is one cell).

    Returns the base scenario, the :class:`Matrix` and the raw document.
    """
    from .scenario import load_document, parse_scenario

    limits = limits if limits is not None else Limits.from_env()
    p = Path(path)
    doc = load_document(p, limits=limits)
    base = parse_scenario(doc, file=p.name, limits=limits, base_dir=p.parent)
    return base, expand(doc, p.name, limits=limits), doc
