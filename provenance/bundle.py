"""Sigstore bundle v0.3 and trusted-root JSON for our envelopes and our log.

* **Bundle** (``application/vnd.dev.sigstore.bundle.v0.3+json``, sigstore
  protobuf-specs, JSON mapping): ``verificationMaterial.publicKey.hint`` (hex SHA-256 of
  the signer's PEM SubjectPublicKeyInfo, model-signing's convention), optional
  ``tlogEntries`` and the ``dsseEnvelope``. model-signing's key-based verifier reads
  exactly this shape.
* **Log entry**: ``logIndex`` (written even when 0: protobuf JSON would omit it and
  some verifiers then refuse the entry), ``logId.keyId``, ``kindVersion`` ``dsse``
  ``0.0.1``, ``integratedTime``, an ``inclusionPromise`` (the log's signature over the
  RFC 8785 JSON of ``{body, integratedTime, logID, logIndex}``, as Rekor v1 defines its
  signed entry timestamp), ``inclusionProof`` (RFC 6962 path, base64) with the C2SP
  ``checkpoint``, and the ``canonicalizedBody`` (Rekor ``dsse`` 0.0.1 shape).
* **logId** of an Ed25519 log is ``SHA-256(name ‖ 0x0A ‖ 0x01 ‖ key)``, the convention of
  Sigstore's Ed25519 (Rekor v2) logs in the public-good trusted root, so that its first
  four bytes are the C2SP key hash that sigstore-python matches checkpoint signatures
  against. (The RFC 6962 ``SHA-256(DER key)`` id is what Rekor v1's ECDSA logs use;
  with it, sigstore-python cannot find the checkpoint signature.)
* **Trusted root** (``application/vnd.dev.sigstore.trustedroot+json;version=0.1``): one
  ``tlogs[]`` entry with ``baseUrl = https://<origin>`` (the checkpoint key name must
  occur in it), the log key as DER ``PKIX_ED25519`` and the logId above.

:func:`verify_bundle` is our own offline verifier. It checks the envelope, the
signer's hint, the log entry's consistency with the envelope (payload hash, signature
and verifier: the CVE-2022-36056 class), the inclusion proof *and* that the proof's
root and size equal the signed checkpoint's, the checkpoint signature, the logId, and
the inclusion promise when present.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from . import _codec, checkpoint as _cp, dsse
from .errors import ProvenanceError, VerificationFailed, one_line
from .keys import SigningKey, VerifyingKey
from .merkle import InclusionProof, leaf_hash, verify_inclusion

__all__ = [
    "BUNDLE_MEDIA_TYPE",
    "TRUSTED_ROOT_MEDIA_TYPE",
    "BundleResult",
    "dsse_body",
    "make_bundle",
    "promise_payload",
    "sign_promise",
    "tlog_entry",
    "trusted_root",
    "verify_bundle",
]

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
TRUSTED_ROOT_MEDIA_TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"


def dsse_body(env: dsse.Envelope, verifier: VerifyingKey) -> bytes:
    """Rekor ``dsse`` 0.0.1 canonicalized body for a one-signature envelope (RFC 8785
    coincides with sorted compact JSON here: ASCII keys and strings only)."""
    if len(env.signatures) != 1:
        raise ProvenanceError(f"DSSE envelope has {len(env.signatures)} signatures; the log takes exactly one")
    return _codec.dumps({
        "apiVersion": "0.0.1",
        "kind": "dsse",
        "spec": {
            "envelopeHash": {"algorithm": "sha256", "value": hashlib.sha256(env.to_json()).hexdigest()},
            "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(env.payload).hexdigest()},
            "signatures": [{"signature": _codec.b64encode(env.signatures[0].sig),
                            "verifier": _codec.b64encode(verifier.pem)}],
        },
    })


def promise_payload(body: bytes, integrated_time: int, log_id: bytes, index: int) -> bytes:
    """The bytes a signed entry timestamp covers (RFC 8785 JSON, as Rekor v1 and sigstore define)."""
    return _codec.dumps({"body": _codec.b64encode(body), "integratedTime": integrated_time,
                         "logID": log_id.hex(), "logIndex": index})


def sign_promise(key: SigningKey, body: bytes, integrated_time: int, log_id: bytes, index: int) -> bytes:
    return key.sign(promise_payload(body, integrated_time, log_id, index))


def tlog_entry(*, index: int, log_id: bytes, integrated_time: int, body: bytes, proof: InclusionProof,
               promise: bytes | None) -> dict[str, Any]:
    if proof.checkpoint is None:
        raise ProvenanceError("a bundle's inclusion proof needs a signed checkpoint")
    entry: dict[str, Any] = {
        "logIndex": str(index),
        "logId": {"keyId": _codec.b64encode(log_id)},
        "kindVersion": {"kind": "dsse", "version": "0.0.1"},
        "integratedTime": str(integrated_time),
        "inclusionProof": {
            "logIndex": str(proof.log_index),
            "rootHash": _codec.b64encode(proof.root_hash),
            "treeSize": str(proof.tree_size),
            "hashes": [_codec.b64encode(h) for h in proof.hashes],
            "checkpoint": {"envelope": proof.checkpoint},
        },
        "canonicalizedBody": _codec.b64encode(body),
    }
    if promise is not None:
        entry["inclusionPromise"] = {"signedEntryTimestamp": _codec.b64encode(promise)}
    return entry


def make_bundle(env: dsse.Envelope, signer: VerifyingKey, tlog_entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A v0.3 bundle with public-key verification material."""
    return {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": signer.hint}, "tlogEntries": list(tlog_entries or [])},
        "dsseEnvelope": env.to_dict(),
    }


