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

import os as _os

# OpenMP's waiting threads spin by default. On a machine shared with other busy processes, a
# torch program at 2 threads then loses far more than its CPU share (a digits federation of 100
# clients: 10.2 s at 2 threads against 1.5 s at 1, with one core busy elsewhere; 1.6 s with
# passive waiting). Passive waiting, unless the user chose otherwise; it takes effect where
# redteam is imported before torch (the CLI, the matrix workers, the pytest plugin). It is set in
# os.environ, so every process started from this one inherits it too (the matrix's workers, and
# any OpenMP program a user's session starts after importing redteam); it is not unset again,
# since OpenMP reads it only when torch is first imported, later. Set it yourself to choose.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
