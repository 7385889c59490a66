"""The simulated network: timing by hand, stragglers, tampering, loss, relays, churn."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redteam.errors import InvalidParameter
from redteam.transport import Network, NetworkConfig, build_manifest
from redteam.types import ChunkDelivery

PARENT = "cd" * 32
NONCE = "01" * 16
FLAT = dict(bandwidth_sigma=0.0, latency_sigma=0.0, compute_sigma=0.0)


def uploads_for(payloads: dict[int, bytes], chunk_size: int, round: int = 0):
    out = {}
    for c, p in payloads.items():
        m, chunks = build_manifest(p, round=round, client=c, parent_digest=PARENT, codec="none()", chunk_size=chunk_size, nonce=NONCE)
        out[c] = (m, chunks)
    return out


def mlen(up) -> int:
    return len(up[0].to_json())


def payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_straggler_excluded_and_counted_by_hand():
    # 8 Mbit/s = 1e6 bytes/s, RTT 100 ms, 0.01 s per step × 10 steps = 0.1 s of compute
    cfg = NetworkConfig(bandwidth_mbps=8.0, latency_ms=100.0, compute_s_per_step=0.01, deadline_s=1.0, retries=0, **FLAT)
    net = Network(cfg, 2, np.random.default_rng(0))
    up = uploads_for({0: payload(100_000), 1: payload(2_000_000, 1)}, chunk_size=65536)
    res = net.transmit(0, up, 10, np.random.default_rng(1))
    # T = steps·c + bytes/bw + RTT
    assert res.arrival_s[0] == pytest.approx(0.1 + (mlen(up[0]) + 100_000) / 1e6 + 0.1)
    assert res.arrival_s[1] == pytest.approx(0.1 + (mlen(up[1]) + 2_000_000) / 1e6 + 0.1)
    assert res.dropped == {1: "straggler: arrived at 2.2 s > deadline 1 s"}
    assert res.stragglers == [1] and list(res.payloads) == [0] and res.payloads[0] == payload(100_000)
    assert res.round_time_s == 1.0
    assert res.bytes_on_wire == mlen(up[0]) + mlen(up[1]) + 2_100_000
    assert res.client_bytes == {0: mlen(up[0]) + 100_000, 1: mlen(up[1]) + 2_000_000}

    no_deadline = Network(dataclasses.replace(cfg, deadline_s=None), 2, np.random.default_rng(0))
    res2 = no_deadline.transmit(0, up, 10, np.random.default_rng(1))
    assert res2.dropped == {} and res2.round_time_s == pytest.approx(res.arrival_s[1])


def test_per_client_profiles_and_relay_timing_by_hand():
    cfg = NetworkConfig(relay_fraction=1.0, retries=0, **FLAT)
    # client 0: 1e6 B/s, RTT 0.1 s; client 1: 2e6 B/s, RTT 0.05 s; no compute time
    net = Network(cfg, 2, np.random.default_rng(0), bandwidth_mbps=[8.0, 16.0], latency_ms=[100.0, 50.0], compute_s_per_step=[0.0, 0.0])
    up = uploads_for({0: payload(1000), 1: payload(3000, 1)}, chunk_size=4096)
    seen = []

    def hook(deliveries):
        seen.extend((d.author, d.index, d.relay) for d in deliveries)
        return deliveries

    res = net.transmit(0, up, 5, np.random.default_rng(2), hook)
    assert sorted(seen) == [(0, 0, 1), (1, 0, 0)]  # each chunk goes via the only other peer
    # store and forward: author uplink + RTT_author, then relay uplink + RTT_relay
    assert res.arrival_s[0] == pytest.approx((mlen(up[0]) + 1000) / 1e6 + 0.1 + 1000 / 2e6 + 0.05)
    assert res.arrival_s[1] == pytest.approx((mlen(up[1]) + 3000) / 2e6 + 0.05 + 3000 / 1e6 + 0.1)
    assert res.bytes_on_wire == mlen(up[0]) + mlen(up[1]) + 2 * (1000 + 3000)  # two hops each
    assert res.payloads == {0: payload(1000), 1: payload(3000, 1)}


def flip_bit(author: int, index: int, waves: int = 10**9):
    calls = []

    def hook(deliveries: list[ChunkDelivery]) -> list[ChunkDelivery]:
        calls.append(len(deliveries))
        if len(calls) <= waves:
            for d in deliveries:
                if (d.author, d.index) == (author, index):
                    d.data = bytes([d.data[0] ^ 0x01]) + d.data[1:]
        return deliveries

    return hook


def test_single_flipped_bit_is_detected_and_dropped_without_retries():
    cfg = NetworkConfig(retries=0, **FLAT)
    net = Network(cfg, 3, np.random.default_rng(0))
    up = uploads_for({c: payload(2500, c) for c in range(3)}, chunk_size=1000)
    res = net.transmit(0, up, 1, np.random.default_rng(3), flip_bit(2, 1))
    assert res.dropped == {2: "chunk 1 digest mismatch after 0 retries (direct from the author)"}
    assert res.detections == {2: "chunk 1 digest mismatch (direct from the author)"}
    assert res.mismatches == [(2, 1, 2)]
    assert sorted(res.payloads) == [0, 1]


def test_refetch_repairs_a_tampered_chunk_and_still_counts_a_detection():
    cfg = NetworkConfig(bandwidth_mbps=8.0, latency_ms=100.0, compute_s_per_step=0.0, retries=1, **FLAT)
    net = Network(cfg, 3, np.random.default_rng(0))
    up = uploads_for({c: payload(2500, c) for c in range(3)}, chunk_size=1000)
    res = net.transmit(0, up, 1, np.random.default_rng(3), flip_bit(2, 1, waves=1))
    assert res.payloads[2] == payload(2500, 2) and res.dropped == {}
    assert res.detections == {2: "chunk 1 digest mismatch (direct from the author) (verified copies obtained)"}
    m = mlen(up[2])
    first = (m + 2000) / 1e6 + 0.1  # when the corrupted chunk 1 arrived
    assert res.arrival_s[2] == pytest.approx(first + 0.1 + 1000 / 1e6)  # re-fetch: RTT + size/bw
    assert res.client_bytes[2] == m + 2500 + 1000


def test_persistent_tampering_relay_is_routed_around():
    cfg = NetworkConfig(relay_fraction=1.0, retries=1, **FLAT)
    net = Network(cfg, 3, np.random.default_rng(0))
    up = uploads_for({c: payload(20_000, c) for c in range(3)}, chunk_size=1000)

    def relay2(deliveries):
        for d in deliveries:
            if d.relay == 2 and d.author != 2:
                d.data = d.data[:-1] + bytes([d.data[-1] ^ 0x80])
        return deliveries

    res = net.transmit(0, up, 1, np.random.default_rng(4), relay2)
    assert res.dropped == {} and all(res.payloads[c] == payload(20_000, c) for c in range(3))
    assert res.mismatches and {r for _, _, r in res.mismatches} == {2}
    assert set(res.detections) == {0, 1} and all("via relay 2" in v and "verified copies obtained" in v for v in res.detections.values())

    res0 = Network(dataclasses.replace(cfg, retries=0), 3, np.random.default_rng(0)).transmit(0, up, 1, np.random.default_rng(4), relay2)
    assert set(res0.dropped) == {0, 1}
    assert all(re.fullmatch(r"chunk \d+ digest mismatch after 0 retries \(via relay 2\)", v) for v in res0.dropped.values())


def test_withholding_by_the_hook_and_by_the_author():
    cfg = NetworkConfig(retries=2, **FLAT)
    net = Network(cfg, 3, np.random.default_rng(0))
    up = uploads_for({c: payload(3000, c) for c in range(3)}, chunk_size=1000)
    calls = []

    def withhold(deliveries):
        calls.append(sorted((d.author, d.index) for d in deliveries))
        return [d for d in deliveries if (d.author, d.index) != (1, 0)]

    m, chunks = up[2]
    up[2] = (m, chunks[:2])  # the author announces 3 chunks but sends 2
    res = net.transmit(0, up, 1, np.random.default_rng(5), withhold)
    assert res.dropped == {1: "withheld: missing chunk 0", 2: "withheld: missing chunk 2"}
    assert res.detections == {} and list(res.payloads) == [0]
    assert calls[1:] == [[(1, 0)], [(1, 0)]]  # each re-fetch goes through the hook again


def test_loss_and_retries():
    up = uploads_for({c: payload(500, c) for c in range(40)}, chunk_size=1000)
    lossy = Network(NetworkConfig(loss=0.5, retries=0, **FLAT), 40, np.random.default_rng(0))
    res = lossy.transmit(0, up, 1, np.random.default_rng(6))
    assert 5 < len(res.dropped) < 35
    assert all(v == "chunk 0 lost after 0 retries" for v in res.dropped.values())
    # lost bytes were still sent
    assert res.bytes_on_wire == sum(mlen(u) + 500 for u in up.values())
    patient = Network(NetworkConfig(loss=0.5, retries=60, **FLAT), 40, np.random.default_rng(0))
    res2 = patient.transmit(0, up, 1, np.random.default_rng(6))
    assert res2.dropped == {} and len(res2.payloads) == 40
    assert res2.bytes_on_wire > sum(mlen(u) + 500 for u in up.values())


def test_injected_and_replayed_chunks_are_ignored_but_counted():
    net = Network(NetworkConfig(retries=0, **FLAT), 3, np.random.default_rng(0))
    up = uploads_for({0: payload(1500), 1: payload(1500, 1)}, chunk_size=1000)
    old = uploads_for({0: payload(1500, 9)}, chunk_size=1000)

    def inject(deliveries):
        extra = [
            ChunkDelivery(author=2, index=0, relay=2, data=b"x" * 100),  # nobody announced client 2
            ChunkDelivery(author=0, index=7, relay=2, data=b"y" * 50),  # index outside the manifest
            ChunkDelivery(author=1, index=0, relay=2, data=old[0][1][0]),  # replay of another update
        ]
        return deliveries + extra

    res = net.transmit(0, up, 1, np.random.default_rng(7), inject)
    assert sorted(res.payloads) == [0, 1] and res.payloads[1] == payload(1500, 1)
    assert res.detections == {1: "chunk 0 digest mismatch (via relay 2) (verified copies obtained)"}
    assert res.mismatches == [(1, 0, 2)]
    assert res.bytes_on_wire == mlen(up[0]) + mlen(up[1]) + 3000 + 100 + 50 + 1000


def test_bad_manifests_are_dropped_with_a_reason():
    net = Network(NetworkConfig(**FLAT), 4, np.random.default_rng(0))
    up = uploads_for({0: payload(10)}, 4)
    up[1] = uploads_for({5: payload(10)}, 4)[5]  # claims another client
    up[2] = uploads_for({2: payload(10)}, 4, round=3)[2]  # another round (replay)
    m, chunks = uploads_for({3: payload(10)}, 4)[3]
    up[3] = (dataclasses.replace(m, merkle_root="00" * 32), chunks)
    res = net.transmit(0, up, 1, np.random.default_rng(8), parent_digest=PARENT)
    assert res.dropped[1] == "bad manifest: manifest names client 5, uploaded by client 1"
    assert res.dropped[2] == "bad manifest: manifest is for round 3, this is round 0"
    assert res.dropped[3].startswith("bad manifest: manifest.merkle_root 0000000000000000… does not match")
    assert list(res.payloads) == [0]
    stale = net.transmit(0, {0: up[0]}, 1, np.random.default_rng(8), parent_digest="ee" * 32)
    assert stale.dropped[0].startswith("bad manifest: stale parent model cdcdcdcdcdcd…")


def test_same_seed_same_result():
    cfg = NetworkConfig(loss=0.3, relay_fraction=0.5, retries=1, deadline_s=0.2)
    up = uploads_for({c: payload(5000, c) for c in range(8)}, chunk_size=700)

    def run():
        net = Network(cfg, 8, np.random.default_rng(11))
        return net.transmit(0, up, 3, np.random.default_rng(12), flip_bit(3, 2, waves=1))

    a, b = run(), run()
    assert a == b
    assert a.payloads or a.dropped


def test_device_profiles_are_lognormal_around_the_medians():
    cfg = NetworkConfig(bandwidth_mbps=20.0, bandwidth_sigma=1.0, latency_ms=40.0, latency_sigma=0.3, compute_s_per_step=0.5)
    net = Network(cfg, 20001, np.random.default_rng(0))
    assert np.median(net.bandwidth_mbps) == pytest.approx(20.0, rel=0.05)
    assert np.median(net.latency_s) == pytest.approx(0.040, rel=0.05)
    assert np.median(net.compute_s) == pytest.approx(0.5, rel=0.05)
    assert np.std(np.log(net.bandwidth_mbps)) == pytest.approx(1.0, rel=0.05)


def test_churn_is_vectorized_and_follows_the_rates():
    net = Network(NetworkConfig(churn_leave=0.2, churn_join=0.5), 100_000, np.random.default_rng(0))
    online = np.arange(100_000) % 2 == 0
    nxt = net.churn(online, np.random.default_rng(1))
    assert nxt.dtype == bool and nxt.shape == online.shape
    assert np.mean(~nxt[online]) == pytest.approx(0.2, abs=0.01)  # left
    assert np.mean(nxt[~online]) == pytest.approx(0.5, abs=0.01)  # joined
    still = Network(NetworkConfig(), 5, np.random.default_rng(0))
    assert (still.churn(np.array([True, False, True, True, False]), np.random.default_rng(2)) == [True, False, True, True, False]).all()
    with pytest.raises(InvalidParameter, match=r"online has shape \(3,\), expected \(5,\)"):
        still.churn(np.ones(3, bool), np.random.default_rng(0))


@pytest.mark.parametrize(
    "params,match",
    [
        ({"bandwidth_mbps": 0}, r"NetworkConfig.bandwidth_mbps = 0: must be a finite number > 0"),
        ({"latency_ms": -1}, r"NetworkConfig.latency_ms = -1"),
        ({"loss": 1.5}, r"NetworkConfig.loss = 1.5: must be a probability in \[0, 1\]"),
        ({"loss": 1}, r"NetworkConfig.loss = 1: must be < 1"),
        ({"relay_fraction": -0.1}, r"NetworkConfig.relay_fraction = -0.1"),
        ({"retries": -1}, r"NetworkConfig.retries = -1: must be an integer ≥ 0"),
        ({"retries": 1.5}, r"NetworkConfig.retries = 1.5"),
        ({"deadline_s": 0}, r"NetworkConfig.deadline_s = 0: must be a number > 0"),
        ({"churn_join": float("nan")}, r"NetworkConfig.churn_join = nan"),
    ],
)
def test_config_errors_name_the_field(params, match):
    with pytest.raises(InvalidParameter, match=match):
        NetworkConfig(**params)


def test_transmit_argument_errors():
    net = Network(NetworkConfig(), 2, np.random.default_rng(0))
    with pytest.raises(InvalidParameter, match=r"upload key 5 is not a client id in \[0, 2\)"):
        net.transmit(0, uploads_for({5: b"x"}, 4), 1, np.random.default_rng(0))
    with pytest.raises(InvalidParameter, match="local_steps = -1"):
        net.transmit(0, {}, -1, np.random.default_rng(0))
    with pytest.raises(InvalidParameter, match=r"Network.bandwidth_mbps = \[1.0\]: expected 2 finite values > 0"):
        Network(NetworkConfig(), 2, np.random.default_rng(0), bandwidth_mbps=[1.0])
    empty = net.transmit(0, {}, 1, np.random.default_rng(0))
    assert empty.round_time_s == 0.0 and empty.bytes_on_wire == 0


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    loss=st.floats(0.0, 0.6),
    relay=st.floats(0.0, 1.0),
    retries=st.integers(0, 3),
    corrupt=st.floats(0.0, 1.0),
    drop=st.floats(0.0, 0.5),
)
def test_integrity_invariant_under_random_tampering(seed, loss, relay, retries, corrupt, drop):
    """Whatever the hook does, an accepted payload is byte-identical to what its author sent,
    and every participant ends up either accepted or dropped with a reason."""
    payloads = {c: payload(300 + 97 * c, c) for c in range(5)}
    up = uploads_for(payloads, chunk_size=128)
    hook_rng = np.random.default_rng(seed)

    def chaos(deliveries):
        out = []
        for d in deliveries:
            if hook_rng.random() < drop:
                continue
            if hook_rng.random() < corrupt and d.data:
                j = int(hook_rng.integers(len(d.data)))
                d.data = d.data[:j] + bytes([d.data[j] ^ 0x04]) + d.data[j + 1 :]
            out.append(d)
        if deliveries and hook_rng.random() < 0.5:  # a replay of some earlier chunk under another index
            src = deliveries[int(hook_rng.integers(len(deliveries)))]
            out.append(ChunkDelivery(author=src.author, index=src.index + 1, relay=4, data=src.data))
        return out

    cfg = NetworkConfig(loss=loss, relay_fraction=relay, retries=retries, **FLAT)
    res = Network(cfg, 6, np.random.default_rng(seed)).transmit(0, up, 1, np.random.default_rng(seed + 1), chaos)
    assert all(res.payloads[c] == payloads[c] for c in res.payloads)
    assert set(res.payloads) | set(res.dropped) == set(payloads) and not set(res.payloads) & set(res.dropped)
    assert all(res.dropped[c] for c in res.dropped)
    assert {a for a, _, _ in res.mismatches} == set(res.detections)
    assert res.bytes_on_wire >= sum(mlen(up[c]) for c in up)


@pytest.mark.parametrize("params", [
    dict(bandwidth_mbps=5e-324, bandwidth_sigma=0.0),  # the smallest legal value: bytes/s underflow
    dict(bandwidth_mbps=1e-300, bandwidth_sigma=30.0),  # a wide spread draws some links as 0
    dict(bandwidth_mbps=1e-300, bandwidth_sigma=1000.0, compute_sigma=1000.0, latency_sigma=1000.0),  # exp overflows
])
@pytest.mark.parametrize("deadline,stragglers", [(None, "drop"), (10.0, "drop"), (10.0, "partial")])
def test_a_tiny_bandwidth_warns_nothing_and_never_arrives(params, deadline, stragglers):
    """issue 22 §7: numpy's divide/overflow RuntimeWarnings leaked to the user for tiny
    bandwidths. A transfer too slow for a float takes forever: a straggler under a deadline,
    without one an infinitely long round."""
    import warnings

    cfg = NetworkConfig(deadline_s=deadline, stragglers=stragglers, relay_fraction=0.5, loss=0.3, retries=2, **params)
    up = uploads_for({c: payload(3000, c) for c in range(4)}, chunk_size=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net = Network(cfg, 4, np.random.default_rng(0))
        steps = net.steps_by_deadline(list(up), 5, 3000)
        assert net.ready_s(list(up), 0).tolist() == [0.0] * 4  # no steps take no time, even on an infinitely slow device
        res = net.transmit(0, up, 5, np.random.default_rng(1), client_steps=dict(zip(up, steps.tolist())))
    if deadline is None:  # everyone arrives (lost chunks aside), some after ~forever
        assert res.round_time_s > 1e250 and set(res.payloads) | set(res.dropped) == set(up)
    else:  # who could not make it is a straggler
        assert res.round_time_s <= deadline and all(res.arrival_s[c] <= deadline for c in res.payloads)
        assert res.dropped
