"""Pre-aggregation that lowers the spread of honest updates: NNM and bucketing.

* Nearest-neighbour mixing, Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan,
  "Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
  AISTATS 2023: every row xᵢ is replaced by the mean of its n − f nearest rows
  (itself included), then any robust aggregator runs on the mixed rows.
* Bucketing, Karimireddy, He & Jaggi, "Byzantine-Robust Learning on Heterogeneous
  Datasets via Bucketing", ICLR 2022: shuffle the rows, average them in buckets of
  s (s = 2 in the paper; the last bucket is smaller when s does not divide n), and
  hand the ⌈n/s⌉ bucket means to the aggregator.

NNM's distances come from one float64 Gram matrix accumulated over column blocks,
and the mixing is one ``(n, n) @ (n, d)`` product: memory is O(n² + n·d), never
O(n²·d).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.pipeline import PreAggregator
from redteam.types import ServerContext, param_error

from ._common import check_count, generator_of, sq_distances

if TYPE_CHECKING:
    import torch

__all__ = ["NNM", "Bucketing", "nearest_neighbour_mixing"]


def nearest_neighbour_mixing(updates: "torch.Tensor", k: int) -> "torch.Tensor":
    """Each row → the mean of its ``k`` nearest rows (squared L2), itself included."""
    import torch

    n = updates.shape[0]
    dist = sq_distances(updates)
    dist.fill_diagonal_(-1.0)  # a row is always its own first neighbour
    idx = torch.topk(dist, k, dim=1, largest=False).indices
    mix = torch.zeros(n, n, dtype=updates.dtype, device=updates.device)
    mix.scatter_(1, idx, 1.0 / k)
    return mix @ updates


@dataclass(frozen=True, slots=True)
class NNM(PreAggregator):
    """Nearest-neighbour mixing (Allouah et al., AISTATS 2023).

    * ``f``: the number of Byzantine updates tolerated, n > 2f; each row becomes
      the mean of its n − f nearest rows including itself. Unset means the largest
      f the round allows, ⌈n/2⌉ − 1.

    Row i of the output stands for client i, so the clients' weights pass through.
    """

    f: int | None = None
    summary: ClassVar[str] = "Nearest-neighbour mixing: each update → mean of its n−f nearest"
    reference: ClassVar[str] = "Allouah et al., AISTATS 2023"

    def validate_f(self, v: int | None) -> None:
        check_count(self, "f", v)

    def resolve_f(self, n: int) -> int:
        if self.f is None:
            return (n - 1) // 2
        if 2 * self.f >= n:
            raise param_error(self, "f", self.f, f"must satisfy 2f < n (n = {n}, so f ≤ {(n - 1) // 2})")
        return self.f

    def transform(
        self, updates: "torch.Tensor", weights: "torch.Tensor", ctx: ServerContext
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        n = int(updates.shape[0])
        f = self.resolve_f(n)
        return nearest_neighbour_mixing(updates, n - f), weights


@dataclass(frozen=True, slots=True)
class Bucketing(PreAggregator):
    """Bucketing (Karimireddy, He & Jaggi, ICLR 2022).

    * ``s``: the bucket size (the paper's s = 2).

    The shuffle draws from ``ctx.generator`` (a CPU generator seeded 0 when the
    context has none). Each bucket mean is the plain mean of its members (claimed
    sample counts do not steer it); a bucket's weight, for a weighted aggregator that
    follows, is the sum of its members' weights. A Byzantine-robust rule after
    bucketing sees ⌈n/s⌉ rows, so its f counts buckets.
    """

    s: int = 2
    summary: ClassVar[str] = "Bucketing: shuffle, average buckets of s, then aggregate the bucket means"
    reference: ClassVar[str] = "Karimireddy, He & Jaggi, ICLR 2022"
    symmetric: ClassVar[bool] = False  # the buckets depend on the order of the rows

    def validate_s(self, v: int) -> None:
        check_count(self, "s", v, allow_none=False, minimum=1)

    def transform(
        self, updates: "torch.Tensor", weights: "torch.Tensor", ctx: ServerContext
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        n = int(updates.shape[0])
        perm = torch.randperm(n, generator=generator_of(ctx), device="cpu")
        position = torch.empty_like(perm)
        position[perm] = torch.arange(n)
        bucket = (position // self.s).to(updates.device)  # bucket of each row
        n_buckets = (n + self.s - 1) // self.s
        sums = torch.zeros(n_buckets, updates.shape[1], dtype=updates.dtype, device=updates.device)
        sums.index_add_(0, bucket, updates)
        counts = torch.bincount(bucket, minlength=n_buckets).to(updates.dtype)
        bucket_w = torch.zeros(n_buckets, dtype=weights.dtype, device=weights.device)
        bucket_w.index_add_(0, bucket.to(weights.device), weights)
        return sums / counts[:, None], bucket_w
