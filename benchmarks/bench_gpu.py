"""The GPU benchmark of issue 13 §3: the full round at 1,000 and 10,000 clients and the
aggregator table, on CUDA.

    python benchmarks/bench_gpu.py                          # both parts (a few minutes on one GPU)
    python benchmarks/bench_gpu.py --skip-aggregators --clients 1000 --rounds 6
    python benchmarks/bench_gpu.py --skip-scale --only krum,median --no-cpu
    python benchmarks/bench_gpu.py --device cpu --clients 100 --d 10000   # a dry run of the script itself

Without CUDA it prints one line saying so and exits 0 (``--device cpu`` runs the same code
on the CPU instead: a check of the script, not a GPU figure). Nothing here is asserted; the
CPU/CUDA agreement is tested in ``tests/test_cuda.py``.

**(a) Round overhead on the GPU** (the method of ``benchmarks/bench_scale.py``, on
``device="cuda"``): the ``synthetic`` workload, ~20 samples per client, 10 local steps of
batch 16, codec ``none``. Each size runs in its own child process. After every full round
(``Federation.run``'s round wall time: training, encode, chunk + SHA-256 + manifests, the
simulated network, decode with the receiver's checks, merge, server step, evaluation; the
round ends on the host after evaluation, so its GPU work is finished) one *bare* round is
timed from the on-round callback: the same clients' batched local training from the same
global model, the weighted mean of the deltas and the step, with ``torch.cuda.synchronize()``
before and after. The table gives the medians (from round 1: round 0 includes lazy
initialisation and CUDA start-up) and the median of the per-round ratios, with the peak GPU
memory (``torch.cuda.max_memory_allocated``) of the full rounds and of the bare rounds
(the counter is reset between them) and the host's peak RSS.

**(b) Aggregator table on the GPU beside the CPU**: every defense of
``benchmarks/bench_aggregators.py``'s ``defenses_for(n)`` (same labels, same parameters,
f = n // 10) at n = 100, d = 10⁶ float32 N(0, 1) rows from a seeded generator, the same
rows on both devices. A cell is the median of ``--repeats`` calls after one warm-up call;
on the GPU ``torch.cuda.synchronize()`` is called before the clock starts and before it
stops. "GPU MiB" is the peak of ``torch.cuda.max_memory_allocated`` during the warm-up call
above what was allocated before it (the input's 400 MB are not counted). FLDetector is
timed in a round after its warm-up (the state that ``WarmFLDetector`` builds, copied to the
GPU before the warm-up call, so here its GPU MiB do not include building that state, whatever
the label says). The first line is the float32 Gram matrix x·xᵀ, the distance rules' floor.
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
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_reset(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_mib(device: str) -> float | None:
    import torch

    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


# -- (a) full round vs bare round ------------------------------------------------------


def one_size(n: int, rounds: int, device: str) -> dict:
    """One federation of ``n`` clients on ``device``: full and bare round times, peaks."""
    import torch

    from bench_scale import scale_doc  # the same scenario as the CPU benchmark

    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    t_build = time.perf_counter()
    fed = Federation(parse_scenario(scale_doc(n, rounds)), device=device)
    build_s = time.perf_counter() - t_build
    part_t = torch.arange(n, device=fed.device)
    gen = torch.Generator().manual_seed(1)  # the bare rounds' own stream: the federation's is untouched
    params = fed.params0.clone()
    w = fed.weights / fed.weights.sum()
    bare: list[float] = []
    full: list[float] = []
    peak_full: list[float] = []
    peak_bare: list[float] = []

    def bare_round() -> float:
        _sync(device)
        t = time.perf_counter()
        local = fed.trainer.train(params, fed.data, part_t, fed.local, gen)
        agg = (w[:, None] * (local - params)).sum(0)
        _ = params + agg
        _sync(device)
        return time.perf_counter() - t

    def on_round(rec) -> None:
        p = _peak_mib(device)
        if p is not None:
            peak_full.append(p)
        _peak_reset(device)
        b = bare_round()
        p = _peak_mib(device)
        if p is not None:
            peak_bare.append(p)
        _peak_reset(device)
        if rec.round == 0:  # warm-up: lazy initialisation, CUDA context and kernels
            return
        full.append(rec.wall_time_s)
        bare.append(b)

    _peak_reset(device)
    res = fed.run(on_round=on_round)
    ratios = [f / b for f, b in zip(full, bare)]
    return {
        "clients": n,
        "d": fed.spec.dim,
        "device": str(fed.device),
        "full_ms": statistics.median(full) * 1e3,
        "bare_ms": statistics.median(bare) * 1e3,
        "ratio": statistics.median(ratios),
        "rounds_timed": len(full),
        "build_s": build_s,
        "accuracy": res.records[-1].accuracy,
        "gpu_peak_full_mib": max(peak_full) if peak_full else None,
        "gpu_peak_bare_mib": max(peak_bare) if peak_bare else None,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def scale_table(sizes: list[int], rounds: int, device: str) -> None:
    print(f"\n(a) full round vs bare batched round, synthetic workload, device {device}\n")
    print("| clients | d | bare round ms | full round ms | full / bare (median of rounds) | rounds timed | "
          "GPU peak full MiB | GPU peak bare MiB | host peak RSS MiB | build s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        r_n = rounds or (8 if n <= 1000 else 4)
        cmd = [sys.executable, os.path.abspath(__file__), "--one", str(n), "--rounds", str(r_n), "--device", device]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
            print(f"| {n} | failed: {last} |", flush=True)
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        gf = f"{r['gpu_peak_full_mib']:.0f}" if r["gpu_peak_full_mib"] is not None else "-"
        gb = f"{r['gpu_peak_bare_mib']:.0f}" if r["gpu_peak_bare_mib"] is not None else "-"
        print(f"| {n} | {r['d']} | {r['bare_ms']:.1f} | {r['full_ms']:.1f} | {r['ratio']:.2f}x | {r['rounds_timed']} | "
              f"{gf} | {gb} | {r['maxrss_mib']:.0f} | {r['build_s']:.1f} |", flush=True)


# -- (b) aggregator table --------------------------------------------------------------


def _to(obj: Any, device: str) -> Any:
    """``obj`` with every tensor inside (dicts, lists, tuples) moved to ``device``."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def _time(call: Callable[[], object], repeats: int, device: str) -> tuple[float, float | None]:
    """(median seconds over ``repeats`` calls after a warm-up call, extra GPU MiB of the warm-up)."""
    import torch

    extra = None
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        call()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        call()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), extra


