"""Per-client state: worker momentum, local AdamW, epoch-style sampling, kept by client id
across rounds and churn. Expected values are derived by hand in the comments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _toy import toy
from redteam.federation.loop import Federation
from redteam.federation.state import ClientStates, apply_momentum
from redteam.federation.training import LocalTraining, _Sampler
from redteam.scenario import parse_scenario
from redteam.types import Attack, AttackContext, Surface


def _ids(*c):
    return torch.tensor(c, dtype=torch.long)


def test_momentum_sgd_form_by_hand():
    # beta = 0.9; client 0 sends Δ=(1, 2) then (3, 0): m1 = (1, 2); m2 = 0.9·(1, 2) + (3, 0) = (3.9, 1.8)
    s = ClientStates(2, torch.device("cpu"))
    out1 = apply_momentum(s, _ids(0), torch.tensor([[1.0, 2.0]]), 0.9)
    out2 = apply_momentum(s, _ids(0), torch.tensor([[3.0, 0.0]]), 0.9)
    assert out1.tolist() == [[1.0, 2.0]]
    assert torch.allclose(out2, torch.tensor([[3.9, 1.8]]))


def test_momentum_ema_form_by_hand():
    # ema: m1 = 0.1·(1, 2) = (0.1, 0.2); m2 = 0.1·(3, 0) + 0.9·(0.1, 0.2) = (0.39, 0.18)
    s = ClientStates(1, torch.device("cpu"))
    apply_momentum(s, _ids(0), torch.tensor([[1.0, 2.0]]), 0.9, "ema")
    out = apply_momentum(s, _ids(0), torch.tensor([[3.0, 0.0]]), 0.9, "ema")
    assert torch.allclose(out, torch.tensor([[0.39, 0.18]]))


def test_momentum_zero_is_identity_and_keeps_no_state():
    s = ClientStates(2, torch.device("cpu"))
    x = torch.tensor([[1.0], [2.0]])
    assert apply_momentum(s, _ids(0, 1), x, 0.0) is x
    assert not s.has("momentum")


def test_momentum_survives_churn_by_client_id():
    # round 1: clients 0, 1 send (1), (10); round 2: only client 1, Δ = (1): m = 0.5·10 + 1 = 6;
    # round 3: client 0 is back with Δ = (2): its m = 0.5·1 + 2 = 2.5 (kept while offline, not decayed)
    s = ClientStates(2, torch.device("cpu"))
    apply_momentum(s, _ids(0, 1), torch.tensor([[1.0], [10.0]]), 0.5)
    assert apply_momentum(s, _ids(1), torch.tensor([[1.0]]), 0.5).item() == 6.0
    assert apply_momentum(s, _ids(0), torch.tensor([[2.0]]), 0.5).item() == 2.5


def _adamw(**kw):
    return LocalTraining(steps=1, batch_size=1, lr=0.1, optimizer="adamw", **kw)


def test_adamw_two_rounds_by_hand():
    # w·x with x = 1, y = 1, global w = 0 each round, one local step per round.
    # round 1 (t=1): g = −1; m = −0.1, v = 0.001; m̂ = −1, v̂ = 1; w = 0 + 0.1·1/(1 + 1e-8) ≈ 0.1
    # round 2 starts again from w = 0 with the kept state (t=2): g = −1;
    #   m = 0.9·(−0.1) − 0.1 = −0.19, v = 0.999·0.001 + 0.001 = 0.001999
    #   m̂ = −0.19/0.19 = −1, v̂ = 0.001999/0.001999 = 1  →  w ≈ 0.1 again, t = 2
    trainer, data, w0 = toy(d=1, n=1)
    states = ClientStates(1, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    w1 = trainer.train(w0, data, _ids(0), _adamw(), gen, states=states)
    assert w1.item() == pytest.approx(0.1, rel=1e-6)
    w2 = trainer.train(w0, data, _ids(0), _adamw(), gen, states=states)
    assert w2.item() == pytest.approx(0.1, rel=1e-6)
    assert states.tensors["adamw_t"].tolist() == [2]
    assert states.tensors["adamw_m"].item() == pytest.approx(-0.19)
    assert states.tensors["adamw_v"].item() == pytest.approx(0.001999)


def test_adamw_matches_torch_adamw_across_rounds_and_churn():
    # three clients; client 0 sits out round 2 (churn) and keeps its state: its three
    # rounds equal torch.optim.AdamW run for its two participating rounds only
    trainer, data, w0 = toy(d=2, n=3, x=[1.0, -2.0], y=0.5)
    cfg = dataclasses.replace(_adamw(weight_decay=0.05, betas=(0.8, 0.99)), steps=2)
    states = ClientStates(3, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    rounds = [(_ids(0, 1, 2), torch.tensor([0.3, 0.1])), (_ids(1, 2), torch.tensor([0.2, 0.0])),
              (_ids(0, 1, 2), torch.tensor([-0.1, 0.4]))]
    got = [trainer.train(g, data, part, cfg, gen, states=states) for part, g in rounds]

    w = torch.zeros(2, requires_grad=True)
    opt = torch.optim.AdamW([w], lr=0.1, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.05)
    ref = []
    for part, g in (rounds[0], rounds[2]):
        with torch.no_grad():
            w.copy_(g)
        for _ in range(2):
            opt.zero_grad()
            loss = 0.5 * ((w @ torch.tensor([1.0, -2.0]) - 0.5) ** 2)
            loss.backward()
            opt.step()
        ref.append(w.detach().clone())
    assert torch.allclose(got[0][0], ref[0], atol=1e-6)
    assert torch.allclose(got[2][0], ref[1], atol=1e-6)
    assert states.tensors["adamw_t"].tolist() == [4, 6, 6]


def test_adamw_needs_states():
    trainer, data, w0 = toy(d=1, n=1)
    with pytest.raises(ValueError, match="per-client states"):
        trainer.train(w0, data, _ids(0), _adamw(), torch.Generator())


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4), batch=st.integers(1, 4),
       steps=st.integers(1, 12), seed=st.integers(0, 2**31))
def test_without_replacement_stream_is_a_sequence_of_permutations(sizes, batch, steps, seed):
    """Each client's stream of drawn positions, across two rounds, cut into epochs of its
    size, is a run of permutations of 0..size−1 (no item twice before all were seen)."""
    n = len(sizes)
    states = ClientStates(n, torch.device("cpu"))
    clients = torch.arange(n)
    sz = torch.tensor(sizes)
    gen = torch.Generator().manual_seed(seed)
    drawn = []
    for _round in range(2):
        sampler = _Sampler(states, clients, sz, batch, max(sizes))
        drawn += [sampler.next(gen) for _ in range(steps)]
        sampler.save()
    stream = torch.cat(drawn, dim=1)
    for c, size in enumerate(sizes):
        row = stream[c].tolist()
        for e in range(len(row) // size):
            assert sorted(row[e * size:(e + 1) * size]) == list(range(size)), (c, row)
        tail = row[(len(row) // size) * size:]
        assert len(set(tail)) == len(tail) and all(0 <= i < size for i in tail)


# ------------------------------------------------------------------ in the federation
def _doc(**fed):
    return {"scenario": {"seed": 1}, "workload": {"name": "digits", "hidden": 8},
            "federation": {"clients": 6, "rounds": 3, "local_steps": 1, "batch_size": 4, "lr": 0.1,
                           "malicious_fraction": 0.34, "partition": "iid", **fed},
            "attack": "none", "defense": "mean"}


@dataclasses.dataclass(frozen=True, slots=True)
class _Spy(Attack):
    surfaces = (Surface.UPDATES,)
    omniscient = True
    seen: list = dataclasses.field(default_factory=list)

    def craft_updates(self, ctx: AttackContext) -> torch.Tensor:
        self.seen.append(ctx)
        ctx.attack_state["calls"] = ctx.attack_state.get("calls", 0) + 1
        return ctx.own_updates


def test_federation_momentum_and_visible_sent_vectors(monkeypatch):
    """Local training replaced by fixed deltas Δ(c, r) = (c+1)(r+1)·0.001·1: with β = 0.5
    the honest clients send m0 = Δ0 = (c+1)·0.001, m1 = 0.5·m0 + 2(c+1)·0.001 = 2.5(c+1)·0.001,
    m2 = 0.5·m1 + 3(c+1)·0.001 = 4.25(c+1)·0.001 — what the omniscient attacker sees."""
    fed = Federation(parse_scenario(_doc(client_momentum=0.5)))
    spy = _Spy()
    fed.attack, fed.omniscient = spy, True
    calls = {"r": 0}

    def fixed(params, data, clients, cfg, gen, **kw):
        r = calls["r"]
        calls["r"] += 1
        scale = (clients.to(torch.float32) + 1)[:, None] * (r + 1) * 1e-3
        return params + scale * torch.ones_like(params)

    monkeypatch.setattr(fed.trainer, "train", fixed)
    fed.run()
    coef = [1.0, 2.5, 4.25]
    for r, ctx in enumerate(spy.seen):
        assert ctx.visible_clients == tuple(c for c in range(6) if c not in fed.malicious)
        want = torch.tensor([(c + 1) * coef[r] * 1e-3 for c in ctx.visible_clients])
        assert torch.allclose(ctx.visible_updates[:, 0], want, rtol=1e-5), (r, ctx.visible_updates[:, 0], want)
        assert ctx.attack_state is spy.seen[0].attack_state
    assert spy.seen[-1].attack_state["calls"] == 3


def test_label_sorted_defaults_to_iid_overlap_and_honest_keep_their_shards():
    # 20 clients, 7 malicious: 13 honest shards of ~103 images of a label-sorted pool of
    # ~1,340 (~135 per class): each honest shard spans at most one class boundary
    fed = Federation(parse_scenario(_doc(partition="label_sorted", clients=20)))
    assert fed.scenario.federation.malicious_data_rule == "iid_overlap"
    sizes = fed.data.sizes.tolist()
    pool = len(fed.data.x) - sum(sizes[c] for c in fed.malicious)
    honest = [c for c in range(20) if c not in fed.malicious]
    # the honest clients split the whole pool (nothing taken by attackers); 1–2 classes each
    assert sum(sizes[c] for c in honest) == pool
    for c in honest:
        assert len(torch.unique(fed.data.client(c).y)) <= 2
    for c in fed.malicious:  # an IID sample of ⌊pool / n⌋: many classes
        assert sizes[c] == pool // 20 and len(torch.unique(fed.data.client(c).y)) >= 8


def test_training_seed_changes_model_and_batches_not_data_or_roles():
    a = Federation(parse_scenario(_doc()))
    b = Federation(parse_scenario({**_doc(), "scenario": {"seed": 1, "training_seed": 7}}))
    assert a.malicious == b.malicious and torch.equal(a.data.x, b.data.x)
    assert not torch.equal(a.params0, b.params0)


def test_root_samples_auto_and_explicit():
    assert Federation(parse_scenario(_doc(root_samples="auto"))).root is None
    assert Federation(parse_scenario(_doc(root_samples=0))).root is None
    assert len(Federation(parse_scenario(_doc(root_samples=10))).root.y) == 10
    assert len(Federation(parse_scenario(_doc())).root.y) == 64
    auto_fl = Federation(parse_scenario({**_doc(root_samples="auto"), "defense": "fltrust"}))
    assert len(auto_fl.root.y) == 64


def test_new_keys_are_validated():
    from redteam.errors import InvalidScenario

    for bad in ({"client_momentum": 1.0}, {"momentum_form": "adam"}, {"sampling": "sometimes"},
                {"local_optimizer": "lion"}, {"root_samples": -1}, {"root_samples": "some"},
                {"malicious_data": "all"}, {"local_betas": [0.9]}, {"partition": "sorted"}):
        with pytest.raises(InvalidScenario):
            parse_scenario(_doc(**bad))


def test_adamw_and_sampling_in_a_federation_run():
    res = Federation(parse_scenario(_doc(local_optimizer="adamw", lr=0.01, sampling="without_replacement",
                                         local_steps=3, client_momentum=0.9))).run()
    assert all(np.isfinite(r.loss) for r in res.records)


def test_karimireddy_setting_is_expressible_and_runs():
    """The bucketing paper's digits setting: label-sorted honest shards, attackers with an
    IID overlapping sample, one local step per round, worker momentum 0.9, epoch-style
    batches, centered clipping against an omniscient attack; scored by the mean of the
    last k evaluations."""
    from redteam.scoring import summarize

    doc = _doc(partition="label_sorted", client_momentum=0.9, local_steps=1, batch_size=8,
               sampling="without_replacement", root_samples="auto", last_k=2, clients=10, rounds=3,
               malicious_fraction=0.2)
    doc.update(attack={"name": "ipm", "epsilon": 0.1}, defense={"name": "centered_clipping", "tau": 1.0})
    sc = parse_scenario(doc)
    fed = Federation(sc)
    assert fed.root is None and sc.federation.malicious_data_rule == "iid_overlap"
    res = fed.run()
    assert all(np.isfinite(r.loss) for r in res.records)
    m = summarize(res.records, last_k=sc.federation.last_k)
    assert m["final_accuracy_last_k"] == pytest.approx((res.records[-1].accuracy + res.records[-2].accuracy) / 2)


def test_sgd_weight_decay_is_coupled_l2():
    # w·x, x = 1, y = 1, w_g = 0.5, λ = 0.2, lr 0.1: g = (0.5 − 1) + 0.2·0.5 = −0.4 → w = 0.54
    trainer, data, _ = toy(d=1, n=1)
    cfg = LocalTraining(steps=1, batch_size=1, lr=0.1, weight_decay=0.2)
    w = trainer.train(torch.tensor([0.5]), data, _ids(0), cfg, torch.Generator())
    assert w.item() == pytest.approx(0.54)


def _epoch_trainer():
    from redteam.federation.params import ParamSpec
    from redteam.federation.training import BatchedTrainer, StackedData
    from redteam.types import ClientData
    from _toy import ToyWorkload

    model = torch.nn.Linear(1, 1, bias=False)
    data = StackedData.stack([ClientData(torch.arange(10.0).reshape(10, 1), torch.ones(10, 1)) for _ in range(2)])
    return BatchedTrainer(ToyWorkload(), model, ParamSpec.of(model)), data


def test_epoch_sampler_advances_only_for_steps_a_client_runs():
    # Two clients of 10 items, batch 4, 2 local steps, epoch-style sampling. By hand: a
    # client that runs 2 steps has taken 8 items of its first permutation, so its position
    # is 8 and its permutation unchanged — whether or not the attacker's training hook
    # gives client 1 four steps (steps 3–4 are the attacker's alone: the honest stream must
    # be the same as in the baseline run). A straggler that runs only 1 step (partial work,
    # client_steps) has taken 4 items: position 4. Before the fix every client's sampler
    # moved on every step of the longest client (position 6 in a fresh permutation).
    from redteam.types import TrainingHook

    trainer, data = _epoch_trainer()
    cfg = LocalTraining(steps=2, batch_size=4, lr=0.01, sampling="without_replacement")
    got = {}
    for name, kw in (("plain", {}), ("hooked", {"hook": TrainingHook(steps=4), "hook_rows": [1],
                                              "hook_generator": torch.Generator().manual_seed(9)})):
        st_ = ClientStates(2, torch.device("cpu"))
        trainer.train(torch.zeros(1), data, _ids(0, 1), cfg, torch.Generator().manual_seed(0), states=st_, **kw)
        got[name] = (int(st_.tensors["sampler_pos"][0]), st_.tensors["sampler_perm"][0].tolist())
    assert got["plain"][0] == 8 and got["hooked"] == got["plain"]
    st_ = ClientStates(2, torch.device("cpu"))
    trainer.train(torch.zeros(1), data, _ids(0, 1), cfg, torch.Generator().manual_seed(0), states=st_,
                  client_steps=torch.tensor([1, 2]))
    assert st_.tensors["sampler_pos"].tolist() == [4, 8]
