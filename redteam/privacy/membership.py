"""Metrics of a membership-inference attack: its scores against the hidden truth.

An attack gives every candidate a score, higher = more likely a member of the training set, and
predicts "member" for every candidate whose score is at least a threshold t. Sweeping t gives
the empirical ROC curve; the metrics read it as the literature does:

* :func:`roc_auc`: the area under that curve, computed exactly as the Mann-Whitney statistic
  (the probability that a random member outscores a random non-member, a tie counting 1/2);
  equal to the trapezoidal area of :func:`roc_curve` (scikit-learn's ``roc_auc_score``).
* :func:`tpr_at_fpr`: the true-positive rate at a low false-positive rate, the metric Carlini et
  al. argue for ("Membership Inference Attacks From First Principles", IEEE S&P 2022):
  the **largest TPR among the thresholds whose FPR is at most the level**. Ties are never split
  (a threshold takes all the candidates of one score or none: no randomised test), and the
  threshold above every score (FPR 0, TPR 0) always qualifies, so the result is 0 when even the
  single highest-scoring group holds more non-members than the level allows. The authors'
  released code (tensorflow/privacy, ``research/mi_lira_2021/plot.py``) reads the last ROC point
  with FPR *strictly below* the level; the two conventions differ only when an ROC point sits
  exactly on it (e.g. 1 false positive among 100 non-members at the 1 % level, counted here).
* :func:`roc_curve`: the curve itself, one point per distinct score (for a plot).
* :func:`membership_metrics`: AUC and the TPR at 0.1 % and 1 % FPR (the levels Carlini et al.
  report) in one call.

Every function takes 1-D ``scores`` (numbers, ±inf included — an attack may score log 0 — but no
NaN: a tensor, an array or a sequence) and a same-length ``is_member`` (bools, or 0 / 1), with at
least one member and one non-member.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from redteam.errors import InvalidParameter

if TYPE_CHECKING:
    import torch

__all__ = ["roc_auc", "roc_curve", "tpr_at_fpr", "membership_metrics", "REPORTED_FPRS"]

#: the false-positive rates a scenario reports the TPR at (0.1 % and 1 %)
REPORTED_FPRS: tuple[float, ...] = (0.001, 0.01)


def _inputs(scores: Any, is_member: Any) -> tuple["torch.Tensor", "torch.Tensor"]:
    """``scores`` as float64 and ``is_member`` as bool, both ``(m,)``, checked."""
    import torch

    try:
        s = torch.as_tensor(scores).detach().to("cpu", torch.float64)
    except (TypeError, ValueError, RuntimeError) as e:
        raise InvalidParameter(f"scores: must be a 1-D sequence of numbers ({e})") from None
    try:
        t = torch.as_tensor(is_member).detach().to("cpu")
    except (TypeError, ValueError, RuntimeError) as e:
        raise InvalidParameter(f"is_member: must be a 1-D sequence of bools ({e})") from None
    if s.ndim != 1:
        raise InvalidParameter(f"scores: must be 1-D (one score per candidate), got shape {tuple(s.shape)}")
    if t.ndim != 1 or t.shape[0] != s.shape[0]:
        raise InvalidParameter(f"is_member: must be 1-D with one entry per score ({s.shape[0]}), "
                               f"got shape {tuple(t.shape)}")
    if t.dtype != torch.bool:
        if t.is_floating_point() or t.is_complex() or not bool(((t == 0) | (t == 1)).all()):
            raise InvalidParameter(f"is_member: must be bools or 0 / 1 integers, got {t.dtype} values "
                                   f"{sorted(set(t.tolist()))[:5]}")
        t = t.to(torch.bool)
    if bool(torch.isnan(s).any()):
        bad = int(torch.isnan(s).nonzero()[0])
        raise InvalidParameter(f"scores: must not be NaN (no order), got NaN at index {bad} of {s.shape[0]}")
    pos = int(t.sum())
    if pos == 0 or pos == t.shape[0]:
        raise InvalidParameter(f"is_member: needs at least one member and one non-member, got {pos} members "
                               f"of {t.shape[0]} candidates (the ROC is undefined)")
    return s, t


def roc_auc(scores: Any, is_member: Any) -> float:
    """The exact area under the ROC curve: P(member score > non-member score) + ½·P(equal).

    Computed from mid-ranks (the Mann-Whitney U statistic divided by n₁·n₀): sort all scores,
    give each group of equal scores the mean of the ranks it spans, and
    AUC = (Σ member ranks − n₁(n₁ + 1)/2) / (n₁·n₀). All-equal scores give 0.5; scores that put
    every member above every non-member give 1.0; the reverse 0.0. O(m log m).
    """
    import torch

    s, t = _inputs(scores, is_member)
    _, inverse, counts = torch.unique(s, sorted=True, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)  # 1-based rank of each group's last member
    mid = ends - (counts.to(torch.float64) - 1.0) / 2.0  # the mean of the ranks a tied group spans
    n1 = int(t.sum())
    n0 = int(t.numel()) - n1
    rank_sum = float(mid[inverse][t].sum())  # half-integers: exact in float64 below 2**52
    return (rank_sum - n1 * (n1 + 1) / 2.0) / (n1 * n0)


def roc_curve(scores: Any, is_member: Any) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """The empirical ROC curve: ``(fpr, tpr, thresholds)``, float64, one point per distinct score.

    Point k predicts "member" for every candidate whose score is ≥ ``thresholds[k]``; the
    thresholds descend from +inf (nothing predicted: FPR = TPR = 0; it stands for that point even
    when some score is +inf itself) to the lowest score (everything predicted: FPR = TPR = 1). This
    is scikit-learn's ``roc_curve`` with ``drop_intermediate=False`` (whose first threshold is +inf
    too).
    """
    import torch

    s, t = _inputs(scores, is_member)
    values, inverse = torch.unique(s, sorted=True, return_inverse=True)
    k = values.numel()
    pos = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, t.to(torch.float64))
    neg = torch.zeros(k, dtype=torch.float64).index_add_(0, inverse, (~t).to(torch.float64))
    # descending thresholds: the candidates predicted at each are those of its value and above
    tp = torch.cumsum(pos.flip(0), 0)
    fp = torch.cumsum(neg.flip(0), 0)
    zero = torch.zeros(1, dtype=torch.float64)
    fpr = torch.cat([zero, fp / fp[-1]])
    tpr = torch.cat([zero, tp / tp[-1]])
    thresholds = torch.cat([torch.tensor([math.inf], dtype=torch.float64), values.flip(0)])
    return fpr, tpr, thresholds


def _check_level(fpr: Any) -> float:
    if isinstance(fpr, bool) or not isinstance(fpr, (int, float)) or not (0.0 <= float(fpr) <= 1.0):
        raise InvalidParameter(f"fpr = {fpr!r}: must be a false-positive rate in [0, 1]")
    return float(fpr)


def tpr_at_fpr(scores: Any, is_member: Any, fpr: float) -> float:
    """The largest TPR among the ROC points whose FPR is ≤ ``fpr`` (ties not split; see the module).

    FPR = (non-members predicted) / (non-members), compared with ``fpr`` as the float division
    gives it, so a point exactly on the level (1 of 100 at ``fpr = 0.01``) counts. ``fpr = 0``
    gives the TPR of the thresholds above every non-member score; ``fpr = 1`` gives 1.0.
    """
    level = _check_level(fpr)
    f, t, _ = roc_curve(scores, is_member)
    return float(t[f <= level].max())


def membership_metrics(scores: Any, is_member: Any, fprs: Sequence[float] = REPORTED_FPRS) -> dict[str, float]:
    """``{"auc": …, "tpr@0.001": …, "tpr@0.01": …}`` (one ``tpr@<level>`` per entry of ``fprs``)."""
    levels = [_check_level(f) for f in fprs]
    f, t, _ = roc_curve(scores, is_member)
    out = {"auc": roc_auc(scores, is_member)}
    for level in levels:
        out[f"tpr@{level:g}"] = float(t[f <= level].max())
    return out
