"""Can each ``[[expect]]`` row fail? Re-judge it with its attack removed and its defense replaced.

A row that holds whatever the attack does (a bound a clean run meets: ``undetected_attackers ≤
0`` when nobody attacks, an ASR floor the clean model already passes) or whatever the defense does
(``fpr ≤ 0.1`` when plain averaging flags nobody) cannot show what it claims. This module re-judges
every row of a scenario on runs that are already stored, with no new run:

* **attack → none**: each cell's seeds replaced by its no-attack baselines (same defense,
  settings and seeds; the runs an attacked run is measured against, so every matrix stores
  them). A comparative row has both sides replaced. A count of attackers a check missed
  (:data:`VACUOUS`: ``undetected_attackers``, ``uncaught_cheats``) is undefined in a run without
  attackers, which fails a row closed; here it reads as what it counts, 0, so that ``≤ 0`` —
  "every attacker was caught" — shows as the row that holds vacuously that it is.
* **defense → mean**: the row's cell replaced by the matrix's plain ``mean`` cell of the same
  attack and settings, when the store holds all its seeds (a comparative row keeps its partner).

A row *holds* under a replacement when it would pass there too; that is an error unless the row
says why it may: ``can_hold_without_attack = "…"`` (e.g. a learning check on the clean model) or
``can_hold_without_defense = "…"`` (e.g. a row stating that a check is blind to an attack: it
holds as well with no check at all). A replacement that changes nothing (the cell's attack is
``none``, its defense is ``mean``) is not judged; nor is the defense replacement when the store has
no finished ``mean`` cell for it (the matrix has none, or no row made the session run it):
``scripts/rows_can_fail.py --defense mean`` re-runs the scenario to judge those.

The pytest plugin runs this as one item per scenario file (``<file>::can_fail``) after the file's
cells, when the ini option ``redteam_can_fail`` is true (this project sets it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from .matrix import Cell, Expectation

__all__ = ["UNDEFINED", "Verdict", "RowReport", "judge_row", "rejudge", "replaces_nothing", "is_plain_mean", "mean_cell_of",
           "render"]

#: per-seed metrics of a cell (None: not in the store)
Seeds = Sequence[Mapping[str, Any]]

FAILED, HELD, EXCUSED, SAME, NOT_STORED = "failed", "held", "held (excused)", "n/a", "not stored"
#: the row fails there only because its metric is undefined in every replaced run (an ASR without
#: the attack's probe, a recall without attackers): fail-closed, not evidence either way
UNDEFINED = "fails closed (undefined)"

#: counts of attackers a check missed: undefined (None) without attackers, read as 0 there
VACUOUS = {"undetected_attackers": 0.0, "uncaught_cheats": 0.0}


def _vacuous(seeds: Seeds | None, metric: str) -> Seeds | None:
    """``seeds`` of a no-attack run with an undefined :data:`VACUOUS` count read as 0."""
    if seeds is None or metric not in VACUOUS:
        return seeds
    return [{**s, metric: VACUOUS[metric]} if s.get(metric) is None else s for s in seeds]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The row on one cell under one replacement: ``status`` is ``failed`` (the row depends on
    what was replaced: good), ``held`` (it cannot fail this way: an error), ``held (excused)``
    (held, and the row says why it may), ``n/a`` (the replacement changes nothing) or ``not
    stored``; ``why`` is the row's failure message there, or the excuse."""

    cell: str
    status: str
    why: str = ""


@dataclass(frozen=True, slots=True)
class RowReport:
    """One row's verdicts under both replacements, one per cell it applies to."""

    row: "Expectation"
    without_attack: tuple[Verdict, ...]
    with_mean: tuple[Verdict, ...]

    @property
    def holds_regardless(self) -> list[str]:
        """What it holds under without an excuse (empty: it can fail each way it was judged)."""
        out = [f"attack → none on {v.cell}" for v in self.without_attack if v.status == HELD]
        return out + [f"defense → mean on {v.cell}" for v in self.with_mean if v.status == HELD]


def _table(cell: "Cell", key: str) -> Any:
    return cell.doc.get(key)


def replaces_nothing(cell: "Cell") -> bool:
    """Whether the cell's attack is already ``none`` (removing it changes nothing)."""
    a = _table(cell, "attack")
    name = a if isinstance(a, str) else a.get("name") if isinstance(a, Mapping) else None
    return name in (None, "none")


def is_plain_mean(cell: "Cell") -> bool:
    """Whether the cell's defense is plain ``mean`` (no pipeline, no parameters but its label)."""
    d = _table(cell, "defense")
    if isinstance(d, str):
        return d == "mean"
    if isinstance(d, Mapping):
        rest = {k: v for k, v in d.items() if k not in ("name", "label")}
        return d.get("name") == "mean" and not rest
    return d is None  # the scenario default is mean


