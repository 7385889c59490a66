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
from hypothesis import event, given, settings
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


# -- the round's fast lanes against the general paths (issue 13 §3, second pass) ---------------

def _identity(deliveries):
    # a tamper hook that changes nothing: it sends transmit down its general path (every
    # delivery through the hook, grouped and checked one by one), the oracle for the lanes
    # that run without a hook
    return list(deliveries)


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=7),
    chunk_size=st.sampled_from([16, 64]),
    loss=st.sampled_from([0.0, 0.3]),
    relay=st.sampled_from([0.0, 0.5]),
    retries=st.integers(0, 2),
    deadline=st.sampled_from([None, 0.5, 0.1, 0.0704]),  # 0.1 cuts relayed chunks, 0.0704 the larger payloads
    # mostly honest rounds (the lanes), with every kind of fault now and then
    faults=st.lists(st.sampled_from(["ok"] * 6 + ["swap", "stale", "withhold", "corrupt", "big"]), min_size=7,
                    max_size=7),
    seed=st.integers(0, 2**16),
)
def test_transmit_without_hook_equals_the_general_path(sizes, chunk_size, loss, relay, retries, deadline, faults,
                                                        seed):
    from redteam.transport import Network, NetworkConfig

    n = len(sizes)
    clients = list(range(n))
    payloads_ = [bytes((7 * c + j) % 256 for j in range(s)) for c, s in enumerate(sizes)]
    built, texts = build_manifests(payloads_, round=3, clients=clients, parent_digest=PARENT, codec="none()",
                                   chunk_size=chunk_size, nonces=new_nonces(np.random.default_rng(seed), n))
    uploads = {c: (m, list(chunks)) for c, (m, chunks) in zip(clients, built)}
    headers = dict(zip(clients, texts))
    for c, fault in zip(clients, faults):
        m, chunks = uploads[c]
        if fault == "swap" and n > 1:  # another client's header (names the wrong client)
            headers[c] = texts[(c + 1) % n]
        elif fault == "stale":  # a header for another round (its text is no builder's)
            headers[c] = dataclasses.replace(m, round=2).to_json()
        elif fault == "withhold":
            uploads[c] = (m, chunks[:-1])
        elif fault == "corrupt" and chunks[0]:
            uploads[c] = (m, [bytes([chunks[0][0] ^ 1]) + chunks[0][1:], *chunks[1:]])
    limit = 30 if "big" in faults else None  # a payload over 30 bytes is refused before any fetch
    cfg = NetworkConfig(loss=loss, relay_fraction=relay, retries=retries, deadline_s=deadline,
                        bandwidth_sigma=0.0, latency_sigma=0.0, compute_sigma=0.0)
    net = Network(cfg, n, np.random.default_rng(seed))

    def run(hook, hdrs):
        return net.transmit(3, uploads, 2, np.random.default_rng(seed + 1), hook, parent_digest=PARENT,
                            headers=hdrs, max_payload_len=limit)

    lane = run(None, headers)
    assert lane == run(_identity, headers)
    if deadline is not None and loss == 0 and relay > 0 and set(faults[:n]) == {"ok"}:
        event("an honest round cut by the deadline")
    # the same header texts rebuilt (equal bytes, other objects) open to the same result
    assert lane == run(None, {c: bytes(bytearray(h)) for c, h in headers.items()})
    # manifests sent directly (no headers): the lane's direct landing against the hook's path
    direct = net.transmit(3, uploads, 2, np.random.default_rng(seed + 1), None, parent_digest=PARENT,
                          max_payload_len=limit)
    assert direct == net.transmit(3, uploads, 2, np.random.default_rng(seed + 1), _identity,
                                  parent_digest=PARENT, max_payload_len=limit)


def test_known_header_texts_parse_like_any_other_and_are_forgotten_after_two_batches():
    # build_manifests remembers the text it wrote for each manifest (from_json's answer for
    # those bytes); a text from three batches back is parsed in full, to an equal manifest
    first, texts = build_manifests([b"abc", b"de"], round=1, clients=[0, 1], parent_digest=PARENT, codec="c",
                                   nonces=[NONCE, NONCE])
    assert UpdateManifest.from_json(texts[0]) is first[0][0]
    for r in (2, 3):
        build_manifests([b"x"], round=r, clients=[0], parent_digest=PARENT, codec="c", nonces=[NONCE])
    again = UpdateManifest.from_json(texts[0])
    assert again == first[0][0] and again is not first[0][0]
    # a manifest equal to a built one but not made by a builder is validated in full
    forged = dataclasses.replace(first[1][0], merkle_root="0" * 64)
    with pytest.raises(ManifestError, match="merkle_root"):
        forged.validate()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["ok", "nan", "inf", "big", "magic"]), min_size=2, max_size=6),
       st.sampled_from(["none", "fp16", "bf16"]), st.sampled_from([None, 10.0]), st.sampled_from([6, 33_000]))
