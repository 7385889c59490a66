"""NNM, bucketing and DP noise: worked examples, seeds, errors."""

from __future__ import annotations

import pytest
import torch

from defenses.basic import Mean
from defenses.dp import DPNoise
from defenses.krum import Krum
from defenses.median import Median
from defenses.mixing import NNM, Bucketing, nearest_neighbour_mixing
from redteam.errors import InvalidParameter
from redteam.pipeline import Pipeline
from redteam.types import ServerContext


def col(*values):
    return torch.tensor([[float(v)] for v in values])


def test_nnm_worked_example():
    # Points 0 1 3 10, f = 1 → each row becomes the mean of its n − f = 3 nearest (itself included):
    #   0: {0, 1, 3} → 4/3     1: {1, 0, 3} → 4/3     3: {3, 1, 0} → 4/3 (10 is 49 away, 0 only 9)
    #  10: {10, 3, 1} → 14/3
    x = col(0, 1, 3, 10)
    rows, w = NNM(f=1).transform(x, torch.ones(4), ServerContext.default(x))
    assert rows.flatten().tolist() == pytest.approx([4 / 3, 4 / 3, 4 / 3, 14 / 3])
    assert w.tolist() == [1.0, 1.0, 1.0, 1.0]
    # alone, NNM is followed by the weighted mean: (3·4/3 + 14/3)/4 = 13/6
    assert NNM(f=1)(x).aggregate.item() == pytest.approx(13 / 6)
    # followed by the median: rows 4/3 4/3 4/3 14/3 → midpoint of 4/3 and 4/3
    assert Pipeline((NNM(f=1), Median()))(x).aggregate.item() == pytest.approx(4 / 3)


def test_nnm_bounds_and_default():
    with pytest.raises(InvalidParameter, match=r"NNM.f = 2: must satisfy 2f < n \(n = 4, so f ≤ 1\)"):
        NNM(f=2)(torch.zeros(4, 2))
    with pytest.raises(InvalidParameter, match="NNM.f = -1"):
        NNM(f=-1)
    # default f = ⌈n/2⌉ − 1 = 2 for n = 5: each row is the mean of its 3 nearest
    x = col(0, 1, 2, 50, 51)
    rows, _ = NNM().transform(x, torch.ones(5), ServerContext.default(x))
    #  0: {0,1,2} → 1;  1: {1,0,2} → 1;  2: {2,1,0} → 1;  50: {50,51,2} → 103/3;  51: {51,50,2} → 103/3
    assert rows.flatten().tolist() == pytest.approx([1, 1, 1, 103 / 3, 103 / 3])


def test_nnm_keeps_itself_among_duplicates():
    x = col(5, 5, 5, 0)
    out = nearest_neighbour_mixing(x, 1)  # k = 1: every row is its own (only) neighbour
    assert torch.equal(out, x)


def test_bucketing_matches_its_shuffle():
    x = col(1, 10, 100, 1000, 10000)
    gen_seed = 7
    ctx = ServerContext.default(x, generator=torch.Generator().manual_seed(gen_seed))
    rows, w = Bucketing(s=2).transform(x, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), ctx)
    # the shuffle is torch.randperm(5) on a generator seeded 7; buckets are consecutive pairs
    perm = torch.randperm(5, generator=torch.Generator().manual_seed(gen_seed)).tolist()
    buckets = [perm[0:2], perm[2:4], perm[4:5]]
    values = [1, 10, 100, 1000, 10000]
    expect = [sum(values[i] for i in b) / len(b) for b in buckets]
    assert rows.flatten().tolist() == pytest.approx(expect)
    assert w.tolist() == [float(sum(i + 1 for i in b)) for b in buckets]


def test_bucketing_is_deterministic_under_the_seed_and_default_seed_zero():
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(3))
    a = Bucketing()(x, ServerContext.default(x, generator=torch.Generator().manual_seed(1)))
    b = Bucketing()(x, ServerContext.default(x, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(a.aggregate, b.aggregate)
    no_gen = ServerContext(n_clients=9, generator=None)
    c = Pipeline((Bucketing(), Median()))(x, no_gen)
    d = Pipeline((Bucketing(), Median()))(x, ServerContext.default(x, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(c.aggregate, d.aggregate)


def test_bucketing_then_krum_counts_buckets():
    # 10 updates in buckets of 2 → Krum sees 5 rows, so f = 1 is allowed (2·1 + 2 < 5) and f = 2 is not
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(0))
    assert Pipeline((Bucketing(s=2), Krum(f=1)))(x).aggregate.shape == (3,)
    with pytest.raises(InvalidParameter, match=r"Krum.f = 2: must satisfy 2f \+ 2 < n \(n = 5"):
        Pipeline((Bucketing(s=2), Krum(f=2)))(x)
    with pytest.raises(InvalidParameter, match="Bucketing.s = 0"):
        Bucketing(s=0)


def test_dp_noise_is_the_seeded_gaussian():
    x = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    ctx = ServerContext.default(x, generator=torch.Generator().manual_seed(11))
    out = DPNoise(sigma=0.5)(x, ctx).aggregate
    noise = torch.randn(3, generator=torch.Generator().manual_seed(11))
    # mean (2, 2, 2) plus 0.5·N(0, 1) from the same seed
    assert torch.allclose(out, torch.full((3,), 2.0) + 0.5 * noise)
    assert torch.equal(DPNoise(sigma=0.0)(x).aggregate, torch.full((3,), 2.0))


def test_dp_noise_after_an_aggregator_and_sigma_errors():
    x = torch.tensor([[1.0], [2.0], [100.0]])
    ctx = ServerContext.default(x, generator=torch.Generator().manual_seed(0))
    out = Pipeline((Median(), DPNoise(sigma=1.0)))(x, ctx).aggregate
    assert out.item() == pytest.approx(2.0 + torch.randn(1, generator=torch.Generator().manual_seed(0)).item())
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(InvalidParameter, match=r"DPNoise.sigma = .*: must be a finite number ≥ 0"):
            DPNoise(sigma=bad)


def test_dp_noise_statistics():
    x = torch.zeros(3, 200000)
    out = DPNoise(sigma=0.025)(x).aggregate
    assert out.mean().abs() < 1e-3 and out.std().item() == pytest.approx(0.025, rel=0.01)
    assert Mean()(x).aggregate.abs().max() == 0
