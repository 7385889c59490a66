"""Staleness-aware filters of an asynchronous server (the ``[async]`` regime,
:mod:`redteam.federation.asyncrun`; they run on any server's rows).

An asynchronous server merges updates computed from models several versions old. A rule that
compares an update with its peers (median, Krum) judges a buffer of K rows of mixed staleness; the
two rules here compare each update with the server's own view of the *current* model instead, so a
stale or replayed update is judged against where the model is now. Both read the server's
pseudo-gradient g_s on its small trusted dataset (``ServerContext.root_update``: the clients' local
procedure run from the current model on the root sample; the delta convention of the rows,
local − global). Rows and g_s are deltas Δ; the pseudo-gradient of the papers is g = −Δ, and the
tests below are written on −Δ (the signs cancel in both).

* :class:`ZenoPlusPlus` — Zeno++ (Xie, Koyejo & Gupta, "Zeno++: Robust Fully Asynchronous SGD",
  ICML 2020). With v = −g_s the server's gradient estimate at the current model, u = −Δ a
  candidate, γ the server's step (``lr``), the candidate is first rescaled to v's magnitude
  (``normalize``: u ← (‖v‖/‖u‖)·u, as the paper does so that a large update cannot buy its way
  through the ρ term) and accepted when

      score = γ⟨v, u⟩ − ρ‖u‖² ≥ −γε.

  Accepted rows are merged (rescaled when ``normalize``) by the sample- and staleness-weighted
  mean; the paper applies each accepted candidate on its own, which over a buffer of K is that mean
  up to the server lr. ``state["scores"]`` holds every row's score.
* :class:`AFLGuard` — AFLGuard (Fang, Liu, Jia & Gong, "AFLGuard: Byzantine-robust Asynchronous
  Federated Learning", ACSAC 2022): accept Δ when ‖Δ − g_s‖ ≤ λ‖g_s‖ (the server's update computed
  on the current model; a client update that strays more than λ times the server update's length
  from it is rejected). Accepted rows are merged by the weighted mean.

A non-finite row is rejected with its reason. Without server data (``root_update`` is ``None``) both
refuse with a clear error, as FLTrust does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext

from ._common import check_number, finite_rows, row_norms
from .cosine import root_update_of

if TYPE_CHECKING:
    import torch

__all__ = ["ZenoPlusPlus", "AFLGuard", "zeno_scores", "aflguard_distances"]


def zeno_scores(updates: "torch.Tensor", server: "torch.Tensor", lr: float, rho: float,
                normalize: bool = True) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Zeno++'s score of each row (float64) and the candidates it scored (rows, rescaled to the
    server update's norm when ``normalize``). Rows and ``server`` are deltas; v = −server,
    u = −row, so ⟨v, u⟩ = ⟨server, row⟩."""
    import torch

    x = updates.to(torch.float64)
    s = server.to(device=x.device, dtype=torch.float64)
    if normalize:
        norms = row_norms(x)
        s_norm = float(torch.linalg.vector_norm(s))
        factor = torch.where(norms > 0, s_norm / norms.clamp_min(1e-300), torch.zeros_like(norms))
        x = x * factor[:, None]
    score = lr * (x @ s) - rho * (x * x).sum(1)
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
    """Zeno++ (Xie, Koyejo & Gupta, ICML 2020): accept u when γ⟨v, u⟩ − ρ‖u‖² ≥ −γε (module docstring).

    * ``lr``: γ, the server's step in the test; ``rho``: ρ, the weight of the magnitude penalty;
    * ``eps``: ε, the slack (ε > 0 lets through candidates slightly against v: v is itself a noisy
      estimate from a small batch). With ``normalize`` the test reads cos(u, v) ≥ ρ/γ − ε/‖v‖², so ε
      is in the units of ‖v‖² (the squared length of the server's update); the default ε = 0 with
      ρ = 0.001, γ = 1 accepts exactly the candidates at cosine ≥ 0.001 to v;
    * ``normalize``: rescale each candidate to ‖v‖ before the test and the merge (the paper).
    """

    lr: float = 1.0
    rho: float = 0.001
    eps: float = 0.0
    normalize: bool = True
    uses_server_data: ClassVar[bool] = True
    summary: ClassVar[str] = "Zeno++: accept an update whose descent score on the server's data is ≥ −γε"
    reference: ClassVar[str] = "Xie, Koyejo & Gupta, ICML 2020"

    def validate_lr(self, v: float) -> None:
        check_number(self, "lr", v, low=0, low_open=True)

    def validate_rho(self, v: float) -> None:
        check_number(self, "rho", v, low=0)

    def validate_eps(self, v: float) -> None:
        check_number(self, "eps", v, low=0)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        import torch

        g0 = root_update_of(self, ctx, updates.shape[1]).to(updates.device)
        ok = finite_rows(updates)
        safe = torch.where(ok[:, None], updates, torch.zeros((), dtype=updates.dtype, device=updates.device))
        score, cand = zeno_scores(safe, g0, self.lr, self.rho, self.normalize)
        bar = -self.lr * self.eps
        accepted = ok & (score >= bar)
        reasons = _nonfinite(ok)
        for i in (ok & ~accepted).nonzero().flatten().tolist():
            reasons[i] = f"Zeno++ score {float(score[i]):.4g} < −γε = {bar:.4g}"
        rows = cand.to(updates.dtype) if self.normalize else updates
        rows = torch.where(ok[:, None], rows, updates)
        return FilterResult(rows, accepted, reasons,
                            {"scores": [float(v) if bool(o) else None for v, o in zip(score.tolist(), ok.tolist())]})


@dataclass(frozen=True, slots=True)
class AFLGuard(Filter):
    """AFLGuard (Fang, Liu, Jia & Gong, ACSAC 2022): accept Δ when ‖Δ − g_s‖ ≤ λ‖g_s‖ (module docstring).

    * ``lam``: λ, how far (in units of the server update's length) a client update may stray
      from the server's own update.
    """

    lam: float = 1.5
    uses_server_data: ClassVar[bool] = True
    summary: ClassVar[str] = "AFLGuard: accept an update within λ‖g_s‖ of the server's own update on the current model"
    reference: ClassVar[str] = "Fang, Liu, Jia & Gong, ACSAC 2022"

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
