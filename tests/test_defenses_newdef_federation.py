"""DnC, FLAME, FLDetector, RLR and SignGuard inside the trainer: digits, 20 clients, 4 malicious.

Each test is one short federation (20 rounds, Dirichlet(0.5) label skew), checking the
behaviour the papers report for the attack each rule was designed against, with margins
wide enough for any seed-level noise (the seed is fixed anyway).
"""

from __future__ import annotations

import pytest

from redteam.federation.loop import Federation
from redteam.scenario import parse_scenario


def _run(attack: dict, defense: dict, rounds: int = 20):
    sc = parse_scenario({
        "scenario": {"seed": 0},
        "workload": {"name": "digits"},
        "federation": {"clients": 20, "rounds": rounds, "partition": "dirichlet", "alpha": 0.5, "lr": 0.2,
                       "malicious_fraction": 0.2},
        "attack": attack,
        "defense": defense,
    })
    return Federation(sc).run().records


def _rates(records):
    """(share of malicious updates rejected, share of honest updates rejected) over all rounds."""
    mal = [c for c, m in enumerate(records[0].malicious) if m]
    hon = [c for c in range(len(records[0].malicious)) if c not in mal]
    recall = sum(not r.accepted[c] for r in records for c in mal) / (len(mal) * len(records))
    fpr = sum(not r.accepted[c] for r in records for c in hon) / (len(hon) * len(records))
    return recall, fpr


BACKDOOR = {"name": "backdoor", "target": 0, "fraction": 0.5}
SIGN_FLIP = {"name": "sign_flip", "scale": 4.0}


def test_rlr_blunts_a_backdoor_that_plain_averaging_lets_through():
    # θ = 8 > 4 corrupt agents (seeds 0–3 measured: ASR 0.60/0.85/0.42/0.89 under the mean,
    # 0.05/0.32/0.17/0.00 under RLR, at a cost of 0.1–0.4 clean accuracy)
    plain = _run(BACKDOOR, {"name": "mean"})[-1].extra["asr"]
    robust = _run(BACKDOOR, {"name": "rlr", "theta": 8})[-1].extra["asr"]
    assert plain > 0.4 and robust < plain - 0.25, (plain, robust)


def test_signguard_rejects_alie_by_its_sign_statistics():
    recall, fpr = _rates(_run({"name": "alie"}, {"name": "signguard"}))
    assert recall >= 0.9 and fpr <= 0.1, (recall, fpr)


@pytest.mark.parametrize("defense, min_recall, max_fpr", [
    ({"name": "dnc", "f": 4}, 0.8, 0.1),
    ({"name": "flame"}, 0.9, 0.5),  # FLAME admits about n/2 + 1 updates (see defenses/flame.py)
])
def test_filters_catch_a_scaled_sign_flip(defense, min_recall, max_fpr):
    recall, fpr = _rates(_run(SIGN_FLIP, defense))
    assert recall >= min_recall and fpr <= max_fpr, (recall, fpr)


def test_fldetector_flags_the_attackers_after_its_warm_up_and_keeps_them_out():
    # the cascading form (detection every round): the authors detect once, the default
    # (tests/test_defense_defaults2.py pins it); here one detection finds 1 of the 4 attackers
    records = _run(SIGN_FLIP, {"name": "fldetector", "window": 5, "detect_once": False})
    mal = {c for c, m in enumerate(records[0].malicious) if m}
    # warm-up: pairs exist from round 2, the window of 5 is full in round 6
    assert all(all(r.accepted) for r in records[:6])
    last = records[-1]
    assert {c for c, ok in enumerate(last.accepted) if not ok} == mal
    assert all("FLDetector" in last.rejected[c] for c in mal)
