"""Commit-reveal and the Gauntlet's edges, worked by hand (issue 39: the mutation audit):
lateness on the window's close, shared digests, the top-G order and ties, the rating EMA and
its scale, the consensus's stake share, Templar's indicator and relative improvement, and the
ledger's late commitments."""

from __future__ import annotations

import pytest
import torch

from defenses.gauntlet import (commit_flags, consensus_scores, relative_improvement, row_digest, templar_indicator,
                               top_g_rewards, update_ratings)


def test_a_commit_exactly_at_the_close_is_on_time():
    upd = torch.tensor([[1.0], [2.0], [3.0]])
    d = [row_digest(r) for r in upd]
    assert commit_flags(upd, [0, 1, 2], {0: (d[0], 1.0), 1: (d[1], 0.0), 2: (d[2], 0.5)}) == {}
    late = commit_flags(upd, [0, 1, 2], {0: (d[0], 1.0000001), 1: (d[1], 0.0), 2: (d[2], 0.5)})
    assert late == {0: "commit-reveal: committed at 1, after the commit window closed at 1"}
    # another window: close 0.5 makes 0.5 on time and 1.0 late
    assert sorted(commit_flags(upd, [0, 1, 2], {0: (d[0], 1.0), 1: (d[1], 0.0), 2: (d[2], 0.5)}, close=0.5)) == [0]


def test_shared_digests_flag_every_sharer_and_a_late_reason_comes_first():
    upd = torch.tensor([[1.0], [1.0], [1.0], [2.0]])
    d = row_digest(upd[0])
    commits = {10: (d, 0.1), 11: (d, 0.2), 12: (d, 1.5), 13: (row_digest(upd[3]), 0.3)}
    flags = commit_flags(upd, [10, 11, 12, 13], commits)
    assert flags[0] == flags[1] == "commit-reveal: digest shared by 3 peers (one computation, several identities)"
    assert flags[2].startswith("commit-reveal: committed at 1.5")  # late: its first reason stands
    assert 3 not in flags  # a digest of its own
    # keys are client ids, positions are rows: client 13 at row 0
    assert commit_flags(upd[3:], [13], {13: (row_digest(upd[3]), 0.3)}) == {}
    assert commit_flags(upd[3:], [13], {12: (row_digest(upd[3]), 0.3)}) == {
        0: "commit-reveal: no commitment before the reveal"}


def test_top_g_by_rating_ties_to_the_lower_row_and_only_positive_ratings():
    ratings = {0: 0.1, 1: 0.3, 2: 0.3, 3: 0.2, 4: 0.0, 5: -0.4}
    ids = [0, 1, 2, 3, 4, 5]
    top, rew = top_g_rewards(ratings, ids, 1)
    assert top == [1] and rew[1] == 1.0  # 1 and 2 tie: the lower row
    top, rew = top_g_rewards(ratings, ids, 3)
    assert top == [1, 2, 3] and rew == pytest.approx({0: 0.0, 1: 0.375, 2: 0.375, 3: 0.25, 4: 0.0, 5: 0.0})
    top, _ = top_g_rewards(ratings, ids, 10)
    assert top == [0, 1, 2, 3]  # a rating of exactly 0 is not paid, nor a negative one
    top, rew = top_g_rewards(ratings, [5, 4], 2)
    assert top == [] and rew == {5: 0.0, 4: 0.0}
    # rows are positions in ids, not client ids; an absent client has no rating (0)
    top, rew = top_g_rewards({7: 0.5, 9: 0.25}, [9, 8, 7], 2)
    assert top == [0, 2] and rew == pytest.approx({9: 1 / 3, 8: 0.0, 7: 2 / 3})


