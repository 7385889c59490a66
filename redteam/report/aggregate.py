"""From a results store to what a report shows: cells × seeds → mean and interval per metric.

Everything here is plain data (frozen dataclasses of floats, strings and tuples), so the
table, Markdown, JSON, CSV and HTML writers only format; no writer computes a number.

* :func:`aggregate_cells`: per cell, the mean over its finished seeds of every metric,
  with a two-sided Student-t interval (:func:`redteam.scoring.mean_ci`; ``None`` values,
  e.g. an ASR of an untargeted attack, are skipped, so ``n`` may be below the seed count)
  clamped to the values the metric can take (:func:`redteam.scoring.metric_range`: a
  recall's interval stays in [0, 1], a count's above 0),
  and the reasons its runs give for metrics they could not compute
  (:func:`redteam.scoring.undefined_reasons`; :func:`undefined_notes` words them).
* :func:`convergence`: per cell, accuracy per round, attacked and baseline, averaged
  over seeds.
* :func:`breakdown`: per (attack, defense, other settings) the breakdown fraction over a
  ``*.malicious_fraction`` matrix axis (:func:`redteam.scoring.breakdown_fraction` on the
  seed means), with the accuracy margin and ASR level as parameters.
* :func:`envelope_utilisation`: per cell, the worst case over seeds of how close accepted
  malicious updates came to the validation bounds (largest norm / bound, smallest cosine).
* :func:`check_expectations`: the scenario's ``[[expect]]`` rows against the seed means.
* :func:`shared_draws`: per defense and metric, the attacks whose cells hold exactly the same
  per-seed values (values that vary from seed to seed): a figure that does not depend on the
  attack (e.g. a spot check's ``rounds_to_catch``, drawn from the defense's own sampling) is
  one sample of its seeds, however many attack rows repeat it; the reports mark those cells
  with :data:`SHARED_MARK` and say so in one line (:meth:`SharedDraw.note`).

:func:`redteam.report.load.load_report` puts them together from a results store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..errors import RedteamError
from ..scoring import METRICS, breakdown_fraction, mean_ci, metric_range, undefined_reasons

#: the detection rates, which mean nothing for a defense that never rejects
DETECTION_RATES = frozenset({"precision", "recall", "f1", "fpr"})


def rejects(report: Any, defense: str) -> bool:
    """Whether ``defense``'s detection rates mean anything in ``report`` (True without a summary)."""
    summary = getattr(report, "defenders", None)
    return summary is None or summary.rejects(defense)

__all__ = [
    "REPORT_METRICS",
    "Stat",
    "CellSummary",
    "Curve",
    "BreakdownRow",
    "EnvelopeRow",
    "ExpectationResult",
    "Report",
    "aggregate_cells",
    "convergence",
    "breakdown",
    "envelope_utilisation",
    "check_expectations",
    "SharedDraw",
    "SHARED_MARK",
    "shared_draws",
    "settings_groups",
    "axis_labels",
    "fraction_axis",
    "resolve_metrics",
    "undefined_notes",
    "ReportError",
]

#: Every metric a report can show or a ``--fail-if`` expression can name.
REPORT_METRICS: dict[str, str] = {
    **METRICS,
    "tp": "malicious updates flagged (judged updates, all rounds)",
    "fp": "honest updates flagged",
    "tn": "honest updates accepted",
    "fn": "malicious updates accepted",
}

Settings = tuple[tuple[str, Any], ...]


class ReportError(RedteamError):
    """A report cannot be made: unknown metric, empty store, unwritable output, ..."""


@dataclass(frozen=True, slots=True)
class Stat:
    """Mean over seeds with its interval; ``n`` = the seeds that had a value."""

    mean: float | None
    lo: float | None
    hi: float | None
    n: int

    @property
    def half_width(self) -> float | None:
        """Half the interval's width, or ``None`` with fewer than two values."""
        if self.n < 2 or self.mean is None or self.hi is None or self.lo is None:
            return None
        return (self.hi - self.lo) / 2

    @property
    def clamped(self) -> bool:
        """The interval was cut at an end of the metric's range (so it is not ``mean ± half_width``)."""
        if self.n < 2 or self.mean is None or self.hi is None or self.lo is None:
            return False
        up, down = self.hi - self.mean, self.mean - self.lo
        return abs(up - down) > 1e-9 * max(abs(up), abs(down), 1e-300)


