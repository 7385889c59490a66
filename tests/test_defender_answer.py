"""The defender's answer (issue 18 §1–2): the summary's pick cannot be a rule that never learns,
a rule that leaks a backdoor, or a winner by a third decimal inside the seed noise; ties are
broken by what a defender cares about (a gate's recall), never by matrix order; a language model
is judged in bits per byte. Each expected figure is worked by hand from the rows below."""

import math

import pytest

from redteam.report import report_from_rows
from redteam.report.defender import TRAIN_SHARE, defender_columns

LN2 = math.log(2)


def base_rounds(clean, untrained=0.10, chance=0.10, loss=0.5, untrained_loss=None):
    """A baseline's two rounds; the first carries the untrained level as the federation records it."""
    u = {"accuracy": untrained, "loss": untrained_loss, "chance_accuracy": chance}
    return [{"round": 0, "accuracy": 0.3, "loss": 2.0, "accepted": [True] * 4, "participating": [True] * 4,
             "malicious": [False] * 4, "rejected": {}, "extra": {"untrained": u}},
            {"round": 1, "accuracy": clean, "loss": loss, "accepted": [True] * 4, "participating": [True] * 4,
             "malicious": [False] * 4, "rejected": {}, "extra": {}}]


def cell_rows(defense, attack, cleans, unders, asr=None, recall=None, **kw):
    """One cell, one row per seed: clean (baseline) accuracy and accuracy under attack per seed."""
    out = []
    for rep, (c, u) in enumerate(zip(cleans, unders)):
        tp = 4 if recall else 0
        m = {"final_accuracy": u, "final_accuracy_last_k": u, "accuracy_drop": c - u, "asr": asr,
             "recall": recall if recall is not None else 0.0, "tp": tp, "fp": 0}
        out.append({"cell_id": f"{defense}[{attack}]", "attack": attack, "defense": defense, "settings": {},
                    "replicate": rep, "seed": 100 + rep, "finished": True, "metrics": m,
                    "rounds": base_rounds(u), "baseline_rounds": base_rounds(c, **kw)})
    return out


def rows_by_name(group):
    return {r.defense: r for r in group.rows}


def test_a_rule_that_never_learns_is_flagged_and_not_ranked():
    # untrained level 0.10 (initial model and majority class). Best clean: mean 0.90 → gap 0.80; a
    # defense trains when its clean accuracy closes ≥ 20 % of it (≥ 0.26). "stuck" sits at 0.14
    # (5 % of the gap) and loses nothing to the attack: under the old drop ranking it came first.
    rows = (cell_rows("mean", "alie", [0.90], [0.40]) + cell_rows("median", "alie", [0.85], [0.70])
            + cell_rows("stuck", "alie", [0.14], [0.14]))
    (g,) = report_from_rows(rows).defenders.groups
    r = rows_by_name(g)
    assert g.untrained == pytest.approx(0.10) and TRAIN_SHARE == 0.2
    assert r["stuck"].trains is False and r["stuck"].rank is None and r["stuck"].rank_text == "—"
    assert r["median"].trains and r["mean"].trains
    # harm from the best trained clean (0.90) to the floor 0.10: median (0.90 − 0.70)/0.80 = 0.25,
    # mean (0.90 − 0.40)/0.80 = 0.625
    assert r["median"].harm == pytest.approx(0.25) and r["mean"].harm == pytest.approx(0.625)
    assert [x.defense for x in g.rows] == ["median", "mean", "stuck"]
    assert any(h.startswith("Does not train here") and "stuck (clean 0.140)" in h for h in g.headline)
    _, body = defender_columns(g, report_from_rows(rows).defenders)
    assert body[2][:3] == ["—", "stuck", "does not train"]


