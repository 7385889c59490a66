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

θ left unset (convention ``theta = None``). The paper asks for θ above the number of
corrupt agents (then they alone cannot keep a coordinate's +η) and its authors tune θ per
task: their runner.sh sets ``--robustLR_threshold`` = 4 for FMNIST (10 agents, 1
corrupt), 8 for CIFAR-10 (40 agents, 4 corrupt) and 8 for FedEMNIST (≈ 34 agents a
round, ≈ 10 % corrupt). Here:

* in a scenario run, θ = f + 1 with f the scenario's malicious count: the smallest θ the
  corrupt agents alone cannot reach (every θ of the authors' scripts is at least that).
  It is filled in before the run (``from_malicious_count``), so the run's
  ``params["defense"]`` shows it (``RLR(theta=5, …)`` for f = 4);
* in a bare call (no count known), θ = ⌈2n/5⌉ for a round of n updates: θ/n of the
  authors' FMNIST script (4 of 10), the largest ratio of their scripts (CIFAR-10 8/40,
  FedEMNIST ≈ 0.24), so the premise holds for up to ⌈2n/5⌉ − 1 corrupt agents.

The former unset θ, ⌈n/2⌉, flipped most coordinates an honest majority moves: on digits
(20 clients, 4 sign-flipping, Dirichlet 0.5) it ended at 37 % accuracy (65 % with no
attack), θ = f + 1 = 5 at 65 % (87 % with no attack). Against a backdoor there (4 of
20 agents) θ = 5 cut the attack success from 0.60 (plain mean) to 0.17 and θ = 8, the
authors' margin for 4 corrupt agents, to 0.05 at 0.69 clean accuracy: a margin above
f + 1 is set with ``theta``.

Known weakness (a property of the published rule): votes are one per agent whatever the
update's size, so sign votes cast at a tiny norm, which barely move the mean, still pull
a coordinate's |Σ sgn| below θ and flip the sign of the honest mean there. The attack
``rlr_sign_vote`` (attacks/steer.py) does this; scenarios/weaknesses.toml shows it.

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
      agents. Unset: in a scenario run it is **filled with f + 1**, f the scenario's
      malicious count (``from_malicious_count``; the run's ``params["defense"]`` shows it);
      in a bare call it is ⌈2n/5⌉ for a round of n (the authors' FMNIST θ/n = 4/10).
    * ``weighted``: ``True`` (the paper: FedAvg's sample-weighted mean) or ``False``
      (plain mean).

    ``Decision.state``: θ, the round's n, whether θ exceeded n (``theta_above_n``: a
    round thinned by churn or stragglers below θ has every coordinate flipped, as the
    formula says, instead of stopping the run), and how many coordinates had their
    step flipped.
    """

    theta: int | None = None
    weighted: bool = True
    #: fields that a scenario fills from its malicious count f when left unset (θ = f + 1)
    from_malicious_count: ClassVar[tuple[str, ...]] = ("theta",)
    summary: ClassVar[str] = "RLR: per-coordinate learning rate −η where |Σ sign| < θ"
    reference: ClassVar[str] = "Ozdayi, Kantarcioglu & Gel, AAAI 2021"

    def validate_theta(self, v: int | None) -> None:
        check_count(self, "theta", v, minimum=1)

    @staticmethod
    def value_from_malicious_count(name: str, f: int) -> int:
        """The unset ``theta`` of a scenario with f malicious clients: f + 1, the smallest θ
        that the f corrupt agents' votes alone cannot reach."""
        return int(f) + 1

    def resolve_theta(self, n: int) -> int:
        """θ for a round of ``n`` updates: the fixed θ (it may exceed a thinned round's n), or
        ⌈2n/5⌉ (at least 1) when unset (a bare call: no malicious count known)."""
        if self.theta is None:
            return max(1, (2 * n + 4) // 5)
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