def _fmt(sec: float) -> str:
    return f"{sec * 1e3:.1f} ms" if sec < 1 else f"{sec:.2f} s"


def aggregator_table(n: int, d: int, repeats: int, names: list[str] | None, device: str, with_cpu: bool) -> None:
    import torch

    sys.path.insert(0, HERE)
    from bench_aggregators import GRAM, WarmFLDetector, defenses_for  # a sibling script

    from redteam.types import ServerContext

    gen = torch.Generator().manual_seed(0)
    x_cpu = torch.randn(n, d, generator=gen)
    g0_cpu = x_cpu.mean(dim=0) + 0.1 * torch.randn(d, generator=gen)
    x_dev = x_cpu.to(device)
    g0_dev = g0_cpu.to(device)
    ctx_cpu = ServerContext.default(x_cpu, root_update=lambda: g0_cpu)
    ctx_dev = ServerContext.default(x_dev, root_update=lambda: g0_dev)
    rules: list[tuple[str, Any]] = [(GRAM, lambda x, ctx: x @ x.T), *defenses_for(n)]
    cpu_col = with_cpu and device != "cpu"
    threads = torch.get_num_threads()
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else "no GPU"
    print(f"\n(b) every defense at n = {n}, d = {d:,}, float32; torch {torch.__version__}; {gpu}; "
          f"CPU: {threads} intra-op threads\n")
    cols = ["defense", device, "GPU MiB"] + (["CPU", "CPU / GPU"] if cpu_col else [])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for label, rule in rules:
        key = label.split(" ")[0]
        if names and key not in names and label != GRAM:
            continue
        rule_dev = rule
        if isinstance(rule, WarmFLDetector):
            # its synthetic state is built on the CPU: build it once there, copy it over
            rule(x_cpu, ctx_cpu)
            rule_dev = WarmFLDetector(rule.detector)
            rule_dev.key, rule_dev.extra = rule.key, _to(rule.extra, device)
        try:
            t_dev, extra = _time(lambda r=rule_dev: r(x_dev, ctx_dev), repeats, device)
            cell_dev, cell_mem = _fmt(t_dev), (f"{extra:.0f}" if extra is not None else "-")
        except Exception as exc:  # noqa: BLE001  (a rule failing on the device is a finding: print it, go on)
            t_dev, cell_dev, cell_mem = None, f"failed: {type(exc).__name__}: {str(exc)[:80]}", "-"
        row = f"| {label} | {cell_dev} | {cell_mem} |"
        if cpu_col:
            t_cpu, _ = _time(lambda r=rule: r(x_cpu, ctx_cpu), repeats, "cpu")
            ratio = f"{t_cpu / t_dev:.1f}x" if t_dev else "-"
            row += f" {_fmt(t_cpu)} | {ratio} |"
        print(row, flush=True)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run of the script")
    ap.add_argument("--clients", type=int, nargs="+", default=[1000, 10000], help="sizes for part (a)")
    ap.add_argument("--rounds", type=int, default=0, help="rounds per size (default: 8 up to 1,000 clients, else 4)")
    ap.add_argument("--n", type=int, default=100, help="clients for part (b)")
    ap.add_argument("--d", type=int, default=10**6, help="dimension for part (b)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per cell in part (b)")
    ap.add_argument("--only", default="", help="part (b): comma-separated first words of the labels (krum,median)")
    ap.add_argument("--no-cpu", action="store_true", help="part (b): skip the CPU column")
    ap.add_argument("--skip-scale", action="store_true", help="skip part (a)")
    ap.add_argument("--skip-aggregators", action="store_true", help="skip part (b)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one_size(args.one, args.rounds, args.device)))
        return
    if args.device.startswith("cuda") and not _cuda_available():
        import torch

        print(f"bench_gpu: CUDA is not available here (torch {torch.__version__}); nothing measured "
              "(run it on a GPU machine, or --device cpu for a dry run of the script)")
        return
    import torch

    if args.device.startswith("cuda"):
        print(f"{torch.cuda.get_device_name(args.device)}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"{os.cpu_count()} host cores")
    if not args.skip_scale:
        scale_table(args.clients, args.rounds, args.device)
    if not args.skip_aggregators:
        names = [s for s in args.only.split(",") if s] or None
        aggregator_table(args.n, args.d, args.repeats, names, args.device, not args.no_cpu)


if __name__ == "__main__":
    main()
