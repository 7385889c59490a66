"""Loss check on server-held data: accept an update only if it does not hurt.

Accept Δᵢ iff L(w + Δᵢ) ≤ L(w) + ε, where L is the loss on data the server (or a
validator) holds. This is the "loss before / after each peer's pseudo-gradient"
test that deployed decentralized trainers run, e.g. the Gauntlet validator of
Templar (arXiv:2505.21684, 2025), and the reject-on-negative-impact (RONI) idea of
Barreno, Nelson, Joseph & Tygar, "The Security of Machine Learning", Machine
Learning 81, 2010.

The server's ``ctx.evaluate_loss`` takes a batch of candidate deltas ``(k, d)`` and
returns their losses ``(k,)``; the loss of the zero delta is L(w).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.errors import InvalidParameter
from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext

from ._common import check_count, check_number, finite_rows

if TYPE_CHECKING:
    import torch

__all__ = ["LossCheck"]


@dataclass(frozen=True, slots=True)
class LossCheck(Filter):
    """Reject updates that raise the server-side loss by more than ``epsilon``.

    * ``epsilon``: the tolerated increase ε ≥ 0 (absolute, in loss units);
    * ``batch_size``: how many candidate deltas one ``evaluate_loss`` call gets
      (unset: all at once).

    The zero delta is evaluated in the first batch to get L(w). Non-finite updates
    are rejected without being evaluated; a non-finite loss is a rejection too.
    Raises :class:`~redteam.errors.InvalidParameter` when the server holds no data
    (``ctx.evaluate_loss`` is None).
    """

    epsilon: float = 0.0
    uses_server_data: ClassVar[bool] = True  # losses on the server's root data
    batch_size: int | None = None
    summary: ClassVar[str] = "Accept Δ iff L(w+Δ) ≤ L(w) + ε on server-held data (Gauntlet-style)"
    reference: ClassVar[str] = "Templar Gauntlet, arXiv:2505.21684; RONI, Barreno et al. 2010"

    def validate_epsilon(self, v: float) -> None:
        check_number(self, "epsilon", v, low=0.0)

    def validate_batch_size(self, v: int | None) -> None:
        check_count(self, "batch_size", v, minimum=1)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        if ctx.evaluate_loss is None:
            raise InvalidParameter(
                "LossCheck needs ctx.evaluate_loss, but it is None: the scenario must give the server "
                "held-out data to evaluate candidate updates on"
            )
        n, d = updates.shape
        ok = finite_rows(updates)
        reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        idx = ok.nonzero().flatten()
        candidates = torch.cat([torch.zeros(1, d, dtype=updates.dtype, device=updates.device), updates[idx]])
        step = candidates.shape[0] if self.batch_size is None else self.batch_size
        parts = []
        for start in range(0, candidates.shape[0], step):
            out = torch.as_tensor(ctx.evaluate_loss(candidates[start:start + step]))
            if out.shape != (min(step, candidates.shape[0] - start),):
                raise InvalidParameter(
                    f"LossCheck: ctx.evaluate_loss returned shape {tuple(out.shape)} for "
                    f"{min(step, candidates.shape[0] - start)} candidates; expected one loss per candidate"
                )
            parts.append(out.to(torch.float64).cpu())
        losses = torch.cat(parts)
        base = float(losses[0])
        if not torch.isfinite(losses[0]):
            raise InvalidParameter(f"LossCheck: the loss of the current model is {base}, not a finite number")
        losses_all = torch.full((n,), float("nan"), dtype=torch.float64)
        losses_all[idx.cpu()] = losses[1:]
        limit = base + self.epsilon
        good = torch.isfinite(losses_all) & (losses_all <= limit)
        keep = ok & good.to(ok.device)
        for i in (ok & ~keep).nonzero().flatten().tolist():
            reasons[i] = f"loss {float(losses_all[i]):.6g} > current {base:.6g} + ε {self.epsilon:g}"
        return FilterResult(updates=updates, accepted=keep, reasons=reasons,
                            state={"base_loss": base, "losses": losses_all.tolist()})
