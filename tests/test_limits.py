"""`redteam limits`: every formula against a hand-computed case, the analytic transport model
against the simulator it summarises, the file's validation, and the command end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from redteam.errors import InvalidScenario
from redteam.limits import formulas as F
from redteam.limits.compute import header_bytes, payload_bytes, simulate_rounds
from redteam.limits.config import parse_limits

MIN_DOC = {
    "limits": {
        "name": "t",
        "target_tokens": 1e9,
        "model": [{"name": "tiny", "layers": 2, "hidden": 64, "heads": 2, "vocab": 256}],
        "gpu": [{"name": "card", "memory_gb": 8, "tflops": 10, "price_per_hour": 0.1, "power_w": 200}],
        "peers": {"counts": [4, 16], "rounds": 5},
        "noniid": {"run": False},
    }
}


def _doc(**over):
    import copy

    d = copy.deepcopy(MIN_DOC)
    for path, v in over.items():
        t = d["limits"]
        keys = path.split("__")
        for k in keys[:-1]:
            t = t.setdefault(k, {})
        t[keys[-1]] = v
    return d


# ------------------------------------------------------------------ formulas, by hand
def test_codec_bytes_by_hand():
    from redteam.transport.compression import make_codec

    # none: 16-byte header + 4·1000; bf16: 16 + 2·1000
    assert payload_bytes(make_codec("none"), 1000, 1 << 30) == (4016, 1)
    assert payload_bytes(make_codec("bf16"), 1000, 1 << 30) == (2016, 1)
    # int8, blocks of 256: ceil(1000/256) = 4 fp32 scales (16 B) + 1000 int8 + 16 header = 1032
    assert payload_bytes(make_codec("int8"), 1000, 1 << 30) == (1032, 1)
    # top-1 %: k = 10; a bitmap (125 B) is not smaller than 4k = 40 B of uint32 indices, so
    # 16 + 10·4 values + 10·4 indices = 96
    assert payload_bytes(make_codec("topk", fraction=0.01), 1000, 1 << 30) == (96, 1)
    # segments of 1024 values: 1024 + 1024 + 452 → 3 headers + 4·2500 = 10048
    assert payload_bytes(make_codec("none"), 2500, 1024) == (10048, 3)


def test_raw_bytes_and_upload_time():
    assert F.raw_payload_bytes(7e9, 16) == 14e9  # 7B values at 16 bits
    # 1 MB over 8 Mbit/s = 1 s, + 50 ms RTT
    assert F.upload_seconds(1e6, 8e6, 0.05) == pytest.approx(1.05)


def test_p2p_bound_by_hand():
    # S = 1 MB = 8 Mbit; seed 8 Mbit/s → 1 s; slowest download 4 Mbit/s → 2 s;
    # 4 peers at 2 Mbit/s: 4·8/(8 + 8) = 2 s → max = 2 s
    assert F.p2p_distribution_seconds(1e6, 8e6, [2e6] * 4, 4e6) == pytest.approx(2.0)
    # 16 peers: 16·8/(8 + 32) = 3.2 s dominates
    assert F.p2p_distribution_seconds(1e6, 8e6, [2e6] * 16, 4e6) == pytest.approx(3.2)


def test_aggregator_ingress_by_hand():
    """Issue 24 §3: 7B int8 (≈ 7e9 bytes) from 1,000 peers into a 10 Gbit/s link:
    7e9 · 1000 · 8 / 1e10 = 5,600 s ≈ 1.56 h per round, however well the uploads overlap."""
    assert F.ingress_seconds(7e9, 1000, 1e10) == pytest.approx(5600.0)
    assert F.ingress_seconds(7e9, 1000, 1e10) / 3600 == pytest.approx(1.556, abs=1e-3)


def test_bandwidth_shows_upload_download_and_ingress():
    """A 7e9-parameter model, int8, 1,000 peers, aggregator ingress 10 Gbit/s. int8 in blocks of
    256: 7e9 values + 4·7e9/256 scale bytes = 7.109375e9 bytes of payload (+ 16 B per segment,
    + headers, under 0.01 %); the merged update comes back dense int8, the same payload.
    Ingress: 1000 · 7.109e9 · 8 / 1e10 ≈ 5,688 s; download at the median 100 Mbit/s:
    7.109e9 · 8 / 1e8 ≈ 569 s (+ 50 ms RTT)."""
    from redteam.limits.compute import bandwidth_section

    doc = _doc(model=[{"name": "7B", "params": 7e9, "layers": 32, "hidden": 4096, "heads": 32}],
               transport={"codecs": [{"name": "int8"}], "sample_params": 4096},
               peers={"counts": [10, 1000], "aggregator_ingress_mbps": 10_000})
    row = bandwidth_section(parse_limits(doc))["rows"][0]
    assert row["download_bytes"] == pytest.approx(7.109375e9, rel=1e-6)
    assert row["bytes"] == pytest.approx(7.109375e9, rel=1e-4)
    assert row["ingress_bytes"] == 1000 * row["bytes"]
    assert row["ingress_s"] == pytest.approx(5687.5, rel=1e-4)
    assert row["download_s_median"] == pytest.approx(568.75, rel=1e-4)


def test_the_round_waits_for_the_aggregators_ingress():
    """round total = max(compute + upload, ingress of the contributing uploads) + broadcast:
    with a 1 Mbit/s ingress, 16 peers' int8 updates of the tiny model dominate the round."""
    from redteam.limits.compute import straggler_section

    cfg = parse_limits(_doc(transport={"codecs": [{"name": "int8"}], "sample_params": 4096},
                            peers={"counts": [16], "rounds": 5, "aggregator_ingress_mbps": 1.0}))
    r = straggler_section(cfg)["rows"][0]
    assert r["ingress_s"] == pytest.approx(r["contributing"] * r["upload_bytes"] * 8 / 1e6)
    assert r["ingress_s"] > r["round_s"]
    assert r["round_total_s"] == pytest.approx(r["ingress_s"] + r["broadcast_s"])


