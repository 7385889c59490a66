"""Stateful defenses keep their per-client memory by client id, so a hierarchy that
regroups clients every round (grouping = "random") does not hand one client's memory to
another (issue 8 §1). Both federation tests fail on the loop before this change, where a
node's state belonged to last round's members of the node with the same key."""

from __future__ import annotations

import pytest
import torch

from defenses.clipping import CenteredClipping
from defenses.foolsgold import FoolsGold
from redteam.federation.loop import Federation
from redteam.merge import DefenseMemory
from redteam.scenario import parse_scenario


def _doc(defense):
    return {"scenario": {"seed": 2}, "workload": {"name": "digits", "hidden": 8},
            "federation": {"clients": 8, "rounds": 4, "local_steps": 1, "batch_size": 8, "lr": 0.1,
                           "partition": "iid"},
            "hierarchy": {"fan_out": 2, "depth": 2, "grouping": "random"},
            "attack": "none", "defense": defense}


def _spy(monkeypatch, cls):
    calls = []
    original = cls.decide

    def decide(self, updates, ctx):
        dec = original(self, updates, ctx)
        calls.append((ctx.round, tuple(ctx.client_ids), updates.clone(), dict(ctx.state), dec.aggregate.clone()))
        return dec

    monkeypatch.setattr(cls, "decide", decide)
    return calls


def test_foolsgold_history_follows_the_client(monkeypatch):
    calls = _spy(monkeypatch, FoolsGold)
    Federation(parse_scenario(_doc("foolsgold"))).run()
    assert len({c[0] for c in calls}) == 4
    sums: dict[int, torch.Tensor] = {}
    moved = 0
    for rnd, ids, upd, state, _ in calls:
        held = list(state.get("ids", []))
        for row, c in enumerate(ids):
            if c in sums:
                assert c in held, f"round {rnd}: client {c}'s history missing from its node's state"
                assert torch.allclose(state["history"][held.index(c)], sums[c], atol=1e-6)
                moved += 1
        for row, c in enumerate(ids):
            sums[c] = sums.get(c, torch.zeros_like(upd[row])) + upd[row]
    assert moved == 8 * 3


def test_centered_clipping_starts_from_its_members_last_centres(monkeypatch):
    # rule: with random regrouping a node starts from the mean, over its members, of the
    # aggregate of the node each member was in last round
    calls = _spy(monkeypatch, CenteredClipping)
    Federation(parse_scenario(_doc({"name": "centered_clipping", "tau": 0.5}))).run()
    last: dict[int, torch.Tensor] = {}
    checked = 0
    for rnd, ids, _, state, out in calls:
        if rnd > 0:
            want = torch.stack([last[c].to(torch.float64) for c in sorted(ids)]).mean(0).to(torch.float32)
            assert torch.allclose(state["previous"], want, atol=1e-7), f"round {rnd}, node {ids}"
            checked += 1
        for c in ids:
            last[c] = out
    assert checked == 2 * 3


def test_memory_by_hand():
    # round 1: node 0.0 = {0, 1} (FoolsGold-like history rows h0, h1; centre a),
    #          node 0.1 = {2, 3} (rows h2, h3; centre b)
    # round 2: node 0.0 = {0, 2}: ids [0, 2], rows [h0, h2], centre (a + b)/2
    #          node 0.1 = {1, 3, 4}: ids [1, 3] (4 is new), centre (a + b)/2 (4 brings nothing)
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])
    h = {c: torch.full((2,), float(c)) for c in range(4)}
    mem = DefenseMemory(regrouped=True)
    mem.record({"0.0": {"ids": [0, 1], "history": torch.stack([h[0], h[1]]), "previous": a},
                "0.1": {"ids": [2, 3], "history": torch.stack([h[2], h[3]]), "previous": b},
                "1.0": {"upper": 1}}, [[0, 1], [2, 3]])
    s0 = mem.start("0.0", [0, 2])
    assert s0["ids"] == [0, 2] and torch.equal(s0["history"], torch.stack([h[0], h[2]]))
    assert torch.allclose(s0["previous"], torch.tensor([0.5, 1.5]))
    s1 = mem.start("0.1", [1, 3, 4])
    assert s1["ids"] == [1, 3] and torch.equal(s1["history"], torch.stack([h[1], h[3]]))
    assert torch.allclose(s1["previous"], torch.tensor([0.5, 1.5]))
    assert mem.start("1.0", []) == {"upper": 1}
    assert mem.start("0.0", [7]) == {}


def test_fixed_grouping_keeps_node_state():
    # flat / region / hash: a node's own state is what it gets back (node-level parts by key)
    mem = DefenseMemory(regrouped=False)
    st = {"previous": torch.tensor([1.0])}
    mem.record({"0.0": st}, [[0, 1, 2]])
    assert mem.start("0.0", [0, 2]) == st
    assert mem.start("0.0", []) == st


@pytest.mark.parametrize("grouping", ["region"])
def test_pipeline_state_is_rebuilt_stage_by_stage(grouping):
    mem = DefenseMemory(regrouped=True)
    mem.record({"0.0": {"0": {}, "1": {"ids": [5], "history": torch.ones(1, 2)}},
                "0.1": {"0": {}, "1": {"ids": [6], "history": torch.zeros(1, 2)}}}, [[5], [6]])
    s = mem.start("0.0", [6, 5])
    assert s["1"]["ids"] == [5, 6] and torch.equal(s["1"]["history"], torch.tensor([[1.0, 1.0], [0.0, 0.0]]))


