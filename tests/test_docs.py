"""The reference docs build from the docstrings, strictly: a broken link, a missing object or
a docstring that does not render fails the suite (issue: docs a plugin author can follow)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parent.parent


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, capture_output=True, text=True, timeout=300)


def test_reference_builds_strictly(tmp_path):
    r = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stderr[-3000:]
    attacks = (tmp_path / "site" / "reference" / "attacks" / "index.html").read_text()
    # every registered built-in attack has its docstring on the page
    assert "sign_flip" in attacks and "Karimireddy" in attacks
    # the docstrings' Sphinx roles render as links or code (docs/sphinx_roles.py), never as raw text
    raw = [f"{page.relative_to(tmp_path)}: {m}" for page in sorted((tmp_path / "site").glob("**/*.html"))
           for m in re.findall(r":(?:class|func|meth|data|mod|attr|exc|obj):<code>[^<]*</code>", page.read_text())]
    assert not raw, "\n".join(raw)


def test_a_broken_link_or_a_missing_object_fails_the_build(tmp_path):
    proj = tmp_path / "p"
    shutil.copytree(ROOT / "docs", proj / "docs")
    shutil.copy(ROOT / "mkdocs.yml", proj / "mkdocs.yml")
    text = (proj / "mkdocs.yml").read_text().replace("paths: [.]", f"paths: [{ROOT}]")
    (proj / "mkdocs.yml").write_text(text)
    idx = proj / "docs" / "index.md"
    good = idx.read_text()
    idx.write_text(good + "\nSee [nowhere](no-such-page.md).\n")
    assert _build(proj / "mkdocs.yml", tmp_path / "s1").returncode != 0
    idx.write_text(good + "\n::: redteam.no_such_module\n")
    assert _build(proj / "mkdocs.yml", tmp_path / "s2").returncode != 0
