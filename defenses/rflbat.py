"""RFLBAT: PCA to two dimensions, outlier removal, k-means, keep the least self-similar cluster.

Wang, Zhai, Zhan & Xia, "RFLBAT: A Robust Federated Learning Algorithm against Backdoor
Attack", arXiv:2201.03772 (2022), Algorithm 1. With Δ₁ … Δₙ the round's updates:

1. project the updates onto their first two principal components: points pᵢ ∈ ℝ²;
2. EDᵢ = Σⱼ ‖pᵢ − pⱼ‖ (the sum of Euclidean distances in the PCA plane); remove every
   update with EDᵢ ≥ ε₁·median(ED) (kept: EDᵢ < ε₁·median, a strict inequality);
3. choose the number of clusters K by the gap statistic (Tibshirani, Walther & Hastie,
   J. R. Stat. Soc. B 63, 2001) on the remaining points, min-max normalised per axis,
   with B uniform reference sets on [0, 1]² and K ≤ K_max; K is the smallest k with
   Gap(k) ≥ Gap(k + 1) − s_{k+1};
4. k-means with K clusters on the remaining points (k-means++ seeding);
5. for each cluster, the cosine similarities of its members' *full* updates: each
   member's mean similarity to the cluster (itself included), and the median of those;
   keep the cluster with the lowest median (backdoor updates, sharing one objective,
   are more alike than honest ones);
6. EDᵢ again inside the kept cluster; remove EDᵢ ≥ ε₂·median (ε₂ < ε₁: a stricter pass);
7. the aggregate is the mean of the updates left.

Defaults ε₁ = 10, ε₂ = 4, B = 5, K_max = 9: the values of both released
implementations we read — the RFLBAT server of Li & Dai's BackdoorIndicator code
(github.com/ybdai7/Backdoor-indicator-defense, participants/servers/RflbatServer.py,
commit 12646de) and BackFed's (github.com/thinh-dao/BackFed,
backfed/servers/anomaly_detection/rflbat_server.py and the gap statistic in
anomaly_detection_server.py, commit a00c07d). The RFLBAT authors released no code we
could find, and the paper's text was not reachable from this environment: the steps
above are the algorithm as both implementations carry it out. Where those differ or
leave a choice open, here:

* PCA: both call ``torch.pca_lowrank`` (a randomised approximation that draws from torch's
  global generator) and project the uncentred updates; here the projection is exact
  (the top two eigenvectors of the centred n × n Gram matrix, in float64). Centring
  translates every point by one vector, which changes no distance, no k-means partition
  and no min-max normalised point.
* The gap statistic's dispersion W_k is, as in both, the sum of the (unsquared)
  Euclidean distances of the points to their centres (Tibshirani et al. use the sum of
  squared distances); BackdoorIndicator's loop counts each cluster's first member once
  per member (an indexing slip), BackFed's the true sum, which is used here. As in
  BackFed, log(W + 10⁻¹⁰) (a partition with W = 0 is not −∞), a normalised axis with no
  spread is 0, and the rule is "≥" (BackdoorIndicator: ">"). The B reference sets are
  drawn once and used for every k (Tibshirani et al.; both codes draw new ones per k).
  K_max is capped at the number of points (scikit-learn refuses k > n).
* k-means: scikit-learn's ``KMeans(init="k-means++")`` in both, unseeded in
  BackdoorIndicator. Here a torch k-means: standard k-means++ seeding (Arthur &
  Vassilvitskii, SODA 2007; without scikit-learn's greedy extra trials), Lloyd
  iterations until no label changes (at most ``max_iter``), best of ``n_init`` seedings
  by inertia (``n_init = 10``, ``max_iter = 300``: scikit-learn's defaults of 2022), an
  emptied cluster keeps its centre. Every draw comes from ``ctx.generator``, over the
  rows in an order fixed by their content, so the decision does not depend on the order
  of the clients.
* A cluster of one update: BackdoorIndicator scores it 1 (ties with perfectly aligned
  clusters), BackFed +∞ (never chosen while a larger cluster exists); here +∞. Ties
  between clusters go to the one whose k-means++ seed was drawn first.
* A zero update has cosine 0 with every update, itself included (scikit-learn's
  ``cosine_similarity``).
* Aggregation: both codes average the kept updates with equal weights (``weighted =
  False``, default); ``weighted = True`` weights them by the clients' sample counts (FedAvg).
* The outlier tests are strict ("<" in both codes: a point exactly on ε·median is
  removed), and a sum of distances within 10⁻¹² (relative) of the threshold counts as on
  it (the PCA's rounding cannot say on which side a point that is on it falls).
* Degenerate rounds, which neither code handles: when every point coincides (median of
  ED = 0) nothing is an outlier; with fewer than two points left there is one cluster.
  BackFed falls back to FedAvg of all updates when fewer than two pass step 2;
  here the one update left is kept.

Non-finite updates are rejected before RFLBAT runs (n counts the finite ones).
``Decision.state``: the PCA points, the ED values of both passes with their thresholds,
K, the gap values, the k-means labels and each cluster's median cosine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error

from ._common import TINY64, check_count, check_number, finite_rows, generator_of, rescale_pow2
from ._detect import canonical_order, kept_mean
from ._stats import midpoint_median

if TYPE_CHECKING:
    import torch

__all__ = ["RFLBAT", "pca_points", "distance_sums", "kmeans", "gap_statistic"]

#: columns per float64 block when forming the Gram matrices
_CHUNK = 8192
#: a sum of distances within this relative distance of its threshold is on it (and removed)
ON_THRESHOLD = 1e-12


def _grams(rows: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """(Gram matrix of the rows, Gram matrix of the rows centred on their mean), float64,
    accumulated over column blocks (no float64 copy of the whole matrix)."""
    import torch

    n, d = rows.shape
    g = torch.zeros(n, n, dtype=torch.float64, device=rows.device)
    gc = torch.zeros_like(g)
    for start in range(0, d, _CHUNK):
        block = rows[:, start:start + _CHUNK].to(torch.float64)
        g.addmm_(block, block.T)
        block = block - block.mean(dim=0, keepdim=True)
        gc.addmm_(block, block.T)
    return 0.5 * (g + g.T), 0.5 * (gc + gc.T)


def pca_points(centred_gram: "torch.Tensor", components: int = 2) -> "torch.Tensor":
    """``(n, components)`` float64: the rows' coordinates on their top principal components,
    from the Gram matrix of the centred rows (X̃X̃ᵀ = UΛUᵀ gives the coordinates U·Λ^½).
    A spread at the level of rounding (largest eigenvalue ≤ 2⁻⁸⁰ of the largest diagonal
    entry of the uncentred Gram matrix is the caller's test) is the caller's to zero."""
    import torch

    n = centred_gram.shape[0]
    out = torch.zeros(n, components, dtype=torch.float64, device=centred_gram.device)
    if n < 2:
        return out
    evals, evecs = torch.linalg.eigh(centred_gram)
    take = min(components, n)
    lam = evals[-take:].flip(0).clamp_min(0.0)
    out[:, :take] = evecs[:, -take:].flip(1) * lam.sqrt()[None, :]
    return out


def distance_sums(points: "torch.Tensor") -> "torch.Tensor":
    """EDᵢ = Σⱼ ‖pᵢ − pⱼ‖ for every point (float64)."""
    import torch

    if points.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64, device=points.device)
    return torch.cdist(points, points).sum(dim=1)


def _ed_filter(points: "torch.Tensor", eps: float) -> tuple["torch.Tensor", "torch.Tensor", float]:
    """(kept mask, ED, threshold ε·median(ED)): kept where EDᵢ < threshold; all kept when
    the median is 0 (every point coincides)."""
    import torch

    ed = distance_sums(points)
    med = midpoint_median(ed)
    if not med > 0:
        return torch.ones_like(ed, dtype=torch.bool), ed, math.inf
    thr = eps * med
    return ed < thr * (1.0 - ON_THRESHOLD), ed, thr


def kmeans(data: "torch.Tensor", k: int, generator: "torch.Generator", n_init: int = 10,
           max_iter: int = 300) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """k-means on a batch of point sets ``data`` ``(D, m, q)`` (float64, CPU): k-means++
    seeding and Lloyd iterations, ``n_init`` seedings per set, the lowest inertia kept.

    Returns (labels ``(D, m)``, centres ``(D, k, q)``, W ``(D,)``: the sum of the points'
    Euclidean distances to their centres). Seeding: the first centre uniformly among the
    points, each next one with probability ∝ the squared distance to the nearest centre
    chosen so far (uniform when every point already sits on a centre)."""
    import torch

    D, m, q = data.shape
    runs = D * n_init
    x = data.repeat_interleave(n_init, dim=0)  # (runs, m, q)
    ar = torch.arange(runs)
    first = torch.randint(m, (runs,), generator=generator)
    centres = x[ar, first][:, None, :]
    d2 = ((x - centres) ** 2).sum(-1)
    for _ in range(1, k):
        w = d2.clone()
        empty = w.sum(dim=1) <= 0
        if bool(empty.any()):
            w[empty] = 1.0
        nxt = torch.multinomial(w, 1, generator=generator).squeeze(1)
        c = x[ar, nxt]
        centres = torch.cat([centres, c[:, None, :]], dim=1)
        d2 = torch.minimum(d2, ((x - c[:, None, :]) ** 2).sum(-1))
    labels = None
    for _ in range(max_iter):
        dist = ((x[:, :, None, :] - centres[:, None, :, :]) ** 2).sum(-1)  # (runs, m, k)
        new = dist.argmin(dim=-1)
        if labels is not None and bool((new == labels).all()):
            break
        labels = new
        onehot = torch.nn.functional.one_hot(labels, k).to(torch.float64)  # (runs, m, k)
        counts = onehot.sum(dim=1)  # (runs, k)
        sums = onehot.transpose(1, 2) @ x  # (runs, k, q)
        centres = torch.where(counts[..., None] > 0, sums / counts.clamp_min(1.0)[..., None], centres)
    else:
        dist = ((x[:, :, None, :] - centres[:, None, :, :]) ** 2).sum(-1)
        labels = dist.argmin(dim=-1)
    d_own = dist.gather(2, labels[..., None]).squeeze(-1)  # squared distance to own centre
    inertia = d_own.sum(dim=1).view(D, n_init)
    best = inertia.argmin(dim=1) + torch.arange(D) * n_init
    w_sum = d_own.clamp_min(0.0).sqrt().sum(dim=1)
    return labels[best], centres[best], w_sum[best]


def gap_statistic(points: "torch.Tensor", k_max: int, samples: int, generator: "torch.Generator",
                  n_init: int = 10, max_iter: int = 300) -> tuple[int, list[float], list[float]]:
    """(K, gaps, s): the gap statistic's choice of the number of clusters for ``points``
    ``(m, q)`` (see the module docstring), with the gaps and their s_k as far as computed
    (the search stops at the first k that satisfies the rule)."""
    import torch

    m, q = points.shape
    top = min(k_max, m)
    if top <= 1:
        return 1, [], []
    lo, hi = points.min(dim=0).values, points.max(dim=0).values
    span = hi - lo
    norm = torch.where(span > 0, (points - lo) / torch.where(span > 0, span, torch.ones_like(span)),
                       torch.zeros_like(points))
    ref = torch.rand(samples, m, q, generator=generator, dtype=torch.float64)
    data = torch.cat([norm[None], ref])
    gaps: list[float] = []
    ss: list[float] = []
    for k in range(1, top + 1):
        _, _, w = kmeans(data, k, generator, n_init, max_iter)
        logw = torch.log(w + 1e-10)
        ref_log = logw[1:]
        gaps.append(float(ref_log.mean() - logw[0]))
        ss.append(float(ref_log.std(unbiased=False)) * math.sqrt(1.0 + 1.0 / samples))
        if k >= 2 and gaps[k - 2] >= gaps[k - 1] - ss[k - 1]:
            return k - 1, gaps, ss
    return top, gaps, ss


def _cluster_scores(cos: "torch.Tensor", labels: "torch.Tensor", k: int) -> list[float]:
    """Per cluster: the median over its members of their mean cosine similarity to the
    cluster (themselves included); +inf for a cluster of fewer than two members."""
    import torch

    out = []
    for c in range(k):
        idx = (labels == c).nonzero().flatten()
        if idx.numel() <= 1:
            out.append(math.inf)
            continue
        sub = cos.index_select(0, idx).index_select(1, idx)
        out.append(midpoint_median(sub.mean(dim=1)))
    return out


@dataclass(frozen=True, slots=True)
class RFLBAT(Aggregator):
    """RFLBAT (Wang et al., arXiv:2201.03772, 2022): PCA to 2-D, two outlier passes around
    a k-means cluster chosen by the gap statistic and the lowest median cosine similarity.

    * ``eps1``: ε₁ > 0 of the first outlier pass (default 10);
    * ``eps2``: ε₂ > 0 of the second, inside the kept cluster (default 4);
    * ``k_max``: the largest number of clusters the gap statistic tries (default 9);
    * ``gap_samples``: B ≥ 1 uniform reference sets of the gap statistic (default 5);
    * ``n_init``, ``max_iter``: k-means++ seedings and Lloyd iterations (10, 300);
    * ``weighted``: average the kept updates by sample counts (default ``False``: equal
      weights, as both released implementations do).
    """

    eps1: float = 10.0
    eps2: float = 4.0
    k_max: int = 9
    gap_samples: int = 5
    n_init: int = 10
    max_iter: int = 300
    weighted: bool = False
    summary: ClassVar[str] = "RFLBAT: PCA to 2-D, outlier passes, gap-statistic k-means, least self-similar cluster"
    reference: ClassVar[str] = "Wang, Zhai, Zhan & Xia, arXiv:2201.03772 (2022)"

    def validate_eps1(self, v: float) -> None:
        check_number(self, "eps1", v, low=0.0, low_open=True)

    def validate_eps2(self, v: float) -> None:
        check_number(self, "eps2", v, low=0.0, low_open=True)

    def validate_k_max(self, v: int) -> None:
        check_count(self, "k_max", v, allow_none=False, minimum=1)

    def validate_gap_samples(self, v: int) -> None:
        check_count(self, "gap_samples", v, allow_none=False, minimum=1)

    def validate_n_init(self, v: int) -> None:
        check_count(self, "n_init", v, allow_none=False, minimum=1)

    def validate_max_iter(self, v: int) -> None:
        check_count(self, "max_iter", v, allow_none=False, minimum=1)

    def validate_weighted(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "weighted", v, "must be true or false")

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        ok = finite_rows(updates)
        fin = ok.nonzero().flatten()
        reasons: dict[int, str] = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        kept = torch.zeros(n, dtype=torch.bool, device=updates.device)
        state: dict[str, Any] = {}
        if fin.numel():
            rows = updates.index_select(0, fin)
            order = canonical_order(rows)  # every draw below follows the rows' content, not their positions
            fin, rows = fin[order.to(fin.device)], rows.index_select(0, order.to(rows.device))
            rows, _ = rescale_pow2(rows, low=TINY64)  # an exact power of two: no decision changes
            keep_local, state, why = self._detect(rows, generator_of(ctx))
            kept[fin[keep_local.to(fin.device)]] = True
            for j, text in why.items():
                reasons[int(fin[j])] = text
            state["rows"] = fin.tolist()
        agg, weights = kept_mean(updates, ok, kept, ctx, self.weighted)
        return Decision(aggregate=agg, accepted=kept, weights=weights, reasons=reasons, state=state)

    def _detect(self, rows: "torch.Tensor", gen: "torch.Generator"
                ) -> tuple["torch.Tensor", dict[str, Any], dict[int, str]]:
        """(kept mask over ``rows``, state, reasons by row position) — ``rows`` finite, in canonical order."""
        import torch

        m = rows.shape[0]
        g, gc = _grams(rows)
        points = pca_points(gc).cpu()
        scale = float(g.diagonal().max()) if m else 0.0
        if not float(gc.diagonal().max()) > 2.0 ** -80 * scale:  # spread at rounding level: one point
            points = torch.zeros_like(points)
        why: dict[int, str] = {}
        keep1, ed1, thr1 = _ed_filter(points, self.eps1)
        for j in (~keep1).nonzero().flatten().tolist():
            why[j] = (f"RFLBAT: outlier in the PCA plane, first pass (sum of distances {float(ed1[j]):.4g} "
                      f"≥ ε₁·median = {thr1:.4g})")
        idx1 = keep1.nonzero().flatten()
        pts1 = points.index_select(0, idx1)
        k, gaps, ss = (1, [], [])
        if idx1.numel() >= 2:
            k, gaps, ss = gap_statistic(pts1, self.k_max, self.gap_samples, gen, self.n_init, self.max_iter)
        if k > 1:
            labels, _, _ = kmeans(pts1[None], k, gen, self.n_init, self.max_iter)
            labels = labels[0]
        else:
            labels = torch.zeros(idx1.numel(), dtype=torch.long)
        norms = g.diagonal().clamp_min(0.0).sqrt()
        denom = norms[:, None] * norms[None, :]
        cos = torch.where(denom > 0, g / denom.clamp_min(1e-300), torch.zeros_like(g)).clamp(-1.0, 1.0).cpu()
        cos1 = cos.index_select(0, idx1).index_select(1, idx1)
        scores = _cluster_scores(cos1, labels, k)
        chosen = min(range(k), key=lambda c: (scores[c], c)) if k > 1 else 0
        for pos in range(idx1.numel()):
            lab = int(labels[pos])
            if lab != chosen:
                why[int(idx1[pos])] = (f"RFLBAT: in k-means cluster {lab} of {k} (median cosine similarity "
                                       f"{scores[lab]:.4g}), not the kept cluster {chosen} ({scores[chosen]:.4g}: "
                                       "the lowest)")
        idx2 = idx1[labels == chosen]
        keep2, ed2, thr2 = _ed_filter(points.index_select(0, idx2), self.eps2)
        for pos in (~keep2).nonzero().flatten().tolist():
            why[int(idx2[pos])] = (f"RFLBAT: outlier in the kept cluster, second pass (sum of distances "
                                   f"{float(ed2[pos]):.4g} ≥ ε₂·median = {thr2:.4g})")
        kept = torch.zeros(m, dtype=torch.bool)
        kept[idx2[keep2]] = True
        state = {"points": points.tolist(), "ed1": ed1.tolist(), "threshold1": thr1, "k": k, "gaps": gaps,
                 "gap_s": ss, "labels": labels.tolist(), "cluster_cosine": scores, "chosen": chosen,
                 "ed2": ed2.tolist(), "threshold2": thr2}
        return kept, state, why
