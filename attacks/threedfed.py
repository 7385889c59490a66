"""3DFed: a covert backdoor that reads the server's verdicts from the global model and adapts.

Haoyang Li, Qingqing Ye, Haibo Hu, Jin Li, Leixia Wang, Chengfang Fang & Jie Shi, "3DFed:
Adaptive and Extensible Framework for Covert Backdoor Attack in Federated Learning", IEEE
Symposium on Security and Privacy (S&P) 2023. Released code: github.com/haoyangliASTAPLE/3DFed
at commit 6e0e8ec0db251421fb3df69a590d91e760aeb530 (``attacks/thrdfed.py``,
``attacks/components/{indicator,mask,decoy,tuning}.py``, ``attacks/loss_functions.py``,
``configs/mnist_fed.yaml``), read for this transcription; no code was copied.
BackFed (github.com/thinh-dao/BackFed, commit ab3bcbd) names a ``backfed.clients.3DFedClient``
in its attack configs (``config/atk_config/*.yaml``) but ships no such class (its
``backfed/clients`` has none), so there is no second implementation to compare with.

One round of the attack (``craft_updates``; the f malicious rows of the round are split into
f − k **backdoor rows** followed by k **decoy rows**):

1. **Indicator feedback** (previous round's plants, read from the new global model). Each row
   sent in round r − 1 carried an *indicator*: one coordinate p of a low-impact layer whose
   value v was multiplied by ``indicator_scale`` (1e5; a zero becomes ``indicator_floor``).
   With Δg the change of the global model between r − 1 and r, the feedback of that row is
   ρ = Δg[p] / (η·v) (η: the server step, ``ctx.server_lr``; the released code has η = 1):
   under FedAvg an accepted row gives its aggregation weight (1/n for equal weights), a clipped
   one less, a rejected one about 0 (the other rows' values there are 1e5 times smaller).
   Rule (``read_feedback``, the released ``read_indicator``): if any ρ > 1 or ρ < −τ the server
   adds noise ("weak DP") and the feedback is ignored from then on; otherwise ρ ≤ τ is
   *rejected* ``r``, τ < ρ ≤ ``clip_ratio``·max ρ is *clipped* ``c``, larger is *accepted*
   ``a`` (τ = ``feedback_threshold``).
2. **Adaptive tuning** (``adapt``, the released ``adaptive_tuning``). Decoys: k ← max(k − #a
   among the decoys, 0), then k ← k + 1 if no backdoor row was accepted or clipped and no decoy
   accepted. Noise-mask weights α (one per group of ``group_size`` backdoor rows; a full group
   counts as accepted when ≥ 0.8·group_size of its rows are ``a``): one full group → redraw all
   α ~ U(``alpha_min``, 1) when it was not accepted; several → all accepted: α_g ~ U(c₁, c₂)
   (the two smallest accepted α), some: α_g ~ U(c₁, c₁ + 0.1), none: α_g ~ U(alpha_min, 1);
   then α ≥ 1 → 0.99, α ≤ 0 → 0.01. Under weak DP every α is 0.1 and k stays. Round one
   draws α ~ U(alpha_min, 1) and starts with k = ``initial_decoys`` (0).
3. **Backdoor training with constrained loss**: from the global model G, ``poison_steps``
   steps of SGD (``lr``, ``momentum``, ``weight_decay``, ``batch_size``) on the attackers'
   data with L = 0.3·CE(clean batch) + 0.3·CE(the same batch, every image triggered and
   labelled ``target``) + 0.4·‖w − G‖₂ (``loss_weights``; the released ``fixed_scales`` and
   ``poisoning_proportion = 1.0`` of its MNIST config). A **benign reference** is trained
   from G for ``benign_steps`` on clean data; the backdoor update Δ is scaled by
   max(1, min(‖Δ_benign‖/‖Δ‖, ``weight_scale``)).
4. **Indicators** (``select_indicators``): in the indicator layer, the ``num_candidates``·f
   coordinates with the smallest |Δ| + |Δ_benign|, of which the f rows' indicators are those
   with the smallest |curvature|, the curvature being ∂/∂w_p Σ_q ∂L/∂w_q over the layer (the
   Hessian's row sums), summed over the clean and the triggered batches at G. Row i gets the
   i-th; a row's value there is multiplied by ``indicator_scale`` after its noise mask is added.
5. **Noise masks** (``noise_masks``, for DeepSight-style inspection of the output layer): the
   backdoor rows are shuffled into groups of ``group_size``; each group picks ``num_neurons``
   output neurons other than ``target`` and gives each member a mask n_i on those rows of the
   output layer (weights and bias), drawn N(0, ``noise_std``²), centred on the group mean, then
   ``mask_steps`` SGD steps (``mask_lr``, ``momentum``, ``weight_decay``) on
   [α·Σ_j c_u/‖Δ_j + n_ij‖₁ + (1 − α)·c_n‖n_i‖₂ + λ·c_l‖Σ_m n_m‖₂]/(1 + λ) with dual ascent
   λ ← λ + ``lagrange_step``·‖Σ_m n_m‖₂ (λ₀ = 1; (c_u, c_n, c_l) = ``mask_coefficients``): it
   raises the update energy of low-update neurons while the group's masks cancel in a sum.
6. **Decoy models** (``decoy_positions``, ``train_decoy``): decoy j starts from G and trains
   ``benign_steps`` on (−10·|w_P − w_P^benign| + CE(clean))/2 at one *decoy parameter* P of
   the decoy layer (the coordinates with the smallest |Δ − Δ_benign|, none an indicator),
   the −10·|…| term becoming +1e-10·|…| once the gap passes ``decoy_threshold`` (10): a model
   of benign accuracy that is an outlier in one coordinate, so that a clustering or PCA
   detector spends its outlier / principal axis on it (the released PCA toy example) instead
   of on the backdoor rows. Each decoy carries an indicator too.

Where this differs from the released code, and why:

* **Decoys are some of the malicious rows.** The released code writes the k decoys over the
  updates of the last k *benign* participants (``update_{n-1-i}``), i.e. as extra sybils; here
  the engine gives the attack f rows, so the last k of them are decoys and f − k carry the
  backdoor. k is capped at ``max_decoys`` (default f − 1: at least one backdoor row).
* **Layers by role, not by name.** The released code hard-codes MNIST's ``conv2.weight``
  (indicators), ``fc1.weight`` (decoys) and ``fc2`` (noise masks) and ResNet's
  ``layer4.1.conv2.weight`` / ``fc``. Here the noise masks act on the output layer
  (``ModelView.head``), and by default the decoy layer is the last weight tensor (≥ 2-D) before
  it and the indicator layer the one before that (the MNIST layout), each falling back to the
  next one when the model has fewer (the digits MLP: both on ``0.weight``; a model of one layer:
  the output layer). ``indicator_layer`` / ``decoy_layer`` name others. A model whose output
  weight is not a (classes × inputs) matrix gets no noise mask.
* **Data.** As released (``data = "release"``) the backdoor trains on the first malicious
  client's data and the reference, curvature and decoys on the last one's; ``"pooled"`` gives
  every step all the colluders' data.
* **Defects of the release, implemented as intended**: ``find_decoy_params`` writes each new
  index to the slot of the *new* maximum (indices and values drift apart) — here the k smallest
  |Δ − Δ_benign|; ``adaptive_tuning`` counts a group's acceptances on rows taken by adversary
  id although the groups were drawn from a shuffled order — here by the group's actual members;
  each mask's step in ``noise_mask_design`` receives the shared Lagrange gradient once per
  earlier ``backward`` (1, 2, … times) — here once; the streaming candidate selection of
  ``design_indicator`` is the lexicographic order (|curvature|, |Δ| + |Δ_benign|, index) it
  approximates; the decoy term's gradient at a zero gap is taken as pushing upwards (torch's
  |·| has slope 0 there and such a decoy would never move: the released code's decoy
  parameters, chosen where the two updates agree, are often exact zeros of both).
* **Server step.** The feedback divides by ``ctx.server_lr``; under a momentum or Adam server
  step (``server_optimizer`` other than fedavg) the change of the global model is not the
  aggregate and the reading is as unreliable as in the released code, which assumes FedAvg.
* A round the attackers skip (not sampled, outside the window) breaks the chain: the next
  round plants afresh without reading feedback (the released code assumes every round).
* A layer with fewer coordinates than rows gets no indicators that round (no feedback).
* ``target`` defaults to 0 as the project's ``backdoor`` (the released MNIST config uses 8); the
  trigger is the project's pixel pattern (``attacks.backdoor``), not the released 5×3 pattern.

**Local training.** The released attacker trains with its federation's own local optimizer
(MNIST: SGD lr 0.1, momentum 0.9, weight decay 5e-4, batch 64) for ``fl_poison_epochs`` = 15
epochs where an honest client trains ``fl_local_epochs`` = 1 (CIFAR-10: 15 vs 2); its reference
and decoys train the honest amount. The engine does not tell an attack the federation's local
procedure, so it is given here: by default this project's federation (SGD lr 0.1, no momentum,
no weight decay, batch 16, 10 local steps), i.e. ``benign_steps`` 10 and ``poison_steps`` 150
(15× the honest work, the MNIST ratio). Set them to the run's ``[federation]`` values when
those differ. The release's own numbers are ``momentum`` 0.9, ``weight_decay`` 5e-4,
``batch_size`` 64 with ``benign_steps`` / ``poison_steps`` one and fifteen local epochs.

**Measured on digits** (20 clients, 4 malicious, 30 rounds, seeds 0–2, FedAvg weights; the
plain ``backdoor`` with the same trigger and target as baseline): without a defense the ASR
over rounds 25–29 is 0.29–0.91 (``backdoor``: 0.38–0.87); FLAME admits 0–23 % of the malicious
rows (``backdoor``: 28–39 %) and Multi-Krum 0–20 % (``backdoor``: 8–100 %), so the evasion the
paper reports does not show here: the f − k backdoor rows are near-copies of one constrained
backdoor update whose cosine to the nearest honest update is about 0.3 (honest updates: about
0.65 to their nearest; round 6, seed 0), and cosine or distance rules drop the copies as a block. The indicator
feedback is read as the paper says where no other participant writes into the indicator
coordinates: under the plain mean, a norm bound and Krum (seeds 1–2) the labels of every round
agree with the server's accept flags (116 of 116 rows per run); FLAME's noise is detected as
weak DP in round 1. Under Multi-Krum (seeds 0, 2) and Krum (seed 0) the weak-DP rule fires
without noise: the indicators sit on first-layer weights of pixels that are dark in the
attacker's data but not in every honest client's, whose updates there exceed τ·v (v is the
floor 1e-2: the digits updates are exactly 0 on dark pixels); a larger ``indicator_floor``
only delays it.

The other defaults are the released MNIST ones (``configs/mnist_fed.yaml`` and the MNIST
branches of the code): ``loss_weights`` (0.3, 0.3, 0.4), ``weight_scale`` 5, ``group_size`` 2,
``num_neurons`` 8, ``alpha_min`` 0, ``lagrange_step`` 0.1, ``mask_steps`` 30, ``mask_lr`` 0.1,
``noise_std`` 0.05 (``weak_noise_std`` 0.01 under weak DP), ``mask_coefficients``
(0.1, 0.08, 0.1), ``num_candidates`` 10, ``indicator_scale`` 1e5, ``indicator_floor`` 1e-2,
``feedback_threshold`` 1e-4, ``clip_ratio`` 0.8, ``decoy_threshold`` 10; CIFAR-10 uses
(0.1, 0.03, 0.01), 1e-3, 1e-5, noise 0.01, group_size 5, num_neurons 5, and triggers half of
each batch (MNIST: all of it, as here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from redteam.errors import InvalidParameter, RedteamError
from redteam.types import Attack, AttackContext, ModelView, Surface, param_error

from .backdoor import Backdoor

if TYPE_CHECKING:
    import torch

__all__ = ["ThreeDFed", "read_feedback", "adapt", "select_indicators", "decoy_positions", "implant",
           "noise_masks", "train_decoy", "sgd_train"]

#: the key of the attack's memory in ``ctx.attack_state``
STATE_KEY = "3dfed"


# ------------------------------------------------------------------ the modules as functions
def read_feedback(feedback: "torch.Tensor", threshold: float, clip_ratio: float) -> tuple[list[str], bool]:
    """The released ``read_indicator`` rule on the feedback ρ of each planted row (backdoor rows
    first, then decoys): ``(labels, weak)``. ``weak`` (noise detected) when some ρ > 1 or
    ρ < −threshold; then the labels are ``[]``. Else ρ ≤ threshold → ``"r"``, threshold < ρ ≤
    clip_ratio·max ρ → ``"c"``, larger → ``"a"``."""
    import torch

    fb = feedback.to(torch.float64)
    if fb.numel() == 0:
        return [], False
    if bool(((fb > 1) | (fb < -threshold) | ~torch.isfinite(fb)).any()):
        return [], True
    top = float(fb.max()) * clip_ratio
    labels = ["r" if float(v) <= threshold else ("c" if float(v) <= top else "a") for v in fb.tolist()]
    return labels, False


def adapt(groups: list[list[str]], decoys: list[str], alpha: list[float], k: int, weak: bool, group_size: int,
          alpha_min: float, draw: Callable[[float, float], float]) -> tuple[list[float], int]:
    """The released ``adaptive_tuning``: the next round's noise-mask weights α (one per group) and
    decoy count k from the labels of each group's rows (``groups``, in group order) and of the
    decoys. ``draw(a, b)`` is a uniform draw in [a, b). Only full groups (``group_size`` rows)
    are judged, as the release judges ⌊f/group_size⌋ groups."""
    alpha = list(alpha)
    if weak:
        return [0.1] * len(alpha), k
    adv = [lab for g in groups for lab in g]
    k = max(k - decoys.count("a"), 0)
    if "a" not in adv and "c" not in adv and "a" not in decoys:
        k += 1
    full = [i for i, g in enumerate(groups) if len(g) == group_size]
    cand = sorted(alpha[i] for i in full if groups[i].count("a") >= 0.8 * group_size)
    if len(full) == 1:
        if not cand:
            alpha = [draw(alpha_min, 1.0) for _ in alpha]
    elif len(full) > 1:
        for i in full:
            if len(cand) == len(full):
                alpha[i] = draw(cand[0], cand[1])
            elif cand:
                alpha[i] = draw(cand[0], cand[0] + 0.1)
            else:
                alpha[i] = draw(alpha_min, 1.0)
    alpha = [0.99 if a >= 1 else (0.01 if a <= 0 else a) for a in alpha]
    return alpha, k


def _stable_order(*keys: "torch.Tensor") -> "torch.Tensor":
    """Indices sorting by ``keys[0]``, ties by ``keys[1]``, …, then by index (stable sorts)."""
    import torch

    order = torch.arange(keys[0].numel(), device=keys[0].device)
    for key in reversed(keys):
        order = order[torch.sort(key[order], stable=True).indices]
    return order


def select_indicators(analog: "torch.Tensor", curvature: "torch.Tensor", count: int,
                      num_candidates: int) -> "torch.Tensor":
    """The released ``design_indicator`` choice within one layer (flat positions): the
    ``num_candidates``·``count`` coordinates with the smallest ``analog`` (|Δ| + |Δ_benign|,
    earliest first among ties), then of those the ``count`` with the smallest |curvature|,
    ties by analog, then by position; returned in that order."""
    import torch

    cand = _stable_order(analog)[: num_candidates * count]
    pick = _stable_order(curvature.abs()[cand], analog[cand], cand.to(analog.dtype))[:count]
    return cand[pick].to(torch.long)


def decoy_positions(gap: "torch.Tensor", count: int, exclude: "torch.Tensor | None" = None) -> "torch.Tensor":
    """The ``count`` coordinates with the smallest ``gap`` (|Δ − Δ_benign| over the decoy layer),
    earliest first among ties, leaving out the flat positions ``exclude`` (indicators)."""
    import torch

    g = gap.clone()
    if exclude is not None and exclude.numel():
        g[exclude] = float("inf")
    order = _stable_order(g)
    order = order[torch.isfinite(g[order])]
    return order[:count]


def implant(values: "torch.Tensor", scale: float, floor: float) -> "torch.Tensor":
    """Indicator values: ``values``·scale, a zero becoming ``floor``."""
    import torch

    v = values * scale
    return torch.where(v == 0, torch.full_like(v, floor), v)


def sgd_train(flat0: "torch.Tensor", loss_of: Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"],
              x: "torch.Tensor", y: "torch.Tensor", steps: int, batch_size: int, lr: float, momentum: float,
              weight_decay: float, generator: "torch.Generator") -> "torch.Tensor":
    """``steps`` steps of mini-batch SGD as ``torch.optim.SGD`` (momentum buffer b ← μb + g with
    g = ∇L + wd·w, w ← w − lr·b) over passes through ``(x, y)``, each pass shuffled from
    ``generator`` and cut into batches of ``batch_size`` (the last one shorter, as a DataLoader
    keeps it); ``loss_of(w, xb, yb)`` is the batch loss. Returns the trained flat parameters."""
    import torch

    w = flat0.detach().clone()
    buf = torch.zeros_like(w)
    n = int(y.shape[0])
    batches: list = []
    for _ in range(steps):
        if not batches:
            perm = torch.randperm(n, generator=generator, device=generator.device).to(x.device)
            batches = [perm[s: s + batch_size] for s in range(0, n, batch_size)]
        idx = batches.pop(0)
        wr = w.requires_grad_(True)
        with torch.enable_grad():
            grad = torch.autograd.grad(loss_of(wr, x[idx], y[idx]), wr)[0]
        w = w.detach()
        buf = momentum * buf + grad + weight_decay * w
        w = w - lr * buf
    return w.detach()


def train_decoy(flat0: "torch.Tensor", benign: "torch.Tensor", position: int, model: ModelView,
                x: "torch.Tensor", y: "torch.Tensor", steps: int, batch_size: int, lr: float, momentum: float,
                weight_decay: float, threshold: float, generator: "torch.Generator") -> "torch.Tensor":
    """A decoy model: from ``flat0`` (G), SGD on (P + CE)/2 with P = −10·|w_p − benign_p| while
    that gap is ≤ ``threshold``, +1e-10·|w_p − benign_p| beyond (the released
    ``compute_decoy_param_loss``); a zero gap is pushed upwards (see the module docstring)."""
    import torch

    ref = benign.detach()[position]

    def loss(w: "torch.Tensor", xb: "torch.Tensor", yb: "torch.Tensor") -> "torch.Tensor":
        gap = w[position] - ref
        up = torch.where(gap.detach() >= 0, gap, -gap)  # |gap|, its slope +1 at 0
        param = torch.where(up.detach() > threshold, 1e-10 * up, -10.0 * up)
        return (param + model.loss(model.forward(w, xb), yb)) / 2

    return sgd_train(flat0, loss, x, y, steps, batch_size, lr, momentum, weight_decay, generator)


def noise_masks(delta_rows: "torch.Tensor", members: int, alpha: float, init: "torch.Tensor", steps: int, lr: float,
                momentum: float, weight_decay: float, coefficients: tuple[float, float, float],
                lagrange_step: float) -> "torch.Tensor":
    """One group's noise masks (the released ``noise_mask_design``): ``delta_rows`` ``(m, h)`` are
    the backdoor update's rows of the chosen output neurons (weights then bias), ``init``
    ``(members, m, h)`` the masks' initial draw (centred here on their mean). Each member's mask
    takes ``steps`` SGD steps on [α·Σ_j c_u/‖Δ_j + n_j‖₁ + (1 − α)·c_n‖n‖₂ + λ·c_l‖Σ_m n_m‖₂]/(1 + λ),
    then λ ← λ + lagrange_step·‖Σ_m n_m‖₂ (λ₀ = 1). Returns the ``(members, m, h)`` masks."""
    import torch

    c_up, c_norm, c_lag = coefficients
    n = (init - init.mean(0, keepdim=True)).detach()
    buf = torch.zeros_like(n)
    lam = 1.0
    for _ in range(steps):
        nr = n.requires_grad_(True)
        with torch.enable_grad():
            ups = (c_up / (delta_rows.unsqueeze(0) + nr).abs().sum(-1).clamp_min(1e-12)).sum(-1)  # (members,)
            norm = c_norm * nr.flatten(1).norm(dim=1)
            lag = c_lag * nr.sum(0).norm()
            total = ((alpha * ups + (1 - alpha) * norm).sum() + lam * lag) / (1 + lam)
            grad = torch.autograd.grad(total, nr)[0]
        n = n.detach()
        buf = momentum * buf + grad + weight_decay * n
        n = n - lr * buf
        lam += lagrange_step * float(n.sum(0).norm())
    return n.detach()


# ------------------------------------------------------------------ helpers
def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _weight_layers(model: ModelView) -> list[tuple[str, int, int, tuple[int, ...]]]:
    """The ≥ 2-D parameter tensors before the output layer, in the flat order."""
    return [lay for lay in model.layers if lay[0] not in model.head and len(lay[3]) >= 2]


# ------------------------------------------------------------------ the plugin
@dataclass(frozen=True, slots=True)
class ThreeDFed(Attack):
    """3DFed (Li et al., IEEE S&P 2023; see the module docstring for the round and the departures).

    * trigger: ``trigger``, ``value``, ``image_shape``, ``target`` as ``backdoor`` (the engine
      fills ``image_shape`` from the workload);
    * backdoor training: ``loss_weights`` (clean, triggered, ‖w − G‖) = (0.3, 0.3, 0.4),
      ``poison_steps`` 150, ``benign_steps`` 10 (the reference and the decoys), ``lr`` 0.1,
      ``momentum`` 0, ``weight_decay`` 0, ``batch_size`` 16 (the honest local procedure: see
      "Local training" in the module docstring), ``weight_scale`` 5, ``data`` (``"release"``:
      the first attacker's data trains the backdoor, the last one's the reference, curvature
      and decoys; ``"pooled"``: all of them for all);
    * noise masks: ``group_size`` 2, ``num_neurons`` 8, ``alpha_min`` 0, ``lagrange_step`` 0.1,
      ``mask_steps`` 30, ``mask_lr`` 0.1, ``noise_std`` 0.05, ``weak_noise_std`` 0.01,
      ``mask_coefficients`` (0.1, 0.08, 0.1);
    * indicators: ``indicator_layer`` (None: by role), ``num_candidates`` 10,
      ``indicator_scale`` 1e5, ``indicator_floor`` 1e-2, ``feedback_threshold`` 1e-4,
      ``clip_ratio`` 0.8;
    * decoys: ``decoy_layer`` (None: by role), ``initial_decoys`` 0, ``max_decoys`` (None: f − 1),
      ``decoy_threshold`` 10.
    """

    trigger: tuple[tuple[int, int], ...] | None = None
    value: float = 1.0
    image_shape: tuple[int, ...] = (8, 8)
    target: int = 0
    loss_weights: tuple[float, float, float] = (0.3, 0.3, 0.4)
    poison_steps: int = 150
    benign_steps: int = 10
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 16
    weight_scale: float = 5.0
    group_size: int = 2
    num_neurons: int = 8
    alpha_min: float = 0.0
    lagrange_step: float = 0.1
    mask_steps: int = 30
    mask_lr: float = 0.1
    noise_std: float = 0.05
    weak_noise_std: float = 0.01
    mask_coefficients: tuple[float, float, float] = (0.1, 0.08, 0.1)
    indicator_layer: str | None = None
    num_candidates: int = 10
    indicator_scale: float = 1e5
    indicator_floor: float = 1e-2
    feedback_threshold: float = 1e-4
    clip_ratio: float = 0.8
    decoy_layer: str | None = None
    initial_decoys: int = 0
    max_decoys: int | None = None
    decoy_threshold: float = 10.0
    data: Literal["release", "pooled"] = "release"

    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    needs_model: ClassVar[bool] = True
    summary: ClassVar[str] = ("3DFed: constrained backdoor + noise masks + decoy rows, tuned each round from "
                              "indicators read in the global model")
    reference: ClassVar[str] = "Li et al., IEEE S&P 2023 (3DFed)"

    # -- validation -------------------------------------------------------------------
    def _backdoor(self, image_shape: tuple[int, ...] | None = None) -> Backdoor:
        return Backdoor(trigger=self.trigger, value=self.value,
                        image_shape=tuple(image_shape if image_shape is not None else self.image_shape),
                        target=self.target, fraction=1.0)

    def validate_trigger(self, v: Any) -> None:
        if v is not None and not (isinstance(v, (tuple, list)) and len(v) and all(isinstance(p, (tuple, list)) for p in v)):
            raise param_error(self, "trigger", v, "must be a non-empty list of [row, col] pixels (or unset)")

    def validate_target(self, v: Any) -> None:
        # target is validated after trigger, value and image_shape (field order): build the trigger
        if not _int(v) or v < 0:
            raise param_error(self, "target", v, "must be a class id ≥ 0")
        try:
            self._backdoor()
        except InvalidParameter as exc:
            msg = str(exc)
            name = msg.split(".", 1)[1].split(" =", 1)[0] if msg.startswith("Backdoor.") else "trigger"
            field = name if name in ("trigger", "value", "image_shape") else "trigger"
            raise param_error(self, field, getattr(self, field), msg.split(": ", 1)[-1]) from None

    def validate_loss_weights(self, v: Any) -> None:
        if not (isinstance(v, (tuple, list)) and len(v) == 3 and all(_finite(a) and a >= 0 for a in v) and v[1] > 0):
            raise param_error(self, "loss_weights", v,
                              "must be three finite weights ≥ 0 (clean, triggered, ‖w − G‖), the triggered one > 0")

    def _positive_int(self, name: str, v: Any, lo: int = 1) -> None:
        if not _int(v) or v < lo:
            raise param_error(self, name, v, f"must be an integer ≥ {lo}")

    def validate_poison_steps(self, v: Any) -> None:
        self._positive_int("poison_steps", v)

    def validate_benign_steps(self, v: Any) -> None:
        self._positive_int("benign_steps", v)

    def validate_batch_size(self, v: Any) -> None:
        self._positive_int("batch_size", v)

    def validate_group_size(self, v: Any) -> None:
        self._positive_int("group_size", v)

    def validate_num_neurons(self, v: Any) -> None:
        self._positive_int("num_neurons", v)

    def validate_mask_steps(self, v: Any) -> None:
        self._positive_int("mask_steps", v, 0)

    def validate_num_candidates(self, v: Any) -> None:
        self._positive_int("num_candidates", v)

    def validate_initial_decoys(self, v: Any) -> None:
        self._positive_int("initial_decoys", v, 0)

    def validate_max_decoys(self, v: Any) -> None:
        if v is not None:
            self._positive_int("max_decoys", v, 0)

    def _positive(self, name: str, v: Any, *, zero: bool = False) -> None:
        if not _finite(v) or v < 0 or (v == 0 and not zero):
            raise param_error(self, name, v, "must be a finite number " + ("≥ 0" if zero else "> 0"))

    def validate_value(self, v: Any) -> None:
        if not _finite(v):
            raise param_error(self, "value", v, "must be a finite number")

    def validate_lr(self, v: Any) -> None:
        self._positive("lr", v)

    def validate_mask_lr(self, v: Any) -> None:
        self._positive("mask_lr", v)

    def validate_weight_decay(self, v: Any) -> None:
        self._positive("weight_decay", v, zero=True)

    def validate_momentum(self, v: Any) -> None:
        if not _finite(v) or not 0 <= v < 1:
            raise param_error(self, "momentum", v, "must be in [0, 1)")

    def validate_weight_scale(self, v: Any) -> None:
        if not _finite(v) or v < 1:
            raise param_error(self, "weight_scale", v, "must be a finite number ≥ 1 (the largest boost)")

    def validate_alpha_min(self, v: Any) -> None:
        if not _finite(v) or not 0 <= v < 1:
            raise param_error(self, "alpha_min", v, "must be in [0, 1)")

    def validate_lagrange_step(self, v: Any) -> None:
        self._positive("lagrange_step", v, zero=True)

    def validate_noise_std(self, v: Any) -> None:
        self._positive("noise_std", v, zero=True)

    def validate_weak_noise_std(self, v: Any) -> None:
        self._positive("weak_noise_std", v, zero=True)

    def validate_mask_coefficients(self, v: Any) -> None:
        if not (isinstance(v, (tuple, list)) and len(v) == 3 and all(_finite(a) and a >= 0 for a in v)):
            raise param_error(self, "mask_coefficients", v,
                              "must be three finite numbers ≥ 0 (update-energy, norm, Lagrange coefficients)")

    def validate_indicator_layer(self, v: Any) -> None:
        if v is not None and not (isinstance(v, str) and v):
            raise param_error(self, "indicator_layer", v, "must be a parameter name of the model or unset")

    def validate_decoy_layer(self, v: Any) -> None:
        if v is not None and not (isinstance(v, str) and v):
            raise param_error(self, "decoy_layer", v, "must be a parameter name of the model or unset")

    def validate_indicator_scale(self, v: Any) -> None:
        if not _finite(v) or v <= 1:
            raise param_error(self, "indicator_scale", v, "must be a finite number > 1")

    def validate_indicator_floor(self, v: Any) -> None:
        self._positive("indicator_floor", v)

    def validate_feedback_threshold(self, v: Any) -> None:
        if not _finite(v) or not 0 <= v < 1:
            raise param_error(self, "feedback_threshold", v, "must be in [0, 1)")

    def validate_clip_ratio(self, v: Any) -> None:
        if not _finite(v) or not 0 < v <= 1:
            raise param_error(self, "clip_ratio", v, "must be in (0, 1]")

    def validate_decoy_threshold(self, v: Any) -> None:
        self._positive("decoy_threshold", v)

    def validate_data(self, v: Any) -> None:
        if v not in ("release", "pooled"):
            raise param_error(self, "data", v, "must be 'release' (the first attacker's data for the backdoor, the "
                              "last one's for the reference and decoys) or 'pooled' (all of them for both)")

    # -- what it is scored on ------------------------------------------------------------
    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """Held-out non-target samples with the trigger, labelled ``target``."""
        return self._backdoor().targeted_test(x, y)

    # -- layers ------------------------------------------------------------------------
    def _layer(self, model: ModelView, name: str | None, field: str, back: int) -> tuple[int, int]:
        """(start, stop) of the named layer, or by role: the ``back``-th last ≥ 2-D weight before
        the output layer, falling back to the last one, then to the output layer's first param."""
        if name is not None:
            for n, a, b, _ in model.layers:
                if n == name:
                    return a, b
            raise param_error(self, field, name, "is not a parameter of the model (has "
                              + ", ".join(n for n, *_ in model.layers) + ")")
        ws = _weight_layers(model)
        if ws:
            lay = ws[-back] if len(ws) >= back else ws[-1]
            return lay[1], lay[2]
        head = model.head[0] if model.head else model.layers[-1][0]
        s = model.span(head)
        return s.start, s.stop

    def _head_rows(self, model: ModelView, classes: int) -> "tuple[torch.Tensor, int] | None":
        """Flat positions ``(classes, h')`` of each output neuron's weights then bias, or ``None``
        when the output weight is not a (classes × inputs) matrix."""
        import torch

        if not model.head:
            return None
        lay = {n: (a, b, s) for n, a, b, s in model.layers}
        a, _, shape = lay[model.head[0]]
        if len(shape) != 2 or shape[0] != classes:
            return None
        h = shape[1]
        rows = a + torch.arange(classes)[:, None] * h + torch.arange(h)[None, :]
        if len(model.head) > 1:
            ba, bb, bshape = lay[model.head[1]]
            if tuple(bshape) == (classes,):
                rows = torch.cat([rows, (ba + torch.arange(classes))[:, None]], dim=1)
        return rows, classes

    # -- the round -------------------------------------------------------------------
    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        import torch

        own = ctx.own_updates
        f = int(own.shape[0])
        if f == 0:
            return own.clone()
        model = ctx.model
        if model is None or len(ctx.own_data) != f:
            raise RedteamError("3dfed needs the model view and the malicious clients' data "
                               "(needs_model): this regime gives neither")
        dev, dtype = own.device, own.dtype
        gen = ctx.generator
        G = ctx.global_params.detach().to(device=dev, dtype=dtype)

        def cat(parts: tuple) -> tuple["torch.Tensor", "torch.Tensor"]:
            xs = torch.cat([d.x for d in parts]).to(dev)
            return (xs.to(dtype) if xs.dtype.is_floating_point else xs), torch.cat([d.y for d in parts]).to(dev)

        # the backdoor's data, and the data of the reference, the curvature and the decoys
        if self.data == "pooled":
            xb, yb = x, y = cat(ctx.own_data)
        else:  # the release: adversary 0 trains the backdoor, the last adversary's loader the rest
            xb, yb = cat(ctx.own_data[:1])
            x, y = cat(ctx.own_data[-1:])
        classes = int(model.num_classes or ctx.num_classes)
        if classes and self.target >= classes:
            raise param_error(self, "target", self.target, f"must be a class of the model (0 … {classes - 1})")
        trig = self._backdoor()
        per = math.prod(x.shape[1:])
        if math.prod(self.image_shape) != per and math.prod(model.input_shape) == per \
                and len(model.input_shape) in (2, 3):
            trig = self._backdoor(tuple(model.input_shape))  # the model's input layout (image_shape unset)
        tx, ty = trig.apply(x, y)
        txb, tyb = trig.apply(xb, yb)

        def draw(a: float, b: float) -> float:
            return a + (b - a) * float(torch.rand((), generator=gen, device=gen.device, dtype=torch.float64))

        # ---- memory: the record of the latest earlier round (a repeated call of a round restarts from it)
        mem = ctx.attack_state.setdefault(STATE_KEY, {"records": []})
        records = [r for r in mem["records"] if r["round"] < ctx.round]
        prev = records[-1] if records else None
        n_alpha = -(-f // self.group_size)
        cap = min(f - 1, self.max_decoys) if self.max_decoys is not None else f - 1
        if prev is None:
            alpha, k, weak = [draw(self.alpha_min, 1.0) for _ in range(n_alpha)], self.initial_decoys, False
            labels: list[str] | None = None
        else:
            alpha, k, weak = list(prev["alpha"]), int(prev["k"]), bool(prev["weak"])
            labels = None
            if prev["round"] == ctx.round - 1 and prev["positions"] is not None and not weak:
                change = (G - prev["global"].to(device=dev, dtype=dtype)).to(torch.float64)
                fb = change[prev["positions"].to(dev)] / (ctx.server_lr * prev["values"].to(dev, torch.float64))
                labels, weak = read_feedback(fb, self.feedback_threshold, self.clip_ratio)
                nb = prev["n_backdoor"]
                groups = [[labels[i] for i in g] for g in prev["groups"]] if not weak else []
                alpha, k = adapt(groups, labels[nb:] if not weak else [], alpha, k, weak, self.group_size,
                                 self.alpha_min, draw)
            elif weak:
                alpha = [0.1] * len(alpha)
            alpha = alpha + [draw(self.alpha_min, 1.0) for _ in range(n_alpha - len(alpha))]
        k = min(max(k, 0), cap)

        # ---- backdoor training with the constrained loss, benign reference, scaling
        w_clean, w_bd, w_con = (float(a) for a in self.loss_weights)

        def bd_loss(w: "torch.Tensor", xb: "torch.Tensor", yb: "torch.Tensor") -> "torch.Tensor":
            loss = w_bd * model.loss(model.forward(w, xb[1]), yb[1])
            if w_clean:
                loss = loss + w_clean * model.loss(model.forward(w, xb[0]), yb[0])
            if w_con:
                loss = loss + w_con * (w - G).norm()
            return loss

        pair_x, pair_y = torch.stack([xb, txb]), torch.stack([yb, tyb])
        idx_all = torch.arange(int(yb.shape[0]), device=dev)

        def bd_loss_idx(w: "torch.Tensor", ib: "torch.Tensor", _yb: "torch.Tensor") -> "torch.Tensor":
            return bd_loss(w, pair_x[:, ib], pair_y[:, ib])

        bd = sgd_train(G, bd_loss_idx, idx_all, idx_all, self.poison_steps, self.batch_size, self.lr,
                       self.momentum, self.weight_decay, gen)

        def ce(w: "torch.Tensor", xb: "torch.Tensor", yb: "torch.Tensor") -> "torch.Tensor":
            return model.loss(model.forward(w, xb), yb)

        benign = sgd_train(G, ce, x, y, self.benign_steps, self.batch_size, self.lr, self.momentum,
                           self.weight_decay, gen)
        delta, delta_b = bd - G, benign - G
        nd, nb_ = float(delta.norm()), float(delta_b.norm())
        scale = max(1.0, min(nb_ / nd, self.weight_scale)) if nd > 0 else 1.0
        delta = delta * scale
        # ---- indicators (one per row: f − k backdoor rows, then k decoys)
        ia, ib = self._layer(model, self.indicator_layer, "indicator_layer", 2)
        positions = None
        if ib - ia >= f:
            analog = (delta[ia:ib].abs() + delta_b[ia:ib].abs()).to(torch.float64)
            curv = self._curvature(model, G, x, y, tx, ty, ia, ib)
            positions = ia + select_indicators(analog, curv, f, self.num_candidates).to(dev)

        # ---- decoy parameters (fewer coordinates than decoys: the rest carry the backdoor)
        spots = None
        if k:
            da, db = self._layer(model, self.decoy_layer, "decoy_layer", 1)
            gap = (delta[da:db] - delta_b[da:db]).abs().to(torch.float64)
            excl = None
            if positions is not None:
                excl = positions[(positions >= da) & (positions < db)] - da
            spots = decoy_positions(gap, k, excl) + da
            k = int(spots.numel())
        f_b = f - k

        # ---- noise masks on the output layer, group by group
        rows = delta.unsqueeze(0).repeat(f_b, 1)
        perm = torch.randperm(f_b, generator=gen, device=gen.device).tolist()
        groups = [perm[s: s + self.group_size] for s in range(0, f_b, self.group_size)]
        head = self._head_rows(model, classes) if classes >= 2 else None
        if head is not None and f_b:
            pos, _ = head
            others = torch.tensor([c for c in range(classes) if c != self.target], dtype=torch.long)
            std = self.weak_noise_std if weak else self.noise_std
            for gi, members in enumerate(groups):
                pick = others[torch.randperm(len(others), generator=gen, device=gen.device).cpu()[: self.num_neurons]]
                cols = pos[pick].to(dev)  # (m, h'): each chosen neuron's weights, then its bias
                init = torch.randn((len(members), *cols.shape), generator=gen, device=gen.device,
                                   dtype=torch.float64).to(dev) * std
                masks = noise_masks(delta[cols].to(torch.float64), len(members), float(alpha[gi]), init,
                                    self.mask_steps, self.mask_lr, self.momentum, self.weight_decay,
                                    tuple(float(c) for c in self.mask_coefficients), self.lagrange_step)
                for j, r in enumerate(members):
                    rows[r, cols.reshape(-1)] += masks[j].reshape(-1).to(dtype)

        # ---- decoy models
        if k:
            dec = torch.stack([train_decoy(G, benign, int(spots[j]), model, x, y, self.benign_steps,
                                           self.batch_size, self.lr, self.momentum, self.weight_decay,
                                           self.decoy_threshold, gen) - G for j in range(k)])
            rows = torch.cat([rows, dec])

        # ---- plant the indicators (after the masks, as the release does)
        values = None
        if positions is not None:
            at = torch.arange(f, device=dev)
            values = implant(rows[at, positions], self.indicator_scale, self.indicator_floor)
            rows[at, positions] = values

        mem["records"] = records[-1:] + [{
            "round": ctx.round, "global": G.detach().clone(), "positions": positions,
            "values": None if values is None else values.detach().clone(),
            "n_backdoor": f_b, "groups": [list(g) for g in groups], "alpha": list(alpha), "k": k, "weak": weak,
            "labels": labels, "scale": scale,
        }]
        return rows.to(dtype)

    def _curvature(self, model: ModelView, G: "torch.Tensor", x: "torch.Tensor", y: "torch.Tensor",
                   tx: "torch.Tensor", ty: "torch.Tensor", a: int, b: int) -> "torch.Tensor":
        """Σ over the clean and triggered batches (in order, ``batch_size``) of the Hessian's row
        sums over layer [a, b): ∂/∂w_p Σ_{q∈layer} ∂L/∂w_q at G."""
        import torch

        total = torch.zeros(b - a, dtype=torch.float64, device=G.device)
        n = int(y.shape[0])
        for xs, ys in ((x, y), (tx, ty)):
            for s in range(0, n, self.batch_size):
                w = G.detach().clone().requires_grad_(True)
                with torch.enable_grad():
                    g = torch.autograd.grad(model.loss(model.forward(w, xs[s: s + self.batch_size]),
                                                       ys[s: s + self.batch_size]), w, create_graph=True)[0]
                    if not g.requires_grad:  # a model linear in w: no curvature
                        continue
                    h = torch.autograd.grad(g[a:b].sum(), w, allow_unused=True)[0]
                if h is not None:
                    total += h[a:b].detach().to(torch.float64)
        return total
