"""Keep the literature tables (``scenarios/literature/``) out of a plain ``pytest`` run.

``testpaths`` walks ``scenarios/``, so every ``[[expect]]`` row of a file there is a CI test
item. The full literature tables take many minutes of CPU; CI runs their small subset,
``scenarios/literature_ci.toml``, instead. The full tables are collected when

* the ``-m`` expression names ``attacks`` (``python -m pytest -m attacks``) or ``--redteam``
  is given, or
* pytest was given paths on the command line (``python -m pytest scenarios/literature/``,
  ``python -m pytest scenarios/literature/sun.toml``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

_FULL = (Path(__file__).parent / "literature").resolve()


def _wants_full_tables(config: pytest.Config) -> bool:
    if config.args_source == pytest.Config.ArgsSource.ARGS:
        return True
    if re.search(r"\battacks\b", config.getoption("markexpr", "") or ""):
        return True
    return bool(config.getoption("redteam", False))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    p = collection_path.resolve()
    if (p == _FULL or p.is_relative_to(_FULL)) and not _wants_full_tables(config):
        return True
    return None
