"""Snowball (Qin et al., AAAI 2024) and CRFL (Xie et al., ICML 2021): worked examples by hand,
independent transcriptions of the authors' formulas, determinism, parameter errors, contracts."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction as Fr

import pytest
import torch

from defenses.crfl import CRFL, CertifySetting, certified_radius, certify
from defenses.snowball import Snowball, bottom_up_votes, layer_blocks
from redteam.errors import InvalidParameter
from redteam.testing import check_defense
from redteam.types import ModelView, ServerContext


def _ctx(u, **kw):
    return ServerContext.default(u, **kw)


# ================================================================================== CRFL
# Global model G = (1, 2, 2) (norm 3); two updates (2, 0, 0) and (0, 2, 2): their plain mean is
# (1, 1, 1), so the averaged model is (2, 3, 3), norm √22 = 4.690416. Round 0 is the authors'
# epoch t = 1: ρ₁ = min(15, 2 + 0.1·1) = 2.1, so the model is scaled by 2.1/√22 = 0.4477215:
# (0.8954430, 1.3431645, 1.3431645), and the aggregate is that minus G.
G3 = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64)
U3 = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 2.0]], dtype=torch.float64)


def test_crfl_clip_then_noise_without_noise_is_the_clipped_model():
    dec = CRFL(sigma=0.0)(U3, _ctx(U3, global_params=G3))
    f = 2.1 / math.sqrt(22.0)
    assert f == pytest.approx(0.4477215, abs=1e-7)
    new = G3 + dec.aggregate
    assert new.tolist() == pytest.approx([2 * f, 3 * f, 3 * f], abs=1e-12)
    assert float(new.norm()) == pytest.approx(2.1, abs=1e-12)
    assert dec.aggregate.tolist() == pytest.approx([0.8954430 - 1, 1.3431645 - 2, 1.3431645 - 2], abs=1e-6)
    assert dec.state["rho_t"] == pytest.approx(2.1) and dec.state["norm_before"] == pytest.approx(math.sqrt(22))
    assert dec.accepted.tolist() == [True, True] and dec.weights.tolist() == pytest.approx([f / 2, f / 2])


def test_crfl_samples_weighting_and_the_norm_on_the_threshold_unchanged():
    # weights 1 and 3: mean (0.5, 1.5, 1.5), model (1.5, 3.5, 3.5), norm √26.75; scaled to 2.1
    ctx = _ctx(U3, global_params=G3, weights=torch.tensor([1.0, 3.0], dtype=torch.float64))
    new = G3 + CRFL(sigma=0.0, weighting="samples")(U3, ctx).aggregate
    f = 2.1 / math.sqrt(26.75)
    assert new.tolist() == pytest.approx([1.5 * f, 3.5 * f, 3.5 * f], abs=1e-12)
    # a constant threshold ρ = 3 (ρ₀ = 3, growth 0) and a model of norm exactly 3: left as it is
    g = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    u = torch.tensor([[0.0, 0.0, 2.0]], dtype=torch.float64)  # G + u = (1, 2, 2), norm 3
    dec = CRFL(rho_start=3.0, rho_growth=0.0, sigma=0.0)(u, _ctx(u, global_params=g))
    assert dec.aggregate.tolist() == [0.0, 0.0, 2.0] and dec.state["clip_factor"] == 1.0
    # one step beyond it is clipped back onto the sphere of radius 3
    dec = CRFL(rho_start=3.0, rho_growth=0.0, sigma=0.0)(2 * u, _ctx(u, global_params=g))
    assert float((g + dec.aggregate).norm()) == pytest.approx(3.0, abs=1e-12) and dec.state["clip_factor"] < 1


def test_crfl_noise_comes_from_the_context_generator_after_the_clip():
    ctx = _ctx(U3, global_params=G3, generator=torch.Generator().manual_seed(7))
    dec = CRFL(sigma=0.5)(U3, ctx)
    z = torch.randn(3, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    f = 2.1 / math.sqrt(22.0)
    expected = torch.tensor([2 * f, 3 * f, 3 * f], dtype=torch.float64) + 0.5 * z - G3
    assert torch.allclose(dec.aggregate, expected, atol=1e-12)
    again = CRFL(sigma=0.5)(U3, _ctx(U3, global_params=G3, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(dec.aggregate, again.aggregate)


def test_crfl_schedule_and_screening():
    big = U3 * 100
    for rnd, rho in ((0, 2.1), (9, 3.0), (129, 15.0), (500, 15.0)):
        dec = CRFL(sigma=0.0)(big, _ctx(big, global_params=G3, round=rnd))
        assert dec.state["rho_t"] == pytest.approx(rho)
        assert float((G3 + dec.aggregate).norm()) == pytest.approx(rho, rel=1e-12)
    u = torch.cat([U3, torch.tensor([[math.nan, 0.0, 0.0]], dtype=torch.float64)])
    dec = CRFL(sigma=0.0)(u, _ctx(u, global_params=G3))
    assert dec.accepted.tolist() == [True, True, False] and dec.reasons == {2: "non-finite update"}
    assert torch.allclose(dec.aggregate, CRFL(sigma=0.0)(U3, _ctx(U3, global_params=G3)).aggregate)
    with pytest.raises(InvalidParameter, match="ctx.global_params is needed"):
        CRFL()(U3)


def _radius_transcribed(pa, pb, sigma_test, *, T, t_adv, R, p, gamma, tau, eta, lz, q_b, n_b, sigma_train, rho_t):
    """The authors' cal_prob_bound (certify_mnist.py), written out again with math only."""
    phi = lambda v: 0.5 * (1.0 + math.erf(v / math.sqrt(2.0)))  # noqa: E731
    fraction = -math.log(1.0 - (math.sqrt(pa) - math.sqrt(pb)) ** 2) * sigma_train ** 2
    denominator = 2 * R * tau ** 2 * lz ** 2 * sum(x ** 2 for x in p) * gamma ** 2 * eta ** 2 * (q_b / n_b) ** 2
    contract = 1.0
    for t in range(t_adv + 1, T):
        contract *= 2 * phi(rho_t(t) / sigma_train) - 1
    contract *= 2 * phi(rho_t(T) / sigma_test) - 1
    return math.sqrt(fraction / (denominator * contract))


