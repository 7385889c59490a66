import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redteam.errors import InvalidParameter
from redteam.federation.partition import partition

LABELS = np.repeat(np.arange(10), 50)  # 500 samples, 50 per class


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(["iid", "dirichlet", "shards", "quantity"]), n=st.integers(1, 40), seed=st.integers(0, 999))
def test_disjoint_cover_min_size_and_deterministic(kind, n, seed):
    parts = partition(LABELS, n, kind, np.random.default_rng(seed), alpha=1.0)
    again = partition(LABELS, n, kind, np.random.default_rng(seed), alpha=1.0)
    assert len(parts) == n
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx)) == len(LABELS)  # disjoint and covering
    assert min(len(p) for p in parts) >= 2
    assert all((a == b).all() for a, b in zip(parts, again))


def test_iid_sizes_equal():
    parts = partition(LABELS, 5, "iid", np.random.default_rng(0))
    assert [len(p) for p in parts] == [100] * 5


def test_shards_two_labels_each():
    # 10 clients x 2 shards of 25 sorted samples: each shard lies inside one class,
    # so every client sees at most two labels (McMahan et al. 2017's pathological split)
    parts = partition(LABELS, 10, "shards", np.random.default_rng(3), shards_per_client=2)
    assert all(len(np.unique(LABELS[p])) <= 2 for p in parts)
    assert all(len(p) == 50 for p in parts)


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def mean_labels(alpha):
        parts = partition(LABELS, 10, "dirichlet", np.random.default_rng(0), alpha=alpha)
        return np.mean([len(np.unique(LABELS[p])) for p in parts])

    assert mean_labels(0.05) < mean_labels(100.0)
    assert mean_labels(100.0) == 10


@pytest.mark.parametrize(
    "kind,kw,msg",
    [("nope", {}, "kind"), ("dirichlet", {"alpha": 0}, "alpha"), ("quantity", {"beta": -1}, "beta")],
)
def test_bad_parameters(kind, kw, msg):
    with pytest.raises(InvalidParameter, match=msg):
        partition(LABELS, 4, kind, np.random.default_rng(0), **kw)


def test_too_few_samples():
    with pytest.raises(InvalidParameter, match="cannot give"):
        partition(LABELS[:10], 8, "iid", np.random.default_rng(0))


def test_label_sorted_by_hand():
    # labels [2, 0, 1, 0, 2, 1]: stable argsort = [1, 3, 2, 5, 0, 4]; three contiguous
    # shards [1, 3], [2, 5], [0, 4] → client 0 holds the 0s, client 1 the 1s, client 2 the 2s
    from redteam.federation.partition import partition

    labels = np.array([2, 0, 1, 0, 2, 1])
    parts = partition(labels, 3, "label_sorted", np.random.default_rng(0), min_samples=1)
    assert [p.tolist() for p in parts] == [[1, 3], [2, 5], [0, 4]]


def test_deal_iid_overlap_by_hand():
    # 4 clients, client 3 malicious: the honest 0, 1, 2 split the label-sorted pool of 8
    # (shards of 3, 3, 2: [0,1,2] [3,4,5] [6,7] of the sorted order); client 3 draws
    # ⌊8/4⌋ = 2 items from all 8 (overlapping the honest shards)
    from redteam.federation.partition import deal

    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    parts = deal(labels, 4, [3], "label_sorted", "iid_overlap", np.random.default_rng(0), min_samples=1)
    assert [p.tolist() for p in parts[:3]] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert len(parts[3]) == 2 and len(set(parts[3].tolist())) == 2 and set(parts[3].tolist()) <= set(range(8))
    same = deal(labels, 4, [3], "label_sorted", "partition", np.random.default_rng(0), min_samples=1)
    assert [p.tolist() for p in same] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_deal_rejects_unknown_rule():
    from redteam.errors import InvalidParameter
    from redteam.federation.partition import deal

    with pytest.raises(InvalidParameter, match="malicious_data = 'all'"):
        deal(np.zeros(8), 2, [1], "iid", "all", np.random.default_rng(0))
