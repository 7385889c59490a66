"""One run of a ``[flower]`` scenario: a user's Flower app, attacked and defended, recorded as
redteam records its own runs.

:class:`FlowerRun` is the Flower regime's run object (:func:`redteam.federation.regimes.make_run`
builds it for a scenario with ``[flower]``). It

1. calls the app's factory (:mod:`.protocol`) with the run's clients, rounds and seed (a matrix
   cell's attacked run and its baseline get the same seed, so the same data split, initial model
   and minibatches);
2. draws the malicious partitions from the seed (``round(malicious_fraction · clients)`` of them;
   the baseline has the same ones, acting honestly);
3. builds the server's strategy from the scenario's defense: a redteam defense (or pipeline) as
   :class:`~.strategy.DefenseStrategy`, or Flower's own rule named ``"flower:<Name>"``; every
   node trains in every round (``fraction_train = 1``) and the server evaluates centrally;
4. builds the ClientApp with redteam's mods first: a tag of each reply's partition (how the
   server side knows which client sent what, on either engine) and the attack's
   :class:`~.attack.AttackMod`; an omniscient update attack (ALIE, IPM …) crafts server-side
   through :class:`~.attack.ColludingAttack`, from all the round's replies, as redteam's engine
   gives it the honest updates;
5. runs Flower's ``Strategy.start`` on the engine the scenario names (:mod:`.engine`), and turns
   every round into a :class:`~redteam.types.RoundRecord` through the shared builder
   (:func:`redteam.federation.rounds.record`): accuracy and loss from the app's evaluation,
   per client who took part, who the defense accepted and rejected (with its reasons), who was
   malicious, the defense's notes, and the untrained reference in round 0.

What a Flower app cannot offer (server-held data, the model's functions, a commit phase, other
attack surfaces, a backdoor's success rate, an attack window) is refused by name before anything
runs, through :mod:`redteam.topology`'s one rule and the Flower wrappers' own checks.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from ...errors import InvalidParameter, InvalidScenario
from ...scenario import PluginSpec, Scenario
from ...topology import FLOWER, check_plugins
from ...types import Attack, RoundRecord, Surface
from .attack import TAG, AttackMod, ColludingAttack, build_attack_for_flower
from .engine import LocalGrid, run_on_ray
from .protocol import AppSpec, ScoredApp, load_app
from .strategy import DefenseStrategy, build_defense_for_flower

__all__ = ["FlowerRun", "MALICIOUS_STREAM", "builtin_strategy", "tag_partition"]

#: the stream the malicious partitions are drawn from (with the run's seed)
MALICIOUS_STREAM = 0x6D616C
#: the streams of the defense's and the attack's generators (with the run's seed)
DEFENSE_STREAM, ATTACK_STREAM = 0x646566, 0x61746B


def _stream(seed: int, stream: int) -> int:
    return int(np.random.SeedSequence([int(seed), stream]).generate_state(1, dtype=np.uint64)[0] & 0x7FFF_FFFF)


def tag_partition(msg: Message, ctxt: Any, call_next: Callable) -> Message:
    """A client mod: tag the reply with the node's ``partition-id`` (a ``ConfigRecord`` under
    ``"redteam"``, which Flower's strategies do not read), so that the server side records who sent
    what whatever node ids the engine gives."""
    reply = call_next(msg, ctxt)
    if not reply.has_error() and "partition-id" in ctxt.node_config:
        reply.content[TAG] = ConfigRecord({"partition-id": int(ctxt.node_config["partition-id"])})
    return reply


def builtin_strategy(name: str, params: Mapping[str, Any], **common: Any) -> Strategy:
    """Flower's own strategy ``"flower:<Name>"`` with ``params`` (checked by the scenario parser)."""
    import flwr.serverapp.strategy as fs

    return getattr(fs, name.split(":", 1)[1])(**common, **dict(params))


class _NoParts:
    """A Flower built-in's stand-in for the one rule's defense check: no redteam stages."""

    def parts(self) -> tuple[()]:
        return ()


class _Recorder(Strategy):
    """Strategy ``inner`` as it is, noting per round which partition sent which reply (the tags),
    the error replies, and how long the aggregation took."""

    def __init__(self, inner: Strategy) -> None:
        self.inner = inner
        self.rounds: dict[int, dict[str, Any]] = {}

    def summary(self) -> None:
        self.inner.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        started = time.perf_counter()
        messages = list(self.inner.configure_train(server_round, arrays, config, grid))
        self.rounds[server_round] = {"started": started, "sent": len(messages)}
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        node_of: dict[int, int] = {}
        errors: list[str] = []
        for m in replies:
            if m.has_error():
                errors.append(str(m.error.reason))
                continue
            tag = m.content.config_records.get(TAG) if TAG in m.content.config_records else None
            if tag is None or "partition-id" not in tag:
                raise InvalidParameter(f"the reply of node {m.metadata.src_node_id} carries no partition tag: the "
                                       "ClientApp must be built with the mods redteam passes (ClientApp(mods=mods))")
            node_of[int(m.metadata.src_node_id)] = int(tag["partition-id"])
        t = time.perf_counter()
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        self.rounds.setdefault(server_round, {"started": t, "sent": len(replies)}).update(
            node_of=node_of, errors=errors, applied=arrays is not None, defense_time_s=time.perf_counter() - t)
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                           ) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)


