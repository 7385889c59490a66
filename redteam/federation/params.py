"""Flat parameter vectors: one ``(d,)`` row per model, views back into named tensors.

Every model in redteam travels as a flat float32 vector (the ``d`` of an ``Updates``
matrix). :class:`ParamSpec` records the names, shapes and offsets of a module's
parameters so that a flat vector — or a stack of them, ``(..., d)`` — can be turned
back into the dict ``torch.func.functional_call`` wants, without copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ParamSpec"]


@dataclass(frozen=True, slots=True)
class ParamSpec:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    numels: tuple[int, ...]

    @classmethod
    def of(cls, module: torch.nn.Module) -> "ParamSpec":
        items = list(module.named_parameters())
        return cls(
            names=tuple(n for n, _ in items),
            shapes=tuple(tuple(p.shape) for _, p in items),
            numels=tuple(p.numel() for _, p in items),
        )

    @property
    def dim(self) -> int:
        return sum(self.numels)

    def flatten(self, module: torch.nn.Module) -> torch.Tensor:
        """The module's parameters as one detached float32 vector ``(d,)``."""
        return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).to(torch.float32)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``flat`` (``(..., d)``) as ``{name: (..., *shape)}``."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, list(self.numels), dim=-1)
        return {n: p.reshape(*lead, *s) for n, p, s in zip(self.names, parts, self.shapes)}

