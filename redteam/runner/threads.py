"""How many intra-op threads a run gets: a deliberate, documented policy.

torch's default is one intra-op thread per core, and its pool spins while it waits for
work. For the many small federations of a matrix that buys little (a digits round is a
handful of small kernels) and, on a busy machine, costs a great deal: measured on a
2-core machine with two background processes, the smoke matrix took ~16 minutes with
the default pool and 68 s with one thread per run. The policy (``--threads``, or the
environment variable ``REDTEAM_THREADS``):

* ``auto`` (default): a run whose local-training work is small — model parameters ×
  samples per local step over all clients (× tokens per sample for sequence models) below
  :data:`SMALL_WORK` — gets **one** thread; a larger one gets its share of the cores
  (cores ÷ parallel runs). Parallelism then comes from running several runs at once
  (``redteam matrix --executor process``), not from threads inside each.
* an integer N: exactly N threads per run.

A run executed in the caller's own process (the local executor, ``redteam run``, the
pytest plugin) restores the caller's thread count when it ends.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from ..errors import InvalidParameter

__all__ = ["SMALL_WORK", "parse_threads", "default_policy", "threads_for", "run_work", "run_threads"]

#: parameters × samples per step (× tokens per sample) below which a run gets one thread
SMALL_WORK = 1e8



def parse_threads(value: Any, *, option: str = "--threads") -> str | int:
    """``"auto"`` or an integer ≥ 1 (also given as text); anything else is a one-line error."""
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "auto":
            return "auto"
        if v.isdigit() and 1 <= int(v) <= 4096:
            return int(v)
    elif isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4096:
        return value
    raise InvalidParameter(f"{option} = {str(value)[:40]!r}: must be 'auto' or an integer from 1 to 4096")


def default_policy() -> str | int:
    """``REDTEAM_THREADS`` if set (checked), else ``auto``."""
    env = os.environ.get("REDTEAM_THREADS")
    return parse_threads(env, option="REDTEAM_THREADS") if env else "auto"


def run_work(fed: Any) -> float:
    """Local-training work of one round step of ``fed``: parameters × samples per step over
    all clients, × tokens per sample for sequence workloads."""
    fedspec = fed.scenario.federation
    if getattr(fed.scenario, "flower", None) is not None:  # a Flower app: its ClientApps set their own threads
        return 0.0
    pl = getattr(fed.scenario, "pipeline", None)  # a bare run (tests) may have no regime sections
    if pl is not None:  # the pipeline regime: one micro-batch of windows through the model at a time
        return float(fed.spec.dim) * pl.micro_batch_size * int(fed.train_x.shape[-1])
    work = float(fed.spec.dim) * fedspec.clients * fedspec.batch_size
    if fed.workload.input_kind == "tokens" and fed.data.x.ndim >= 2:
        work *= int(fed.data.x.shape[-1])
    return work


def threads_for(policy: str | int, *, work: float, parallel_runs: int = 1, cores: int | None = None) -> int:
    """The intra-op thread count of one run under ``policy`` (see the module docstring)."""
    if isinstance(policy, int):
        return policy
    cores = cores or os.cpu_count() or 1
    share = max(1, cores // max(1, parallel_runs))
    return 1 if work < SMALL_WORK else share


@contextlib.contextmanager
def run_threads(fed: Any, policy: str | int | None, parallel_runs: int = 1) -> Iterator[int]:
    """Set the thread count for running ``fed`` under ``policy`` (``None``: the default
    policy), and restore the previous count afterwards."""
    import torch

    policy = default_policy() if policy is None else policy
    n = threads_for(policy, work=run_work(fed), parallel_runs=parallel_runs)
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    from .._omp import warn_spinning

    warn_spinning(n)  # torch imported before redteam: training threads spin (the rules are spared)
    try:
        yield n
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
