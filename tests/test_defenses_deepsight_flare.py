"""DeepSight (Rieger et al., NDSS 2022) and FLARE (Wang et al., AsiaCCS 2022): worked examples.

Every expected number below is derived by hand in the comments, or by an independent
transcription of the paper's formula written here (never by calling the code under test)."""

from __future__ import annotations

import math

import pytest
import torch

from defenses.deepsight import (DeepSight, division_differences, membership_distances, neups, output_layer,
                                suspicious_labels, threshold_exceedings, vote)
from defenses.flare import FLARE, mmd2_unbiased, neighbour_count, pairwise_mmd, trust_counts, trust_scores
from redteam.errors import InvalidParameter
from redteam.types import ModelView, ServerContext


# ---------------------------------------------------------------- tiny models as flat rows
def linear_view(k: int, p: int) -> ModelView:
    """A linear classifier of k inputs and p classes: flat = [W (p, k) row-major, b (p,)]."""

    def split(flat):
        return flat[: p * k].reshape(p, k), flat[p * k:]

    def forward(flat, x):
        w, b = split(flat)
        return x.reshape(x.shape[0], k) @ w.T + b

    def features(flat, x):
        return x.reshape(x.shape[0], k).to(flat.dtype)

    return ModelView(forward=forward, loss=torch.nn.functional.cross_entropy, features=features,
                     layers=(("w", 0, p * k, (p, k)), ("b", p * k, p * k + p, (p,))), head=("w", "b"),
                     input_shape=(k,), num_classes=p)


def mlp_view(k: int, h: int, p: int) -> ModelView:
    """k → h (ReLU) → p; flat = [W1 (h, k), W2 (p, h), b2 (p,)]; features = the ReLU layer."""
    a, b = h * k, h * k + p * h

    def hidden(flat, x):
        return torch.relu(x.reshape(x.shape[0], k).to(flat.dtype) @ flat[:a].reshape(h, k).T)

    def forward(flat, x):
        return hidden(flat, x) @ flat[a:b].reshape(p, h).T + flat[b:]

    return ModelView(forward=forward, loss=torch.nn.functional.cross_entropy, features=hidden,
                     layers=(("w1", 0, a, (h, k)), ("w2", a, b, (p, h)), ("b2", b, b + p, (p,))),
                     head=("w2", "b2"), input_shape=(k,), num_classes=p)


# ================================================================= DeepSight
def test_neups_and_threshold_exceedings_by_hand():
    # P = 3 neurons, k = 2 inputs. ΔW = [[1, −1], [0.5, 0], [0, 0]], Δb = [0, 0.5, 1]:
    # energies e = |Δb| + Σ|ΔW| = [2, 1, 1], squares [4, 1, 1] / 6 → NEUP = [2/3, 1/6, 1/6].
    # ξ = max(0.01, 1/3)·2/3 = 2/9 ≈ 0.222: only 2/3 reaches it → TE = 1.
    w = torch.tensor([[[1.0, -1.0], [0.5, 0.0], [0.0, 0.0]]])
    b = torch.tensor([[0.0, 0.5, 1.0]])
    neup = neups(w, b)
    assert neup.tolist()[0] == pytest.approx([2 / 3, 1 / 6, 1 / 6], abs=1e-15)
    assert threshold_exceedings(neup).tolist() == [1]
    # boundary: P = 4, e = [2, 1, 1, 0] → NEUP = [4, 1, 1, 0]/6; ξ = max(0.01, 1/4)·(4/6) = 1/6 exactly,
    # so the two NEUPs equal to ξ count (≥): TE = 3 (a strict ">" would give 1)
    w4 = torch.tensor([[[2.0], [1.0], [-1.0], [0.0]]], dtype=torch.float64)
    n4 = neups(w4, None)
    assert n4.tolist()[0] == pytest.approx([4 / 6, 1 / 6, 1 / 6, 0.0], abs=1e-15)
    assert threshold_exceedings(n4).tolist() == [3]
    # a floor above 1/P: ξ = 0.3·(4/6) = 0.2 > 1/6 → TE = 1
    assert threshold_exceedings(n4, floor=0.3).tolist() == [1]
    # NEUPs ignore the update's scale (and a huge one does not overflow); a zero head is uniform (TE = P)
    assert torch.allclose(neups(w4 * 1e300, None), n4)
    z = neups(torch.zeros(1, 4, 1), torch.zeros(1, 4))
    assert z.tolist()[0] == [0.25] * 4 and threshold_exceedings(z).tolist() == [4]


