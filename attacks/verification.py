"""Incentive gaming against validators of work (issue 25): earn rewards without doing the work.

These target a rewarding validator such as defenses/gauntlet.py (after Templar's Gauntlet,
arXiv:2505.21684), where the payoff is a share of the round's reward pool rather than
damage to the model:

* ``copy_noise``: each cheat copies a randomly chosen honest peer's update of the round and
  adds small Gaussian noise (std ``noise``·‖victim‖/√d), so that exact-duplicate checks miss
  it. Omniscient: it needs this round's honest updates (under commit-reveal it can only have
  them after they are revealed, which is what commit-reveal exploits).
* ``lazy_scaled``: trains ``steps`` local steps instead of the federation's (and, with
  ``batch``, on fewer items per step), then scales its update by ``scale`` so its norm looks
  like an honest one (a lazy peer, cf. the free riders of Fraboni et al., AISTATS 2021,
  disguised by scaling instead of noise).
* ``score_gaming``: trains on its assigned page only (the first ``page`` items of its data; a
  permissionless trainer's data assignment is public, and the Gauntlet-style validator scores a
  peer on that page, ``redteam.federation.loop.ASSIGNED_PAGE``): it overfits the batch it is
  scored on. The validator's random batch (which the cheat cannot see) is the counter.

Each can also hold ``validator_seats``: colluding validators that report scores favouring the
cheats to a consensus of several validators (:class:`_ValidatorSeats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, ClientData, Surface, TrainingHook, param_error

from ._common import randn, work

if TYPE_CHECKING:
    import torch

__all__ = ["CopyNoise", "LazyScaled", "ScoreGaming"]


class _ValidatorSeats:
    """A cheat that also holds validator seats (``validator_seats`` = c ≥ 0; 0: none).

    Permissionless trainers pay by a consensus of several validators (Templar's weights go through
    Bittensor's Yuma consensus: per peer, the largest score that validators holding more than a
    κ share of the stake support; defenses/gauntlet.py ``validators``). A colluding seat reports,
    per peer, the round's largest |honest score| for the cheat's own identities and minus it for
    everyone else: it boosts its own and buries the honest. With equal stakes it moves the
    consensus only when the colluding seats hold more than κ of the validators."""

    __slots__ = ()

    def validate_validator_seats(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "validator_seats", v, "must be an integer ≥ 0")

    def report_scores(self, peers: tuple[int, ...], scores: "torch.Tensor", own: tuple[int, ...]) -> "torch.Tensor":
        import torch

        s = scores.to(torch.float64)
        finite = s[torch.isfinite(s)]
        top = float(finite.abs().max()) if finite.numel() else 1.0
        top = top if top > 0 else 1.0
        mine = torch.tensor([c in set(own) for c in peers], dtype=torch.bool)
        row = torch.where(mine, torch.full_like(s, top), torch.full_like(s, -top))
        return row.expand(int(self.validator_seats), -1).clone()  # type: ignore[attr-defined]


def _nonneg(obj: object, name: str, v: float) -> None:
    if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
        raise param_error(obj, name, v, "must be a finite number ≥ 0")


@dataclass(frozen=True, slots=True)
class CopyNoise(_ValidatorSeats, Attack):
    """Copy a random honest peer's update of this round and add relative Gaussian noise.

    * ``noise``: the noise's std σ, in the unit ``noise_mode`` says; each cheat sends
      x_v + σ·u·N(0, I), x_v a victim drawn uniformly (per cheat, per round) from
      ``ctx.visible_updates``;
    * ``noise_mode``: ``"relative"`` (default): u = ‖x_v‖/√d, the victim's RMS coordinate;
      ``"spread"``: u = the honest updates' spread, √(mean over coordinates of their variance
      across peers), so that at σ = 1 the copy differs from its victim as much as a fresh honest
      peer's update differs from the honest mean (its distance to the victim is then √2 less than
      two honest peers' typical distance, not more): a copier calibrated not to look like a copy;
    * ``validator_seats``: validator seats the cheats also hold (:class:`_ValidatorSeats`).
    """

    noise: float = 0.01
    noise_mode: Literal["relative", "spread"] = "relative"
    validator_seats: int = 0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    omniscient: ClassVar[bool] = True
    summary: ClassVar[str] = "Copy plus noise: send a random honest peer's update with small noise (incentive gaming)"
    reference: ClassVar[str] = "issue 25; Templar Gauntlet, arXiv:2505.21684"

    def validate_noise(self, v: float) -> None:
        _nonneg(self, "noise", v)

    def validate_noise_mode(self, v: str) -> None:
        if v not in ("relative", "spread"):
            raise param_error(self, "noise_mode", v, 'must be "relative" or "spread"')

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own, honest = ctx.own_updates, ctx.visible_updates
        f = own.shape[0]
        if f == 0 or honest.shape[0] == 0:
            return own.clone()
        g = ctx.generator
        pick = torch.randint(0, honest.shape[0], (f,), generator=g, device=g.device).to(honest.device)
        base = work(honest[pick])
        if self.noise_mode == "spread":  # one honest peer: no spread to copy, the copy is exact
            h = work(honest)
            spread = h.var(dim=0, unbiased=True).mean().sqrt() if h.shape[0] > 1 else h.new_zeros(())
            scale = spread.expand(base.shape[0], 1)
        else:
            scale = torch.linalg.vector_norm(base, dim=1, keepdim=True) / math.sqrt(max(base.shape[1], 1))
        out = base + self.noise * scale * randn(tuple(base.shape), ctx, base)
        return out.to(dtype=own.dtype, device=own.device)


@dataclass(frozen=True, slots=True)
class LazyScaled(_ValidatorSeats, Attack):
    """Train fewer local steps, then scale the update to look honest.

    * ``steps``: local steps the cheat runs (≥ 1; the federation's honest count is typically
      larger);
    * ``scale``: factor applied to its own delta (default 5.0: about what h/steps gives when
      h = 5·steps and the steps add up linearly);
    * ``batch``: train each step on the first ``batch`` items of the drawn batch only (unset:
      the whole batch); a smaller batch saves work without shrinking the update, so pair it with
      ``steps`` at the federation's count and ``scale = 1`` for the small-batch cheat alone;
    * ``validator_seats``: validator seats the cheats also hold (:class:`_ValidatorSeats`).
    """

    steps: int = 1
    scale: float = 5.0
    batch: int | None = None
    validator_seats: int = 0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRAINING, Surface.UPDATES)
    summary: ClassVar[str] = "Lazy training: fewer local steps, update scaled to an honest norm (incentive gaming)"
    reference: ClassVar[str] = "issue 25; Fraboni, Vidal & Lorenzi, AISTATS 2021 (free riders)"

    def validate_steps(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "steps", v, "must be an integer ≥ 1")

    def validate_scale(self, v: float) -> None:
        _nonneg(self, "scale", v)

    def validate_batch(self, v: int | None) -> None:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise param_error(self, "batch", v, "must be an integer ≥ 1 (or unset: the whole batch)")

    def training_hook(self, ctx: AttackContext) -> TrainingHook:
        return TrainingHook(steps=self.steps, batch=self.batch)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        return (ctx.own_updates * self.scale).to(ctx.own_updates.dtype)


@dataclass(frozen=True, slots=True)
class ScoreGaming(_ValidatorSeats, Attack):
    """Train on the assigned page only (the batch the validator scores the peer on).

    * ``page``: the assigned page's size (default 32, the engine's ``ASSIGNED_PAGE``);
    * ``validator_seats``: validator seats the cheats also hold (:class:`_ValidatorSeats`).
    """

    page: int = 32
    validator_seats: int = 0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA,)
    summary: ClassVar[str] = "Score gaming: train only on the validator's assigned batch (overfit what is scored)"
    reference: ClassVar[str] = "issue 25; Templar Gauntlet, arXiv:2505.21684"

    def validate_page(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "page", v, "must be an integer ≥ 1")

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        return ClientData(data.x[:self.page].clone(), data.y[:self.page].clone())