def test_rating_ema_scale_and_the_peers_it_leaves_out():
    """α = 0.25: r ← 0.75·r + 0.25·ŝ. Scores (2, −1, 8 flagged, −inf): the scale is the largest
    |s| of the finite, unflagged scores (2), so ŝ = (1, −0.5, −1, −1)."""
    old = {0: 0.5, 1: 0.0, 2: 0.25, 3: 0.5, 9: 0.75}
    r = update_ratings(old, [0, 1, 2, 3], torch.tensor([2.0, -1.0, 8.0, -float("inf")]), 0.25, flagged={2})
    assert r == {0: 0.375 + 0.25, 1: -0.125, 2: 0.1875 - 0.25, 3: 0.375 - 0.25, 9: 0.75}  # 9: absent, kept
    r = update_ratings({}, [4, 5], torch.tensor([0.0, 0.0]), 0.5)  # all zero: scale 1, new peers start at 0
    assert r == {4: 0.0, 5: 0.0}
    r = update_ratings({}, [4, 5], torch.tensor([-3.0, 1.5]), 1.0)  # scale 3: ŝ = (−1, 0.5)
    assert r == {4: -1.0, 5: 0.5}


def test_consensus_needs_more_than_kappa_of_the_seats():
    """Four seats report (4, 3, 2, 1) for one peer. κ = 0.5: a value needs more than 2 seats at
    or above it → 2 (three seats; 3 has only two). κ = 0.75 → all four → 1. κ = 0.25 → two → 3."""
    reports = torch.tensor([[4.0], [3.0], [2.0], [1.0]])
    assert consensus_scores(reports, 0.5).tolist() == [2.0]
    assert consensus_scores(reports, 0.75).tolist() == [1.0]
    assert consensus_scores(reports, 0.25).tolist() == [3.0]  # more than 1 seat: two at ≥ 3
    assert consensus_scores(torch.tensor([[5.0, 1.0]]), 0.5).tolist() == [5.0, 1.0]  # one seat: its report
    # three seats, two peers: each column on its own (the lower median of (1, 7, 3) and of (6, 2, 4))
    assert consensus_scores(torch.tensor([[1.0, 6.0], [7.0, 2.0], [3.0, 4.0]]), 0.5).tolist() == [3.0, 4.0]


def test_round_scores_take_the_smaller_improvement_and_non_finite_is_minus_infinity():
    from defenses.gauntlet import round_scores

    s = round_scores(torch.tensor([5.0, 5.0, 5.0]), torch.tensor([1.0, float("inf"), 4.0]), 3.0,
                     torch.tensor([2.5, 0.0, 0.0]))
    assert s.tolist() == [0.5, -float("inf"), 1.0]


def test_relative_improvement_and_the_indicator_by_hand():
    before = torch.tensor([4.0, 0.0, -1.0, 2.0], dtype=torch.float64)
    after = torch.tensor([3.0, 1.0, 1.0, float("nan")], dtype=torch.float64)
    assert relative_improvement(before, after).tolist() == [0.25, 0.0, 0.0, -float("inf")]
    assert relative_improvement(2.0, torch.tensor([1.0, 3.0])).tolist() == [0.5, -0.5]
    # a loss under 1 is still a loss (relative to itself); at or under 0 the improvement is 0
    small = relative_improvement(torch.tensor([0.5, -0.5, 0.0]), torch.tensor([0.25, -1.0, -1.0]))
    assert small.tolist() == [0.5, 0.0, 0.0]
    own = torch.tensor([0.5, 0.25, 0.1])
    rand = torch.tensor([0.25, 0.25, 0.2])
    assert templar_indicator(own, rand).tolist() == [1.0, -1.0, -1.0]  # a tie is no evidence


