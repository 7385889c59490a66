"""Provenance for federated training: keys, DSSE/in-toto, dataset manifests, a transparency log.

Formats are the ecosystem's, used exactly, so tools nobody here wrote can check them:

* :mod:`provenance.keys`: ECDSA P-256 (clients, data) and Ed25519 (the log) keys,
  securesystemslib key ids derived from the public key, 0600 PEM files;
* :mod:`provenance.dsse`: DSSE v1 envelopes (PAE, sign, strict verify);
* :mod:`provenance.intoto`: in-toto Statement v1;
* :mod:`provenance.manifest`: dataset manifests in the OpenSSF model-signing v1.0 layout;
* :mod:`provenance.merkle`: RFC 6962 / 9162 tree hashes, inclusion and consistency proofs;
* :mod:`provenance.checkpoint`: C2SP signed-note checkpoints (Ed25519);
* :mod:`provenance.ledger`: the SQLite append-only log;
* :mod:`provenance.bundle`: Sigstore bundle v0.3 and trusted-root JSON, offline verification;
* :mod:`provenance.cli`: ``redteam provenance ...`` and ``redteam ledger ...``.

Every malformed input raises :class:`ProvenanceError` (one line); well-formed input that
does not verify raises its subclass :class:`VerificationFailed`.
"""

from __future__ import annotations

from .bundle import make_bundle, trusted_root, verify_bundle
from .dsse import PAYLOAD_TYPE, Envelope, pae
from .errors import ProvenanceError, VerificationFailed
from .intoto import Statement, Subject
from .keys import SigningKey, VerifyingKey
from .ledger import Ledger, VerifyReport
from .manifest import DatasetManifest, FileEntry

__all__ = [
    "PAYLOAD_TYPE",
    "DatasetManifest",
    "Envelope",
    "FileEntry",
    "Ledger",
    "ProvenanceError",
    "SigningKey",
    "Statement",
    "Subject",
    "VerificationFailed",
    "VerifyReport",
    "VerifyingKey",
    "make_bundle",
    "pae",
    "trusted_root",
    "verify_bundle",
]
