"""The defense plugin path end to end: ``examples/redteam-example-defense``, installed, found
through its entry point, checked with the contract kit, run in a federation; and the guide
(docs/plugins.md) shows its source verbatim, so the page fails the suite when it drifts.

As in test_plugin_path.py, the package is pip-installed (offline: no index, no build
isolation, no dependencies) into a temporary directory, never into the real environment,
and each test puts that directory on ``sys.path`` and takes it off again.
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
from redteam.testing import check_defense

from _example_install import importable, install_example

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "redteam-example-defense"
SOURCE = EXAMPLE / "redteam_example_defense" / "__init__.py"
NAME, DIST, MODULE = "example_clipped_mean", "redteam-example-defense", "redteam_example_defense"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example package pip-installed into a fresh directory."""
    return install_example(EXAMPLE, MODULE, tmp_path_factory)


@pytest.fixture
def on_path(site):
    """The installed example importable for one test, then gone without a trace."""
    with importable(site, MODULE, redteam.DEFENSES, NAME) as path:
        yield path


def test_entry_point_resolves_to_the_installed_package(on_path):
    assert NAME in redteam.DEFENSES.names()
    cls = redteam.DEFENSES.get(NAME)
    assert cls.__name__ == "ClippedMean" and Path(sys.modules[cls.__module__].__file__).is_relative_to(on_path)
    info = redteam.DEFENSES.info(NAME)
    assert info.distribution == DIST and info.target == f"{MODULE}:ClippedMean"
    assert ("radius", "float", 1.0) in info.parameters and info.reference.startswith("Sun, Kairouz")
    assert redteam.defense(NAME, radius=3).radius == 3
    with pytest.raises(InvalidParameter, match=r"ClippedMean.radius = 0.0: must be a finite number > 0"):
        redteam.defense(NAME, radius=0.0)


def test_cli_lists_it_with_its_package(on_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(on_path), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "250"}
    table = subprocess.run([sys.executable, "-m", "redteam.cli", "defenses", "list"], capture_output=True,
                           text=True, env=env, check=True).stdout
    row = next(line for line in table.splitlines() if NAME in line)
    assert DIST in row and "Clip each update" in row and "radius = 1.0" in row


def test_it_meets_the_plugin_contract(on_path):
    report = check_defense(NAME)
    assert "finite in → finite out" in report.checked and "non-finite rows rejected with a reason" in report.checked
    assert not report.not_checked  # symmetric, unanimous, screens non-finite rows: every property applies


def test_what_it_decides():
    import torch

    sys.path.insert(0, str(EXAMPLE))
    try:
        from redteam_example_defense import ClippedMean
    finally:
        sys.path.remove(str(EXAMPLE))
        sys.modules.pop(MODULE, None)
    rows = torch.tensor([[3.0, 4.0], [float("nan"), 0.0], [0.3, 0.4], [0.0, 0.0]])
    dec = ClippedMean(radius=1.0)(rows)
    # (3, 4) is clipped to (0.6, 0.8); the NaN row is out; the mean of the three others
    assert torch.allclose(dec.aggregate, torch.tensor([0.3, 0.4]))
    assert dec.accepted.tolist() == [True, False, True, True] and dec.reasons == {1: "non-finite update"}
    assert dec.aggregate.dtype == rows.dtype and dec.weights.tolist() == [1.0, 0.0, 1.0, 1.0]


def _scenario(attack, defense):
    return parse_scenario({
        "scenario": {"name": "plugin-defense", "seed": 0},
        "workload": {"name": "synthetic"},
        "federation": {"clients": 10, "malicious_fraction": 0.3, "rounds": 3, "partition": "iid",
                       "local_steps": 5, "lr": 0.1},
        "attack": attack,
        "defense": defense,
    })


