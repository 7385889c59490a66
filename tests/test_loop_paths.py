"""Round-loop paths through ``Federation.run()``, pinned to hand-derived values.

Spies stand in for the defense or the attack, so what reaches them (global parameters,
the server's data oracles, the rows that arrive after compression, what an attacker may
see) can be compared with what the papers' rules say it must be:

* server optimizers (Reddi et al. 2021 FedAdam; DiLoCo's Nesterov outer step) on a
  constant aggregate, two rounds worked by hand;
* the server-data oracles (``root_update``, ``evaluate_loss``) and the built-in rules
  that read them (FLTrust, the loss check, the root-referenced cosine filter);
* error feedback (Stich et al. 2018) on a crafted row whose top-k choice alternates,
  with clients that miss rounds (churn: the residual is kept, by client id);
* the ``[federation] omniscient`` override of an attack's threat model.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch

from redteam.pipeline import Aggregator
from redteam.types import Attack, AttackContext, Decision, ServerContext, Surface

SEEN: list[dict[str, Any]] = []  # what the spies saw, call by call


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()
    yield
    SEEN.clear()


@dataclass(frozen=True, slots=True)
class ConstantAggregate(Aggregator):
    """Accepts everything and returns ``value`` in every coordinate; records its inputs."""

    value: float = 0.01
    uses_server_data: ClassVar[bool] = True

    def decide(self, updates: torch.Tensor, ctx: ServerContext) -> Decision:
        seen: dict[str, Any] = {"round": ctx.round, "params": ctx.global_params.clone(),
                                "rows": updates.clone(), "ids": tuple(ctx.client_ids)}
        if ctx.root_update is not None:
            seen["root"] = ctx.root_update()
            seen["root_again"] = ctx.root_update()
            zero = torch.zeros(1, updates.shape[1], dtype=updates.dtype)
            seen["loss0"] = ctx.evaluate_loss(zero)
            seen["loss_root"] = ctx.evaluate_loss(seen["root"][None, :])
        SEEN.append(seen)
        return Decision(aggregate=torch.full((updates.shape[1],), self.value, dtype=updates.dtype),
                        accepted=torch.ones(updates.shape[0], dtype=torch.bool))


def _steps(rounds: int) -> list[torch.Tensor]:
    params = [s["params"] for s in SEEN]
    assert len(params) == rounds
    return [b - a for a, b in itertools.pairwise(params)]


# -- server optimizers through the loop --------------------------------------------------------
@pytest.mark.parametrize("opt, lr, step1, step2", [
    # FedAvg: w ← w + η·Δ, η = 0.5, Δ = 0.01 → 0.005 each round
    ("fedavg", 0.5, 0.005, 0.005),
    # FedAdam (β₁ 0.9, β₂ 0.99, τ 1e-3, η 0.05), Δ = 0.01 in every coordinate:
    #   m₁ = 0.1·0.01 = 1e-3, v₁ = 0.01·1e-4 = 1e-6 → step 0.05·1e-3/(1e-3 + 1e-3) = 0.025
    #   m₂ = 0.9e-3 + 1e-3 = 1.9e-3, v₂ = 0.99e-6 + 1e-6 = 1.99e-6, √v₂ = 1.4106736e-3
    #   → step 0.05·1.9e-3/(2.4106736e-3) = 0.0394080…
    ("fedadam", 0.05, 0.025, 0.05 * 1.9e-3 / (1.99e-6 ** 0.5 + 1e-3)),
    # Nesterov (μ 0.9, η 0.7) on g = −Δ = −0.01:
    #   b₁ = −0.01 → step −0.7·(−0.01 + 0.9·(−0.01)) = 0.0133
    #   b₂ = 0.9·(−0.01) − 0.01 = −0.019 → step −0.7·(−0.01 − 0.0171) = 0.01897
    ("nesterov", 0.7, 0.0133, 0.01897),
])
def test_server_optimizer_steps_through_the_loop(redteam_federation, opt, lr, step1, step2):
    redteam_federation(defense=ConstantAggregate(value=0.01), run=True,
                       overrides={"federation.rounds": 3, "federation.server_optimizer": opt,
                                  "federation.server_lr": lr, "federation.malicious_fraction": 0.0})
    s1, s2 = _steps(3)
    torch.testing.assert_close(s1, torch.full_like(s1, step1), rtol=0, atol=2e-6)
    torch.testing.assert_close(s2, torch.full_like(s2, step2), rtol=0, atol=2e-6)


# -- the server's data oracles ----------------------------------------------------------------------
def test_root_update_and_loss_oracle_reach_every_merge_node_once_per_round(redteam_federation):
    # a hierarchy of 4 bottom groups: every node of a round sees the same root update (one
    # per round, computed once), and evaluate_loss(0) is the loss of the round's model.
    redteam_federation(defense=ConstantAggregate(value=0.0), run=True,
                       overrides={"federation.rounds": 2, "federation.root_samples": 40,
                                  "federation.malicious_fraction": 0.0,
                                  "hierarchy.fan_out": 4, "hierarchy.depth": 2})
    by_round: dict[int, list[dict]] = {}
    for s in SEEN:
        by_round.setdefault(s["round"], []).append(s)
    assert sorted(by_round) == [0, 1] and all(len(v) == 4 for v in by_round.values())
    for nodes in by_round.values():
        root = nodes[0]["root"]
        assert root.shape == nodes[0]["params"].shape and bool(torch.isfinite(root).all())
        assert float(root.abs().sum()) > 0
        for s in nodes:
            assert s["root"] is root and s["root_again"] is root
            assert torch.equal(s["loss0"], nodes[0]["loss0"])
        # a step of local training on the root data lowers the loss on the root data
        assert float(nodes[0]["loss_root"][0]) < float(nodes[0]["loss0"][0])
    # the aggregate is 0, so the model (and its root loss) stay put, but the root update is
    # drawn afresh each round (new batches)
    assert torch.equal(by_round[0][0]["loss0"], by_round[1][0]["loss0"])
    assert not torch.equal(by_round[0][0]["root"], by_round[1][0]["root"])


def test_no_server_data_means_no_oracles(redteam_federation):
    redteam_federation(defense=ConstantAggregate(), run=True,
                       overrides={"federation.rounds": 1, "federation.root_samples": 0})
    assert len(SEEN) == 1 and "root" not in SEEN[0]


@pytest.mark.parametrize("defense", [
    "fltrust",
    {"name": "loss_check"},
    {"name": "cosine_filter", "against": "root", "threshold": 0.0},
])
def test_server_data_rules_catch_a_scaled_sign_flip(redteam_federation, defense):
    # 8 clients, 2 malicious sending −4 × their honest update: against the server's own
    # root update the flipped rows point backwards (cosine < 0: FLTrust trust 0, the
    # cosine filter rejects) and raise the root loss (the loss check rejects).
    res = redteam_federation(defense=defense, attack={"name": "sign_flip", "scale": 4.0}, run=True,
                             overrides={"federation.rounds": 3, "federation.root_samples": 64})
    flagged_mal = flagged_honest = judged_mal = 0
    for r in res.records:
        for acc, mal, part in zip(r.accepted, r.malicious, r.participating):
            if part and mal:
                judged_mal += 1
                flagged_mal += not acc
            elif part:
                flagged_honest += not acc
    assert judged_mal == 2 * 3 and flagged_mal == judged_mal
    assert flagged_honest <= 3  # a few honest rows may be caught too, never most of them


# -- error feedback when only some clients take part -------------------------------------------------
@dataclass(frozen=True, slots=True)
class TwoLevelRow(Attack):
    """Every malicious client sends u = [1.0 … 1.0 | 0.6 … 0.6] (first half | second half)."""

    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        d = ctx.own_updates.shape[1]
        u = torch.where(torch.arange(d) < d // 2, 1.0, 0.6).to(ctx.own_updates.dtype)
        return u.expand_as(ctx.own_updates).clone()


def _expected_sent(history: list[bool], d: int) -> list[torch.Tensor | None]:
    """Top-(d/2) with error feedback on u, by hand: sent = topk(u + e), e ← u + e − sent,
    e kept unchanged through rounds the client misses.

    round a: u + 0 = [1 | 0.6]   → send [1 | 0],   e = [0 | 0.6]
    round b: u + e = [1 | 1.2]   → send [0 | 1.2], e = [1 | 0]
    round c: u + e = [2 | 0.6]   → send [2 | 0],   e = [0 | 0.6]   (then as round b …)
    """
    half = d // 2
    e = torch.zeros(d)
    u = torch.where(torch.arange(d) < half, 1.0, 0.6)
    out: list[torch.Tensor | None] = []
    for online in history:
        if not online:
            out.append(None)
            continue
        x = u + e
        keep = torch.zeros(d, dtype=torch.bool)
        keep[torch.topk(x.abs(), half).indices] = True
        sent = torch.where(keep, x, torch.zeros_like(x))
        e = x - sent
        out.append(sent)
    return out


def test_error_feedback_residual_is_kept_by_client_id_through_churn(redteam_federation):
    res = redteam_federation(
        attack=TwoLevelRow(), defense=ConstantAggregate(value=0.0), run=True,
        overrides={"federation.rounds": 6, "federation.malicious_fraction": 0.5,
                   "transport.codec": "topk", "transport.codec_params": {"fraction": 0.5},
                   "transport.error_feedback": True,
                   "transport.network.churn_leave": 0.4, "transport.network.churn_join": 0.6})
    mal = [c for c, m in enumerate(res.records[0].malicious) if m]
    assert len(mal) == 4
    d = SEEN[0]["rows"].shape[1]
    assert d % 2 == 0
    # the test must exercise a rejoin: some malicious client misses a round and returns
    histories = {c: [r.participating[c] for r in res.records] for c in mal}
    assert any(not h[i] and any(h[:i]) and any(h[i + 1:]) for h in histories.values() for i in range(len(h)))
    for c in mal:
        want = _expected_sent(histories[c], d)
        for rnd, w in enumerate(want):
            seen = SEEN[rnd]
            if w is None:
                assert c not in seen["ids"]
                continue
            row = seen["rows"][seen["ids"].index(c)]
            torch.testing.assert_close(row, w.to(row.dtype), rtol=0, atol=1e-6)


# -- the omniscient override ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Peek(Attack):
    """Records how many honest rows it was shown, and whether they are its own."""

    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        SEEN.append({"visible": ctx.visible_updates.shape[0],
                     "own": torch.equal(ctx.visible_updates, ctx.own_updates)})
        return ctx.own_updates


@dataclass(frozen=True, slots=True)
class PeekOmniscient(Peek):
    omniscient: ClassVar[bool] = True


@pytest.mark.parametrize("attack, override, visible, own", [
    # 8 clients, 2 malicious, all online: the honest rows are 6
    (Peek, None, 2, True),            # default: the attack's own threat model (own rows)
    (PeekOmniscient, None, 6, False),  # an omniscient attack sees every honest row
    (Peek, True, 6, False),            # [federation] omniscient = true grants it
    (PeekOmniscient, False, 2, True),  # ... and false takes it away
])
def test_omniscient_override(redteam_federation, attack, override, visible, own):
    overrides: dict[str, Any] = {"federation.rounds": 2}
    if override is not None:
        overrides["federation.omniscient"] = override
    redteam_federation(attack=attack(), run=True, overrides=overrides)
    assert [(s["visible"], s["own"]) for s in SEEN] == [(visible, own)] * 2
