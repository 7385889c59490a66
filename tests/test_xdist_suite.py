"""The whole suite on one process per core (pytest-xdist), and what the scenario summary keeps there.

``tests/conftest.py`` turns a plain ``python -m pytest`` into ``-n <cores, up to 4> --dist
loadfile``; the redteam plugin then gives each test process its share of scenario workers, and the
controller rebuilds the summary (cells, stores, can-fail lines) from what the workers' reports carry.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

import redteam.pytest_plugin as plugin


class _Config:
    def __init__(self, workers=None):
        self.workers = workers

    def getoption(self, name, default=None):
        return self.workers if name == "redteam_workers" else default


@pytest.mark.parametrize("cores,share,want", [
    (2, None, 2),    # alone: one per core
    (2, "2", 2),     # two test processes on two cores: each keeps two (the last file alone uses both)
    (16, "16", 2),   # one per core: two each, not 4 × 16
    (16, "4", 4),    # four test processes on 16 cores: 16 // 4
    (16, "2", 4),    # capped at MAX_DEFAULT_WORKERS
    (1, "2", 1),     # one core: never more than one per core below two
    (4, "junk", 4),  # a count that is not a number counts as one process
])
def test_scenario_workers_share_the_cores_among_test_processes(monkeypatch, cores, share, want):
    monkeypatch.delenv(plugin.WORKERS_ENV, raising=False)
    monkeypatch.setattr(plugin.os, "cpu_count", lambda: cores)
    if share is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", share)
    assert plugin._workers(_Config()) == want
    assert plugin._workers(_Config("3")) == 3  # an explicit count is never changed


def _state():
    return types.SimpleNamespace(outcomes=[], stores={}, can_fail={})


def test_the_controller_rebuilds_the_summary_from_worker_reports():
    state = _state()
    relay = plugin._Relay(state)
    props = [("redteam_outcome", {"file": "scenarios/a.toml", "row": "alie", "defense": "median", "status": "failed",
                                  "metrics": {"accuracy_drop": 0.25, "recall": None}, "store": "/s/a"}),
             ("redteam_can_fail", {"file": "scenarios/a.toml", "lines": ["a.toml#1 recall ≥ 0.9: attack → none: failed"]}),
             ("something_else", {"file": "x"})]
    relay.pytest_runtest_logreport(types.SimpleNamespace(node=object(), user_properties=props))
    (o,) = state.outcomes
    assert (o.file, o.row, o.defense, o.status, o.metrics) == ("scenarios/a.toml", "alie", "median", "failed",
                                                               {"accuracy_drop": 0.25, "recall": None})
    assert state.stores == {"scenarios/a.toml": Path("/s/a")}
    assert state.can_fail == {"scenarios/a.toml": ["a.toml#1 recall ≥ 0.9: attack → none: failed"]}
    # a report of this process (no ``node``): its item already wrote to the state; not counted twice
    relay.pytest_runtest_logreport(types.SimpleNamespace(user_properties=props))
    assert len(state.outcomes) == 1


def test_metrics_travel_as_plain_values():
    import numpy as np
    import torch

    assert plugin._plain(np.float32(0.5)) == 0.5 and type(plugin._plain(np.float32(0.5))) is float
    assert plugin._plain(torch.tensor(2.0)) == 2.0
    assert plugin._plain(None) is None and plugin._plain("n/a") == "n/a" and plugin._plain(3) == 3
    assert plugin._plain([1, 2]) == "[1, 2]"  # not a number: shown as text


@pytest.fixture
def suite(request):
    """tests/conftest.py, as pytest loaded it (a conftest is a plugin, not an importable module)."""
    here = Path(__file__).resolve().with_name("conftest.py")
    (mod,) = [p for p in request.config.pluginmanager.get_plugins()
              if Path(getattr(p, "__file__", "") or "/").resolve() == here]
    return mod


class _SuiteConfig:
    def __init__(self, source):
        self.args_source = source


@pytest.mark.parametrize("raw,source,cores,want", [
    (None, pytest.Config.ArgsSource.TESTPATHS, 2, 2),  # the whole suite: one per core
    (None, pytest.Config.ArgsSource.TESTPATHS, 16, 4),  # at most MAX_SUITE_PROCESSES
    (None, pytest.Config.ArgsSource.TESTPATHS, 1, 0),  # one core: no extra process
    (None, pytest.Config.ArgsSource.ARGS, 8, 0),       # named paths: one process
    ("0", pytest.Config.ArgsSource.TESTPATHS, 8, 0),
    ("3", pytest.Config.ArgsSource.ARGS, 8, 3),
])
def test_how_many_test_processes_the_whole_suite_starts(suite, monkeypatch, raw, source, cores, want):
    assert suite.MAX_SUITE_PROCESSES == 4
    monkeypatch.setattr(suite.os, "cpu_count", lambda: cores)
    if raw is None:
        monkeypatch.delenv("REDTEAM_SUITE_PROCESSES", raising=False)
    else:
        monkeypatch.setenv("REDTEAM_SUITE_PROCESSES", raw)
    assert suite._suite_processes(_SuiteConfig(source)) == want


@pytest.mark.parametrize("raw", ["two", "-1", ""])
def test_a_bad_process_count_is_one_line(suite, monkeypatch, raw):
    monkeypatch.setenv("REDTEAM_SUITE_PROCESSES", raw)
    with pytest.raises(pytest.UsageError, match="REDTEAM_SUITE_PROCESSES = .*must be an integer ≥ 0"):
        suite._suite_processes(_SuiteConfig(pytest.Config.ArgsSource.TESTPATHS))


def test_the_longest_files_are_handed_out_first(suite):
    """xdist's default queue (most items first) put the scenario files, a few long cells each, at
    the end of the run; the suite turns that off and sorts scenario files, then the long modules,
    then the rest, keeping each file's own order (a ``can_fail`` item after its cells)."""
    here = Path(__file__).resolve().parent
    for name in suite.LONG_MODULES:  # a stale hint would only cost time: caught here instead
        assert (here / f"{name}.py").is_file(), name

    def item(path):
        return types.SimpleNamespace(path=Path(path))

    items = [item("tests/test_a.py"), item("tests/test_matrix.py"), item("scenarios/x.toml"),
             item("tests/test_b.py"), item("scenarios/y.toml")]
    names = [str(i.path) for i in sorted(items, key=suite._longest_first)]
    assert names == ["scenarios/x.toml", "scenarios/y.toml", "tests/test_matrix.py", "tests/test_a.py",
                     "tests/test_b.py"]
    worker = types.SimpleNamespace(workerinput={}, option=types.SimpleNamespace())
    got = list(items)
    suite.pytest_collection_modifyitems(worker, got)
    assert [str(i.path) for i in got] == names
    alone = list(items)
    suite.pytest_collection_modifyitems(types.SimpleNamespace(option=types.SimpleNamespace()), alone)
    assert alone == items  # one process: collection order