def test_the_ledger_logs_each_round_by_commit_time_and_a_commit_at_the_close_is_not_late(tmp_path):
    from redteam.federation.commitments import late_commitments, read_commitments, write_commitment_ledger

    rounds = [(0, {3: {"digest": "a" * 64, "time": 1.0}, 1: {"digest": "b" * 64, "time": 1.25},
                   2: {"digest": "c" * 64, "time": 0.5}, 5: {"digest": "d" * 64, "time": 0.5}}),
              (1, {}),
              (2, {"4": {"digest": "e" * 64, "time": 0.0}})]  # a record read back from JSON: a string key
    path = tmp_path / "c.sqlite"
    assert write_commitment_ledger(path, rounds, seed=3) == 5
    got = read_commitments(path)
    # each round's commits in commit-time order, ties by client; the index is the log position
    assert [(c["round"], c["client"], c["commit_time"], c["index"]) for c in got] == [
        (0, 2, 0.5, 0), (0, 5, 0.5, 1), (0, 3, 1.0, 2), (0, 1, 1.25, 3), (2, 4, 0.0, 4)]
    assert got[0]["digest"] == "c" * 64 and all(c["window_close"] == 1.0 for c in got)
    assert [c["client"] for c in late_commitments(path)] == [1]  # 1.0 is on time; 1.25 is late
    early = tmp_path / "early.sqlite"
    write_commitment_ledger(early, rounds, seed=3, window_close=0.75)
    assert [c["client"] for c in late_commitments(early)] == [3, 1]


def test_openskill_update_puts_a_non_finite_score_last_and_keeps_absent_peers():
    from defenses.gauntlet import openskill_update

    prior = {0: (30.0, 2.0), 9: (20.0, 5.0)}
    nan = openskill_update(prior, [0, 1, 2], torch.tensor([1.0, float("nan"), 2.0]))
    assert nan == openskill_update(prior, [0, 1, 2], torch.tensor([1.0, -5.0, 2.0]))  # the last place
    assert nan != openskill_update(prior, [0, 1, 2], torch.tensor([1.0, 1.5, 2.0]))
    assert nan[9] == (20.0, 5.0)  # absent: kept
    assert nan[0] != openskill_update({}, [0, 1, 2], torch.tensor([1.0, float("nan"), 2.0]))[0]  # its prior counts
    # one player: no game; a new peer gets the model's starting rating, a known one keeps its own
    assert openskill_update({}, [4], torch.tensor([3.0]))[4] == pytest.approx((25.0, 25.0 / 3))
    assert openskill_update(prior, [0], torch.tensor([3.0])) == prior
    # a NaN first, or below a negative score: still the last place (the floor is under the lowest finite)
    assert openskill_update({}, [1, 0, 2], torch.tensor([float("nan"), -3.0, 2.0])) == openskill_update(
        {}, [1, 0, 2], torch.tensor([-9.0, -3.0, 2.0]))
    # the prior's μ and σ are the peer's starting point: μ 30, σ 2 moves little in one game
    won = openskill_update(prior, [0, 1], torch.tensor([2.0, 1.0]))
    assert 30.0 < won[0][0] < 30.5 and won[0][1] < 2.1 and won[1][0] < 25.0


def test_gauntlet_defaults_and_parameter_edges():
    from defenses.gauntlet import Gauntlet
    from redteam.errors import InvalidParameter

    g = Gauntlet()
    assert (g.top_g, g.scoring, g.alpha, g.bma_alpha, g.random_batch, g.commit_reveal, g.validators, g.kappa) == (
        5, "templar", 0.3, 0.05, True, False, 1, 0.5)
    assert Gauntlet(alpha=1.0, bma_alpha=1.0, kappa=0.0, top_g=1, validators=1).alpha == 1.0  # the closed ends
    for bad in ({"alpha": 0.0}, {"bma_alpha": 0.0}, {"alpha": 1.5}, {"kappa": 1.0}, {"top_g": 0},
                {"validators": 0}, {"scoring": "max"}):
        with pytest.raises(InvalidParameter):
            Gauntlet(**bad)
    assert Gauntlet(scoring="min").unanimity and not Gauntlet().unanimity


