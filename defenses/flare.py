"""FLARE: trust scores from the MMD of penultimate-layer representations.

Wang, Xiao, Chen, Hu, Lou & Hou, "FLARE: Defending Federated Learning against Model
Poisoning Attacks via Latent Space Representations", AsiaCCS 2022
(doi:10.1145/3488932.3517395). With G the global model and Wᵢ = G + Δᵢ client i's model:

1. **PLRs**: the server feeds its small auxiliary set X (here ``ctx.root_data``) to every
   model and keeps the penultimate-layer representations Pᵢ = {hᵢ(x) : x ∈ X} (the input
   of the output layer, ``ctx.model.features``);
2. **MMD**: for every pair, the unbiased estimate of the squared maximum mean discrepancy
   with a Gaussian kernel k(a, b) = exp(−γ‖a − b‖²) (m = |X|):
   MMD²ᵤ(Pᵢ, Pⱼ) = Σ_{a≠a'} k(pᵢₐ, pᵢₐ')/(m(m−1)) + Σ_{b≠b'} k(pⱼᵦ, pⱼᵦ')/(m(m−1))
   − 2 Σ_{a,b} k(pᵢₐ, pⱼᵦ)/m², negative estimates read as 0;
3. **trust counts**: every model names its k nearest neighbours by MMD (itself excluded;
   k = 50 % of n in the paper) and each named model's count cᵢ grows by one;
4. **trust scores**: a softmax of the counts with temperature τ,
   αᵢ = exp(cᵢ/(τ·c̄)) / Σⱼ exp(cⱼ/(τ·c̄)), c̄ the mean count (= k);
5. the aggregate is Σᵢ αᵢ Δᵢ (the new global model is G plus it).

Reference code read: the authors' TensorFlow code, github.com/ning-wang1/flare_poisoning_detection
(commit df40ce48a233f4668036a2625f9798a398d2c90d; ``detect.py`` ``Detect.penul_check``,
``cal_nearest_neighbor``, ``count_to_trustscore``; ``utils/mmd.py`` ``kernel_mmd``;
``agg_alg.py`` ``soft_agg``) and BackFed's ``backfed/servers/flare_server.py``
(github.com/thinh-dao/BackFed, commit ab3bcbd1a7339f626b3dd9117676d88b6ac1abb5). Where they
differ, a named parameter chooses; the default follows the authors' code, whose formulas
this docstring states (the paper's text was not available to us while writing this):

* **kernel bandwidth** (``gamma``): the authors' code calls scikit-learn's RBF kernel with
  its default γ = 1/(PLR width) (``gamma = None``, default); BackFed uses σ = 1, i.e.
  γ = 1/2. BackFed also leaves the kernel's diagonal in its "unbiased" sums; the authors'
  code (and this one) excludes it;
* **count scale** (``count_scale``): the authors' code divides the counts by their mean
  before the temperature (``"mean"``, default); ``"none"`` takes softmax(cᵢ/τ); BackFed
  uses no softmax at all, αᵢ = cᵢ/Σc (``scoring = "proportional"``);
* **k** (``k_rule``): ``"paper"`` (default) names k = ⌊fraction·n⌋ neighbours;
  ``"authors_code"`` reproduces the authors' slice ``argsort(mmd)[:, 1:k]`` (which skips the
  first entry, taken to be the model itself, and so names ⌊fraction·n⌋ − 1); ``"backfed"``
  names round(fraction·n) (Python's rounding, half to even);
* **auxiliary set** (``aux_class``): the authors' code feeds the models auxiliary samples of
  one class only (class 1); ``None`` (default) feeds the whole root sample, an integer only
  the root samples of that label;
* **scoring** (``scoring``): ``"softmax"`` (default, step 4); ``"top_half"``: the authors'
  code's alternative (``count_to_trustscore(method='detect')``) admits the ⌈n/2⌉ models with
  the largest counts and rejects the others — here with equal weights summing to 1 (the
  authors give each 2/n) and every model tied with the last admitted count admitted too;
  ``"proportional"``: BackFed's αᵢ = cᵢ/Σc (rows with count 0 are rejected).

Ties: the authors' and BackFed's ``argsort`` break a tie on the k-th neighbour boundary by
position; here the models tied at the k-th distance share the votes left, each getting
(k − #closer)/#tied, so the result does not depend on the clients' order. A model whose
PLRs are not finite (finite updates near the overflow) is at distance +∞ from every other.
Non-finite updates are rejected before FLARE runs (n counts the finite ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext

from ._common import check_choice, check_count, check_number, combine, finite_rows

if TYPE_CHECKING:
    import torch

__all__ = ["FLARE", "mmd2_unbiased", "pairwise_mmd", "trust_counts", "trust_scores", "neighbour_count"]


def mmd2_unbiased(x: "torch.Tensor", y: "torch.Tensor", gamma: float) -> float:
    """MMD²ᵤ of two point sets ``(m, k)`` and ``(m', k)`` with k(a, b) = exp(−γ‖a − b‖²)."""
    import torch

    x, y = x.to(torch.float64), y.to(torch.float64)
    m, mp = int(x.shape[0]), int(y.shape[0])
    kxx = torch.exp(-gamma * torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist").pow(2))
    kyy = torch.exp(-gamma * torch.cdist(y, y, compute_mode="donot_use_mm_for_euclid_dist").pow(2))
    kxy = torch.exp(-gamma * torch.cdist(x, y, compute_mode="donot_use_mm_for_euclid_dist").pow(2))
    return float((kxx.sum() - kxx.diagonal().sum()) / (m * (m - 1))
                 + (kyy.sum() - kyy.diagonal().sum()) / (mp * (mp - 1)) - 2.0 * kxy.sum() / (m * mp))


def pairwise_mmd(plrs: "torch.Tensor", gamma: float) -> "torch.Tensor":
    """``(n, n)`` MMD²ᵤ between the PLR sets ``plrs[i]`` ``(n, m, k)`` (float64, symmetric, zero
    diagonal, negative estimates read as 0, +∞ for a set with a non-finite entry).

    Kernel sums Sᵢⱼ = Σ_{a,b} k(pᵢₐ, pⱼᵦ) are taken one model at a time against all of them
    (``(m, n·m)`` kernel values at once); k(a, a) = 1 is the diagonal left out of Sᵢᵢ."""
    import torch

    n, m, k = plrs.shape
    p = plrs.to(torch.float64)
    bad = ~torch.isfinite(p).reshape(n, -1).all(dim=1)
    p = torch.where(bad[:, None, None], torch.zeros_like(p), p)
    flat = p.reshape(n * m, k)
    sums = torch.empty(n, n, dtype=torch.float64, device=p.device)
    for i in range(n):
        d2 = torch.cdist(p[i], flat, compute_mode="donot_use_mm_for_euclid_dist").pow(2)
        sums[i] = torch.exp(-gamma * d2).reshape(m, n, m).sum(dim=(0, 2))
    sums = 0.5 * (sums + sums.T)
    within = (sums.diagonal() - m) / (m * (m - 1))
    mmd = within[:, None] + within[None, :] - 2.0 * sums / (m * m)
    mmd = mmd.clamp_min(0.0)
    mmd[bad, :] = math.inf
    mmd[:, bad] = math.inf
    mmd.fill_diagonal_(0.0)
    return mmd


def trust_counts(dist: "torch.Tensor", k: int) -> "torch.Tensor":
    """cⱼ = the votes model j gets when every model i votes for its k nearest others by
    ``dist`` ``(n, n)``; the models tied at i's k-th distance share i's remaining votes
    equally. float64 ``(n,)``, summing to n·k (k is clipped to [0, n − 1])."""
    import torch

    n = int(dist.shape[0])
    k = max(0, min(int(k), n - 1))
    if k == 0:
        return torch.zeros(n, dtype=torch.float64, device=dist.device)
    big = torch.finfo(torch.float64).max
    d = torch.nan_to_num(dist.to(torch.float64), nan=big, posinf=big)
    d = d.clone()
    d.fill_diagonal_(math.inf)  # a model never votes for itself (every other distance is finite)
    kth = torch.sort(d, dim=1).values[:, k - 1:k]
    closer = d < kth
    tied = d == kth
    left = (k - closer.sum(dim=1, keepdim=True)).to(torch.float64)
    votes = closer.to(torch.float64) + tied.to(torch.float64) * (left / tied.sum(dim=1, keepdim=True).to(torch.float64))
    return votes.sum(dim=0)


def trust_scores(counts: "torch.Tensor", temperature: float = 1.0, count_scale: str = "mean") -> "torch.Tensor":
    """αᵢ = softmax(cᵢ/(τ·s)) with s the mean count (``"mean"``) or 1 (``"none"``); uniform
    when every count is 0."""
    import torch

    c = counts.to(torch.float64)
    scale = float(c.mean()) if count_scale == "mean" else 1.0
    if not scale > 0:
        return torch.full_like(c, 1.0 / max(int(c.shape[0]), 1))
    return torch.softmax(c / (temperature * scale), dim=0)


def neighbour_count(n: int, fraction: float, rule: str = "paper") -> int:
    """k for n models: ⌊fraction·n⌋ (``"paper"``), that minus one (``"authors_code"``) or
    round(fraction·n) (``"backfed"``), clipped to [0, n − 1]."""
    raw = fraction * n
    if rule == "backfed":
        k = round(raw)
    else:
        k = math.floor(raw + 1e-9)  # 0.5·10 is 5 even where the product rounds below
        if rule == "authors_code":
            k -= 1
    return max(0, min(int(k), n - 1))


@dataclass(frozen=True, slots=True)
class FLARE(Aggregator):
    """FLARE (Wang et al., AsiaCCS 2022): MMD of penultimate-layer representations on the
    server's root sample, k-nearest-neighbour trust counts, softmax trust scores.

    * ``fraction``: k = ⌊fraction·n⌋ nearest neighbours each model votes for (paper: 0.5);
    * ``k_rule``: ``"paper"``, ``"authors_code"`` or ``"backfed"`` (module docstring);
    * ``temperature``: τ of the softmax (authors' code: 1);
    * ``count_scale``: ``"mean"`` (authors' code) or ``"none"``;
    * ``gamma``: the Gaussian kernel's γ; unset: 1/(PLR width) (authors' code);
    * ``aux_class``: use only the root samples of this label (authors' code: 1); unset: all;
    * ``scoring``: ``"softmax"`` (default), ``"top_half"`` or ``"proportional"``.

    ``Decision.state``: the trust counts, the trust scores, k.
    """

    fraction: float = 0.5
    k_rule: Literal["paper", "authors_code", "backfed"] = "paper"
    temperature: float = 1.0
    count_scale: Literal["mean", "none"] = "mean"
    gamma: float | None = None
    aux_class: int | None = None
    scoring: Literal["softmax", "top_half", "proportional"] = "softmax"
    inspects_models: ClassVar[bool] = True
    uses_server_data: ClassVar[bool] = True
    summary: ClassVar[str] = "FLARE: MMD of penultimate representations, kNN trust counts, softmax trust scores"
    reference: ClassVar[str] = "Wang et al., AsiaCCS 2022"

    def validate_fraction(self, v: float) -> None:
        check_number(self, "fraction", v, low=0.0, low_open=True, high=1.0)

    def validate_k_rule(self, v: str) -> None:
        check_choice(self, "k_rule", v, ("paper", "authors_code", "backfed"))

    def validate_temperature(self, v: float) -> None:
        check_number(self, "temperature", v, low=0.0, low_open=True)

    def validate_count_scale(self, v: str) -> None:
        check_choice(self, "count_scale", v, ("mean", "none"))

    def validate_gamma(self, v: float | None) -> None:
        check_number(self, "gamma", v, low=0.0, low_open=True, allow_none=True)

    def validate_aux_class(self, v: int | None) -> None:
        check_count(self, "aux_class", v, minimum=0)

    def validate_scoring(self, v: str) -> None:
        check_choice(self, "scoring", v, ("softmax", "top_half", "proportional"))

    def plrs(self, rows: "torch.Tensor", ctx: ServerContext) -> "torch.Tensor":
        """The PLRs ``(n, m, k)`` of the models ``ctx.global_params + rows[i]`` on the auxiliary set."""
        import torch

        view = ctx.model
        if view is None:
            raise InvalidParameter("FLARE inspects the clients' models: ctx.model (a ModelView) is needed; "
                                   "run it in a regime that offers one")
        if ctx.root_data is None:
            raise InvalidParameter("FLARE needs the server's auxiliary data: ctx.root_data is None "
                                   "(give the server a root sample, [federation] root_samples)")
        if ctx.global_params is None:
            raise InvalidParameter("FLARE: ctx.global_params is needed to form the clients' models")
        glob = ctx.global_params.to(device=rows.device, dtype=rows.dtype)
        if tuple(glob.shape) != (rows.shape[1],):
            raise InvalidParameter(f"FLARE: ctx.global_params has shape {tuple(glob.shape)}, "
                                   f"expected ({rows.shape[1]},)")
        x, y = ctx.root_data
        if self.aux_class is not None:
            x = x[y == self.aux_class]
        m = int(x.shape[0])
        if m < 2:
            which = f"of label {self.aux_class} " if self.aux_class is not None else ""
            raise InvalidParameter(f"FLARE needs at least 2 auxiliary samples {which}for the unbiased MMD; "
                                   f"the server's root sample has {m}")
        x = x.to(rows.device)
        if x.is_floating_point():
            x = x.to(rows.dtype)
        with torch.no_grad():
            return torch.stack([view.features(glob + row, x).to(torch.float64) for row in rows])

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, _ = updates.shape
        ok = finite_rows(updates)
        fin = ok.nonzero().flatten()
        m = int(fin.numel())
        alpha = torch.zeros(n, dtype=torch.float64, device=updates.device)
        counts = torch.zeros(n, dtype=torch.float64, device=updates.device)
        k = 0
        if m:
            rows = updates if m == n else updates.index_select(0, fin)
            p = self.plrs(rows, ctx)
            gamma = self.gamma if self.gamma is not None else 1.0 / max(int(p.shape[2]), 1)
            k = neighbour_count(m, self.fraction, self.k_rule)
            c = trust_counts(pairwise_mmd(p, gamma), k)
            counts[fin] = c.to(counts.device)
            alpha[fin] = self._scores(c).to(alpha.device)
        accepted = ok & (alpha > 0)
        reasons: dict[int, str] = {}
        for i in (~accepted).nonzero().flatten().tolist():
            if not bool(ok[i]):
                reasons[i] = "non-finite update"
            elif self.scoring == "top_half":
                reasons[i] = f"FLARE: trust count {float(counts[i]):.4g} below the top half (k = {k})"
            else:
                reasons[i] = f"FLARE: trust count 0 (k = {k}): no model has it among its nearest neighbours"
        weights = alpha.to(updates.dtype)
        agg = combine(weights, updates, ok, convex=True)
        state: dict[str, Any] = {"counts": counts.tolist(), "trust": alpha.tolist(), "k": k}
        return Decision(aggregate=agg, accepted=accepted, weights=weights, reasons=reasons, state=state)

    def _scores(self, c: "torch.Tensor") -> "torch.Tensor":
        import torch

        n = int(c.shape[0])
        if self.scoring == "softmax":
            return trust_scores(c, self.temperature, self.count_scale)
        if self.scoring == "proportional":
            total = float(c.sum())
            return c / total if total > 0 else torch.full_like(c, 1.0 / n)
        # top half: the ⌈n/2⌉ largest counts, and every model tied with the last of them
        last = torch.sort(c, descending=True).values[(n + 1) // 2 - 1]
        keep = (c >= last).to(torch.float64)
        return keep / keep.sum()
