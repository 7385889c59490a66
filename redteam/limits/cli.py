"""``redteam limits FILE.toml [--out DIR] [--json]``."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "limits",
        help="the seven failure modes of peer-to-peer LLM training, computed for a proposal's numbers",
        description=textwrap.dedent(
            """\
            Read a limits file (see scenarios/limits.toml) and answer, from stated formulas and the
            harness's own codecs, manifests and network simulator: (1) bytes and upload time per peer
            per round for each model and codec; (2) round time, dropped work and idle time as peers
            grow, under churn and a deadline; (3) the FedAvg accuracy gap under non-IID data, trained
            here on digits; (4) training memory against consumer cards, with and without activation
            checkpointing; (5) GPU-hours, energy and money to reach the target tokens, federated vs a
            centralized cluster; (6) and (7) the security envelope and the provenance gate, summarised
            from their results stores when [limits.results] names them.

            Prints a summary; with --out writes DIR/limits.json (redteam.limits/v1) and DIR/limits.html
            (plots). Every formula and its source is in docs/limits.md."""
        ),
        epilog="example:\n  redteam limits scenarios/limits.toml --out results/limits",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="limits TOML file (e.g. scenarios/limits.toml)")
    p.add_argument("--out", metavar="DIR", help="write limits.json and limits.html into DIR")
    p.add_argument("--json", action="store_true", help="print the JSON result to stdout instead of tables")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    from ..cli_common import _THREADS_HELP, _threads_arg

    p.add_argument("--threads", type=_threads_arg, default=None, metavar="auto|N", help=_THREADS_HELP)
    p.set_defaults(handler=_cmd_limits)


def print_summary(console: Any, res: dict[str, Any]) -> None:
    """The summary tables within ``console.width``: values never wrap or break (a table
    too wide is stacked, repeating its first column), headers and titles wrap at words."""
    from rich.text import Text

    from ..report.fit import FitColumn, fit_tables
    from ..runner.outputs import terminal_safe
    from .render import summary_lines

    for title, header, rows in summary_lines(res):
        console.print(Text(terminal_safe(title)))
        if not header:
            continue
        columns = [FitColumn(terminal_safe(h), "left" if i == 0 else "right") for i, h in enumerate(header)]
        cells = [[Text(terminal_safe(c)) for c in row] for row in rows]
        for span, table in fit_tables(console.width, columns, cells, keep=1):
            if span:
                console.print(Text(f"  columns {span[0]}–{span[1]} of {len(header) - 1}"))
            console.print(table)


def _cmd_limits(args: argparse.Namespace) -> int:
    from ..runner.outputs import check_output_dir
    from .config import load_limits

    cfg = load_limits(args.file)
    out = check_output_dir(args.out, option="--out", sqlite_file_ok=False) if args.out else None
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - t0:5.1f} s] {msg}", file=sys.stderr, flush=True)

    from .compute import compute_all
    from .render import to_json, write_outputs

    res = compute_all(cfg, progress, threads=args.threads)
    if args.json:
        sys.stdout.write(to_json(res))
    else:
        from rich.console import Console

        # a pipe or a file gets 160 columns unless COLUMNS says otherwise
        width = None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 160
        print_summary(Console(width=width, markup=False, highlight=False), res)
    if out is not None:
        paths = write_outputs(res, Path(out))
        print(f"JSON: {paths['json']}\nHTML report: {paths['html']}", file=sys.stderr if args.json else sys.stdout)
    return 0
