"""AlignIns: direction alignment inspection (TDA and MPSA), MZ-score filtering, clipping.

Xu, Zhang & Hu, "Detecting Backdoor Attacks in Federated Learning via Direction Alignment
Inspection", CVPR 2025 (pp. 20654–20664; arXiv:2503.07978). With θ the global model of
the round, Δ₁ … Δₙ the updates:

1. TDA (temporal direction alignment): TDAᵢ = cos(Δᵢ, θ);
2. MPSA (masked principal sign alignment): the principal sign p = sgn(Σᵢ sgn(Δᵢ)) per
   coordinate (the majority sign; 0 on a tie); for each update the k = ⌊s·d⌋ coordinates
   of largest |Δᵢ| (s the ``sparsity``); MPSAᵢ = the fraction of those where
   sgn(Δᵢ) = p;
3. MZ-scores (median-based z-scores): MZᵢ = |xᵢ − med(x)| / std(x), for x = TDA and for
   x = MPSA (std the population standard deviation);
4. an update is benign when MZ(MPSA)ᵢ < λ_s *and* MZ(TDA)ᵢ < λ_c (strict: a score exactly
   on its threshold is an outlier); the others are removed;
5. post-filtering clipping: every benign update is scaled to at most c = the median of
   the benign updates' norms: Δᵢ·min(1, c/‖Δᵢ‖);
6. the aggregate is the sample-weighted mean of the clipped benign updates (FedAvg).

Defaults λ_s = λ_c = 1.0 and s = 0.3: the authors' released code
(github.com/JiiahaoXU/AlignIns, src/aggregation.py ``agg_alignins`` and the argument
defaults of src/federated.py, commit aff6126), which the steps above follow; BackFed's
port (github.com/thinh-dao/BackFed, backfed/servers/anomaly_detection/alignins_server.py,
commit 05ba905) has the same defaults. The paper's PDF was not reachable from this
environment. Where the sources differ or leave a choice open (named parameters; the
default is the authors'):

* ``tda_reference``: the code (and BackFed) takes the cosine with the flattened global
  *model* parameters θ (``"global_model"``, default; needs ``ctx.global_params``).
  ``"mean_update"`` compares with the plain mean of the round's finite updates instead,
  a reading that needs nothing but the updates.
* ``clip_median``: ``torch.median`` returns the lower of the two middle values for an
  even count (``"lower"``, default, the code and BackFed); ``"midpoint"`` averages them.
* ``weighted``: the code averages the benign updates weighted by the clients' sample
  counts (default); BackFed with equal weights (``weighted = False``).
* Top-k ties: ``torch.topk`` leaves the choice among coordinates of equal |Δᵢ| at the
  k-th place to the implementation; here the lowest coordinate indices are taken. k is at
  least 1 (the code divides by 0 when ⌊s·d⌋ = 0).
* A spread of the scores at rounding level (std ≤ 10⁻¹², both statistics lie in
  [−1, 1]) counts as none: every MZ-score is then 0 (the code divides 0 by 0, NaN, and
  removes everyone: n copies of one update aggregated to 0).
* The test is strict, as in the code (``np.argwhere(mz < λ)``), and an MZ-score within
  10⁻¹² (relative) of its threshold counts as on it: rounding cannot say on which side a
  value that is mathematically on the threshold falls. With two clients both MZ-scores
  are exactly 1 (each lies one standard deviation from the midpoint median), so at the
  default λ = 1 both are removed.
* A zero update has TDA 0 (torch's ``CosineSimilarity`` with its ε gives 0 too).
* When nothing is benign the aggregate is 0 (as in the code).

The code also clips the removed updates before discarding them (no effect on the
result). Non-finite updates are rejected before AlignIns runs (n counts the finite ones).
``Decision.state``: TDA, MPSA, both MZ-score lists, the clipping bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.errors import InvalidParameter
from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext, param_error

from ._common import HUGE64, TINY64, check_choice, check_number, finite_rows, rescale_pow2, rescale_rows_pow2
from ._detect import exact_count, kept_mean
from ._stats import clip_scales, midpoint_median, safe_norms

if TYPE_CHECKING:
    import torch

__all__ = ["AlignIns", "principal_signs", "mpsa", "tda", "mz_scores"]

_CHUNK = 1 << 16
#: an MZ-score within this relative distance of its threshold is on it (outside: the test is strict)
ON_THRESHOLD = 1e-12


def principal_signs(rows: "torch.Tensor") -> "torch.Tensor":
    """``(d,)`` int8: sgn(Σᵢ sgn(xᵢ)) per coordinate (the majority sign, 0 on a tie)."""
    import torch

    n, d = rows.shape
    out = torch.empty(d, dtype=torch.int8, device=rows.device)
    for start in range(0, d, _CHUNK):
        s = torch.sign(rows[:, start:start + _CHUNK]).to(torch.int32).sum(dim=0)
        out[start:start + _CHUNK] = torch.sign(s).to(torch.int8)
    return out


def top_mask(row: "torch.Tensor", k: int) -> "torch.Tensor":
    """Bool ``(d,)``: the k coordinates of largest |x| (ties at the k-th place: lowest indices)."""
    import torch

    a = row.abs()
    d = a.shape[0]
    if k >= d:
        return torch.ones(d, dtype=torch.bool, device=row.device)
    t = torch.kthvalue(a, d - k + 1).values  # the k-th largest magnitude
    above = a > t
    need = k - int(above.sum())
    at = a == t
    return above | (at & (torch.cumsum(at.to(torch.int64), 0) <= need))


def mpsa(rows: "torch.Tensor", k: int, signs: "torch.Tensor | None" = None) -> "torch.Tensor":
    """``(n,)`` float64: for each row, the fraction of its k largest-|x| coordinates whose sign
    equals the principal sign (one row at a time: O(d) memory)."""
    import torch

    p = principal_signs(rows) if signs is None else signs
    out = torch.empty(rows.shape[0], dtype=torch.float64)
    for i in range(rows.shape[0]):
        mask = top_mask(rows[i], k)
        agree = (torch.sign(rows[i][mask]).to(torch.int8) == p[mask]).sum()
        out[i] = int(agree) / k
    return out


def tda(rows: "torch.Tensor", reference: "torch.Tensor") -> "torch.Tensor":
    """``(n,)`` float64: cos(xᵢ, reference) (0 where either is zero), each row and the
    reference first brought to a safe scale by its own exact power of two."""
    import torch

    n, d = rows.shape
    rows, _ = rescale_rows_pow2(rows, low=TINY64, high=HUGE64)
    ref, _ = rescale_pow2(reference[None, :], low=TINY64)
    ref = ref[0]
    dot = torch.zeros(n, dtype=torch.float64, device=rows.device)
    rr = torch.zeros_like(dot)
    gg = 0.0
    for start in range(0, d, _CHUNK):
        block = rows[:, start:start + _CHUNK].to(torch.float64)
        gb = ref[start:start + _CHUNK].to(device=rows.device, dtype=torch.float64)
        dot += block @ gb
        rr += (block * block).sum(dim=1)
        gg += float(gb @ gb)
    denom = rr.sqrt() * math.sqrt(gg)
    return torch.where(denom > 0, dot / denom.clamp_min(1e-300), torch.zeros_like(dot)).clamp(-1.0, 1.0).cpu()


def mz_scores(x: "torch.Tensor", floor: float = 1e-12) -> "torch.Tensor":
    """|xᵢ − med(x)| / std(x) (float64; midpoint median, population std computed in two passes
    as numpy does); all 0 when std ≤ ``floor``."""
    import torch

    x = x.to(torch.float64)
    if x.numel() == 0:
        return x
    med = midpoint_median(x)
    mean = x.sum() / x.numel()
    std = float((((x - mean) ** 2).sum() / x.numel()).sqrt())
    if not std > floor:
        return torch.zeros_like(x)
    return (x - med).abs() / std


@dataclass(frozen=True, slots=True)
class AlignIns(Aggregator):
    """AlignIns (Xu, Zhang & Hu, CVPR 2025): MZ-scores of direction (TDA) and sign (MPSA)
    alignment, both within their thresholds, then clipping to the median norm.

    * ``lambda_c``: λ_c > 0, the MZ-score bound of TDA (default 1.0);
    * ``lambda_s``: λ_s > 0, the MZ-score bound of MPSA (default 1.0);
    * ``sparsity``: s in (0, 1], the share of coordinates MPSA inspects (default 0.3);
    * ``tda_reference``: ``"global_model"`` (default) or ``"mean_update"``;
    * ``clip``: post-filtering clipping to the median norm (default on);
    * ``clip_median``: ``"lower"`` (default) or ``"midpoint"`` median of the benign norms;
    * ``weighted``: average by sample counts (default) or equally.
    """

    lambda_c: float = 1.0
    lambda_s: float = 1.0
    sparsity: float = 0.3
    tda_reference: Literal["global_model", "mean_update"] = "global_model"
    clip: bool = True
    clip_median: Literal["lower", "midpoint"] = "lower"
    weighted: bool = True
    summary: ClassVar[str] = "AlignIns: MZ-scores of TDA and masked principal sign alignment, median-norm clipping"
    reference: ClassVar[str] = "Xu, Zhang & Hu, CVPR 2025"

    def validate_lambda_c(self, v: float) -> None:
        check_number(self, "lambda_c", v, low=0.0, low_open=True)

    def validate_lambda_s(self, v: float) -> None:
        check_number(self, "lambda_s", v, low=0.0, low_open=True)

    def validate_sparsity(self, v: float) -> None:
        check_number(self, "sparsity", v, low=0.0, low_open=True, high=1.0)

    def validate_tda_reference(self, v: str) -> None:
        check_choice(self, "tda_reference", v, ("global_model", "mean_update"))

    def validate_clip(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "clip", v, "must be true or false")

    def validate_clip_median(self, v: str) -> None:
        check_choice(self, "clip_median", v, ("lower", "midpoint"))

    def validate_weighted(self, v: bool) -> None:
        if not isinstance(v, bool):
            raise param_error(self, "weighted", v, "must be true or false")

    def _reference(self, rows: "torch.Tensor", ctx: ServerContext) -> "torch.Tensor":
        import torch

        d = rows.shape[1]
        if self.tda_reference == "mean_update":
            rows64, k = rescale_pow2(rows, low=TINY64)  # the mean's direction is scale-free
            return rows64.to(torch.float64).mean(dim=0)
        if ctx.global_params is None:
            raise InvalidParameter("AlignIns(tda_reference='global_model'): ctx.global_params (the global model θ) "
                                   "is needed; tda_reference='mean_update' scores the updates alone")
        glob = ctx.global_params.to(device=rows.device)
        if tuple(glob.shape) != (d,):
            raise InvalidParameter(f"AlignIns: ctx.global_params has shape {tuple(glob.shape)}, expected ({d},)")
        if not bool(torch.isfinite(glob).all()):
            raise InvalidParameter("AlignIns: ctx.global_params is not finite")
        return glob

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:
        import torch

        n, d = updates.shape
        ok = finite_rows(updates)
        fin = ok.nonzero().flatten()
        m = int(fin.numel())
        reasons: dict[int, str] = {i: "non-finite update" for i in (~ok).nonzero().flatten().tolist()}
        kept = torch.zeros(n, dtype=torch.bool, device=updates.device)
        scales = torch.zeros(n, dtype=torch.float64, device=updates.device)
        state: dict[str, Any] = {"tda": [], "mpsa": [], "mz_tda": [], "mz_mpsa": [], "bound": 0.0}
        if m == 0 and self.tda_reference == "global_model":
            self._reference(updates, ctx)  # the same refusal with or without finite rows
        if m:
            rows = updates.index_select(0, fin)
            k = min(d, max(1, exact_count(self.sparsity, d)))
            t = tda(rows, self._reference(rows, ctx))
            s = mpsa(rows, k)
            mz_t, mz_s = mz_scores(t), mz_scores(s)
            # strict, and a score within rounding (10⁻¹² relative) of its threshold counts as on it
            ok_s = mz_s < self.lambda_s * (1.0 - ON_THRESHOLD)
            ok_t = mz_t < self.lambda_c * (1.0 - ON_THRESHOLD)
            benign = ok_s & ok_t
            for j in (~benign).nonzero().flatten().tolist():
                why = []
                if not bool(ok_s[j]):
                    why.append(f"MZ-score of MPSA {float(mz_s[j]):.4g} ≥ λ_s = {self.lambda_s:g} (MPSA {float(s[j]):.4g})")
                if not bool(ok_t[j]):
                    why.append(f"MZ-score of TDA {float(mz_t[j]):.4g} ≥ λ_c = {self.lambda_c:g} (TDA {float(t[j]):.4g})")
                reasons[int(fin[j])] = "AlignIns: " + "; ".join(why)
            good = fin[benign.to(fin.device)]
            kept[good] = True
            norms = safe_norms(updates, ok)
            bound = math.inf
            if good.numel() and self.clip:
                bn = torch.sort(norms[good]).values
                c = int(bn.numel())
                bound = float(bn[(c - 1) // 2]) if self.clip_median == "lower" else midpoint_median(bn)
                scales[good] = clip_scales(norms[good], bound)
            else:
                scales[good] = 1.0
            state = {"tda": t.tolist(), "mpsa": s.tolist(), "mz_tda": mz_t.tolist(), "mz_mpsa": mz_s.tolist(),
                     "bound": bound, "k": k, "rows": fin.tolist()}
        agg, weights = kept_mean(updates, ok, kept, ctx, self.weighted, scales=scales)
        return Decision(aggregate=agg, accepted=kept, weights=weights, reasons=reasons, state=state)
