"""Staleness-aware filters of an asynchronous server (the ``[async]`` regime,
:mod:`redteam.federation.asyncrun`; they run on any server's rows).

An asynchronous server merges updates computed from models several versions old. A rule that
compares an update with its peers (median, Krum) judges a buffer of K rows of mixed staleness; the
two rules here compare each update with the server's own view of the *current* model instead, so a
stale or replayed update is judged against where the model is now. Both read the server's
pseudo-gradient g_s on its small trusted dataset (``ServerContext.root_update``: the clients' local
procedure run from the current model on the root sample; the delta convention of the rows,
local − global). Rows and g_s are deltas Δ; the gradients of the papers point the other way,
g = −Δ, and both tests are unchanged by negating every vector (an inner product of two negated
vectors, a distance between two negated vectors), so the code works on the deltas directly.

* :class:`ZenoPlusPlus` — Zeno++ (Xie, Koyejo & Gupta, "Zeno++: Robust Fully Asynchronous SGD",
  ICML 2020). With v = −g_s the server's gradient estimate, u = −Δ a candidate, γ the step size
  (``lr``), the candidate is first rescaled to v's length (``normalize``: ũ = (‖v‖/‖u‖)·u, so that
  length cannot buy a candidate through the test) and accepted when

      score = γ⟨v, ũ⟩ − ρ‖ũ‖² ≥ −γε,

  the first-order form of Zeno's stochastic descent score f_r(x) − f_r(x − γũ) − ρ‖ũ‖². The server
  refreshes v only every k steps (``refresh_every``, the paper's lazy update) and judges the
  steps in between against the kept v. Accepted rows are merged (rescaled when ``normalize``) by
  the sample- and staleness-weighted mean; the paper applies each accepted candidate on its own,
  which over a buffer of K is that mean up to the server's step. ``state["scores"]`` holds every
  row's score.
* :class:`AFLGuard` — AFLGuard (Fang, Liu, Gong & Bentley, "AFLGuard: Byzantine-robust Asynchronous
  Federated Learning", ACSAC 2022): accept Δ when ‖Δ − g_s‖ ≤ λ‖g_s‖, g_s the server's update on
  the *current* model (not on the stale model the client trained from): an update that strays
  more than λ times the server update's length from it is rejected, whatever its staleness.
  Accepted rows are merged by the weighted mean.

Where the authors' released Zeno++ code (github.com/xcgoner/iclr2020_zeno_async,
``train_cifar10.py`` and ``train_wikitext.py``; the same test in github.com/xcgoner/AsyncByzGrad)
departs from the paper's formula, the departure is a named option whose default is the paper's:
``penalty = "raw"`` (ρ times the squared length of the candidate as received, not rescaled) and
``shrink_only`` (rescale only candidates longer than v). The defaults γ = 0.1, ρ = 0.001, ε = 0 are
the settings of the released experiment scripts (CIFAR-10, learning rate 0.1); with ``normalize``
only ρ/γ = 0.01 and γε enter the decision (see :class:`ZenoPlusPlus`).

A non-finite row is rejected with its reason. Without server data (``root_update`` is ``None``) both
refuse with a clear error, as FLTrust does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext

from ._common import check_choice, check_count, check_number, finite_rows, row_norms
from .cosine import root_update_of

if TYPE_CHECKING:
    import torch

__all__ = ["ZenoPlusPlus", "AFLGuard", "zeno_scores", "aflguard_distances"]


def zeno_scores(updates: "torch.Tensor", server: "torch.Tensor", lr: float, rho: float,
                normalize: bool = True, penalty: str = "rescaled",
                shrink_only: bool = False) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Zeno++'s score of each row (float64) and the candidates it scored (the rows, rescaled to
    the server update's norm when ``normalize``; with ``shrink_only`` only rows longer than it are
    rescaled). Rows and ``server`` are deltas; v = −server, u = −row, so ⟨v, u⟩ = ⟨server, row⟩.

    ``penalty``: ``"rescaled"`` charges ρ‖ũ‖² on the candidate as scored (the paper);
    ``"raw"`` charges ρ‖u‖² on the row as received (the authors' released scripts)."""
    import torch

    x = updates.to(torch.float64)
    s = server.to(device=x.device, dtype=torch.float64)
    raw_sq = (x * x).sum(1)
    if normalize:
        norms = row_norms(x)
        s_norm = float(torch.linalg.vector_norm(s))
        factor = torch.where(norms > 0, s_norm / norms.clamp_min(1e-300), torch.zeros_like(norms))
        if shrink_only:
            factor = torch.where(norms > 0, factor.clamp_max(1.0), torch.ones_like(norms))
        x = x * factor[:, None]
    sq = raw_sq if penalty == "raw" else (x * x).sum(1)
    score = lr * (x @ s) - rho * sq
    return score, x


