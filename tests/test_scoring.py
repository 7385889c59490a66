"""Every metric of redteam.scoring on hand-built round records (worked examples)."""

from __future__ import annotations

import math

import pytest

from redteam.scoring import (
    METRICS,
    Detection,
    _t_quantile,
    accuracy_drop,
    attack_success_rate,
    breakdown_fraction,
    detection,
    envelope,
    final_accuracy_last_k,
    language_model,
    mean_ci,
    rounds_to_target,
    rounds_to_target_loss,
    summarize,
)
from redteam.types import RoundRecord

# Two rounds of six clients (M = malicious, H = honest):
#
# round 0: c0 M accepted → FN        c1 M rejected (norm) → TP
#          c2 H accepted → TN        c3 H rejected (cosine) → FP
#          c4 M straggler (took part, dropped, never checked) → not judged
#          c5 H churned out (did not take part)               → not judged
# round 1: c0 M rejected → TP        c1 M churned out → not judged
#          c2 H accepted → TN        c3 H accepted → TN
#          c4 H straggler → not judged
#          c5 M bad chunk signature (dropped *and* rejected: a check saw it) → TP
#
# TP = 3, FP = 1, TN = 3, FN = 1 → precision 3/4, recall 3/4, F1 3/4, FPR 1/4.
# (Counting stragglers and churned clients as judged-and-flagged would add TP 2, FP 2.)
R0 = RoundRecord(
    round=0, accuracy=0.5, loss=1.25,
    accepted=[True, False, True, False, False, False],
    malicious=[True, True, False, False, True, False],
    participating=[True, True, True, True, True, False],
    dropped={4: "straggler: deadline missed", 5: "offline (churn)"},
    rejected={1: "norm 3 > bound 2", 3: "cosine -0.2 < 0"},
    bytes_on_wire=1000, sim_time_s=2.0, wall_time_s=1.0, defense_time_s=0.25,
    extra={"norms": {0: 1.5, 1: 5.0}, "norm_bounds": {0: 2.0, 1: 2.0},
           "cosines": {0: 0.3, 1: -0.9}, "cos_threshold": 0.1},
)
R1 = RoundRecord(
    round=1, accuracy=0.92, loss=0.5,
    accepted=[False, False, True, True, False, False],
    malicious=[True, True, False, False, False, True],
    participating=[True, False, True, True, True, True],
    dropped={1: "offline (churn)", 4: "straggler: deadline missed", 5: "bad chunk signature"},
    rejected={0: "norm 9 > bound 2", 5: "bad chunk signature"},
    bytes_on_wire=500, sim_time_s=1.5, wall_time_s=3.0, defense_time_s=0.75,
    extra={"asr": 0.125},
)
BASE = [
    RoundRecord(round=0, accuracy=0.91, loss=0.4, accepted=[True] * 6, malicious=[False] * 6,
                participating=[True] * 6),
    RoundRecord(round=1, accuracy=0.95, loss=0.3, accepted=[True] * 6, malicious=[False] * 6,
                participating=[True] * 6),
]


def test_detection_counts_only_judged_updates():
    det = detection([R0, R1])
    assert (det.tp, det.fp, det.tn, det.fn) == (3, 1, 3, 1)
    assert det.precision == 0.75 and det.recall == 0.75 and det.f1 == 0.75 and det.fpr == 0.25


def test_detection_per_round():
    # round 0 alone: TP 1 (c1), FP 1 (c3), TN 1 (c2), FN 1 (c0)
    assert detection([R0]) == Detection(1, 1, 1, 1)
    # round 1 alone: TP 2 (c0, c5), TN 2 (c2, c3)
    assert detection([R1]) == Detection(2, 0, 2, 0)


def test_detection_counts_accumulate():
    # one round: two missed malicious (FN 2), two flagged honest (FP 2), one flagged
    # malicious (TP 1), three accepted honest (TN 3)
    r = RoundRecord(round=0, accuracy=0.0, loss=0.0,
                    accepted=[True, True, False, False, False, True, True, True],
                    malicious=[True, True, False, False, True, False, False, False],
                    participating=[True] * 8, rejected={2: "x", 3: "x", 4: "x"})
    assert detection([r]) == Detection(tp=1, fp=2, tn=3, fn=2)
    assert detection([r, r]) == Detection(tp=2, fp=4, tn=6, fn=4)


