"""Model replacement: boost a (backdoored) update so that it replaces the global model.

Bagdasaryan, Veit, Hua, Estrin & Shmatikov, "How To Backdoor Federated Learning",
AISTATS 2020. With the global step G^{t+1} = G^t + (η/n)·Σᵢ (Lᵢ − G^t), an attacker
that wants the global model to become X submits L̃ = γ·(X − G^t) + G^t with γ = n/η:
if the honest deltas roughly cancel (near convergence), G^{t+1} ≈ X.

In this harness X − G^t is the malicious client's own update (``ctx.own_updates``):
the delta it trained. On its own that is an honest update boosted, which is a scaling
attack; combined with a data attack (``backdoor`` or ``label_flip`` on the malicious
clients' data, in the same scenario) the own update is the backdoored one and this is
the paper's attack. The boost:

* ``boost``: an explicit γ, or ``None`` (default) for the paper's γ = n/η, with
  n = ``ctx.n_clients`` (the round's participants) and η = ``ctx.server_lr``;
* ``share`` (default true): with f > 1 attackers in the round, each boosts by γ/f so
  that together they replace the model once (the released code divides
  ``scale_weights`` by the number of adversaries); with one attacker this is γ itself;
* ``weighting``: whose weight share the boost undoes. The derived boost must undo the
  aggregation's own weight on the attacker, or the model lands short of (or past) X:

  - ``"uniform"``: the paper's unweighted mean, γ = n/η;
  - ``"samples"``: sample-weighted FedAvg (McMahan et al. 2017, this harness's default
    ``mean``): client a enters with share w_a/W, W = Σ_j w_j, so γ_a = W/(w_a·η)
    (``ctx.weights`` indexed by the attacker's row);
  - ``"defense"`` (default): follow the server's rule. The attack is white-box
    (``adaptive``: it is told the defense, as the paper's attacker knows the aggregation
    rule): a sample-weighted mean — ``mean`` with ``weighted = true``, or a pipeline
    whose aggregation is the default weighted mean, or a filter used alone — gives
    ``"samples"``; an unweighted
    mean or a robust rule that ignores sample counts gives ``"uniform"``. With no
    defense in the context (a bare call) it is ``"samples"`` when ``ctx.weights`` is
    given and ``"uniform"`` otherwise.

Server optimizer. n/η inverts exactly the FedAvg step G ← G + η·agg. Under FedAdam or
outer Nesterov momentum the step is not linear in this round's aggregate (Adam divides
by a running √v; momentum re-applies it in later rounds), so no boost of this form makes
the model land on X. With ``boost`` unset and ``ctx.server_optimizer`` other than
``"fedavg"`` the attack refuses with an error naming the optimizer; an explicit ``boost``
is sent as given (the user's choice of scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

if TYPE_CHECKING:
    import torch

__all__ = ["ModelReplacement", "defense_weighting"]


def defense_weighting(defense: Any) -> str:
    """``"samples"`` if ``defense`` averages by sample count, else ``"uniform"``.

    A defense with a ``weighted`` field (``mean``) says so itself; a pipeline follows its
    aggregator stage, or — without one — its default sample-weighted mean, and so does a
    filter, pre- or post-stage used alone (``norm_bound``, ``fldetector``); every other
    rule (median, Krum, clipping, …) ignores the claimed sample counts.
    """
    if defense.stages:  # a pipeline: its aggregator stage
        aggs = [s for s in defense.stages if s.kind == "aggregator"]
        if not aggs:
            return "samples"
        defense = aggs[0]
    elif defense.kind != "aggregator":
        return "samples"  # a filter / pre / post stage alone aggregates with the default weighted mean
    return "samples" if bool(getattr(defense, "weighted", False)) else "uniform"  # a parameter of mean


@dataclass(frozen=True, slots=True)
class ModelReplacement(Attack):
    """Send γ × own update, γ = n/η (or W/(w_a·η)) by default (see the module docstring)."""

    boost: float | None = None
    share: bool = True
    weighting: Literal["defense", "uniform", "samples"] = "defense"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    adaptive: ClassVar[bool] = True
    summary: ClassVar[str] = "Model replacement: boost the own (backdoored) update by n/η"
    reference: ClassVar[str] = "Bagdasaryan et al., AISTATS 2020"

    def validate_boost(self, v: float | None) -> None:
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and math.isfinite(v) and v > 0):
            raise param_error(self, "boost", v, "must be a finite number > 0, or unset for n/η")

    def validate_weighting(self, v: str) -> None:
        if v not in ("defense", "uniform", "samples"):
            raise param_error(self, "weighting", v, "must be 'defense', 'uniform' or 'samples'")

    def resolved_weighting(self, ctx: AttackContext) -> str:
        """The weighting in force this round (``"uniform"`` or ``"samples"``)."""
        if self.weighting != "defense":
            return self.weighting
        if ctx.defense is not None:
            return defense_weighting(ctx.defense)
        return "samples" if ctx.weights is not None else "uniform"

    def factors(self, ctx: AttackContext) -> "torch.Tensor":
        """The per-attacker boost factors, float64, shape (f,)."""
        import torch

        f = ctx.n_malicious
        dev = ctx.own_updates.device
        if self.boost is not None:
            gamma = torch.full((f,), float(self.boost), dtype=torch.float64, device=dev)
        else:
            opt = str(getattr(ctx, "server_optimizer", "fedavg") or "fedavg")
            if opt != "fedavg":
                raise param_error(self, "boost", None,
                                  f"n/η inverts the FedAvg server step w ← w + η·agg; this run's server "
                                  f"optimizer is {opt!r}, whose step is not linear in one round's aggregate: "
                                  f"set an explicit boost or use server_optimizer = 'fedavg'")
            eta = float(ctx.server_lr)
            if not (math.isfinite(eta) and eta > 0):
                raise param_error(self, "boost", None, f"n/η needs a server learning rate η > 0, got {eta}")
            if self.resolved_weighting(ctx) == "samples":
                w = ctx.weights
                if w is None or w.shape[0] != ctx.n_clients:
                    raise param_error(self, "weighting", self.weighting,
                                      "needs ctx.weights with one weight per client (sample weighting)")
                if max(ctx.rows, default=-1) >= w.shape[0]:
                    raise param_error(self, "weighting", self.weighting,
                                      f"malicious rows {ctx.rows} do not index ctx.weights "
                                      f"({w.shape[0]} participants); use weighting='uniform' or an explicit boost")
                w64 = w.to(device=dev, dtype=torch.float64)
                mine = w64[torch.tensor(ctx.rows, dtype=torch.int64, device=dev)]
                if bool((mine <= 0).any()):
                    raise param_error(self, "weighting", self.weighting, "a malicious client has weight ≤ 0")
                gamma = w64.sum() / (mine * eta)
            else:
                gamma = torch.full((f,), ctx.n_clients / eta, dtype=torch.float64, device=dev)
        if self.share and f > 1:
            gamma = gamma / f
        return gamma

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        own = ctx.own_updates
        g = self.factors(ctx)
        return own * g[:, None].to(own.dtype)