def trusted_root(log_key: VerifyingKey, origin: str, *, valid_from: str = "2025-01-01T00:00:00Z") -> dict[str, Any]:
    """A Sigstore trusted root describing our log (and nothing else)."""
    return {
        "mediaType": TRUSTED_ROOT_MEDIA_TYPE,
        "tlogs": [{
            "baseUrl": f"https://{origin}",
            "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": _codec.b64encode(log_key.der), "keyDetails": "PKIX_ED25519",
                          "validFor": {"start": valid_from}},
            "logId": {"keyId": _codec.b64encode(_cp.log_id(origin, log_key))},
        }],
        "certificateAuthorities": [],
        "ctlogs": [],
        "timestampAuthorities": [],
    }


def logs_from_trusted_root(root: Mapping[str, Any] | bytes | str) -> dict[bytes, tuple[str, VerifyingKey]]:
    """``{logId: (origin, Ed25519 key)}`` for the Ed25519 logs of a trusted root."""
    if not isinstance(root, Mapping):
        root = _codec.loads(root, "trusted root")
    if not isinstance(root, Mapping) or root.get("mediaType") != TRUSTED_ROOT_MEDIA_TYPE:
        raise ProvenanceError(f"trusted root: mediaType must be {TRUSTED_ROOT_MEDIA_TYPE!r}")
    out = {}
    tlogs = root.get("tlogs")
    if not isinstance(tlogs, list):
        raise ProvenanceError("trusted root: 'tlogs' must be a list")
    for i, t in enumerate(tlogs):
        if not isinstance(t, Mapping) or not isinstance(t.get("publicKey"), Mapping):
            raise ProvenanceError(f"trusted root: tlogs[{i}] is malformed")
        if t["publicKey"].get("keyDetails") != "PKIX_ED25519":
            continue
        key = VerifyingKey.from_der(_codec.b64decode(t["publicKey"].get("rawBytes"), f"trusted root tlogs[{i}].rawBytes"),
                                    kind="ed25519", where=f"trusted root tlogs[{i}]")
        url = urlsplit(_codec.string(t.get("baseUrl"), f"trusted root tlogs[{i}].baseUrl"))
        origin = (url.netloc + url.path).rstrip("/")  # our baseUrl is https://<origin>
        lid = _codec.b64decode((t.get("logId") or {}).get("keyId"), f"trusted root tlogs[{i}].logId.keyId")
        out[lid] = (origin, key)
    if not out:
        raise ProvenanceError("trusted root: no Ed25519 transparency log in 'tlogs'")
    return out


