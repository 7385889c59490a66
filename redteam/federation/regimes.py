"""The regime a scenario runs under: one round shape, several topologies.

A scenario without ``[pipeline]`` is data-parallel (:class:`~.loop.Federation`: every client
holds the whole model; a server, or a tree of sub-aggregators, merges their updates); with
``[pipeline]`` it is model-parallel (:class:`~.swarm.SwarmRun`: the model cut into stages served
by pools of peers); with ``[gossip]`` it is serverless (:class:`~.gossip.GossipRun`: every node
keeps its own model and merges its neighbours' on a graph); with ``[async]`` the server merges stale
updates as they arrive (:class:`~.asyncrun.AsyncRun`: buffered, staleness-weighted). All take the same arguments, run with ``run(on_round)`` and return the same
records, so the runners, the store, the reports and the pytest plugin never ask which.
"""

from __future__ import annotations

from typing import Any

from ..scenario import PluginSpec, Scenario

__all__ = ["make_run"]


def make_run(scenario: Scenario, *, device: str = "cpu", attack: PluginSpec | None = None,
             warmup_dir: str | None = None, start: Any = None) -> Any:
    """The run object of ``scenario``'s regime (``attack`` overrides its attack: the baseline;
    ``start``: the flat parameters round 0 starts from, instead of the workload's initial model)."""
    if scenario.pipeline is not None:
        from .swarm import SwarmRun

        return SwarmRun(scenario, device=device, attack=attack, warmup_dir=warmup_dir, start=start)
    if getattr(scenario, "gossip", None) is not None:
        from .gossip import GossipRun

        return GossipRun(scenario, device=device, attack=attack, warmup_dir=warmup_dir, start=start)
    if getattr(scenario, "asynchronous", None) is not None:
        from .asyncrun import AsyncRun

        return AsyncRun(scenario, device=device, attack=attack, warmup_dir=warmup_dir, start=start)
    from .loop import Federation

    return Federation(scenario, device=device, attack=attack, warmup_dir=warmup_dir, start=start)
