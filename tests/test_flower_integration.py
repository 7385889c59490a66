"""redteam inside Flower (redteam.integrations.flower): the wrapped defense's aggregate is redteam's
own on the same rows, its memory follows Flower's node ids, it agrees with Flower's built-in of the
same rule, and the client mod / colluding stand-in send the attack's rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr", reason="Flower is not installed (pip install 'redteam[flower]')")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg, FedMedian, FedTrimmedAvg, Krum as FlowerKrum  # noqa: E402

from _flower_local import LocalGrid, reply  # noqa: E402
from redteam.errors import InvalidParameter  # noqa: E402
from redteam.integrations.flower import AttackMod, ColludingAttack, DefenseStrategy, poison  # noqa: E402
from redteam.integrations.flower._records import flatten, layout_of, unflatten  # noqa: E402
from redteam.merge import DefenseMemory  # noqa: E402
from redteam.registry import ATTACKS, DEFENSES  # noqa: E402
from redteam.types import AttackContext, ServerContext  # noqa: E402

SHAPES = {"fc.weight": (4, 3), "fc.bias": (4,), "out.weight": (2, 4)}
D = sum(int(np.prod(s)) for s in SHAPES.values())


def record(vec: np.ndarray) -> ArrayRecord:
    out, start = {}, 0
    for k, s in SHAPES.items():
        size = int(np.prod(s))
        out[k] = Array(vec[start:start + size].reshape(s).astype(np.float32))
        start += size
    return ArrayRecord(out)


def round_of(strategy, g: np.ndarray, locals_: dict[int, np.ndarray], sizes: dict[int, int], rnd: int = 1):
    """Configure round ``rnd`` with global ``g`` and aggregate the replies ``locals_`` (node → model),
    given in reverse node order."""
    grid = LocalGrid(None, sorted(locals_))
    strategy.configure_train(rnd, record(g), ConfigRecord(), grid)
    replies = [reply(node, record(locals_[node]), sizes[node]) for node in sorted(locals_, reverse=True)]
    return strategy.aggregate_train(rnd, replies)


def redteam_rows(g: np.ndarray, locals_: dict[int, np.ndarray]) -> torch.Tensor:
    """The rows redteam's own engine would see: local − global in float32, nodes in id order."""
    gt = torch.from_numpy(g.astype(np.float32))
    return torch.stack([torch.from_numpy(locals_[k].astype(np.float32)) - gt for k in sorted(locals_)])


def federation(n: int, seed: int = 0, nodes: list[int] | None = None):
    rng = np.random.default_rng(seed)
    g = rng.normal(0, 0.5, D).astype(np.float32)
    nodes = nodes or sorted({int(x) for x in rng.integers(0, 2**64, size=n, dtype=np.uint64)})  # 64-bit, as Flower's
    locals_ = {node: (g + rng.normal(0, 0.05, D)).astype(np.float32) for node in nodes}
    sizes = {node: int(rng.integers(5, 50)) for node in nodes}
    return g, locals_, sizes


def as_vec(arrays: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.numpy().ravel() for a in arrays.values()])


# ------------------------------------------------------------------ the wrapped defense = redteam's own
@pytest.mark.parametrize("name, params", [("trimmed_mean", {"b": 2}), ("krum", {"f": 1}), ("median", {})])
def test_wrapped_stateless_aggregate_is_redteams_own_bit_for_bit(name, params):
    g, locals_, sizes = federation(7)
    bad = sorted(locals_)[3]
    locals_[bad] = g - 4.0 * (locals_[bad] - g)  # one flipped update, for krum to leave out
    strategy = DefenseStrategy(name, params)
    arrays, metrics = round_of(strategy, g, locals_, sizes)
    rows = redteam_rows(g, locals_)
    w = torch.tensor([float(sizes[k]) for k in sorted(locals_)])
    dec = DEFENSES.create(name, params)(rows, ServerContext(n_clients=7, weights=w, global_params=torch.from_numpy(g),
                                                            client_ids=tuple(range(7))))
    expected = torch.from_numpy(g) + dec.aggregate
    # tolerance: none. The wrapper hands the defense the same float32 rows and adds the same
    # float32 aggregate to the same float32 global model.
    assert np.array_equal(as_vec(arrays), expected.numpy())
    assert metrics["redteam-accepted"] == int(dec.accepted.sum())
    assert metrics["redteam-rejected"] == 7 - int(dec.accepted.sum())
    last = strategy.history[-1]
    if name == "krum":
        assert bad in last.rejected and "Krum" in last.rejected[bad]
        assert metrics["redteam-accepted"] == 1


