"""A Little Is Enough (ALIE).

Baruch, Baruch & Goldberg, "A Little Is Enough: Circumventing Defenses For Distributed
Learning", NeurIPS 2019. The f colluding clients all send, coordinate by coordinate,
the honest mean shifted by z standard deviations: small enough that, for each
coordinate, the malicious value still has enough honest "supporters" on its side of it
to look like the majority to median- and distance-based rules.

The number of supporters the attacker needs is s = ⌊n/2 + 1⌋ − f. The field computes
z from it in two ways, both offered here (the paper's and the reference implementations'):

* ``z="paper"``: the largest z with Φ(z) < (n − s)/n, i.e. z = Φ⁻¹((n − s)/n), as the
  paper states it;
* ``z="implementation"``: z = Φ⁻¹((n − f − s)/(n − f)), as the widely reused code
  (epfml, blades) computes it.

For n = 25, f = 5: s = 8, Φ⁻¹(17/25) ≈ 0.468 and Φ⁻¹(12/20) ≈ 0.253.

Sign. The rows here are model deltas (local − global ≈ −η·gradient). The original
code and the epfml re-implementation work on gradients and send μ − z·σ; blades and
the NDSS artifact send μ + z·σ. Negating the space flips the sign, so the original
code's gradient-space μ_g − z·σ_g is exactly μ_Δ + z·σ_Δ on deltas: ``sign=+1``
(the default) reproduces the original attack on our delta rows, ``sign=-1`` gives the
other form. Standard deviation: ``ddof=1`` (the sample std of the reference code used
by the field; the original repository used ddof = 0).

Threat model: ``knowledge="omniscient"`` (default) estimates μ and σ over every honest
update of the round; ``knowledge="own"`` is the paper's non-omniscient setting, where
the attackers estimate them from their own honest updates only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import broadcast, check_knowledge, honest_rows, work

if TYPE_CHECKING:
    import torch

__all__ = ["ALIE", "alie_z"]


def alie_z(n: int, f: int, form: str = "paper") -> float:
    """ALIE's z_max for n clients of which f are malicious.

    ``form="paper"``: Φ⁻¹((n − s)/n); ``form="implementation"``: Φ⁻¹((n − f − s)/(n − f)),
    with s = ⌊n/2 + 1⌋ − f supporters. Raises :class:`InvalidParameter` when the
    attackers already hold a majority (s ≤ 0) or the quantile is undefined.
    """
    if form not in ("paper", "implementation"):
        raise InvalidParameter(f"alie_z: form = {form!r}: must be 'paper' or 'implementation'")
    if not (isinstance(n, int) and isinstance(f, int) and n >= 2 and 1 <= f < n):
        raise InvalidParameter(f"alie_z: (n, f) = ({n!r}, {f!r}): need integers with n ≥ 2 and 1 ≤ f < n")
    s = (n // 2 + 1) - f  # ⌊n/2 + 1⌋ − f
    if s <= 0:
        raise InvalidParameter(
            f"alie_z: f = {f}: ALIE needs s = ⌊n/2 + 1⌋ − f ≥ 1 supporters, i.e. f ≤ ⌊n/2⌋ "
            f"(n = {n}, s = {s})"
        )
    p = (n - s) / n if form == "paper" else (n - f - s) / (n - f)
    if not 0 < p < 1:
        raise InvalidParameter(f"alie_z: quantile {p} for (n, f) = ({n}, {f}) is outside (0, 1)")
    return NormalDist().inv_cdf(p)


@dataclass(frozen=True, slots=True)
class ALIE(Attack):
    """Every malicious client sends μ + sign·z·σ (coordinate-wise over the honest rows).

    * ``z``: a number, or ``"paper"`` / ``"implementation"`` to derive it from n and f
      (see :func:`alie_z`; n = ``ctx.n_clients``, f = number of malicious clients);
    * ``ddof``: delta degrees of freedom of σ (default 1);
    * ``sign``: +1 (default) or −1, see the module docstring;
    * ``knowledge``: ``"omniscient"`` (default) or ``"own"``.
    """

    z: float | Literal["paper", "implementation"] = "paper"
    ddof: int = 1
    sign: int = 1
    knowledge: Literal["omniscient", "own"] = "omniscient"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "A Little Is Enough: mean ± z·std per coordinate of the honest updates"
    reference: ClassVar[str] = "Baruch, Baruch & Goldberg, NeurIPS 2019"

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_z(self, v: object) -> None:
        if isinstance(v, str):
            if v not in ("paper", "implementation"):
                raise param_error(self, "z", v, "must be a number, 'paper' or 'implementation'")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise param_error(self, "z", v, "must be a finite number, 'paper' or 'implementation'")

    def validate_ddof(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "ddof", v, "must be an integer ≥ 0")

    def validate_sign(self, v: int) -> None:
        if v not in (1, -1) or isinstance(v, bool):
            raise param_error(self, "sign", v, "must be +1 or -1")

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    def z_value(self, n: int, f: int) -> float:
        """The z in force for n clients with f malicious."""
        if isinstance(self.z, str):
            try:
                return alie_z(n, f, self.z)
            except InvalidParameter as exc:
                raise param_error(self, "z", self.z, str(exc)) from None
        return float(self.z)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":

        z = self.z_value(ctx.n_clients, ctx.n_malicious)
        rows = honest_rows(self.knowledge, ctx)
        h = rows.shape[0]
        if h <= self.ddof:
            raise param_error(
                self, "ddof", self.ddof,
                f"σ needs more than ddof honest updates, got {h} ({self.knowledge!r} knowledge)",
            )
        x = work(rows)
        mu = x.mean(dim=0)
        sigma = x.std(dim=0, correction=self.ddof)
        return broadcast(mu + self.sign * z * sigma, ctx)
