"""Noise attacks: Gaussian Byzantine vectors and non-finite injection.

Gaussian: Blanchard, El Mhamdi, Guerraoui & Stainer, "Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017 (§5: Byzantine workers
send vectors drawn from a Gaussian with standard deviation 200). The ``center="own"``
variant adds the noise to the client's own honest update (additive-noise attack).

Non-finite: a malicious or faulty client puts NaN or ±Inf into some coordinates; a
single NaN poisons a plain mean and every aggregate built on it. It is the baseline
that the finite check (``sanity`` in :mod:`defenses.sanity`) exists for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import rand, randn

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class Gaussian(Attack):
    """Send Gaussian noise: each malicious row is ``base + N(mean, std²·I)``.

    * ``mean``, ``std``: the noise law (defaults 0 and 200, as in Blanchard et al. 2017);
    * ``center``: ``"zero"`` (the paper's pure noise, base = 0) or ``"own"`` (base = the
      client's own honest update).

    Each malicious client draws its own independent noise from ``ctx.generator``.
    """

    mean: float = 0.0
    std: float = 200.0
    center: Literal["zero", "own"] = "zero"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Gaussian noise rows N(μ, σ²I), pure or added to the own update"
    reference: ClassVar[str] = "Blanchard et al., NeurIPS 2017"

    def validate_mean(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v)):
            raise param_error(self, "mean", v, "must be a finite number")

    def validate_std(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise param_error(self, "std", v, "must be a finite number ≥ 0")

    def validate_center(self, v: str) -> None:
        if v not in ("zero", "own"):
            raise param_error(self, "center", v, "must be 'zero' or 'own'")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        own = ctx.own_updates
        noise = randn(tuple(own.shape), ctx, own) * self.std + self.mean
        return noise + own if self.center == "own" else noise


@dataclass(frozen=True, slots=True)
class NonFinite(Attack):
    """Put ``value`` (NaN, +Inf or −Inf) into a ``fraction`` of each row's coordinates.

    * ``value``: ``"nan"``, ``"inf"`` or ``"-inf"``;
    * ``fraction``: share of coordinates replaced, in (0, 1]; each row gets
      ``k = ⌈fraction · d⌉`` positions (at least one) chosen uniformly without
      replacement from ``ctx.generator``, independently per malicious client;
    * ``base``: the other coordinates hold the client's own honest update (``"own"``)
      or zero (``"zero"``).
    """

    value: Literal["nan", "inf", "-inf"] = "nan"
    fraction: float = 1.0
    base: Literal["own", "zero"] = "own"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    produces_nonfinite: ClassVar[bool] = True  # non-finite rows are the point
    summary: ClassVar[str] = "Non-finite injection: NaN/±Inf in a fraction of the coordinates"
    reference: ClassVar[str] = "Blanchard et al., NeurIPS 2017 (arbitrary Byzantine vectors); IEEE 754 NaN/Inf"

    def validate_value(self, v: str) -> None:
        if v not in ("nan", "inf", "-inf"):
            raise param_error(self, "value", v, "must be 'nan', 'inf' or '-inf'")

    def validate_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and 0 < v <= 1):
            raise param_error(self, "fraction", v, "must be in (0, 1]")

    def validate_base(self, v: str) -> None:
        if v not in ("own", "zero"):
            raise param_error(self, "base", v, "must be 'own' or 'zero'")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f, d = own.shape
        out = own.clone() if self.base == "own" else torch.zeros_like(own)
        if d == 0 or f == 0:
            return out
        k = min(d, max(1, math.ceil(self.fraction * d)))
        fill = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[self.value]
        if k == d:
            return out.fill_(fill)
        # k positions per row without replacement: the k largest of i.i.d. uniform keys
        keys = rand((f, d), ctx, own, dtype=torch.float32)
        idx = keys.topk(k, dim=1).indices
        out.scatter_(1, idx, fill)
        return out