def test_a_leaky_rule_with_the_best_drop_is_not_the_pick():
    # "leaky" loses no accuracy at all (drop 0) but the backdoor succeeds as often as through mean
    # (ASR 0.7); "robust" loses 0.1 accuracy and holds the backdoor to 0.05 → robust first.
    rows = (cell_rows("mean", "backdoor", [0.90], [0.88], asr=0.70)
            + cell_rows("leaky", "backdoor", [0.90], [0.90], asr=0.70)
            + cell_rows("robust", "backdoor", [0.90], [0.80], asr=0.05))
    (g,) = report_from_rows(rows).defenders.groups
    r = rows_by_name(g)
    # robust: max((0.90 − 0.80)/0.80 = 0.125, 0.05) = 0.125; leaky max(0, 0.70) = 0.70; mean max(0.025, 0.7)
    assert r["robust"].harm == pytest.approx(0.125) and r["leaky"].harm == pytest.approx(0.70)
    assert g.rows[0].defense == "robust" and r["leaky"].rank == 2 and r["mean"].rank == 2  # equal harm: tied
    assert g.headline[1].startswith("Pick: robust, harm 0.12")


def test_no_defense_stops_a_backdoor_that_every_rule_lets_through():
    rows = (cell_rows("mean", "backdoor", [0.90], [0.89], asr=0.95)
            + cell_rows("median", "backdoor", [0.88], [0.86], asr=0.62))
    (g,) = report_from_rows(rows).defenders.groups
    assert "No defense here stops backdoor: the best, median, leaves ASR 0.620." in g.headline
    assert g.headline[1].startswith("No defense here holds against this matrix: the least harmed, median")


def test_overlapping_seed_intervals_are_indistinguishable_from_the_leader():
    # three seeds each. a: under attack 0.80, 0.82, 0.84 → mean 0.82, s = 0.02, half-width
    # t(0.975, 2)·0.02/√3 = 4.3027·0.011547 = 0.04968; b: 0.79, 0.80, 0.81 → 0.80 ± 0.02484;
    # c: 0.50, 0.51, 0.52 → 0.51 ± 0.02484. Clean 0.90 everywhere, floor 0.10, span 0.80.
    rows = (cell_rows("a", "ipm", [0.9] * 3, [0.80, 0.82, 0.84]) + cell_rows("b", "ipm", [0.9] * 3, [0.79, 0.80, 0.81])
            + cell_rows("c", "ipm", [0.9] * 3, [0.50, 0.51, 0.52]))
    (g,) = report_from_rows(rows).defenders.groups
    r = rows_by_name(g)
    assert r["a"].harm == pytest.approx(0.08 / 0.8)
    assert r["a"].harm_lo == pytest.approx((0.08 - 0.049679) / 0.8, abs=1e-4)
    assert r["a"].harm_hi == pytest.approx((0.08 + 0.049679) / 0.8, abs=1e-4)
    # b's harm [(0.10 − 0.0248)/0.8, (0.10 + 0.0248)/0.8] = [0.094, 0.156] overlaps a's [0.038, 0.162]; c's
    # [0.456, 0.518] does not
    assert [x.defense for x in g.rows] == ["a", "b", "c"]
    assert r["b"].tied_with_leader and r["b"].rank_text == "≈1" and not r["c"].tied_with_leader
    assert "Indistinguishable from a at 95 % over 3 seeds: b." in g.headline
    assert not any(h.startswith("One seed") for h in g.headline)
    # with one seed the first line says nothing was tested against noise
    (g1,) = report_from_rows([x for x in rows if x["replicate"] == 0]).defenders.groups
    assert g1.headline[0].startswith("One seed: no difference here is tested against noise")
    assert not any(x.tied_with_leader for x in g1.rows)