SMALL = CertifySetting(rounds=3, attack_round=1, attackers=1, clients=10, agg_weights=(0.1,), scale=10.0,
                       lr=0.01, local_steps=10.0, poison_per_batch=1, batch_size=10, lipschitz=1.0,
                       sigma_train=1.0, rho=15.0, rho_start=1.0, rho_growth=0.0)


def test_certified_radius_by_hand():
    # p_A = 0.9, p_B = 0.1: (√0.9 − √0.1)² = 1 − 2√0.09 = 0.4, −ln 0.6 = 0.5108256.
    # SMALL: ρₜ = 1 and σ = σ_T = 1, so Π = (2Φ(1) − 1)² (rounds 2 and T = 3) = 0.6826895² = 0.4660649;
    # denominator 2·R·Σpᵢ²·γ²·τ²·η²·L_Z²·(q_B/n_B)²·Π = 2·1·0.01·100·100·10⁻⁴·1·0.01·Π = 2·10⁻⁴·Π
    # = 9.321299e-5, and RAD = √(0.5108256/9.321299e-5) = 74.02836.
    assert float(certified_radius(0.9, 0.1, 1.0, SMALL)) == pytest.approx(74.02836, rel=1e-6)
    kw = dict(T=3, t_adv=1, R=1, p=(0.1,), gamma=10.0, tau=10.0, eta=0.01, lz=1.0, q_b=1, n_b=10, sigma_train=1.0,
              rho_t=lambda t: 1.0)
    for pa, pb, st in ((0.9, 0.1, 1.0), (0.7, 0.25, 0.5), (0.55, 0.44, 2.0)):
        assert float(certified_radius(pa, pb, st, SMALL)) == pytest.approx(_radius_transcribed(pa, pb, st, **kw),
                                                                            rel=1e-12)
    # no certificate where p_A ≤ p_B (the authors' formula is symmetric and would give one); p_A = 1: ∞
    r = certified_radius(torch.tensor([0.4, 0.5, 1.0]), torch.tensor([0.5, 0.5, 0.0]), 1.0, SMALL)
    assert r[0] == 0 and r[1] == 0 and math.isinf(float(r[2]))
    # the authors' MNIST configuration (the default setting), ρₜ ≥ 9.1 ≫ σ: Π = 1, denominator 0.00765
    default = dict(T=100, t_adv=70, R=2, p=(0.05, 0.05), gamma=100.0, tau=30.0, eta=0.001, lz=math.sqrt(17.0),
                   q_b=5, n_b=100, sigma_train=0.01, rho_t=lambda t: min(15.0, 2 + 0.1 * t))
    assert float(certified_radius(0.9, 0.1, 0.01)) == pytest.approx(
        math.sqrt(-math.log(0.6) * 1e-4 / 0.00765), rel=1e-9)
    assert float(certified_radius(0.9, 0.1, 0.01)) == pytest.approx(
        _radius_transcribed(0.9, 0.1, 0.01, **default), rel=1e-12)


