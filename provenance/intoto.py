"""in-toto Statement v1: build, serialize, parse strictly.

in-toto attestation framework, ``spec/v1/statement.md`` (v1.1)::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "<NAME>", "digest": {"<ALG>": "<lowercase hex>"}}],
     "predicateType": "<TypeURI>",
     "predicate": {...}}

A statement is serialized once, as compact JSON with sorted keys, and those bytes are
what the DSSE envelope signs (no canonicalization is needed on the verifying side).

Digest sets are an attack surface: the spec lets consumers accept a match on *any*
algorithm they know, so an attacker may offer only a weak one (``md5``). The parser
therefore requires ``required_digest`` (default ``"sha256"``, the spec's RECOMMENDED
algorithm) in every subject, and :func:`digest_matches` compares that algorithm only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import _codec
from .errors import ProvenanceError, VerificationFailed, one_line

__all__ = ["STATEMENT_TYPE", "Statement", "Subject", "digest_matches", "statement_json"]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"

_HEX = re.compile(r"[0-9a-f]+")
_SUBJECT_KEYS = frozenset(("digest", "name", "uri", "downloadLocation", "mediaType", "annotations"))
#: Hex lengths of the DigestSet algorithms whose length we know (others: any even length).
_HEX_LEN = {"sha256": 64, "sha224": 56, "sha384": 96, "sha512": 128, "sha3_256": 64, "sha3_384": 96,
            "sha3_512": 128, "sha1": 40, "md5": 32, "gitBlob": 40, "gitCommit": 40, "gitTree": 40}


@dataclass(frozen=True, slots=True)
class Subject:
    """A ResourceDescriptor used as a subject: a name and a DigestSet."""

    name: str
    digest: Mapping[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "digest": dict(self.digest)}


@dataclass(frozen=True, slots=True)
class Statement:
    """An in-toto Statement v1."""

    subjects: tuple[Subject, ...]
    predicate_type: str
    predicate: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "_type": STATEMENT_TYPE,
            "subject": [s.to_dict() for s in self.subjects],
            "predicateType": self.predicate_type,
            "predicate": dict(self.predicate),
        }

    def to_json(self) -> bytes:
        """The bytes to sign: compact JSON, sorted keys."""
        return _codec.dumps(self.to_dict())

    @classmethod
    def build(cls, subjects: Mapping[str, str] | list[tuple[str, str]], predicate_type: str,
              predicate: Mapping[str, Any] | None = None) -> "Statement":
        """A statement from ``{name: sha256 hex}`` (or a list of pairs, order kept)."""
        pairs = list(subjects.items()) if isinstance(subjects, Mapping) else list(subjects)
        if not pairs:
            raise ProvenanceError("statement: needs at least one subject")
        for n, d in pairs:
            if not isinstance(n, str) or not isinstance(d, str) or len(d) != 64 or not _HEX.fullmatch(d):
                raise ProvenanceError(f"subject {one_line(n, 60)!r}: sha256 {one_line(d, 80)!s} must be 64 lowercase hex")
        if not isinstance(predicate_type, str) or not predicate_type:
            raise ProvenanceError(f"predicate_type = {predicate_type!r}: expected a non-empty type URI")
        if predicate is not None and not isinstance(predicate, Mapping):
            raise ProvenanceError(f"predicate of type {type(predicate).__name__}: expected a mapping")
        return cls(subjects=tuple(Subject(name=n, digest={"sha256": d}) for n, d in pairs),
                   predicate_type=predicate_type, predicate=dict(predicate or {}))

    @classmethod
    def from_dict(cls, d: object, what: str = "in-toto statement", *,
                  required_digest: str = "sha256") -> "Statement":
        d = _codec.obj(d, what, ("_type", "subject", "predicateType"), ("predicate",))
        if d["_type"] != STATEMENT_TYPE:
            raise ProvenanceError(f"{what}._type = {one_line(d['_type'], 80)!r}: expected {STATEMENT_TYPE!r}")
        subs = d["subject"]
        if not isinstance(subs, list) or not subs:
            raise ProvenanceError(f"{what}.subject: expected a non-empty list")
        out = []
        for i, s in enumerate(subs):
            if type(s) is not dict or not s.keys() <= _SUBJECT_KEYS or "digest" not in s:
                _codec.obj(s, f"{what}.subject[{i}]", ("digest",), tuple(_SUBJECT_KEYS))
            name = s.get("name", "")
            if type(name) is not str:
                _codec.string(name, f"{what}.subject[{i}].name", empty=True)
            dig = s["digest"]
            if type(dig) is not dict or not dig:
                raise ProvenanceError(f"{what}.subject[{i}].digest: expected a non-empty object of algorithm → hex")
            for alg, val in dig.items():
                if type(val) is not str or len(val) != _HEX_LEN.get(alg, len(val)) or len(val) % 2 or \
                        not _HEX.fullmatch(val):
                    raise ProvenanceError(f"{what}.subject[{i}].digest.{one_line(alg, 20)} = {one_line(val, 80)!s}: "
                                          f"expected lowercase hex" + (f" of length {_HEX_LEN[alg]}" if alg in _HEX_LEN else ""))
            if required_digest not in dig:
                raise ProvenanceError(f"{what}.subject[{i}].digest has {', '.join(sorted(dig))}: {required_digest} "
                                      f"is required (digest-algorithm downgrade?)")
            out.append(Subject(name=name, digest=dict(dig)))
        ptype = d["predicateType"]
        if type(ptype) is not str or not ptype:
            _codec.string(ptype, f"{what}.predicateType")
        pred = d.get("predicate", {})
        if not isinstance(pred, dict):
            raise ProvenanceError(f"{what}.predicate: expected a JSON object, got {type(pred).__name__}")
        return cls(subjects=tuple(out), predicate_type=ptype, predicate=pred)

    @classmethod
    def from_json(cls, data: bytes | str, what: str = "in-toto statement", *,
                  required_digest: str = "sha256") -> "Statement":
        return cls.from_dict(_codec.loads(data, what), what, required_digest=required_digest)

    def subject(self, name: str) -> Subject:
        for s in self.subjects:
            if s.name == name:
                return s
        raise VerificationFailed(f"statement has no subject named {one_line(name, 80)!r}")


def statement_json(name: str, sha256_hex: str, predicate_type: str, predicate_json: bytes) -> bytes:
    """Fast path for the hot loop (one statement per chunk): the exact bytes
    ``Statement.build({name: sha256_hex}, predicate_type, predicate).to_json()`` produces,
    given ``predicate_json = _codec.dumps(predicate)`` (which callers may cache)."""
    if len(sha256_hex) != 64 or not _HEX.fullmatch(sha256_hex):
        raise ProvenanceError(f"subject {one_line(name, 60)!r}: sha256 {one_line(sha256_hex, 80)!s} must be 64 lowercase hex")
    return b"".join((b'{"_type":"https://in-toto.io/Statement/v1","predicate":', predicate_json,
                     b',"predicateType":', json.dumps(predicate_type).encode(),
                     b',"subject":[{"digest":{"sha256":"', sha256_hex.encode(), b'"},"name":',
                     json.dumps(name).encode(), b"}]}"))


def digest_matches(subject: Subject, sha256_hex: str, *, algorithm: str = "sha256") -> bool:
    """True iff ``subject`` carries ``algorithm`` and it equals ``sha256_hex``.

    Deliberately not "any algorithm matches": a subject offering only a weak or
    unknown algorithm does not match.
    """
    return subject.digest.get(algorithm) == sha256_hex
