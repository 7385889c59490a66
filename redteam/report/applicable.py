"""Which metrics mean something for a store's workload.

:func:`redteam.scoring.summarize` computes the language-model metrics (bits per byte,
perplexity, their increases, the trigger-phrase false-trigger rate) for every run: they
are functions of the final loss, so a classifier's run gets numbers too. For a
classifier (``digits``, ``synthetic``) those numbers are not bits per byte of anything;
a report shows them only when the workload is a language model.

A workload is a language model when its class says ``input_kind = "tokens"`` (the
:class:`~redteam.workloads.base.Workload` contract). The workloads of a store are the
scenario's ``[workload] name`` and any ``workload.name`` matrix axis. Where the kind
cannot be told (no scenario document in the store, a plugin that is not installed), the
metrics are kept: a report hides a metric only when it knows the metric is meaningless.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

# metrics defined only for language models (docs/reports.md, Metrics), defined once in scoring
from ..scoring import LANGUAGE_MODEL_METRICS

__all__ = ["LANGUAGE_MODEL_METRICS", "language_model", "store_workloads", "workload_is_language_model"]


@functools.lru_cache(maxsize=64)
def workload_is_language_model(name: str) -> bool | None:
    """``True``/``False`` from the registered workload's ``input_kind``; ``None`` if unknown."""
    from ..errors import RedteamError
    from ..registry import WORKLOADS

    try:
        cls = WORKLOADS.get(name)
    except RedteamError:  # an unknown or broken plugin (the registry says which): kind unknown
        return None
    kind = getattr(cls, "input_kind", None)
    return kind == "tokens" if isinstance(kind, str) else None


def store_workloads(scenario_doc: Mapping[str, Any] | None, settings: Iterable[Iterable[tuple[str, Any]]]) -> set[Any]:
    """Workload names of a store: the scenario's and every cell's ``workload.name`` setting
    (``None`` in the set: a cell whose workload is not known)."""
    names: set[Any] = set()
    base = None
    if isinstance(scenario_doc, Mapping):
        wl = scenario_doc.get("workload")
        base = wl.get("name") if isinstance(wl, Mapping) else None
    cells = 0
    for s in settings:
        cells += 1
        own = dict(s).get("workload.name", base)
        names.add(own if isinstance(own, str) else None)
    if not cells:
        names.add(base if isinstance(base, str) else None)
    return names


def language_model(names: set[Any]) -> bool | None:
    """Whether any of the store's workloads is a language model (``None``: some kind unknown)."""
    kinds = [workload_is_language_model(n) if isinstance(n, str) else None for n in names]
    if any(k is True for k in kinds):
        return True
    return None if any(k is None for k in kinds) else False
