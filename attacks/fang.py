"""Fang et al.'s local model poisoning attacks on trimmed mean / median and on Krum.

Fang, Cao, Jia & Gong, "Local Model Poisoning Attacks to Byzantine-Robust Federated
Learning", USENIX Security 2020. The paper crafts local *models* w'; our rows are
deltas Δ' = w' − w_Re (w_Re the current global model).

What carries over exactly and what does not. The Krum attack uses only differences of
models (w_Re − λs, distances between models, D(w_i, w_Re) = ‖Δ_i‖), so it is the same
attack on deltas. The trim attack is **not** translation-invariant: its full-knowledge
intervals multiply or divide the benign extreme by b and branch on the extreme's sign,
and b·max_j(w) − w_Re,j ≠ b·max_j(Δ) unless w_Re,j = 0. ``space`` chooses:

* ``"model"`` (default, the paper's): the intervals are computed on the benign models
  w_i = w_Re + Δ_i (``ctx.global_params``), then w_Re is subtracted;
* ``"delta"``: the same rule applied to the deltas directly (what a delta-space port
  computes; a different, usually much milder, attack whenever |w_Re,j| ≫ |Δ_ij|).

The partial-knowledge intervals (μ ± 3σ … 4σ) and the direction s are translation-
equivariant and identical in both spaces.

Let s_j be the sign of the benign change of coordinate j (the direction parameter j
would move under no attack).

**Trim attack** (``fang_trim``, the paper's attack on trimmed mean and median). With
full knowledge, let max_j / min_j be the largest / smallest benign value of coordinate
j and b > 1 (paper: b = 2). Each malicious value is drawn uniformly from

* s_j = −1 (would decrease, so push it up): [max_j, b·max_j] if max_j > 0, else
  [max_j, max_j/b];
* s_j = +1 (would increase, so push it down): [min_j/b, min_j] if min_j > 0, else
  [b·min_j, min_j].

With partial knowledge (``knowledge="own"``) the paper estimates the benign
coordinate distribution from the attackers' own honest updates, mean μ_j and std σ_j,
and draws from [μ_j + 3σ_j, μ_j + 4σ_j] (s_j = −1) or [μ_j − 4σ_j, μ_j − 3σ_j] (s_j = +1).
This implements the paper's version, not the NDSS artifact's gradient-space one.

**Krum attack** (``fang_krum``). Δ'_1 = −λ·s. λ starts at the paper's upper bound

    λ₀ = min_{i benign} Σ_{l ∈ Γ(i)} ‖x_l − x_i‖ / ((n − 2f − 1)·√d) + max_{i benign} ‖x_i‖ / √d,

Γ(i) the n − f − 2 benign updates closest to x_i (Euclidean, not squared; x_i itself
excluded) and ‖x_i‖ = D(w_i, w_Re). λ is halved until Krum (n − f − 2 neighbours,
squared distances, f = number of malicious) over the benign rows plus the crafted ones
selects a crafted one, or λ drops to ``threshold`` (paper: 1e-5); the last λ tried is
sent either way, as in the released code.

Simplifications, stated: (1) s is the sign of the mean of the benign updates the
attacker sees (the paper derives it from the before-attack aggregate of the targeted
rule; for the mean of deltas these coincide); a zero sign counts as +1. (2) The other
f − 1 malicious clients send exact copies of Δ'_1 (the paper allows copies within a
small distance ε; the released code uses exact copies). (3) With partial knowledge the
Krum attack simulates Krum over the attackers' own honest rows plus the crafted ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import broadcast, check_knowledge, honest_rows, pairwise_sq_dists, rand, work

if TYPE_CHECKING:
    import torch

__all__ = ["FangTrim", "FangKrum", "krum_scores"]


def _sign(benign64: "torch.Tensor") -> "torch.Tensor":
    import torch

    s = torch.sign(benign64.mean(dim=0))
    return torch.where(s == 0, torch.ones_like(s), s)


def krum_scores(sq: "torch.Tensor", f: int) -> "torch.Tensor":
    """Krum scores from a squared-distance matrix: sum of the n − f − 2 smallest
    distances to *other* rows (Blanchard et al. 2017)."""
    import torch

    n = sq.shape[0]
    k = n - f - 2
    off = sq + torch.diag(torch.full((n,), math.inf, dtype=sq.dtype, device=sq.device))
    return off.topk(k, dim=1, largest=False).values.sum(dim=1)


@dataclass(frozen=True, slots=True)
class FangTrim(Attack):
    """Fang et al.'s trim attack (targets trimmed mean and coordinate median).

    * ``b``: the scaling factor of the sampling intervals (> 1; paper: 2);
    * ``knowledge``: ``"omniscient"`` (full knowledge, default) or ``"own"`` (partial
      knowledge: μ ± 3σ … 4σ from the attackers' own honest updates);
    * ``ddof``: σ's delta degrees of freedom under partial knowledge (default 1);
    * ``space``: ``"model"`` (default, the paper's intervals on w_Re + Δ) or ``"delta"``
      (module docstring).

    Every malicious client draws its own values from ``ctx.generator``.
    """

    b: float = 2.0
    knowledge: Literal["omniscient", "own"] = "omniscient"
    ddof: int = 1
    space: Literal["model", "delta"] = "model"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Fang trim attack: push each coordinate past the benign extreme against its direction"
    reference: ClassVar[str] = "Fang, Cao, Jia & Gong, USENIX Security 2020"

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_b(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 1):
            raise param_error(self, "b", v, "must be a finite number > 1")

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    def validate_ddof(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "ddof", v, "must be an integer ≥ 0")

    def validate_space(self, v: str) -> None:
        if v not in ("model", "delta"):
            raise param_error(self, "space", v, "must be 'model' (the paper's) or 'delta'")

    def intervals(self, benign: "torch.Tensor", global_params: "torch.Tensor | None" = None,
                  ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """(low, high) delta intervals per coordinate (``work`` precision) for these benign
        rows; in model space the models are ``global_params`` + rows (zero when omitted)."""
        import torch

        x = work(benign)
        s = _sign(x)
        base = None
        if self.space == "model" and self.knowledge != "own" and global_params is not None:
            base = global_params.to(device=x.device, dtype=x.dtype)
            x = x + base[None, :]
        if self.knowledge == "own":
            if x.shape[0] <= self.ddof:
                raise param_error(self, "ddof", self.ddof,
                                  f"σ needs more than ddof own honest updates, got {x.shape[0]}")
            mu, sd = x.mean(dim=0), x.std(dim=0, correction=self.ddof)
            up_lo, up_hi = mu + 3 * sd, mu + 4 * sd
            dn_lo, dn_hi = mu - 4 * sd, mu - 3 * sd
        else:
            mx, mn = x.max(dim=0).values, x.min(dim=0).values
            up_lo = mx
            up_hi = torch.where(mx > 0, mx * self.b, mx / self.b)
            dn_lo = torch.where(mn > 0, mn / self.b, mn * self.b)
            dn_hi = mn
        push_up = s < 0
        low, high = torch.where(push_up, up_lo, dn_lo), torch.where(push_up, up_hi, dn_hi)
        if base is not None:
            low, high = low - base, high - base
        return low, high

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        benign = honest_rows(self.knowledge, ctx)
        if benign.shape[0] == 0:
            raise param_error(self, "knowledge", self.knowledge, "no honest updates are visible")
        low, high = self.intervals(benign, ctx.global_params)
        own = ctx.own_updates
        u = rand(tuple(own.shape), ctx, own, dtype=low.dtype)
        return (low + u * (high - low)).to(dtype=own.dtype, device=own.device)


@dataclass(frozen=True, slots=True)
class FangKrum(Attack):
    """Fang et al.'s Krum attack: −λ·sign(benign change), λ halved until Krum picks it.

    * ``threshold``: stop halving once λ ≤ threshold (paper: 1e-5);
    * ``knowledge``: ``"omniscient"`` (full knowledge, default) or ``"own"``.

    Needs at least n − f − 2 ≥ 1 neighbours in the simulated Krum and, for λ₀,
    n − 2f − 1 ≥ 1 (i.e. f < (n − 1)/2).
    """

    threshold: float = 1e-5
    knowledge: Literal["omniscient", "own"] = "omniscient"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Fang Krum attack: −λ·sign(benign change) with the largest λ Krum still selects"
    reference: ClassVar[str] = "Fang, Cao, Jia & Gong, USENIX Security 2020"

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_threshold(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "threshold", v, "must be a finite number > 0")

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    def lambda0(self, benign: "torch.Tensor", n: int, f: int) -> float:
        """The paper's upper bound on λ for n clients with f malicious."""
        import torch

        x = work(benign)
        h, d = x.shape
        k = n - f - 2
        if n - 2 * f - 1 < 1 or k < 1 or h < 2:
            raise InvalidParameter(
                f"FangKrum: f = {f} malicious of n = {n}: λ₀ needs n − 2f − 1 ≥ 1 (f < (n − 1)/2), "
                f"n − f − 2 ≥ 1 and at least 2 benign rows (got {h}, {self.knowledge!r} knowledge)")
        dist = pairwise_sq_dists(x).sqrt()
        dist = dist + torch.diag(torch.full((h,), math.inf, dtype=dist.dtype, device=dist.device))
        kk = min(k, h - 1)  # with partial knowledge fewer benign rows may be visible
        score = dist.topk(kk, dim=1, largest=False).values.sum(dim=1)
        term1 = float(score.min()) / ((n - 2 * f - 1) * math.sqrt(d))
        term2 = float(torch.linalg.vector_norm(x, dim=1, dtype=torch.float64).max()) / math.sqrt(d)
        return term1 + term2

    def search(self, benign: "torch.Tensor", n: int, f: int) -> tuple[float, bool, "torch.Tensor"]:
        """(λ, whether Krum selected a crafted row, s) for these benign rows."""
        import torch

        x = work(benign)
        h = x.shape[0]
        s = _sign(x)
        m = h + f  # rows in the simulated Krum
        lam = self.lambda0(x, n, f)
        if not math.isfinite(lam):  # halving ∞ (or NaN) never reaches the threshold
            raise InvalidParameter(
                f"FangKrum: λ₀ = {lam} is not finite: the benign updates' distances overflow float64 "
                f"(largest |value| {float(x.abs().max()):.3g})")
        if m - f - 2 < 1:
            raise InvalidParameter(
                f"FangKrum: the simulated Krum over {h} benign and f = {f} crafted rows needs "
                f"rows − f − 2 ≥ 1 ({self.knowledge!r} knowledge)")
        bb = pairwise_sq_dists(x)
        sq_norm = torch.linalg.vector_norm(x, dim=1, dtype=torch.float64) ** 2
        ss = float(s @ s)
        xs = (x @ s).to(torch.float64)
        full = torch.zeros((m, m), dtype=torch.float64, device=bb.device)
        full[:h, :h] = bb
        while True:
            # ‖−λs − x_i‖² = λ²‖s‖² + 2λ⟨s, x_i⟩ + ‖x_i‖²
            cross = (lam * lam * ss + 2.0 * lam * xs + sq_norm).clamp_min(0.0)
            full[:h, h:] = cross[:, None]
            full[h:, :h] = cross[None, :]
            scores = krum_scores(full, f)
            # ties go to the lowest index, so a crafted row (index ≥ h) must strictly win
            won = int(torch.argmin(scores)) >= h
            if won or lam <= self.threshold:
                return lam, won, s
            lam = lam / 2

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        benign = honest_rows(self.knowledge, ctx)
        lam, _, s = self.search(benign, ctx.n_clients, ctx.n_malicious)
        return broadcast(-lam * s, ctx)
