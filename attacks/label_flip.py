"""Label flipping: a data-poisoning attack on the malicious clients' training sets.

Tolpegin, Truex, Gursoy & Liu, "Data Poisoning Attacks Against Federated Learning
Systems", ESORICS 2020 (a source class relabelled as a target class); the reverse
mapping y ↦ C − 1 − y is the label-flipping baseline of Fang et al. (USENIX Security
2020) and of Karimireddy, He & Jaggi's code (epfml/byzantine-robust-optimizer).

The mapping is a named parameter:

* ``"reverse"`` (default): y ↦ C − 1 − y, C = ``num_classes``;
* ``"all_to_one"``: every label ↦ ``target``;
* ``"pairs"``: the directed pairs ``(source, destination)`` in ``pairs``; labels not
  listed keep their value. Pairs apply simultaneously to the original labels, so a
  swap of 3 and 8 is ``pairs = [[3, 8], [8, 3]]``.

``fraction`` of the client's samples (default all) are relabelled; which ones is drawn
from the generator passed in. Inputs are left untouched.

Under worker momentum (``[federation] client_momentum = β``) a label-flipping client sends
what ``[federation] malicious_momentum`` says: ``"raw"`` (default) its round's fresh term on
the flipped labels, as the authors' ``LableFlippingWorker`` (a plain ``TorchWorker``, no
momentum, in ``codes/attacks/labelflipping.py``); ``"momentum"`` the momentum of its poisoned
deltas, as an honest client would keep it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, ClientData, Surface, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["LabelFlip", "poison_indices"]


def poison_indices(n: int, fraction: float, generator: "torch.Generator",
                   eligible: "torch.Tensor | None" = None) -> "torch.Tensor":
    """Indices (sorted, int64, CPU) of ⌈fraction · m⌉ samples drawn without replacement
    from the m eligible ones (all n when ``eligible`` is None)."""
    import torch

    pool = torch.arange(n) if eligible is None else eligible.nonzero().flatten().cpu()
    m = int(pool.shape[0])
    k = min(m, math.ceil(fraction * m - 1e-12))
    if k >= m:
        return pool
    perm = torch.randperm(m, generator=generator, device=generator.device).cpu()
    return pool[perm[:k]].sort().values


@dataclass(frozen=True, slots=True)
class LabelFlip(Attack):
    """Relabel the malicious clients' training samples with an explicit mapping.

    * ``mapping``: ``"reverse"`` | ``"all_to_one"`` | ``"pairs"`` (see the module docstring);
    * ``num_classes``: C (default 10, the digits workload); labels must lie in [0, C);
    * ``target``: the destination class of ``"all_to_one"``;
    * ``pairs``: the directed (source, destination) pairs of ``"pairs"``;
    * ``fraction``: share of the client's samples relabelled, in (0, 1] (default 1).
    """

    mapping: Literal["reverse", "all_to_one", "pairs"] = "reverse"
    num_classes: int = 10
    target: int = 0
    pairs: tuple[tuple[int, int], ...] = ()
    fraction: float = 1.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA,)
    summary: ClassVar[str] = "Label flipping: reverse (C−1−y), all-to-one, or explicit pairs"
    reference: ClassVar[str] = "Tolpegin et al., ESORICS 2020; Fang et al., USENIX Security 2020"

    def validate_mapping(self, v: str) -> None:
        if v not in ("reverse", "all_to_one", "pairs"):
            raise param_error(self, "mapping", v, "must be 'reverse', 'all_to_one' or 'pairs'")

    def validate_num_classes(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise param_error(self, "num_classes", v, "must be an integer ≥ 2")

    def validate_target(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < self.num_classes:
            raise param_error(self, "target", v, f"must be a class in [0, {self.num_classes})")

    def validate_pairs(self, v: tuple[tuple[int, int], ...]) -> None:
        seen: set[int] = set()
        for p in v:
            if (not isinstance(p, (tuple, list)) or len(p) != 2
                    or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < self.num_classes
                               for c in p)):
                raise param_error(self, "pairs", v,
                                  f"each pair must be (source, destination) classes in [0, {self.num_classes})")
            if p[0] in seen:
                raise param_error(self, "pairs", v, f"source class {p[0]} is mapped twice")
            seen.add(p[0])
        if self.mapping == "pairs" and not v:
            raise param_error(self, "pairs", v, "mapping='pairs' needs at least one (source, destination) pair")

    def validate_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "fraction", v, "must be in (0, 1]")

    def table(self) -> "torch.Tensor":
        """The mapping as a lookup table: new label = table[old label]."""
        import torch

        c = self.num_classes
        if self.mapping == "reverse":
            return torch.arange(c - 1, -1, -1, dtype=torch.int64)
        if self.mapping == "all_to_one":
            return torch.full((c,), self.target, dtype=torch.int64)
        t = torch.arange(c, dtype=torch.int64)
        for src, dst in self.pairs:
            t[src] = dst
        return t

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        import torch

        y = data.y
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise param_error(self, "num_classes", self.num_classes,
                              f"client {client} has labels in [{int(y.min())}, {int(y.max())}], "
                              f"outside [0, {self.num_classes})")
        table = self.table().to(y.device)
        flipped = table[y]
        if self.fraction < 1:
            idx = poison_indices(int(y.shape[0]), self.fraction, generator).to(y.device)
            mask = torch.zeros(y.shape[0], dtype=torch.bool, device=y.device)
            mask[idx] = True
            flipped = torch.where(mask.view(-1, *([1] * (y.ndim - 1))), flipped, y)
        return ClientData(x=data.x, y=flipped.to(y.dtype))