def test_ties_go_to_the_rule_that_catches_more_then_share_a_rank_never_matrix_order():
    # provenance-style: no attack moves accuracy (harm 0 everywhere). The gate rejects 7 of 8 attacks'
    # updates (mean recall 0.875); mean and "other" reject nothing and tie exactly → same rank, by name.
    rows = []
    for i in range(8):
        rows += cell_rows("zmean", f"forge{i}", [0.9], [0.9])
        rows += cell_rows("other", f"forge{i}", [0.9], [0.9])
        rows += cell_rows("gate", f"forge{i}", [0.9], [0.9], recall=1.0 if i < 7 else 0.0)
    (g,) = report_from_rows(rows).defenders.groups
    r = rows_by_name(g)
    assert r["gate"].mean_recall == pytest.approx(0.875) and r["gate"].rank == 1
    assert r["zmean"].rank == r["other"].rank == 2
    assert [x.defense for x in g.rows] == ["gate", "other", "zmean"]  # alphabetical among the tied
    assert g.headline[1] == ("Pick: gate, harm 0.00 (worst accuracy under attack 0.900 (forge0); clean 0.900; flags "
                             "the attackers in 7 of 8 attacks (recall ≥ 0.5); ahead of other at equal harm in steps "
                             "of 0.05 on mean recall (0.875 vs 0.000)).")


def test_the_no_attack_cell_is_never_the_worst_attack_whatever_its_label():
    rows = cell_rows("mean", "clean", [0.9], [0.2]) + cell_rows("mean", "ipm", [0.9], [0.8])
    doc = {"matrix": {"attacks": [{"name": "none", "label": "clean"}, "ipm"]}}
    (g,) = report_from_rows(rows, meta={"scenario_doc": doc}).defenders.groups
    assert g.attacks == ("ipm",) and g.rows[0].worst_quality_attack == "ipm"
    # without the scenario document "clean" would be taken for an attack
    (g2,) = report_from_rows(rows).defenders.groups
    assert g2.rows[0].worst_quality_attack == "clean"


def test_a_destroyed_model_is_harm_one_and_said_so():
    rows = cell_rows("mean", "nonfinite", [0.9], [0.1]) + cell_rows("median", "nonfinite", [0.88], [0.86])
    rows[0]["rounds"][-1]["extra"] = {"model_nonfinite": True}
    (g,) = report_from_rows(rows).defenders.groups
    r = rows_by_name(g)
    assert r["mean"].destroyed == ("nonfinite",) and r["mean"].harm == 1.0 and g.rows[0].defense == "median"
    assert any(h.startswith("Model destroyed") and "mean under nonfinite" in h for h in g.headline)


def lm_rows(defense, attack, clean_bpb, under_bpb, asr=None, untrained_bpb=8.0):
    out = []
    for rep, (c, u) in enumerate(zip(clean_bpb, under_bpb)):
        m = {"final_accuracy": 0.5, "final_accuracy_last_k": 0.5, "accuracy_drop": 0.0,
             "final_bits_per_byte": u, "bits_per_byte_increase": u - c, "asr": asr, "recall": 0.0, "tp": 0, "fp": 0}
        out.append({"cell_id": f"{defense}[{attack}]", "attack": attack, "defense": defense, "settings": {},
                    "replicate": rep, "seed": rep, "finished": True, "metrics": m,
                    "rounds": base_rounds(0.5, loss=u * LN2),
                    "baseline_rounds": base_rounds(0.5, loss=c * LN2, untrained_loss=untrained_bpb * LN2)})
    return out


