"""End-to-end federation behaviour: the acceptance figures of the trainer issue."""

import dataclasses

import pytest
import torch

from redteam.federation.loop import Federation
from redteam.runner.single import run_scenario
from redteam.scenario import PluginSpec, parse_scenario
from redteam.types import Attack, ChunkDelivery

BASE = {
    "scenario": {"seed": 0},
    "workload": {"name": "digits"},
    "federation": {"clients": 20, "rounds": 30, "partition": "dirichlet", "alpha": 0.5, "lr": 0.2},
}


def _scenario(**sections):
    doc = {k: dict(v) for k, v in BASE.items()}
    for k, v in sections.items():
        doc.setdefault(k, {}).update(v)
    return parse_scenario(doc)


@pytest.fixture(scope="module")
def clean_run():
    return Federation(_scenario()).run()


def test_clean_fedavg_digits_reaches_90_percent(clean_run):
    accs = [r.accuracy for r in clean_run.records]
    assert max(accs[-5:]) >= 0.90, accs
    assert all(all(r.accepted) for r in clean_run.records)


def test_same_seed_same_metrics(clean_run):
    again = Federation(_scenario()).run()
    assert [r.accuracy for r in again.records] == [r.accuracy for r in clean_run.records]
    assert [r.loss for r in again.records] == [r.loss for r in clean_run.records]
    assert [r.bytes_on_wire for r in again.records] == [r.bytes_on_wire for r in clean_run.records]


def test_topk_and_int8_close_to_dense(clean_run):
    dense_acc = clean_run.records[-1].accuracy
    dense_bytes = sum(r.bytes_on_wire for r in clean_run.records)
    topk = Federation(_scenario(transport={"codec": "topk", "codec_params": {"fraction": 0.1}})).run()
    int8 = Federation(_scenario(transport={"codec": "int8"})).run()
    assert topk.records[-1].accuracy >= dense_acc - 0.02
    assert int8.records[-1].accuracy >= dense_acc - 0.01
    assert sum(r.bytes_on_wire for r in topk.records) <= 0.15 * dense_bytes
    assert sum(r.bytes_on_wire for r in int8.records) <= 0.30 * dense_bytes


def test_hierarchical_mean_equals_flat():
    flat = Federation(_scenario(federation={"rounds": 3})).run()
    tree = Federation(_scenario(federation={"rounds": 3}, hierarchy={"fan_out": 4, "depth": 2})).run()
    for a, b in zip(flat.records, tree.records):
        assert abs(a.accuracy - b.accuracy) < 1e-6 and abs(a.loss - b.loss) < 1e-4


@dataclasses.dataclass(frozen=True, slots=True)
class _FlipOneBit(Attack):
    """A relay flips one bit of chunk 0 of the first malicious client, every time it passes."""

    from typing import ClassVar

    surfaces: ClassVar[tuple[str, ...]] = ("transport",)
    omniscient: ClassVar[bool] = False

    def poison_data(self, data, client, generator):
        return data

    def tamper_chunks(self, deliveries, ctx):
        victim = ctx.malicious[0]
        out = []
        for d in deliveries:
            if d.author == victim and d.index == 0:
                b = bytearray(d.data)
                b[len(b) // 2] ^= 0x01
                d = ChunkDelivery(d.author, d.index, d.relay, bytes(b), d.round)
            out.append(d)
        return out


def test_single_flipped_bit_is_detected_and_update_dropped(monkeypatch):
    import redteam.federation.loop as loop

    sc = _scenario(
        federation={"rounds": 2, "malicious_fraction": 0.1},
        transport={"chunk_size": 1024, "network": {"retries": 0}},
    )
    import redteam.federation.setup as setup_module

    monkeypatch.setattr(setup_module, "build_attack", lambda spec: _FlipOneBit())
    fed = Federation(sc, attack=PluginSpec("bitflip"))
    res = fed.run()
    victim = fed.malicious[0]
    for r in res.records:
        assert not r.accepted[victim]
        assert victim in r.dropped and "digest" in r.dropped[victim]
        assert victim in r.rejected
        assert sum(r.accepted) == 19


def test_deadline_makes_stragglers():
    sc = _scenario(
        federation={"rounds": 2},
        transport={"network": {"deadline_s": 0.5, "bandwidth_mbps": 2.0, "bandwidth_sigma": 1.5,
                               "compute_s_per_step": 0.01}},
    )
    res = Federation(sc).run()
    for r in res.records:
        stragglers = [c for c, why in r.dropped.items() if "straggler" in why]
        assert stragglers, r.dropped
        assert all(not r.accepted[c] for c in stragglers)
        assert sum(r.accepted) == 20 - len(stragglers)


def test_churn_excludes_offline_clients():
    sc = _scenario(federation={"rounds": 4}, transport={"network": {"churn_leave": 0.5, "churn_join": 0.2}})
    res = Federation(sc).run()
    offline = [sum(not p for p in r.participating) for r in res.records]
    assert offline[0] == 0 and max(offline) > 0
    for r in res.records:
        for c, p in enumerate(r.participating):
            if not p:
                assert not r.accepted[c] and "churn" in r.dropped[c]


def test_run_scenario_document_shape():
    sc = _scenario(
        federation={"rounds": 3, "malicious_fraction": 0.2},
        attack={"name": "sign_flip", "variant": "own", "scale": 4.0},
        defense={"name": "norm_bound", "multiplier": 2.0, "mode": "reject"},
    )
    doc = run_scenario(sc)
    assert doc["format"] == "redteam.run/v1"
    base, atk = doc["runs"]
    assert base["attack"] == "none" and base["baseline"] and atk["attack"] == "sign_flip"
    for run in doc["runs"]:
        m = run["metrics"]
        for key in ("final_accuracy", "accuracy_drop", "bytes_on_wire", "dropped_updates"):
            assert key in m
        assert [r["round"] for r in run["rounds"]] == [0, 1, 2]
        assert all({"accuracy", "loss"} <= set(r) for r in run["rounds"])
    assert base["metrics"]["accuracy_drop"] == 0.0
    # a 4x sign flip is far outside 2x the median norm: the norm bound catches every one
    assert atk["metrics"]["recall"] == 1.0
    assert atk["metrics"]["fpr"] == 0.0


def test_device_cuda_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from redteam.errors import InvalidParameter

    with pytest.raises(InvalidParameter, match="no CUDA device"):
        Federation(_scenario(federation={"rounds": 1}), device="cuda")


def test_a_federation_runs_once():
    from redteam.errors import RedteamError

    fed = Federation(_scenario(federation={"rounds": 1}))
    fed.run()
    with pytest.raises(RedteamError, match="already run"):
        fed.run()


def test_upper_level_defenses_see_their_children_not_the_clients():
    # FoolsGold insists that client_ids name each of its n inputs once: at the upper level
    # its inputs are the 4 sub-aggregates, which carry no client ids
    sc = _scenario(federation={"rounds": 2},
                   hierarchy={"fan_out": 4, "depth": 2, "upper_defense": {"name": "foolsgold"}})
    res = Federation(sc).run()
    assert len(res.records) == 2
