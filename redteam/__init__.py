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

# OpenMP's waiting threads spin by default. On a machine shared with other busy processes, a
# torch program at 2 threads then loses far more than its CPU share (a digits federation of 100
# clients: 10.2 s at 2 threads against 1.5 s at 1, with one core busy elsewhere; 1.6 s with
# passive waiting). Passive waiting, unless the user chose otherwise: set in os.environ, so it
# takes effect where redteam is imported before torch (the CLI, the matrix workers, the pytest
# plugin) and in every process started from this one. Where torch came first it cannot take
# effect; ``_omp`` notes that, and the robust rules then run on redteam's own threads.
from . import _omp

_omp.record()

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
