"""Pre-aggregation that lowers the spread of honest updates: NNM and bucketing.

* Nearest-neighbour mixing, Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan,
  "Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity",
  AISTATS 2023: every row xᵢ is replaced by the mean of its n − f nearest rows
  (itself included), then any robust aggregator runs on the mixed rows.
* Bucketing, Karimireddy, He & Jaggi, "Byzantine-Robust Learning on Heterogeneous
  Datasets via Bucketing", ICLR 2022: shuffle the rows, average them in buckets of
  s (s = 2 in the paper; the last bucket is smaller when s does not divide n), and
  hand the ⌈n/s⌉ bucket means to the aggregator.

NNM's distances come from the shared pairwise kernel (:mod:`defenses._pairwise`:
float32 blocks with a rounding bound per pair, exact float64 recomputation of the
pairs near a row's k-th distance), and the mixing is one ``(u, n) @ (n, d)`` product
over the u distinct neighbour sets: memory is O(n² + n·d), never O(n²·d). Rows tied
exactly at the k-th distance share the remaining slots evenly (the paper leaves ties
open; this is the average over every way of breaking them, so no order or value an
attacker picks decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.pipeline import PreAggregator
from redteam.types import ServerContext, param_error

from ._common import check_count, finite_rows, generator_of, safe_sum
from ._pairwise import PairwiseDistances, pairwise

if TYPE_CHECKING:
    import torch

__all__ = ["NNM", "Bucketing", "nearest_neighbour_mixing"]


def _rank_counts(sorted_rows: "torch.Tensor", values: "torch.Tensor", right: bool) -> "torch.Tensor":
    """Per row i and entry j: how many of row i's (sorted) values are ≤ (``right``) or
    < values[i, j]."""
    import torch

    return torch.searchsorted(sorted_rows.contiguous(), values.contiguous(), right=right)


def neighbour_weights(pd: PairwiseDistances, k: int) -> "torch.Tensor":
    """``(n, n)`` float64 mixing weights: row i puts 1/k on each of its k nearest rows
    (itself first), the rows tied exactly at the k-th distance sharing the slots left.

    Membership is settled from the kernel's rounding intervals; the pairs near row i's
    k-th distance that the intervals cannot settle are recomputed exactly. A tie at the
    cut (equal in exact arithmetic, each distance with its own bound) is split evenly:
    no choice among tied rows depends on their order or on a value an attacker picks.
    """
    import torch

    n = pd.approx.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=pd.approx.device)
    for _ in range(3):  # bounds → (float64 Gram) → refine the undecided pairs → exact values
        lo = pd.lower.masked_fill(eye, -1.0)  # a row is always its own first neighbour
        hi = pd.upper.masked_fill(eye, -1.0)
        lo_sorted = torch.sort(lo, dim=1).values
        hi_sorted = torch.sort(hi, dim=1).values
        # j surely in: fewer than k rows (j included) may be ≤ its upper end … (counts include j itself)
        surely_in = _rank_counts(lo_sorted, hi, right=True) <= k
        # … surely out: at least k rows are strictly nearer than its lower end
        surely_out = _rank_counts(hi_sorted, lo, right=False) >= k
        undecided = ~surely_in & ~surely_out
        if not bool(undecided.any()):
            break
        if int(undecided.sum()) > n and pd.passes == 0:
            # many pairs near the cuts: one float64 Gram centred on the row nearest the others
            total = torch.where(torch.isfinite(pd.approx), pd.approx, torch.zeros_like(pd.approx)).sum(dim=1)
            total = torch.where(pd.finite, total, torch.full_like(total, float("inf")))
            pd = pd.recentred(int(torch.argmin(total)))
            continue
        pd = pd.refine(undecided & (pd.error > 1e-9 * pd.approx))
    w = surely_in.to(torch.float64)
    if bool(undecided.any()):
        # exact ties at the cut: share the remaining slots equally
        free = (k - w.sum(dim=1)).clamp_min(0.0)
        tied = undecided.to(torch.float64)
        w = w + tied * (free / tied.sum(dim=1).clamp_min(1.0))[:, None]
    return w / k


def nearest_neighbour_mixing(updates: "torch.Tensor", k: int) -> "torch.Tensor":
    """Each row → the mean of its ``k`` nearest rows (squared L2), itself included.

    Rows whose neighbour multisets coincide (copies of one row count as one row) are
    mixed once and get bitwise the same result. Sums of rows near ±3.4e38 are redone
    in float64 (a mean of finite rows is always representable).
    """
    import torch

    n = updates.shape[0]
    if n == 0:
        return updates.clone()
    pd = pairwise(updates)
    w = neighbour_weights(pd, k)
    # move the weight of copies onto their group's first row: equal multisets → equal rows
    group = pd.group.to(w.device)
    canon = torch.zeros_like(w).index_add_(1, group, w)
    uniq, inverse = torch.unique(canon, dim=0, return_inverse=True)
    if uniq.shape[0] == n:  # every neighbour multiset distinct: keep the rows' order, no gather
        uniq, inverse = canon, None
    used = (uniq != 0).any(dim=0).nonzero().flatten()
    every = int(used.numel()) == n
    coeff = (uniq if every else uniq.index_select(1, used)).to(updates.dtype)
    rows = updates if every else updates.index_select(0, used.to(updates.device))
    mixed = coeff @ rows
    ok = pd.finite.index_select(0, used)
    if not bool(torch.isfinite(mixed.sum(dim=1)).all()) and bool(ok.all()):  # a cheap screen
        mixed = torch.stack([safe_sum(uniq[r, used], rows, convex=True, what="an NNM row")
                             for r in range(uniq.shape[0])])
    return mixed if inverse is None else mixed.index_select(0, inverse.to(updates.device))


@dataclass(frozen=True, slots=True)
class NNM(PreAggregator):
    """Nearest-neighbour mixing (Allouah et al., AISTATS 2023).

    * ``f``: the number of Byzantine updates tolerated, n > 2f; each row becomes
      the mean of its n − f nearest rows including itself. Unset means the largest
      f the round allows, ⌈n/2⌉ − 1.

    Row i of the output stands for client i, so the clients' weights pass through.
    """

    f: int | None = None
    screens_nonfinite: ClassVar[bool] = False  # rows pass through: put `sanity` (or a rule that screens) first
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
    screens_nonfinite: ClassVar[bool] = False  # rows pass through: put `sanity` (or a rule that screens) first
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
        means = sums / counts[:, None]
        if not bool(torch.isfinite(means).all()) and bool(finite_rows(updates).all()):
            # finite rows near the overflow: the bucket means in float64 (always representable)
            big = torch.finfo(updates.dtype).max
            sums64 = torch.zeros(n_buckets, updates.shape[1], dtype=torch.float64, device=updates.device)
            sums64.index_add_(0, bucket, updates.to(torch.float64))
            means = (sums64 / counts.to(torch.float64)[:, None]).clamp(-big, big).to(updates.dtype)
        bucket_w = torch.zeros(n_buckets, dtype=weights.dtype, device=weights.device)
        bucket_w.index_add_(0, bucket.to(weights.device), weights)
        return means, bucket_w
