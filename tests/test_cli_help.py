"""The command line explains itself (issue 24 §1): every argument of every command has help
text, the top-level examples cover the commands, and a usage error is one line with one
``redteam: error:`` prefix naming the command it concerns."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from redteam.cli import build_parser


def _walk(parser: argparse.ArgumentParser, path: str):
    """``(path, action)`` of every argument below ``parser``, subcommands included."""
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in a._choices_actions}
            for name, sub in a.choices.items():
                yield f"{path} {name}", helps.get(name)
                yield from _walk(sub, f"{path} {name}")
            continue
        yield f"{path} {'/'.join(a.option_strings) or a.dest}", a.help


def test_every_argument_of_every_command_has_help_text():
    items = list(_walk(build_parser(), "redteam"))
    assert len(items) > 100 and any(p == "redteam ledger prove index" for p, _ in items)
    missing = [p for p, h in items if not h or h == argparse.SUPPRESS or not str(h).strip()]
    assert not missing, f"no help text: {missing}"