def test_wrapped_defense_sees_flower_weights_and_round():
    seen = []

    class Spy(DEFENSES.get("mean")):  # a registered rule, observed
        def decide(self, updates, ctx):
            seen.append(ctx)
            return super().decide(updates, ctx)

    g, locals_, sizes = federation(4)
    strategy = DefenseStrategy(Spy())
    round_of(strategy, g, locals_, sizes, rnd=1)
    arrays, _ = round_of(strategy, g, locals_, sizes, rnd=2)
    ctx = seen[-1]
    assert ctx.round == 1  # Flower's round 2 is redteam's round 1 (0-based)
    assert ctx.weights.tolist() == [float(sizes[k]) for k in sorted(locals_)]
    assert ctx.previous_update is not None and ctx.client_ids == (0, 1, 2, 3)
    w = torch.tensor([float(sizes[k]) for k in sorted(locals_)])
    rows = redteam_rows(g, locals_)
    expected = (w[:, None] * rows).sum(0) / w.sum()  # the sample-weighted mean: num-examples are the weights
    assert np.allclose(as_vec(arrays) - g, expected.numpy(), atol=1e-6)


def _memory_run(name: str, params: dict, rounds: list[dict[int, np.ndarray]], g: np.ndarray,
                sizes: dict[int, int]):
    """(wrapped aggregates, redteam's own aggregates) over ``rounds`` (each: node → model)."""
    strategy = DefenseStrategy(name, params)
    ids: dict[int, int] = {}
    memory = DefenseMemory(regrouped=False)
    prev = None
    got, want = [], []
    rule = DEFENSES.create(name, params)
    gen = torch.Generator().manual_seed(0)
    for r, locals_ in enumerate(rounds, start=1):
        arrays, _ = round_of(strategy, g, locals_, sizes, rnd=r)
        got.append(as_vec(arrays))
        members = [ids.setdefault(k, len(ids)) for k in sorted(locals_)]
        w = torch.tensor([float(sizes[k]) for k in sorted(locals_)])
        ctx = ServerContext(round=r - 1, n_clients=len(members), weights=w, global_params=torch.from_numpy(g),
                            previous_update=prev, generator=gen, state=memory.start("0.0", members),
                            client_ids=tuple(members))
        dec = rule(redteam_rows(g, locals_), ctx)
        memory.record({"0.0": dict(dec.state)}, [members])
        prev = dec.aggregate
        want.append((torch.from_numpy(g) + dec.aggregate).numpy())
    return got, want


def test_stateful_memory_follows_node_ids_through_a_dropout():
    """FoolsGold's per-client history is keyed by client: a node that skips round 2 gets its own
    history back in round 3, whatever position it replies in."""
    g, first, sizes = federation(5, seed=3)
    nodes = sorted(first)
    rng = np.random.default_rng(9)
    sybil = rng.normal(0, 0.05, D).astype(np.float32)
    rounds = []
    for r in range(3):
        locals_ = {k: (g + rng.normal(0, 0.05, D)).astype(np.float32) for k in nodes}
        for k in nodes[3:]:
            locals_[k] = g + sybil + rng.normal(0, 0.005, D).astype(np.float32)  # two look-alikes
        if r == 1:
            del locals_[nodes[0]]  # node 0 drops out of round 2: every other node shifts position
        rounds.append(locals_)
    got, want = _memory_run("foolsgold", {}, rounds, g, sizes)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    assert not np.allclose(got[2], got[0])  # the history matters: round 3 is not round 1 again


