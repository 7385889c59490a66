"""Min-Max and Min-Sum: the aggregation-rule-agnostic attacks of Shejwalkar & Houmansadr.

Shejwalkar & Houmansadr, "Manipulating the Byzantine: Optimizing Model Poisoning
Attacks and Defenses for Federated Learning", NDSS 2021. All malicious clients send

    x_b = μ − γ·p,

μ the mean of the benign updates and p a fixed perturbation direction (``dev_type``):

* ``"unit_vec"``: p = μ/‖μ‖ (inverse unit vector; the released code's default);
* ``"sign"``: p = sign(μ) (inverse sign);
* ``"std"``: p = −s·σ, σ the coordinate-wise standard deviation of the benign updates
  (``ddof``, default 1 as ``torch.std``) and s = ``std_sign``.

Sign of the ``std`` direction (``std_sign``). The released code works on gradients and
sends μ_g − γ·σ_g. Our rows are deltas (local − global ≈ −η·gradient): negating the
space flips μ but not σ (a standard deviation is ≥ 0), so the released attack is
μ_Δ + γ·σ_Δ on deltas, ``std_sign = +1`` (the default). ``std_sign = −1`` applies the
printed formula μ − γσ literally to delta rows (what a delta-space port that forgets the
flip computes). ``unit_vec`` and ``sign`` need no such parameter: p flips with μ, so
μ − γp is the same attack in either space. Worked example: honest deltas (1, 1), (2, 3),
(3, 2) give μ = (2, 2), σ = (1, 1) and, for Min-Max, the crafted row
(1 + √2.5, 1 + √2.5) ≈ (2.581, 2.581) (derivation in the tests).

γ is the largest value for which x_b stays inside the benign cloud:

* Min-Max: max_i ‖x_b − x_i‖² ≤ max_{i,j} ‖x_i − x_j‖² (no benign update is farther
  from x_b than the two most distant benign updates are from each other);
* Min-Sum: Σ_i ‖x_b − x_i‖² ≤ min_i Σ_j ‖x_i − x_j‖² (x_b's total squared distance does
  not exceed that of the most central benign update). This is the released code's
  bound; the paper's text states max_i instead, which is looser. ``score_bound``
  selects it (``"min"`` default, ``"max"`` for the text's form).

The search is the released code's: γ = ``gamma_init``, step = ``gamma_init``,
γ_succ = 0; while |γ_succ − γ| > ``tol``: if x_b(γ) passes, γ_succ ← γ and γ ← γ + step/2,
otherwise γ ← γ − step/2; then step ← step/2. The result is μ − γ_succ·p (so γ never
exceeds 2·gamma_init, and γ_succ = 0, i.e. x_b = μ, when no γ passes).

Distances are computed without materialising candidates (and compared in float64): with
D_i = μ − x_i, ‖x_b − x_i‖² = ‖D_i‖² − 2γ⟨p, D_i⟩ + γ²‖p‖², so each step of the search
costs O(h) once ‖D_i‖² and ⟨p, D_i⟩ are known; benign pairwise distances come from the
Gram matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, Surface, param_error

from ._common import broadcast, check_knowledge, honest_rows, work

if TYPE_CHECKING:
    import torch

__all__ = ["MinMax", "MinSum", "perturbation", "gamma_search"]

DEV_TYPES = ("unit_vec", "sign", "std")


def perturbation(benign: "torch.Tensor", dev_type: str, ddof: int = 1, std_sign: int = 1) -> "torch.Tensor":
    """The direction p (``work`` precision, shape (d,)) for ``dev_type`` over the benign
    rows; for ``"std"`` p = −std_sign·σ, so that x_b = μ − γp = μ + std_sign·γ·σ."""
    import torch

    x = work(benign)
    mu = x.mean(dim=0)
    if dev_type == "unit_vec":
        norm = torch.linalg.vector_norm(mu)
        return mu / norm if float(norm) > 0 else torch.zeros_like(mu)
    if dev_type == "sign":
        return torch.sign(mu)
    if x.shape[0] <= ddof:
        return torch.zeros_like(mu)
    return -std_sign * x.std(dim=0, correction=ddof)


def gamma_search(passes, gamma_init: float, tol: float) -> float:
    """The released code's halving search for the largest γ with ``passes(γ)``."""
    gamma, step, succ = float(gamma_init), float(gamma_init), 0.0
    while abs(succ - gamma) > tol:
        if passes(gamma):
            succ = gamma
            gamma = gamma + step / 2
        else:
            gamma = gamma - step / 2
        step = step / 2
    return succ


