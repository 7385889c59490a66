"""Compression-aware attacks: the attack surface that update compression opens.

* ``neurotoxin``: Zhang, Panda, Song, Yang, Mahoney, Mittal, Ramchandran & Gonzalez,
  "Neurotoxin: Durable Backdoors in Federated Learning", ICML 2022. The attacker
  estimates the benign update and confines its (backdoored) training to the
  coordinates *outside* that estimate's top-k by magnitude, which honest clients rarely
  touch and so rarely overwrite: the backdoor lasts longer. The released scripts keep
  ``gradmask_ratio = 0.99`` of the coordinates over all layers at once, i.e. mask the
  top 1 %: ``topk_fraction = 0.01`` here. ``masking = "per_step"`` (default, the paper's
  Algorithm 1 and the released code) multiplies the mask into the gradient of **every
  local step** (``Surface.TRAINING``), so later steps compensate on the free coordinates;
  ``"after_training"`` zeroes the trained update once (the earlier simplification, kept
  for scenarios that use it — it loses whatever the masked coordinates carried). See
  :class:`Neurotoxin` for the mask's source and the optional norm projection.
  Combine with ``backdoor`` on the data surface (``compose``).
* ``sparse_capture`` [ours, a hypothesis about client-side top-k]: with client-side top-k,
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
from typing import TYPE_CHECKING, Callable, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import check_knowledge, fit_norm, honest_rows, rand, work

if TYPE_CHECKING:
    import torch

    from redteam.types import TrainingHook

__all__ = ["Neurotoxin", "SparseCapture", "ScaleInflation", "EFFlush", "topk_mask", "ball_projection"]


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


def ball_projection(radius: float) -> "Callable[[torch.Tensor, torch.Tensor], torch.Tensor]":
    """Rows W (f, d) ↦ G + (W − G)·min(1, r/‖W − G‖): the L2 ball of radius r around G."""
    import torch

    r = float(radius)

    def project(rows: "torch.Tensor", global_params: "torch.Tensor") -> "torch.Tensor":
        diff = rows - global_params[None, :]
        norm = torch.linalg.vector_norm(diff, dim=1, keepdim=True, dtype=torch.float64)
        scale = torch.where(norm > r, r / norm.clamp_min(1e-300), torch.ones_like(norm))
        return global_params[None, :] + diff * scale.to(diff.dtype)

    return project


@dataclass(frozen=True, slots=True)
class Neurotoxin(Attack):
    """Train (or send) only outside the top-k coordinates of the benign estimate.

    * ``topk_fraction``: share of coordinates masked, by magnitude of the benign
      estimate (default 0.01 = the released ``gradmask_ratio`` 0.99);
    * ``masking``: ``"per_step"`` (default: a gradient mask on every local step) or
      ``"after_training"`` (zero the trained update once);
    * ``mask_from``: the benign estimate. ``"previous_update"`` (default, the paper's
      text): the previous round's global update. ``"clean_gradient"`` (the released
      code computes the gradient of clean data on the current model): the hook has no
      data or model of its own, so the stand-in is the mean of the honest clients'
      updates of the previous round (omniscient) — the clean data's descent direction
      as the benign population saw it;
    * ``norm_bound``: optional L2 radius r; with per-step masking the local model is
      projected onto ‖w − w_g‖ ≤ r after every step (the released code's norm bound),
      after training the masked update is scaled down to ‖Δ‖ ≤ r;
    * ``lr``, ``steps``: the attacker's own local learning rate and step count with
      per-step masking (unset: the federation's; the released scripts pass a separate
      ``--poison_lr``). With ``masking = "after_training"`` the attack does not touch the
      local training, so setting either is refused (a one-line error naming it) rather
      than silently ignored.

    Without an estimate (round 0, no previous update) nothing is masked.
    """

    topk_fraction: float = 0.01
    masking: Literal["per_step", "after_training"] = "per_step"
    mask_from: Literal["previous_update", "clean_gradient"] = "previous_update"
    norm_bound: float | None = None
    lr: float | None = None
    steps: int | None = None
    summary: ClassVar[str] = "Neurotoxin: confine the (backdoored) training to coordinates outside the benign top-k"
    reference: ClassVar[str] = "Zhang et al., ICML 2022"

    @property
    def surfaces(self) -> tuple[str, ...]:  # type: ignore[override]
        return (Surface.TRAINING,) if self.masking == "per_step" else (Surface.UPDATES,)

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.mask_from == "clean_gradient"

    def validate_topk_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1):
            raise param_error(self, "topk_fraction", v, "must be in [0, 1)")

    def validate_masking(self, v: str) -> None:
        if v not in ("per_step", "after_training"):
            raise param_error(self, "masking", v, "must be 'per_step' or 'after_training'")

    def validate_mask_from(self, v: str) -> None:
        if v not in ("previous_update", "clean_gradient"):
            raise param_error(self, "mask_from", v, "must be 'previous_update' or 'clean_gradient'")

    def validate_norm_bound(self, v: float | None) -> None:
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and math.isfinite(v) and v > 0):
            raise param_error(self, "norm_bound", v, "must be a finite number > 0, or unset")

    def validate_lr(self, v: float | None) -> None:
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and math.isfinite(v) and v > 0):
            raise param_error(self, "lr", v, "must be a finite number > 0, or unset (the federation's)")
        self._training_only("lr", v)

    def validate_steps(self, v: int | None) -> None:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise param_error(self, "steps", v, "must be an integer ≥ 1, or unset (the federation's)")
        self._training_only("steps", v)

    def _training_only(self, name: str, v: object) -> None:
        if v is not None and self.masking == "after_training":
            raise param_error(self, name, v, "acts on the local training, which masking = 'after_training' leaves "
                                             "to the federation: unset it or use masking = 'per_step'")

    def estimate(self, ctx: AttackContext) -> "torch.Tensor | None":
        """The benign estimate (d,) whose top-k coordinates are masked, or ``None``."""
        if self.mask_from == "previous_update":
            return ctx.previous_update
        honest = ctx.visible_updates
        if honest.shape[0] == 0:
            return None
        est = work(honest).mean(dim=0)
        return est if bool((est != 0).any()) else None

    def free_mask(self, ctx: AttackContext) -> "torch.Tensor | None":
        """Bool (d,): ``True`` on the coordinates the attacker may change (``None``: all)."""
        est = self.estimate(ctx)
        if est is None:
            return None
        d = ctx.own_updates.shape[1]
        k = math.ceil(self.topk_fraction * d - 1e-12)
        return ~topk_mask(est.to(device=ctx.own_updates.device), k)

    def training_hook(self, ctx: AttackContext) -> "TrainingHook | None":
        from redteam.types import TrainingHook

        if self.masking != "per_step":
            return None
        free = self.free_mask(ctx)
        proj = ball_projection(self.norm_bound) if self.norm_bound is not None else None
        if free is None and proj is None and self.lr is None and self.steps is None:
            return None
        mask = None if free is None else free.to(ctx.global_params.dtype)
        return TrainingHook(grad_mask=mask, project=proj, lr=self.lr, steps=self.steps)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        own = ctx.own_updates
        if self.masking == "per_step":
            return own.clone()  # shaped during training already
        free = self.free_mask(ctx)
        out = own.clone() if free is None else own.masked_fill(~free[None, :], 0)
        if self.norm_bound is not None and out.shape[0]:
            import torch

            over = torch.linalg.vector_norm(out, dim=1, dtype=torch.float64) > self.norm_bound
            if bool(over.any()):
                out = torch.where(over[:, None].to(out.device), fit_norm(out, self.norm_bound, out), out)
        return out


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
    reference: ClassVar[str] = "Stich et al., NeurIPS 2018 (top-k with memory); Zhang et al., ICML 2022"

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
    reference: ClassVar[str] = "Stich et al., NeurIPS 2018 (top-k); Bagdasaryan et al., AISTATS 2020 (boosting)"

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
    reference: ClassVar[str] = "Karimireddy et al., ICML 2019 and Stich et al., NeurIPS 2018 (error feedback)"

    def validate_rounds(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise param_error(self, "rounds", v, "must be an integer ≥ 1")

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        return ctx.own_updates * self.rounds
