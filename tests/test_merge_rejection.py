"""Hierarchical merge: a group rejected at an upper level takes its clients with it.

Worked examples through the public ``hierarchical_merge`` signature; each node's
defense is a reject-mode norm bound, so every decision can be followed by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.merge import (
    Hierarchy,
    assign_groups,
    group_of_identity,
    hierarchical_merge,
)
from redteam.pipeline import Aggregator
from redteam.types import Decision, ServerContext


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
    assert res.groups == [[0, 1], [2, 3]] and res.refused == {}
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
    # the record is complete: why each client went, the groups, each node's state
    assert res.reasons == {c: "its group was rejected at merge level 1: norm 9 > bound 2" for c in range(4)}
    assert res.groups == [[0, 1], [2, 3]] and set(res.state) == {"0.0", "0.1", "1.0"}
    assert res.state["1.0"] == {"bound": 2.0} and res.refused == {}
    x64 = torch.tensor([[9.0, 0.0], [0.0, 9.0]], dtype=torch.float64)
    res = hierarchical_merge(x64, torch.ones(2, dtype=torch.float64), [[0], [1]], MEAN,
                             redteam.defense("norm_bound", bound=2.0, mode="reject"), 2, _ctx)
    assert res.aggregate.dtype == torch.float64 and res.aggregate.tolist() == [0.0, 0.0]


# -- the rest of the merge's public behaviour (each pinned by hand) ---------------------------------
class _RejectOdd(Aggregator):
    """Rejects odd rows without giving a reason; aggregate = mean of the rest."""

    def decide(self, updates, ctx):
        keep = torch.arange(updates.shape[0]) % 2 == 0
        return Decision(aggregate=updates[keep].mean(dim=0), accepted=keep, state={"n": int(keep.sum())})


def test_flat_merge_reports_reasons_groups_and_state():
    # one group: the defense's own decision; a rejection without a reason is named after
    # the defense's class
    x = torch.tensor([[1.0, 0.0], [5.0, 5.0], [3.0, 0.0]])
    res = hierarchical_merge(x, torch.ones(3), [[0, 1, 2]], _RejectOdd(), MEAN, 2, _ctx)
    assert res.accepted.tolist() == [True, False, True]
    assert res.reasons == {1: "rejected by _RejectOdd"}
    assert res.groups == [[0, 1, 2]] and res.state == {"0.0": {"n": 2}} and res.refused == {}
    torch.testing.assert_close(res.aggregate, torch.tensor([2.0, 0.0]))


def test_empty_merge():
    res = hierarchical_merge(torch.zeros(0, 3), torch.zeros(0), [], MEAN, MEAN, 2, _ctx)
    assert res.aggregate.tolist() == [0.0, 0.0, 0.0] and res.aggregate.dtype == torch.float32
    assert res.accepted.tolist() == [] and res.accepted.dtype == torch.bool
    assert res.reasons == {} and res.groups == [] and res.state == {}


def test_node_keys_rows_and_state_per_node():
    # groups {0,1}, {2}, {3}; fan-out 2: level 1 has nodes (g0, g1) and (g2); level 2 the root.
    seen = []

    def ctx(w, rows, key):
        seen.append((key, list(rows), w.tolist()))
        return _ctx(w, rows, key)

    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 4.0]])
    res = hierarchical_merge(x, torch.tensor([1.0, 3.0, 2.0, 2.0]), [[0, 1], [2], [3]],
                             redteam.defense("norm_bound", bound=10.0, mode="reject"), MEAN, 2, ctx)
    # bottom: g0 = (1·[1,0] + 3·[3,0])/4 = [2.5, 0] weight 4; g1 = [0,2] w 2; g2 = [0,4] w 2
    # level 1: (g0, g1) → (4·[2.5,0] + 2·[0,2])/6 = [5/3, 2/3] w 6; (g2) → [0,4] w 2
    # root: (6·[5/3, 2/3] + 2·[0, 4])/8 = [10/8, 12/8] = [1.25, 1.5]
    assert seen == [("0.0", [0, 1], [1.0, 3.0]), ("0.1", [2], [2.0]), ("0.2", [3], [2.0]),
                    ("1.0", [0, 1, 2], [4.0, 2.0]), ("1.1", [3], [2.0]), ("2.0", [0, 1, 2, 3], [6.0, 2.0])]
    assert res.state["0.0"] == {"bound": 10.0} and res.state["2.0"] == {}
    torch.testing.assert_close(res.aggregate, torch.tensor([1.25, 1.5]))


def test_tamper_hook_sees_its_group_and_is_cast_and_checked():
    calls = []

    def tamper(gi, rows, agg):
        calls.append((gi, rows))
        return agg.double() * 2  # float64 comes back as the aggregate's float32

    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    res = hierarchical_merge(x, torch.ones(3), [[0, 1], [2]], MEAN, MEAN, 2, _ctx, tamper)
    assert calls == [(0, [0, 1]), (1, [2])]
    # (2·[0.5,0.5]·2 + 1·[1,1]·2)/3 = [4/3, 4/3]
    assert res.aggregate.dtype == torch.float32
    torch.testing.assert_close(res.aggregate, torch.tensor([4 / 3, 4 / 3]))
    for bad, shape in ((torch.zeros(3), "(3,)"), ("nope", "()")):
        with pytest.raises(InvalidParameter) as ei:
            hierarchical_merge(x, torch.ones(3), [[0, 1], [2]], MEAN, MEAN, 2, _ctx, lambda g, r, a, b=bad: b)
        assert str(ei.value) == f"tamper_group returned {shape} for group 0, expected (2,)"


def test_a_non_finite_sub_aggregate_is_refused():
    # group 1's leader passes up NaN: the root never sees it (aggregate = group 0's mean)
    def tamper(gi, rows, agg):
        return torch.full_like(agg, float("nan")) if gi == 1 else agg

    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    res = hierarchical_merge(x, torch.ones(3), [[0, 1], [2]], MEAN, MEAN, 2, _ctx, tamper)
    assert res.refused == {"0.1": {"reason": "non-finite sub-aggregate", "rows": [2]}}
    torch.testing.assert_close(res.aggregate, torch.tensor([0.5, 0.5]))


# -- groups ----------------------------------------------------------------------------------------------
def test_group_of_identity_by_hand():
    # SHA-256 of the decimal id, first 8 bytes big-endian, mod 4 = the low 2 bits of byte 8:
    # "0" → …6f38 (0x38: 0), "1" → …fce1 (1), "2" → …16ee (2), "3" → …db8b (3), "alice" → …00af (3)
    assert [group_of_identity(s, 4) for s in ("0", "1", "2", "3", "alice")] == [0, 1, 2, 3, 3]


def test_hash_grouping_uses_public_names():
    h = Hierarchy(fan_out=4, depth=2, grouping="hash")
    rng = np.random.default_rng(0)
    assert assign_groups([0, 1, 2, 3], 4, h, rng) == [[0], [1], [2], [3]]
    # client 0 renamed "alice" (group 3) joins client 3; unnamed clients keep their ids
    assert assign_groups([0, 1, 2, 3], 4, h, rng, identities={0: "alice"}) == [[1], [2], [0, 3]]


def test_random_grouping_is_balanced_and_region_contiguous():
    rng = np.random.default_rng(5)
    groups = assign_groups(list(range(12)), 12, Hierarchy(fan_out=4, depth=2), rng)
    assert sorted(len(g) for g in groups) == [3, 3, 3, 3]
    assert sorted(r for g in groups for r in g) == list(range(12))
    # region: client id c of n goes to c·g // n: ids 0-2 → 0, 3-5 → 1, … (positions returned)
    region = assign_groups([11, 0, 5, 6], 12, Hierarchy(fan_out=4, depth=2, grouping="region"), rng)
    assert region == [[1], [2], [3], [0]]


def test_flat_grouping_consumes_no_randomness_and_handles_no_clients():
    h = Hierarchy(fan_out=4, depth=1)
    rng, fresh = np.random.default_rng(9), np.random.default_rng(9)
    assert assign_groups(list(range(5)), 5, h, rng) == [[0, 1, 2, 3, 4]]
    assert rng.random() == fresh.random()
    assert assign_groups([], 5, Hierarchy(fan_out=2, depth=3), rng) == []


@pytest.mark.parametrize("kw, msg", [
    ({"fan_out": 1}, "Hierarchy.fan_out = 1: must be an integer ≥ 2"),
    ({"depth": 9}, "Hierarchy.depth = 9: must be an integer in [1, 8]"),
    ({"depth": 0}, "Hierarchy.depth = 0: must be an integer in [1, 8]"),
    ({"grouping": "ring"}, "Hierarchy.grouping = 'ring': must be 'random', 'region' or 'hash'"),
])
def test_hierarchy_messages(kw, msg):
    with pytest.raises(InvalidParameter) as ei:
        Hierarchy(**kw)
    assert str(ei.value) == msg
    assert Hierarchy(depth=8).n_groups == 4 ** 7


class _NaNAbove(Aggregator):
    """Mean of the children, NaN when any child's first coordinate exceeds 100."""

    def decide(self, updates, ctx):
        w = ctx.weights / ctx.weights.sum()
        agg = w @ updates
        if bool((updates[:, 0] > 100).any()):
            agg = torch.full_like(agg, float("nan"))
        return Decision(aggregate=agg, accepted=torch.ones(updates.shape[0], dtype=torch.bool))


