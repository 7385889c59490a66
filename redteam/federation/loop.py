"""The round loop: one federation, attacked and defended, deterministic under its seed.

One round (DESIGN.md, "The flow of one round")::

    churn → local training (all clients batched; poisoned data for attackers)
          → delta = local − global → update-poisoning attack on the malicious rows
          → compress (error feedback) → chunk + manifest → simulated transport
            (transport attacks act here) → reassemble + verify → decode (untrusted)
          → hierarchical merge with the defense → server optimizer → evaluate

Randomness comes from independent streams spawned from the scenario seed (data split,
roles, model init, training batches, network, attack, defense, codec), so a run with
attack ``none`` and the same seed is the exact baseline of an attacked run: the honest
clients see the same batches and the same network either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..errors import DecodeError, InvalidParameter, RedteamError
from ..merge import Hierarchy, assign_groups, hierarchical_merge
from ..scenario import PluginSpec, Scenario
from ..transport.chunking import build_manifest, new_nonce, params_digest
from ..transport.network import Network, NetworkConfig
from ..types import AttackContext, ClientData, RoundRecord, ServerContext, Surface
from .builders import build_attack, build_compressor, build_defense, build_workload
from .params import ParamSpec
from .partition import partition
from .server_opt import make_server_optimizer
from .training import BatchedTrainer, LocalTraining, StackedData

__all__ = ["Federation", "RunResult", "resolve_device"]

_STREAMS = ("split", "roles", "init", "train", "network", "attack", "defense", "codec", "merge", "root")


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

        clients: list[ClientData] = []
        for i, p in enumerate(parts):
            cd = ClientData(ds.train_x[pool[p]], ds.train_y[pool[p]])
            if self.is_malicious[i] and Surface.DATA in self.attack.surfaces:
                cd = self.attack.poison_data(cd, i, self._torch["attack"])
            clients.append(cd)
        self.data = StackedData.stack(clients).to(self.device)
        self.weights = self.data.sizes.to(torch.float32).to(self.device)
        self.test_x, self.test_y = ds.test_x.to(self.device), ds.test_y.to(self.device)
        self.root = StackedData.stack([ClientData(ds.train_x[root_idx], ds.train_y[root_idx])]).to(self.device)
        # targeted / backdoor attacks say which test inputs measure their success (ASR);
        # the baseline is scored on the same inputs, so its ASR is the natural rate
        targeted_from = self.attack if hasattr(self.attack, "targeted_test") else build_attack(scenario.attack)
        self._targeted = None
        if hasattr(targeted_from, "targeted_test"):
            tx, ty = targeted_from.targeted_test(ds.test_x, ds.test_y)
            self._targeted = (tx.to(self.device), ty.to(self.device))

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

    # ------------------------------------------------------------------ one run
    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
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
        t_run = time.perf_counter()

        for rnd in range(fed.rounds):
            t0 = time.perf_counter()
            if rnd > 0:
                online = self.network.churn(online, self._np["network"])
            part = np.flatnonzero(online)
            part_t = torch.as_tensor(part, dtype=torch.long, device=dev)
            local = self.trainer.train(params, self.data, part_t, self.local, self._torch["train"])
            deltas = local - params
            mal_pos = [k for k, c in enumerate(part) if self.is_malicious[c]]
            honest_pos = [k for k, c in enumerate(part) if not self.is_malicious[c]]
            actx: AttackContext | None = None
            if mal_pos and self.attack.surfaces:
                own = deltas[mal_pos]
                omni = fed.omniscient if fed.omniscient is not None else bool(getattr(self.attack, "omniscient", False))
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

            # compress (client-side error feedback) → chunk → transport
            comp = self.compressor.compress(
                deltas, residual[part_t] if residual is not None else None, self._torch["codec"]
            )
            if residual is not None and comp.residual is not None:
                residual[part_t] = comp.residual
            digest = params_digest(params)
            uploads = {}
            for k, c in enumerate(part):
                nonce = new_nonce(self._np["network"])
                uploads[int(c)] = build_manifest(
                    comp.payloads[k],
                    round=rnd,
                    client=int(c),
                    parent_digest=digest,
                    codec=self.codec_label,
                    chunk_size=sc.transport.chunk_size,
                    nonce=nonce,
                )
            tamper = None
            if actx is not None and Surface.TRANSPORT in self.attack.surfaces:
                ctx_t = actx
                tamper = lambda deliveries: self.attack.tamper_chunks(deliveries, ctx_t)  # noqa: E731
            tx = self.network.transmit(rnd, uploads, fed.local_steps, self._np["network"], tamper)

            dropped: dict[int, str] = dict(tx.dropped)
            rejected: dict[int, str] = dict(tx.detections)
            rows, row_clients = [], []
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

            accepted = [False] * n
            extra: dict[str, Any] = {}
            t_def = time.perf_counter()
            if rows:
                upd = torch.stack(rows)
                w = self.weights[torch.as_tensor(row_clients, device=dev)]
                groups = assign_groups(row_clients, n, self.hierarchy, self._np["merge"])

                def make_ctx(wts: torch.Tensor, rows_: list[int], key: str) -> ServerContext:
                    return ServerContext(
                        round=rnd,
                        n_clients=len(rows_),
                        weights=wts,
                        global_params=params,
                        previous_update=prev_update,
                        generator=self._torch["defense"],
                        state=defense_state.get(key, {}),
                        evaluate_loss=self._evaluate_loss(params),
                        root_update=self._root_update(params),
                        client_ids=tuple(row_clients[r] for r in rows_),
                    )

                merged = hierarchical_merge(
                    upd, w, groups, self.defense, self.upper_defense, self.hierarchy.fan_out, make_ctx
                )
                defense_state = merged.state
                for pos, c in enumerate(row_clients):
                    accepted[c] = bool(merged.accepted[pos])
                    if not accepted[c]:
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
                bytes_on_wire=int(tx.bytes_on_wire),
                sim_time_s=float(tx.round_time_s),
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