@dataclass(frozen=True, slots=True)
class CellSummary:
    cell_id: str
    attack: str
    defense: str
    settings: Settings
    planned: int  # seeds in the plan
    finished: int  # seeds with a finished run
    metrics: Mapping[str, Stat] = field(hash=False)
    broken: int = 0  # finished seeds whose model (attacked or baseline) became non-finite
    #: metric → why some finished seeds could not compute it (and in how many), e.g. a
    #: simulated time past float64's range; absent when every seed could (or it is 0/0)
    undefined: Mapping[str, str] = field(default_factory=dict, hash=False)

    def value(self, metric: str) -> float | None:
        """The seed mean of ``metric`` (``None``: undefined or nothing finished)."""
        s = self.metrics.get(metric)
        return None if s is None else s.mean


@dataclass(frozen=True, slots=True)
class Curve:
    """Accuracy per round (index = round), averaged over the seeds that have that round."""

    cell_id: str
    attack: str
    defense: str
    settings: Settings
    attacked: tuple[float, ...]
    baseline: tuple[float, ...]
    seeds: int


@dataclass(frozen=True, slots=True)
class BreakdownRow:
    attack: str
    defense: str
    settings: Settings  # the other settings (the axis removed)
    axis: str  # e.g. "federation.malicious_fraction"
    points: tuple[tuple[float, float | None, float | None], ...]  # (fraction, drop, asr), sorted
    fraction: float | None  # None: never broke on the axis


@dataclass(frozen=True, slots=True)
class EnvelopeRow:
    cell_id: str
    attack: str
    defense: str
    settings: Settings
    norm: float | None  # max over seeds of envelope_norm
    cos: float | None  # min over seeds of envelope_cos
    cos_margin: float | None  # min over seeds of envelope_cos_margin


@dataclass(frozen=True, slots=True)
class ExpectationResult:
    index: int  # 0-based, as in the scenario's [[expect]] order
    metric: str
    description: str  # "accuracy_drop ≤ 0.05", "final_accuracy_last_k(cc) ≥ final_accuracy_last_k(avg) + 0.05"
    cell_id: str  # the cell the row applies to (a comparative row: its left cell)
    value: float | None  # that cell's seed mean
    failure: str | None  # None: holds
    other_cell_id: str | None = None  # a comparative row: the cell it is compared with
    other_value: float | None = None  # and that cell's seed mean


#: The footnote marker of a cell whose per-seed values are one draw shared with other attacks.
SHARED_MARK = "†"


@dataclass(frozen=True, slots=True)
class SharedDraw:
    """Cells of one defense (and settings group) whose per-seed values of ``metric`` are
    exactly the same, seed by seed: one draw that does not depend on the attack."""

    metric: str
    defense: str
    settings: Settings
    attacks: tuple[str, ...]  # in matrix order (≥ 2)
    cell_ids: tuple[str, ...]
    replicates: tuple[int, ...]  # the seeds (replicate indices) the values are over
    values: tuple[float | None, ...]  # per replicate, in that order (None: undefined in that seed)

    def note(self) -> str:
        """One line: which cells share the draw, and what it is worth."""
        from .labels import group_title

        group = f" ({group_title(self.settings)})" if self.settings else ""
        n, k = len(self.replicates), len(self.attacks)
        return (f"{self.metric} under {self.defense}{group}: the same per-seed values for {', '.join(self.attacks)} "
                f"(a draw that does not depend on the attack, e.g. the defense's own sampling): one sample of "
                f"{n} seed{'s' if n != 1 else ''}, not {k} confirmations")