def test_the_ledger_is_a_function_of_its_seed_and_commitments(tmp_path):
    """Keys come from the seed alone (``derive_key``; the default seed 0), and signing is
    deterministic, so the same commitments and seed give the same ledger root on every machine
    and version: a published ledger can be re-derived. The root below was written by this
    version for seed 3; a change to the key derivation or the statement's encoding changes it."""
    from redteam.federation.commitments import PREDICATE_TYPE, verified_statements, write_commitment_ledger

    rounds = [(0, {1: {"digest": "a" * 64, "time": 0.5}, 2: {"digest": "b" * 64, "time": 1.5}})]

    def root(name, **kw):
        write_commitment_ledger(tmp_path / name, rounds, **kw)
        return verified_statements(tmp_path / name, PREDICATE_TYPE)[1].hex()

    assert root("default.sqlite") == root("zero.sqlite", seed=0) != root("one.sqlite", seed=1)
    assert root("three.sqlite", seed=3) == "e967ae7565a26409699dedb44f1ee16ad05991ebd718ff219f74c26629255e32"


def test_the_ledger_log_key_is_the_ed25519_key_of_the_seeds_own_stream(tmp_path):
    """The log's own key (which the root does not cover: the root hashes the entries) is the
    Ed25519 key whose 32 private bytes are the first draw of ``default_rng(SeedSequence([seed,
    25]))`` (RFC 8032 §5.1.5 seed bytes), derived here with ``cryptography`` directly, not
    through the module; the neighbouring streams [seed, 24], [seed, 26] and a peer's
    [seed, 25, c] give other keys, and so does another seed."""
    import numpy as np
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from provenance.ledger import Ledger

    from redteam.federation.commitments import write_commitment_ledger

    def der(entropy):
        raw = np.random.default_rng(np.random.SeedSequence(entropy)).bytes(32)
        return ed25519.Ed25519PrivateKey.from_private_bytes(raw).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)

    rounds = [(0, {1: {"digest": "a" * 64, "time": 0.5}})]
    for seed in (3, 0):
        path = tmp_path / f"s{seed}.sqlite"
        write_commitment_ledger(path, rounds, seed=seed)
        with Ledger.open(path) as ledger:
            got = ledger.log_public.der
        assert got == der([seed, 25])
        assert got not in {der([seed, 24]), der([seed, 26]), der([seed, 25, 1]), der([seed + 1, 25])}
    # and, written down, for seed 3 (a SubjectPublicKeyInfo ends with the 32 raw key bytes): a change
    # to numpy's SeedSequence / PCG64 stream or to the key's encoding shows here
    assert der([3, 25]).hex()[-64:] == "e7cc555bb566a4f7969b8f4c96659d22fbe59d59fee6fee052966fe64c0f485b"


def _qctx(upd, random_target=None, assigned=None, **kw):
    """Quadratic losses (as in test_verification_gauntlet): L_R = ‖Δ − r‖², L_Aᵢ = ‖Δ − aᵢ‖²."""
    from redteam.types import ServerContext

    ev = None if random_target is None else (
        lambda d: ((d.to(torch.float64) - torch.as_tensor(random_target, dtype=torch.float64)) ** 2).sum(1))
    ev_a = None if assigned is None else (
        lambda d, c: ((d.to(torch.float64) - torch.as_tensor(assigned, dtype=torch.float64)[list(c)]) ** 2).sum(1))
    return ServerContext.default(upd, evaluate_loss=ev, evaluate_loss_assigned=ev_a, **kw)


