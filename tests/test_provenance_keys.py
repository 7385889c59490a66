"""Keys: generation, 0600 PEM files, passphrases, clear load errors, derived key ids."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from provenance.errors import ProvenanceError
from provenance.keys import SigningKey, VerifyingKey, canonical_json, sslib_keyid


def test_canonical_json_is_securesystemslib_canonical_form():
    # OLPC canonical JSON: sorted keys, no whitespace, only backslash and quote escaped.
    assert canonical_json({"b": [1, True, None], "a": "x\"y\\z\n"}) == b'{"a":"x\\"y\\\\z\n","b":[1,true,null]}'
    with pytest.raises(ProvenanceError, match="no floats"):
        canonical_json({"x": 1.5})


def test_keyid_is_sha256_of_the_canonical_key_dict_by_hand():
    key = SigningKey.generate("p256")
    pem = key.public.pem.decode()
    by_hand = ('{"keytype":"ecdsa","keyval":{"public":"' + pem + '"},"scheme":"ecdsa-sha2-nistp256"}').encode()
    assert key.keyid == hashlib.sha256(by_hand).hexdigest()
    log = SigningKey.generate("ed25519")
    raw = log.public.raw.hex()
    by_hand = ('{"keytype":"ed25519","keyval":{"public":"' + raw + '"},"scheme":"ed25519"}').encode()
    assert log.keyid == hashlib.sha256(by_hand).hexdigest()


def test_keyid_matches_securesystemslib():
    from securesystemslib.signer import SSlibKey

    for kind in ("p256", "ed25519"):
        key = SigningKey.generate(kind)
        assert key.keyid == SSlibKey.from_crypto(key.public.key).keyid == sslib_keyid(key.public.key)


def test_model_signing_hint_is_sha256_of_the_pem():
    key = SigningKey.generate()
    assert key.public.hint == hashlib.sha256(key.public.pem).hexdigest()


@pytest.mark.parametrize("kind", ["p256", "ed25519"])
def test_sign_verify_and_round_trip(tmp_path, kind):
    key = SigningKey.generate(kind)
    sig = key.sign(b"data")
    assert key.public.verify(sig, b"data") and not key.public.verify(sig, b"datb")
    path = key.save(tmp_path / "k.pem")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = SigningKey.load(path)
    assert again.public == key.public and again.keyid == key.keyid
    pub = key.public.save(tmp_path / "k.pub")
    assert VerifyingKey.load(pub) == key.public


def test_private_key_file_is_created_0600_even_with_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        p = SigningKey.generate().save(tmp_path / "k.pem")
        q = SigningKey.generate().save(tmp_path / "k.pem", overwrite=True)
    finally:
        os.umask(old)
    assert p == q and stat.S_IMODE(os.stat(q).st_mode) == 0o600
    assert [f.name for f in tmp_path.iterdir()] == ["k.pem"]  # no temporary file left behind


def test_existing_key_is_not_overwritten_by_default(tmp_path):
    key = SigningKey.generate()
    key.save(tmp_path / "k.pem")
    with pytest.raises(ProvenanceError, match="already exists"):
        SigningKey.generate().save(tmp_path / "k.pem")
    assert SigningKey.load(tmp_path / "k.pem").public == key.public


def test_encrypted_key_needs_the_right_passphrase(tmp_path):
    key = SigningKey.generate()
    path = key.save(tmp_path / "k.pem", passphrase="correct horse")
    assert b"ENCRYPTED PRIVATE KEY" in path.read_bytes()
    assert SigningKey.load(path, passphrase="correct horse").public == key.public
    with pytest.raises(ProvenanceError, match="wrong passphrase"):
        SigningKey.load(path, passphrase="battery staple")
    with pytest.raises(ProvenanceError, match="encrypted; a passphrase is required"):
        SigningKey.load(path)


def test_clear_errors_for_garbage_wrong_type_and_missing_files(tmp_path):
    (tmp_path / "garbage").write_bytes(b"\x00\x01 not a key")
    with pytest.raises(ProvenanceError, match="garbage: not a PEM private key"):
        SigningKey.load(tmp_path / "garbage")
    with pytest.raises(ProvenanceError, match="no such key file"):
        SigningKey.load(tmp_path / "missing.pem")
    key = SigningKey.generate("ed25519")
    key.save(tmp_path / "log.pem")
    key.public.save(tmp_path / "log.pub")
    with pytest.raises(ProvenanceError, match="is an Ed25519 key, expected a P-256 key"):
        SigningKey.load(tmp_path / "log.pem", kind="p256")
    with pytest.raises(ProvenanceError, match="is an Ed25519 key, expected a P-256 key"):
        VerifyingKey.load(tmp_path / "log.pub", kind="p256")
    with pytest.raises(ProvenanceError, match="is a private key; pass the public key"):
        VerifyingKey.load(tmp_path / "log.pem")
    with pytest.raises(ProvenanceError, match="not a private key"):
        SigningKey.load(tmp_path / "log.pub")
    # other curves and algorithms are refused by name
    with pytest.raises(ProvenanceError, match="secp384r1: expected P-256"):
        VerifyingKey(ec.generate_private_key(ec.SECP384R1()).public_key())
    with pytest.raises(ProvenanceError, match="RSAPublicKey.*expected ECDSA P-256 or Ed25519"):
        VerifyingKey(rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key())
    with pytest.raises(ProvenanceError, match="kind = 'rsa'"):
        SigningKey.generate("rsa")  # type: ignore[arg-type]
