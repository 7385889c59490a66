"""The null attack and sign flipping.

Sign flipping (a.k.a. bit flipping) sends the negation of an honest update. It is the
baseline Byzantine attack of Karimireddy, He & Jaggi, "Learning from History for
Byzantine Robust Optimization", ICML 2021 (variant ``own``: negate the client's own
honest update), and, with the mean of the honest updates (variant ``mean``), the
ε = 1 case of Xie, Koyejo & Gupta's inner-product manipulation (UAI 2019).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class NoAttack(Attack):
    """No attack: malicious clients behave honestly. Used for baselines."""

    summary: ClassVar[str] = "No attack (baseline)"


@dataclass(frozen=True, slots=True)
class SignFlip(Attack):
    """Send −g instead of g.

    * ``variant="own"``: each malicious client sends the negation of its own honest
      update (Karimireddy et al. 2021);
    * ``variant="mean"``: every malicious client sends −mean of the honest updates it
      can see (under the non-omniscient threat model, its own colluders' updates).
    * ``scale``: multiply the flipped update by this factor (1 = plain flip).

    Under worker momentum (``[federation] client_momentum = β``) the client's "own update"
    is what ``[federation] malicious_momentum`` says: ``"raw"`` (default) its round's fresh
    term, as the authors' ``BitFlippingWorker`` (a plain ``TorchWorker``, no momentum) sends
    −g while the honest ``MomentumWorker``s send their momenta; ``"momentum"`` its momentum,
    as an honest client's. ``variant="mean"`` flips the visible honest rows (their momenta
    when omniscient).
    """

    variant: Literal["own", "mean"] = "own"
    scale: float = 1.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Sign flipping: send −(own update) or −(mean of visible honest updates)"
    reference: ClassVar[str] = "Karimireddy, He & Jaggi, ICML 2021"

    def validate_variant(self, v: str) -> None:
        if v not in ("own", "mean"):
            raise param_error(self, "variant", v, "must be 'own' or 'mean'")

    def validate_scale(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "scale", v, "must be a finite number > 0")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        if self.variant == "own":
            return -self.scale * ctx.own_updates
        mean = ctx.visible_updates.mean(dim=0)
        return (-self.scale * mean).expand_as(ctx.own_updates).clone()
