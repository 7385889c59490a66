"""The SQLite transparency log: proofs, tamper evidence, crashes, concurrent appenders."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import multiprocessing
import os
import signal
import sqlite3
from pathlib import Path
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from provenance import checkpoint as cp, dsse
from provenance.errors import ProvenanceError, VerificationFailed
from provenance.intoto import Statement
from provenance.keys import SigningKey
from provenance.ledger import Ledger, verify_inclusion_document
from provenance.merkle import leaf_hash, root_from_leaves, verify_consistency

ORIGIN = "ledger.test/log"
CLIENT = SigningKey.generate("p256")
LOG = SigningKey.generate("ed25519")


@functools.lru_cache(maxsize=None)
def envelope(i: int, key: SigningKey = CLIENT) -> dsse.Envelope:
    """The i-th signed chunk statement (cached: ECDSA signatures are randomized)."""
    st_ = Statement.build({f"round-{i}/chunk-0": hashlib.sha256(b"chunk %d" % i).hexdigest()},
                          "https://redteam.test/chunk/v1", {"round": i})
    return dsse.sign(st_.to_json(), key)


@pytest.fixture
def ledger(tmp_path):
    led = Ledger.init(tmp_path / "log.db", LOG, ORIGIN)
    led.append_many([(envelope(i), CLIENT.public) for i in range(12)])
    for i in range(12, 21):
        led.append(envelope(i), CLIENT.public)
    yield led
    led.close()


def bodies(led: Ledger) -> list[bytes]:
    return [led.entry(i)["body"] for i in range(led.size)]


def test_leaf_is_the_rekor_dsse_body(ledger):
    from rekor_types import Dsse

    env = envelope(3)
    body = ledger.entry(3)["body"]
    doc = json.loads(body)
    assert doc == {"apiVersion": "0.0.1", "kind": "dsse", "spec": {
        "envelopeHash": {"algorithm": "sha256", "value": hashlib.sha256(env.to_json()).hexdigest()},
        "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(env.payload).hexdigest()},
        "signatures": [{"signature": base64.b64encode(env.signatures[0].sig).decode(),
                        "verifier": base64.b64encode(CLIENT.public.pem).decode()}]}}
    assert body == json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    Dsse.model_validate_json(body)  # sigstore's Rekor schema accepts it


def test_roots_proofs_and_checkpoints(ledger):
    leaves = [leaf_hash(b) for b in bodies(ledger)]
    assert ledger.size == 21
    for n in (1, 12, 21):
        assert ledger.root(n) == root_from_leaves(leaves[:n])
    note = ledger.checkpoint()
    c = cp.verify(note, LOG.public, origin=ORIGIN)
    assert (c.size, c.root) == (21, root_from_leaves(leaves))
    for i in range(21):
        doc = ledger.prove(i).to_dict()
        verify_inclusion_document(doc, ledger.entry(i)["body"], LOG.public, ORIGIN)
    old = ledger.prove(4, tree_size=12)
    assert old.checkpoint == ledger.checkpoint(12) and old.root_hash == root_from_leaves(leaves[:12])
    for m in range(0, 22):
        c = ledger.consistency(m)
        verify_consistency(m, 21, root_from_leaves(leaves[:m]), root_from_leaves(leaves), c.hashes)
    # one subtree row per complete perfect subtree: sum over levels of floor(n / 2^level)
    rows = ledger._conn.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
    assert rows == sum(21 >> lv for lv in range(6))


def test_proof_for_another_tree_size_is_refused(ledger):
    with pytest.raises(ProvenanceError, match="tree size 30: the log has 21 entries"):
        ledger.prove(0, tree_size=30)
    with pytest.raises(ProvenanceError, match="log index 21: not in a tree of size 21"):
        ledger.prove(21)
    doc = ledger.prove(5).to_dict()
    doc["treeSize"] = 20  # leaf 5's audit path is the same shape in trees of 17..32
    with pytest.raises(VerificationFailed, match="tree size 20, its checkpoint for size 21"):
        verify_inclusion_document(doc, ledger.entry(5)["body"], LOG.public, ORIGIN)
    doc = ledger.prove(5, tree_size=12).to_dict()
    doc["checkpoint"] = ledger.checkpoint()
    with pytest.raises(VerificationFailed):
        verify_inclusion_document(doc, ledger.entry(5)["body"], LOG.public, ORIGIN)


def test_appends_are_checked(ledger):
    with pytest.raises(ProvenanceError, match="already in the log at index 3"):
        ledger.append(envelope(3), CLIENT.public)
    with pytest.raises(VerificationFailed):
        ledger.append(envelope(99, SigningKey.generate()), CLIENT.public)
    with pytest.raises(ProvenanceError, match="wrong payloadType"):
        ledger.append(dsse.sign(b"x", CLIENT, payload_type="text/plain"), CLIENT.public)
    with pytest.raises(ProvenanceError, match="truncated JSON"):
        ledger.append(envelope(99).to_json()[:40], CLIENT.public)
    assert ledger.size == 21
    reader = Ledger.open(ledger.path)
    with pytest.raises(ProvenanceError, match="needs the log's private key"):
        reader.append(envelope(99), CLIENT.public)
    with pytest.raises(ProvenanceError, match="is not this ledger's"):
        Ledger.open(ledger.path, SigningKey.generate("ed25519"))
    reader.close()


def test_an_untampered_ledger_verifies(ledger):
    r = ledger.verify()
    assert r.ok and r.size == 21 and r.checkpoints == 11, str(r)  # init + 1 batch + 9 appends


def _raw(ledger):
    return sqlite3.connect(ledger.path, isolation_level=None)


@pytest.mark.parametrize("tamper,expect", [
    ("UPDATE entries SET body = CAST(replace(body, 'sha256', 'sha512') AS BLOB) WHERE idx = 4",
     "entry 4: stored leaf hash is not the hash of its body"),
    ("UPDATE entries SET body = replace(body, 'sha256', 'sha512') WHERE idx = 4", "entry 4"),
    ("UPDATE entries SET envelope = (SELECT envelope FROM entries WHERE idx = 6) WHERE idx = 5",
     "entry 5: body does not describe its stored envelope"),
    ("DELETE FROM entries WHERE idx = 20", "only 20 entries are stored"),
    ("DELETE FROM entries WHERE idx = 7", "entries 7..7 are missing"),
    ("UPDATE nodes SET hash = zeroblob(32) WHERE level = 2 AND idx = 1", "stored subtree hash"),
    ("UPDATE checkpoints SET note = replace(note, '21', '22') WHERE size = 21", "checkpoint #"),
    # issue 9 §5: the integration time is covered by the entry's signed entry timestamp
    ("UPDATE entries SET integrated_time = integrated_time - 86400 WHERE idx = 9",
     "entry 9: its signed entry timestamp does not verify for integrated time"),
    ("UPDATE entries SET integrated_time = 'yesterday' WHERE idx = 9",
     "entry 9: its signed entry timestamp does not verify for integrated time 'yesterday'"),
    ("UPDATE entries SET promise = (SELECT promise FROM entries WHERE idx = 3) WHERE idx = 9",
     "entry 9: its signed entry timestamp does not verify"),
    ("UPDATE entries SET promise = zeroblob(64) WHERE idx = 0", "entry 0: its signed entry timestamp"),
])
def test_tampering_is_reported(ledger, tamper, expect):
    with _raw(ledger) as raw:
        raw.execute(tamper)
    r = ledger.verify()
    assert not r.ok and any(expect in p for p in r.problems), str(r)


def test_signed_entry_timestamp_is_the_rekor_promise_over_the_stored_time(ledger):
    # Rekor v1's signed entry timestamp: the log key's signature over the RFC 8785 JSON of
    # {body (base64), integratedTime, logID (hex), logIndex}; for ASCII keys and values that is
    # compact JSON with sorted keys. Built here by hand, it must verify for every stored entry,
    # and the same bytes with the time one second later must not.
    log_id = hashlib.sha256(ORIGIN.encode() + b"\n\x01" + LOG.public.raw).digest()  # the Ed25519 log's id
    with _raw(ledger) as raw:
        rows = raw.execute("SELECT idx, body, integrated_time, promise FROM entries ORDER BY idx").fetchall()
    assert len(rows) == 21
    for idx, body, t, promise in rows:
        def payload(time_):
            return json.dumps({"body": base64.b64encode(body).decode(), "integratedTime": time_,
                               "logID": log_id.hex(), "logIndex": idx}, sort_keys=True, separators=(",", ":")).encode()
        assert LOG.public.verify(promise, payload(t))
        assert not LOG.public.verify(promise, payload(t + 1))
    with _raw(ledger) as raw:
        raw.execute("UPDATE entries SET integrated_time = integrated_time + 1 WHERE idx = 20")
    r = ledger.verify()
    assert not r.ok and [p for p in r.problems if "signed entry timestamp" in p] == [
        f"entry 20: its signed entry timestamp does not verify for integrated time {rows[20][2] + 1} "
        "(integrated_time or the promise modified?)"], str(r)


def test_swapped_entries_are_reported(ledger):
    with _raw(ledger) as raw:
        a, b = (raw.execute("SELECT leaf, body, envelope FROM entries WHERE idx = ?", (i,)).fetchone() for i in (2, 3))
        raw.execute("UPDATE entries SET leaf = zeroblob(32) WHERE idx = 2")
        raw.execute("UPDATE entries SET leaf = ?, body = ?, envelope = ? WHERE idx = 3", a)
        raw.execute("UPDATE entries SET leaf = ?, body = ?, envelope = ? WHERE idx = 2", b)
    r = ledger.verify()
    assert not r.ok and any("reordered" in p for p in r.problems)


def test_inserted_entry_without_checkpoint_is_reported(ledger):
    with _raw(ledger) as raw:
        row = raw.execute("SELECT body, envelope, integrated_time, promise FROM entries WHERE idx = 0").fetchone()
        body = row[0].replace(b"sha256", b"sha384")
        raw.execute("INSERT INTO entries VALUES (21, ?, ?, ?, ?, ?)", (leaf_hash(body), body, *row[1:]))
    r = ledger.verify()
    assert not r.ok and any("not covered by any signed checkpoint" in p for p in r.problems)


def test_forked_checkpoint_is_reported(ledger):
    # The log key signs a second, different tree of the same size (equivocation).
    forged = cp.sign(cp.Checkpoint(ORIGIN, 21, hashlib.sha256(b"fork").digest()), LOG)
    with _raw(ledger) as raw:
        raw.execute("INSERT INTO checkpoints(size, root, note) VALUES (21, ?, ?)",
                    (hashlib.sha256(b"fork").digest(), forged))
    r = ledger.verify()
    assert not r.ok and any("fork" in p for p in r.problems)
    # and a witness that saw the fork makes an otherwise clean ledger fail
    with _raw(ledger) as raw:
        raw.execute("DELETE FROM checkpoints WHERE note = ?", (forged,))
    assert ledger.verify().ok
    r = ledger.verify(witnesses=[forged])
    assert not r.ok and any("witness checkpoint 0" in p and "fork" in p for p in r.problems)


def test_swapped_log_key_is_reported(ledger):
    other = SigningKey.generate("ed25519")
    with _raw(ledger) as raw:
        raw.execute("UPDATE meta SET value = ? WHERE key = 'log_public_key'", (other.public.der,))
    reopened = Ledger.open(ledger.path)
    r = reopened.verify(log_key=LOG.public)
    assert not r.ok and any("stored in the file is not the trusted" in p for p in r.problems)
    reopened.close()


def test_a_failed_append_rolls_back(ledger, monkeypatch):
    before = ledger.checkpoint()

    def boom(*a, **k):
        raise RuntimeError("crash while signing")

    monkeypatch.setattr(ledger, "_sign_checkpoint", boom)
    with pytest.raises(RuntimeError):
        ledger.append(envelope(50), CLIENT.public)
    monkeypatch.undo()
    assert ledger.size == 21 and ledger.checkpoint() == before and ledger.verify().ok
    ledger.append(envelope(50), CLIENT.public)
    assert ledger.verify().ok


KILL_SCRIPT = r"""
import sys
from provenance.keys import SigningKey
from provenance.ledger import Ledger
sys.path.insert(0, {tests!r})
from test_provenance_ledger import envelope
log = SigningKey.load({log!r})
client = SigningKey.load({client!r})
with Ledger.open({db!r}, log) as led:
    i = 1000
    while True:
        led.append(envelope(i, client), client.public)
        print(i, flush=True)
        i += 1
