"""The contract kit for plugin authors: checks every plugin must pass, and the inputs.

>>> from redteam.testing import check_attack, check_defense
>>> check_attack("sign_flip")                     # doctest: +SKIP
>>> check_defense(MyRule(f=1))                    # doctest: +SKIP

* :func:`check_attack` / :func:`check_defense` (:mod:`redteam.testing.contracts`):
  shapes, dtypes and device preserved; finite in → finite out; deterministic under the
  seed; no mutation of inputs; for symmetric defenses, invariance to permuting clients
  and identity on identical rows. They raise ``AssertionError`` naming the plugin and
  the broken property, and return a :class:`ContractReport` when everything holds.
* :mod:`redteam.testing.strategies`: hypothesis strategies for update matrices, server
  and attack contexts and client datasets (imported on first use, so importing
  ``redteam.testing`` does not import hypothesis).
* :mod:`redteam.testing.builders`: the deterministic builders behind them
  (``make_updates(seed, n, d)``, ``make_attack_context(seed, n, f, d)``,
  ``make_gossip_context(seed, n, f, d)`` …) and the
  ``AttackCase`` / ``DefenseCase`` reproduce lines a failing check prints.

Nothing here imports torch until a check or builder runs.
"""

from __future__ import annotations

from typing import Any

from .builders import (
    DEFENSE_KINDS,
    KINDS,
    AttackCase,
    DefenseCase,
    FixedUpdate,
    QuadraticLoss,
    RowReplay,
    make_attack_context,
    make_client_data,
    make_gossip_context,
    make_server_context,
    make_updates,
)
from .contracts import DEGENERATE, ContractReport, check_attack, check_defense

__all__ = [
    "check_attack",
    "check_defense",
    "ContractReport",
    "AttackCase",
    "DefenseCase",
    "KINDS",
    "DEFENSE_KINDS",
    "DEGENERATE",
    "make_updates",
    "make_server_context",
    "make_attack_context",
    "make_client_data",
    "make_gossip_context",
    "QuadraticLoss",
    "FixedUpdate",
    "RowReplay",
    "strategies",
]


def __getattr__(name: str) -> Any:
    if name == "strategies":  # hypothesis is imported only when the strategies are asked for
        import importlib

        return importlib.import_module(".strategies", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