@dataclass(frozen=True, slots=True)
class Report:
    source: Path  # the store file
    name: str
    file: str | None
    digest: str | None
    versions: Mapping[str, str] = field(hash=False)
    reproduce: str | None
    scenario_doc: Mapping[str, Any] | None = field(hash=False)
    cells: tuple[CellSummary, ...]
    curves: tuple[Curve, ...]
    breakdown: tuple[BreakdownRow, ...]
    envelope: tuple[EnvelopeRow, ...]
    expectations: tuple[ExpectationResult, ...]
    confidence: float = 0.95
    accuracy_margin: float = 0.05
    asr_level: float = 0.5
    #: per defense: clean accuracy, cost, worst case, ranking (:mod:`redteam.report.defender`)
    defenders: Any = field(default=None, hash=False)
    #: cells whose per-seed values of a metric are one draw shared across attacks (:func:`shared_draws`)
    shared: tuple[SharedDraw, ...] = field(default=(), hash=False)
    #: the scenario file as written when the matrix ran (None: a store made before it was kept)
    scenario_text: str | None = field(default=None, hash=False)
    scenario_text_truncated: bool = False

    def shared_draw(self, cell_id: str, metric: str) -> SharedDraw | None:
        """The shared draw ``cell_id``'s ``metric`` belongs to, if any."""
        for d in self.shared:
            if d.metric == metric and cell_id in d.cell_ids:
                return d
        return None

    def shared_cells(self, metric: str) -> frozenset[str]:
        """The cell ids whose ``metric`` is part of a shared draw (marked :data:`SHARED_MARK`)."""
        return frozenset(c for d in self.shared if d.metric == metric for c in d.cell_ids)

    def shared_notes(self, metric: str) -> list[str]:
        """One line per shared draw of ``metric``, starting with the marker (not for a detection
        rate of a defense that does not reject: the grids show ``n/a`` there)."""
        return [f"{SHARED_MARK} {d.note()}" for d in self.shared if d.metric == metric
                and (metric not in DETECTION_RATES or rejects(self, d.defense))]

    @property
    def out_dir(self) -> Path:
        return self.source.parent

    def defined(self, metric: str) -> bool:
        """Whether any cell has a value for ``metric``."""
        return any(c.value(metric) is not None for c in self.cells)

    def language_model(self) -> bool | None:
        """Whether the store's workload is a language model (``None``: cannot be told)."""
        from .applicable import language_model, store_workloads

        return language_model(store_workloads(self.scenario_doc, (c.settings for c in self.cells)))

    def applies(self, metric: str) -> bool:
        """Whether ``metric`` means something here: language-model metrics (bits per byte,
        perplexity, …) only for a language-model workload (:mod:`redteam.report.applicable`)."""
        from .applicable import LANGUAGE_MODEL_METRICS

        return metric not in LANGUAGE_MODEL_METRICS or self.language_model() is not False

    def applicable(self, metrics: Iterable[str]) -> list[str]:
        """``metrics`` without those that mean nothing for this store's workload."""
        return [m for m in metrics if self.applies(m)]

    def refuse_inapplicable(self, metrics: Iterable[str], option: str) -> None:
        """A one-line :class:`ReportError` when a metric asked for by ``option`` means nothing here."""
        bad = [m for m in metrics if not self.applies(m)]
        if bad:
            from .applicable import store_workloads

            names = sorted(str(n) for n in store_workloads(self.scenario_doc, (c.settings for c in self.cells)))
            raise ReportError(f"{option} {', '.join(bad)}: language-model metric(s); this store's workload "
                              f"({', '.join(names)}) is not a language model, so the value would mean nothing")


# ------------------------------------------------------------------------ helpers


def _settings(d: Mapping[str, Any] | Settings) -> Settings:
    items = d.items() if isinstance(d, Mapping) else d
    return tuple(sorted((str(k), v) for k, v in items))


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer past float64's range: no mean can be taken of it
        return None
    return f if math.isfinite(f) else None


