"""A small Flower app in the shape of Flower's PyTorch quickstart, on data that ships with
scikit-learn (the 8×8 digits; nothing is downloaded), with redteam's attacks and defenses plugged
in where a Flower user would put them:

* the ClientApp's ``mods`` carry :class:`~redteam.integrations.flower.AttackMod` (the chosen
  clients send the attack's update; a data attack poisons their training set through
  :func:`~redteam.integrations.flower.poison`);
* the ServerApp's strategy is redteam's :class:`~redteam.integrations.flower.DefenseStrategy` or
  any Flower strategy (Flower's own ``FedTrimmedAvg`` …), wrapped in
  :class:`~redteam.integrations.flower.ColludingAttack` for an attack that crafts from every
  honest update of the round (ALIE).

:func:`scored` is the app as redteam's matrix scores it (``[flower] app = "quickstart_app:scored"`` in
``scenario.toml`` next to this file: ``redteam matrix examples/flower_quickstart/scenario.toml``).
:func:`run` runs one cell by hand (attack × defense × seed) in Flower's simulation engine and returns
the global model's test accuracy after every round; ``compare.py`` runs the side-by-side table that
way. The partition, the initial model and every client's minibatches come from the seed alone, so
a cell's no-attack baseline and its attacked run share them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from redteam.integrations.flower import AttackMod, ColludingAttack, poison


# ------------------------------------------------------------------ model and data
class Net(torch.nn.Module):
    """An MLP 64-64-10 (the digits are 8×8 grey images; the size of redteam's own digits workload)."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, hidden)
        self.fc2 = torch.nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@dataclass(frozen=True)
class Setup:
    """One federation: ``clients`` partitions of the digits' training split (Dirichlet(``alpha``)
    label skew drawn from ``seed``), ``local_steps`` SGD steps of ``batch`` at ``lr`` per round."""

    clients: int = 10
    rounds: int = 5
    seed: int = 0
    alpha: float = 1.0
    local_steps: int = 10
    batch: int = 16
    lr: float = 0.1
    test_fraction: float = 0.25


@dataclass
class Data:
    x: np.ndarray
    y: np.ndarray
    parts: list[np.ndarray]
    x_test: np.ndarray
    y_test: np.ndarray


_DATA: dict[Setup, Data] = {}


def load(setup: Setup) -> Data:
    """The digits split and partitioned for ``setup`` (cached per process)."""
    if setup in _DATA:
        return _DATA[setup]
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    rng = np.random.default_rng(setup.seed)
    order = rng.permutation(len(y))
    n_test = int(round(setup.test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    xt, yt = x[train], y[train]
    parts: list[list[int]] = [[] for _ in range(setup.clients)]
    for c in range(10):  # Dirichlet label skew over positions in the training split
        idx = np.flatnonzero(yt == c)
        rng.shuffle(idx)
        share = rng.dirichlet([setup.alpha] * setup.clients)
        cuts = (np.cumsum(share) * len(idx)).astype(int)[:-1]
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].extend(chunk.tolist())
    for k in range(setup.clients):  # a starved client gets two samples from the largest
        if len(parts[k]) < 2:
            big = max(range(setup.clients), key=lambda j: len(parts[j]))
            parts[k].extend(parts[big][-2:])
            del parts[big][-2:]
    data = Data(xt, yt, [np.asarray(sorted(p), dtype=np.int64) for p in parts], x[test], y[test])
    _DATA[setup] = data
    return data


def initial_model(setup: Setup) -> Net:
    torch.manual_seed(setup.seed)
    return Net()


def accuracy(model: Net, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        out = model(torch.from_numpy(x))
    return float((out.argmax(1).numpy() == y).mean())


# ------------------------------------------------------------------ ClientApp
def make_client_app(setup: Setup, mods: list[Any]) -> ClientApp:
    """The ClientApp: partition ``partition-id`` trains ``local_steps`` SGD steps on its share (its
    minibatches drawn from the seed, the partition and the round), with ``mods`` around it."""
    app = ClientApp(mods=list(mods))

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        data = load(setup)
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        x, y = data.x[data.parts[pid]], data.y[data.parts[pid]]
        x, y = poison(context, x, y)  # redteam: a data attack's poisoned set on a chosen client
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=setup.lr)
        gen = np.random.default_rng([setup.seed, pid, rnd])
        tx, ty = torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(y))
        loss = torch.zeros(())
        for _ in range(setup.local_steps):
            idx = torch.from_numpy(gen.integers(0, len(ty), size=setup.batch))
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(tx[idx]), ty[idx])
            loss.backward()
            opt.step()
        return Message(content=RecordDict({
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"train_loss": float(loss.detach()), "num-examples": len(ty)}),
        }), reply_to=msg)

    return app