def _linear_view():
    """Logits x·Wᵀ with W the 2×2 matrix read from the flat row."""

    def forward(flat, x):
        return x.to(flat.dtype) @ flat.reshape(2, 2).T

    return ModelView(forward=forward, loss=None, features=None, layers=(("w", 0, 4, (2, 2)),), head=("w",),
                     input_shape=(2,), num_classes=2)


def test_certify_worked_example():
    # W = 100·I: inputs (1, 0) and (0, 1) have a logit margin of 100 ≫ σ = 0.01: every one of the
    # M = 50 noisy models votes for the true class, p̂_A = 1, p̂_B = 0; h = √(ln(1/0.001)/100) = 0.2628261,
    # p_A = 0.7371739, p_B = 0.2628261. The input (1, 1) ties the logits: the noise decides, the top
    # share is near 1/2 and p_A − h < p_B + h: no certificate.
    flat = torch.tensor([100.0, 0.0, 0.0, 100.0])
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 0])
    cert = certify(_linear_view(), flat, x, y, sigma=0.01, M=50, alpha=0.001, setting=SMALL,
                   generator=torch.Generator().manual_seed(3))
    assert cert.predictions[:2].tolist() == [0, 1] and cert.correct[:2].all()
    assert cert.counts[:2].max(dim=1).values.tolist() == [50, 50] and int(cert.counts[2].sum()) == 50
    assert cert.p_a[:2].tolist() == pytest.approx([0.7371739] * 2, abs=1e-7)
    assert cert.p_b[:2].tolist() == pytest.approx([0.2628261] * 2, abs=1e-7)
    kw = dict(T=3, t_adv=1, R=1, p=(0.1,), gamma=10.0, tau=10.0, eta=0.01, lz=1.0, q_b=1, n_b=10, sigma_train=1.0,
              rho_t=lambda t: 1.0)
    want = _radius_transcribed(1 - 0.2628261, 0.2628261, 0.01, **kw)
    assert cert.radius[:2].tolist() == pytest.approx([want] * 2, rel=1e-5)
    assert float(cert.radius[2]) == 0.0
    assert cert.certified_accuracy() == pytest.approx(2 / 3) and cert.certified_accuracy(want * 2) == 0.0
    again = certify(_linear_view(), flat, x, y, sigma=0.01, M=50, alpha=0.001, setting=SMALL,
                    generator=torch.Generator().manual_seed(3))
    assert torch.equal(again.counts, cert.counts)


