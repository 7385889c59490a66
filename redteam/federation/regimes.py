"""The regime a scenario runs under: one round shape, four topologies.

A scenario without a regime section is data-parallel (:class:`~.loop.Federation`: every client
holds the whole model; a server, or a tree of sub-aggregators, merges their updates); with
``[pipeline]`` it is model-parallel (:class:`~.swarm.SwarmRun`: the model cut into stages served by
pools of peers); with ``[gossip]`` it is serverless (:class:`~.gossip.GossipRun`: every node keeps
its own model and merges its neighbours' on a graph); with ``[async]`` the server merges stale
updates as they arrive (:class:`~.asyncrun.AsyncRun`: buffered, staleness-weighted); with
``[flower]`` a user's own Flower app runs in Flower (:class:`~redteam.integrations.flower.run.FlowerRun`).

Each is one implementation of the same shape: it receives one :class:`~.setup.RunSetup` (built by
:func:`~.setup.build_setup` from its placement: stream names, where the attackers sit, how many rows
each merging party sees, whether a server holds data), decides who trains each step and whose rows
each merging party sees, moves its model(s) by the merged result, and records each round through
the shared builders of :mod:`.rounds`. What each supports (scenario keys, attack surfaces, defense
capabilities) is declared once in :mod:`redteam.topology`, so refusals are one rule. All take the
same arguments, run with ``run(on_round)`` and return the same records, so the runners, the store,
the reports and the pytest plugin never ask which.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..scenario import PluginSpec, Scenario
from ..topology import support_of
from .rounds import RunResult

__all__ = ["make_run", "Run"]


class Run(Protocol):
    """What every regime's run object offers the runners."""

    setup: Any
    final_params: Any

    def run(self, on_round: Any = None) -> RunResult:
        """Every round in order; ``on_round(record)`` after each."""


def make_run(scenario: Scenario, *, device: str = "cpu", attack: PluginSpec | None = None,
             warmup_dir: str | None = None, start: Any = None) -> Run:
    """The run object of ``scenario``'s regime (``attack`` overrides its attack: the baseline;
    ``start``: the flat parameters round 0 starts from, instead of the workload's initial model)."""
    regime = support_of(scenario).name
    kw = {"device": device, "attack": attack, "warmup_dir": warmup_dir, "start": start}
    if regime == "pipeline":
        from .swarm import SwarmRun

        return SwarmRun(scenario, **kw)
    if regime == "gossip":
        from .gossip import GossipRun

        return GossipRun(scenario, **kw)
    if regime == "async":
        from .asyncrun import AsyncRun

        return AsyncRun(scenario, **kw)
    if regime == "flower":
        from ..integrations.flower.run import FlowerRun  # imports Flower: only for a [flower] scenario

        return FlowerRun(scenario, **kw)
    from .loop import Federation

    return Federation(scenario, **kw)
