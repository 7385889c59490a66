"""FLAME: cosine clustering, adaptive clipping and adaptive noise.

Nguyen, Rieger, Chen, Yalame, Möllering, Fereidooni, Marchal, Miettinen, Mirhoseini,
Zeitouni, Koushanfar, Sadeghi & Schneider, "FLAME: Taming Backdoors in Federated
Learning", USENIX Security 2022, Algorithm 1. With Wᵢ the local models and G the
previous global model:

1. cᵢⱼ = 1 − cos(Wᵢ, Wⱼ) for all pairs;
2. HDBSCAN on (cᵢⱼ) with a minimum cluster size of n/2 + 1; the updates of the
   (unique, since it holds a majority) cluster are admitted, all others are outliers;
3. eᵢ = ‖Wᵢ − G‖ for all n clients, S = median(e₁ … eₙ);
4. each admitted model is clipped towards G: G + (Wᵢ − G)·min(1, S/eᵢ);
5. the new global model is the plain mean of the L clipped admitted models;
6. Gaussian noise N(0, σ²I) with σ = λ·S is added (λ = 0.001 for the paper's image
   and NLP tasks, 0.01 for its NIDS task).

Here every row is an update Δᵢ = Wᵢ − G, so eᵢ = ‖Δᵢ‖ and steps 4–6 act on Δ: the
aggregate is (1/L)·Σ Δᵢ·min(1, S/eᵢ) + N(0, σ²I), which is the paper's new global
model minus G. The noise is drawn from ``ctx.generator``.

Conventions (named parameters): ``space`` chooses what the cosine distances of step 1
compare. Algorithm 1 writes the local models Wᵢ while the text speaks of "model
updates"; ``"updates"`` (default) compares the deltas Δᵢ, ``"models"`` the models
G + Δᵢ (needs ``ctx.global_params``). The paper leaves HDBSCAN's min_samples open;
here ``min_samples = 1`` (every update is its own core; mutual reachability is the
cosine distance itself). With a minimum cluster size above n/2 the condensed tree has
only its root, so a single cluster must be allowed (scikit-learn's HDBSCAN,
``allow_single_cluster=True``). HDBSCAN then labels as members only the updates still
in that cluster when it finally splits into parts smaller than the minimum size;
updates that left it earlier, one by one from its sparse edge, are outliers. So even
with no attacker FLAME admits about n/2 + 1 updates when the honest ones are spread
evenly (measured: 6–7 of 10, 11–13 of 20, 26–27 of 50 i.i.d. Gaussian updates) —
a property of the algorithm as specified, not of this implementation. The median of
step 3 is the midpoint median for even n.

Non-finite updates are rejected before FLAME runs (n counts the finite ones).
Results outside the output dtype's range saturate at its largest finite value.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext

from ._common import (TINY64, check_choice, check_count, check_number, combine, finite_rows, generator_of, gram64,
                      rescale_pow2, rescale_rows_pow2)
from ._stats import clip_scales, midpoint_median, power_of_two_below, safe_norms, saturate

if TYPE_CHECKING:
    import torch

__all__ = ["FLAME", "cosine_distances", "hdbscan_labels"]


def cosine_distances(gram: "torch.Tensor") -> "torch.Tensor":
    """1 − cos from a float64 Gram matrix: symmetric, zero diagonal, in [0, 2].

    A zero row has cosine 0 with every non-zero row (distance 1) and distance 0 to
    another zero row."""
    import torch

    norms = gram.diagonal().clamp_min(0.0).sqrt()
    denom = norms[:, None] * norms[None, :]
    cos = torch.where(denom > 0, gram / denom.clamp_min(1e-300), torch.zeros_like(gram)).clamp(-1.0, 1.0)
    dist = 1.0 - cos
    zero = norms == 0
    dist[zero[:, None] & zero[None, :]] = 0.0
    dist = 0.5 * (dist + dist.T)
    dist.fill_diagonal_(0.0)
    return dist


def hdbscan_labels(dist: "torch.Tensor", min_cluster_size: int, min_samples: int = 1, *,
                   allow_single_cluster: bool = True) -> list[int]:
    """HDBSCAN labels (−1: outlier) of a precomputed distance matrix (scikit-learn); one cluster of
    everything is allowed unless ``allow_single_cluster`` is false."""
    import numpy as np
    from sklearn.cluster import HDBSCAN

    n = dist.shape[0]
    if n == 1:
        return [0]
    d = np.ascontiguousarray(dist.detach().cpu().numpy(), dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = HDBSCAN(min_cluster_size=max(2, min(min_cluster_size, n)), min_samples=min(min_samples, n),
                        metric="precomputed", allow_single_cluster=allow_single_cluster, copy=True)
        return [int(v) for v in model.fit(d).labels_]


@dataclass(frozen=True, slots=True)
class FLAME(Aggregator):
    """FLAME (Nguyen et al., USENIX Security 2022): HDBSCAN on cosine distances, clip to
    the median norm, Gaussian noise λ·S.

    * ``lam``: the noise level λ ≥ 0 (paper: 0.001 for image/NLP, 0.01 for NIDS);
    * ``space``: ``"updates"`` (default) or ``"models"`` — what the cosine compares;
    * ``min_cluster_size``: HDBSCAN's minimum cluster size; unset is the paper's
      ⌊n/2⌋ + 1;
    * ``min_samples``: HDBSCAN's core neighbourhood (default 1).

    ``Decision.state``: the clipping bound S, σ, the cluster labels (−1: outlier).
    """

    lam: float = 0.001
    space: Literal["updates", "models"] = "updates"
    min_cluster_size: int | None = None
    min_samples: int = 1
    unanimity: ClassVar[bool] = False  # noise is added to the aggregate
    summary: ClassVar[str] = "FLAME: HDBSCAN on cosine distances, clip to median norm, noise λ·S"
    reference: ClassVar[str] = "Nguyen et al., USENIX Security 2022"

    def validate_lam(self, v: float) -> None:
        check_number(self, "lam", v, low=0.0)

    def validate_space(self, v: str) -> None:
        check_choice(self, "space", v, ("updates", "models"))

    def validate_min_cluster_size(self, v: int | None) -> None:
        check_count(self, "min_cluster_size", v, minimum=2)

    def validate_min_samples(self, v: int) -> None:
        check_count(self, "min_samples", v, allow_none=False, minimum=1)

    def _gram(self, rows: "torch.Tensor", ctx: ServerContext) -> "torch.Tensor":
        """Gram matrix of what the cosines compare; only directions matter, so rows whose
        products overflow float64 are rescaled first (by an exact power of two), and so are
        float64 rows whose products underflow (largest entry below 2⁻³⁰⁰, each row by its own
        power of two: at 1e-170 every row counted as a zero row, at cosine distance 0 from
        the others, and all of them were admitted)."""
        import torch

        if self.space == "updates":
            if rows.dtype == torch.float64:
                lo, hi = torch.aminmax(rows, dim=1)
                if bool((torch.maximum(lo.abs(), hi.abs()) < TINY64).any()):
                    rows, _ = rescale_rows_pow2(rows, low=TINY64, high=2.0 ** 400)
            g = gram64(rows)
            if not bool(torch.isfinite(g).all()):  # each row by its own power of two: a moderate row
                # next to one of 1e300 keeps its direction (one common factor flushed it to zero)
                g = gram64(rescale_rows_pow2(rows.to(torch.float64), low=TINY64, high=2.0 ** 400)[0])
            return g
        if ctx.global_params is None:
            raise InvalidParameter("FLAME(space='models'): ctx.global_params is needed to form the local models")
        glob = ctx.global_params.to(device=rows.device)
        if tuple(glob.shape) != (rows.shape[1],):
            raise InvalidParameter(f"FLAME(space='models'): ctx.global_params has shape {tuple(glob.shape)}, "
                                   f"expected ({rows.shape[1]},)")
        # ⟨G + Δᵢ, G + Δⱼ⟩ = ‖G‖² + ⟨G, Δᵢ⟩ + ⟨G, Δⱼ⟩ + ⟨Δᵢ, Δⱼ⟩
        both_rows = torch.cat([glob.to(rows.dtype)[None, :], rows])
        if both_rows.dtype == torch.float64:  # tiny models: all of them times one power of two
            both_rows, _ = rescale_pow2(both_rows, low=TINY64, high=math.inf, target=0)
        both = gram64(both_rows)
        gd = both[0, 1:]
        g = both[1:, 1:] + gd[:, None] + gd[None, :] + both[0, 0]
        if not bool(torch.isfinite(g).all()):
            w = torch.cat([glob.to(torch.float64)[None, :], rows.to(torch.float64)])
            w = w * power_of_two_below(float(w.abs().max()))
            g = gram64(w[1:] + w[:1])  # the models themselves, rescaled
        return g

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        ok = finite_rows(updates)
        fin = ok.nonzero().flatten()
        m = int(fin.numel())
        labels = [-2] * n  # −2: not clustered (non-finite)
        admitted = torch.zeros(n, dtype=torch.bool, device=updates.device)
        norms = torch.full((n,), math.inf, dtype=torch.float64, device=updates.device)
        size = 0
        if m:
            rows = updates if m == n else updates.index_select(0, fin)
            norms[fin] = safe_norms(rows, torch.ones(m, dtype=torch.bool, device=rows.device))
            size = self.min_cluster_size if self.min_cluster_size is not None else m // 2 + 1
            dist = cosine_distances(self._gram(rows, ctx))
            lab = hdbscan_labels(dist, size, self.min_samples)
            for j, i in enumerate(fin.tolist()):
                labels[i] = lab[j]
            best = _largest_cluster(lab, dist)
            if best is not None:
                local = torch.tensor([j for j, v in enumerate(lab) if v == best], dtype=torch.long)
                admitted[fin[local.to(fin.device)]] = True
        bound = midpoint_median(norms[fin]) if m else 0.0
        scale = torch.where(admitted, clip_scales(norms, bound), torch.zeros_like(norms))
        count = int(admitted.sum())
        weights = (scale / count if count else scale).to(updates.dtype)
        # (1/L)·Σ min(1, S/eᵢ)·Δᵢ: weights ≤ 1/L summing to ≤ 1, so finite rows cannot overflow
        agg64 = combine(weights, updates, ok).to(torch.float64)
        sigma = self.lam * bound
        if sigma > 0:
            dt = torch.float64 if updates.dtype == torch.float64 else torch.float32
            noise = torch.randn(d, generator=generator_of(ctx), dtype=dt, device="cpu").to(updates.device)
            agg64 = agg64 + sigma * noise.to(torch.float64)
        reasons: dict[int, str] = {}
        for i in (~admitted).nonzero().flatten().tolist():
            if not bool(ok[i]):
                reasons[i] = "non-finite update"
            elif labels[i] == -1:
                reasons[i] = f"FLAME: outlier to HDBSCAN on cosine distances (min cluster size {size})"
            else:
                reasons[i] = f"FLAME: not in the majority cluster (HDBSCAN cluster {labels[i]}, min size {size})"
        return Decision(aggregate=saturate(agg64, updates.dtype), accepted=admitted, weights=weights,
                        reasons=reasons, state={"bound": bound, "sigma": sigma, "labels": labels,
                                                "min_cluster_size": size})


def _largest_cluster(labels: list[int], dist: "torch.Tensor") -> int | None:
    """The label with most members; ties go to the tighter cluster (lower mean
    pairwise cosine distance), then the lower label."""
    import torch

    sizes: dict[int, int] = {}
    for v in labels:
        if v >= 0:
            sizes[v] = sizes.get(v, 0) + 1
    if not sizes:
        return None
    top = max(sizes.values())
    cands = [v for v, s in sizes.items() if s == top]
    if len(cands) == 1:
        return cands[0]

    def spread(v: int) -> float:
        idx = torch.tensor([j for j, u in enumerate(labels) if u == v], dtype=torch.long)
        return float(dist.index_select(0, idx).index_select(1, idx).mean())

    return min(cands, key=lambda v: (spread(v), v))
