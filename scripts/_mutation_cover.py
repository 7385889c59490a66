"""A pytest plugin for ``scripts/mutation.py``: which lines of one file each test runs.

Loaded with ``-p _mutation_cover`` (``scripts/`` on ``PYTHONPATH``); ``MUTATION_COVER_FILE``
names the file to watch (absolute path) and ``MUTATION_COVER_OUT`` where to write
``{"tests": [node ids, in run order], "lines": {node id: [lines]}, "import": [lines]}``
(``import``: the lines run outside any test, at collection — module level). Only frames
of the watched file are traced line by line, so the other code runs at almost full speed.
A line run inside a module- or session-scoped fixture is credited to the first test that
set it up: a mutant there may be judged by fewer tests than reach it (a survivor), never
by a test that cannot see it.
"""

from __future__ import annotations

import json
import os
import sys
import threading

_FILE = os.environ.get("MUTATION_COVER_FILE", "")
_lines: dict[str, set[int]] = {}
_order: list[str] = []
_current: list[set[int]] = [set()]  # the set being filled: per test, or the import-time set first
_import = _current[0]


def _local(frame, event, arg):  # noqa: ANN001 - the settrace signature
    if event == "line":
        _current[0].add(frame.f_lineno)
    return _local


_seen: dict[str, bool] = {}


def _global(frame, event, arg):  # noqa: ANN001
    name = frame.f_code.co_filename
    hit = _seen.get(name)
    if hit is None:
        hit = _seen[name] = os.path.realpath(name) == _FILE
    if hit:
        _current[0].add(frame.f_lineno)
        return _local
    return None


def pytest_configure(config):  # noqa: ANN001
    if _FILE:
        sys.settrace(_global)
        threading.settrace(_global)


def pytest_runtest_logstart(nodeid, location):  # noqa: ANN001
    _order.append(nodeid)
    _current[0] = _lines.setdefault(nodeid, set())


def pytest_runtest_logfinish(nodeid, location):  # noqa: ANN001
    _current[0] = set()  # between tests: not credited


def pytest_unconfigure(config):  # noqa: ANN001
    sys.settrace(None)
    threading.settrace(None)
    out = os.environ.get("MUTATION_COVER_OUT")
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            json.dump({"tests": _order, "lines": {k: sorted(v) for k, v in _lines.items()},
                       "import": sorted(_import)}, fh)
