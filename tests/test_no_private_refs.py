"""No tracked file cites the maintainers' private notes, which users do not have: every
citation names the paper, the standard or the module itself instead."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NEEDLES = ("REFERENCES.md", "REFERENCES §", "DESIGN.md")


def tracked_files() -> list[Path]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / p for p in done.stdout.decode("utf-8").split("\0") if p]


def test_no_tracked_file_cites_private_notes():
    me = Path(__file__).resolve()
    hits = []
    for path in tracked_files():
        if path.resolve() == me or not path.is_file():
            continue
        data = path.read_bytes()
        for needle in NEEDLES:
            if needle.encode("utf-8") in data:
                line = data[: data.index(needle.encode("utf-8"))].count(b"\n") + 1
                hits.append(f"{path.relative_to(ROOT)}:{line}: {needle}")
    assert not hits, "cite the source itself, not private notes:\n" + "\n".join(hits)
