"""Synthetic classification (scikit-learn's ``make_classification``) with logistic regression.

Guyon's Madelon-style generator (Guyon, "Design of experiments for the NIPS 2003
variable selection benchmark", 2003) as implemented by scikit-learn: clusters of points
on the vertices of a hypercube, informative plus redundant features. Fast and
seed-determined: the data itself is drawn from ``data_seed`` (fixed by default, so every
run sees the same task).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..types import param_error
from ._init import init_module_
from .base import Dataset, Workload

__all__ = ["Synthetic"]


@dataclass(frozen=True, slots=True)
class Synthetic(Workload):
    """``make_classification`` data, multinomial logistic regression (one linear layer)."""

    samples: int = 4000
    features: int = 20
    informative: int = 10
    classes: int = 4
    class_sep: float = 1.0
    test_fraction: float = 0.2
    data_seed: int = 0
    summary: ClassVar[str] = "make_classification data with logistic regression (fast tests)"
    reference: ClassVar[str] = "Guyon 2003 via scikit-learn make_classification"
    input_kind: ClassVar[str] = "tabular"

    def validate_samples(self, v: int) -> None:
        if not 20 <= v <= 10**6:
            raise param_error(self, "samples", v, "must be in [20, 10**6]")

    def validate_features(self, v: int) -> None:
        if not 2 <= v <= 10**4:
            raise param_error(self, "features", v, "must be in [2, 10**4]")
        if self.samples * v > 2**26:  # the generated matrix, float64 while it is drawn: ≤ 512 MiB
            raise param_error(self, "features", v, f"samples × features must be ≤ 2**26 (samples = {self.samples})")

    def validate_informative(self, v: int) -> None:
        if not 1 <= v <= self.features:
            raise param_error(self, "informative", v, f"must be in [1, features = {self.features}]")

    def validate_classes(self, v: int) -> None:
        if v < 2 or v > min(2**self.informative, 1000):
            raise param_error(self, "classes", v, "must be ≥ 2 and ≤ min(2**informative, 1000)")

    def validate_test_fraction(self, v: float) -> None:
        if not 0.05 <= v <= 0.9:
            raise param_error(self, "test_fraction", v, "must be in [0.05, 0.9]")

    def load(self, seed: int) -> Dataset:
        from importlib.metadata import version

        from .datacache import cached_arrays

        args = dict(n_samples=self.samples, n_features=self.features, n_informative=self.informative,
                    n_redundant=min(2, self.features - self.informative), n_classes=self.classes,
                    n_clusters_per_class=1, class_sep=self.class_sep, random_state=self.data_seed)

        def make() -> dict:
            import numpy as np
            from sklearn.datasets import make_classification

            x, y = make_classification(**args)
            return {"x": x.astype(np.float32), "y": y.astype(np.int64)}

        # kept between processes: importing sklearn.datasets cost each process more than a small run
        arrays = cached_arrays("make_classification", args, {"scikit-learn": version("scikit-learn")}, ("x", "y"), make)
        x, y = arrays["x"], arrays["y"]
        n_test = int(round(self.test_fraction * len(y)))
        return Dataset(
            torch.from_numpy(x[n_test:]),
            torch.from_numpy(y[n_test:]),
            torch.from_numpy(x[:n_test]),
            torch.from_numpy(y[:n_test]),
            num_classes=self.classes,
        )

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        return init_module_(torch.nn.Linear(self.features, self.classes), generator)

    def param_count(self) -> int:
        return self.features * self.classes + self.classes
