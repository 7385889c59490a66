"""The two gradient paths of the clients' local training, ``vmap`` and ``loop``, timed on CPU.

    python benchmarks/bench_batching.py                       # the three models, 1 thread
    python benchmarks/bench_batching.py --cases mlp cnn --threads 2 --repeats 9
    python benchmarks/bench_batching.py --clients 20 --steps 2 --batch 64

``[federation] batching`` (``redteam.federation.training.resolve_batching``) picks how
``BatchedTrainer`` computes the clients' gradients: ``vmap(grad(loss))`` over the stacked
parameter rows (one batched program), or ``grad(loss)`` one row after another (``loop``).
Everything else — the batch draws, the SGD step on the stacked rows — is the same code. This
script times one round of local training (``BatchedTrainer.train``: ``--clients`` clients ×
``--steps`` local steps × batch ``--batch``) under each path, for:

* ``mlp``: the 2NN, ``mnist5k``'s ``model = "mlp"`` (784-200-200-10, 199,210 parameters);
* ``cnn``: ``mnist5k``'s ``model = "cnn"`` (McMahan et al.'s two 5×5 convolutions) at
  ``channels = 8`` (``--channels``), ``hidden = 128`` (105,194 parameters);
* ``resnet18``: ``redteam.workloads.nets``' CIFAR ResNet-18 at width 16 with GroupNorm
  (701,466 parameters) on 3×32×32 inputs.

Inputs are random (standard normal pixels, uniform labels; nothing is read or downloaded),
``--samples`` per client. Each (model, path) runs in its own child process, so that its peak
RSS (``ru_maxrss``) is its own; the table gives the median of ``--repeats`` timed rounds after
one warm-up round (each round restarts the batch generator: every round trains the same
batches), per round and per client, the RSS after setup and the peak, and "loop / vmap"
(above 1: vmap is faster). The last column is the largest difference between the two paths'
trained parameters (float32 rounding: the two programs sum in different orders).
Nothing is asserted: this is a measurement.

Measured 2026-12 on a 2-core AMD EPYC, torch CPU, ``--threads 1``, 10 clients × 1 step ×
batch 32, **while another process kept both cores busy** (a test suite; load ≈ 1.5–2), so the
times are noisy and the ratios are the figures to read:

| model | parameters | vmap ms/round | loop ms/round | loop / vmap | peak RSS vmap / loop MiB (after setup 235–291) | max abs diff |
|---|---|---|---|---|---|---|
| mlp (2NN) | 199,210 | 16.0 | 20.2 | 1.26x | 378 / 364 | 7.5e-09 |
| cnn, 8 channels | 105,194 | 92.6 | 91.7 | 0.99x | 416 / 356 | 1.5e-08 |
| cnn, 32 channels (``--channels 32``) | 454,922 | 437.0 | 432.2 | 0.99x | 751 / 471 | 1.5e-06 |
| resnet18, width 16 | 701,466 | 1653.6 | 1388.0 | 0.84x | 1967 / 646 | 2.2e-05 |

Over every run of these sizes in that session (2 to 21 timed rounds each; seven for the MLP and
the 8-channel CNN, three for the others), loop / vmap was 1.25–2.07 for the MLP in six runs and
0.70 in one (5 rounds, while the load peaked: its rounds last 12–40 ms and are the noisiest),
0.86–1.06 for the 8-channel CNN, 0.82–0.99 at 32 channels, and 0.75–0.84 for the ResNet-18
(the loop faster, at a third of vmap's peak memory). ``bench_paper_scale.py``
measured the ResNet-18 on the idle machine at 0.48 (batch 64). These figures are the rule of
``"auto"``: the loop on CPU for a model with a convolution, ``vmap`` otherwise (and on CUDA).

The SGD step updates the rows in place since 2026-12-07 (the same two roundings as
``params - lr * g``; a new ``(n, d)`` matrix at every step cost page faults). The MLP at 10
clients × 10 steps (``--cases mlp --steps 10 --repeats 9``), vmap path, before → after: 191.5 →
157.6 ms a round on the idle machine, then 241.1 → 199.2 and 263.2 → 221.7 ms in two
alternated pairs while the machine was loaded; the trained parameters are bit for bit the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run as `python benchmarks/bench_batching.py` from a checkout
    sys.path.insert(0, ROOT)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

CASES = ("mlp", "cnn", "resnet18")
PATHS = ("vmap", "loop")


def _workload(case: str, channels: int = 8):
    """The workload (its model and loss) and the shape of one input."""
    from dataclasses import dataclass

    import torch

    from redteam.workloads.base import Workload
    from redteam.workloads.mnist import MNIST5k
    from redteam.workloads.nets import build_net

    if case == "mlp":
        return MNIST5k(model="mlp"), (784,)
    if case == "cnn":
        return MNIST5k(model="cnn", channels=channels, hidden=128), (784,)

    @dataclass(frozen=True, slots=True)
    class Cifar(Workload):
        input_kind = "image"

        def build_model(self, generator: torch.Generator) -> torch.nn.Module:
            return build_net("resnet18", num_classes=10, in_channels=3, image_size=32, width=16,
                             generator=generator)

    return Cifar(), (3, 32, 32)


def _child(args: argparse.Namespace) -> dict:
    import torch

    from redteam.federation.params import ParamSpec
    from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
    from redteam.types import ClientData

    torch.set_num_threads(args.threads)
    wl, shape = _workload(args.case, args.channels)
    g = torch.Generator().manual_seed(args.seed)
    n, s = args.clients, args.samples
    x = torch.randn((n * s, *shape), generator=g)
    y = torch.randint(0, 10, (n * s,), generator=g)
    model = wl.build_model(torch.Generator().manual_seed(args.seed + 1))
    spec = ParamSpec.of(model)
    flat = spec.flatten(model)
    data = StackedData.stack([ClientData(x[c * s:(c + 1) * s], y[c * s:(c + 1) * s]) for c in range(n)])
    trainer = BatchedTrainer(wl, model, spec, batching=args.path)
    cfg = LocalTraining(steps=args.steps, batch_size=args.batch, lr=0.05)
    idx = torch.arange(n)

    def one_round() -> torch.Tensor:
        return trainer.train(flat, data, idx, cfg, torch.Generator().manual_seed(args.seed + 2))

    from _timing import rss_mib

    setup_rss = rss_mib()
    one_round()  # warm-up: allocator, vmap's tracing
    times = []
    out = None
    for _ in range(args.repeats):
        t = time.perf_counter()
        out = one_round()
        times.append(time.perf_counter() - t)
    assert out is not None
    from safetensors.torch import save_file

    save_file({"params": out.contiguous()}, args.out)  # never pickle
    return {"d": spec.dim, "median_s": statistics.median(times), "times": times, "setup_rss_mib": setup_rss,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "threads": torch.get_num_threads()}


def _run(case: str, path: str, args: argparse.Namespace, out: str) -> dict | str:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--case", case, "--path", path, "--out", out]
    for k in ("clients", "steps", "batch", "samples", "repeats", "threads", "seed", "channels"):
        cmd += [f"--{k}", str(getattr(args, k))]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()
        return f"failed (exit {proc.returncode}): {tail[-1] if tail else ''}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--steps", type=int, default=1, help="local steps per client (default 1)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--samples", type=int, default=100, help="inputs per client (default 100)")
    ap.add_argument("--repeats", type=int, default=11, help="timed rounds per path, after one warm-up (default 11)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each child (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--channels", type=int, default=8, help="the cnn's first convolution's channels (default 8)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    ap.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return

    import torch
    from _timing import cpu_name
    from safetensors.torch import load_file

    print(f"torch {torch.__version__}, CPU {cpu_name()} ({os.cpu_count()} logical cores), python "
          f"{platform.python_version()}, {args.threads} thread(s); load average {os.getloadavg()[0]:.2f}")
    print(f"{args.clients} clients x {args.steps} step(s) x batch {args.batch}, {args.samples} inputs per client, "
          f"median of {args.repeats} rounds\n")
    print("| model | parameters | vmap ms/round | loop ms/round | vmap ms/client | loop ms/client | loop / vmap "
          "| peak RSS vmap / loop MiB (after setup) | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            res = {p: _run(case, p, args, os.path.join(tmp, f"{case}-{p}.safetensors")) for p in PATHS}
            bad = [f"{p}: {r}" for p, r in res.items() if isinstance(r, str)]
            if bad:
                print(f"| {case} | {'; '.join(bad)} |")
                continue
            v, lp = res["vmap"], res["loop"]
            assert isinstance(v, dict) and isinstance(lp, dict)
            trained = {p: load_file(os.path.join(tmp, f"{case}-{p}.safetensors"))["params"] for p in PATHS}
            diff = float((trained["vmap"] - trained["loop"]).abs().max())
            n = args.clients
            print(f"| {case} | {v['d']:,} | {1e3 * v['median_s']:.1f} | {1e3 * lp['median_s']:.1f} | "
                  f"{1e3 * v['median_s'] / n:.2f} | {1e3 * lp['median_s'] / n:.2f} | "
                  f"{lp['median_s'] / v['median_s']:.2f}x | {v['peak_rss_mib']:.0f} / {lp['peak_rss_mib']:.0f} "
                  f"({v['setup_rss_mib']:.0f} / {lp['setup_rss_mib']:.0f}) | {diff:.1e} |")
    print("\nloop / vmap above 1: vmap is faster. redteam.federation.training.resolve_batching's \"auto\": "
          "loop on CPU for a model with a convolution, vmap otherwise.")


if __name__ == "__main__":
    main()
