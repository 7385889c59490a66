"""The part of the pytest plugin's session state that its fixtures use.

:mod:`redteam.pytest_plugin` keeps its session state in a :class:`_SessionRuns` subclass
and stores it under :data:`_RUNS` too; the fixtures (:mod:`redteam._pytest_fixtures`)
read it from there, so neither fixtures nor this module import the plugin module.
Nothing heavy is imported until a run is computed.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__: list[str] = []


class _SessionRuns:
    """Round records computed once per session, and the rows the ``run_cell`` /
    ``attack_vs_all_defenses`` fixtures add to the terminal summary."""

    def __init__(self) -> None:
        self.memo: dict[str, list[Any]] = {}
        self.python_results: list[tuple[str, str, dict[str, Any]]] = []

    def records(self, scenario: Any, device: str) -> list[Any]:
        """The round records of one concrete scenario, computed once per session."""
        key = scenario.digest()
        if key not in self.memo:
            from .federation.regimes import make_run

            self.memo[key] = make_run(scenario, device=device).run().records
        return self.memo[key]


_RUNS = pytest.StashKey[_SessionRuns]()
