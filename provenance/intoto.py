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

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import _codec
from .errors import ProvenanceError, VerificationFailed, one_line

__all__ = ["STATEMENT_TYPE", "Statement", "Subject", "digest_matches"]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"

_HEX = re.compile(r"[0-9a-f]+")
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
        subs = tuple(Subject(name=n, digest={"sha256": d}) for n, d in pairs)
        st = cls(subjects=subs, predicate_type=predicate_type, predicate=dict(predicate or {}))
        return cls.from_dict(st.to_dict())  # validate through the one parser

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
            w = f"{what}.subject[{i}]"
            s = _codec.obj(s, w, ("digest",), ("name", "uri", "downloadLocation", "mediaType", "annotations"))
            name = _codec.string(s.get("name", ""), f"{w}.name", empty=True)
            dig = s["digest"]
            if not isinstance(dig, dict) or not dig:
                raise ProvenanceError(f"{w}.digest: expected a non-empty object of algorithm → hex")
            for alg, val in dig.items():
                if not isinstance(val, str) or not _HEX.fullmatch(val) or len(val) % 2 or \
                        (alg in _HEX_LEN and len(val) != _HEX_LEN[alg]):
                    raise ProvenanceError(f"{w}.digest.{one_line(alg, 20)} = {one_line(val, 80)!s}: "
                                          f"expected lowercase hex" + (f" of length {_HEX_LEN[alg]}" if alg in _HEX_LEN else ""))
            if required_digest not in dig:
                raise ProvenanceError(f"{w}.digest has {', '.join(sorted(dig))}: {required_digest} is required "
                                      f"(digest-algorithm downgrade?)")
            out.append(Subject(name=name, digest=dict(dig)))
        ptype = _codec.string(d["predicateType"], f"{what}.predicateType")
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


def digest_matches(subject: Subject, sha256_hex: str, *, algorithm: str = "sha256") -> bool:
    """True iff ``subject`` carries ``algorithm`` and it equals ``sha256_hex``.

    Deliberately not "any algorithm matches": a subject offering only a weak or
    unknown algorithm does not match.
    """
    return subject.digest.get(algorithm) == sha256_hex
