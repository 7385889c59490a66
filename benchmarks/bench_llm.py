"""The text workload: tokens per second of batched client training against a per-client
loop, and the full DiLoCo round's overhead as a fraction of its training time.

    python benchmarks/bench_llm.py                    # CPU, 4 / 16 / 64 clients (a few minutes on 2 cores)
    python benchmarks/bench_llm.py --quick            # fewer repeats and steps
    python benchmarks/bench_llm.py --device cuda      # the same figures on a GPU
    python benchmarks/bench_llm.py --width 128 --layers 4 --context 128   # a bigger model

Training: H inner AdamW steps of batch B windows of T bytes per client, so one round trains
n·H·B·T tokens. "batched" is redteam's trainer (``vmap(grad)`` over stacked client rows,
AdamW moments per client); "loop" is the plain way, one model and one ``torch.optim.AdamW``
per client, trained one after another. The round overhead is everything a DiLoCo round
does besides local training and the held-out evaluation — the pseudo-gradient's
compression (int8), chunking and hashing, simulated transport, decoding, the defense (norm
bound) and the outer Nesterov step — measured by timing the trainer inside real rounds.
Figures are medians after a warm-up. Nothing is asserted: this is a measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch

from redteam.federation.params import ParamSpec
from redteam.federation.partition import partition
from redteam.federation.state import ClientStates
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import ClientData
from redteam.workloads.text import TextLM
from _timing import median_time


def _clients(wl: TextLM, n: int, device: torch.device) -> tuple[Any, list[ClientData]]:
    ds = wl.load(0)
    parts = partition(ds.groups.numpy(), n, "by_group" if len(np.unique(ds.groups.numpy())) >= n else "iid",
                      np.random.default_rng(0), min_samples=1)
    return ds, [ClientData(ds.train_x[p].to(device), ds.train_y[p].to(device)) for p in parts]


def per_client_loop(wl: TextLM, flat: torch.Tensor, clients: list[ClientData], cfg: LocalTraining,
                    gen: torch.Generator) -> torch.Tensor:
    """One model and one torch.optim.AdamW per client, trained one after another."""
    out = []
    for c in clients:
        net = wl.build_model(torch.Generator().manual_seed(0)).to(flat.device)
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


def bench_training(wl: TextLM, n: int, cfg: LocalTraining, repeats: int, device: torch.device) -> dict[str, float]:
    _, clients = _clients(wl, n, device)
    model = wl.build_model(torch.Generator().manual_seed(0)).to(device)
    spec = ParamSpec.of(model)
    flat = spec.flatten(model).to(device)
    data = StackedData.stack(clients)
    tr = BatchedTrainer(wl, model, spec)
    gen = torch.Generator().manual_seed(0)
    idx = torch.arange(n, device=device)
    states = ClientStates(n, device)

    def batched() -> None:
        tr.train(flat, data, idx, cfg, gen, states=states)
        if device.type == "cuda":
            torch.cuda.synchronize()

    def looped() -> None:
        per_client_loop(wl, flat, clients, cfg, gen)
        if device.type == "cuda":
            torch.cuda.synchronize()

    tokens = n * cfg.steps * cfg.batch_size * wl.context
    t_b = median_time(batched, repeats)
    t_l = median_time(looped, max(1, repeats // 2))
    return {"n": n, "d": spec.dim, "batched_tok_s": tokens / t_b, "loop_tok_s": tokens / t_l, "speedup": t_l / t_b}


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
    args = ap.parse_args()
    device = torch.device(args.device)
    wl = TextLM(context=args.context, width=args.width, layers=args.layers, heads=args.heads, max_bytes=2_000_000)
    steps = 2 if args.quick else 5
    reps = 2 if args.quick else 5
    cfg = LocalTraining(steps=steps, batch_size=8, lr=0.003, optimizer="adamw")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {device}; model T={wl.context} "
          f"width={wl.width} layers={wl.layers} heads={wl.heads}\n")
    print(f"## Local training: {steps} inner AdamW steps x batch 8 x {wl.context} bytes per client\n")
    print("| clients | parameters | batched tokens/s | per-client loop tokens/s | batched / loop |")
    print("|---|---|---|---|---|")
    for n in (int(c) for c in args.clients.split(",")):
        r = bench_training(wl, n, cfg, reps, device)
        print(f"| {n} | {r['d']:,} | {r['batched_tok_s']:,.0f} | {r['loop_tok_s']:,.0f} | {r['speedup']:.2f}x |")

    n_round = 16
    print(f"\n## Full DiLoCo round, {n_round} clients, H = {steps * 2} (int8 pseudo-gradients, norm bound, Nesterov)\n")
    print("| round s | training s | evaluation s | overhead / training |")
    print("|---|---|---|---|")
    r = bench_round(wl, n_round, steps * 2, 8, 3 if args.quick else 6, args.device)
    print(f"| {r['round_s']:.3f} | {r['train_s']:.3f} | {r['eval_s']:.3f} | {r['overhead']:.1%} |")


if __name__ == "__main__":
    main()
