"""Checks and metrics at their boundaries (issue 39, survivors of an outside mutation audit), each
a worked example: the pipeline's redundant recomputation compares the *largest* |Δ| with its
tolerance, whose default is pinned (as the spot check's is); rounds under ``attacker_selection =
every_round / count`` hold exactly K; an ASR exactly at ``lifespan_threshold`` still counts as
alive; ``idle_share`` is the mean over rounds, not the worst round."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from defenses.pipeline_checks import RedundantRecompute
from defenses.spot_check import SpotCheck
from redteam.federation.sampling import RoundPlan
from redteam.scenario import AttackWindow, FederationSpec
from redteam.scoring import durability, pipeline_metrics
from redteam.testing import RowReplay
from redteam.types import RoundRecord, ServerContext

# ------------------------------------------------------------------ redundant recomputation


@dataclass(frozen=True, slots=True)
class _Peer:
    pid: int
    stage: int
    banned_at: int | None = None


class _View:
    """Two peers of stage 0; the honest verifier's recomputation of the hop is ``ref``."""

    def __init__(self, ref: torch.Tensor) -> None:
        self.ref = ref
        self.peers = [_Peer(0, 0), _Peer(1, 0)]
        self.current_round = 0

    def verifier_agrees(self, stage, verifier, peer, inp, flat, test) -> bool:
        return bool(test(self.ref))


def _verdict(check: RedundantRecompute, ref: torch.Tensor, sent: torch.Tensor):
    return check.verify_hop(_View(ref), 0, _Peer(0, 0), torch.zeros(1), sent, torch.zeros(1),
                            np.random.default_rng(0))


def _ref() -> torch.Tensor:
    ref = torch.zeros(100)
    ref[0] = 1.0  # max |b| = 1: the bound is tolerance × 2
    return ref


def test_recompute_judges_the_largest_difference_not_the_mean():
    """One entry of 100 off by 0.01: max |Δ| = 0.01 > 1e-4 × (1 + 1) = 2e-4, though the mean |Δ|
    (1e-4) is under the bound. A one-coordinate tamper is caught."""
    sent = _ref().clone()
    sent[50] += 0.01
    v = _verdict(RedundantRecompute(fraction=1.0), _ref(), sent)
    assert v.recomputed and v.failed and "max |Δ| = 0.01 > 0.0002" in v.reason


def test_recompute_default_tolerance_is_pinned_at_1e_4():
    """Every entry off by 5e-4 (max = mean): over the default bound 2e-4 (a 10× looser tolerance
    would pass it); off by 1e-4: within it. At the bound exactly (tolerance 0.5: bound 1.0, a
    gap of exactly 1.0) the hop passes; a hair over, it fails."""
    assert RedundantRecompute().tolerance == 1e-4
    ref = _ref()
    assert _verdict(RedundantRecompute(fraction=1.0), ref, ref + 5e-4).failed
    assert not _verdict(RedundantRecompute(fraction=1.0), ref, ref + 1e-4).failed
    at = ref.clone()
    at[7] = 1.0
    assert not _verdict(RedundantRecompute(fraction=1.0, tolerance=0.5), ref, at).failed
    at[7] = 1.0 + 1e-6
    assert _verdict(RedundantRecompute(fraction=1.0, tolerance=0.5), ref, at).failed


def test_spot_check_default_tolerance_is_pinned_at_1e_4():
    """Rows off their replay by a relative 5e-4 are rejected at the default tol (1e-4; 10× looser
    would accept them); rows off by 5e-5 pass."""
    assert SpotCheck().tol == 1e-4
    honest = torch.tensor([[3.0, 4.0], [0.0, 5.0]])  # norms 5
    sent = honest.clone()
    sent[0, 0] += 5 * 5e-4  # ‖Δ‖ / ‖r‖ = 5e-4
    sent[1, 1] += 5 * 5e-5  # 5e-5
    ids = (1, 2)
    ctx = ServerContext.default(sent, client_ids=ids, replay_work=RowReplay(ids, honest), state={}, round=0)
    d = SpotCheck(fraction=1.0)(sent, ctx)
    assert d.accepted.tolist() == [False, True] and "0.0005 of the replay's norm" in d.reasons[0]


# ------------------------------------------------------------------ K of N with attacker selection


@pytest.mark.parametrize("rule,per_round,attackers", [("every_round", None, 3), ("count", 1, 1), ("count", 2, 2)])
def test_attacker_selection_draws_exactly_k(rule, per_round, attackers):
    """10 clients, attackers 1, 4, 8, K = 5: every round holds 5 clients, of them all 3 attackers
    (every_round) or exactly a (count), the rest honest."""
    mal = np.zeros(10, dtype=bool)
    mal[[1, 4, 8]] = True
    spec = FederationSpec(clients=10, malicious_fraction=0.3, clients_per_round=5, attacker_selection=rule,
                          attackers_per_round=per_round)
    plan = RoundPlan(spec, AttackWindow(), mal, np.random.default_rng(0))
    for r in range(40):
        drawn = plan.draw(r, np.arange(10))
        assert len(drawn) == 5 and len(set(drawn.tolist())) == 5, (r, drawn)
        assert int(mal[drawn].sum()) == attackers, (r, drawn)


# ------------------------------------------------------------------ durability and pipeline metrics


def _rec(i: int, **extra) -> RoundRecord:
    return RoundRecord(round=i, accuracy=0.5, loss=1.0, accepted=[], malicious=[], participating=[], extra=extra)


def test_an_asr_exactly_at_the_lifespan_threshold_is_still_alive():
    """Window rounds 0..1 (E = 1); ASR at E exactly 0.5, then 0.5, 0.5, 0.25: "stays ≥ the
    threshold" counts the two rounds at 0.5, so the lifespan is 2 (not 0, not 1)."""
    asr = [0.75, 0.5, 0.5, 0.5, 0.25, 0.75]
    recs = [_rec(i, asr=a, attack_active=i < 2) for i, a in enumerate(asr)]
    d = durability(recs, after_k=1, threshold=0.5)
    assert d["asr_at_end_of_window"] == 0.5
    assert d["backdoor_lifespan"] == 2 and d["lifespan_censored"] == 0
    d = durability(recs, after_k=1, threshold=0.75)  # at E already under it
    assert d["backdoor_lifespan"] == 0


def test_idle_share_is_the_mean_over_rounds():
    recs = [_rec(i, pipeline={"idle_share": s, "hops": 4}) for i, s in enumerate([0.25, 0.75, 0.5])]
    assert pipeline_metrics(recs)["idle_share"] == 0.5  # the worst round would say 0.75
