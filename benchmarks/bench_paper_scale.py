"""A paper-scale round: ResNet-18 on CIFAR-10-shaped inputs, 10 clients, trained by redteam's
batched trainer beside a plain per-client torch loop, on the same inputs.

    python benchmarks/bench_paper_scale.py                          # full width, batch 64, 2 steps, CPU
    python benchmarks/bench_paper_scale.py --width 16 --steps 2     # a quick, smaller run
    python benchmarks/bench_paper_scale.py --device cuda --steps 10 --repeats 5
    python benchmarks/bench_paper_scale.py --model vgg11 --norm batch

The setting is BackFed's CIFAR-10 configuration (``config/cifar10.yaml`` of
github.com/thinh-dao/BackFed: ResNet-18, 100 clients of which 10 train per round, batch 64,
SGD at lr 0.1) with a few local steps instead of its 2 local epochs (``--steps``; a client of
500 images runs 16 steps of 64 per epoch). The model is ``redteam.workloads.nets``'
``resnet18`` (kuangliu's CIFAR ResNet-18, 11,173,962 parameters at ``--width 64``) with
GroupNorm by default (``--norm``). Inputs are random uint8 pixels 3×32×32 made in process
(no dataset is read or downloaded), scaled to [0, 1] and standardised with the usual CIFAR-10
channel means and deviations, with random labels of 10 classes; each client holds
``--samples`` of them (500 = CIFAR-10's 50,000 over 100 clients).

A *round* here is the local training of the round's clients, the part the two ways do
differently (averaging 10 rows afterwards costs milliseconds either way):

* **batched**: ``BatchedTrainer.train`` — every client's row stacked, ``vmap(grad(loss))`` over
  ``functional_call`` per step, SGD on the stacked rows;
* **loop**: one ``nn.Module``; for each client its weights are loaded
  (copied into its parameters), a fresh ``torch.optim.SGD`` (same lr, no momentum) runs the same
  steps on the same minibatches (the trainer's index draws, replayed), and the weights are
  read back (``parameters_to_vector``).

Each way runs in its own child process (same seed, so the same data and the same initial
model) so that its peak memory is its own: the table gives the median of ``--repeats`` timed
rounds after one warm-up round (each round restarts the batch-index generator, so every round
trains the same batches), the host's peak RSS (``ru_maxrss``: data, model and training) beside
the RSS after setup, and on CUDA the peak of ``torch.cuda.max_memory_allocated`` during the
rounds; on CUDA the clock starts and stops after ``torch.cuda.synchronize()``. The last line
checks that the two ways computed the same thing: the largest difference between their final
parameters on 4,096 sampled coordinates of each row, beside the largest update there: float32
rounding (on CUDA also TF32 convolutions, torch's default) differs between the two programs and
the difference grows with the steps, so this is a sanity check, not a test (the gradients'
equality is tested in ``tests/test_nets.py``). Nothing here is asserted: this is a measurement.

Measured 2026-11-27, ResNet-18 with GroupNorm, lr 0.1, 500 images per client, median of 3
timed rounds (2 for the full-width CPU row). "loop / batched" above 1 means the batched trainer
is faster; RSS and GPU memory are peaks of the child process.

| machine | model, round | batched s | loop s | loop / batched | peak RSS (or GPU) batched / loop |
|---|---|---|---|---|---|
| 2-core AMD EPYC, torch 2.13 CPU, 1 thread | width 16 (701,466), 10 × 2 steps × 64 | 8.39 | 4.01 | 0.48× | 2,886 / 595 MiB |
| same, 2 threads | width 16, 10 × 2 × 64 | 5.58 | 2.67 | 0.48× | 2,925 / 573 MiB |
| same, 1 thread | width 64 (11,173,962), 10 × 1 × 32 | 24.9 | 12.2 | 0.49× | 5,924 / 2,049 MiB |
| 16-core Xeon (the H100 host), torch 2.11 CPU, 16 threads | width 64, 10 × 1 × 64 | 6.51 | 2.84 | 0.44× | 8,800 / 2,546 MiB |
| NVIDIA H100 80GB, torch 2.11+cu130 | width 64, 10 × 2 × 64 | 0.147 | 0.149 | 1.02× | GPU 8,247 / 1,533 MiB |
| same | width 64, 10 × 10 × 64 | 0.796 | 0.914 | 1.15× | GPU 8,247 / 1,533 MiB |
| same, ``--norm batch`` | width 64, 10 × 2 × 64 | 0.148 | 0.153 | 1.03× | GPU 8,485 / 1,533 MiB |
| same | width 64, 10 × 2 × 32 | 0.095 | 0.177 | 1.87× | GPU 5,291 / 1,533 MiB |
| same | width 64, 50 × 2 × 32 | 0.382 | 0.997 | 2.61× | GPU 25,839 / 6,884 MiB |
| same, ``--model vgg11`` | 9,231,114, 10 × 2 × 64 | 0.062 | 0.116 | 1.86× | GPU 3,898 / 1,297 MiB |
| same, ``--model lenet5 --norm none`` | 62,006, 10 × 2 × 64 | 0.021 | 0.050 | 2.40× | GPU 342 / 134 MiB |
| same, ``--model lenet5 --norm none`` | 62,006, 100 × 2 × 32 | 0.024 | 0.535 | 22.4× | GPU 1,816 / 724 MiB |

On CPU the batched program is about half as fast as the plain loop for these convolutional nets
and needs several times the memory: under ``vmap`` a convolution with per-client weights
becomes a grouped convolution over all clients' images, and GroupNorm's backward has no
batching rule and is decomposed into elementwise ops (profiled at width 4: convolution
backward and those ops dominate). On the GPU it is as fast as the loop when each client's
batch already fills the device (ResNet-18, batch 64, 10 clients) and faster when it does not
(smaller batches, more clients, smaller models). On the shared 2-core machine use
``--threads 1`` whenever other jobs run: with 2 threads while other jobs kept the machine
busy (load ≈ 3), the width-16 loop took 21.9 s a round instead of 2.7 to 4.0 s, and a LeNet-5
batched round (100 images per client) 18.1 s instead of 0.33 s with one thread.
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
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run as `python benchmarks/bench_paper_scale.py` from a checkout
    sys.path.insert(0, ROOT)

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
SAMPLE = 4096  # coordinates compared between the two ways


def _cpu_name() -> str:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _timing import cpu_name

    return cpu_name()


def _setup(args: argparse.Namespace):
    """Data, model, spec and initial flat parameters, all from seeded generators."""
    import torch

    from redteam.workloads.base import Workload
    from redteam.workloads.nets import build_net

    @dataclass(frozen=True, slots=True)
    class PaperNet(Workload):
        input_kind = "image"

        def build_model(self, generator: torch.Generator) -> torch.nn.Module:
            kw = {} if args.width is None else {"width": args.width}
            return build_net(args.model, num_classes=10, in_channels=3, image_size=32, norm=args.norm,
                             generator=generator, **kw)

    device = torch.device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    n_all = args.clients * args.samples
    pixels = torch.randint(0, 256, (n_all, 3, 32, 32), generator=g, dtype=torch.uint8)
    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    x = ((pixels.float() / 255.0 - mean) / std).to(device)
    y = torch.randint(0, 10, (n_all,), generator=g).to(device)
    wl = PaperNet()
    model = wl.build_model(torch.Generator().manual_seed(args.seed + 1)).to(device)
    return wl, model, x, y


def _child(args: argparse.Namespace) -> dict:
    import torch

    from redteam.federation.params import ParamSpec
    from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
    from redteam.types import ClientData

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    wl, model, x, y = _setup(args)
    spec = ParamSpec.of(model)
    flat = spec.flatten(model).to(device)
    n, b, s = args.clients, args.batch, args.samples
    clients = [ClientData(x[c * s:(c + 1) * s], y[c * s:(c + 1) * s]) for c in range(n)]
    cfg = LocalTraining(steps=args.steps, batch_size=b, lr=args.lr)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if args.child == "batched":
        data = StackedData.stack(clients)
        trainer = BatchedTrainer(wl, model, spec)
        idx = torch.arange(n, device=device)

        def one_round() -> torch.Tensor:
            return trainer.train(flat, data, idx, cfg, torch.Generator().manual_seed(args.seed + 2))
    else:
        net = model  # one module, reloaded per client
        net.train()
        params = list(net.parameters())  # in ParamSpec order

        def one_round() -> torch.Tensor:
            gen = torch.Generator().manual_seed(args.seed + 2)
            # the batched trainer's draws: one (n, B) uniform matrix per step, on the CPU
            draws = [torch.rand((n, b), generator=gen, dtype=torch.float64) for _ in range(cfg.steps)]
            out = []
            for c, cd in enumerate(clients):
                with torch.no_grad():  # copy, not vector_to_parameters: that makes the parameters views of `flat`
                    for p, v in zip(params, spec.unflatten(flat).values()):
                        p.copy_(v)
                opt = torch.optim.SGD(params, lr=cfg.lr)
                for step in range(cfg.steps):
                    pos = torch.floor(draws[step][c] * len(cd)).to(torch.int64).to(device)
                    loss = wl.loss(net(cd.x[pos]), cd.y[pos])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                out.append(torch.nn.utils.parameters_to_vector(net.parameters()).detach())
            return torch.stack(out)

    from _timing import rss_mib

    setup_rss = rss_mib()
    sync()
    one_round()  # warm-up: allocator, kernels, vmap's tracing of the model
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    result = None
    for _ in range(args.repeats):
        sync()
        t = time.perf_counter()
        result = one_round()
        sync()
        times.append(time.perf_counter() - t)
    cuda_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    coords = torch.randperm(spec.dim, generator=torch.Generator().manual_seed(99))[:SAMPLE].to(device)
    assert result is not None
    torch.save({"rows": result[:, coords].cpu(), "start": flat[coords].cpu()}, args.out)
    return {
        "method": args.child,
        "d": spec.dim,
        "times": times,
        "median_s": statistics.median(times),
        "setup_rss_mib": setup_rss,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cuda_peak_mib": cuda_peak,
        "threads": torch.get_num_threads(),
        "device_name": torch.cuda.get_device_name(device) if cuda else _cpu_name(),
    }


def _run_child(method: str, args: argparse.Namespace, out: str) -> dict | str:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--out", out]
    for k in ("model", "norm", "clients", "batch", "steps", "samples", "repeats", "lr", "device", "seed", "threads"):
        v = getattr(args, k)
        if v is not None:
            cmd += [f"--{k}", str(v)]
    if args.width is not None:
        cmd += ["--width", str(args.width)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()
        return f"failed (exit {proc.returncode}): {tail[-1] if tail else ''}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18", choices=("resnet18", "vgg11", "lenet5"))
    ap.add_argument("--width", type=int, default=None, help="the net's width (default 64: the full model)")
    ap.add_argument("--norm", default="group", choices=("group", "batch", "none"))
    ap.add_argument("--clients", type=int, default=10, help="clients trained per round (default 10)")
    ap.add_argument("--batch", type=int, default=64, help="local batch size (default 64, BackFed's CIFAR-10)")
    ap.add_argument("--steps", type=int, default=2, help="local SGD steps per client (default 2)")
    ap.add_argument("--samples", type=int, default=500, help="images per client (default 500)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per way, after one warm-up (default 3)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda / cuda:N")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in each child (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("batched", "loop"), default=None, help="time one way only")
    ap.add_argument("--child", choices=("batched", "loop"), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        print(json.dumps(_child(args)))
        return

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: CUDA is not available here (torch {torch.__version__}); nothing measured")
        return
    if args.model == "lenet5" and args.width is not None:
        ap.error("--width: lenet5 has no width parameter")
    width = 64 if args.width is None else args.width
    imgs = args.clients * args.batch * args.steps
    print(f"torch {torch.__version__}, device {args.device}, CPU {_cpu_name()} ({os.cpu_count()} logical cores), "
          f"python {platform.python_version()}")
    print(f"{args.model}{'' if args.model == 'lenet5' else f' width {width}'}, norm {args.norm}; {args.clients} clients x {args.steps} steps x batch "
          f"{args.batch} ({imgs} images per round), {args.samples} images per client, lr {args.lr}\n")
    methods = [args.only] if args.only else ["batched", "loop"]
    res: dict[str, dict | str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in methods:
            res[m] = _run_child(m, args, os.path.join(tmp, f"{m}.pt"))
        saved = {m: torch.load(os.path.join(tmp, f"{m}.pt"), weights_only=True) for m in methods if isinstance(res[m], dict)}
    first = next((r for r in res.values() if isinstance(r, dict)), None)
    if first is not None:
        print(f"parameters {first['d']:,}; torch threads {first['threads']}; {first['device_name']}\n")
    cuda = args.device.startswith("cuda")
    print("| way | s / round (median) | rounds timed | images / s | host RSS after setup MiB | host peak RSS MiB |"
          + (" GPU peak MiB |" if cuda else ""))
    print("|---|---|---|---|---|---|" + ("---|" if cuda else ""))
    for m in methods:
        r = res[m]
        if isinstance(r, str):
            print(f"| {m} | {r} |")
            continue
        gpu = f" {r['cuda_peak_mib']:.0f} |" if cuda else ""
        print(f"| {m} | {r['median_s']:.3f} | {len(r['times'])} | {imgs / r['median_s']:.0f} | "
              f"{r['setup_rss_mib']:.0f} | {r['peak_rss_mib']:.0f} |{gpu}")
    b, lp = res.get("batched"), res.get("loop")
    if isinstance(b, dict) and isinstance(lp, dict):
        print(f"\nloop / batched: {lp['median_s'] / b['median_s']:.2f}x (above 1: the batched trainer is faster)")
        rb, rl, start = saved["batched"]["rows"], saved["loop"]["rows"], saved["batched"]["start"]
        diff = float((rb - rl).abs().max())
        moved = float((rb - start).abs().max())
        print(f"agreement on {rb.shape[1]:,} sampled coordinates of each client's row: max |batched - loop| = "
              f"{diff:.2e} (largest update there {moved:.2e})")


if __name__ == "__main__":
    main()