def test_adam_memory_per_parameter():
    # ZeRO: mixed-precision Adam = 2 (bf16 weights) + 2 (grads) + 4 (fp32 master) + 8 (m, v) = 16
    assert F.bytes_per_param("bf16", "adamw") == {"weights": 2, "gradients": 2, "master": 4, "optimizer": 8,
                                                   "total": 16}
    # fp32 Adam: 4 + 4 + 8 = 16 (no master copy)
    assert F.bytes_per_param("fp32", "adamw")["total"] == 16
    assert F.bytes_per_param("bf16", "adamw_8bit")["total"] == 2 + 2 + 4 + 2
    assert F.bytes_per_param("fp32", "sgd")["total"] == 8
    with pytest.raises(ValueError, match="optimizer"):
        F.bytes_per_param("bf16", "lion")


def test_activation_bytes_by_hand():
    # L=2, h=4, a=2, s=8, b=1, V=10. Per layer: s·b·h·(34 + 5·a·s/h) = 32·(34 + 20) = 1728.
    # plain: 2·1728 + logits 4·8·1·10 = 320 → 3776
    kw = dict(layers=2, hidden=4, heads=2, seq=8, batch=1, vocab=10)
    assert F.activation_bytes(checkpointing=False, **kw) == 3776
    # checkpointed: inputs 2·(2·8·1·4) = 128, one layer recomputed 1728, logits 320 → 2176
    assert F.activation_bytes(checkpointing=True, **kw) == 2176
    # fp32 doubles the per-layer part: 2·3456 + 320
    assert F.activation_bytes(checkpointing=False, precision="fp32", **kw) == 7232
    # FlashAttention-style kernels keep no a·s×s scores: per layer s·b·h·34 + 4·a·s·b (fp32
    # log-sum-exp) = 32·34 + 4·2·8 = 1088 + 64 = 1152; plain 2·1152 + 320 = 2624;
    # checkpointed 128 + 1152 + 320 = 1600
    assert F.activation_bytes(checkpointing=False, attention="flash", **kw) == 2624
    assert F.activation_bytes(checkpointing=True, attention="flash", **kw) == 1600
    with pytest.raises(ValueError, match="attention"):
        F.activation_bytes(checkpointing=False, attention="paged", **kw)


