"""The round's batched wire paths give exactly what the one-at-a-time paths give.

The speed work (issue 13 §3) batches per-client work: one nonce draw and one manifest
builder call per round, canonical JSON written without ``json.dumps``, a header parser
that recognises the canonical form first, one batched decode. Each fast path must
accept exactly what the full check accepts and leave every refusal (and its message) to
the full check; these tests pin that, on hand-made examples and on hypothesis draws.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from redteam.errors import InvalidParameter
from redteam.transport.chunking import (
    ManifestError,
    UpdateManifest,
    build_manifest,
    build_manifests,
    new_nonce,
    new_nonces,
)
from redteam.transport.compression import make_codec

PARENT = "ab" * 32
NONCE = "0f" * 16


def _dumps(m: UpdateManifest) -> bytes:
    """The specification of the canonical form, written with json.dumps."""
    obj = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
    obj["chunk_digests"] = list(m.chunk_digests)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _full_parse(data: bytes) -> UpdateManifest:
    # the full parser (json.loads with duplicate/constant hooks, field checks, re-serialization);
    # from_json takes it for anything but exact `bytes`, so a bytearray exercises it alone
    return UpdateManifest.from_json(bytearray(data))


def test_canonical_json_by_hand():
    # b"" is one empty chunk: its digest is SHA-256("") = e3b0c442…b855, which is also the
    # Merkle root (a single leaf is its own root). Keys sorted, no spaces, the codec's quote
    # escaped as \" by JSON.
    m, chunks = build_manifest(b"", round=2, client=5, parent_digest=PARENT, codec='a"b', chunk_size=4, nonce=NONCE)
    e = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    want = ('{"chunk_digests":["%s"],"chunk_size":4,"client":5,"codec":"a\\"b","merkle_root":"%s","nonce":"%s",'
            '"parent_digest":"%s","payload_len":0,"round":2}' % (e, e, NONCE, PARENT)).encode()
    assert chunks == [b""] and m.to_json() == want
    built, texts = build_manifests([b""], round=2, clients=[5], parent_digest=PARENT, codec='a"b', chunk_size=4,
                                   nonces=[NONCE])
    assert built == [(m, [b""])] and texts == [want]
    assert UpdateManifest.from_json(want) == m == _full_parse(want)


def test_nonces_in_one_draw_match_one_per_call():
    # 3 nonces of 16 uint8 draws each from seed 7, one call or three: same strings, same state after
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    assert new_nonces(a, 3) == [new_nonce(b) for _ in range(3)]
    assert a.random() == b.random()
    with pytest.raises(InvalidParameter, match="new_nonces: n = -1"):
        new_nonces(a, -1)


payloads = st.lists(st.binary(max_size=70), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(payloads, st.integers(1, 20), st.sampled_from(["none()", "int8(block_size=2)", 'odd "%s" \\ é', "x"]),
       st.integers(0, 2**53), st.integers(0, 3))
def test_build_manifests_equals_build_manifest(ps, chunk_size, codec, rnd, seed):
    nonces = new_nonces(np.random.default_rng(seed), len(ps))
    clients = list(range(len(ps)))
    built, texts = build_manifests(ps, round=rnd, clients=clients, parent_digest=PARENT, codec=codec,
                                   chunk_size=chunk_size, nonces=nonces)
    for (m, chunks), text, p, c, nonce in zip(built, texts, ps, clients, nonces):
        one, one_chunks = build_manifest(p, round=rnd, client=c, parent_digest=PARENT, codec=codec,
                                         chunk_size=chunk_size, nonce=nonce)
        assert (m, chunks) == (one, one_chunks)
        assert text == m.to_json() == _dumps(m)
        assert UpdateManifest.from_json(text) == m == _full_parse(text)


def test_build_manifests_refuses_bad_shared_and_per_client_fields():
    with pytest.raises(InvalidParameter, match="manifest.parent_digest"):
        build_manifests([b"x"], round=0, clients=[0], parent_digest="nothex", codec="c", nonces=[NONCE])
    with pytest.raises(InvalidParameter, match="manifest.nonce"):
        build_manifests([b"x", b"y"], round=0, clients=[0, 1], parent_digest=PARENT, codec="c",
                        nonces=[NONCE, "zz"])
    with pytest.raises(InvalidParameter, match="manifest.client"):
        build_manifests([b"x", b"y"], round=0, clients=[0, -1], parent_digest=PARENT, codec="c",
                        nonces=[NONCE, NONCE])
    with pytest.raises(InvalidParameter, match="2 payloads, 1 clients"):
        build_manifests([b"x", b"y"], round=0, clients=[0], parent_digest=PARENT, codec="c", nonces=[NONCE])


odd_values = st.one_of(st.integers(-3, 2**60), st.booleans(), st.floats(allow_nan=True), st.text(max_size=70),
                       st.none(), st.lists(st.text(max_size=3), max_size=2))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([f.name for f in dataclasses.fields(UpdateManifest)]), odd_values)
def test_forged_fields_validate_and_serialize_as_the_full_check_says(name, value):
    good, _ = build_manifest(b"0123456789", round=1, client=2, parent_digest=PARENT, codec="none()",
                             chunk_size=4, nonce=NONCE)
    m = dataclasses.replace(good, **{name: tuple(value) if name == "chunk_digests" and isinstance(value, list)
                                     else value})
    try:
        want = _dumps(m)
    except (TypeError, ValueError):
        want = None
    if want is not None:
        assert m.to_json() == want
    try:
        m._validate_slow()
        full = None
    except ManifestError as exc:
        full = str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever the full check does, validate does too
        full = type(exc).__name__
    try:
        m.validate()
        fast = None
    except ManifestError as exc:
        fast = str(exc)
    except Exception as exc:  # noqa: BLE001
        fast = type(exc).__name__
    assert fast == full


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 400), st.integers(0, 255), st.booleans())
def test_header_bytes_changed_anywhere_parse_as_the_full_parser_says(pos, byte, insert):
    m, _ = build_manifest(b"x" * 30, round=3, client=4, parent_digest=PARENT, codec="none()", chunk_size=8,
                          nonce=NONCE)
    data = bytearray(m.to_json())
    pos %= len(data) + 1
    if insert:
        data[pos:pos] = bytes([byte])
    elif pos < len(data):
        data[pos] = byte
    data = bytes(data)
    try:
        full = _full_parse(data)
    except ManifestError as exc:
        full = str(exc)
    try:
        fast = UpdateManifest.from_json(data)
    except ManifestError as exc:
        fast = str(exc)
    assert fast == full


def test_duplicate_key_is_named_not_swallowed_by_the_fast_parser():
    m, _ = build_manifest(b"x", round=0, client=0, parent_digest=PARENT, codec="c", nonce=NONCE)
    text = m.to_json()
    dup = text[:-1] + b',"round":0}'
    with pytest.raises(ManifestError, match="duplicate field 'round'"):
        UpdateManifest.from_json(dup)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["ok", "nan", "inf", "big", "short", "none", "magic"]), min_size=1, max_size=6),
       st.sampled_from(["none", "fp16", "int8"]), st.sampled_from([None, 10.0]))
def test_batched_decode_equals_row_by_row(kinds, codec_name, max_abs):
    params = {"max_abs": max_abs} if max_abs is not None else {}
    codec = make_codec(codec_name, **params)
    loose = make_codec(codec_name)
    gen = torch.Generator().manual_seed(0)
    d = 5
    payloads = []
    for k, kind in enumerate(kinds):
        row = torch.linspace(-1.0, 1.0, d) * (k + 1)
        if kind == "nan":
            row[2] = float("nan")
        elif kind == "inf":
            row[4] = float("inf")
        elif kind == "big":
            row[1] = 50.0
        p = loose.encode(row, gen)
        payloads.append(None if kind == "none" else p[:-1] if kind == "short" else
                        b"XX" + p[2:] if kind == "magic" else p)
    rows, errors = codec.decode_many(payloads, d)
    for i, p in enumerate(payloads):
        if p is None:
            assert errors[i] == "no payload" and not rows[i].any()
            continue
        try:
            want = codec.decode(p, d)
        except Exception as exc:  # noqa: BLE001 - the message is what is compared
            assert errors[i] == str(exc) and not rows[i].any()
        else:
            assert errors[i] is None and torch.equal(rows[i], want)