def test_it_runs_in_a_federation(on_path):
    # 3 of 10 clients send −10 × their honest update. The honest updates are shorter than
    # radius 1, so clipping leaves them alone and caps the flipped ones: training still makes
    # progress, while under the plain mean every round steps uphill.
    flip = {"name": "sign_flip", "scale": 10.0}
    clipped = Federation(_scenario(flip, {"name": NAME, "radius": 1.0})).run()
    assert len(clipped.malicious) == 3 and len(clipped.records) == 3
    assert all(all(r.accepted) for r in clipped.records)
    losses = [r.loss for r in clipped.records]
    assert losses[2] < losses[1] < losses[0]
    attacked = Federation(_scenario(flip, {"name": "mean"})).run()
    assert attacked.records[2].loss > attacked.records[1].loss > attacked.records[0].loss
    assert attacked.records[-1].loss > 10 * clipped.records[-1].loss
    # without an attack nothing is clipped: the plain mean's run, up to float64 rounding
    quiet = Federation(_scenario({"name": "none"}, {"name": NAME, "radius": 1.0})).run()
    plain = Federation(_scenario({"name": "none"}, {"name": "mean"})).run()
    assert [r.loss for r in quiet.records] == pytest.approx([r.loss for r in plain.records], rel=1e-4)


def test_nothing_is_left_behind(site):
    assert NAME not in redteam.DEFENSES.names()
    with pytest.raises(UnknownPlugin):
        redteam.defense(NAME)
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution(DIST)
    assert not (EXAMPLE / "build").exists() and not list(EXAMPLE.glob("*.egg-info"))


def test_the_guide_shows_the_example_verbatim():
    page = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    source = SOURCE.read_text(encoding="utf-8")
    assert f"```python\n{source}```" in page, "docs/plugins.md's defense example is out of date with examples/"
    entry = f'{NAME} = "{MODULE}:ClippedMean"'
    assert entry in (EXAMPLE / "pyproject.toml").read_text() and entry in page
    assert f'check_defense("{NAME}")' in page
    assert f'check_defense("{NAME}")' in (EXAMPLE / "tests" / "test_contract.py").read_text()


def _table_names(page: str, heading: str) -> set[str]:
    """The `names` in the first cell of each row of the table under ``heading``."""
    import re

    section = page[page.index(heading) + len(heading):]
    section = section[: section.index("\n#")] if "\n#" in section else section
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`(\w+)`", cell)}


@pytest.mark.parametrize("cls, heading", [("AttackContext", "## What an attack sees: `AttackContext`"),
                                          ("ServerContext", "### What a defense sees: `ServerContext`"),
                                          ("Decision", "### What it returns: `Decision`")])
def test_the_guide_documents_every_field(cls, heading):
    import dataclasses

    import redteam.types

    page = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    missing = [f.name for f in dataclasses.fields(getattr(redteam.types, cls)) if f.name not in _table_names(page, heading)]
    assert not missing, f"docs/plugins.md: the {cls} table lacks {missing}"


@pytest.mark.parametrize("owner, names, heading", [
    ("Attack", "CAPABILITIES", "### What the engine asks of an attack"),
    ("Defense", "CAPABILITIES", "### What the engine asks of a defense"),
    ("PipelineCheck", "CHECK_INTERFACE", "### Pipeline checks: `PipelineCheck`"),
])
def test_the_guide_documents_every_declared_capability(owner, names, heading):
    # every optional capability the engine reads of a plugin is declared (issue 32) and has a row
    import redteam.pipeline
    import redteam.types

    cls = getattr(redteam.types, owner, None) or getattr(redteam.pipeline, owner)
    page = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    documented = _table_names(page, heading)
    if owner == "Defense":  # the attributes table above it documents the first ones
        documented |= _table_names(page, "Class attributes a defense may set:")
    missing = [n for n in getattr(cls, names) if n not in documented]
    assert not missing, f"docs/plugins.md: {heading} lacks {missing}"
    for n in getattr(cls, names):  # and each is declared on the base class, so the engine never probes
        assert hasattr(cls, n), n