def test_gauntlet_scores_on_whichever_batch_it_has():
    """Random batch only (r = 1): Δ = 1 scores 1 − 0 = 1, Δ = 0 scores 0, a NaN row −inf (it is
    not evaluated: the zero row stands in). Assigned only (a = 2): Δ = 1 scores 4 − 1 = 3."""
    from defenses.gauntlet import Gauntlet
    from redteam.errors import InvalidParameter

    upd = torch.tensor([[1.0], [0.0], [float("nan")]])
    for random_batch in (True, False):  # without an assignment the random batch stands for both
        dec = Gauntlet(scoring="min", alpha=1.0, top_g=1, random_batch=random_batch)(upd, _qctx(upd, [1.0]))
        assert dec.state["scores"] == {0: 1.0, 1: 0.0, 2: -float("inf")}
        assert dec.state["rating"] == {0: 1.0, 1: 0.0, 2: -1.0} and dec.accepted.tolist() == [True, False, False]
    dec = Gauntlet(scoring="min", alpha=1.0)(upd[:2], _qctx(upd[:2], assigned=[[2.0], [2.0]]))
    assert dec.state["scores"] == {0: 3.0, 1: 0.0}
    with pytest.raises(InvalidParameter, match="needs ctx.evaluate_loss"):
        Gauntlet(scoring="min")(upd, _qctx(upd))
    with pytest.raises(InvalidParameter, match="use scoring = 'min'"):
        Gauntlet()(upd, _qctx(upd, [1.0]))  # Templar's indicator needs the assigned batches
    with pytest.raises(InvalidParameter):
        Gauntlet(validators=None)
    assert Gauntlet.uses_server_data


def test_validator_reports_of_the_wrong_shape_are_refused():
    from defenses.gauntlet import Gauntlet
    from redteam.errors import InvalidParameter

    upd = torch.tensor([[1.0], [0.0]])
    for shape in ((2,), (1, 3)):
        ctx = _qctx(upd, [1.0], validator_reports=lambda ids, s, sh=shape: torch.zeros(sh))
        with pytest.raises(InvalidParameter, match=rf"returned shape \({shape[0]},"):
            Gauntlet(scoring="min", validators=3)(upd, ctx)


def test_ratings_when_every_score_is_out():
    r = update_ratings({}, [0, 1], torch.tensor([-float("inf"), 5.0]), 0.5, flagged={1})
    assert r == {0: -0.5, 1: -0.5}  # no finite, unflagged score: both −1


def test_gauntlet_weights_when_one_or_no_peer_is_kept_and_extra_attacker_seats():
    from defenses.gauntlet import Gauntlet

    upd = torch.tensor([[1.0], [0.0], [float("nan")]])
    dec = Gauntlet(scoring="min", alpha=1.0, top_g=1)(upd, _qctx(upd, [1.0]))
    assert float(dec.aggregate) == 1.0 and dec.weights.tolist() == [1.0, 0.0, 0.0]  # one peer kept: its row
    worse = torch.tensor([[3.0], [float("nan")]])  # both hurt the loss (or are not finite): nobody kept
    dec = Gauntlet(scoring="min", alpha=1.0)(worse, _qctx(worse, [1.0]))
    assert dec.accepted.tolist() == [False, False] and dec.weights.tolist() == [0.0, 0.0]
    assert dec.aggregate.tolist() == [0.0]  # zeros, not 0 · NaN
    # an attacker returning more reports than there are seats holds them all, no more
    ctx = _qctx(upd[:2], [1.0], validator_reports=lambda ids, s: torch.full((5, 2), 7.0))
    assert Gauntlet(scoring="min", validators=3)(upd[:2], ctx).state["scores"] == {0: 7.0, 1: 7.0}


def test_templar_indicator_average_and_flagged_scores():
    """β = 0.25: B ← 0.75·B + 0.25·b. Peer 0 improves its assigned batch (target 1) fully and the
    random one (target 2) by 3/4 of it: own 1 > rand 0.75 → b = +1; from B = 0.5, B = 0.625. Peer 1
    is flagged by commit-reveal (no commitment): its score is −inf and its b is −1."""
    from defenses.gauntlet import Gauntlet

    upd = torch.tensor([[1.0], [1.0]])
    ctx = _qctx(upd, [2.0], assigned=[[1.0], [1.0]], state={"bma": {0: 0.5, 1: 0.5}},
                commits={0: (row_digest(upd[0]), 0.5)})
    dec = Gauntlet(bma_alpha=0.25, commit_reveal=True)(upd, ctx)
    assert dec.state["bma"] == {0: 0.625, 1: 0.125}
    assert dec.state["scores"][1] == -float("inf") and dec.state["indicator"] == {0: 1.0, 1: -1.0}