def aflguard_distances(updates: "torch.Tensor", server: "torch.Tensor") -> tuple["torch.Tensor", float]:
    """‖Δ_i − g_s‖ for every row (float64), and ‖g_s‖."""
    import torch

    x = updates.to(torch.float64)
    s = server.to(device=x.device, dtype=torch.float64)
    return torch.linalg.vector_norm(x - s[None, :], dim=1), float(torch.linalg.vector_norm(s))


def _nonfinite(ok: "torch.Tensor") -> dict[int, str]:
    return {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}


@dataclass(frozen=True, slots=True)
class ZenoPlusPlus(Filter):
    """Zeno++ (Xie, Koyejo & Gupta, ICML 2020): accept u when γ⟨v, ũ⟩ − ρ‖ũ‖² ≥ −γε (module docstring).

    * ``lr``: γ, the step size the score assumes (the paper's SGD learning rate); ``rho``: ρ, the
      weight of the length penalty. Default γ = 0.1, ρ = 0.001: the authors' released CIFAR-10
      scripts (learning rate 0.1, ``--rho 0.001 --epsilon 0``).
    * ``eps``: ε, the slack (ε > 0 lets through candidates slightly against v: v is itself a noisy
      estimate from a small batch). With ``normalize`` and the paper's penalty the test reads
      cos(u, v) ≥ ρ/γ − ε/‖v‖², so ε is in the units of ‖v‖² (the squared length of the server's
      update, a delta here, a gradient in the paper); the defaults accept exactly the candidates at
      cosine ≥ 0.01 to v.
    * ``normalize``: rescale each candidate to ‖v‖ before the test and the merge (the paper).
      ``shrink_only``: rescale only candidates longer than v and keep shorter ones as they are
      (the released WikiText-2 script, c = min(‖v‖/‖u‖, 1)); default off, the paper's two-sided
      rescaling (also the released CIFAR-10 script).
    * ``penalty``: ``"rescaled"`` (default, the paper) charges ρ‖ũ‖² on the rescaled candidate, so
      with ``normalize`` the penalty is ρ‖v‖² for every row; ``"raw"`` charges ρ‖u‖² on the row as
      received, as both released scripts do (they compute the squared norm before rescaling): the
      test then reads cos(u, v) ≥ (ρ/γ)·‖u‖²/‖v‖² − ε/‖v‖² and also rejects rows much longer than v.
    * ``refresh_every``: k, the paper's lazy update: v is recomputed on the current model every k
      server steps and the steps in between are judged against the kept (older) v, as the paper
      and the released scripts do (their k = 10 counts received gradients, each a step of their
      server; here a step merges a buffer of K rows). Default 1: a fresh v at every step, the test the
      lazy update approximates (the lazy refresh saves the server's computation). The kept
      v and its age travel in ``state["server_update"]`` / ``state["server_update_age"]``.
    """

    lr: float = 0.1
    rho: float = 0.001
    eps: float = 0.0
    normalize: bool = True
    shrink_only: bool = False
    penalty: Literal["rescaled", "raw"] = "rescaled"
    refresh_every: int = 1
    uses_server_data: ClassVar[bool] = True
    summary: ClassVar[str] = "Zeno++: accept an update whose descent score on the server's data is ≥ −γε"
    reference: ClassVar[str] = "Xie, Koyejo & Gupta, ICML 2020"

    def validate_lr(self, v: float) -> None:
        check_number(self, "lr", v, low=0, low_open=True)

    def validate_rho(self, v: float) -> None:
        check_number(self, "rho", v, low=0)

    def validate_eps(self, v: float) -> None:
        check_number(self, "eps", v, low=0)

    def validate_penalty(self, v: str) -> None:
        check_choice(self, "penalty", v, ("rescaled", "raw"))

    def validate_refresh_every(self, v: int) -> None:
        check_count(self, "refresh_every", v, allow_none=False, minimum=1)

    def _server_update(self, ctx: ServerContext, d: int) -> tuple["torch.Tensor", int]:
        """g_s and its age in steps: the kept one while younger than ``refresh_every``, else fresh."""
        import torch

        state: Any = ctx.state or {}
        kept, age = state.get("server_update"), state.get("server_update_age")
        if (self.refresh_every > 1 and isinstance(kept, torch.Tensor) and tuple(kept.shape) == (d,)
                and isinstance(age, int) and 0 <= age < self.refresh_every - 1
                and bool(torch.isfinite(kept).all())):
            return kept, age + 1
        return root_update_of(self, ctx, d), 0

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        g0, age = self._server_update(ctx, updates.shape[1])
        g0 = g0.to(updates.device)
        ok = finite_rows(updates)
        safe = torch.where(ok[:, None], updates, torch.zeros((), dtype=updates.dtype, device=updates.device))
        score, cand = zeno_scores(safe, g0, self.lr, self.rho, self.normalize, self.penalty, self.shrink_only)
        bar = -self.lr * self.eps
        accepted = ok & (score >= bar)
        reasons = _nonfinite(ok)
        for i in (ok & ~accepted).nonzero().flatten().tolist():
            reasons[i] = f"Zeno++ score {float(score[i]):.4g} < −γε = {bar:.4g}"
        rows = cand.to(updates.dtype) if self.normalize else updates
        rows = torch.where(ok[:, None], rows, updates)
        state: dict[str, Any] = {
            "scores": [float(v) if bool(o) else None for v, o in zip(score.tolist(), ok.tolist())]}
        if self.refresh_every > 1:
            state["server_update"] = g0.detach().clone()
            state["server_update_age"] = age
        return FilterResult(rows, accepted, reasons, state)