# ------------------------------------------------------------------ ServerApp
@dataclass
class Outcome:
    """What one cell's server saw: test accuracy after every round (index 0: the initial model),
    when each evaluation ended, and the strategy it ran (its ``history`` for redteam's)."""

    accuracy: list[float] = field(default_factory=list)
    strategy: Any = None
    times: list[float] = field(default_factory=list)  # time.perf_counter() at each evaluation


def make_server_app(setup: Setup, strategy: Any, outcome: Outcome) -> ServerApp:
    app = ServerApp()

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        data = load(setup)
        acc = accuracy(model, data.x_test, data.y_test)
        outcome.accuracy.append(acc)
        outcome.times.append(time.perf_counter())
        return MetricRecord({"accuracy": acc})

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        outcome.strategy = strategy
        strategy.start(grid=grid, initial_arrays=ArrayRecord(initial_model(setup).state_dict()),
                       num_rounds=setup.rounds, train_config=ConfigRecord(), evaluate_fn=evaluate)

    return app


# ------------------------------------------------------------------ scored by redteam's matrix
#: the [flower].params this app reads (Setup's fields besides clients, rounds and seed)
PARAMS = ("alpha", "local_steps", "batch", "lr", "test_fraction")


def scored(spec: Any) -> Any:
    """The app for ``redteam matrix`` (redteam.integrations.flower.protocol): ``spec.clients``
    partitions, ``spec.rounds`` rounds, everything drawn from ``spec.seed``; ``spec.params`` may set
    :data:`PARAMS`."""
    from redteam.integrations.flower import ScoredApp

    unknown = sorted(set(spec.params) - set(PARAMS))
    if unknown:
        raise ValueError(f"quickstart_app: [flower].params {unknown[0]!r} is not a setting of this app "
                         f"(it reads {', '.join(PARAMS)})")
    setup = Setup(clients=spec.clients, rounds=spec.rounds, seed=spec.seed, **dict(spec.params))
    data = load(setup)

    def evaluate(arrays: ArrayRecord) -> dict[str, float]:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            out = model(torch.from_numpy(data.x_test))
            loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(data.y_test))
        return {"accuracy": float((out.argmax(1).numpy() == data.y_test).mean()), "loss": float(loss)}

    return ScoredApp(client_app=lambda mods: make_client_app(setup, mods),
                     initial_arrays=ArrayRecord(initial_model(setup).state_dict()), evaluate=evaluate,
                     chance_accuracy=float(np.bincount(data.y_test).max() / len(data.y_test)))


# ------------------------------------------------------------------ one cell
def strategy_for(defense: str, setup: Setup, malicious: int, **params: Any) -> Any:
    """``defense``: ``"flower:FedTrimmedAvg"`` (Flower's own, ``params`` its arguments) or a redteam
    registry name (``params`` the defense's), every node training and none evaluating."""
    n = setup.clients
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
    if defense.startswith("flower:"):
        import flwr.serverapp.strategy as fs

        return getattr(fs, defense.split(":", 1)[1])(**common, **params)
    from redteam.integrations.flower import DefenseStrategy

    return DefenseStrategy(defense, params, malicious=malicious, seed=setup.seed, **common)


def run(setup: Setup, defense: str, defense_params: dict[str, Any] | None = None, attack: str = "none",
        attack_params: dict[str, Any] | None = None, malicious: tuple[int, ...] = (),
        colluding: bool = False, ray_cpus: int = 2) -> Outcome:
    """One cell in Flower's simulation engine (Ray): ``attack`` on partitions ``malicious`` (through
    :class:`AttackMod`, or :class:`ColludingAttack` on the server when ``colluding``) against
    ``defense``, on a local Ray instance of ``ray_cpus`` CPUs (one ClientApp actor per CPU).
    Returns the :class:`Outcome`."""
    from flwr.simulation import run_simulation

    here = os.path.dirname(os.path.abspath(__file__))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if here not in paths:  # Ray's workers import this module to unpickle the apps
        os.environ["PYTHONPATH"] = os.pathsep.join([here] + [p for p in paths if p])
    strategy = strategy_for(defense, setup, len(malicious), **(defense_params or {}))
    mods: list[Callable] = []
    if attack != "none":
        mods.append(AttackMod(attack, attack_params or {}, malicious=malicious, seed=setup.seed, colluding=colluding))
        if colluding:
            strategy = ColludingAttack(strategy, attack, attack_params or {}, malicious=malicious, seed=setup.seed)
    outcome = Outcome()
    run_simulation(server_app=make_server_app(setup, strategy, outcome),
                   client_app=make_client_app(setup, mods), num_supernodes=setup.clients, backend_name="ray",
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": int(ray_cpus), "include_dashboard": False}})
    if len(outcome.accuracy) != setup.rounds + 1:
        raise RuntimeError(f"the simulation evaluated {len(outcome.accuracy)} times, expected {setup.rounds + 1} "
                           "(a client failed: see Flower's log above)")
    return outcome
