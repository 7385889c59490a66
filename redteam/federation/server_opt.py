"""Server optimizers: how the aggregate update moves the global model.

Optax-style: each optimizer is a frozen dataclass with ``init(params) -> state`` and
``step(params, update, state) -> (params, state)``; the state is explicit and returned,
never hidden. ``update`` is the aggregate of client deltas Δ = local − global, so the
pseudo-gradient of the outer problem is g = −Δ.

* ``fedavg``: w ← w + η·Δ (McMahan et al., AISTATS 2017; η = 1 is plain FedAvg).
* ``fedadam``: Adam on the pseudo-gradient, as FedAdam in Reddi et al., "Adaptive
  Federated Optimization", ICLR 2021 (Algorithm 2): m ← β₁m + (1−β₁)Δ,
  v ← β₂v + (1−β₂)Δ², w ← w + η·m/(√v + τ); no bias correction, as in the paper.
  Defaults β₁ = 0.9, β₂ = 0.99, τ = 10⁻³.
* ``nesterov``: the outer step of DiLoCo (Douillard et al., 2023): SGD with Nesterov
  momentum on g = −Δ, as PyTorch's SGD(nesterov=True): b ← μb + g;
  w ← w − η(g + μb). Defaults η = 0.7, μ = 0.9 (the paper's).

A round with no contributor (every update rejected or dropped) is ``[federation]
empty_round`` (:data:`EMPTY_ROUNDS`), applied by :func:`redteam.federation.stages.server_step`:

* ``"skip"`` (default): no step at all; the model and the optimizer state are kept bit for
  bit. This is torchft's DiLoCo (``torchft/local_sgd.py``, ``DiLoCo._perform_sync``): the
  outer optimizer steps only ``if manager.should_commit()``, which is false when fewer
  replicas than ``min_replica_size`` took part;
* ``"momentum"``: ``step`` is called with a zero update, as a loop that always steps would:
  FedAvg stays put, but Nesterov moves w by −ημ²b (b the previous buffer) and FedAdam by
  η·β₁m/(√(β₂v) + τ), so empty rounds drift the model along the stale momentum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..errors import InvalidParameter
from ..types import param_error

__all__ = ["FedAvg", "FedAdam", "Nesterov", "make_server_optimizer", "SERVER_OPTIMIZERS", "EMPTY_ROUNDS"]

#: what a round with no contributor does (``[federation] empty_round``; the first is the default)
EMPTY_ROUNDS = ("skip", "momentum")


def _positive(obj: Any, name: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        raise param_error(obj, name, v, "must be a finite number > 0")


def _unit(obj: Any, name: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and 0 <= v < 1):
        raise param_error(obj, name, v, "must be in [0, 1)")


@dataclass(frozen=True, slots=True)
class FedAvg:
    lr: float = 1.0
    name: ClassVar[str] = "fedavg"

    def __post_init__(self) -> None:
        _positive(self, "lr", self.lr)

    def init(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        return {}

    def step(self, params: torch.Tensor, update: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        return params + self.lr * update, state


@dataclass(frozen=True, slots=True)
class FedAdam:
    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    name: ClassVar[str] = "fedadam"

    def __post_init__(self) -> None:
        _positive(self, "lr", self.lr)
        _unit(self, "beta1", self.beta1)
        _unit(self, "beta2", self.beta2)
        _positive(self, "tau", self.tau)

    def init(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"m": torch.zeros_like(params), "v": torch.zeros_like(params)}

    def step(self, params: torch.Tensor, update: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        m = self.beta1 * state["m"] + (1 - self.beta1) * update
        v = self.beta2 * state["v"] + (1 - self.beta2) * update * update
        return params + self.lr * m / (v.sqrt() + self.tau), {"m": m, "v": v}


@dataclass(frozen=True, slots=True)
class Nesterov:
    lr: float = 0.7
    momentum: float = 0.9
    name: ClassVar[str] = "nesterov"

    def __post_init__(self) -> None:
        _positive(self, "lr", self.lr)
        _unit(self, "momentum", self.momentum)

    def init(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"b": torch.zeros_like(params)}

    def step(self, params: torch.Tensor, update: torch.Tensor, state: dict) -> tuple[torch.Tensor, dict]:
        g = -update
        b = self.momentum * state["b"] + g
        return params - self.lr * (g + self.momentum * b), {"b": b}


SERVER_OPTIMIZERS = {"fedavg": FedAvg, "fedadam": FedAdam, "nesterov": Nesterov}


def make_server_optimizer(name: str, **params: Any) -> Any:
    if name not in SERVER_OPTIMIZERS:
        raise InvalidParameter(
            f"server optimizer {name!r}: must be one of {', '.join(SERVER_OPTIMIZERS)}"
        )
    try:
        return SERVER_OPTIMIZERS[name](**params)
    except TypeError as exc:
        raise InvalidParameter(f"server optimizer {name!r}: {exc}") from None
