"""Signed update headers: an :class:`~redteam.transport.chunking.UpdateManifest` as an
in-toto statement inside a DSSE envelope, signed by the client's enrolled P-256 key.

The statement (in-toto Statement v1, ``provenance.intoto``) names every chunk as a
subject — ``chunk/<i>`` with its SHA-256 — and binds, in its predicate, what makes the
update *this* update: ``round``, ``client``, a fresh ``nonce``, the ``parentDigest`` of
the global model it is a delta of, the ``codec``, ``payloadLength``, ``chunkSize`` and
the BEP 52 ``merkleRoot`` over the chunk digests. The envelope is DSSE v1 with payload
type ``application/vnd.in-toto+json`` (``provenance.dsse``), so any DSSE / in-toto
verifier can check it. A receiver that verifies the envelope against the sender's
enrolled key and then checks round, parent and nonce detects replay (an earlier
round's update), rollback (an update against an older model), substitution and
mix-and-match (a chunk whose digest is not the signed one) and, when sub-aggregators
gossip the headers they accepted, equivocation (two signed headers for one
(sender, round)); see ``defenses.provenance.SignedChunks``.

Keys are derived from the federation's seeded stream (:func:`derive_key`), and
signatures are deterministic ECDSA (RFC 6979), so a run is byte-for-byte reproducible —
including its bytes on the wire, since a DER signature's length depends on its value.

On the wire, the header is a :class:`~redteam.types.ChunkDelivery` with index
:data:`HEADER_INDEX` (−1) whose data is either the canonical manifest JSON (unsigned
federations) or the DSSE envelope JSON. :func:`read_header` parses either *without*
verifying anything — what a relay or an attacker can read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from provenance import dsse
from provenance.errors import ProvenanceError
from provenance.intoto import Statement
from provenance.keys import SigningKey
from redteam.errors import InvalidParameter

from .chunking import ManifestError, UpdateManifest

__all__ = [
    "HEADER_INDEX",
    "UPDATE_PREDICATE_TYPE",
    "DeterministicSigningKey",
    "derive_key",
    "update_statement",
    "manifest_from_statement",
    "sign_update",
    "is_signed",
    "read_header",
    "forge_header",
]

#: ``ChunkDelivery.index`` of an update's header.
HEADER_INDEX = -1
#: in-toto predicate type of a signed federated update.
UPDATE_PREDICATE_TYPE = "https://redteam.dev/federated-update/v1"
_PREDICATE_KEYS = frozenset(
    ("round", "client", "nonce", "parentDigest", "codec", "payloadLength", "chunkSize", "merkleRoot")
)
# the order of the P-256 group (SEC 2, secp256r1 n)
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_ECDSA_RFC6979 = ec.ECDSA(hashes.SHA256(), deterministic_signing=True)


class DeterministicSigningKey(SigningKey):
    """A :class:`provenance.keys.SigningKey` whose ECDSA signatures are deterministic
    (RFC 6979, Pornin 2013: the nonce k is derived from the key and the message hash).

    Verification is unchanged (any ECDSA-P256-SHA256 verifier accepts them); Ed25519
    signatures are deterministic by construction.
    """

    __slots__ = ()

    def sign(self, data: bytes) -> bytes:
        if self.kind == "p256":
            return self.key.sign(data, _ECDSA_RFC6979)
        return self.key.sign(data)


def derive_key(rng: np.random.Generator, kind: str = "p256") -> DeterministicSigningKey:
    """A private key drawn from ``rng`` (reproducible under the seed).

    P-256: the scalar is drawn uniformly from [1, n − 1] by rejection sampling of 256-bit
    draws (FIPS 186-5 A.2.2, "rejection sampling"); Ed25519: 32 random seed bytes
    (RFC 8032 §5.1.5). The stream must be a private one: whoever can replay it holds the key.
    """
    if kind == "p256":
        while True:
            d = int.from_bytes(rng.bytes(32), "big")
            if 1 <= d < _P256_ORDER:
                return DeterministicSigningKey(ec.derive_private_key(d, ec.SECP256R1()))
    if kind == "ed25519":
        return DeterministicSigningKey(ed25519.Ed25519PrivateKey.from_private_bytes(rng.bytes(32)))
    raise InvalidParameter(f"derive_key: kind = {kind!r}: expected 'p256' or 'ed25519'")


# --------------------------------------------------------------------------- statements
def update_statement(manifest: UpdateManifest) -> bytes:
    """The in-toto statement bytes (compact JSON, sorted keys) that a client signs."""
    predicate = {
        "round": manifest.round,
        "client": manifest.client,
        "nonce": manifest.nonce,
        "parentDigest": {"sha256": manifest.parent_digest},
        "codec": manifest.codec,
        "payloadLength": manifest.payload_len,
        "chunkSize": manifest.chunk_size,
        "merkleRoot": {"sha256": manifest.merkle_root},
    }
    subjects = [(f"chunk/{i}", h) for i, h in enumerate(manifest.chunk_digests)]
    try:
        return Statement.build(subjects, UPDATE_PREDICATE_TYPE, predicate).to_json()
    except ProvenanceError as exc:
        raise ManifestError(f"update statement: {exc}") from None


def _sha256_field(pred: dict[str, Any], key: str) -> str:
    v = pred[key]
    if type(v) is not dict or set(v) != {"sha256"} or not isinstance(v["sha256"], str):
        raise ManifestError(f"update statement: predicate.{key} must be {{\"sha256\": <hex>}}")
    return v["sha256"]


def manifest_from_statement(payload: bytes) -> UpdateManifest:
    """Parse and validate the statement bytes back into an :class:`UpdateManifest`.

    Untrusted input: every field is type-checked and the manifest is validated (chunk
    count, digests, Merkle root); subjects must be ``chunk/0 … chunk/n−1`` in order with
    a SHA-256 each (a subject offering only another algorithm is a downgrade and fails).
    """
    try:
        st = Statement.from_json(payload, "update statement")
    except ProvenanceError as exc:
        raise ManifestError(str(exc)) from None
    if st.predicate_type != UPDATE_PREDICATE_TYPE:
        raise ManifestError(f"update statement: predicateType {st.predicate_type[:80]!r}, "
                            f"expected {UPDATE_PREDICATE_TYPE!r}")
    pred = dict(st.predicate)
    if set(pred) != _PREDICATE_KEYS:
        missing, extra = sorted(_PREDICATE_KEYS - set(pred)), sorted(set(pred) - _PREDICATE_KEYS)
        raise ManifestError(f"update statement: predicate fields missing {missing}, unexpected {extra}")
    digests = []
    for i, s in enumerate(st.subjects):
        if s.name != f"chunk/{i}":
            raise ManifestError(f"update statement: subject {i} is named {s.name[:40]!r}, expected 'chunk/{i}'")
        digests.append(s.digest["sha256"])
    for key in ("round", "client", "payloadLength", "chunkSize"):
        if type(pred[key]) is not int:
            raise ManifestError(f"update statement: predicate.{key} = {pred[key]!r:.40}: must be an integer")
    for key in ("nonce", "codec"):
        if type(pred[key]) is not str:
            raise ManifestError(f"update statement: predicate.{key} must be a string")
    manifest = UpdateManifest(
        round=pred["round"], client=pred["client"], parent_digest=_sha256_field(pred, "parentDigest"),
        codec=pred["codec"], payload_len=pred["payloadLength"], chunk_size=pred["chunkSize"],
        chunk_digests=tuple(digests), merkle_root=_sha256_field(pred, "merkleRoot"), nonce=pred["nonce"],
    )
    return manifest.validate()


def sign_update(manifest: UpdateManifest, key: SigningKey) -> bytes:
    """The DSSE envelope JSON (one signature, keyid = the key's derived id) of ``manifest``."""
    return dsse.sign_json(update_statement(manifest), key)


# --------------------------------------------------------------------------- headers on the wire
def is_signed(header: bytes) -> bool:
    """True when ``header`` looks like a DSSE envelope rather than bare manifest JSON."""
    return bytes(header[:12]) == b'{"payload":"'


def read_header(header: bytes) -> UpdateManifest:
    """The manifest a header announces, parsed but *not verified* (a relay's view).

    Raises :class:`~redteam.transport.chunking.ManifestError` on malformed bytes.
    """
    if is_signed(header):
        try:
            env = dsse.Envelope.from_json(bytes(header), "update header", urlsafe=False)
        except ProvenanceError as exc:
            raise ManifestError(str(exc)) from None
        return manifest_from_statement(env.payload)
    return UpdateManifest.from_json(bytes(header))


def forge_header(header: bytes, manifest: UpdateManifest) -> bytes:
    """What an attacker without the signer's key can make of ``header`` announcing ``manifest``.

    An unsigned header is simply rewritten (nothing binds it). A signed one gets the new
    statement as its payload under the *old* signature — the best a forger can do, and
    what a verifier must reject.
    """
    if not is_signed(header):
        return manifest.to_json()
    try:
        env = dsse.Envelope.from_json(bytes(header), "update header", urlsafe=False)
    except ProvenanceError as exc:
        raise ManifestError(str(exc)) from None
    return replace(env, payload=update_statement(manifest)).to_json()

