"""The test suite runs under the project's thread policy, not torch's default pool.

torch starts one intra-op thread per core, and its pool spins while it waits for work. On a
shared machine (a CI runner, a laptop running other jobs) a test process whose two threads
compete with other busy processes loses far more than its share of the CPU: a DiLoCo federation
test went from 1.6 s to 392 s at load 12. The runs the project starts itself follow
``redteam.runner.threads`` (one thread for small federations); the tests now do the same: one
intra-op thread per test process (``REDTEAM_TEST_THREADS=N`` to change it), and a test that
needs more says so with ``@pytest.mark.threads(N)``.

The property tests draw the same inputs on every run (hypothesis profile ``ci``: derandomized,
no example database), so a change lands or fails on its own merits, not on the inputs one run
happened to draw. ``REDTEAM_HYPOTHESIS=explore`` draws fresh inputs each run (and keeps the
failures hypothesis finds in its database) to hunt for new counter-examples; pin each one
found as an ``@example`` (or a test of its own) before fixing it.

The whole suite (``python -m pytest`` with no paths) runs on one test process per core, up to 4
(pytest-xdist, ``--dist loadfile``: a scenario file's cells and its ``can_fail`` item stay in one
process, in order), since most tests use one core and a 2-core machine would otherwise idle half
of the time. ``-n N`` chooses another count (``-n 0``: one process), ``REDTEAM_SUITE_PROCESSES=N``
too; a run of named files or directories stays in one process unless given ``-n``. The whole suite
hands out its longest files first (the scenario files, then the long modules) and runs a scenario
cell's seeds inside its test process, one after another: the processes already fill the cores.

numba compiles the sorting network once per suite run: every process of the run (this one, the
subprocesses tests start, the matrix workers they start) uses one cache directory, the user's
own (``NUMBA_CACHE_DIR``, else ``~/.cache/redteam/numba``) or, where that one is refused (not
the user's, writable by others, cannot be made: a read-only home on a CI runner), one made for
this run and set in ``NUMBA_CACHE_DIR`` before numba is imported, so that the processes share
it instead of each compiling without a cache. ``defenses._numba_cache.first_use`` makes the
processes that need it at the same time wait for the first to compile.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

#: the most test processes the whole suite starts by itself (more cores: more processes would
#: mostly add memory; pass -n to go further)
MAX_SUITE_PROCESSES = 4


def _suite_processes(config: pytest.Config) -> int:
    """How many pytest-xdist processes a whole-suite run starts (0: none)."""
    raw = os.environ.get("REDTEAM_SUITE_PROCESSES")
    if raw is not None:
        if not raw.strip().isdigit():
            raise pytest.UsageError(f"REDTEAM_SUITE_PROCESSES = {raw!r}: must be an integer ≥ 0 (0: one process)")
        return int(raw)
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return 0  # named paths: the developer's loop, one process
    n = min(MAX_SUITE_PROCESSES, os.cpu_count() or 1)
    return n if n > 1 else 0


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Before pytest-xdist reads its options: the whole suite on one process per core (above)."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    opt = config.option
    if getattr(opt, "numprocesses", None) is not None or getattr(opt, "tx", None):
        return  # -n / --tx given: the user's choice
    if opt.collectonly or getattr(opt, "usepdb", False):
        return
    n = _suite_processes(config)
    if n > 1:
        opt.numprocesses = n
        if opt.dist == "no":
            opt.dist = "loadfile"
            # files in the order pytest_collection_modifyitems gives (longest first), not xdist's
            # default of the most items first, which put every scenario file (a few long cells)
            # at the end of the run, one process finishing them while the others idled
            opt.loadscopereorder = False
            config.stash[_WHOLE_SUITE] = True


_WHOLE_SUITE = pytest.StashKey[bool]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001 - pytest-xdist's WorkerController
    """(pytest-xdist, in the controller) tells each test process that it runs the whole suite."""
    if node.config.stash.get(_WHOLE_SUITE, False):
        node.workerinput["redteam_whole_suite"] = True


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """A test process of the whole suite runs a scenario cell's seeds one after another, in
    itself: with one test process per core and the scenario files handed out first, every core is
    busy without seed workers, and two files' seed workers on top of the test processes only
    crowded the cores (measured: 7 % more CPU for the same cells, before any crowding).
    ``--redteam-workers N`` or ``REDTEAM_PYTEST_WORKERS=N`` still choose."""
    from redteam.pytest_plugin import WORKERS_ENV

    inp = getattr(config, "workerinput", None)
    if inp and inp.get("redteam_whole_suite") and not os.environ.get(WORKERS_ENV) \
            and config.getoption("redteam_workers", None) is None:
        config.option.redteam_workers = "1"


#: test modules that take tens of seconds (Ray and subprocess drivers, real-disk runs; measured
#: by ``--durations``), started right after the scenario files: a scheduling hint only, so a
#: stale entry costs time, never a result
LONG_MODULES = ("test_worker_lifetime", "test_matrix_sharing", "test_matrix", "test_contracts",
                "test_cli_hostile", "test_pytest_plugin", "test_flower_scenario", "test_swarm",
                "test_sortnet", "test_undefined_metrics", "test_expect_compare", "test_flower_integration")


def _longest_first(item: pytest.Item) -> int:
    """0: a scenario file (its cells run whole matrices); 1: a long test module; 2: the rest."""
    path = item.path
    if path.suffix == ".toml":
        return 0
    return 1 if path.stem in LONG_MODULES else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In test processes of pytest-xdist, the longest files come first (a stable sort:
    each file's items keep their order, a scenario file's ``can_fail`` item after its cells),
    so that the run ends on short files spread over every process instead of on one long one (the
    whole suite hands files out in this order: ``loadscopereorder`` is off, above)."""
    if hasattr(config, "workerinput"):  # the same order in every process (xdist checks it)
        items.sort(key=_longest_first)


def _one_numba_cache() -> None:
    import atexit
    import shutil

    from defenses import _numba_cache  # imports no numba

    made = _numba_cache.one_for_this_run()
    if made is not None:
        atexit.register(shutil.rmtree, made, ignore_errors=True)


_one_numba_cache()

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
_PROFILE = os.environ.get("REDTEAM_HYPOTHESIS", "ci")
if _PROFILE not in ("ci", "explore"):
    raise pytest.UsageError(f"REDTEAM_HYPOTHESIS = {_PROFILE!r}: must be 'ci' (the same inputs every run) "
                            "or 'explore' (fresh inputs each run)")
settings.load_profile(_PROFILE)


def _suite_threads() -> int:
    raw = os.environ.get("REDTEAM_TEST_THREADS", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"REDTEAM_TEST_THREADS = {raw!r}: must be an integer ≥ 1")
    return int(raw)


@pytest.fixture(autouse=True)
def _thread_policy(request: pytest.FixtureRequest):
    """Every test starts with the suite's intra-op thread count (or its ``threads`` mark's) and
    leaves the process as it found it."""
    mark = request.node.get_closest_marker("threads")
    want = int(mark.args[0]) if mark is not None and mark.args else _suite_threads()
    before = torch.get_num_threads()
    torch.set_num_threads(want)
    try:
        yield
    finally:
        torch.set_num_threads(before)
