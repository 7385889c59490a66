"""The federation of ``fl_federation.py`` as a Flower simulation (``run_simulation``, Ray backend).

One simulation per process (as a user's script runs it): a ``ServerApp`` with Flower's
``FedAvg`` (every node trains every round; aggregation weighted by the clients'
``num-examples``, i.e. by sample count) and a ``ClientApp`` whose node ``partition-id`` = c
trains client c of the federation file: the same initial weights, the same rows, the same
minibatches of the same round, plain SGD (``fl_federation.local_train``).

Times come from the server-side ``evaluate_fn``, which ``FedAvg`` calls on the initial
model and after every round, in this process: round r = t(evaluation r) − t(evaluation r−1)
(the evaluation itself is ~0.1 ms). Flower evaluates the initial model before it starts
Ray, so round 1 holds Ray's start-up and the actors' creation: "start-up" is the time from
calling ``run_simulation`` to the end of round 1, and rounds 2..R are the steady ones.

    python flower_sim.py --federation FED.npz [--rounds R] [--client-cpus 1] [--json OUT]

This file runs in the reference environment (``setup.sh``); it never imports redteam.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

import fl_federation as F  # noqa: E402


@functools.lru_cache(maxsize=2)
def federation(path: str) -> F.Fed:
    return F.load(path)  # once per actor process


def state_dict(fed: F.Fed, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    m = F.MLP(fed.hidden)
    F.set_flat(m, flat)
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


# ------------------------------------------------------------------ clients (Ray actors)
client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    cfg = msg.content["config"]
    fed = federation(str(cfg["federation"]))
    c = int(context.node_config["partition-id"])
    rnd = int(cfg["server-round"]) - 1
    torch.set_num_threads(1)
    model = F.MLP(fed.hidden)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = fed.client(c)
    loss = F.local_train(model, x, y, fed.batches[rnd, :, c], fed.lr)
    return Message(content=RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({"train_loss": loss, "num-examples": int(fed.sizes[c])}),
    }), reply_to=msg)


# ------------------------------------------------------------------ server (this process)
RUN: dict = {}
EVALS: list[tuple[float, float]] = []  # (perf_counter, accuracy) per evaluate_fn call
REPLIES: list[int] = []  # training replies per round (a client that raised sends none)


def train_metrics(records: list[RecordDict], key: str) -> MetricRecord:
    from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

    REPLIES.append(len(records))
    return aggregate_metricrecords(records, key)


def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    fed = federation(RUN["federation"])
    model = F.MLP(fed.hidden)
    model.load_state_dict(arrays.to_torch_state_dict())
    acc = F.accuracy(model, fed.x_test, fed.y_test)
    EVALS.append((time.perf_counter(), acc))
    return MetricRecord({"accuracy": acc})


server_app = ServerApp()


@server_app.main()
def main_server(grid: Grid, context: Context) -> None:
    fed = federation(RUN["federation"])
    n = fed.clients
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n,
                      train_metrics_aggr_fn=train_metrics)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(state_dict(fed, fed.init)), num_rounds=RUN["rounds"],
                   train_config=ConfigRecord({"federation": RUN["federation"]}), evaluate_fn=evaluate)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--federation", required=True, help="the .npz bench_vs_flower.py --export wrote")
    ap.add_argument("--rounds", type=int, default=0, help="rounds (default: every round in the file)")
    ap.add_argument("--client-cpus", type=float, default=1.0, help="Ray CPUs per ClientApp actor")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    import flwr
    from flwr.simulation import run_simulation

    # the apps as attributes of an importable module (not __main__), so that Ray's actors,
    # which inherit PYTHONPATH, can unpickle them
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    import flower_sim as mod

    path = os.path.abspath(args.federation)
    fed = federation(path)
    rounds = args.rounds or fed.rounds
    mod.RUN.update(federation=path, rounds=rounds)
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    t_call = time.perf_counter()
    run_simulation(server_app=mod.server_app, client_app=mod.client_app, num_supernodes=fed.clients,
                   backend_name="ray",
                   backend_config={"client_resources": {"num_cpus": args.client_cpus, "num_gpus": 0.0}})
    t_end = time.perf_counter()
    EVALS, REPLIES = mod.EVALS, mod.REPLIES
    if len(REPLIES) != rounds or min(REPLIES, default=0) < fed.clients:
        sys.exit(f"flower_sim: training replies per round {REPLIES}, expected {fed.clients} in each of {rounds} "
                 "rounds (a client failed: see the log above)")
    times = [t for t, _ in EVALS]
    out = {"mode": "flower", "clients": fed.clients, "rounds": rounds, "flwr": flwr.__version__,
           "torch": torch.__version__, "startup_s": times[1] - t_call if len(times) > 1 else None,
           "round_s": [b - a for a, b in zip(times, times[1:])], "acc": [a for _, a in EVALS[1:]],
           "acc_initial": EVALS[0][1] if EVALS else None, "teardown_s": t_end - times[-1] if times else None,
           "load_before": load0, "load_after": os.getloadavg()[0]}
    if len(out["round_s"]) != rounds:
        sys.exit(f"flower_sim: {len(out['round_s'])} of {rounds} rounds evaluated")
    print(f"flower: {fed.clients} clients, steady round median "
          f"{sorted(out['round_s'][1:] or out['round_s'])[len(out['round_s'][1:]) // 2] * 1e3:.1f} ms, "
          f"accuracy after {rounds} rounds {out['acc'][-1]:.4f}", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"results": [out]}, fh)


if __name__ == "__main__":
    main()
