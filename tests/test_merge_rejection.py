"""Hierarchical merge: a group rejected at an upper level takes its clients with it.

Worked examples through the public ``hierarchical_merge`` signature; each node's
defense is a reject-mode norm bound, so every decision can be followed by hand.
"""

from __future__ import annotations

import torch

import redteam
from redteam.merge import hierarchical_merge
from redteam.types import ServerContext


def _ctx(w, rows, key):
    return ServerContext.default(torch.zeros(len(w), 1), weights=w)


def _merge(x, groups, bottom, upper, fan_out=2, tamper=None):
    x = torch.tensor(x, dtype=torch.float32)
    return hierarchical_merge(x, torch.ones(x.shape[0]), groups, bottom, upper, fan_out, _ctx, tamper)


MEAN = redteam.defense("mean")


def test_group_rejected_at_level_one_rejects_its_clients():
    # groups {0,1} and {2,3}; bottom: plain mean.
    #   A = mean([1,0], [0,1]) = [0.5, 0.5] (‖·‖ ≈ 0.71), weight 2
    #   B = mean([10,0], [10,0]) = [10, 0]   (‖·‖ = 10),   weight 2
    # upper: reject ‖·‖ > 2 → B rejected at level 1 → clients 2 and 3 not accepted;
    # root aggregate = A = [0.5, 0.5]
    res = _merge([[1, 0], [0, 1], [10, 0], [10, 0]], [[0, 1], [2, 3]], MEAN,
                 redteam.defense("norm_bound", bound=2.0, mode="reject"))
    assert res.accepted.tolist() == [True, True, False, False]
    for c in (2, 3):
        assert res.reasons[c] == "its group was rejected at merge level 1: norm 10 > bound 2"
    assert 0 not in res.reasons and 1 not in res.reasons
    torch.testing.assert_close(res.aggregate, torch.tensor([0.5, 0.5]))


def test_group_rejected_at_level_two_rejects_every_client_below_it():
    # four single-client groups, fan-out 2 → two levels above the bottom.
    # upper: adaptive reject bound M = 1.5 · lower median of the children's norms.
    # level 1, node (g0, g1): norms 1, 1 → M = 1.5, both kept → A = [0.5, 0.5], weight 2
    # level 1, node (g2, g3): norms 4, 5 → M = 6,   both kept → B = [4.5, 0],   weight 2
    # level 2 (root): norms 0.707…, 4.5 → lower median 0.707… → M ≈ 1.06 → B rejected
    # → clients 2 and 3 (accepted at levels 0 and 1) are rejected; aggregate = A
    upper = redteam.defense("norm_bound", multiplier=1.5, mode="reject")
    res = _merge([[1, 0], [0, 1], [4, 0], [5, 0]], [[0], [1], [2], [3]], MEAN, upper)
    assert res.accepted.tolist() == [True, True, False, False]
    assert res.reasons[2].startswith("its group was rejected at merge level 2: norm 4.5 > bound 1.06")
    assert res.reasons[3] == res.reasons[2]
    torch.testing.assert_close(res.aggregate, torch.tensor([0.5, 0.5]))
    assert set(res.state) == {"0.0", "0.1", "0.2", "0.3", "1.0", "1.1", "2.0"}


def test_bottom_rejection_reason_survives_a_group_rejection():
    # bottom: reject ‖·‖ > 8; upper: reject ‖·‖ > 2.
    # group {0,1}: both kept → [0.5, 0.5]. group {2,3}: [10,0] rejected at the bottom
    # ("norm 10 > bound 8"), [6,0] kept → B = [6, 0], weight 1 → rejected at level 1.
    # client 2 keeps its own reason, client 3 gets the group's.
    res = _merge([[1, 0], [0, 1], [10, 0], [6, 0]], [[0, 1], [2, 3]],
                 redteam.defense("norm_bound", bound=8.0, mode="reject"),
                 redteam.defense("norm_bound", bound=2.0, mode="reject"))
    assert res.accepted.tolist() == [True, True, False, False]
    assert res.reasons[2] == "norm 10 > bound 8"
    assert res.reasons[3] == "its group was rejected at merge level 1: norm 6 > bound 2"


def test_a_tampered_group_aggregate_rejected_upstairs_rejects_its_members():
    # honest rows everywhere; the leader of group 1 replaces its aggregate with [0, 50]
    # → rejected at level 1 (‖·‖ = 50 > 2) → its members 2, 3 are not accepted.
    def tamper(gi, rows, agg):
        return torch.tensor([0.0, 50.0]) if gi == 1 else agg

    res = _merge([[1, 0], [0, 1], [1, 1], [0, 1]], [[0, 1], [2, 3]], MEAN,
                 redteam.defense("norm_bound", bound=2.0, mode="reject"), tamper=tamper)
    assert res.accepted.tolist() == [True, True, False, False]
    torch.testing.assert_close(res.aggregate, torch.tensor([0.5, 0.5]))


def test_every_group_rejected_gives_a_zero_aggregate_and_no_accepted_client():
    res = _merge([[9, 0], [9, 0], [0, 9], [0, 9]], [[0, 1], [2, 3]], MEAN,
                 redteam.defense("norm_bound", bound=2.0, mode="reject"))
    assert res.accepted.tolist() == [False] * 4
    torch.testing.assert_close(res.aggregate, torch.zeros(2))
