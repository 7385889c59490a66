"""A tiny Flower app for the [flower] regime's tests (redteam.integrations.flower.protocol): a linear
classifier of 3 classes on 8 synthetic features, every draw from the run's seed. ``CALLS`` lists
the AppSpec of every factory call in this process."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from redteam.integrations.flower import ScoredApp, poison

CALLS: list[Any] = []
D, K = 8, 3


def _data(seed: int, clients: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(D, K))
    x = rng.normal(size=(600, D)).astype(np.float32)
    y = (x @ w).argmax(1).astype(np.int64)
    return x[:450], y[:450], np.array_split(rng.permutation(450), clients), x[450:], y[450:]


def scored(spec: Any) -> ScoredApp:
    CALLS.append(spec)
    if spec.params.get("broken_evaluate"):
        return ScoredApp(client_app=lambda mods: ClientApp(mods=list(mods)), initial_arrays=_init(spec.seed),
                         evaluate=lambda arrays: {"accuracy": 0.5})
    x, y, parts, xt, yt = _data(spec.seed, spec.clients)
    steps = int(spec.params.get("local_steps", 5))

    def client_app(mods: Any) -> ClientApp:
        app = ClientApp(mods=list(mods))

        @app.train()
        def train(msg: Message, context: Context) -> Message:
            pid = int(context.node_config["partition-id"])
            rnd = int(msg.content["config"]["server-round"])
            if spec.params.get("fail_partition") == pid:
                raise RuntimeError(f"partition {pid} fails on purpose")
            px, py = poison(context, x[parts[pid]], y[parts[pid]])
            model = torch.nn.Linear(D, K)
            model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            gen = np.random.default_rng([spec.seed, pid, rnd])
            tx, ty = torch.from_numpy(np.asarray(px)), torch.from_numpy(np.asarray(py))
            for _ in range(steps):
                idx = torch.from_numpy(gen.integers(0, len(ty), size=16))
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(tx[idx]), ty[idx]).backward()
                opt.step()
            return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                               "metrics": MetricRecord({"num-examples": len(ty)})}), reply_to=msg)

        return app

    def evaluate(arrays: ArrayRecord) -> dict[str, float]:
        model = torch.nn.Linear(D, K)
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            out = model(torch.from_numpy(xt))
        return {"accuracy": float((out.argmax(1).numpy() == yt).mean()),
                "loss": float(torch.nn.functional.cross_entropy(out, torch.from_numpy(yt)))}

    return ScoredApp(client_app=client_app, initial_arrays=_init(spec.seed), evaluate=evaluate,
                     chance_accuracy=float(np.bincount(yt).max() / len(yt)))


def _init(seed: int) -> ArrayRecord:
    torch.manual_seed(seed)
    return ArrayRecord(torch.nn.Linear(D, K).state_dict())


NOT_A_FACTORY = 3


def wrong_type(spec: Any) -> dict:
    return {"client_app": None}