class _NodeConfig:
    def __init__(self, workerinput=None, workers=None):
        if workerinput is not None:
            self.workerinput = workerinput
        self.option = types.SimpleNamespace(redteam_workers=workers)

    def getoption(self, name, default=None):
        return getattr(self.option, name, default)


def test_the_whole_suite_runs_a_cells_seeds_in_its_test_processes(suite, monkeypatch):
    """One test process per core, scenario files first: seed workers on top only crowd the cores."""
    monkeypatch.delenv("REDTEAM_PYTEST_WORKERS", raising=False)
    whole = _NodeConfig({"redteam_whole_suite": True})
    suite.pytest_configure(whole)
    assert whole.option.redteam_workers == "1"
    assert plugin._workers(whole) == 1
    for other in (_NodeConfig({}), _NodeConfig(None), _NodeConfig({"redteam_whole_suite": True}, workers="3")):
        before = other.option.redteam_workers
        suite.pytest_configure(other)  # -n given by hand, one process, or a count of the user's own
        assert other.option.redteam_workers == before
    monkeypatch.setenv("REDTEAM_PYTEST_WORKERS", "2")
    chosen = _NodeConfig({"redteam_whole_suite": True})
    suite.pytest_configure(chosen)
    assert chosen.option.redteam_workers is None and plugin._workers(chosen) == 2


def test_the_controller_marks_the_whole_suites_test_processes(suite):
    ctrl = types.SimpleNamespace(stash=pytest.Stash())
    node = types.SimpleNamespace(config=ctrl, workerinput={})
    suite.pytest_configure_node(node)
    assert node.workerinput == {}
    ctrl.stash[suite._WHOLE_SUITE] = True
    suite.pytest_configure_node(node)
    assert node.workerinput == {"redteam_whole_suite": True}


@pytest.mark.parametrize("raw,want", [(None, 1), ("2", 2), ("4", 4), ("0", 1), ("junk", 1)])
def test_a_cell_run_in_the_test_process_takes_its_share_of_the_cores(monkeypatch, raw, want):
    """In-process cells ran as if alone on the machine (2 intra-op threads on 2 cores beside the
    other test process): fmnist_ci took 169 CPU-s for 124 s, against 140 for 137 s on one thread."""
    if raw is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", raw)
    assert plugin._test_processes() == want
    from redteam.runner.threads import threads_for

    assert threads_for("auto", work=float("inf"), parallel_runs=plugin._test_processes(), cores=2) == (2 if want == 1 else 1)
