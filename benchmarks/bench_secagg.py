"""Cost of one secure-aggregation round (Bonawitz et al. 2017, semi-honest) in this simulation.

    python benchmarks/bench_secagg.py            # m = 20 and 100 clients, d = 10⁴, 3 repeats
    python benchmarks/bench_secagg.py --quick    # 1 repeat

For each (m, d, R, dropouts): the median wall and process-CPU time of ``secure_sum`` (all m clients and
the server, one process: key derivation, Shamir sharing, sealing and opening the share
pairs, masking, unmasking) and the bytes clients send, per phase, against the m·d·4 B of
plain float32 updates. Then the same for ``bucketed_secure_sum`` with 5 buckets, whose
pairwise work is ~1/5 of one cohort's. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from redteam.transport.secagg import bucketed_secure_sum, secure_sum
from _timing import cpu_name


def median_times(fn, repeats: int) -> tuple[float, float]:
    """Median wall and process-CPU seconds of ``fn`` over ``repeats`` calls after a warm-up
    (CPU time is the steadier figure on a shared machine)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


def bench(m: int, d: int, modulus_bits: int, drop_frac: float, repeats: int) -> None:
    rows = torch.randn(m, d, generator=torch.Generator().manual_seed(0)) * 0.01
    ids = list(range(m))
    drops = ids[: int(drop_frac * m)]
    res = secure_sum(rows, ids, round=0, seed=1, dropouts=drops, modulus_bits=modulus_bits)
    t, c = median_times(lambda: secure_sum(rows, ids, round=0, seed=1, dropouts=drops, modulus_bits=modulus_bits),
                        repeats)
    phases = dict(res.phase_bytes)
    plain = m * d * 4
    print(f"| {m:>4} | {d:>6,} | 2^{modulus_bits} | {len(drops):>4} | {t:>7.3f} | {c:>7.3f} | {res.bytes_up:>11,} "
          f"| {res.bytes_up / plain:>6.2f} | {phases['advertise_keys']:>8,} | {phases['share_keys']:>10,} "
          f"| {phases['masked_input']:>10,} | {phases['unmasking']:>9,} |")


def bench_buckets(m: int, d: int, buckets: int, repeats: int) -> None:
    rows = torch.randn(m, d, generator=torch.Generator().manual_seed(0)) * 0.01
    ids = list(range(m))

    def run():
        return bucketed_secure_sum(rows, ids, buckets, torch.Generator().manual_seed(0), round=0, seed=1)

    out = run()
    t, c = median_times(run, repeats)
    total = sum(r.bytes_up for r in out.results if r is not None)
    print(f"bucketed, m = {m}, d = {d:,}, {buckets} buckets: {t:.3f} s wall, {c:.3f} s CPU, {total:,} bytes up "
          f"({total / (m * d * 4):.2f}× plain float32)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one repeat")
    args = ap.parse_args()
    repeats = 1 if args.quick else 3
    print(f"CPU: {cpu_name()}, torch threads {torch.get_num_threads()}\n")
    print("|    m |      d |    R | drop |  wall s |   CPU s |    bytes up | ×plain |     keys |     shares "
          "|     masked | unmasking |")
    print("|-----:|-------:|-----:|-----:|--------:|--------:|------------:|-------:|---------:|-----------:"
          "|-----------:|----------:|")
    for m in (20, 100):
        for modulus_bits in (32, 64):
            for drop in (0.0, 0.1):
                bench(m, 10_000, modulus_bits, drop, repeats)
    print()
    bench_buckets(100, 10_000, 5, repeats)


if __name__ == "__main__":
    main()
