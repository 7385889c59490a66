"""The papers' datasets, from files the user has, with the papers' models.

Each workload reads a standard on-disk distribution with :mod:`redteam.workloads.files`
(verified against the published SHA-256 digests where they exist; nothing is downloaded:
``redteam data fetch NAME --dir DIR`` does that for a user with a network) and trains one of
:mod:`redteam.workloads.nets`'s models across clients as one batch.

* ``cifar10`` / ``cifar100``: the CIFAR binary distribution (Krizhevsky 2009); 50,000 training
  and the official 10,000 test images, 3×32×32. Model ``resnet18`` (default, the CIFAR variant),
  ``vgg11`` … ``vgg19`` or ``lenet5``; ``norm`` (``"group"`` by default: GroupNorm, see
  :mod:`.nets` for why; ``"batch"`` uses batch statistics in training and evaluation; ``"none"``).
* ``mnist``: IDX files — ``variant = "mnist"`` (LeCun et al. 1998; 60,000 / 10,000),
  ``"fashion_mnist"`` (Xiao, Rasul & Vollgraf 2017) or ``"emnist_<split>"`` (Cohen et al. 2017,
  e.g. ``emnist_balanced``). Model ``cnn2`` (McMahan et al. 2017's CNN; 10 classes only),
  ``lenet5`` (default), ``cnn_example`` (the bucketing paper's code's CNN, PyTorch's MNIST
  example, without its dropout) or ``mlp`` (McMahan et al.'s 2NN, 784-200-200-C).
* ``fmnist``: Fashion-MNIST, the ``mnist`` workload's ``fashion_mnist`` variant, which also
  finds Debian's ``dataset-fashion-mnist`` package (what CI installs).
* ``femnist``: LEAF's FEMNIST JSON (Caldas et al., "LEAF: A Benchmark for Federated Settings",
  2018): 62 classes of handwritten characters, one group per writer, so ``partition =
  "natural"`` gives each client whole writers (with as many clients as writers, one each).
  Pixels are LEAF's (background 1.0, ink 0.0). Model ``lenet5`` (default) or ``mlp``.
* ``shakespeare``: LEAF's Shakespeare JSON: 80-character windows of a speaking role's lines and
  the next character, over LEAF's 80-symbol alphabet; one group per role (``partition =
  "natural"``). Model: :class:`~.nets.CharLSTM` (8-dim embedding, two LSTM layers of 256 units;
  ``hidden`` / ``layers`` shrink it), predicting the character after each window; accuracy is
  next-character accuracy, as LEAF reports it.

Common parameters: ``dir`` (the dataset's directory; unset: ``$REDTEAM_DATA_DIR/<workload>``),
``train_limit`` / ``test_limit`` (a fixed, stratified subset of the training pool / test set,
for quick runs on a CPU: 0 = all; the subset's seed is ``split_seed``, independent of the run's
seed), ``standardize`` (images: ``"channel"`` — per-channel mean and standard deviation of the
training images, the papers' ``transforms.Normalize``; ``"global"``; ``"none"``: [0, 1]).
No augmentation: the papers' random crops and flips are not applied (say so when comparing
with their tables). The dataset's content digest is in :attr:`Dataset.source`, so a result
names the bytes it was measured on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from ..errors import InvalidParameter
from ..types import param_error
from .base import Dataset, Workload
from .mnist import _ExampleCNN

__all__ = ["CIFAR10", "CIFAR100", "MNISTFiles", "FashionMNIST", "FEMNIST", "Shakespeare"]


def _where(workload: str, given: str | None) -> Path:
    from ..requirements import data_dir_for

    d = data_dir_for(workload, {"dir": given} if given else None)
    if d is None:
        raise InvalidParameter(f"workload {workload}: no data directory: give dir = \"PATH\" or set REDTEAM_DATA_DIR "
                               f"to a directory holding {workload}/ (redteam data fetch {workload} --dir PATH; "
                               "nothing is downloaded at run time)")
    return d


def _stamp(p: Path) -> float:
    try:
        return max((q.stat().st_mtime for q in p.rglob("*") if q.is_file()), default=p.stat().st_mtime)
    except OSError:
        return 0.0


@functools.lru_cache(maxsize=4)
def _read(kind: str, directory: str, name: str, stamp: float) -> Any:
    """A reader's result, cached per (directory, dataset, newest file time): a matrix's runs
    in one process read the files once."""
    from . import files

    if kind == "cifar":
        return files.read_cifar(directory, name)  # type: ignore[arg-type]
    if kind == "idx":
        return files.read_idx(directory, name)  # type: ignore[arg-type]
    if kind == "femnist":
        return files.read_leaf_femnist(directory)
    return files.read_leaf_shakespeare(directory)


def _subset(y: torch.Tensor, limit: int, seed: int) -> torch.Tensor:
    """Indices of a fixed stratified subset of ``limit`` items (all when 0 or ≥ len)."""
    n = int(y.shape[0])
    if limit <= 0 or limit >= n:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    # stratified: take items class by class in proportion, by walking a label-sorted permutation
    order = perm[torch.argsort(y[perm], stable=True)]
    step = n / limit
    picks = (torch.arange(limit, dtype=torch.float64) * step).long()
    return torch.sort(order[picks]).values


def _images(raw: Any, *, standardize: str, train_limit: int, test_limit: int, seed: int,
            groups: bool = False, invert: bool = False) -> Dataset:
    tr = _subset(raw.train_y, train_limit, seed)
    te = _subset(raw.test_y, test_limit, seed + 1)
    x = raw.train_x[tr].to(torch.float32) / 255.0
    tx = raw.test_x[te].to(torch.float32) / 255.0
    if invert:
        x, tx = 1.0 - x, 1.0 - tx
    if standardize == "channel":
        mean = x.mean(dim=(0, 2, 3), keepdim=True)
        std = x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
        x, tx = (x - mean) / std, (tx - mean) / std
    elif standardize == "global":
        mean, std = x.mean(), x.std().clamp_min(1e-6)
        x, tx = (x - mean) / std, (tx - mean) / std
    g = raw.groups[tr].to(torch.int64) if groups and raw.groups is not None else None
    return Dataset(x.contiguous(), raw.train_y[tr].to(torch.int64), tx.contiguous(), raw.test_y[te].to(torch.int64),
                   int(raw.num_classes), g, f"{raw.source} (train {len(tr)}, test {len(te)})")


class _MLP(torch.nn.Module):
    """McMahan et al.'s 2NN: flatten → dense 200 → ReLU → dense 200 → ReLU → classes."""

    def __init__(self, inputs: int, classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(inputs, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.out = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1)
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _image_model(model: str, *, classes: int, channels: int, size: int, norm: str | None, width: int | None,
                 groups: int | None, generator: torch.Generator) -> torch.nn.Module:
    from ._init import init_module_
    from .nets import build_net

    if model == "mlp":
        return init_module_(_MLP(channels * size * size, classes), generator)
    if model == "cnn_example":
        return init_module_(_ExampleCNN(classes), generator)
    extra: dict[str, int] = {}
    if width is not None and model in ("resnet18", "vgg11", "vgg13", "vgg16", "vgg19"):
        extra["width"] = width
    if groups is not None and model != "cnn2":
        extra["groups"] = groups
    return build_net(model, num_classes=classes, in_channels=channels, image_size=size, norm=norm,
                     generator=generator, **extra)


def _check_common(w: Any) -> None:
    for name in ("train_limit", "test_limit"):
        v = getattr(w, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(w, name, v, "must be an integer ≥ 0 (0 = all)")
    if w.dir is not None and (not isinstance(w.dir, str) or not w.dir):
        raise param_error(w, "dir", w.dir, "must be a directory path")
    for name in ("width", "groups"):
        v = getattr(w, name, None)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise param_error(w, name, v, "must be an integer ≥ 1")


@dataclass(frozen=True, slots=True)
class CIFAR10(Workload):
    """CIFAR-10 from its binary distribution, with the CIFAR ResNet-18 (module docstring)."""

    dir: str | None = None
    model: Literal["resnet18", "vgg11", "vgg13", "vgg16", "vgg19", "lenet5", "mlp"] = "resnet18"
    norm: Literal["group", "batch", "none"] | None = None
    width: int | None = None
    groups: int | None = None
    standardize: Literal["channel", "global", "none"] = "channel"
    train_limit: int = 0
    test_limit: int = 0
    split_seed: int = 0
    summary: ClassVar[str] = "CIFAR-10 from the binary files in dir (ResNet-18 / VGG / LeNet-5)"
    reference: ClassVar[str] = "Krizhevsky 2009; He et al., CVPR 2016 (ResNet-18, CIFAR variant)"
    input_kind: ClassVar[str] = "image"
    image_shape: ClassVar[tuple[int, ...]] = (3, 32, 32)
    _dataset: ClassVar[str] = "cifar10"

    def validate_dir(self, v: Any) -> None:
        _check_common(self)

    def load(self, seed: int) -> Dataset:
        d = _where(self._dataset, self.dir)
        raw = _read("cifar", str(d), self._dataset, _stamp(d))
        return _images(raw, standardize=self.standardize, train_limit=self.train_limit, test_limit=self.test_limit,
                       seed=self.split_seed)

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        classes = 100 if self._dataset == "cifar100" else 10
        return _image_model(self.model, classes=classes, channels=3, size=32, norm=self.norm, width=self.width,
                            groups=self.groups, generator=generator)


@dataclass(frozen=True, slots=True)
class CIFAR100(CIFAR10):
    """CIFAR-100 (fine labels) from its binary distribution."""

    summary: ClassVar[str] = "CIFAR-100 from the binary files in dir (ResNet-18 / VGG / LeNet-5)"
    _dataset: ClassVar[str] = "cifar100"


@dataclass(frozen=True, slots=True)
class MNISTFiles(Workload):
    """MNIST, Fashion-MNIST or EMNIST from IDX files (module docstring)."""

    dir: str | None = None
    variant: str = "mnist"
    model: Literal["lenet5", "cnn2", "cnn_example", "mlp"] = "lenet5"
    standardize: Literal["channel", "global", "none"] = "global"
    train_limit: int = 0
    test_limit: int = 0
    split_seed: int = 0
    summary: ClassVar[str] = "MNIST / Fashion-MNIST / EMNIST from IDX files in dir (LeNet-5, McMahan's CNN, 2NN)"
    reference: ClassVar[str] = "LeCun et al. 1998; Xiao et al. 2017; Cohen et al. 2017; McMahan et al., AISTATS 2017"
    input_kind: ClassVar[str] = "image"
    image_shape: ClassVar[tuple[int, ...]] = (1, 28, 28)

    def validate_variant(self, v: Any) -> None:
        _check_common(self)
        if not isinstance(v, str) or not (v in ("mnist", "fashion_mnist") or v.startswith("emnist_")):
            raise param_error(self, "variant", v, 'must be "mnist", "fashion_mnist" or "emnist_<split>"')

    def _raw(self) -> Any:
        # $REDTEAM_DATA_DIR/mnist, /fashion_mnist or /emnist (one folder for every EMNIST split)
        d = _where("emnist" if self.variant.startswith("emnist_") else self.variant, self.dir)
        return _read("idx", str(d), self.variant, _stamp(d))

    def load(self, seed: int) -> Dataset:
        return _images(self._raw(), standardize=self.standardize, train_limit=self.train_limit,
                       test_limit=self.test_limit, seed=self.split_seed)

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        classes = 10 if self.variant in ("mnist", "fashion_mnist") else int(self._raw().num_classes)
        if self.model == "cnn2" and classes != 10:
            raise InvalidParameter(f"workload mnist: model cnn2 has 10 outputs; {self.variant} has {classes} classes "
                                   "(use lenet5 or mlp)")
        return _image_model(self.model, classes=classes, channels=1, size=28, norm=None, width=None, groups=None,
                            generator=generator)


@dataclass(frozen=True, slots=True)
class FashionMNIST(MNISTFiles):
    """Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) from its IDX files: the ``mnist`` workload with
    ``variant = "fashion_mnist"``. Without ``dir`` or ``$REDTEAM_DATA_DIR/fashion_mnist`` it reads
    Debian's package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``, recompressed:
    verified by the content digests of :mod:`.digests`)."""

    variant: str = "fashion_mnist"
    summary: ClassVar[str] = "Fashion-MNIST from IDX files (dir, $REDTEAM_DATA_DIR or Debian's dataset-fashion-mnist)"
    reference: ClassVar[str] = "Xiao, Rasul & Vollgraf, Fashion-MNIST, arXiv:1708.07747, 2017"

    def validate_variant(self, v: Any) -> None:
        if v != "fashion_mnist":
            raise param_error(self, "variant", v, 'is "fashion_mnist" here (the mnist workload reads the others)')


@dataclass(frozen=True, slots=True)
class FEMNIST(Workload):
    """LEAF's FEMNIST: 62 classes, one group per writer (``partition = "natural"``)."""

    dir: str | None = None
    model: Literal["lenet5", "mlp"] = "lenet5"
    standardize: Literal["channel", "global", "none"] = "none"
    train_limit: int = 0
    test_limit: int = 0
    split_seed: int = 0
    summary: ClassVar[str] = "LEAF FEMNIST (62 classes, natural partition by writer) from JSON in dir"
    reference: ClassVar[str] = "Caldas et al., LEAF: A Benchmark for Federated Settings, 2018"
    input_kind: ClassVar[str] = "image"
    image_shape: ClassVar[tuple[int, ...]] = (1, 28, 28)

    def validate_dir(self, v: Any) -> None:
        _check_common(self)

    def load(self, seed: int) -> Dataset:
        d = _where("femnist", self.dir)
        raw = _read("femnist", str(d), "femnist", _stamp(d))
        return _images(raw, standardize=self.standardize, train_limit=self.train_limit, test_limit=self.test_limit,
                       seed=self.split_seed, groups=True)

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        return _image_model(self.model, classes=62, channels=1, size=28, norm=None, width=None, groups=None,
                            generator=generator)


@dataclass(frozen=True, slots=True)
class Shakespeare(Workload):
    """LEAF's Shakespeare: next character after an 80-character window, one group per role."""

    dir: str | None = None
    embed: int = 8
    hidden: int = 256
    layers: int = 2
    train_limit: int = 0
    test_limit: int = 0
    split_seed: int = 0
    summary: ClassVar[str] = "LEAF Shakespeare (next character, natural partition by role) with a char-LSTM"
    reference: ClassVar[str] = "Caldas et al. 2018 (LEAF); McMahan et al., AISTATS 2017 (the char-LSTM)"
    input_kind: ClassVar[str] = "sequence"  # token ids, scored by accuracy (not a language model's bits)

    def validate_dir(self, v: Any) -> None:
        _check_common(self)
        for name in ("embed", "hidden", "layers"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= 4096:
                raise param_error(self, name, x, "must be an integer in [1, 4096]")

    def _raw(self) -> Any:
        d = _where("shakespeare", self.dir)
        return _read("shakespeare", str(d), "shakespeare", _stamp(d))

    def load(self, seed: int) -> Dataset:
        raw = self._raw()
        tr = _subset(raw.train_y, self.train_limit, self.split_seed)
        te = _subset(raw.test_y, self.test_limit, self.split_seed + 1)
        return Dataset(raw.train_x[tr].to(torch.int64), raw.train_y[tr].to(torch.int64),
                       raw.test_x[te].to(torch.int64), raw.test_y[te].to(torch.int64), int(raw.num_classes),
                       raw.groups[tr].to(torch.int64), f"{raw.source} (train {len(tr)}, test {len(te)})")

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        from .nets import CharLSTM

        return CharLSTM(int(self._raw().num_classes), self.embed, self.hidden, self.layers, generator=generator,
                        last_only=True)

