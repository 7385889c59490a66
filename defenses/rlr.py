"""Robust learning rate (RLR): flip the server step where the clients' signs disagree.

Ozdayi, Kantarcioglu & Gel, "Defending against Backdoors in Federated Learning with
Robust Learning Rate", AAAI 2021. For every coordinate k the server counts the signs
of the n updates; where the agreement is weak the learning rate is negated:

    η_θ,k = +η   if |Σᵢ sgn(Δᵢ,ₖ)| ≥ θ,
    η_θ,k = −η   otherwise,

and the server steps w ← w + η_θ ⊙ (Σᵢ nᵢΔᵢ / Σᵢ nᵢ). A backdoor pushes coordinates
that the honest agents do not care about (their signs cancel), so only the corrupt
agents agree there, and with θ above their number those coordinates move backwards.

Here the server step η is the server optimizer's (after the defense), so the
aggregate is s ⊙ mean with sₖ = ±1. Signs are unweighted (one vote per client);
sgn(0) = 0. Everyone is accepted except non-finite updates, which neither vote nor
enter the mean.

A fixed θ meets rounds of different sizes (client churn, stragglers, hierarchy groups).
A round of n < θ agents is still the paper's rule: |Σᵢ sgn| ≤ n < θ on every coordinate,
so every coordinate's rate is −η (the step is the negated mean). The round runs and
``Decision.state`` says so (``theta_above_n``, with ``flipped`` = d); only a θ that no
round of the federation can reach (θ above its client count) is refused, at setup
(:meth:`RLR.check_capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error, sample_weights

from ._common import check_count, finite_rows
from ._stats import convex_mean

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

__all__ = ["RLR", "sign_votes"]

_BLOCK = 1 << 16


def sign_votes(updates: "torch.Tensor") -> "torch.Tensor":
    """Σᵢ sgn(xᵢₖ) for every column k, as int32 ``(d,)`` (column blocks bound the memory)."""
    import torch

    d = updates.shape[1]
    out = torch.empty(d, dtype=torch.int32, device=updates.device)
    for start in range(0, d, _BLOCK):
        block = updates[:, start:start + _BLOCK]
        # sgn ∈ {−1, 0, 1} summed in float32: exact for n < 2²⁴ (NaN rows are screened out before)
        out[start:start + block.shape[1]] = torch.sign(block).sum(dim=0, dtype=torch.float32).to(torch.int32)
    return out


@dataclass(frozen=True, slots=True)
class RLR(Aggregator):
    """Robust learning rate (Ozdayi et al., AAAI 2021): sign-agreement threshold θ.

    * ``theta``: the threshold θ on |Σ sgn|, θ ≥ 1 and at most the federation's client
      count (checked at setup); a round with fewer than θ updates flips every coordinate.
      The paper tunes it per task and asks for θ larger than the number of corrupt
      agents; unset means f + 1 for the largest minority f = ⌊(n − 1)/2⌋, i.e. θ = ⌈n/2⌉.
    * ``weighted``: ``True`` (the paper: FedAvg's sample-weighted mean) or ``False``
      (plain mean).

    ``Decision.state``: θ, the round's n, whether θ exceeded n (``theta_above_n``: a
    round thinned by churn or stragglers below θ has every coordinate flipped, as the
    formula says, instead of stopping the run), and how many coordinates had their
    step flipped.
    """

    theta: int | None = None
    weighted: bool = True
    summary: ClassVar[str] = "RLR: per-coordinate learning rate −η where |Σ sign| < θ"
    reference: ClassVar[str] = "Ozdayi, Kantarcioglu & Gel, AAAI 2021"

    def validate_theta(self, v: int | None) -> None:
        check_count(self, "theta", v, minimum=1)

    def resolve_theta(self, n: int) -> int:
        """θ for a round of ``n`` updates: the fixed θ (it may exceed a thinned round's n), or ⌈n/2⌉."""
        if self.theta is None:
            return (n + 1) // 2
        return self.theta

    def check_capacity(self, most: int) -> None:
        """Refuse, at setup, a θ that no round of at most ``most`` updates can reach."""
        if self.theta is not None and self.theta > most:
            raise param_error(self, "theta", self.theta,
                              f"must be ≤ the {most} updates a round can have at most "
                              f"(a larger θ flips every coordinate of every round)")

    def degradation(self, state: "Mapping[str, Any]", accepted: int) -> str | None:
        """The round's note when θ exceeded its n (``theta_above_n``)."""
        if state.get("theta_above_n") is not True:
            return None
        return (f"θ = {state.get('theta')} is above the round's n = {state.get('n')} updates: "
                f"the sign of all {state.get('flipped')} coordinates flipped")

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        theta = self.resolve_theta(n)
        ok = finite_rows(updates)
        w = sample_weights(ctx, n, updates) if self.weighted else torch.ones(n, dtype=updates.dtype,
                                                                           device=updates.device)
        w = torch.where(ok, w, torch.zeros_like(w))
        rows = updates if bool(ok.all()) else updates.index_select(0, ok.nonzero().flatten())
        agree = sign_votes(rows).abs() >= theta
        mean = convex_mean(updates, w, ok)
        agg = torch.where(agree, mean, -mean)
        reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        total = float(w.sum())
        return Decision(aggregate=agg, accepted=ok, weights=w / total if total > 0 else w, reasons=reasons,
                        state={"theta": theta, "n": n, "theta_above_n": theta > n,
                               "flipped": int(d - int(agree.sum()))})
