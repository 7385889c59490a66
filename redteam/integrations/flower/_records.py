"""Flower's ``ArrayRecord`` ↔ one flat float32 row, the form redteam's defenses and attacks read.

A model travels in Flower as an ``ArrayRecord``: named arrays in a fixed order. Its
:class:`Layout` is that order with each array's shape and dtype; :func:`flatten` concatenates
the arrays (C order) into a ``(d,)`` float32 tensor and :func:`unflatten` cuts a row back into
arrays of the layout's shapes and dtypes. Integer arrays (a batch-norm layer's
``num_batches_tracked``) travel through the row as floats and come back rounded to the nearest
integer; float64 arrays come back as float64 from their float32 values (the row's precision).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidParameter

if TYPE_CHECKING:
    import torch
    from flwr.app import ArrayRecord

__all__ = ["Layout", "flatten", "unflatten", "layout_of"]


@dataclass(frozen=True, slots=True)
class Layout:
    """The arrays of a model in their order: ``(key, shape, dtype)`` each."""

    entries: tuple[tuple[str, tuple[int, ...], str], ...]

    @property
    def dim(self) -> int:
        return sum(int(np.prod(shape, dtype=np.int64)) for _, shape, _ in self.entries)


def layout_of(record: "ArrayRecord") -> Layout:
    """The layout of ``record`` (its keys, shapes and dtypes, in order)."""
    entries = []
    for key, arr in record.items():
        entries.append((str(key), tuple(int(s) for s in arr.shape), str(arr.dtype)))
    return Layout(tuple(entries))


def flatten(record: "ArrayRecord", layout: Layout | None = None, *, who: str = "the model") -> "torch.Tensor":
    """``record`` as one ``(d,)`` float32 row; with ``layout``, a record whose keys or shapes differ
    is refused, naming ``who`` sent it and the first difference."""
    import torch

    arrays = [(str(k), a.numpy()) for k, a in record.items()]
    if layout is not None:
        keys = [k for k, _ in arrays]
        want = [k for k, _, _ in layout.entries]
        if keys != want:
            raise InvalidParameter(f"{who}: its arrays are {keys}, expected {want} (the global model's, in order)")
        for (key, arr), (_, shape, _) in zip(arrays, layout.entries):
            if tuple(arr.shape) != shape:
                raise InvalidParameter(f"{who}: array {key!r} has shape {tuple(arr.shape)}, expected {shape}")
    if not arrays:
        raise InvalidParameter(f"{who}: the ArrayRecord holds no arrays")
    for key, arr in arrays:
        if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
                or arr.dtype == np.bool_):
            raise InvalidParameter(f"{who}: array {key!r} has dtype {arr.dtype}, expected a number type")
    flat = np.concatenate([np.asarray(arr, dtype=np.float32).ravel() for _, arr in arrays])
    return torch.from_numpy(flat)


def unflatten(row: "torch.Tensor", layout: Layout) -> "ArrayRecord":
    """The row ``(d,)`` as an ``ArrayRecord`` of ``layout`` (integer arrays rounded)."""
    from flwr.app import Array, ArrayRecord

    vec = row.detach().to("cpu").numpy()
    if vec.shape != (layout.dim,):
        raise InvalidParameter(f"unflatten: row of shape {vec.shape}, expected ({layout.dim},)")
    out: dict[str, Any] = {}
    start = 0
    for key, shape, dtype in layout.entries:
        size = int(np.prod(shape, dtype=np.int64))
        part = vec[start:start + size].reshape(shape)
        start += size
        dt = np.dtype(dtype)
        if np.issubdtype(dt, np.integer) or dt == np.bool_:
            part = np.rint(part)
        out[key] = Array(np.array(part, dtype=dt).reshape(shape))  # (a 0-d array stays 0-d)
    return ArrayRecord(out)
