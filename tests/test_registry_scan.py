"""Entry points are scanned once and scanned again when what they are found in changes
(``redteam.registry.entry_points``): collecting the shipped scenarios asked for a scan 87 times."""

from __future__ import annotations

import sys

from redteam import registry
from redteam.registry import ATTACKS


def _dist(site, name, attack):
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[redteam.attacks]\n{attack} = os:getcwd\n")


def test_a_package_installed_or_a_path_added_is_seen_without_a_restart(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    _dist(site, "probe_one", "zz_probe_one")
    before = ATTACKS.names()
    assert "zz_probe_one" not in before
    calls = []
    real = registry.metadata.entry_points
    monkeypatch.setattr(registry.metadata, "entry_points", lambda **k: calls.append(k) or real(**k))
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    assert "zz_probe_one" in ATTACKS.names()           # a path added
    n = len(calls)
    assert ATTACKS.names() == ATTACKS.names() and len(calls) == n  # nothing changed: no scan
    _dist(site, "probe_two", "zz_probe_two")            # installed into a directory already on the path
    assert "zz_probe_two" in ATTACKS.names() and len(calls) == n + 1
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    assert ATTACKS.names() == before                    # and gone with it
