"""The round loop: one federation, attacked and defended, deterministic under its seed.

One round (DESIGN.md, "The flow of one round")::

    churn → local training (all clients batched; poisoned data for attackers)
          → delta = local − global → update-poisoning attack on the malicious rows
          → compress (error feedback) → chunk + manifest (signed with ``signed_chunks``)
          → simulated transport (transport attacks act here) → verify headers and
            chunks → decode (untrusted) → hierarchical merge with the defense
            (compromised sub-aggregators act here) → server optimizer → evaluate

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
clients see the same batches and the same network either way.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable

import numpy as np
import torch

from ..errors import DecodeError, InvalidParameter, RedteamError
from ..merge import Hierarchy, assign_groups, hierarchical_merge
from ..scenario import PluginSpec, Scenario
from ..transport.chunking import UpdateManifest, build_manifest, new_nonce, params_digest
from ..transport.network import HEADER_INDEX, Network, NetworkConfig
from ..transport.signing import sign_update
from ..types import AttackContext, ChunkDelivery, ClientData, RoundRecord, ServerContext, Surface
from .builders import build_attack, build_compressor, build_defense, build_workload
from .params import ParamSpec
from .partition import partition
from .server_opt import make_server_optimizer
from .training import BatchedTrainer, LocalTraining, StackedData

__all__ = ["Federation", "RunResult", "resolve_device"]

# appended streams never change the earlier ones (SeedSequence children are indexed)
_STREAMS = ("split", "roles", "init", "train", "network", "attack", "defense", "codec", "merge", "root",
            "keys", "provenance")


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
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        device: str = "cpu",
        attack: PluginSpec | None = None,
        server_root_samples: int = 64,
    ) -> None:
        self.scenario = scenario
        self._ran = False
        self.device = resolve_device(device)
        self.attack_spec = attack if attack is not None else scenario.attack
        fed = scenario.federation
        ss = np.random.SeedSequence(scenario.seed)
        seeds = dict(zip(_STREAMS, ss.spawn(len(_STREAMS))))
        self._np = {k: np.random.default_rng(s) for k, s in seeds.items()}
        self._torch = {
            k: torch.Generator(device="cpu").manual_seed(int(s.generate_state(1, np.uint64)[0] >> np.uint64(1)))
            for k, s in seeds.items()
        }

        self.workload = build_workload(scenario.workload.name, dict(scenario.workload.params))
        ds = self.workload.load(scenario.seed)
        self.num_classes = ds.num_classes
        n = fed.clients
        pool = np.arange(len(ds.train_y))
        # the server's small trusted root set (FLTrust, loss checks), held out of the pool
        root_k = min(server_root_samples, len(pool) // 10)
        perm = self._np["split"].permutation(len(pool))
        root_idx, pool = np.sort(perm[:root_k]), np.sort(perm[root_k:])
        parts = partition(
            ds.train_y.numpy()[pool],
            n,
            fed.partition,
            self._np["split"],
            alpha=fed.alpha,
            shards_per_client=fed.shards_per_client,
            beta=fed.quantity_beta,
            min_samples=fed.min_samples,
        )
        f = fed.n_malicious
        self.malicious = sorted(self._np["roles"].choice(n, size=f, replace=False).tolist()) if f else []
        self.is_malicious = np.zeros(n, dtype=bool)
        self.is_malicious[self.malicious] = True

        self.attack = build_attack(self.attack_spec)
        self.defense = build_defense(scenario.defense)
        self.upper_defense = build_defense(scenario.hierarchy.upper_defense)
        self.hierarchy = Hierarchy(scenario.hierarchy.fan_out, scenario.hierarchy.depth, scenario.hierarchy.grouping)
        stages = tuple(getattr(self.defense, "stages", ()) or (self.defense,))
        self.signed_chunks = next((s for s in stages if getattr(s, "acts_at", None) == "transport"), None)
        self.gate = next((s for s in stages if getattr(s, "acts_at", None) == "admission"), None)
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
            clients.append(cd)
        self.data = StackedData.stack(clients).to(self.device)
        self.weights = self.data.sizes.to(torch.float32).to(self.device)
        self.test_x, self.test_y = ds.test_x.to(self.device), ds.test_y.to(self.device)
        self.root = StackedData.stack([ClientData(ds.train_x[root_idx], ds.train_y[root_idx])]).to(self.device)
        # targeted / backdoor attacks say which test inputs measure their success (ASR);
        # the baseline is scored on the same inputs, so its ASR is the natural rate
        self._targeted = None
        for candidate in (self.attack, build_attack(scenario.attack)):
            targeted_test = getattr(candidate, "targeted_test", None)
            if targeted_test is None:
                continue
            try:
                tx, ty = targeted_test(ds.test_x, ds.test_y)
            except AttributeError:  # a composition without a targeted part
                continue
            self._targeted = (tx.to(self.device), ty.to(self.device))
            break

        model = self.workload.build_model(self._torch["init"])
        self.spec = ParamSpec.of(model)
        self.params0 = self.spec.flatten(model).to(self.device)
        self.trainer = BatchedTrainer(self.workload, model.to(self.device), self.spec)
        self.local = LocalTraining(
            steps=fed.local_steps, epochs=fed.local_epochs, batch_size=fed.batch_size, lr=fed.lr, prox_mu=fed.prox_mu
        )
        opt_params: dict[str, Any] = {}
        if fed.server_lr is not None:
            opt_params["lr"] = fed.server_lr
        if fed.server_optimizer == "nesterov":
            opt_params["momentum"] = fed.server_momentum
        self.server_opt = make_server_optimizer(fed.server_optimizer, **opt_params)

        self.compressor = build_compressor(scenario.transport)
        self.codec_label = self.compressor.codec.spec
        net = scenario.transport.network
        self.network = Network(
            NetworkConfig(**{k: getattr(net, k) for k in net.__dataclass_fields__}), n, self._np["network"]
        )
        # the provenance gate: admission before the first round (data is fixed for the run)
        self.excluded: dict[int, str] = {}
        self.admission: Any = None
        if self.gate is not None:
            self.admission = self._admit(clean, clients, scenario.workload.name)
            self.excluded = dict(self.admission.excluded)

    def _admit(self, clean: list[ClientData], actual: list[ClientData], dataset: str) -> Any:
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
        )

    # ------------------------------------------------------------------ one run
    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
        """Run every round. A Federation runs once: its random streams advance as it goes."""
        if self._ran:
            raise RedteamError("this Federation has already run; build a new one for another run")
        self._ran = True
        sc = self.scenario
        fed = sc.federation
        n = fed.clients
        d = self.spec.dim
        dev = self.device
        params = self.params0.clone()
        opt_state = self.server_opt.init(params)
        residual = torch.zeros((n, d), dtype=torch.float32, device=dev) if self.compressor.error_feedback else None
        online = np.ones(n, dtype=bool)
        prev_update: torch.Tensor | None = None
        defense_state: dict[str, dict] = {}
        records: list[RoundRecord] = []
        server_lr = float(getattr(self.server_opt, "lr", 1.0))
        # ground truth for scoring: with an attack that acts on nothing (the baseline's
        # "none"), the would-be attackers are honest clients
        truth = self.is_malicious.tolist() if self.attack.surfaces else [False] * n
        banned: dict[int, str] = dict(self.excluded)  # gate exclusions, then equivocation bans
        signed = self.signed_chunks is not None
        verifier = self.signed_chunks.verifier(self.enrollment.public) if signed else None
        history: dict[int, tuple[ChunkDelivery, ...]] = {}
        keep = int(getattr(self.attack, "history_rounds", 0) or 0)
        t_run = time.perf_counter()

        for rnd in range(fed.rounds):
            t0 = time.perf_counter()
            if rnd > 0:
                online = self.network.churn(online, self._np["network"])
            part = np.array([c for c in np.flatnonzero(online) if int(c) not in banned], dtype=np.int64)
            part_t = torch.as_tensor(part, dtype=torch.long, device=dev)
            dropped: dict[int, str] = {c: why for c, why in banned.items() if online[c]}
            rejected: dict[int, str] = dict(dropped)
            extra: dict[str, Any] = {}
            if rnd == 0 and self.admission is not None:
                extra["provenance_gate"] = self.admission.summary()
            accepted = [False] * n
            rows: list[torch.Tensor] = []
            row_clients: list[int] = []
            tx = None
            actx: AttackContext | None = None
            if part.size:
                local = self.trainer.train(params, self.data, part_t, self.local, self._torch["train"])
                deltas = local - params
                mal_pos = [k for k, c in enumerate(part) if self.is_malicious[c]]
                honest_pos = [k for k, c in enumerate(part) if not self.is_malicious[c]]
                if mal_pos and self.attack.surfaces:
                    own = deltas[mal_pos]
                    omni = fed.omniscient if fed.omniscient is not None else \
                        bool(getattr(self.attack, "omniscient", False))
                    visible = deltas[honest_pos] if (omni and honest_pos) else own
                    actx = AttackContext(
                        round=rnd,
                        n_clients=len(part),
                        malicious=tuple(int(part[k]) for k in mal_pos),
                        malicious_rows=tuple(mal_pos),
                        own_updates=own,
                        visible_updates=visible,
                        global_params=params,
                        generator=self._torch["attack"],
                        num_classes=self.num_classes,
                        weights=self.weights[part_t],
                        previous_update=prev_update,
                        server_lr=server_lr,
                        server_optimizer=str(getattr(self.server_opt, "name", "fedavg")),
                        defense=self.defense if getattr(self.attack, "adaptive", False) else None,
                    )
                    if Surface.UPDATES in self.attack.surfaces:
                        crafted = self.attack.craft_updates(actx)
                        if tuple(crafted.shape) != tuple(own.shape):
                            raise RedteamError(
                                f"attack {self.attack_spec.name!r}: craft_updates returned shape "
                                f"{tuple(crafted.shape)}, expected {tuple(own.shape)}"
                            )
                        deltas = deltas.clone()
                        deltas[mal_pos] = crafted.to(deltas.dtype)

                tx, timing = self._transport(rnd, part, part_t, deltas, residual, params, actx, verifier,
                                             history, keep)
                extra.update(timing)
                dropped.update(tx.dropped)
                # a check that failed but was repaired by a re-fetch (a tampered relayed chunk
                # fetched again from another peer) is a detection, not a rejected update
                repaired: dict[int, str] = {}
                for c, why in tx.detections.items():
                    if c in tx.payloads:
                        repaired[c] = why
                    else:
                        rejected[c] = why
                if repaired:
                    extra["repaired"] = repaired
                if tx.mismatches:
                    flagged: dict[int, int] = {}
                    for _, _, r in tx.mismatches:
                        flagged[r] = flagged.get(r, 0) + 1
                    extra["flagged_relays"] = flagged
                # gossip of signed headers: two valid signatures for one (sender, round)
                if signed:
                    for c, why in self.signed_chunks.equivocations(tx.headers, rnd).items():
                        tx.payloads.pop(c, None)
                        tx.alternates.pop(c, None)
                        dropped[c] = rejected[c] = why
                        if self.signed_chunks.ban:
                            banned[c] = f"banned in round {rnd}: {why}"
                for c in part:
                    c = int(c)
                    if c not in tx.payloads:
                        continue
                    try:
                        rows.append(self.compressor.codec.decode(tx.payloads[c], d).to(dev))
                        row_clients.append(c)
                    except DecodeError as exc:
                        dropped[c] = f"undecodable update: {exc}"
                        rejected[c] = dropped[c]

            t_def = time.perf_counter()
            if rows:
                primary = len(rows)
                groups = assign_groups(row_clients, n, self.hierarchy, self._np["merge"], self.identities)
                self._place_alternates(tx, rows, row_clients, groups, d, extra)
                upd = torch.stack(rows)
                w = self.weights[torch.as_tensor(row_clients, device=dev)]

                # one server-data oracle per round: every merge node sees the same root update
                evaluate_loss = self._evaluate_loss(params)
                root_update = self._root_update(params)

                def make_ctx(wts: torch.Tensor, rows_: list[int], key: str) -> ServerContext:
                    # a bottom node's inputs are its clients; an upper node's are its children
                    # (sub-aggregates), which carry no client ids
                    bottom = len(rows_) == int(wts.shape[0])
                    return ServerContext(
                        round=rnd,
                        n_clients=int(wts.shape[0]),
                        weights=wts,
                        global_params=params,
                        previous_update=prev_update,
                        generator=self._torch["defense"],
                        state=defense_state.get(key, {}),
                        evaluate_loss=evaluate_loss,
                        root_update=root_update,
                        client_ids=tuple(row_clients[r] for r in rows_) if bottom else (),
                    )

                ctx_h = actx if Surface.HIERARCHY in self.attack.surfaces else None

                def tamper_group(gi: int, rows_: list[int], agg: torch.Tensor) -> torch.Tensor:
                    members = tuple(row_clients[r] for r in rows_)
                    return self.attack.tamper_subaggregate(agg, gi, members, ctx_h)

                merged = hierarchical_merge(
                    upd, w, groups, self.defense, self.upper_defense, self.hierarchy.fan_out, make_ctx,
                    tamper_group if ctx_h is not None else None,
                )
                defense_state = merged.state
                for pos, c in enumerate(row_clients):
                    ok = bool(merged.accepted[pos])
                    accepted[c] = accepted[c] or ok
                    if not ok and pos < primary:
                        rejected[c] = merged.reasons.get(pos, "rejected")
                aggregate = merged.aggregate
                extra.update(_envelope_telemetry(upd, row_clients, groups, merged.state))
            else:
                aggregate = torch.zeros(d, dtype=torch.float32, device=dev)
            defense_time = time.perf_counter() - t_def

            params, opt_state = self.server_opt.step(params, aggregate.to(params.dtype), opt_state)
            prev_update = aggregate
            acc, loss = self.trainer.evaluate(params, self.test_x, self.test_y)
            if self._targeted is not None:
                extra["asr"] = self.trainer.evaluate(params, *self._targeted)[0]
            participating = [bool(x) for x in online]
            for c in np.flatnonzero(~online):
                dropped.setdefault(int(c), "offline (churn)")
            rec = RoundRecord(
                round=rnd,
                accuracy=acc,
                loss=loss,
                accepted=accepted,
                malicious=truth,
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

        return RunResult(
            attack=self.attack_spec.name,
            defense=sc.defense_label(),
            records=records,
            malicious=list(self.malicious),
            params={"attack": dict(self.attack_spec.params)},
            wall_time_s=time.perf_counter() - t_run,
        )

    # ------------------------------------------------------------ transport
    def _transport(
        self,
        rnd: int,
        part: np.ndarray,
        part_t: torch.Tensor,
        deltas: torch.Tensor,
        residual: torch.Tensor | None,
        params: torch.Tensor,
        actx: AttackContext | None,
        verifier: Any,
        history: dict[int, tuple[ChunkDelivery, ...]],
        keep: int,
    ) -> tuple[Any, dict[str, Any]]:
        """compress (client-side error feedback) → chunk → header (signed) → transmit."""
        sc = self.scenario
        comp = self.compressor.compress(deltas, residual[part_t] if residual is not None else None,
                                        self._torch["codec"])
        if residual is not None and comp.residual is not None:
            residual[part_t] = comp.residual
        digest = params_digest(params)
        keys = self.enrollment.keys if verifier is not None else None
        uploads: dict[int, tuple[UpdateManifest, list[bytes]]] = {}
        headers: dict[int, bytes] = {}
        t_sign = time.perf_counter()
        for k, c in enumerate(part):
            c = int(c)
            nonce = new_nonce(self._np["network"])
            m, chunks = build_manifest(
                comp.payloads[k], round=rnd, client=c, parent_digest=digest, codec=self.codec_label,
                chunk_size=sc.transport.chunk_size, nonce=nonce,
            )
            uploads[c] = (m, chunks)
            headers[c] = sign_update(m, keys[c]) if keys is not None else m.to_json()
        sign_s = time.perf_counter() - t_sign if keys is not None else 0.0

        tamper = None
        if actx is not None and Surface.TRANSPORT in self.attack.surfaces:
            mal = set(actx.malicious)

            def signer(m: UpdateManifest) -> bytes:
                if m.client not in mal:
                    raise RedteamError(f"signer: client {m.client} is not malicious; the attacker holds only "
                                       "its own clients' keys")
                return sign_update(m, keys[m.client]) if keys is not None else m.to_json()

            state = {
                "own_uploads": {c: (headers[c], tuple(uploads[c][1])) for c in actx.malicious if c in uploads},
                "signer": signer,
                "signed": keys is not None,
                "codec": self.compressor.codec,
                "dim": self.spec.dim,
                "chunk_size": sc.transport.chunk_size,
                "parent_digest": digest,
            }
            if keep:
                state["history"] = MappingProxyType(dict(history))
            ctx_t = dataclasses.replace(actx, state=MappingProxyType(state))
            tamper = lambda deliveries: self.attack.tamper_chunks(deliveries, ctx_t)  # noqa: E731

        verify_s = [0.0]

        def open_header(author: int, header: bytes) -> UpdateManifest:
            t = time.perf_counter()
            try:
                return verifier.open(author, header, round=rnd, parent_digest=digest)
            finally:
                verify_s[0] += time.perf_counter() - t

        tx = self.network.transmit(
            rnd, uploads, sc.federation.local_steps, self._np["network"], tamper,
            parent_digest=digest, headers=headers, open_header=open_header if verifier is not None else None,
        )
        if keep:
            history[rnd] = tuple(
                [ChunkDelivery(c, HEADER_INDEX, c, headers[c], rnd) for c in uploads]
                + [ChunkDelivery(c, i, c, ch, rnd) for c, (_, chs) in uploads.items() for i, ch in enumerate(chs)]
            )
            for old in [r for r in history if r <= rnd - keep]:
                del history[old]
        header_bytes = sum(len(h) for h in headers.values())
        timing: dict[str, Any] = {"header_bytes": header_bytes}
        if keys is not None:
            plain = sum(len(m.to_json()) for m, _ in uploads.values())
            timing.update(signature_overhead_bytes=header_bytes - plain, sign_s=sign_s, verify_s=verify_s[0])
        return tx, timing

    def _place_alternates(self, tx: Any, rows: list[torch.Tensor], row_clients: list[int],
                          groups: list[list[int]], d: int, extra: dict[str, Any]) -> None:
        """An equivocator's further updates: each goes to the bottom group after its own
        (the other sub-aggregator it was sent to). With one group there is no other
        sub-aggregator, and the receiver keeps only the first header."""
        if tx is None or not tx.alternates:
            return
        ignored = 0
        for c, payloads in sorted(tx.alternates.items()):
            if c not in row_clients:
                continue
            home = next(gi for gi, g in enumerate(groups) if row_clients.index(c) in g)
            for j, payload in enumerate(payloads):
                if len(groups) < 2:
                    ignored += 1
                    continue
                try:
                    row = self.compressor.codec.decode(payload, d).to(self.device)
                except DecodeError:
                    ignored += 1
                    continue
                groups[(home + 1 + j) % len(groups)].append(len(rows))
                rows.append(row)
                row_clients.append(c)
        extra["equivocal_rows"] = len(row_clients) - len(set(row_clients))
        if ignored:
            extra["ignored_alternates"] = ignored

    # ------------------------------------------------------------ server data
    def _evaluate_loss(self, params: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        root = self.root

        def evaluate(deltas: torch.Tensor) -> torch.Tensor:
            return self.trainer.losses(params + deltas, root.x, root.y)

        return evaluate

    def _root_update(self, params: torch.Tensor) -> Callable[[], torch.Tensor]:
        cache: dict[str, torch.Tensor] = {}
        gen = self._torch["root"]

        def update() -> torch.Tensor:
            if "g0" not in cache:
                zero = torch.zeros(1, dtype=torch.long, device=self.device)
                cache["g0"] = (self.trainer.train(params, self.root, zero, self.local, gen) - params)[0]
            return cache["g0"]

        return update


def _envelope_telemetry(
    updates: torch.Tensor, clients: list[int], groups: list[list[int]], state: dict[str, dict]
) -> dict[str, Any]:
    """Per-client norms, and the norm bound / cosines the validation filters applied.

    Feeds the envelope-utilisation metrics: how close accepted updates came to each
    validation bound. Bounds and cosines are read from the filters' explicit state
    (``bound``; ``cosine`` with the ``_rows`` a pipeline stage saw).
    """
    norms = torch.linalg.vector_norm(updates.to(torch.float64), dim=1).tolist()
    out: dict[str, Any] = {"norms": {c: norms[k] for k, c in enumerate(clients)}}
    bounds: dict[int, float] = {}
    cosines: dict[int, float] = {}
    for gi, rows in enumerate(groups):
        st = state.get(f"0.{gi}", {})
        stages = [v for k, v in sorted(st.items()) if k.isdigit() and isinstance(v, dict)] or [st]
        for stage in stages:
            seen = stage.get("_rows", list(range(len(rows))))
            if "bound" in stage and isinstance(stage["bound"], (int, float)):
                for r in rows:
                    bounds[clients[r]] = float(stage["bound"])
            cos = stage.get("cosine")
            if isinstance(cos, list) and len(cos) == len(seen):
                for local, value in zip(seen, cos):
                    cosines[clients[rows[local]]] = float(value)
                if isinstance(stage.get("threshold"), (int, float)):
                    out["cos_threshold"] = float(stage["threshold"])
    if bounds:
        out["norm_bounds"] = bounds
    if cosines:
        out["cosines"] = cosines
    return out
