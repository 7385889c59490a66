"""Signing keys: ECDSA P-256 for clients and data, Ed25519 for the log.

Clients sign dataset manifests and update chunks with ECDSA over NIST P-256 with
SHA-256 (the curve model-signing and Sigstore's DSSE verification accept; signatures
are DER encoded, as securesystemslib, model-signing and sigstore expect). The
transparency log signs its checkpoints with Ed25519, the C2SP signed-note key type
0x01. Everything goes through ``cryptography``.

Key ids are always *derived from the public key*: the securesystemslib default key id,
i.e. the lowercase hex SHA-256 of the OLPC canonical JSON of
``{"keytype", "scheme", "keyval": {"public"}}`` (securesystemslib
``signer._utils.compute_default_keyid``), with the public value a PEM
SubjectPublicKeyInfo for ECDSA and the raw 32 bytes in hex for Ed25519. A ``keyid`` read
from an envelope is a hint and is only ever compared with this derived value.

Private keys are written as PKCS#8 PEM, optionally encrypted with a passphrase, to a
file created with mode 0600 (the mode is set by ``open(2)``, so the key is never
readable by others, not even briefly).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal, Union

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from .errors import ProvenanceError, one_line

__all__ = [
    "KeyKind",
    "SigningKey",
    "VerifyingKey",
    "canonical_json",
    "sslib_key_dict",
    "sslib_keyid",
]

KeyKind = Literal["p256", "ed25519"]
KINDS: tuple[str, ...] = ("p256", "ed25519")
_NAMES = {"p256": "a P-256", "ed25519": "an Ed25519"}
PrivateKey = Union[ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey]
PublicKey = Union[ec.EllipticCurvePublicKey, ed25519.Ed25519PublicKey]
Passphrase = Union[str, bytes, None]

_ECDSA = ec.ECDSA(hashes.SHA256())


# --------------------------------------------------------------------------- canonical JSON
def _canon_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _canon(obj: object, out: list[str]) -> None:
    if isinstance(obj, str):
        out.append(_canon_str(obj))
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif obj is None:
        out.append("null")
    elif isinstance(obj, int):
        out.append(str(obj))
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for i, item in enumerate(obj):
            if i:
                out.append(",")
            _canon(item, out)
        out.append("]")
    elif isinstance(obj, dict):
        out.append("{")
        for i, (k, v) in enumerate(sorted(obj.items())):
            if not isinstance(k, str):
                raise ProvenanceError(f"canonical JSON: key {k!r} must be a string")
            if i:
                out.append(",")
            out.append(_canon_str(k))
            out.append(":")
            _canon(v, out)
        out.append("}")
    else:
        raise ProvenanceError(f"canonical JSON: cannot encode {type(obj).__name__} {obj!r} (no floats)")


def canonical_json(obj: object) -> bytes:
    """OLPC canonical JSON as securesystemslib writes it: sorted keys, no whitespace,
    only ``\\`` and ``"`` escaped, integers only. Returned UTF-8 encoded."""
    out: list[str] = []
    _canon(obj, out)
    return "".join(out).encode("utf-8")


# --------------------------------------------------------------------------- public keys
def _kind_of(key: object) -> str:
    if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        if isinstance(key.curve, ec.SECP256R1):
            return "p256"
        raise ProvenanceError(f"ECDSA key on curve {key.curve.name}: expected P-256 (secp256r1) or Ed25519")
    if isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey)):
        return "ed25519"
    raise ProvenanceError(f"key of type {type(key).__name__}: expected ECDSA P-256 or Ed25519")


def _check_kind(kind: str, expected: KeyKind | tuple[str, ...] | None, where: str) -> None:
    allowed = KINDS if expected is None else ((expected,) if isinstance(expected, str) else tuple(expected))
    for k in allowed:
        if k not in KINDS:
            raise ProvenanceError(f"kind = {k!r}: expected one of {', '.join(KINDS)}")
    if kind not in allowed:
        raise ProvenanceError(f"{where}: is {_NAMES[kind]} key, expected {' or '.join(_NAMES[k] for k in allowed)} key")