# ---- whole-module run (issue 39): the survivors of every mutant of defenses/gauntlet.py ----


def test_openskill_update_ties_every_non_finite_score_at_the_last_place():
    """NaN, −inf and +inf all take the one last place, tied: (NaN, −inf, 1) rates as (−5, −5, 1)
    and (+inf, 1, 2) as (−5, 1, 2) (OpenSkill reads only the order of the scores)."""
    from defenses.gauntlet import openskill_update

    inf = float("inf")
    assert openskill_update({}, [0, 1, 2], torch.tensor([float("nan"), -inf, 1.0])) == openskill_update(
        {}, [0, 1, 2], torch.tensor([-5.0, -5.0, 1.0]))
    assert openskill_update({}, [0, 1, 2], torch.tensor([inf, 1.0, 2.0])) == openskill_update(
        {}, [0, 1, 2], torch.tensor([-5.0, 1.0, 2.0]))


def test_consensus_default_stake_share_is_one_half():
    """κ defaults to 0.5: four seats (4, 3, 2, 1) → the value three seats support, 2."""
    assert consensus_scores(torch.tensor([[4.0], [3.0], [2.0], [1.0]])).tolist() == [2.0]


def test_rating_scale_is_the_largest_finite_score_even_under_one_and_beside_a_zero():
    """Scores (0, 0.5), α = 1: the scale is 0.5, so ŝ = (0, 1) — not (0, 0.5), which a scale
    of 1 (a fallback taken too early) would give."""
    assert update_ratings({}, [0, 1], torch.tensor([0.0, 0.5]), 1.0) == {0: 0.0, 1: 1.0}
    assert update_ratings({}, [0, 1], torch.tensor([0.25, 0.5]), 1.0) == {0: 0.5, 1: 1.0}


def test_a_flagged_peer_with_a_positive_rating_is_not_paid():
    top, rew = top_g_rewards({0: 0.5, 1: 0.25}, [0, 1], 2, flagged={0})
    assert top == [1] and rew == {0: 0.0, 1: 1.0}


def test_a_digest_that_does_not_match_the_revealed_row_is_flagged_and_two_sharers_are_enough():
    upd = torch.tensor([[1.0], [2.0], [2.0]])
    commits = {0: (row_digest(torch.tensor([1.5])), 0.5), 1: (row_digest(upd[1]), 0.5),
               2: (row_digest(upd[2]), 0.5)}
    assert commit_flags(upd, [0, 1, 2], commits) == {
        0: "commit-reveal: revealed row does not match its committed digest",
        1: "commit-reveal: digest shared by 2 peers (one computation, several identities)",
        2: "commit-reveal: digest shared by 2 peers (one computation, several identities)"}


def test_gauntlet_refuses_a_missing_top_g_and_bma_alpha_over_one():
    from defenses.gauntlet import Gauntlet
    from redteam.errors import InvalidParameter

    for bad in ({"top_g": None}, {"bma_alpha": 1.5}):
        with pytest.raises(InvalidParameter):
            Gauntlet(**bad)


