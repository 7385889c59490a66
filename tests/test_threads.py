"""The thread policy (issue 13 §2): small federations run on one intra-op thread, large ones
on their share of the cores, an explicit N is honoured, and the caller's count is restored."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from redteam.errors import InvalidParameter
from redteam.runner.threads import SMALL_WORK, parse_threads, run_threads, run_work, threads_for


def test_parse_threads():
    assert parse_threads("auto") == "auto" and parse_threads(" AUTO ") == "auto"
    assert parse_threads("3") == 3 and parse_threads(2) == 2
    for bad in ("0", "-1", "many", 0, True, 5000, 1.5):
        with pytest.raises(InvalidParameter, match="must be 'auto' or an integer from 1 to 4096"):
            parse_threads(bad)


def test_policy_by_hand():
    # small work → 1 thread whatever the cores; large → cores ÷ parallel runs (at least 1)
    assert threads_for("auto", work=SMALL_WORK / 2, cores=16) == 1
    assert threads_for("auto", work=SMALL_WORK * 2, cores=16) == 16
    assert threads_for("auto", work=SMALL_WORK * 2, cores=16, parallel_runs=4) == 4
    assert threads_for("auto", work=SMALL_WORK * 2, cores=2, parallel_runs=4) == 1
    assert threads_for(3, work=1.0, cores=16) == 3


def _fed(dim, clients, batch, kind="image", x_shape=(10, 64)):
    return SimpleNamespace(spec=SimpleNamespace(dim=dim),
                           scenario=SimpleNamespace(federation=SimpleNamespace(clients=clients, batch_size=batch)),
                           workload=SimpleNamespace(input_kind=kind), data=SimpleNamespace(x=torch.zeros(x_shape)))


def test_work_counts_tokens_for_sequence_models():
    # digits MLP: 4,810 parameters × 20 clients × 16 samples = 1,539,200
    assert run_work(_fed(4810, 20, 16)) == 4810 * 20 * 16
    # a byte LM: × 128 tokens per window
    assert run_work(_fed(100_000, 16, 16, "tokens", (5, 128))) == 100_000 * 16 * 16 * 128


@pytest.mark.threads(3)  # a caller's count that is neither 1 nor 2, so "restored" means something
def test_run_threads_sets_and_restores():
    before = torch.get_num_threads()
    with run_threads(_fed(4810, 20, 16), "auto") as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with run_threads(_fed(4810, 20, 16), 2) as n:
        assert n == 2 and torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


@pytest.mark.threads(3)
def test_redteam_run_trains_on_one_thread_and_restores(monkeypatch):
    from redteam.runner.single import run_scenario
    from redteam.scenario import parse_scenario

    before = torch.get_num_threads()
    seen = []
    sc = parse_scenario({"scenario": {"seed": 0}, "workload": {"name": "digits", "hidden": 8},
                         "federation": {"clients": 4, "rounds": 2, "local_steps": 1, "batch_size": 8,
                                        "partition": "iid"}})
    run_scenario(sc, on_round=lambda kind, r: seen.append(torch.get_num_threads()))
    assert seen == [1, 1] and torch.get_num_threads() == before
    monkeypatch.setenv("REDTEAM_THREADS", "2")
    seen.clear()
    run_scenario(sc, on_round=lambda kind, r: seen.append(torch.get_num_threads()))
    assert seen == [2, 2]
    monkeypatch.setenv("REDTEAM_THREADS", "zero")
    with pytest.raises(InvalidParameter, match="REDTEAM_THREADS = 'zero'"):
        run_scenario(sc)


def test_the_suite_runs_one_intra_op_thread_unless_a_test_asks():
    # tests/conftest.py: torch's default pool (one spinning thread per core) collapses on a shared
    # machine; every test starts on the suite's count (REDTEAM_TEST_THREADS, default 1)
    import os

    assert torch.get_num_threads() == int(os.environ.get("REDTEAM_TEST_THREADS", "1"))


@pytest.mark.threads(2)
def test_a_threads_mark_gives_a_test_its_own_count():
    assert torch.get_num_threads() == 2


def test_importing_redteam_makes_openmp_wait_passively_unless_the_user_chose():
    """OpenMP's spinning waits make a 2-thread run collapse beside busy processes (issue 23 §2);
    `import redteam` (before torch) sets OMP_WAIT_POLICY = PASSIVE, and keeps a value the user set."""
    import os
    import subprocess
    import sys

    code = "import os, redteam; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert got.stdout.strip() == "PASSIVE"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE"}, check=True)
    assert got.stdout.strip() == "ACTIVE"
