"""The round loop: one federation, attacked and defended, deterministic under its seed.

One round, each stage a function of
:mod:`.stages`::

    churn → broadcast (the model sent: the global one, or a ``prepares_broadcast`` defense's)
          → train (all clients batched; poisoned data, or a training hook, for attackers;
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

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InvalidParameter, RedteamError
from ..merge import DefenseMemory, Hierarchy
from ..scenario import PluginSpec, Scenario
from ..topology import DATA_PARALLEL, Support
from ..transport.network import Network, NetworkConfig
from ..types import AttackContext, ChunkDelivery, ClientData, Defense, RoundRecord, Surface
from . import stages
from .builders import build_compressor, build_upper_defense, needs_server_data
from .rounds import RunResult, adopt, record, result_of, standard_extra
from .sampling import RoundPlan
from .server_opt import make_server_optimizer
from .setup import RunSetup, build_setup, random_streams, resolve_device
from .stages import RoundInputs
from .training import StackedData

__all__ = ["Federation", "RunResult", "resolve_device", "random_streams", "ServerPlacement", "STREAMS"]

#: items in a client's assigned page (the validator's assigned batch; attacks/verification.py)
ASSIGNED_PAGE = 32

#: the data-parallel regime's random streams (appended streams never change the earlier ones:
#: SeedSequence children are indexed)
STREAMS = ("split", "roles", "init", "train", "network", "attack", "defense", "codec", "merge", "root",
           "keys", "provenance", "sampling", "privacy")


@dataclass
class ServerPlacement:
    """The data-parallel (and asynchronous) server's answers to :func:`~.setup.build_setup`:
    malicious clients drawn uniformly, each merge party's rule sized for a round of K clients,
    and the server's root sample held out of the training pool."""

    scenario: Scenario
    server_root_samples: int = 64
    support: Support = DATA_PARALLEL
    streams: tuple[str, ...] = STREAMS

    def check_workload(self, workload: Any) -> None:
        return None

    def place(self, n: int, rng: Any) -> list[int]:
        f = self.scenario.federation.n_malicious
        return sorted(rng["roles"].choice(n, size=f, replace=False).tolist()) if f else []

    def defense_sizes(self, malicious: list[int]) -> tuple[int | None, int | None]:
        # a round holds K clients (clients_per_round): the rules' capacity and their malicious-count
        # defaults are per round, so they are sized for K and the attackers K can hold
        fed = self.scenario.federation
        k = fed.clients_per_round or fed.clients
        f_round = min(fed.n_malicious, k) if fed.attacker_selection != "count" else int(fed.attackers_per_round or 0)
        return f_round, k

    def root_size(self, pool: int, defense: Defense) -> int | None:
        wanted = self.scenario.federation.root_samples
        if wanted is None:
            wanted = self.server_root_samples
        elif wanted == "auto":
            upper = build_upper_defense(self.scenario.hierarchy, n_malicious=self.scenario.federation.n_malicious)
            wanted = self.server_root_samples if needs_server_data(defense, upper) else 0
        return min(int(wanted), pool // 10)


def run_warmup(cls: Any) -> Callable[[Scenario, torch.Tensor, torch.device], torch.Tensor]:
    """A warm-up computed by a run of class ``cls`` (its regime's honest run)."""
    def compute(ws: Scenario, start: torch.Tensor, device: torch.device) -> torch.Tensor:
        run = cls(ws, device=device.type if device.index is None else str(device), start=start)
        run.run()
        return run.final_params.detach().clone()

    return compute


class Federation:
    """A data-parallel federation built from a scenario. ``run()`` executes all rounds.

    ``attack`` overrides the scenario's attack (used for the no-attack baseline).
    ``server_root_samples`` is the size of the server's root sample when the scenario's
    ``[federation] root_samples`` is unset. ``start`` is the model round 0 starts from
    (default: the scenario's ``start_from`` / warm-up, else the fresh initialisation);
    ``warmup_dir`` where warm-ups are kept (:mod:`.warmup`). What every regime shares is in
    ``setup`` (:class:`~.setup.RunSetup`); the server's own parts (network, codec, hierarchy,
    provenance gate, root sample) are this object's attributes, read by the stages.
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
        compute_warmup: Callable[[Scenario, torch.Tensor, torch.device], torch.Tensor] | None = None,
        support: Support = DATA_PARALLEL,
    ) -> None:
        placement = ServerPlacement(scenario, server_root_samples, support)
        self.setup: RunSetup = build_setup(scenario, placement, device=device, attack=attack, warmup_dir=warmup_dir,
                                           start=start, compute_warmup=compute_warmup or run_warmup(Federation))
        su = self.setup
        adopt(self, su)
        self.scenario = scenario
        self._ran = False
        n = scenario.federation.clients
        fed = scenario.federation
        surfaces = set(self.attack.surfaces)
        if not scenario.window.is_full and surfaces & {Surface.PROVENANCE, Surface.HIERARCHY}:
            raise InvalidParameter(f"[attack].window: attack {self.attack_spec.name!r} acts on "
                                   f"{', '.join(sorted(surfaces & {Surface.PROVENANCE, Surface.HIERARCHY}))} before the "
                                   "first round (enrolment, merge groups), so it cannot wait for a window")
        self.upper_defense = build_upper_defense(scenario.hierarchy, n_malicious=fed.n_malicious)
        if scenario.hierarchy.depth > 1 and any(st.prepares_broadcast for st in self.upper_defense.parts()):
            raise InvalidParameter("[hierarchy].upper_defense: a rule that prepares the model the server sends "
                                   "(prepares_broadcast) runs as the [defense] of the bottom groups, not above them")
        self.hierarchy = Hierarchy(scenario.hierarchy.fan_out, scenario.hierarchy.depth, scenario.hierarchy.grouping)
        part = su.partition
        assert part is not None
        stages_ = self.defense.parts()
        self.signed_chunks = next((s for s in stages_ if s.acts_at == "transport"), None)
        self.gate = next((s for s in stages_ if s.acts_at == "admission"), None)
        self.enrollment = None
        if self.signed_chunks is not None or self.gate is not None:
            from .provenance import Enrollment

            self.enrollment = Enrollment.derive(n, self.rng["keys"])
        # public names: hash grouping reads them, and an identity-grinding attacker chooses its own
        self.identities: dict[int, str] = {}
        if Surface.HIERARCHY in self.attack.surfaces:
            self.identities = {c: str(self.attack.choose_identity(c, self.hierarchy.n_groups)) for c in self.malicious}
        # each client's assigned page (verification of work, defenses/gauntlet.py): the first
        # ASSIGNED_PAGE items of the data it was dealt, public as a permissionless trainer's data
        # assignment is, so a validator can score an update on the data its peer was meant to train on
        self.assigned = StackedData.stack([ClientData(c.x[:ASSIGNED_PAGE], c.y[:ASSIGNED_PAGE])
                                           for c in part.clean]).to(self.device)
        # who takes part in each round and whether the attack acts in it (.sampling)
        self.plan = RoundPlan(fed, scenario.window, self.is_malicious, self.rng["sampling"])
        self.data = part.data
        self.weights = self.data.sizes.to(torch.float32).to(self.device)
        # the data and sample weights of a round the attack acts in (index 1) and of one it
        # does not act in (index 0): poisoned data is used only inside the attack window
        self.phases = ((self.data, self.weights),) * 2
        if not scenario.window.is_full and part.clean_data is not part.data:
            self.phases = ((part.clean_data, part.clean_data.sizes.to(torch.float32).to(self.device)),
                           (self.data, self.weights))
        ds = su.dataset
        self.root = (StackedData.stack([ClientData(ds.train_x[part.root], ds.train_y[part.root])]).to(self.device)
                     if part.root.size else None)
        self.probes = su.probes
        opt_params: dict[str, Any] = {}
        if fed.server_lr is not None:
            opt_params["lr"] = fed.server_lr
        if fed.server_optimizer == "nesterov":
            opt_params["momentum"] = fed.server_momentum
        self.server_opt = make_server_optimizer(fed.server_optimizer, **opt_params)
        self.server_lr = float(self.server_opt.lr)
        self.omniscient = fed.omniscient if fed.omniscient is not None else bool(self.attack.omniscient)

        self.compressor = build_compressor(scenario.transport)
        self.codec_label = self.compressor.codec.spec
        # spot-check replay (defenses/spot_check.py): a verifier recomputes a peer's round from what
        # it committed to (the global model, its batch seed, its assigned = clean data)
        self.replays_work = any(st.replays_work for st in stages_)
        self.committed_data: StackedData | None = None
        if self.replays_work:
            _check_replayable(scenario, self.compressor.codec)
            self.committed_data = part.clean_data
        net = scenario.transport.network
        self.network = Network(
            NetworkConfig(**{k: getattr(net, k) for k in net.__dataclass_fields__}), n, self.rng["network"]
        )
        # [privacy]: passive observers (redteam.privacy.observe) and secure aggregation (.secure)
        self.privacy = scenario.privacy
        from ..privacy.observe import Observers
        from .secure import check_secure_aggregation

        self.observers = Observers.of(self.privacy) if self.privacy is not None else Observers()
        check_secure_aggregation(self.privacy, self.defense)
        # the provenance gate: admission before the first round (data is fixed for the run)
        self.excluded: dict[int, str] = {}
        self.admission: Any = None
        if self.gate is not None:
            self.admission = self._admit(part.clean, part.clients, scenario.workload.name,
                                         ds.corpus, [part.pool[p] for p in part.parts], ds.source)
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
                visible_updates=zeros, global_params=self.params0, generator=self.torch_rng["attack"],
                num_classes=self.num_classes, weights=self.weights, malicious_rows=tuple(self.malicious),
            )
            forgers = {c: base for c in self.malicious}
        return admit(
            self.gate,
            clean=dict(enumerate(clean)),
            actual=dict(enumerate(actual)),
            dataset=dataset,
            enrollment=self.enrollment,
            log_rng=self.rng["provenance"],
            origin=f"redteam.federation/seed-{self.scenario.seed}",
            forgers=forgers,
            attack=self.attack,
            corpus=corpus,  # documents (text): the manifests list the files the windows came from
            rows=dict(enumerate(rows)) if rows is not None else None,
            data_source=data_source,
        )

    def inputs(self, rnd: int, part: np.ndarray, params: torch.Tensor, prev_update: torch.Tensor | None
               ) -> RoundInputs:
        """What the stages of round ``rnd`` take (an asynchronous job's base version): its
        participants, their roles and data (clean outside the attack window), the model it
        starts from."""
        data, weights = self.phases[int(self.plan.active(rnd))]
        roles = self.plan.roles(rnd, bool(self.attack.surfaces))
        return RoundInputs(rnd=rnd, part=part, part_t=torch.as_tensor(part, dtype=torch.long, device=self.device),
                           roles=roles, data=data, weights=weights, params=params, prev_update=prev_update)

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
        banned: dict[int, str] = dict(self.excluded)  # gate exclusions, then equivocation bans
        signed = self.signed_chunks is not None
        verifier = self.signed_chunks.verifier(self.enrollment.public) if signed else None
        history: dict[int, tuple[ChunkDelivery, ...]] = {}
        keep = int(self.attack.history_rounds or 0)
        t_run = time.perf_counter()
        start_quality = self.setup.start_record()

        for rnd in range(sc.federation.rounds):
            t0 = time.perf_counter()
            if rnd > 0:
                online = self.network.churn(online, self.rng["network"])
            # the round's plan: who is drawn (K of the online clients), who acts maliciously,
            # and the data of the round (clean outside the attack window)
            ban_ids = np.fromiter(banned, dtype=np.int64, count=len(banned)) if banned else None
            drawn = self.plan.draw(rnd, np.flatnonzero(online).astype(np.int64), ban_ids)
            selected = np.zeros(n, dtype=bool)
            selected[drawn] = True
            part = drawn
            if ban_ids is not None:
                part = part[~np.isin(part, ban_ids)]
                # a banned client takes no place among the K drawn, and is recorded as rejected
                # with its reason in every round it is online (with or without K)
                selected[ban_ids[online[ban_ids]]] = True
            # the attack acts in the round only when its window is open *and* an attacker takes
            # part: a window round that drew no attacker (K of N) is no active attack round, so it
            # cannot be the window's end E of the durability metrics. Read from the attackers, not
            # the attack, so the baseline marks the same rounds as the attacked run.
            active = self.plan.active(rnd) and bool(self.is_malicious[part].any())
            rin = self.inputs(rnd, part, params, prev_update)
            # the model the server sends: the global one, or what a defense prepares of it
            # (prepares_broadcast); the round trains from it and the server steps from it
            sent_from: dict[str, Any] = {}
            if part.size:
                rin, sent_from = stages.broadcast(self, rin)
            self.roles = rin.roles
            dropped: dict[int, str] = {c: why for c, why in banned.items() if selected[c]}
            rejected: dict[int, str] = dict(dropped)
            extra: dict[str, Any] = {}
            if rnd == 0 and self.admission is not None:
                extra["provenance_gate"] = self.admission.summary()
            extra.update(standard_extra(self.setup, rnd, active=active, start=start_quality))
            extra.update({k: v for k, v in sent_from.items() if k != "refused"})
            accepted = [False] * n
            tx = None
            received = stages.Received()
            trained = None
            pv = self.privacy
            observing = pv is not None and self.observers.inversion is not None and rnd == pv.observe_round
            train_state = self.torch_rng["train"].get_state() if observing else None
            secure = None
            if part.size:
                hook, hook_rows = stages.training_hook(self, rin)
                trained = stages.train(self, rin, hook, hook_rows)
                sent, actx = stages.craft(self, rin, trained.sent)
                comp = stages.encode(self, rin.part_t, sent)
                chunked = stages.chunk(self, rnd, part, comp, rin.params, signed)
                tx, timing = stages.transport(self, rnd, chunked, actx, verifier, history, keep, trained.client_steps)
                extra.update(timing)
                received = stages.receive(self, rnd, part, tx)
                if pv is not None and pv.secure_aggregation:  # the server reads bucket sums only
                    from .secure import secure_aggregate

                    secure = secure_aggregate(self, rnd, received)
                    received = secure.received
                    extra.update(secure.extra)
                dropped.update(received.dropped)
                rejected.update(received.rejected)
                banned.update(received.banned)
                extra.update(received.extra)
            else:
                actx = None

            t_def = time.perf_counter()
            if secure is not None:
                from .secure import bucket_weights, expand_verdicts

                rin_s = dataclasses.replace(rin, weights=bucket_weights(self, rin, secure))
                merged = stages.defend(self, rin_s, received, tx, memory, actx, trained, summed=secure.counts)
                merged.accepted, merged.rejected = expand_verdicts(secure, merged.accepted, merged.rejected)
            else:
                merged = stages.defend(self, rin, received, tx, memory, actx, trained)
            for c, ok in merged.accepted.items():
                accepted[c] = accepted[c] or ok
            rejected.update(merged.rejected)
            extra.update(merged.extra)
            defense_time = time.perf_counter() - t_def

            contributors = [c for c in range(n) if accepted[c]]
            params, opt_state, prev_update, refusal = stages.server_step(
                self, rin.params, merged.aggregate, opt_state, contributors, received.rows, received.clients)
            if not contributors:  # no update taken: what the server did ([federation] empty_round)
                extra["empty_round"] = sc.federation.empty_round
            refused = (list(sent_from.get("refused", [])) + merged.refused
                       + ([refusal] if refusal is not None else []))
            if refused:
                extra["refused"] = refused
            acc, loss, scored = stages.evaluate(self, params)
            extra.update(scored)
            if observing and part.size:
                extra["privacy"] = self._observe_update(rin, received, secure, merged, train_state, contributors)
            if pv is not None and rnd == sc.federation.rounds - 1:
                extra.setdefault("privacy", {}).update(self._observe_model(params))
            participating = [bool(x) for x in selected]
            for c in np.flatnonzero(~online):
                dropped.setdefault(int(c), "offline (churn)")
            # a client banned or excluded for what its attack did stays an attacker in the ground
            # truth outside the window too: judging its ban there is a true positive, not a false one
            truth = rin.roles.copy()
            if banned and self.attack.surfaces:
                for c in banned:
                    truth[c] = truth[c] or bool(self.is_malicious[c])
            rec = record(
                rnd, acc, loss, accepted=accepted, malicious=truth.tolist(), participating=participating,
                dropped={k: v for k, v in sorted(dropped.items()) if participating[k] or "churn" in v},
                rejected=rejected, bytes_on_wire=int(tx.bytes_on_wire) if tx is not None else 0,
                sim_time_s=float(tx.round_time_s) if tx is not None else 0.0, started=t0,
                defense_time_s=defense_time, extra=extra)
            records.append(rec)
            if on_round is not None:
                on_round(rec)

        self.final_params = params
        return result_of(self.setup, records, time.perf_counter() - t_run,
                         **({"upper_defense": repr(self.upper_defense)} if self.hierarchy.depth > 1 else {}))


    def _observe_update(self, rin: RoundInputs, received: Any, secure: Any, merged: Any, train_state: Any,
                        contributors: list[int]) -> dict[str, Any]:
        """The inversion observer's reconstruction of this round's row (or aggregate), scored."""
        from ..privacy.observe import invert

        pv = self.privacy
        gen = self.torch_rng["privacy"]
        if pv.observe == "aggregate":
            if not contributors:
                return {"inversion": {"note": "no update was applied this round: nothing to invert"}}
            observed, clients = merged.aggregate, contributors
        else:
            honest = [int(c) for c in rin.part.tolist() if not bool(rin.roles[c])]
            victim = pv.victim if pv.victim is not None else (honest[0] if honest else None)
            rows = {int(c): k for k, c in enumerate(received.clients)}
            if secure is not None and victim in secure.masked:
                observed = secure.masked[victim]
            elif victim is not None and victim in rows and secure is None:
                observed = received.rows[rows[victim]]
            else:
                return {"inversion": {"note": f"client {victim} sent no row in round {rin.rnd}: nothing to invert"}}
            clients = [int(victim)]
        got = invert(self, self.observers.inversion, rin, observed, clients, train_state, gen)
        got["observer"] = self.observers.inversion_name
        got["observe"] = pv.observe
        return {"inversion": got}

    def _observe_model(self, params: torch.Tensor) -> dict[str, Any]:
        """The membership observer's scores on the final model, and the run's ε."""
        from ..privacy.observe import membership, run_epsilon

        pv = self.privacy
        out: dict[str, Any] = {}
        if self.observers.membership is not None:
            got = membership(self, self.observers.membership, params, pv.candidates, self.torch_rng["privacy"],
                             self.rng["privacy"])
            got["observer"] = self.observers.membership_name
            out["membership"] = got
        eps = run_epsilon(self, pv.delta)
        if eps is not None:
            out["dp"] = eps
        return out


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
    if not codec.lossless:
        why.append(f"[transport] codec = {codec.spec!r} is lossy: the update received is not the update trained "
                   "(use \"none\")")
    if why:
        raise InvalidParameter("[defense] spot_check replays a peer's local training from the round's inputs, "
                               "which this scenario does not allow: " + "; ".join(why))
