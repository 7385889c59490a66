"""Worked examples for the compression-aware attacks: neurotoxin, sparse_capture, scale_inflation, ef_flush."""

from __future__ import annotations

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.types import AttackContext


def make_ctx(honest, own, *, previous=None, seed=0) -> AttackContext:
    honest = torch.as_tensor(honest, dtype=torch.float32)
    own = torch.as_tensor(own, dtype=torch.float32)
    f = own.shape[0]
    n = honest.shape[0] + f
    return AttackContext(
        round=1, n_clients=n, malicious=tuple(range(n - f, n)), own_updates=own,
        visible_updates=honest, global_params=torch.zeros(own.shape[1]),
        generator=torch.Generator().manual_seed(seed),
        previous_update=None if previous is None else torch.as_tensor(previous, dtype=torch.float32),
    )


def test_neurotoxin_masks_the_benign_top_k():
    # the after-training variant (the per-step default is in test_attacks_training.py)
    # previous global update (5, −1, 0.5, −4, 2); top ⌈0.4·5⌉ = 2 by magnitude: indices 0 and 3
    ctx = make_ctx([[0.0] * 5], [[1.0] * 5, [2.0] * 5], previous=[5.0, -1.0, 0.5, -4.0, 2.0])
    out = redteam.attack("neurotoxin", topk_fraction=0.4, masking="after_training").craft_updates(ctx)
    assert out.tolist() == [[0.0, 1.0, 1.0, 0.0, 1.0], [0.0, 2.0, 2.0, 0.0, 2.0]]
    # default 1 %: ⌈0.05⌉ = 1 coordinate (index 0) masked
    assert redteam.attack("neurotoxin", masking="after_training").craft_updates(ctx)[0].tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    # round 0 (no previous update): nothing to estimate from, the update passes unchanged
    assert torch.equal(redteam.attack("neurotoxin", masking="after_training").craft_updates(make_ctx([[0.0]], [[3.0]])), torch.tensor([[3.0]]))
    with pytest.raises(InvalidParameter, match=r"Neurotoxin\.topk_fraction = 1\.0: must be in \[0, 1\)"):
        redteam.attack("neurotoxin", topk_fraction=1.0)


def test_sparse_capture_worked_example():
    # k = ⌈0.5·4⌉ = 2. Honest top-2 supports: {0,1}, {0,2}, {0,2} → coverage (3, 1, 2, 0).
    # Fewest senders: coordinate 3 (0), then 1 (1). Honest means there: 0.1 and 5/3 → push −.
    # Own top-2 magnitudes of (1, −3, 0, 2): 3 and 2, mean 2.5.
    honest = [[5.0, 4.0, 0.0, 0.1], [3.0, 0.0, -6.0, 0.2], [-4.0, 1.0, 2.0, 0.0]]
    ctx = make_ctx(honest, [[1.0, -3.0, 0.0, 2.0]])
    out = redteam.attack("sparse_capture", k_fraction=0.5).craft_updates(ctx)
    assert out.tolist() == [[0.0, -2.5, 0.0, -2.5]]
    assert redteam.attack("sparse_capture", k_fraction=0.5, scale=2.0).craft_updates(ctx).tolist() == [
        [0.0, -5.0, 0.0, -5.0]]
    with pytest.raises(InvalidParameter, match=r"SparseCapture\.k_fraction = 0\.0: must be in \(0, 1\]"):
        redteam.attack("sparse_capture", k_fraction=0)


def test_scale_inflation_one_huge_value():
    own = torch.tensor([[0.5, -1.0, 0.25], [0.1, 0.2, 0.3]])
    out = redteam.attack("scale_inflation", factor=100.0).craft_updates(make_ctx([[0.0] * 3], own))
    # max |own| = 1 → one coordinate per row becomes ±100, the others are unchanged
    for row, orig in zip(out, own):
        big = row.abs() == 100.0
        assert int(big.sum()) == 1 and torch.equal(row[~big], orig[~big])
    with pytest.raises(InvalidParameter, match=r"ScaleInflation\.coordinates = 0: must be an integer ≥ 1"):
        redteam.attack("scale_inflation", coordinates=0)


def test_ef_flush_multiplies():
    out = redteam.attack("ef_flush", rounds=4).craft_updates(make_ctx([[0.0, 0.0]], [[0.5, -1.0]]))
    assert out.tolist() == [[2.0, -4.0]]
    with pytest.raises(InvalidParameter, match=r"EFFlush\.rounds = 0: must be an integer ≥ 1"):
        redteam.attack("ef_flush", rounds=0)
