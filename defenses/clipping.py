"""Centered clipping (an aggregator) and static L2 clipping (a pre-aggregator).

* Karimireddy, He & Jaggi, "Learning from History for Byzantine Robust Optimization",
  ICML 2021. Starting from v₀ (the previous round's aggregate, i.e. the server-side
  momentum; zero in the first round), repeat ``n_iter`` times

      v ← v + (1/n) Σᵢ (xᵢ − v) · min(1, τ / ‖xᵢ − v‖),

  and return v. The paper pairs it with worker momentum (clients send momenta);
  that is the clients' business, not the aggregator's. The previous aggregate is
  explicit state: it is returned in ``Decision.state["previous"]`` and read back from
  ``ctx.state["previous"]``; no hidden mutation.
* Static clipping, Sun, Kairouz, Suresh & McMahan, "Can You Really Backdoor Federated
  Learning?", arXiv:1911.07963 (2019): every row becomes xᵢ·min(1, M/‖xᵢ‖) before
  whatever aggregator follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator, PreAggregator
from redteam.types import Decision, ServerContext

from ._common import check_count, check_number, combine, finite_rows, row_norms

if TYPE_CHECKING:
    import torch

__all__ = ["CenteredClipping", "Clip", "distances_to"]


def distances_to(x: "torch.Tensor", v: "torch.Tensor", chunk: int = 16384) -> "torch.Tensor":
    """‖xᵢ − v‖₂ for every row, differences taken directly (no cancellation).

    Each column block's norms come from :func:`row_norms` (fast float32, float64 where
    the squares could overflow or underflow) and are summed in float64.
    """
    import torch

    n, d = x.shape
    acc = torch.zeros(n, dtype=torch.float64, device=x.device)
    for start in range(0, d, chunk):
        acc += row_norms(x[:, start:start + chunk] - v[start:start + chunk]).square()
    return acc.sqrt()


@dataclass(frozen=True, slots=True)
class CenteredClipping(Aggregator):
    """Centered clipping (Karimireddy, He & Jaggi, ICML 2021).

    * ``tau``: the clipping radius τ around the current centre;
    * ``n_iter``: the number L of clipping iterations.

    Defaults τ = 100, L = 1 are those of the authors' released CIFAR-10 experiments
    for this paper (their later bucketing paper, ICLR 2022, uses τ = 10, L = 3);
    τ is on the scale of the updates, so set it for your workload.

    The starting point is ``ctx.state["previous"]`` (the aggregate this rule returned
    last round), zero when absent. Rows with a non-finite entry contribute nothing
    (as if they sat on the centre) but still count in the 1/n, like the paper's
    asynchronous variant treats missing inputs; they are reported as rejected.
    ``Decision.weights`` are the coefficients wᵢ with v = a·v₀ + Σ wᵢ xᵢ.
    """

    tau: float = 100.0
    n_iter: int = 1
    summary: ClassVar[str] = "Centered clipping around the previous aggregate (explicit state)"
    reference: ClassVar[str] = "Karimireddy, He & Jaggi, ICML 2021"

    def validate_tau(self, v: float) -> None:
        check_number(self, "tau", v, low=0.0, low_open=True)

    def validate_n_iter(self, v: int) -> None:
        check_count(self, "n_iter", v, allow_none=False, minimum=1)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        ok = finite_rows(updates)
        prev = ctx.state.get("previous") if ctx.state else None
        if prev is None:
            v = torch.zeros(d, dtype=updates.dtype, device=updates.device)
        else:
            prev = torch.as_tensor(prev)
            if prev.shape != (d,) or not bool(torch.isfinite(prev).all()):
                raise InvalidParameter(
                    f"CenteredClipping: ctx.state['previous'] must be a finite vector of shape ({d},), "
                    f"got shape {tuple(prev.shape)}"
                )
            v = prev.to(dtype=updates.dtype, device=updates.device)
        a = 1.0  # coefficient of v0
        w = torch.zeros(n, dtype=torch.float64, device=updates.device)
        at_origin = prev is None
        for _ in range(self.n_iter):
            dist = row_norms(updates) if at_origin else distances_to(updates, v)
            at_origin = False
            s = torch.clamp(self.tau / dist.clamp_min(1e-300), max=1.0)
            s = torch.where(ok, s, torch.zeros_like(s))
            shrink = 1.0 - float(s.sum()) / n
            v = v * shrink + combine(s / n, updates, ok)
            a *= shrink
            w = w * shrink + s / n
        reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        return Decision(
            aggregate=v,
            accepted=ok,
            weights=w.to(updates.dtype),
            reasons=reasons,
            state={"previous": v.detach().clone(), "start_coefficient": a},
        )


@dataclass(frozen=True, slots=True)
class Clip(PreAggregator):
    """Static L2 clipping of every row to norm ≤ ``bound`` (Sun et al. 2019).

    A pre-aggregator: ``Pipeline((Clip(bound=M), Median()))`` clips, then takes the
    median. Used alone it is followed by the sample-weighted mean. Sun et al. used
    M = 3 on EMNIST; M is on the scale of the updates, so set it for your workload.
    Rows with a non-finite entry pass through unchanged (put ``sanity`` first).
    """

    bound: float = 1.0
    screens_nonfinite: ClassVar[bool] = False  # rows pass through: put `sanity` (or a rule that screens) first
    summary: ClassVar[str] = "Static L2 clipping of each update to norm ≤ M (pre-aggregation)"
    reference: ClassVar[str] = "Sun et al., arXiv:1911.07963, 2019"

    def validate_bound(self, v: float) -> None:
        check_number(self, "bound", v, low=0.0, low_open=True)

    def transform(
        self, updates: "torch.Tensor", weights: "torch.Tensor", ctx: ServerContext
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        norms = row_norms(updates)
        scale = torch.clamp(self.bound / norms.clamp_min(1e-300), max=1.0)
        scale = torch.where(torch.isfinite(norms), scale, torch.ones_like(scale))
        return updates * scale.to(updates.dtype)[:, None], weights
