"""A3FL: a backdoor trigger optimised, every round, against the global model and against copies
of it trained to forget the trigger.

Hangfan Zhang, Jinyuan Jia, Jinghui Chen, Lu Lin & Dinghao Wu, "A3FL: Adversarially Adaptive
Backdoor Attacks to Federated Learning", NeurIPS 2023 (pp. 61213-61233). Released code:
github.com/hfzhang31/A3FL at eb1bdc1 (``fl_utils/attacker.py``: ``Attacker.search_trigger``,
``get_adv_model``, ``poison_input``; ``fl_utils/fler.py``: when the search runs and how the attackers
train; defaults from ``main/configs/config.yaml``, the CIFAR-10 configuration). Second reference:
BackFed (Dao et al., arXiv 2507.04903), github.com/thinh-dao/BackFed at ab3bcbd,
``backfed/poisons/a3fl.py`` (and ``pattern.py``, ``base.py``, ``config/atk_config/*.yaml``).

**What the attacker does each round it takes part** (:meth:`A3FL.training_hook`). Before local
training, on the clean data of the first attacker of the round (``search_on = "first"``, as both
codes: the first sampled adversary searches and the others use its trigger), starting from the
trigger it held last round (the authors' ``self.trigger`` persists across rounds):

* ``outer_epochs`` passes over that data in shuffled batches of ``search_batch``; on each batch one
  signed-gradient step on the trigger t (inside the mask m only)::

      x' = x·(1 − m) + t·m                    (every item of the batch, label → target)
      L  = CE(f(x'; θ), target) + (λ / K) Σ_k w_k · CE(f(x'; θ'_k), target)
      t  ← clamp(t − α·sign(∇_t L), lo, hi)

  with θ the global model it was sent, α = ``trigger_lr``, λ = ``adv_lambda``, K = ``adv_models``;
* at the start of every outer epoch e with e mod ``adv_every`` = 0 and e ≠ 0, K adversarial copies
  θ'_k are rebuilt: each starts from θ and trains ``adv_epochs`` epochs on the attacker's data with
  the *current trigger stamped on every item and the true labels* (the defenders' best move: unlearn
  the trigger), SGD lr ``adv_lr``, momentum ``adv_momentum``, weight decay ``adv_weight_decay``;
  w_k is a similarity of that copy to the global model (``adv_weight``, below).

Then the malicious clients train as honest ones do (the federation's lr and steps unless ``lr`` /
``steps`` are set) on batches whose first ⌊``poison_fraction``·B⌋ items carry the trigger and the
label ``target`` (the authors' ``poison_input``: ``inputs[:bkd_num] = t·m + inputs[:bkd_num]·(1 − m)``,
``bkd_num = int(bkd_ratio·B)``, whatever the item's class). ``targeted_test`` stamps the trigger the
attacker holds now on every test image whose class is not ``target`` (``dynamic_trigger``: the
engine asks again before every evaluation).

**Defaults** (the authors' ``main/configs/config.yaml``, CIFAR-10): ``target = 2``, ``trigger_size =
5`` at ``trigger_position = (2, 2)`` (``mask[:, :, 2:2+size, 2:2+size] = 1``), ``trigger_init = 0.5``
(``torch.ones(...)·0.5``), ``poison_fraction = 0.25`` (``bkd_ratio``), ``trigger_lr = 0.01``,
``outer_epochs = 200`` (``trigger_outter_epochs``), ``adv_every = 1`` (``dm_adv_K``), ``adv_epochs = 5``
(``dm_adv_epochs``), ``adv_models = 1`` (``dm_adv_model_count``), ``adv_lambda = 0.01``
(``noise_loss_lambda``), ``search_batch = 64`` (``batch_size``), the copies' SGD 0.01 / 0.9 / 5e-4
(hard-coded in ``get_adv_model``).

**Conventions where the implementations differ** (parameters):

* ``adv_weight``, the w_k of each copy. ``"params"`` (default, the paper: its balancing coefficient
  is λ₀·sim(θ'_t, θ_t), the cosine similarity of the adversarial copy and the global model — read
  from a summary of the paper, the PDF could not be opened where this was written; BackFed computes
  it so): the mean, over the model's convolution kernels (both codes average over the parameters
  whose name contains ``conv``; a model without kernels: its weight matrices), of the cosine
  similarity of the copy's and the global model's parameters. ``"grads"`` (the authors' released
  code, ``get_adv_model``): the same mean of the cosine similarity of their *gradients* — the copy's
  of its last unlearning batch, and the global model's of the backdoor loss accumulated over the
  search steps so far (the authors read ``.grad`` of both; their global ``.grad`` also holds whatever
  it held before the search, which is not reproduced). ``"none"``: w = 1 (the bi-level objective alone).
* ``clamp``: the authors clamp t to [−2, 2], the range of their normalised CIFAR-10 inputs; BackFed
  clamps to [0, 1] before normalising, the pixel range. Both keep the trigger a valid image, so
  ``"data"`` (default) clamps to [min, max] of the attackers' own inputs (≈ [−1.99, 2.13] on
  standardised CIFAR-10, [0, 1] on raw digits); ``[lo, hi]`` is a fixed range, ``"none"`` none.
* ``search_fraction``: the authors stamp every item of a search batch (1.0, default); BackFed stamps
  only its ``poison_rate`` share (the others keep their clean label), as in training.
* ``stop_asr``: BackFed stops the search once, over an outer epoch, more than 70 % of the search
  items were classified as labelled (stamped: target) by the global model; the authors never stop
  early (``None``, default).
* BackFed defaults: 100 outer epochs, ``dm_adv_K = 100`` (so no copy is ever built in 100 epochs),
  the trigger at the bottom right with a 3-pixel margin (rows / columns 23-27 of 32),
  ``poison_rate = 0.3125``, target 2, attackers trained with SGD lr 0.05 for 6 epochs.

**Departures.** (1) The authors' search accumulates, into the trigger's gradient, the gradients of
the copies' unlearning losses (``t`` requires grad while ``get_adv_model`` backpropagates through
``t·m + (1 − m)·x``), so the first step after each rebuild also descends the *unlearning* loss; that
artefact is not reproduced (BackFed detaches the trigger there too). (2) Everything runs on one flat
parameter row through the engine's :class:`~redteam.types.ModelView` (functional forwards); the
copies' train / eval mode is the model's own (no batch-norm statistics are updated). (3) The cost is
bounded by the parameters: each round costs about ``outer_epochs``·⌈n/``search_batch``⌉ trigger steps
plus ``adv_epochs``·⌈n/``search_batch``⌉ copy steps per rebuild, n the searching attacker's samples.
The authors' 200 outer epochs with a rebuild every epoch are slow on a CPU (digits, 20 clients:
about 2.5 CPU-seconds per attacked round); :data:`CHEAP_SEARCH` (``outer_epochs = 10, adv_every = 2,
adv_epochs = 2``, about 20× cheaper) is the setting for CI and quick runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.types import Attack, AttackContext, ModelView, Surface, TrainingHook, param_error

from ._common import check_image_shape

if TYPE_CHECKING:
    import torch

__all__ = ["A3FL", "ADV_WEIGHTS", "CHEAP_SEARCH"]

#: how each adversarial copy's term is weighted (module docstring)
ADV_WEIGHTS = ("params", "grads", "none")

#: a search about 20× cheaper than the authors' (200 outer epochs, a copy rebuilt every epoch, 5
#: epochs each), for CI and quick CPU runs: ``A3FL(**CHEAP_SEARCH, ...)`` or the same keys in a scenario
CHEAP_SEARCH: dict[str, int] = {"outer_epochs": 10, "adv_every": 2, "adv_epochs": 2}


def _int_at_least(obj: Any, name: str, v: Any, lo: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise param_error(obj, name, v, f"must be an integer ≥ {lo}")


def _finite(obj: Any, name: str, v: Any, *, positive: bool = False, nonneg: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and positive:
        ok = v > 0
    if ok and nonneg:
        ok = v >= 0
    if not ok:
        raise param_error(obj, name, v, "must be a finite number" + (" > 0" if positive else " ≥ 0" if nonneg else ""))


@dataclass(frozen=True, slots=True)
class A3FL(Attack):
    """A3FL's adversarially adaptive trigger (module docstring), re-optimised each round and
    stamped on a share of every training batch of the malicious clients.

    * ``target``: the class the trigger should produce;
    * ``trigger_size``, ``trigger_position`` ``[row, col]`` (top-left corner of the square patch,
      every channel), ``image_shape`` (``(H, W)`` or ``(C, H, W)``; the engine fills in the
      workload's), ``trigger_init`` (the patch's first value), ``clamp`` (``"data"``, ``"none"`` or
      ``[lo, hi]``);
    * ``poison_fraction``: the share ⌊f·B⌋ of each training batch stamped and relabelled;
    * the search: ``trigger_lr`` α, ``outer_epochs``, ``search_batch``, ``search_fraction``,
      ``search_on`` (``"first"`` attacker's data or ``"all"`` the attackers' data), ``stop_asr``;
    * the adversarial copies: ``adv_every`` (rebuilt every that many outer epochs, not at 0),
      ``adv_epochs``, ``adv_models``, ``adv_lambda`` λ, ``adv_lr``, ``adv_momentum``,
      ``adv_weight_decay``, ``adv_weight`` (``"params"``, ``"grads"`` or ``"none"``);
    * ``lr``, ``steps``: the malicious clients' local lr and steps (unset: the federation's, as the
      authors' attackers train like the honest clients).
    """

    target: int = 2
    trigger_size: int = 5
    trigger_position: tuple[int, int] = (2, 2)
    image_shape: tuple[int, ...] = (3, 32, 32)
    trigger_init: float = 0.5
    clamp: Literal["data", "none"] | tuple[float, float] = "data"
    poison_fraction: float = 0.25
    trigger_lr: float = 0.01
    outer_epochs: int = 200
    search_batch: int = 64
    search_fraction: float = 1.0
    search_on: Literal["first", "all"] = "first"
    stop_asr: float | None = None
    adv_every: int = 1
    adv_epochs: int = 5
    adv_models: int = 1
    adv_lambda: float = 0.01
    adv_lr: float = 0.01
    adv_momentum: float = 0.9
    adv_weight_decay: float = 5e-4
    adv_weight: Literal["params", "grads", "none"] = "params"
    lr: float | None = None
    steps: int | None = None
    _memory: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRAINING,)
    needs_model: ClassVar[bool] = True
    dynamic_trigger: ClassVar[bool] = True
    summary: ClassVar[str] = "A3FL: a trigger optimised each round against the global model and copies trained to unlearn it"
    reference: ClassVar[str] = "Zhang et al., NeurIPS 2023 (A3FL); github.com/hfzhang31/A3FL"

    # -- validation -------------------------------------------------------------------
    def validate_target(self, v: Any) -> None:
        _int_at_least(self, "target", v, 0)

    def validate_trigger_size(self, v: Any) -> None:
        _int_at_least(self, "trigger_size", v, 1)

    def validate_trigger_position(self, v: Any) -> None:
        if (not isinstance(v, (tuple, list)) or len(v) != 2
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in v)):
            raise param_error(self, "trigger_position", v, "must be [row, col], two integers ≥ 0 (the patch's top-left)")

    def validate_image_shape(self, v: Any) -> None:
        check_image_shape(self, v, allow_none=False)
        h, w = v[-2], v[-1]
        r, c = self.trigger_position
        s = self.trigger_size
        if r + s > h or c + s > w:
            raise param_error(self, "trigger_position", list(self.trigger_position),
                              f"a {s}×{s} patch there does not fit an image of {h}×{w}")

    def validate_trigger_init(self, v: Any) -> None:
        _finite(self, "trigger_init", v)

    def validate_clamp(self, v: Any) -> None:
        if isinstance(v, str) and v in ("data", "none"):
            return
        if (not isinstance(v, (tuple, list)) or len(v) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in v)
                or not v[0] < v[1]):
            raise param_error(self, "clamp", v, "must be 'data', 'none' or [lo, hi] with finite lo < hi")

    def validate_poison_fraction(self, v: Any) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "poison_fraction", v, "must be in (0, 1]")

    def validate_search_fraction(self, v: Any) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "search_fraction", v, "must be in (0, 1]")

    def validate_trigger_lr(self, v: Any) -> None:
        _finite(self, "trigger_lr", v, positive=True)

    def validate_outer_epochs(self, v: Any) -> None:
        _int_at_least(self, "outer_epochs", v, 0)

    def validate_search_batch(self, v: Any) -> None:
        _int_at_least(self, "search_batch", v, 1)

    def validate_search_on(self, v: Any) -> None:
        if v not in ("first", "all"):
            raise param_error(self, "search_on", v, "must be 'first' (the first attacker's data) or 'all'")

    def validate_stop_asr(self, v: Any) -> None:
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1):
            raise param_error(self, "stop_asr", v, "must be in [0, 1) or unset (never stop early)")

    def validate_adv_every(self, v: Any) -> None:
        _int_at_least(self, "adv_every", v, 1)

    def validate_adv_epochs(self, v: Any) -> None:
        _int_at_least(self, "adv_epochs", v, 1)

    def validate_adv_models(self, v: Any) -> None:
        _int_at_least(self, "adv_models", v, 0)

    def validate_adv_lambda(self, v: Any) -> None:
        _finite(self, "adv_lambda", v, nonneg=True)

    def validate_adv_lr(self, v: Any) -> None:
        _finite(self, "adv_lr", v, positive=True)

    def validate_adv_momentum(self, v: Any) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1):
            raise param_error(self, "adv_momentum", v, "must be in [0, 1)")

    def validate_adv_weight_decay(self, v: Any) -> None:
        _finite(self, "adv_weight_decay", v, nonneg=True)

    def validate_adv_weight(self, v: Any) -> None:
        if v not in ADV_WEIGHTS:
            raise param_error(self, "adv_weight", v, f"must be one of {', '.join(repr(a) for a in ADV_WEIGHTS)}")

    def validate_lr(self, v: Any) -> None:
        if v is not None:
            _finite(self, "lr", v, positive=True)

    def validate_steps(self, v: Any) -> None:
        if v is not None:
            _int_at_least(self, "steps", v, 1)

    # -- the trigger ------------------------------------------------------------------
    @property
    def pixels(self) -> int:
        """Values per image (C·H·W)."""
        return math.prod(int(s) for s in self.image_shape)

    def mask(self, device: "torch.device | str" = "cpu", dtype: "torch.dtype | None" = None) -> "torch.Tensor":
        """The flat ``(C·H·W,)`` mask: 1 on the square patch (every channel), 0 elsewhere."""
        import torch

        shape = tuple(int(s) for s in self.image_shape)
        img = torch.zeros(shape if len(shape) == 3 else (1, *shape), dtype=dtype or torch.float32, device=device)
        r, c = (int(p) for p in self.trigger_position)
        s = int(self.trigger_size)
        img[:, r:r + s, c:c + s] = 1
        return img.reshape(-1)

    def initial_trigger(self, device: "torch.device | str" = "cpu",
                        dtype: "torch.dtype | None" = None) -> "torch.Tensor":
        """The first trigger, ``trigger_init`` everywhere (only the masked part is ever used)."""
        import torch

        return torch.full((self.pixels,), float(self.trigger_init), dtype=dtype or torch.float32, device=device)

    @property
    def trigger(self) -> "torch.Tensor":
        """The flat trigger the attacker holds now (its first one before any search)."""
        t = self._memory.get("trigger")
        return self.initial_trigger() if t is None else t

    def _flat(self, x: "torch.Tensor", lead: int) -> "torch.Tensor":
        per = math.prod(int(s) for s in x.shape[lead:])
        if not x.dtype.is_floating_point:
            raise param_error(self, "image_shape", list(self.image_shape), f"A3FL stamps float images, got {x.dtype}")
        if per != self.pixels:
            raise param_error(self, "image_shape", list(self.image_shape),
                              f"inputs have {per} values per sample, expected {self.pixels}")
        return x.reshape(*x.shape[:lead], per)

    def stamp(self, x: "torch.Tensor", trigger: "torch.Tensor | None" = None) -> "torch.Tensor":
        """``x·(1 − m) + t·m`` on every sample of ``x`` (``(N, *input)``, flat or ``(C, H, W)``),
        differentiable in ``trigger``; the result has ``x``'s shape."""
        t = self.trigger if trigger is None else trigger
        flat = self._flat(x, 1)
        m = self.mask(x.device, flat.dtype)
        return (flat * (1 - m) + t.to(device=x.device, dtype=flat.dtype) * m).reshape(x.shape)

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """The test images whose class is not ``target``, with the trigger held now, labelled ``target``."""
        import torch

        keep = y != self.target
        xs = x[keep]
        return self.stamp(xs), torch.full_like(y[keep], self.target)

    def poison_batch(self, x: "torch.Tensor", y: "torch.Tensor",
                     trigger: "torch.Tensor | None" = None) -> tuple["torch.Tensor", "torch.Tensor"]:
        """The malicious rows' batches (``x``: ``(f, B, *input)``, ``y``: ``(f, B)``) with the first
        ⌊``poison_fraction``·B⌋ items of each stamped and labelled ``target`` (the authors' ``poison_input``)."""
        t = self.trigger if trigger is None else trigger
        b = int(x.shape[1])
        k = int(self.poison_fraction * b)
        if k == 0:
            return x, y
        flat = self._flat(x, 2).clone()
        m = self.mask(x.device, flat.dtype)
        flat[:, :k] = flat[:, :k] * (1 - m) + t.to(device=x.device, dtype=flat.dtype) * m
        ys = y.clone()
        ys[:, :k] = self.target
        return flat.reshape(x.shape), ys

    # -- the search -------------------------------------------------------------------
    def _similarity_segments(self, view: ModelView, device: "torch.device") -> tuple["torch.Tensor", int]:
        """For each coordinate of the flat row, the index of the layer it belongs to among those the
        similarity averages over (convolution kernels, else weight matrices, else every layer), −1 if none."""
        import torch

        layers = list(view.layers)
        chosen = [ly for ly in layers if len(ly[3]) >= 3] or [ly for ly in layers if len(ly[3]) >= 2] or layers
        chosen.sort(key=lambda ly: ly[1])
        starts = torch.tensor([a for _, a, _, _ in chosen], dtype=torch.long, device=device)
        stops = torch.tensor([b for _, _, b, _ in chosen], dtype=torch.long, device=device)
        pos = torch.arange(view.dim, device=device)
        seg = torch.bucketize(pos, starts, right=True) - 1  # the last chosen layer starting at or before
        inside = (seg >= 0) & (pos < stops[seg.clamp_min(0)])
        return torch.where(inside, seg, torch.full_like(seg, -1)), len(chosen)

    def layer_cosine(self, u: "torch.Tensor", v: "torch.Tensor", view: ModelView) -> float:
        """The mean over the similarity's layers (:meth:`_similarity_segments`) of cos(u_layer, v_layer)
        (torch's ``CosineSimilarity(eps=1e-8)``: u·v / max(‖u‖·‖v‖, 1e-8))."""
        import torch

        seg, n = self._similarity_segments(view, u.device)
        keep = seg >= 0
        s = seg[keep]
        uu, vv = u[keep].to(torch.float64), v[keep].to(torch.float64)
        z = torch.zeros(n, dtype=torch.float64, device=u.device)
        dot = z.index_add(0, s, uu * vv)
        nu = z.index_add(0, s, uu * uu).sqrt()
        nv = z.index_add(0, s, vv * vv).sqrt()
        return float((dot / (nu * nv).clamp_min(1e-8)).mean())

    def trigger_step(self, view: ModelView, global_params: "torch.Tensor", trigger: "torch.Tensor",
                     x: "torch.Tensor", y: "torch.Tensor", adversarial: list[tuple["torch.Tensor", float]] = (),
                     bounds: tuple[float, float] | None = None, grad_sum: "torch.Tensor | None" = None
                     ) -> tuple["torch.Tensor", int]:
        """One signed-gradient step of the trigger on one batch (module docstring): returns the new
        flat trigger and how many of the batch's items the global model labelled as they are
        labelled (the stop rule's count). ``adversarial``: the copies ``(θ'_k, w_k)``; ``bounds``:
        the clamp; ``grad_sum`` (a ``(d,)`` tensor): the global model's gradient of the loss is added
        to it (``adv_weight = "grads"``)."""
        import torch

        t = trigger.detach().clone().requires_grad_(True)
        b = int(x.shape[0])
        k = int(self.search_fraction * b)
        flat = self._flat(x, 1)
        m = self.mask(x.device, flat.dtype)
        stamped = flat[:k] * (1 - m) + t.to(flat.dtype) * m
        xs = torch.cat([stamped, flat[k:]]).reshape(x.shape)
        ys = y.clone()
        ys[:k] = self.target
        g = global_params.detach()
        if grad_sum is not None:
            g = g.clone().requires_grad_(True)
        out = view.forward(g, xs)
        loss = view.loss(out, ys)
        if adversarial:
            extra = sum(float(w) * view.loss(view.forward(a.detach(), xs), ys) for a, w in adversarial)
            loss = loss + self.adv_lambda / len(adversarial) * extra
        wrt = [t, g] if grad_sum is not None else [t]
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        gt = grads[0] if grads[0] is not None else torch.zeros_like(t)
        if grad_sum is not None and grads[1] is not None:
            grad_sum.add_(grads[1].detach().to(grad_sum.dtype))
        new = t.detach() - self.trigger_lr * gt.sign()
        if bounds is not None:
            new = new.clamp(bounds[0], bounds[1])
        hits = int((out.detach().argmax(-1) == ys).sum())
        return new, hits

    def adversarial_copy(self, view: ModelView, global_params: "torch.Tensor", trigger: "torch.Tensor",
                         x: "torch.Tensor", y: "torch.Tensor", generator: "torch.Generator",
                         grad_sum: "torch.Tensor | None" = None) -> tuple["torch.Tensor", float]:
        """A copy θ' of the global model trained ``adv_epochs`` epochs (shuffled batches of
        ``search_batch``, SGD with momentum and weight decay as torch's) on ``x`` with the trigger
        stamped on every item and the true labels ``y``; returns θ' and its weight w (``adv_weight``)."""
        import torch

        xs = self.stamp(x, trigger.detach())
        a = global_params.detach().clone()
        buf = None
        last = torch.zeros_like(a)
        n = int(x.shape[0])
        for _ in range(self.adv_epochs):
            order = torch.randperm(n, generator=generator, device=generator.device).to(x.device)
            for s in range(0, n, self.search_batch):
                idx = order[s:s + self.search_batch]
                p = a.detach().requires_grad_(True)
                (gr,) = torch.autograd.grad(view.loss(view.forward(p, xs[idx]), y[idx]), (p,))
                d = gr + self.adv_weight_decay * a
                buf = d.clone() if buf is None else self.adv_momentum * buf + d
                a = a - self.adv_lr * buf
                last = gr.detach()
        a = a.detach()
        if self.adv_weight == "params":
            w = self.layer_cosine(a, global_params.detach(), view)
        elif self.adv_weight == "grads":
            ref = grad_sum if grad_sum is not None else torch.zeros_like(a)
            w = self.layer_cosine(last, ref, view)
        else:
            w = 1.0
        return a, w

    def search(self, view: ModelView, global_params: "torch.Tensor", x: "torch.Tensor", y: "torch.Tensor",
               generator: "torch.Generator", start: "torch.Tensor | None" = None,
               bounds: tuple[float, float] | None = None) -> tuple["torch.Tensor", dict[str, Any]]:
        """The round's trigger search from ``start`` (module docstring) on data ``(x, y)``; returns
        the new flat trigger and what it did (epochs run, copies built, last weights, stop rate)."""
        import torch

        t = (self.initial_trigger(x.device, x.dtype) if start is None else start).detach().to(x.device, x.dtype)
        n = int(x.shape[0])
        adversarial: list[tuple[torch.Tensor, float]] = []
        grad_sum = torch.zeros_like(global_params, dtype=torch.float32) \
            if (self.adv_weight == "grads" and self.adv_models > 0) else None
        rate: float | None = None
        epochs = built = 0
        for epoch in range(self.outer_epochs):
            if self.stop_asr is not None and rate is not None and rate > self.stop_asr:
                break
            if self.adv_models > 0 and epoch % self.adv_every == 0 and epoch != 0:
                adversarial = [self.adversarial_copy(view, global_params, t, x, y, generator, grad_sum)
                               for _ in range(self.adv_models)]
                built += len(adversarial)
            order = torch.randperm(n, generator=generator, device=generator.device).to(x.device)
            hits = 0
            for s in range(0, n, self.search_batch):
                idx = order[s:s + self.search_batch]
                t, h = self.trigger_step(view, global_params, t, x[idx], y[idx], adversarial, bounds, grad_sum)
                hits += h
            rate = hits / max(n, 1)
            epochs += 1
        return t, {"epochs": epochs, "copies": built, "weights": [w for _, w in adversarial], "rate": rate}

    def _bounds(self, own: tuple[Any, ...]) -> tuple[float, float] | None:
        if self.clamp == "none":
            return None
        if self.clamp != "data":
            lo, hi = self.clamp  # type: ignore[misc]
            return float(lo), float(hi)
        if "bounds" not in self._memory:
            xs = [d.x for d in own if int(d.x.shape[0])]
            if not xs:
                return None
            self._memory["bounds"] = (min(float(v.min()) for v in xs), max(float(v.max()) for v in xs))
        return self._memory["bounds"]

    def training_hook(self, ctx: AttackContext) -> TrainingHook | None:
        import torch

        from redteam.errors import InvalidParameter

        if ctx.model is None:
            raise InvalidParameter("attack a3fl searches its trigger against the model it is sent, but its context "
                                   "carries no model view (AttackContext.model): run it where the regime gives "
                                   "one (it declares needs_model)")
        own = tuple(ctx.own_data)
        data = own[:1] if self.search_on == "first" else own
        x = torch.cat([d.x for d in data]) if data else None
        y = torch.cat([d.y for d in data]).to(torch.long) if data else None
        t = self._memory.get("trigger")
        if x is not None and int(x.shape[0]) and self.outer_epochs > 0:
            if not x.dtype.is_floating_point:
                raise param_error(self, "image_shape", list(self.image_shape),
                                  f"A3FL stamps float images, got {x.dtype} inputs")
            self._flat(x, 1)
            t, info = self.search(ctx.model, ctx.global_params, x, y, ctx.generator, start=t,
                                  bounds=self._bounds(own))
            self._memory["trigger"] = t.detach()
            self._memory["last_search"] = {"round": ctx.round, **info}
        trigger = self.trigger.clone()

        def poison(xb: "torch.Tensor", yb: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
            return self.poison_batch(xb, yb, trigger)

        return TrainingHook(poison_batch=poison, lr=self.lr, steps=self.steps)
