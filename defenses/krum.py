"""Krum, Multi-Krum and Bulyan.

* Blanchard, El Mhamdi, Guerraoui & Stainer, "Machine Learning with Adversaries:
  Byzantine Tolerant Gradient Descent", NeurIPS 2017 (Krum, Multi-Krum). Each update
  xᵢ is scored by the sum of its squared distances to its n − f − 2 nearest other
  updates; Krum returns the update with the lowest score, Multi-Krum the plain mean
  of the m lowest-scoring ones (m = n − f by default). Requires 2f + 2 < n.
* El Mhamdi, Guerraoui & Rouault, "The Hidden Vulnerability of Distributed Learning
  in Byzantium", ICML 2018 (Bulyan). Krum is applied repeatedly, each time to the
  updates not yet chosen, until θ = n − 2f are chosen; then every coordinate is the
  mean of the β = θ − 2f chosen values closest to that coordinate's median.
  Requires n ≥ 4f + 3.

All distances come from one float64 Gram matrix (no Python loop over pairs). The
papers leave ties in the Krum score open; here they are broken by the sum of squared
distances to all other updates, then by two fingerprints of the rows' values (Σxⱼ,
Σj·xⱼ), then by position, so the choice does not depend on the clients' order
unless two different rows agree on all of these. A non-finite update is infinitely
far from everyone: it is never selected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error

from ._common import check_choice, check_count, combine, sorted_reduce, sq_distances

if TYPE_CHECKING:
    import torch

__all__ = ["Krum", "MultiKrum", "Bulyan", "krum_scores", "content_keys"]


def krum_scores(dist: "torch.Tensor", neighbours: int) -> "torch.Tensor":
    """Score of every row: sum of its ``neighbours`` smallest distances to *other* rows.

    ``dist`` is the ``(n, n)`` matrix of squared distances (zero diagonal).
    """
    import torch

    n = dist.shape[0]
    if neighbours <= 0 or n <= 1:
        return torch.zeros(n, dtype=dist.dtype, device=dist.device)
    others = dist.clone()
    others.fill_diagonal_(float("inf"))
    return torch.topk(others, neighbours, dim=1, largest=False).values.sum(dim=1)


def content_keys(updates: "torch.Tensor") -> "torch.Tensor":
    """Two order-free fingerprints of every row, ``(n, 2)`` float64: Σⱼ xⱼ and Σⱼ j·xⱼ.

    They depend on a row's values only (not on its position among the clients), so
    ranking by them breaks ties between different rows the same way in any order.
    """
    import torch

    n, d = updates.shape
    keys = torch.zeros(n, 2, dtype=torch.float64, device=updates.device)
    step = 1 << 16
    for start in range(0, d, step):
        block = torch.nan_to_num(updates[:, start:start + step].to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
        pos = torch.arange(start + 1, start + 1 + block.shape[1], dtype=torch.float64, device=updates.device)
        keys[:, 0] += block.sum(dim=1)
        keys[:, 1] += (block * pos).sum(dim=1)
    return keys


def _rank(
    scores: "torch.Tensor",
    dist: "torch.Tensor",
    content: "Callable[[], torch.Tensor] | None" = None,
) -> "torch.Tensor":
    """Row indices ordered by (score, number of infinite distances, sum of the finite
    ones, then — only if a tie remains — the rows' content keys, then position).

    ``content()`` returns :func:`content_keys` of these rows; it is called only when
    two rows tie on the first three keys, so the common case reads no update data.
    """
    import torch

    ok = torch.isfinite(dist)
    total = torch.where(ok, dist, torch.zeros_like(dist)).sum(dim=1)
    keys = [_tie_classes(scores), (~ok).sum(dim=1).to(scores.dtype), _tie_classes(total)]

    def order_by(columns: list["torch.Tensor"]) -> "torch.Tensor":
        order = torch.arange(scores.shape[0], device=scores.device)
        for col in reversed(columns):  # stable sorts, least significant key first
            order = order[torch.argsort(col[order], stable=True)]
        return order

    order = order_by(keys)
    if content is not None and scores.shape[0] > 1:
        ranked = torch.stack([k[order] for k in keys], dim=1)
        if bool((ranked[1:] == ranked[:-1]).all(dim=1).any()):
            extra = content().to(device=scores.device)
            order = order_by(keys + [extra[:, 0], extra[:, 1]])
    return order


def _tie_classes(values: "torch.Tensor", rtol: float = 1e-9) -> "torch.Tensor":
    """Replace values by the index of their tie class: sorted values closer than
    ``rtol`` × (largest finite magnitude) to their predecessor share a class.

    Scores that are equal in exact arithmetic come out of the Gram matrix a few ulps
    apart, in an order that depends on the rows' positions; classing them makes the
    ranking depend on the multiset of values only (then content keys break the tie).
    """
    import torch

    vals, idx = torch.sort(values)
    finite = vals[torch.isfinite(vals)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    tol = rtol * max(scale, 1e-300)
    gaps = vals[1:] - vals[:-1]
    step = torch.zeros_like(vals, dtype=torch.int64)
    step[1:] = (gaps > tol).to(torch.int64)  # inf − inf = nan: infinite values share a class
    classes = torch.empty_like(step)
    classes[idx] = torch.cumsum(step, 0)
    return classes.to(values.dtype)


def _krum_f(obj: Any, f: int | None, n: int) -> int:
    """The f in force for n updates: the given one, checked, or the largest with 2f + 2 < n."""
    if f is None:
        if n < 3:
            raise param_error(obj, "f", f, f"needs 2f + 2 < n, impossible with n = {n} updates (need n ≥ 3)")
        return (n - 3) // 2
    if 2 * f + 2 >= n:
        raise param_error(obj, "f", f, f"must satisfy 2f + 2 < n (n = {n}, so f ≤ {(n - 3) // 2})"
                          if n >= 3 else f"must satisfy 2f + 2 < n, impossible with n = {n} updates")
    return f


def _neighbours(obj: Any, neighbours: int | None, n: int, f: int) -> int:
    if neighbours is None:
        return n - f - 2
    if not 1 <= neighbours <= n - 1:
        raise param_error(obj, "neighbours", neighbours, f"must be between 1 and n − 1 = {n - 1} (n = {n})")
    return neighbours


def _one_hot(n: int, idx: "torch.Tensor", like: "torch.Tensor") -> "torch.Tensor":
    import torch

    w = torch.zeros(n, dtype=like.dtype, device=like.device)
    w[idx] = 1.0
    return w


@dataclass(frozen=True, slots=True)
class Krum(Aggregator):
    """Krum (Blanchard et al., NeurIPS 2017): the update with the lowest score.

    * ``f``: the number of Byzantine updates the rule must tolerate; 2f + 2 < n.
      Unset means the largest f the round allows, ⌊(n − 3)/2⌋.
    * ``neighbours``: how many nearest other updates enter a score; default
      n − f − 2 as in the paper. Distances are squared L2.

    ``Decision.state`` holds the f and neighbour count used, the scores and the
    selected index.
    """

    f: int | None = None
    neighbours: int | None = None
    summary: ClassVar[str] = "Krum: the update closest (squared L2) to its n−f−2 nearest neighbours"
    reference: ClassVar[str] = "Blanchard et al., NeurIPS 2017"

    def validate_f(self, v: int | None) -> None:
        check_count(self, "f", v)

    def validate_neighbours(self, v: int | None) -> None:
        check_count(self, "neighbours", v, minimum=1)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        n = int(updates.shape[0])
        f = _krum_f(self, self.f, n)
        k = _neighbours(self, self.neighbours, n, f)
        dist = sq_distances(updates)
        scores = krum_scores(dist, k)
        best = _rank(scores, dist, lambda: content_keys(updates))[0]
        accepted = _one_hot(n, best, updates) > 0
        best_score = float(scores[best])
        reasons = {
            j: f"not selected by Krum (score {float(scores[j]):.6g}; the selected update scored {best_score:.6g})"
            for j in range(n) if j != int(best)
        }
        return Decision(
            aggregate=updates[best].clone(),
            accepted=accepted,
            weights=_one_hot(n, best, updates),
            reasons=reasons,
            state={"f": f, "neighbours": k, "scores": scores.tolist(), "selected": [int(best)]},
        )


def _iterative_krum(dist: "torch.Tensor", f: int, count: int, clamp: bool,
                    updates: "torch.Tensor | None" = None) -> list[int]:
    """Apply Krum ``count`` times, each time to the rows not yet chosen.

    On r remaining rows Krum uses r − f − 2 neighbours; with ``clamp`` this is raised
    to at least 1 (Bulyan's last steps run Krum on fewer than 2f + 3 rows). Chosen
    rows are masked out (their column set to +inf) rather than re-indexed.
    """
    import torch

    n = dist.shape[0]
    alive = torch.ones(n, dtype=torch.bool, device=dist.device)
    chosen: list[int] = []
    keys: list["torch.Tensor"] = []

    def content_of(idx: "torch.Tensor") -> "torch.Tensor":
        if not keys:
            keys.append(content_keys(updates))
        return keys[0].index_select(0, idx.to(keys[0].device))

    for _ in range(count):
        r = n - len(chosen)
        k = r - f - 2
        if clamp:
            k = max(k, 1)
        k = min(k, r - 1)
        masked = dist.masked_fill(~alive[None, :], float("inf"))
        idx = alive.nonzero().flatten()
        rows = masked.index_select(0, idx)
        scores = krum_scores(masked, k).index_select(0, idx) if k > 0 else torch.zeros(r, dtype=dist.dtype, device=dist.device)
        tie_break = None if updates is None else (lambda idx=idx: content_of(idx))
        pick = int(idx[_rank(scores, rows, tie_break)[0]])
        chosen.append(pick)
        alive[pick] = False
    return chosen


@dataclass(frozen=True, slots=True)
class MultiKrum(Aggregator):
    """Multi-Krum (Blanchard et al., NeurIPS 2017): plain mean of the m best updates.

    * ``f``: tolerated Byzantine updates, 2f + 2 < n (unset: the largest allowed);
    * ``m``: how many updates are averaged; default n − f;
    * ``neighbours``: as in :class:`Krum` (default n − f − 2);
    * ``variant``: ``"scores"`` (the paper: score every update once, keep the m
      lowest) or ``"iterative"`` (as in Shejwalkar & Houmansadr's NDSS 2021 code: pick
      the Krum winner, remove it, re-score the rest, repeat; on r remaining updates
      Krum needs 2f + 2 < r, so m ≤ n − 2f − 2, which is also its default).

    The mean is unweighted (sample counts are not trusted), as in the paper.
    """

    f: int | None = None
    m: int | None = None
    neighbours: int | None = None
    variant: Literal["scores", "iterative"] = "scores"
    summary: ClassVar[str] = "Multi-Krum: unweighted mean of the m lowest Krum scores"
    reference: ClassVar[str] = "Blanchard et al., NeurIPS 2017"

    def validate_f(self, v: int | None) -> None:
        check_count(self, "f", v)

    def validate_m(self, v: int | None) -> None:
        check_count(self, "m", v, minimum=1)

    def validate_neighbours(self, v: int | None) -> None:
        check_count(self, "neighbours", v, minimum=1)

    def validate_variant(self, v: str) -> None:
        check_choice(self, "variant", v, ("scores", "iterative"))
        if v == "iterative" and self.neighbours is not None:
            raise param_error(self, "neighbours", self.neighbours,
                              "must be unset with variant = 'iterative' (each step uses r − f − 2)")

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n = int(updates.shape[0])
        f = _krum_f(self, self.f, n)
        dist = sq_distances(updates)
        if self.variant == "scores":
            m = n - f if self.m is None else self.m
            if m > n:
                raise param_error(self, "m", self.m, f"must be ≤ n (n = {n})")
            k = _neighbours(self, self.neighbours, n, f)
            scores = krum_scores(dist, k)
            chosen = _rank(scores, dist, lambda: content_keys(updates))[:m].tolist()
            state: dict[str, Any] = {"f": f, "m": m, "neighbours": k, "scores": scores.tolist()}
        else:
            limit = n - 2 * f - 2
            m = limit if self.m is None else self.m
            if m > limit:
                raise param_error(self, "m", self.m,
                                  f"must be ≤ n − 2f − 2 = {limit} with variant = 'iterative' (n = {n}, f = {f})")
            chosen = _iterative_krum(dist, f, m, clamp=False, updates=updates)
            state = {"f": f, "m": m}
        state["selected"] = list(chosen)
        sel = torch.tensor(chosen, dtype=torch.long, device=updates.device)
        w = torch.zeros(n, dtype=updates.dtype, device=updates.device)
        w[sel] = 1.0 / m
        accepted = w > 0
        reasons = {j: f"not among the {m} updates selected by Multi-Krum" for j in range(n) if not bool(accepted[j])}
        return Decision(aggregate=combine(w, updates), accepted=accepted, weights=w, reasons=reasons, state=state)


@dataclass(frozen=True, slots=True)
class Bulyan(Aggregator):
    """Bulyan over Krum (El Mhamdi et al., ICML 2018).

    1. Selection: θ = n − 2f updates, chosen one at a time by Krum on the updates
       not yet chosen (on r remaining updates Krum uses r − f − 2 neighbours, raised
       to 1 in the last steps where that count drops below 1).
    2. Aggregation: for every coordinate, the mean of the β = θ − 2f selected values
       closest to the coordinate median of the selected values (the midpoint median
       when θ is even; among equally close candidates the lower values are kept).

    * ``f``: tolerated Byzantine updates; the rule refuses n < 4f + 3 rather than
      silently degrading. Unset means the largest allowed, ⌊(n − 3)/4⌋.
    """

    f: int | None = None
    summary: ClassVar[str] = "Bulyan: iterative Krum selects n−2f, then β values nearest the median per coordinate"
    reference: ClassVar[str] = "El Mhamdi et al., ICML 2018"

    def validate_f(self, v: int | None) -> None:
        check_count(self, "f", v)

    def resolve_f(self, n: int) -> int:
        if self.f is None:
            if n < 3:
                raise param_error(self, "f", self.f, f"needs n ≥ 4f + 3, impossible with n = {n} updates (need n ≥ 3)")
            return (n - 3) // 4
        if n < 4 * self.f + 3:
            raise param_error(self, "f", self.f, f"must satisfy n ≥ 4f + 3 (n = {n}, so f ≤ {max((n - 3) // 4, 0)})"
                              if n >= 3 else f"must satisfy n ≥ 4f + 3, impossible with n = {n} updates")
        return self.f

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n = int(updates.shape[0])
        f = self.resolve_f(n)
        theta = n - 2 * f
        beta = theta - 2 * f
        chosen = _iterative_krum(sq_distances(updates), f, theta, clamp=True, updates=updates)
        sel = torch.tensor(chosen, dtype=torch.long, device=updates.device)
        selected = updates.index_select(0, sel)
        agg = sorted_reduce(selected, lambda s: _closest_to_median_mean(s, beta))
        accepted = torch.zeros(n, dtype=torch.bool, device=updates.device)
        accepted[sel] = True
        reasons = {j: f"not among the θ = {theta} updates selected by Bulyan's iterative Krum"
                   for j in range(n) if not bool(accepted[j])}
        return Decision(aggregate=agg, accepted=accepted, reasons=reasons,
                        state={"f": f, "theta": theta, "beta": beta, "selected": chosen})


def _closest_to_median_mean(s: "torch.Tensor", beta: int) -> "torch.Tensor":
    """Per column of the sorted ``s`` (θ, c): mean of the β values nearest the median.

    The β nearest values form a window of consecutive sorted values; the best window
    is the one whose farther end is nearest the median (first such window on ties).
    """
    import torch

    theta = s.shape[0]
    mid = theta // 2
    med = s[mid] if theta % 2 == 1 else 0.5 * s[mid - 1] + 0.5 * s[mid]
    lo = s[: theta - beta + 1]
    hi = s[beta - 1:]
    spread = torch.maximum(med - lo, hi - med)
    start = torch.argmin(spread, dim=0)
    idx = start[None, :] + torch.arange(beta, device=s.device)[:, None]
    return s.gather(0, idx).sum(dim=0, dtype=torch.float64) / beta