def test_a_language_model_is_ranked_in_bits_per_byte_lower_is_better():
    # next-byte accuracy is the same everywhere (0.5): only bits per byte tells the rules apart.
    # untrained 8 bits; best clean 4.0 → span 4.0. cc: worst 4.6 → harm 0.15; tm: 4.2 → 0.05
    doc = {"workload": {"name": "text"}}
    rows = lm_rows("cc", "sign_flip", [4.0], [4.6]) + lm_rows("tm", "sign_flip", [4.1], [4.2])
    report = report_from_rows(rows, meta={"scenario_doc": doc})
    (g,) = report.defenders.groups
    r = rows_by_name(g)
    assert g.quality.label == "bits per byte" and not g.quality.higher_is_better
    assert g.untrained == pytest.approx(8.0)
    assert r["cc"].harm == pytest.approx(0.15) and r["tm"].harm == pytest.approx(0.05)
    assert [x.defense for x in g.rows] == ["tm", "cc"]
    assert r["tm"].cost is None and r["tm"].worst_drop == pytest.approx(0.1)
    header, body = defender_columns(g, report.defenders)
    assert header[:5] == ["#", "defense", "harm ↓", "clean bits per byte ↓", "worst under attack ↓"]
    assert body[0][4] == "4.200 (sign_flip)"
    # every default view of a language-model store is in bits per byte
    from redteam.report.html import default_html_metrics
    from redteam.report.tables import default_table_metric

    assert default_table_metric(report) == "final_bits_per_byte"
    assert default_html_metrics(report)[:2] == ["final_bits_per_byte", "bits_per_byte_increase"]


def test_a_backdoor_that_faded_after_its_window_still_counts():
    """With an attack window (issue 20), the verdict reads the ASR at the window's end: "fading"
    let a 0.9 backdoor into the model and it is gone only by the final round (ASR 0.05), while
    "holding" never let more than 0.2 in (and 0.2 at the end). By the final ASR "fading" would
    win; by what the defense let through it loses."""
    rows = []
    for d, end, final in (("fading", 0.9, 0.05), ("holding", 0.2, 0.2)):
        for r in cell_rows(d, "backdoor", [0.9, 0.9], [0.88, 0.88], asr=final):
            r["metrics"]["asr_at_end_of_window"] = end
            rows.append(r)
    (g,) = report_from_rows(rows).defenders.groups
    r = rows_by_name(g)
    assert r["fading"].worst_asr == pytest.approx(0.9) and r["holding"].worst_asr == pytest.approx(0.2)
    assert [x.defense for x in g.rows][0] == "holding"


def test_one_seed_ranks_tie_within_the_stated_step_and_more_seeds_separate_them():
    """issue 40 §3: with one seed, two defenses at equal harm whose mean recall differs in the
    third decimal (0.443 against 0.442, as in envelope.toml) share rank 1, and the headline states
    the step; a difference of a whole step still ranks. With 3 seeds the 3-decimal rule applies."""
    from redteam.report.defender import ONE_SEED_STEP

    def gate(defense, recall, under, seeds=1):
        return cell_rows(defense, "ipm", [0.9] * seeds, [under] * seeds, recall=recall)

    rows = gate("a", 0.443, 0.80) + gate("b", 0.442, 0.80) + gate("c", 0.443 - ONE_SEED_STEP, 0.80)
    (g,) = report_from_rows(rows).defenders.groups
    r = rows_by_name(g)
    assert (r["a"].rank, r["b"].rank, r["c"].rank) == (1, 1, 3)
    assert g.headline[0].startswith(f"One seed: no difference here is tested against noise, so ranks compare "
                                    f"harm, mean recall and clean quality in steps of {ONE_SEED_STEP:g} only")
    assert g.headline[1].startswith("Pick: a (tied: b), harm 0.12")
    assert "0.443 vs 0.442" not in " ".join(g.headline)
    # harm exactly one step apart on the step grid (0.10 and 0.15 of the learnable accuracy): ranked apart
    (g,) = report_from_rows(gate("x", None, 0.82) + gate("y", None, 0.78)).defenders.groups
    assert [(x.defense, x.rank) for x in g.rows] == [("x", 1), ("y", 2)]
    # three seeds: the same figures are told apart at 3 decimals, recall breaking the tie
    rows3 = gate("a", 0.443, 0.80, 3) + gate("b", 0.442, 0.80, 3)
    (g3,) = report_from_rows(rows3).defenders.groups
    assert [(x.defense, x.rank) for x in g3.rows] == [("a", 1), ("b", 2)]