def test_suspicious_labels_half_the_median():
    # TE = [4, 4, 2, 1]: midpoint median 3, half 1.5 → only TE = 1 is suspicious
    assert suspicious_labels(torch.tensor([4, 4, 2, 1])).tolist() == [False, False, False, True]
    # boundary: TE = [4, 2, 2, 1]: median 2, half 1; TE = 1 ≤ 1 is suspicious
    assert suspicious_labels(torch.tensor([4, 2, 2, 1])).tolist() == [False, False, False, True]
    # every model alike: TE > TE/2, nobody suspicious
    assert not suspicious_labels(torch.tensor([3, 3, 3])).any()


def test_ddifs_of_two_linear_models():
    # 1 input, 2 classes. G: W = 0, b = (1, 2). Model A: W = 0, b = (3, 1): its outputs do not depend
    # on x, so DDif_p = softmax(3, 1)_p / softmax(1, 2)_p exactly:
    #   class 0: [e³/(e³ + e)] / [e/(e + e²)] = e²(1 + e)/(e² + 1);  class 1: [e/(e³ + e)]·(e + e²)/e² = (1 + e)/(e(e² + 1))
    # Model B: W = (2, 0), b = G's: DDif_0 = mean over x of softmax(2x + 1, 2)_0 / softmax(1, 2)_0 on the
    # inputs drawn from the generator (transcribed here from the same seed).
    view = linear_view(1, 2)
    glob = torch.tensor([0.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    rows = torch.tensor([[0.0, 0.0, 2.0, -1.0], [2.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    got = division_differences(view, glob, rows, torch.Generator().manual_seed(5), seeds=2, samples=7, batch=3)
    e = math.e
    a0, a1 = e * e * (1 + e) / (e * e + 1), (1 + e) / (e * (e * e + 1))
    assert got.shape == (2, 2, 2)
    for s in range(2):
        assert got[s, 0].tolist() == pytest.approx([a0, a1], rel=1e-12)
    g = torch.Generator().manual_seed(5)
    for s in range(2):
        x = torch.cat([torch.rand((3, 1), generator=g), torch.rand((3, 1), generator=g),
                       torch.rand((1, 1), generator=g)]).double().flatten()
        pg0 = 1 / (1 + math.exp(1.0))  # softmax(1, 2)_0
        p0 = [1 / (1 + math.exp(2.0 - (2 * v + 1))) for v in x.tolist()]
        want = [sum(q / pg0 for q in p0) / 7, sum((1 - q) / (1 - pg0) for q in p0) / 7]
        assert got[s, 1].tolist() == pytest.approx(want, rel=1e-12)
    # the logits convention divides the raw outputs: model A's (3, 1)/(1, 2) = (3, 0.5)
    raw = division_differences(view, glob, rows[:1], torch.Generator().manual_seed(5), seeds=1, samples=4, batch=4,
                               outputs="logits")
    assert raw[0, 0].tolist() == pytest.approx([3.0, 0.5], rel=1e-12)


def test_output_layer_layouts():
    assert output_layer(linear_view(3, 4)) == (slice(0, 12), 4, 3, slice(12, 16), False)
    from redteam.testing.builders import toy_model_view

    # the kit's toy view: one flat head of 10 entries read cyclically by P = 10 neurons
    assert output_layer(toy_model_view(10)) == (slice(0, 10), 10, 1, None, True)


def test_membership_distances_and_the_vote():
    d = membership_distances([0, 0, -1, -1, 1])
    assert d.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 1], [1, 1, 0, 1, 1], [1, 1, 1, 0, 1], [1, 1, 1, 1, 0]]
    assert membership_distances([0, -1, -1], "together").tolist() == [[0, 1, 1], [1, 0, 0], [1, 0, 0]]
    labels = [0, 0, 0, 1, 1, -1, -1]
    susp = [False, False, True, True, False, True, False]
    # τ = 1/3: cluster 0 has 1 of 3 suspicious, 1 < (1/3)·3 = 1 is false → rejected (a share of exactly τ);
    # cluster 1: 1 of 2 → rejected; outliers one by one: 5 (suspicious) rejected, 6 accepted
    acc, why = vote(labels, susp, 1 / 3)
    assert acc == [False, False, False, False, False, False, True]
    assert "1 of 3" in why[0] and "suspicious" in why[5]
    # τ = 0.34: 1 < 1.02 → cluster 0 accepted
    assert vote(labels, susp, 0.34)[0][:3] == [True, True, True]
    assert vote(labels, susp, 0.34, "reject")[0][5:] == [False, False]
    # together: the outliers' group has 1 of 2 suspicious → rejected at τ = 0.34, accepted at 0.6
    assert vote(labels, susp, 0.34, "together")[0][5:] == [False, False]
    assert vote(labels, susp, 0.6, "together")[0][5:] == [True, True]


def _backdoored_round(seed=0, honest=8, bad=3, k=6, p=10):
    """Honest updates of a linear classifier spread over every class; backdoored ones push class 0
    (its weights and bias) and barely touch the rest."""
    g = torch.Generator().manual_seed(seed)
    d = p * k + p
    hon = 0.1 * torch.randn(honest, d, generator=g, dtype=torch.float64)
    mal = 0.002 * torch.randn(bad, d, generator=g, dtype=torch.float64)
    mal[:, :k] += 0.5  # class 0's weights
    mal[:, p * k] += 0.5  # class 0's bias
    glob = 0.1 * torch.randn(d, generator=g, dtype=torch.float64)
    return torch.cat([hon, mal]), glob, linear_view(k, p)


def test_deepsight_rejects_a_backdoored_cluster_and_keeps_the_honest():
    rows, glob, view = _backdoored_round()
    ctx = ServerContext.default(rows, global_params=glob, model=view)
    dec = DeepSight(num_samples=500)(rows, ctx)
    assert dec.accepted.tolist() == [True] * 8 + [False] * 3
    assert dec.state["suspicious"] == [False] * 8 + [True] * 3 and dec.state["te"][8:] == [1, 1, 1]
    assert all("DeepSight" in dec.reasons[i] for i in (8, 9, 10))
    # the aggregate: the mean of the 8 honest updates, each clipped to the median norm of all 11
    norms = rows.norm(dim=1)
    s = float(norms.sort().values[5])
    want = sum(rows[i] * min(1.0, s / float(norms[i])) for i in range(8)) / 8
    assert torch.allclose(dec.aggregate, want, atol=1e-12)
    assert dec.state["bound"] == pytest.approx(s)


def test_deepsight_needs_a_model_view():
    rows, glob, _ = _backdoored_round()
    with pytest.raises(InvalidParameter, match="ctx.model"):
        DeepSight()(rows, ServerContext.default(rows, global_params=glob))


@pytest.mark.parametrize("field, value", [
    ("tau", 0.0), ("tau", 1.5), ("num_seeds", 0), ("num_samples", 0), ("probe_batch", 0), ("te_floor", -0.1),
    ("ddif_outputs", "probabilities"), ("min_cluster_size", 1), ("min_samples", 0), ("outliers", "keep"),
    ("num_seeds", True)])
def test_deepsight_bad_parameters(field, value):
    with pytest.raises(InvalidParameter, match=f"DeepSight.{field}"):
        DeepSight(**{field: value})


# ================================================================= FLARE
def test_mmd_of_two_point_sets_by_hand():
    # X = {(0, 0), (1, 0)}, Y = {(0, 1), (0, 2)}, k(a, b) = exp(−γ‖a − b‖²) with γ = 1/2:
    # within X: ‖·‖² = 1 → Σ_{a≠a'} = 2e^{−1/2}, over m(m − 1) = 2: e^{−1/2}; the same within Y;
    # across: ‖·‖² = 1, 4, 2, 5 → −2/4·(e^{−1/2} + e^{−2} + e^{−1} + e^{−5/2})
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    y = torch.tensor([[0.0, 1.0], [0.0, 2.0]])
    want = 2 * math.exp(-0.5) - 0.5 * (math.exp(-0.5) + math.exp(-2) + math.exp(-1) + math.exp(-2.5))
    assert mmd2_unbiased(x, y, 0.5) == pytest.approx(want, rel=1e-14)
    # MMD²ᵤ(X, X) = 2e^{−1/2} − (1 + 1 + 2e^{−1/2})/2 = e^{−1/2} − 1 < 0: the pairwise matrix reads it as 0
    assert mmd2_unbiased(x, x, 0.5) == pytest.approx(math.exp(-0.5) - 1, rel=1e-14)
    m = pairwise_mmd(torch.stack([x, y, x]), 0.5)
    assert m[0, 1] == pytest.approx(want, rel=1e-12) and m[1, 2] == pytest.approx(want, rel=1e-12)
    assert m[0, 2] == 0.0 and m.diagonal().tolist() == [0.0] * 3 and torch.equal(m, m.T)
    # a set with a non-finite entry is at +∞ from every other
    bad = pairwise_mmd(torch.stack([x, y, torch.full((2, 2), math.nan)]), 0.5)
    assert bad[2, 0] == math.inf and bad[0, 2] == math.inf and bad[2, 2] == 0.0


# Five models, k = 2, a hand-made distance matrix:
#        0  1  2  3  4
D = torch.tensor([[0, 1, 2, 2, 5],
                  [1, 0, 3, 4, 4],
                  [2, 3, 0, 1, 6],
                  [2, 4, 1, 0, 6],
                  [5, 4, 6, 6, 0]], dtype=torch.float64)
# votes: 0 → 1, and 2 and 3 tie at the 2nd distance (2) and share the vote left: ½ each;
# 1 → 0, 2;  2 → 3, 0;  3 → 2, 0;  4 → 1 (distance 4), 0 (5).
# counts: c0 = 4 (from 1, 2, 3, 4), c1 = 1 + 1 = 2, c2 = ½ + 1 + 1 = 2.5, c3 = ½ + 1 = 1.5, c4 = 0 (Σ = n·k = 10)
COUNTS = [4.0, 2.0, 2.5, 1.5, 0.0]


def test_trust_counts_with_a_tie_on_the_kth_neighbour():
    assert trust_counts(D, 2).tolist() == COUNTS
    # relabelling the models permutes the counts with them (the tie is shared, not broken by position)
    perm = torch.tensor([3, 0, 4, 2, 1])
    assert trust_counts(D[perm][:, perm], 2).tolist() == [COUNTS[i] for i in perm.tolist()]
    # k = 1 (no ties): 0 → 1, 1 → 0, 2 → 3, 3 → 2, 4 → 1 (distance 4)
    assert trust_counts(D, 1).tolist() == [1.0, 2.0, 1.0, 1.0, 0.0]
    assert trust_counts(D, 0).tolist() == [0.0] * 5 and float(trust_counts(D, 99).sum()) == 20.0


def test_trust_scores_softmax_with_temperature():
    c = torch.tensor(COUNTS, dtype=torch.float64)
    # authors' code: exp(cᵢ/(τ·c̄)), c̄ = 10/5 = 2, τ = 1
    e = [math.exp(v / 2) for v in COUNTS]
    assert trust_scores(c).tolist() == pytest.approx([v / sum(e) for v in e], rel=1e-14)
    # τ = 0.5 without the mean: exp(2cᵢ)
    e2 = [math.exp(2 * v) for v in COUNTS]
    assert trust_scores(c, 0.5, "none").tolist() == pytest.approx([v / sum(e2) for v in e2], rel=1e-14)
    assert trust_scores(torch.zeros(4)).tolist() == [0.25] * 4


def test_neighbour_count_conventions():
    assert [neighbour_count(n, 0.5) for n in (1, 2, 5, 10, 20)] == [0, 1, 2, 5, 10]
    assert [neighbour_count(n, 0.5, "authors_code") for n in (2, 5, 10, 20)] == [0, 1, 4, 9]
    assert [neighbour_count(n, 0.5, "backfed") for n in (5, 7, 20)] == [2, 4, 10]  # round half to even
    assert neighbour_count(100, 0.29) == 29


def _flare_round(seed=0, honest=7, bad=3):
    g = torch.Generator().manual_seed(seed)
    view = mlp_view(4, 6, 3)
    d = 4 * 6 + 3 * 6 + 3
    glob = torch.randn(d, generator=g, dtype=torch.float64)
    rows = 0.02 * torch.randn(honest + bad, d, generator=g, dtype=torch.float64)
    rows[honest:, :24] += 1.0  # the first layer moved: other penultimate representations
    x = torch.rand(16, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (16,), generator=g)
    return rows, ServerContext.default(rows, global_params=glob, model=view, root_data=(x, y))


def test_flare_weights_by_hand_and_down_weighs_the_outliers():
    rows, ctx = _flare_round()
    dec = FLARE()(rows, ctx)
    # transcribe: PLRs, MMD with γ = 1/6 (6 hidden units), k = 5, counts, softmax(c/c̄)
    x = ctx.root_data[0]
    feats = [ctx.model.features(ctx.global_params + r, x) for r in rows]
    n = len(feats)
    dist = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            if i != j:
                dist[i, j] = max(0.0, mmd2_unbiased(feats[i], feats[j], 1 / 6))
    # the honest models' PLR sets are so alike that their unbiased MMD² is negative, read as 0:
    # every honest voter sees the other six honest models tied at distance 0 and gives each 5/6
    counts = [0.0] * n
    for i in range(n):
        others = sorted(float(dist[i, j]) for j in range(n) if j != i)
        kth = others[4]
        closer = [j for j in range(n) if j != i and float(dist[i, j]) < kth]
        tied = [j for j in range(n) if j != i and float(dist[i, j]) == kth]
        for j in closer:
            counts[j] += 1
        for j in tied:
            counts[j] += (5 - len(closer)) / len(tied)
    # each honest model: 6 honest voters × 5/6 = 5, plus a vote from each backdoored voter that names it
    # among its 3 nearest honest models (after the 2 other backdoored ones, at 0): here models 1, 3, 4;
    # each backdoored model: its 2 backdoored peers' votes only
    assert counts == pytest.approx([5.0, 8.0, 5.0, 8.0, 8.0, 5.0, 5.0, 2.0, 2.0, 2.0])
    assert dec.state["counts"] == pytest.approx(counts) and dec.state["k"] == 5
    e = [math.exp(c / (sum(counts) / n)) for c in counts]
    assert dec.weights.tolist() == pytest.approx([v / sum(e) for v in e], rel=1e-12)
    assert torch.allclose(dec.aggregate, dec.weights @ rows, atol=1e-14)
    assert max(dec.weights[7:].tolist()) < min(dec.weights[:7].tolist())
    assert dec.accepted.all()  # soft weighting: nobody is rejected
    # the authors' alternative: keep the top half by count, reject the rest
    top = FLARE(scoring="top_half")(rows, ctx)
    assert top.accepted[7:].tolist() == [False] * 3 and int(top.accepted.sum()) >= 5
    assert "top half" in top.reasons[7]


def test_flare_aux_class_and_missing_inputs():
    rows, ctx = _flare_round()
    x, y = ctx.root_data
    only = FLARE(aux_class=1)(rows, ctx)
    full = FLARE()(rows, ServerContext.default(rows, global_params=ctx.global_params, model=ctx.model,
                                               root_data=(x[y == 1], y[y == 1])))
    assert torch.equal(only.weights, full.weights)
    with pytest.raises(InvalidParameter, match="at least 2 auxiliary samples of label 7"):
        FLARE(aux_class=7)(rows, ctx)
    with pytest.raises(InvalidParameter, match="root_data is None"):
        FLARE()(rows, ServerContext.default(rows, global_params=ctx.global_params, model=ctx.model))
    with pytest.raises(InvalidParameter, match="ctx.model"):
        FLARE()(rows, ServerContext.default(rows, global_params=ctx.global_params, root_data=(x, y)))


@pytest.mark.parametrize("field, value", [
    ("fraction", 0.0), ("fraction", 1.5), ("k_rule", "nearest"), ("temperature", 0.0), ("count_scale", "max"),
    ("gamma", -1.0), ("aux_class", -1), ("scoring", "hard"), ("temperature", math.inf)])
def test_flare_bad_parameters(field, value):
    with pytest.raises(InvalidParameter, match=f"FLARE.{field}"):
        FLARE(**{field: value})


# ================================================================= the contract kit
def test_contracts():
    from redteam.testing import check_defense

    # fewer random inputs than the authors' 20,000 keep the kit's many calls quick; the contract is the same
    check_defense("deepsight", params={"num_samples": 64, "probe_batch": 32}, max_examples=5, derandomize=True)
    check_defense("flare", max_examples=8, derandomize=True)
    check_defense("flare", params={"scoring": "top_half"}, max_examples=4, derandomize=True)
