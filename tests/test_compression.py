"""Codecs and error feedback: worked examples, bounds, untrusted-bytes properties."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redteam.errors import DecodeError, InvalidParameter, UnknownPlugin
from redteam.transport import CODECS, Compressor, make_codec

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def header(codec_id: int, dtype: int, flags: int, dim: int, count: int) -> bytes:
    return b"RTDC" + bytes([1, codec_id, dtype, flags]) + struct.pack("<II", dim, count)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- worked examples: exact bytes --------------------------------------------------------


def test_dense_exact_bytes_and_round_trip():
    x = torch.tensor([1.5, -2.0, 0.0, 3.25])
    payload = make_codec("none").encode(x)
    assert payload == header(0, 1, 0, 4, 4) + struct.pack("<4f", 1.5, -2.0, 0.0, 3.25)
    assert torch.equal(make_codec("none").decode(payload, 4), x)


def test_topk_small_vector_exact_bytes():
    x = torch.tensor([0.1, -3.0, 2.0, 0.5, -0.2])
    codec = make_codec("topk", k=2, indices="uint32")
    payload = codec.encode(x)
    # the two largest magnitudes are -3.0 (index 1) and 2.0 (index 2), sent in index order
    assert payload == header(4, 1, 0, 5, 2) + struct.pack("<2f", -3.0, 2.0) + struct.pack("<2I", 1, 2)
    assert len(payload) == 16 + 2 * (4 + 4)
    assert codec.decode(payload, 5).tolist() == [0.0, -3.0, 2.0, 0.0, 0.0]


def test_topk_bitmap_index_format_exact_bytes():
    x = torch.tensor([0.1, -3.0, 2.0, 0.5, -0.2])
    payload = make_codec("topk", k=2, indices="bitmap").encode(x)
    # bits 1 and 2 set, least significant bit first: 0b00000110
    assert payload == header(4, 1, 1, 5, 2) + struct.pack("<2f", -3.0, 2.0) + bytes([0x06])
    assert make_codec("topk", k=2).decode(payload, 5).tolist() == [0.0, -3.0, 2.0, 0.0, 0.0]


def test_int8_hand_picked_blocks():
    # block 0: absmax 127 -> scale 1, q = round-half-even([127, -63.5, 2.25]) = [127, -64, 2]
    # block 1: absmax 1.5 -> scale 1.5/127, q = [0, -127, round(42.33)] = [0, -127, 42]
    x = torch.tensor([127.0, -63.5, 2.25, 0.0, -1.5, 0.5])
    codec = make_codec("int8", block_size=3)
    payload = codec.encode(x)
    s1 = np.float32(1.5) / np.float32(127)
    assert payload == (
        header(3, 4, 0, 6, 3)
        + struct.pack("<2f", 1.0, s1)
        + struct.pack("<6b", 127, -64, 2, 0, -127, 42)
    )
    out = codec.decode(payload, 6)
    assert out.tolist()[:3] == [127.0, -64.0, 2.0]
    assert out[3:].tolist() == pytest.approx([0.0, -1.5, 42 * 1.5 / 127], rel=1e-6)


def test_half_precision_rounding_by_hand():
    third = torch.tensor([1 / 3, 1e5, -1e5])
    # fp16: 1/3 -> 0x3555 = 0.333251953125; out-of-range finite values saturate at ±65504
    assert make_codec("fp16").decode(make_codec("fp16").encode(third), 3).tolist() == [0.333251953125, 65504.0, -65504.0]
    # bf16: float32(1/3) = 0x3EAAAAAB, low half 0xAAAB > 0x8000 rounds up to 0x3EAB = 0.333984375
    assert make_codec("bf16").decode(make_codec("bf16").encode(third[:1]), 1).tolist() == [0.333984375]


def test_spec_strings_are_canonical():
    assert make_codec("topk", fraction=0.1, indices="uint32").spec == "topk(fraction=0.1, indices='uint32')"
    assert make_codec("topk").spec == "topk(fraction=0.1, indices='auto')"
    assert make_codec("randk", k=7, rescale=True).spec == "randk(k=7, indices='auto', rescale=True)"
    assert make_codec("int8").spec == "int8(block_size=256, rounding='deterministic')"
    assert make_codec("none").spec == "none()"


# -- acceptance figures ------------------------------------------------------------------


def test_payload_sizes_for_the_digits_mlp():
    d = 4810  # MLP 64-64-10
    dense = 16 + 4 * d
    x = torch.randn(d, generator=gen())
    topk = make_codec("topk", fraction=0.1, indices="uint32").encode(x)
    assert len(topk) == 16 + 481 * 8  # k = round(0.1 * 4810) = 481
    assert len(topk) / dense <= 0.201
    assert len(make_codec("topk", fraction=0.1, indices="bitmap").encode(x)) == 16 + 481 * 4 + 602
    # the default ("auto") picks the bitmap here: ⌈4810/8⌉ = 602 bytes < 481 × 4
    assert len(make_codec("topk", fraction=0.1).encode(x)) == 16 + 481 * 4 + 602
    int8 = make_codec("int8").encode(x)
    assert len(int8) == 16 + 4 * math.ceil(d / 256) + d
    assert len(int8) / dense <= 0.26
    assert len(make_codec("fp16").encode(x)) == 16 + 2 * d
    for cls in CODECS.values():
        codec = cls()
        assert codec.payload_size(d) == len(codec.encode(x, gen()))


def test_int8_error_bounds():
    x = torch.randn(8, 1000, generator=gen(1)) * torch.logspace(-3, 3, 8)[:, None]
    for rounding, factor in (("deterministic", 0.5), ("stochastic", 1.0)):
        codec = make_codec("int8", block_size=100, rounding=rounding)
        _, sent = codec.encode_many(x, gen(2))
        scale = x.view(8, 10, 100).abs().amax(dim=2, keepdim=True) / 127
        err = (sent - x).abs().view(8, 10, 100)
        assert bool((err <= factor * scale * (1 + 1e-5)).all())


def test_stochastic_rounding_is_unbiased():
    x = torch.linspace(-1.0, 0.9, 256)
    rows = x.repeat(4000, 1)
    _, sent = make_codec("int8", rounding="stochastic").encode_many(rows, gen(3))
    scale = 1.0 / 127
    # rounding error std ≤ scale/2, so the mean of 4000 draws is within ~scale/126 per coordinate
    assert float((sent.mean(dim=0) - x).abs().max()) < 0.05 * scale
    # deterministic rounding is biased on the same coordinates
    _, det = make_codec("int8").encode_many(rows[:1], gen())
    assert float((det[0] - x).abs().max()) > 0.2 * scale


def test_randk_unbiased_rescaling_and_seeding():
    x = torch.arange(1.0, 11.0)
    codec = make_codec("randk", k=2, rescale=True)
    payloads, sent = codec.encode_many(x.repeat(20000, 1), gen(4))
    assert bool(((sent != 0).sum(dim=1) == 2).all())
    nz = sent[sent != 0]
    assert torch.allclose(nz, (nz / 5).round() * 5)  # values are x_i · d/k = 5 x_i
    assert torch.allclose(sent.mean(dim=0), x, rtol=0.06)
    # same seed, same coordinates; no rescaling by default
    a = make_codec("randk", k=3).encode(x, gen(9))
    assert a == make_codec("randk", k=3).encode(x, gen(9))
    kept = make_codec("randk", k=3).decode(a, 10)
    assert set(kept[kept != 0].tolist()) <= set(x.tolist())


# -- error feedback ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,params",
    [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {"block_size": 64}), ("topk", {"fraction": 0.05}), ("randk", {"fraction": 0.05})],
)
def test_error_feedback_residual_identity(name, params):
    comp = Compressor(make_codec(name, **params), error_feedback=True)
    delta = torch.randn(6, 700, generator=gen(5)) * torch.logspace(-4, 2, 6)[:, None]
    residual = torch.randn(6, 700, generator=gen(6)) * 1e-2
    res = comp.compress(delta, residual, gen(7))
    p = delta + residual
    assert torch.equal(res.sent + res.residual, p)  # sent + e_new == p exactly
    decoded, errors = comp.decode_many(res.payloads, 700)
    assert errors == [None] * 6 and torch.equal(decoded, res.sent)
    assert res.nbytes == sum(len(b) for b in res.payloads)


def test_error_feedback_topk_two_rounds_by_hand():
    comp = Compressor(make_codec("topk", k=2))
    delta = torch.tensor([[0.1, -3.0, 2.0, 0.5, -0.2]])
    r1 = comp.compress(delta, None, gen())
    assert r1.residual[0].tolist() == pytest.approx([0.1, 0.0, 0.0, 0.5, -0.2])
    r2 = comp.compress(torch.zeros(1, 5), r1.residual, gen())
    assert r2.sent[0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.5, -0.2])
    assert r2.residual[0].tolist() == pytest.approx([0.1, 0.0, 0.0, 0.0, 0.0])
    assert Compressor(make_codec("topk", k=2), error_feedback=False).compress(delta, None, gen()).residual is None


def test_stochastic_rounding_needs_a_generator():
    with pytest.raises(InvalidParameter, match="needs a torch.Generator"):
        make_codec("int8", rounding="stochastic").encode(torch.ones(4))


# -- parameter errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,params,match",
    [
        ("topk", {"fraction": 0.0}, r"TopK.fraction = 0.0: must be a number in \(0, 1\]"),
        ("topk", {"fraction": 1.5}, r"TopK.fraction = 1.5"),
        ("randk", {"k": 0}, r"RandK.k = 0: must be an integer ≥ 1"),
        ("topk", {"fraction": 0.1, "k": 3}, r"TopK.k = 3: give either fraction or k, not both"),
        ("int8", {"block_size": 0}, r"Int8.block_size = 0: must be an integer ≥ 1"),
        ("int8", {"rounding": "nearest"}, r"Int8.rounding = 'nearest'"),
        ("topk", {"fractoin": 0.1}, r"no parameter 'fractoin'; did you mean 'fraction'"),
        ("randk", {"rescale": 1}, r"RandK.rescale = 1: must be true or false"),
    ],
)
def test_bad_parameters_name_the_parameter(name, params, match):
    with pytest.raises(InvalidParameter, match=match):
        make_codec(name, **params)


def test_unknown_codec_lists_close_matches():
    with pytest.raises(UnknownPlugin, match=r"unknown codec 'topkk'; did you mean 'topk'"):
        make_codec("topkk")


# -- untrusted bytes: clear rejections ---------------------------------------------------


def _valid(name: str, d: int = 10, **params) -> bytes:
    return make_codec(name, **params).encode(torch.randn(d, generator=gen(8)), gen(8))


@pytest.mark.parametrize(
    "name,data,match",
    [
        ("none", b"RTDC\x01", r"none payload: truncated header \(5 bytes, need 16\)"),
        ("none", b"XXXX" + bytes(12), r"bad magic b'XXXX', expected b'RTDC'"),
        ("none", header(0, 1, 0, 10, 10)[:4] + b"\x02" + header(0, 1, 0, 10, 10)[5:], r"unsupported version 2"),
        ("none", header(4, 1, 0, 10, 10), r"codec id 4 \(topk\), expected 0 \(none\)"),
        ("fp16", header(1, 1, 0, 10, 10), r"value dtype code 1 \(f32\), expected 2 \(f16\)"),
        ("none", header(0, 1, 0, 11, 11) + bytes(44), r"dimension 11, expected 10"),
        ("none", header(0, 1, 0, 10, 10) + bytes(12), r"body is 12 bytes, header implies 40"),
        ("none", header(0, 1, 2, 10, 10) + bytes(40), r"flags 0x02"),
        ("topk", header(4, 1, 0, 10, 2) + bytes(16), r"header count 2, topk\(k=1, indices='uint32'\) at d=10 expects 1"),
        ("topk", header(4, 1, 0, 10, 1) + struct.pack("<fI", 1.0, 10), r"index 10 at position 0 is out of range \[0, 10\)"),
        ("none", header(0, 1, 0, 10, 10) + struct.pack("<10f", *([0.0] * 9 + [float("nan")])), r"non-finite value nan at coordinate 9"),
        ("int8", header(3, 4, 0, 10, 256) + struct.pack("<f", -1.0) + bytes(10), r"scale of block 0 is -1.0"),
        ("int8", header(3, 4, 0, 10, 256) + struct.pack("<f", 1.0) + b"\x80" + bytes(9), r"value −128 at coordinate 0"),
        ("int8", header(3, 4, 0, 10, 256) + struct.pack("<f", 3e38) + b"\x7f" + bytes(9), r"non-finite value inf"),
        ("topk", header(4, 1, 1, 10, 1) + struct.pack("<f", 1.0) + bytes([0x01, 0x04]), r"bitmap padding bits beyond d=10"),
        ("topk", header(4, 1, 1, 10, 1) + struct.pack("<f", 1.0) + bytes([0x03, 0x00]), r"bitmap has 2 bits set, header says k=1"),
    ],
)
def test_malformed_payloads_are_rejected_with_a_reason(name, data, match):
    params = {"k": 1, "indices": "uint32"} if name == "topk" else {}
    with pytest.raises(DecodeError, match=match):
        make_codec(name, **params).decode(data, 10)


def test_duplicate_sparse_indices_rejected():
    data = header(4, 1, 0, 10, 2) + struct.pack("<2f2I", 1.0, 2.0, 3, 3)
    with pytest.raises(DecodeError, match=r"indices not strictly increasing at position 1 \(3 then 3"):
        make_codec("topk", k=2).decode(data, 10)


def test_non_bytes_and_bad_dim_argument():
    with pytest.raises(DecodeError, match="expected bytes, got str"):
        make_codec("none").decode("RTDC", 10)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match="expected_dim = 0"):
        make_codec("none").decode(_valid("none"), 0)


def test_decode_many_reports_per_row_errors():
    good = _valid("none")
    rows, errors = make_codec("none").decode_many([good, good[:-1], None], 10)
    assert errors[0] is None and "body is 39 bytes, header implies 40" in errors[1] and errors[2] == "no payload"
    assert rows.shape == (3, 10) and bool((rows[1:] == 0).all())


def test_nonfinite_input_encodes_but_is_rejected_on_decode():
    x = torch.tensor([1.0, float("nan"), 2.0, float("inf")])
    for name in CODECS:
        codec = make_codec(name, k=4) if name in ("topk", "randk") else make_codec(name)
        with pytest.raises(DecodeError):
            codec.decode(codec.encode(x, gen()), 4)


# -- properties --------------------------------------------------------------------------

ALL = [("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {"block_size": 7}), ("int8", {"block_size": 7, "rounding": "stochastic"}),
       ("topk", {"fraction": 0.3}), ("topk", {"k": 3, "indices": "auto"}), ("randk", {"fraction": 0.5}), ("randk", {"k": 2, "rescale": True})]

finite_rows = st.integers(1, 40).flatmap(
    lambda d: st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=d, max_size=d)
)


@SETTINGS
@given(values=finite_rows, which=st.sampled_from(ALL), seed=st.integers(0, 2**31))
def test_round_trip_within_bounds(values, which, seed):
    name, params = which
    codec = make_codec(name, **params)
    x = torch.tensor(values, dtype=torch.float32)
    d = x.numel()
    payload = codec.encode(x, gen(seed))
    assert len(payload) == codec.payload_size(d)
    y = codec.decode(payload, d)
    assert y.shape == (d,) and y.dtype == torch.float32 and bool(torch.isfinite(y).all())
    err = (y - x).abs()
    if name == "none":
        assert torch.equal(y, x)
    elif name == "fp16":
        assert bool((err <= x.abs() * 2**-11 + 2**-25).all())
    elif name == "bf16":
        assert bool((err <= x.abs() * 2**-8 + 2**-126).all())  # subnormals may flush to 0
    elif name == "int8":
        b = params["block_size"]
        nb = -(-d // b)
        absmax = torch.nn.functional.pad(x.abs(), (0, nb * b - d)).view(nb, b).amax(dim=1)
        bound = (absmax / 127).repeat_interleave(b)[:d] * (0.5 if params.get("rounding") != "stochastic" else 1.0)
        assert bool((err <= bound * (1 + 1e-5) + 1e-30).all())
    else:
        k = codec.expected_count(d)
        kept = y != 0
        assert int(kept.sum()) <= k
        factor = d / k if params.get("rescale") else 1.0
        assert torch.allclose(y[kept], x[kept] * factor, rtol=1e-6)
        if name == "topk" and bool(kept.any()) and bool((~kept).any()):
            # no dropped coordinate is larger in magnitude than a kept one
            assert float(x[~kept].abs().max()) <= float(x[kept].abs().min())


def _decodes_or_rejects(codec, data: bytes, d: int) -> None:
    try:
        out = codec.decode(data, d)
    except DecodeError:
        return
    assert out.shape == (d,) and out.dtype == torch.float32 and bool(torch.isfinite(out).all())


@SETTINGS
@given(data=st.binary(max_size=200), which=st.sampled_from(ALL), d=st.integers(1, 20))
def test_arbitrary_bytes_decode_or_raise_decode_error(data, which, d):
    name, params = which
    _decodes_or_rejects(make_codec(name, **params), data, d)


@SETTINGS
@given(which=st.sampled_from(ALL), flip=st.integers(1, 255), seed=st.integers(0, 1000))
def test_every_single_byte_mutation_and_truncation(which, flip, seed):
    name, params = which
    codec = make_codec(name, **params)
    d = 9
    payload = codec.encode(torch.randn(d, generator=gen(seed)) * 10, gen(seed))
    for pos in range(len(payload)):
        mutated = bytearray(payload)
        mutated[pos] ^= flip
        _decodes_or_rejects(codec, bytes(mutated), d)
    for cut in range(len(payload)):
        with pytest.raises(DecodeError):
            codec.decode(payload[:cut], d)
    with pytest.raises(DecodeError):
        codec.decode(payload + b"\x00", d)
