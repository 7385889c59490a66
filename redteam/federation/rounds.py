"""What every regime's round shares: the defense call path, the :class:`~redteam.types.ServerContext`
builder, the :class:`~redteam.types.RoundRecord` builder, and the run's result.

A merging party (a server, a sub-aggregator, a gossip node, a pipeline stage) calls its rule
through :func:`call_defense`: a rule that cannot work on its input (an
:class:`~redteam.errors.InvalidParameter`, e.g. Krum with too few rows) or that returns a non-finite
aggregate leaves the party's model as it was, and says why. Every record carries the same standard
entries (:func:`record`): the untrained reference and the start model in round 0, and whether the
attack acted where a window is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from ..errors import InvalidParameter
from ..types import Decision, RoundRecord, ServerContext

if TYPE_CHECKING:
    from .setup import RunSetup

__all__ = ["RunResult", "server_context", "call_defense", "Called", "record", "standard_extra", "result_of", "adopt"]


#: what every regime's run object exposes of its setup, under the same names
_ADOPTED = ("device", "attack_spec", "rng", "torch_rng", "workload", "num_classes", "dataset_source", "attack",
            "defense", "test_x", "test_y", "spec", "params_init", "params0", "trainer", "local", "states")


def adopt(run: Any, setup: "RunSetup") -> None:
    """Give ``run`` its setup (``run.setup``) and the setup's parts under their names (``run.attack``,
    ``run.trainer`` …), with ``malicious`` as a list, ready for the first round."""
    run.setup = setup
    for name in _ADOPTED:
        setattr(run, name, getattr(setup, name))
    run.malicious = list(setup.malicious)
    run.is_malicious = setup.is_malicious
    run.final_params = None


@dataclass
class RunResult:
    """The outcome of one run: its records and what it was."""

    attack: str
    defense: str
    records: list[RoundRecord]
    malicious: list[int]
    params: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0


def result_of(setup: "RunSetup", records: list[RoundRecord], wall_time_s: float, **params: Any) -> RunResult:
    """The run's :class:`RunResult`: its attack's parameters and its defense, and ``params``."""
    return RunResult(setup.attack_spec.name, setup.scenario.defense_label(), records, list(setup.malicious),
                     {"attack": dict(setup.attack_spec.params), "defense": repr(setup.defense), **params},
                     wall_time_s)


def server_context(generator: torch.Generator | None, *, rnd: int, weights: torch.Tensor | None,
                   global_params: torch.Tensor | None, state: Mapping[str, Any], client_ids: Sequence[int] = (),
                   previous_update: torch.Tensor | None = None, n_clients: int | None = None,
                   **oracles: Any) -> ServerContext:
    """What a merging party's rule sees: ``generator`` is the defense's own random stream (a run's
    ``torch_rng["defense"]``); ``oracles`` the optional :class:`~redteam.types.ServerContext` fields
    the regime offers (``evaluate_loss``, ``root_update``, ``own_row``, ``commits`` …); ``n_clients``
    defaults to the number of weights."""
    n = int(weights.shape[0]) if n_clients is None and weights is not None else int(n_clients or 0)
    return ServerContext(round=rnd, n_clients=n, weights=weights, global_params=global_params,
                         previous_update=previous_update, generator=generator, state=state,
                         client_ids=tuple(client_ids), **oracles)


@dataclass(frozen=True)
class Called:
    """A rule's call: its decision, or why the party kept its model (``refused``)."""

    decision: Decision | None
    refused: str | None = None


def call_defense(defense: Any, rows: torch.Tensor, ctx: ServerContext, *, check_finite: bool = True) -> Called:
    """The one defense call path: the decision, or the refusal (a rule that cannot run on these
    rows, or a non-finite aggregate when ``check_finite``) with its reason."""
    try:
        dec = defense(rows, ctx)
    except InvalidParameter as exc:  # e.g. Krum on a round too small for it
        return Called(None, str(exc))
    if check_finite and not bool(torch.isfinite(dec.aggregate).all()):
        return Called(dec, "non-finite aggregate")
    return Called(dec)


def standard_extra(setup: "RunSetup", rnd: int, *, active: bool | None, start: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The entries every regime's record carries: ``untrained`` and ``start`` in round 0, and
    ``attack_active`` where the scenario sets an attack window (``active``: the window is open
    in the round *and* an attacker takes part in it; the regime decides the second)."""
    extra: dict[str, Any] = {}
    if rnd == 0:
        extra["untrained"] = dict(setup.untrained)
        if start:
            extra["start"] = dict(start)
    if not setup.scenario.window.is_full:
        extra["attack_active"] = bool(active)
    return extra


def record(rnd: int, acc: float, loss: float, *, accepted: Sequence[bool], malicious: Sequence[bool],
           participating: Sequence[bool], dropped: Mapping[int, str] | None = None,
           rejected: Mapping[int, str] | None = None, bytes_on_wire: int = 0, sim_time_s: float = 0.0,
           started: float, defense_time_s: float = 0.0, extra: dict[str, Any] | None = None,
           wall_time: Callable[[], float] | None = None) -> RoundRecord:
    """The round's :class:`~redteam.types.RoundRecord` (``started``: its ``perf_counter`` start).
    The loss is recorded as given (gossip passes +inf for a non-finite mean over its nodes)."""
    import time

    now = (wall_time or time.perf_counter)()
    return RoundRecord(
        round=rnd, accuracy=acc, loss=loss,
        accepted=[bool(a) for a in accepted], malicious=[bool(m) for m in malicious],
        participating=[bool(p) for p in participating], dropped=dict(dropped or {}),
        rejected=dict(sorted((rejected or {}).items())), bytes_on_wire=int(bytes_on_wire),
        sim_time_s=float(sim_time_s), wall_time_s=now - started, defense_time_s=defense_time_s, extra=extra or {})