def test_vram_headline_uses_the_configured_attention():
    """(4) reports the configured kernel (default flash) as the headline and the other beside
    it. tiny: L=2, h=64, a=2, s=2048, b=1, V=256. Standard: per layer
    2048·64·(34 + 5·2·2048/64) = 131072·354 = 46,399,488; flash: 131072·34 + 4·2·2048 =
    4,456,448 + 16,384 = 4,472,832; logits 4·2048·256 = 2,097,152. Activations: standard
    2·46,399,488 + 2,097,152 = 94,896,128; flash 2·4,472,832 + 2,097,152 = 11,042,816."""
    from redteam.limits.compute import vram_section

    vr = vram_section(parse_limits(_doc()))
    m = vr["models"][0]
    assert vr["attention"] == "flash" and vr["other_attention"] == "standard"
    assert m["memory"]["activations"] == 11_042_816
    assert m["memory_other_attention"]["activations"] == 94_896_128
    vr = vram_section(parse_limits(_doc(training__attention="standard")))
    assert vr["models"][0]["memory"]["activations"] == 94_896_128


def test_straggler_quantile_of_a_lognormal():
    # median of the max of 10 log-normals (median 2 s, σ 0.5): q = 0.5^(1/10) = 0.93303;
    # Φ⁻¹(0.93303) = 1.4985 (Φ(1.5) = 0.93319); 2·exp(0.5·1.4985) = 2·2.1155 = 4.231
    assert F.max_quantile_lognormal(2.0, 0.5, 10, 0.5) == pytest.approx(4.231, abs=2e-3)
    assert F.max_quantile_lognormal(2.0, 0.5, 1, 0.5) == pytest.approx(2.0)
    # H_10 = 2.9290 → E[max of 10 Exp(2)] = 1.4645
    assert F.expected_max_exponential(10, 2.0) == pytest.approx(2.928968 / 2, rel=1e-6)


def test_the_simulated_maximum_matches_the_quantile_formula():
    """The straggler simulation's compute draws are log-normal: the median of their maximum
    over 201 trials lands within 5 % of m·exp(σ·Φ⁻¹(0.5^{1/n}))."""
    cfg = parse_limits(_doc())
    row = simulate_rounds(cfg, 50, 0.01, 1e4, np.random.default_rng(1))
    assert row["max_compute_median_simulated"] == pytest.approx(row["max_compute_median_analytic"], rel=0.05)


def test_flops_and_cost_by_hand():
    assert F.training_flops(1e9, 1e10) == 6e19
    # 6e19 / (10 · 1e15 · 0.5) = 12000 s
    assert F.cluster_seconds(6e19, 10, 1e15, 0.5) == pytest.approx(12000.0)
    # 10 busy + 5 idle hours at $2/h; energy (10·700 + 5·70)·1.2/1000 = 8.82 kWh
    c = F.gpu_cost(10, 2.0, 700, 1.2, idle_hours=5, idle_power_w=70)
    assert c == {"usd": 30.0, "kwh": pytest.approx(8.82)}


def test_batch_token_factor_by_hand():
    """McCandlish et al. 2018: E = E_min·(1 + B/B_crit). Against a reference at B_crit = 1e6:
    B = 1e6 → 1; B = 9e6 → (1 + 9)/(1 + 1) = 5; B → 0 → 1/2; B = 1.6e8 (10,000 peers × 16,384
    tokens) → (1 + 160)/2 = 80.5: each token is worth 1/80.5 of the cluster's."""
    assert F.batch_token_factor(1e6, 1e6, 1e6) == 1.0
    assert F.batch_token_factor(9e6, 1e6, 1e6) == 5.0
    assert F.batch_token_factor(0.0, 1e6, 1e6) == 0.5
    assert F.batch_token_factor(1.6e8, 1e6, 1e6) == 80.5