def test_node_level_memory_is_carried():
    """Centered clipping starts from the previous aggregate (node-level state)."""
    g, locals_, sizes = federation(5, seed=4)
    got, want = _memory_run("centered_clipping", {"tau": 0.05, "n_iter": 1}, [locals_, locals_], g, sizes)
    assert np.array_equal(got[1], want[1])
    assert not np.array_equal(got[1], got[0])


def test_refused_round_keeps_the_model_and_says_so():
    g, locals_, sizes = federation(3)
    strategy = DefenseStrategy("krum", {"f": 1})  # 2f + 2 < n needs n ≥ 5
    arrays, metrics = round_of(strategy, g, locals_, sizes)
    assert arrays is None and metrics["redteam-refused"] == 1 and metrics["redteam-rejected"] == 0
    assert "Krum" in strategy.history[-1].refused


@pytest.mark.parametrize("defense, why", [("fltrust", "server"), ("signed_chunks", "acts at")])
def test_defenses_a_flower_server_cannot_serve_are_refused_by_name(defense, why):
    with pytest.raises(InvalidParameter, match=why):
        DefenseStrategy(defense)


def test_malicious_count_fills_trimmed_mean_b():
    assert DefenseStrategy("trimmed_mean", malicious=3).defense.b == 3
    with pytest.raises(InvalidParameter, match="TrimmedMean.b is unset.*malicious=f"):
        DefenseStrategy("trimmed_mean")


def test_a_reply_with_other_arrays_is_refused_naming_the_node():
    g, locals_, sizes = federation(4)
    strategy = DefenseStrategy("median")
    grid = LocalGrid(None, sorted(locals_))
    strategy.configure_train(1, record(g), ConfigRecord(), grid)
    odd = sorted(locals_)[1]
    wrong = ArrayRecord({k: Array(np.zeros((2, 2) if k == "fc.bias" else s, np.float32)) for k, s in SHAPES.items()})
    replies = [reply(k, record(v) if k != odd else wrong, sizes[k]) for k, v in locals_.items()]
    with pytest.raises(InvalidParameter, match=rf"node {odd}: array 'fc.bias' has shape \(2, 2\), expected \(4,\)"):
        strategy.aggregate_train(1, replies)


def test_records_round_trip_dtypes():
    rec = ArrayRecord({"w": Array(np.arange(6, dtype=np.float64).reshape(2, 3) / 3),
                       "n": Array(np.array(7, dtype=np.int64))})
    lay = layout_of(rec)
    back = unflatten(flatten(rec, lay) + 0.4, lay)
    assert back["n"].numpy().dtype == np.int64 and int(back["n"].numpy()) == 7  # rounded back
    assert back["w"].numpy().dtype == np.float64
    assert np.allclose(back["w"].numpy(), np.arange(6).reshape(2, 3) / 3 + 0.4, atol=1e-6)


# ------------------------------------------------------------------ beside Flower's own built-ins
@pytest.mark.parametrize("n, beta, b", [(10, 0.2, 2), (10, 0.25, 2), (7, 0.3, 2), (10, 0.3, 3), (5, 0.19, 0)])
def test_trimmed_mean_agrees_with_flowers_fedtrimmedavg(n, beta, b):
    """Flower's beta is the fraction cut per side: it trims ⌊beta·n⌋ values from each end, so ours
    with b = ⌊beta·n⌋ is the same rule. Flower trims the models, we trim the updates (models −
    global): equal in exact arithmetic, within float32 rounding here."""
    assert int(beta * n) == b
    g, locals_, sizes = federation(n, seed=n)
    ours, _ = round_of(DefenseStrategy("trimmed_mean", {"b": b}), g, locals_, sizes)
    replies = [reply(k, record(v), sizes[k]) for k, v in locals_.items()]
    theirs, _ = FedTrimmedAvg(beta=beta).aggregate_train(1, replies)
    diff = np.abs(as_vec(ours) - as_vec(theirs)).max()
    assert diff <= 1e-6, diff  # |values| ≤ ~2: a few float32 ulps
    if b:  # and it is not the plain mean: the trimming is what agrees
        mean = np.mean([locals_[k] for k in locals_], axis=0)
        assert np.abs(as_vec(theirs) - mean).max() > 1e-4


