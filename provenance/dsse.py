"""DSSE v1 envelopes: pre-authentication encoding, signing, strict verification.

Dead Simple Signing Envelope, secure-systems-lab/dsse ``protocol.md`` v1.0.0 and
``envelope.md``. The signature is computed over

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

with LEN the ASCII decimal byte length (no leading zeros), and the JSON envelope is
``{"payload": b64(body), "payloadType": type, "signatures": [{"keyid", "sig"}]}``.
Following the spec:

* ``keyid`` is an unauthenticated hint. It never selects a key we would not otherwise
  trust; with ``keyid_policy="match"`` (our default) a non-empty hint must equal the
  securesystemslib key id *derived* from the trusted key that verifies the signature,
  so a spoofed hint is reported rather than silently ignored;
* a ``(t, n)`` threshold counts distinct trusted keys, not signatures;
* standard and URL-safe base64 are both accepted (canonical spellings only).

The in-toto layer uses ``payloadType = application/vnd.in-toto+json`` and, as Sigstore
bundles require, exactly one signature per envelope.
"""

from __future__ import annotations

import binascii
import json
import re
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

from . import _codec
from .errors import ProvenanceError, VerificationFailed, one_line
from .keys import SigningKey, VerifyingKey

__all__ = ["PAYLOAD_TYPE", "Envelope", "Signature", "Verified", "pae", "sign", "sign_json", "verify"]

_b64 = binascii.b2a_base64
#: The in-toto envelope payload type (in-toto attestation spec, envelope layer).
PAYLOAD_TYPE = "application/vnd.in-toto+json"
_INTOTO_JSON = json.dumps(PAYLOAD_TYPE).encode()
_SIG_KEYS = frozenset(("sig", "keyid"))
# The canonical one-signature envelope as to_json()/sign_json() write it (payload type and
# keyid restricted to characters JSON does not escape). Anything else takes the full parser.
_CANONICAL = re.compile(rb'\{"payload":"([A-Za-z0-9+/]*={0,2})","payloadType":"([A-Za-z0-9.+\-/:_]+)",'
                        rb'"signatures":\[\{(?:"keyid":"([0-9a-f]+)",)?"sig":"([A-Za-z0-9+/]+={0,2})"\}\]\}')


