"""Coordinate-wise median and coordinate-wise trimmed mean.

Yin, Chen, Ramchandran & Bartlett, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates", ICML 2018. Both rules act on every coordinate j
separately: the median of the n values x₁ⱼ … xₙⱼ, or, after sorting them, the mean
of what is left once the b smallest and the b largest are dropped. Both ignore the
clients' claimed sample counts (a Byzantine client can claim any count).

A row with a NaN/±Inf entry is rejected ("non-finite update") and both rules run on
the finite rows (the trimmed mean's b is lowered to ⌊(n' − 1)/2⌋ when fewer n' rows
are left and the requested b no longer fits; ``state["b"]`` reports the b used).
Sums are accumulated in float64, so float32 rows near ±3.4e38 give a finite result;
float64 rows whose sums overflow float64 are refused with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error

from ._common import (check_choice, check_count, finite_or_refuse, finite_rows, halves_reduce, kth_of_two,
                      order_statistics, trimmed_means32)

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

__all__ = ["Median", "TrimmedMean", "coordinate_median", "trimmed_mean"]


def coordinate_median(updates: "torch.Tensor", even_rule: str = "midpoint") -> "torch.Tensor":
    """Median of every column of ``updates`` ``(n, d)`` → ``(d,)``.

    For even n, ``even_rule="midpoint"`` averages the two middle values (the usual
    statistical median), as ½·lower + ½·upper in the input's dtype (no overflow near the
    largest float); ``"lower"`` takes the lower one (what ``torch.median`` does). NaN counts
    as +inf. The sign of a zero median is not specified when -0.0 and +0.0 meet in the middle.
    """
    n = updates.shape[0]
    k = (n - 1) // 2
    if n % 2 == 1 or even_rule == "lower":
        return order_statistics(updates, (k,))[0]
    s = order_statistics(updates, (k, k + 1))
    return 0.5 * s[0] + 0.5 * s[1]


def trimmed_mean(updates: "torch.Tensor", b: int) -> "torch.Tensor":
    """Per column: drop the ``b`` smallest and ``b`` largest values, average the rest.

    With s the sorted column, lo = s[b] and hi = s[n−1−b], clamping every value to
    [lo, hi] turns the b values below lo into lo and the b above hi into hi, so
    Σ_{b ≤ r < n−b} s[r] = Σ clamp(x, lo, hi) − b·lo − b·hi, exactly, and the dropped
    values (however huge) never enter a sum. Sums are accumulated in float64 (the values
    widened first: torch sums a float32 column into float64 several times slower than
    it sums a float64 one, in the same order), over the two sorted halves of the rows.

    float32 on CPU: the sorted kept values are summed directly, and every column where
    that provably gives the same float32 bits (almost all:
    :func:`~defenses._common.trimmed_means32`) is taken from there; the others, and every
    other dtype or device, take the halves' sums above.
    """
    import torch

    n = updates.shape[0]
    if updates.dtype == torch.float32 and updates.device.type == "cpu" and n > 0 and updates.shape[1] > 0:
        out, settled = trimmed_means32(updates, b)
        if not bool(settled.all()):
            redo = ~settled
            out[redo] = _trimmed_mean_halves(updates, b, redo)[redo]
        return out
    return _trimmed_mean_halves(updates, b)


def _trimmed_mean_halves(updates: "torch.Tensor", b: int, columns: "torch.Tensor | None" = None) -> "torch.Tensor":
    """:func:`trimmed_mean` over the sorted halves (what defines its bits); ``columns``
    (bool ``(d,)``): only those are needed, the others are left undefined."""
    import torch

    n = updates.shape[0]
    keep = n - 2 * b

    def reduce(lo_half: "torch.Tensor", hi_half: "torch.Tensor") -> "torch.Tensor":
        if b == 0:
            total = lo_half.to(torch.float64).sum(dim=0) + hi_half.to(torch.float64).sum(dim=0)
            return total / keep
        lo = kth_of_two(lo_half, hi_half, b)
        hi = kth_of_two(lo_half, hi_half, n - 1 - b)
        total = torch.clamp(lo_half, lo, hi).to(torch.float64).sum(dim=0)
        total += torch.clamp(hi_half, lo, hi).to(torch.float64).sum(dim=0)
        total -= b * (lo.to(torch.float64) + hi.to(torch.float64))
        return total / keep

    return halves_reduce(updates, reduce, columns=columns, local=True)  # each column from its own values


def _screen(updates: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor", dict[int, str]]:
    """(finite rows, accepted mask, reasons): non-finite rows are rejected."""
    ok = finite_rows(updates)
    reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
    return (updates if not reasons else updates[ok]), ok, reasons


@dataclass(frozen=True, slots=True)
class Median(Aggregator):
    """Coordinate-wise median (Yin et al., ICML 2018); tolerates f < n/2 per coordinate.

    * ``even_rule``: for an even number of updates, ``"midpoint"`` (default: the mean
      of the two middle values, the textbook median) or ``"lower"`` (the lower middle
      value, as ``torch.median`` and several libraries compute it).
    """

    even_rule: Literal["midpoint", "lower"] = "midpoint"
    summary: ClassVar[str] = "Coordinate-wise median"
    reference: ClassVar[str] = "Yin et al., ICML 2018"

    def validate_even_rule(self, v: str) -> None:
        check_choice(self, "even_rule", v, ("midpoint", "lower"))

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        rows, ok, reasons = _screen(updates)
        if rows.shape[0] == 0:
            return Decision(aggregate=torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device),
                            accepted=ok, reasons=reasons)
        agg = finite_or_refuse(self, coordinate_median(rows, self.even_rule), rows)
        return Decision(aggregate=agg, accepted=ok, reasons=reasons)


@dataclass(frozen=True, slots=True)
class TrimmedMean(Aggregator):
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018).

    * ``b``: how many values are dropped **per side** of every coordinate (a count,
      not a fraction); the mean is over the n − 2b values left. It must satisfy
      2b < n for the federation's size (refused at setup otherwise); a round thinned by
      churn below that drops ⌊(n − 1)/2⌋ per side and records ``b_reduced_from`` in
      ``Decision.state``. Yin et al. require b ≥ f (the reference code uses b = f). In a scenario
      run an unset b is **derived from the scenario's malicious count**: b = f (the
      builder fills it in before the run, so the run's parameters show the value; see
      ``from_malicious_count``). A bare call with b unset is refused: the rule never
      falls back to the median on its own. The value used is reported in
      ``Decision.state["b"]``.
    """

    b: int | None = None
    #: fields that a scenario fills with its malicious count f when left unset
    from_malicious_count: ClassVar[tuple[str, ...]] = ("b",)
    summary: ClassVar[str] = "Coordinate-wise trimmed mean, b values dropped per side"
    reference: ClassVar[str] = "Yin et al., ICML 2018"

    def validate_b(self, v: int | None) -> None:
        check_count(self, "b", v)

    def resolve_b(self, n: int) -> int:
        """The count per side used for a round of ``n`` updates: ``b``, or the most a round
        that small can drop (⌊(n − 1)/2⌋, the median) when churn or screening thinned it
        below 2b + 1 — the run goes on and ``Decision.state`` says so. An unset b is refused;
        a b that no round of the federation could hold is refused at setup
        (:meth:`check_capacity`)."""
        if self.b is None:
            raise param_error(self, "b", None, "is unset: give the count dropped per side (Yin et al. need "
                                               "b ≥ f); in a scenario it defaults to the malicious count")
        return min(self.b, max((n - 1) // 2, 0))

    def check_capacity(self, most: int) -> None:
        """Refuse, at setup, a b that no round of at most ``most`` updates can trim (2b < n)."""
        if self.b is not None and 2 * self.b >= most:
            raise param_error(self, "b", self.b, f"must satisfy 2b < n, and a round has at most n = {most} "
                                                 f"updates (so b ≤ {(most - 1) // 2})")

    def degradation(self, state: "Mapping[str, Any]", accepted: int) -> str | None:
        """The round's note when it had fewer than 2b + 1 updates (``b_reduced_from``)."""
        if state.get("b_reduced_from") is None or "b" not in state:
            return None
        return f"b reduced from {state['b_reduced_from']} to {state['b']} ({accepted} updates)"

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        self.resolve_b(int(updates.shape[0]))  # refuses an unset b
        rows, ok, reasons = _screen(updates)
        if rows.shape[0] == 0:
            return Decision(aggregate=torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device),
                            accepted=ok, reasons=reasons, state={"b": 0})
        b = self.resolve_b(int(rows.shape[0]))
        state: dict[str, Any] = {"b": b}
        if b < int(self.b or 0):  # a round thinned by churn or by screening: as much trimming as it holds
            state["b_reduced_from"] = int(self.b or 0)
        agg = finite_or_refuse(self, trimmed_mean(rows, b), rows)
        return Decision(aggregate=agg, accepted=ok, reasons=reasons, state=state)
