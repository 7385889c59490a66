"""``redteam report DIR``: read a results store and print or write its report.

:func:`register` adds the ``report`` subcommand to ``redteam``'s subparsers (the leaf
parser sets ``handler``, which ``redteam.cli.main`` calls; errors are
:class:`~redteam.errors.RedteamError`, printed by ``main`` as one line, exit 2).
:func:`print_summary` is what ``redteam matrix`` prints when it finishes.

Exit status: 0 = report made (and, with ``--fail-if``, no cell fails); 1 = some cell
fails the ``--fail-if`` condition (each one is named with its values on stderr);
2 = bad input (no store, corrupt store, unknown metric, bad expression, unwritable
``--out``).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = ["register", "print_summary", "cmd_report", "FORMATS", "fail_if_cells", "MatrixSummaryReport"]

FORMATS = ("table", "md", "html", "json", "csv")

_DESCRIPTION = textwrap.dedent(
    """\
    Read the results store that `redteam matrix --out DIR` wrote and report it:
      table  attacks × defenses of each --metric, one table per settings combination (default)
      md     the same as Markdown, with breakdown fraction, envelope and expectations
      html   a self-contained page (heatmaps, convergence curves, detection, scenario,
             versions, reproduce command; images embedded): --out, default DIR/report.html
      json   format redteam.report/v1: mean, 95 % interval and n per metric per cell
      csv    one row per cell: settings, seeds, then M, M_lo, M_hi, M_n for each metric
    Values are means over seeds; ± is the half-width of the 95 % Student-t interval.
    Every format but csv starts with the defender's summary: per defense its clean
    accuracy, cost vs mean, worst accuracy drop and ASR (with the attack), detection
    only for rules that reject, ranked by worst case then clean accuracy; a scenario
    with [matrix] defender_metric = "M" is ranked by its worst M instead, and M's
    table and heatmap come first. A cell marked † holds exactly the per-seed values
    of other attacks' cells under the same defense: one draw, named under the table.

    --fail-if EXPR gates a pipeline: EXPR is evaluated on each cell's seed means, e.g.
      --fail-if "asr > 0.2 or accuracy_drop > 0.05"
    Allowed: metric names, numbers, < <= > >= == !=, and, or, not, parentheses.
    A comparison with an undefined (null) metric is false, except that a cell whose
    model broke (a non-finite model refused by the round loop, or a NaN/inf final loss,
    in any seed or its baseline) fails whatever EXPR says: its metrics are not evidence
    (fail closed). Exit status 1 names every failing cell; 2 = bad input or expression."""
)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``report`` to ``redteam``'s subcommands."""
    p = subparsers.add_parser(
        "report",
        help="report a results store: table, Markdown, HTML, JSON or CSV; --fail-if gates CI",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="results directory written by `redteam matrix --out DIR`")
    p.add_argument("--format", default="table", choices=FORMATS, help="output format (default: table)")
    p.add_argument(
        "--metric", action="append", default=None, metavar="M",
        help="metric(s) to show; repeat or comma-separate (default: accuracy_drop for table; "
             "accuracy_drop, asr, recall, fpr for md/html, after the scenario's [matrix] defender_metric "
             "if it declares one; all for json/csv)",
    )
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout (html: default DIR/report.html)")
    p.add_argument("--fail-if", metavar="EXPR", help="exit 1 naming every cell for which EXPR holds")
    p.add_argument("--margin", type=float, default=0.05, metavar="X",
                   help="breakdown fraction: accuracy drop that counts as broken (default 0.05)")
    p.add_argument("--asr-level", type=float, default=0.5, metavar="X",
                   help="breakdown fraction: ASR that counts as broken (default 0.5)")
    p.set_defaults(handler=cmd_report)
    return p


def _default_metrics(fmt: str, report: Any) -> list[str]:
    from .aggregate import REPORT_METRICS
    from .html import default_html_metrics
    from .tables import default_table_metrics

    if fmt == "table":
        return default_table_metrics(report)
    if fmt in ("md", "html"):
        return default_html_metrics(report)
    return report.applicable(REPORT_METRICS)  # all that mean something for the workload


def fail_if_cells(report: Any, condition: Any) -> list[tuple[Any, dict[str, float | None]]]:
    """The cells (with the values the condition read) that fail: those for which ``condition``
    holds, and — failing closed (issue 22 §7) — those with no finished run and those where a
    metric the condition reads is present but not a finite number (a damaged or hand-edited store)."""
    out = []
    for c in report.cells:
        values = {m: c.value(m) for m in condition.metrics}
        if c.finished == 0 or _unreadable(values) or condition.holds(values):
            out.append((c, values))
    return out


def _unreadable(values: dict[str, Any]) -> list[str]:
    """The metrics whose value is present but not a finite number."""
    import math

    return [m for m, v in values.items() if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                                                or not math.isfinite(v))]


