"""scripts/explore_properties.py (issue 39): a bounded pass of the property tests on fresh inputs
that prints what it finds and never fails the build."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import explore_properties as X  # noqa: E402


def test_the_rotation_walks_every_property_file():
    files = X.property_files(ROOT / "tests")
    assert ROOT / "tests" / "test_defenses_median_exact.py" in files
    assert ROOT / "tests" / "test_explore_properties.py" not in files  # no @given here
    seen = {f for day in range(len(files)) for f in X.pick(files, 20261206 + day, 3)}
    assert seen == set(files) and len(X.pick(files, 5, 3)) == 3
    assert X.pick(files[:2], 0, 3) == files[:2] and X.pick([], 1, 3) == []


def _explore(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "explore_properties.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_a_find_is_printed_with_its_seed_and_the_exit_is_0(tmp_path):
    f = tmp_path / "test_prop.py"
    f.write_text(textwrap.dedent("""
        from hypothesis import given, settings, strategies as st

        @settings(max_examples=300, database=None)
        @given(x=st.integers(0, 1000))
        def test_small(x):
            assert x < 600
    """))
    res = _explore("--seed", "11", "--budget", "120", str(f))
    assert res.returncode == 0, res.stderr
    assert "NEW FIND (seed 11)" in res.stdout and "test_small" in res.stdout
    assert "Falsifying example" in res.stdout and "--hypothesis-seed 11" in res.stdout
    f.write_text(f.read_text().replace("x < 600", "x <= 1000"))
    res = _explore("--seed", "11", "--budget", "120", str(f))
    assert res.returncode == 0 and "nothing new (1 passed" in res.stdout


def test_bad_arguments_exit_2():
    assert _explore("--files", "0").returncode == 2