def test_a_rejected_client_that_did_not_take_part_is_not_judged():
    # c1 did not take part (participating False) yet appears in rejected (e.g. a stale
    # entry): it is still not judged. c0 took part and was accepted: TN.
    r = RoundRecord(round=0, accuracy=0.0, loss=0.0, accepted=[True, False], malicious=[False, True],
                    participating=[True, False], rejected={1: "stale"})
    assert detection([r]) == Detection(0, 0, 1, 0)


def test_detection_ratios_and_undefined_cases():
    # precision = TP/(TP+FP), recall = TP/(TP+FN), F1 = 2PR/(P+R), FPR = FP/(FP+TN)
    d = Detection(tp=2, fp=1, tn=6, fn=2)
    assert d.precision == pytest.approx(2 / 3)
    assert d.recall == pytest.approx(0.5)
    assert d.f1 == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))  # 4/7
    assert d.fpr == pytest.approx(1 / 7)
    # nothing flagged: precision 0/0 → None, F1 undefined → None; recall 0/3 = 0
    d = Detection(tp=0, fp=0, tn=5, fn=3)
    assert d.precision is None and d.recall == 0.0 and d.f1 is None and d.fpr == 0.0
    # flagged only honest, missed every malicious: P = 0, R = 0 → F1 = 0 (not None)
    d = Detection(tp=0, fp=1, tn=0, fn=1)
    assert d.precision == 0.0 and d.recall == 0.0 and d.f1 == 0.0 and d.fpr == 1.0
    # no malicious client judged: recall None → F1 None; no honest judged: FPR None
    d = Detection(tp=0, fp=2, tn=0, fn=0)
    assert d.recall is None and d.f1 is None and d.precision == 0.0 and d.fpr == 1.0
    assert Detection(1, 0, 0, 0).fpr is None
    assert Detection(1, 0, 0, 0).as_dict() == {
        "tp": 1, "fp": 0, "tn": 0, "fn": 0, "precision": 1.0, "recall": 1.0, "f1": 1.0, "fpr": None}


def test_summarize_worked_example():
    out = summarize([R0, R1], BASE, target_accuracy=0.9)
    assert out["final_accuracy"] == 0.92 and out["final_loss"] == 0.5
    # first round reaching 0.9: round index 1 → 2 (1-based); baseline: 1 → slowdown 1
    assert out["rounds_to_target"] == 2 and out["slowdown_rounds"] == 1
    assert out["accuracy_drop"] == pytest.approx(0.95 - 0.92)
    assert out["asr"] == 0.125
    assert (out["tp"], out["fp"], out["tn"], out["fn"]) == (3, 1, 3, 1)
    assert out["precision"] == out["recall"] == out["f1"] == 0.75 and out["fpr"] == 0.25
    assert out["bytes_on_wire"] == 1500
    assert out["dropped_updates"] == 2 + 3
    assert out["rejected_updates"] == 2 + 2
    assert out["wall_time_per_round_s"] == pytest.approx((1.0 + 3.0) / 2)
    assert out["defense_time_per_round_s"] == pytest.approx((0.25 + 0.75) / 2)
    assert out["sim_time_s"] == pytest.approx(3.5)
    # envelope: the only accepted malicious update is c0 in round 0: ‖u‖/M = 1.5/2 = 0.75,
    # cos 0.3, margin 0.3 − 0.1 = 0.2 (c1's 5/2 and −0.9 were rejected: not counted)
    assert out["envelope_norm"] == 0.75
    assert out["envelope_cos"] == 0.3
    assert out["envelope_cos_margin"] == pytest.approx(0.2)
    assert out["target_accuracy"] == 0.9
    # every documented metric is produced (and nothing undocumented but the counts)
    assert set(METRICS) <= set(out)
    assert set(out) - set(METRICS) == {"tp", "fp", "tn", "fn", "target_accuracy", "undefined"}
    assert out["undefined"] == {}  # every metric of this run could be computed


def test_summarize_defaults_and_a_single_round():
    # default target accuracy 0.9: R1 (0.92) reaches it in its round → 1; per-round
    # figures of one round are that round's own
    out = summarize([R1])
    assert out["target_accuracy"] == 0.9 and out["rounds_to_target"] == 2
    assert out["wall_time_per_round_s"] == 3.0 and out["defense_time_per_round_s"] == 0.75


