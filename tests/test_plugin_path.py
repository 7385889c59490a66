"""The plugin path end to end: a third-party attack package, installed, found, checked, run.

``examples/redteam-example-attack`` is built and installed with pip (offline: no index,
no build isolation, no dependencies) into a temporary directory, never into the real
environment. Each test puts that directory on ``sys.path`` and takes it off again, so
the only way redteam can find the attack is the installed distribution's
``redteam.attacks`` entry point.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import redteam
from redteam.errors import InvalidParameter, UnknownPlugin
from redteam.federation.loop import Federation
from redteam.scenario import parse_scenario
from redteam.testing import check_attack

from _example_install import importable, install_example

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "redteam-example-attack"
NAME, DIST = "example_scale", "redteam-example-attack"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example package pip-installed into a fresh directory."""
    return install_example(EXAMPLE, "redteam_example_attack", tmp_path_factory)


@pytest.fixture
def on_path(site):
    """The installed example importable for one test, then gone without a trace."""
    with importable(site, "redteam_example_attack", redteam.ATTACKS, NAME) as path:
        yield path


def test_entry_point_resolves_to_the_installed_package(on_path):
    assert NAME in redteam.ATTACKS.names()
    cls = redteam.ATTACKS.get(NAME)
    assert cls.__name__ == "ScaledFlip" and Path(sys.modules[cls.__module__].__file__).is_relative_to(on_path)
    info = redteam.ATTACKS.info(NAME)
    assert info.distribution == DIST and info.target == "redteam_example_attack:ScaledFlip"
    assert ("scale", "float", 10.0) in info.parameters and info.reference.startswith("Karimireddy")
    assert redteam.attack(NAME, scale=3.0).scale == 3.0
    with pytest.raises(InvalidParameter, match=r"ScaledFlip.scale = -1.0: must be a finite number > 0"):
        redteam.attack(NAME, scale=-1.0)


def test_cli_lists_it_with_its_package(on_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(on_path), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "250"}
    table = subprocess.run([sys.executable, "-m", "redteam.cli", "attacks", "list"], capture_output=True,
                           text=True, env=env, check=True).stdout
    row = next(line for line in table.splitlines() if NAME in line)
    assert DIST in row and "Scaled sign flip" in row and "scale = 10.0" in row and "Karimireddy" in row
    names = subprocess.run([sys.executable, "-m", "redteam.cli", "attacks", "list", "--names"],
                           capture_output=True, text=True, env=env, check=True).stdout.split()
    assert NAME in names and "sign_flip" in names


def test_it_meets_the_plugin_contract(on_path):
    report = check_attack(NAME)
    assert report.examples == 10 and "finite in → finite out" in report.checked


def _scenario(attack, defense):
    return parse_scenario({
        "scenario": {"name": "plugin-path", "seed": 0},
        "workload": {"name": "synthetic"},
        "federation": {"clients": 10, "malicious_fraction": 0.3, "rounds": 2, "partition": "iid",
                       "local_steps": 5, "lr": 0.1},
        "attack": attack,
        "defense": defense,
    })


def test_it_runs_in_a_federation(on_path):
    # 3 of 10 clients send −10 × their honest update. A norm bound at twice the median
    # norm (the median is an honest norm: 7 of 10 are honest) rejects exactly them.
    bounded = Federation(_scenario({"name": NAME, "scale": 10.0},
                                   {"name": "norm_bound", "mode": "reject", "multiplier": 2.0})).run()
    assert len(bounded.malicious) == 3 and len(bounded.records) == 2
    for rec in bounded.records:
        for c in range(10):
            if c in bounded.malicious:
                assert not rec.accepted[c] and "norm" in rec.rejected[c]
            else:
                assert rec.accepted[c]
    # Under a plain mean the aggregate is about (7 − 3·10)/10 = −2.3 × the honest mean
    # update: every round steps uphill, while the bounded run averaged the honest rows.
    attacked = Federation(_scenario({"name": NAME, "scale": 10.0}, {"name": "mean"})).run()
    assert all(all(r.accepted) for r in attacked.records)
    assert attacked.records[1].loss > attacked.records[0].loss
    assert attacked.records[-1].loss > bounded.records[-1].loss


def test_nothing_is_left_behind(site):
    assert NAME not in redteam.ATTACKS.names()
    with pytest.raises(UnknownPlugin):
        redteam.attack(NAME)
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution(DIST)
    assert not (EXAMPLE / "build").exists() and not list(EXAMPLE.glob("*.egg-info"))


def test_docs_show_the_example_verbatim():
    page = (EXAMPLE.parents[1] / "docs" / "plugin-example.md").read_text(encoding="utf-8")
    section = page[page.index("# Write an attack in 20 lines"):]
    source = (EXAMPLE / "redteam_example_attack" / "__init__.py").read_text(encoding="utf-8")
    assert f"```python\n{source}```" in section, "docs/plugin-example.md's example is out of date with examples/"
    assert 'example_scale = "redteam_example_attack:ScaledFlip"' in (EXAMPLE / "pyproject.toml").read_text()
    assert 'example_scale = "redteam_example_attack:ScaledFlip"' in section
    assert 'check_attack("example_scale")' in section
