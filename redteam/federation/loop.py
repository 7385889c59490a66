"""The round loop: one federation, attacked and defended, deterministic under its seed.

One round, each stage a function of
:mod:`.stages`::

    churn → train (all clients batched; poisoned data, or a training hook, for attackers;
            worker momentum) → craft (update-poisoning attack on the malicious rows)
          → encode (compress, error feedback) → chunk + manifest (signed with
            ``signed_chunks``) → transport (transport attacks act here) → verify/decode
          → defend/merge (compromised sub-aggregators act here) → server step → evaluate

What a client carries from round to round (momentum, error-feedback residual, local
optimizer state, sampler position, the attack's memory) is in ``self.states``
(:class:`.state.ClientStates`), keyed by client id; the defenses' memory is a
:class:`~redteam.merge.DefenseMemory`, keyed by client id as well.

Before the first round, with ``provenance_gate`` in the defense, every client presents
its signed, logged dataset manifest and the gate excludes those that fail
(:mod:`.provenance`). ``signed_chunks`` and ``provenance_gate`` are found in the defense
pipeline (their ``acts_at``) and run at those stages; inside the pipeline they accept
everything. A client excluded by the gate, or banned for equivocation, takes part in no
later round and is recorded as rejected (and dropped) with the reason in every round.

What transport attacks see (``ctx.state`` of ``tamper_chunks``, read-only): ``own_uploads``
(malicious client → (its header, its chunks) this round), ``signer`` (signs an
:class:`~redteam.transport.chunking.UpdateManifest` with the key of a malicious client —
the attackers' own keys, nothing else — or returns its JSON when updates are unsigned),
``signed``, ``codec``, ``dim``, ``chunk_size``, ``parent_digest`` and, for an attack with
``history_rounds = k > 0``, ``history``: round → the deliveries (headers and chunks, as
sent) of each of the last k rounds, the traffic an eavesdropper has recorded.

Randomness comes from independent streams spawned from the scenario seed (data split,
roles, model init, training batches, network, attack, defense, codec), so a run with
attack ``none`` and the same seed is the exact baseline of an attacked run: the honest
clients see the same batches and the same network either way. With ``[scenario]
training_seed`` the model-init and batch streams come from that seed instead, so the
model and batches can vary while the data split and the malicious clients stay.

Data (``[federation]``): the training pool minus the server's root sample is partitioned
(:mod:`.partition`). ``malicious_data = "partition"`` deals the malicious clients their
parts of that partition like everyone else; ``"iid_overlap"`` (the default for
``label_sorted``, as in Karimireddy, He & Jaggi's code) partitions the pool among the
honest clients only and gives each malicious client an IID sample of the pool (as many
samples as pool/clients), which overlaps the honest data. The root sample (FLTrust,
loss checks) is ``root_samples`` items held out of the pool: unset keeps the historic 64
(capped at a tenth of the pool) for every defense, an integer sets it (0: none), and
``"auto"`` takes 64 only when a defense uses server data.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InvalidParameter, RedteamError
from ..merge import DefenseMemory, Hierarchy
from ..scenario import PluginSpec, Scenario
from ..transport.network import Network, NetworkConfig
from ..types import AttackContext, ChunkDelivery, ClientData, RoundRecord, Surface
from . import stages
from .builders import build_attack, build_compressor, build_defense, build_upper_defense, build_workload
from .params import ParamSpec
from .builders import needs_server_data
from .partition import deal
from .sampling import RoundPlan
from .warmup import round0_params
from .server_opt import make_server_optimizer
from .state import ClientStates
from .training import BatchedTrainer, LocalTraining, StackedData

__all__ = ["Federation", "RunResult", "resolve_device", "random_streams"]

# appended streams never change the earlier ones (SeedSequence children are indexed)
#: items in a client's assigned page (the validator's assigned batch; attacks/verification.py)
ASSIGNED_PAGE = 32

_STREAMS = ("split", "roles", "init", "train", "network", "attack", "defense", "codec", "merge", "root",
            "keys", "provenance", "sampling")


def random_streams(scenario: Scenario, names: tuple[str, ...]
                   ) -> tuple[dict[str, np.random.Generator], dict[str, torch.Generator]]:
    """Independent numpy and torch streams, one per name, spawned from the scenario seed
    (appending a name never changes the earlier ones); with ``[scenario] training_seed`` the
    ``init`` and ``train`` streams come from that seed instead."""
    seeds = dict(zip(names, np.random.SeedSequence(scenario.seed).spawn(len(names))))
    training_seed = getattr(scenario.scenario, "training_seed", None)
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


@dataclass
class RunResult:
    """The outcome of one run: its records and what it was."""

    attack: str
    defense: str
    records: list[RoundRecord]
    malicious: list[int]
    params: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0


class Federation:
    """A federation built from a scenario. ``run()`` executes all rounds.

    ``attack`` overrides the scenario's attack (used for the no-attack baseline).
    ``server_root_samples`` is the size of the server's root sample when the scenario's
    ``[federation] root_samples`` is unset. ``start`` is the model round 0 starts from
    (default: the scenario's ``start_from`` / warm-up, else the fresh initialisation);
    ``warmup_dir`` where warm-ups are kept (:mod:`.warmup`).
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        device: str = "cpu",
        attack: PluginSpec | None = None,
        server_root_samples: int = 64,
        start: torch.Tensor | None = None,
        warmup_dir: str | None = None,
    ) -> None:
        self.scenario = scenario
        self._ran = False
        self.device = resolve_device(device)
        self.attack_spec = attack if attack is not None else scenario.attack
        fed = scenario.federation
        self._np, self._torch = random_streams(scenario, _STREAMS)

        self.workload = build_workload(scenario.workload.name, dict(scenario.workload.params))
        # pixel-pattern attacks address the workload's images: an image_shape they leave unset is the workload's
        shape = tuple(getattr(self.workload, "image_shape", ()) or ())
        scenario_attack = scenario.attack
        if getattr(self.workload, "input_kind", "") == "image" and shape:
            self.attack_spec = _fill_image_shape(self.attack_spec, shape)
            scenario_attack = _fill_image_shape(scenario.attack, shape)
        ds = self.workload.load(scenario.seed)
        self.num_classes = ds.num_classes
        self.dataset_source = ds.source  # what the data is, with its digest where the workload computes one
        n = fed.clients
        f = fed.n_malicious
        self.malicious = sorted(self._np["roles"].choice(n, size=f, replace=False).tolist()) if f else []
        self.is_malicious = np.zeros(n, dtype=bool)
        self.is_malicious[self.malicious] = True

        self.attack = build_attack(self.attack_spec)
        surfaces = set(self.attack.surfaces)
        if surfaces and surfaces <= {Surface.PIPELINE}:
            raise InvalidParameter(f"attack {self.attack_spec.name!r} is a pipeline stage peer's attack: it needs a "
                                   "[pipeline] section (the model-parallel regime)")
        if not scenario.window.is_full and surfaces & {Surface.PROVENANCE, Surface.HIERARCHY}:
            raise InvalidParameter(f"[attack].window: attack {self.attack_spec.name!r} acts on "
                                   f"{', '.join(sorted(surfaces & {Surface.PROVENANCE, Surface.HIERARCHY}))} before the "
                                   "first round (enrolment, merge groups), so it cannot wait for a window")
        # a round holds K clients (clients_per_round): the rules' capacity and their
        # malicious-count defaults are per round, so they are sized for K and the attackers K can hold
        k = fed.clients_per_round or n
        f_round = min(fed.n_malicious, k) if fed.attacker_selection != "count" else int(fed.attackers_per_round or 0)
        self.defense = build_defense(scenario.defense, n_malicious=f_round, most_updates=k)
        for st in tuple(getattr(self.defense, "stages", ()) or (self.defense,)):
            if getattr(st, "acts_at", None) == "pipeline":
                raise InvalidParameter(f"[defense]: {type(st).__name__} checks the hops of a model-parallel pipeline; "
                                       "it needs a [pipeline] section")
        self.upper_defense = build_upper_defense(scenario.hierarchy, n_malicious=fed.n_malicious)
        self.hierarchy = Hierarchy(scenario.hierarchy.fan_out, scenario.hierarchy.depth, scenario.hierarchy.grouping)

        pool = np.arange(len(ds.train_y))
        # the server's small trusted root set (FLTrust, loss checks), held out of the pool
        wanted = fed.root_samples
        if wanted is None:
            wanted = server_root_samples
        elif wanted == "auto":
            wanted = server_root_samples if needs_server_data(self.defense, self.upper_defense) else 0
        root_k = min(int(wanted), len(pool) // 10)
        perm = self._np["split"].permutation(len(pool))
        root_idx, pool = np.sort(perm[:root_k]), np.sort(perm[root_k:])
        # partitions read labels; a language model's sample groups (text: each window's
        # package) replace its labels, so that by_group (and the label skews) act on groups;
        # a classifier's groups (LEAF's writers) are read by by_group / natural only
        by_groups = ds.groups is not None and (fed.partition in ("by_group", "natural")
                                               or getattr(self.workload, "input_kind", "") == "tokens")
        if fed.partition == "natural" and ds.groups is None:
            raise InvalidParameter(f"[federation].partition = \"natural\": workload {scenario.workload.name!r} "
                                   "has no natural partition (LEAF's femnist and shakespeare have one, by writer "
                                   "and by role); use dirichlet, iid, shards, quantity or label_sorted")
        labels = (ds.groups if by_groups else ds.train_y).numpy()[pool]
        parts = deal(
            labels, n, self.malicious, fed.partition, fed.malicious_data_rule, self._np["split"],
            alpha=fed.alpha, shards_per_client=fed.shards_per_client, beta=fed.quantity_beta,
            min_samples=fed.min_samples,
        )
        stages_ = tuple(getattr(self.defense, "stages", ()) or (self.defense,))
        self.signed_chunks = next((s for s in stages_ if getattr(s, "acts_at", None) == "transport"), None)
        self.gate = next((s for s in stages_ if getattr(s, "acts_at", None) == "admission"), None)
        self.enrollment = None
        if self.signed_chunks is not None or self.gate is not None:
            from .provenance import Enrollment

            self.enrollment = Enrollment.derive(n, self._np["keys"])
        # public names: hash grouping reads them, and an identity-grinding attacker chooses its own
        self.identities: dict[int, str] = {}
        if Surface.HIERARCHY in self.attack.surfaces:
            self.identities = {c: str(self.attack.choose_identity(c, self.hierarchy.n_groups)) for c in self.malicious}

        clean: list[ClientData] = []
        clients: list[ClientData] = []
        for i, p in enumerate(parts):
            cd = ClientData(ds.train_x[pool[p]], ds.train_y[pool[p]])
            clean.append(cd)
            if self.is_malicious[i] and Surface.DATA in self.attack.surfaces:
                cd = self.attack.poison_data(cd, i, self._torch["attack"])
                _check_poisoned_labels(self.attack_spec.name, self.attack, cd, i, ds.num_classes)
            clients.append(cd)
        # each client's assigned page (verification of work, defenses/gauntlet.py): the first
        # ASSIGNED_PAGE items of the data it was dealt, public as a permissionless trainer's data
        # assignment is, so a validator can score an update on the data its peer was meant to train on
        self.assigned = StackedData.stack([ClientData(c.x[:ASSIGNED_PAGE], c.y[:ASSIGNED_PAGE])
                                           for c in clean]).to(self.device)
        # who takes part in each round and whether the attack acts in it (.sampling)
        self.plan = RoundPlan(fed, scenario.window, self.is_malicious, self._np["sampling"])
        self.data = StackedData.stack(clients).to(self.device)
        self.weights = self.data.sizes.to(torch.float32).to(self.device)
        # the data and sample weights of a round the attack acts in (index 1) and of one it
        # does not act in (index 0): poisoned data is used only inside the attack window
        self._phases = ((self.data, self.weights),) * 2
        if not scenario.window.is_full and Surface.DATA in self.attack.surfaces:
            clean_data = StackedData.stack(clean).to(self.device)
            self._phases = ((clean_data, clean_data.sizes.to(torch.float32).to(self.device)),
                            (self.data, self.weights))
        self.roles = self.plan.roles(0, bool(self.attack.surfaces))
        self.test_x, self.test_y = ds.test_x.to(self.device), ds.test_y.to(self.device)
        self.root = (StackedData.stack([ClientData(ds.train_x[root_idx], ds.train_y[root_idx])]).to(self.device)
                     if root_k else None)
        # targeted / backdoor attacks say which test inputs measure their success (ASR);
        # the baseline is scored on the same inputs, so its ASR is the natural rate
        self._targeted = None
        self._false_trigger: tuple[torch.Tensor, torch.Tensor] | None = None
        self._near_miss: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._targeted_parts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for candidate in (self.attack, build_attack(scenario_attack)):
            targeted_test = getattr(candidate, "targeted_test", None)
            if targeted_test is None:
                continue
            try:
                tx, ty = targeted_test(ds.test_x, ds.test_y)
            except AttributeError:  # a composition without a targeted part
                continue
            self._targeted = (tx.to(self.device), ty.to(self.device))
            # a text backdoor's clean prompts (no trigger): its false-trigger rate; and its
            # near-miss prompts (a partial trigger), by kind: its near-miss trigger rate
            for part in (candidate, *getattr(candidate, "parts", ())):
                clean_test = getattr(part, "clean_test", None)
                if clean_test is not None:
                    cx, cy = clean_test(ds.test_x, ds.test_y)
                    self._false_trigger = (cx.to(self.device), cy.to(self.device))
                    near_miss_test = getattr(part, "near_miss_test", None)
                    if near_miss_test is not None:
                        self._near_miss = {k: (nx.to(self.device), ny.to(self.device))
                                           for k, (nx, ny) in near_miss_test(ds.test_x, ds.test_y).items()}
                    break
            # a distributed trigger (DBA): the success rate of each local trigger alone as well
            for part in (candidate, *getattr(candidate, "parts", ())):
                targeted_parts = getattr(part, "targeted_parts", None)
                if targeted_parts is not None:
                    self._targeted_parts = {k: (px.to(self.device), py.to(self.device))
                                            for k, (px, py) in targeted_parts(ds.test_x, ds.test_y).items()}
                    break
            break

        model = self.workload.build_model(self._torch["init"])
        self.spec = ParamSpec.of(model)
        self.params_init = self.spec.flatten(model).to(self.device)
        self.params0, self._start_info = round0_params(scenario, self.spec, self.params_init, self.device, warmup_dir,
                                                       self.dataset_source, start)
        self.final_params: torch.Tensor | None = None
        self.trainer = BatchedTrainer(self.workload, model.to(self.device), self.spec)
        self.local = LocalTraining(
            steps=fed.local_steps, epochs=fed.local_epochs, batch_size=fed.batch_size, lr=fed.lr, prox_mu=fed.prox_mu,
            optimizer=fed.local_optimizer, weight_decay=fed.local_weight_decay, betas=tuple(fed.local_betas),
            sampling=fed.sampling,
        )
        opt_params: dict[str, Any] = {}
        if fed.server_lr is not None:
            opt_params["lr"] = fed.server_lr
        if fed.server_optimizer == "nesterov":
            opt_params["momentum"] = fed.server_momentum
        self.server_opt = make_server_optimizer(fed.server_optimizer, **opt_params)
        self.server_lr = float(getattr(self.server_opt, "lr", 1.0))
        self.omniscient = fed.omniscient if fed.omniscient is not None else \
            bool(getattr(self.attack, "omniscient", False))

        self.compressor = build_compressor(scenario.transport)
        self.codec_label = self.compressor.codec.spec
        # spot-check replay (defenses/spot_check.py): a verifier recomputes a peer's round from what
        # it committed to (the global model, its batch seed, its assigned = clean data)
        self.replays_work = any(getattr(st, "replays_work", False) for st in stages_)
        self.committed_data: StackedData | None = None
        if self.replays_work:
            _check_replayable(scenario, self.compressor.codec)
            if Surface.DATA not in self.attack.surfaces:  # every client trains on the data it was dealt
                self.committed_data = self.data
            elif self._phases[0][0] is not self.data:  # the clean phase's data (a windowed data attack)
                self.committed_data = self._phases[0][0]
            else:
                self.committed_data = StackedData.stack(clean).to(self.device)
        net = scenario.transport.network
        self.network = Network(
            NetworkConfig(**{k: getattr(net, k) for k in net.__dataclass_fields__}), n, self._np["network"]
        )
        # what each client carries across rounds (fresh for the run)
        self.states = ClientStates(n, self.device)
        # the provenance gate: admission before the first round (data is fixed for the run)
        self.excluded: dict[int, str] = {}
        self.admission: Any = None
        if self.gate is not None:
            self.admission = self._admit(clean, clients, scenario.workload.name,
                                         ds.corpus, [pool[p] for p in parts], ds.source)
            self.excluded = dict(self.admission.excluded)

    def _admit(self, clean: list[ClientData], actual: list[ClientData], dataset: str,
               corpus: Any = None, rows: list[np.ndarray] | None = None, data_source: str = "") -> Any:
        from .provenance import admit

        forgers: dict[int, AttackContext] = {}
        if Surface.PROVENANCE in self.attack.surfaces and self.malicious:
            f, d = len(self.malicious), self.spec.dim
            zeros = torch.zeros((f, d), dtype=torch.float32, device=self.device)
            base = AttackContext(
                round=0, n_clients=len(actual), malicious=tuple(self.malicious), own_updates=zeros,
                visible_updates=zeros, global_params=self.params0, generator=self._torch["attack"],
                num_classes=self.num_classes, weights=self.weights, malicious_rows=tuple(self.malicious),
            )
            forgers = {c: base for c in self.malicious}
        return admit(
            self.gate,
            clean=dict(enumerate(clean)),
            actual=dict(enumerate(actual)),
            dataset=dataset,
            enrollment=self.enrollment,
            log_rng=self._np["provenance"],
            origin=f"redteam.federation/seed-{self.scenario.seed}",
            forgers=forgers,
            attack=self.attack,
            corpus=corpus,  # documents (text): the manifests list the files the windows came from
            rows=dict(enumerate(rows)) if rows is not None else None,
            data_source=data_source,
        )

    def _untrained_reference(self) -> dict[str, float | None]:
        """What "learned nothing" means on this test set (the defender's summary flags a defense
        whose clean model is no better): the untrained global model's accuracy and loss (the
        fresh initialisation, before any warm-up or ``start_from``), and the
        majority-class rate of the test labels (``None`` where the labels are not class ids).
        Evaluation only: no random stream advances, so no other number of the run changes."""
        acc, loss = self.trainer.evaluate(self.params_init, self.test_x, self.test_y)
        chance = None
        y = self.test_y
        if y.dtype in (torch.int64, torch.int32, torch.int16, torch.uint8) and y.numel() and int(y.min()) >= 0:
            chance = float(torch.bincount(y.reshape(-1).long()).max()) / y.numel()
        return {"accuracy": acc, "loss": loss if math.isfinite(loss) else None, "chance_accuracy": chance}

    # ------------------------------------------------------------------ one run
    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
        """Run every round. A Federation runs once: its random streams advance as it goes."""
        if self._ran:
            raise RedteamError("this Federation has already run; build a new one for another run")
        self._ran = True
        sc = self.scenario
        n = sc.federation.clients
        params = self.params0.clone()
        opt_state = self.server_opt.init(params)
        online = np.ones(n, dtype=bool)
        prev_update: torch.Tensor | None = None
        memory = DefenseMemory(regrouped=self.hierarchy.grouping == "random" and self.hierarchy.n_groups > 1)
        records: list[RoundRecord] = []
        # ground truth for scoring is the round's roles (self.plan.roles): with an attack that
        # acts on nothing (the baseline's "none"), or outside its window, the would-be
        # attackers are honest clients
        windowed = not sc.window.is_full
        banned: dict[int, str] = dict(self.excluded)  # gate exclusions, then equivocation bans
        signed = self.signed_chunks is not None
        verifier = self.signed_chunks.verifier(self.enrollment.public) if signed else None
        history: dict[int, tuple[ChunkDelivery, ...]] = {}
        keep = int(getattr(self.attack, "history_rounds", 0) or 0)
        t_run = time.perf_counter()
        untrained = self._untrained_reference()
        self._start_quality: dict[str, Any] = {}
        if self._start_info:  # the model the run starts from, as evaluated before round 0
            s_acc, s_loss = self.trainer.evaluate(self.params0, self.test_x, self.test_y)
            self._start_quality = {"accuracy": s_acc, "loss": s_loss if math.isfinite(s_loss) else None}

        for rnd in range(sc.federation.rounds):
            t0 = time.perf_counter()
            if rnd > 0:
                online = self.network.churn(online, self._np["network"])
            # the round's plan: who is drawn (K of the online clients), who acts maliciously,
            # and the data of the round (clean outside the attack window)
            active = self.plan.active(rnd)
            self.roles = self.plan.roles(rnd, bool(self.attack.surfaces))
            self.data, self.weights = self._phases[int(active)]
            drawn = self.plan.draw(rnd, np.flatnonzero(online).astype(np.int64))
            selected = np.zeros(n, dtype=bool)
            selected[drawn] = True
            part = drawn
            if banned:
                part = part[~np.isin(part, np.fromiter(banned, dtype=np.int64, count=len(banned)))]
            part_t = torch.as_tensor(part, dtype=torch.long, device=self.device)
            dropped: dict[int, str] = {c: why for c, why in banned.items() if selected[c]}
            rejected: dict[int, str] = dict(dropped)
            extra: dict[str, Any] = {}
            if rnd == 0 and self.admission is not None:
                extra["provenance_gate"] = self.admission.summary()
            if rnd == 0:
                extra["untrained"] = untrained
                if self._start_info:
                    extra["start"] = {**self._start_info, **self._start_quality}
            if windowed:
                extra["attack_active"] = active
            accepted = [False] * n
            tx = None
            received = stages.Received()
            if part.size:
                hook, hook_rows = stages.training_hook(self, rnd, part, params, prev_update)
                sent = stages.train(self, part_t, params, hook, hook_rows)
                sent, actx = stages.craft(self, rnd, part, sent, params, prev_update)
                comp = stages.encode(self, part_t, sent)
                chunked = stages.chunk(self, rnd, part, comp, params, signed)
                tx, timing = stages.transport(self, rnd, chunked, actx, verifier, history, keep)
                extra.update(timing)
                received = stages.receive(self, rnd, part, tx)
                dropped.update(received.dropped)
                rejected.update(received.rejected)
                banned.update(received.banned)
                extra.update(received.extra)
            else:
                actx = None

            t_def = time.perf_counter()
            merged = stages.defend(self, rnd, received, tx, params, prev_update, memory, actx)
            for c, ok in merged.accepted.items():
                accepted[c] = accepted[c] or ok
            rejected.update(merged.rejected)
            extra.update(merged.extra)
            defense_time = time.perf_counter() - t_def

            contributors = [c for c in range(n) if accepted[c]]
            params, opt_state, prev_update, refusal = stages.server_step(
                self, params, merged.aggregate, opt_state, contributors, received.rows, received.clients)
            if not contributors:  # no update taken: what the server did ([federation] empty_round)
                extra["empty_round"] = sc.federation.empty_round
            refused = merged.refused + ([refusal] if refusal is not None else [])
            if refused:
                extra["refused"] = refused
            acc, loss, scored = stages.evaluate(self, params)
            extra.update(scored)
            participating = [bool(x) for x in selected]
            for c in np.flatnonzero(~online):
                dropped.setdefault(int(c), "offline (churn)")
            # a client banned or excluded for what its attack did stays an attacker in the ground
            # truth outside the window too: judging its ban there is a true positive, not a false one
            truth = self.roles.copy()
            if banned and self.attack.surfaces:
                for c in banned:
                    truth[c] = truth[c] or bool(self.is_malicious[c])
            rec = RoundRecord(
                round=rnd,
                accuracy=acc,
                loss=loss,
                accepted=accepted,
                malicious=truth.tolist(),
                participating=participating,
                dropped={k: v for k, v in sorted(dropped.items()) if participating[k] or "churn" in v},
                rejected=dict(sorted(rejected.items())),
                bytes_on_wire=int(tx.bytes_on_wire) if tx is not None else 0,
                sim_time_s=float(tx.round_time_s) if tx is not None else 0.0,
                wall_time_s=time.perf_counter() - t0,
                defense_time_s=defense_time,
                extra=extra,
            )
            records.append(rec)
            if on_round is not None:
                on_round(rec)

        self.final_params = params
        return RunResult(
            attack=self.attack_spec.name,
            defense=sc.defense_label(),
            records=records,
            malicious=list(self.malicious),
            params={"attack": dict(self.attack_spec.params), "defense": repr(self.defense),
                    **({"upper_defense": repr(self.upper_defense)} if self.hierarchy.depth > 1 else {})},
            wall_time_s=time.perf_counter() - t_run,
        )


def _check_replayable(scenario: Scenario, codec: Any) -> None:
    """A spot-check verifier can replay a peer's round only from inputs it can hold: refuse,
    naming the setting, a scenario whose local procedure carries client state or whose codec
    changes the update (the replayed update could never match what the peer sent)."""
    fed = scenario.federation
    why = []
    if fed.local_optimizer != "sgd":
        why.append(f"[federation] local_optimizer = {fed.local_optimizer!r} keeps per-client moments the verifier "
                   "does not hold (use \"sgd\")")
    if fed.sampling != "with_replacement":
        why.append(f"[federation] sampling = {fed.sampling!r} keeps each client's place in its data stream "
                   "(use \"with_replacement\")")
    if fed.client_momentum:
        why.append(f"[federation] client_momentum = {fed.client_momentum} sends a momentum of past rounds "
                   "(use 0)")
    if not getattr(codec, "lossless", False):
        why.append(f"[transport] codec = {codec.spec!r} is lossy: the update received is not the update trained "
                   "(use \"none\")")
    if why:
        raise InvalidParameter("[defense] spot_check replays a peer's local training from the round's inputs, "
                               "which this scenario does not allow: " + "; ".join(why))


def _fill_image_shape(spec: PluginSpec, shape: tuple[int, ...]) -> PluginSpec:
    """``spec`` with ``image_shape = shape`` where its attack (or a part of a composition) has
    that parameter and leaves it unset."""
    import dataclasses

    from ..registry import ATTACKS

    def fill(name: str, params: dict[str, Any]) -> dict[str, Any]:
        out = dict(params)
        try:
            cls = ATTACKS.get(name)
        except RedteamError:
            return out
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        if "image_shape" in fields and "image_shape" not in out:
            out["image_shape"] = list(shape)
        parts = out.get("attacks")
        if isinstance(parts, (list, tuple)):
            out["attacks"] = [({**t, **fill(t["name"], {k: v for k, v in t.items() if k != "name"})}
                               if isinstance(t, dict) and isinstance(t.get("name"), str) else t) for t in parts]
        return out

    filled = fill(spec.name, dict(spec.params))
    return spec if filled == dict(spec.params) else PluginSpec(spec.name, filled)


def _check_poisoned_labels(name: str, attack: Any, data: ClientData, client: int, num_classes: int) -> None:
    """A data attack must keep a classifier's labels among the workload's classes: a label
    out of range would otherwise crash deep inside the loss (e.g. ``label_flip``'s default
    ``num_classes = 10`` on a 4-class workload)."""
    y = data.y
    if num_classes <= 0 or y.dtype.is_floating_point or y.ndim != 1 or not y.numel():
        return
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= num_classes:
        hint = (f"; set num_classes = {num_classes} in [attack]" if getattr(attack, "num_classes", num_classes)
                != num_classes else "")
        raise InvalidParameter(
            f"attack {name!r}: poison_data gave client {client} labels in [{lo}, {hi}], outside the "
            f"workload's {num_classes} classes [0, {num_classes}){hint}"
        )