def test_node_level_matrix_with_as_many_rows_as_ids_is_not_gathered():
    # FLDetector keeps node-level (m, d) L-BFGS pairs "s"/"y" (oldest first) beside its
    # per-client "rows". After a churned client is kept at the front (FLDetector lists kept
    # ids first), ids = [2, 0, 1]; with m = 3 stored pairs, "s" has as many rows as there
    # are ids. By hand: s is history, not one row per client, so a flat merge must hand
    # it back unchanged (rows s0, s1, s2 in that order); "rows" is per client, so node
    # {0, 1, 2} gets ids [0, 1, 2] and rows [r0, r1, r2] = [rows[1], rows[2], rows[0]].
    s = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    rows = torch.tensor([[20.0, 2.0], [0.0, 0.0], [10.0, 1.0]])  # clients 2, 0, 1
    st = {"ids": [2, 0, 1], "rows": rows, "s": s, "y": -s, "per_client": ["rows", "distances", "flagged"],
          "distances": {2: [0.5], 0: [0.25], 1: [0.25]}, "flagged": {2: 4}}
    mem = DefenseMemory(regrouped=False)
    mem.record({"0.0": st}, [[0, 1, 2]])
    got = mem.start("0.0", [0, 1, 2])
    assert torch.equal(got["s"], s) and torch.equal(got["y"], -s)
    assert got["ids"] == [0, 1, 2] and torch.equal(got["rows"], rows[[1, 2, 0]])
    assert got["flagged"] == {2: 4}


def test_per_client_mappings_follow_the_client_under_regrouping():
    # FLDetector's "flagged" / "distances" are dicts keyed by client id. Round 1: node 0.0 =
    # {0, 1} flagged nobody, node 0.1 = {2, 3} flagged client 3 in round 1. Round 2 regroups
    # {0, 3}: by hand the node must know client 3 was flagged (from node 0.1) and client 0's
    # distances (from node 0.0); taking the lowest-id member's node dicts would lose 3's flag.
    z = torch.zeros(2, 2)
    per = ["rows", "distances", "flagged"]
    mem = DefenseMemory(regrouped=True)
    mem.record({"0.0": {"ids": [0, 1], "rows": z, "per_client": per, "distances": {0: [0.1], 1: [0.2]},
                        "flagged": {}},
                "0.1": {"ids": [2, 3], "rows": z + 1, "per_client": per, "distances": {2: [0.3], 3: [0.4]},
                        "flagged": {3: 1}}}, [[0, 1], [2, 3]])
    got = mem.start("0.0", [0, 3])
    assert got["ids"] == [0, 3] and torch.equal(got["rows"], torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert got["flagged"] == {3: 1}
    assert got["distances"] == {0: [0.1], 3: [0.4]}


def test_fldetector_history_survives_churn_in_a_flat_merge():
    # FLDetector(window = 3) through DefenseMemory, flat: rounds 0–4 with clients 0–3, round 5
    # without client 3, round 6 with all four. Round 5's node state holds ids [0, 1, 2] and
    # 3 L-BFGS pairs, so its (3, d) history "s" has one row per id by coincidence; client 3's
    # row comes from round 4's state (4 ids). By hand: round 6 must start from exactly the
    # pairs round 5 stored, oldest first (the server's history, not one row per client), and
    # rows of clients 0, 1, 2 from round 5, client 3's from round 4. Before the fix "s"/"y"
    # were taken for per-client rows, found missing for client 3 and dropped: the history
    # restarted, and detection stopped for a whole window.
    from defenses.fldetector import FLDetector
    from redteam.types import ServerContext

    fl, d = FLDetector(window=3), 3
    gen = torch.Generator().manual_seed(0)
    mem = DefenseMemory(regrouped=False)
    kept: dict[int, dict] = {}
    for rnd in range(7):
        ids = [0, 1, 2] if rnd == 5 else [0, 1, 2, 3]
        upd = torch.randn(len(ids), d, generator=gen)
        state = mem.start("0.0", ids)
        if rnd == 6:
            assert state["s"].shape == (3, d)
            assert torch.equal(state["s"], kept[5]["s"]) and torch.equal(state["y"], kept[5]["y"])
            assert state["ids"] == [0, 1, 2, 3]
            assert torch.equal(state["rows"], torch.cat([kept[5]["rows"], kept[4]["rows"][3:]]))
        ctx = ServerContext.default(upd, round=rnd, global_params=torch.randn(d, generator=gen),
                                    previous_update=torch.randn(d, generator=gen), state=state,
                                    client_ids=tuple(ids))
        kept[rnd] = dict(fl.decide(upd, ctx).state)
        mem.record({"0.0": kept[rnd]}, [ids])
    assert kept[5]["ids"] == [0, 1, 2] and kept[4]["ids"] == [0, 1, 2, 3]


def test_a_declared_key_missing_from_one_members_state_is_not_a_crash():
    # Node 0.0's state has no "flagged" dict (an older state); node 0.1's flagged client 3.
    # Regrouped {0, 3}: by hand, flagged = {3: 1} (what is known), rows from both nodes.
    per = ["rows", "flagged"]
    mem = DefenseMemory(regrouped=True)
    mem.record({"0.0": {"ids": [0], "rows": torch.zeros(1, 2), "per_client": per},
                "0.1": {"ids": [3], "rows": torch.ones(1, 2), "per_client": per, "flagged": {3: 1}}},
               [[0], [3]])
    got = mem.start("0.0", [0, 3])
    assert got["ids"] == [0, 3] and got["flagged"] == {3: 1}
    assert torch.equal(got["rows"], torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
