"""DSSE v1: the spec's test vector, interop with securesystemslib, strict parsing, mutations."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from hypothesis import given, settings, strategies as st

from provenance import dsse
from provenance.errors import ProvenanceError, VerificationFailed
from provenance.intoto import Statement
from provenance.keys import SigningKey, VerifyingKey

# secure-systems-lab/dsse protocol.md v1.0.0, "Test Vectors".
SPEC_TYPE = "http://example.com/HelloWorld"
SPEC_BODY = b"hello world"
SPEC_PAE = b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
SPEC_D = 97358161215184420915383655311931858321456579547487070936769975997791359926199
SPEC_X = 46950820868899156662930047687818585632848591499744589407958293238635476079160
SPEC_Y = 5640078356564379163099075877009565129882514886557779369047442380624545832820
SPEC_SIG = "A3JqsQGtVsJ2O2xqrI5IcnXip5GToJ3F+FnZ+O88SjtR6rDAajabZKciJTfUiHqJPcIAriEGAHTVeCUjW2JIZA=="

KEY = SigningKey.generate("p256")
STATEMENT = Statement.build({"chunk-0": "ab" * 32}, "https://example.org/test/v1", {"round": 3})


def test_pae_reproduces_the_spec_test_vector():
    assert dsse.pae(SPEC_TYPE, SPEC_BODY) == SPEC_PAE
    assert dsse.pae(SPEC_TYPE.encode(), SPEC_BODY) == SPEC_PAE


def test_pae_lengths_are_byte_lengths():
    assert dsse.pae("é", b"") == b"DSSEv1 2 \xc3\xa9 0 "


def test_spec_signature_is_reproduced_and_verifies():
    # The spec signs with deterministic (RFC 6979) ECDSA P-256 and shows r‖s raw.
    priv = ec.derive_private_key(SPEC_D, ec.SECP256R1())
    pub = ec.EllipticCurvePublicNumbers(SPEC_X, SPEC_Y, ec.SECP256R1()).public_key()
    assert priv.public_key().public_numbers() == pub.public_numbers()
    raw = base64.b64decode(SPEC_SIG)
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    vk = VerifyingKey(pub)
    assert vk.verify(der, dsse.pae(SPEC_TYPE, SPEC_BODY))
    mine = priv.sign(dsse.pae(SPEC_TYPE, SPEC_BODY), ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    r, s = decode_dss_signature(mine)
    assert base64.b64encode(r.to_bytes(32, "big") + s.to_bytes(32, "big")).decode() == SPEC_SIG
    # ...and the spec's envelope verifies through our parser (keyid absent).
    env = {"payload": "aGVsbG8gd29ybGQ=", "payloadType": SPEC_TYPE,
           "signatures": [{"sig": base64.b64encode(der).decode()}]}
    assert dsse.verify(env, vk, payload_type=SPEC_TYPE).payload == SPEC_BODY


def test_sign_verify_round_trip_and_serialization():
    env = dsse.sign(STATEMENT.to_json(), KEY)
    assert env.signatures[0].keyid == KEY.keyid
    text = env.to_json()
    assert json.loads(text) == env.to_dict()
    assert text == json.dumps(env.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    assert dsse.Envelope.from_json(text) == env
    v = dsse.verify(text, KEY.public)
    assert v.payload == STATEMENT.to_json() and v.keyids == (KEY.keyid,)


def test_securesystemslib_verifies_our_envelope():
    from securesystemslib.dsse import Envelope as SslibEnvelope
    from securesystemslib.signer import CryptoSigner, SSlibKey

    env = dsse.sign(STATEMENT.to_json(), KEY)
    theirs = SslibEnvelope.from_dict(json.loads(env.to_json()))
    ssl_key = SSlibKey.from_crypto(KEY.public.key)
    assert ssl_key.keyid == KEY.keyid
    accepted = theirs.verify([ssl_key], 1)
    assert list(accepted) == [KEY.keyid]
    # and we verify theirs
    signer = CryptoSigner(KEY.key, ssl_key)
    theirs2 = SslibEnvelope(payload=b"x" * 10, payload_type=dsse.PAYLOAD_TYPE, signatures={})
    theirs2.sign(signer)
    assert dsse.verify(theirs2.to_dict(), KEY.public).payload == b"x" * 10


def test_url_safe_base64_is_accepted():
    env = dsse.sign(b"\xfb\xff\xbf" * 5, KEY)
    d = env.to_dict()
    d["payload"] = base64.urlsafe_b64encode(env.payload).decode()
    assert "-" in d["payload"] or "_" in d["payload"]
    assert dsse.verify(d, KEY.public).payload == env.payload


def test_threshold_counts_distinct_keys():
    other = SigningKey.generate()
    env = dsse.sign(b"p", KEY)
    second = dsse.sign(b"p", other).signatures[0]
    both = dsse.Envelope(env.payload, env.payload_type, env.signatures + (second,))
    assert set(dsse.verify(both, [KEY.public, other.public], threshold=2).keyids) == {KEY.keyid, other.keyid}
    twice = dsse.Envelope(env.payload, env.payload_type, env.signatures * 2)
    with pytest.raises(VerificationFailed, match="1 of the required 2"):
        dsse.verify(twice, [KEY.public, other.public], threshold=2)
    with pytest.raises(ProvenanceError, match="at most 1 allowed"):
        dsse.verify(both, [KEY.public], max_signatures=1)


def test_keyid_is_a_hint_never_a_source_of_trust():
    other = SigningKey.generate()
    env = dsse.sign(b"p", other, keyid=KEY.keyid)  # claims to be KEY
    with pytest.raises(VerificationFailed):
        dsse.verify(env, KEY.public)
    spoof = dsse.sign(b"p", KEY, keyid=other.keyid)  # made by KEY, hint names another key
    with pytest.raises(VerificationFailed, match="keyid spoofing"):
        dsse.verify(spoof, [KEY.public])
    assert dsse.verify(spoof, [KEY.public], keyid_policy="ignore").keyids == (KEY.keyid,)
    assert dsse.verify(dsse.sign(b"p", KEY, keyid=""), KEY.public).keyids == (KEY.keyid,)


@pytest.mark.parametrize("mutate,msg", [
    (lambda d: d.pop("payload"), "missing field 'payload'"),
    (lambda d: d.update(payload="not base64!"), "payload: bad base64"),
    (lambda d: d.update(payload="aGVsbG8gd29ybGR="), "non-canonical"),
    (lambda d: d.update(payloadType="application/json"), "wrong payloadType"),
    (lambda d: d.update(signatures=[]), "non-empty list"),
    (lambda d: d["signatures"][0].update(sig=""), "empty signature"),
    (lambda d: d["signatures"][0].update(extra=1), "unexpected field"),
    (lambda d: d.update(payload=5), "expected a base64 string"),
])
def test_malformed_envelopes_are_one_line_errors(mutate, msg):
    d = dsse.sign(STATEMENT.to_json(), KEY).to_dict()
    mutate(d)
    with pytest.raises(ProvenanceError, match=msg) as info:
        dsse.verify(d, KEY.public)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text,msg", [
    (b"", "empty input"), (b'{"payload": "aGk=", "payloadType"', "truncated JSON"),
    (b"[1, 2]", "expected a JSON object"), (b"\xff\xfe", "not UTF-8"),
    (b'{"payload":"aGk=","payload":"aGk=","payloadType":"x","signatures":[]}', "duplicate JSON key"),
    (b'{"payload": NaN}', "JSON constant NaN"),
])
def test_malformed_json_is_a_one_line_error(text, msg):
    with pytest.raises(ProvenanceError, match=msg):
        dsse.Envelope.from_json(text)


ENV_BYTES = dsse.sign(STATEMENT.to_json(), KEY).to_json()


def _rejected_or_same_envelope(bad: bytes, i: int) -> None:
    """DSSE makes verifiers accept URL-safe base64, so '+'↔'-' and '/'↔'_' re-spell the
    same bytes; any other single-byte change must be rejected."""
    try:
        dsse.verify(bad, KEY.public)
    except ProvenanceError:
        return
    assert {ENV_BYTES[i], bad[i]} in ({ord("+"), ord("-")}, {ord("/"), ord("_")})
    assert dsse.Envelope.from_json(bad) == dsse.Envelope.from_json(ENV_BYTES)


def test_every_position_flipped_is_rejected():
    for i in range(len(ENV_BYTES)):
        bad = ENV_BYTES[:i] + bytes([ENV_BYTES[i] ^ 0x01]) + ENV_BYTES[i + 1:]
        with pytest.raises(ProvenanceError):
            dsse.verify(bad, KEY.public, urlsafe=False)
        _rejected_or_same_envelope(bad, i)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, len(ENV_BYTES) - 1), st.integers(0, 255))
def test_every_single_byte_mutation_of_an_envelope_is_rejected(i, b):
    if ENV_BYTES[i] == b:
        return
    bad = ENV_BYTES[:i] + bytes([b]) + ENV_BYTES[i + 1:]
    with pytest.raises(ProvenanceError):
        dsse.verify(bad, KEY.public, urlsafe=False)  # canonical base64 only: every change is caught
    _rejected_or_same_envelope(bad, i)


def test_alphabet_variant_is_the_only_accepted_respelling():
    # A fixed Ed25519 key (deterministic signatures, RFC 8032) and a fixed statement whose
    # signature's base64 has exactly one '+' or '/': the test never depends on luck (a
    # fresh P-256 signature has none in ~5 % of runs).
    key = SigningKey(ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
    statement = Statement.build({"chunk-0": "ab" * 32}, "https://example.org/test/v1", {"round": 4})
    text = dsse.sign(statement.to_json(), key).to_json().decode()
    sig = json.loads(text)["signatures"][0]["sig"]
    assert sum(c in "+/" for c in sig) == 1
    pos = next(j for j, c in enumerate(sig) if c in "+/")
    i = text.index(sig) + pos
    variant = text[:i] + {"+": "-", "/": "_"}[text[i]] + text[i + 1:]
    assert dsse.verify(variant, key.public).payload == statement.to_json()
    with pytest.raises(ProvenanceError, match="bad base64"):
        dsse.verify(variant, key.public, urlsafe=False)
