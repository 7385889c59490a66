"""FLTrust: trust bootstrapped from a small root dataset held by the server.

Cao, Fang, Liu & Gong, "FLTrust: Byzantine-robust Federated Learning via Trust
Bootstrapping", NDSS 2021. Each round the server trains the global model on its
root dataset (100 clean samples in the paper) with the clients' local procedure,
giving g₀. Then

1. trust score TSᵢ = ReLU(cos(xᵢ, g₀));
2. magnitude normalisation x̄ᵢ = (‖g₀‖ / ‖xᵢ‖)·xᵢ;
3. aggregate = Σᵢ TSᵢ x̄ᵢ / Σᵢ TSᵢ (zero when every score is 0).

g₀ comes from ``ctx.root_update()``; when the server holds no root data the rule
raises a clear error instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext

from ._common import combine, finite_rows, row_norms
from .cosine import cosine_to, root_update_of

if TYPE_CHECKING:
    import torch

__all__ = ["FLTrust"]


@dataclass(frozen=True, slots=True)
class FLTrust(Aggregator):
    """FLTrust (Cao et al., NDSS 2021): ReLU-cosine trust to the root update g₀.

    * ``normalize``: rescale every update to ‖g₀‖ before weighting (the paper; set
      False only to study the trust scores alone).

    A client with TSᵢ = 0 (cosine ≤ 0, a zero update, or a non-finite one) is
    reported as rejected. ``Decision.weights`` are the effective coefficients on the
    raw updates, TSᵢ·‖g₀‖/‖xᵢ‖ / Σⱼ TSⱼ; ``state["trust"]`` the trust scores.
    """

    normalize: bool = True
    uses_server_data: ClassVar[bool] = True  # g₀ is trained on the server's root data
    summary: ClassVar[str] = "FLTrust: ReLU(cos) trust to the server's root update, magnitudes normalised"
    reference: ClassVar[str] = "Cao et al., NDSS 2021"

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        g0 = root_update_of(self, ctx, d).to(updates.device)
        ok = finite_rows(updates)
        cos = cosine_to(updates, g0)
        cos = torch.where(ok, cos, torch.zeros_like(cos))
        trust = torch.where(ok, torch.relu(cos), torch.zeros_like(cos))
        norms = row_norms(updates)
        g0_norm = float(row_norms(g0[None, :])[0])
        total = float(trust.sum())
        if self.normalize:
            coeff = torch.where(trust > 0, trust * g0_norm / norms.clamp_min(1e-300), torch.zeros_like(trust))
        else:
            coeff = trust.clone()
        w = (coeff / total if total > 0 else torch.zeros_like(coeff)).to(updates.dtype)
        accepted = trust > 0
        reasons: dict[int, str] = {}
        for i in (~accepted).nonzero().flatten().tolist():
            reasons[i] = "non-finite update" if not bool(ok[i]) else \
                f"trust score 0: cosine {float(cos[i]):.4g} to the root update ≤ 0"
        return Decision(aggregate=combine(w, updates), accepted=accepted, weights=w, reasons=reasons,
                        state={"trust": trust.tolist(), "root_norm": g0_norm})
