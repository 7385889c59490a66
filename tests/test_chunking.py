"""Chunks, BEP 52 Merkle roots and proofs, update manifests, verified reassembly."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from redteam.errors import DecodeError, InvalidParameter, TransportError
from redteam.transport import (
    ManifestError,
    UpdateManifest,
    build_manifest,
    chunk_digest,
    merkle_proof,
    merkle_root,
    new_nonce,
    params_digest,
    reassemble,
    split,
    verify_proof,
)


def H(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


Z = bytes(32)
PARENT = "ab" * 32
NONCE = "0f" * 16


def test_split_by_hand():
    assert split(b"abcdefghij", 4) == [b"abcd", b"efgh", b"ij"]
    assert split(b"abcdefgh", 4) == [b"abcd", b"efgh"]
    assert split(b"", 4) == [b""]
    with pytest.raises(InvalidParameter, match="chunk_size = 0: must be an integer ≥ 1"):
        split(b"abc", 0)


def test_three_chunk_tree_by_hand():
    chunks = split(b"abcdefghij", 4)
    d0, d1, d2 = (H(c) for c in chunks)
    assert [chunk_digest(c) for c in chunks] == [d0, d1, d2]
    # BEP 52: pad the leaf layer to 4 with zero hashes; node = SHA-256(left ‖ right)
    left, right = H(d0 + d1), H(d2 + Z)
    root = H(left + right)
    assert merkle_root([d0, d1, d2]) == root
    assert merkle_proof([d0, d1, d2], 2) == [Z, left]
    assert verify_proof(d2, 2, [Z, left], root)
    assert not verify_proof(d2, 3, [Z, left], root)  # wrong position
    assert not verify_proof(d1, 2, [Z, left], root)  # wrong leaf
    assert not verify_proof(d2, 6, [Z, left], root)  # index beyond the tree
    assert not verify_proof(d2, 2, [Z[:31], left], root)  # malformed sibling


def test_single_leaf_and_power_of_two():
    d = H(b"x")
    assert merkle_root([d]) == d and merkle_proof([d], 0) == []
    leaves = [H(bytes([i])) for i in range(4)]
    assert merkle_root(leaves) == H(H(leaves[0] + leaves[1]) + H(leaves[2] + leaves[3]))
    five = leaves + [H(b"5")]  # padded to 8 leaves with three zero hashes
    assert merkle_root(five) == H(H(H(leaves[0] + leaves[1]) + H(leaves[2] + leaves[3])) + H(H(five[4] + Z) + H(Z + Z)))
    with pytest.raises(InvalidParameter, match="at least one leaf"):
        merkle_root([])
    with pytest.raises(InvalidParameter, match=r"digests\[0\] has 3 bytes"):
        merkle_root([b"abc"])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_every_proof_verifies(n, data):
    leaves = [H(i.to_bytes(4, "little")) for i in range(n)]
    root = merkle_root(leaves)
    i = data.draw(st.integers(0, n - 1))
    proof = merkle_proof(leaves, i)
    assert len(proof) == (n - 1).bit_length()
    assert verify_proof(leaves[i], i, proof, root)
    j = data.draw(st.integers(0, n - 1).filter(lambda j: leaves[j] != leaves[i]))
    assert not verify_proof(leaves[j], i, proof, root)


def test_manifest_fields_and_canonical_json():
    payload = b"0123456789"
    m, chunks = build_manifest(payload, round=3, client=7, parent_digest=PARENT, codec="none()", chunk_size=4, nonce=NONCE)
    digests = [H(c).hex() for c in chunks]
    assert m.chunk_digests == tuple(digests) and m.payload_len == 10 and m.n_chunks == 3
    assert m.merkle_root == merkle_root([bytes.fromhex(h) for h in digests]).hex()
    expected = (
        '{"chunk_digests":["%s","%s","%s"],"chunk_size":4,"client":7,"codec":"none()",'
        '"merkle_root":"%s","nonce":"%s","parent_digest":"%s","payload_len":10,"round":3}'
        % (*digests, m.merkle_root, NONCE, PARENT)
    ).encode()
    assert m.to_json() == expected
    assert UpdateManifest.from_json(expected) == m


def test_nonce_from_generator_and_bytes():
    a = new_nonce(np.random.default_rng(1))
    assert a == new_nonce(np.random.default_rng(1)) and len(a) == 32 and a != new_nonce(np.random.default_rng(2))
    m, _ = build_manifest(b"x", round=0, client=0, parent_digest=PARENT, codec="none()", nonce=bytes(range(16)))
    assert m.nonce == bytes(range(16)).hex()


def test_params_digest_is_sha256_of_le_float32():
    p = torch.tensor([[1.0, -2.5], [0.0, 3.0]])
    assert params_digest(p) == hashlib.sha256(np.array([1.0, -2.5, 0.0, 3.0], "<f4").tobytes()).hexdigest()


def _manifest_dict() -> dict:
    m, _ = build_manifest(b"0123456789", round=1, client=2, parent_digest=PARENT, codec="none()", chunk_size=4, nonce=NONCE)
    return json.loads(m.to_json())


def _canon(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda o: o.pop("nonce"), r"manifest.nonce: missing"),
        (lambda o: o.update(extra=1), r"unknown field 'extra'"),
        (lambda o: o.update(round=True), r"manifest.round = True: must be an integer"),
        (lambda o: o.update(round=-1), r"manifest.round = -1"),
        (lambda o: o.update(chunk_size=0), r"manifest.chunk_size = 0"),
        (lambda o: o.update(parent_digest="AB" * 32), r"manifest.parent_digest = 'ABAB"),
        (lambda o: o.update(nonce="00"), r"manifest.nonce = '00': must be 32 lowercase hex"),
        (lambda o: o.update(payload_len=13), r"chunk_digests has 3 entries, payload_len 13 at chunk_size 4 needs 4"),
        (lambda o: o["chunk_digests"].__setitem__(1, "00" * 32), r"merkle_root .* does not match its chunk digests"),
        (lambda o: o["chunk_digests"].__setitem__(1, "zz"), r"manifest.chunk_digests\[1\] = 'zz'"),
        (lambda o: o.update(chunk_digests="ab"), r"manifest.chunk_digests = 'ab': must be a list"),
        (lambda o: o.update(codec=""), r"manifest.codec = ''"),
    ],
)
def test_from_json_rejects_bad_fields(mutate, match):
    obj = _manifest_dict()
    mutate(obj)
    with pytest.raises(ManifestError, match=match):
        UpdateManifest.from_json(_canon(obj))


def test_from_json_rejects_non_canonical_and_garbage():
    obj = _manifest_dict()
    with pytest.raises(ManifestError, match="not in canonical form"):
        UpdateManifest.from_json(json.dumps(obj).encode())
    with pytest.raises(ManifestError, match="duplicate field 'round'"):
        UpdateManifest.from_json(b'{"round":1,"round":2}')
    with pytest.raises(ManifestError, match="NaN is not allowed"):
        UpdateManifest.from_json(b'{"round":NaN}')
    with pytest.raises(ManifestError, match="expected a JSON object, got list"):
        UpdateManifest.from_json(b"[1]")
    with pytest.raises(ManifestError, match="not valid ASCII JSON"):
        UpdateManifest.from_json(b'{"round":')
    # ManifestError is both a DecodeError and a TransportError
    with pytest.raises(DecodeError):
        UpdateManifest.from_json(b"\xff")
    with pytest.raises(TransportError):
        UpdateManifest.from_json(b"\xff")


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=300))
def test_from_json_on_arbitrary_bytes_only_raises_manifest_error(data):
    try:
        UpdateManifest.from_json(data)
    except ManifestError:
        pass


def test_reassemble_verifies_every_chunk():
    payload = bytes(range(256)) * 3
    m, chunks = build_manifest(payload, round=0, client=7, parent_digest=PARENT, codec="none()", chunk_size=200, nonce=NONCE)
    assert m.n_chunks == 4 and [len(c) for c in chunks] == [200, 200, 200, 168]
    assert reassemble(m, dict(enumerate(chunks))) == payload
    assert reassemble(m, {**dict(enumerate(chunks)), 99: b"ignored"}) == payload
    bad = bytearray(chunks[3])
    bad[5] ^= 0x10  # one flipped bit
    with pytest.raises(TransportError, match=r"^chunk 3 of client 7: digest mismatch$"):
        reassemble(m, {**dict(enumerate(chunks)), 3: bytes(bad)})
    with pytest.raises(TransportError, match=r"^chunk 2 of client 7 missing$"):
        reassemble(m, {0: chunks[0], 1: chunks[1], 3: chunks[3]})
    with pytest.raises(TransportError, match=r"chunk 1 of client 7: has 199 bytes, expected 200"):
        reassemble(m, {**dict(enumerate(chunks)), 1: chunks[1][:-1]})


@settings(max_examples=60, deadline=None)
@given(payload=st.binary(max_size=2000), chunk_size=st.integers(1, 700))
def test_split_build_reassemble_round_trip(payload, chunk_size):
    m, chunks = build_manifest(payload, round=0, client=0, parent_digest=PARENT, codec="x", chunk_size=chunk_size, nonce=NONCE)
    assert b"".join(chunks) == payload
    assert all(len(c) == chunk_size for c in chunks[:-1]) and 0 < len(chunks[-1]) <= chunk_size or payload == b""
    assert UpdateManifest.from_json(m.to_json()) == m
    assert reassemble(m, dict(enumerate(chunks))) == payload
