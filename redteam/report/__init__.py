"""Reports of a results store: terminal tables, Markdown, HTML, JSON, CSV, and a CI gate.

::

    from redteam.report import load_report, to_markdown, write_html, parse_fail_if

    report = load_report("results/")                 # cells × seeds → mean and 95 % interval
    print(to_markdown(report, ["accuracy_drop", "recall"]))
    write_html(report)                               # results/report.html, self-contained
    gate = parse_fail_if("asr > 0.2 or accuracy_drop > 0.05")
    failing = [c.cell_id for c in report.cells if gate.holds({m: c.value(m) for m in gate.metrics})]

The command line is ``redteam report DIR`` (:mod:`redteam.report.cli`). Only
:mod:`~redteam.report.html` needs matplotlib, and only when a page is drawn.
"""

from .aggregate import (
    REPORT_METRICS,
    BreakdownRow,
    CellSummary,
    Curve,
    EnvelopeRow,
    ExpectationResult,
    Report,
    ReportError,
    SharedDraw,
    Stat,
    aggregate_cells,
    breakdown,
    check_expectations,
    convergence,
    envelope_utilisation,
    shared_draws,
)
from .fail_if import FailIf, FailIfError, parse_fail_if
from .load import load_report, report_from_rows
from .formats import report_dict, to_csv, to_json, to_markdown, toml_dump

from .html import render_html, write_html

__all__ = [
    "REPORT_METRICS",
    "Report",
    "CellSummary",
    "Stat",
    "Curve",
    "BreakdownRow",
    "EnvelopeRow",
    "ExpectationResult",
    "ReportError",
    "load_report",
    "report_from_rows",
    "aggregate_cells",
    "convergence",
    "breakdown",
    "envelope_utilisation",
    "check_expectations",
    "SharedDraw",
    "shared_draws",
    "FailIf",
    "FailIfError",
    "parse_fail_if",
    "to_markdown",
    "to_json",
    "to_csv",
    "report_dict",
    "toml_dump",
    "render_html",
    "write_html",
]
