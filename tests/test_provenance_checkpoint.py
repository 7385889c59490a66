"""C2SP signed notes and checkpoints: the Go sumdb/note vector, format, strictness, mutations."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given, settings, strategies as st

from provenance import checkpoint as cp
from provenance.errors import ProvenanceError, VerificationFailed
from provenance.keys import SigningKey

# golang.org/x/mod/sumdb/note: the package documentation's example note and its keys
# ("PRIVATE+KEY+<name>+<hash>+base64(0x01 ‖ seed)", "<name>+<hash>+base64(0x01 ‖ public key)").
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_NOTE = GO_TEXT + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"


def go_keys() -> SigningKey:
    seed = base64.b64decode(GO_SKEY.split("+", 4)[4])  # the base64 itself may contain "+"
    assert seed[0] == 1
    return SigningKey(ed25519.Ed25519PrivateKey.from_private_bytes(seed[1:]))


def test_go_sumdb_note_vector_is_reproduced_and_verified():
    key = go_keys()
    pub = base64.b64decode(GO_VKEY.split("+", 2)[2])
    assert pub == b"\x01" + key.public.raw
    assert cp.key_hash("PeterNeumann", key.public).hex() == "c74f20a3"
    assert cp.sign_note(GO_TEXT, key, "PeterNeumann") == GO_NOTE   # Ed25519 is deterministic
    assert cp.open_note(GO_NOTE, key.public, "PeterNeumann") == GO_TEXT
    with pytest.raises(VerificationFailed):
        cp.open_note(GO_NOTE.replace("cryptography", "cryptographY"), key.public, "PeterNeumann")


LOG = SigningKey.generate("ed25519")
ORIGIN = "example.org/log"
ROOT = hashlib.sha256(b"root").digest()


def test_checkpoint_text_by_hand():
    note = cp.sign(cp.Checkpoint(ORIGIN, 42, ROOT), LOG)
    body = f"{ORIGIN}\n42\n{base64.b64encode(ROOT).decode()}\n"
    kh = hashlib.sha256(ORIGIN.encode() + b"\n\x01" + LOG.public.raw).digest()[:4]
    sig = LOG.key.sign(body.encode())
    assert note == f"{body}\n\u2014 {ORIGIN} {base64.b64encode(kh + sig).decode()}\n"
    got = cp.verify(note, LOG.public, origin=ORIGIN)
    assert (got.origin, got.size, got.root) == (ORIGIN, 42, ROOT)


def test_sigstore_python_parses_and_verifies_our_checkpoint():
    from sigstore._internal.rekor.checkpoint import SignedCheckpoint
    from sigstore._internal.trust import Keyring
    from sigstore_models.common import v1 as common_v1

    note = cp.sign(cp.Checkpoint(ORIGIN, 7, ROOT), LOG)
    parsed = SignedCheckpoint.from_text(note)
    assert parsed.checkpoint.log_size == 7 and parsed.checkpoint.log_hash == ROOT.hex()
    keyring = Keyring([common_v1.PublicKey(raw_bytes=base64.b64encode(LOG.public.der).decode(), key_details=common_v1.PublicKeyDetails.PKIX_ED25519)])
    parsed.signed_note.verify(keyring, cp.log_id(ORIGIN, LOG.public))  # raises on failure


def test_wrong_key_origin_or_name():
    note = cp.sign(cp.Checkpoint(ORIGIN, 1, ROOT), LOG)
    with pytest.raises(VerificationFailed, match="no signature by the log key"):
        cp.verify(note, SigningKey.generate("ed25519").public)
    with pytest.raises(VerificationFailed, match="not the expected 'other.org/log'"):
        cp.verify(note, LOG.public, origin="other.org/log")
    with pytest.raises(ProvenanceError, match="Ed25519"):
        cp.sign(cp.Checkpoint(ORIGIN, 1, ROOT), SigningKey.generate("p256"))
    with pytest.raises(ProvenanceError, match="without spaces"):
        cp.sign(cp.Checkpoint(ORIGIN, 1, ROOT), LOG, name="bad name")


def test_unknown_signatures_are_ignored_but_one_trusted_signature_is_needed():
    note = cp.sign(cp.Checkpoint(ORIGIN, 1, ROOT), LOG)
    other = SigningKey.generate("ed25519")
    extra = cp.sign_note(note.split("\n\n")[0] + "\n", other, "witness.example").split("\n\n")[1]
    cosigned = note + extra
    assert cp.verify(cosigned, LOG.public).size == 1
    assert cp.open_note(cosigned, other.public, "witness.example")


@pytest.mark.parametrize("text,msg", [
    ("example.org/log\n01\nAAAA\n\n\u2014 x AAAAAAA=\n", "leading zeros"),
    ("example.org/log\n1\n" + base64.b64encode(ROOT).decode() + "\n", "one blank line"),
    ("example.org/log\n1\n" + base64.b64encode(ROOT).decode() + "\n\n", "signature block missing"),
    ("example.org/log\n1\nAAAA\n\n\u2014 x AAAAAAA=\n", "root hash is 3 bytes"),
    ("example.org/log\n1\n" + base64.b64encode(ROOT).decode() + "\n\n- x AAAAAAA=\n", "bad signature line"),
    ("example.org/log\n1\n\n\u2014 x AAAAAAA=\n", "expected origin, size and root"),
    ("a\tb\n1\n" + base64.b64encode(ROOT).decode() + "\n\n\u2014 x AAAAAAA=\n", "control characters"),
])
def test_malformed_checkpoints_are_one_line_errors(text, msg):
    with pytest.raises(ProvenanceError, match=msg) as info:
        cp.verify(text, LOG.public)
    assert "\n" not in str(info.value)


NOTE = cp.sign(cp.Checkpoint(ORIGIN, 123456, ROOT), LOG).encode()


def test_every_position_flipped_is_rejected():
    for i in range(len(NOTE)):
        bad = NOTE[:i] + bytes([NOTE[i] ^ 0x01]) + NOTE[i + 1:]
        with pytest.raises(ProvenanceError):
            cp.verify(bad, LOG.public, origin=ORIGIN)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, len(NOTE) - 1), st.integers(0, 255))
def test_every_single_byte_mutation_of_a_checkpoint_is_rejected(i, b):
    if NOTE[i] == b:
        return
    with pytest.raises(ProvenanceError):
        cp.verify(NOTE[:i] + bytes([b]) + NOTE[i + 1:], LOG.public, origin=ORIGIN)