def test_at_10000_peers_the_rounds_grow_with_the_batch():
    """Issue 24 §3: a 125M model at 10,000 peers 'trained' in 3 rounds. Here every token counted
    would need D/(c·H·t) rounds; with the batch model it needs (1 + c·t/B_crit)/2 times as many
    (B_cluster = B_crit)."""
    from redteam.limits.compute import cost_section, vram_section

    cfg = parse_limits(_doc(target_tokens=1e11, peers={"counts": [10000], "rounds": 3}))
    tr = cfg.training
    st = {"rows": [{"model": "tiny", "peers": 10000, "contributing": 9000.0, "online": 9500.0, "round_s": 60.0,
                    "round_total_s": 90.0, "idle_fraction": 0.1}]}
    f = cost_section(cfg, st, vram_section(cfg), {})["rows"][0]["federated"]
    # t = 2048 tokens per step, B = 9000·2048 = 18,432,000; factor (1 + 9.216)/2 = 5.108
    assert f["batch_tokens"] == 9000 * 2048
    assert f["batch_factor"] == pytest.approx((1 + 18_432_000 / 2e6) / 2)
    assert f["token_efficiency"] == pytest.approx(1 / 5.108)
    # every token counted: 1e11/(9000·500·2048) = 10.85 rounds; with the factor 55.42
    assert f["rounds_if_every_token_counted"] == pytest.approx(1e11 / (9000 * 500 * 2048))
    assert f["rounds"] == pytest.approx(10.851 * 5.108, rel=1e-3)
    assert tr.critical_batch_tokens == 2e6 and cfg.cluster.batch_tokens == 2e6


def test_dropped_work_share_by_hand():
    """Three peers arrive at 10, 20 and 40 s after computing 8, 16 and 30 s; deadline 30 s.
    The third is late: dropped work = 30/(8 + 16 + 30) = 30/54 = 0.5556; the round ends at 30 s;
    idle = 1 − (8 + 16 + min(30, 30))/(3·30) = 1 − 54/90 = 0.4; 2 contribute. Without a
    deadline (∞): the round is 40 s, nothing dropped, idle = 1 − 54/120 = 0.55."""
    from redteam.limits.compute import round_stats

    t, c = np.array([10.0, 20.0, 40.0]), np.array([8.0, 16.0, 30.0])
    r = round_stats(t, c, 30.0)
    assert r == {"round_s": 30.0, "round_s_no_deadline": 40.0, "dropped_work": pytest.approx(30 / 54),
                 "idle_fraction": pytest.approx(0.4), "contributing": 2.0}
    r = round_stats(t, c, float("inf"))
    assert r["round_s"] == 40.0 and r["dropped_work"] == 0.0 and r["idle_fraction"] == pytest.approx(0.55)


def test_federated_bill_by_hand():
    """(5) on a stated straggler row. tiny (P = 12·2·64² + 256·64 = 114,688), D = 1e9, t = 1000
    tokens per step (seq 1000), H = 100, B_crit = B_cluster = 1e4, token_efficiency 0.5; the
    round: 8 of 10 online peers contribute, compute + upload 100 s, total 150 s, idle 25 %.
    B = 8·1000 = 8000 → factor (1 + 0.8)/(1 + 1) = 0.9; tokens needed 1e9·0.9/0.5 = 1.8e9;
    per round 8·100·1000 = 8e5 → 2250 rounds. Billed: 2250·10·150/3600 = 937.5 GPU-h; busy
    2250·10·100·0.75/3600 = 468.75 h, idle 468.75 h. $0.1/h → $93.75. Energy (peers' PUE 1):
    (468.75·200 + 468.75·20)/1000 = 103.125 kWh (idle power 10 % of 200 W). Wall: 2250·150 s =
    3.90625 d. Centralized (256 cards of 10 TFLOP/s, MFU 0.4): 6·114,688·1e9/(256·1e13·0.4) =
    0.672 s → 256·0.672/3600 h · $0.1 = $0.0047787."""
    from redteam.limits.compute import cost_section, vram_section

    cfg = parse_limits(_doc(training={"seq_len": 1000, "inner_steps": 100, "critical_batch_tokens": 1e4,
                                      "token_efficiency": 0.5}))
    st = {"rows": [{"model": "tiny", "peers": 10, "contributing": 8.0, "online": 10.0, "round_s": 100.0,
                    "round_total_s": 150.0, "idle_fraction": 0.25}]}
    row = cost_section(cfg, st, vram_section(cfg), {})["rows"][0]
    f, c = row["federated"], row["centralized"]
    assert f["batch_factor"] == pytest.approx(0.9) and f["tokens_needed"] == pytest.approx(1.8e9)
    assert f["rounds"] == pytest.approx(2250)
    assert f["gpu_hours"] == pytest.approx(937.5) and f["busy_hours"] == pytest.approx(468.75)
    assert f["idle_hours"] == pytest.approx(468.75)
    assert f["usd"] == pytest.approx(93.75) and f["kwh"] == pytest.approx(103.125)
    assert f["wall_days"] == pytest.approx(3.90625)
    assert c["usd"] == pytest.approx(256 * 0.672 / 3600 * 0.1)
    assert f["usd_ratio"] == pytest.approx(93.75 / (256 * 0.672 / 3600 * 0.1))


