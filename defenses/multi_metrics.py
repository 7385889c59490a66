"""Multi-Metrics: three distance features per update, whitened, the least divergent kept.

Huang, Li, Chen, Shi & Gao, "Multi-metrics adaptively identifies backdoors in Federated
learning", ICCV 2023 (pp. 4652–4662; arXiv:2303.06601). With w₀ the global model the
round started from, Δᵢ = wᵢ − w₀ client i's update and n clients:

1. *Multiple metrics as the feature of a gradient* (the paper's definition and its
   redefinition as summed deviations): every update
   gets three numbers fᵢ = (‖Δᵢ‖₁, ‖Δᵢ‖₂, cos(w₀, wᵢ)) — its Manhattan length, its
   Euclidean length and the cosine of the angle between the global and the local model —
   and its feature vector is its summed deviation from every other client:
   xᵢ = Σ_{j≠i} |fᵢ − fⱼ| (per component);
2. *dynamic weighting by whitening*: Σ the covariance matrix of the n feature vectors
   (the 3 × 3 sample covariance, n − 1 in the denominator), the score
   δᵢ = √(xᵢᵀ Σ⁻¹ xᵢ) (xᵢ not centred);
3. the ⌊p·n⌋ updates with the lowest scores (the least divergent) are kept, p = 0.3;
4. they are averaged, weighted by their clients' sample counts (FedAvg).

Sources and where they differ (``features`` chooses; the default is the paper's):

* ``features = "paper"`` (default): steps 1–4 as above. The equations are those of the
  paper as the authors reproduce them on their project page (github.com/siquanhuang/
  Multi-metrics, ``index.html`` at commit 83d68b0; the PDF itself was not reachable from
  this environment). That page says the *higher*-scoring gradients are kept, contrary to
  its own remark that they are the more divergent ones and to every implementation; the
  lowest are kept here, as the code does.
* ``features = "pairwise"``: the authors' released code (same repository, ``defense.py``,
  class ``Multi_metrics``, commit 5cd027e) and BackFed's port
  (github.com/thinh-dao/BackFed, backfed/servers/anomaly_detection/multi_metrics_server.py,
  commit 05ba905) sum *pairwise* distances instead: xᵢ = (Σⱼ (1 − cos(wᵢ, wⱼ))²,
  Σⱼ ‖wᵢ − wⱼ‖₁, Σⱼ |‖wᵢ‖ − ‖wⱼ‖|), on the local *models* wᵢ = w₀ + Δᵢ
  (``space = "models"``, default). The AlignIns authors' re-implementation
  (github.com/JiiahaoXU/AlignIns, src/aggregation.py ``agg_mul_metric``, commit aff6126)
  takes the same sums on the updates Δᵢ (``space = "updates"``). Note that the third
  "Euclidean" term of the code is the difference of the two lengths, not ‖wᵢ − wⱼ‖₂.
  ``space`` applies to this variant only (the paper's features are fixed by w₀).
* The code scores xᵢᵀΣ⁻¹xᵢ without the square root (the same ranking) and keeps
  ``int(p·n)`` rows, which is 0 for n ≤ 3 (its weighted average of nothing fails) and
  rounds 0.29·100 down to 28; here ⌊p·n⌋ in exact decimal arithmetic, at least 1.
* The code inverts Σ with ``np.linalg.inv``, which fails on an exactly singular Σ (n ≤ 3
  clients always give one: 3 features, n − 1 ≤ 2 degrees of freedom; so do identical
  clients). Here the Moore–Penrose pseudo-inverse: the features are first divided by
  their largest magnitude (the score is unchanged by that, and Σ better conditioned),
  and eigenvalues below 10⁻¹⁰ of the largest count as 0 (a direction with no spread
  does not score). A feature with no spread at all is 0 for every client and drops out.
* Aggregation: the code weights the kept updates by the clients' sample counts
  (``weighted = True``, default); BackFed averages them with equal weights
  (``weighted = False``).

Precision: every feature is computed from the updates, not from the rounded local models
(a small update on a large model changes the model below its printed digits; the code's
float32 models lose it): cosines through 1 − cos from the component of Δᵢ off w₀ (or off
the other update), lengths and their differences from ⟨w₀, Δᵢ⟩ and ‖Δᵢ‖². Cosines that
differ by less than their own rounding bound ((d + 4)·2⁻⁵² relative to the terms they
come from, d the dimension) count as equal: whitening divides each feature by its
spread, and would otherwise turn rounding noise among parallel updates into scores of
order 1.

Ties: scores equal up to rounding (10⁻⁹ relative) are broken by the rows' content
(fingerprints Σⱼxⱼ, Σⱼ j·xⱼ), never by their position; bit-identical copies of a kept
update are kept with it (they are one point, and which copy the cut took would otherwise
depend on positions — and weigh differently under sample weights), so a round with
copies may keep more than ⌊p·n⌋. The paper's features and
``space = "models"`` need ``ctx.global_params`` (w₀); without it the rule refuses with a
clear error. Rows whose entries would overflow float64 products are rescaled first by an
exact power of two (with w₀): the score is scale-free.

Non-finite updates are rejected before the rule runs (n counts the finite ones).
``Decision.state``: the feature vectors xᵢ, the scores δᵢ and the number kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error

from ._common import TINY64, check_choice, check_number, finite_peak, finite_rows, pow2_exponent, times_pow2
from ._detect import exact_count, kept_mean
from ._pairwise import tie_classes
from ._stats import order_low_first

if TYPE_CHECKING:
    import torch

__all__ = ["MultiMetrics", "cosine_rounding", "paper_features", "pairwise_features", "whitened_scores"]

_CHUNK = 8192


def cosine_rounding(d: int) -> float:
    """A bound on the rounding error of a cosine taken from float64 inner products of d
    terms (γ_d on the product and on each norm: about 2·d·2⁻⁵³): cosines closer than this
    are not told apart (whitening divides by the spread, and would blow rounding up to O(1))."""
    return (d + 4) * 2.0 ** -52


def paper_features(rows: "torch.Tensor", glob: "torch.Tensor") -> "torch.Tensor":
    """``(n, 3)`` float64: xᵢ = Σⱼ |fᵢ − fⱼ| with fᵢ = (‖Δᵢ‖₁, ‖Δᵢ‖₂, cos(w₀, w₀ + Δᵢ)).

    The cosines are compared through 1 − cos, taken from the updates: with g = ‖w₀‖²,
    cᵢ = ⟨w₀, Δᵢ⟩ and oᵢ = ‖Δᵢ‖², sin² = (oᵢ − cᵢ²/g)/‖wᵢ‖² and 1 − cos = sin²/(1 + cos)
    (1 − cos directly when cos ≤ 0): small updates on a large model keep their differences.
    Two cosines closer than their rounding bound (:func:`cosine_rounding` times each
    one's terms) count as equal."""
    import torch

    n, d = rows.shape
    l1 = torch.zeros(n, dtype=torch.float64, device=rows.device)
    own = torch.zeros_like(l1)  # ‖Δᵢ‖²
    dot = torch.zeros_like(l1)  # ⟨w₀, Δᵢ⟩
    g2 = 0.0
    for start in range(0, d, _CHUNK):
        block = rows[:, start:start + _CHUNK].to(torch.float64)
        gb = glob[start:start + _CHUNK].to(device=rows.device, dtype=torch.float64)
        l1 += block.abs().sum(dim=1)
        own += (block * block).sum(dim=1)
        dot += block @ gb
        g2 += float(gb @ gb)
    e = cosine_rounding(d)
    ww = (g2 + 2.0 * dot + own).clamp_min(0.0)  # ‖wᵢ‖²
    if g2 > 0:
        cos = torch.where(ww > 0, (g2 + dot) / (ww.sqrt() * math.sqrt(g2)).clamp_min(1e-300),
                          torch.zeros_like(dot)).clamp(-1.0, 1.0)
        perp = own - dot * dot / g2  # ‖Δᵢ‖² − ⟨w₀, Δᵢ⟩²/‖w₀‖²: the part of Δᵢ off w₀
        sin2 = torch.where(ww > 0, perp.clamp_min(0.0) / ww.clamp_min(1e-300), torch.ones_like(ww))
        pos = cos > 0
        omc = torch.where(pos, sin2 / (1.0 + cos), 1.0 - cos)
        noise = torch.where(pos, e * (own + dot * dot / g2) / ww.clamp_min(1e-300) + e * omc, torch.full_like(cos, e))
    else:  # w₀ = 0: cos(0, ·) = 0 for everyone
        omc = torch.ones_like(dot)
        noise = torch.zeros_like(dot)
    f = torch.stack([l1, own.sqrt(), omc], dim=1)
    dev = (f[:, None, :] - f[None, :, :]).abs()
    cdev = dev[..., 2]
    dev[..., 2] = torch.where(cdev <= noise[:, None] + noise[None, :], torch.zeros_like(cdev), cdev)
    return dev.sum(dim=1)


def pairwise_features(rows: "torch.Tensor", glob: "torch.Tensor | None") -> "torch.Tensor":
    """``(n, 3)`` float64: xᵢ = (Σⱼ (1 − cos(vᵢ, vⱼ))², Σⱼ ‖vᵢ − vⱼ‖₁, Σⱼ |‖vᵢ‖ − ‖vⱼ‖|) with vᵢ
    the models w₀ + Δᵢ (``glob`` = w₀) or the updates Δᵢ (``glob`` None).

    Everything is taken from the updates, never from the rounded models: vᵢ − vⱼ = Δᵢ − Δⱼ
    (pair by pair, as differences of the rows), ‖vᵢ‖² = ‖w₀‖² + 2⟨w₀, Δᵢ⟩ + ‖Δᵢ‖²,
    ‖vᵢ‖ − ‖vⱼ‖ = (2⟨w₀, Δᵢ − Δⱼ⟩ + ‖Δᵢ‖² − ‖Δⱼ‖²)/(‖vᵢ‖ + ‖vⱼ‖) and
    1 − cos(vᵢ, vⱼ) = (‖vᵢ − vⱼ‖² − (‖vᵢ‖ − ‖vⱼ‖)²)/(2‖vᵢ‖‖vⱼ‖): small updates on a large
    model keep their differences (the models themselves agree in every printed digit)."""
    import torch

    n, d = rows.shape
    man = torch.zeros(n, n, dtype=torch.float64, device=rows.device)
    sq = torch.zeros_like(man)
    own = torch.zeros(n, dtype=torch.float64, device=rows.device)  # ‖Δᵢ‖²
    dot = torch.zeros_like(own)  # ⟨w₀, Δᵢ⟩
    g2 = 0.0
    for start in range(0, d, _CHUNK):
        block = rows[:, start:start + _CHUNK].to(torch.float64)
        man += torch.cdist(block, block, p=1.0)
        sq += torch.cdist(block, block, p=2.0, compute_mode="donot_use_mm_for_euclid_dist") ** 2
        own += (block * block).sum(dim=1)
        if glob is not None:
            gb = glob[start:start + _CHUNK].to(device=rows.device, dtype=torch.float64)
            dot += block @ gb
            g2 += float(gb @ gb)
    man = 0.5 * (man + man.T)
    sq = 0.5 * (sq + sq.T)
    norms = (g2 + 2.0 * dot + own).clamp_min(0.0).sqrt()
    both = norms[:, None] + norms[None, :]
    num = 2.0 * (dot[:, None] - dot[None, :]) + (own[:, None] - own[None, :])
    dn = torch.where(both > 0, num / both.clamp_min(1e-300), torch.zeros_like(num))
    prod = norms[:, None] * norms[None, :]
    two = (2.0 * prod).clamp_min(1e-300)
    gap = torch.where(prod > 0, (sq - dn * dn) / two, torch.ones_like(sq))
    gap = gap.clamp(0.0, 2.0)  # 1 − cos; a zero vector has cosine 0 with everything
    # a gap within the rounding of its two terms (cosine_rounding) is an angle of 0: no score from noise
    noise = torch.where(prod > 0, cosine_rounding(d) * (sq + dn * dn) / two, torch.zeros_like(sq))
    off = ~torch.eye(n, dtype=torch.bool, device=rows.device) & (gap > noise)
    cosd = torch.where(off, gap * gap, torch.zeros_like(gap)).sum(dim=1)
    return torch.stack([cosd, man.sum(dim=1), dn.abs().sum(dim=1)], dim=1)


def whitened_scores(x: "torch.Tensor", rtol: float = 1e-10) -> "torch.Tensor":
    """δᵢ = √(xᵢᵀ Σ⁺ xᵢ) (float64) with Σ the sample covariance (n − 1) of the rows of ``x``
    ``(n, k)`` and Σ⁺ its pseudo-inverse (eigenvalues ≤ ``rtol`` × the largest count as 0),
    taken after dividing each column by its largest magnitude (which leaves δ unchanged)."""
    import torch

    n = x.shape[0]
    if n < 2:
        return torch.zeros(n, dtype=torch.float64, device=x.device)
    top = x.abs().amax(dim=0)
    xs = torch.where(top > 0, x / torch.where(top > 0, top, torch.ones_like(top)), torch.zeros_like(x))
    cen = xs - xs.mean(dim=0, keepdim=True)
    cov = cen.T @ cen / (n - 1)
    cov = 0.5 * (cov + cov.T)
    evals, evecs = torch.linalg.eigh(cov)
    big = float(evals.max()) if evals.numel() else 0.0
    use = evals > rtol * big if big > 0 else torch.zeros_like(evals, dtype=torch.bool)
    inv = torch.where(use, 1.0 / torch.where(use, evals, torch.ones_like(evals)), torch.zeros_like(evals))
    proj = xs @ evecs  # (n, k)
    return ((proj * proj) * inv[None, :]).sum(dim=1).clamp_min(0.0).sqrt()


@dataclass(frozen=True, slots=True)
class MultiMetrics(Aggregator):
    """Multi-Metrics (Huang et al., ICCV 2023): Manhattan, Euclidean and cosine features,
    whitened by their covariance; the fraction ``p`` of updates with the lowest scores is averaged.

    * ``p``: the fraction kept, in (0, 1] (paper and code: 0.3; BackFed's default 0.5);
    * ``features``: ``"paper"`` (default: per-update lengths and angle to w₀, deviations
      summed) or ``"pairwise"`` (the released code: summed pairwise distances);
    * ``space``: ``"models"`` (default, the released code) or ``"updates"`` — what the
      ``"pairwise"`` distances compare;
    * ``weighted``: average the kept updates by sample counts (default, the code) or equally.
    """

    p: float = 0.3
    features: Literal["paper", "pairwise"] = "paper"
    space: Literal["models", "updates"] = "models"
    weighted: bool = True
    summary: ClassVar[str] = "Multi-Metrics: cosine/Manhattan/Euclidean features, whitened; lowest p·n kept"
    reference: ClassVar[str] = "Huang, Li, Chen, Shi & Gao, ICCV 2023"

    def validate_p(self, v: float) -> None:
        check_number(self, "p", v, low=0.0, low_open=True, high=1.0)

    def validate_features(self, v: str) -> None:
        check_choice(self, "features", v, ("paper", "pairwise"))

    def validate_space(self, v: str) -> None:
        check_choice(self, "space", v, ("models", "updates"))

    def validate_weighted(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "weighted", v, "must be true or false")

    def _needs_global(self) -> bool:
        return self.features == "paper" or self.space == "models"

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        ok = finite_rows(updates)
        fin = ok.nonzero().flatten()
        m = int(fin.numel())
        glob = None
        if self._needs_global():
            if ctx.global_params is None:
                what = "features='paper'" if self.features == "paper" else "space='models'"
                raise InvalidParameter(f"MultiMetrics({what}): ctx.global_params (the global model w₀) is needed; "
                                       "use features='pairwise', space='updates' to score the updates alone")
            glob = ctx.global_params.to(device=updates.device)
            if tuple(glob.shape) != (d,):
                raise InvalidParameter(f"MultiMetrics: ctx.global_params has shape {tuple(glob.shape)}, expected ({d},)")
            if not bool(torch.isfinite(glob).all()):
                raise InvalidParameter("MultiMetrics: ctx.global_params is not finite")
        reasons: dict[int, str] = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        kept = torch.zeros(n, dtype=torch.bool, device=updates.device)
        state: dict[str, Any] = {"features": [], "scores": [], "kept": 0}
        if m:
            rows = updates.index_select(0, fin)
            peak = finite_peak(rows, torch.ones(m, dtype=torch.bool, device=rows.device))
            if glob is not None:
                peak = max(peak, float(glob.abs().max()) if d else 0.0)
            k2 = pow2_exponent(peak, low=TINY64)  # one exact power of two for rows and w₀: same scores
            if k2:
                rows = times_pow2(rows.to(torch.float64), k2)
                glob = None if glob is None else times_pow2(glob.to(torch.float64), k2)
            if self.features == "paper":
                x = paper_features(rows, glob)
            else:
                x = pairwise_features(rows, glob if self.space == "models" else None)
            scores = whitened_scores(x)
            keep = min(m, max(1, exact_count(self.p, m)))
            classes = tie_classes(scores, 1e-9 * scores.abs() + 1e-300)
            order = order_low_first(classes, updates.index_select(0, fin))
            chosen = order[:keep].tolist()
            cut = float(scores[order[keep - 1]])
            last = int(classes[order[keep - 1]])
            for j in order[keep:].tolist():  # a copy of a kept update is that update: kept too
                if int(classes[j]) == last and any(int(classes[i]) == last and torch.equal(rows[i], rows[j])
                                                   for i in chosen):
                    chosen.append(j)
            kept[fin[torch.tensor(chosen, dtype=torch.long, device=fin.device)]] = True
            for j in order[keep:].tolist():
                if j in chosen:
                    continue
                reasons[int(fin[j])] = (f"Multi-Metrics: score {float(scores[j]):.4g} not among the {keep} lowest "
                                        f"of {m} (p = {self.p:g}; highest kept {cut:.4g})")
            state = {"features": x.tolist(), "scores": scores.tolist(), "kept": len(chosen), "rows": fin.tolist()}
        agg, weights = kept_mean(updates, ok, kept, ctx, self.weighted)
        return Decision(aggregate=agg, accepted=kept, weights=weights, reasons=reasons, state=state)
