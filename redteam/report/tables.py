"""The attacks × defenses table of one metric, for the terminal (rich) and shared formatting.

A matrix with ``[matrix.settings]`` axes gives one table per combination of settings
(titled e.g. ``malicious_fraction=0.25``). Each entry is the mean over the cell's seeds,
``± h`` the half-width of the 95 % Student-t interval when two or more seeds have a
value; ``—`` = undefined (e.g. ASR of an untargeted attack); ``…`` = no seed finished;
a trailing ``*`` = some of the cell's seeds have not finished; a trailing ``†`` = the cell's
per-seed values are exactly those of other attacks' cells under the same defense (one draw that
does not depend on the attack, named in a line under the table). A table wider than the
terminal is stacked (see :mod:`redteam.report.fit`), so ``…`` never stands for a cut value.
Under a table, a line per cell whose runs could not compute the metric gives their reason
(e.g. a simulated time past float64's range).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .aggregate import (REPORT_METRICS, SHARED_MARK, CellSummary, Report, Stat, axis_labels, settings_groups,
                        undefined_notes)
from .labels import group_title, short_key

__all__ = [
    "fmt_value",
    "fmt_stat",
    "cell_text",
    "group_title",
    "short_key",
    "metric_grids",
    "metric_table",
    "print_tables",
    "DEFAULT_TABLE_METRIC",
    "DEFAULT_LM_TABLE_METRIC",
    "default_table_metric",
    "default_table_metrics",
    "LEGEND",
]

DEFAULT_TABLE_METRIC = "accuracy_drop"
#: The default table of a language-model store: bits per byte, in the workload's own unit (issue 18 §2).
DEFAULT_LM_TABLE_METRIC = "final_bits_per_byte"


def default_table_metric(report: Any) -> str:
    """The terminal's default table: the accuracy drop for a classifier, bits per byte for a
    language model (whose next-byte accuracy is not what anyone trains it for)."""
    return DEFAULT_LM_TABLE_METRIC if report.language_model() is True else DEFAULT_TABLE_METRIC


def default_table_metrics(report: Any) -> list[str]:
    """The terminal's default tables: the scenario's declared defender metric first (``[matrix]
    defender_metric``, what the defender's summary ranks by), then :func:`default_table_metric`."""
    declared = getattr(getattr(report, "defenders", None), "metric", None)
    main = default_table_metric(report)
    if declared is None or declared == main or not report.applies(declared):
        return [main]
    return [declared, main]

LEGEND = ("mean over seeds ± half-width of the 95 % interval (≥ 2 seeds); — undefined; … not run yet; "
          "* some seeds not finished")

_DECIMAL3 = {"final_accuracy", "accuracy_drop", "asr", "precision", "recall", "f1", "fpr", "final_loss",
             "envelope_norm", "envelope_cos", "envelope_cos_margin", "target_accuracy", "final_accuracy_last_k",
             "final_bits_per_byte", "bits_per_byte_increase", "false_trigger_rate", "near_miss_trigger_rate"}
_COUNTS = {"bytes_on_wire", "dropped_updates", "rejected_updates", "tp", "fp", "tn", "fn",
           "rounds_to_target", "slowdown_rounds"}


def fmt_value(metric: str, v: float | None) -> str:
    """A metric value as the reports print it (``—`` for undefined)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if metric in _DECIMAL3:
        return f"{v:.3f}"
    if metric in _COUNTS:
        return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"
    return f"{v:.3g}"


def fmt_stat(metric: str, s: Stat | None) -> str:
    """``mean ± half-width`` (the ± part only with two or more values); ``mean [lo, hi]`` when
    the interval was clamped to the metric's range (a recall's stays in [0, 1])."""
    if s is None or s.mean is None:
        return "—"
    h = s.half_width
    text = fmt_value(metric, s.mean)
    if h is not None and s.clamped:
        text += f" [{fmt_value(metric, s.lo)}, {fmt_value(metric, s.hi)}]"
    elif h is not None:
        text += f" ± {fmt_value(metric, h)}"
    return text


def cell_text(cell: CellSummary | None, metric: str, rejects: bool = True, shared: bool = False) -> str:
    """A grid entry; ``rejects=False`` (the defense never rejects) turns detection rates into ``n/a``;
    ``shared`` (the value is one draw shared with other attacks' cells) appends :data:`SHARED_MARK`."""
    if cell is None:
        return ""
    if cell.finished == 0:
        return "…"
    if not rejects:
        from .defender import DETECTION_RATES

        if metric in DETECTION_RATES:
            return "n/a"
    text = fmt_stat(metric, cell.metrics.get(metric))
    return text + ("*" if cell.finished < cell.planned else "") + (SHARED_MARK if shared else "")


def metric_grids(cells: Sequence[CellSummary]) -> list[tuple[tuple, list[str], list[str], dict]]:
    """Per settings group: (settings, attacks, defenses, {(attack, defense): cell})."""
    out = []
    for group, cs in settings_groups(cells).items():
        attacks, defenses = axis_labels(cs)
        out.append((group, attacks, defenses, {(c.attack, c.defense): c for c in cs}))
    return out


def metric_table(report: Report, metric: str, width: int | None = None) -> list[tuple[str, Any]]:
    """(title, rich table) per settings group of ``metric``; every label in a table is
    text, never markup (cell labels contain brackets). With ``width`` (the terminal's),
    a group too wide for it is stacked into several tables, each with the attack column
    and some of the defenses (titled ``defenses i–j of n``); no value is ever cut."""
    from rich.text import Text

    from ..runner.outputs import terminal_safe
    from .fit import FitColumn, fit_tables

    tables = []
    for group, attacks, defenses, by in metric_grids(report.cells):
        title = metric + (f" · {group_title(group)}" if group else "")
        columns = [FitColumn("attack \\ defense", "left", "bold")] + [FitColumn(terminal_safe(d)) for d in defenses]
        from .defender import rejects

        marked = report.shared_cells(metric)

        def entry(a: str, d: str) -> Text:
            c = by.get((a, d))
            return Text(cell_text(c, metric, rejects(report, d), c is not None and c.cell_id in marked))

        rows = [[Text(terminal_safe(a)), *[entry(a, d) for d in defenses]] for a in attacks]
        for span, t in fit_tables(width or 10**6, columns, rows, keep=1):
            suffix = f" (defenses {span[0]}–{span[1]} of {len(defenses)})" if span else ""
            tables.append((title + suffix, t))
    return tables


def _markup(text: object) -> str:
    """Label text for rich markup: brackets escaped, control characters made visible."""
    from rich.markup import escape

    from ..runner.outputs import terminal_safe

    return escape(terminal_safe(text))


def print_tables(console: Any, report: Report, metrics: Sequence[str]) -> None:
    """Print a header, the legend, and one table per metric (and settings group)."""
    escape = _markup

    seeds = max((c.planned for c in report.cells), default=0)
    done = sum(c.finished for c in report.cells)
    total = sum(c.planned for c in report.cells)
    console.print(f"[bold]{escape(report.name)}[/bold]: {len(report.cells)} cells × {seeds} seed(s), "
                  f"{done}/{total} runs finished — {escape(str(report.source))}")
    from .defender import print_defenders

    print_defenders(console, report.defenders, escape)
    console.print(f"[dim]{escape(LEGEND)}[/dim]")
    for m in metrics:
        console.print(f"[dim]{m}: {escape(REPORT_METRICS[m])}[/dim]")
        from .defender import na_note

        if (note := na_note(report, m)) is not None:
            console.print(f"[dim]{escape(note)}[/dim]")
        for title, t in metric_table(report, m, console.width):
            console.print(f"[bold]{escape(title)}[/bold]")
            console.print(t)
        for line in undefined_notes(report.cells, m):  # why a — is there, when a run said why
            console.print(f"[dim]— {escape(line)}[/dim]")
        for line in report.shared_notes(m):  # a figure repeated across attacks is one sample
            console.print(f"[dim]{escape(line)}[/dim]")
