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


_TORCH_FIRST = r"""
import os, sys, threading
import torch, redteam
from redteam import _omp
from redteam.registry import DEFENSES


def foreign_ticks():  # CPU ticks of the threads Python did not start (OpenMP's team among them)
    ours = {t.native_id for t in threading.enumerate()}
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) not in ours:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total


torch.set_num_threads(2)
x = torch.randn(100, 70_000, generator=torch.Generator().manual_seed(0))
print(_omp.policy_in_force().split()[0])
for name, params in (("krum", {"f": 10}), ("median", {})):
    rule = DEFENSES.create(name, params)
    seen = []
    decide = type(rule).decide
    type(rule).decide = lambda self, u, c: (seen.append((torch.get_num_threads(), _omp.workers())),
                                            decide(self, u, c))[1]
    rule(x)  # compiles what it compiles
    before = foreign_ticks()
    for _ in range(3):
        rule(x)
    print(name, seen[0], torch.get_num_threads(), foreign_ticks() - before)
"""


def _run(code: str) -> list[str]:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return out.stdout.replace("(1, 2)", "1/2").replace("(2, 2)", "2/2").split()


def test_a_rule_does_not_spin_when_torch_was_imported_before_redteam():
    """`import torch, redteam`: OpenMP read its policy before redteam could set it, and its idle
    threads spin. The rule then runs torch at one thread (OpenMP's team does no work at all: no
    CPU tick on a thread Python did not start) and gives its kernels the caller's 2 threads of our
    own; the count is restored. With the policy in force (redteam first), torch's own 2 threads
    run it, and for Krum's products OpenMP's team works (issue 40 §1)."""
    import os

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc to read the process's threads")
    assert _run(_TORCH_FIRST) == ["unset", "krum", "1/2", "2", "0", "median", "1/2", "2", "0"]
    got = _run(_TORCH_FIRST.replace("import torch, redteam", "import redteam, torch"))
    assert got[:4] == ["PASSIVE", "krum", "2/2", "2"] and int(got[4]) > 0 and got[5:8] == ["median", "2/2", "2"]


def test_a_run_at_two_threads_warns_once_when_torch_came_first(monkeypatch):
    import warnings

    from redteam import _omp

    def warnings_for(torch_first: bool, given: "str | None", counts: tuple[int, ...]) -> list[str]:
        monkeypatch.setattr(_omp, "_state", {"torch_first": torch_first, "given": given})
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for n in counts:
                _omp.warn_spinning(n)
        return [str(m.message) for m in w]

    said = warnings_for(True, None, (1, 2, 2))
    assert len(said) == 1 and "this run's 2 intra-op threads" in said[0]
    assert "import redteam before torch, or set OMP_WAIT_POLICY=PASSIVE" in said[0]
    assert warnings_for(True, "ACTIVE", (2,)) == []  # the user's choice
    assert warnings_for(False, None, (2,)) == []  # redteam first: PASSIVE is in force
    assert _omp.policy_in_force() == "PASSIVE"


@pytest.mark.threads(2)
def test_the_gram_on_our_own_threads_keeps_its_bound(monkeypatch):
    """Where OpenMP spins (torch imported first), the pairwise kernel's float32 products run in
    groups on redteam's threads at one torch thread each: every approximate distance still lies
    within its stated bound of the float64 distance, and Krum picks what it picks otherwise."""
    from defenses import _pairwise
    from redteam import _omp
    from redteam.registry import DEFENSES

    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 256 * 40 + 7, generator=g) + 5.0  # groups, a tail, and rows worth centring
    x[:3] += 0.01 * torch.randn(3, x.shape[1], generator=g)
    exact = torch.cdist(x.double(), x.double()).square()
    plain = _pairwise.pairwise(x)
    krum = DEFENSES.create("krum", {"f": 2})
    chosen = krum(x).accepted
    monkeypatch.setattr(_omp, "_state", {"torch_first": True, "given": None})
    groups = []
    real = _pairwise._own_threads
    monkeypatch.setattr(_pairwise, "_own_threads", lambda x: groups.append(real(x)) or groups[-1])
    with _omp.rule_threads():
        assert torch.get_num_threads() == 1 and _omp.workers() == 2
        mine = _pairwise.pairwise(x)
    assert groups == [2] and torch.get_num_threads() == 2
    for pd in (plain, mine):
        assert bool(((pd.approx - exact).abs() <= pd.error + 1e-9).all())
    assert torch.equal(krum(x).accepted, chosen)