def test_header_bytes_match_real_manifests():
    """The header model reproduces the transport's manifests exactly, and its signed DSSE
    envelopes within a few bytes (DER signature lengths vary), across digit-count changes."""
    from redteam.transport.chunking import build_manifest
    from redteam.transport.signing import derive_key, sign_update

    key = derive_key(np.random.default_rng(5))
    for payload_len in (64, 64 * 7 + 3, 64 * 12, 64 * 123):
        m, _ = build_manifest(b"\1" * payload_len, round=0, client=0, parent_digest="0" * 64, codec="none",
                              chunk_size=64, nonce=b"\0" * 16)
        assert header_bytes("none", payload_len, 64, False) == len(m.to_json())
        assert header_bytes("none", payload_len, 64, True) == pytest.approx(len(sign_update(m, key)), abs=4)


def test_digit_sum():
    from redteam.limits.compute import _digit_sum

    # 1..9 → 9, 10..99 → 180, 100..123 → 72
    assert _digit_sum(123) == 9 + 180 + 72
    assert _digit_sum(0) == 0


# ------------------------------------------------------------------ the model vs the simulator
@pytest.mark.parametrize("codec", ["none", "int8"])
def test_analytic_bytes_and_round_time_agree_with_the_simulator(codec):
    """A real federation (digits, 5 clients, no loss, no relays, no deadline): the bytes it
    puts on the wire and its simulated round time agree with the limits model's prediction —
    payload_size + header model per client, and max_i(H·c_i + bytes/bw_i + RTT_i) over the
    simulator's own device draws — to 1e-9: the model is exact where the simulator is deterministic."""
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario
    from redteam.transport.compression import make_codec

    doc = {"scenario": {"name": "agree", "seed": 3}, "workload": {"name": "digits"},
           "federation": {"clients": 5, "rounds": 2, "local_steps": 2, "batch_size": 8, "lr": 0.1,
                          "partition": "iid"},
           "transport": {"codec": codec, "chunk_size": 1024,
                         "network": {"bandwidth_mbps": 2.0, "latency_ms": 30.0, "compute_s_per_step": 0.05}}}
    fed = Federation(parse_scenario(doc, file="t.toml"), device="cpu")
    res = fed.run()
    c = make_codec(codec)
    payload, _ = payload_bytes(c, fed.spec.dim, 1 << 30)
    per_client = payload + header_bytes(c.spec, payload, 1024, False)
    net = fed.network
    t = 2 * net.compute_s + per_client / net.bytes_per_s + net.latency_s
    for rec in res.records:
        assert rec.bytes_on_wire == 5 * per_client
        assert rec.sim_time_s == pytest.approx(float(t.max()), rel=1e-9)


