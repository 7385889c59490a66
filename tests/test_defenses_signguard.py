"""SignGuard (Xu et al., ICDCS 2022): norm window, sign-statistics clusters, clipping."""

from __future__ import annotations

import math

import pytest
import torch

from defenses.signguard import SignGuard, estimate_bandwidth, sign_statistics
from redteam.errors import InvalidParameter
from redteam.types import ServerContext

# Five 4-D updates, sign statistics on all coordinates (coordinate_fraction = 1):
#   rows 0, 1, 2, 4 are all positive -> (1, 0, 0); row 3 is all negative -> (0, 0, 1).
# Norms: √30, √7, √7, √7, 80 -> median M = √7. Window [0.1·√7, 3·√7] = [0.26, 7.94]: row 4 is out.
# Bandwidth: k = max(2, ⌊0.3·5⌋) = 2 -> distance to the nearest other vector: 0 for the four
#   positive rows, √2 for row 3 -> mean √2/5 ≈ 0.283 < √2, so MeanShift finds two clusters and
#   the largest is {0, 1, 2, 4}.
# S = window ∩ cluster = {0, 1, 2}. Row 0 is clipped to √7 (factor √(7/30)), rows 1, 2 are kept:
#   aggregate = (√(7/30)·(1, 2, 3, 4) + (2, 1, 1, 1) + (1, 1, 2, 1)) / 3.
X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 1.0, 1.0], [1.0, 1.0, 2.0, 1.0], [-1.0, -1.0, -1.0, -2.0],
                  [40.0, 40.0, 40.0, 40.0]], dtype=torch.float64)


def test_worked_example():
    dec = SignGuard(coordinate_fraction=1.0)(X)
    f = math.sqrt(7 / 30)
    expected = [(f * a + b + c) / 3 for a, b, c in zip([1, 2, 3, 4], [2, 1, 1, 1], [1, 1, 2, 1])]
    assert dec.accepted.tolist() == [True, True, True, False, False]
    assert dec.aggregate.tolist() == pytest.approx(expected, rel=1e-12)
    assert dec.state["median_norm"] == pytest.approx(math.sqrt(7))
    assert dec.state["bandwidth"] == pytest.approx(math.sqrt(2) / 5)
    assert "outside the largest MeanShift cluster" in dec.reasons[3]
    assert "norm 80 outside [0.1, 3] × median norm 2.64575" in dec.reasons[4]
    assert dec.weights.tolist() == pytest.approx([f / 3, 1 / 3, 1 / 3, 0.0, 0.0])


def test_sign_statistics_and_bandwidth_by_hand():
    x = torch.tensor([[1.0, 0.0, -2.0, 3.0], [0.0, 0.0, 0.0, -1.0]])
    # row 0: 2 positive, 1 zero, 1 negative of 4; row 1: 0, 3, 1
    assert sign_statistics(x).tolist() == [[0.5, 0.25, 0.25], [0.0, 0.75, 0.25]]
    # on columns 1 and 3 only: row 0 (0, 3) -> (1/2, 1/2, 0); row 1 (0, −1) -> (0, 1/2, 1/2)
    assert sign_statistics(x, torch.tensor([1, 3])).tolist() == [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]]
    # two vectors at distance √(0.5² + 0.5²): k = 2 -> both nearest-other distances are √0.5
    f = sign_statistics(x)
    assert estimate_bandwidth(f, 0.3) == pytest.approx(math.sqrt(0.5))


