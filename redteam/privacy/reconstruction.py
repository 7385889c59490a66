"""How close a reconstruction is to the data it was made from: PSNR, SSIM, the assignment of
reconstructions to true samples, and the share of labels recovered.

* :func:`psnr`: peak signal-to-noise ratio per image, ``10·log10(R² / MSE)`` with R the data
  range (infinite for an exact copy), as gradient-inversion papers report it (Geiping et al.,
  "Inverting Gradients", NeurIPS 2020, score each image of a batch this way and average);
* :func:`ssim`: the structural similarity index of Wang, Bovik, Sheikh & Simoncelli, "Image
  Quality Assessment: From Error Visibility to Structural Similarity", IEEE TIP 13(4), 2004:
  local means, variances and covariance under an 11×11 Gaussian window (σ = 1.5) normalised to
  sum 1, ``K1 = 0.01``, ``K2 = 0.03``, population (not sample) statistics, the map over the
  positions where the window fits inside the image ("valid"), averaged; per channel, then the
  channels' mean (scikit-image's ``structural_similarity(..., gaussian_weights=True, sigma=1.5,
  use_sample_covariance=False)`` computes the same for images of 11 pixels a side or more, which
  the tests check). **Small images**: the window never exceeds the image: its side is the largest
  odd number ≤ min(11, H, W), the same σ = 1.5 Gaussian truncated there and renormalised (7×7 on the
  8×8 digits, leaving a 2×2 map). scikit-image cannot be asked for that (its Gaussian is always
  11 taps), so there it is checked against SSIM written out window by window;
* :func:`match`: which reconstruction stands for which true sample: the one-to-one assignment
  that maximises the total PSNR (Hungarian method, ``scipy.optimize.linear_sum_assignment``), as
  batch-inversion papers score a batch whose order the attack cannot know;
* :func:`label_recovery`: the share of the true labels found, as a multiset (two 3s recovered
  once count once).

Images come as ``(B, H, W)`` or ``(B, C, H, W)``; a flat ``(B, D)`` batch (a workload whose model
reads flattened pixels, as the digits MLP does) is given its shape with ``image_shape``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import InvalidParameter

if TYPE_CHECKING:
    import torch

__all__ = ["psnr", "ssim", "match", "Match", "label_recovery", "as_images", "gaussian_window",
           "SSIM_SIGMA", "SSIM_WINDOW", "SSIM_K1", "SSIM_K2"]

#: Wang et al. (2004)'s window: 11×11 Gaussian, σ = 1.5, and their constants
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1 = 0.01
SSIM_K2 = 0.03


def _check_range(data_range: Any) -> float:
    if (isinstance(data_range, bool) or not isinstance(data_range, (int, float))
            or not math.isfinite(data_range) or data_range <= 0):
        raise InvalidParameter(f"data_range = {data_range!r}: must be a finite number > 0 "
                               "(the span of the pixel values, e.g. 1.0 for pixels in [0, 1])")
    return float(data_range)


def _pair(a: "torch.Tensor", b: "torch.Tensor", what: str) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise InvalidParameter(f"{what}: the two batches differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.ndim < 2 or a.shape[0] == 0:
        raise InvalidParameter(f"{what}: expected a non-empty batch (B, ...), got shape {tuple(a.shape)}")


def as_images(x: "torch.Tensor", image_shape: Sequence[int] | None = None) -> "torch.Tensor":
    """``x`` ``(B, ...)`` as ``(B, C, H, W)``: ``(B, H, W)`` gains a channel; a flat ``(B, D)``
    batch takes ``image_shape`` (``(H, W)`` or ``(C, H, W)``, with as many pixels as D)."""
    if image_shape is not None:
        shape = tuple(int(s) for s in image_shape)
        if len(shape) not in (2, 3) or math.prod(shape) != math.prod(x.shape[1:]):
            raise InvalidParameter(f"image_shape = {list(shape)}: must be (H, W) or (C, H, W) with "
                                   f"{math.prod(x.shape[1:])} values, the size of one sample {tuple(x.shape[1:])}")
        x = x.reshape(x.shape[0], *shape)
    if x.ndim == 3:
        x = x.unsqueeze(1)
    if x.ndim != 4:
        raise InvalidParameter(f"expected images (B, H, W) or (B, C, H, W), got shape {tuple(x.shape)}; "
                               "give image_shape for a flat (B, D) batch")
    return x


def psnr(a: "torch.Tensor", b: "torch.Tensor", data_range: float = 1.0) -> "torch.Tensor":
    """PSNR of each image of ``a`` against the same-index image of ``b``: ``(B,)`` float64 in dB,
    ``10·log10(data_range² / mean((a − b)²))`` over all of an image's values; ``inf`` where the
    two are equal. Any shape ``(B, ...)``."""
    import torch

    r = _check_range(data_range)
    _pair(a, b, "psnr")
    diff = a.detach().to(torch.float64) - b.detach().to(torch.float64)
    mse = diff.reshape(diff.shape[0], -1).pow(2).mean(dim=1)
    return 10.0 * torch.log10(r * r / mse)  # mse = 0 → +inf


def gaussian_window(side: int, sigma: float = SSIM_SIGMA) -> "torch.Tensor":
    """The ``(side, side)`` Gaussian weights (float64, summing to 1) of SSIM's local statistics."""
    import torch

    if side < 1 or side % 2 == 0:
        raise InvalidParameter(f"window side = {side}: must be an odd integer ≥ 1")
    t = torch.arange(side, dtype=torch.float64) - (side - 1) / 2
    g = torch.exp(-(t * t) / (2.0 * sigma * sigma))
    w = g[:, None] * g[None, :]
    return w / w.sum()