def pae(payload_type: str | bytes, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of ``(UTF8(payload_type), payload)``."""
    t = payload_type.encode("utf-8") if isinstance(payload_type, str) else bytes(payload_type)
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


@dataclass(frozen=True, slots=True)
class Signature:
    """One DSSE signature: the raw signature bytes and the (unauthenticated) key id hint."""

    sig: bytes
    keyid: str = ""


@dataclass(frozen=True, slots=True)
class Envelope:
    """A DSSE envelope. ``payload`` is the raw (decoded) body."""

    payload: bytes
    payload_type: str
    signatures: tuple[Signature, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "payload": _codec.b64encode(self.payload),
            "payloadType": self.payload_type,
            "signatures": [
                ({"keyid": s.keyid, "sig": _codec.b64encode(s.sig)} if s.keyid else {"sig": _codec.b64encode(s.sig)})
                for s in self.signatures
            ],
        }

    def to_json(self) -> bytes:
        """Compact JSON with sorted keys (byte-identical to ``_codec.dumps(self.to_dict())``)."""
        sigs = ",".join(
            ('{"keyid":%s,"sig":"%s"}' % (json.dumps(s.keyid), _codec.b64encode(s.sig))) if s.keyid
            else ('{"sig":"%s"}' % _codec.b64encode(s.sig))
            for s in self.signatures
        )
        return ('{"payload":"%s","payloadType":%s,"signatures":[%s]}'
                % (_codec.b64encode(self.payload), json.dumps(self.payload_type), sigs)).encode()

    @classmethod
    def from_dict(cls, d: object, what: str = "DSSE envelope", *, urlsafe: bool = True) -> "Envelope":
        """Parse an untrusted envelope. ``urlsafe`` (DSSE's rule, the default) also
        accepts URL-safe and unpadded base64; pass ``False`` for canonical padded
        standard base64 only, so that no two spellings of one envelope both parse."""
        d = _codec.obj(d, what, ("payload", "payloadType", "signatures"))
        payload = _codec.b64decode(d["payload"], f"{what}.payload", urlsafe=urlsafe)
        ptype = d["payloadType"]
        if type(ptype) is not str or not ptype:
            _codec.string(ptype, f"{what}.payloadType")
        raw_sigs = d["signatures"]
        if not isinstance(raw_sigs, list) or not raw_sigs:
            raise ProvenanceError(f"{what}.signatures: expected a non-empty list")
        sigs = []
        for i, s in enumerate(raw_sigs):
            if type(s) is not dict or not s.keys() <= _SIG_KEYS or "sig" not in s:
                _codec.obj(s, f"{what}.signatures[{i}]", ("sig",), ("keyid",))
            sig = _codec.b64decode(s["sig"], f"{what}.signatures[{i}].sig", urlsafe=urlsafe)
            if not sig:
                raise ProvenanceError(f"{what}.signatures[{i}].sig: empty signature")
            keyid = s.get("keyid", "")
            if type(keyid) is not str:
                _codec.string(keyid, f"{what}.signatures[{i}].keyid", empty=True)
            sigs.append(Signature(sig=sig, keyid=keyid))
        return cls(payload=payload, payload_type=ptype, signatures=tuple(sigs))

    @classmethod
    def from_json(cls, data: bytes | str, what: str = "DSSE envelope", *, urlsafe: bool = True) -> "Envelope":
        if isinstance(data, bytes):
            m = _CANONICAL.fullmatch(data)
            if m is not None:  # exactly the form we emit: skip the general JSON parser
                payload, sig = binascii.a2b_base64(m[1], strict_mode=True), binascii.a2b_base64(m[4], strict_mode=True)
                if binascii.b2a_base64(payload, newline=False) == m[1] and \
                        binascii.b2a_base64(sig, newline=False) == m[4] and sig:
                    return cls(payload, m[2].decode(), (Signature(sig, (m[3] or b"").decode()),))
        return cls.from_dict(_codec.loads(data, what), what, urlsafe=urlsafe)


@dataclass(frozen=True, slots=True)
class Verified:
    """What a successful verification established.

    ``keyids`` are the *derived* key ids of the trusted keys whose signatures verified.
    """

    payload: bytes
    payload_type: str
    keyids: tuple[str, ...]


def sign(payload: bytes, key: SigningKey, *, payload_type: str = PAYLOAD_TYPE,
         keyid: str | None = None) -> Envelope:
    """Sign ``payload`` into a one-signature envelope.

    ``keyid`` defaults to the key's securesystemslib key id; pass ``""`` to omit it
    (as model-signing does).
    """
    if not isinstance(payload, (bytes, bytearray)):
        raise ProvenanceError(f"payload of type {type(payload).__name__}: expected bytes")
    sig = key.sign(pae(payload_type, bytes(payload)))
    return Envelope(payload=bytes(payload), payload_type=payload_type,
                    signatures=(Signature(sig=sig, keyid=key.keyid if keyid is None else keyid),))


def sign_json(payload: bytes, key: SigningKey, *, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """Fast path: ``sign(payload, key, payload_type=...).to_json()`` without the objects
    (the same bytes; the keyid is the key's derived hex id, which needs no escaping)."""
    sig = key.sign(pae(payload_type, payload))
    ptype = _INTOTO_JSON if payload_type == PAYLOAD_TYPE else json.dumps(payload_type).encode()
    return b"".join((b'{"payload":"', _b64(payload, newline=False), b'","payloadType":', ptype,
                     b',"signatures":[{"keyid":"', key.keyid.encode(), b'","sig":"', _b64(sig, newline=False),
                     b'"}]}'))


def _as_envelope(envelope: Envelope | bytes | str | Mapping[str, object], urlsafe: bool) -> Envelope:
    if isinstance(envelope, Envelope):
        return envelope
    if isinstance(envelope, Mapping):
        return Envelope.from_dict(dict(envelope), urlsafe=urlsafe)
    return Envelope.from_json(envelope, urlsafe=urlsafe)


def verify(
    envelope: Envelope | bytes | str | Mapping[str, object],
    trusted: VerifyingKey | Iterable[VerifyingKey],
    *,
    payload_type: str | tuple[str, ...] = PAYLOAD_TYPE,
    threshold: int = 1,
    max_signatures: int | None = None,
    keyid_policy: Literal["match", "ignore"] = "match",
    urlsafe: bool = True,
) -> Verified:
    """Verify a DSSE envelope against trusted public keys; return the authenticated payload.

    * ``payload_type``: the accepted type(s); anything else is a :class:`ProvenanceError`;
    * ``threshold``: how many *distinct* trusted keys must have signed (DSSE ``t``);
    * ``max_signatures``: refuse envelopes carrying more signatures (1 for Sigstore bundles);
    * ``keyid_policy``: ``"match"`` rejects a non-empty ``keyid`` that is not the derived
      key id of the key that made the signature (keyid spoofing); ``"ignore"`` treats
      it purely as a hint;
    * ``urlsafe``: accept URL-safe/unpadded base64 as DSSE requires (``False``: only
      canonical padded standard base64, as we emit).

    Raises :class:`VerificationFailed` when fewer than ``threshold`` trusted keys verify.
    """
    env = _as_envelope(envelope, urlsafe)
    if (type(trusted) is VerifyingKey and threshold == 1 and len(env.signatures) == 1
            and env.payload_type == payload_type and env.signatures[0].keyid in ("", trusted.keyid)):
        # the common case: one key, one signature, matching (or absent) hint
        if trusted.verify(env.signatures[0].sig, pae(env.payload_type, env.payload)):
            return Verified(env.payload, env.payload_type, (trusted.keyid,))
    keys = [trusted] if isinstance(trusted, VerifyingKey) else list(trusted)
    if not keys or not all(isinstance(k, VerifyingKey) for k in keys):
        raise ProvenanceError("trusted: expected one or more VerifyingKey objects")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ProvenanceError(f"threshold = {threshold!r}: must be an integer ≥ 1")
    if keyid_policy not in ("match", "ignore"):
        raise ProvenanceError(f"keyid_policy = {keyid_policy!r}: expected 'match' or 'ignore'")
    accepted_types = (payload_type,) if isinstance(payload_type, str) else tuple(payload_type)
    if env.payload_type not in accepted_types:
        raise ProvenanceError(f"DSSE envelope: wrong payloadType {one_line(env.payload_type, 80)!r}, "
                              f"expected {' or '.join(accepted_types)}")
    if max_signatures is not None and len(env.signatures) > max_signatures:
        raise ProvenanceError(f"DSSE envelope: {len(env.signatures)} signatures, at most {max_signatures} allowed")

    by_id: dict[str, VerifyingKey] = {k.keyid: k for k in keys}
    message = pae(env.payload_type, env.payload)
    accepted: dict[bytes, str] = {}
    problems: list[str] = []
    for i, s in enumerate(env.signatures):
        if s.keyid and keyid_policy == "match":
            k = by_id.get(s.keyid)
            if k is None:
                # The hint names no trusted key. If a trusted key made it anyway, the
                # hint was spoofed; otherwise the signer is simply unknown to us.
                maker = next((c for c in keys if c.verify(s.sig, message)), None)
                if maker is not None:
                    problems.append(f"signature {i}: keyid {one_line(s.keyid, 80)} is not the key id of the key that "
                                    f"made it ({maker.keyid}): keyid spoofing")
                else:
                    problems.append(f"signature {i}: keyid {one_line(s.keyid, 80)} is not a trusted key")
                continue
            candidates = [k]
        else:
            hinted = by_id.get(s.keyid) if s.keyid else None
            candidates = ([hinted] if hinted else []) + [c for c in keys if c is not hinted]
        maker = next((c for c in candidates if c.verify(s.sig, message)), None)
        if maker is None:
            problems.append(f"signature {i}: does not verify with "
                            + (f"key {candidates[0].keyid}" if len(candidates) == 1 else
                               f"any of {len(candidates)} trusted keys"))
            continue
        accepted.setdefault(maker.der, maker.keyid)
        if len(accepted) >= threshold:
            break
    if len(accepted) < threshold:
        detail = "; ".join(problems) or "no signature verified"
        raise VerificationFailed(f"DSSE envelope: {len(accepted)} of the required {threshold} trusted "
                                 f"key(s) signed it ({detail})")
    return Verified(payload=env.payload, payload_type=env.payload_type, keyids=tuple(accepted.values()))
