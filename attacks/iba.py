"""IBA: a learned, bounded trigger generator and a projected local poisoning.

Nguyen, Nguyen, Le, Nguyen, Tran & Doan, "IBA: Towards Irreversible Backdoor Attacks in
Federated Learning", NeurIPS 2023. Authors' code: github.com/sail-research/iba (read at commit
69a5139, files ``fl_trainer.py``, ``iba_helpers.py``, ``attack_models/{unet,autoencoders}.py``,
``exps/iba_{cifar10,mnist}_fedavg*.sh``). Second implementation: BackFed (Dao et al.,
github.com/thinh-dao/BackFed, read at commit ab3bcbd: ``backfed/poisons/iba.py``,
``backfed/poisons/base.py``, ``backfed/clients/base_malicious_client.py``,
``config/atk_config/cifar10_multishot.yaml``).

The attack, as both implementations run it (the LIRA formulation of Doan et al., ICCV 2021,
carried to federated learning):

* **Trigger generator.** A small image-to-image network G_ξ (the authors: a U-Net on CIFAR-10,
  a convolutional autoencoder on MNIST, both ending in ``tanh``) turns an image into its
  triggered copy T_ξ(x) = clip(x + ε·G_ξ(x)), so ‖T_ξ(x) − x‖∞ ≤ ε. Each round the
  attackers take part, G is trained on their own clean data to make the model they were sent
  answer ``target``: ξ ← ξ − η_ξ ∇_ξ CE(f_θ(T_ξ(x)), target), over every sample (the authors'
  ``_train_attack_model`` with ``attack_portion = 1``).
* **Poisoning.** The malicious clients then train their local model on batches whose first
  ⌊p·B⌋ items are replaced by their triggered copies labelled ``target`` (on-the-fly poisoning,
  :attr:`~redteam.types.TrainingHook.poison_batch`), the classifier's step of the bilevel
  objective α·CE(f(x), y) + (1 − α)·CE(f(T(x)), target).
* **PGD.** After every local step (every ``project_frequency``-th) the local model w is
  projected onto the L2 ball ‖w − w_g‖ ≤ ``radius`` around the global model w_g (the
  authors' ``_apply_l2_projection``), so the update stays near the global model.

Defaults are the authors' released MNIST settings (``exps/iba_mnist_fedavg.sh`` and the
argparse defaults of ``iba_simulated_averaging.py``) unless said otherwise. The authors' ε is in
units of their standardised inputs (MNIST: ``Normalize((0.1307,), (0.3081,))``); here ``eps`` is
in the units of the workload's inputs, by default images in [0, 1], so the defaults are theirs
times 0.3081: ``eps`` 0.092 (``--atk_eps 0.3``), ``eps_min`` 0.015 (``--atk_test_eps 0.05``);
on standardised inputs give ``eps`` in those units (0.3 is the authors' value there, with
``input_range`` the inputs' range). Then ``eps_decay`` 0.001, ``lr`` 1e-3
(``--atk_lr``) with SGD (momentum 0.9, weight decay 1e-4: ``_create_adv_optimizer``), 3
generator epochs a round (``--atk_model_train_epoch``), mini-batches of 128, ``target`` 0
(``--target_label``), the two-phase schedule (``start_asr`` 0.85: ``expected_atk_threshold``)
and the generator retrained every other round once poisoning has begun (``retrain_every`` 2:
the ``alternative_training`` toggle), the PGD radius 2 (``--eps 2``) projected every step
(``--project_frequency 1``).

Where the implementations differ (each a named parameter; BackFed's values in brackets):

* **the generator's optimiser**: ``optimizer = "sgd"`` (authors) [``"adam"``, lr 0.01];
* **how long it trains**: ``epochs`` fixed epochs (authors: 3 on MNIST, 10 on CIFAR-10)
  [up to 100 epochs, stopping once its ASR on the attacker's data reaches 0.70:
  ``epochs = 100, stop_asr = 0.7``];
* **when poisoning starts**: the authors' attackers train honestly (α = 1) and only train the
  generator until its ASR on their data reaches 0.85, then poison [BackFed poisons from the
  first round: ``start_asr = 0``];
* **how often the generator is retrained** once poisoning has begun: ``retrain_every`` 2
  (authors) [1];
* **the poisoned share of a batch**: the authors' classifier step is
  0.5·CE(clean batch) + 0.5·CE(triggered copy of the whole batch) (``--attack_alpha 0.5``,
  ``--attack_portion 1.0``); a rewritten batch keeps its size, so the same 50/50 weighting is
  ``poison_fraction = 0.5`` with the triggered half replacing clean items [BackFed's online
  poisoning replaces the first ⌊0.3125·B⌋ items of each batch: ``poison_fraction = 0.3125``];
* **the trigger bound ε**: the authors decay it after poisoning starts,
  ε_t = max(``eps_min``, ``eps``·(1 − ``eps_decay``)^t), t = rounds since the start, and score
  the ASR with ε_t [BackFed keeps ε fixed: ``eps_decay = 0``]; BackFed's CIFAR-10 ε is 0.3 of
  the raw [0, 1] pixel range (its module default is 0.06), four times the authors' CIFAR-10
  ε (0.3 standardised units, std ≈ 0.25: about 0.075 of the pixel range);
* **the PGD radius**: the authors shrink it under (multi-)Krum, radius·γ^t with γ = 0.998
  (``radius_decay = 0.002``), and keep it elsewhere [BackFed: PGD off by default,
  ``poisoned_is_projection: False``; radius 10 every 2 steps when on]. The released scripts
  run ``--attack_method blackbox``, i.e. with no projection at all: ``radius = "none"``
  reproduces them; the default keeps the projection the paper describes (the poisoned update
  constrained to the vicinity of the global model, as its abstract puts it; the PDF itself was
  not at hand where this was written) with the released radius.

Departures from both, each stated:

* the generator is a two-level U-Net of ``width`` channels (conv 3×3 → average pool → conv 3×3
  → bilinear upsample, concatenated with the first level → conv 3×3 → conv 1×1 → tanh), each
  conv followed by a per-sample normalisation (GroupNorm of one group, learnable scale and
  shift) where the authors use BatchNorm: batch statistics would make an image's trigger depend
  on the batch it is in, and some normalisation before the tanh is needed (without it the tanh
  saturates within a few Adam steps and the generator's gradient vanishes: measured on digits,
  its ASR stayed at the target's share of the data). About 12 k parameters at ``width`` 16 on
  8×8 digits; the authors' CIFAR-10 U-Net has ~7.8 M;
* the generator is trained against the **global** model of the round, before local training
  (as BackFed's ``poison_warmup`` on the received model); the authors' release retrains it
  after the attacker's local training, against that local model, for the next round;
* the colluding attackers of a round share one generator trained on their pooled data (BackFed:
  the first selected attacker trains it on its own data and shares it; the authors run one
  attacker a round);
* the start test (``start_asr``) is made on the generator just trained, against the global
  model, in the same round (the authors test the attacker's local model and switch in the next
  round); the projection applies from the first poisoning round (the authors' code enables it
  only once ε has begun to decay);
* ``input_range`` is one interval for every channel (the authors clip normalised CIFAR-10
  images to the global min/max of the normalised range, as here; BackFed clips raw pixels to
  [0, 1] before normalising, which is per channel in normalised units). The authors clip
  MNIST to [−1, 1] in standardised units, i.e. raw pixels to [−0.18, 0.44]: every stroke
  pixel brighter than 0.44 is dimmed, whatever ε, so their MNIST trigger is not bounded by ε;
  the default [0, 1] does not copy that (``input_range = [-0.177, 0.439]`` would, on [0, 1]
  inputs).

Not implemented: the paper's abstract also names poisoning only the parameters the main task
rarely updates (a Neurotoxin-like mask); the authors' code offers it as a separate mode (``--attack_method neurotoxin``,
a 30 % gradient mask, exclusive of PGD, off in the released scripts).

The generator lives in the attack's memory (``_memory``), built at the first call from the
model's input shape with a torch generator seeded from ``ctx.generator``, so a run is
deterministic; a new run (a fresh ``ctx.attack_state``) starts a fresh generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.types import Attack, AttackContext, Surface, TrainingHook, param_error

from ._common import check_image_shape
from .compression import ball_projection

if TYPE_CHECKING:
    import torch

__all__ = ["IBA", "init_generator", "generate", "trigger_images"]


# ------------------------------------------------------------------ the generator network
def init_generator(channels: int, width: int, generator: "torch.Generator", *,
                   dtype: "torch.dtype | None" = None, device: "torch.device | str" = "cpu"
                   ) -> dict[str, "torch.Tensor"]:
    """The generator's parameters, drawn as PyTorch's default ``Conv2d`` initialisation
    (weights and biases uniform in ±1/√fan_in) from ``generator``: a two-level U-Net of
    ``width`` channels for images of ``channels`` channels (see :func:`generate`)."""
    import torch

    dt = dtype or torch.float32
    shapes = {
        "d1": (width, channels, 3, 3),
        "d2": (2 * width, width, 3, 3),
        "u1": (width, 3 * width, 3, 3),
        "out": (channels, width, 1, 1),
    }
    params: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        bound = 1.0 / math.sqrt(shape[1] * shape[2] * shape[3])
        w = (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound
        b = (torch.rand(shape[0], generator=generator, dtype=torch.float64) * 2 - 1) * bound
        params[name + ".weight"] = w.to(dtype=dt, device=device)
        params[name + ".bias"] = b.to(dtype=dt, device=device)
        params[name + ".norm.weight"] = torch.ones(shape[0], dtype=dt, device=device)
        params[name + ".norm.bias"] = torch.zeros(shape[0], dtype=dt, device=device)
    return params


def generate(params: dict[str, "torch.Tensor"], x: "torch.Tensor") -> "torch.Tensor":
    """G(x) ∈ (−1, 1) for images ``x`` of shape (N, C, H, W): conv 3×3 + ReLU → 2×2 average pool →
    conv 3×3 + ReLU → bilinear upsample to (H, W), concatenated with the first level → conv 3×3 +
    ReLU → conv 1×1 → tanh."""
    import torch
    import torch.nn.functional as F

    def layer(name: str, inp: "torch.Tensor", padding: int) -> "torch.Tensor":
        out = F.conv2d(inp, params[name + ".weight"], params[name + ".bias"], padding=padding)
        return F.group_norm(out, 1, params[name + ".norm.weight"], params[name + ".norm.bias"])

    h, w = int(x.shape[-2]), int(x.shape[-1])
    d1 = F.relu(layer("d1", x, 1))
    d2 = F.relu(layer("d2", F.avg_pool2d(d1, 2, ceil_mode=True), 1))
    up = F.interpolate(d2, size=(h, w), mode="bilinear", align_corners=True)
    u1 = F.relu(layer("u1", torch.cat([up, d1], dim=1), 1))
    return torch.tanh(layer("out", u1, 0))


def trigger_images(params: dict[str, "torch.Tensor"], x: "torch.Tensor", eps: float,
                   image_shape: tuple[int, int, int], lo: float, hi: float) -> "torch.Tensor":
    """T(x) = clip(x + ε·G(x), lo, hi) for inputs ``x`` of shape (N, *input) whose values per
    sample are an image of ``image_shape`` (C, H, W) (flat rows or images alike); same shape
    and dtype as ``x``. Differentiable in the generator's parameters."""
    import torch

    dt = params["d1.weight"].dtype
    img = x.reshape(x.shape[0], *image_shape).to(dt)
    out = torch.clamp(img + eps * generate(params, img), lo, hi)
    return out.reshape(x.shape).to(x.dtype)


