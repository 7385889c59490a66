"""Strict decoding of untrusted bytes: JSON, base64, hex.

Every decoder here is *canonical*: it accepts exactly one spelling of each value, so a
single-byte change to a document either fails to parse or changes the decoded value
(which the signature or hash covering it then catches). In particular:

* JSON must be UTF-8, an object where one is expected, without duplicate keys and
  without NaN/Infinity; unknown keys are rejected by the callers' field checks;
* base64 must re-encode to the very same text (no stray bits in the last character,
  no missing or extra padding), in the standard or the URL-safe alphabet (DSSE says
  verifiers must accept both);
* hex digests must be lowercase.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from typing import Any

from .errors import ProvenanceError, one_line

_HEX64 = re.compile(r"[0-9a-f]{64}")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")
_B64_VALUE = {c: i for i, c in enumerate(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}
_B64_VALUE[ord("=")] = 0


def dumps(obj: object) -> bytes:
    """Compact, key-sorted JSON (UTF-8, ASCII-escaped): the one serialization we sign."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ProvenanceError(f"duplicate JSON key {one_line(k, 40)!r}")
            seen.add(k)
    return out


def _no_constant(name: str) -> None:
    raise ProvenanceError(f"JSON constant {name} is not allowed")


_DECODER = json.JSONDecoder(object_pairs_hook=_no_dupes, parse_constant=_no_constant)


def loads(data: bytes | str, what: str) -> Any:
    """Parse untrusted JSON; any defect is a one-line :class:`ProvenanceError`."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProvenanceError(f"{what}: not UTF-8 (byte {exc.start})") from None
    elif isinstance(data, str):
        text = data
    else:
        raise ProvenanceError(f"{what}: expected bytes or str, got {type(data).__name__}")
    if not text or text.isspace():
        raise ProvenanceError(f"{what}: empty input, expected JSON")
    try:
        return _DECODER.decode(text)
    except ProvenanceError as exc:
        raise ProvenanceError(f"{what}: {exc}") from None
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated")
        kind = "truncated JSON" if truncated else "invalid JSON"
        raise ProvenanceError(f"{what}: {kind} at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise ProvenanceError(f"{what}: invalid JSON ({one_line(str(exc), 80)})") from None


@functools.lru_cache(maxsize=256)
def _keysets(required: tuple[str, ...], optional: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    return frozenset(required), frozenset(required) | frozenset(optional)


def obj(value: Any, what: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check that ``value`` is a JSON object with all ``required`` keys and no keys
    beyond ``required`` and ``optional``."""
    if not isinstance(value, dict):
        raise ProvenanceError(f"{what}: expected a JSON object, got {type(value).__name__}")
    req, allowed = _keysets(tuple(required), tuple(optional))
    keys = value.keys()
    if req <= keys and keys <= allowed:
        return value
    for k in required:
        if k not in value:
            raise ProvenanceError(f"{what}: missing field {k!r}")
    extra = sorted(keys - allowed)
    raise ProvenanceError(f"{what}: unexpected field {one_line(extra[0], 40)!s} "
                          f"(expected {', '.join(sorted(allowed))})")


def string(value: Any, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ProvenanceError(f"{what}: expected a string, got {type(value).__name__}")
    if not empty and not value:
        raise ProvenanceError(f"{what}: must not be empty")
    return value


def integer(value: Any, what: str, *, minimum: int = 0, from_string: bool = False) -> int:
    """A non-negative JSON integer (or, with ``from_string``, its protobuf-JSON decimal string)."""
    if from_string and isinstance(value, str):
        if not re.fullmatch(r"0|[1-9][0-9]{0,19}", value):
            raise ProvenanceError(f"{what} = {one_line(value, 40)!r}: expected a decimal integer")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProvenanceError(f"{what}: expected an integer, got {type(value).__name__}")
    if value < minimum:
        raise ProvenanceError(f"{what} = {value}: must be ≥ {minimum}")
    return value


def b64decode(text: Any, what: str, *, urlsafe: bool = False) -> bytes:
    """Decode canonical base64: padded, standard alphabet; with ``urlsafe`` also the
    URL-safe alphabet and unpadded text (DSSE requires verifiers to accept both; the
    price is that ``+``/``-`` and ``/``/``_`` then spell the same bytes)."""
    if not isinstance(text, str):
        raise ProvenanceError(f"{what}: expected a base64 string, got {type(text).__name__}")
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raise ProvenanceError(f"{what}: bad base64 (non-ASCII character)") from None
    try:  # fast path: padded standard alphabet; strict mode rejects stray characters and
        # bad padding, and the unused low bits of the last character must be zero
        data = binascii.a2b_base64(raw, strict_mode=True)
        if len(raw) % 4 == 0 and (not raw.endswith(b"=") or
                                  not _B64_VALUE[raw[-3 if raw.endswith(b"==") else -2]] & (15 if raw.endswith(b"==") else 3)):
            return data
    except binascii.Error:
        pass
    if not urlsafe:
        try:
            data = binascii.a2b_base64(raw, strict_mode=True)
        except binascii.Error:
            raise ProvenanceError(f"{what}: bad base64") from None
        raise ProvenanceError(f"{what}: bad base64 (non-canonical encoding)")
    urlsafe = b"-" in raw or b"_" in raw
    if urlsafe and (b"+" in raw or b"/" in raw):
        raise ProvenanceError(f"{what}: bad base64 (mixes the standard and URL-safe alphabets)")
    std = raw.translate(_FROM_URLSAFE) if urlsafe else raw
    unpadded = len(std) % 4 != 0
    if unpadded and b"=" in std:
        raise ProvenanceError(f"{what}: bad base64 (length {len(raw)} is not a multiple of 4)")
    try:
        data = base64.b64decode(std + b"=" * (-len(std) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ProvenanceError(f"{what}: bad base64") from None
    again = base64.b64encode(data)
    if unpadded:
        again = again.rstrip(b"=")
    if again != std:
        raise ProvenanceError(f"{what}: bad base64 (non-canonical encoding)")
    return data


def b64encode(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def hex32(text: Any, what: str) -> bytes:
    """A SHA-256 digest as 64 lowercase hex characters."""
    if not isinstance(text, str) or not _HEX64.fullmatch(text):
        raise ProvenanceError(f"{what} = {one_line(text, 80)!s}: expected 64 lowercase hex characters (SHA-256)")
    return bytes.fromhex(text)
