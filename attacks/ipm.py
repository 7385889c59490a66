"""Inner Product Manipulation (IPM).

Xie, Koyejo & Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner
Product Manipulation", UAI 2019. Every malicious client sends −ε·μ, μ the mean of the
honest updates. With a small ε (0.1) the malicious rows sit next to the honest mean,
so Krum and Bulyan pick them, and once enough copies are picked the inner product of
the aggregate with the true descent direction turns negative; a large ε (≈ 100)
targets mean- and median-type rules. The default ε = 0.1 is
the small-ε setting of the paper, also used by Karimireddy et al. (2021).

Space: the paper and its code work on gradients and send −ε·μ_g; on our delta rows
(≈ −η·gradient) μ flips sign with the space, so −ε·μ_Δ is the same attack and no sign
parameter is needed (unlike ALIE's and Min-Max's σ, which does not flip). The "optimal"
variant with ε chosen against the defense is ``ipm_opt`` (``attacks.tailored``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import broadcast, check_knowledge, honest_rows, work

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class IPM(Attack):
    """Every malicious client sends −ε · mean(honest updates).

    * ``epsilon``: ε > 0 (default 0.1);
    * ``knowledge``: ``"omniscient"`` (default, the paper's: the mean of every honest
      update of the round) or ``"own"`` (the mean of the malicious clients' own honest updates).
    """

    epsilon: float = 0.1
    knowledge: Literal["omniscient", "own"] = "omniscient"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Inner product manipulation: −ε × mean of the honest updates"
    reference: ClassVar[str] = "Xie, Koyejo & Gupta, UAI 2019"

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_epsilon(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "epsilon", v, "must be a finite number > 0")

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":

        mu = work(honest_rows(self.knowledge, ctx)).mean(dim=0)
        return broadcast(-self.epsilon * mu, ctx)
