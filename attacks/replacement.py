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
* ``weighting``: ``"uniform"`` (default, the paper's unweighted mean) or ``"samples"``
  for sample-weighted FedAvg: attacker a boosts by W/(w_a·η) (divided by f when
  sharing), W = Σ_j w_j and w_a its own weight from ``ctx.weights`` (indexed by the
  client id, which is its row position under full participation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class ModelReplacement(Attack):
    """Send γ × own update, γ = n/η by default (see the module docstring)."""

    boost: float | None = None
    share: bool = True
    weighting: Literal["uniform", "samples"] = "uniform"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Model replacement: boost the own (backdoored) update by n/η"
    reference: ClassVar[str] = "Bagdasaryan et al., AISTATS 2020"

    def validate_boost(self, v: float | None) -> None:
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and math.isfinite(v) and v > 0):
            raise param_error(self, "boost", v, "must be a finite number > 0, or unset for n/η")

    def validate_weighting(self, v: str) -> None:
        if v not in ("uniform", "samples"):
            raise param_error(self, "weighting", v, "must be 'uniform' or 'samples'")

    def factors(self, ctx: AttackContext) -> "torch.Tensor":
        """The per-attacker boost factors, float64, shape (f,)."""
        import torch

        f = ctx.n_malicious
        dev = ctx.own_updates.device
        if self.boost is not None:
            gamma = torch.full((f,), float(self.boost), dtype=torch.float64, device=dev)
        else:
            eta = float(ctx.server_lr)
            if not (math.isfinite(eta) and eta > 0):
                raise param_error(self, "boost", None, f"n/η needs a server learning rate η > 0, got {eta}")
            if self.weighting == "samples":
                w = ctx.weights
                if w is None or w.shape[0] != ctx.n_clients:
                    raise param_error(self, "weighting", "samples",
                                      "needs ctx.weights with one weight per client")
                if max(ctx.rows, default=-1) >= w.shape[0]:
                    raise param_error(self, "weighting", "samples",
                                      f"malicious rows {ctx.rows} do not index ctx.weights "
                                      f"({w.shape[0]} participants); use weighting='uniform' or an explicit boost")
                w64 = w.to(device=dev, dtype=torch.float64)
                mine = w64[torch.tensor(ctx.rows, dtype=torch.int64, device=dev)]
                if bool((mine <= 0).any()):
                    raise param_error(self, "weighting", "samples", "a malicious client has weight ≤ 0")
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