def test_upper_rejection_without_a_reason_names_the_rule_and_drops_its_weight():
    # four single-row groups, fan-out 2. Level 1 rejects g1 (‖[0,9]‖ = 9 > 5):
    #   A = g0 = [3, 0] with weight 1 (g1's weight is dropped), B = mean(g2, g3) = [0, 1.5], w 2
    # root: (1·[3,0] + 2·[0,1.5]) / 3 = [1, 1]
    x = torch.tensor([[3.0, 0.0], [0.0, 9.0], [0.0, 3.0], [0.0, 0.0]])
    res = _merge(x.tolist(), [[0], [1], [2], [3]], MEAN,
                 redteam.defense("norm_bound", bound=5.0, mode="reject"))
    assert res.accepted.tolist() == [True, False, True, True]
    torch.testing.assert_close(res.aggregate, torch.tensor([1.0, 1.0]))
    # a rule that gives no reason is named by its class
    res = hierarchical_merge(x, torch.ones(4), [[0, 1], [2, 3]], MEAN, _RejectOdd(), 2, _ctx)
    assert res.reasons[2] == res.reasons[3] == "its group was rejected at merge level 1: _RejectOdd"


def test_a_non_finite_upper_aggregate_is_refused_below_the_root_and_kept_at_the_root():
    # four groups, fan-out 2: node 1.1 (g2, g3) sees a first coordinate > 100 and returns NaN:
    # refused, with the rows it covers; the root averages node 1.0 alone: [0.5, 0.5]
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [200.0, 0.0], [0.0, 1.0]])
    res = hierarchical_merge(x, torch.ones(4), [[0], [1], [2], [3]], MEAN, _NaNAbove(), 2, _ctx)
    assert res.refused == {"1.1": {"reason": "non-finite sub-aggregate", "rows": [2, 3]}}
    torch.testing.assert_close(res.aggregate, torch.tensor([0.5, 0.5]))
    # at the root itself nothing is refused: the NaN goes to the server step, which refuses it
    # (group {2, 3} averages to [100, 0.5]: its row 2 is doubled so the mean exceeds 100)
    x[2, 0] = 400.0
    res = hierarchical_merge(x, torch.ones(4), [[0, 1], [2, 3]], MEAN, _NaNAbove(), 2, _ctx)
    assert res.refused == {} and bool(torch.isnan(res.aggregate).all())


def test_empty_merge_keeps_the_dtype():
    res = hierarchical_merge(torch.zeros(0, 2, dtype=torch.float64), torch.zeros(0, dtype=torch.float64),
                             [], MEAN, MEAN, 2, _ctx)
    assert res.aggregate.dtype == torch.float64
