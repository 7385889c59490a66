"""scikit-learn's bundled 8×8 handwritten digits (1,797 images, 10 classes).

The data ships inside scikit-learn (UCI "Optical Recognition of Handwritten Digits",
Alpaydin & Kaynak 1998), so nothing is downloaded. Pixels (0..16) are scaled to [0, 1],
then optionally standardized with statistics of the training split only
(``standardize``): ``"global"`` subtracts the mean of all training pixels and divides by
their standard deviation (as torchvision's ``Normalize`` with a dataset's mean/std, the
robustness papers' MNIST preprocessing); ``"feature"`` does so per pixel (a pixel that is
constant on the training split is only centred).
The held-out test split is fixed (stratified, 20 %, its own seed) so that every run and
every seed is scored on the same images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ..types import param_error
from ._init import init_module_
from ._split import split_and_standardize
from .base import Dataset, Workload

__all__ = ["Digits"]


class _CNN(torch.nn.Module):
    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc = torch.nn.Linear(2 * channels * 4 * 4, hidden)
        self.out = torch.nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1, 8, 8)
        x = torch.relu(self.conv1(x))
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc(x.flatten(1)))
        return self.out(x)


@dataclass(frozen=True, slots=True)
class Digits(Workload):
    """8×8 digits with an MLP (64-``hidden``-10, ReLU) or a small CNN.

    * ``model``: ``"mlp"`` (default; 4,810 parameters at hidden = 64) or ``"cnn"``;
    * ``hidden``: the model's width (the MLP's hidden layer; the CNN's dense layer);
    * ``standardize``: ``"none"`` (default), ``"global"`` or ``"feature"`` (module docstring);
    * ``test_fraction``: size of the fixed held-out split;
    * ``split_seed``: seed of that split (independent of the run seed on purpose).
    """

    model: Literal["mlp", "cnn"] = "mlp"
    hidden: int = 64
    test_fraction: float = 0.2
    split_seed: int = 0
    standardize: Literal["none", "global", "feature"] = "none"
    summary: ClassVar[str] = "scikit-learn 8×8 digits (bundled), MLP 64-64-10 or small CNN"
    reference: ClassVar[str] = "Alpaydin & Kaynak, UCI optdigits, 1998"
    input_kind: ClassVar[str] = "image"
    image_shape: ClassVar[tuple[int, ...]] = (8, 8)

    def validate_model(self, v: str) -> None:
        if v not in ("mlp", "cnn"):
            raise param_error(self, "model", v, "must be 'mlp' or 'cnn'")

    def validate_hidden(self, v: int) -> None:
        if not (isinstance(v, int) and 1 <= v <= 4096):  # a stated cap: a scenario cannot ask for a huge model
            raise param_error(self, "hidden", v, "must be an integer in [1, 4096]")

    def validate_standardize(self, v: str) -> None:
        if v not in ("none", "global", "feature"):
            raise param_error(self, "standardize", v, "must be 'none', 'global' or 'feature'")

    def validate_test_fraction(self, v: float) -> None:
        if not 0.05 <= v <= 0.9:
            raise param_error(self, "test_fraction", v, "must be in [0.05, 0.9]")

    def load(self, seed: int) -> Dataset:
        from importlib.metadata import version

        import numpy as np

        from .datacache import cached_arrays

        def make() -> dict:
            from sklearn.datasets import load_digits

            bunch = load_digits()
            return {"x": np.asarray(bunch.data, dtype=np.float32) / 16.0, "y": np.asarray(bunch.target, dtype=np.int64)}

        # kept between processes (redteam.workloads.datacache): importing sklearn.datasets cost
        # each process more than a small run
        arrays = cached_arrays("load_digits", {}, {"scikit-learn": version("scikit-learn")}, ("x", "y"), make)
        x, y = arrays["x"], arrays["y"]
        return split_and_standardize(x, y, classes=10, test_fraction=self.test_fraction,
                                     split_seed=self.split_seed, standardize=self.standardize)

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        if self.model == "cnn":
            net: torch.nn.Module = _CNN(8, self.hidden)
        else:
            net = torch.nn.Sequential(
                torch.nn.Linear(64, self.hidden), torch.nn.ReLU(), torch.nn.Linear(self.hidden, 10)
            )
        return init_module_(net, generator)

    def param_count(self) -> int | None:
        """The MLP's 64·h + h + 10·h + 10 (the CNN: not said)."""
        return 75 * self.hidden + 10 if self.model == "mlp" else None
