"""Commit-reveal commitments in a transparency ledger (issue 25 §3).

Each commitment a run recorded (``RoundRecord.extra["commitments"]``: client → SHA-256 of
the row it revealed, and its commit time in units of the commit window, which closes at
1.0) becomes an in-toto Statement v1 — subject ``round-<r>/client-<c>`` with that digest,
predicate ``{"round", "client", "commit_time", "window_close"}`` — signed by the peer's key
in a DSSE envelope and appended to an RFC 6962 ledger (:class:`provenance.ledger.Ledger`),
one append transaction per round (commits of a round are logged together when the window
closes; a late commit is logged with its late time). Anyone holding the file checks it
with ``redteam ledger verify FILE`` and can then show that a copy's commitment came after
the window closed: :func:`late_commitments` reads them back from the verified entries.

Keys are derived from the given seed (:func:`redteam.transport.signing.derive_key`): one
Ed25519 key for the log, one P-256 key per peer, the same for the same seed.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

import numpy as np

__all__ = ["PREDICATE_TYPE", "write_commitment_ledger", "read_commitments", "late_commitments", "verified_statements"]

PREDICATE_TYPE = "https://redteam.dev/commitment/v1"


def write_commitment_ledger(path: str | os.PathLike[str], rounds: Iterable[tuple[int, Mapping[Any, Mapping[str, Any]]]],
                            seed: int = 0, origin: str = "redteam.verification/commitments",
                            window_close: float = 1.0) -> int:
    """Log every ``(round, {client: {"digest", "time"}})`` commitment in a new ledger at
    ``path``; returns the number of entries. Records read back from JSON (client keys as
    strings) are accepted."""
    from provenance import dsse
    from provenance.ledger import Ledger

    from ..transport.signing import derive_key

    rng = np.random.default_rng(np.random.SeedSequence([seed, 25]))
    log_key = derive_key(rng, "ed25519")
    peer_keys: dict[int, Any] = {}
    total = 0
    with Ledger.init(path, log_key, origin) as ledger:
        for rnd, commits in rounds:
            items = []
            for c_raw, rec in sorted(commits.items(), key=lambda kv: (float(kv[1]["time"]), int(kv[0]))):
                c = int(c_raw)
                if c not in peer_keys:
                    peer_keys[c] = derive_key(np.random.default_rng(np.random.SeedSequence([seed, 25, c])), "p256")
                predicate = {"round": int(rnd), "client": c, "commit_time": float(rec["time"]),
                             "window_close": window_close}
                statement = {"_type": "https://in-toto.io/Statement/v1",
                             "subject": [{"name": f"round-{int(rnd)}/client-{c}",
                                          "digest": {"sha256": str(rec["digest"])}}],
                             "predicateType": PREDICATE_TYPE, "predicate": predicate}
                env = dsse.sign(json.dumps(statement, sort_keys=True).encode(), peer_keys[c])
                items.append((env, peer_keys[c].public))
            if items:
                total += len(ledger.append_many(items))
    return total


def verified_statements(path: str | os.PathLike[str], predicate_type: str) -> tuple[list[tuple[int, dict]], bytes]:
    """The in-toto statements of ``predicate_type`` in the ledger at ``path``, as (entry index,
    statement) in log order, and the ledger's root hash, once :meth:`provenance.ledger.Ledger.verify`
    passes (raises :class:`provenance.errors.VerificationFailed` otherwise)."""
    from provenance import dsse
    from provenance.errors import VerificationFailed
    from provenance.ledger import Ledger

    out = []
    with Ledger.open(path) as ledger:
        report = ledger.verify()
        if not report.ok:
            raise VerificationFailed(f"{path}: ledger does not verify: {'; '.join(report.problems)}")
        for i in range(ledger.size):
            st = json.loads(dsse.Envelope.from_json(ledger.entry(i)["envelope"]).payload)
            if st.get("predicateType") == predicate_type:
                out.append((i, st))
        root = ledger.root()
    return out, root


def read_commitments(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every commitment in the ledger, in log order, after :meth:`provenance.ledger.Ledger.verify` passes
    (raises :class:`provenance.errors.VerificationFailed` otherwise): round, client,
    commit_time, window_close, digest, index."""
    statements, _ = verified_statements(path, PREDICATE_TYPE)
    return [{**st["predicate"], "digest": st["subject"][0]["digest"]["sha256"], "index": i} for i, st in statements]


def late_commitments(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The verified ledger's commitments made after their round's window closed."""
    return [c for c in read_commitments(path) if c["commit_time"] > c["window_close"]]
