"""An example third-party attack for redteam, registered through an entry point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.types import Attack, AttackContext, Surface, param_error

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class ScaledFlip(Attack):
    """Each malicious client sends −scale × its own honest update.

    The bit-flipping attack of Karimireddy, He & Jaggi, "Learning from History for
    Byzantine Robust Optimization", ICML 2021 (scale = 1), boosted the way Bagdasaryan
    et al. boost a malicious update ("How To Backdoor Federated Learning", AISTATS 2020).
    """

    scale: float = 10.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Scaled sign flip: send −scale × own update"
    reference: ClassVar[str] = "Karimireddy, He & Jaggi, ICML 2021"

    def validate_scale(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise param_error(self, "scale", v, "must be a finite number > 0")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        return -self.scale * ctx.own_updates