def test_crfl_bad_parameters_name_the_field():
    for kw, name in (({"sigma": -1.0}, "CRFL.sigma"), ({"rho": 0.0}, "CRFL.rho"), ({"rho_start": -2.0}, "CRFL.rho_start"),
                     ({"rho_growth": -0.1}, "CRFL.rho_growth"), ({"weighting": "median"}, "CRFL.weighting"),
                     ({"sigma": math.nan}, "CRFL.sigma")):
        with pytest.raises(InvalidParameter, match=name.replace(".", r"\.")):
            CRFL(**kw)
    with pytest.raises(InvalidParameter, match=r"CertifySetting\.attack_round"):
        CertifySetting(rounds=10, attack_round=10)
    with pytest.raises(InvalidParameter, match=r"CertifySetting\.agg_weights"):
        CertifySetting(attackers=2, agg_weights=(0.1,))
    with pytest.raises(InvalidParameter, match=r"CertifySetting\.poison_per_batch"):
        CertifySetting(poison_per_batch=200, batch_size=100)
    with pytest.raises(InvalidParameter, match="sigma"):
        certify(_linear_view(), torch.zeros(4), torch.zeros(1, 2), torch.zeros(1), sigma=0.0)
    with pytest.raises(InvalidParameter, match="M = 0"):
        certify(_linear_view(), torch.zeros(4), torch.zeros(1, 2), torch.zeros(1), M=0)


def test_crfl_contracts():
    rep = check_defense("crfl", max_examples=6)
    assert rep.examples > 0


# ============================================================================== Snowball
# Five clients, two one-coordinate layers, ct = 1 (k-means with 2 clusters seeded by the client
# and its farthest peer).
# Layer a = (0, 1, 2, 3, 20): client 4 is a clear outlier. Every client's k-means ends at
# {0, 1, 2, 3} | {4} (the honest ones seed with 20, client 4 with 0), so all five Calinski–Harabasz
# scores are equal (164.28) and every vote weighs 1 (all-equal convention): clients 0–3 get 4 votes
# (from 0–3), client 4 only its own.
# Layer b = (0, 1, 3, 8, 5):
#   client 0 (seeds 0, 8): 1, 3 → 0; 5 → 8; centres 4/3, 13/2; stable: {0,1,2} | {3,4}.
#     mean 17/5; B = 3·(31/15)² + 2·(31/10)² = 961/30; W = 42/9 + 9/2 = 55/6; CH = B/(W/3) = a.
#   client 1 (seeds 1, 8): the same partition, CH = a, votes {0, 1, 2}.
#   client 2 (seeds 3, 8): 0, 1, 5 → 3; centre 9/4; stable: {0,1,2,4} | {3}.
#     B = 4·(23/20)² + (23/5)² = 529/20; W = 236/16; CH = b; votes {0, 1, 2, 4}.
#   client 3 (seeds 8, 0): {0,1,2} | {3,4} again, CH = a; votes {3, 4}.
#   client 4 (seeds 5, 0): 3, 8 → 5, 1 → 0; centres 16/3, 1/2; 3 stays (7/3 < 5/2): {2,3,4} | {0,1}.
#     B = 3·(29/15)² + 2·(29/10)² = 841/30; W = 114/9 + 1/2 = 79/6; CH = c; votes {2, 3, 4}.
#   a > c > b: normalised weights 1, 1, 0, 1, r = (c − b)/(a − b) = 0.19743.
#   layer-b votes: (2, 2, 2 + r, 1 + r, 1 + r).
# Totals (6, 6, 6 + r, 5 + r, 2 + r): the outlier has the fewest. ⌈0.1·5⌉ = 1 is raised to 2 selectees:
# client 2, then client 0 (ties go to the lower row); ⌊0.5·5⌋ = 2 are wanted: no VAE runs.
A_CH = Fr(961, 30) / (Fr(55, 6) / 3)
B_CH = Fr(529, 20) / (Fr(236, 16) / 3)
C_CH = Fr(841, 30) / (Fr(79, 6) / 3)
R = float((C_CH - B_CH) / (A_CH - B_CH))
U5 = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 3.0], [3.0, 8.0], [20.0, 5.0]])
TWO_LAYERS = ModelView(forward=None, loss=None, features=None, layers=(("a.weight", 0, 1, (1,)), ("b.weight", 1, 2, (1,))),
                       head=("b.weight",), input_shape=(1,))