def _unique(xs: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for x in xs:
        seen.setdefault(x, None)
    return list(seen)


def settings_groups(items: Sequence[Any], drop: str | None = None) -> dict[Settings, list[Any]]:
    """Items (anything with ``.settings``) grouped by their settings, ``drop`` removed."""
    out: dict[Settings, list[Any]] = {}
    for it in items:
        key = tuple((k, v) for k, v in it.settings if k != drop)
        out.setdefault(key, []).append(it)
    return out


def axis_labels(items: Sequence[Any]) -> tuple[list[str], list[str]]:
    """Attacks and defenses in the order they first appear (the matrix's order)."""
    return _unique(i.attack for i in items), _unique(i.defense for i in items)


def resolve_metrics(names: Iterable[str]) -> list[str]:
    """Validate metric names (comma-separated lists allowed); unknown ones name close matches."""
    import difflib

    out: list[str] = []
    for raw in names:
        for name in (p.strip() for p in str(raw).split(",")):
            if not name:
                continue
            if name not in REPORT_METRICS:
                close = difflib.get_close_matches(name.lower(), list(REPORT_METRICS), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise ReportError(
                    f"--metric {name!r}: unknown metric{hint} (known: {', '.join(REPORT_METRICS)})"
                )
            if name not in out:
                out.append(name)
    return out


# -------------------------------------------------------------------- aggregation


def aggregate_cells(rows: Sequence[Mapping[str, Any]], *, confidence: float = 0.95) -> tuple[CellSummary, ...]:
    """Group store rows (``ResultsStore.results()``) by cell, in plan order, and average.

    Every name of :data:`REPORT_METRICS` gets a :class:`Stat`; unfinished seeds count in
    ``planned`` but not in ``finished`` nor in any mean.
    """
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["cell_id"], []).append(r)
    out = []
    for cell_id, rs in groups.items():
        done = [r for r in rs if r.get("finished") and r.get("metrics") is not None]
        stats = {}
        for m in REPORT_METRICS:
            ci = mean_ci([_num(r["metrics"].get(m)) for r in done], confidence, bounds=metric_range(m))
            stats[m] = Stat(ci["mean"], ci["lo"], ci["hi"], ci["n"])
        first = rs[0]
        broken = sum(1 for r in done if model_broke(r))
        out.append(CellSummary(cell_id, first["attack"], first["defense"], _settings(first["settings"]),
                               len(rs), len(done), stats, broken, _why_undefined(done)))
    return tuple(out)


def shared_draws(rows: Sequence[Mapping[str, Any]], metrics: Iterable[str] | None = None) -> tuple[SharedDraw, ...]:
    """Per settings group, defense and metric, the classes of attacks whose cells hold exactly
    the same per-seed values (the same finished replicates, every value equal to the other
    cell's of the same replicate, an undefined one included), for classes of ≥ 2 attacks.

    Only values that vary from seed to seed count: a cell needs at least two distinct defined
    values over its seeds. A vector constant over the seeds (a recall of 1.0 under every attack, a
    figure the rule fixes, the last round where a target is reached) may be the same because the
    measure is saturated, not because one draw was repeated, so it is never marked; with one seed
    nothing is.
    ``metrics``: the names to look at (default: :data:`REPORT_METRICS`)."""
    names = list(metrics) if metrics is not None else list(REPORT_METRICS)
    # (settings, defense) → cell id → (attack, replicate → metrics)
    groups: dict[tuple[Settings, str], dict[str, tuple[str, dict[int, Mapping[str, Any]]]]] = {}
    for r in rows:
        if not r.get("finished") or not isinstance(r.get("metrics"), Mapping):
            continue
        rep = r.get("replicate")
        if not isinstance(rep, int) or isinstance(rep, bool):
            continue
        key = (_settings(r["settings"]), str(r["defense"]))
        cell = groups.setdefault(key, {}).setdefault(str(r["cell_id"]), (str(r["attack"]), {}))
        cell[1][rep] = r["metrics"]
    out: list[SharedDraw] = []
    for (settings, defense), cells in groups.items():
        if len(cells) < 2:
            continue
        for m in names:
            classes: dict[tuple[tuple[int, float | None], ...], list[tuple[str, str]]] = {}
            for cell_id, (attack, by_rep) in cells.items():
                vec = tuple(sorted((rep, _num(ms.get(m))) for rep, ms in by_rep.items()))
                if len({v for _, v in vec if v is not None}) < 2:
                    continue  # fewer than two distinct values: cannot be told from a saturated measure
                classes.setdefault(vec, []).append((attack, cell_id))
            for vec, members in classes.items():
                if len(members) >= 2:
                    out.append(SharedDraw(m, defense, settings, tuple(a for a, _ in members),
                                          tuple(c for _, c in members), tuple(rep for rep, _ in vec),
                                          tuple(v for _, v in vec)))
    return tuple(out)


def _why_undefined(done: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Per metric, the distinct reasons the finished runs give for not computing it, with the
    number of seeds: ``"… (2 of 3 seeds)"``."""
    seen: dict[str, dict[str, int]] = {}
    for r in done:
        for m, why in undefined_reasons(r.get("metrics")).items():
            seen.setdefault(m, {}).setdefault(why, 0)
            seen[m][why] += 1
    return {m: "; ".join(f"{why} ({k} of {len(done)} seed{'s' if len(done) != 1 else ''})" for why, k in whys.items())
            for m, whys in seen.items()}


def undefined_notes(cells: Sequence[CellSummary], metric: str) -> list[str]:
    """One line per cell whose runs could not compute ``metric``: ``cell: reason``."""
    return [f"{metric} undefined for {c.cell_id}: {c.undefined[metric]}" for c in cells if metric in c.undefined]


#: The key a round record's ``extra`` carries (``True``) when the round loop refused a
#: non-finite aggregate or server step, i.e. the model broke.
MODEL_NONFINITE = "model_nonfinite"


def _rounds_broke(rounds: Any) -> bool:
    if not isinstance(rounds, list) or not rounds:
        return False
    for r in rounds:
        extra = r.get("extra") if isinstance(r, Mapping) else None
        if isinstance(extra, Mapping) and extra.get(MODEL_NONFINITE):
            return True
    last = max(rounds, key=lambda r: r.get("round", 0) if isinstance(r, Mapping) else 0)
    return isinstance(last, Mapping) and "loss" in last and _num(last.get("loss")) is None


def model_broke(row: Mapping[str, Any]) -> bool:
    """Did this finished run's model (or its baseline's) break: a round flagged
    ``model_nonfinite``, or a final loss that is NaN/inf (stored as ``null``)? Its
    metrics are then not evidence of anything, and ``--fail-if`` fails closed."""
    metrics = row.get("metrics")
    if isinstance(metrics, Mapping) and "final_loss" in metrics and _num(metrics.get("final_loss")) is None:
        return True
    return _rounds_broke(row.get("rounds")) or _rounds_broke(row.get("baseline_rounds"))


def _mean_series(series: Sequence[Sequence[float]]) -> tuple[float, ...]:
    if not series:
        return ()
    length = max(len(s) for s in series)
    out = []
    for i in range(length):
        xs = [s[i] for s in series if i < len(s) and math.isfinite(s[i])]
        out.append(sum(xs) / len(xs) if xs else math.nan)
    return tuple(out)


def _accuracies(records: Sequence[Mapping[str, Any]] | None) -> list[float]:
    if not records:
        return []
    ordered = sorted(records, key=lambda r: r.get("round", 0))
    return [v if (v := _num(r.get("accuracy"))) is not None else math.nan for r in ordered]


def convergence(rows: Sequence[Mapping[str, Any]]) -> tuple[Curve, ...]:
    """Per cell, the seed-mean accuracy per round of the attacked runs and of their baselines
    (rows from ``ResultsStore.results(with_rounds=True)``)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["cell_id"], []).append(r)
    out = []
    for cell_id, rs in groups.items():
        done = [r for r in rs if r.get("finished") and r.get("rounds")]
        att = _mean_series([_accuracies(r["rounds"]) for r in done])
        base = _mean_series([a for r in done if (a := _accuracies(r.get("baseline_rounds")))])
        first = rs[0]
        out.append(Curve(cell_id, first["attack"], first["defense"], _settings(first["settings"]), att, base,
                         len(done)))
    return tuple(out)


