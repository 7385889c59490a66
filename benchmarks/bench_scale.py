"""The full redteam round against the bare batched round, side by side, at 100 to 10,000
clients on the ``synthetic`` workload (issue 13 §3), with the memory each size needed.

    python benchmarks/bench_scale.py                  # 100, 1000 and 10000 clients (a few minutes)
    python benchmarks/bench_scale.py --clients 100 1000 --rounds 6

What is compared (both in the same process, interleaved round by round, so both see the
same machine load):

* **full round**: ``Federation.run``'s round wall time: local training of every client
  (batched), encode (codec ``none``, error feedback), chunk + SHA-256 + Merkle root + manifest,
  the simulated network (headers announced and opened, every chunk checked against its
  digest), batched decode with the receiver's checks, merge (FedAvg mean), server step,
  and evaluation;
* **bare round**: the same clients' batched local training from the same global model
  (``BatchedTrainer.train``, same local settings), the weighted mean of the deltas and the
  server step — what a batched trainer without any of the harness would do.

After every full round (from the second: the first includes lazy initialisation) one bare
round is timed from the on-round callback; the table gives the medians and the median of
the per-round ratios. The same ratio is also given in CPU time of the running thread
(``time.thread_time``; the full round's from the end of one on-round callback to the next,
so it includes the loop's bookkeeping between rounds): on a shared machine another
process's load stretches wall time but not the thread's own CPU time. Each size runs in a
child process, so its peak resident memory (``ru_maxrss``) is that size's alone. The
machine is shared: the load average is printed with every figure. Nothing here is asserted.

Each client holds about 20 samples (``samples = 20 × clients``, at least 4000); local
training is 10 steps of batch 16 (the setting the speed targets use).

Measured (2-core machine, load ≈ 2, ``--clients 100 1000 --rounds 6``; the code before the
batched wire lanes of issue 13 §3's second pass in the same session, back to back):

    clients  bare ms  full ms  full/bare wall  full/bare CPU   before: full ms, wall, CPU
    100      11.9     14.0     1.21x           1.21x           16.4, 1.38x, 1.37x
    1000     39.9     48.7     1.23x           1.23x           66.2, 1.68x, 1.69x

At 1,000 clients the stages beside training then take 9.8 ms per round instead of 27.2
(thread CPU time: chunk + manifests 5.3 → 3.2 ms, transport 13.2 → 2.9, receive + decode
5.3 → 0.9, defend 1.5 → 1.3, encode 0.7 → 0.6), two SHA-256 passes over every chunk
included. See docs/benchmarks.md, "Scale".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def scale_doc(n: int, rounds: int) -> dict:
    """The scenario every size runs (also bench_gpu.py's): synthetic, ~20 samples per client."""
    return {
        "workload": {"name": "synthetic", "samples": max(4000, 20 * n)},
        "federation": {"clients": n, "rounds": rounds, "partition": "iid", "min_samples": 1,
                       "local_steps": 10, "batch_size": 16},
        "transport": {"codec": "none"},
    }


def one(n: int, rounds: int) -> dict:
    import torch

    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    torch.set_num_threads(1)
    t_build = time.perf_counter()
    fed = Federation(parse_scenario(scale_doc(n, rounds)), device="cpu")
    build_s = time.perf_counter() - t_build
    part_t = torch.arange(n)
    gen = torch.Generator().manual_seed(1)  # the bare rounds' own stream: the federation's is untouched
    params = fed.params0.clone()
    w = fed.weights / fed.weights.sum()
    bare: list[float] = []
    full: list[float] = []
    bare_cpu: list[float] = []
    full_cpu: list[float] = []
    mark = [0.0]  # thread CPU time when the previous on_round returned

    def bare_round() -> tuple[float, float]:
        t, c = time.perf_counter(), time.thread_time()
        local = fed.trainer.train(params, fed.data, part_t, fed.local, gen)
        agg = (w[:, None] * (local - params)).sum(0)
        _ = params + agg
        return time.perf_counter() - t, time.thread_time() - c

    def on_round(rec) -> None:
        now = time.thread_time()
        if rec.round == 0:
            bare_round()  # warm-up
        else:
            full.append(rec.wall_time_s)
            full_cpu.append(now - mark[0])  # this round and the loop's bookkeeping between rounds
            b, bc = bare_round()
            bare.append(b)
            bare_cpu.append(bc)
        mark[0] = time.thread_time()

    res = fed.run(on_round=on_round)
    ratios = [f / b for f, b in zip(full, bare)]
    cpu_ratios = [f / b for f, b in zip(full_cpu, bare_cpu)]
    return {
        "clients": n,
        "d": fed.spec.dim,
        "full_ms": statistics.median(full) * 1e3,
        "bare_ms": statistics.median(bare) * 1e3,
        "ratio": statistics.median(ratios),
        "cpu_ratio": statistics.median(cpu_ratios),
        "rounds_timed": len(full),
        "build_s": build_s,
        "accuracy": res.records[-1].accuracy,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--rounds", type=int, default=0, help="rounds per size (default: 12 / 8 / 4 by size)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.rounds)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print(f"cores {os.cpu_count()}, one intra-op thread per run\n")
    print("| clients | d | bare round ms | full round ms | full / bare (median of rounds) | same, CPU time | "
          "rounds timed | peak RSS MiB | load avg |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.clients:
        rounds = args.rounds or (12 if n <= 100 else 8 if n <= 1000 else 4)
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--rounds", str(rounds)],
                             capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            print(f"| {n} | failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode} |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {n} | {r['d']} | {r['bare_ms']:.1f} | {r['full_ms']:.1f} | {r['ratio']:.2f}x | "
              f"{r['cpu_ratio']:.2f}x | {r['rounds_timed']} | {r['maxrss_mib']:.0f} | {r['load']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
