"""The workload contract: a model factory, the data, and how to score a model.

A workload is a frozen dataclass registered under the ``redteam.workloads`` entry point
group. The trainer needs four things from it:

* :meth:`Workload.load` — the full training pool and a fixed held-out test split
  (:class:`Dataset`); the federation partitions the training pool among clients;
* :meth:`Workload.build_model` — a fresh ``torch.nn.Module`` (initialised from the
  generator it is given), used *functionally*: the trainer stacks one flat parameter
  vector per client and calls the module through ``torch.func.functional_call``;
* :meth:`Workload.loss` — mean loss of model outputs against targets;
* :meth:`Workload.correct` — per-sample correctness, for accuracy.

Inputs may be float features (tabular, images flattened or not) or int64 token ids
(sequence models): the trainer only indexes the first (sample) dimension, so a tiny
language model fits the same contract with ``loss`` over ``(B, T, V)`` logits and
``(B, T)`` targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

    from .corpus import CorpusIndex

__all__ = ["Dataset", "Workload"]


@dataclass(frozen=True, slots=True)
class Dataset:
    """Training pool and held-out test split of one workload.

    ``groups`` (optional, ``(N,)`` int64): a group id per training sample (for text, the
    document's package), used by the ``by_group`` partition; ``source``: what the data is,
    with a digest of exactly the bytes used where the workload computes one; ``corpus``
    (optional): per training sample, the document it came from (text:
    :class:`~redteam.workloads.corpus.CorpusIndex`), which the provenance gate's dataset
    manifests list instead of the raw tensors.
    """

    train_x: "torch.Tensor"
    train_y: "torch.Tensor"
    test_x: "torch.Tensor"
    test_y: "torch.Tensor"
    num_classes: int
    groups: "torch.Tensor | None" = None
    source: str = ""
    corpus: "CorpusIndex | None" = None

    def to(self, device: "torch.device | str") -> "Dataset":
        return Dataset(
            self.train_x.to(device),
            self.train_y.to(device),
            self.test_x.to(device),
            self.test_y.to(device),
            self.num_classes,
            self.groups,
            self.source,
            self.corpus,
        )


@dataclass(frozen=True, slots=True)
class Workload:
    """Base class; subclasses set the ClassVars and implement ``load`` and ``build_model``.

    ``input_kind`` is ``"image"``, ``"tabular"`` or ``"tokens"``; image workloads also
    give ``image_shape`` so that pixel-pattern attacks can address pixels.

    ``cpu_grad_rows``: on CPU the batched trainer computes the clients' gradients this many
    client rows at a time (0: all rows in one call). A workload sets it only where each row's
    gradient is bitwise the same whatever rows are computed with it (so the results do not
    change) and a smaller working set is faster.
    """

    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    input_kind: ClassVar[str] = "tabular"
    image_shape: ClassVar[tuple[int, ...]] = ()
    cpu_grad_rows: ClassVar[int] = 0

    def __post_init__(self) -> None:
        from ..types import _check_fields

        _check_fields(self)

    def load(self, seed: int) -> Dataset:  # pragma: no cover - contract
        raise NotImplementedError

    def build_model(self, generator: "torch.Generator") -> "torch.nn.Module":  # pragma: no cover
        raise NotImplementedError

    def param_count(self) -> int | None:
        """The number of parameters :meth:`build_model` makes, computed without building it (the
        scenario's memory estimate, :func:`redteam.scenario_limits.memory_estimate`); None: this
        workload does not say, and the estimate leaves out what scales with the model."""
        return None

    def loss(self, output: "torch.Tensor", target: "torch.Tensor") -> "torch.Tensor":
        """Mean cross-entropy; works for ``(B, C)`` and ``(B, T, C)`` outputs."""
        import torch.nn.functional as F

        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def correct(self, output: "torch.Tensor", target: "torch.Tensor") -> "torch.Tensor":
        """Per-element correctness (bool), flattened."""
        return (output.argmax(dim=-1) == target).reshape(-1)