def test_summarize_without_baseline_and_without_rounds():
    out = summarize([R0, R1])
    assert "accuracy_drop" not in out and "slowdown_rounds" not in out
    empty = summarize([])
    # no round: the final accuracy is undefined (it was NaN), with the reason
    assert empty["final_accuracy"] is None and empty["final_loss"] is None
    assert "no round was recorded" in empty["undefined"]["final_accuracy"]
    assert empty["rounds_to_target"] is None and empty["precision"] is None
    assert empty["wall_time_per_round_s"] == 0.0


def test_non_finite_final_loss_is_reported_as_null():
    r = RoundRecord(round=0, accuracy=0.1, loss=math.inf, accepted=[True], malicious=[False],
                    participating=[True])
    assert summarize([r])["final_loss"] is None


def test_slowdown_is_null_when_either_run_never_reaches_the_target():
    assert summarize([R0, R1], BASE, target_accuracy=0.93)["slowdown_rounds"] is None  # attacked never
    assert summarize(BASE, [R0], target_accuracy=0.9)["slowdown_rounds"] is None  # baseline never


def test_rounds_to_target_is_inclusive_and_one_based():
    assert rounds_to_target([R0, R1], 0.92) == 2  # 0.92 ≥ 0.92
    assert rounds_to_target([R0, R1], 0.5) == 1
    assert rounds_to_target([R0, R1], 0.9200001) is None
    assert accuracy_drop([R0, R1], BASE) == pytest.approx(0.03)


def test_attack_success_rate_is_the_last_rounds():
    assert attack_success_rate([R1, R0]) is None  # the last round has no "asr"
    assert attack_success_rate([R0, R1]) == 0.125
    assert attack_success_rate([]) is None
    other = RoundRecord(round=2, accuracy=0.9, loss=0.5, accepted=[True], malicious=[True],
                        participating=[True], extra={"asr": 0.75})
    assert attack_success_rate([R0, R1, other]) == 0.75


def test_envelope_takes_the_max_norm_and_min_cosine_over_rounds():
    # round A: accepted malicious c0 with ‖u‖/M = 1/2 and cos 0.5; round B: 3/4 and cos 0.2
    # → max 0.75, min cos 0.2, margin 0.2 − 0.1 = 0.1. A bound of 0 is ignored (no division).
    mk = lambda norms, bounds, cos: RoundRecord(
        round=0, accuracy=0.0, loss=0.0, accepted=[True, True], malicious=[True, False],
        participating=[True, True],
        extra={"norms": norms, "norm_bounds": bounds, "cosines": cos, "cos_threshold": 0.1})
    a = mk({0: 1.0, 1: 9.0}, {0: 2.0, 1: 2.0}, {0: 0.5, 1: -1.0})
    b = mk({0: 3.0}, {0: 4.0}, {0: 0.2})
    c = mk({0: 5.0}, {0: 0.0}, {})
    bare = RoundRecord(round=0, accuracy=0.0, loss=0.0, accepted=[True], malicious=[True],
                       participating=[True])  # no telemetry at all: contributes nothing
    env = envelope([a, b, c, bare])
    assert env["envelope_norm"] == 0.75
    assert env["envelope_cos"] == 0.2
    assert env["envelope_cos_margin"] == pytest.approx(0.1)
    assert envelope([b, a]) == env
    assert envelope([]) == {"envelope_norm": None, "envelope_cos": None, "envelope_cos_margin": None}


def test_envelope_reads_every_client_and_small_bounds():
    # client 0 is honest (skipped), client 1 malicious and accepted: ‖u‖/M = 0.25/0.5 = 0.5
    r = RoundRecord(round=0, accuracy=0.0, loss=0.0, accepted=[True, True], malicious=[False, True],
                    participating=[True, True],
                    extra={"norms": {0: 9.0, 1: 0.25}, "norm_bounds": {0: 0.5, 1: 0.5}})
    assert envelope([r])["envelope_norm"] == 0.5
    # a bound without a norm (or a norm without a bound) says nothing
    lone = RoundRecord(round=0, accuracy=0.0, loss=0.0, accepted=[True], malicious=[True],
                       participating=[True], extra={"norm_bounds": {0: 2.0}})
    assert envelope([lone])["envelope_norm"] is None
    lone.extra.clear()
    lone.extra["norms"] = {0: 2.0}
    assert envelope([lone])["envelope_norm"] is None


