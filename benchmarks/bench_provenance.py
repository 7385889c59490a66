"""Provenance speed: chunk signing/verification against raw SHA-256 + P-256, and the ledger.

    python benchmarks/bench_provenance.py                 # full run (10^6-entry ledger)
    python benchmarks/bench_provenance.py --entries 50000 # smaller ledger
    python benchmarks/bench_provenance.py --json out.json

What is measured (all in this one process, so the ratios compare like with like):

* raw rates: SHA-256 over a 4 KiB / 1 MiB chunk; ECDSA P-256 sign / verify of a 32-byte
  digest (``cryptography``, prehashed);
* chunk signing, per chunk: SHA-256 of the chunk, the in-toto statement binding it
  (subject ``round-r/client-c/chunk-i`` + its digest; predicate with round, client,
  nonce, parent digest and codec, serialized once per update) and the DSSE envelope
  (``statement_json`` + ``dsse.sign_json``). Baseline: SHA-256 of the chunk + one raw
  P-256 signature. Ratio = raw time / our time (1.0 = no overhead);
* chunk verification, per chunk: strict envelope parsing, the DSSE signature, then either
  (a) parsing the statement strictly and comparing the subject digest, or (b) comparing
  the signed statement byte-for-byte with the one the receiver expects (it knows round,
  client, nonce and parent, and hashes the chunk it got). Baseline: SHA-256 + raw verify;
* ledger appends per second (one transaction and one signed checkpoint per append), with
  ``synchronous=FULL`` (durable) and ``NORMAL``, and bulk ``append_many`` throughput;
* a ledger of ``--entries`` (10^6) entries built in batched transactions, then the
  time of ``prove`` (inclusion proof + checkpoint), ``consistency``, an append at that
  size, and a proof verification.

Timings take the best of interleaved batches (other processes share the machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives import hashes  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, utils  # noqa: E402

from provenance import _codec, dsse  # noqa: E402
from provenance.intoto import Statement, statement_json  # noqa: E402
from provenance.keys import SigningKey  # noqa: E402
from provenance.ledger import Ledger, verify_inclusion_document  # noqa: E402

PREDICATE_TYPE = "https://redteam.dev/provenance/model-update-chunk/v1"
PREHASHED = ec.ECDSA(utils.Prehashed(hashes.SHA256()))


def best_interleaved(fns: dict[str, callable], batch: int, rounds: int) -> dict[str, float]:
    """Seconds per call of each function: the minimum over ``rounds`` interleaved batches."""
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(batch):
                f()
            best[k] = min(best[k], (time.perf_counter() - t) / batch)
    return best


def bench_chunks(size: int, key: SigningKey, rounds: int) -> dict[str, float]:
    chunk = os.urandom(size)
    pred = _codec.dumps({"round": 3, "client": "client-7", "nonce": os.urandom(16).hex(),
                         "parentModelDigest": hashlib.sha256(b"parent").hexdigest(), "codec": "topk+int8"})
    name = "round-3/client-7/chunk-0"
    digest = hashlib.sha256(chunk).digest()
    raw_sig = key.key.sign(digest, PREHASHED)
    env = dsse.sign_json(statement_json(name, hashlib.sha256(chunk).hexdigest(), PREDICATE_TYPE, pred), key)
    pub, pkey = key.public, key.public.key

    def raw_sign():
        key.key.sign(hashlib.sha256(chunk).digest(), PREHASHED)

    def our_sign():
        dsse.sign_json(statement_json(name, hashlib.sha256(chunk).hexdigest(), PREDICATE_TYPE, pred), key)

    def raw_verify():
        pkey.verify(raw_sig, hashlib.sha256(chunk).digest(), PREHASHED)

    def our_verify_parse():
        st = Statement.from_json(dsse.verify(env, pub).payload)
        if st.subject(name).digest["sha256"] != hashlib.sha256(chunk).hexdigest():
            raise AssertionError

    def our_verify_expected():
        if dsse.verify(env, pub).payload != statement_json(name, hashlib.sha256(chunk).hexdigest(),
                                                           PREDICATE_TYPE, pred):
            raise AssertionError

    batch = 200 if size <= 65536 else 20
    t = best_interleaved({"raw_sign": raw_sign, "sign": our_sign, "raw_verify": raw_verify,
                          "verify_parse": our_verify_parse, "verify_expected": our_verify_expected},
                         batch, rounds)
    sha = best_interleaved({"sha": lambda: hashlib.sha256(chunk).digest()}, batch * 4, rounds)["sha"]
    return {
        "chunk_bytes": size,
        "sha256_MBps": size / sha / 1e6,
        "raw_sign_us": t["raw_sign"] * 1e6, "sign_us": t["sign"] * 1e6,
        "sign_ratio": t["raw_sign"] / t["sign"],
        "raw_verify_us": t["raw_verify"] * 1e6,
        "verify_parse_us": t["verify_parse"] * 1e6, "verify_parse_ratio": t["raw_verify"] / t["verify_parse"],
        "verify_expected_us": t["verify_expected"] * 1e6,
        "verify_expected_ratio": t["raw_verify"] / t["verify_expected"],
    }


def bench_raw(key: SigningKey, rounds: int) -> dict[str, float]:
    d = hashlib.sha256(b"x").digest()
    sig = key.key.sign(d, PREHASHED)
    t = best_interleaved({"sign": lambda: key.key.sign(d, PREHASHED),
                          "verify": lambda: key.public.key.verify(sig, d, PREHASHED)}, 200, rounds)
    return {"p256_sign_per_s": 1 / t["sign"], "p256_verify_per_s": 1 / t["verify"]}


def envelopes(key: SigningKey, start: int, count: int, pred: bytes) -> list[bytes]:
    return [dsse.sign_json(statement_json(f"entry-{i}", hashlib.sha256(b"%d" % i).hexdigest(), PREDICATE_TYPE, pred),
                           key) for i in range(start, start + count)]


def bench_appends(tmp: Path, key: SigningKey, log: SigningKey, n: int) -> dict[str, float]:
    pred = _codec.dumps({"bench": "appends"})
    out = {}
    for sync in ("FULL", "NORMAL"):
        envs = envelopes(key, 0, n, pred)
        led = Ledger.init(tmp / f"appends-{sync}.db", log, "bench.local/log", synchronous=sync)
        t = time.perf_counter()
        for e in envs:
            led.append(e, key.public)
        out[f"append_per_s_{sync}"] = n / (time.perf_counter() - t)
        led.close()
    envs = envelopes(key, 0, 20 * n, pred)
    led = Ledger.init(tmp / "bulk.db", log, "bench.local/log")
    t = time.perf_counter()
    led.append_many([(e, key.public) for e in envs])
    out["append_many_per_s_checked"] = len(envs) / (time.perf_counter() - t)
    led.close()
    return out


def bench_big(tmp: Path, key: SigningKey, log: SigningKey, entries: int, batch: int) -> dict[str, float]:
    pred = _codec.dumps({"bench": "big"})
    path = tmp / "big.db"
    led = Ledger.init(path, log, "bench.local/log", synchronous="NORMAL")
    t_sign = t_insert = 0.0
    for start in range(0, entries, batch):
        t = time.perf_counter()
        envs = envelopes(key, start, min(batch, entries - start), pred)
        t_sign += time.perf_counter() - t
        t = time.perf_counter()
        # just signed by us, so the DSSE check is skipped for the bulk import
        led.append_many([(e, key.public) for e in envs], check_signatures=False)
        t_insert += time.perf_counter() - t
        print(f"  … {start + len(envs)} entries, sign {t_sign:.0f} s, insert {t_insert:.0f} s", file=sys.stderr)
    led.close()
    led = Ledger.open(path, log)
    n = led.size
    rng = random.Random(6962)
    idx = [rng.randrange(n) for _ in range(2000)]
    t = time.perf_counter()
    proofs = [led.prove(i) for i in idx]
    t_prove = (time.perf_counter() - t) / len(idx)
    olds = [rng.randrange(1, n) for _ in range(500)]
    t = time.perf_counter()
    for m in olds:
        led.consistency(m)
    t_cons = (time.perf_counter() - t) / len(olds)
    bodies = [led.entry(i)["body"] for i in idx[:500]]
    t = time.perf_counter()
    for p, b in zip(proofs, bodies):
        verify_inclusion_document(p.to_dict(), b, log.public, "bench.local/log")
    t_vdoc = (time.perf_counter() - t) / len(bodies)
    extra = envelopes(key, entries, 200, pred)
    t = time.perf_counter()
    for e in extra:
        led.append(e, key.public)
    t_append = (time.perf_counter() - t) / len(extra)
    led.close()
    return {"entries": n, "build_sign_s": t_sign, "build_insert_s": t_insert,
            "build_entries_per_s": n / t_insert, "db_MB": os.path.getsize(path) / 1e6,
            "prove_ms": t_prove * 1e3, "consistency_ms": t_cons * 1e3, "verify_proof_ms": t_vdoc * 1e3,
            "append_ms_at_size": t_append * 1e3, "proof_hashes": len(proofs[0].hashes)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000, help="size of the big ledger (default 10^6)")
    ap.add_argument("--batch", type=int, default=50_000, help="entries per bulk transaction")
    ap.add_argument("--appends", type=int, default=500, help="single appends to time")
    ap.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds")
    ap.add_argument("--dir", default=None, help="where to put the databases (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    key, log = SigningKey.generate("p256"), SigningKey.generate("ed25519")
    res: dict[str, object] = {"raw": bench_raw(key, args.rounds)}
    print(f"raw P-256: sign {res['raw']['p256_sign_per_s']:.0f}/s, verify {res['raw']['p256_verify_per_s']:.0f}/s")
    for size in (4096, 1 << 20):
        r = bench_chunks(size, key, args.rounds if size <= 65536 else max(5, args.rounds // 3))
        res[f"chunk_{size}"] = r
        print(f"{size:>8} B chunks: SHA-256 {r['sha256_MBps']:.0f} MB/s | sign {r['sign_us']:.1f} µs "
              f"(raw {r['raw_sign_us']:.1f}, ratio {r['sign_ratio']:.2f}) | verify+parse {r['verify_parse_us']:.1f} µs "
              f"(raw {r['raw_verify_us']:.1f}, ratio {r['verify_parse_ratio']:.2f}) | verify+compare "
              f"{r['verify_expected_us']:.1f} µs (ratio {r['verify_expected_ratio']:.2f})")
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        tmp = Path(d)
        a = bench_appends(tmp, key, log, args.appends)
        res["appends"] = a
        print(f"ledger appends: {a['append_per_s_FULL']:.0f}/s (synchronous=FULL), {a['append_per_s_NORMAL']:.0f}/s "
              f"(NORMAL), append_many {a['append_many_per_s_checked']:.0f}/s with signature checks")
        if args.entries:
            t = time.perf_counter()
            b = bench_big(tmp, key, log, args.entries, args.batch)
            b["build_total_s"] = time.perf_counter() - t
            res["big"] = b
            print(f"{b['entries']} entries: built in {b['build_sign_s']:.0f} s signing + {b['build_insert_s']:.0f} s "
                  f"inserting ({b['build_entries_per_s']:.0f} entries/s, {b['db_MB']:.0f} MB); prove "
                  f"{b['prove_ms']:.3f} ms ({b['proof_hashes']} hashes), consistency {b['consistency_ms']:.3f} ms, "
                  f"verify proof {b['verify_proof_ms']:.3f} ms, append {b['append_ms_at_size']:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
