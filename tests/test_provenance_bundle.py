"""Sigstore bundle v0.3 + trusted root: our offline verifier and sigstore-python's pieces."""

from __future__ import annotations

import base64
import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from provenance import dsse
from provenance.bundle import BUNDLE_MEDIA_TYPE, make_bundle, trusted_root, verify_bundle
from provenance.checkpoint import log_id
from provenance.errors import ProvenanceError, VerificationFailed
from provenance.intoto import Statement
from provenance.keys import SigningKey
from provenance.ledger import Ledger

ORIGIN = "bundle.test/log"
CLIENT = SigningKey.generate("p256")
LOG = SigningKey.generate("ed25519")


def env(i: int) -> dsse.Envelope:
    return dsse.sign(Statement.build({f"shard-{i}": "cd" * 32}, "https://redteam.test/x/v1").to_json(), CLIENT)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    led = Ledger.init(tmp_path_factory.mktemp("b") / "log.db", LOG, ORIGIN)
    bundles = [led.append(env(i), CLIENT.public)[1] for i in range(6)]
    root = led.trusted_root()
    yield led, bundles, root
    led.close()


def test_bundle_shape(logged):
    led, bundles, root = logged
    b = bundles[0]
    assert b["mediaType"] == BUNDLE_MEDIA_TYPE == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert b["verificationMaterial"]["publicKey"] == {"hint": CLIENT.public.hint}
    e = b["verificationMaterial"]["tlogEntries"][0]
    assert e["logIndex"] == "0" and e["inclusionProof"]["logIndex"] == "0"  # written even when 0
    assert e["kindVersion"] == {"kind": "dsse", "version": "0.0.1"}
    assert base64.b64decode(e["logId"]["keyId"]) == log_id(ORIGIN, LOG.public)
    t = root["tlogs"][0]
    assert t["baseUrl"] == f"https://{ORIGIN}" and t["publicKey"]["keyDetails"] == "PKIX_ED25519"
    assert base64.b64decode(t["publicKey"]["rawBytes"]) == LOG.public.der
    assert root["mediaType"] == "application/vnd.dev.sigstore.trustedroot+json;version=0.1"


def test_our_verifier_accepts_logged_bundles(logged):
    led, bundles, root = logged
    for i, b in enumerate(bundles):
        r = verify_bundle(b, CLIENT.public, trusted_root=root, require_tlog=True)
        assert (r.log_index, r.tree_size, r.origin) == (i, i + 1, ORIGIN)
        assert verify_bundle(json.dumps(b), CLIENT.public, log_key=LOG.public, origin=ORIGIN).log_index == i
    # a fresh bundle for an old entry is proven against the latest checkpoint
    assert verify_bundle(led.bundle(0), CLIENT.public, trusted_root=root).tree_size == 6


def test_bundle_without_log_entry(logged):
    b = make_bundle(env(99), CLIENT.public)
    assert verify_bundle(b, CLIENT.public).log_index is None
    with pytest.raises(VerificationFailed, match="no transparency-log entry"):
        verify_bundle(b, CLIENT.public, require_tlog=True)
    with pytest.raises(VerificationFailed, match="hint"):
        verify_bundle(b, SigningKey.generate().public)


def _edit(b, fn):
    b = copy.deepcopy(b)
    fn(b)
    return b


def _entry(b):
    return b["verificationMaterial"]["tlogEntries"][0]


@pytest.mark.parametrize("edit,msg", [
    # the log entry describes another envelope (CVE-2022-36056 class)
    (lambda b, o: _entry(b).update(canonicalizedBody=_entry(o)["canonicalizedBody"]), "payload hash"),
    (lambda b, o: b.update(dsseEnvelope=o["dsseEnvelope"]), "payload hash"),
    # proof and checkpoint of different trees
    (lambda b, o: _entry(b)["inclusionProof"].update(checkpoint=_entry(o)["inclusionProof"]["checkpoint"]),
     "not for the signed checkpoint"),
    (lambda b, o: _entry(b)["inclusionProof"].update(logIndex="1"), "inclusion proof is for index 1"),
    (lambda b, o: _entry(b).update(integratedTime="1"), "inclusion promise"),
    (lambda b, o: _entry(b).update(logId={"keyId": base64.b64encode(b"\0" * 32).decode()}), "not a trusted log"),
    (lambda b, o: _entry(b).update(kindVersion={"kind": "hashedrekord", "version": "0.0.1"}), "dsse 0.0.1"),
    (lambda b, o: b.update(mediaType="application/vnd.dev.sigstore.bundle+json;version=0.1"), "mediaType"),
])
def test_inconsistent_bundles_are_rejected(logged, edit, msg):
    led, bundles, root = logged
    bad = _edit(bundles[2], lambda b: edit(b, bundles[3]))
    with pytest.raises(ProvenanceError, match=msg):
        verify_bundle(bad, CLIENT.public, trusted_root=root)


