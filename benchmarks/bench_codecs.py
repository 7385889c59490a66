"""Bytes per round and encode/decode cost per codec, plus chunk hashing throughput.

    python benchmarks/bench_codecs.py            # d = 4810 (digits MLP) and d = 10⁶, n = 20
    python benchmarks/bench_codecs.py --quick    # fewer repeats

For each codec: the exact bytes of one round's payloads (n clients), the ratio to dense
float32, and the median wall time per client of a batched encode with error feedback
(``Compressor.compress`` on the ``(n, d)`` matrix) and of decoding the n untrusted
payloads. Then the chunking path (split, SHA-256 per chunk, Merkle root, verified
reassembly) against raw ``hashlib.sha256`` over the same bytes. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib

import torch

from redteam.transport import Compressor, build_manifest, check_chunk, make_codec, reassemble
from _timing import median_time

CODECS = [
    ("none", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("int8", {}),
    ("int8", {"rounding": "stochastic"}),
    ("topk", {"fraction": 0.1}),
    ("topk", {"fraction": 0.1, "indices": "bitmap"}),
    ("topk", {"fraction": 0.01}),
    ("randk", {"fraction": 0.1}),
]


def bench_codecs(n: int, d: int, repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    updates = torch.randn(n, d, generator=g) * 0.01
    residual = torch.randn(n, d, generator=g) * 0.001
    dense = n * make_codec("none").payload_size(d)
    print(f"\n## codecs, n = {n} clients, d = {d:,}\n")
    print(f"| {'codec':<52} | {'bytes/round':>12} | {'vs dense':>8} | {'encode ms/client':>16} | {'decode ms/client':>16} |")
    print(f"|{'-' * 54}|{'-' * 14}|{'-' * 10}|{'-' * 18}|{'-' * 18}|")
    for name, params in CODECS:
        comp = Compressor(make_codec(name, **params), error_feedback=True)
        res = comp.compress(updates, residual, g)
        t_enc = median_time(lambda: comp.compress(updates, residual, g), repeats)
        t_dec = median_time(lambda: comp.decode_many(res.payloads, d), repeats)
        _, errors = comp.decode_many(res.payloads, d)
        assert errors == [None] * n
        print(
            f"| {comp.codec.spec:<52} | {res.nbytes:>12,} | {res.nbytes / dense:>8.3f} "
            f"| {1e3 * t_enc / n:>16.3f} | {1e3 * t_dec / n:>16.3f} |"
        )


def bench_chunking(total_mib: int, chunk_size: int, repeats: int) -> None:
    gen = torch.Generator().manual_seed(1)
    payload = torch.randint(0, 256, (total_mib * 2**20,), dtype=torch.uint8, generator=gen).numpy().tobytes()
    manifest, chunks = build_manifest(payload, round=0, client=0, parent_digest="0" * 64, codec="none()",
                                      chunk_size=chunk_size, nonce="0" * 32)
    received = dict(enumerate(chunks))

    def raw() -> None:
        hashlib.sha256(payload).digest()

    def verify() -> None:  # what the receiver does per chunk: length + SHA-256 + compare
        for i, c in received.items():
            assert check_chunk(manifest, i, c) is None

    def full() -> None:  # split + hash + Merkle root, then verified reassembly (two copies, two hashes)
        m, ch = build_manifest(payload, round=0, client=0, parent_digest="0" * 64, codec="none()",
                               chunk_size=chunk_size, nonce="0" * 32)
        reassemble(m, dict(enumerate(ch)))

    mb = len(payload) / 1e6
    t_raw, t_verify, t_full = (median_time(f, repeats) for f in (raw, verify, full))
    print(f"\n## chunking, {total_mib} MiB payload, chunk_size = {chunk_size:,} ({manifest.n_chunks} chunks)\n")
    print(f"raw SHA-256 over the whole payload:   {mb / t_raw:7.0f} MB/s")
    print(f"per-chunk verification (receiver):    {mb / t_verify:7.0f} MB/s  ({100 * t_raw / t_verify:.0f} % of raw)")
    print(f"build_manifest + reassemble (sender and receiver, incl. split/join copies): {mb / t_full:7.0f} MB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args()
    repeats = 2 if args.quick else 5
    bench_codecs(20, 4810, repeats * 4)
    bench_codecs(20, 1_000_000, repeats)
    bench_chunking(64, 16 * 1024, repeats)
    bench_chunking(64, 4 * 1024, repeats)
    bench_chunking(64, 1024 * 1024, repeats)


if __name__ == "__main__":
    main()
