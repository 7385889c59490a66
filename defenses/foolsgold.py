"""FoolsGold: down-weight clients whose update histories are too similar (Sybils).

Fung, Yoon & Beschastnikh, "The Limitations of Federated Learning in Sybil
Settings", RAID 2020 (arXiv:1808.04866, "Mitigating Sybils in Federated Learning
Poisoning"). Sybils that push one poisoning objective send similar updates round
after round; honest clients with different data do not. With Hᵢ the sum of client
i's updates so far (this round included):

1. csᵢⱼ = cos(Hᵢ, Hⱼ), with the diagonal set to 0 (as in the authors' code, so
   vᵢ = maxⱼ csᵢⱼ ≥ 0);
2. pardoning: where vⱼ > vᵢ, csᵢⱼ ← csᵢⱼ·vᵢ/vⱼ (an honest client that merely
   resembles a Sybil is not punished as hard as the Sybils are);
3. αᵢ = 1 − maxⱼ csᵢⱼ, clipped to [0, 1], divided by maxᵢ αᵢ; a value of 1
   becomes 0.99;
4. αᵢ ← κ·(ln(αᵢ / (1 − αᵢ)) + 0.5), clipped to [0, 1] (κ is the paper's
   confidence parameter).

The paper's optional importance weighting of output-layer features is not
applied: similarities use whole update vectors.

Known weakness (a property of the published rule): αᵢ reads only maxⱼ cos(Hᵢ, Hⱼ),
whoever made the copy. An exact copy of an honest client's update, sent every round,
gives that honest client weight 0 with its copy (the attackers choose whom FoolsGold
silences), and when every update has an exact copy all the cosines are 1 and the
weights come from floating-point rounding noise. The attack ``foolsgold_copies``
(attacks/steer.py) does this; scenarios/weaknesses.toml shows it.

The history is explicit state: ``Decision.state`` carries ``{"ids": [...],
"history": (k, d) tensor}``, keyed by ``ctx.client_ids``; pass it back as
``ctx.state`` next round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext

from ._common import check_number, combine, finite_rows
from ._pairwise import cosine_similarities

if TYPE_CHECKING:
    import torch

__all__ = ["FoolsGold", "foolsgold_weights"]


def foolsgold_weights(history: "torch.Tensor", kappa: float = 1.0) -> "torch.Tensor":
    """FoolsGold's per-client weights α ∈ [0, 1] from the ``(n, d)`` cumulative updates."""
    import torch

    cs = cosine_similarities(history)  # the shared kernel: float32 blocks, float64 sums
    cs.fill_diagonal_(0.0)
    v = cs.max(dim=1).values  # ≥ 0 thanks to the zero diagonal
    pardon = v[None, :] > v[:, None]  # [i, j]: v_j > v_i
    ratio = v[:, None] / v[None, :].clamp_min(1e-300)
    cs = torch.where(pardon, cs * ratio, cs)
    alpha = (1.0 - cs.max(dim=1).values).clamp(0.0, 1.0)
    top = float(alpha.max())
    if top <= 0:
        return torch.zeros_like(alpha)
    alpha = alpha / top
    alpha = torch.where(alpha == 1.0, torch.full_like(alpha, 0.99), alpha)
    with torch.no_grad():
        logit = kappa * (torch.log(alpha / (1.0 - alpha)) + 0.5)
    logit = torch.nan_to_num(logit, nan=0.0, posinf=1.0, neginf=0.0)
    return logit.clamp(0.0, 1.0)


@dataclass(frozen=True, slots=True)
class FoolsGold(Aggregator):
    """FoolsGold (Fung et al., RAID 2020): cosine similarity of cumulative updates.

    * ``kappa``: the confidence κ > 0 of the logit step (the paper's default 1);
    * ``normalize``: aggregate Σ αᵢxᵢ / Σ αᵢ (default), or the paper's literal
      Σ αᵢxᵢ (``False``), which was applied to per-client gradients under SGD and is
      n times the scale of a mean when every αᵢ = 1.

    Clients with αᵢ = 0 are reported as rejected. Non-finite updates get α = 0 and
    are not added to their history.
    """

    kappa: float = 1.0
    normalize: bool = True
    unanimity: ClassVar[bool] = False  # identical histories are Sybils by definition: weight 0
    summary: ClassVar[str] = "FoolsGold: weights from cosine similarity of clients' cumulative updates"
    reference: ClassVar[str] = "Fung, Yoon & Beschastnikh, RAID 2020"

    def validate_kappa(self, v: float) -> None:
        check_number(self, "kappa", v, low=0.0, low_open=True)

    def _history(self, updates: "torch.Tensor", ok: "torch.Tensor", ctx: ServerContext):
        import torch

        n, d = updates.shape
        ids = list(ctx.client_ids) if ctx.client_ids else list(range(n))
        if len(ids) != n or len(set(ids)) != n:
            raise InvalidParameter(f"FoolsGold: ctx.client_ids must name each of the {n} updates once, got {ids!r}")
        # a fresh tensor (the state must not alias the caller's updates); non-finite rows → 0
        current = updates.clone() if bool(ok.all()) else torch.where(ok[:, None], updates, torch.zeros_like(updates))
        state = ctx.state or {}
        old_ids = list(state.get("ids", []))
        old = state.get("history")
        if old is not None and old_ids:
            old = torch.as_tensor(old).to(device=updates.device, dtype=updates.dtype)
            if old.shape != (len(old_ids), d):
                raise InvalidParameter(
                    f"FoolsGold: ctx.state['history'] has shape {tuple(old.shape)}, expected ({len(old_ids)}, {d})"
                )
            where = {cid: j for j, cid in enumerate(old_ids)}
            rows = [i for i, cid in enumerate(ids) if cid in where]
            if rows:
                src = torch.tensor([where[ids[i]] for i in rows], device=updates.device)
                current[torch.tensor(rows, device=updates.device)] += old.index_select(0, src)
            keep_old = [j for j, cid in enumerate(old_ids) if cid not in set(ids)]
            kept = old.index_select(0, torch.tensor(keep_old, dtype=torch.long, device=updates.device))
            new_ids = [old_ids[j] for j in keep_old] + ids
            new_hist = torch.cat([kept, current])
        else:
            new_ids, new_hist = ids, current
        return current, new_ids, new_hist

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        ok = finite_rows(updates)
        current, new_ids, new_hist = self._history(updates, ok, ctx)
        alpha = foolsgold_weights(current, self.kappa)
        alpha = torch.where(ok, alpha, torch.zeros_like(alpha))
        total = float(alpha.sum())
        if self.normalize:
            w = alpha / total if total > 0 else torch.zeros_like(alpha)
        else:
            w = alpha
        w = w.to(updates.dtype)
        accepted = alpha > 0
        reasons = {i: ("non-finite update" if not bool(ok[i]) else
                       "FoolsGold weight 0: its update history is too similar to another client's")
                   for i in (~accepted).nonzero().flatten().tolist()}
        return Decision(aggregate=combine(w, updates), accepted=accepted, weights=w, reasons=reasons,
                        state={"ids": new_ids, "history": new_hist, "alpha": alpha.tolist()})
