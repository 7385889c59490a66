"""One federation, trained in plain torch two ways: a per-client loop and one ``vmap`` program.

The federation is read from a file that ``benchmarks/bench_vs_flower.py`` writes from
redteam's own ``Federation`` (``--export``): the clients' training rows (pooled, with
per-client offsets and sizes), the test split, the initial flat parameters, the learning
rate and every minibatch of every round as drawn by redteam's trainer. So the three
implementations (redteam, this file, ``flower_sim.py``) start from the same weights, train
on the same data split in the same minibatch order, and average with the same weights
(FedAvg by sample count); their accuracy curves agree to float rounding, which
``bench_vs_flower.py`` checks and prints.

* ``loop``: one ``nn.Module`` per client, global weights copied in, ``torch.optim.SGD``
  (no momentum) over the client's minibatches, the flat parameters averaged;
* ``vmap``: every client at once on stacked parameters, ``vmap(grad(loss))`` over
  ``functional_call``, one batched SGD update per local step.

A round's wall time covers everything the round does: gathering the batches, every
client's training, the weighted mean and the evaluation of the new global model on the
test split.

    python fl_federation.py --federation FED.npz [--modes loop vmap] [--rounds R] [--json OUT]

This file runs in the reference environment (``setup.sh``); it never imports redteam.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap


@dataclass(frozen=True)
class Fed:
    x: torch.Tensor        # (N, 64) float32, client c owns rows offsets[c] : offsets[c] + sizes[c]
    y: torch.Tensor        # (N,) int64
    offsets: torch.Tensor  # (n,) int64
    sizes: torch.Tensor    # (n,) int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    init: torch.Tensor     # (d,) float32: fc1.weight, fc1.bias, fc2.weight, fc2.bias
    hidden: int
    lr: float
    batches: torch.Tensor  # (R, steps, n, B) int64, positions inside each client's rows

    @property
    def clients(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def rounds(self) -> int:
        return int(self.batches.shape[0])

    @property
    def weights(self) -> torch.Tensor:
        """FedAvg's weights: each client's share of the training samples (float32)."""
        return (self.sizes.to(torch.float64) / self.sizes.sum()).to(torch.float32)

    def client(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = int(self.offsets[c]), int(self.offsets[c] + self.sizes[c])
        return self.x[a:b], self.y[a:b]


def load(path: str) -> Fed:
    z = np.load(path, allow_pickle=False)  # arrays only: never unpickle a file
    t = torch.from_numpy
    return Fed(x=t(z["x"]), y=t(z["y"]), offsets=t(z["offsets"]), sizes=t(z["sizes"]), x_test=t(z["x_test"]),
               y_test=t(z["y_test"]), init=t(z["init"]), hidden=int(z["hidden"]), lr=float(z["lr"]),
               batches=t(z["batches"]))


class MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def set_flat(model: nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat.detach().clone(), model.parameters())


def get_flat(model: nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def local_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batches: torch.Tensor, lr: float) -> float:
    """Plain SGD over the given minibatches ``(steps, B)`` of (x, y); the last batch's loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss = torch.zeros(())
    for b in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(x[b]), y[b])
        loss.backward()
        opt.step()
    return float(loss.detach())


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model(x).argmax(1) == y).to(torch.float64).mean())


def run_loop(fed: Fed, rounds: int) -> dict:
    t0 = time.perf_counter()
    glob = MLP(fed.hidden)
    set_flat(glob, fed.init)
    models = [MLP(fed.hidden) for _ in range(fed.clients)]
    data = [fed.client(c) for c in range(fed.clients)]
    w = fed.weights
    setup_s = time.perf_counter() - t0
    round_s, acc = [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        g = get_flat(glob)
        rows = []
        for c, m in enumerate(models):
            set_flat(m, g)
            local_train(m, data[c][0], data[c][1], fed.batches[r, :, c], fed.lr)
            rows.append(get_flat(m))
        set_flat(glob, (w[:, None] * torch.stack(rows)).sum(0))
        acc.append(accuracy(glob, fed.x_test, fed.y_test))
        round_s.append(time.perf_counter() - t0)
    return {"setup_s": setup_s, "round_s": round_s, "acc": acc}


def run_vmap(fed: Fed, rounds: int) -> dict:
    t0 = time.perf_counter()
    base = MLP(fed.hidden)
    names = [k for k, _ in base.named_parameters()]
    shapes = [p.shape for _, p in base.named_parameters()]
    numels = [p.numel() for _, p in base.named_parameters()]

    def unflat(flat: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(flat, numels, dim=-1)
        return {k: p.reshape(*flat.shape[:-1], *s) for k, p, s in zip(names, parts, shapes)}

    def loss(flat: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(base, unflat(flat), (xb,)), yb)

    grads = vmap(grad(loss))
    w = fed.weights
    n = fed.clients
    glob = fed.init.clone()
    setup_s = time.perf_counter() - t0
    round_s, acc = [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        params = glob.unsqueeze(0).expand(n, -1).clone()
        for s in range(fed.batches.shape[1]):
            idx = fed.offsets[:, None] + fed.batches[r, s]  # (n, B) rows of the pooled data
            params = params - fed.lr * grads(params, fed.x[idx], fed.y[idx])
        glob = (w[:, None] * params).sum(0)
        with torch.no_grad():
            out = functional_call(base, unflat(glob), (fed.x_test,))
            acc.append(float((out.argmax(1) == fed.y_test).to(torch.float64).mean()))
        round_s.append(time.perf_counter() - t0)
    return {"setup_s": setup_s, "round_s": round_s, "acc": acc}


RUNNERS = {"loop": run_loop, "vmap": run_vmap}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--federation", required=True, help="the .npz bench_vs_flower.py --export wrote")
    ap.add_argument("--modes", nargs="+", default=["loop", "vmap"], choices=sorted(RUNNERS))
    ap.add_argument("--rounds", type=int, default=0, help="rounds to run (default: every round in the file)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    fed = load(args.federation)
    rounds = args.rounds or fed.rounds
    if not 1 <= rounds <= fed.rounds:
        ap.error(f"--rounds = {rounds}: the file holds batches for {fed.rounds} rounds")
    out = []
    for mode in args.modes:
        load0 = os.getloadavg()[0]
        r = RUNNERS[mode](fed, rounds)
        r.update(mode=mode, clients=fed.clients, rounds=rounds, load_before=load0, load_after=os.getloadavg()[0],
                 torch=torch.__version__, threads=torch.get_num_threads())
        out.append(r)
        steady = sorted(r["round_s"][1:]) or r["round_s"]
        print(f"{mode}: {fed.clients} clients, round median {steady[len(steady) // 2] * 1e3:.1f} ms, "
              f"accuracy after {rounds} rounds {r['acc'][-1]:.4f}", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": out}, fh)


if __name__ == "__main__":
    main()