"""


def _keyfiles(tmp_path):
    CLIENT.save(tmp_path / "client.pem", overwrite=True)
    LOG.save(tmp_path / "log.pem", overwrite=True)
    return str(tmp_path / "client.pem"), str(tmp_path / "log.pem")


def test_a_process_killed_mid_append_leaves_a_ledger_that_verifies(ledger, tmp_path):
    client, log = _keyfiles(tmp_path)
    code = KILL_SCRIPT.format(tests=os.path.dirname(__file__), log=log, client=client, db=str(ledger.path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 15 and time.monotonic() < deadline:  # let it get well into its loop
        if proc.stdout.readline():
            seen += 1
        elif proc.poll() is not None:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert seen >= 15, proc.stderr.read().decode()[-2000:]
    r = Ledger.open(ledger.path).verify()
    assert r.ok and r.size >= 21 + seen, str(r)


def _append_worker(args):
    db, log, client, start, count = args
    led = Ledger.open(db, SigningKey.load(log))
    key = SigningKey.load(client)
    out = [led.append(envelope(i, key), key.public)[0] for i in range(start, start + count)]
    led.close()
    return out


def test_concurrent_appenders_never_corrupt_the_ledger(ledger, tmp_path):
    client, log = _keyfiles(tmp_path)
    jobs = [(str(ledger.path), log, client, 2000 + 100 * p, 8) for p in range(3)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        results = pool.map(_append_worker, jobs)
    indices = sorted(i for r in results for i in r)
    assert indices == list(range(21, 21 + 24))
    r = Ledger.open(ledger.path).verify()
    assert r.ok and r.size == 45, str(r)


def test_export(ledger, tmp_path):
    from sigstore.models import TrustedRoot

    paths = ledger.export(tmp_path / "out")
    lines = paths["entries"].read_text().splitlines()
    assert len(lines) == 21
    first = json.loads(lines[0])
    assert base64.b64decode(first["canonicalizedBody"]) == ledger.entry(0)["body"]
    assert paths["checkpoint"].read_text() == ledger.checkpoint()
    TrustedRoot.from_file(str(paths["trusted_root"]))


@pytest.fixture(scope="module")
def small_ledger(tmp_path_factory):
    led = Ledger.init(tmp_path_factory.mktemp("m") / "log.db", LOG, ORIGIN)
    led.append_many([(envelope(i), CLIENT.public) for i in range(13)])
    doc = json.dumps(led.prove(6).to_dict(), sort_keys=True, separators=(",", ":")).encode()
    return led, doc, led.entry(6)["body"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_single_byte_mutation_of_a_proof_document_is_rejected(small_ledger, data):
    led, doc, body = small_ledger
    verify_inclusion_document(doc, body, LOG.public, ORIGIN)
    i = data.draw(st.integers(0, len(doc) - 1))
    b = data.draw(st.integers(0, 255).filter(lambda v: v != doc[i]))
    with pytest.raises(ProvenanceError):
        verify_inclusion_document(doc[:i] + bytes([b]) + doc[i + 1:], body, LOG.public, ORIGIN)


def test_proofs_read_only_log_n_subtrees_through_the_primary_key(ledger, monkeypatch):
    """Structural O(log n): a proof asks for O(log n) stored subtrees, each found by an
    index search (a regression to a table scan would show in the query plan)."""
    asked = []
    real = ledger._lookup
    monkeypatch.setattr(ledger, "_lookup", lambda keys: asked.append(len(keys)) or real(keys))
    for i in range(21):
        ledger.prove(i)
    ledger.consistency(7)
    assert max(asked) <= 2 * (21).bit_length() + 2
    sql = "SELECT level, idx, hash FROM nodes WHERE (level=? AND idx=?) OR (level=? AND idx=?)"
    plan = " ".join(str(r) for r in ledger._conn.execute("EXPLAIN QUERY PLAN " + sql, (0, 1, 1, 0)))
    assert "USING PRIMARY KEY" in plan and "SCAN nodes" not in plan


def test_export_of_a_damaged_ledger_is_refused_not_shortened(ledger, tmp_path):
    """issue 22 §5: a damaged page must not export as a shorter, valid-looking log."""
    path = ledger.path
    ledger.close()
    data = bytearray(path.read_bytes())
    page = 4096
    for start in range(2 * page, len(data), page):  # overwrite every page after the schema's
        data[start + 100:start + page] = b"\xab" * (page - 100)
    path.write_bytes(bytes(data))
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    with pytest.raises(ProvenanceError, match="damaged ledger|not a ledger|cannot open"):
        with Ledger.open(path) as led:
            led.export(tmp_path / "exp")
    assert not (tmp_path / "exp" / "entries.jsonl").exists()
