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