def test_envelope_without_a_threshold_has_no_margin():
    r = RoundRecord(round=0, accuracy=0.0, loss=0.0, accepted=[True], malicious=[True],
                    participating=[True], extra={"cosines": {0: 0.4}})
    assert envelope([r]) == {"envelope_norm": None, "envelope_cos": 0.4, "envelope_cos_margin": None}


def test_mean_ci_worked_example():
    # values 1, 2, 3: mean 2, sample variance ((1)² + 0 + (1)²)/2 = 1,
    # half-width t_{0.975,2} · √(1/3) = 4.303 · 0.577350… = 2.484339…
    ci = mean_ci([1.0, None, 2.0, 3.0, math.nan])
    assert ci["n"] == 3 and ci["mean"] == 2.0
    assert ci["lo"] == pytest.approx(2 - 4.303 / math.sqrt(3))
    assert ci["hi"] == pytest.approx(2 + 4.303 / math.sqrt(3))
    assert mean_ci([0.5]) == {"mean": 0.5, "lo": 0.5, "hi": 0.5, "n": 1}
    assert mean_ci([None]) == {"mean": None, "lo": None, "hi": None, "n": 0}


def test_t_quantiles_against_tables():
    # standard t tables: t_{0.975,1} = 12.706, t_{0.975,30} = 2.042, t_{0.975,40} = 2.021,
    # t_{0.975,120} = 1.980; t_{0.95,60} = 1.671
    assert _t_quantile(0.975, 1) == 12.706
    assert _t_quantile(0.975, 30) == 2.042
    assert _t_quantile(0.975, 40) == pytest.approx(2.021, abs=1e-3)
    assert _t_quantile(0.975, 120) == pytest.approx(1.980, abs=1e-3)
    assert _t_quantile(0.95, 60) == pytest.approx(1.671, abs=1e-3)
    # just past the table (ν = 31: 2.0395) and off the 0.975 column (t_{0.95,10} = 1.8125)
    assert _t_quantile(0.975, 31) == pytest.approx(2.0395, abs=2e-4)
    assert _t_quantile(0.95, 10) == pytest.approx(1.8125, abs=2e-3)
    # the expansion's third term matters at ν = 120: t_{0.975,120} = 1.9799304 (7 digits;
    # the three-term expansion is within 1.5e-6, without its last term off by ~1e-5)
    assert _t_quantile(0.975, 120) == pytest.approx(1.9799304, abs=3e-6)
    # and at ν = 1000 (t = 1.962339081, 10 digits) each coefficient of the last term shows:
    # the expansion is within 3e-9, a change of 3z to 4z would move it by 2e-8
    assert _t_quantile(0.975, 1000) == pytest.approx(1.962339081, abs=1e-8)


def test_breakdown_fraction():
    # sorted by fraction: 0.1 (drop 0, not broken), 0.2 (drop 0.06 > 0.05: broken) → 0.2
    pts = [(0.3, 0.5, None), (0.1, 0.0, None), (0.2, 0.06, None)]
    assert breakdown_fraction(pts) == 0.2
    # the margins are strict: a drop of exactly 0.05 or an ASR of exactly 0.5 is not broken
    assert breakdown_fraction([(0.1, 0.05, 0.5)]) is None
    assert breakdown_fraction([(0.1, None, 0.51), (0.05, None, None)]) == 0.1
    assert breakdown_fraction([(0.1, 0.2, None)], accuracy_margin=0.25) is None
    assert breakdown_fraction([(0.1, None, 0.3)], asr_level=0.25) == 0.1
    # points are ordered by fraction only (a tie keeps its order; None is not compared)
    assert breakdown_fraction([(0.2, None, 0.9), (0.1, None, 0.6), (0.1, 0.0, None)]) == 0.1


# -- language-model metrics ------------------------------------------------------------------
def _lm(losses, **extra):
    return [RoundRecord(round=i, accuracy=0.0, loss=x, accepted=[True], malicious=[False],
                        participating=[True], extra=dict(extra) if i == len(losses) - 1 else {})
            for i, x in enumerate(losses)]