def test_bundle_from_another_log_is_rejected(logged):
    led, bundles, _ = logged
    other = trusted_root(SigningKey.generate("ed25519").public, ORIGIN)
    with pytest.raises(VerificationFailed, match="not a trusted log"):
        verify_bundle(bundles[1], CLIENT.public, trusted_root=other)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_single_byte_mutation_of_a_bundle_is_rejected(logged, data):
    led, bundles, root = logged
    raw = json.dumps(bundles[4], sort_keys=True, separators=(",", ":")).encode()
    i = data.draw(st.integers(0, len(raw) - 1))
    b = data.draw(st.integers(0, 255).filter(lambda v: v != raw[i]))
    with pytest.raises(ProvenanceError):
        verify_bundle(raw[:i] + bytes([b]) + raw[i + 1:], CLIENT.public, trusted_root=root, require_tlog=True)


# --------------------------------------------------------------------------- sigstore-python
def test_sigstore_python_verifies_our_log_entry_against_our_trusted_root(logged, tmp_path):
    """sigstore-python checks the inclusion proof, the C2SP checkpoint signature and the
    inclusion promise of our entry with the key from our trusted_root.json."""
    from sigstore._internal.trust import KeyringPurpose
    from sigstore.errors import VerificationError
    from sigstore.models import TransparencyLogEntry, TrustedRoot
    from sigstore_models.rekor.v1 import TransparencyLogEntry as _Entry

    led, bundles, root = logged
    (tmp_path / "trusted_root.json").write_text(json.dumps(root))
    keyring = TrustedRoot.from_file(str(tmp_path / "trusted_root.json")).rekor_keyring(KeyringPurpose.VERIFY)
    for b in bundles:
        TransparencyLogEntry(_Entry.from_dict(_entry(b)))._verify(keyring)
    bad = copy.deepcopy(_entry(bundles[5]))
    h = bytearray(base64.b64decode(bad["inclusionProof"]["hashes"][0]))
    h[0] ^= 1
    bad["inclusionProof"]["hashes"][0] = base64.b64encode(bytes(h)).decode()
    with pytest.raises(VerificationError):
        TransparencyLogEntry(_Entry.from_dict(bad))._verify(keyring)


def test_sigstore_python_dsse_helper_verifies_our_envelope(logged):
    from sigstore import dsse as sdsse
    from sigstore_models.intoto import Envelope as _Envelope

    led, bundles, _ = logged
    inner = _Envelope.from_dict(bundles[0]["dsseEnvelope"])
    assert sdsse._verify(CLIENT.public.key, sdsse.Envelope(inner)) == dsse.Envelope.from_dict(
        bundles[0]["dsseEnvelope"]).payload


def test_sigstore_python_refuses_public_key_bundles(logged):
    """Why sigstore-python cannot verify the whole bundle: its Bundle model requires an
    X.509 signing certificate (keyless); public-key bundles are refused on load."""
    from sigstore.errors import Error
    from sigstore.models import Bundle

    with pytest.raises(Error, match="expected certificate in bundle"):
        Bundle.from_json(json.dumps(logged[1][0]))


def _stripped(bundle):
    b = copy.deepcopy(bundle)
    b["verificationMaterial"]["tlogEntries"] = []
    return b


def test_a_trusted_log_requires_the_bundle_to_carry_its_entry(logged):
    # issue 9 §5: removing the log entry from a logged bundle must not turn "logged and
    # checked" into "not checked" when the verifier was told which log to trust
    led, bundles, root = logged
    b = _stripped(bundles[2])
    with pytest.raises(VerificationFailed, match="bundle: has no transparency-log entry \\(the trusted root"):
        verify_bundle(b, CLIENT.public, trusted_root=root)
    with pytest.raises(VerificationFailed, match="has no transparency-log entry"):
        verify_bundle(b, CLIENT.public, log_key=LOG.public, origin=ORIGIN)
    # the explicit relaxation, and no log trusted at all, still accept the signed envelope
    assert verify_bundle(b, CLIENT.public, trusted_root=root, require_tlog=False).log_index is None
    assert verify_bundle(b, CLIENT.public).log_index is None
    # the intact bundle still verifies under the default
    assert verify_bundle(bundles[2], CLIENT.public, trusted_root=root).log_index == 2