def test_uniform_batch_encode_and_decode_equal_row_by_row(kinds, codec_name, max_abs, d):
    # every payload one length with one header: the batched encode and decode lanes, for small
    # rows (one buffer for the batch) and rows over 64 KiB (33,000 values of 2 or 4 bytes: each
    # row joined to its header, each body copied into its row)
    params = {"max_abs": max_abs} if max_abs is not None else {}
    codec = make_codec(codec_name, **params)
    x = torch.stack([torch.linspace(-2.0, 2.0, d) * (k + 1) for k in range(len(kinds))])
    for k, kind in enumerate(kinds):
        if kind in ("nan", "inf", "big"):
            x[k, 3] = {"nan": float("nan"), "inf": float("inf"), "big": 40.0}[kind]
    payloads_, sent = codec.encode_many(x)
    for k in range(len(kinds)):
        one, one_sent = codec.encode_many(x[k : k + 1])
        assert payloads_[k] == one[0] and type(payloads_[k]) is bytes
        assert torch.equal(sent[k], one_sent[0]) or kinds[k] == "nan"
    # a bad magic (same length, another header) sends the batch down the row-by-row path
    payloads_ = [b"XX" + p[2:] if kind == "magic" else p for p, kind in zip(payloads_, kinds)]
    rows, errors = codec.decode_many(payloads_, d)
    for k, p in enumerate(payloads_):
        try:
            want = codec.decode(p, d)
        except Exception as exc:  # noqa: BLE001 - the message is what is compared
            assert errors[k] == str(exc) and not rows[k].any()
        else:
            assert errors[k] is None and torch.equal(rows[k], want)


def test_row_view_reads_the_matrix_rows():
    from redteam.federation.stages import RowView

    m = torch.arange(12.0).reshape(4, 3)
    v = RowView(m)
    assert len(v) == 4 and torch.equal(v[2], m[2]) and torch.equal(v[-1], m[3])
    assert [r.tolist() for r in v] == m.tolist()
    assert [r.tolist() for r in v[1:3]] == m[1:3].tolist()
    with pytest.raises(IndexError):
        v[4]


@pytest.mark.parametrize("uniform", [True, False])
def test_the_row_screen_at_its_boundaries(uniform):
    # decode_many screens each row by its sum and its largest magnitude before any entry-by-entry
    # check: a finite row whose sum overflows (two values of 3e38) is accepted, a value exactly at
    # max_abs is accepted and the next float above it is not, +inf beside -inf (a NaN sum) and a
    # NaN are refused. The same answers as decode, row by row. uniform=False: one payload of
    # another length sends the batch down the row-by-row lane.
    big = 3e38
    limit = float(torch.tensor(big, dtype=torch.float32))  # max_abs on a float32 value, exactly
    above = float(torch.nextafter(torch.tensor(limit), torch.tensor(float("inf"))))
    cases = {"overflowing sum": [big, big, 0.0], "at max_abs": [limit, -limit, 1.0], "above": [above, 0.0, 0.0],
             "inf and -inf": [float("inf"), float("-inf"), 0.0], "nan": [0.0, float("nan"), 0.0],
             "plain": [1.0, -2.0, 3.0]}
    want_ok = {"overflowing sum": True, "at max_abs": True, "above": False, "inf and -inf": False, "nan": False,
               "plain": True}
    codec = make_codec("none", max_abs=limit)
    d = 3
    x = torch.tensor(list(cases.values()), dtype=torch.float32)
    payloads = [make_codec("none").encode(row, None) for row in x]
    if not uniform:
        payloads.append(make_codec("none").encode(torch.zeros(4), None))  # another dimension: refused
    rows, errors = codec.decode_many(payloads, d)
    for k, name in enumerate(cases):
        assert (errors[k] is None) is want_ok[name], (name, errors[k])
        try:
            one = codec.decode(payloads[k], d)
        except Exception as exc:  # noqa: BLE001 - the message is what is compared
            assert errors[k] == str(exc) and not rows[k].any()
        else:
            assert torch.equal(rows[k], one)
    if not uniform:
        assert errors[-1] is not None
