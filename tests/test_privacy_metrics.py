"""Reconstruction metrics (:mod:`redteam.privacy.reconstruction`): PSNR and SSIM on worked
examples, SSIM against scikit-image where it is installed, the Hungarian matching of a batch, and
label recovery as a multiset."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from redteam.errors import InvalidParameter
from redteam.privacy import gaussian_window, label_recovery, match, psnr, ssim


def test_psnr_of_a_known_mse_by_hand():
    a = torch.zeros(2, 4, dtype=torch.float64)
    b = torch.tensor([[0.1, 0.1, 0.1, 0.1], [0.0, 0.0, 0.0, 0.2]], dtype=torch.float64)
    # image 0: MSE 0.01 → 10·log10(1 / 0.01) = 20 dB; image 1: MSE 0.04 / 4 = 0.01 → 20 dB as well
    assert psnr(a, b, 1.0).tolist() == pytest.approx([20.0, 20.0], abs=1e-9)
    # data range 2: 10·log10(4 / 0.01) = 26.0206 dB
    assert float(psnr(a, b, 2.0)[0]) == pytest.approx(10 * math.log10(400.0), abs=1e-9)
    # an exact copy: infinite, per image (the other image keeps its own value)
    got = psnr(b, torch.stack([b[0], b[1] + 0.1]), 1.0)
    assert math.isinf(float(got[0])) and float(got[1]) == pytest.approx(20.0, abs=1e-9)


def test_psnr_refuses_bad_input():
    with pytest.raises(InvalidParameter, match="data_range = 0"):
        psnr(torch.zeros(1, 4), torch.zeros(1, 4), 0)
    with pytest.raises(InvalidParameter, match="differ in shape"):
        psnr(torch.zeros(1, 4), torch.zeros(2, 4))


def test_ssim_is_one_for_identical_images_and_below_for_others():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 8, 8, generator=g)
    assert ssim(a, a, 1.0).tolist() == pytest.approx([1.0, 1.0, 1.0], abs=1e-12)
    b = (a + 0.1 * torch.randn(3, 8, 8, generator=g)).clamp(0, 1)
    assert (ssim(a, b, 1.0) < 0.99).all()


def test_ssim_of_constant_images_by_hand():
    # flat images have no variance: every window's SSIM is the luminance term alone,
    # (2·μx·μy + C1) / (μx² + μy² + C1) with C1 = (0.01·R)²
    a, b = torch.full((1, 8, 8), 0.2, dtype=torch.float64), torch.full((1, 8, 8), 0.6, dtype=torch.float64)
    c1 = (0.01 * 1.0) ** 2
    want = (2 * 0.2 * 0.6 + c1) / (0.2 ** 2 + 0.6 ** 2 + c1)
    assert float(ssim(a, b, 1.0)[0]) == pytest.approx(want, abs=1e-12)


def _ssim_by_loops(x: np.ndarray, y: np.ndarray, r: float, side: int) -> float:
    """SSIM written out window by window (one grayscale image), the Gaussian built separately."""
    t = np.arange(side) - (side - 1) / 2
    w = np.exp(-(t[:, None] ** 2 + t[None, :] ** 2) / (2 * 1.5 ** 2))
    w /= w.sum()
    c1, c2 = (0.01 * r) ** 2, (0.03 * r) ** 2
    vals = []
    for i in range(x.shape[0] - side + 1):
        for j in range(x.shape[1] - side + 1):
            px, py = x[i:i + side, j:j + side], y[i:i + side, j:j + side]
            mx, my = (w * px).sum(), (w * py).sum()
            vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
            cxy = (w * (px - mx) * (py - my)).sum()
            vals.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
    return float(np.mean(vals))


def test_ssim_on_the_8x8_digits_uses_a_7x7_window():
    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, 64, generator=g, dtype=torch.float64)
    b = (a + 0.2 * torch.randn(2, 64, generator=g, dtype=torch.float64)).clamp(0, 1)
    got = ssim(a, b, 1.0, image_shape=(8, 8))
    for i in range(2):
        want = _ssim_by_loops(a[i].reshape(8, 8).numpy(), b[i].reshape(8, 8).numpy(), 1.0, 7)
        assert float(got[i]) == pytest.approx(want, abs=1e-12)
    # the 11×11 window the image cannot hold is not what was used
    assert float(got[0]) != pytest.approx(_ssim_by_loops(a[0].reshape(8, 8).numpy(), b[0].reshape(8, 8).numpy(), 1.0, 5),
                                          abs=1e-6)
    assert torch.allclose(gaussian_window(7).sum(), torch.tensor(1.0, dtype=torch.float64))


@pytest.mark.parametrize("shape, channel_axis", [((2, 11, 11), None), ((2, 24, 20), None), ((2, 3, 16, 18), 0)])
def test_ssim_matches_scikit_image(shape, channel_axis):
    metrics = pytest.importorskip("skimage.metrics")
    g = torch.Generator().manual_seed(2)
    a = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    b = a + 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
    got = ssim(a, b, 2.0)
    for i in range(shape[0]):
        want = metrics.structural_similarity(a[i].numpy(), b[i].numpy(), data_range=2.0, gaussian_weights=True,
                                             sigma=1.5, use_sample_covariance=False, channel_axis=channel_axis)
        assert float(got[i]) == pytest.approx(float(want), abs=1e-10)


def test_ssim_refuses_a_flat_batch_without_a_shape():
    with pytest.raises(InvalidParameter, match="give image_shape"):
        ssim(torch.zeros(1, 64), torch.zeros(1, 64))
    with pytest.raises(InvalidParameter, match="image_shape = \\[7, 7\\]"):
        ssim(torch.zeros(1, 64), torch.zeros(1, 64), image_shape=(7, 7))


def test_match_undoes_a_permutation():
    g = torch.Generator().manual_seed(3)
    truth = torch.rand(5, 64, generator=g)
    perm = torch.tensor([3, 0, 4, 1, 2])
    recon = truth[perm] + 0.01 * torch.randn(5, 64, generator=g)
    m = match(recon, truth, 1.0)
    assert m.truth.tolist() == [0, 1, 2, 3, 4]
    # truth[i] was reconstructed at the position where perm holds i
    assert m.recon.tolist() == torch.argsort(perm).tolist()
    assert torch.allclose(m.psnr, psnr(recon[m.recon], truth, 1.0))
    # order by index would pair wrong images: far lower PSNR
    assert m.mean_psnr() > float(psnr(recon, truth, 1.0).mean()) + 10


def test_match_maximises_the_total_not_greedily():
    # on a line: t0 = 0, t1 = 0.15, r0 = 0.05, r1 = −0.1. The closest pair is (r0, t0) (0.05 apart),
    # which greedy would take, leaving (r1, t1) 0.25 apart; the other pairing, (r0, t1) and (r1, t0),
    # both 0.1 apart, has the larger total PSNR: −20·log10(0.1·0.1) > −20·log10(0.05·0.25)
    truth = torch.tensor([[0.0], [0.15]], dtype=torch.float64)
    recon = torch.tensor([[0.05], [-0.1]], dtype=torch.float64)
    m = match(recon, truth, 1.0)
    assert m.truth.tolist() == [0, 1] and m.recon.tolist() == [1, 0]
    assert m.psnr.tolist() == pytest.approx([20.0, 20.0], abs=1e-9)
    assert float(m.psnr.sum()) > float(psnr(recon, truth, 1.0).sum())


def test_match_ranks_an_exact_copy_first_and_handles_unequal_sizes():
    truth = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5]])
    recon = torch.tensor([[1.0, 1.0]])  # one reconstruction, an exact copy of truth 1
    m = match(recon, truth, 1.0)
    assert m.recon.tolist() == [0] and m.truth.tolist() == [1] and math.isinf(float(m.psnr[0]))
    with pytest.raises(InvalidParameter, match="same sample shape"):
        match(torch.zeros(2, 3), torch.zeros(2, 4))


def test_label_recovery_counts_a_multiset():
    assert label_recovery(torch.tensor([3, 1, 1]), torch.tensor([1, 3, 1])) == 1.0
    # one 3 found for two true 3s: 2 of 3
    assert label_recovery(torch.tensor([3, 1, 7]), torch.tensor([3, 3, 1])) == pytest.approx(2 / 3)
    assert label_recovery(torch.tensor([5]), torch.tensor([4])) == 0.0
    with pytest.raises(InvalidParameter, match="integer class indices"):
        label_recovery(torch.tensor([0.5]), torch.tensor([0]))
