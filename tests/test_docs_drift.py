"""What the docs and comments say matches what the code does (issue 24 §1): the README's
runnable shell blocks run as written, scenario headers count what their files hold,
labels match outputs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted(ROOT.glob("scenarios/**/*.toml"))


def test_scenario_header_counts_match_the_matrix():
    """A header comment "(N attacks x M defenses)" counts the file's [matrix]."""
    checked = 0
    for path in SCENARIOS:
        text = path.read_text(encoding="utf-8")
        m = None
        for a, d in re.findall(r"^#.*?\b(\d+) attacks x (\d+) defenses", text, flags=re.M):
            m = tomllib.loads(text).get("matrix", {}) if m is None else m
            assert (int(a), int(d)) == (len(m.get("attacks", [])), len(m.get("defenses", []))), (path.name, a, d)
            checked += 1
    assert checked  # scenarios/llm.toml states one


def test_llm_header_states_the_outer_lr_the_file_uses():
    text = (ROOT / "scenarios" / "llm.toml").read_text(encoding="utf-8")
    header = "\n".join(line for line in text.splitlines()[:12] if line.startswith("#"))
    lr = tomllib.loads(text)["federation"]["server_lr"]
    stated = re.search(r"\bat lr ([0-9.]+)", header)
    assert stated and float(stated.group(1)) == lr, header


# ------------------------------------------------------------------ runnable shell blocks
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
_MARK = re.compile(r"^<!-- runnable(?:; setup: (?P<setup>.*?))? -->\n```(?:bash|sh|console)\n(?P<body>.*?)^```",
                   flags=re.M | re.S)


def runnable_blocks() -> list[tuple[str, str, list[str]]]:
    """``(where, setup, commands)`` of every shell block marked ``<!-- runnable -->`` in the
    docs (the marker line just above the fence; ``; setup: CMD`` prepares the folder it runs in)."""
    out = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in _MARK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            cmds = [c for c in m.group("body").splitlines() if c.strip() and not c.lstrip().startswith("#")]
            out.append((f"{doc.relative_to(ROOT)}:{line}", m.group("setup") or "", cmds))
    return out


def _comment(cmd: str) -> str:
    """The trailing ``# comment`` of a command line (none inside quotes in our blocks)."""
    return cmd.split("  #", 1)[1] if "  #" in cmd else ""


def test_the_provenance_walk_through_is_marked_runnable():
    assert any("redteam provenance verify" in " ".join(cmds) for _, _, cmds in runnable_blocks())


@pytest.mark.parametrize("where, setup, cmds", runnable_blocks(), ids=[w for w, _, _ in runnable_blocks()])
def test_runnable_doc_block_runs_as_written(where, setup, cmds, tmp_path):
    """Each command of the block, in order, in a fresh folder, as a user types it: exit 0;
    a command whose comment says "(JSON" prints JSON."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               OMP_NUM_THREADS="1")
    if setup:
        subprocess.run(["bash", "-c", setup], cwd=tmp_path, check=True, env=env)
    for cmd in cmds:
        r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, f"{where}: `{cmd}` exited {r.returncode}: {r.stderr.strip()[-2000:]}"
        if re.search(r"\(JSON\b", _comment(cmd)):  # labelled JSON: prints JSON
            try:
                json.loads(r.stdout)
            except ValueError:
                pytest.fail(f"{where}: `{cmd}` is labelled JSON but printed: {r.stdout[:300]!r}")


# ------------------------------------------------------------------ provenance errors name the CLI's options
@pytest.fixture()
def signed(tmp_path, monkeypatch, capsys):
    from redteam.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("one\n")
    for argv in (["provenance", "keygen", "--out", "client"], ["provenance", "keygen", "--out", "log", "--type", "ed25519"],
                 ["provenance", "manifest", "data", "--client", "c0", "--dataset", "toy", "--version", "1",
                  "--license", "MIT", "--out", "stmt.json"],
                 ["provenance", "sign", "stmt.json", "--key", "client.pem", "--out", "bundle.json"],
                 ["ledger", "init", "ledger.sqlite", "--key", "log.pem", "--origin", "example.org/log",
                  "--trusted-root", "trusted_root.json"],
                 ["provenance", "sign", "stmt.json", "--key", "client.pem", "--format", "dsse", "--out", "env.json"],
                 ["ledger", "append", "ledger.sqlite", "env.json", "--pub", "client.pub", "--key", "log.pem",
                  "--out", "logged.json"]):
        assert main(argv) == 0, argv
    capsys.readouterr()
    return main


@pytest.mark.parametrize("trust", [["--trusted-root", "trusted_root.json"], ["--ledger", "ledger.sqlite"]])
def test_a_bundle_without_a_log_entry_names_the_cli_flag(signed, capsys, trust):
    assert signed(["provenance", "verify", "bundle.json", "--pub", "client.pub", *trust]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no transparency-log entry" in err, err
    assert "--allow-missing-tlog" in err and "require_tlog" not in err, err
    assert signed(["provenance", "verify", "bundle.json", "--pub", "client.pub", *trust, "--allow-missing-tlog"]) == 0
    assert signed(["provenance", "verify", "logged.json", "--pub", "client.pub", *trust]) == 0
    assert "logged at index 0 of 1" in capsys.readouterr().out


def test_a_logged_bundle_without_a_trusted_log_names_the_cli_flags(signed, capsys):
    assert signed(["provenance", "verify", "logged.json", "--pub", "client.pub"]) == 2
    err = capsys.readouterr().err
    assert "--trusted-root" in err and "--ledger" in err and "log_key" not in err, err
    assert signed(["provenance", "verify", "bundle.json", "--pub", "client.pub", "--require-tlog"]) == 1
    assert "no transparency-log entry" in capsys.readouterr().err


def test_ledger_prove_prints_what_its_help_says(signed, capsys):
    """Text by default, JSON with --json, and the help says which."""
    import json

    from redteam.cli import build_parser

    assert signed(["ledger", "prove", "ledger.sqlite", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("inclusion proof of entry 0") and "checkpoint:" in text
    assert signed(["ledger", "prove", "ledger.sqlite", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["logIndex"] == 0
    sub = next(a for a in build_parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    ledger = next(a for a in sub.choices["ledger"]._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    helps = {c.dest: c.help for c in ledger._choices_actions}
    assert "text; JSON with --json" in helps["prove"], helps["prove"]
