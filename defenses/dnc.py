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
own reason) and takes no part in the centring.

Ties (convention ``ties``; Algorithm 2 says only "the n − c·m lowest scores", and no
released code of the authors' settles it). Scores equal up to rounding say no client is
more of an outlier than another, so a cut that falls inside a group of tied scores is
decided without the rows' positions:

* ``"content"`` (default): tied rows are ranked by their content (fingerprints Σⱼxⱼ,
  Σⱼ j·xⱼ), which removes exactly ⌊c·f⌋ whenever the tied rows differ; bit-identical
  rows, which no content can rank, are never split: a copy the cut would remove while
  its twin is kept is kept too (fewer than ⌊c·f⌋ removed). Before, one of several
  identical honest copies was flagged as an outlier quoting a score every copy shares;
* ``"keep"``: no tied group is split; a tied group the cut falls inside is kept whole.

``Decision.state["tie_kept"]`` lists, per iteration, the rows kept by this rule. An
attacker with more identical copies than ⌊c·f⌋ removals keeps all of them rather than
losing some to an arbitrary pick (they are one point either way).

Known weakness (a property of the published rule): the scores read one direction, the
top singular vector, which the widest spread sets; two decoys far out on either side of
another direction take it over, the ⌊c·f⌋ removals go to the decoys and the honest rows
spread along it, and 4 of 4 malicious rows off it get through (caught without decoys).
The attack ``dnc_decoys`` (attacks/steer.py) does this; scenarios/weaknesses.toml shows it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error, sample_weights

from ._common import TINY64, check_choice, check_count, check_number, finite_rows, generator_of, rescale_pow2
from ._stats import convex_mean, order_low_first, tie_classes

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

__all__ = ["DnC", "dnc_scores"]


def dnc_scores(sub: "torch.Tensor") -> "torch.Tensor":
    """Outlier scores ``(n,)`` float64 of the rows of ``sub`` ``(n, b)`` (finite rows):
    the squared projection of each centred row on the top right singular vector.

    Scores scale with the square of the rows; rows so large that a sum overflows (largest
    entry above 1e150), or so small that the products underflow (below 2⁻³⁰⁰: at 1e-170
    every score was 0, every row tied and the tie went to the rows' fingerprints, which
    the senders set), are scored after an exact power-of-two rescaling that brings the
    largest entry into [½, 1), in units of that scale² (the ranking, all DnC uses, is the
    one of the rows, whatever power of two they are multiplied by)."""
    import torch

    x = sub.to(torch.float64)
    x, _ = rescale_pow2(x, low=TINY64, high=1e150, target=0)  # centring or the Gram could over/underflow
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
    * ``ties``: a cut inside tied scores (module docstring): ``"content"`` ranks tied
      rows by content and never splits bit-identical rows; ``"keep"`` keeps every tied
      group the cut falls inside.

    ``Decision.state``: the f and removal count used (and ``short``: whether the round
    had too few updates for ⌊c·f⌋ removals), each iteration's scores and rows kept by the
    tie rule (``tie_kept``), the good set.
    """

    f: int | None = None
    c: float = 1.0
    b: int = 10_000
    niters: int = 1
    weighted: bool = False
    ties: Literal["content", "keep"] = "content"
    #: fields that a scenario fills with its malicious count f when left unset
    from_malicious_count: ClassVar[tuple[str, ...]] = ("f",)
    summary: ClassVar[str] = "DnC: drop the c·f largest squared projections on the top singular vector, mean"
    reference: ClassVar[str] = "Shejwalkar & Houmansadr, NDSS 2021"

    def validate_f(self, v: int | None) -> None:
        check_count(self, "f", v)

    def validate_c(self, v: float) -> None:
        # c·f clients are removed; beyond a million times f no round has that many (and c·f would overflow)
        check_number(self, "c", v, low=0.0, high=1e6)

    def validate_b(self, v: int) -> None:
        check_count(self, "b", v, allow_none=False, minimum=1)

    def validate_niters(self, v: int) -> None:
        check_count(self, "niters", v, allow_none=False, minimum=1)

    def validate_ties(self, v: str) -> None:
        check_choice(self, "ties", v, ("content", "keep"))

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

    def _spared(self, scores: "torch.Tensor", order: "torch.Tensor", kept: int, updates: "torch.Tensor",
                ok: "torch.Tensor") -> "torch.Tensor":
        """Finite rows past the cut (``order[kept:]``) whose score ties the last kept one and
        that the tie rule keeps: all of them (``"keep"``) or those bit-identical to a kept
        row of that tie (``"content"``)."""
        import torch

        none = torch.empty(0, dtype=torch.long, device=scores.device)
        if kept <= 0 or kept >= scores.shape[0]:
            return none
        classes = tie_classes(scores)
        edge = classes[order[kept - 1]]
        out = order[kept:]
        cand = out[(classes[out] == edge) & ok.to(scores.device)[out]]
        if cand.numel() == 0 or self.ties == "keep":
            return cand
        ins = order[:kept]
        rows = updates.index_select(0, ins[classes[ins] == edge].to(updates.device))
        same = [i for i in cand.tolist() if bool((rows == updates[i]).all(dim=1).any())]
        return torch.tensor(same, dtype=torch.long, device=scores.device)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        f, drop = self.removals(n)
        ok = finite_rows(updates)
        fin = ok.nonzero().flatten()
        good = torch.ones(n, dtype=torch.bool, device=updates.device)
        all_scores: list[list[float]] = []
        tie_kept: list[list[int]] = []
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
            order = order_low_first(scores, updates)
            keep[order[: n - drop]] = True
            spared = self._spared(scores, order, n - drop, updates, ok) if drop else order[:0]
            keep[spared.to(updates.device)] = True
            tie_kept.append(sorted(spared.tolist()))
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
                               "scores": all_scores, "tie_kept": tie_kept,
                               "good": good.nonzero().flatten().tolist()})
