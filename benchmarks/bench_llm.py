"""The text workload: tokens per second of batched client training against a per-client
loop and against one shared model, and the full DiLoCo round's overhead as a fraction of
its training time.

    python benchmarks/bench_llm.py                    # CPU, 4 / 16 / 64 clients, 1 thread (several minutes on 2 cores)
    python benchmarks/bench_llm.py --quick            # fewer repeats and steps
    python benchmarks/bench_llm.py --threads 0        # torch's default thread count
    python benchmarks/bench_llm.py --against HEAD~1   # also the trainer and model of a git revision ("before")
    python benchmarks/bench_llm.py --device cuda      # the same figures on a GPU
    python benchmarks/bench_llm.py --width 128 --layers 4 --context 128   # a bigger model

Training: H inner AdamW steps of batch B windows of T bytes per client, so one call trains
n·H·B·T tokens. Three ways of training them:

* "batched": redteam's trainer (``vmap(grad)`` over stacked client rows, AdamW moments per client);
* "loop": the plain way, one model and one ``torch.optim.AdamW`` per client, trained one after another;
* "shared": the floor, one model and one ``torch.optim.AdamW`` on all clients' tokens as one batch
  of n·B windows (what the same tokens cost when no client has its own parameters).

``--against REV`` adds the batched trainer and the per-client loop of revision REV
(``redteam/federation/training.py`` and ``redteam/workloads/text.py`` as they were there, loaded
beside the working tree's), so that a change is timed before and after in one process.

The variants are interleaved: after one warm-up call each, every pass calls each variant once,
the order rotating from pass to pass, so that a change of the machine's load hits all alike.
Each call is timed in CPU time (``time.process_time``: unaffected by other processes taking the
cores, but it counts threads that spin while they wait) and in wall time; on CPU the CPU-time
figure is the headline (on a GPU, wall time). The table gives the median over the passes with
the spread (min–max) and the load average around each client count. One thread by default, the
figure least disturbed on a shared machine.

The round overhead is everything a DiLoCo round does besides local training and the held-out
evaluation — the pseudo-gradient's compression (int8), chunking and hashing, simulated
transport, decoding, the defense (norm bound) and the outer Nesterov step — measured by timing
the trainer inside real rounds. Nothing is asserted: this is a measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from redteam.federation.params import ParamSpec
from redteam.federation.partition import partition
from redteam.federation.state import ClientStates
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import ClientData
from redteam.workloads.text import TextLM
from _timing import cpu_name

ROOT = Path(__file__).resolve().parents[1]


def _clients(wl: TextLM, n: int, device: torch.device) -> tuple[Any, list[ClientData]]:
    ds = wl.load(0)
    parts = partition(ds.groups.numpy(), n, "by_group" if len(np.unique(ds.groups.numpy())) >= n else "iid",
                      np.random.default_rng(0), min_samples=1)
    return ds, [ClientData(ds.train_x[p].to(device), ds.train_y[p].to(device)) for p in parts]


def at_revision(rev: str) -> tuple[Any, Any]:
    """``(training, text)``: the modules ``redteam.federation.training`` and
    ``redteam.workloads.text`` as they were at git revision ``rev``, loaded under other names
    beside the working tree's (their relative imports resolve to the working tree's package)."""
    out = []
    for rel, pkg in (("redteam/federation/training.py", "redteam.federation"),
                     ("redteam/workloads/text.py", "redteam.workloads")):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], capture_output=True, text=True,
                             check=True).stdout
        name = f"{pkg}._at_{rev.replace('~', '_').replace('^', '_').replace('.', '_')}_{Path(rel).stem}"
        mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
        mod.__package__ = pkg
        sys.modules[name] = mod
        exec(compile(src, f"{rev}:{rel}", "exec"), mod.__dict__)
        out.append(mod)
    return out[0], out[1]


def per_client_loop(build: Callable[[], torch.nn.Module], wl: TextLM, flat: torch.Tensor, clients: list[ClientData],
                    cfg: LocalTraining, gen: torch.Generator) -> torch.Tensor:
    """One model and one torch.optim.AdamW per client, trained one after another."""
    out = []
    for c in clients:
        net = build().to(flat.device)
        torch.nn.utils.vector_to_parameters(flat.clone(), net.parameters())  # a copy: the parameters become views of it
        opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        for _ in range(cfg.steps):
            idx = torch.randint(0, len(c), (cfg.batch_size,), generator=gen).to(flat.device)
            loss = wl.loss(net(c.x[idx]), c.y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append(torch.nn.utils.parameters_to_vector(net.parameters()).detach())
    return torch.stack(out)


def shared_model(build: Callable[[], torch.nn.Module], wl: TextLM, flat: torch.Tensor, data: StackedData, n: int,
                 cfg: LocalTraining, gen: torch.Generator) -> torch.Tensor:
    """The floor: one model and one torch.optim.AdamW, each step on n·B windows of the pooled data."""
    net = build().to(flat.device)
    torch.nn.utils.vector_to_parameters(flat.clone(), net.parameters())
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    for _ in range(cfg.steps):
        idx = torch.randint(0, len(data.x), (n * cfg.batch_size,), generator=gen).to(flat.device)
        loss = wl.loss(net(data.x[idx]), data.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.nn.utils.parameters_to_vector(net.parameters()).detach()


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None]) -> dict[str, dict]:
    """Per variant: CPU and wall seconds of ``repeats`` calls, the variants called in turn (one
    warm-up call each first; pass r starts at variant r mod k), and the load averages seen."""
    names = list(fns)
    for f in fns.values():
        f()
        sync()
    out: dict[str, dict] = {k: {"cpu": [], "wall": []} for k in names}
    loads = [os.getloadavg()[0]]
    for r in range(repeats):
        for k in names[r % len(names):] + names[:r % len(names)]:
            c, w = time.process_time(), time.perf_counter()
            fns[k]()
            sync()
            out[k]["wall"].append(time.perf_counter() - w)
            out[k]["cpu"].append(time.process_time() - c)
        loads.append(os.getloadavg()[0])
    for v in out.values():
        v["loads"] = loads
    return out


def bench_training(wl: TextLM, n: int, cfg: LocalTraining, repeats: int, device: torch.device,
                   against: tuple[str, Any, Any] | None = None) -> dict[str, Any]:
    _, clients = _clients(wl, n, device)

    def build() -> torch.nn.Module:
        return wl.build_model(torch.Generator().manual_seed(0))

    model = build().to(device)
    spec = ParamSpec.of(model)
    flat = spec.flatten(model).to(device)
    data = StackedData.stack(clients)
    gen = torch.Generator().manual_seed(0)
    idx = torch.arange(n, device=device)
    tr, states = BatchedTrainer(wl, model, spec), ClientStates(n, device)
    fns: dict[str, Callable[[], object]] = {
        "batched": lambda: tr.train(flat, data, idx, cfg, gen, states=states),
        "loop": lambda: per_client_loop(build, wl, flat, clients, cfg, gen),
        "shared": lambda: shared_model(build, wl, flat, data, n, cfg, gen),
    }
    if against is not None:
        rev, old_training, old_text = against

        def build_old() -> torch.nn.Module:
            return old_text.ByteTransformer(wl.context, wl.width, wl.layers, wl.heads).init_(
                torch.Generator().manual_seed(0))

        old_model = build_old().to(device)
        old_tr, old_states = old_training.BatchedTrainer(wl, old_model, spec), ClientStates(n, device)
        fns[f"batched @ {rev}"] = lambda: old_tr.train(flat, data, idx, cfg, gen, states=old_states)
        fns[f"loop @ {rev}"] = lambda: per_client_loop(build_old, wl, flat, clients, cfg, gen)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = interleaved(fns, repeats, sync)
    return {"n": n, "d": spec.dim, "tokens": n * cfg.steps * cfg.batch_size * wl.context, "times": times}


def bench_round(wl: TextLM, n: int, steps: int, batch: int, rounds: int, device: str) -> dict[str, float]:
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    sc = parse_scenario({
        "workload": {"name": "text", **{k: getattr(wl, k) for k in ("context", "width", "layers", "heads", "max_bytes")}},
        "federation": {"clients": n, "rounds": rounds, "partition": "by_group", "local_steps": steps,
                       "batch_size": batch, "lr": 0.003, "local_optimizer": "adamw", "server_optimizer": "nesterov"},
        "transport": {"codec": "int8", "chunk_size": 65536},
        "defense": {"name": "norm_bound", "multiplier": 2.0, "mode": "reject"},
    })
    fed = Federation(sc, device=device)
    spent: dict[str, float] = {"train": 0.0, "eval": 0.0}
    per_round: list[tuple[float, float]] = []
    train, evaluate = fed.trainer.train, fed.trainer.evaluate
    sync = torch.cuda.synchronize if fed.device.type == "cuda" else (lambda: None)

    def timed(kind: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            sync()
            t = time.perf_counter()
            out = fn(*a, **k)
            sync()
            spent[kind] += time.perf_counter() - t
            return out
        return wrapper

    fed.trainer.train = timed("train", train)  # type: ignore[method-assign]
    fed.trainer.evaluate = timed("eval", evaluate)  # type: ignore[method-assign]

    def on_round(rec: Any) -> None:
        per_round.append((rec.wall_time_s, spent["train"], spent["eval"]))
        spent["train"] = spent["eval"] = 0.0

    fed.run(on_round)
    rest = per_round[1:]  # the first round includes lazy initialisation
    wall = statistics.median(w for w, _, _ in rest)
    tr = statistics.median(t for _, t, _ in rest)
    ev = statistics.median(e for _, _, e in rest)
    return {"round_s": wall, "train_s": tr, "eval_s": ev, "overhead": (wall - tr - ev) / tr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--clients", default="4,16,64")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=0, help="timed passes per client count (default 7, --quick 3)")
    ap.add_argument("--against", default="", metavar="REV",
                    help="also time the batched trainer and the per-client loop of this git revision")
    ap.add_argument("--no-round", action="store_true", help="skip the full-round overhead")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    wl = TextLM(context=args.context, width=args.width, layers=args.layers, heads=args.heads, max_bytes=2_000_000)
    steps = 2 if args.quick else 5
    reps = args.repeats or (3 if args.quick else 7)
    cfg = LocalTraining(steps=steps, batch_size=8, lr=0.003, optimizer="adamw")
    against = (args.against, *at_revision(args.against)) if args.against else None
    load = os.getloadavg()
    clock = "wall" if device.type == "cuda" else "cpu"
    print(f"CPU: {cpu_name()} ({os.cpu_count()} logical cores); torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, device {device}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"model T={wl.context} width={wl.width} layers={wl.layers} heads={wl.heads}\n")
    print(f"## Local training: {steps} inner AdamW steps x batch 8 x {wl.context} bytes per client\n")
    print(f"Tokens per {'second' if clock == 'wall' else 'CPU second'}: median of {reps} interleaved calls "
          "[min–max]; wall-clock tokens/s (median) beside; 'x loop' = the loop's median time / the variant's.\n")
    print(f"| clients | parameters | variant | tokens / {'s' if clock == 'wall' else 'CPU s'} | wall tokens / s "
          "| x loop | load (min–max) |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(c) for c in args.clients.split(",")):
        r = bench_training(wl, n, cfg, reps, device, against)
        loop = statistics.median(r["times"]["loop"][clock])
        for k, t in r["times"].items():
            med = statistics.median(t[clock])
            rate = f"{r['tokens'] / med:,.0f} [{r['tokens'] / max(t[clock]):,.0f}–{r['tokens'] / min(t[clock]):,.0f}]"
            loads = t["loads"]
            print(f"| {n} | {r['d']:,} | {k} | {rate} | {r['tokens'] / statistics.median(t['wall']):,.0f} | "
                  f"{loop / med:.2f} | {min(loads):.1f}–{max(loads):.1f} |", flush=True)
    if args.no_round:
        return
    n_round = 16
    print(f"\n## Full DiLoCo round, {n_round} clients, H = {steps * 2} (int8 pseudo-gradients, norm bound, Nesterov)\n")
    print("| round s | training s | evaluation s | overhead / training |")
    print("|---|---|---|---|")
    r = bench_round(wl, n_round, steps * 2, 8, 3 if args.quick else 6, args.device)
    print(f"| {r['round_s']:.3f} | {r['train_s']:.3f} | {r['eval_s']:.3f} | {r['overhead']:.1%} |")


if __name__ == "__main__":
    main()
