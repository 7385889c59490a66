"""What the gradient-inversion attacks (:mod:`attacks.inversion`) share (not a plugin module):
the gradient an observed update stands for, the labels read off the output layer, the gradient a
guess of the data would produce, and the total-variation prior.

**The observed gradient.** A client that runs one step of plain SGD with learning rate η on a
batch of B samples sends Δ = −η·g, g the gradient of the batch's mean loss at the model it was
sent, so ``g = −Δ / η`` exactly (:func:`observed_gradient`). After K > 1 local steps (FedAvg) Δ is
−η·(g₁ + … + g_K), the gradients at K different points on K batches; ``−Δ / (η·K)``, their mean,
is the usual approximation (Geiping et al. 2020, §6, attack the K-step update by unrolling the
steps instead, which is not done here): the attack then matches a gradient no single batch
produced, and reconstructs worse. A local optimiser other than SGD, weight decay, momentum,
clipping or noise likewise make the observation only an approximation of a gradient.

**Labels** (:func:`infer_labels`). For cross-entropy on softmax outputs the gradient of the
output layer's weight row c is ``Σ_b (p_bc − y_bc)·h_b / B`` with h_b ≥ 0 the layer's input (after
a ReLU or sigmoid). For one sample (B = 1) only the true class has p − y < 0, so its row is the
only one whose entries are all ≤ 0: the class whose row *sum* is smallest is the label (Zhao,
Mopuri & Bilen, "iDLG: Improved Deep Leakage from Gradients", arXiv:2001.02610, 2020; their
release takes ``argmin`` of the row sums). For B > 1 the labels are the B classes whose rows have
the most negative *minimum* entry (Yin, Mallya, Vahdat, Alvarez, Kautz & Molchanov, "See through
Gradients: Image Batch Recovery via GradInversion", CVPR 2021; Geiping's ``breaching`` framework
offers it as ``label_strategy = "yin"``): exact when the B labels are distinct and the inputs
to the layer are non-negative; a batch that repeats a class gets that class once, so at most
its number of distinct labels are recovered.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

from redteam.errors import InvalidParameter
from redteam.types import ModelView, UpdateObservation, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["check_observation", "observed_gradient", "head_weight_gradient", "infer_labels",
           "gradient_of", "total_variation", "initial_guess", "image_view", "INITS"]

#: how the dummy data is drawn: N(0, 1) (``randn``, every release), U[0, 1) (``rand``, the DLG paper's
#: figures start from uniform noise)
INITS = ("randn", "rand")


def check_observation(attack: Any, obs: UpdateObservation) -> None:
    """Refuse, by name, an observation an inversion cannot work on."""
    name = type(attack).__name__
    upd, params, model = obs.update, obs.params, obs.model
    if getattr(upd, "ndim", None) != 1 or getattr(params, "ndim", None) != 1 or upd.shape != params.shape:
        raise InvalidParameter(f"{name}: the observed update and the model must be two (d,) rows of one size, "
                               f"got {tuple(getattr(upd, 'shape', ()))} and {tuple(getattr(params, 'shape', ()))}")
    if model.dim != int(params.shape[0]):
        raise InvalidParameter(f"{name}: the model has {model.dim} parameters, the observed row {int(params.shape[0])}")
    if model.num_classes < 2 or model.input_kind == "tokens":
        raise InvalidParameter(f"{name}: gradient inversion needs a classifier of continuous inputs "
                               f"(input_kind = {model.input_kind!r}, num_classes = {model.num_classes})")
    if not model.head:
        raise InvalidParameter(f"{name}: the model has no linear output layer to read the labels from")
    lr = obs.lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise InvalidParameter(f"{name}: the clients' learning rate must be a finite number > 0, got {lr!r}")
    for field in ("local_steps", "num_samples"):
        v = getattr(obs, field)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidParameter(f"{name}: observation.{field} must be an integer ≥ 1, got {v!r}")


def observed_gradient(obs: UpdateObservation) -> "torch.Tensor":
    """``−update / (lr · local_steps)`` (module docstring: exact for one SGD step)."""
    return -obs.update.detach() / (float(obs.lr) * int(obs.local_steps))


def head_weight_gradient(g: "torch.Tensor", model: ModelView) -> "torch.Tensor":
    """The output layer's weight block of the flat gradient ``g``, as ``(num_classes, k)``."""
    name = model.head[0]
    for n, a, b, shape in model.layers:
        if n == name:
            if len(shape) != 2:
                break
            return g[a:b].reshape(shape)
    raise InvalidParameter(f"the output layer's weight {name!r} is not a (classes, inputs) matrix")


def infer_labels(g: "torch.Tensor", model: ModelView, count: int) -> "torch.Tensor":
    """``(count,)`` int64 labels read from the output layer's weight gradient (module docstring:
    iDLG's row-sum rule for one sample, Yin et al.'s row-minimum rule for more)."""
    import torch

    w = head_weight_gradient(g, model)
    if count == 1:
        return torch.argmin(w.sum(dim=1)).reshape(1).to(torch.int64)
    k = min(count, int(w.shape[0]))
    picked = torch.argsort(w.min(dim=1).values)[:k]
    if k < count:  # more samples than classes: repeat the most negative ones
        picked = picked[torch.arange(count) % k]
    return picked.to(torch.int64)


def gradient_of(model: ModelView, params: "torch.Tensor", x: "torch.Tensor",
                loss: Callable[["torch.Tensor"], "torch.Tensor"]) -> "torch.Tensor":
    """The flat ``(d,)`` gradient, at ``params``, of ``loss(model.forward(params, x))``, kept
    differentiable in ``x`` (and anything ``loss`` closes over): one double-backward graph."""
    import torch

    p = params.detach().requires_grad_(True)
    (gp,) = torch.autograd.grad(loss(model.forward(p, x)), p, create_graph=True)
    return gp


def image_view(x: "torch.Tensor", image_shape: tuple[int, ...]) -> "torch.Tensor":
    """``x`` ``(B, ...)`` as ``(B, C, H, W)`` for an image of ``image_shape`` (``(H, W)`` or ``(C, H, W)``)."""
    shape = tuple(image_shape)
    return x.reshape(x.shape[0], *((1,) + shape if len(shape) == 2 else shape))


def total_variation(img: "torch.Tensor") -> "torch.Tensor":
    """Anisotropic total variation of a ``(B, C, H, W)`` batch, as Geiping et al.'s release
    measures it: the mean |horizontal difference| plus the mean |vertical difference|."""
    dx = (img[..., :, 1:] - img[..., :, :-1]).abs().mean()
    dy = (img[..., 1:, :] - img[..., :-1, :]).abs().mean()
    return dx + dy


def initial_guess(obs: UpdateObservation, init: str) -> "torch.Tensor":
    """``(num_samples, *input_shape)`` dummy data from the observer's generator, on the model's
    device and dtype."""
    import torch

    gen = obs.generator
    shape = (int(obs.num_samples), *obs.model.input_shape)
    draw = torch.randn if init == "randn" else torch.rand
    x = draw(shape, generator=gen, device=gen.device, dtype=torch.float64 if obs.params.dtype == torch.float64
             else torch.float32)
    return x.to(device=obs.params.device, dtype=obs.params.dtype)


def check_init(obj: Any, v: Any) -> None:
    if v not in INITS:
        raise param_error(obj, "init", v, f"must be one of {', '.join(repr(i) for i in INITS)}")