def sslib_key_dict(public: PublicKey) -> dict[str, object]:
    """The securesystemslib key dict (``keytype``, ``scheme``, ``keyval``) of a public key."""
    kind = _kind_of(public)
    if kind == "ed25519":
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return {"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": raw.hex()}}
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {"keytype": "ecdsa", "scheme": "ecdsa-sha2-nistp256", "keyval": {"public": pem.decode()}}


def sslib_keyid(public: PublicKey) -> str:
    """securesystemslib's default key id: hex SHA-256 of the canonical JSON key dict."""
    return hashlib.sha256(canonical_json(sslib_key_dict(public))).hexdigest()


class VerifyingKey:
    """A public key (P-256 or Ed25519) with its derived identifiers.

    * ``keyid``: securesystemslib default key id (what our DSSE envelopes carry);
    * ``hint``: hex SHA-256 of the PEM SubjectPublicKeyInfo (model-signing's
      ``verificationMaterial.publicKey.hint``);
    * ``der`` / ``pem``: SubjectPublicKeyInfo encodings; ``raw``: Ed25519 32 bytes.
    """

    __slots__ = ("key", "kind", "der", "pem", "keyid", "hint")

    def __init__(self, key: PublicKey) -> None:
        self.key = key
        self.kind = _kind_of(key)
        self.der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        self.pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        self.keyid = sslib_keyid(key)
        self.hint = hashlib.sha256(self.pem).hexdigest()

    @property
    def raw(self) -> bytes:
        if self.kind != "ed25519":
            raise ProvenanceError(f"key {self.keyid}: raw bytes exist only for Ed25519 keys")
        return self.key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def verify(self, signature: bytes, data: bytes) -> bool:
        """True iff ``signature`` (DER ECDSA-SHA256, or raw Ed25519) is valid over ``data``."""
        try:
            if self.kind == "p256":
                self.key.verify(signature, data, _ECDSA)
            else:
                self.key.verify(signature, data)
        except InvalidSignature:
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyingKey) and self.der == other.der

    def __hash__(self) -> int:
        return hash(self.der)

    def __repr__(self) -> str:
        return f"VerifyingKey({self.kind}, keyid={self.keyid[:16]}…)"

    # -- (de)serialization
    @classmethod
    def from_pem(cls, data: bytes, *, kind: KeyKind | tuple[str, ...] | None = None,
                 where: str = "public key") -> "VerifyingKey":
        if b"PRIVATE KEY" in data:
            raise ProvenanceError(f"{where}: is a private key; pass the public key (.pub) instead")
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise ProvenanceError(f"{where}: not a PEM public key ({one_line(str(exc), 80)})") from None
        vk = cls(key)
        _check_kind(vk.kind, kind, where)
        return vk

    @classmethod
    def from_der(cls, data: bytes, *, kind: KeyKind | tuple[str, ...] | None = None,
                 where: str = "public key") -> "VerifyingKey":
        try:
            key = serialization.load_der_public_key(data)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise ProvenanceError(f"{where}: not a DER public key ({one_line(str(exc), 80)})") from None
        vk = cls(key)
        _check_kind(vk.kind, kind, where)
        return vk

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, kind: KeyKind | tuple[str, ...] | None = None) -> "VerifyingKey":
        return cls.from_pem(_read(path), kind=kind, where=str(path))

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.write_bytes(self.pem)
        return p


