"""OpenMP's wait policy, as it is in force in this process, and the robust rules' own threads
(issue 40 §1).

GNU OpenMP (the runtime torch ships) reads ``OMP_WAIT_POLICY`` once, when the library loads,
that is at ``import torch``. Unset, its idle threads spin for a while after every parallel
region before they sleep; beside busy processes a rule at 2 intra-op threads then loses far
more than its CPU share (Krum at n = 100, d = 10⁵: about 3× its passive time with one core
busy elsewhere). ``import redteam`` sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user set it,
which works only when torch is imported after redteam. :func:`record` notes, at
``import redteam``, which policy the runtime really started with; where torch came first
with the policy unset (``import torch, redteam``), it spins, and nothing can change that
afterwards (the runtime keeps its spin count in private variables).

Then :func:`rule_threads` (entered by every defense call) runs torch at one intra-op thread
for the rule, so no OpenMP team is started and nothing spins, and gives the rule's heavy
kernels the caller's thread count on the project's own Python threads (:func:`workers`): the
sorting network, the sorted tiles and the pairwise Gram matrix, whose compiled code and
torch calls release the GIL. A federation run at several threads in such a process cannot
be helped this way; :func:`warn_spinning` says once what to do. A policy the user set
(``ACTIVE`` included) is the user's choice and left alone.

Imports nothing heavy: ``redteam/__init__`` calls :func:`record` before anything else.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from typing import Iterator

__all__ = ["record", "policy_in_force", "spinning", "rule_threads", "workers", "warn_spinning"]

_state: dict[str, object] = {}
_local = threading.local()

#: what to do, said in the warning and in ``bench_load.py``'s header
ADVICE = ("import redteam before torch, or set OMP_WAIT_POLICY=PASSIVE in the environment before "
          "Python starts")


def record() -> None:
    """Note the policy OpenMP starts with in this process, then set ``PASSIVE`` (unless the
    user chose) for a torch imported later and for every process started from this one."""
    if "torch_first" not in _state:
        given = os.environ.get("OMP_WAIT_POLICY")
        _state["torch_first"] = "torch" in sys.modules
        _state["given"] = given
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def policy_in_force() -> str:
    """The policy this process's OpenMP runtime runs under, in words: ``PASSIVE``, ``ACTIVE``
    (or another value the user set), or the unset default when torch was loaded first."""
    given = _state.get("given")
    if given:
        return str(given).strip().upper()
    if _state.get("torch_first"):
        return "unset (spins after each parallel region: torch was imported before redteam)"
    return "PASSIVE"


def spinning() -> bool:
    """Whether torch's OpenMP threads spin here because torch was imported before redteam with
    ``OMP_WAIT_POLICY`` unset (not when the user chose a policy)."""
    return bool(_state.get("torch_first")) and not _state.get("given")


def workers() -> int:
    """The threads a rule's heavy kernels may use: the caller's intra-op count, also while
    :func:`rule_threads` holds torch at one."""
    got = getattr(_local, "workers", None)
    if got is not None:
        return int(got)
    import torch

    return torch.get_num_threads()


def own_threads() -> bool:
    """Whether a rule is running under :func:`rule_threads` with torch held at one thread
    (its heavy kernels then spread over :func:`workers` threads of the project's own)."""
    return getattr(_local, "workers", None) is not None


@contextlib.contextmanager
def rule_threads() -> Iterator[None]:
    """Around one defense call: where OpenMP spins (:func:`spinning`) and torch runs more than
    one intra-op thread, hold torch at one for the call and keep the count for
    :func:`workers`; restored afterwards. Elsewhere, and when nested, nothing changes."""
    if not spinning() or own_threads():
        yield
        return
    import torch

    count = torch.get_num_threads()
    if count <= 1:
        yield
        return
    _local.workers = count
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(count)
        del _local.workers


def one_thread() -> None:
    """In a worker thread of a rule under :func:`rule_threads`: torch at one intra-op thread."""
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def warn_spinning(threads: int) -> None:
    """Once per process: a run is about to train at ``threads`` > 1 intra-op threads while
    OpenMP spins (:func:`spinning`)."""
    if threads > 1 and spinning() and not _state.get("warned"):
        _state["warned"] = True
        warnings.warn(f"redteam: torch was imported before redteam with OMP_WAIT_POLICY unset, so OpenMP's "
                      f"idle threads spin; this run's {threads} intra-op threads may run several times slower "
                      f"beside busy processes (the robust rules are spared: they run on redteam's own "
                      f"threads). To avoid it, {ADVICE}.", RuntimeWarning, stacklevel=4)