@dataclass(frozen=True, slots=True)
class BundleResult:
    """What :func:`verify_bundle` established."""

    payload: bytes
    payload_type: str
    keyid: str
    log_index: int | None = None
    tree_size: int | None = None
    integrated_time: int | None = None
    origin: str | None = None


def _verify_entry(e: object, env: dsse.Envelope, signer: VerifyingKey,
                  logs: Mapping[bytes, tuple[str, VerifyingKey]], check_envelope_hash: bool) -> tuple[int, int, int, str]:
    w = "bundle tlogEntries[0]"
    e = _codec.obj(e, w, ("logIndex", "logId", "kindVersion", "inclusionProof", "canonicalizedBody"),
                   ("integratedTime", "inclusionPromise"))
    index = _codec.integer(e["logIndex"], f"{w}.logIndex", from_string=True)
    lid = _codec.b64decode(_codec.obj(e["logId"], f"{w}.logId", ("keyId",))["keyId"], f"{w}.logId.keyId")
    kv = _codec.obj(e["kindVersion"], f"{w}.kindVersion", ("kind", "version"))
    if (kv["kind"], kv["version"]) != ("dsse", "0.0.1"):
        raise ProvenanceError(f"{w}.kindVersion = {one_line(kv, 80)}: expected dsse 0.0.1")
    if lid not in logs:
        raise VerificationFailed(f"{w}: log id {lid.hex()[:16]}… is not a trusted log")
    origin, log_key = logs[lid]
    body = _codec.b64decode(e["canonicalizedBody"], f"{w}.canonicalizedBody")
    # the entry must describe *this* envelope and signer
    spec = _codec.obj(_codec.obj(_codec.loads(body, f"{w} body"), f"{w} body", ("apiVersion", "kind", "spec"))["spec"],
                      f"{w} body.spec", ("envelopeHash", "payloadHash", "signatures"))
    want = json.loads(dsse_body(env, signer))["spec"]
    if spec["payloadHash"] != want["payloadHash"]:
        raise VerificationFailed(f"{w}: the logged payload hash is not the envelope's payload")
    if spec["signatures"] != want["signatures"]:
        raise VerificationFailed(f"{w}: the logged signature or verifier is not the envelope's")
    if check_envelope_hash and spec["envelopeHash"] != want["envelopeHash"]:
        raise VerificationFailed(f"{w}: the logged envelope hash is not the envelope's")
    p = _codec.obj(e["inclusionProof"], f"{w}.inclusionProof", ("logIndex", "rootHash", "treeSize", "hashes", "checkpoint"))
    p_index = _codec.integer(p["logIndex"], f"{w}.inclusionProof.logIndex", from_string=True)
    size = _codec.integer(p["treeSize"], f"{w}.inclusionProof.treeSize", from_string=True, minimum=1)
    root = _codec.b64decode(p["rootHash"], f"{w}.inclusionProof.rootHash")
    if not isinstance(p["hashes"], list):
        raise ProvenanceError(f"{w}.inclusionProof.hashes: expected a list")
    hashes = [_codec.b64decode(h, f"{w}.inclusionProof.hashes[{i}]") for i, h in enumerate(p["hashes"])]
    note = _codec.string(_codec.obj(p["checkpoint"], f"{w}.inclusionProof.checkpoint", ("envelope",))["envelope"],
                         f"{w}.inclusionProof.checkpoint.envelope")
    if p_index != index:
        raise VerificationFailed(f"{w}: inclusion proof is for index {p_index}, the entry says {index}")
    verify_inclusion(index, size, leaf_hash(body), hashes, root)
    cp = _cp.verify(note, log_key, origin=origin)
    if cp.size != size or cp.root != root:
        raise VerificationFailed(f"{w}: the inclusion proof (size {size}) is not for the signed checkpoint (size {cp.size})")
    t = _codec.integer(e.get("integratedTime", "0"), f"{w}.integratedTime", from_string=True)
    if "inclusionPromise" in e:
        sig = _codec.b64decode(_codec.obj(e["inclusionPromise"], f"{w}.inclusionPromise", ("signedEntryTimestamp",))
                               ["signedEntryTimestamp"], f"{w}.inclusionPromise.signedEntryTimestamp")
        if not log_key.verify(sig, promise_payload(body, t, lid, index)):
            raise VerificationFailed(f"{w}: the inclusion promise does not verify with the log key")
    return index, size, t, origin