class FlowerRun:
    """The Flower regime's run of ``scenario`` (module docstring); ``attack`` overrides its attack
    (the baseline's ``none``). ``device`` is the app's business (it is not passed); a warm-up and
    ``start`` are not offered (the app gives the initial model)."""

    def __init__(self, scenario: Scenario, *, device: str = "cpu", attack: PluginSpec | None = None,
                 warmup_dir: str | None = None, start: Any = None) -> None:
        if scenario.flower is None:
            raise InvalidParameter("FlowerRun needs a scenario with a [flower] section")
        if start is not None:
            raise InvalidParameter("a [flower] run starts from the app's initial model (no start parameters)")
        self.scenario = scenario
        self.spec = scenario.flower
        self.attack_spec = attack if attack is not None else scenario.attack
        self.workload = None  # the app holds the data and the model
        self.final_params: Any = None
        fed = scenario.federation
        self.clients, self.rounds, self.seed = fed.clients, fed.rounds, scenario.seed
        f = fed.n_malicious
        draw = np.random.default_rng([self.seed, MALICIOUS_STREAM]).choice(self.clients, size=f, replace=False)
        self.malicious = sorted(int(c) for c in draw)
        self.attack: Attack = self._build_attack()
        self.defense_name = scenario.defense[0].name
        self.builtin = self.defense_name.startswith("flower:")
        defense = None if self.builtin else self._defense()
        check_plugins(FLOWER, self.attack_spec.name, self.attack, _NoParts() if defense is None else defense,
                      defense_label=scenario.defense_label())  # the one rule first: its message names the regime
        self.defense = None if defense is None else build_defense_for_flower(defense, malicious=f)
        self.attacking = bool(self.attack.surfaces)
        self.factory = load_app(self.spec.app, scenario.base_dir)

    # ------------------------------------------------------------------ building
    def _build_attack(self) -> Attack:
        from ...federation.builders import build_attack

        spec = self.attack_spec
        attack = build_attack(spec)
        if not attack.surfaces:
            return attack
        check_plugins(FLOWER, spec.name, attack, _NoParts())  # the one rule first: its message names the regime
        attack = build_attack_for_flower(attack, None, f"[attack] {spec.name}")
        if type(attack).targeted_test is not Attack.targeted_test:
            raise InvalidParameter(f"attack {spec.name!r} is scored by its success on triggered test data, which a "
                                   "Flower app's evaluation does not measure (the [flower] regime scores accuracy "
                                   "and detection); use an untargeted attack")
        return attack

    def _defense(self) -> Any:
        from ...federation.builders import build_defense

        return build_defense(self.scenario.defense, n_malicious=self.scenario.federation.n_malicious)

    def _strategy(self) -> Strategy:
        n = self.clients
        common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_evaluate_nodes=0,
                      min_available_nodes=n)
        if self.builtin:
            return builtin_strategy(self.defense_name, self.scenario.defense[0].params, **common)
        return DefenseStrategy(self.defense, malicious=self.scenario.federation.n_malicious,
                               seed=_stream(self.seed, DEFENSE_STREAM), **common)

    # ------------------------------------------------------------------ running
    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> "Any":
        from ...federation.rounds import RunResult

        if self.final_params is not None:
            raise InvalidParameter("this FlowerRun has already run; build a new one for another run")
        t_run = time.perf_counter()
        app = self.factory(AppSpec(self.clients, self.rounds, self.seed, dict(self.spec.params)))
        if not isinstance(app, ScoredApp):
            raise InvalidScenario(f"[flower].app = {self.spec.app!r} returned a {type(app).__name__}, expected a "
                                  "redteam.integrations.flower.ScoredApp (docs/flower.md: scoring your own app)")
        inner = self._strategy()
        defense_strategy = inner if isinstance(inner, DefenseStrategy) else None
        mods: list[Any] = [tag_partition]
        if self.attacking:
            colluding = Surface.UPDATES in self.attack.surfaces and bool(self.attack.omniscient)
            aseed = _stream(self.seed, ATTACK_STREAM)
            mods.append(AttackMod(self.attack, malicious=self.malicious, seed=aseed, colluding=colluding))
            if colluding:
                inner = ColludingAttack(inner, self.attack, malicious=self.malicious, seed=aseed)
        recorder = _Recorder(inner)
        records: list[RoundRecord] = []
        untrained: dict[str, Any] = {}
        final: list[ArrayRecord] = []

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            acc, loss = _quality(app.evaluate(arrays), self.spec.app)
            if server_round == 0:
                untrained.update(accuracy=acc, loss=loss, chance_accuracy=app.chance_accuracy, unigram_loss=None)
            else:
                rec = self._record(server_round, recorder.rounds.get(server_round, {}), defense_strategy, acc, loss,
                                   untrained)
                records.append(rec)
                if on_round is not None:
                    on_round(rec)
            final[:] = [arrays]
            return MetricRecord({"accuracy": acc, "loss": loss})

        client_app = app.client_app(mods)
        server = ServerApp()

        @server.main()
        def main(grid: Grid, context: Any) -> None:
            recorder.start(grid=grid, initial_arrays=app.initial_arrays, num_rounds=self.rounds,
                           train_config=ConfigRecord(dict(app.train_config)), evaluate_fn=evaluate)

        quiet = logging.getLogger("flwr")  # Flower's INFO lines for every round of every cell
        level = quiet.level
        quiet.setLevel(max(level, logging.WARNING))
        try:
            if self.spec.engine == "ray":
                base = str(Path(self.scenario.base_dir).resolve()) if self.scenario.base_dir else ""
                run_on_ray(server, client_app, self.clients, self.spec.ray_cpus, [base] if base else [])
            else:
                main(LocalGrid(client_app, [1000 + p for p in range(self.clients)]), None)
        finally:
            quiet.setLevel(level)
        if len(records) != self.rounds:
            raise InvalidParameter(f"the Flower run recorded {len(records)} of {self.rounds} rounds (a client or the "
                                   "server failed: see Flower's log)")
        from ._records import flatten

        self.final_params = flatten(final[0], who="the final model")
        return RunResult(self.attack_spec.name, self.scenario.defense_label(), records, list(self.malicious),
                         {"attack": dict(self.attack_spec.params), "defense": self.defense_name if self.builtin
                          else repr(self.defense), "flower_engine": self.spec.engine}, time.perf_counter() - t_run)

    def _record(self, server_round: int, seen: Mapping[str, Any], strategy: DefenseStrategy | None, acc: float,
                loss: float, untrained: Mapping[str, Any]) -> RoundRecord:
        from ...federation.rounds import record

        n = self.clients
        node_of: Mapping[int, int] = seen.get("node_of", {})
        replied = set(node_of.values())
        participating = [True] * n  # every node is sent every round's training (fraction_train = 1)
        dropped = {p: "no reply" for p in range(n) if p not in replied}
        accepted = [False] * n
        rejected: dict[int, str] = {}
        extra: dict[str, Any] = {}
        if server_round == 1:
            extra["untrained"] = dict(untrained)
        if strategy is not None:
            hist = next((h for h in reversed(strategy.history) if h.round == server_round), None)
            if hist is not None:
                for node in hist.accepted:
                    accepted[node_of[node]] = True
                rejected = {node_of[node]: why for node, why in hist.rejected.items()}
                if hist.notes:
                    extra["defense_notes"] = list(hist.notes)
                if hist.refused is not None:
                    extra["refused"] = [hist.refused]
        elif seen.get("applied"):
            for p in replied:  # Flower's coordinate-wise rules keep every reply
                accepted[p] = True
        if seen.get("errors"):  # Flower's error replies name no partition: their reasons, in order
            extra["client_errors"] = list(seen["errors"])
        truth = [self.attacking and p in self.malicious for p in range(n)]
        return record(server_round - 1, acc, loss, accepted=accepted, malicious=truth, participating=participating,
                      dropped=dropped, rejected=rejected, started=float(seen.get("started", time.perf_counter())),
                      defense_time_s=float(seen.get("defense_time_s", 0.0)), extra=extra)


def _quality(metrics: Any, ref: str) -> tuple[float, float]:
    """(accuracy, loss) of the app's evaluation ``metrics``, refused naming the app when malformed."""
    if not isinstance(metrics, Mapping) or "accuracy" not in metrics or "loss" not in metrics:
        raise InvalidParameter(f"[flower].app = {ref!r}: evaluate(arrays) returned {metrics!r}; expected a mapping "
                               "with 'accuracy' and 'loss'")
    try:
        return float(metrics["accuracy"]), float(metrics["loss"])
    except (TypeError, ValueError):
        raise InvalidParameter(f"[flower].app = {ref!r}: evaluate(arrays) returned accuracy "
                               f"{metrics['accuracy']!r} and loss {metrics['loss']!r}; expected numbers") from None
