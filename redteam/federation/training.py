"""Local training of all clients at once.

Clients are simulated as a batch: one flat parameter row per client, stacked into an
``(n, d)`` matrix, and trained together with ``torch.func`` — ``vmap`` over the client
dimension of ``grad`` of the functional model — so that one step of every client is a
handful of batched kernels instead of ``n`` separate models in a Python loop.

Each client draws its own minibatches from its own data (all client datasets live in
one pooled tensor; client c owns rows ``offsets[c] : offsets[c] + sizes[c]``). Batches
are drawn *with replacement* from the client's data, seeded by the explicit generator.
Local SGD with an optional FedProx proximal term (Li et al., "Federated Optimization in
Heterogeneous Networks", MLSys 2020): the gradient gains μ·(w − w_global).

``local_epochs`` (instead of ``local_steps``) gives client c ⌈epochs·|D_c| / B⌉ steps;
clients that finish early stop moving (a per-client mask), so the batch stays one
tensor program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch.func import functional_call, grad, vmap

from ..types import ClientData
from .params import ParamSpec

if TYPE_CHECKING:
    from ..workloads.base import Workload

__all__ = ["StackedData", "BatchedTrainer", "LocalTraining"]


@dataclass(frozen=True, slots=True)
class LocalTraining:
    """Hyper-parameters of the clients' local procedure."""

    steps: int = 10
    epochs: float | None = None
    batch_size: int = 16
    lr: float = 0.1
    prox_mu: float = 0.0


@dataclass(frozen=True, slots=True)
class StackedData:
    """Every client's dataset in one pooled tensor, with per-client offsets and sizes."""

    x: torch.Tensor
    y: torch.Tensor
    offsets: torch.Tensor  # (n,) int64
    sizes: torch.Tensor  # (n,) int64

    @classmethod
    def stack(cls, clients: list[ClientData]) -> "StackedData":
        sizes = torch.tensor([len(c) for c in clients], dtype=torch.int64)
        offsets = torch.zeros_like(sizes)
        if len(sizes) > 1:
            offsets[1:] = torch.cumsum(sizes, 0)[:-1]
        return cls(
            x=torch.cat([c.x for c in clients]),
            y=torch.cat([c.y for c in clients]),
            offsets=offsets,
            sizes=sizes,
        )

    def client(self, i: int) -> ClientData:
        a, b = int(self.offsets[i]), int(self.offsets[i] + self.sizes[i])
        return ClientData(self.x[a:b], self.y[a:b])

    def to(self, device: torch.device | str) -> "StackedData":
        return StackedData(self.x.to(device), self.y.to(device), self.offsets.to(device), self.sizes.to(device))


class BatchedTrainer:
    """Trains stacked client parameter rows with ``vmap(grad(loss))``.

    Built once per federation (it holds the functional model); :meth:`train` is pure
    given its arguments: same inputs and generator state → same outputs.
    """

    def __init__(self, workload: "Workload", model: torch.nn.Module, spec: ParamSpec) -> None:
        self.workload = workload
        self.spec = spec
        self.model = model
        loss_of = workload.loss

        def loss(flat: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            out = functional_call(model, spec.unflatten(flat), (xb,))
            return loss_of(out, yb)

        self._loss = loss
        self._grads: Callable[..., torch.Tensor] = vmap(grad(loss))

    def train(
        self,
        global_params: torch.Tensor,
        data: StackedData,
        clients: torch.Tensor,
        cfg: LocalTraining,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Return the local parameters ``(len(clients), d)`` after local training.

        ``clients`` indexes rows of ``data`` (the participating clients, in order).
        """
        n = int(clients.shape[0])
        device = global_params.device
        params = global_params.unsqueeze(0).expand(n, -1).clone()
        if n == 0:
            return params
        clients = clients.to(device)
        offsets = data.offsets.to(device)[clients]
        sizes = data.sizes.to(device)[clients]
        if cfg.epochs is not None:
            steps_each = torch.ceil(cfg.epochs * sizes.to(torch.float64) / cfg.batch_size).to(torch.int64)
            total = int(steps_each.max())
        else:
            steps_each = None
            total = cfg.steps
        b = cfg.batch_size
        for step in range(total):
            # per-client batch indices into the pooled data, drawn on CPU for determinism
            u = torch.rand((n, b), generator=generator, dtype=torch.float64).to(device)
            idx = offsets[:, None] + torch.floor(u * sizes[:, None]).to(torch.int64)
            xb, yb = data.x[idx], data.y[idx]
            g = self._grads(params, xb, yb)
            if cfg.prox_mu:
                g = g + cfg.prox_mu * (params - global_params)
            if steps_each is not None:
                g = g * (step < steps_each).to(g.dtype)[:, None]
            params = params - cfg.lr * g
        return params

    @torch.no_grad()
    def evaluate(self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(accuracy, mean loss) of the flat parameters on ``(x, y)``."""
        out = functional_call(self.model, self.spec.unflatten(flat), (x,))
        loss = float(self.workload.loss(out, y))
        acc = float(self.workload.correct(out, y).to(torch.float64).mean())
        if math.isnan(loss):
            loss = float("inf")
        return acc, loss

    @torch.no_grad()
    def losses(self, flats: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss of each parameter row ``(k, d)`` on the same data, batched: ``(k,)``."""
        return vmap(self._loss, in_dims=(0, None, None))(flats, x, y)