# ------------------------------------------------------------------ the file
@pytest.mark.parametrize("over, match", [
    ({"peers__counts": [0]}, r"\[limits.peers\].counts = \[0\]"),
    ({"training__precision": "fp8"}, r"precision = 'fp8': must be one of fp32, bf16, fp16"),
    ({"training__attention": "paged"}, r"attention = 'paged': must be one of flash, standard"),
    ({"training__critical_batch_tokens": 0}, r"critical_batch_tokens = 0: must be"),
    ({"cluster__batch_tokens": -5}, r"batch_tokens = -5: must be"),
    ({"training__mfu": 1.5}, r"mfu = 1.5: must be a finite number > 0 and ≤ 1"),
    ({"peers__gpu": "nope"}, r"\[limits.peers\].gpu = 'nope': must be one of card"),
    ({"transport__codecs": [{"name": "zip"}]}, r"codecs\[0\]"),
    ({"bogus": 1}, r"unknown key 'bogus'"),
    ({"model": [{"name": "m", "layers": 2, "hidden": 10, "heads": 3}]}, r"heads = 3: must divide hidden = 10"),
    ({"target_tokens": float("nan")}, r"target_tokens = nan"),
    # a required number left out was None in the formulas (a TypeError; found by the limits fuzz)
    ({"model": [{"name": "m", "hidden": 64, "heads": 2}]}, r"\[\[limits.model\]\] #1.layers: missing"),
    ({"gpu": [{"name": "g", "memory_gb": 8, "tflops": 10, "price_per_hour": 0.1}]}, r"#1.power_w: missing"),
    # a subnormal uplink: its slow-peer quantile underflowed to 0 (a ValueError traceback deep in
    # the formulas; 1e-300 leaked a matplotlib overflow warning). Rates start at 1 bit/s
    ({"peers__uplink_mbps": 5e-324}, r"uplink_mbps = 5e-324: must be a finite number ≥ 1e-06"),
    ({"peers__uplink_mbps": 1e-300}, r"uplink_mbps = 1e-300: must be a finite number ≥ 1e-06"),
    ({"peers__downlink_mbps": 1e-9}, r"downlink_mbps = 1e-09: must be"),
    ({"peers__aggregator_uplink_mbps": 0}, r"aggregator_uplink_mbps = 0: must be"),
    ({"peers__aggregator_ingress_mbps": -1}, r"aggregator_ingress_mbps = -1: must be"),
])
def test_bad_limits_files_are_one_line_errors(over, match):
    with pytest.raises(InvalidScenario, match=match) as exc:
        parse_limits(_doc(**over), file="l.toml")
    assert "\n" not in str(exc.value) and str(exc.value).startswith("l.toml: ")


def test_a_scenario_file_is_not_a_limits_file():
    with pytest.raises(InvalidScenario, match=r"no \[limits\] table"):
        parse_limits({"scenario": {"name": "x"}}, file="s.toml")


