"""Chameleon: a durable backdoor that adapts the poisoned images to their peers.

Dai & Li, "Chameleon: Adapting to Peer Images for Planting Durable Backdoors in Federated
Learning", ICML 2023 (PMLR 202:6712-6725). Authors' code: github.com/ybdai7/Chameleon-durable-backdoor
(commit c74618a3, ``training.py`` ``train``, ``utils/losses.py`` ``SupConLoss``,
``image_helper.py`` ``add_trigger``, ``utils/params_pixel_trigger_cifar10.yaml``, ``commands.sh``).

The paper's finding: a backdoor lasts longer when the poisoned images' representations sit
near benign images of the target label (*facilitators*) and far from benign images of their
true label (*obstructors*), since later honest training on those peers then keeps the backdoor
alive instead of erasing it. The malicious client's local procedure has two stages, both starting
from the round's global model G, on batches of which a share is stamped with the trigger and
relabelled to the target (:class:`attacks.backdoor.Backdoor`'s pixel trigger, plus Gaussian noise
of std ``noise`` on the stamped images as the released code adds):

1. **Contrastive stage** (``contrastive_epochs`` epochs at ``contrastive_lr``): train the encoder —
   every parameter outside the output layer (``ModelView.head_span``) — with the supervised
   contrastive loss (Khosla et al., NeurIPS 2020) on the L2-normalised penultimate features
   z = normalise(``ModelView.features``) (the authors' ``SupConResNet`` ends in ``F.normalize``), with
   the labels *after* poisoning, so a poisoned image's positives are the target-class images of the
   batch (the facilitators, and the other poisoned images) and its true-class images (the
   obstructors) are negatives. With P(i) = {j ≠ i : y_j = y_i}, A(i) = {j ≠ i}, τ = ``temperature``::

       L = −(τ/τ_b) · (1/B) Σ_i  w_i/|P(i)| · Σ_{p∈P(i)} log( exp(z_i·z_p/τ) / Σ_{a∈A(i)} exp(z_i·z_a/τ) )

   where w_i = ``fac_scale_weight`` when y_i is the target label (the released code's
   ``contrastive_loss_scale_weight`` on the anchors of its ``fac_label``) and 1 otherwise; an anchor
   with no positive adds 0 but still counts in B; τ_b = ``base_temperature`` (:func:`supcon_loss`).
2. **Classifier stage** (``head_epochs`` epochs at ``head_lr``): with the encoder frozen
   (``freeze_encoder``, the released ``is_frozen_params = 1``), train only the output layer with the
   workload's loss (cross-entropy) on the same kind of poisoned batches.

Both stages use SGD with ``momentum`` and ``weight_decay`` on the trainable coordinates and a
step schedule: the learning rate of (1-based) epoch e is lr·γ^{#{m ∈ milestones : m ≤ e}} (the
released code steps its ``MultiStepLR`` at the *start* of every epoch). After every step the model
is projected onto the L2 ball of radius ``norm_bound`` around G (the released ``diff_privacy`` /
``s_norm``; ``"none"``: no projection), the trained update is scaled by ``boost`` (the released
``scale_weights``: G + (X − G)·γ) and clipped to ``norm_bound`` again. An epoch is
``batches_per_epoch`` batches of ``batch_size`` samples drawn from the attacker's own clean data
(the released attacker trains on a fixed ``size_of_secret_dataset = 25`` batches of 64 images per
epoch), or one shuffled pass over it with ``batches_per_epoch = "none"`` (BackFed's). Each batch
stamps its first ⌈``poison_fraction``·b⌉ samples, whatever their label (the released code
overwrites positions 0 … 6 of every batch of 64: 7/64).

Defaults: the released CIFAR-10 pixel-pattern run (``commands.sh``: the YAML read, then the
command-line defaults of ``training.py``, which override the YAML): ``target = 2``
(``poison_label_swap``), ``trigger`` = its ``pattern_type 1`` (pixels (H−4, W−2), (H−3, W−3),
(H−2, W−4), (H−2, W−2)) at ``value`` 1 (255 before scaling), ``poison_fraction = 7/64``,
``noise = 0.01``, ``temperature = base_temperature = 0.07``, ``fac_scale_weight = 6``,
``contrastive_lr = 0.005``, ``contrastive_epochs = 10``, ``contrastive_milestones = (3, 5, 7, 9)``,
``contrastive_gamma = 0.1``, ``head_lr = 0.01`` (the command-line default of ``poison_lr``; the YAML's
0.001 is overridden), ``head_epochs = 3``, ``head_milestones = (3, 5)``, ``head_gamma = 0.005``,
``momentum = 0.9``, ``weight_decay = 5e-4``, ``batch_size = 64``, ``batches_per_epoch = 25``,
``norm_bound = 5``, ``boost = 1`` (no scaling). Their EMNIST file differs only in ``contrastive_lr
= 0.05``, ``contrastive_gamma = 0.005`` and ``fac_scale_weight = 3`` (``commands.sh``).

Where we differ from the release: it stops the classifier stage early once the poisoned test
loss is ≤ 1e-4 (we always run ``head_epochs``); its loss has a ``down_scale_weight`` hard-wired to
label 1 that its runs leave at 1 (a no-op, left out); its attacker samples its batches from the whole
training set (``size_of_secret_dataset``), ours from its own clean data (``ctx.own_data``).

BackFed (github.com/thinh-dao/BackFed, commit ab3bcbd1, ``backfed/clients/chameleon_malicious_client.py``
and ``config/atk_config/cifar10_multishot.yaml``) runs Chameleon as a *model-poisoning* wrapper around
a data poison (``chameleon(pattern)``: its ``Pattern`` trigger, a white square — 5×5 on CIFAR-10,
4×4 on MNIST — one pixel in from the bottom-right corner). Its contrastive stage: SGD lr 0.015,
momentum 0.9, weight decay 5e-4, 10 epochs over the attacker's own data, ``MultiStepLR`` milestones
(2, 4, 6, 8) γ 0.3 stepped at the *end* of each epoch (= our ``contrastive_milestones = (3, 5, 7, 9)``),
``fac_scale_weight = 2``, no noise, no projection. Its second stage is its ordinary malicious client:
SGD lr 0.05, 6 epochs, ``StepLR`` step 2 γ 0.1 (= our ``head_milestones = (3, 5)``, ``head_gamma =
0.1``), poison rate 0.3125 (20/64, the first items of each batch), target 2 — and it trains the
*whole* model: its freeze loop sets ``require_grad`` (sic), which does not freeze anything. Our
``freeze_encoder = false`` reproduces that; the default ``true`` is the paper's.

Measured on ``digits`` (MLP, 20 clients, 3 attackers, window rounds 20-29, 20 clean rounds after,
3 seeds): the CIFAR-10 defaults are weak there (ASR 0.30 at the end of the window); with the EMNIST
learning rates and the authors' Baseline's second stage (``head_lr = 0.1``, 5 epochs, γ 0.01) the ASR
at the end is 0.76-0.80 and 10 rounds later 0.54-0.57, while that Baseline alone (no contrastive
stage, whole model) goes 0.70 → 0.50: lifespans are longer, by about what the higher start gives; we
saw no slower decay (kept share 0.68-0.75 vs 0.72).

Cost: (``contrastive_epochs`` + ``head_epochs``) × ``batches_per_epoch`` (or ⌈n/``batch_size``⌉)
gradient steps per attacker per round, each on one batch; the defaults make 325 steps. ``craft_updates``
ignores ``ctx.own_updates`` except for its shape, dtype and device: the attackers' honest local
training is replaced by this procedure. Combine with ``model_replacement`` (which boosts the
own update this attack returns) as BackFed's ``scale_weights`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.errors import RedteamError
from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import check_image_shape
from .backdoor import Backdoor

if TYPE_CHECKING:
    import torch

__all__ = ["Chameleon", "supcon_loss", "AUTHORS_PATTERN"]

#: the released code's ``pattern_type 1`` trigger: (H−4, W−2), (H−3, W−3), (H−2, W−4), (H−2, W−2)
AUTHORS_PATTERN: tuple[tuple[int, int], ...] = ((-4, -2), (-3, -3), (-2, -4), (-2, -2))


def supcon_loss(z: "torch.Tensor", labels: "torch.Tensor", target: int, *, temperature: float = 0.07,
                base_temperature: float = 0.07, fac_scale_weight: float = 6.0) -> "torch.Tensor":
    """Chameleon's supervised contrastive loss (module docstring, stage 1) of features ``z``
    ``(B, k)`` (already L2-normalised, as the authors' encoder returns them) with ``labels`` ``(B,)``
    (after poisoning): anchors labelled ``target`` weigh ``fac_scale_weight``; every anchor counts
    in the mean, one without positives adds 0. ``B`` ≥ 2."""
    import torch

    b = int(z.shape[0])
    sim = (z @ z.T) / temperature
    sim = sim - sim.max(dim=1, keepdim=True).values.detach()  # the release's stabiliser (value unchanged)
    others = ~torch.eye(b, dtype=torch.bool, device=z.device)
    pos = (labels[:, None] == labels[None, :]) & others
    denom = torch.logsumexp(sim.masked_fill(~others, float("-inf")), dim=1, keepdim=True)
    log_prob = sim - denom
    npos = pos.sum(1)
    sums = torch.where(pos, log_prob, torch.zeros_like(log_prob)).sum(1)
    weight = torch.where(labels == target, torch.full_like(sums, float(fac_scale_weight)), torch.ones_like(sums))
    mean_pos = weight * sums / npos.clamp_min(1).to(sums.dtype)
    return -(temperature / base_temperature) * mean_pos.mean()


def _finite_pos(obj: Any, name: str, v: Any, *, zero: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v >= 0 if zero else v > 0)
    if not ok:
        raise param_error(obj, name, v, "must be a finite number " + ("≥ 0" if zero else "> 0"))


def _count(obj: Any, name: str, v: Any, low: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise param_error(obj, name, v, f"must be an integer ≥ {low}")


def _milestones(obj: Any, name: str, v: Any) -> None:
    if not isinstance(v, (tuple, list)) or not all(isinstance(m, int) and not isinstance(m, bool) and m >= 1
                                                    for m in v):
        raise param_error(obj, name, v, "must be a list of epochs (integers ≥ 1)")


def _epoch_lr(lr: float, milestones: Any, gamma: float, epoch: int) -> float:
    """lr·γ^{#{m ≤ epoch}} (``epoch`` 1-based; the release steps its scheduler before each epoch)."""
    return float(lr) * float(gamma) ** sum(1 for m in milestones if m <= epoch)


@dataclass(frozen=True, slots=True)
class Chameleon(Attack):
    """Dai & Li's Chameleon (ICML 2023): a contrastive encoder stage, then a classifier stage on
    poisoned batches (module docstring; defaults: the authors' CIFAR-10 pixel-pattern run).

    * trigger: ``trigger`` (pixel positions ``[[r, c], …]``; unset: the authors' 4-pixel pattern),
      ``value``, ``image_shape`` (filled in from the workload; unset in a bare call: the model's
      input shape), ``target``;
    * poisoning of each batch: ``poison_fraction`` (its first ⌈f·b⌉ samples), ``noise`` (std);
    * contrastive stage: ``temperature``, ``base_temperature``, ``fac_scale_weight``,
      ``contrastive_lr``, ``contrastive_epochs`` (0: skip), ``contrastive_milestones``,
      ``contrastive_gamma``;
    * classifier stage: ``head_lr``, ``head_epochs`` (0: skip), ``head_milestones``, ``head_gamma``,
      ``freeze_encoder`` (false: BackFed's whole-model second stage);
    * both: ``momentum``, ``weight_decay``, ``batch_size``, ``batches_per_epoch`` (``"none"``: one pass
      over the attacker's data), ``norm_bound`` (L2 radius around G after every step; ``"none"``: none),
      ``boost`` (scale of the final update).
    """

    trigger: tuple[tuple[int, int], ...] | None = None
    value: float = 1.0
    image_shape: tuple[int, ...] | None = None
    target: int = 2
    poison_fraction: float = 7 / 64
    noise: float = 0.01
    temperature: float = 0.07
    base_temperature: float = 0.07
    fac_scale_weight: float = 6.0
    contrastive_lr: float = 0.005
    contrastive_epochs: int = 10
    contrastive_milestones: tuple[int, ...] = (3, 5, 7, 9)
    contrastive_gamma: float = 0.1
    head_lr: float = 0.01
    head_epochs: int = 3
    head_milestones: tuple[int, ...] = (3, 5)
    head_gamma: float = 0.005
    freeze_encoder: bool = True
    momentum: float = 0.9
    weight_decay: float = 5e-4
    batch_size: int = 64
    batches_per_epoch: int | Literal["none"] | None = 25
    norm_bound: float | Literal["none"] | None = 5.0
    boost: float = 1.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    needs_model: ClassVar[bool] = True
    summary: ClassVar[str] = ("Chameleon: contrastive encoder training that pulls poisoned images to target-class "
                              "peers, then a classifier stage; a durable pixel backdoor")
    reference: ClassVar[str] = "Dai & Li, ICML 2023"

    # -- validation -------------------------------------------------------------------
    def validate_trigger(self, v: Any) -> None:
        if v is None:
            return
        if (not isinstance(v, (tuple, list)) or not v
                or not all(isinstance(p, (tuple, list)) and len(p) == 2
                           and all(isinstance(c, int) and not isinstance(c, bool) for c in p) for p in v)):
            raise param_error(self, "trigger", v, "must be a non-empty list of [row, col] integer pixel positions")

    def validate_value(self, v: Any) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
            raise param_error(self, "value", v, "must be a finite number")

    def validate_image_shape(self, v: Any) -> None:
        check_image_shape(self, v)
        if v is not None:
            self._check_fits(tuple(v))

    def validate_target(self, v: Any) -> None:
        _count(self, "target", v, 0)

    def validate_poison_fraction(self, v: Any) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "poison_fraction", v, "must be in (0, 1]")

    def validate_noise(self, v: Any) -> None:
        _finite_pos(self, "noise", v, zero=True)

    def validate_temperature(self, v: Any) -> None:
        _finite_pos(self, "temperature", v)

    def validate_base_temperature(self, v: Any) -> None:
        _finite_pos(self, "base_temperature", v)

    def validate_fac_scale_weight(self, v: Any) -> None:
        _finite_pos(self, "fac_scale_weight", v, zero=True)

    def validate_contrastive_lr(self, v: Any) -> None:
        _finite_pos(self, "contrastive_lr", v)

    def validate_contrastive_epochs(self, v: Any) -> None:
        _count(self, "contrastive_epochs", v, 0)

    def validate_contrastive_milestones(self, v: Any) -> None:
        _milestones(self, "contrastive_milestones", v)

    def validate_contrastive_gamma(self, v: Any) -> None:
        _finite_pos(self, "contrastive_gamma", v)

    def validate_head_lr(self, v: Any) -> None:
        _finite_pos(self, "head_lr", v)

    def validate_head_epochs(self, v: Any) -> None:
        _count(self, "head_epochs", v, 0)

    def validate_head_milestones(self, v: Any) -> None:
        _milestones(self, "head_milestones", v)

    def validate_head_gamma(self, v: Any) -> None:
        _finite_pos(self, "head_gamma", v)

    def validate_freeze_encoder(self, v: Any) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "freeze_encoder", v, "must be true or false")

    def validate_momentum(self, v: Any) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1):
            raise param_error(self, "momentum", v, "must be in [0, 1)")

    def validate_weight_decay(self, v: Any) -> None:
        _finite_pos(self, "weight_decay", v, zero=True)

    def validate_batch_size(self, v: Any) -> None:
        _count(self, "batch_size", v, 2)

    def validate_batches_per_epoch(self, v: Any) -> None:
        if v is not None and v != "none":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise param_error(self, "batches_per_epoch", v,
                                  "must be an integer ≥ 1, or 'none' (one pass over the attacker's data)")

    def validate_norm_bound(self, v: Any) -> None:
        if v is not None and v != "none":
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                raise param_error(self, "norm_bound", v, "must be a finite number > 0, or 'none' (no projection)")

    @property
    def radius(self) -> float | None:
        """``norm_bound`` as a number, ``None`` for no projection."""
        return None if self.norm_bound in (None, "none") else float(self.norm_bound)  # type: ignore[arg-type]

    def validate_boost(self, v: Any) -> None:
        _finite_pos(self, "boost", v)

    # -- the trigger ------------------------------------------------------------------
    def pattern(self) -> tuple[tuple[int, int], ...]:
        return AUTHORS_PATTERN if self.trigger is None else tuple((int(r), int(c)) for r, c in self.trigger)

    def _check_fits(self, shape: tuple[int, ...]) -> None:
        h, w = shape[-2], shape[-1]
        for r, c in self.pattern():
            if not (-h <= r < h and -w <= c < w):
                raise param_error(self, "trigger", self.trigger if self.trigger is not None else list(AUTHORS_PATTERN),
                                  f"pixel ({r}, {c}) is outside an image of {h}×{w}")

    def stamper(self, input_shape: tuple[int, ...] = ()) -> Backdoor:
        """The pixel trigger as a :class:`~attacks.backdoor.Backdoor` (``image_shape``, else the
        model's ``input_shape`` when that is an image)."""
        shape = tuple(self.image_shape) if self.image_shape is not None else tuple(input_shape)
        if len(shape) not in (2, 3):
            raise param_error(self, "image_shape", self.image_shape,
                              f"unset, and the inputs' shape {shape} is not an image: give (H, W) or (C, H, W)")
        self._check_fits(shape)
        return Backdoor(trigger=self.pattern(), value=float(self.value), image_shape=shape, target=int(self.target),
                        fraction=1.0)

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """Held-out samples not of class ``target``, stamped (no noise), labelled ``target``."""
        return self.stamper(tuple(x.shape[1:])).targeted_test(x, y)

    # -- the procedure ----------------------------------------------------------------
    def poison(self, stamp: Backdoor, x: "torch.Tensor", y: "torch.Tensor",
               generator: "torch.Generator") -> tuple["torch.Tensor", "torch.Tensor"]:
        """A batch with its first ⌈``poison_fraction``·b⌉ samples stamped (plus noise) and relabelled."""
        import torch

        b = int(y.shape[0])
        k = min(b, math.ceil(self.poison_fraction * b - 1e-9))
        px, py = stamp.apply(x[:k], y[:k])
        if self.noise > 0:
            px = px + (self.noise * torch.randn(tuple(px.shape), generator=generator, dtype=torch.float64)
                       ).to(dtype=px.dtype, device=px.device)
        return torch.cat([px, x[k:]]), torch.cat([py, y[k:]])

    def _batches(self, n: int, generator: "torch.Generator") -> list["torch.Tensor"]:
        import torch

        if self.batches_per_epoch in (None, "none"):
            return list(torch.randperm(n, generator=generator).split(self.batch_size))
        b = min(self.batch_size, n)
        return [torch.randperm(n, generator=generator)[:b] for _ in range(int(self.batches_per_epoch))]

    def train_one(self, ctx: AttackContext, x: "torch.Tensor", y: "torch.Tensor",
                  start: "torch.Tensor | None" = None, *, stages: tuple[str, ...] = ("contrastive", "head")
                  ) -> "torch.Tensor":
        """The trained model of one malicious client from ``start`` (default ``ctx.global_params``)
        on its clean data ``(x, y)``: the stages listed, then ``boost`` and the final clip (flat row,
        in the global model's dtype)."""
        import torch
        from torch.func import grad

        model = ctx.model
        if model is None:
            raise RedteamError("chameleon needs the model view (ctx.model): the engine gives it to attacks that "
                               "declare needs_model")
        g0 = ctx.global_params.detach()
        dt, dev = g0.dtype, g0.device
        w = (g0 if start is None else start.detach().to(dtype=dt, device=dev)).clone()
        stamp = self.stamper(tuple(model.input_shape))
        if model.num_classes and self.target >= model.num_classes:
            raise param_error(self, "target", self.target, f"must be a class of the model (< {model.num_classes})")
        x = x.to(device=dev, dtype=dt) if x.dtype.is_floating_point else x.to(dev)
        y = y.to(dev)
        n = int(y.shape[0])
        d = int(g0.shape[0])
        head = torch.zeros(d, dtype=torch.bool, device=dev)
        if model.head:
            hs = model.head_span()
            head[hs.start:min(hs.stop, d)] = True
        encoder = ~head
        mu, wd = float(self.momentum), float(self.weight_decay)

        radius = self.radius

        def project(v: "torch.Tensor") -> "torch.Tensor":
            if radius is None:
                return v
            diff = v - g0
            norm = float(torch.linalg.vector_norm(diff, dtype=torch.float64))
            return g0 + diff * (radius / norm) if norm > radius else v

        def run(loss_of: Any, trainable: "torch.Tensor", lr: float, epochs: int, milestones: Any,
                gamma: float, w: "torch.Tensor") -> "torch.Tensor":
            if epochs == 0 or n < 2 or not bool(trainable.any()):
                return w
            mask = trainable.to(dt)
            step_grad = grad(loss_of)
            buf = torch.zeros_like(w)
            for epoch in range(1, epochs + 1):
                lr_e = _epoch_lr(lr, milestones, gamma, epoch)
                for idx in self._batches(n, ctx.generator):
                    if idx.numel() < 2:  # a lone sample has no pair to contrast (BackFed skips it too)
                        continue
                    idx = idx.to(dev)
                    xb, yb = self.poison(stamp, x[idx], y[idx], ctx.generator)
                    gw = (step_grad(w, xb, yb) + wd * w) * mask
                    buf = mu * buf + gw
                    w = project(w - lr_e * buf)
            return w

        def contrastive(flat: "torch.Tensor", xb: "torch.Tensor", yb: "torch.Tensor") -> "torch.Tensor":
            z = torch.nn.functional.normalize(model.features(flat, xb), dim=1)
            return supcon_loss(z, yb, self.target, temperature=self.temperature,
                               base_temperature=self.base_temperature, fac_scale_weight=self.fac_scale_weight)

        def classify(flat: "torch.Tensor", xb: "torch.Tensor", yb: "torch.Tensor") -> "torch.Tensor":
            return model.loss(model.forward(flat, xb), yb)

        if "contrastive" in stages:
            w = run(contrastive, encoder, self.contrastive_lr, self.contrastive_epochs, self.contrastive_milestones,
                    self.contrastive_gamma, w)
        if "head" in stages:
            trainable = head if self.freeze_encoder else torch.ones_like(head)
            w = run(classify, trainable, self.head_lr, self.head_epochs, self.head_milestones, self.head_gamma, w)
        if self.boost != 1.0:
            w = g0 + (w - g0) * self.boost
        return project(w)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f = int(own.shape[0])
        if f == 0:
            return own.clone()
        if len(ctx.own_data) != f:
            raise RedteamError(f"chameleon: the context holds {len(ctx.own_data)} clients' data (own_data) for {f} "
                               "malicious rows")
        rows = []
        for i in range(f):
            data = ctx.own_data[i]
            w = self.train_one(ctx, data.x, data.y)
            rows.append((w - ctx.global_params).to(dtype=own.dtype, device=own.device))
        return torch.stack(rows)