def test_gauntlet_min_keys_by_client_id_and_takes_the_smaller_of_both_batches():
    """Clients 10 and 11; L_R = (Δ − 2)², L_A = (Δ − aᵢ)² with a = (1, 4). Δ = (1, 3):
    sᴬ = (1 − 0, 16 − 1) = (1, 15), sᴿ = (4 − 1, 4 − 1) = (3, 3) → s = min = (1, 3). With
    random_batch = false, s = sᴬ = (1, 15). The random batch's "before" is the zero row's loss
    (4), not the last row's (1)."""
    from defenses.gauntlet import Gauntlet

    upd = torch.tensor([[1.0], [3.0]])
    ctx = _qctx(upd, [2.0], assigned=[[0.0]] * 10 + [[1.0], [4.0]], client_ids=(10, 11))  # a by client id
    dec = Gauntlet(scoring="min", alpha=1.0)(upd, ctx)
    assert dec.state["scores"] == {10: 1.0, 11: 3.0} and dec.state["per_client"] == ["rating"]
    assert Gauntlet(scoring="min", alpha=1.0, random_batch=False)(upd, ctx).state["scores"] == {10: 1.0, 11: 15.0}
    # random batch only: scores 4 − 1 = 3 for both rows
    assert Gauntlet(scoring="min")(upd, _qctx(upd, [2.0], client_ids=(10, 11))).state["scores"] == {10: 3.0, 11: 3.0}


def test_gauntlet_templar_scores_the_random_batch_and_a_new_peer_starts_at_b_zero():
    """Δ = 1, assigned target 1 (own = (1 − 0)/1 = 1), random target 2 (rand = (4 − 1)/4 = 0.75):
    score 0.75, b = +1 (1 > 0.75), B = 0 + 0.25·1 = 0.25 for a new peer (β = 0.25). Δ = 0.5 for
    peer 1: own = (1 − 0.25)/1 = 0.75, rand = (4 − 2.25)/4 = 0.4375 → b = +1 too. Peer 2,
    Δ = 1 with assigned target 3: own = (9 − 4)/9 = 5/9 < 0.75 = rand → b = −1, B = −0.25.
    Without the random batch the score is own and b compares own with 0."""
    from defenses.gauntlet import Gauntlet

    upd = torch.tensor([[1.0], [0.5], [1.0]])
    ctx = _qctx(upd, [2.0], assigned=[[1.0], [1.0], [3.0]])
    dec = Gauntlet(bma_alpha=0.25)(upd, ctx)
    assert dec.state["scores"] == {0: 0.75, 1: 0.4375, 2: 0.75}
    assert dec.state["indicator"] == {0: 1.0, 1: 1.0, 2: -1.0} and dec.state["bma"] == {0: 0.25, 1: 0.25, 2: -0.25}
    assert dec.state["per_client"] == ["rating", "skill", "bma"]
    dec = Gauntlet(bma_alpha=0.25, random_batch=False)(upd, ctx)
    assert dec.state["scores"] == pytest.approx({0: 1.0, 1: 0.75, 2: 5 / 9})
    assert dec.state["indicator"] == {0: 1.0, 1: 1.0, 2: 1.0}
    # no random batch at all (ctx.evaluate_loss None): the own improvement, whatever random_batch says
    dec = Gauntlet(bma_alpha=0.25)(upd, _qctx(upd, assigned=[[1.0], [1.0], [3.0]]))
    assert dec.state["scores"] == pytest.approx({0: 1.0, 1: 0.75, 2: 5 / 9})


def test_gauntlet_templar_rating_is_the_ordinal_times_the_positive_part_of_b():
    """One peer (no game: its OpenSkill rating is kept), prior (μ, σ) = (30, 2): ordinal
    μ − 3σ = 24; B from 0.5 with b = +1, β = 0.25 → 0.625; rating 24 · 0.625 = 15. Absent peer 9
    with (20, 5) and no B on record: 5 · max(0, 0) = 0."""
    from defenses.gauntlet import Gauntlet

    upd = torch.tensor([[1.0]])
    ctx = _qctx(upd, [2.0], assigned=[[1.0]], state={"skill": {0: [30.0, 2.0], 9: [20.0, 5.0]}, "bma": {0: 0.5}})
    dec = Gauntlet(bma_alpha=0.25)(upd, ctx)
    assert dec.state["skill"] == {0: [30.0, 2.0], 9: [20.0, 5.0]}
    assert dec.state["rating"] == {0: 15.0, 9: 0.0} and dec.accepted.tolist() == [True]