def verify_bundle(bundle: Mapping[str, Any] | bytes | str, key: VerifyingKey, *,
                  log_key: VerifyingKey | None = None, origin: str | None = None,
                  trusted_root: Mapping[str, Any] | bytes | str | None = None,
                  require_tlog: bool | None = None, check_envelope_hash: bool = True,
                  payload_type: str = dsse.PAYLOAD_TYPE) -> BundleResult:
    """Verify a v0.3 bundle signed by ``key``; check its log entry if it has one.

    The log is trusted through ``trusted_root`` or through ``log_key`` + ``origin``.
    ``require_tlog``: whether a bundle without a log entry fails. The default (``None``)
    follows Sigstore's verifiers: when a log is trusted (a trusted root that describes one,
    or ``log_key`` + ``origin``) the bundle must carry a verifiable entry for it, so that
    removing the entry from a bundle cannot turn "logged" into "not checked". ``False``
    relaxes that explicitly; ``True`` requires an entry even when no log is given (and
    then the entry cannot be checked, which is an error).
    """
    w = "bundle"
    b = bundle if isinstance(bundle, Mapping) else _codec.loads(bundle, w)
    b = _codec.obj(b, w, ("mediaType", "verificationMaterial", "dsseEnvelope"))
    if b["mediaType"] != BUNDLE_MEDIA_TYPE:
        raise ProvenanceError(f"{w}.mediaType = {one_line(b['mediaType'], 80)!r}: expected {BUNDLE_MEDIA_TYPE!r}")
    vm = _codec.obj(b["verificationMaterial"], f"{w}.verificationMaterial", ("publicKey",),
                    ("tlogEntries", "timestampVerificationData"))
    pk = _codec.obj(vm["publicKey"], f"{w}.verificationMaterial.publicKey", (), ("hint",))
    hint = pk.get("hint")
    if hint not in (None, "") and hint != key.hint:
        raise VerificationFailed(f"{w}: publicKey.hint {one_line(hint, 20)}… is not the hint of the verifying key "
                                 f"(keyid {key.keyid}): signed by another key")
    env = dsse.Envelope.from_dict(b["dsseEnvelope"], f"{w}.dsseEnvelope", urlsafe=False)
    ok = dsse.verify(env, key, payload_type=payload_type, max_signatures=1)
    entries = vm.get("tlogEntries", [])
    if not isinstance(entries, list) or len(entries) > 1:
        raise ProvenanceError(f"{w}.verificationMaterial.tlogEntries: expected a list of at most one entry")
    logs: Mapping[bytes, tuple[str, VerifyingKey]] | None = None
    if trusted_root is not None:
        logs = logs_from_trusted_root(trusted_root)  # raises unless it describes a log
    elif log_key is not None and origin:
        logs = {_cp.log_id(origin, log_key): (origin, log_key)}
    if not entries:
        if require_tlog or (require_tlog is None and logs is not None):
            why = " (the trusted root describes a log; require_tlog=False relaxes this)" if logs is not None else ""
            raise VerificationFailed(f"{w}: has no transparency-log entry{why}")
        return BundleResult(ok.payload, ok.payload_type, ok.keyids[0])
    if logs is None:
        raise ProvenanceError("bundle has a log entry: pass trusted_root, or log_key and origin, to check it")
    index, size, t, org = _verify_entry(entries[0], env, key, logs, check_envelope_hash)
    return BundleResult(ok.payload, ok.payload_type, ok.keyids[0], index, size, t, org)