def mean_cell_of(cell: "Cell", cells: Sequence["Cell"]) -> "Cell | None":
    """The matrix's plain-mean cell with ``cell``'s attack and settings (None: the matrix has none)."""
    for c in cells:
        if c.attack == cell.attack and c.settings == cell.settings and is_plain_mean(c):
            return c
    return None


def judge_row(e: "Expectation", left: Seeds, right: Seeds | None = None, left_id: str = "this cell",
              right_id: str = "the other cell") -> str | None:
    """The row's verdict on per-seed metrics, as the plugin judges a cell (None: it holds)."""
    from .scoring import mean_ci, metric_range

    def ci(seeds: Seeds) -> dict[str, Any]:
        return mean_ci([s.get(e.metric) for s in seeds], bounds=metric_range(e.metric))

    if e.comparative:
        return e.judge(ci(left), None if right is None else ci(right), left_id=left_id, right_id=right_id)
    stat = ci(left)
    return e.check(stat["mean"]) if e.over == "mean" else e.judge(stat)


def rejudge(expectations: Sequence["Expectation"], cells: Sequence["Cell"],
            attacked: Callable[["Cell"], Seeds | None],
            baselines: Callable[["Cell"], Seeds | None]) -> list[RowReport]:
    """Each row re-judged on every cell it applies to. ``attacked(cell)`` / ``baselines(cell)``:
    the stored per-seed metrics of the cell's attacked runs / of its no-attack baselines (None:
    not all in the store)."""
    out = []
    for e in expectations:
        wa: list[Verdict] = []
        wm: list[Verdict] = []
        for cell in (c for c in cells if e.matches(c)):
            other = e.partner(cell, cells) if e.comparative else None
            # attack → none, on both sides
            if replaces_nothing(cell) and (other is None or replaces_nothing(other)):
                wa.append(Verdict(cell.id, SAME, "the cell has no attack"))
            else:
                left = _vacuous(baselines(cell), e.metric)
                right = _vacuous(baselines(other), e.metric) if other is not None else None
                if left is None or (other is not None and right is None):
                    wa.append(Verdict(cell.id, NOT_STORED))
                else:
                    v = _verdict(e, cell.id, judge_row(e, left, right, cell.id, getattr(other, "id", "")),
                                 e.hold_without_attack)
                    if v.status == FAILED and all(s.get(e.metric) is None for s in left):
                        v = Verdict(cell.id, UNDEFINED, v.why)
                    wa.append(v)
            # defense → mean, on the row's own side
            if is_plain_mean(cell):
                wm.append(Verdict(cell.id, SAME, "the cell's defense is mean"))
                continue
            mean = mean_cell_of(cell, cells)
            left = attacked(mean) if mean is not None else None
            right = attacked(other) if other is not None else None
            if mean is None:
                wm.append(Verdict(cell.id, NOT_STORED, "the matrix has no plain mean cell with this attack"))
            elif left is None or (other is not None and right is None):
                wm.append(Verdict(cell.id, NOT_STORED, f"{mean.id} is not in the store"))
            else:
                wm.append(_verdict(e, cell.id, judge_row(e, left, right, mean.id, getattr(other, "id", "")),
                                   e.hold_without_defense))
        out.append(RowReport(e, tuple(wa), tuple(wm)))
    return out


def _verdict(e: "Expectation", cell: str, why: str | None, excuse: str | None) -> Verdict:
    if why is not None:
        return Verdict(cell, FAILED, why)
    return Verdict(cell, EXCUSED, excuse) if excuse else Verdict(cell, HELD)


def render(reports: Sequence[RowReport], file: str = "") -> list[str]:
    """One line per row and replacement: ``#3 undetected_attackers ≤ 0 (lazy, recompute): attack →
    none: HELD on recompute[lazy]``."""
    lines = []
    for r in reports:
        e = r.row
        where = ", ".join(x for x in (e.attack, e.defense) if x) or "every cell"
        for name, verdicts in (("attack → none", r.without_attack), ("defense → mean", r.with_mean)):
            by: dict[str, list[str]] = {}
            for v in verdicts:
                by.setdefault(v.status, []).append(v.cell)
            parts = [f"{s.upper() if s == HELD else s} on {', '.join(cs)}" for s, cs in by.items()]
            lines.append(f"{file}#{e.index + 1} {e.describe()} ({where}): {name}: {'; '.join(parts)}")
    return lines
