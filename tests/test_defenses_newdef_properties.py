"""DnC, FLAME, FLDetector, RLR, SignGuard, SparseFed under broad draws: the contract kit on
every kind of input it knows (ties, outliers, all-zero rows, rows near the overflow of the
dtype) at magnitudes 1e-30 … 1e30, and non-finite rows rejected with a reason."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import redteam
from redteam.testing import check_defense, make_server_context, make_updates
from redteam.testing.builders import DEFENSE_KINDS

NEW = [
    ("dnc", {}), ("dnc", {"f": 1, "b": 3, "niters": 2}),
    ("flame", {}), ("flame", {"space": "models", "lam": 0.0}),
    ("fldetector", {"window": 1}),
    ("rlr", {}), ("rlr", {"theta": 1, "weighted": False}),
    ("signguard", {}), ("signguard", {"clustering": "dbscan", "coordinate_fraction": 1.0}),
    ("sparsefed", {}), ("sparsefed", {"k": 2, "reduce": "sum"}),
]

matrices = st.builds(
    lambda n, d, seed, kind, scale, dtype: make_updates(seed, n, d, kind=kind, scale=scale, dtype=dtype),
    n=st.integers(2, 12), d=st.integers(1, 40), seed=st.integers(0, 2**16),
    kind=st.sampled_from(DEFENSE_KINDS), scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]),
    dtype=st.sampled_from(["float32", "float64"]),
)


@pytest.mark.parametrize("name, params", NEW)
@settings(max_examples=12, deadline=None)
@given(x=matrices, seed=st.integers(0, 100))
def test_contract_on_broad_draws(name, params, x, seed):
    if not bool(torch.isfinite(x).all()):  # a draw scaled past the dtype's range is not a finite input
        return
    check_defense(name, params=params, updates=x, ctx=make_server_context(x, seed))


@pytest.mark.parametrize("name, params", NEW)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 10), d=st.integers(1, 20))
def test_nonfinite_rows_are_rejected_with_a_reason(name, params, seed, n, d):
    x = make_updates(seed, n, d, finite=False)
    bad = [i for i in range(n) if not bool(torch.isfinite(x[i]).all())]
    dec = redteam.DEFENSES.create(name, params)(x, make_server_context(x, seed))
    assert all(not bool(dec.accepted[i]) and "non-finite" in dec.reasons[i] for i in bad)
    if len(bad) < n:
        assert bool(torch.isfinite(dec.aggregate).all())
