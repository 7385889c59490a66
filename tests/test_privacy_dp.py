"""DP-FedAvg (McMahan et al., ICLR 2018) and the ε the run reports (dp-accounting's RDP accountant)."""

from __future__ import annotations

import math

import pytest
import torch

from defenses.dp import DPFedAvg
from redteam.errors import InvalidParameter
from redteam.privacy.accountant import ClientLevelDP, epsilon
from redteam.types import ServerContext


def test_clip_sum_and_divide_by_m_worked_example() -> None:
    # (3, 4) has norm 5 → clipped to S = 1: (0.6, 0.8); (0.3, 0.4) has norm 0.5 < S: kept.
    # no noise: (0.6 + 0.3, 0.8 + 0.4) / 2 = (0.45, 0.6), whatever the sample weights say
    rule = DPFedAvg(clip=1.0, noise_multiplier=0.0)
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    ctx = ServerContext.default(x, weights=torch.tensor([100.0, 1.0]))
    dec = rule(x, ctx)
    assert torch.allclose(dec.aggregate, torch.tensor([0.45, 0.6]))
    assert dec.accepted.tolist() == [True, True]


def test_a_row_exactly_at_the_bound_is_not_scaled() -> None:
    rule = DPFedAvg(clip=5.0, noise_multiplier=0.0)
    x = torch.tensor([[3.0, 4.0]])
    assert torch.equal(rule.client_side(x), x)


def test_noise_std_is_z_s_over_m() -> None:
    d, m, s, z = 40_000, 4, 2.0, 1.5
    rule = DPFedAvg(clip=s, noise_multiplier=z)
    x = torch.zeros((m, d))
    ctx = ServerContext.default(x, generator=torch.Generator().manual_seed(3))
    agg = rule(x, ctx).aggregate.to(torch.float64)
    assert float(agg.std()) == pytest.approx(z * s / m, rel=0.02)


def test_summed_rows_count_their_clients() -> None:
    # under secure aggregation a row is the mean of several clients' clipped rows: (2 rows of
    # means, 3 and 1 clients) → the mean over the 4 clients, noise scaled by 1/4
    rule = DPFedAvg(clip=10.0, noise_multiplier=0.0)
    x = torch.tensor([[1.0, 0.0], [0.0, 4.0]])
    ctx = ServerContext.default(x, summed=(3, 1))
    assert torch.allclose(rule(x, ctx).aggregate, torch.tensor([0.75, 1.0]))


def test_non_finite_rows_are_rejected_and_left_out() -> None:
    rule = DPFedAvg(clip=1.0, noise_multiplier=0.0)
    x = torch.tensor([[float("nan"), 0.0], [0.3, 0.4]])
    dec = rule(x, ServerContext.default(x))
    assert dec.accepted.tolist() == [False, True]
    assert torch.allclose(dec.aggregate, torch.tensor([0.3, 0.4]))


@pytest.mark.parametrize("field,value", [("clip", 0.0), ("clip", -1.0), ("noise_multiplier", -0.1),
                                         ("sampling", "shuffle")])
def test_bad_parameters_are_named(field: str, value: object) -> None:
    with pytest.raises(InvalidParameter, match=field):
        DPFedAvg(**{field: value})


def test_epsilon_is_dp_accountings_for_the_configuration() -> None:
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting import rdp

    # 10 of 100 clients per round, 30 rounds, z = 1.1: sampling without replacement needs the
    # replace-one relation, under which the clipped sum's sensitivity is 2S: noise multiplier z/2
    event = dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.1 / 2)), 30)
    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(event)
    assert epsilon(ClientLevelDP(1.1, 100, 10, 30), 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    # McMahan et al.'s analysis: Poisson sampling with q = K/N, add-or-remove relation
    acc = rdp.RdpAccountant()
    acc.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.1)), 30))
    assert epsilon(ClientLevelDP(1.1, 100, 10, 30, "poisson"), 1e-5) == pytest.approx(acc.get_epsilon(1e-5),
                                                                                      rel=1e-12)


def test_full_participation_matches_the_gaussian_rdp_bound_by_hand() -> None:
    # every client in every round: T Gaussian mechanisms, RDP(α) = T·α / (2z²) (Mironov 2017).
    # The classic conversion ε = min_α RDP(α) + log(1/δ)/(α − 1) is an upper bound on the
    # library's (it uses a tighter conversion), and not far above it
    z, t, delta = 2.0, 20, 1e-5
    got = epsilon(ClientLevelDP(z, 50, 50, t), delta)
    alphas = [1 + k / 100 for k in range(1, 20_000)]
    classic = min(t * a / (2 * z * z) + math.log(1 / delta) / (a - 1) for a in alphas)
    assert got <= classic + 1e-9
    assert got >= 0.8 * classic


def test_more_noise_or_fewer_rounds_never_costs_more_epsilon() -> None:
    e = [epsilon(ClientLevelDP(z, 100, 10, 30), 1e-5) for z in (0.8, 1.2, 2.0, 4.0)]
    assert e == sorted(e, reverse=True)
    assert epsilon(ClientLevelDP(1.0, 100, 10, 10), 1e-5) < epsilon(ClientLevelDP(1.0, 100, 10, 30), 1e-5)


def test_no_noise_is_infinite_epsilon_and_bad_delta_is_named() -> None:
    assert epsilon(ClientLevelDP(0.0, 10, 10, 5), 1e-5) == math.inf
    with pytest.raises(InvalidParameter, match="delta"):
        epsilon(ClientLevelDP(1.0, 10, 10, 5), 0.0)
