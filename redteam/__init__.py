"""redteam: attack federated and decentralized training on purpose, and measure defenses.

Entry points for Python users::

    import redteam
    atk = redteam.attack("sign_flip", variant="mean")
    dfn = redteam.defense("norm_bound", bound=2.0, mode="reject")
    decision = dfn(updates)          # updates: (n_clients, d) tensor
    decision.aggregate, decision.accepted, decision.reasons

Heavy modules (torch) are imported only when used, so ``import redteam`` is cheap.
"""

from __future__ import annotations

from .errors import DecodeError, InvalidParameter, InvalidScenario, RedteamError, TransportError, UnknownPlugin
from .registry import ATTACKS, DEFENSES, WORKLOADS, attack, defense, workload
from .types import (
    Attack,
    AttackContext,
    ChunkDelivery,
    ClientData,
    Decision,
    Defense,
    RoundRecord,
    ServerContext,
    Surface,
    Updates,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "attack",
    "defense",
    "workload",
    "ATTACKS",
    "DEFENSES",
    "WORKLOADS",
    "Attack",
    "AttackContext",
    "ChunkDelivery",
    "ClientData",
    "Decision",
    "Defense",
    "RoundRecord",
    "ServerContext",
    "Surface",
    "Updates",
    "RedteamError",
    "InvalidScenario",
    "InvalidParameter",
    "UnknownPlugin",
    "DecodeError",
    "TransportError",
]