@dataclass(frozen=True, slots=True)
class AFLGuard(Filter):
    """AFLGuard (Fang, Liu, Gong & Bentley, ACSAC 2022): accept Δ when ‖Δ − g_s‖ ≤ λ‖g_s‖
    (module docstring).

    * ``lam``: λ, how far (in units of the server update's length) a client update may stray
      from the server's own update. With λ ≥ 1 a zero row passes (‖0 − g_s‖ = ‖g_s‖).

    g_s is the server's update on the current model, recomputed at every step; a client's
    staleness enters only through the test (a stale update has drifted from g_s) and the regime's
    own staleness weights, not through the rule (``[async] staleness = "constant"`` is the paper's
    unweighted asynchronous step).
    """

    lam: float = 1.5
    uses_server_data: ClassVar[bool] = True
    summary: ClassVar[str] = "AFLGuard: accept an update within λ‖g_s‖ of the server's own update on the current model"
    reference: ClassVar[str] = "Fang, Liu, Gong & Bentley, ACSAC 2022"

    def validate_lam(self, v: float) -> None:
        check_number(self, "lam", v, low=0)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        g0 = root_update_of(self, ctx, updates.shape[1]).to(updates.device)
        ok = finite_rows(updates)
        safe = torch.where(ok[:, None], updates, torch.zeros((), dtype=updates.dtype, device=updates.device))
        dist, g_norm = aflguard_distances(safe, g0)
        bound = self.lam * g_norm
        accepted = ok & (dist <= bound)
        reasons = _nonfinite(ok)
        for i in (ok & ~accepted).nonzero().flatten().tolist():
            reasons[i] = f"AFLGuard: ‖Δ − g_s‖ = {float(dist[i]):.4g} > λ‖g_s‖ = {bound:.4g}"
        return FilterResult(updates, accepted, reasons,
                            {"distances": [float(v) if bool(o) else None for v, o in zip(dist.tolist(), ok.tolist())],
                             "bound": bound})
