"""A toy regression workload for hand-derived training tests: out = w·x (no bias),
loss = ½·mean((out − y)²), so the gradient on one sample is (w·x − y)·x."""

from __future__ import annotations

import torch

from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer, StackedData
from redteam.types import ClientData


class ToyWorkload:
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((output - target) ** 2).mean()

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (output - target).abs() < 0.5


def toy(d: int = 2, n: int = 3, x: list[float] | None = None, y: float = 1.0):
    """(trainer, data, global params 0): every client holds the single sample (x, y)."""
    model = torch.nn.Linear(d, 1, bias=False)
    spec = ParamSpec.of(model)
    xs = torch.tensor([x or [1.0] * d])
    data = StackedData.stack([ClientData(xs.clone(), torch.tensor([[y]])) for _ in range(n)])
    return BatchedTrainer(ToyWorkload(), model, spec), data, torch.zeros(spec.dim)