def test_one_validator_seat_held_by_the_attacker_is_its_report_and_a_minority_seat_is_not():
    from defenses.gauntlet import Gauntlet

    upd = torch.tensor([[1.0], [0.0]])  # random target 1: scores (1, 0)
    low = _qctx(upd, [1.0], validator_reports=lambda ids, s: torch.full((1, 2), -5.0))
    assert Gauntlet(scoring="min", validators=1)(upd, low).state["scores"] == {0: -5.0, 1: -5.0}
    # three seats, one the attacker's: two honest seats out of three carry the consensus (κ = 0.5)
    assert Gauntlet(scoring="min", validators=3)(upd, low).state["scores"] == {0: 1.0, 1: 0.0}
    # two honest seats and no attacker: their common report
    assert Gauntlet(scoring="min", validators=2)(upd, _qctx(upd, [1.0])).state["scores"] == {0: 1.0, 1: 0.0}


def test_gauntlet_weights_are_the_kept_peers_sample_weights_normalised_and_reasons():
    """Random target 1: scores (1, 0.75, −3), scale 3, α = 1 → ratings (1/3, 1/4, −1). Sample
    weights (0.25, 0.75, 1): with top_g = 1 only peer 0 is kept → weights (1, 0, 0) (0.25 / 0.25),
    aggregate its row; with top_g = 2 → (0.25, 0.75, 0) / 1, aggregate 0.25·1 + 0.75·0.5."""
    from defenses.gauntlet import Gauntlet

    upd = torch.tensor([[1.0], [0.5], [3.0]])  # random target 1: scores 1, 0.75, −3
    w = torch.tensor([0.25, 0.75, 1.0])
    dec = Gauntlet(scoring="min", alpha=1.0, top_g=1)(upd, _qctx(upd, [1.0], weights=w))
    assert dec.weights.tolist() == [1.0, 0.0, 0.0] and dec.aggregate.tolist() == [1.0]
    assert dec.reasons == {1: "Gauntlet: rating 0.25 (round score 0.75) not among the top 1 positive ratings",
                           2: "Gauntlet: rating -1 (round score -3) not among the top 1 positive ratings"}
    dec = Gauntlet(scoring="min", alpha=1.0, top_g=2)(upd, _qctx(upd, [1.0], weights=w))
    assert dec.weights.tolist() == [0.25, 0.75, 0.0] and dec.aggregate.tolist() == [0.625]


def test_a_non_finite_row_with_a_positive_rating_is_not_kept_and_a_flagged_one_says_why():
    """Peer 1's rating 0.9 from before survives one NaN round (α = 0.3: 0.63 − 0.3 = 0.33 > 0),
    but a non-finite row is never aggregated. Peer 2 is flagged (no commitment): its reason is
    commit-reveal's. A ctx.state of None is read as no state."""
    from defenses.gauntlet import Gauntlet

    upd = torch.tensor([[1.0], [float("nan")], [1.0]])
    ctx = _qctx(upd, [1.0], state={"rating": {1: 0.9, 2: 0.9}},
                commits={0: (row_digest(upd[0]), 0.5), 1: (row_digest(upd[1]), 0.5)})
    dec = Gauntlet(scoring="min", commit_reveal=True)(upd, ctx)
    assert dec.state["rating"][1] == pytest.approx(0.33)
    assert dec.accepted.tolist() == [True, False, False] and dec.aggregate.tolist() == [1.0]
    assert dec.reasons == {1: "non-finite update", 2: "commit-reveal: no commitment before the reveal"}
    ctx = _qctx(upd[:1], [1.0], state=None)
    assert Gauntlet(scoring="min", alpha=1.0)(upd[:1], ctx).state["rating"] == {0: 1.0}