def fraction_axis(cells: Sequence[CellSummary]) -> str | None:
    """The matrix setting that varies the malicious fraction (key ending in
    ``malicious_fraction``), if the matrix has one."""
    keys = _unique(k for c in cells for k, _ in c.settings if k.rsplit(".", 1)[-1] == "malicious_fraction")
    return keys[0] if keys else None


def breakdown(
    cells: Sequence[CellSummary],
    *,
    accuracy_margin: float = 0.05,
    asr_level: float = 0.5,
    axis: str | None = None,
) -> tuple[BreakdownRow, ...]:
    """Breakdown fraction of each (attack, defense, other settings) over the malicious-fraction
    axis: the smallest fraction whose seed-mean accuracy drop exceeds ``accuracy_margin`` or
    whose seed-mean ASR exceeds ``asr_level``. Empty without such an axis;
    the no-attack cells (attack ``none``) are left out."""
    axis = axis or fraction_axis(cells)
    if axis is None:
        return ()
    rows: dict[tuple[str, str, Settings], list[tuple[float, float | None, float | None]]] = {}
    for c in cells:
        s = dict(c.settings)
        if c.attack == "none" or axis not in s or _num(s[axis]) is None or c.finished == 0:
            continue
        others = tuple((k, v) for k, v in c.settings if k != axis)
        rows.setdefault((c.attack, c.defense, others), []).append(
            (float(s[axis]), c.value("accuracy_drop"), c.value("asr"))
        )
    return tuple(
        BreakdownRow(a, d, others, axis, tuple(sorted(pts)),
                     breakdown_fraction(pts, accuracy_margin=accuracy_margin, asr_level=asr_level))
        for (a, d, others), pts in rows.items()
    )