@dataclass(frozen=True, slots=True)
class _Agnostic(Attack):
    dev_type: Literal["unit_vec", "sign", "std"] = "unit_vec"
    gamma_init: float = 10.0
    tol: float = 1e-5
    ddof: int = 1
    knowledge: Literal["omniscient", "own"] = "omniscient"
    std_sign: int = 1
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)

    @property
    def omniscient(self) -> bool:  # type: ignore[override]
        return self.knowledge == "omniscient"

    def validate_dev_type(self, v: str) -> None:
        if v not in DEV_TYPES:
            raise param_error(self, "dev_type", v, "must be 'unit_vec', 'sign' or 'std'")

    def validate_gamma_init(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "gamma_init", v, "must be a finite number > 0")

    def validate_tol(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "tol", v, "must be a finite number > 0")

    def validate_ddof(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "ddof", v, "must be an integer ≥ 0")

    def validate_knowledge(self, v: str) -> None:
        check_knowledge(self, v)

    def validate_std_sign(self, v: int) -> None:
        if isinstance(v, bool) or v not in (1, -1):
            raise param_error(self, "std_sign", v, "must be +1 (released code: μ + γσ on deltas) "
                                                   "or -1 (μ − γσ on deltas)")

    def _bound_ok(self, cand_sq: "torch.Tensor", benign_sq: "torch.Tensor") -> bool:  # pragma: no cover
        raise NotImplementedError

    def gamma(self, benign: "torch.Tensor") -> tuple[float, "torch.Tensor", "torch.Tensor"]:
        """(γ_succ, μ, p) for these benign rows (μ and p in ``work`` precision)."""
        import torch

        x = work(benign)
        mu = x.mean(dim=0)
        p = perturbation(x, self.dev_type, self.ddof, self.std_sign)
        cen = x - mu[None, :]  # x_i − μ = −D_i
        a = torch.linalg.vector_norm(cen, dim=1, dtype=torch.float64) ** 2  # ‖D_i‖²
        b = -(cen @ p).to(torch.float64)  # ⟨p, D_i⟩
        c = float(torch.linalg.vector_norm(p, dtype=torch.float64) ** 2)  # ‖p‖²
        gram = (cen @ cen.T).to(torch.float64)
        sq = gram.diagonal()
        benign_sq = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min(0.0)
        del cen

        def passes(g: float) -> bool:
            cand = (a - 2.0 * g * b + (g * g) * c).clamp_min(0.0)  # ‖x_b − x_i‖²
            return self._bound_ok(cand, benign_sq)

        return gamma_search(passes, self.gamma_init, self.tol), mu, p

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        benign = honest_rows(self.knowledge, ctx)
        if benign.shape[0] == 0:
            raise param_error(self, "knowledge", self.knowledge, "no honest updates are visible")
        g, mu, p = self.gamma(benign)
        return broadcast(mu - g * p, ctx)


@dataclass(frozen=True, slots=True)
class MinMax(_Agnostic):
    """Min-Max: the largest γ with max_i ‖μ − γp − x_i‖² ≤ max_{i,j} ‖x_i − x_j‖².

    Parameters: ``dev_type`` ∈ {unit_vec, sign, std} (default unit_vec), ``gamma_init``
    (10, the released code's start for the AGR-agnostic attacks), ``tol`` (1e-5),
    ``ddof`` and ``std_sign`` (for ``std``: +1 default = the released code's μ_g − γσ_g
    carried to deltas, i.e. μ + γσ; −1 = μ − γσ on deltas), ``knowledge``
    (``"omniscient"`` default, or ``"own"``).
    """

    summary: ClassVar[str] = "Min-Max: μ − γp, largest γ keeping max distance within the benign diameter"
    reference: ClassVar[str] = "Shejwalkar & Houmansadr, NDSS 2021"

    def _bound_ok(self, cand_sq: "torch.Tensor", benign_sq: "torch.Tensor") -> bool:
        return bool(cand_sq.max() <= benign_sq.max())


@dataclass(frozen=True, slots=True)
class MinSum(_Agnostic):
    """Min-Sum: the largest γ with Σ_i ‖μ − γp − x_i‖² ≤ min_i Σ_j ‖x_i − x_j‖².

    Same parameters as :class:`MinMax`, plus ``score_bound``: ``"min"`` (default, the
    released code) or ``"max"`` (the paper's text) over the benign summed distances.
    """

    score_bound: Literal["min", "max"] = "min"
    summary: ClassVar[str] = "Min-Sum: μ − γp, largest γ keeping the summed squared distance benign-like"
    reference: ClassVar[str] = "Shejwalkar & Houmansadr, NDSS 2021"

    def validate_score_bound(self, v: str) -> None:
        if v not in ("min", "max"):
            raise param_error(self, "score_bound", v, "must be 'min' (released code) or 'max' (paper text)")

    def _bound_ok(self, cand_sq: "torch.Tensor", benign_sq: "torch.Tensor") -> bool:
        scores = benign_sq.sum(dim=1)
        bound = scores.min() if self.score_bound == "min" else scores.max()
        return bool(cand_sq.sum() <= bound)
