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


def test_top_level_examples_cover_every_command():
    """`redteam --help` shows an example of each command, a matrix run into a store among them."""
    from redteam.cli import _EPILOG

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    examples = [line.split()[1] for line in _EPILOG.splitlines() if line.strip().startswith("redteam ")]
    assert not set(sub.choices) - set(examples), sorted(set(sub.choices) - set(examples))
    assert "redteam matrix scenarios/smoke.toml --out results/smoke" in _EPILOG


@pytest.mark.parametrize("argv, command", [
    (["run", "x.toml", "--nope"], "run"),
    (["run", "--nope", "x.toml"], "run"),
    (["matrix", "x", "--nope"], "matrix"),
    (["report", "d", "--nope"], "report"),
    (["limits", "f.toml", "--nope"], "limits"),
    (["ledger", "prove", "l.sqlite", "0", "--nope"], "ledger prove"),
    (["provenance", "verify", "b.json", "--nope"], "provenance verify"),
    (["attacks", "list", "--nope"], "attacks list"),
    (["--nope"], None),
])
def test_an_unknown_flag_is_one_line_with_one_prefix_naming_its_command(argv, command, capsys):
    from redteam.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.count("redteam: error:") == 1, err
    assert not err.startswith("redteam: error: redteam"), err
    where = f"{command}: " if command else ""
    prog = f"redteam {command}" if command else "redteam"
    assert err.startswith(f"redteam: error: {where}unrecognized arguments: --nope"), err
    assert err.rstrip().endswith(f"(see: {prog} --help)"), err


def test_the_standalone_provenance_entry_point_has_one_prefix():
    proc = subprocess.run([sys.executable, "-m", "provenance.cli", "ledger", "prove", "l", "0", "--nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("redteam: error: ledger prove: unrecognized arguments: --nope"), proc.stderr
