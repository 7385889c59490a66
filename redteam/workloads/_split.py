"""The fixed held-out split and the standardisation the image workloads share."""

from __future__ import annotations

from typing import Any

import torch

from .base import Dataset

__all__ = ["split_and_standardize"]


def split_and_standardize(x: Any, y: Any, *, classes: int, test_fraction: float, split_seed: int,
                          standardize: str, source: str = "") -> Dataset:
    """A :class:`Dataset` from float32 pixels ``x`` (N, D) in [0, 1] and int64 labels ``y``:
    a stratified held-out split drawn by hand from its own seed (``split_seed``, independent of
    the run seed and of any library's RNG use: every run is scored on the same images), then
    ``standardize``: ``"global"`` subtracts the training pixels' mean and divides by their
    standard deviation, ``"feature"`` does so per pixel (a pixel constant on the training split
    is only centred), ``"none"`` leaves the pixels as they are."""
    import numpy as np

    rng = np.random.default_rng(split_seed)
    test_idx = []
    for c in range(classes):
        members = np.flatnonzero(y == c)
        k = int(round(test_fraction * len(members)))
        test_idx.append(rng.permutation(members)[:k])
    test = np.sort(np.concatenate(test_idx))
    train = np.setdiff1d(np.arange(len(y)), test)
    if standardize == "global":
        mu, sd = x[train].mean(dtype=np.float64), x[train].std(dtype=np.float64)
        x = ((x - mu) / sd).astype(np.float32)
    elif standardize == "feature":
        mu, sd = x[train].mean(0, dtype=np.float64), x[train].std(0, dtype=np.float64)
        x = ((x - mu) / np.where(sd > 0, sd, 1.0)).astype(np.float32)
    return Dataset(torch.from_numpy(x[train]), torch.from_numpy(y[train]), torch.from_numpy(x[test]),
                   torch.from_numpy(y[test]), num_classes=classes, source=source)