def test_language_model_worked_example():
    # final loss 0.5 nats: bits = 0.5 / ln 2 = 0.7213475…, perplexity e^0.5 = 1.6487213…
    # baseline final loss 0.3: bits 0.4328085…, perplexity e^0.3 = 1.3498588…
    # increases: 0.2 / ln 2 = 0.2885390…, e^0.5 − e^0.3 = 0.2988625…
    # rounds to the baseline's final loss 0.3: the attacked losses 2.0, 0.5 never get there
    out = language_model(_lm([3.0, 2.0, 0.5], false_trigger=0.25), _lm([1.0, 0.3]))
    assert out["final_bits_per_byte"] == pytest.approx(0.7213475204)
    assert out["final_perplexity"] == pytest.approx(1.6487212707)
    assert out["bits_per_byte_increase"] == pytest.approx(0.2885390082)
    assert out["perplexity_increase"] == pytest.approx(0.2988624587)
    assert out["rounds_to_target_loss"] is None
    assert out["false_trigger_rate"] == 0.25
    assert language_model(_lm([3.0, 2.0, 0.5]) + _lm([0.9]))["false_trigger_rate"] is None  # last only
    # the baseline reaches the attacked run's final loss 0.5? its losses are 1.0, 0.3 → round 2
    assert language_model(_lm([1.0, 0.3]), _lm([2.0, 0.5]))["rounds_to_target_loss"] == 2


def test_language_model_without_baseline_or_rounds():
    out = language_model(_lm([0.7]))
    assert "bits_per_byte_increase" not in out and "perplexity_increase" not in out
    assert out["rounds_to_target_loss"] is None and out["false_trigger_rate"] is None
    assert language_model(_lm([0.7]), target_loss=0.7)["rounds_to_target_loss"] == 1
    empty = language_model([])
    assert empty["final_bits_per_byte"] is None and empty["final_perplexity"] is None


def test_language_model_non_finite_and_huge_losses():
    # an infinite loss has no bits or perplexity; e^700 would overflow soon after: null
    out = language_model(_lm([math.inf]), _lm([0.1]))
    assert out["final_bits_per_byte"] is None and out["bits_per_byte_increase"] is None
    assert out["perplexity_increase"] is None
    big = language_model(_lm([700.0]))
    assert big["final_perplexity"] is None and big["final_bits_per_byte"] == pytest.approx(700 / math.log(2))
    assert language_model(_lm([699.0]))["final_perplexity"] == pytest.approx(math.exp(699.0))


def test_rounds_to_target_loss():
    recs = _lm([3.0, 2.0, 1.0])
    assert rounds_to_target_loss(recs, 2.0) == 2  # 2.0 ≤ 2.0: inclusive
    assert rounds_to_target_loss(recs, 2.5) == 2
    assert rounds_to_target_loss(recs, 0.5) is None
    assert rounds_to_target_loss(recs, None) is None
    assert rounds_to_target_loss(recs, math.inf) is None
    assert rounds_to_target_loss(recs, math.nan) is None


def test_final_accuracy_last_k():
    # accuracies 0.5, 0.92, 0.8: k = 1 → 0.8; k = 2 → (0.92 + 0.8)/2 = 0.86;
    # k = 5 (more than there are) → all three: 2.22/3 = 0.74
    recs = [R0, R1, RoundRecord(round=2, accuracy=0.8, loss=0.4, accepted=[True], malicious=[False],
                                participating=[True])]
    assert final_accuracy_last_k(recs) == 0.8
    assert final_accuracy_last_k(recs, 2) == pytest.approx(0.86)
    assert final_accuracy_last_k(recs, 5) == pytest.approx(0.74)
    assert math.isnan(final_accuracy_last_k([], 3))
    with pytest.raises(ValueError, match="final_accuracy_last_k: k = 0: must be ≥ 1"):
        final_accuracy_last_k(recs, 0)
    assert summarize(recs)["final_accuracy_last_k"] == 0.8  # default k = 1
    assert summarize(recs, last_k=2)["final_accuracy_last_k"] == pytest.approx(0.86)


def test_mean_ci_near_float64s_range_does_not_overflow():
    """issue 22 §2: a legal scenario (latency_ms = 1e300) gave sim times whose squared deviations
    overflowed, crashing the matrix after every run and every later report of the store."""
    from redteam.scoring import mean_ci

    small, big = mean_ci([1.0, 1.5, 2.0]), mean_ci([1e300, 1.5e300, 2e300])
    for k in ("mean", "lo", "hi"):
        assert big[k] == pytest.approx(small[k] * 1e300, rel=1e-12)
    assert mean_ci([1.7e308, 1.7e308])["mean"] == pytest.approx(1.7e308)
