"""Bounds at the receiver (issue 9 §2, §4): a codec's decoded values may be bounded
(``max_abs``), and the transport refuses an announced payload longer than the codec's
exact size for the model before fetching or reassembling any of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from redteam.errors import DecodeError, InvalidParameter
from redteam.transport import Network, NetworkConfig, build_manifest
from redteam.transport.compression import CODECS, make_codec

PARENT = "cd" * 32
NONCE = "01" * 16
FLAT = dict(bandwidth_sigma=0.0, latency_sigma=0.0, compute_sigma=0.0, retries=0)

# x = [0.5, −2, 1]. Every codec below carries all three values (top-k/rand-k keep k = 3
# of d = 3). Decoded, by hand:
#   none/fp16/bf16: exactly [0.5, −2, 1] (all three are representable);
#   int8 (one block of 3): scale = 2/127; q = round(0.5·63.5) = round(31.75) = 32,
#     round(−2·63.5) = −127, round(1·63.5) = round(63.5) = 64 (ties to even)
#     → [32·2/127, −2, 64·2/127] = [0.50394, −2, 1.00787].
# With max_abs = 1.5 the first value beyond the bound is −2 at coordinate 1 for all.
_PARAMS = {"topk": {"k": 3}, "randk": {"k": 3}, "int8": {"block_size": 3}}


@pytest.mark.parametrize("name", sorted(CODECS))
def test_values_beyond_max_abs_are_a_decode_error_naming_value_and_coordinate(name):
    x = torch.tensor([0.5, -2.0, 1.0])
    gen = torch.Generator().manual_seed(0)
    bounded = make_codec(name, max_abs=1.5, **_PARAMS.get(name, {}))
    payload = bounded.encode(x, gen)  # nothing is clamped when encoding
    with pytest.raises(DecodeError) as ei:
        bounded.decode(payload, 3)
    msg = str(ei.value)
    assert "coordinate 1" in msg and "exceeds max_abs = 1.5" in msg and "-2.0" in msg
    loose = make_codec(name, max_abs=2.0, **_PARAMS.get(name, {}))
    assert loose.decode(payload, 3).tolist() == pytest.approx(
        [32 * 2 / 127, -2.0, 64 * 2 / 127] if name == "int8" else [0.5, -2.0, 1.0], rel=1e-6)
    # decode_many turns it into that row's rejection reason
    rows, errors = bounded.decode_many([payload, loose.encode(torch.tensor([0.5, 1.0, -1.0]), gen)], 3)
    assert errors[0] is not None and "exceeds max_abs" in errors[0] and errors[1] is None
    assert rows[0].tolist() == [0.0, 0.0, 0.0]


def test_max_abs_appears_in_the_spec_only_when_set():
    assert make_codec("topk").spec == "topk(fraction=0.1, indices='auto')"
    assert "max_abs=2.0" in make_codec("topk", max_abs=2.0).spec
    assert make_codec("none").spec == "none()"


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "1"])
def test_max_abs_must_be_a_finite_positive_number(bad):
    with pytest.raises(InvalidParameter, match=r"max_abs = .*must be a finite number > 0"):
        make_codec("fp16", max_abs=bad)


def _uploads(sizes, chunk_size=16384, announce=None):
    out = {}
    for c, n in sizes.items():
        data = np.random.default_rng(c).integers(0, 256, n, dtype=np.uint8).tobytes()
        m, chunks = build_manifest(data, round=0, client=c, parent_digest=PARENT, codec="none()",
                                   chunk_size=chunk_size, nonce=NONCE)
        out[c] = (m, chunks)
    return out


@pytest.mark.parametrize("signed_headers", [False, True])
def test_an_announced_payload_beyond_the_codec_size_is_refused_before_reassembly(signed_headers):
    # the codec's exact size for the model: dense float32, d = 1000 → 16 + 4·1000 bytes
    limit = make_codec("none").payload_size(1000)
    assert limit == 4016
    up = _uploads({0: limit, 1: 1_048_576})  # client 1 announces (and sends) 1 MiB: 64 chunks
    net = Network(NetworkConfig(**FLAT), 2, np.random.default_rng(0))
    headers = {c: m.to_json() for c, (m, _) in up.items()} if signed_headers else None
    res = net.transmit(0, up, 1, np.random.default_rng(1), headers=headers, max_payload_len=limit)
    assert list(res.payloads) == [0] and len(res.payloads[0]) == limit
    assert "announced payload of 1048576 bytes exceeds the codec's 4016 bytes" in res.dropped[1]
    # none of the refused client's chunks crossed the wire: only the two headers and client 0's chunk
    header_bytes = sum(len(m.to_json()) for m, _ in up.values())
    assert res.bytes_on_wire == header_bytes + limit
    # without the bound the same upload is reassembled (what happened before)
    res = net.transmit(0, up, 1, np.random.default_rng(1), headers=headers)
    assert len(res.payloads[1]) == 1_048_576


def test_max_payload_len_is_checked():
    net = Network(NetworkConfig(**FLAT), 1, np.random.default_rng(0))
    with pytest.raises(InvalidParameter, match="max_payload_len = -1"):
        net.transmit(0, _uploads({0: 10}), 1, np.random.default_rng(1), max_payload_len=-1)
