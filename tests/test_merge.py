"""Hierarchical merge: worked examples and the flat-FedAvg equivalence."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import redteam
from redteam.errors import InvalidParameter
from redteam.merge import Hierarchy, assign_groups, hierarchical_merge
from redteam.types import ServerContext


def _ctx(w, rows, key):
    return ServerContext(n_clients=len(rows), weights=w)


def _merge(updates, weights, hierarchy, defense="mean", seed=0):
    groups = assign_groups(list(range(updates.shape[0])), updates.shape[0], hierarchy, np.random.default_rng(seed))
    return hierarchical_merge(
        updates, weights, groups, redteam.defense(defense), redteam.defense("mean"), hierarchy.fan_out, _ctx
    ), groups


def test_two_groups_by_hand():
    # groups {0,1} and {2,3} ("region" grouping, fan-out 2, depth 2)
    # group A: weights 1,3 rows [4,0],[0,4]  -> (1*[4,0] + 3*[0,4]) / 4 = [1, 3], weight 4
    # group B: weights 2,2 rows [2,2],[6,6]  -> [4, 4], weight 4
    # root: (4*[1,3] + 4*[4,4]) / 8 = [2.5, 3.5]  == flat (4+0+4+12, 0+12+4+12)/8
    x = torch.tensor([[4.0, 0.0], [0.0, 4.0], [2.0, 2.0], [6.0, 6.0]])
    w = torch.tensor([1.0, 3.0, 2.0, 2.0])
    res, groups = _merge(x, w, Hierarchy(fan_out=2, depth=2, grouping="region"))
    assert groups == [[0, 1], [2, 3]]
    torch.testing.assert_close(res.aggregate, torch.tensor([2.5, 3.5]))
    assert res.accepted.all()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 70),
    fan_out=st.integers(2, 5),
    depth=st.integers(1, 3),
    grouping=st.sampled_from(["random", "region", "hash"]),
    seed=st.integers(0, 2**16),
)
def test_mean_everywhere_equals_flat_fedavg(n, fan_out, depth, grouping, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 50, generator=g)
    w = torch.randint(1, 100, (n,), generator=g).float()
    res, _ = _merge(x, w, Hierarchy(fan_out=fan_out, depth=depth, grouping=grouping), seed=seed)
    flat = (w @ x) / w.sum()
    torch.testing.assert_close(res.aggregate, flat, atol=1e-5, rtol=1e-5)


def test_fanout4_depth2_equals_flat_to_1e5():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 4810, generator=g) * 0.05
    w = torch.randint(10, 150, (20,), generator=g).float()
    res, groups = _merge(x, w, Hierarchy(fan_out=4, depth=2))
    assert len(groups) == 4 and sorted(r for gr in groups for r in gr) == list(range(20))
    assert float((res.aggregate - (w @ x) / w.sum()).abs().max()) < 1e-5


def test_rejections_inside_groups_are_reported_per_client():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [100.0, 0.0], [0.0, 1.0]])
    w = torch.ones(4)
    groups = [[0, 1], [2, 3]]
    res = hierarchical_merge(
        x, w, groups, redteam.defense("norm_bound", bound=2.0, mode="reject"), redteam.defense("mean"), 2, _ctx
    )
    assert res.accepted.tolist() == [True, True, False, True]
    assert "norm" in res.reasons[2]
    # group A mean [0.5,0.5] weight 2; group B only row 3 -> [0,1] weight 1 -> root [1/3, 2/3]
    torch.testing.assert_close(res.aggregate, torch.tensor([1 / 3, 2 / 3]))


def test_hash_grouping_is_stable_and_region_is_contiguous():
    h = Hierarchy(fan_out=2, depth=3, grouping="hash")
    a = assign_groups(list(range(12)), 12, h, np.random.default_rng(0))
    b = assign_groups(list(range(12)), 12, h, np.random.default_rng(99))
    assert a == b
    r = assign_groups(list(range(8)), 8, Hierarchy(fan_out=2, depth=3, grouping="region"), np.random.default_rng(0))
    assert r == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("kw", [{"fan_out": 1}, {"depth": 0}, {"grouping": "bogus"}])
def test_bad_hierarchy(kw):
    with pytest.raises(InvalidParameter):
        Hierarchy(**kw)


def test_non_finite_sub_aggregate_is_refused_and_the_rest_merge():
    # four bottom groups (fan-out 2, depth 3) with sub-aggregates 1, 3, 5 and 7 (weights 1);
    # group 3's leader passes up −inf·x (a rogue sub-aggregator): node 0.3 is refused;
    # level 1: (1+3)/2 = 2 with weight 2, and 5 with weight 1; root: (2·2 + 5·1)/3 = 3.
    # Every row stays accepted: the refusal is the merge's, not the defense's.
    from defenses.basic import Mean
    from redteam.merge import hierarchical_merge
    from redteam.types import ServerContext

    upd = torch.tensor([[1.0], [3.0], [5.0], [7.0]])
    w = torch.ones(4)
    res = hierarchical_merge(upd, w, [[0], [1], [2], [3]], Mean(), Mean(), 2,
                             lambda wts, rows, key: ServerContext(n_clients=int(wts.shape[0]), weights=wts),
                             lambda gi, rows, agg: agg * float("-inf") if gi == 3 else agg)
    assert bool(res.accepted.all())
    assert res.refused == {"0.3": {"reason": "non-finite sub-aggregate", "rows": [3]}}
    assert torch.allclose(res.aggregate, torch.tensor([3.0]))