def test_snowball_bottom_up_votes_by_hand():
    assert float(A_CH) == pytest.approx(10.483636, abs=1e-6) and R == pytest.approx(0.197431, abs=1e-6)
    votes, info = bottom_up_votes([U5[:, :1], U5[:, 1:]], ct=1)
    assert info[0]["scores"] == pytest.approx([164.28] * 5) and info[0]["weights"] == [1.0] * 5
    assert info[1]["scores"] == pytest.approx([float(A_CH)] * 2 + [float(B_CH), float(A_CH), float(C_CH)], rel=1e-12)
    assert info[1]["clusters"] == [[0, 1, 2], [0, 1, 2], [0, 1, 2, 4], [3, 4], [2, 3, 4]]
    assert votes.tolist() == pytest.approx([6, 6, 6 + R, 5 + R, 2 + R], abs=1e-12)
    dec = Snowball(ct=1)(U5, _ctx(U5, model=TWO_LAYERS))
    assert dec.accepted.tolist() == [True, False, True, False, False]
    assert dec.state["selectees"] == [2, 0] and dec.state["picked"] == []
    assert set(dec.reasons) == {1, 3, 4} and "rank 5 of 5" in dec.reasons[4]
    assert dec.aggregate.tolist() == pytest.approx([1.0, 1.5])  # equal weights: the mean of rows 0 and 2
    # without a model view the row is one layer (the 2-D points): another election
    assert Snowball(ct=1)(U5).state["layers"] == ["row"]


def _authors_votes(blocks, ct):
    """The authors' bottom-up loops again, with scikit-learn's KMeans and Calinski–Harabasz score."""
    import numpy as np
    from sklearn.cluster import KMeans
    from sklearn.metrics import calinski_harabasz_score

    n = blocks[0].shape[0]
    cnt = np.zeros(n)
    for block in blocks:
        u = block.double().numpy()
        scores, members = [], []
        for i in range(n):
            ddif = u[i] - u
            rank = np.argsort(np.linalg.norm(ddif, axis=1), kind="stable")
            init = [i] + list(rank[-ct:])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lab = KMeans(n_clusters=len(init), init=ddif[init], n_init=1, tol=0.0).fit_predict(ddif)
            scores.append(calinski_harabasz_score(ddif, lab))
            members.append(np.nonzero(lab == lab[i])[0])
        s = np.array(scores)
        eff = np.nonzero(s > 0)[0]
        s = (s - s.min()) / (s.max() - s.min())
        for i in eff:
            cnt[members[i]] += s[i]
    return cnt


@pytest.mark.parametrize("ct", [3, 10])
def test_snowball_bottom_up_matches_a_transcription_with_scikit_learn(ct):
    g = torch.Generator().manual_seed(ct)
    x = torch.randn(12, 8, generator=g, dtype=torch.float64)
    x[:3] += 2.0
    blocks = [x[:, :5], x[:, 5:]]
    ours, _ = bottom_up_votes(blocks, ct)
    assert ours.tolist() == pytest.approx(_authors_votes(blocks, ct).tolist(), rel=1e-9, abs=1e-9)


FAST = dict(vae_hidden=32, vae_latent=8, vae_initial=40, vae_tuning=10)


def _clustered(seed):
    g = torch.Generator().manual_seed(seed)
    x = 0.05 * torch.randn(10, 24, generator=g)
    x[7:] += torch.tensor([0.8, -0.8] * 12)  # three attackers share a direction far from the honest seven
    return x


