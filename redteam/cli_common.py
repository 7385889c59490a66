"""Helpers shared by the ``redteam`` command and its sub-command modules.

:mod:`redteam.cli` builds the top-level parser and imports the sub-command modules
(:mod:`redteam.report.cli`, :mod:`redteam.limits.cli`, :mod:`redteam.data_cli`,
:mod:`provenance.cli`); those import what they share with it from here, never
:mod:`redteam.cli` itself. Nothing heavy (torch) is imported, so ``redteam --help``
stays fast.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from .errors import RedteamError

__all__ = ["usage_error_line"]


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line, ``redteam: error: ...``, exit status 2 (sub-commands
    are built from the same class, so theirs are too)."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]
        self.exit(2, usage_error_line(self.prog, message) + "\n")


def usage_error_line(prog: str, message: str) -> str:
    """``redteam: error: [COMMAND: ]MESSAGE (see: PROG --help)``: one ``redteam:`` prefix,
    then the sub-command the error concerns (none for the top level)."""
    from .runner.outputs import terminal_safe

    command = prog.split(" ", 1)[1] if prog.startswith("redteam ") else ("" if prog == "redteam" else prog)
    where = f"{terminal_safe(command)}: " if command else ""
    return f"redteam: error: {where}{terminal_safe(message)} (see: {terminal_safe(prog)} --help)"


def _leaf_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)command parser that parsed ``args``: where an unknown option belongs."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, sub.dest, None) if sub is not None else None
        if chosen not in (sub.choices if sub is not None else {}):
            return parser
        parser = sub.choices[chosen]


_THREADS_HELP = ("intra-op threads per run: auto (default: 1 for small federations, a share of the cores "
                 "for large models) or N; env REDTEAM_THREADS. OpenMP threads wait passively "
                 "(OMP_WAIT_POLICY=PASSIVE unless set), here and in every process started from here "
                 "(docs/running.md, \"Threads\")")


def _threads_arg(value: str) -> str | int:
    from .runner.threads import parse_threads

    try:
        return parse_threads(value)
    except RedteamError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