def test_coordinate_subset_comes_from_the_generator():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 200, generator=g)
    dec = SignGuard()(x)
    assert dec.state["coordinates"] == 20  # ⌈0.1 · 200⌉
    a = SignGuard()(x, ServerContext.default(x, generator=torch.Generator().manual_seed(5)))
    b = SignGuard()(x, ServerContext.default(x, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(a.aggregate, b.aggregate)


def test_sign_flipped_minority_is_rejected():
    # 7 honest rows around a common positive direction, 3 sign-flipped copies
    g = torch.Generator().manual_seed(0)
    honest = 1.0 + 0.3 * torch.randn(7, 500, generator=g)
    x = torch.cat([honest, -honest[:3]])
    dec = SignGuard()(x)
    assert dec.accepted.tolist() == [True] * 7 + [False] * 3


def test_identical_rows_form_one_cluster_and_nonfinite_is_rejected():
    x = torch.tensor([[1.0, -2.0, 0.5]] * 4 + [[math.nan, 0.0, 0.0]])
    dec = SignGuard(coordinate_fraction=1.0)(x)
    assert dec.accepted.tolist() == [True] * 4 + [False] and dec.reasons == {4: "non-finite update"}
    assert dec.aggregate.tolist() == pytest.approx([1.0, -2.0, 0.5])
    big = torch.full((5, 6), 3.0e38)
    assert bool(torch.isfinite(SignGuard()(big).aggregate).all())


def test_parameters_are_checked():
    with pytest.raises(InvalidParameter, match=r"SignGuard.upper = 0.05: must be ≥ lower = 0.1"):
        SignGuard(upper=0.05)
    with pytest.raises(InvalidParameter, match=r"SignGuard.coordinate_fraction = 0"):
        SignGuard(coordinate_fraction=0)
    with pytest.raises(InvalidParameter, match=r"SignGuard.bandwidth = -1"):
        SignGuard(bandwidth=-1)


def test_mean_shift_by_hand_and_against_scikit_learn():
    import warnings

    import numpy as np
    from sklearn.cluster import MeanShift
    from sklearn.metrics import adjusted_rand_score

    from defenses.signguard import mean_shift

    # bandwidth 1: seeds in {0, 0.1, 0.2} converge to their mean 0.1, seeds in {5, 5.1} to 5.05
    x = torch.tensor([[0.0], [0.1], [5.0], [0.2], [5.1]], dtype=torch.float64)
    lab = mean_shift(x, 1.0).tolist()
    assert lab[0] == lab[1] == lab[3] != lab[2] == lab[4]
    rng = np.random.default_rng(0)
    for _ in range(5):
        pts = np.concatenate([rng.normal(0, 0.05, (15, 3)), rng.normal(0.5, 0.05, (6, 3)), rng.random((4, 3))])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = MeanShift(bandwidth=0.15).fit(pts).labels_
        assert adjusted_rand_score(ref, mean_shift(torch.tensor(pts), 0.15).numpy()) == 1.0


def test_dbscan_by_hand_and_as_signguard_option():
    from defenses.signguard import dbscan

    # 1-D points 0, 0.1, 0.2, 1, 5, 5.1 with eps 0.15 (neighbourhoods include the point itself):
    #   min_samples 2: 0 {0, .1}, .1 {0, .1, .2}, .2 {.1, .2}, 5 {5, 5.1}, 5.1 {5, 5.1} are cores;
    #   1 {1} is not and has no core neighbour -> clusters {0, .1, .2}, {5, 5.1}, noise {1}
    #   min_samples 3: only .1 is a core; 0 and .2 are its border points; 1, 5, 5.1 are noise
    x = torch.tensor([[0.0], [0.1], [0.2], [1.0], [5.0], [5.1]], dtype=torch.float64)
    two = dbscan(x, 0.15, 2).tolist()
    assert two[0] == two[1] == two[2] != two[4] == two[5] and two[3] == -1 and min(two[:3] + two[4:]) >= 0
    three = dbscan(x, 0.15, 3).tolist()
    assert three[0] == three[1] == three[2] >= 0 and three[3:] == [-1, -1, -1]
    # the worked example: the lone all-negative row has only itself within eps = √2/5 -> noise
    dec = SignGuard(coordinate_fraction=1.0, clustering="dbscan")(X)
    assert dec.accepted.tolist() == [True, True, True, False, False]
    assert "sign statistics are DBSCAN noise" in dec.reasons[3]
    with pytest.raises(InvalidParameter, match=r"SignGuard.clustering = 'kmeans'"):
        SignGuard(clustering="kmeans")


def test_float64_rows_near_overflow_decide_like_their_rescaled_copies():
    # norms of rows ~1.4e307 overflow float64 when squared; they are measured rescaled
    scale = 2.0**1015
    dec = SignGuard(coordinate_fraction=1.0)(X * scale)
    f = math.sqrt(7 / 30)
    expected = [(f * a + b + c) / 3 for a, b, c in zip([1, 2, 3, 4], [2, 1, 1, 1], [1, 1, 2, 1])]
    assert dec.accepted.tolist() == [True, True, True, False, False]
    assert (dec.aggregate / scale).tolist() == pytest.approx(expected, rel=1e-12)
