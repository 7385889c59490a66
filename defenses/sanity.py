"""Cheap validation filters: finiteness and shape, and an update-norm z-score.

These are the first rules of the delta-validation conjunction that deployed
federated and decentralized trainers run before aggregation (finiteness
and a per-entry bound, plus the shape check every decoder performs), and
the magnitude outlier test that anomaly-detection defenses build on: flag an
update whose norm is more than ``threshold`` standard deviations from the round's
centre, with the centre and spread either plain (mean, standard deviation) or
robust (median, 1.4826 × median absolute deviation; Rousseeuw & Croux, JASA 1993,
so that the scale is consistent with the standard deviation under normality).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext

from ._common import check_choice, check_count, check_number, finite_rows, row_norms

if TYPE_CHECKING:
    import torch

__all__ = ["Sanity", "ZScore", "norm_zscores"]


@dataclass(frozen=True, slots=True)
class Sanity(Filter):
    """Reject updates that are not finite, not the model's size, or too large per entry.

    * ``max_abs``: optional bound M∞ on every entry, accept iff max |Δᵢⱼ| ≤ M∞;
      unset means no bound.

    The size check compares d with ``ctx.global_params.numel()`` when the context
    carries the global parameters, and passes otherwise. A non-floating dtype is
    rejected as well (a delta is real-valued).
    """

    max_abs: float | None = None
    summary: ClassVar[str] = "Finite / shape / dtype check (and optional per-entry bound)"
    reference: ClassVar[str] = "IEEE 754 finiteness; Sun et al., arXiv:1911.07963 (per-update bounds)"

    def validate_max_abs(self, v: float | None) -> None:
        check_number(self, "max_abs", v, low=0.0, low_open=True, allow_none=True)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        n, d = updates.shape
        reasons: dict[int, str] = {}
        if not (updates.dtype.is_floating_point):
            reasons = {i: f"dtype {updates.dtype} is not a floating-point type" for i in range(n)}
            return FilterResult(updates=updates, accepted=torch.zeros(n, dtype=torch.bool, device=updates.device),
                                reasons=reasons)
        if ctx.global_params is not None and int(ctx.global_params.numel()) != d:
            expected = int(ctx.global_params.numel())
            reasons = {i: f"update has {d} entries, the model has {expected}" for i in range(n)}
            return FilterResult(updates=updates, accepted=torch.zeros(n, dtype=torch.bool, device=updates.device),
                                reasons=reasons)
        ok = finite_rows(updates)
        for i in (~ok).nonzero().flatten().tolist():
            n_bad = int((~torch.isfinite(updates[i])).sum())
            reasons[i] = f"non-finite update ({n_bad} NaN/Inf entries)"
        state = {}
        if self.max_abs is not None:
            peak = torch.maximum(updates.amax(dim=1), -updates.amin(dim=1)) if d else \
                torch.zeros(n, dtype=updates.dtype, device=updates.device)
            over = ok & (peak > self.max_abs)
            for i in over.nonzero().flatten().tolist():
                reasons[i] = f"max |Δ| = {float(peak[i]):.4g} > max_abs {self.max_abs:g}"
            ok = ok & ~over
            state = {"max_abs": self.max_abs}
        return FilterResult(updates=updates, accepted=ok, reasons=reasons, state=state)


def norm_zscores(norms: "torch.Tensor", statistic: str = "robust", ddof: int = 1) -> "torch.Tensor":
    """z = (‖Δᵢ‖ − centre) / scale over the given norms (float64).

    ``statistic="robust"``: centre = median (midpoint for an even count), scale =
    1.4826·MAD. ``"plain"``: centre = mean, scale = standard deviation with ``ddof``.
    Where the scale is 0, z is 0 at the centre and ±inf elsewhere; where it is
    undefined (too few values), z is 0.
    """
    import torch

    x = norms.to(torch.float64)
    k = x.shape[0]
    if k == 0:
        return x
    if statistic == "robust":
        s = torch.sort(x).values
        centre = s[(k - 1) // 2] if k % 2 else 0.5 * (s[k // 2 - 1] + s[k // 2])
        dev = torch.sort((x - centre).abs()).values
        mad = dev[(k - 1) // 2] if k % 2 else 0.5 * (dev[k // 2 - 1] + dev[k // 2])
        scale = 1.4826 * mad
    else:
        centre = x.mean()
        if k - ddof <= 0:
            return torch.zeros_like(x)
        scale = x.std(correction=ddof)
    diff = x - centre
    if float(scale) > 0:
        return diff / scale
    inf = torch.full_like(diff, float("inf"))
    return torch.where(diff == 0, torch.zeros_like(diff), torch.copysign(inf, diff))


@dataclass(frozen=True, slots=True)
class ZScore(Filter):
    """Reject updates whose L2 norm is an outlier among this round's norms.

    * ``threshold``: reject when z > threshold (``side="upper"``) or |z| > threshold
      (``side="both"``, which also catches near-zero free-rider updates);
    * ``statistic``: ``"robust"`` (median and 1.4826·MAD, default: a few huge updates
      cannot inflate the scale that judges them) or ``"plain"`` (mean and std);
    * ``ddof``: the standard deviation's delta degrees of freedom for ``"plain"``.

    Non-finite updates are rejected first and left out of the statistics.
    """

    threshold: float = 3.0
    statistic: Literal["robust", "plain"] = "robust"
    side: Literal["upper", "both"] = "upper"
    ddof: int = 1
    summary: ClassVar[str] = "Reject updates whose norm z-score (robust or plain) exceeds a threshold"
    reference: ClassVar[str] = "Rousseeuw & Croux, JASA 1993 (MAD scale)"

    def validate_threshold(self, v: float) -> None:
        check_number(self, "threshold", v, low=0.0, low_open=True)

    def validate_statistic(self, v: str) -> None:
        check_choice(self, "statistic", v, ("robust", "plain"))

    def validate_side(self, v: str) -> None:
        check_choice(self, "side", v, ("upper", "both"))

    def validate_ddof(self, v: int) -> None:
        check_count(self, "ddof", v, allow_none=False)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        ok = finite_rows(updates)
        reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        norms = row_norms(updates)
        z = torch.zeros_like(norms)
        z[ok] = norm_zscores(norms[ok], self.statistic, self.ddof)
        score = z if self.side == "upper" else z.abs()
        keep = ok & (score <= self.threshold)
        for i in (ok & ~keep).nonzero().flatten().tolist():
            reasons[i] = f"norm {float(norms[i]):.4g} has z-score {float(z[i]):.3g} beyond ±{self.threshold:g}" \
                if self.side == "both" else \
                f"norm {float(norms[i]):.4g} has z-score {float(z[i]):.3g} > {self.threshold:g}"
        return FilterResult(updates=updates, accepted=keep, reasons=reasons,
                            state={"zscores": z.tolist()})
