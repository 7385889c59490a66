"""Plain averaging: FedAvg's aggregation rule.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017: the server averages client updates weighted by their sample counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.pipeline import Aggregator, weighted_mean
from redteam.types import Decision, ServerContext, sample_weights

from ._common import finite_rows

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class Mean(Aggregator):
    """(Sample-weighted) mean of all updates; accepts every finite one.

    ``weighted=True`` (the default, as in FedAvg) weights client i by its sample
    count nᵢ: Σ nᵢ xᵢ / Σ nᵢ. ``weighted=False`` is the plain mean. A row with a
    NaN/±Inf entry is rejected ("non-finite update") and the mean is over the rest
    (zeros when no row is finite); finite rows near the float32 overflow are averaged
    in float64.
    """

    weighted: bool = True
    summary: ClassVar[str] = "FedAvg mean (sample-weighted by default)"
    reference: ClassVar[str] = "McMahan et al., AISTATS 2017"
    needs_client_rows: ClassVar[bool] = False  # a weighted sum over a weighted count: sums are enough

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n = updates.shape[0]
        w = sample_weights(ctx, n, updates) if self.weighted else torch.ones(
            n, dtype=updates.dtype, device=updates.device
        )
        agg = weighted_mean(updates, w)
        accepted = torch.ones(n, dtype=torch.bool, device=updates.device)
        reasons: dict[int, str] = {}
        if not (bool(torch.isfinite(agg).all()) and bool((w > 0).all())):
            # a finite mean with every weight positive proves every row finite; else screen
            ok = finite_rows(updates)
            if not bool(ok.all()):
                accepted = ok
                w = w * ok.to(w.dtype)
                reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
                agg = weighted_mean(updates, w)
        return Decision(aggregate=agg, accepted=accepted, weights=w, reasons=reasons)