def _number(obj: Any, name: str, v: Any, *, lo: float | None = None, hi: float | None = None,
            lo_open: bool = False, hi_open: bool = False, what: str = "") -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v < hi if hi_open else v <= hi
    if not ok:
        raise param_error(obj, name, v, what)


def _integer(obj: Any, name: str, v: Any, lo: int, what: str, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise param_error(obj, name, v, what)


@dataclass(frozen=True, slots=True)
class IBA(Attack):
    """IBA (Nguyen et al., NeurIPS 2023; see the module docstring for sources and departures).

    Trigger: ``eps`` (the bound ε of ‖T(x) − x‖∞), ``eps_min`` / ``eps_decay`` (its decay once
    poisoning has begun), ``input_range`` (the clip of triggered inputs), ``target``,
    ``image_shape`` (unset: the workload's, else read from the model's input shape), ``width``
    (the generator's channels). Generator training: ``optimizer`` (sgd | adam), ``lr``,
    ``epochs`` a round, ``batch``, ``stop_asr`` (stop early at this ASR on the attackers' data;
    unset: run every epoch), ``start_asr`` (poison only once the generator reaches it; 0: from
    the first round), ``retrain_every`` (rounds between retrainings once poisoning has begun).
    Poisoning: ``poison_fraction`` of each batch; ``local_lr`` / ``steps`` (the attackers' local
    training; unset: the federation's). PGD: ``radius`` (``"none"``: no projection),
    ``radius_decay`` a round, ``project_frequency`` (project after steps t with t mod k = 0, and
    after the last, which needs ``steps`` when k > 1).
    """

    target: int = 0
    eps: float = 0.092
    eps_min: float = 0.015
    eps_decay: float = 0.001
    input_range: tuple[float, float] = (0.0, 1.0)
    image_shape: tuple[int, ...] | None = None
    width: int = 16
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = 1e-3
    epochs: int = 3
    batch: int = 128
    stop_asr: float | None = None
    start_asr: float = 0.85
    retrain_every: int = 2
    poison_fraction: float = 0.5
    local_lr: float | None = None
    steps: int | None = None
    radius: float | Literal["none"] | None = 2.0
    radius_decay: float = 0.0
    project_frequency: int = 1
    _memory: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRAINING,)
    needs_model: ClassVar[bool] = True
    dynamic_trigger: ClassVar[bool] = True
    summary: ClassVar[str] = "IBA: a learned bounded trigger generator, on-the-fly poisoning, PGD near the global model"
    reference: ClassVar[str] = "Nguyen et al., NeurIPS 2023 (IBA)"

    # -- validation -------------------------------------------------------------------
    def validate_target(self, v: Any) -> None:
        _integer(self, "target", v, 0, "must be a class id ≥ 0")

    def validate_eps(self, v: Any) -> None:
        _number(self, "eps", v, lo=0, lo_open=True, what="must be a finite number > 0 (the trigger's L∞ bound)")

    def validate_eps_min(self, v: Any) -> None:
        _number(self, "eps_min", v, lo=0, lo_open=True, what="must be a finite number > 0")
        if v > self.eps:
            raise param_error(self, "eps_min", v, f"must be ≤ eps = {self.eps} (the floor of its decay)")

    def validate_eps_decay(self, v: Any) -> None:
        _number(self, "eps_decay", v, lo=0, hi=1, hi_open=True, what="must be in [0, 1) (the share ε loses a round)")

    def validate_input_range(self, v: Any) -> None:
        ok = (isinstance(v, (tuple, list)) and len(v) == 2
              and all(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) for t in v))
        if not ok or not v[0] < v[1]:
            raise param_error(self, "input_range", v, "must be [lo, hi] with finite lo < hi (the inputs' range)")

    def validate_image_shape(self, v: Any) -> None:
        check_image_shape(self, v)

    def validate_width(self, v: Any) -> None:
        _integer(self, "width", v, 1, "must be an integer ≥ 1 (the generator's channels)")
        if v > 512:
            raise param_error(self, "width", v, "must be ≤ 512 (the authors' largest U-Net level)")

    def validate_optimizer(self, v: Any) -> None:
        if v not in ("sgd", "adam"):
            raise param_error(self, "optimizer", v, "must be 'sgd' (the authors') or 'adam' (BackFed's)")

    def validate_lr(self, v: Any) -> None:
        _number(self, "lr", v, lo=0, lo_open=True, what="must be a finite number > 0 (the generator's step)")

    def validate_epochs(self, v: Any) -> None:
        _integer(self, "epochs", v, 1, "must be an integer ≥ 1 (generator epochs a round)")

    def validate_batch(self, v: Any) -> None:
        _integer(self, "batch", v, 1, "must be an integer ≥ 1 (the generator's mini-batch)")

    def validate_stop_asr(self, v: Any) -> None:
        if v is not None:
            _number(self, "stop_asr", v, lo=0, hi=1, lo_open=True, what="must be in (0, 1], or unset")

    def validate_start_asr(self, v: Any) -> None:
        _number(self, "start_asr", v, lo=0, hi=1, what="must be in [0, 1] (0: poison from the first round)")

    def validate_retrain_every(self, v: Any) -> None:
        _integer(self, "retrain_every", v, 1, "must be an integer ≥ 1 (rounds between generator retrainings)")

    def validate_poison_fraction(self, v: Any) -> None:
        _number(self, "poison_fraction", v, lo=0, hi=1, lo_open=True, what="must be in (0, 1]")

    def validate_local_lr(self, v: Any) -> None:
        if v is not None:
            _number(self, "local_lr", v, lo=0, lo_open=True, what="must be a finite number > 0, or unset")

    def validate_steps(self, v: Any) -> None:
        _integer(self, "steps", v, 1, "must be an integer ≥ 1, or unset (the federation's)", allow_none=True)

    def validate_radius(self, v: Any) -> None:
        if v is not None and v != "none":
            _number(self, "radius", v, lo=0, lo_open=True, what="must be a finite number > 0, or 'none' (no PGD)")

    def validate_radius_decay(self, v: Any) -> None:
        _number(self, "radius_decay", v, lo=0, hi=1, hi_open=True, what="must be in [0, 1)")

    def validate_project_frequency(self, v: Any) -> None:
        _integer(self, "project_frequency", v, 1, "must be an integer ≥ 1")
        if v > 1 and self.steps is None:
            raise param_error(self, "project_frequency", v, "> 1 needs steps (the attackers' local step count) so "
                              "that the last step is projected too, as the authors do")

    # -- the trigger --------------------------------------------------------------------
    def shape_for(self, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
        """The (C, H, W) image the generator works on, for one input of ``input_shape``:
        ``image_shape`` when given, else the input shape itself (C, H, W) / (H, W), or a square
        single-channel image for flat inputs of a square length."""
        n = math.prod(input_shape)
        if self.image_shape is not None:
            s = tuple(int(t) for t in self.image_shape)
            shape = s if len(s) == 3 else (1, *s)
        elif len(input_shape) == 3:
            shape = tuple(int(t) for t in input_shape)
        elif len(input_shape) == 2:
            shape = (1, int(input_shape[0]), int(input_shape[1]))
        else:
            side = math.isqrt(n)
            if side * side != n:
                raise param_error(self, "image_shape", self.image_shape,
                                  f"is unset and inputs of shape {tuple(input_shape)} are no square image: give it")
            shape = (1, side, side)
        if math.prod(shape) != n:
            raise param_error(self, "image_shape", self.image_shape,
                              f"has {math.prod(shape)} values, the model's inputs {tuple(input_shape)} have {n}")
        return shape  # type: ignore[return-value]

    def eps_at(self, round_: int) -> float:
        """ε of round ``round_``: ``eps`` until poisoning starts, then
        max(``eps_min``, ``eps``·(1 − ``eps_decay``)^(round − start))."""
        start = self._memory.get("start")
        if start is None or round_ <= start:
            return float(self.eps)
        return max(float(self.eps_min), float(self.eps) * (1.0 - float(self.eps_decay)) ** (round_ - start))

    def radius_at(self, round_: int) -> float | None:
        """The PGD radius of round ``round_``: ``radius``·(1 − ``radius_decay``)^(round − start)."""
        if self.radius is None or self.radius == "none":
            return None
        start = self._memory.get("start")
        t = 0 if start is None else max(round_ - start, 0)
        return float(self.radius) * (1.0 - float(self.radius_decay)) ** t

    def apply(self, x: "torch.Tensor", eps: float | None = None) -> "torch.Tensor":
        """The triggered copies T(x) of inputs ``x`` (N, *input) with the current generator
        (ε: the current one unless given). Needs a generator (:meth:`build`)."""
        import torch

        mem = self._memory
        if "params" not in mem:
            raise RuntimeError("IBA.apply: no generator yet (it is built at the first training round)")
        lo, hi = (float(t) for t in self.input_range)
        with torch.no_grad():
            return trigger_images(mem["params"], x.to(mem["params"]["d1.weight"].device),
                                  mem["eps"] if eps is None else float(eps), mem["shape"], lo, hi).to(x.device)

    def build(self, input_shape: tuple[int, ...], generator: "torch.Generator", *,
              device: "torch.device | str" = "cpu") -> None:
        """A fresh generator for inputs of ``input_shape``, its weights and its shuffling stream
        drawn from ``generator`` (one draw: a seed)."""
        import torch

        shape = self.shape_for(tuple(input_shape))
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        g = torch.Generator(device="cpu").manual_seed(seed)
        mem = self._memory
        mem.clear()
        mem.update(shape=shape, params=init_generator(shape[0], int(self.width), g, device=device), rng=g,
                   eps=float(self.eps), start=None, trained=[])

    def train_generator(self, forward: Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"],
                        flat: "torch.Tensor", x: "torch.Tensor", eps: float) -> float:
        """Train the generator in memory for ``epochs`` epochs (or until ``stop_asr``) to make the
        model ``flat`` answer ``target`` on T(x): minimise CE(f(clip(x + ε·G(x))), target) over
        shuffled mini-batches of ``batch`` items of ``x``; returns the ASR on every item of ``x``
        afterwards (the share of T(x) the model sends to ``target``)."""
        import torch
        import torch.nn.functional as F

        mem = self._memory
        params = {k: v.detach().clone().requires_grad_(True) for k, v in mem["params"].items()}
        if self.optimizer == "sgd":
            opt: torch.optim.Optimizer = torch.optim.SGD(list(params.values()), lr=float(self.lr), momentum=0.9,
                                                         weight_decay=1e-4)
        else:
            opt = torch.optim.Adam(list(params.values()), lr=float(self.lr))
        lo, hi = (float(t) for t in self.input_range)
        shape, flat = mem["shape"], flat.detach()
        n = int(x.shape[0])
        stop = self.stop_asr
        for _ in range(int(self.epochs)):
            if stop is not None and self.local_asr(forward, flat, x, eps, params) >= stop:
                break
            order = torch.randperm(n, generator=mem["rng"]).to(x.device)
            for i in range(0, n, int(self.batch)):
                xb = x[order[i:i + int(self.batch)]]
                out = forward(flat, trigger_images(params, xb, eps, shape, lo, hi))
                tgt = torch.full((xb.shape[0],), int(self.target), dtype=torch.long, device=out.device)
                loss = F.cross_entropy(out, tgt)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        mem["params"] = {k: v.detach() for k, v in params.items()}
        return self.local_asr(forward, flat, x, eps)

    def local_asr(self, forward: Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"], flat: "torch.Tensor",
                  x: "torch.Tensor", eps: float, params: dict[str, "torch.Tensor"] | None = None) -> float:
        """The share of the triggered inputs T(x) that the model ``flat`` sends to ``target``."""
        import torch

        p = self._memory["params"] if params is None else params
        lo, hi = (float(t) for t in self.input_range)
        with torch.no_grad():
            out = forward(flat, trigger_images(p, x, eps, self._memory["shape"], lo, hi))
        return float((out.argmax(-1) == int(self.target)).to(torch.float64).mean()) if x.shape[0] else 0.0

    # -- the round ------------------------------------------------------------------------
    def poisoner(self, eps: float) -> Callable[["torch.Tensor", "torch.Tensor"], tuple["torch.Tensor", "torch.Tensor"]]:
        """``poison_batch(x, y)``: the first ⌊``poison_fraction``·B⌋ items of each malicious row's
        batch (x: (f, B, *input), y: (f, B)) become their triggered copies labelled ``target``."""
        import torch

        mem = self._memory
        params = mem["params"]
        shape = mem["shape"]
        lo, hi = (float(t) for t in self.input_range)
        frac, target = float(self.poison_fraction), int(self.target)

        def poison(x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
            k = math.floor(frac * int(x.shape[1]) + 1e-9)
            if k == 0:
                return x, y
            head = x[:, :k].reshape(-1, *x.shape[2:])
            with torch.no_grad():
                trig = trigger_images(params, head.to(params["d1.weight"].device), eps, shape, lo, hi)
            nx, ny = x.clone(), y.clone()
            nx[:, :k] = trig.reshape(x.shape[0], k, *x.shape[2:]).to(device=x.device, dtype=x.dtype)
            ny[:, :k] = target
            return nx, ny

        return poison

    def projector(self, radius: float) -> Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]:
        """The PGD step: rows W ↦ w_g + (W − w_g)·min(1, r/‖W − w_g‖) after local steps t with
        t mod ``project_frequency`` = 0 and after step ``steps`` − 1 (the authors' rule)."""
        ball = ball_projection(radius)
        k = int(self.project_frequency)
        if k == 1:
            return ball
        last = int(self.steps) - 1  # validated: k > 1 needs steps
        count = [0]

        def project(rows: "torch.Tensor", global_params: "torch.Tensor") -> "torch.Tensor":
            t = count[0]
            count[0] += 1
            return ball(rows, global_params) if (t % k == 0 or t == last) else rows

        return project

    def training_hook(self, ctx: AttackContext) -> TrainingHook | None:
        """Train the generator against the round's global model on the attackers' own data,
        then (once poisoning has begun) poison their batches and project their models."""
        import torch

        if ctx.model is None or not ctx.own_data:
            raise InvalidParameter("attack 'iba' needs the model and the attackers' own data (needs_model): "
                                   "the context carries neither")
        if not ctx.own_data[0].x.dtype.is_floating_point or ctx.own_data[0].y.ndim != 1:
            raise InvalidParameter("attack 'iba' generates image triggers for a classifier; this workload's "
                                   f"inputs are {ctx.own_data[0].x.dtype} of shape {tuple(ctx.own_data[0].x.shape[1:])} "
                                   "(token ids?): use an image workload")
        classes = int(ctx.model.num_classes or ctx.num_classes or 0)
        if classes and int(self.target) >= classes:
            raise param_error(self, "target", self.target, f"must be a class of the model (0 … {classes - 1})")
        mem = self._memory
        run = ctx.attack_state.setdefault("iba_run", object())
        if mem.get("run") is not run:  # a new run: a fresh generator
            self.build(tuple(ctx.model.input_shape), ctx.generator, device=ctx.global_params.device)
            mem["run"] = run
        x = torch.cat([d.x for d in ctx.own_data]).to(ctx.global_params.device)
        rnd = int(ctx.round)
        started = mem["start"] is not None
        eps = self.eps_at(rnd)
        retrain = not started or (rnd - mem["start"]) % int(self.retrain_every) == 0
        if retrain:
            asr = self.train_generator(ctx.model.forward, ctx.global_params, x, eps)
            mem["trained"].append((rnd, asr))
            if not started and asr >= float(self.start_asr):
                mem["start"] = rnd
                started = True
        mem["eps"] = eps
        if not started:
            return None  # the authors' first phase: honest local training while the generator learns
        radius = self.radius_at(rnd)
        return TrainingHook(poison_batch=self.poisoner(eps),
                            project=None if radius is None else self.projector(radius),
                            lr=self.local_lr, steps=self.steps)

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """The held-out images whose class is not ``target``, triggered by the current generator
        at the current ε (the authors score with the ε they train with), labelled ``target``;
        untouched before the generator exists."""
        import torch

        keep = y != int(self.target)
        x, y = x[keep], y[keep]
        ty = torch.full_like(y, int(self.target))
        if "params" not in self._memory:
            return x, ty
        return self.apply(x), ty