def ssim(a: "torch.Tensor", b: "torch.Tensor", data_range: float = 1.0, *,
         image_shape: Sequence[int] | None = None, window: int = SSIM_WINDOW) -> "torch.Tensor":
    """Mean SSIM of each image of ``a`` against the same-index image of ``b``: ``(B,)`` float64 in
    [−1, 1] (module docstring: Wang et al.'s Gaussian window, shrunk to the largest odd side that
    fits the image, per-channel maps averaged). 1 exactly for identical images."""
    import torch
    import torch.nn.functional as F

    r = _check_range(data_range)
    _pair(a, b, "ssim")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise InvalidParameter(f"window = {window!r}: must be an odd integer ≥ 1")
    x = as_images(a.detach().to(torch.float64), image_shape)
    y = as_images(b.detach().to(torch.float64), image_shape)
    bsz, ch, h, w = x.shape
    side = min(window, h, w)
    side -= 1 - side % 2  # the largest odd side that fits
    kern = gaussian_window(side).to(x.device)[None, None].expand(ch, 1, side, side)

    def blur(t: "torch.Tensor") -> "torch.Tensor":
        return F.conv2d(t, kern, groups=ch)  # "valid": the window inside the image only

    mu_x, mu_y = blur(x), blur(y)
    var_x = blur(x * x) - mu_x * mu_x
    var_y = blur(y * y) - mu_y * mu_y
    cov = blur(x * y) - mu_x * mu_y
    c1, c2 = (SSIM_K1 * r) ** 2, (SSIM_K2 * r) ** 2
    smap = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x * mu_x + mu_y * mu_y + c1) * (var_x + var_y + c2))
    return smap.reshape(bsz, -1).mean(dim=1)


@dataclass(frozen=True, slots=True)
class Match:
    """The assignment of :func:`match`: reconstruction ``recon[i]`` stands for true sample
    ``truth[i]`` (two ``(k,)`` int64 index tensors, k = min of the two batch sizes, ``truth``
    ascending), with the ``(k,)`` PSNR of each pair."""

    recon: "torch.Tensor"
    truth: "torch.Tensor"
    psnr: "torch.Tensor"

    def mean_psnr(self) -> float:
        return float(self.psnr.mean())


def match(recon: "torch.Tensor", truth: "torch.Tensor", data_range: float = 1.0) -> Match:
    """Assign each reconstruction to a distinct true sample so that the total PSNR is largest
    (``scipy.optimize.linear_sum_assignment`` on the ``(B_r, B_t)`` PSNR matrix); both batches
    ``(B, ...)`` with the same sample shape, the sizes may differ (the smaller one is matched in
    full). An exact copy's infinite PSNR is ranked above every finite one."""
    import numpy as np
    import torch
    from scipy.optimize import linear_sum_assignment

    r = _check_range(data_range)
    if recon.ndim < 2 or truth.ndim < 2 or tuple(recon.shape[1:]) != tuple(truth.shape[1:]):
        raise InvalidParameter(f"match: reconstructions {tuple(recon.shape)} and true samples "
                               f"{tuple(truth.shape)} must be batches (B, ...) of the same sample shape")
    if recon.shape[0] == 0 or truth.shape[0] == 0:
        raise InvalidParameter("match: empty batch")
    xr = recon.detach().to(torch.float64).reshape(recon.shape[0], -1)
    xt = truth.detach().to(torch.float64).reshape(truth.shape[0], -1)
    mse = torch.cdist(xr, xt).pow(2) / xr.shape[1]
    table = 10.0 * torch.log10(r * r / mse)
    score = table.cpu().numpy()
    finite = np.isfinite(score)
    # an exact copy (inf) outranks any finite pair; NaN (a non-finite reconstruction) ranks last
    top = float(np.abs(score[finite]).max()) if finite.any() else 0.0
    score = np.where(np.isposinf(score), 4 * top + 1e6, np.where(finite, score, -(4 * top + 1e6)))
    rows, cols = linear_sum_assignment(score, maximize=True)
    order = np.argsort(cols)
    ri = torch.as_tensor(rows[order], dtype=torch.int64)
    ci = torch.as_tensor(cols[order], dtype=torch.int64)
    return Match(recon=ri, truth=ci, psnr=table[ri, ci])


def label_recovery(pred_labels: "torch.Tensor", true_labels: "torch.Tensor") -> float:
    """The share of ``true_labels`` (B,) that ``pred_labels`` names, counted as multisets:
    ``Σ_c min(#pred = c, #true = c) / B``. Order does not matter."""
    import torch

    p = torch.as_tensor(pred_labels).reshape(-1)
    t = torch.as_tensor(true_labels).reshape(-1)
    if t.numel() == 0:
        raise InvalidParameter("label_recovery: no true labels")
    for name, v in (("pred_labels", p), ("true_labels", t)):
        if v.dtype.is_floating_point or v.dtype == torch.bool or (v.numel() and int(v.min()) < 0):
            raise InvalidParameter(f"label_recovery: {name} must be integer class indices ≥ 0, "
                                   f"got dtype {v.dtype}")
    n = int(max(int(p.max()) if p.numel() else 0, int(t.max()))) + 1
    common = torch.minimum(torch.bincount(p.to(torch.int64), minlength=n), torch.bincount(t.to(torch.int64), minlength=n))
    return float(common.sum()) / t.numel()
