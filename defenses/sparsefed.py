"""SparseFed: clip, aggregate, keep the global top-k with server-side error feedback.

Panda, Mahloujifar, Bhagoji, Chakraborty & Mittal, "SparseFed: Mitigating Model
Poisoning Attacks in Federated Learning with Sparsification", AISTATS 2022. Each
round the server:

1. clips every client update to L2 norm at most L: Δᵢ ← Δᵢ·min(1, L/‖Δᵢ‖);
2. aggregates the clipped updates into g (here g = (1/n)·Σ Δᵢ by default; see
   ``reduce`` below);
3. adds g to its error-feedback accumulator, e ← e + g;
4. applies only the k largest-magnitude coordinates of e, Δ = top_k(e), and keeps
   the rest for later rounds, e ← e − Δ.

An attacker's few coordinates rarely reach the global top-k on their own, and the
clipping bounds how far any one client can push those that do. This is the
server-side (global) top-k of the paper; the clients send full updates. The
accumulator e is explicit state (``Decision.state["error"]``), kept per merge node.

Conventions (named parameters). Whether step 2 is a sum or a mean is not pinned down
here from the paper (written from memory of it, not checked against the
text): ``reduce="mean"`` (default) averages the clipped updates, FedAvg's scale,
so the server learning rate keeps its meaning; ``"sum"`` adds them, as FetchSGD, which
SparseFed builds on, sums client sketches. The two differ only by the factor n, i.e.
by the server learning rate. Server momentum, if combined with the error feedback, is
left to the server optimizer (it runs after the defense). The paper tunes L and k per
task; the defaults below (L = 1, k = 1 % of d) are ours.
Non-finite updates are rejected and do not enter the sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext

from ._common import check_choice, check_count, check_number, combine, finite_rows
from ._stats import clip_scales, safe_norms

if TYPE_CHECKING:
    import torch

__all__ = ["SparseFed", "top_k_split"]


def top_k_split(e: "torch.Tensor", k: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(Δ, e − Δ): Δ keeps the k largest |eⱼ| of ``e`` (zeros elsewhere)."""
    import torch

    k = min(k, e.shape[0])
    idx = torch.topk(e.abs(), k, sorted=False).indices
    delta = torch.zeros_like(e)
    delta[idx] = e[idx]
    rest = e.clone()
    rest[idx] = 0
    return delta, rest


@dataclass(frozen=True, slots=True)
class SparseFed(Aggregator):
    """SparseFed (Panda et al., AISTATS 2022): clip to L, global top-k with error feedback.

    * ``bound``: the clipping norm L > 0 (the paper tunes it per task);
    * ``k``: coordinates applied per round; unset means ⌈k_fraction·d⌉;
    * ``k_fraction``: used when ``k`` is unset (default 1 % of the coordinates; the
      paper sweeps k);
    * ``reduce``: ``"mean"`` (default) or ``"sum"`` of the clipped updates.
    """

    bound: float = 1.0
    k: int | None = None
    k_fraction: float = 0.01
    reduce: Literal["mean", "sum"] = "mean"
    unanimity: ClassVar[bool] = False  # only k coordinates of an agreed update are applied per round
    summary: ClassVar[str] = "SparseFed: clip to L, apply the global top-k of the error-feedback accumulator"
    reference: ClassVar[str] = "Panda et al., AISTATS 2022"

    def validate_bound(self, v: float) -> None:
        check_number(self, "bound", v, low=0.0, low_open=True)

    def validate_k(self, v: int | None) -> None:
        check_count(self, "k", v, minimum=1)

    def validate_k_fraction(self, v: float) -> None:
        check_number(self, "k_fraction", v, low=0.0, low_open=True, high=1.0)

    def validate_reduce(self, v: str) -> None:
        check_choice(self, "reduce", v, ("mean", "sum"))

    def _error(self, ctx: ServerContext, like: "torch.Tensor") -> "torch.Tensor":
        import torch

        old = (ctx.state or {}).get("error")
        if old is None:
            return torch.zeros(like.shape[1], dtype=like.dtype, device=like.device)
        old = torch.as_tensor(old).to(device=like.device, dtype=like.dtype)
        if tuple(old.shape) != (like.shape[1],):
            raise InvalidParameter(f"SparseFed: ctx.state['error'] has shape {tuple(old.shape)}, "
                                   f"expected ({like.shape[1]},)")
        return old

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        ok = finite_rows(updates)
        norms = safe_norms(updates, ok)
        scale = torch.where(ok, clip_scales(norms, float(self.bound)), torch.zeros_like(norms))
        if self.reduce == "mean":
            scale = scale / n
        w = scale.to(updates.dtype)
        e = self._error(ctx, updates) + combine(w, updates, ok)
        k = self.k if self.k is not None else max(1, math.ceil(self.k_fraction * d))
        delta, rest = top_k_split(e, k)
        reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        clipped = int(((norms > self.bound) & ok).sum())
        return Decision(aggregate=delta, accepted=ok, weights=w, reasons=reasons,
                        state={"error": rest, "k": min(k, d), "clipped": clipped})