@pytest.mark.parametrize("n, rule, same", [(7, "midpoint", True), (8, "midpoint", True), (8, "lower", False)])
def test_median_agrees_with_flowers_fedmedian(n, rule, same):
    """Flower's FedMedian is numpy's median: for an even n the midpoint of the two middle values,
    our default even_rule; ``even_rule="lower"`` is another rule, and the comparison sees it."""
    g, locals_, sizes = federation(n, seed=20 + n)
    ours, _ = round_of(DefenseStrategy("median", {"even_rule": rule}), g, locals_, sizes)
    theirs, _ = FedMedian().aggregate_train(1, [reply(k, record(v), sizes[k]) for k, v in locals_.items()])
    diff = np.abs(as_vec(ours) - as_vec(theirs)).max()
    assert (diff <= 1e-6) == same, diff


def test_krum_selects_what_flowers_krum_selects():
    """Both score each model by its n − f − 2 nearest squared distances and keep the lowest."""
    g, locals_, sizes = federation(8, seed=5)
    for k in sorted(locals_)[:2]:
        locals_[k] = g + 3.0 * (locals_[k] - g)
    strategy = DefenseStrategy("krum", {"f": 2})
    ours, _ = round_of(strategy, g, locals_, sizes)
    replies = [reply(k, record(v), sizes[k]) for k, v in locals_.items()]
    theirs, _ = FlowerKrum(num_malicious_nodes=2).aggregate_train(1, replies)
    chosen = strategy.history[-1].accepted
    assert len(chosen) == 1 and np.allclose(as_vec(theirs), locals_[chosen[0]], atol=0)
    assert np.abs(as_vec(ours) - as_vec(theirs)).max() <= 1e-6  # ours: g + (local − g) in float32


# ------------------------------------------------------------------ the client mod
def _client_app(mods, lr=1.0):
    app = ClientApp(mods=mods)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        x, y = poison(context, np.arange(8, dtype=np.float32).reshape(4, 2), np.arange(4))
        step = np.float32(lr * (1 + int(context.node_config["partition-id"])))
        arrays = ArrayRecord({k: Array(v.numpy() + step) for k, v in msg.content["arrays"].items()})
        return Message(content=RecordDict({"arrays": arrays, "metrics": MetricRecord({
            "num-examples": 10, "labels": [int(v) for v in np.asarray(y)]})}), reply_to=msg)

    return app


def _train_once(app, nodes, g):
    grid = LocalGrid(app, nodes)
    strategy = FedAvg(min_train_nodes=len(nodes), min_available_nodes=len(nodes), fraction_evaluate=0.0)
    msgs = strategy.configure_train(1, record(g), ConfigRecord(), grid)
    return {r.metadata.src_node_id: r for r in grid.send_and_receive(msgs)}


def test_attack_mod_crafts_the_chosen_clients_update_only():
    g = np.zeros(D, np.float32) + 0.5
    nodes = [101, 102, 103]
    replies = _train_once(_client_app([AttackMod("sign_flip", {"scale": 3.0}, malicious=[1])]), nodes, g)
    got = {n: as_vec(r.content["arrays"]) - g for n, r in replies.items()}
    assert np.allclose(got[101], 1.0) and np.allclose(got[103], 3.0)  # honest: their own step
    assert np.allclose(got[102], -3.0 * 2.0)  # partition 1 stepped +2, flipped and scaled by 3