# --------------------------------------------------------------------------- private keys
class SigningKey:
    """A private key (P-256 or Ed25519) and its :class:`VerifyingKey`."""

    __slots__ = ("key", "public")

    def __init__(self, key: PrivateKey) -> None:
        _kind_of(key)
        self.key = key
        self.public = VerifyingKey(key.public_key())

    @property
    def kind(self) -> str:
        return self.public.kind

    @property
    def keyid(self) -> str:
        return self.public.keyid

    @classmethod
    def generate(cls, kind: KeyKind = "p256") -> "SigningKey":
        """A fresh key: ``"p256"`` (clients, data) or ``"ed25519"`` (the log)."""
        if kind == "p256":
            return cls(ec.generate_private_key(ec.SECP256R1()))
        if kind == "ed25519":
            return cls(ed25519.Ed25519PrivateKey.generate())
        raise ProvenanceError(f"kind = {kind!r}: expected 'p256' or 'ed25519'")

    def sign(self, data: bytes) -> bytes:
        """DER ECDSA-SHA256 signature (P-256) or 64-byte Ed25519 signature over ``data``."""
        if self.public.kind == "p256":
            return self.key.sign(data, _ECDSA)
        return self.key.sign(data)

    def __repr__(self) -> str:
        return f"SigningKey({self.kind}, keyid={self.keyid[:16]}…)"

    # -- (de)serialization
    def to_pem(self, passphrase: Passphrase = None) -> bytes:
        """PKCS#8 PEM, encrypted with the best available scheme when a passphrase is given."""
        pw = _passphrase(passphrase)
        enc = serialization.BestAvailableEncryption(pw) if pw else serialization.NoEncryption()
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)

    def save(self, path: str | os.PathLike[str], *, passphrase: Passphrase = None,
             overwrite: bool = False) -> Path:
        """Write the private key (mode 0600) and return its path.

        Without ``overwrite`` an existing file is an error; with it the key is written
        to a fresh 0600 file beside it and renamed over the old one.
        """
        p = Path(path)
        data = self.to_pem(passphrase)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        target = p if not overwrite else p.with_name(f".{p.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(target, flags, 0o600)
        except FileExistsError:
            raise ProvenanceError(f"{p}: already exists; refusing to overwrite a key (pass overwrite=True)") from None
        except OSError as exc:
            raise ProvenanceError(f"{p}: cannot create key file ({exc.strerror})") from None
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(target)
            raise
        os.close(fd)
        if overwrite:
            os.replace(target, p)
        return p

    @classmethod
    def from_pem(cls, data: bytes, *, passphrase: Passphrase = None,
                 kind: KeyKind | tuple[str, ...] | None = None, where: str = "private key") -> "SigningKey":
        if b"-----BEGIN" not in data:
            raise ProvenanceError(f"{where}: not a PEM private key (no '-----BEGIN' line)")
        if b"PRIVATE KEY" not in data:
            raise ProvenanceError(f"{where}: not a private key (a public key or certificate?)")
        encrypted = b"ENCRYPTED" in data or b"Proc-Type: 4,ENCRYPTED" in data
        pw = _passphrase(passphrase)
        if encrypted and not pw:
            raise ProvenanceError(f"{where}: key is encrypted; a passphrase is required")
        try:
            key = serialization.load_pem_private_key(data, password=pw if encrypted else None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            if encrypted:
                raise ProvenanceError(f"{where}: wrong passphrase (or corrupt encrypted key)") from None
            raise ProvenanceError(f"{where}: cannot parse private key ({one_line(str(exc), 80)})") from None
        if not isinstance(key, (ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey)):
            raise ProvenanceError(f"{where}: key of type {type(key).__name__}: expected ECDSA P-256 or Ed25519")
        sk = cls(key)
        _check_kind(sk.kind, kind, where)
        return sk

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, passphrase: Passphrase = None,
             kind: KeyKind | tuple[str, ...] | None = None) -> "SigningKey":
        return cls.from_pem(_read(path), passphrase=passphrase, kind=kind, where=str(path))


def _passphrase(passphrase: Passphrase) -> bytes | None:
    if passphrase is None:
        return None
    if isinstance(passphrase, str):
        passphrase = passphrase.encode("utf-8")
    if not isinstance(passphrase, bytes):
        raise ProvenanceError(f"passphrase of type {type(passphrase).__name__}: expected str or bytes")
    return passphrase or None


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ProvenanceError(f"{path}: no such key file") from None
    except IsADirectoryError:
        raise ProvenanceError(f"{path}: is a directory, expected a PEM key file") from None
    except OSError as exc:
        raise ProvenanceError(f"{path}: cannot read ({exc.strerror})") from None