def envelope_utilisation(rows: Sequence[Mapping[str, Any]]) -> tuple[EnvelopeRow, ...]:
    """Per cell, the worst case over its finished seeds: the largest accepted-malicious norm
    over the bound (``envelope_norm``), the smallest accepted-malicious cosine
    (``envelope_cos``) and cosine margin. Cells where no bound was ever measured are left out."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["cell_id"], []).append(r)
    out = []
    for cell_id, rs in groups.items():
        ms = [r["metrics"] for r in rs if r.get("finished") and r.get("metrics")]

        def pick(key: str, fn: Any) -> float | None:
            xs = [v for m in ms if (v := _num(m.get(key))) is not None]
            return fn(xs) if xs else None

        norm, cos, margin = pick("envelope_norm", max), pick("envelope_cos", min), pick("envelope_cos_margin", min)
        if norm is None and cos is None and margin is None:
            continue
        first = rs[0]
        out.append(EnvelopeRow(cell_id, first["attack"], first["defense"], _settings(first["settings"]),
                               norm, cos, margin))
    return tuple(out)


def check_expectations(cells: Sequence[CellSummary], expectations: Sequence[Mapping[str, Any]]) -> tuple[
        ExpectationResult, ...]:
    """The scenario's ``[[expect]]`` rows (as stored in the store's meta) checked against
    every cell they match (cells with no finished seed are skipped): a bound on the seed
    mean, or with ``over = "interval"`` on the seed interval; a comparative row against its
    partner cell (which fails closed when that cell has no finished seed)."""
    from ..matrix import Cell, Expectation

    def stat(c: CellSummary, metric: str) -> dict[str, Any] | None:
        if c.finished == 0:
            return None
        s = c.metrics.get(metric)
        return None if s is None else {"mean": s.mean, "lo": s.lo, "hi": s.hi, "n": s.n}

    as_cells = [Cell(c.attack, c.defense, c.settings, {}) for c in cells]
    summary_of = {id(cell): c for c, cell in zip(cells, as_cells)}  # a summary's settings are sorted: match by object
    out = []
    for e in expectations:
        exp = Expectation.from_dict(e)
        for c, cell in zip(cells, as_cells):
            if c.finished == 0 or not exp.matches(cell):
                continue
            v = c.value(exp.metric)
            if not exp.comparative:
                why = exp.check(v) if exp.over == "mean" else exp.judge(stat(c, exp.metric))
                out.append(ExpectationResult(exp.index, exp.metric, exp.describe(), c.cell_id, v, why))
                continue
            p = exp.partner(cell, as_cells)
            other = None if p is None else summary_of.get(id(p))
            if other is None:
                why = f"{exp.metric}: {c.cell_id} has no partner cell in this store to compare with"
            elif other.finished == 0:
                why = f"{exp.metric}: its partner cell {other.cell_id} has no finished seed"
            else:
                why = exp.judge(stat(c, exp.metric), stat(other, exp.metric), left_id=c.cell_id,
                                right_id=other.cell_id)
            out.append(ExpectationResult(exp.index, exp.metric, exp.describe(), c.cell_id, v, why,
                                         None if other is None else other.cell_id,
                                         None if other is None else other.value(exp.metric)))
    return tuple(out)
