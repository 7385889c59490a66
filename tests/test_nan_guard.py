"""A model never silently becomes NaN (issue 9 §2, loop side).

A finite but huge row (3e38: the weighted sum overflows float32) or a rogue
sub-aggregator sending −1e300·x (−inf in float32) used to turn the global model into
NaN/Inf, the run exiting 0 and every honest client then reported as a false positive.
Now the non-finite sub-aggregate / aggregate / server step is refused, the model kept,
and the event recorded in ``RoundRecord.extra["refused"]``; ``accepted`` stays the
defense's, so detection metrics are unaffected by the refusal."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import torch

from redteam.federation import stages
from redteam.federation.loop import Federation
from redteam.federation.server_opt import FedAvg
from redteam.scenario import parse_scenario
from redteam.scoring import detection
from redteam.types import Attack, AttackContext, Surface


def _doc(**sections):
    doc = {"scenario": {"seed": 0}, "workload": {"name": "digits", "hidden": 8},
           "federation": {"clients": 8, "rounds": 3, "local_steps": 2, "batch_size": 8, "lr": 0.2,
                          "malicious_fraction": 0.25, "partition": "iid"},
           "attack": "none", "defense": "mean"}
    doc.update(sections)
    return doc


def _finite(res):
    return all(math.isfinite(r.loss) for r in res.records)


def test_rogue_aggregator_with_huge_scale_keeps_the_model_finite():
    doc = _doc(attack={"name": "rogue_aggregator", "scale": 1e300}, hierarchy={"fan_out": 2, "depth": 2})
    fed = Federation(parse_scenario(doc))
    res = fed.run()
    assert _finite(res), [r.loss for r in res.records]
    events = [e for r in res.records for e in r.extra.get("refused", [])]
    assert events and all(e["stage"] == "merge" and "non-finite" in e["reason"] for e in events)
    # the refused group is one with a malicious leader (its lowest-id member)
    for e in events:
        assert min(e["clients"]) in fed.malicious
    # honest clients are not flagged for the merge's refusal
    assert detection(res.records).fp == 0


@dataclasses.dataclass(frozen=True, slots=True)
class _Huge(Attack):
    surfaces = (Surface.UPDATES,)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        return torch.full_like(ctx.own_updates, 3e38)


def test_attacker_row_of_3e38_with_mean_keeps_the_model_finite(monkeypatch):
    # 2 of 8 clients send rows of 3e38. A float32 weighted sum overflows (the aggregate is
    # refused); a mean taken in float64 is a finite ~7.5e37 step, after which the next
    # step overflows the model (the server step is refused). Either way the model stays
    # finite in every round and every refusal names the attackers.
    fed = Federation(parse_scenario(_doc()))
    fed.attack = _Huge()
    seen = []
    evaluate = stages.evaluate

    def spy(fed_, params):
        seen.append(bool(torch.isfinite(params).all()))
        return evaluate(fed_, params)

    monkeypatch.setattr(stages, "evaluate", spy)
    res = fed.run()
    assert seen == [True] * 3
    events = [e for r in res.records for e in r.extra.get("refused", [])]
    assert events and all(e["stage"] in ("aggregate", "server_step") for e in events)
    assert all(set(e["clients"]) <= set(fed.malicious) for e in events), events


def test_a_finite_step_whose_outputs_overflow_is_refused_and_no_honest_client_is_flagged():
    # rows of 1e37 averaged in float64 are a finite step (~2.5e36 per coordinate): the
    # parameters stay finite but the model's outputs overflow, so every honest client
    # would train to NaN next round and be rejected as a false positive. The server
    # refuses that step (outputs checked on held-out inputs), keeps the model, and the
    # detection figures count no honest client.
    @dataclasses.dataclass(frozen=True, slots=True)
    class _Big(Attack):
        surfaces = (Surface.UPDATES,)

        def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
            return torch.full_like(ctx.own_updates, 1e37)

    fed = Federation(parse_scenario(_doc(federation={
        "clients": 8, "rounds": 4, "local_steps": 2, "batch_size": 8, "lr": 0.2, "malicious_fraction": 0.25,
        "partition": "iid"})))
    fed.attack = _Big()
    res = fed.run()
    assert _finite(res)
    # mean accepts the attackers every round, so every step is refused and the model kept
    assert all(r.extra.get("refused") for r in res.records)
    events = [e for r in res.records for e in r.extra["refused"]]
    assert any("outputs are not finite" in e["reason"] for e in events), events
    assert all(set(e["clients"]) <= set(fed.malicious) for e in events), events
    assert detection(res.records).fp == 0
    assert len({r.accuracy for r in res.records}) == 1  # the model never moved


def test_server_step_to_a_non_finite_model_is_refused():
    # FedAvg with η = 10 and a finite aggregate of 1e38: w + 1e39 overflows → refused, model kept
    fed = SimpleNamespace(server_opt=FedAvg(lr=10.0))
    params = torch.zeros(3)
    agg = torch.full((3,), 1e38)
    new, state, applied, event = stages.server_step(fed, params, agg, {}, [0, 1], [agg, torch.zeros(3)], [0, 1])
    assert torch.equal(new, params) and torch.equal(applied, torch.zeros(3))
    # client 0's row (1e38, 1e38, 1e38): its squared norm 3e76 overflows float32 → the suspect
    assert event["stage"] == "server_step" and event["clients"] == [0]
    # no suspicious row: every contributor is named
    *_, event = stages.server_step(fed, params, agg, {}, [0, 1], [torch.ones(3), torch.zeros(3)], [0, 1])
    assert event["clients"] == [0, 1]
    # a finite step goes through unchanged: w + 10·1 = 10
    new, _, applied, event = stages.server_step(fed, params, torch.ones(3), {}, [0], [torch.ones(3)], [0])
    assert event is None and torch.equal(new, torch.full((3,), 10.0))
