"""Divide-and-Conquer (DnC).

Shejwalkar & Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning
Attacks and Defenses for Federated Learning", NDSS 2021, Algorithm 2. Each of
``niters`` iterations:

1. draws a random sorted subset r of b coordinates (paper: b = 10 000; all d
   coordinates when d ≤ b);
2. centres the sub-vectors: x̃ᵢ = xᵢ[r] − μ with μ the mean of the n sub-vectors;
3. takes v, the top right singular vector of the centred n × b matrix X̃;
4. scores every update by its squared projection sᵢ = ⟨x̃ᵢ, v⟩²;
5. keeps the n − c·f updates with the lowest scores.

The good set is the intersection of the kept sets over the iterations; the aggregate
is the plain mean of the good updates (the paper's AGR_avg).

Computation: with X̃X̃ᵀ = U Λ Uᵀ (an n × n float64 eigenproblem) and u the top
eigenvector, v = X̃ᵀu/√λ, so sᵢ = (X̃v)ᵢ² = λ·uᵢ²: the n × b matrix is never
decomposed. A non-finite update scores +∞ (it is one of the c·f removed, with its
own reason) and takes no part in the centring. Ties in the score (up to rounding)
are broken by the rows' content, not their position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error, sample_weights

from ._common import check_count, check_number, finite_rows, generator_of
from ._stats import convex_mean, order_low_first, power_of_two_below

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

__all__ = ["DnC", "dnc_scores"]


def dnc_scores(sub: "torch.Tensor") -> "torch.Tensor":
    """Outlier scores ``(n,)`` float64 of the rows of ``sub`` ``(n, b)`` (finite rows):
    the squared projection of each centred row on the top right singular vector.

    Scores scale with the square of the rows; rows so large that a sum overflows are
    scored after an exact power-of-two rescaling, in units of that scale² (the ranking,
    all DnC uses, is the same)."""
    import torch

    x = sub.to(torch.float64)
    top = float(x.abs().max()) if x.numel() else 0.0
    if top > 1e150:  # centring or the Gram product could overflow
        x = x * power_of_two_below(top)
    centred = x - x.mean(dim=0, keepdim=True)
    gram = centred @ centred.T
    scale = float(gram.diagonal().max()) if gram.numel() else 0.0
    if not scale > 0 or not math.isfinite(scale):
        return torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    evals, evecs = torch.linalg.eigh(gram / scale)  # normalised: huge rows do not overflow eigh
    lam = float(evals[-1].clamp_min(0.0)) * scale
    return lam * evecs[:, -1] ** 2


@dataclass(frozen=True, slots=True)
class DnC(Aggregator):
    """DnC (Shejwalkar & Houmansadr, NDSS 2021): SVD outlier scores on random coordinates.

    * ``f``: the number of malicious clients (the paper's m, which Algorithm 2 takes as
      known to the server). In a scenario run an unset f is **filled with the scenario's
      malicious count** before the run (``from_malicious_count``; the run's
      ``params["defense"]`` shows it). A bare call with f unset (no federation, so no
      count is known) keeps a default rather than refusing: ⌊(n − 1)/2⌋, the largest
      minority of the round, which removes at least as many updates as any f an honest
      majority allows (so it never keeps more suspects than the paper would); the f used
      is in ``Decision.state["f"]``.
    * ``c``: the filtering fraction; ⌊c·f⌋ updates are removed per iteration (paper
      c = 1). ⌊c·f⌋ must be below the federation's client count (checked at setup,
      :meth:`DnC.check_capacity`); a round thinned below that (churn, stragglers, a
      small hierarchy group) removes n − 1 and keeps the single lowest score, and
      ``Decision.state["short"]`` says so, instead of stopping the run.
    * ``b``: coordinates sampled per iteration (paper 10 000; all of them when d ≤ b).
    * ``niters``: iterations (paper 1); the good set is the intersection.
    * ``weighted``: ``False`` (the paper) averages the good updates plainly;
      ``True`` weights them by the clients' sample counts.

    ``Decision.state``: the f and removal count used (and ``short``: whether the round
    had too few updates for ⌊c·f⌋ removals), each iteration's scores, the good set.
    """

    f: int | None = None
    c: float = 1.0
    b: int = 10_000
    niters: int = 1
    weighted: bool = False
    #: fields that a scenario fills with its malicious count f when left unset
    from_malicious_count: ClassVar[tuple[str, ...]] = ("f",)
    summary: ClassVar[str] = "DnC: drop the c·f largest squared projections on the top singular vector, mean"
    reference: ClassVar[str] = "Shejwalkar & Houmansadr, NDSS 2021"

    def validate_f(self, v: int | None) -> None:
        check_count(self, "f", v)

    def validate_c(self, v: float) -> None:
        check_number(self, "c", v, low=0.0)

    def validate_b(self, v: int) -> None:
        check_count(self, "b", v, allow_none=False, minimum=1)

    def validate_niters(self, v: int) -> None:
        check_count(self, "niters", v, allow_none=False, minimum=1)

    def removals(self, n: int) -> tuple[int, int]:
        """(f, updates removed) for a round of n updates: ⌊c·f⌋, at most n − 1."""
        f = (n - 1) // 2 if self.f is None else self.f
        return f, min(math.floor(self.c * f + 1e-9), max(n - 1, 0))

    def check_capacity(self, most: int) -> None:
        """Refuse, at setup, an f whose ⌊c·f⌋ removals no round of at most ``most`` updates leaves a survivor of."""
        if self.f is None:
            return
        drop = math.floor(self.c * self.f + 1e-9)
        if drop >= most:
            raise param_error(self, "f", self.f, f"removes ⌊c·f⌋ = {drop} updates a round, but a round has at "
                              f"most {most}; must leave at least one (c = {self.c:g})")

    def degradation(self, state: "Mapping[str, Any]", accepted: int) -> str | None:
        """The round's note when ⌊c·f⌋ removals would have left no update (``short``)."""
        if state.get("short") is not True or not isinstance(state.get("removed"), int):
            return None
        removed = int(state["removed"])
        return (f"⌊c·f⌋ removals with f = {state.get('f')} would leave none of the {removed + 1} updates: "
                f"removed {removed}, kept the lowest-scored one")

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        f, drop = self.removals(n)
        ok = finite_rows(updates)
        fin = ok.nonzero().flatten()
        good = torch.ones(n, dtype=torch.bool, device=updates.device)
        all_scores: list[list[float]] = []
        last = torch.full((n,), math.inf, dtype=torch.float64, device=updates.device)
        gen = generator_of(ctx)
        every = fin.numel() == n
        for _ in range(self.niters):
            sub = updates
            if d > self.b:  # columns first: never copy the whole (n, d) matrix
                r = torch.randperm(d, generator=gen)[: self.b].sort().values.to(updates.device)
                sub = updates.index_select(1, r)
            if not every:
                sub = sub.index_select(0, fin)
            scores = torch.full((n,), math.inf, dtype=torch.float64, device=updates.device)
            if fin.numel():
                scores[fin] = dnc_scores(sub)
            keep = torch.zeros(n, dtype=torch.bool, device=updates.device)
            keep[order_low_first(scores, updates)[: n - drop]] = True
            good &= keep & ok  # non-finite rows count among the removals and are never kept
            all_scores.append(scores.tolist())
            last = scores
        w = sample_weights(ctx, n, updates) if self.weighted else torch.ones(n, dtype=updates.dtype,
                                                                           device=updates.device)
        w = torch.where(good, w, torch.zeros_like(w))
        agg = convex_mean(updates, w, ok)
        reasons: dict[int, str] = {}
        for i in (~good).nonzero().flatten().tolist():
            if not bool(ok[i]):
                reasons[i] = "non-finite update (DnC scores it +inf)"
            else:
                reasons[i] = (f"DnC outlier: among the {drop} highest squared projections on the top singular "
                              f"vector (score {float(last[i]):.6g})" if self.niters == 1 else
                              f"DnC outlier: among the {drop} highest squared projections in some iteration")
        weights = w / w.sum() if float(w.sum()) > 0 else w
        return Decision(aggregate=agg, accepted=good, weights=weights, reasons=reasons,
                        state={"f": f, "removed": drop, "short": drop < math.floor(self.c * f + 1e-9),
                               "scores": all_scores,
                               "good": good.nonzero().flatten().tolist()})
