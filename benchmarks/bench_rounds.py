"""Rounds per second: batched (vmap) client training against a per-client Python loop,
and the full redteam round (training, compression, chunking + hashing, transport,
validation, merge, evaluation), plus bytes per round per codec.

    python benchmarks/bench_rounds.py            # all figures (a minute or two on 2 cores)
    python benchmarks/bench_rounds.py --quick    # fewer repeats

Figures are medians over repeats, after a warm-up. Local training is 10 steps of batch 16
(the setting the speed targets use). Nothing here is asserted: this is a measurement.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from redteam.federation.params import ParamSpec
from redteam.federation.partition import partition
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.types import ClientData
from redteam.workloads.digits import Digits
from redteam.workloads.synthetic import Synthetic
from _timing import median_time


def _clients(workload, n: int, seed: int = 0):
    ds = workload.load(seed)
    parts = partition(ds.train_y.numpy(), n, "iid", np.random.default_rng(seed), min_samples=1)
    return ds, [ClientData(ds.train_x[p], ds.train_y[p]) for p in parts]


def per_client_loop(workload, model, spec, flat, clients, cfg, gen):
    """The plain way: one model per client, trained one after another with torch.optim.SGD."""
    out = []
    for c in clients:
        net = workload.build_model(torch.Generator().manual_seed(0))
        torch.nn.utils.vector_to_parameters(flat.clone(), net.parameters())  # a copy: the parameters become views of it
        opt = torch.optim.SGD(net.parameters(), lr=cfg.lr)
        for _ in range(cfg.steps):
            idx = torch.randint(0, len(c), (cfg.batch_size,), generator=gen)
            loss = workload.loss(net(c.x[idx]), c.y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append(torch.nn.utils.parameters_to_vector(net.parameters()).detach())
    return torch.stack(out)


def bench_training(workload, n: int, repeats: int, loop: bool = True) -> dict:
    ds, clients = _clients(workload, n)
    model = workload.build_model(torch.Generator().manual_seed(0))
    spec = ParamSpec.of(model)
    flat = spec.flatten(model)
    data = StackedData.stack(clients)
    cfg = LocalTraining(steps=10, batch_size=16, lr=0.1)
    tr = BatchedTrainer(workload, model, spec)
    gen = torch.Generator().manual_seed(0)
    idx = torch.arange(n)
    batched = median_time(lambda: tr.train(flat, data, idx, cfg, gen), repeats)
    looped = median_time(lambda: per_client_loop(workload, model, spec, flat, clients, cfg, gen), max(1, repeats // 3)) if loop else float("nan")
    return {"n": n, "batched_ms": batched * 1e3, "loop_ms": looped * 1e3, "ratio": looped / batched}


def bench_full_round(workload_name: str, n: int, rounds: int, codec: str = "none", codec_params=None, **fed) -> dict:
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    doc = {
        "workload": {"name": workload_name},
        "federation": {"clients": n, "rounds": rounds, "partition": "iid", "min_samples": 1, **fed},
        "transport": {"codec": codec, "codec_params": codec_params or {}},
    }
    sc = parse_scenario(doc)
    f = Federation(sc, device="cpu")
    res = f.run()
    recs = res.records[1:]  # first round includes lazy initialisation
    return {
        "round_ms": statistics.median(r.wall_time_s for r in recs) * 1e3,
        "bytes_per_round": statistics.mean(r.bytes_on_wire for r in res.records),
        "final_accuracy": res.records[-1].accuracy,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    reps = 5 if args.quick else 15
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}\n")

    print("## Local training, 10 steps x batch 16 per client (one round of training)\n")
    print("| workload | clients | batched (vmap) ms | per-client loop ms | loop / batched |")
    print("|---|---|---|---|---|")
    for wl, name, n in ((Digits(), "digits", 10), (Digits(), "digits", 20), (Digits(), "digits", 100),
                        (Synthetic(samples=20000), "synthetic", 1000)):
        r = bench_training(wl, n, reps)
        print(f"| {name} | {n} | {r['batched_ms']:.1f} | {r['loop_ms']:.1f} | {r['ratio']:.1f}x |")

    print("\n## Full redteam round (train, compress, chunk+hash, transport, verify, decode, merge, eval)\n")
    print("| workload | clients | round ms | rounds/s |")
    print("|---|---|---|---|")
    for name, n in (("digits", 10), ("digits", 20), ("digits", 100)):
        r = bench_full_round(name, n, 8 if args.quick else 15)
        print(f"| {name} | {n} | {r['round_ms']:.1f} | {1e3 / r['round_ms']:.1f} |")
    r = bench_full_round("synthetic", 1000, 4 if args.quick else 8)
    print(f"| synthetic | 1000 | {r['round_ms']:.1f} | {1e3 / r['round_ms']:.1f} |")

    print("\n## Bytes on the wire per round by codec (digits, 20 clients, d = 4810; 30 rounds)\n")
    print("| codec | bytes / round | vs dense | final accuracy |")
    print("|---|---|---|---|")
    dense = None
    for codec, params in (("none", {}), ("fp16", {}), ("bf16", {}), ("int8", {}),
                          ("topk", {"fraction": 0.1}), ("randk", {"fraction": 0.1})):
        r = bench_full_round("digits", 20, 30, codec, params, partition="dirichlet", alpha=0.5, lr=0.2)
        dense = dense or r["bytes_per_round"]
        label = codec + (f"({params})" if params else "")
        print(f"| {label} | {r['bytes_per_round']:.0f} | {r['bytes_per_round'] / dense:.1%} | {r['final_accuracy']:.3f} |")


if __name__ == "__main__":
    main()
