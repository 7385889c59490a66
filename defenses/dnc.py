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
eigenvector, v = X̃ᵀu/‖X̃ᵀu‖: the n × b matrix is never decomposed. The projections
⟨xᵢ − μ, v⟩ are taken row by row, each at its own power-of-two scale, from the row's
difference to the coordinate median, and centred in exact rational arithmetic
(:func:`dnc_ranking`): one huge row sets μ, and the other rows' scores, taken from
xᵢ − μ, kept nothing of those rows (issue 35 §5). A non-finite update scores +∞ (it is
one of the c·f removed, with its own reason) and takes no part in the centring.

Ties (convention ``ties``; Algorithm 2 says only "the n − c·m lowest scores", and no
released code of the authors' settles it). Scores equal up to rounding say no client is
more of an outlier than another, so a cut that falls inside a group of tied scores is
decided without the rows' positions. Each score's rounding is that of its own row (a few
ulps of the row's distance to the coordinate median), so a far row cannot make the others
tie (one row 10¹² times the others' size made every other score tie, and the content rule
then kept a row whose exact score ranked second):

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
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error, sample_weights

from ._common import (TINY64, check_choice, check_count, check_number, finite_rows, generator_of, rescale_pow2,
                      times_pow2)
from ._stats import convex_mean, order_low_first

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

__all__ = ["DnC", "dnc_ranking", "dnc_scores"]


#: two rows' projections tie when they differ by at most this × the sum of their lengths (each
#: row measured from the reference point): values equal in exact arithmetic differ by a few ulps
#: of those lengths, depending on the order of the sums and on the rounding of the direction
RTOL = 1e-9


def dnc_scores(sub: "torch.Tensor") -> "torch.Tensor":
    """Outlier scores ``(n,)`` float64 of the rows of ``sub`` ``(n, b)`` (finite rows):
    the squared projection of each centred row on the top right singular vector
    (:func:`dnc_ranking` has their tie classes too)."""
    return dnc_ranking(sub)[0]


def dnc_ranking(sub: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """(scores, tie classes) of the rows of ``sub`` ``(n, b)`` (finite rows): the squared
    projection sᵢ = ⟨xᵢ − μ, v⟩² of each centred row on the top right singular vector v, and
    ``(n,)`` int64 classes numbering the scores from the lowest up, rows whose scores are equal
    up to rounding sharing one.

    The direction v depends on the rows' spread only; it is taken from the centred rows after
    one exact power-of-two rescaling (rows so large that a sum overflows, largest entry above
    1e150, or so small that the products underflow, below 2⁻³⁰⁰). The projections are not:
    one huge row sets the mean μ, and ⟨xᵢ − μ, v⟩ computed from xᵢ − μ kept nothing of the
    other rows (at 10¹² times their size their scores fell within 10⁻¹² of each other, a tie
    broken by their content; at 10¹⁵⁰ they were equal). So each row's projection is taken from
    its own difference to a reference point r (the coordinate median), at its own power-of-two
    scale: aᵢ = ⟨xᵢ − r, v⟩, accurate to a few ulps of ‖xᵢ − r‖, and the projections are
    aᵢ − ā (ā their mean) in exact rational arithmetic. Ranked by |aᵢ − ā|, two neighbours
    tie when they differ by at most ``RTOL`` × ‖xᵢ − r‖ + ``RTOL`` × ‖xⱼ − r‖ (plus the mean's
    own error when they lie on opposite sides of it): a far row cannot widen a tie of others.

    Scores are reported in units of the rescaled rows (the rows × 2ᵏ, scores × 2²ᵏ; k = 0 for
    rows inside that range): the ranking, all DnC uses, is the one of the rows, whatever power
    of two they are multiplied by."""
    import torch

    x = sub.to(torch.float64)
    n = x.shape[0]
    scaled, k = rescale_pow2(x, low=TINY64, high=1e150, target=0)  # centring or the Gram could over/underflow
    v = _top_direction(scaled)
    if v is None:  # no spread (or none float64 can measure): every score 0, one class
        return (torch.zeros(n, dtype=torch.float64, device=x.device),
                torch.zeros(n, dtype=torch.int64, device=x.device))
    proj, length = _projections(x, v)
    mean = sum(proj, Fraction(0)) / n
    p = [a - mean for a in proj]
    unit = Fraction(2) ** (2 * k)
    scores = torch.tensor([_as_float(q * q * unit) for q in p], dtype=torch.float64, device=x.device)
    return scores, _tie_classes(p, [Fraction(RTOL) * s for s in length])


def _top_direction(x: "torch.Tensor") -> "torch.Tensor | None":
    """The top right singular vector ``(b,)`` (unit length) of the centred rows of ``x``, from
    the n × n eigenproblem of X̃X̃ᵀ (v = X̃ᵀu/‖X̃ᵀu‖); ``None`` when the rows do not spread."""
    import torch

    centred = x - x.mean(dim=0, keepdim=True)
    gram = centred @ centred.T
    scale = float(gram.diagonal().max()) if gram.numel() else 0.0
    if not scale > 0 or not math.isfinite(scale):
        return None
    _, evecs = torch.linalg.eigh(gram / scale)  # normalised: huge rows do not overflow eigh
    v = centred.T @ evecs[:, -1]
    size = float(torch.linalg.vector_norm(v))
    if not size > 0 or not math.isfinite(size):
        return None
    return v / size


def _projections(x: "torch.Tensor", v: "torch.Tensor") -> tuple[list[Fraction], list[Fraction]]:
    """aᵢ = ⟨xᵢ − r, v⟩ and ‖xᵢ − r‖ of every row, exact rationals of float64 results, with r the
    coordinate median of the rows. Row i and r are taken times 2^eᵢ, the power of two that brings
    the larger of their largest entries into [½, 1) (exact), so the difference rounds once, no
    product of a tiny row underflows and no sum of a huge one overflows."""
    import torch

    n = x.shape[0]
    ref = x.median(dim=0).values
    peak = (torch.maximum(x.abs().amax(dim=1), ref.abs().max()) if x.shape[1]
            else torch.zeros(n, dtype=x.dtype, device=x.device))
    e = torch.where(peak > 0, -torch.frexp(peak).exponent.to(torch.int64), torch.zeros_like(peak, dtype=torch.int64))
    y = times_pow2(x, e) - times_pow2(ref.expand(n, -1), e)
    a, length = (y @ v).tolist(), torch.linalg.vector_norm(y, dim=1).tolist()
    unit = [Fraction(2) ** -int(k) for k in e.tolist()]
    return [Fraction(ai) * u for ai, u in zip(a, unit)], [Fraction(li) * u for li, u in zip(length, unit)]


def _tie_classes(p: list[Fraction], tol: list[Fraction]) -> "torch.Tensor":
    """Classes ``(n,)`` int64 of the values |pᵢ|, from the lowest up: neighbours in that order
    share a class when they differ by at most tolᵢ + tolⱼ, plus twice the mean tolerance when pᵢ
    and pⱼ have different signs (|pᵢ| − |pⱼ| then depends on the mean the pᵢ are taken from)."""
    import torch

    n = len(p)
    shared = 2 * sum(tol, Fraction(0)) / max(n, 1)
    order = sorted(range(n), key=lambda i: abs(p[i]))
    classes = [0] * n
    c = 0
    for prev, cur in zip(order, order[1:]):
        allow = tol[prev] + tol[cur]
        if (p[prev] > 0) != (p[cur] > 0) or p[prev] == 0 or p[cur] == 0:
            allow += shared
        if abs(p[cur]) - abs(p[prev]) > allow:
            c += 1
        classes[cur] = c
    return torch.tensor(classes, dtype=torch.int64)


def _as_float(q: Fraction) -> float:
    """``q`` as the nearest float64; +inf beyond its range (a score, reported only)."""
    try:
        return float(q)
    except OverflowError:
        return math.inf


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

    def _spared(self, classes: "torch.Tensor", order: "torch.Tensor", kept: int, updates: "torch.Tensor",
                ok: "torch.Tensor") -> "torch.Tensor":
        """Finite rows past the cut (``order[kept:]``) whose score ties the last kept one (the
        same tie class) and that the tie rule keeps: all of them (``"keep"``) or those
        bit-identical to a kept row of that tie (``"content"``)."""
        import torch

        none = torch.empty(0, dtype=torch.long, device=classes.device)
        if kept <= 0 or kept >= classes.shape[0]:
            return none
        edge = classes[order[kept - 1]]
        out = order[kept:]
        cand = out[(classes[out] == edge) & ok.to(classes.device)[out]]
        if cand.numel() == 0 or self.ties == "keep":
            return cand
        ins = order[:kept]
        rows = updates.index_select(0, ins[classes[ins] == edge].to(updates.device))
        same = [i for i in cand.tolist() if bool((rows == updates[i]).all(dim=1).any())]
        return torch.tensor(same, dtype=torch.long, device=classes.device)

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
            classes = torch.full((n,), fin.numel(), dtype=torch.int64, device=updates.device)  # non-finite: last
            if fin.numel():
                scores[fin], classes[fin] = (t.to(updates.device) for t in dnc_ranking(sub))
            keep = torch.zeros(n, dtype=torch.bool, device=updates.device)
            order = order_low_first(classes, updates)
            keep[order[: n - drop]] = True
            spared = self._spared(classes, order, n - drop, updates, ok) if drop else order[:0]
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