def test_attack_mod_same_row_as_redteams_attack():
    """The mod's row is the attack's craft_updates on the client's own (1, d) update."""
    g = np.linspace(-1, 1, D).astype(np.float32)
    replies = _train_once(_client_app([AttackMod("gaussian", {"std": 0.5}, malicious=[0], seed=4)]), [7, 8], g)
    row = as_vec(replies[7].content["arrays"]) - g
    from redteam.integrations.flower.attack import _generator

    gt = torch.from_numpy(g)
    own = (gt + 1.0 - gt).unsqueeze(0)
    ctx = AttackContext(round=0, n_clients=2, malicious=(0,), own_updates=own, visible_updates=own,
                        global_params=gt, generator=_generator(4, 0, 1), malicious_rows=(0,))
    want = ATTACKS.create("gaussian", {"std": 0.5}).craft_updates(ctx)[0]
    assert np.allclose(row, (gt + want - gt).numpy(), atol=1e-6)
    assert not np.allclose(row, 1.0, atol=1e-3)


def test_data_attack_poisons_only_the_chosen_clients_set():
    mod = AttackMod("label_flip", {"mapping": "reverse", "num_classes": 4}, malicious=[0])
    replies = _train_once(_client_app([mod]), [5, 6], np.zeros(D, np.float32))
    labels = {n: list(r.content["metrics"]["labels"]) for n, r in replies.items()}
    assert labels == {5: [3, 2, 1, 0], 6: [0, 1, 2, 3]}  # partition 0 trains on reversed labels
    assert poison(None, 1, 2) == (1, 2)  # outside an attacked client's training: unchanged


@pytest.mark.parametrize("attack, params, match", [
    ("alie", {}, "'alie' is omniscient.*ColludingAttack"),
    ("ipm", {}, "'ipm' is omniscient"),
    ("chunk_tamper", {}, "acts on transport"),
    ("sign_flip", {"scael": 2.0}, "did you mean 'scale'"),
])
def test_attack_mod_refuses_by_name(attack, params, match):
    with pytest.raises(InvalidParameter, match=match):
        AttackMod(attack, params, malicious=[0])


def test_alie_knowing_only_its_own_update_is_accepted():
    AttackMod("alie", {"knowledge": "own"}, malicious=[0])  # the paper's non-omniscient setting


def test_colluding_mod_without_the_server_side_wrapper_is_refused():
    app = _client_app([AttackMod("alie", malicious=[0], colluding=True)])
    replies = _train_once(app, [1, 2, 3], np.zeros(D, np.float32))
    assert all(r.has_error() for r in replies.values())
    assert "ColludingAttack" in next(iter(replies.values())).error.reason


# ------------------------------------------------------------------ the colluding stand-in (omniscient attacks)
def test_colluding_alie_replaces_the_chosen_replies_with_redteams_rows():
    n, chosen = 6, (0, 4)
    nodes = [900 + i for i in range(n)]
    app = _client_app([AttackMod("alie", malicious=chosen, colluding=True)], lr=0.1)
    g = np.random.default_rng(1).normal(0, 0.1, D).astype(np.float32)
    grid = LocalGrid(app, nodes)
    captured = {}

    class Capture(FedAvg):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            captured.update({r.content["redteam"]["partition-id"]: as_vec(r.content["arrays"]) for r in replies})
            return super().aggregate_train(server_round, replies)

    strategy = ColludingAttack(Capture(min_train_nodes=n, min_available_nodes=n, fraction_evaluate=0.0), "alie",
                               malicious=chosen)
    msgs = strategy.configure_train(1, record(g), ConfigRecord(), grid)
    strategy.aggregate_train(1, grid.send_and_receive(msgs))
    honest = torch.stack([torch.from_numpy(g + np.float32(0.1 * (1 + p))) - torch.from_numpy(g)
                          for p in range(n) if p not in chosen])
    ctx = AttackContext(round=0, n_clients=n, malicious=chosen, own_updates=honest[:2], visible_updates=honest,
                        global_params=torch.from_numpy(g), generator=torch.Generator(), malicious_rows=chosen)
    want = ATTACKS.create("alie", {}).craft_updates(ctx)
    for j, p in enumerate(chosen):
        assert np.allclose(captured[p] - g, want[j].numpy(), atol=1e-6)
    assert np.allclose(captured[1] - g, 0.2, atol=1e-6)  # an honest reply is untouched
    assert strategy.history == [(1, chosen)]


