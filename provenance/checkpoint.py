"""C2SP checkpoints as Ed25519-signed notes.

A checkpoint (C2SP ``tlog-checkpoint``) is the note text::

    <origin>\\n
    <tree size, ASCII decimal, no leading zeros>\\n
    <base64 root hash>\\n
    [<extension line>\\n ...]

and a signed note (C2SP ``signed-note``) appends a blank line and one line per
signature::

    — <key name> <base64(key hash[4] ‖ signature)>\\n

(the dash is U+2014). For Ed25519 (signature type 0x01) the key hash is
``SHA-256(key name ‖ 0x0A ‖ 0x01 ‖ 32-byte public key)[:4]`` and the signature is over
the note text including its final newline. Verifiers ignore signatures by keys they do
not know and need one from a key they trust.

Parsing is strict and canonical (see ``_codec``): any single-byte change to a signed
checkpoint either fails to parse or fails to verify.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from . import _codec
from .errors import ProvenanceError, VerificationFailed, one_line
from .keys import SigningKey, VerifyingKey

__all__ = ["Checkpoint", "NoteSignature", "key_hash", "log_id", "open_note", "parse", "parse_note", "sign",
           "sign_note", "verify"]

_DASH = "\u2014"
_SIG_LINE = re.compile(r"\u2014 (\S+) (\S+)")
_SIZE = re.compile(r"0|[1-9][0-9]*")


def _check_key_name(name: str) -> str:
    if not isinstance(name, str) or not name or any(c.isspace() for c in name) or "+" in name:
        raise ProvenanceError(f"note key name {one_line(name, 60)!r}: must be non-empty, without spaces or '+'")
    return name


def key_hash(name: str, public: VerifyingKey) -> bytes:
    """C2SP signed-note key hash of an Ed25519 key: SHA-256(name ‖ 0x0A ‖ 0x01 ‖ key)[:4]."""
    return log_id(name, public)[:4]


def log_id(name: str, public: VerifyingKey) -> bytes:
    """The full SHA-256(name ‖ 0x0A ‖ 0x01 ‖ key): Sigstore's ``logId`` of an Ed25519 (Rekor v2) log,
    whose first four bytes are the note key hash."""
    if public.kind != "ed25519":
        raise ProvenanceError(f"log key is a {public.kind} key: checkpoints are signed with Ed25519")
    return hashlib.sha256(_check_key_name(name).encode() + b"\n\x01" + public.raw).digest()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The note body: origin, tree size, root hash, optional extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        for line in (self.origin, *self.extensions):
            if not line or "\n" in line or any(ord(c) < 0x20 for c in line):
                raise ProvenanceError(f"checkpoint line {one_line(line, 60)!r}: must be non-empty, one line, no control characters")
        if len(self.root) != 32 or self.size < 0:
            raise ProvenanceError("checkpoint: root must be 32 bytes and size ≥ 0")
        return "".join(f"{line}\n" for line in (self.origin, str(self.size), _codec.b64encode(self.root), *self.extensions))


@dataclass(frozen=True, slots=True)
class NoteSignature:
    name: str
    key_hash: bytes
    signature: bytes


def sign_note(text: str, key: SigningKey, name: str) -> str:
    """Sign any note text (non-empty, newline-terminated) with an Ed25519 key named ``name``."""
    if key.kind != "ed25519":
        raise ProvenanceError("note signing key is a P-256 key, expected Ed25519")
    if not text.endswith("\n") or "\n\n" in text or any(ord(c) < 0x20 and c != "\n" for c in text):
        raise ProvenanceError("note text must end with a newline and contain no blank lines or control characters")
    name = _check_key_name(name)
    sig = key.sign(text.encode("utf-8"))
    return f"{text}\n{_DASH} {name} {_codec.b64encode(key_hash(name, key.public) + sig)}\n"


def sign(cp: Checkpoint, key: SigningKey, name: str | None = None) -> str:
    """The signed note text for ``cp``; ``name`` (the key name) defaults to the origin."""
    return sign_note(cp.body(), key, name or cp.origin)


def parse_note(text: str | bytes) -> tuple[str, tuple[NoteSignature, ...]]:
    """Split a signed note into its text (with final newline) and its signature lines."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise ProvenanceError("signed note: not UTF-8") from None
    if not isinstance(text, str):
        raise ProvenanceError(f"signed note: expected text, got {type(text).__name__}")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise ProvenanceError("signed note: contains control characters")
    if text.count("\n\n") != 1:
        raise ProvenanceError("signed note: expected one blank line between the text and its signatures")
    body, sigs_text = text.split("\n\n")
    if not body:
        raise ProvenanceError("signed note: empty text")
    if not sigs_text.endswith("\n") or not sigs_text.strip():
        raise ProvenanceError("signed note: signature block missing or not newline-terminated")
    sigs = []
    for line in sigs_text[:-1].split("\n"):
        m = _SIG_LINE.fullmatch(line)
        if not m:
            raise ProvenanceError(f"signed note: bad signature line {one_line(line, 80)!r}")
        raw = _codec.b64decode(m.group(2), "signed note signature")
        if len(raw) < 5:
            raise ProvenanceError("signed note: signature too short")
        sigs.append(NoteSignature(m.group(1), raw[:4], raw[4:]))
    return body + "\n", tuple(sigs)


