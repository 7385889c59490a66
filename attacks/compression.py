"""Compression-aware attacks: the attack surface that update compression opens.

* ``neurotoxin``: Zhang, Panda, Song, Yang, Mahoney, Mittal, Ramchandran & Gonzalez,
  "Neurotoxin: Durable Backdoors in Federated Learning", ICML 2022. The attacker
  estimates the benign update from the previous global update, and confines its
  (backdoored) update to the coordinates *outside* that estimate's top-k by magnitude,
  which honest clients rarely touch and so rarely overwrite: the backdoor lasts longer.
  The released scripts keep ``gradmask_ratio = 0.99`` of the coordinates over all layers
  at once, i.e. mask the top 1 %: ``topk_fraction = 0.01`` here.
  Stated simplification: the paper projects every local gradient step onto the mask;
  here the trained update is masked once (identical for plain SGD with a fixed mask up
  to how the masked steps change later gradients). Without a previous global update
  (round 0) nothing is masked. Combine with ``backdoor`` on the data surface.
* ``sparse_capture`` [ours, REFERENCES.md §3.3 hypothesis 1]: with client-side top-k,
  coordinate j only receives values from the honest clients whose top-k support holds
  j (h_j of them). The attacker sends its k values on the coordinates with the fewest
  honest senders, each pushing against the honest mean there, so an aggregator that
  treats missing values as absent is controlled wherever f > h_j.
* ``scale_inflation`` [ours, hypothesis 2]: when one quantisation scale (max-abs) is
  shared by all contributions, one huge coordinate coarsens the int8 grid for everyone
  (a denial of service that never has to pass a norm check on the decoded grid).
* ``ef_flush`` [ours, hypothesis 3]: error-feedback residuals live on the client and
  cannot be checked; a client claims ``rounds`` rounds of withheld residual and sends
  them at once: ``rounds`` × its update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import check_knowledge, honest_rows, rand, work

if TYPE_CHECKING:
    import torch

__all__ = ["Neurotoxin", "SparseCapture", "ScaleInflation", "EFFlush", "topk_mask"]


def topk_mask(values: "torch.Tensor", k: int) -> "torch.Tensor":
    """Bool mask of the k largest-|value| entries along the last dim (``torch.topk``;
    which of several tied entries is kept is up to it)."""
    import torch

    mask = torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    if k <= 0:
        return mask
    k = min(k, values.shape[-1])
    return mask.scatter_(-1, values.abs().topk(k, dim=-1).indices, True)


def _fraction(obj: object, name: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
        raise param_error(obj, name, v, "must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class Neurotoxin(Attack):
    """Zero the own update on the top-k coordinates of the previous global update.

    * ``topk_fraction``: share of coordinates masked, by magnitude of the benign
      estimate (default 0.01 = the released ``gradmask_ratio`` 0.99).
    """

    topk_fraction: float = 0.01
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Neurotoxin: confine the (backdoored) update to coordinates outside the benign top-k"
    reference: ClassVar[str] = "Zhang et al., ICML 2022"

    def validate_topk_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1):
            raise param_error(self, "topk_fraction", v, "must be in [0, 1)")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        own = ctx.own_updates
        prev = ctx.previous_update
        if prev is None:
            return own.clone()
        d = own.shape[1]
        k = math.ceil(self.topk_fraction * d - 1e-12)
        masked = topk_mask(prev.to(device=own.device), k)
        return own.masked_fill(masked[None, :], 0)


@dataclass(frozen=True, slots=True)
class SparseCapture(Attack):
    """Spend the top-k budget on the coordinates the fewest honest clients send.

    * ``k_fraction``: the codec's top-k share (default 0.01); each row has k = ⌈k_fraction·d⌉
      non-zeros, like an honest top-k row;
    * ``scale``: the magnitude sent on each captured coordinate, as a multiple of the
      mean |value| of the attacker's own top-k entries (default 1: indistinguishable in
      size from its honest sparse update);
    * ``knowledge``: honest supports from every honest update (``"omniscient"``) or the
      attacker's own ones (``"own"``).

    Coverage h_j = number of honest rows with j in their top-k. The k coordinates with
    the smallest h_j are captured (ties broken towards the largest |honest mean|, then
    the lowest index) and receive −sign(honest mean_j)·magnitude (+magnitude where the
    mean is 0). All malicious clients capture the same coordinates.
    """

    k_fraction: float = 0.01
    scale: float = 1.0
    knowledge: Literal["omniscient", "own"] = "omniscient"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Sparse-support capture: top-k budget on the coordinates fewest honest clients send"
    reference: ClassVar[str] = "REFERENCES.md §3.3, hypothesis 1"

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_k_fraction(self, v: float) -> None:
        _fraction(self, "k_fraction", v)

    def validate_scale(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "scale", v, "must be a finite number > 0")

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f, d = own.shape
        if f == 0 or d == 0:
            return own.clone()
        k = min(d, math.ceil(self.k_fraction * d - 1e-12))
        honest = honest_rows(self.knowledge, ctx)
        coverage = topk_mask(honest, k).sum(dim=0).to(torch.float64)  # h_j
        mean = work(honest).mean(dim=0).to(torch.float64)
        # lexicographic key: fewest senders first, then the largest |mean|, then lowest index
        span = float(mean.abs().max()) + 1.0
        key = coverage * span - mean.abs()
        chosen = torch.sort(key, stable=True).indices[:k]
        own_top = own.abs().topk(k, dim=1).values.to(torch.float64).mean(dim=1)  # (f,)
        sign = -torch.sign(mean[chosen])
        sign = torch.where(sign == 0, torch.ones_like(sign), sign)
        out = torch.zeros_like(own)
        out[:, chosen] = ((self.scale * own_top)[:, None] * sign[None, :]).to(own.dtype)
        return out


@dataclass(frozen=True, slots=True)
class ScaleInflation(Attack):
    """Add one (or a few) huge coordinates to the own update to inflate a shared scale.

    * ``factor``: the injected magnitude as a multiple of max |own update| over all
      malicious rows (default 1000; 1 if the update is zero);
    * ``coordinates``: how many coordinates per row (default 1), at positions drawn from
      ``ctx.generator``, each with a random sign.

    With a shared max-abs int8 scale s = max|x|/127, every honest value smaller than
    s/2 = factor·max|own|/254 rounds to zero.
    """

    factor: float = 1000.0
    coordinates: int = 1
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Shared-scale inflation: one huge value coarsens a shared quantisation grid"
    reference: ClassVar[str] = "REFERENCES.md §3.3, hypothesis 2"

    def validate_factor(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "factor", v, "must be a finite number > 0")

    def validate_coordinates(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "coordinates", v, "must be an integer ≥ 1")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f, d = own.shape
        out = own.clone()
        if f == 0 or d == 0:
            return out
        k = min(self.coordinates, d)
        peak = float(own.abs().max())
        value = self.factor * (peak if peak > 0 else 1.0)
        keys = rand((f, d), ctx, own, dtype=torch.float32)
        idx = keys.topk(k, dim=1).indices
        signs = torch.where(rand((f, k), ctx, own, dtype=torch.float32) < 0.5, -1.0, 1.0)
        return out.scatter_(1, idx, (signs * value).to(own.dtype))


@dataclass(frozen=True, slots=True)
class EFFlush(Attack):
    """Claim ``rounds`` rounds of error-feedback residual and flush them at once.

    * ``rounds``: the number of rounds the "accumulated" residual stands for (default 10);
      each malicious row is ``rounds`` × its own update.
    """

    rounds: int = 10
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Error-feedback flush: send `rounds` rounds of claimed residual at once"
    reference: ClassVar[str] = "REFERENCES.md §3.3, hypothesis 3"

    def validate_rounds(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "rounds", v, "must be an integer ≥ 1")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        return ctx.own_updates * self.rounds