def test_snowball_top_down_election_enlarges_the_selectees_with_honest_rows():
    x = _clustered(0)
    dec = Snowball(**FAST)(x, _ctx(x, generator=torch.Generator().manual_seed(1)))
    st = dec.state
    # 2 selectees, ⌊0.5·10⌋ = 5 wanted, ⌈0.05·10⌉ = 1 picked up per step: three VAE steps
    assert len(st["selectees"]) == 2 and st["target"] == 5 and [len(p) for p in st["picked"]] == [1, 1, 1]
    assert st["clusters"] == 9 and "ct = 10 capped at n − 2 = 8" in st["note"]  # 10 updates: 9 clusters at most
    assert int(dec.accepted[:7].sum()) == 5
    assert not bool(dec.accepted[7:].any())
    # every attacker reconstructs worse than every honest row left over at the last step
    honest_left = [e for i, e in st["errors"].items() if i < 7 and not bool(dec.accepted[i])]
    assert min(st["errors"][i] for i in (7, 8, 9)) > max(honest_left)
    assert "top-down reconstruction error" in dec.reasons[8]
    # determinism: the generator decides the VAE; the same seed gives the same decision
    again = Snowball(**FAST)(x, _ctx(x, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(again.accepted, dec.accepted) and torch.equal(again.aggregate, dec.aggregate)
    assert again.state["errors"] == st["errors"]


def test_snowball_warmup_runs_the_bottom_up_election_alone():
    x = _clustered(2)
    dec = Snowball(warmup_rounds=3, **FAST)(x, _ctx(x, round=2))
    assert dec.n_accepted == 2 and dec.state["warmup"] and dec.state["picked"] == []
    assert all("warm-up" in r for r in dec.reasons.values())
    assert Snowball(warmup_rounds=3, **FAST)(x, _ctx(x, round=3)).n_accepted == 5


def test_snowball_layers_from_the_model_view():
    view = ModelView(forward=None, loss=None, features=None, head=("4.weight", "4.bias"), input_shape=(3,),
                     layers=(("0.weight", 0, 6, (2, 3)), ("0.bias", 6, 8, (2,)), ("2.weight", 8, 12, (2, 2)),
                             ("2.bias", 12, 14, (2,)), ("4.weight", 14, 18, (2, 2)), ("4.bias", 18, 20, (2,))))
    x = torch.zeros(4, 20)
    spans, names = layer_blocks(x, view, "first_last")
    assert names == ["0.weight", "0.bias", "4.weight", "4.bias"] and spans[2] == slice(14, 18)
    assert layer_blocks(x, view, "all")[1] == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert layer_blocks(x, None, "first_last") == ([slice(0, 20)], ["row"])
    assert layer_blocks(torch.zeros(4, 21), view, "all") == ([slice(0, 21)], ["row"])  # not these rows' layout


def test_snowball_few_and_nonfinite_rows():
    x = torch.tensor([[1.0, 2.0], [math.inf, 0.0], [3.0, 4.0]])
    dec = Snowball()(x)
    assert dec.accepted.tolist() == [True, False, True] and dec.reasons == {1: "non-finite update"}
    assert "too few" in dec.state["note"] and Snowball().degradation(dec.state, 2) == dec.state["note"]
    assert dec.aggregate.tolist() == pytest.approx([2.0, 3.0])


def test_snowball_bad_parameters_name_the_field():
    for kw, name in (({"ct": 0}, "ct"), ({"vt": 0.0}, "vt"), ({"vt": 1.5}, "vt"), ({"v_step": -0.1}, "v_step"),
                     ({"bottom_up_fraction": 2.0}, "bottom_up_fraction"), ({"vae_hidden": 0}, "vae_hidden"),
                     ({"vae_latent": 1.5}, "vae_latent"), ({"vae_initial": -1}, "vae_initial"),
                     ({"recon_samples": 0}, "recon_samples"), ({"layers": "middle"}, "layers"),
                     ({"warmup_rounds": -2}, "warmup_rounds"), ({"ct": True}, "ct")):
        with pytest.raises(InvalidParameter, match=rf"Snowball\.{name} ="):
            Snowball(**kw)


def test_snowball_contracts():
    # the contract kit's inputs with a small VAE (the default one trains 270 + 30·k epochs per call)
    rep = check_defense("snowball", params=dict(vae_hidden=16, vae_latent=4, vae_initial=3, vae_tuning=1),
                        max_examples=3)
    assert rep.examples > 0
