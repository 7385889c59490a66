"""One run setup, built once from a validated scenario; every regime receives it.

What every topology needs before its first round is built here and nowhere else
(:func:`build_setup`): the random streams, the workload and its data, the roles (who is
malicious), the attack and the defense (refused in one line when the regime does not wire
them: :func:`redteam.topology.check_plugins`), the partition of the training pool (poisoned for
the malicious clients, the poisoned labels checked), the held-out test split and what a targeted
attack is scored on (:class:`Probes`), the model, its start (warm-up or ``start_from``), the
batched trainer, the clients' per-run state, and the untrained reference. A topology
(:mod:`.regimes`) says only what differs: its stream names, how it places the attackers, how
many rows its merging parties see, and whether the server holds a root sample.

Random streams are spawned from the scenario seed by name (:func:`random_streams`), so a run
with attack ``none`` and the same seed is the exact baseline of an attacked run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np
import torch

from ..errors import InvalidParameter
from ..topology import Support, check_plugins
from ..types import Attack, ClientData, Defense, Surface
from .builders import build_attack, build_defense, build_workload
from .params import ParamSpec
from .partition import deal
from .state import ClientStates
from .training import BatchedTrainer, LocalTraining, StackedData
from .warmup import round0_params

__all__ = ["RunSetup", "Probes", "Partition", "Placement", "build_setup", "random_streams", "resolve_device",
           "fill_image_shape", "check_poisoned_labels", "untrained_reference", "local_training"]


def random_streams(scenario: Any, names: tuple[str, ...]
                   ) -> tuple[dict[str, np.random.Generator], dict[str, torch.Generator]]:
    """Independent numpy and torch streams, one per name, spawned from the scenario seed
    (appending a name never changes the earlier ones); with ``[scenario] training_seed`` the
    ``init`` and ``train`` streams come from that seed instead."""
    seeds = dict(zip(names, np.random.SeedSequence(scenario.seed).spawn(len(names))))
    training_seed = scenario.scenario.training_seed
    if training_seed is not None:  # model init and batches from their own seed
        own = dict(zip(names, np.random.SeedSequence(training_seed).spawn(len(names))))
        seeds["init"], seeds["train"] = own["init"], own["train"]
    gens = {k: np.random.default_rng(s) for k, s in seeds.items()}
    torch_gens = {k: torch.Generator(device="cpu").manual_seed(int(s.generate_state(1, np.uint64)[0] >> np.uint64(1)))
                  for k, s in seeds.items()}
    return gens, torch_gens


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; ``cuda`` without a GPU is a clear error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InvalidParameter("device = 'cuda': no CUDA device is available (use --device cpu or auto)")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise InvalidParameter(f"device = {device!r}: must be auto, cpu or cuda")
    return torch.device(device)


@dataclass(frozen=True)
class Probes:
    """What a targeted attack is scored on, the same inputs for the attacked run and its baseline
    (whose ASR is then the natural rate): the triggered test inputs (``targeted``: ASR), a text
    backdoor's clean prompts (``false_trigger``) and partial triggers by kind (``near_miss``), a
    distributed trigger's local triggers (``parts``: ``asr_parts``)."""

    targeted: tuple[torch.Tensor, torch.Tensor] | None = None
    false_trigger: tuple[torch.Tensor, torch.Tensor] | None = None
    near_miss: Mapping[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    parts: Mapping[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @classmethod
    def of(cls, attacks: tuple[Attack, ...], x: torch.Tensor, y: torch.Tensor, device: torch.device) -> "Probes":
        """From the first of ``attacks`` that is targeted (the run's attack, then the scenario's)."""
        def on(xy: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            return xy[0].to(device), xy[1].to(device)

        for atk in attacks:
            targeted = atk.targeted_test(x, y)
            if targeted is None:
                continue
            clean = atk.clean_test(x, y)
            near = atk.near_miss_test(x, y) if clean is not None else None
            parts = atk.targeted_parts(x, y)
            return cls(on(targeted), on(clean) if clean is not None else None,
                       {k: on(v) for k, v in (near or {}).items()}, {k: on(v) for k, v in (parts or {}).items()})
        return cls()

    def evaluate(self, trainer: BatchedTrainer, params: torch.Tensor) -> dict[str, Any]:
        """The round's ``extra`` entries of the model ``params``: ``asr``, ``false_trigger``,
        ``near_miss_trigger`` (pooled, and by kind), ``asr_parts``."""
        extra: dict[str, Any] = {}
        if self.targeted is not None:
            extra["asr"] = trainer.evaluate(params, *self.targeted)[0]
        if self.false_trigger is not None:
            extra["false_trigger"] = trainer.evaluate(params, *self.false_trigger)[0]
        if self.near_miss:
            by_kind = {k: trainer.evaluate(params, *xy)[0] for k, xy in self.near_miss.items()}
            hits = sum(round(by_kind[k] * xy[0].shape[0]) for k, xy in self.near_miss.items())
            extra["near_miss_trigger"] = hits / sum(xy[0].shape[0] for xy in self.near_miss.values())
            extra["near_miss_trigger_by_kind"] = by_kind
        if self.parts:
            extra["asr_parts"] = {k: trainer.evaluate(params, *xy)[0] for k, xy in self.parts.items()}
        return extra


@dataclass(frozen=True)
class Partition:
    """The training pool dealt to the clients: ``pool`` (indices of the training split the clients
    share, the server's ``root`` sample held out), ``parts`` (each client's indices into ``pool``),
    ``clean`` (each client's data as dealt) and ``clients`` (what each trains on: a malicious
    client's poisoned); ``data`` stacks ``clients``, ``clean_data`` stacks ``clean`` where a run
    reads it (a windowed data attack, a replaying verifier), else it is ``data``."""

    pool: np.ndarray
    root: np.ndarray
    parts: list[np.ndarray]
    clean: list[ClientData]
    clients: list[ClientData]
    data: StackedData
    clean_data: StackedData


class Placement(Protocol):
    """What a topology tells :func:`build_setup` (:mod:`.regimes` implements one per regime)."""

    support: Support
    streams: tuple[str, ...]

    def check_workload(self, workload: Any) -> None:
        """Refuse (``InvalidParameter``) a workload the topology cannot cut, before anything is built."""

    def place(self, n: int, rng: Mapping[str, np.random.Generator]) -> list[int]:
        """The malicious clients (peers, nodes), drawn from the run's streams."""

    def defense_sizes(self, malicious: list[int]) -> tuple[int | None, int | None]:
        """The malicious count a merging party's rule is sized for, and the most rows it sees."""

    def root_size(self, pool: int, defense: Defense) -> int | None:
        """Items of the training pool the server holds out (``None``: no server, no draw)."""


@dataclass(frozen=True)
class RunSetup:
    """Everything a run needs before its first round (module docstring). Read-only: a topology
    reads it; what changes during a run (the clients' ``states``) is a store of its own."""

    scenario: Any
    support: Support
    device: torch.device
    attack_spec: Any
    attack: Attack
    defense: Defense
    rng: Mapping[str, np.random.Generator]
    torch_rng: Mapping[str, torch.Generator]
    workload: Any
    dataset: Any
    malicious: tuple[int, ...]
    is_malicious: np.ndarray
    partition: Partition | None
    test_x: torch.Tensor
    test_y: torch.Tensor
    probes: Probes
    model: torch.nn.Module
    spec: ParamSpec
    params_init: torch.Tensor
    params0: torch.Tensor
    start_info: Mapping[str, Any]
    trainer: BatchedTrainer
    local: LocalTraining
    states: ClientStates
    untrained: Mapping[str, Any]

    @property
    def num_classes(self) -> int:
        return int(self.dataset.num_classes)

    @property
    def dataset_source(self) -> str:
        return str(self.dataset.source)

    @property
    def n(self) -> int:
        return int(self.scenario.federation.clients)

    def start_record(self) -> dict[str, Any]:
        """Round 0's ``extra["start"]``: the model the run starts from, evaluated before round 0."""
        if not self.start_info:
            return {}
        acc, loss = self.trainer.evaluate(self.params0, self.test_x, self.test_y)
        return {**self.start_info, "accuracy": acc, "loss": loss if math.isfinite(loss) else None}


def local_training(fed: Any, privacy: Any = None) -> LocalTraining:
    """``[federation]``'s local procedure (with ``[privacy]``'s DP-SGD, when it sets one)."""
    clip = getattr(privacy, "dp_sgd_clip", None)
    return LocalTraining(
        steps=fed.local_steps, epochs=fed.local_epochs, batch_size=fed.batch_size, lr=fed.lr, prox_mu=fed.prox_mu,
        optimizer=fed.local_optimizer, weight_decay=fed.local_weight_decay, betas=tuple(fed.local_betas),
        sampling=fed.sampling, dp_clip=clip,
        dp_noise_multiplier=float(getattr(privacy, "dp_sgd_noise_multiplier", 0.0)) if clip is not None else 0.0)


def build_setup(scenario: Any, topology: Placement, *, device: str = "cpu", attack: Any = None,
                warmup_dir: str | None = None, start: torch.Tensor | None = None,
                compute_warmup: Callable[[Any, torch.Tensor, torch.device], torch.Tensor] | None = None,
                partition: bool = True) -> RunSetup:
    """The run setup of ``scenario`` under ``topology`` (module docstring). ``attack`` overrides the
    scenario's (the baseline's ``none``); ``start`` is the model round 0 starts from (else the
    scenario's ``start_from`` / warm-up, computed by ``compute_warmup``, else the initialisation);
    ``partition = False`` for a topology whose peers draw from the whole pool (a pipeline)."""
    dev = resolve_device(device)
    rng, torch_rng = random_streams(scenario, topology.streams)
    workload = build_workload(scenario.workload.name, scenario.workload_params)  # relative paths: the file's dir
    topology.check_workload(workload)
    attack_spec = attack if attack is not None else scenario.attack
    scenario_attack = scenario.attack
    # pixel-pattern attacks address the workload's images: an image_shape they leave unset is the workload's
    shape = tuple(workload.image_shape or ()) if workload.input_kind == "image" else ()
    if shape:
        attack_spec = fill_image_shape(attack_spec, shape)
        scenario_attack = fill_image_shape(scenario_attack, shape)
    ds = workload.load(scenario.seed)
    n = scenario.federation.clients
    malicious = sorted(int(c) for c in topology.place(n, rng))
    is_malicious = np.zeros(max(n, (max(malicious) + 1) if malicious else 0), dtype=bool)
    is_malicious[malicious] = True

    atk = build_attack(attack_spec)
    f_round, most = topology.defense_sizes(malicious)
    defense = build_defense(scenario.defense, n_malicious=f_round, most_updates=most)
    check_plugins(topology.support, attack_spec.name, atk, defense, defense_label=scenario.defense_label())

    part = None
    if partition:
        part = _partition(scenario, topology, workload, ds, atk, attack_spec.name, malicious, is_malicious, rng,
                          torch_rng, dev, defense)
    test_x, test_y = ds.test_x.to(dev), ds.test_y.to(dev)
    probes = Probes.of((atk, build_attack(scenario_attack)), ds.test_x, ds.test_y, dev)

    model = workload.build_model(torch_rng["init"])
    spec = ParamSpec.of(model)
    params_init = spec.flatten(model).to(dev)
    params0, start_info = round0_params(scenario, spec, params_init, dev, warmup_dir, ds.source, start,
                                        compute=compute_warmup)
    trainer = BatchedTrainer(workload, model.to(dev), spec, batching=scenario.federation.batching)
    setup = RunSetup(
        scenario=scenario, support=topology.support, device=dev, attack_spec=attack_spec, attack=atk, defense=defense,
        rng=rng, torch_rng=torch_rng, workload=workload, dataset=ds, malicious=tuple(malicious),
        is_malicious=is_malicious, partition=part, test_x=test_x, test_y=test_y, probes=probes, model=model,
        spec=spec, params_init=params_init, params0=params0, start_info=dict(start_info), trainer=trainer,
        local=local_training(scenario.federation, getattr(scenario, "privacy", None)), states=ClientStates(n, dev), untrained={})
    # evaluation only: no random stream advances
    return dataclasses.replace(setup, untrained=untrained_reference(trainer, params_init, test_x, test_y,
                                                                    train_y=ds.train_y))


def _partition(scenario: Any, topology: Placement, workload: Any, ds: Any, atk: Attack, attack_name: str,
               malicious: list[int], is_malicious: np.ndarray, rng: Mapping[str, np.random.Generator],
               torch_rng: Mapping[str, torch.Generator], dev: torch.device, defense: Defense) -> Partition:
    fed = scenario.federation
    n = fed.clients
    pool = np.arange(len(ds.train_y))
    root_idx = pool[:0]
    root_k = topology.root_size(len(pool), defense)
    if root_k is not None:  # the server's small trusted root set (FLTrust, loss checks), held out of the pool
        perm = rng["split"].permutation(len(pool))
        root_idx, pool = np.sort(perm[:root_k]), np.sort(perm[root_k:])
    # partitions read labels; a language model's sample groups (text: each window's package) replace
    # its labels, so that by_group (and the label skews) act on groups; a classifier's groups (LEAF's
    # writers) are read by by_group / natural only
    by_groups = ds.groups is not None and (fed.partition in ("by_group", "natural") or workload.input_kind == "tokens")
    if fed.partition == "natural" and ds.groups is None:
        raise InvalidParameter(f"[federation].partition = \"natural\": workload {scenario.workload.name!r} "
                               "has no natural partition (LEAF's femnist and shakespeare have one, by writer "
                               "and by role); use dirichlet, iid, shards, quantity or label_sorted")
    labels = (ds.groups if by_groups else ds.train_y).numpy()[pool]
    parts = deal(labels, n, malicious, fed.partition, fed.malicious_data_rule, rng["split"], alpha=fed.alpha,
                 shards_per_client=fed.shards_per_client, beta=fed.quantity_beta, min_samples=fed.min_samples)
    clean: list[ClientData] = []
    clients: list[ClientData] = []
    poisons = Surface.DATA in atk.surfaces
    for i, p in enumerate(parts):
        cd = ClientData(ds.train_x[pool[p]], ds.train_y[pool[p]])
        clean.append(cd)
        if is_malicious[i] and poisons:
            cd = atk.poison_data(cd, i, torch_rng["attack"])
            check_poisoned_labels(attack_name, atk, cd, i, ds.num_classes)
        clients.append(cd)
    data = StackedData.stack(clients).to(dev)
    clean_data = data
    # the clean data is read only outside an attack window (poisoned data is used inside it) and
    # by a verifier that replays the peers' training: stacked only then
    if poisons and (not scenario.window.is_full or any(st.replays_work for st in defense.parts())):
        clean_data = StackedData.stack(clean).to(dev)
    return Partition(pool, root_idx, parts, clean, clients, data, clean_data)


def untrained_reference(trainer: BatchedTrainer, params_init: torch.Tensor, test_x: torch.Tensor,
                        test_y: torch.Tensor, train_y: torch.Tensor | None = None) -> dict[str, float | None]:
    """What "learned nothing" means on this test set (the defender's summary flags a defense
    whose clean model is no better): the untrained model's accuracy and loss (the fresh
    initialisation, before any warm-up or ``start_from``); the majority-class rate of the test
    labels (``chance_accuracy``); and the unigram loss (``unigram_loss``, nats): the test
    cross-entropy of predicting every target by the training targets' frequencies (add-one
    smoothed over the classes), the best a model that ignores its input can do — for a language
    model, the rate a model must beat to have learned anything of the context. Both ``None``
    where the labels are not class ids."""
    acc, loss = trainer.evaluate(params_init, test_x, test_y)
    chance = unigram = None
    y = test_y.reshape(-1)
    ints = (torch.int64, torch.int32, torch.int16, torch.uint8)
    if test_y.dtype in ints and y.numel() and int(y.min()) >= 0:
        chance = float(torch.bincount(y.long()).max()) / y.numel()
    if test_y.dtype in ints and y.numel():
        y = y[y >= 0].long()  # a language model's masked targets (−100) are not scored
        src = y if train_y is None or train_y.dtype not in ints else train_y.reshape(-1)
        src = src[src >= 0].long().cpu()
        if y.numel() and src.numel():
            k = int(max(int(src.max()), int(y.max()))) + 1
            counts = torch.bincount(src, minlength=k).to(torch.float64) + 1.0
            logp = torch.log(counts / counts.sum())
            unigram = float(-logp[y.cpu()].mean())
    return {"accuracy": acc, "loss": loss if math.isfinite(loss) else None, "chance_accuracy": chance,
            "unigram_loss": unigram}


def fill_image_shape(spec: Any, shape: tuple[int, ...]) -> Any:
    """``spec`` with ``image_shape = shape`` where its attack (or a part of a composition) has
    that parameter and leaves it unset (:func:`redteam.scenario.fill_image_shape`, which the
    scenario's own check uses too)."""
    from ..scenario import fill_image_shape as fill

    return fill(spec, shape)


def check_poisoned_labels(name: str, attack: Attack, data: ClientData, client: int, num_classes: int) -> None:
    """A data attack must keep a classifier's labels among the workload's classes: a label
    out of range would otherwise crash deep inside the loss (e.g. ``label_flip``'s default
    ``num_classes = 10`` on a 4-class workload)."""
    y = data.y
    if num_classes <= 0 or y.dtype.is_floating_point or y.ndim != 1 or not y.numel():
        return
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= num_classes:
        own = dataclasses.asdict(attack) if dataclasses.is_dataclass(attack) else {}  # its parameters
        hint = (f"; set num_classes = {num_classes} in [attack]"
                if own.get("num_classes", num_classes) != num_classes else "")
        raise InvalidParameter(
            f"attack {name!r}: poison_data gave client {client} labels in [{lo}, {hi}], outside the "
            f"workload's {num_classes} classes [0, {num_classes}){hint}"
        )