def _write(text: str, out: str | None) -> None:
    from ..runner.outputs import OutputError, atomic_write_text, terminal_safe
    from .aggregate import ReportError

    if out is None:
        sys.stdout.write(text)
        return
    try:
        atomic_write_text(out, text, option="--out", make_parents=False)
    except OutputError as exc:
        raise ReportError(str(exc)) from None
    print(f"wrote {terminal_safe(out)}", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    from .aggregate import ReportError, resolve_metrics
    from .load import load_report
    from .fail_if import parse_fail_if
    from .tables import fmt_value

    for name in ("margin", "asr_level"):
        v = getattr(args, name)
        if not (0.0 <= v <= 1.0):
            raise ReportError(f"--{name.replace('_', '-')} = {v}: must be in [0, 1]")
    condition = parse_fail_if(args.fail_if) if args.fail_if is not None else None
    metrics = resolve_metrics(args.metric) if args.metric else None
    report = load_report(args.dir, accuracy_margin=args.margin, asr_level=args.asr_level)
    if metrics:
        report.refuse_inapplicable(metrics, "--metric")
    if condition is not None:
        report.refuse_inapplicable(condition.metrics, "--fail-if")
    metrics = metrics or _default_metrics(args.format, report)

    if args.format == "table":
        from rich.console import Console

        if args.out:
            import io

            buf = io.StringIO()
            _print_table(Console(file=buf, width=200, color_system=None), report, metrics)
            _write(buf.getvalue(), args.out)
        else:
            _print_table(Console(width=None if sys.stdout.isatty() else 200), report, metrics)
    elif args.format == "html":
        from .html import write_html

        path = write_html(report, args.out, metrics)
        print(f"HTML report: {path}")
    else:
        from .formats import to_csv, to_json, to_markdown

        render = {"md": to_markdown, "json": to_json, "csv": to_csv}[args.format]
        _write(render(report, metrics), args.out)

    if condition is None:
        return 0
    unjudged = [c.cell_id for c in report.cells if c.finished == 0]
    if unjudged:
        print(f"--fail-if: {len(unjudged)} cell(s) have no finished run; nothing can be judged there, so the "
              "gate fails closed on them", file=sys.stderr)
    from ..runner.outputs import terminal_safe

    failing = fail_if_cells(report, condition)
    held = {id(c) for c, _ in failing}
    broken = [c for c in report.cells if c.broken and id(c) not in held]
    if not failing and not broken:
        print(f"--fail-if {condition.text!r}: no cell fails ({len(report.cells)} checked)", file=sys.stderr)
        return 0
    n = len(failing) + len(broken)
    print(f"--fail-if {condition.text!r}: {n} of {len(report.cells)} cell(s) fail:", file=sys.stderr)
    for c, values in failing:
        if c.finished == 0:
            print(f"  {terminal_safe(c.cell_id)}: no finished run (fails closed)", file=sys.stderr)
            continue
        bad = _unreadable(values)
        if bad:
            print(f"  {terminal_safe(c.cell_id)}: {', '.join(bad)} not a finite number in the store (fails closed)",
                  file=sys.stderr)
            continue
        vals = ", ".join(f"{m} = {'null' if v is None else fmt_value(m, v)}" for m, v in values.items())
        why = f" (and the model broke in {c.broken} of {c.finished} seed(s))" if c.broken else ""
        print(f"  {terminal_safe(c.cell_id)}: {vals}{why}", file=sys.stderr)
    for c in broken:
        print(f"  {terminal_safe(c.cell_id)}: the model broke (non-finite) in {c.broken} of {c.finished} seed(s); "
              "its metrics are undefined, so the gate fails closed", file=sys.stderr)
    return 1


def _print_table(console: Any, report: Any, metrics: Sequence[str]) -> None:
    from .tables import print_tables

    print_tables(console, report, metrics)


@dataclass(frozen=True, slots=True)
class MatrixSummaryReport:
    """What :func:`print_summary` made: the HTML report's path (``None`` if it could not
    be written, with the reason in ``html_error`` when writing it failed) and how many
    ``[[expect]]`` rows fail (``redteam matrix`` then exits 1)."""

    html: Path | None
    failed_expectations: int = 0
    html_error: str | None = None


def print_summary(console: Any, out_dir: str | Path) -> MatrixSummaryReport:
    """After ``redteam matrix``: the accuracy-drop table, the expectations' tally, and the
    HTML report written to ``OUT/report.html`` (its path printed). A report that cannot
    be made is printed as the reason, nothing raised."""
    from ..errors import RedteamError
    from .load import load_report
    from .tables import _markup as escape, default_table_metrics, print_tables

    try:
        report = load_report(out_dir)
    except RedteamError as exc:
        console.print(f"[yellow]no report: {escape(str(exc))}[/yellow]")
        return MatrixSummaryReport(None)
    print_tables(console, report, default_table_metrics(report))
    bad = [e for e in report.expectations if e.failure]
    if report.expectations:
        style = "red" if bad else "green"
        console.print(f"[{style}]expectations: {len(report.expectations) - len(bad)} of "
                      f"{len(report.expectations)} hold[/{style}]")
        for e in bad:
            console.print(f"  [red]{escape(e.cell_id)}: expect #{e.index + 1} ({escape(e.description)}): "
                          f"{escape(e.failure or '')}[/red]")
    try:
        from ..runner.outputs import terminal_safe
        from .html import write_html

        # drawing the figures takes a while (tens of seconds for a large matrix on a busy machine)
        target = terminal_safe(str(report.out_dir / "report.html"))
        print(f"redteam: writing the HTML report ({len(report.cells)} cells, with figures) to {target} ...",
              file=sys.stderr, flush=True)
        path = write_html(report)
    except ImportError as exc:  # matplotlib is a dependency; say so rather than fail the matrix
        console.print(f"[yellow]HTML report skipped: {escape(str(exc))}[/yellow]")
        return MatrixSummaryReport(None, len(bad))
    except RedteamError as exc:  # e.g. a full disk or an unwritable OUT/report.html: the runs are stored
        console.print(f"[yellow]HTML report not written: {escape(str(exc))}[/yellow]")
        return MatrixSummaryReport(None, len(bad), str(exc))
    console.print(f"HTML report: [bold]{escape(str(path))}[/bold]")
    return MatrixSummaryReport(path, len(bad))
