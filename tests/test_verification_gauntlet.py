"""Issue 25: the Gauntlet-style validator, commit-reveal and its ledger, the incentive-gaming
attacks. Hand-made cases whose results are derived in the comments."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
import torch

from attacks.verification import CopyNoise, LazyScaled, ScoreGaming
from defenses.gauntlet import (Gauntlet, commit_flags, relative_improvement, round_scores, row_digest,
                               templar_indicator, top_g_rewards, update_ratings)
from redteam.scoring import reward_metrics
from redteam.types import AttackContext, ClientData, RoundRecord, ServerContext


def _ctx(updates, assigned_target, random_target, **kw):
    """Losses are quadratic: L_A,i(w + Δ) = ‖Δ − aᵢ‖², L_R(w + Δ) = ‖Δ − r‖² (w = 0)."""
    a = torch.as_tensor(assigned_target, dtype=torch.float64)
    r = torch.as_tensor(random_target, dtype=torch.float64)

    def ev(deltas):
        return ((deltas.to(torch.float64) - r) ** 2).sum(1)

    def ev_a(deltas, clients):
        return ((deltas.to(torch.float64) - a[list(clients)]) ** 2).sum(1)

    return ServerContext.default(updates, evaluate_loss=ev, evaluate_loss_assigned=ev_a, **kw)


def test_round_scores_by_hand():
    # s_A = 5 − 1 = 4, s_R = 3 − 2 = 1 → min 1; second: s_A = 1, s_R = 3 − 0 = 3 → 1; NaN → −inf
    s = round_scores(torch.tensor([5.0, 5.0, 5.0]), torch.tensor([1.0, 4.0, float("nan")]), 3.0,
                     torch.tensor([2.0, 0.0, 1.0]))
    assert s.tolist() == [1.0, 1.0, -float("inf")]
    assert round_scores(torch.tensor([5.0]), torch.tensor([1.0]), None, None).tolist() == [4.0]


def test_ratings_and_rewards_by_hand():
    # scores (2, 1, −4, −inf): scale 4 → ŝ = (0.5, 0.25, −1, −1); α = 0.5 from r = (0, 0.5, 0, 0)
    r = update_ratings({1: 0.5}, [0, 1, 2, 3], torch.tensor([2.0, 1.0, -4.0, -float("inf")]), 0.5)
    assert r == {0: 0.25, 1: 0.375, 2: -0.5, 3: -0.5}
    top, rew = top_g_rewards(r, [0, 1, 2, 3], 2)
    assert top == [0, 1] and rew == {0: 0.25 / 0.625, 1: 0.375 / 0.625, 2: 0.0, 3: 0.0}
    top, rew = top_g_rewards(r, [0, 1, 2, 3], 1)  # only the best: peer 1 takes the pool
    assert top == [1] and rew[1] == 1.0
    top, rew = top_g_rewards(r, [0, 1, 2, 3], 2, flagged={1})
    assert top == [0] and rew[0] == 1.0 and rew[1] == 0.0


def test_gauntlet_scores_rates_and_pays_the_work():
    # 1-D model, w = 0. Honest peers 0, 1 move to their targets; peer 2 overfits its assigned
    # target a₂ = 3 which is far from the random batch's target r = 1; peer 3 sends nothing.
    # Peer 0: L_A 1 → 0 (s_A 1), L_R 1 → 0 (s_R 1): s = 1. Peer 1: same. Peer 2: Δ = 3:
    # s_A = 9 − 0 = 9, s_R = 1 − 4 = −3 → s = −3. Peer 3: Δ = 0: s = 0.
    upd = torch.tensor([[1.0], [1.0], [3.0], [0.0]])
    ctx = _ctx(upd, [[1.0], [1.0], [3.0], [1.0]], [1.0])
    dec = Gauntlet(top_g=2, alpha=0.5, scoring="min")(upd, ctx)
    assert dec.state["scores"] == {0: 1.0, 1: 1.0, 2: -3.0, 3: 0.0}
    # scale 3: ŝ = (1/3, 1/3, −1, 0), r = ŝ/2
    assert dec.state["rating"] == pytest.approx({0: 1 / 6, 1: 1 / 6, 2: -0.5, 3: 0.0})
    assert dec.accepted.tolist() == [True, True, False, False]
    assert dec.state["rewards"] == {0: 0.5, 1: 0.5, 2: 0.0, 3: 0.0}
    assert float(dec.aggregate) == 1.0
    # without the random batch the overfitting peer scores s = 9 and takes most of the pool
    dec = Gauntlet(top_g=2, alpha=0.5, random_batch=False, scoring="min")(upd, ctx)
    assert dec.state["scores"][2] == 9.0
    assert dec.accepted.tolist() == [True, False, True, False]  # ŝ = (1/9, 1/9, 1, 0): ties → lower row
    assert dec.state["rewards"][2] == pytest.approx((0.5) / (0.5 + 1 / 18))
    # the rating carries over: next round peer 2 is honest (s = 1 like the others) but starts at −0.5
    dec1 = Gauntlet(top_g=2, alpha=0.5, scoring="min")(upd, ctx)
    ctx2 = _ctx(upd, [[1.0], [1.0], [1.0], [1.0]], [1.0], state=dec1.state)
    upd2 = torch.tensor([[1.0], [1.0], [1.0], [1.0]])
    dec2 = Gauntlet(top_g=2, alpha=0.5, scoring="min")(upd2, ctx2)
    assert dec2.state["rating"][2] == pytest.approx(-0.25 + 0.5)  # 0.5·(−0.5) + 0.5·1
    assert dec2.state["rating"][0] == pytest.approx(1 / 12 + 0.5)


def test_commit_reveal_flags_late_wrong_and_shared_digests():
    upd = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [5.0, 6.0], [7.0, 8.0]])
    d = [row_digest(r) for r in upd]
    commits = {0: (d[0], 0.2), 1: (d[1], 1.4), 2: (d[2], 0.3), 3: (d[4], 0.5)}  # 4: none
    flags = commit_flags(upd, [0, 1, 2, 3, 4], commits)
    assert sorted(flags) == [0, 1, 2, 3, 4]
    assert "after the commit window" in flags[1]
    assert "shared by 2 peers" in flags[0] and "shared by 2 peers" in flags[2]
    assert "does not match" in flags[3] and "no commitment" in flags[4]
    assert commit_flags(upd[:2], [0, 1], {0: (d[0], 0.1), 1: (d[1], 0.9)}) == {}
    # in the defense: a flagged peer is not aggregated, gets ŝ = −1 and no reward
    ctx = _ctx(upd[:2, :1], [[1.0], [3.0]], [2.0], commits={0: (row_digest(upd[0, :1]), 0.1),
                                                             1: (row_digest(upd[1, :1]), 1.5)})
    dec = Gauntlet(top_g=2, alpha=1.0, commit_reveal=True, scoring="min")(upd[:2, :1], ctx)
    assert dec.accepted.tolist() == [True, False] and dec.state["rating"][1] == -1.0
    assert dec.state["rewards"] == {0: 1.0, 1: 0.0}


def test_reward_metrics_by_hand():
    # round 0: peers 0..3, 1 malicious paid 0.5 → ratio 0.5/0.25 = 2; round 1: paid 0 → 0; mean 0.25/0.25 = 1
    recs = [RoundRecord(round=k, accuracy=0, loss=0, accepted=[True] * 4, malicious=[False, True, False, False],
                        participating=[True] * 4, extra={"rewards": {0: 0.5, 1: p, 2: 0.0, 3: 0.5 - p}})
            for k, p in enumerate((0.5, 0.0))]
    assert reward_metrics(recs) == {"reward_share": 0.25, "cheat_reward_ratio": 1.0}
    assert reward_metrics(recs[:0]) == {"reward_share": None, "cheat_reward_ratio": None}


def _actx(own, honest, seed=0):
    return AttackContext(round=0, n_clients=own.shape[0] + honest.shape[0], malicious=tuple(range(own.shape[0])),
                         own_updates=own, visible_updates=honest, global_params=torch.zeros(own.shape[1]),
                         generator=torch.Generator().manual_seed(seed))


def test_attacks_by_hand():
    honest = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 6.0, 8.0]])
    own = torch.zeros(2, 4)
    out = CopyNoise(noise=0.0).craft_updates(_actx(own, honest))
    assert all(any(torch.equal(r, h) for h in honest) for r in out)
    noisy = CopyNoise(noise=0.01).craft_updates(_actx(own, honest))
    # each row is within ~σ‖x‖ of a victim (noise std σ‖x‖/√d per coordinate, d = 4)
    assert all(min(float((r - h).norm() / h.norm()) for h in honest) < 0.05 for r in noisy)
    # noise_mode = "spread": the unit is the honest rows' spread. Two honest rows [0, 0] and
    # [2, 4]: per-coordinate variances (unbiased) 2 and 8, mean 5, spread √5; σ = 1 adds noise
    # of std √5 per coordinate, so ‖copy − victim‖² averages d·5 = 10 over many draws
    pair = torch.tensor([[0.0, 0.0], [2.0, 4.0]])
    many = torch.zeros(4000, 2)
    sp = CopyNoise(noise=1.0, noise_mode="spread").craft_updates(_actx(many, pair))
    # averaged over both honest rows h: E‖c − h‖² = 10 (noise) + ‖h0 − h1‖²/2 (half the time h is
    # not the victim) = 20
    assert abs(float((sp - pair[0]).pow(2).sum(1).mean() + (sp - pair[1]).pow(2).sum(1).mean()) / 2
               - (10.0 + 20.0 / 2)) < 1.0
    one = CopyNoise(noise=1.0, noise_mode="spread").craft_updates(_actx(own, honest[:1]))
    assert torch.equal(one, honest[:1].expand(2, -1))  # one honest peer: no spread, an exact copy
    with pytest.raises(Exception, match="noise_mode"):
        CopyNoise(noise_mode="absolute")
    assert torch.equal(LazyScaled(steps=1, scale=5.0).craft_updates(_actx(torch.ones(1, 4), honest)),
                       torch.full((1, 4), 5.0))
    assert LazyScaled(steps=2).training_hook(_actx(own, honest)).steps == 2
    data = ClientData(torch.arange(100.0)[:, None], torch.arange(100))
    kept = ScoreGaming(page=32).poison_data(data, 0, torch.Generator())
    assert kept.y.tolist() == list(range(32))


_BASE = """
[scenario]
name = "v"
seed = {seed}
[workload]
name = "digits"
[federation]
clients = 10
malicious_fraction = 0.2
rounds = 6
local_steps = 5
batch_size = 16
lr = 0.1
partition = "iid"
[attack]
name = "{attack}"
[defense]
name = "gauntlet"
top_g = 5
commit_reveal = {cr}
"""


def _run(attack, cr="false", seed=0):
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    return Federation(parse_scenario(tomllib.loads(_BASE.format(attack=attack, cr=cr, seed=seed)))).run()


def test_commit_reveal_in_the_federation_and_the_ledger_verifies(tmp_path):
    from redteam.federation.commitments import late_commitments, read_commitments, write_commitment_ledger

    res = _run("copy_noise", "true")
    mal = set(res.malicious)
    for r in res.records:
        assert sum(r.extra["rewards"][c] for c in mal) == 0.0
        assert {c for c, v in r.extra["commitments"].items() if v["time"] > 1.0} == mal
        assert all(not r.accepted[c] and "commit-reveal" in r.rejected[c] for c in mal)
    path = tmp_path / "commitments.sqlite"
    n = write_commitment_ledger(path, [(r.round, r.extra["commitments"]) for r in res.records], seed=0)
    assert n == 10 * len(res.records)
    # independently verifiable with the project's CLI, as the provenance artefacts are
    out = subprocess.run([sys.executable, "-m", "redteam.cli", "ledger", "verify", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "ledger OK: 60 entries" in out.stdout
    late = late_commitments(path)
    assert {c["client"] for c in late} == mal and len(late) == 2 * len(res.records)
    back = {(c["round"], c["client"]): c["digest"] for c in read_commitments(path)}
    assert back[(0, res.malicious[0])] == res.records[0].extra["commitments"][res.malicious[0]]["digest"]


def test_honest_run_under_commit_reveal_flags_nobody():
    res = _run("none", "true")
    assert all(not r.extra["flags"] for r in res.records)
    assert all(v["time"] < 1.0 for r in res.records for v in r.extra["commitments"].values())


def test_lazy_peer_is_paid_less_than_its_share():
    res = _run("lazy_scaled")
    assert reward_metrics(res.records)["cheat_reward_ratio"] < 0.5


def test_consensus_of_validator_seats_by_hand():
    from defenses.gauntlet import consensus_scores

    s = torch.tensor([[1.0, 5.0, 0.0], [2.0, -1.0, 0.0], [3.0, 2.0, 0.0]])
    # κ = 0.5 and 3 seats: the largest value more than 1.5 seats support = the median of each column
    assert consensus_scores(s).tolist() == [2.0, 2.0, 0.0]
    # 2 seats: more than 1 seat must support it: the lower of the two
    assert consensus_scores(s[:2]).tolist() == [1.0, -1.0, 0.0]
    # κ = 0: one seat suffices: the largest; ties count as support
    assert consensus_scores(s, 0.0).tolist() == [3.0, 5.0, 0.0]
    assert consensus_scores(torch.tensor([[1.0], [1.0], [0.0]])).tolist() == [1.0]


def test_colluding_seats_move_the_consensus_only_with_a_majority():
    # the round above (honest scores 1, 1, −3, 0); peer 2 is the cheat, and the colluding seats
    # report +3 for it and −3 for everyone else (the largest |score| of the round)
    upd = torch.tensor([[1.0], [1.0], [3.0], [0.0]])
    cheat = LazyScaled(validator_seats=2)

    def ctx_with(seats):
        att = LazyScaled(validator_seats=seats)
        return _ctx(upd, [[1.0], [1.0], [3.0], [1.0]], [1.0],
                    validator_reports=lambda peers, scores: att.report_scores(peers, scores, (2,)))

    assert cheat.report_scores((0, 1, 2, 3), torch.tensor([1.0, 1.0, -3.0, 0.0]), (2,)).tolist() == \
        [[-3.0, -3.0, 3.0, -3.0]] * 2
    one_of_three = Gauntlet(top_g=2, alpha=0.5, validators=3)(upd, ctx_with(1))
    assert one_of_three.state["scores"] == {0: 1.0, 1: 1.0, 2: -3.0, 3: 0.0}  # the honest median
    assert one_of_three.state["rewards"][2] == 0.0
    two_of_three = Gauntlet(top_g=2, alpha=0.5, validators=3)(upd, ctx_with(2))
    assert two_of_three.state["scores"] == {0: -3.0, 1: -3.0, 2: 3.0, 3: -3.0}
    assert two_of_three.state["rewards"][2] == 1.0 and two_of_three.accepted.tolist() == [False, False, True, False]
    # one validator that colludes is the consensus; without reports, V seats agree with one
    alone = Gauntlet(top_g=2, alpha=0.5)(upd, ctx_with(1))
    assert alone.state["rewards"][2] == 1.0
    plain = Gauntlet(top_g=2, alpha=0.5, validators=3)(upd, _ctx(upd, [[1.0], [1.0], [3.0], [1.0]], [1.0]))
    assert plain.state["scores"] == one_of_three.state["scores"]


def test_colluding_seats_in_the_federation():
    """Through the engine: 2 of 3 seats colluding pay the lazy cheats the whole pool; 1 of 3
    pays them nothing (the first round already shows it)."""
    import redteam.federation.loop as L
    from redteam.scenario import parse_scenario

    def run(seats):
        doc = {"scenario": {"seed": 0}, "workload": {"name": "digits"},
               "federation": {"clients": 10, "malicious_fraction": 0.2, "rounds": 2, "local_steps": 5,
                              "batch_size": 16, "partition": "iid"},
               "attack": {"name": "lazy_scaled", "validator_seats": seats},
               "defense": {"name": "gauntlet", "top_g": 5, "validators": 3, "scoring": "min"}}
        return reward_metrics(L.Federation(parse_scenario(doc)).run().records)["cheat_reward_ratio"]

    assert run(1) == 0.0 and run(2) == pytest.approx(5.0)


def test_templar_scoring_by_hand():
    # issue 33 §2: Templar's validator. 1-D model, w = 0, random target r = 1.
    # peer 0 (assigned 2, Δ = 1): L_A 4 → 1, own = 0.75; L_R 1 → 0, rand = 1   → b = −1
    # peer 1 (assigned 3, Δ = 3): L_A 9 → 0, own = 1;    L_R 1 → 4, rand = −3  → b = +1 (trained on its own data)
    # peer 2 (assigned 1, Δ = 0.5): L_A 1 → 0.25, own = 0.75; L_R same, rand = 0.75 → b = −1 (no gap)
    upd = torch.tensor([[1.0], [3.0], [0.5]])
    ctx = _ctx(upd, [[2.0], [3.0], [1.0]], [1.0])
    assert relative_improvement(torch.tensor([4.0, 9.0, 1.0]), torch.tensor([1.0, 0.0, 0.25])).tolist() == [
        0.75, 1.0, 0.75]
    assert templar_indicator(torch.tensor([0.75, 1.0, 0.75]), torch.tensor([1.0, -3.0, 0.75])).tolist() == [
        -1.0, 1.0, -1.0]
    dec = Gauntlet(top_g=2)(upd, ctx)  # scoring = "templar" is the default
    assert dec.state["scores"] == {0: 1.0, 1: -3.0, 2: 0.75}  # the random batch's relative improvement
    assert dec.state["indicator"] == {0: -1.0, 1: 1.0, 2: -1.0}
    assert dec.state["bma"] == pytest.approx({0: -0.05, 1: 0.05, 2: -0.05})  # β = 0.05
    # the rating: one Plackett–Luce game (openskill's defaults), places by score 0 > 2 > 1
    from openskill.models import PlackettLuce

    m = PlackettLuce()
    games = m.rate([[m.rating()], [m.rating()], [m.rating()]], scores=[1.0, -3.0, 0.75])
    want = {c: (t[0].mu, t[0].sigma) for c, t in enumerate(games)}
    assert {c: tuple(v) for c, v in dec.state["skill"].items()} == pytest.approx(want)
    # final = ordinal · max(0, B): only peer 1 has B > 0, and its ordinal (last place) is negative
    ordinal1 = want[1][0] - 3 * want[1][1]
    assert ordinal1 < 0 and dec.state["rating"] == pytest.approx({0: 0.0, 1: ordinal1 * 0.05, 2: 0.0})
    assert dec.accepted.tolist() == [False, False, False] and set(dec.state["rewards"].values()) == {0.0}
    # a second window in which every peer repeats: peer 0 keeps winning the games but its indicator
    # stays −1, so it is never paid; the rule pays only a peer with B > 0 and a positive ordinal
    state = dec.state
    for _ in range(40):
        state = Gauntlet(top_g=2)(upd, _ctx(upd, [[2.0], [3.0], [1.0]], [1.0], state=state)).state
    assert state["rating"][0] == 0.0 and state["bma"][0] < 0 and state["skill"][0][0] > state["skill"][1][0]


def test_templar_pays_a_peer_that_improves_its_own_batch_and_the_random_one():
    # two honest peers whose own batches improve more than the random one (b = +1, positive rand) and a
    # copier whose own batch improves no more than the random one (b = −1): only the honest are paid
    upd = torch.tensor([[1.0], [1.2], [1.1]])
    ctx = _ctx(upd, [[1.0], [1.2], [0.0]], [1.1])  # copier (peer 2): assigned 0, it sent another's update
    state: dict = {}
    for _ in range(30):
        dec = Gauntlet(top_g=3)(upd, _ctx(upd, [[1.0], [1.2], [0.0]], [1.1], state=state))
        state = dec.state
    assert dec.state["indicator"][2] == -1.0 and dec.state["rewards"][2] == 0.0
    assert dec.state["rewards"][0] + dec.state["rewards"][1] == pytest.approx(1.0)
    # the earlier rule ("min") pays that copier, whose smaller improvement is on its own batch
    mdec = Gauntlet(top_g=3, scoring="min")(upd, ctx)
    assert mdec.state["scores"][2] < 0

