"""Defenses that cannot be steered: Krum-type ties, the pairwise kernel's error bound.

Issue 9 §1: a tie tolerance relative to the *largest* score let far outliers make every
honest score "tie" with a bad update's, and the tie was then broken by a key the
attacker controls. Issue 13 §1: the float32 pairwise kernel must give the selection
exact distances give.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from defenses.krum import Bulyan, Krum, MultiKrum
from defenses.mixing import NNM, nearest_neighbour_mixing
from redteam.testing import make_updates


def col(*values):
    return torch.tensor([[float(v)] for v in values])


# Honest 0, .1, .2, .3, .4; a bad update at −100; two far outliers at 1e18.
# Krum with n = 8, f = 2 → n − f − 2 = 4 neighbours. Scores (squared distances):
#   0.0: .01 + .04 + .09 + .16 = .30     0.1: .01 + .01 + .04 + .09 = .15
#   0.2: .01 + .01 + .04 + .04 = .10     0.3: .15     0.4: .30
#  −100: 100² + 100.1² + 100.2² + 100.3² = 40120.14  (≈ 4·10⁵ × the minimum)
#  1e18: 0 (its twin) + three distances ≈ 1e36
# The minimum is 0.2's. A tolerance of 1e-9 × the largest score (≈ 3e36) made every
# score below 3e27 a "tie", and the tie then went to the smallest Σx: the bad row.
STEER = col(0.0, 0.1, 0.2, 0.3, 0.4, -100.0, 1e18, 1e18)


def test_far_outliers_cannot_make_krum_pick_a_bad_update():
    dec = Krum(f=2)(STEER)
    assert dec.state["selected"] == [2]
    assert dec.aggregate.tolist() == pytest.approx([0.2])
    assert not bool(dec.accepted[5])


def test_far_outliers_cannot_make_multi_krum_pick_a_bad_update():
    # m = 2: 0.2 (score .10), then 0.1 and 0.3 tie exactly at .15 in real arithmetic;
    # in float32 0.1 and 0.3 are not symmetric about 0.2, so either may be the lower;
    # the bad row (40120.14) must not be among the two.
    dec = MultiKrum(f=2, m=2)(STEER)
    assert sorted(dec.state["selected"])[0] in (1, 2) and 5 not in dec.state["selected"]
    assert 0.14 <= float(dec.aggregate) <= 0.26


def test_far_outliers_cannot_make_bulyan_pick_a_bad_update():
    # Honest 0, .1, …, .8 (9 rows), the bad row −100, outliers at ±1e18: n = 12, f = 2,
    # θ = 8, β = 4. At every step r = 12 … 5 (k = max(r − 4, 1) neighbours) the bad row's
    # score is ≥ 99.2² ≈ 9841 while the best honest row's is below 8 × .8² ≈ 5.1, and the
    # outliers' are ≈ 1e36, so the 8 picks are honest. (Twin outliers would legitimately
    # win the last step, where k = 1 and a twin scores 0.)
    x = torch.cat([torch.arange(9.0)[:, None] / 10, col(-100.0, 1e18, -1e18)])
    dec = Bulyan(f=2)(x)
    assert not bool(dec.accepted[9:].any()) and int(dec.accepted.sum()) == 8
    assert 0.0 <= float(dec.aggregate) <= 0.8


def _exact_distances(x: torch.Tensor) -> torch.Tensor:
    """Squared distances from the difference rows in float64 (exact differences of
    float32 values; a sum of non-negative terms), independent of the kernel."""
    x64 = x.to(torch.float64)
    return torch.stack([(x64 - x64[i]).square().sum(dim=1) for i in range(x.shape[0])])


def _exact_scores(x: torch.Tensor, k: int) -> torch.Tensor:
    dist = _exact_distances(x)
    dist.fill_diagonal_(math.inf)
    return torch.topk(dist, k, dim=1, largest=False).values.sum(dim=1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_h=st.integers(4, 9), d=st.integers(1, 6),
       n_out=st.integers(1, 3), exponent=st.integers(6, 36), dtype=st.sampled_from(["float32", "float64"]),
       kind=st.sampled_from(["gaussian", "clustered", "duplicates", "sparse"]), where=st.integers(0, 2**16))
def test_adding_far_outliers_never_changes_the_krum_pick(seed, n_h, d, n_out, exponent, dtype, kind, where):
    # Krum with k = n_h − 2 neighbours: with the outliers far away, every honest row's k
    # nearest are honest, so its score does not change; the outliers' scores are huge.
    # So the honest row selected must be the same with and without the outliers, and its
    # score must be the true minimum (exact float64 distances of the difference rows)
    # up to float64 rounding.
    honest = make_updates(seed, n_h, d, dtype=dtype, kind=kind)
    k = n_h - 2
    g = torch.Generator().manual_seed(seed)
    far = torch.randn(n_out, d, generator=g, dtype=torch.float64)
    # distinct magnitudes 10^e, 4·10^e, 16·10^e: far from the honest rows *and* from each
    # other (a tight group of outliers would be a legitimate Krum pick)
    far = far / far.norm(dim=1, keepdim=True).clamp_min(1e-300) * 10.0 ** exponent
    far = (far * (4.0 ** torch.arange(n_out, dtype=torch.float64))[:, None]).to(honest.dtype)
    x = honest.clone()
    pos = list(range(n_h))
    for r in range(n_out):  # insert each outlier at a drawn position
        at = (where >> (3 * r)) % (x.shape[0] + 1)
        x = torch.cat([x[:at], far[r:r + 1], x[at:]])
        pos = [p + (p >= at) for p in pos]
    alone = Krum(f=0, neighbours=k)(honest)
    mixed = Krum(f=0, neighbours=k)(x)
    picked = mixed.state["selected"][0]
    assert picked in pos, "an outlier was selected"
    assert pos.index(picked) == alone.state["selected"][0]
    true = _exact_scores(honest.to(torch.float64), k)
    assert float(true[pos.index(picked)]) <= float(true.min()) * (1 + 1e-12) + 1e-300


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 12), d=st.integers(1, 700),
       kind=st.sampled_from(["gaussian", "clustered", "duplicates", "zeros", "outlier", "sparse", "identical"]),
       scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30, 3e38]), dtype=st.sampled_from(["float32", "float64"]))
def test_pairwise_bound_holds(seed, n, d, kind, scale, dtype):
    from defenses._pairwise import pairwise

    # The kernel's promise: |approx − exact| ≤ error for every pair, exact from the
    # difference rows in float64 (relative error ≤ (d + 2)·2⁻⁵³, allowed for here).
    x = make_updates(seed, n, d, dtype=dtype, kind=kind, scale=min(scale, 1e300))
    if dtype == "float32":
        x = torch.nan_to_num(x, posinf=3.4e38, neginf=-3.4e38)
    pd = pairwise(x)
    exact = _exact_distances(x)
    slack = exact * (d + 3) * 2.0 ** -53
    assert bool(((pd.approx - exact).abs() <= pd.error + slack).all())
    # the float64 tier (Gram of the rows minus one row; some rows, then all) keeps the promise
    if bool(pd.finite.all()):
        some = pd.recentred(n // 2, torch.arange(0, n, 2))
        assert bool(((some.approx - exact).abs() <= some.error + slack).all())
        every = some.recentred(n - 1)
        assert bool(((every.approx - exact).abs() <= every.error + slack).all()) and every.passes == 2
        assert bool((every.error <= pd.error).all())
    # bitwise-equal rows share a group and have distance exactly 0
    for a in range(n):
        for b in range(n):
            if torch.equal(x[a], x[b]):
                assert int(pd.group[a]) == int(pd.group[b]) and float(pd.approx[a, b]) == 0.0


def _alie(n: int, f: int, d: int, seed: int, z: float) -> torch.Tensor:
    """n − f honest float32 rows around a shared direction, f ALIE rows at μ − z·σ."""
    honest = make_updates(seed, n - f, d, kind="clustered")
    mu, sigma = honest.mean(dim=0), honest.std(dim=0)
    bad = (mu - z * sigma).expand(f, d)
    return torch.cat([honest, bad])


@pytest.mark.parametrize("z", [0.0, 0.05, 0.5, 1.0])
def test_alie_at_d_1e5_gives_the_exact_krum_selection(z):
    # The float32 Gram loses distances of ALIE rows (close to the mean, ‖·‖ ≫ spread);
    # the kernel must still select what exact float64 distances select.
    n, f, d = 20, 4, 100_000
    x = _alie(n, f, d, seed=3, z=z)
    k = n - f - 2
    exact = _exact_scores(x, k)
    dec = Krum(f=f)(x)
    picked = dec.state["selected"][0]
    assert float(exact[picked]) <= float(exact.min()) * (1 + 1e-12)
    best = int(torch.argmin(exact))
    assert torch.equal(x[picked], x[best]) or float(exact[picked]) == float(exact[best])
    # Multi-Krum's m = n − f best are the exact m best (up to exact ties)
    chosen = MultiKrum(f=f)(x).state["selected"]
    cut = torch.sort(exact).values[n - f - 1]
    assert all(float(exact[i]) <= float(cut) * (1 + 1e-12) for i in chosen)


def test_sq_distances_are_float64_accurate_for_nearby_large_vectors():
    from defenses._pairwise import sq_distances

    # Float32 vectors of norm 32·√1000 that differ by 2⁻¹⁰ in one coordinate: the squared
    # distance is 2⁻²⁰, ~1e-12 of the squared norms: below float32 Gram resolution.
    base = torch.full((1, 1000), 32.0)
    x = torch.cat([base, base, base])
    x[1, 0] += 2.0 ** -10
    d = sq_distances(x)
    assert d[0, 1].item() == 2.0 ** -20 and d[0, 2].item() == 0.0


def test_nnm_mixes_copies_of_one_neighbour_set_identically():
    # 0, 1, 2, 10, 11 with k = 3: rows 0, 1, 2 all mix {0, 1, 2} → 1 (bitwise the same
    # row, so a Krum after NNM cannot tell clients 0, 1, 2 apart by rounding);
    # 10 → {10, 11, 2} → 23/3, 11 → {11, 10, 2} → 23/3.
    out = nearest_neighbour_mixing(col(0, 1, 2, 10, 11), 3)
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2]) and torch.equal(out[3], out[4])
    assert out.flatten().tolist() == pytest.approx([1, 1, 1, 23 / 3, 23 / 3])


def test_nnm_then_krum_credits_every_copy():
    from redteam.pipeline import Pipeline

    # continuing: Krum (f = 1, 2 neighbours) on 1, 1, 1, 23/3, 23/3 scores the three
    # copies of 1 with 0: all three clients contributed the selected row.
    dec = Pipeline((NNM(), Krum()))(col(0, 1, 2, 10, 11))
    assert dec.aggregate.tolist() == pytest.approx([1.0])
    assert dec.accepted.tolist() == [True, True, True, False, False]


# -- finite in, finite out ---------------------------------------------------------------
PARAMS = {"trimmed_mean": {"b": 2}}
HUGE_OK = ["mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan", "geometric_median",
           "centered_clipping", "nnm", "bucketing", "clip", "norm_bound", "cosine_filter", "sanity",
           "zscore", "fltrust", "foolsgold", "loss_check", "dp_noise"]


@pytest.mark.parametrize("name", HUGE_OK)
def test_rows_near_the_float32_overflow_give_a_finite_aggregate(name):
    # 9 float32 rows of ±3e38 entries (a sum of two overflows float32): the mean of such
    # rows is representable, and every rule here averages, selects or clips rows, so the
    # aggregate must be finite (and within ±3.4028e38).
    import redteam
    from redteam.testing import make_server_context

    g = torch.Generator().manual_seed(5)
    signs = torch.where(torch.rand(9, 4, generator=g) < 0.3, -1.0, 1.0)
    x = (3e38 * signs * (0.9 + 0.1 * torch.rand(9, 4, generator=g))).to(torch.float32)
    dec = redteam.defense(name, **PARAMS.get(name, {}))(x, make_server_context(x, 1))
    assert bool(torch.isfinite(dec.aggregate).all()), dec.aggregate


@pytest.mark.parametrize("name", ["mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan",
                                  "geometric_median", "centered_clipping", "fltrust", "foolsgold", "sanity"])
def test_nonfinite_rows_are_rejected_with_a_reason(name):
    # rows 1 (NaN) and 4 (+inf) among 9 finite rows around 1: rejected, named, and the
    # aggregate is finite
    import redteam
    from redteam.testing import make_server_context

    x = make_updates(3, 11, 5)
    x[1, 2] = float("nan")
    x[4, 0] = float("inf")
    dec = redteam.defense(name, **PARAMS.get(name, {}))(x, make_server_context(x, 1))
    assert not bool(dec.accepted[1]) and not bool(dec.accepted[4])
    assert "non-finite" in dec.reasons[1] and "non-finite" in dec.reasons[4]
    assert bool(torch.isfinite(dec.aggregate).all())


def test_krum_never_selects_an_all_nan_row():
    # every row NaN but one finite row: the finite row is the only candidate
    x = torch.full((5, 3), float("nan"))
    x[3] = torch.tensor([1.0, 2.0, 3.0])
    dec = Krum(f=1)(x)
    assert dec.aggregate.tolist() == [1.0, 2.0, 3.0] and dec.accepted.tolist() == [False, False, False, True, False]
    # no finite row at all: zeros, everyone rejected
    dec = Krum(f=1)(torch.full((5, 3), float("nan")))
    assert dec.aggregate.tolist() == [0.0, 0.0, 0.0] and not bool(dec.accepted.any())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 9), d=st.integers(1, 600),
       kind=st.sampled_from(["gaussian", "clustered", "duplicates", "zeros", "sparse"]),
       scale=st.sampled_from([1e-3, 1.0, 1e3, 1e30]))
def test_gram_and_cosine_bounds_hold(seed, n, d, kind, scale):
    from defenses._pairwise import cosine_similarities, gram

    x = make_updates(seed, n, d, kind=kind, scale=scale)
    x64 = x.to(torch.float64)
    exact = x64 @ x64.T  # float32 products are exact in float64; sums of ≤ 600 terms: ~1e-13
    g, err = gram(x)
    assert bool(((g - exact).abs() <= err + 1e-12 * exact.abs()).all())
    norms = exact.diagonal().sqrt()
    denom = norms[:, None] * norms[None, :]
    cos = torch.where(denom > 0, exact / denom.clamp_min(1e-300), torch.zeros_like(exact))
    cos.diagonal().copy_((norms > 0).to(cos.dtype))
    assert bool(((cosine_similarities(x) - cos).abs() <= 1e-4).all())


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("scale, checked", [(1.0, False), (5e18, True), (3e38, True)])
def test_pairwise_bound_holds_when_many_blocks_are_summed_in_float32(monkeypatch, groups, scale, checked):
    # The float32 stage sums a call's block products by halving in float32 (TREE_DEPTH
    # roundings folded into KAPPA). Odd block counts (13 = 6 + 6 + 1, then 3 …) take the
    # fold-in branch. At scale 5e18 the centred entries are ~6e17: one block product
    # (256 terms, ~1e38) fits float32 but the halving sum of 13 (~1.4e39) overflows it,
    # though the float64 sum of the groups would not; at 3e38 the products themselves
    # overflow. Both must fall back to the checked path and keep the promise.
    import defenses._pairwise as pw

    monkeypatch.setattr(pw, "_group", lambda n: 13)
    calls: list[bool] = []
    unchecked = pw._centred_gram

    def spy(x, careful=False):
        calls.append(careful)
        return unchecked(x, careful)

    monkeypatch.setattr(pw, "_centred_gram", spy)
    n, d = 7, pw.BLOCK * 13 * groups + 5
    g = torch.Generator().manual_seed(groups)
    x = (torch.randn(n, d, generator=g, dtype=torch.float64) * 0.3 + 1.0)
    x[3] = x[2]  # a copy: distance exactly 0, one group
    x = (x * (scale / float(x.abs().max()))).to(torch.float32)
    pd = pw.pairwise(x)
    exact = _exact_distances(x)
    slack = exact * (d + 3) * 2.0 ** -53
    assert bool(torch.isfinite(pd.approx).all())
    assert bool(((pd.approx - exact).abs() <= pd.error + slack).all())
    assert int(pd.group[3]) == 2 and float(pd.approx[2, 3]) == 0.0
    assert calls == ([False, True] if checked else [False])
    # the uncentred inner products (cosine rules) keep their bound the same way: exact
    # float64 products of float32 values (48 bits), summed with relative error ≤ d·2⁻⁵³
    g, err = pw.gram(x)
    x64 = x.to(torch.float64)
    exact = x64 @ x64.T
    slack = (x64.abs() @ x64.abs().T) * d * 2.0 ** -53
    assert bool(torch.isfinite(g).all()) and bool(((g - exact).abs() <= err + slack).all())


def test_pairwise_nonfinite_row_is_found_after_the_unchecked_pass():
    # The usual float32 path checks only its result; a NaN or an inf entry in one row
    # makes the Gram non-finite, and the rows are then screened: that row is infinitely
    # far from every other, the others' distances are exact to the bound.
    from defenses._pairwise import pairwise

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3 * 256 + 7, generator=g)
    x[4, 100] = float("nan")
    x[1, 5] = float("inf")
    pd = pairwise(x)
    assert pd.finite.tolist() == [True, False, True, True, False, True]
    assert bool(torch.isinf(pd.approx[1, [0, 2, 3, 5]]).all()) and bool(torch.isinf(pd.approx[4, [0, 2, 3, 5]]).all())
    keep = [0, 2, 3, 5]
    exact = _exact_distances(x[keep])
    sub = pd.approx[keep][:, keep]
    assert bool(((sub - exact).abs() <= pd.error[keep][:, keep] + exact * 1e-12).all())