def open_note(text: str | bytes, key: VerifyingKey, name: str) -> str:
    """Verify a signed note carries a valid signature by Ed25519 ``key`` named ``name``;
    return the note text. Signatures by other keys are ignored, as C2SP specifies."""
    body, sigs = parse_note(text)
    kh = key_hash(name, key)
    for s in sigs:
        if s.name == name and s.key_hash == kh:
            if len(s.signature) == 64 and key.verify(s.signature, body.encode("utf-8")):
                return body
            raise VerificationFailed(f"signed note: signature by {name!r} does not verify")
    raise VerificationFailed(f"signed note: no signature by the key {name!r} ({kh.hex()})")


def parse(text: str | bytes) -> tuple[Checkpoint, tuple[NoteSignature, ...], str]:
    """Parse a signed checkpoint: ``(checkpoint, signatures, signed body text)``. No verification."""
    body, sigs = parse_note(text)
    lines = body[:-1].split("\n")
    if len(lines) < 3:
        raise ProvenanceError(f"checkpoint: {len(lines)} body lines, expected origin, size and root hash")
    origin, size_s, root_s, *ext = lines
    if not origin or any(not x for x in ext):
        raise ProvenanceError("checkpoint: empty origin or extension line")
    if not _SIZE.fullmatch(size_s):
        raise ProvenanceError(f"checkpoint: tree size {one_line(size_s, 40)!r} is not a decimal without leading zeros")
    root = _codec.b64decode(root_s, "checkpoint root hash")
    if len(root) != 32:
        raise ProvenanceError(f"checkpoint: root hash is {len(root)} bytes, expected 32")
    return Checkpoint(origin, int(size_s), root, tuple(ext)), sigs, body


def verify(text: str | bytes, key: VerifyingKey, *, name: str | None = None,
           origin: str | None = None) -> Checkpoint:
    """Verify a signed checkpoint against the log's Ed25519 key and return it.

    ``name`` (the note key name) defaults to ``origin``, which defaults to the
    checkpoint's own origin line; pass ``origin`` to pin the log you expect.
    """
    cp, sigs, body = parse(text)
    if origin is not None and cp.origin != origin:
        raise VerificationFailed(f"checkpoint origin {one_line(cp.origin, 60)!r} is not the expected {origin!r}")
    name = name or origin or cp.origin
    kh = key_hash(name, key)
    for s in sigs:
        if s.name == name and s.key_hash == kh:
            if len(s.signature) == 64 and key.verify(s.signature, body.encode("utf-8")):
                return cp
            raise VerificationFailed(f"checkpoint: signature by {name!r} does not verify")
    raise VerificationFailed(f"checkpoint: no signature by the log key {name!r} ({kh.hex()})")