# ------------------------------------------------------------------ end to end
def test_limits_command_end_to_end(tmp_path, capsys):
    from redteam.cli import main

    f = tmp_path / "l.toml"
    f.write_text(
        '[limits]\nname = "e2e"\ntarget_tokens = 1e9\n'
        '[[limits.model]]\nname = "tiny"\nlayers = 2\nhidden = 64\nheads = 2\nvocab = 256\n'
        '[[limits.model]]\nname = "big"\nparams = 7e9\nlayers = 32\nhidden = 4096\nheads = 32\n'
        '[[limits.gpu]]\nname = "card"\nmemory_gb = 8\ntflops = 10\nprice_per_hour = 0.1\npower_w = 200\n'
        '[limits.peers]\ncounts = [4, 16]\nrounds = 5\n[limits.noniid]\nrun = false\n'
        '[limits.transport]\ncodecs = [{ name = "int8" }]\nsample_params = 4096\n'
    )
    out = tmp_path / "out"
    assert main(["limits", str(f), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "(1) bandwidth" in text and "(5) cost" in text and "does not fit on card" in text
    data = json.loads((out / "limits.json").read_text())
    assert data["format"] == "redteam.limits/v1"
    big = next(r for r in data["bandwidth"]["rows"] if r["model"] == "big")
    # int8 of 7e9 values in segments of 2^30: 7 segments (6 full + 1 partial)
    assert big["payload_bytes"] == payload_bytes(__import__("redteam.transport.compression", fromlist=["x"])
                                                 .make_codec("int8"), 7e9, 1 << 30)[0]
    html = (out / "limits.html").read_text()
    assert html.count("<img") == 4 and "Kumar" in html  # 4 plots (no non-IID run), formulas listed
    # every output lists the assumptions it used (issue 24 §3): uplinks, prices, H, efficiency, MFU
    names = {a["assumption"]: a["value"] for a in data["assumptions"]}
    assert names["peer uplink (median, σ)"] == "20 Mbit/s, σ 0.8"
    assert names["inner steps H"] == "500" and names["peer MFU / cluster MFU"] == "0.35 / 0.4"
    assert names["price: card"] == "$0.1/h, 200 W, idle 20 W"
    assert names["critical batch B_crit"] == "2e+06 tokens"
    assert names["token efficiency (same batch)"] == "1" and names["attention (VRAM headline)"] == "flash"
    for shown in (text, html):
        assert "assumptions used below" in shown and "$0.1/h, 200 W, idle 20 W" in shown
    # a bad file: exit 2, one line, nothing written
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits]\nname = 3\n")
    assert main(["limits", str(bad), "--out", str(tmp_path / "o2")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "o2").exists()


def test_shipped_limits_file_parses():
    from pathlib import Path

    from redteam.limits import load_limits

    cfg = load_limits(Path(__file__).parent.parent / "scenarios" / "limits.toml")
    assert [m.name for m in cfg.models] == ["125M", "1B", "7B", "70B"]
    assert {g.memory_gb for g in cfg.gpus} >= {8, 12, 16, 24}


_WIDE = (
    '[limits]\nname = "w"\ntarget_tokens = 1e9\n'
    '[[limits.model]]\nname = "tiny"\nlayers = 2\nhidden = 64\nheads = 2\nvocab = 256\n'
    '[[limits.model]]\nname = "big"\nparams = 7e9\nlayers = 32\nhidden = 4096\nheads = 32\n'
    + "".join(f'[[limits.gpu]]\nname = "Card Model {i} {8 * i}GB"\nmemory_gb = {8 * i}\ntflops = 10\n'
              'price_per_hour = 0.1\npower_w = 200\n' for i in (1, 2, 3, 4))
    + '[limits.peers]\ncounts = [4, 16]\nrounds = 5\n[limits.noniid]\nrun = false\n'
    '[limits.transport]\ncodecs = [{ name = "int8" }, { name = "topk", fraction = 0.01 }]\nsample_params = 4096\n'
)


def test_limits_tables_never_break_a_word_at_80_columns(tmp_path, monkeypatch, capsys):
    """At 80 columns every value is whole on one line and every header word is whole (issue
    24 §1: "topk(fr / action= / 0.01)", "broadcas / t"); a table too wide is stacked. The
    command honours COLUMNS when its output is not a terminal."""
    import io
    import re

    from rich.cells import cell_len
    from rich.console import Console

    from redteam.cli import main
    from redteam.limits import load_limits
    from redteam.limits.cli import print_summary
    from redteam.limits.compute import compute_all
    from redteam.limits.render import summary_lines

    f = tmp_path / "w.toml"
    f.write_text(_WIDE)
    res = compute_all(load_limits(f), lambda msg: None)
    console = Console(width=80, file=io.StringIO(), markup=False, highlight=False)
    print_summary(console, res)
    lines = console.file.getvalue().splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    tokens = {t for line in lines for t in re.split(r"[\s│┃]+", line) if t}
    for _, header, rows in summary_lines(res):
        for row in rows:
            for cell in row:
                assert any(cell in line for line in lines), f"value {cell!r} is broken across lines"
        for h in header:
            for word in h.split():
                assert word in tokens, f"header word {word!r} of {h!r} is broken"
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["limits", str(f), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "(1) bandwidth" in out and max(cell_len(line) for line in out.splitlines()) <= 80
    assert "topk(fraction=0.01)" in out


def test_limits_follows_the_thread_policy(tmp_path, monkeypatch):
    """`redteam limits --threads N` runs its torch work (codec samples, the non-IID federations)
    on N intra-op threads, `auto` on one (the work is small), and restores the caller's count;
    a bad value is a usage error (issue 24 §3: 129 s against 20 s on a loaded machine)."""
    import torch

    from redteam.cli import main
    from redteam.limits import load_limits
    from redteam.limits.compute import compute_all

    f = tmp_path / "l.toml"
    f.write_text(_WIDE)
    cfg = load_limits(f)
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n)))
    before = torch.get_num_threads()
    compute_all(cfg, threads=3)
    assert seen[0] == 3 and torch.get_num_threads() == before
    seen.clear()
    monkeypatch.delenv("REDTEAM_THREADS", raising=False)
    compute_all(cfg)
    assert seen[0] == 1 and torch.get_num_threads() == before
    with pytest.raises(SystemExit) as exc:
        main(["limits", str(f), "--threads", "0"])
    assert exc.value.code == 2
