"""The reference renders the docstrings' Sphinx roles (``:class:`~a.b.C```) as cross-references,
and a role naming an object that does not exist fails ``mkdocs build --strict``
(docs/sphinx_roles.py, a Griffe extension mkdocs.yml loads)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = ROOT / "docs" / "sphinx_roles.py"

TINY = '''\
"""A tiny package.

See :class:`Present`, :class:`~tiny.Present`, :meth:`Present.run`, :func:`tiny.helper`,
:func:`hidden`, :mod:`ast` and :func:`tempfile.mkstemp`.
"""

import ast


class Present:
    """A class."""

    def run(self):
        """Run it; :meth:`run` again."""


def helper():
    """A helper."""


def _hidden():
    pass


hidden = _hidden
'''


def _project(tmp_path: Path, source: str) -> Path:
    (tmp_path / "src" / "tiny").mkdir(parents=True)
    (tmp_path / "src" / "tiny" / "__init__.py").write_text(source)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Tiny\n\n::: tiny\n")
    (tmp_path / "mkdocs.yml").write_text(textwrap.dedent(f"""\
        site_name: tiny
        strict: true
        plugins:
          - mkdocstrings:
              handlers:
                python:
                  paths: [src]
                  options:
                    extensions: [{{"{EXTENSION.as_posix()}": {{packages: [tiny]}}}}]
                    show_root_heading: true
                    show_source: false
                    filters: ["!^_"]
        """))
    return tmp_path


def _build(proj: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(proj / "site")],
                          cwd=proj, capture_output=True, text=True, timeout=120)


def test_roles_become_links_or_code(tmp_path):
    proj = _project(tmp_path, TINY)
    r = _build(proj)
    assert r.returncode == 0, r.stderr[-3000:]
    html = (proj / "site" / "index.html").read_text()
    assert not re.search(r":(class|func|meth|mod|data|attr):", html), "a raw Sphinx role is left in the page"
    links = dict((text, href) for href, text in
                 re.findall(r'<a class="autorefs[^"]*"[^>]*href="([^"]+)"[^>]*><code>([^<]+)</code></a>', html))
    assert links["Present"] == "#tiny.Present" and links["Present.run"] == "#tiny.Present.run"
    assert links["tiny.helper"] == "#tiny.helper" and links["run"] == "#tiny.Present.run"
    # an object that exists but is not rendered (filtered out), and other packages' objects: code
    for name in ("hidden", "ast", "tempfile.mkstemp"):
        assert f"<code>{name}</code>" in html and name not in links


@pytest.mark.parametrize("role", [":class:`Gone`", ":meth:`~tiny.Present.stop`", ":mod:`.nowhere`"])
def test_a_role_naming_nothing_fails_the_strict_build(tmp_path, role):
    proj = _project(tmp_path, TINY.replace("See :class:`Present`", f"See {role}, :class:`Present`"))
    r = _build(proj)
    assert r.returncode != 0, "a dangling reference built"
    assert "Could not find cross-reference target 'tiny." in r.stderr, r.stderr[-3000:]
