"""Simple misbehaviours: mimic, free riding, Sybil collusion.

* Mimic: Karimireddy, He & Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets
  via Bucketing", ICLR 2022. Every malicious client copies one honest client, chosen
  to maximise ⟨x_i, z⟩ with z the top principal direction of the honest updates'
  heterogeneity. Harmless under IID data; under non-IID data it over-weights one
  client's distribution, and no distance- or norm-based rule can tell the copies apart.
* Free rider: Fraboni, Vidal & Lorenzi, "Free-rider Attacks on Model Aggregation in
  Federated Learning", AISTATS 2021 (also Lin, Du & Liu, arXiv:1911.12560). A client
  that trains nothing sends a zero update (plain free rider) or the last global update
  it received (stale), optionally disguised with Gaussian noise of std σ·(t + 1)^(−γ).
* Sybil: Fung, Yoon & Beschastnikh, "The Limitations of Federated Learning in Sybil
  Settings", RAID 2020 (FoolsGold): many identities, one objective. Every malicious
  client sends the same update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import broadcast, randn, work

if TYPE_CHECKING:
    import torch

__all__ = ["Mimic", "FreeRider", "Sybil", "mimic_target"]


def mimic_target(honest: "torch.Tensor") -> int:
    """Index of the honest row farthest along the top principal direction.

    The direction z is the leading right singular vector of the centred honest rows,
    computed from the small (h, h) Gram matrix. Its sign is arbitrary, so the row
    maximising |⟨x_i − μ, z⟩| is chosen (the paper's argmax ⟨x_i, z⟩ for the sign of z
    that makes that client the extreme one). Ties go to the lowest index.
    """
    import torch

    x = work(honest)
    if x.shape[0] == 1:
        return 0
    c = x - x.mean(dim=0, keepdim=True)
    gram = (c @ c.T).to(torch.float64)
    evals, evecs = torch.linalg.eigh(gram)  # ascending
    if float(evals[-1]) <= 0:
        return 0
    # projections of the rows on z are the leading eigenvector scaled by √λ
    proj = (evecs[:, -1] * evals[-1].sqrt()).abs()
    return int(torch.argmax(proj))


@dataclass(frozen=True, slots=True)
class Mimic(Attack):
    """Every malicious client sends a copy of one honest client's update.

    * ``target``: index into the honest rows the attacker sees (``ctx.visible_updates``,
      honest clients in ascending client id); ``None`` (default) picks it by the paper's
      rule, recomputed each round from that round's honest updates (the paper fixes
      i* after a warm-up; the attack keeps no state between rounds).
    """

    target: int | None = None
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "Mimic: all malicious clients copy one honest client"
    reference: ClassVar[str] = "Karimireddy, He & Jaggi, ICLR 2022"

    def validate_target(self, v: int | None) -> None:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise param_error(self, "target", v, "must be an integer ≥ 0 (an honest row index) or unset")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        honest = ctx.visible_updates
        h = honest.shape[0]
        if h == 0:
            raise param_error(self, "target", self.target, "no honest updates are visible to copy")
        if self.target is None:
            i = mimic_target(honest)
        elif self.target >= h:
            raise param_error(self, "target", self.target, f"must be < {h} (number of honest updates)")
        else:
            i = self.target
        return broadcast(honest[i], ctx)


@dataclass(frozen=True, slots=True)
class FreeRider(Attack):
    """Send no real work: a zero update or the previous global update, maybe disguised.

    * ``mode``: ``"zero"`` (plain free rider: Δ = 0) or ``"stale"`` (Δ = the previous
      round's global update ``ctx.previous_update``; zero in the first round);
    * ``noise_std`` σ and ``noise_decay`` γ: disguise with N(0, (σ·(t + 1)^(−γ))²·I) per
      client, t the round (Fraboni et al.'s disguised free rider; σ = 0 disables).
    """

    mode: Literal["zero", "stale"] = "zero"
    noise_std: float = 0.0
    noise_decay: float = 0.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Free rider: zero or stale update, optionally disguised with noise"
    reference: ClassVar[str] = "Fraboni, Vidal & Lorenzi, AISTATS 2021"

    def validate_mode(self, v: str) -> None:
        if v not in ("zero", "stale"):
            raise param_error(self, "mode", v, "must be 'zero' or 'stale'")

    def validate_noise_std(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise param_error(self, "noise_std", v, "must be a finite number ≥ 0")

    def validate_noise_decay(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise param_error(self, "noise_decay", v, "must be a finite number ≥ 0")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        if self.mode == "stale" and ctx.previous_update is not None:
            out = broadcast(ctx.previous_update, ctx)
        else:
            out = torch.zeros_like(own)
        if self.noise_std > 0:
            sigma = self.noise_std * (ctx.round + 1) ** (-self.noise_decay)
            out = out + sigma * randn(tuple(own.shape), ctx, own)
        return out


@dataclass(frozen=True, slots=True)
class Sybil(Attack):
    """Every malicious identity sends one shared update.

    * ``source``: ``"mean"`` (default: the mean of the malicious clients' own updates;
      when the scenario also poisons their data these are poisoned updates, so the
      Sybils push one poisoned objective) or ``"first"`` (the first malicious client's
      update, copied to every other identity);
    * ``jitter``: std of independent Gaussian noise added per identity (0 = exact copies,
      the FoolsGold setting; a small jitter evades exact-duplicate checks).
    """

    source: Literal["mean", "first"] = "mean"
    jitter: float = 0.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Sybil collusion: many identities, one (possibly poisoned) update"
    reference: ClassVar[str] = "Fung, Yoon & Beschastnikh, RAID 2020"

    def validate_source(self, v: str) -> None:
        if v not in ("mean", "first"):
            raise param_error(self, "source", v, "must be 'mean' or 'first'")

    def validate_jitter(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise param_error(self, "jitter", v, "must be a finite number ≥ 0")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        if own.shape[0] == 0:
            return own.clone()
        shared = work(own).mean(dim=0) if self.source == "mean" else own[0]
        out = broadcast(shared, ctx)
        if self.jitter > 0:
            out = out + self.jitter * randn(tuple(own.shape), ctx, own)
        return out
