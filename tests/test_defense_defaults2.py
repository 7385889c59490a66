"""Issue 19 items 6–9: FLDetector, SignGuard, RLR and DnC defaults that differed from their
authors' and hurt, each pinned by a worked example from the paper or the released code.

* FLDetector (Zhang et al., KDD 2022; github.com/zaixizhang/FLDetector): the released
  training loops run ``detection(...)`` once and ``break`` — detect once, then stop;
* SignGuard (Xu et al., ICDCS 2022; github.com/JianXu95/SignGuard,
  ``aggregators/signguard.py``): a contiguous coordinate window, max-normalised sign
  features, ``estimate_bandwidth(quantile=0.5)``, ``MeanShift(bin_seeding=True,
  cluster_all=False)``;
* RLR (Ozdayi et al., AAAI 2021; their ``src/aggregation.py`` and ``runner.sh``):
  |Σ sgn| < θ gives −η; θ above the corrupt count (scenario: f + 1; bare call ⌈2n/5⌉,
  the FMNIST script's 4 of 10);
* DnC (Shejwalkar & Houmansadr, NDSS 2021): ties at the ⌊c·f⌋ cut and the bare-call f.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from defenses.dnc import DnC
from defenses.fldetector import FLDetector
from defenses.rlr import RLR
from defenses.signguard import SignGuard, bin_seeds, mean_shift
from redteam.errors import InvalidParameter
from redteam.federation.builders import build_defense
from redteam.federation.loop import Federation
from redteam.scenario import PluginSpec, parse_scenario
from redteam.types import ServerContext


def _digits(attack: dict, defense: dict, rounds: int = 20, clients: int = 20, fraction: float = 0.2, **fed):
    sc = parse_scenario({
        "scenario": {"seed": 0}, "workload": {"name": "digits"},
        "federation": {"clients": clients, "rounds": rounds, "partition": "dirichlet", "alpha": 0.5, "lr": 0.2,
                       "malicious_fraction": fraction, **fed},
        "attack": attack, "defense": defense,
    })
    return Federation(sc).run()


# =========================================================================== 8. RLR

def test_rlr_scenario_theta_is_f_plus_one_and_the_run_shows_it():
    # The paper's premise: θ above the corrupt count, so the f corrupt agents alone cannot
    # reach it. Unset θ in a scenario: f + 1 (runner.sh's θ = 4 for 1 corrupt of 10 and
    # θ = 8 for 4 of 40 both satisfy it).
    assert build_defense(PluginSpec("rlr"), n_malicious=4).theta == 5
    assert build_defense(PluginSpec("rlr"), n_malicious=0).theta == 1
    assert build_defense(PluginSpec("rlr", {"theta": 8}), n_malicious=4).theta == 8  # explicit wins
    assert build_defense(PluginSpec("rlr")).theta is None  # no count known: the bare-call rule
    res = _digits({"name": "sign_flip"}, {"name": "rlr"}, rounds=1, clients=10, fraction=0.3, local_steps=1)
    assert res.params["defense"] == "RLR(theta=4, weighted=True)"  # f = 3 -> θ = 4, in the run's params


def test_rlr_authors_fmnist_threshold_worked_example():
    # runner.sh: 10 agents, --robustLR_threshold=4; compute_robustLR sets −server_lr where
    # |Σ sgn| < 4 and +server_lr where ≥ 4; the step is lr_vector ⊙ the FedAvg mean.
    #   col 0: 7 × +1, 3 × −1          -> Σ = 4 (keeps +η), mean 0.4
    #   col 1: 6 × +1, 4 × −1          -> Σ = 2 (flips),    mean 0.2 -> −0.2
    #   col 2: 5 × +1, 1 × −1, 4 × 0   -> Σ = 4 (keeps),    mean 0.4
    # A bare call with n = 10 resolves θ = ⌈2·10/5⌉ = 4, the same threshold.
    c0 = [1.0] * 7 + [-1.0] * 3
    c1 = [1.0] * 6 + [-1.0] * 4
    c2 = [1.0] * 5 + [-1.0] + [0.0] * 4
    x = torch.tensor([c0, c1, c2]).T
    expected = [0.4, -0.2, 0.4]
    assert RLR(theta=4)(x).aggregate.tolist() == pytest.approx(expected)
    dec = RLR()(x)
    assert dec.state["theta"] == 4 and dec.aggregate.tolist() == pytest.approx(expected)
    # θ = ⌈n/2⌉ = 5 (the former default) would have flipped column 0 as well
    assert RLR(theta=5)(x).aggregate.tolist() == pytest.approx([-0.4, -0.2, -0.4])


@pytest.mark.parametrize("n, theta", [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2), (6, 3), (7, 3), (8, 4), (9, 4),
                                      (10, 4)])
def test_rlr_bare_theta_is_two_fifths_of_n_on_odd_and_even_rounds(n, theta):
    # ⌈2n/5⌉: 1.2 -> 2, 1.6 -> 2, 2.0 -> 2, 2.4 -> 3, 2.8 -> 3, 3.2 -> 4, 3.6 -> 4, 4.0 -> 4.
    # One column with exactly θ agreeing votes (the rest 0) keeps +η; one with θ − 1 flips.
    keep = [1.0] * theta + [0.0] * (n - theta)
    flip = [1.0] * (theta - 1) + [0.0] * (n - theta + 1)
    x = torch.tensor([keep, flip]).T
    dec = RLR()(x)
    assert dec.state["theta"] == theta
    assert dec.aggregate.tolist() == pytest.approx([theta / n, -(theta - 1) / n])


def test_rlr_known_weakness_tiny_norm_votes_flip_the_honest_mean():
    # Three honest rows (1, 1) agree (votes 3 ≥ θ = 3): the step is their mean (1, 1).
    # Two rows of norm ~10⁻⁶ voting − barely move the mean ((3 − 2·10⁻⁶)/5 ≈ 0.6) but take
    # the votes to 3 − 2 = 1 < 3: both coordinates step backwards.
    honest = torch.ones(3, 2)
    assert RLR(theta=3)(honest).aggregate.tolist() == pytest.approx([1.0, 1.0])
    x = torch.cat([honest, torch.full((2, 2), -1e-6)])
    assert RLR(theta=3)(x).aggregate.tolist() == pytest.approx([-0.6, -0.6], abs=1e-5)


def test_rlr_default_theta_keeps_a_sign_flip_from_wrecking_digits():
    # 20 clients, 4 sign-flipping, Dirichlet(0.5). Measured: θ = ⌈n/2⌉ = 10 (the former
    # unset θ) ends at 0.37, the scenario's θ = f + 1 = 5 at 0.65.
    old = _digits({"name": "sign_flip"}, {"name": "rlr", "theta": 10}).records[-1].accuracy
    new = _digits({"name": "sign_flip"}, {"name": "rlr"})
    assert new.params["defense"] == "RLR(theta=5, weighted=True)"
    assert new.records[-1].accuracy > old + 0.15, (old, new.records[-1].accuracy)


# =========================================================================== 9. DnC

# Six 2-D rows: four honest, two bit-identical copies far out. Mean (2, 2); centred rows
# (−2, −2), (−1, −2), (−2, −1), (−1, −1), (3, 3), (3, 3); the centred matrix is symmetric
# under swapping the coordinates, so v = (1, 1)/√2 and sᵢ = (x̃ᵢ₁ + x̃ᵢ₂)²/2:
#   8, 4.5, 4.5, 2, 18, 18.
SIX = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [5.0, 5.0], [5.0, 5.0]])


def test_dnc_never_splits_bit_identical_copies():
    dec = DnC(f=1)(SIX)
    assert dec.state["scores"][0] == pytest.approx([8, 4.5, 4.5, 2, 18, 18])
    # f = 1: the one highest score is shared by two identical rows; removing one copy and
    # keeping its twin would call a row an outlier by a score the kept row has too:
    # both are kept (none removed), the mean of all six is (2, 2)
    assert dec.accepted.all() and dec.reasons == {} and dec.state["tie_kept"] == [[5]]
    assert dec.aggregate.tolist() == pytest.approx([2.0, 2.0])
    # f = 2 covers both copies: the paper's rule as written, mean of rows 0–3 = (0.5, 0.5)
    two = DnC(f=2)(SIX)
    assert two.accepted.tolist() == [True] * 4 + [False] * 2 and two.state["tie_kept"] == [[]]
    assert two.aggregate.tolist() == pytest.approx([0.5, 0.5])
    # every client sends the same update: every score is 0, nobody is an outlier
    same = torch.tensor([[1.0, -2.0, 3.0]] * 5)
    dec = DnC(f=2)(same)
    assert dec.accepted.all() and dec.reasons == {} and dec.aggregate.tolist() == pytest.approx([1.0, -2.0, 3.0])


def test_dnc_ties_keep_keeps_every_tied_group_the_cut_falls_inside():
    # FIVE of test_defenses_dnc.py: scores 11.52, 7.22, 7.22, 3.92, 115.52; f = 3 keeps 2:
    # 3.92 and one of the tied 7.22 rows. "content" keeps (1, 0) by its fingerprint
    # (mean (1, 0.5)); "keep" keeps both tied rows: mean of (1, 0), (0, 1), (1, 1) = (2/3, 2/3).
    five = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [10.0, 10.0]])
    assert DnC(f=3)(five).aggregate.tolist() == pytest.approx([1.0, 0.5])
    dec = DnC(f=3, ties="keep")(five)
    assert dec.accepted.tolist() == [False, True, True, True, False] and dec.state["tie_kept"] == [[2]]
    assert dec.aggregate.tolist() == pytest.approx([2 / 3, 2 / 3])
    with pytest.raises(InvalidParameter, match=r"DnC.ties = 'random'"):
        DnC(ties="random")


@pytest.mark.parametrize("rows, f, kept_mean", [
    # n = 6 (even): f = ⌊5/2⌋ = 2. Mean 5, centred −5, −4, −3, −2, −1, 15: scores 25, 16, 9,
    # 4, 1, 225; rows 5 and 0 go, mean of 1–4 = 2.5 (f = n/2 = 3 would drop row 1 too: 3)
    ([0.0, 1.0, 2.0, 3.0, 4.0, 20.0], 2, 2.5),
    # n = 4 (even): f = ⌊3/2⌋ = 1. Mean 3.25, scores 10.5625, 5.0625, 1.5625, 45.5625: row 3
    # goes, mean 1 (f = 2 would drop row 0 too: 1.5)
    ([0.0, 1.0, 2.0, 10.0], 1, 1.0),
])
def test_dnc_bare_call_f_on_even_rounds(rows, f, kept_mean):
    dec = DnC()(torch.tensor(rows)[:, None])
    assert dec.state["f"] == f and int((~dec.accepted).sum()) == f
    assert dec.aggregate.tolist() == pytest.approx([kept_mean])


# =========================================================================== 7. SignGuard

def _signs(spec, d=10):
    """Rows of d entries: p × +1, z × 0, the rest −1."""
    return torch.tensor([[1.0] * p + [0.0] * z + [-1.0] * (d - p - z) for p, z in spec], dtype=torch.float64)


def _authors_signguard(grads: torch.Tensor, idx: int, num_spars: int) -> tuple[list[int], bool]:
    """aggregators/signguard.py, ``signguard_multiclass.aggregate``, line by line (scikit-learn
    calls included), with the window start ``idx`` given. Returns the benign indices and
    whether the largest cluster was tied (the code's argmax then picks the first)."""
    from sklearn.cluster import MeanShift, estimate_bandwidth

    grad_l2norm = torch.norm(grads, dim=1).cpu().numpy()
    norm_med = np.median(grad_l2norm)
    benign_idx1 = set(range(len(grads)))
    benign_idx1 &= {int(i[0]) for i in np.argwhere(grad_l2norm > 0.1 * norm_med)}
    benign_idx1 &= {int(i[0]) for i in np.argwhere(grad_l2norm < 3.0 * norm_med)}
    sign_grads = torch.sign(grads[:, idx:(idx + num_spars)])
    sign_pos = (sign_grads.eq(1.0)).sum(dim=1, dtype=torch.float32) / num_spars
    sign_zero = (sign_grads.eq(0.0)).sum(dim=1, dtype=torch.float32) / num_spars
    sign_neg = (sign_grads.eq(-1.0)).sum(dim=1, dtype=torch.float32) / num_spars
    feat = [sign_pos / (sign_pos.max() + 1e-8), sign_zero / (sign_zero.max() + 1e-8),
            sign_neg / (sign_neg.max() + 1e-8)]
    sign_feat = torch.stack(feat, dim=1).cpu().numpy()
    bandwidth = estimate_bandwidth(sign_feat, quantile=0.5, n_samples=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        labels = MeanShift(bandwidth=bandwidth, bin_seeding=True, cluster_all=False).fit(sign_feat).labels_
    labels_unique = np.unique(labels)
    n_cluster = len(labels_unique) - (1 if -1 in labels_unique else 0)
    num_class = [np.sum(labels == i) for i in range(n_cluster)]
    tied = n_cluster > 1 and sorted(num_class)[-2] == max(num_class)
    benign_idx2 = {int(i[0]) for i in np.argwhere(labels == np.argmax(num_class))}
    return sorted(benign_idx1 & benign_idx2), tied


def test_signguard_defaults_are_the_authors():
    sg = SignGuard()
    assert (sg.bandwidth_quantile, sg.coordinates, sg.normalise, sg.bin_seeding, sg.cluster_all) == \
        (0.5, "window", "max", True, False)
    assert (sg.lower, sg.upper, sg.coordinate_fraction) == (0.1, 3.0, 0.1)


def test_signguard_worked_example_spread_honest_rows_stay_together():
    # Six rows of 10 entries (coordinate_fraction = 1: the window is every coordinate), all of
    # norm √10. Positive / negative counts: A (9, 1), B (8, 2), C (8, 2), D (7, 3), E (6, 4),
    # F (1, 9). Features (÷ the maxima 0.9, 0, 0.9): A (1, 0, 1/9), B = C (8/9, 0, 2/9),
    # D (7/9, 0, 3/9), E (6/9, 0, 4/9), F (1/9, 0, 1); neighbours on this line are s = √2/9
    # apart, F is 5s from E.
    # Bandwidth, quantile 0.5: k = 3 (self included); 3rd-nearest distances A s, B 0·s → s
    # (C at 0, then A/D at s), C s, D s, E 2s, F 6s: mean 12s/6 = 2s = 2√2/9 ≈ 0.3143.
    # MeanShift (bin seeds, bandwidth 2s): one mode at the mean of A–E,
    # (38/45, 0, 12/45), with A–E within 7√2/45 ≤ 2s of it; F is its own mode. The largest
    # cluster is A–E: only F goes. (scikit-learn, the authors' calls, agrees below.)
    x = _signs([(9, 0), (8, 0), (8, 0), (7, 0), (6, 0), (1, 0)])
    dec = SignGuard(coordinate_fraction=1.0)(x)
    assert dec.state["bandwidth"] == pytest.approx(2 * math.sqrt(2) / 9)
    assert dec.accepted.tolist() == [True] * 5 + [False]
    assert dec.aggregate.tolist() == pytest.approx(x[:5].mean(dim=0).tolist())
    assert _authors_signguard(x.float(), 0, 10) == ([0, 1, 2, 3, 4], False)
    # the former defaults (quantile 0.3, raw fractions, seeds at every row, everyone
    # clustered): k = 2, bandwidth = mean nearest-other distance = 8·(√2/10)/6 ≈ 0.1886, which
    # splits the honest rows into {A, B, C} and {D, E}: two honest rows rejected
    old = SignGuard(coordinate_fraction=1.0, bandwidth_quantile=0.3, normalise="none", bin_seeding=False,
                    cluster_all=True)(x)
    assert old.state["bandwidth"] == pytest.approx(8 * math.sqrt(2) / 10 / 6)
    assert old.accepted.tolist() == [True, True, True, False, False, False]


def test_signguard_a_vector_outside_every_mode_is_unclustered():
    # Counts A (9, 1), B (8, 2), C (7, 3), D (6, 4), E (5, 5), F (1, 9); s = √2/9 as above.
    # Bandwidth: 3rd-nearest A 2s, B s, C s, D s, E 2s, F 5s: mean 2s. The honest mode is the
    # mean of A–D, (30/36, 0, 10/36); E is (−5/18, 5/18) from it, 5√2/18 ≈ 0.393 > 2s ≈ 0.314,
    # and farther still from F's mode: cluster_all = False leaves E in no cluster (label −1,
    # rejected), as the authors' MeanShift(cluster_all=False); cluster_all = True puts E
    # with its nearest mode, the honest one.
    x = _signs([(9, 0), (8, 0), (7, 0), (6, 0), (5, 0), (1, 0)])
    dec = SignGuard(coordinate_fraction=1.0)(x)
    assert dec.state["labels"][4] == -1 and dec.accepted.tolist() == [True] * 4 + [False, False]
    assert "farther than the bandwidth from every MeanShift mode" in dec.reasons[4]
    assert _authors_signguard(x.float(), 0, 10) == ([0, 1, 2, 3], False)
    assert SignGuard(coordinate_fraction=1.0, cluster_all=True)(x).accepted.tolist() == [True] * 5 + [False]


def test_signguard_matches_the_released_code_on_random_rounds():
    # ±1/0 entries with random magnitudes per row, a quarter of the rows sign-flipped,
    # n ≤ 30 (the code's n_samples = 50 does not subsample), the window start read back from
    # the decision. Rounds whose largest clusters tie are skipped (the code's argmax takes
    # the first mode, this module the mode nearest the median).
    rng = np.random.default_rng(0)
    compared = 0
    for t in range(40):
        n, d = int(rng.integers(4, 30)), int(rng.integers(20, 200))
        x = torch.from_numpy(rng.choice([-1.0, 0.0, 1.0], size=(n, d), p=[0.3, 0.2, 0.5]))
        x[: n // 4] *= -1
        x = x * torch.from_numpy(rng.uniform(0.5, 2.0, size=(n, 1)))
        dec = SignGuard()(x, ServerContext.default(x, generator=torch.Generator().manual_seed(t)))
        ref, tied = _authors_signguard(x.float(), dec.state["window_start"], dec.state["coordinates"])
        if tied:
            continue
        compared += 1
        assert [i for i in range(n) if bool(dec.accepted[i])] == ref, t
    assert compared >= 35


def test_signguard_window_is_contiguous_and_every_start_can_be_drawn():
    # d = 6, coordinate_fraction 0.5: k = 3, starts 0 … 3 (the code's randint(0, d − k) never
    # draws 3). The labels are those of the same rule run on the window's columns alone.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 6, generator=g, dtype=torch.float64)
    starts = set()
    for seed in range(60):
        dec = SignGuard(coordinate_fraction=0.5)(x, ServerContext.default(x, generator=torch.Generator().manual_seed(seed)))
        s, k = dec.state["window_start"], dec.state["coordinates"]
        starts.add(s)
        assert k == 3
        assert dec.state["labels"] == SignGuard(coordinate_fraction=1.0)(x[:, s:s + k]).state["labels"]
    assert starts == {0, 1, 2, 3}
    assert SignGuard(coordinate_fraction=0.5, coordinates="random")(x).state["window_start"] is None
    with pytest.raises(InvalidParameter, match=r"SignGuard.coordinates = 'strided'"):
        SignGuard(coordinates="strided")


def test_signguard_lower_norm_edge_by_hand():
    # Four rows (1, 1, 1, 1) of norm 2 and one (0.01, …) of norm 0.02: median M = 2, window
    # [0.1·2, 3·2] = [0.2, 6]. Every row's sign statistics are (1, 0, 0): one cluster, so only
    # the norm window can reject the small row. Aggregate: the four rows, (1, 1, 1, 1)
    # (accepting it would give (4 + 0.01)/5 = 0.802 per coordinate).
    x = torch.tensor([[1.0] * 4] * 4 + [[0.01] * 4], dtype=torch.float64)
    dec = SignGuard(coordinate_fraction=1.0)(x)
    assert dec.accepted.tolist() == [True] * 4 + [False]
    assert dec.reasons[4] == "SignGuard: norm 0.02 outside [0.1, 3] × median norm 2"
    assert dec.aggregate.tolist() == pytest.approx([1.0] * 4)
    # the window's ends are kept: lower = 0.25 puts the edge at 0.5, the norm of (0.25, …)
    edge = torch.tensor([[1.0] * 4] * 4 + [[0.25] * 4], dtype=torch.float64)
    dec = SignGuard(coordinate_fraction=1.0, lower=0.25)(edge)
    assert dec.accepted.all() and dec.aggregate.tolist() == pytest.approx([0.85] * 4)


def test_bin_seeds_and_seeded_mean_shift_by_hand():
    # bandwidth 1: 0.2 -> 0, 0.4 -> 0, 1.6 -> 2, 5.2 -> 5, 5.4 -> 5 (round half to even: 2.5 -> 2)
    x = torch.tensor([[0.2], [0.4], [1.6], [5.2], [5.4], [2.5]], dtype=torch.float64)
    assert bin_seeds(x, 1.0).flatten().tolist() == [0.0, 2.0, 5.0]
    # every row in a cell of its own: the rows themselves (scikit-learn's fallback)
    assert torch.equal(bin_seeds(x[:3], 0.5), x[:3])
    # seeds 0, 2, 5 with bandwidth 1: 0 -> mean(0.2, 0.4) = 0.3; 2 -> mean(1.6, 2.5) = 2.05
    # -> mean(1.6, 2.5) again; 5 -> 5.3. Modes 0.3, 2.05, 5.3 are > 1 apart: three clusters
    lab = mean_shift(x, 1.0, bin_seeding=True).tolist()
    assert lab[0] == lab[1] and lab[2] == lab[5] and lab[3] == lab[4] and len(set(lab)) == 3


# =========================================================================== 6. FLDetector

def _quadratic(detector, rounds=30, n=10, d=20, malicious=(7, 8, 9), seed=1, turn=None):
    """test_defenses_fldetector.py's quadratic problem: honest client i's delta is −0.1·A(w − cᵢ)
    plus noise; the malicious send noise; ``turn = (client, round)`` turns one more client
    malicious from that round on. Returns the per-round sets of rejected client ids and
    the decisions."""
    g = torch.Generator().manual_seed(seed)
    a = torch.linspace(0.5, 2.0, d)
    c = 1.0 + 0.1 * torch.randn(n, d, generator=g)
    w = torch.zeros(d)
    state, prev, rejected, decs = {}, None, [], []
    for t in range(rounds):
        x = -0.1 * (w - c) * a + 0.001 * torch.randn(n, d, generator=g)
        for i in malicious:
            x[i] = 0.3 * torch.randn(d, generator=g)
        if turn is not None and t >= turn[1]:
            x[turn[0]] = 0.3 * torch.randn(d, generator=g)
        ctx = ServerContext.default(x, global_params=w.clone(), previous_update=prev, state=state, round=t,
                                    client_ids=tuple(range(n)))
        dec = detector(x, ctx)
        rejected.append({int(i) for i in (~dec.accepted).nonzero().flatten()})
        decs.append(dec)
        state, prev = dec.state, dec.aggregate
        w = w + prev
    return rejected, decs


def test_fldetector_detects_once_like_the_released_code():
    # train_cifar.py / train_femnist.py: `if detection1(...): detection(...); break` — the
    # first round the gap statistic finds two clusters decides, and nothing is detected after.
    # Window 3: pairs from round 2, three distances per client by round 4, which flags the
    # three noise senders; from then on nobody is scored and the three stay out.
    rejected, decs = _quadratic(FLDetector(window=3))
    assert all(not r for r in rejected[:4]) and all(r == {7, 8, 9} for r in rejected[4:])
    assert decs[4].state["detected_round"] == 4 and decs[4].state["decided"] == list(range(10))
    assert all(dec.state["scored"] == [] and dec.state["detected_round"] == 4 for dec in decs[5:])
    # detecting every round (the former default) kept splitting the survivors' scores:
    # by round 29 six of the seven honest clients were banned after the attackers
    cascade, _ = _quadratic(FLDetector(window=3, detect_once=False))
    assert cascade[4] == {7, 8, 9} and cascade[-1] == {0, 1, 3, 4, 5, 6, 7, 8, 9}


def test_fldetector_scores_wait_for_a_full_window_of_distances():
    # The released code tests only with 10 rows of distances (malicious_score.shape[0] >= 11,
    # a zero row included). Window 3: distances in rounds 2 and 3 are measured but decide
    # nothing; round 4 is the first with 3 distances per client.
    _, decs = _quadratic(FLDetector(window=3), rounds=5)
    assert [dec.state["pairs"] for dec in decs] == [0, 0, 1, 2, 3]
    assert decs[2].state["scored"] == list(range(10)) and decs[2].state["decided"] == []
    assert decs[3].state["decided"] == [] and "clusters" not in decs[3].state
    assert decs[4].state["decided"] == list(range(10)) and decs[4].state["clusters"] == 2


def test_fldetector_after_detection_a_late_attacker_is_not_detected():
    # The authors stop (and retrain without the detected clients); a defense cannot restart
    # training, so detection ends with the first one: client 3 turning malicious in round 8
    # is never flagged (the former cascade flagged it, and honest clients with it).
    rejected, _ = _quadratic(FLDetector(window=3), turn=(3, 8), seed=0)
    assert rejected[-1] == {7, 8, 9}
    cascade, _ = _quadratic(FLDetector(window=3, detect_once=False), turn=(3, 8), seed=0)
    assert 3 in cascade[-1] and len(cascade[-1] - {3, 7, 8, 9}) > 0


def test_fldetector_without_attackers_one_false_detection_does_not_compound():
    # No attacker: the gap statistic still splits the honest scores once (round 11, four
    # honest clients); detecting every round banned nine of the ten by round 29.
    rejected, decs = _quadratic(FLDetector(window=3), malicious=())
    assert decs[-1].state["detected_round"] == 11 and rejected[-1] == {2, 3, 4, 6}
    cascade, _ = _quadratic(FLDetector(window=3, detect_once=False), malicious=())
    assert len(cascade[-1]) == 9


def test_fldetector_in_the_newdef_federation_scenario():
    # test_defenses_newdef_federation.py's scenario (digits, 20 clients, 4 sign-flipping ×4,
    # Dirichlet(0.5), window 5). Detecting once, the first detection flags attackers only and
    # the set never changes (measured: one of the four — a loud one keeps the others in, the
    # known weakness); detecting every round (detect_once = False) flags all four by the end.
    def flagged(once):
        records = _digits({"name": "sign_flip", "scale": 4.0}, {"name": "fldetector", "window": 5,
                                                                "detect_once": once}).records
        mal = {c for c, m in enumerate(records[0].malicious) if m}
        sets = [frozenset(c for c, ok in enumerate(r.accepted) if not ok) for r in records]
        return mal, [s for s in sets if s]

    mal, sets = flagged(True)
    assert sets and sets[0] <= mal and all(s == sets[0] for s in sets)
    mal, sets = flagged(False)
    assert sets[-1] == mal
