"""Cosine-similarity filter against a reference direction.

Reject an update xᵢ when cos(xᵢ, r) < c. The reference r is one of:

* ``"median"``: the coordinate-wise median of this round's (finite) updates
  (Yin et al., ICML 2018, as a robust centre);
* ``"previous"``: the previous round's global update (momentum-style direction
  checks, as in FoolsGold/FLAME-family filters and deployed validators);
* ``"root"``: the server's own update on a small trusted root dataset, g₀ in
  Cao, Fang, Liu & Gong, "FLTrust: Byzantine-robust Federated Learning via Trust
  Bootstrapping", NDSS 2021.

Caveat on the threshold: for random directions in ℝ^d the cosine
is about N(0, 1/d), so c = 0 lets through half of pure-noise updates; rejecting
noise needs c of several times 1/√d. Conversely, an attacker who knows the rule can
still send any vector inside the cone cos ≥ c (up to ‖·‖·√(1 − c²) orthogonal drift).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.pipeline import Filter, FilterResult
from redteam.types import ServerContext

from ._common import GRAM_CHUNK, TINY64, check_choice, check_number, finite_rows, rescale_rows_pow2, row_norms
from .median import coordinate_median

if TYPE_CHECKING:
    import torch

__all__ = ["CosineFilter", "cosine_to", "root_update_of"]


def cosine_to(updates: "torch.Tensor", ref: "torch.Tensor", chunk: int = GRAM_CHUNK) -> "torch.Tensor":
    """cos(xᵢ, r) for every row, in float64; 0 where either vector is zero.

    float64 vectors whose products would underflow (largest entry below 2⁻³⁰⁰) or
    overflow (above 2⁴⁰⁰) are first multiplied by their own power of two (exact): a
    cosine does not depend on the scale, and a vector of 1e-170 is not a zero vector."""
    import torch

    if updates.dtype == torch.float64:
        updates, _ = rescale_rows_pow2(updates, low=TINY64, high=2.0 ** 400)
    if ref.dtype == torch.float64:
        ref = rescale_rows_pow2(ref[None, :], low=TINY64, high=2.0 ** 400)[0][0]
    n, d = updates.shape
    dot = torch.zeros(n, dtype=torch.float64, device=updates.device)
    for start in range(0, d, chunk):
        dot += updates[:, start:start + chunk].to(torch.float64) @ ref[start:start + chunk].to(torch.float64)
    norms = row_norms(updates)
    rnorm = row_norms(ref[None, :])[0]
    denom = norms * rnorm
    cos = torch.where(denom > 0, dot / denom.clamp_min(1e-300), torch.zeros_like(dot))
    return cos.clamp(-1.0, 1.0)


def root_update_of(obj: Any, ctx: ServerContext, d: int) -> "torch.Tensor":
    """The server's root-data update g₀, checked; a clear error when there is none."""
    import torch

    if ctx.root_update is None:
        raise InvalidParameter(
            f"{type(obj).__name__} needs the server's root update g₀, but ctx.root_update is None: "
            "the scenario must give the server a trusted root dataset"
        )
    g0 = torch.as_tensor(ctx.root_update()).flatten()
    if g0.shape[0] != d:
        raise InvalidParameter(
            f"{type(obj).__name__}: the root update must be a vector of length {d}, got shape {tuple(g0.shape)}"
        )
    if not bool(torch.isfinite(g0).all()):
        raise InvalidParameter(f"{type(obj).__name__}: the root update has non-finite entries")
    return g0


@dataclass(frozen=True, slots=True)
class CosineFilter(Filter):
    """Reject updates whose cosine to a reference direction is below ``threshold``.

    * ``against``: the reference r, ``"median"`` (default), ``"previous"`` or
      ``"root"`` (see the module docstring). With ``"previous"`` and no previous update (round 0) every
      finite update is accepted and ``state["reference"]`` is ``None``. With
      ``"root"`` and no root data on the server, the filter raises.
    * ``threshold``: c in [−1, 1]; accept iff cos(xᵢ, r) ≥ c. Mind the 1/√d scale.

    A zero update has cosine 0 by convention; a non-finite one is rejected.
    """

    against: Literal["median", "previous", "root"] = "median"
    threshold: float = 0.0
    summary: ClassVar[str] = "Reject updates with cos(Δ, r) < c; r = median, previous update or root update"
    reference: ClassVar[str] = "Yin et al., ICML 2018 (median); Cao et al., NDSS 2021 (root update)"

    def validate_against(self, v: str) -> None:
        check_choice(self, "against", v, ("median", "previous", "root"))

    @property
    def uses_server_data(self) -> bool:  # type: ignore[override]
        """Only against the root update does it read the server's data."""
        return self.against == "root"

    def validate_threshold(self, v: float) -> None:
        check_number(self, "threshold", v, low=-1.0, high=1.0)

    def _reference(self, updates: "torch.Tensor", ok: "torch.Tensor", ctx: ServerContext) -> "torch.Tensor | None":
        import torch

        d = updates.shape[1]
        if self.against == "median":
            if bool(ok.all()):
                return coordinate_median(updates)
            return coordinate_median(updates[ok]) if bool(ok.any()) else None
        if self.against == "previous":
            if ctx.previous_update is None:
                return None
            prev = torch.as_tensor(ctx.previous_update).flatten()
            if prev.shape[0] != d:
                raise InvalidParameter(
                    f"CosineFilter: ctx.previous_update has {prev.shape[0]} entries, the updates have {d}"
                )
            return prev.to(updates.device)
        return root_update_of(self, ctx, d).to(updates.device)

    def filter(self, updates: "torch.Tensor", ctx: ServerContext) -> FilterResult:
        ok = finite_rows(updates)
        reasons = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        ref = self._reference(updates, ok, ctx)
        if ref is None:
            return FilterResult(updates=updates, accepted=ok, reasons=reasons, state={"reference": None})
        cos = cosine_to(updates, ref)
        keep = ok & (cos >= self.threshold)
        for i in (ok & ~keep).nonzero().flatten().tolist():
            reasons[i] = f"cosine {float(cos[i]):.4g} to the {self.against} reference < threshold {self.threshold:g}"
        return FilterResult(updates=updates, accepted=keep, reasons=reasons,
                            state={"reference": self.against, "cosine": cos.tolist(),
                                   "threshold": self.threshold})