def test_colluding_wrapper_needs_tagged_replies():
    g, locals_, sizes = federation(3)
    strategy = ColludingAttack(FedAvg(), "sign_flip", malicious=[0])
    strategy.configure_train(1, record(g), ConfigRecord(), LocalGrid(None, sorted(locals_)))
    with pytest.raises(InvalidParameter, match="partition tag"):
        strategy.aggregate_train(1, [reply(k, record(v), sizes[k]) for k, v in locals_.items()])


# ------------------------------------------------------------------ a whole run
def test_strategy_start_in_process_rejects_the_flipped_clients():
    """Flower's own round loop (Strategy.start) with redteam's Multi-Krum and a sign flip by mod."""
    n = 8
    nodes = [50 + i for i in range(n)]
    app = _client_app([AttackMod("sign_flip", {"scale": 5.0}, malicious=[0, 1])], lr=0.01)
    strategy = DefenseStrategy("multi_krum", {"f": 2}, min_train_nodes=n, min_available_nodes=n,
                               fraction_evaluate=0.0)
    result = strategy.start(grid=LocalGrid(app, nodes, drop={3: {55}}), initial_arrays=record(np.zeros(D)),
                            num_rounds=3)
    assert len(strategy.history) == 3
    for rnd in strategy.history:
        assert set(rnd.rejected) >= {50, 51}
    assert len(strategy.history[1].nodes) == 7  # node 55's reply was lost in round 2
    assert result.train_metrics_clientapp[3]["redteam-rejected"] >= 2


@pytest.mark.slow  # Ray's start dominates: ~15-70 s depending on the machine's load
def test_flower_simulation_engine_runs_the_example_app_attacked_and_defended():
    """Flower's own simulation engine (Ray): the example app with 3 clients, 2 rounds, ALIE by the
    colluding stand-in on partition 0 against redteam's trimmed mean. The tags, the flag and the
    crafted rows cross Ray's transport; the defense keeps its history across the rounds."""
    import sys
    from pathlib import Path

    pytest.importorskip("ray", reason="Flower's simulation engine needs Ray (pip install 'flwr[simulation]')")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "flower_quickstart"))
    try:
        import quickstart_app as Q
    finally:
        sys.path.pop(0)
    setup = Q.Setup(clients=3, rounds=2, local_steps=2)
    out = Q.run(setup, "trimmed_mean", {"b": 1}, "alie", {}, malicious=(0,), colluding=True, ray_cpus=1)
    assert len(out.accuracy) == 3 and all(0.0 <= a <= 1.0 for a in out.accuracy)
    assert out.strategy.history == [(1, (0,)), (2, (0,))]  # partition 0's reply crafted in both rounds
    inner = out.strategy.inner
    assert [r.round for r in inner.history] == [1, 2] and all(len(r.nodes) == 3 for r in inner.history)
    assert inner.history[0].client_ids == inner.history[1].client_ids == (0, 1, 2)


def test_flower_is_imported_only_when_the_integration_is_used():
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    code = ("import sys, redteam, redteam.integrations.flower as f\n"
            "assert 'flwr' not in sys.modules, 'flwr imported by the package'\n"
            "sys.modules['flwr'] = None  # as if Flower were not installed\n"
            "try:\n    f.DefenseStrategy\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'pip install "redteam[flower]"' in out.stdout
