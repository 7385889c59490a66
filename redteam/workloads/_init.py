"""Deterministic parameter initialisation shared by the built-in workloads."""

from __future__ import annotations

import math

import torch


def init_linear_(layer: torch.nn.Linear, generator: torch.Generator) -> None:
    """Kaiming-uniform weights and uniform bias as torch's default, but from ``generator``.

    torch's own ``reset_parameters`` draws from the global RNG; redteam never uses
    global random state, so the same bounds are drawn from the explicit generator.
    """
    fan_in = layer.weight.shape[1]
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        if layer.bias is not None:
            layer.bias.uniform_(-bound, bound, generator=generator)


def init_conv_(layer: torch.nn.Conv2d, generator: torch.Generator) -> None:
    fan_in = layer.weight[0].numel()
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=generator)
        if layer.bias is not None:
            layer.bias.uniform_(-bound, bound, generator=generator)


def init_module_(module: torch.nn.Module, generator: torch.Generator) -> torch.nn.Module:
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            init_linear_(m, generator)
        elif isinstance(m, torch.nn.Conv2d):
            init_conv_(m, generator)
    return module
