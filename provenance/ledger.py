"""An append-only transparency log of signed envelopes, in one SQLite file.

The log is an RFC 6962 / RFC 9162 Merkle tree (see :mod:`provenance.merkle`) whose
leaves are Rekor ``dsse`` 0.0.1 canonicalized bodies; its signed checkpoints are C2SP
notes under the log's Ed25519 key (see :mod:`provenance.checkpoint`).

Storage (SQLite, WAL journal, one file):

* ``entries(idx, leaf, body, envelope, integrated_time, promise)``, ``leaf`` unique
  (an envelope can be logged once);
* ``nodes(level, idx, hash)``: the hash of every *complete perfect subtree*
  (2^level leaves starting at ``idx·2^level``), written as soon as it completes. An
  append adds the leaf and the O(1) amortized parents it completes, reading only the
  O(log n) subtrees on the tree's right edge; a proof reads O(log n) rows
  (:func:`provenance.merkle.range_hashes`). Both stay fast at 10^6 entries.
* ``checkpoints(id, size, root, note)``: every signed checkpoint ever issued (one per
  append transaction).

Every append is one ``BEGIN IMMEDIATE`` transaction (entry, nodes, signed checkpoint),
so a process killed mid-append leaves the previous, consistent state, and concurrent
appenders from several processes serialize on SQLite's write lock.

:meth:`Ledger.verify` trusts nothing stored but the entries' bytes: it recomputes every
leaf and node, checks every stored node, every entry's body against its envelope, every
entry's signed entry timestamp against its stored integrated time and index, and every
signed checkpoint against the recomputed roots; modified, deleted, reordered or inserted
entries, edited integration times and forked checkpoints (two roots for one size) all
fail it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping

from . import _codec, bundle as _bundle, checkpoint as _cp, dsse
from .errors import ProvenanceError, VerificationFailed, one_line
from .keys import SigningKey, VerifyingKey
from .merkle import (
    ConsistencyProof, InclusionProof, consistency_ranges, inclusion_ranges, leaf_hash, node_hash,
    perfect_cover, range_hashes, EMPTY_ROOT,
)

__all__ = ["FORMAT", "Ledger", "VerifyReport", "verify_inclusion_document"]

FORMAT = "redteam-ledger/1"
_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE entries(idx INTEGER PRIMARY KEY, leaf BLOB NOT NULL UNIQUE, body BLOB NOT NULL,
                     envelope BLOB NOT NULL, integrated_time INTEGER NOT NULL, promise BLOB NOT NULL);
CREATE TABLE nodes(level INTEGER NOT NULL, idx INTEGER NOT NULL, hash BLOB NOT NULL,
                   PRIMARY KEY(level, idx)) WITHOUT ROWID;
CREATE TABLE checkpoints(id INTEGER PRIMARY KEY, size INTEGER NOT NULL, root BLOB NOT NULL,
                         note TEXT NOT NULL);
CREATE INDEX checkpoints_by_size ON checkpoints(size);
"""
Synchronous = Literal["FULL", "NORMAL", "OFF"]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Outcome of :meth:`Ledger.verify`: ``ok`` and, if not, each problem in one line."""

    ok: bool
    size: int
    root: bytes
    checkpoints: int
    problems: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        if self.ok:
            return (f"ledger OK: {self.size} entries, root {self.root.hex()[:16]}…, "
                    f"{self.checkpoints} signed checkpoints consistent")
        head = f"ledger FAILED: {len(self.problems)} problem(s)"
        return "\n".join([head, *(f"  - {p}" for p in self.problems[:50])]
                         + ([f"  … {len(self.problems) - 50} more"] if len(self.problems) > 50 else []))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "treeSize": self.size, "rootHash": self.root.hex(),
                "checkpoints": self.checkpoints, "problems": list(self.problems)}


def _connect(path: Path, timeout: float, synchronous: str) -> sqlite3.Connection:
    if synchronous not in ("FULL", "NORMAL", "OFF"):
        raise ProvenanceError(f"synchronous = {synchronous!r}: expected 'FULL', 'NORMAL' or 'OFF'")
    try:
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        conn.execute("PRAGMA trusted_schema=OFF")
        conn.execute(f"PRAGMA synchronous={synchronous}")
    except sqlite3.Error as exc:
        raise ProvenanceError(f"{path}: cannot open ledger ({exc})") from None
    return conn


class Ledger:
    """A transparency log in one SQLite file. Create with :meth:`init`, reopen with :meth:`open`.

    Reading (proofs, checkpoints, verify, export) needs only the file; appending needs
    the log's Ed25519 private key.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, origin: str, log_public: VerifyingKey,
                 log_key: SigningKey | None) -> None:
        self._conn = conn
        self.path = path
        self.origin = origin
        self.log_public = log_public
        self.log_id = _cp.log_id(origin, log_public)
        self._key = log_key

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def init(cls, path: str | os.PathLike[str], log_key: SigningKey, origin: str, *,
             synchronous: Synchronous = "FULL", timeout: float = 30.0) -> "Ledger":
        """Create a new, empty ledger (refuses to overwrite an existing file)."""
        p = Path(path)
        if log_key.kind != "ed25519":
            raise ProvenanceError(f"log key is a {log_key.kind} key: the log signs checkpoints with Ed25519")
        _cp.log_id(origin, log_key.public)  # validates origin as a note key name
        if p.exists():
            raise ProvenanceError(f"{p}: already exists; refusing to overwrite a ledger")
        conn = _connect(p, timeout, synchronous)
        led = cls(conn, p, origin, log_key.public, log_key)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA)  # schema, meta and first checkpoint: one transaction
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [
                ("format", FORMAT), ("origin", origin), ("log_public_key", log_key.public.der)])
            led._sign_checkpoint(0, EMPTY_ROOT)
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            for suffix in ("", "-wal", "-shm"):
                Path(str(p) + suffix).unlink(missing_ok=True)
            raise
        return led

    @classmethod
    def open(cls, path: str | os.PathLike[str], log_key: SigningKey | None = None, *,
             synchronous: Synchronous = "FULL", timeout: float = 30.0) -> "Ledger":
        p = Path(path)
        if not p.is_file():
            raise ProvenanceError(f"{p}: no such ledger file")
        conn = _connect(p, timeout, synchronous)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise ProvenanceError(f"{p}: not a ledger ({exc})") from None
        if meta.get("format") != FORMAT:
            conn.close()
            raise ProvenanceError(f"{p}: not a ledger (format {one_line(meta.get('format'), 40)!r}, expected {FORMAT!r})")
        pub = VerifyingKey.from_der(bytes(meta["log_public_key"]), kind="ed25519", where=f"{p} log key")
        if log_key is not None and log_key.public != pub:
            conn.close()
            raise ProvenanceError(f"{p}: the given log key {log_key.keyid} is not this ledger's "
                                  f"({pub.keyid})")
        return cls(conn, p, str(meta["origin"]), pub, log_key)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    def _check_intact(self) -> None:
        """Raise :class:`ProvenanceError` unless SQLite finds the file's pages intact."""
        try:
            rows = [r[0] for r in self._conn.execute("PRAGMA quick_check(5)").fetchall()]
        except sqlite3.DatabaseError as exc:
            raise ProvenanceError(f"{self.path}: damaged ledger ({exc})") from None
        if rows != ["ok"]:
            raise ProvenanceError(f"{self.path}: damaged ledger (SQLite integrity check: "
                                  f"{one_line('; '.join(map(str, rows)), 160)})")

    @property
    def size(self) -> int:
        return self._conn.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM entries").fetchone()[0]

    def _lookup(self, keys: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        out: dict[tuple[int, int], bytes] = {}
        for i in range(0, len(keys), 200):
            chunk = keys[i:i + 200]
            # an OR of primary-key equalities: SQLite answers each with an index search
            # (a row-value IN (VALUES ...) would scan the whole table)
            sql = "SELECT level, idx, hash FROM nodes WHERE " + " OR ".join("(level=? AND idx=?)" for _ in chunk)
            out.update(((lv, ix), h) for lv, ix, h in
                       self._conn.execute(sql, [v for k in chunk for v in k]))
        return out

    def root(self, size: int | None = None) -> bytes:
        """The Merkle root of the first ``size`` entries (default: all), from stored subtrees."""
        n = self.size if size is None else self._check_size(size)
        return EMPTY_ROOT if n == 0 else range_hashes([(0, n)], self._lookup)[0]

    def _check_size(self, size: int, what: str = "tree size") -> int:
        n = self.size
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= n:
            raise ProvenanceError(f"{what} {size!r}: the log has {n} entries (expected 0 ≤ size ≤ {n})")
        return size

    def checkpoint(self, size: int | None = None) -> str:
        """The latest signed checkpoint (or the latest one issued for ``size``)."""
        if size is None:
            row = self._conn.execute("SELECT note FROM checkpoints ORDER BY id DESC LIMIT 1").fetchone()
        else:
            row = self._conn.execute("SELECT note FROM checkpoints WHERE size = ? ORDER BY id DESC LIMIT 1",
                                     (size,)).fetchone()
        if row is None:
            raise ProvenanceError(f"no signed checkpoint for tree size {size}")
        return row[0]

    def entry(self, index: int) -> dict[str, Any]:
        row = self._conn.execute("SELECT body, envelope, integrated_time, promise FROM entries WHERE idx = ?",
                                 (index,)).fetchone()
        if row is None:
            raise ProvenanceError(f"log index {index!r}: no such entry (the log has {self.size})")
        return {"body": bytes(row[0]), "envelope": bytes(row[1]), "integratedTime": row[2], "promise": bytes(row[3])}

    def prove(self, index: int, tree_size: int | None = None) -> InclusionProof:
        """Inclusion proof of entry ``index`` in the tree of ``tree_size`` (default: latest)."""
        n = self.size if tree_size is None else self._check_size(tree_size)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ProvenanceError(f"log index {index!r}: not in a tree of size {n}")
        hashes = range_hashes(inclusion_ranges(index, n) + [(0, n)], self._lookup)
        root = hashes.pop()
        note = self._note_for(n, root)
        return InclusionProof(index, n, root, tuple(hashes), note)

    def consistency(self, old_size: int, new_size: int | None = None) -> ConsistencyProof:
        """RFC 9162 consistency proof from ``old_size`` to ``new_size`` (default: latest)."""
        new = self.size if new_size is None else self._check_size(new_size, "new tree size")
        if isinstance(old_size, bool) or not isinstance(old_size, int) or not 0 <= old_size <= new:
            raise ProvenanceError(f"old tree size {old_size!r}: expected 0 ≤ old ≤ new = {new}")
        ranges = consistency_ranges(old_size, new)
        ends = [(0, old_size)] if old_size else []
        hashes = range_hashes(ranges + ends + ([(0, new)] if new else []), self._lookup)
        new_root = hashes.pop() if new else EMPTY_ROOT
        old_root = hashes.pop() if old_size else EMPTY_ROOT
        return ConsistencyProof(old_size, new, old_root, new_root, tuple(hashes), self._note_for(new, new_root))

    def _note_for(self, size: int, root: bytes) -> str | None:
        row = self._conn.execute("SELECT root, note FROM checkpoints WHERE size = ? ORDER BY id DESC LIMIT 1",
                                 (size,)).fetchone()
        if row is None:
            return None
        if bytes(row[0]) != root:
            raise VerificationFailed(f"stored subtrees give root {root.hex()[:16]}… for size {size} but the signed "
                                     f"checkpoint says {bytes(row[0]).hex()[:16]}…: the ledger is damaged; run verify")
        return row[1]

    def bundle(self, index: int, tree_size: int | None = None) -> dict[str, Any]:
        """The Sigstore v0.3 bundle of entry ``index``: its envelope plus its log entry."""
        e = self.entry(index)
        proof = self.prove(index, tree_size)
        env = dsse.Envelope.from_json(e["envelope"], "stored envelope")
        body = json.loads(e["body"])
        signer = VerifyingKey.from_pem(_codec.b64decode(body["spec"]["signatures"][0]["verifier"], "verifier"))
        tle = _bundle.tlog_entry(index=index, log_id=self.log_id, integrated_time=e["integratedTime"],
                                 body=e["body"], proof=proof, promise=e["promise"])
        return _bundle.make_bundle(env, signer, [tle])

    def trusted_root(self, *, valid_from: str = "2025-01-01T00:00:00Z") -> dict[str, Any]:
        return _bundle.trusted_root(self.log_public, self.origin, valid_from=valid_from)

    # ------------------------------------------------------------------ appending
    def _require_key(self) -> SigningKey:
        if self._key is None:
            raise ProvenanceError(f"{self.path}: appending needs the log's private key (open the ledger with log_key)")
        return self._key

    def _sign_checkpoint(self, size: int, root: bytes) -> str:
        note = _cp.sign(_cp.Checkpoint(self.origin, size, root), self._require_key())
        self._conn.execute("INSERT INTO checkpoints(size, root, note) VALUES (?, ?, ?)", (size, root, note))
        return note

    def _prepare(self, envelope: dsse.Envelope | bytes | str, verifier: VerifyingKey, check: bool,
                 payload_types: tuple[str, ...]) -> tuple[bytes, bytes]:
        env = envelope if isinstance(envelope, dsse.Envelope) else dsse.Envelope.from_json(envelope)
        if not isinstance(verifier, VerifyingKey):
            raise ProvenanceError(f"verifier of type {type(verifier).__name__}: expected a VerifyingKey")
        if len(env.signatures) != 1:
            raise ProvenanceError(f"DSSE envelope has {len(env.signatures)} signatures; the log takes exactly one")
        if check:
            dsse.verify(env, verifier, payload_type=payload_types, max_signatures=1)
        return _bundle.dsse_body(env, verifier), env.to_json()

    def append(self, envelope: dsse.Envelope | bytes | str, verifier: VerifyingKey, *,
               payload_types: tuple[str, ...] = (dsse.PAYLOAD_TYPE,)) -> tuple[int, dict[str, Any]]:
        """Log a signed envelope (its signature is checked against ``verifier`` first).

        Returns ``(log index, Sigstore bundle)``; the bundle's inclusion proof is against
        the checkpoint signed in the same transaction.
        """
        self._require_key()
        body, env_json = self._prepare(envelope, verifier, True, payload_types)
        with _tx(self._conn):
            [index] = self._insert([(body, env_json)])
            proof = self.prove(index)
            e = self.entry(index)
        tle = _bundle.tlog_entry(index=index, log_id=self.log_id, integrated_time=e["integratedTime"], body=body,
                                 proof=proof, promise=e["promise"])
        return index, _bundle.make_bundle(dsse.Envelope.from_json(env_json), verifier, [tle])

    def append_many(self, items: Iterable[tuple[dsse.Envelope | bytes | str, VerifyingKey]], *,
                    check_signatures: bool = True,
                    payload_types: tuple[str, ...] = (dsse.PAYLOAD_TYPE,)) -> list[int]:
        """Log many envelopes in one transaction with one checkpoint (bulk import).

        ``check_signatures=False`` skips DSSE verification: only for envelopes the
        caller has just verified or produced itself.
        """
        self._require_key()
        rows = [self._prepare(env, vk, check_signatures, payload_types) for env, vk in items]
        with _tx(self._conn):
            return self._insert(rows)

    def _insert(self, rows: list[tuple[bytes, bytes]]) -> list[int]:
        """Inside a write transaction: add entries, complete subtrees, sign a checkpoint."""
        key = self._require_key()
        n = self.size
        cover = perfect_cover(0, n) if n else []
        got = self._lookup(cover) if cover else {}
        peaks = [(lv, ix, got[(lv, ix)]) for lv, ix in cover]
        now = int(time.time())
        entries, nodes = [], []
        for i, (body, env_json) in enumerate(rows):
            idx = n + i
            leaf = leaf_hash(body)
            entries.append((idx, leaf, body, env_json, now,
                            _bundle.sign_promise(key, body, now, self.log_id, idx)))
            h, lv, ix = leaf, 0, idx
            nodes.append((0, idx, leaf))
            while ix & 1:
                plv, pix, ph = peaks.pop()
                h, lv, ix = node_hash(ph, h), lv + 1, ix >> 1
                nodes.append((lv, ix, h))
            peaks.append((lv, ix, h))
        try:
            self._conn.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?)", entries)
        except sqlite3.IntegrityError:
            for _, leaf, *_ in entries:
                row = self._conn.execute("SELECT idx FROM entries WHERE leaf = ?", (leaf,)).fetchone()
                if row is not None:
                    raise ProvenanceError(f"envelope is already in the log at index {row[0]}") from None
            raise ProvenanceError("the same envelope appears twice in this batch") from None
        self._conn.executemany("INSERT INTO nodes VALUES (?, ?, ?)", nodes)
        root = peaks[-1][2]
        for _, _, h in reversed(peaks[:-1]):
            root = node_hash(h, root)
        self._sign_checkpoint(n + len(rows), root)
        return list(range(n, n + len(rows)))

    # ------------------------------------------------------------------ audit
    def verify(self, *, log_key: VerifyingKey | None = None, witnesses: Iterable[str] = (),
               check_signatures: bool = True) -> VerifyReport:
        """Recompute the whole tree from the stored entries and audit everything else.

        ``log_key``: the log key you trust (default: the one stored in the file);
        ``witnesses``: signed checkpoints obtained elsewhere (gossip), checked too;
        ``check_signatures``: also verify each entry's DSSE signature.
        """
        try:
            with _snapshot(self._conn):
                return self._verify(log_key, list(witnesses), check_signatures)
        except sqlite3.Error as exc:
            return VerifyReport(ok=False, size=0, root=EMPTY_ROOT, checkpoints=0,
                                problems=(f"the database is damaged ({exc})",))

    def _verify(self, log_key: VerifyingKey | None, witnesses: list[str], check_signatures: bool) -> VerifyReport:
        problems: list[str] = []
        trusted = log_key or self.log_public
        if trusted != self.log_public:
            problems.append("the log key stored in the file is not the trusted log key")
        leaves: list[bytes] = []
        keys: dict[str, VerifyingKey] = {}
        log_id = _cp.log_id(self.origin, trusted)
        expected = 0
        for idx, leaf, body, env_json, t, promise in self._conn.execute(
                "SELECT idx, leaf, body, envelope, integrated_time, promise FROM entries ORDER BY idx"):
            if idx != expected:
                problems.append(f"entries {expected}..{idx - 1} are missing (deleted?)" if idx > expected
                                else f"entry index {idx} out of order")
                expected = idx
            body, leaf, env_json = _blob(body), _blob(leaf), _blob(env_json)
            lh = leaf_hash(body)
            if lh != leaf:
                problems.append(f"entry {idx}: stored leaf hash is not the hash of its body (modified?)")
            problems.extend(f"entry {idx}: {p}" for p in _check_entry(body, env_json, check_signatures, keys))
            if not _promise_ok(trusted, body, t, log_id, idx, promise):
                problems.append(f"entry {idx}: its signed entry timestamp does not verify for integrated time "
                                f"{one_line(repr(t), 40)} (integrated_time or the promise modified?)")
            leaves.append(lh)
            expected += 1
        n = len(leaves)
        levels = [leaves]
        while len(levels[-1]) > 1:
            prev = levels[-1]
            levels.append([node_hash(prev[j], prev[j + 1]) for j in range(0, len(prev) - 1, 2)])
        bad_nodes = 0
        seen = [0] * len(levels)
        for lv, ix, h in self._conn.execute("SELECT level, idx, hash FROM nodes"):
            if isinstance(lv, int) and isinstance(ix, int) and 0 <= lv < len(levels) and 0 <= ix < len(levels[lv]):
                seen[lv] += 1
                if _blob(h) != levels[lv][ix]:
                    bad_nodes += 1
            else:
                bad_nodes += 1
        missing = sum(len(lvl) for lvl in levels) - sum(seen) if n else 0
        if bad_nodes or missing:
            problems.append(f"{bad_nodes} stored subtree hash(es) differ from the entries, {missing} missing")

        def root_at(size: int) -> bytes:
            if size == 0:
                return EMPTY_ROOT
            cover = perfect_cover(0, size)
            h = levels[cover[-1][0]][cover[-1][1]]
            for lv, ix in reversed(cover[:-1]):
                h = node_hash(levels[lv][ix], h)
            return h

        roots_by_size: dict[int, bytes] = {}
        count, latest = 0, -1
        notes = [(f"checkpoint #{cid}", note, size, _blob(root)) for cid, size, root, note in
                 self._conn.execute("SELECT id, size, root, note FROM checkpoints ORDER BY id")]
        notes += [(f"witness checkpoint {i}", w, None, None) for i, w in enumerate(witnesses)]
        for label, note, size, root in notes:
            count += 1
            try:
                cp = _cp.verify(note, trusted, origin=self.origin)
            except ProvenanceError as exc:
                problems.append(f"{label}: {exc}")
                continue
            if size is not None and (cp.size != size or cp.root != root):
                problems.append(f"{label}: its columns disagree with its signed note")
            if cp.size in roots_by_size and roots_by_size[cp.size] != cp.root:
                problems.append(f"{label}: fork: two signed checkpoints for tree size {cp.size} with different roots")
            roots_by_size.setdefault(cp.size, cp.root)
            if size is not None:
                latest = max(latest, cp.size)
            if cp.size > n:
                problems.append(f"{label}: signed for tree size {cp.size} but only {n} entries are stored (deleted?)")
            elif root_at(cp.size) != cp.root:
                problems.append(f"{label}: root for tree size {cp.size} differs from the recomputed tree "
                                f"(entries modified, reordered or inserted)")
        if latest < n:
            problems.append(f"entries {max(latest, 0)}..{n - 1} are not covered by any signed checkpoint (inserted?)")
        return VerifyReport(ok=not problems, size=n, root=root_at(n), checkpoints=count, problems=tuple(problems))

    def export(self, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
        """Write the log for independent checking: ``entries.jsonl`` (one Rekor-style entry
        per line), ``checkpoints.jsonl``, ``checkpoint`` (latest note), ``trusted_root.json``
        and ``log.pub``. Returns the paths."""
        self._check_intact()  # a damaged file must not export as a shorter, valid-looking log
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        paths = {k: d / v for k, v in (("entries", "entries.jsonl"), ("checkpoints", "checkpoints.jsonl"),
                                        ("checkpoint", "checkpoint"), ("trusted_root", "trusted_root.json"),
                                        ("log_key", "log.pub"))}
        with _snapshot(self._conn):
            with open(paths["entries"], "w", encoding="utf-8") as fh:
                for idx, body, env_json, t, promise in self._conn.execute(
                        "SELECT idx, body, envelope, integrated_time, promise FROM entries ORDER BY idx"):
                    fh.write(json.dumps({
                        "logIndex": idx, "integratedTime": t, "logID": self.log_id.hex(),
                        "canonicalizedBody": _codec.b64encode(bytes(body)),
                        "leafHash": leaf_hash(bytes(body)).hex(),
                        "signedEntryTimestamp": _codec.b64encode(bytes(promise)),
                        "envelope": json.loads(bytes(env_json))}, sort_keys=True) + "\n")
            with open(paths["checkpoints"], "w", encoding="utf-8") as fh:
                for size, root, note in self._conn.execute("SELECT size, root, note FROM checkpoints ORDER BY id"):
                    fh.write(json.dumps({"treeSize": size, "rootHash": bytes(root).hex(), "checkpoint": note},
                                        sort_keys=True) + "\n")
            paths["checkpoint"].write_text(self.checkpoint(), encoding="utf-8")
        paths["trusted_root"].write_text(json.dumps(self.trusted_root(), indent=2) + "\n", encoding="utf-8")
        self.log_public.save(paths["log_key"])
        return paths


def _blob(value: object) -> bytes:
    """A stored value as bytes, whatever type a tampered database holds there."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8", "surrogateescape")


def _promise_ok(key: VerifyingKey, body: bytes, t: object, log_id: bytes, idx: object, promise: object) -> bool:
    """The entry's signed entry timestamp (inclusion promise) covers its body, index and stored time."""
    if isinstance(t, bool) or not isinstance(t, int) or not isinstance(idx, int):
        return False
    return key.verify(_blob(promise), _bundle.promise_payload(body, t, log_id, idx))


def _check_entry(body: bytes, env_json: bytes, check_signature: bool, keys: dict[str, VerifyingKey]) -> list[str]:
    """Consistency of a stored body with its stored envelope (and the envelope's signature)."""
    try:
        env = dsse.Envelope.from_json(env_json, "stored envelope")
        pem_b64 = json.loads(body)["spec"]["signatures"][0]["verifier"]
        verifier = keys.get(pem_b64)
        if verifier is None:
            verifier = keys[pem_b64] = VerifyingKey.from_pem(_codec.b64decode(pem_b64, "verifier"))
        if _bundle.dsse_body(env, verifier) != body:
            return ["body does not describe its stored envelope (payload, signature or envelope hash differ)"]
        if check_signature:
            dsse.verify(env, verifier, payload_type=env.payload_type)
    except (ProvenanceError, KeyError, IndexError, TypeError, ValueError) as exc:
        return [one_line(str(exc), 120)]
    return []


@contextmanager
def _tx(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction taken up front (BEGIN IMMEDIATE): appenders serialize here."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        raise ProvenanceError(f"ledger is busy or read-only ({exc})") from None
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def _snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """A read transaction: one consistent view of the log while exporting."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("COMMIT")


def verify_inclusion_document(doc: Mapping[str, Any] | bytes | str, body: bytes, log_key: VerifyingKey,
                              origin: str) -> InclusionProof:
    """Check a ``ledger prove`` JSON document for ``body``: the RFC 9162 path reaches
    ``rootHash``, and ``rootHash`` / ``treeSize`` are those of the log-signed checkpoint."""
    d = doc if isinstance(doc, Mapping) else _codec.loads(doc, "inclusion proof")
    proof = InclusionProof.from_dict(d)
    if proof.checkpoint is None:
        raise VerificationFailed("inclusion proof carries no signed checkpoint")
    cp = _cp.verify(proof.checkpoint, log_key, origin=origin)
    if cp.size != proof.tree_size:
        raise VerificationFailed(f"inclusion proof is for tree size {proof.tree_size}, "
                                 f"its checkpoint for size {cp.size}")
    if cp.root != proof.root_hash:
        raise VerificationFailed("inclusion proof's rootHash is not the checkpoint's root")
    proof.verify(leaf_hash(body))
    return proof
