"""Asynchronous server with buffered, staleness-weighted merging (issue 26 §2).

The regime (``[async]`` in a scenario; see :mod:`.regimes`) is FedBuff (Nguyen et al., "Federated
Learning with Buffered Asynchronous Aggregation", AISTATS 2022) and asynchronous DiLoCo (Liu et al.,
"Asynchronous Local-SGD Training for Language Modeling", 2024): the clients do not wait for each
other. It shares everything else with the synchronous federation (:class:`~.loop.Federation`, built
inside it: the same data split, roles, model, local training, attack and defense registries, server
optimizer and network draws) and reports the same :class:`~redteam.types.RoundRecord`, one per
server step, so the store, reports, ``[[expect]]`` rows and the pytest plugin work unchanged.

An event simulation in simulated time:

* **jobs** — at time 0 every client downloads model version 0 and starts a job. A job of client i
  lasts H·c_i + 4d/bw_i + RTT_i (the ``[transport.network]`` draws: seconds per local step, uplink,
  round trip; ``[async] jitter`` multiplies each job's duration by exp(σ·z)); when it is ready the
  update (local − base model) arrives at the server and the client at once downloads the current
  version and starts again. Events at the same instant: arrivals first (in the order of readiness,
  then client id), then the server steps they trigger, then the downloads, which therefore get the
  stepped model.
* **staleness** — an update trained from version b arriving while the server is at version v has
  staleness τ = v − b (with ``trust_claims``, b is the base the client *claims*; otherwise the
  version the server served it). Staler than ``max_staleness``: dropped on arrival (recorded in
  ``dropped`` of the next step). Weight s(τ) = 1 (``"constant"``) or (1 + τ)^−a (``"polynomial"``,
  FedBuff's, a = ``exponent``).
* **server step** — every K = ``buffer_size`` arrivals the server runs the ``[defense]`` rule over
  the buffer's rows (``ServerContext.weights`` = sample count × s(τ); ``global_params`` the current
  model; the root update on the current model), scales the aggregate by FedBuff's factor
  Σ_accepted n_i s(τ_i) / Σ_accepted n_i (so the merged update is Σ n_i s_i Δ_i / Σ n_i for the mean:
  uniformly stale buffers move the model less), and applies it through the same server step as the
  synchronous round (:func:`~.stages.server_step`: FedAvg, FedAdam or DiLoCo's outer Nesterov, with
  ``[async] server_lr`` if set).
* **batched training** — a job's update depends only on its client and base version, so the jobs
  started from version v are trained together, in one batched call (:func:`~.stages.train`, the
  synchronous round's), when version v is superseded; a client with two jobs from one version
  (a fast client, K large) trains in a second batch. Update attacks craft their rows in that call
  (:func:`~.stages.craft`: ``round`` = the base version; omniscient attacks see the honest rows of
  the same cohort).
* **attackers** — a job is malicious when its client is an attacker and its base version is in the
  ``[attack]`` window. A ``Surface.ASYNC`` attack is asked (:meth:`~redteam.types.Attack.async_send`)
  when its update is ready, and again after every event while it holds it: it may hold it back or
  claim another base version (:mod:`attacks.stale`).

With K = every client and identical job durations (σ = 0 for compute, bandwidth and latency, no
jitter), every step merges one update per client, all from the current version: the run is the
synchronous federation's, update for update (a test checks it to the bit).

The record of server step r: ``accuracy`` / ``loss`` of the stepped model; ``participating``: the
clients with a row in the buffer (or dropped as stale since the last step); ``accepted``: a row of
theirs was used; ``malicious``: a row of theirs was crafted by the attack; ``sim_time_s``: simulated
time since the previous step; ``bytes_on_wire``: uploads and downloads since the previous step
(4d bytes each); ``extra["async"]``: ``version``, ``time_s``, ``rows``, per row ``clients``,
``staleness`` (as the server computed it), ``true_staleness``, ``weights`` (s(τ)), their
``staleness_mean`` / ``staleness_max``, ``scale`` (FedBuff's factor), ``stale_dropped``,
``misclaimed`` (rows whose claimed base was not their own) and ``held`` (updates attackers hold).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InvalidParameter, RedteamError
from ..scenario import AsyncSpec, PluginSpec, Scenario
from ..topology import ASYNC
from ..types import AsyncContext, AsyncSend, RoundRecord, Surface
from . import stages
from .rounds import RunResult, call_defense, record, result_of, server_context, standard_extra
from .server_opt import make_server_optimizer

__all__ = ["AsyncRun", "staleness_weight", "Job"]

def staleness_weight(tau: int | float, rule: str = "polynomial", exponent: float = 0.5) -> float:
    """s(τ): 1 for ``"constant"``; (1 + τ)^−a for ``"polynomial"`` (FedBuff; τ ≥ 0)."""
    if tau < 0:
        raise InvalidParameter(f"staleness τ = {tau}: must be ≥ 0 (a claimed base version above the server's)")
    if rule == "constant":
        return 1.0
    if rule == "polynomial":
        return float((1.0 + tau) ** (-exponent))
    raise InvalidParameter(f"staleness rule {rule!r}: must be 'constant' or 'polynomial'")


@dataclass
class Job:
    """One local run of one client: trained from version ``base``, ready at ``ready_s``."""

    id: int
    client: int
    base: int
    start_s: float
    ready_s: float
    malicious: bool = False
    row: torch.Tensor | None = None
    claimed: int | None = None


@dataclass
class _Pending:
    """What happened since the last server step (it goes into the next record)."""

    dropped: dict[int, str] = field(default_factory=dict)
    dropped_malicious: set[int] = field(default_factory=set)
    transfers: int = 0


class AsyncRun:
    """An asynchronous server built from a scenario with ``[async]``; ``run()`` executes
    ``[federation] rounds`` server steps."""

    def __init__(self, scenario: Scenario, *, device: str = "cpu", attack: PluginSpec | None = None,
                 warmup_dir: str | None = None, start: torch.Tensor | None = None) -> None:
        from .loop import Federation, run_warmup

        spec = scenario.asynchronous
        if spec is None:
            raise InvalidParameter("AsyncRun needs a scenario with an [async] section")
        self.async_spec: AsyncSpec = spec
        self.scenario = scenario
        # the server's parts (data split, roles, model, local training, network draws) are the
        # synchronous federation's, built under this regime's declaration (topology.ASYNC)
        self.fed = fed = Federation(scenario, device=device, attack=attack, warmup_dir=warmup_dir, start=start,
                                    compute_warmup=run_warmup(AsyncRun), support=ASYNC)
        self.setup = fed.setup
        # what the runners read of a run object (the model's layout, workload, data, device)
        self.spec, self.workload, self.data, self.device = fed.spec, fed.workload, fed.data, fed.device
        self.malicious = list(fed.malicious)
        if spec.server_lr is not None:
            fs = scenario.federation
            kw: dict[str, Any] = {"lr": spec.server_lr}
            if fs.server_optimizer == "nesterov":
                kw["momentum"] = fs.server_momentum
            fed.server_opt = make_server_optimizer(fs.server_optimizer, **kw)
            fed.server_lr = float(spec.server_lr)
        seeds = np.random.SeedSequence(scenario.seed).spawn(32)
        self._rng = np.random.default_rng(seeds[31])  # the jobs' jitter: its own stream
        self._ran = False
        self.final_params: torch.Tensor | None = None
        self.jobs: list[Job] = []

    # ------------------------------------------------------------------ timing
    def job_seconds(self, client: int, base: int = 0) -> float:
        """How long one job of ``client`` from version ``base`` takes (module docstring), jitter
        included; under ``local_epochs`` its steps follow the data of that version's phase (clean
        outside the attack window)."""
        fed = self.fed
        net = fed.network
        steps = fed.local.steps
        if fed.local.epochs is not None:
            size = int(fed.phases[int(fed.plan.active(base))][0].sizes[client])
            steps = int(math.ceil(fed.local.epochs * size / fed.local.batch_size))
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            t = float(steps * net.compute_s[client] + 4.0 * fed.spec.dim / net.bytes_per_s[client]
                      + net.latency_s[client])
        if self.async_spec.jitter:
            t *= float(np.exp(self.async_spec.jitter * self._rng.standard_normal()))
        return t

    # ------------------------------------------------------------------ training
    def _train_cohort(self, jobs: list[Job], params: torch.Tensor, prev_update: torch.Tensor | None,
                      base: int) -> None:
        """Train every job started from version ``base`` (from ``params``), batched; set their rows."""
        fed = self.fed
        waves: list[list[Job]] = []
        for job in jobs:  # a client twice in one cohort trains in a later wave
            for wave in waves:
                if all(j.client != job.client for j in wave):
                    wave.append(job)
                    break
            else:
                waves.append([job])
        for wave in waves:
            part = np.asarray([j.client for j in wave], dtype=np.int64)
            rin = fed.inputs(base, part, params, prev_update)
            self._weights = rin.weights  # the sample weights of the data the latest cohort trained on
            hook, hook_rows = stages.training_hook(fed, rin)
            trained = stages.train(fed, rin, hook, hook_rows)
            sent, _ = stages.craft(fed, rin, trained.sent)
            for k, j in enumerate(wave):
                j.row = sent[k]

    # ------------------------------------------------------------------ one run
    def run(self, on_round: Callable[[RoundRecord], None] | None = None) -> RunResult:
        if self._ran:
            raise RedteamError("this AsyncRun has already run; build a new one for another run")
        self._ran = True
        fed, spec, sc = self.fed, self.async_spec, self.scenario
        n, dim = sc.federation.clients, fed.spec.dim
        attacking = bool(fed.attack.surfaces)
        asks = Surface.ASYNC in fed.attack.surfaces
        params = fed.params0.clone()
        opt_state = fed.server_opt.init(params)
        prev_update: torch.Tensor | None = None
        defense_state: dict = {}
        records: list[RoundRecord] = []
        t_run = time.perf_counter()
        self._weights = fed.weights
        start_info = fed.setup.start_record()  # the model the run starts from, as evaluated before step 0

        version = 0
        now = 0.0
        last_step_s = 0.0
        heap: list[tuple[float, int, int]] = []  # (ready time, job id, client): ties by start order
        cohorts: dict[int, list[Job]] = {}
        served = np.zeros(n, dtype=np.int64)  # the version the server last served each client
        buffer: list[Job] = []
        held: list[Job] = []
        pending = _Pending()
        jobs = self.jobs

        def start(client: int, at: float) -> None:
            malicious = bool(fed.is_malicious[client]) and attacking and fed.plan.active(version)
            job = Job(len(jobs), client, version, at, at + self.job_seconds(client, version), malicious)
            jobs.append(job)
            cohorts.setdefault(version, []).append(job)
            served[client] = version
            pending.transfers += 1
            heapq.heappush(heap, (job.ready_s, job.id, client))

        def ask(job: Job) -> AsyncSend | None:
            if not (job.malicious and asks):
                return None
            ctx = AsyncContext(
                client=job.client, trained_from=job.base, version=version, time_s=now, buffer_size=spec.buffer_size,
                buffered=len(buffer), buffered_malicious=sum(j.malicious for j in buffer),
                holding=tuple(sorted({j.client for j in held} | {job.client})),
                attackers=tuple(fed.malicious), max_staleness=spec.max_staleness, state=fed.states.attack)
            answer = fed.attack.async_send(ctx)
            if answer is not None and not isinstance(answer, AsyncSend):
                raise RedteamError(f"attack {fed.attack_spec.name!r}: async_send returned {type(answer).__name__}, "
                                   "expected a redteam.types.AsyncSend or None")
            return answer

        restart: list[int] = []

        def arrive(job: Job, claimed: int | None) -> None:
            nonlocal version
            restart.append(job.client)
            pending.transfers += 1
            job.claimed = job.base if claimed is None else int(claimed)
            tau = version - (job.claimed if spec.trust_claims else int(job.base))
            if spec.max_staleness is not None and tau > spec.max_staleness:
                pending.dropped[job.client] = f"stale: τ = {tau} > max_staleness = {spec.max_staleness}"
                if job.malicious:
                    pending.dropped_malicious.add(job.client)
                return
            buffer.append(job)
            if len(buffer) >= spec.buffer_size:
                step()

        def step() -> None:
            nonlocal version, params, opt_state, prev_update, defense_state, last_step_s
            t0 = time.perf_counter()
            rnd = version
            # the jobs of the version being superseded are all started: train them, batched
            cohort = cohorts.pop(version, [])
            if cohort:
                self._train_cohort(cohort, params, prev_update, version)
            rows_jobs = list(buffer)
            buffer.clear()
            for j in rows_jobs:
                if j.row is None:  # a cohort trained at an earlier step holds every row of its version
                    raise RedteamError(f"async: job {j.id} of client {j.client} (base {j.base}) was never trained")
            clients = [j.client for j in rows_jobs]
            used = [version - (j.claimed if spec.trust_claims else j.base) for j in rows_jobs]
            true = [version - j.base for j in rows_jobs]
            s = [staleness_weight(t, spec.staleness, spec.exponent) for t in used]
            rows = torch.stack([j.row for j in rows_jobs])  # type: ignore[misc]
            sizes = self._weights[torch.as_tensor(clients, dtype=torch.long, device=fed.device)].to(torch.float32)
            s_t = torch.as_tensor(s, dtype=torch.float32, device=fed.device)
            w = sizes * s_t
            ctx = server_context(fed.torch_rng["defense"], rnd=rnd, weights=w, global_params=params, previous_update=prev_update,
                                 state=defense_state, client_ids=clients,
                                 evaluate_loss=stages._evaluate_loss(fed, params),
                                 root_update=stages._root_update(fed, params), model=stages.model_view(fed),
                                 root_data=(fed.root.x, fed.root.y) if fed.root is not None else None,
                                 evaluate_loss_assigned=stages._evaluate_assigned(fed, params))
            extra: dict[str, Any] = {}
            refused: list[dict[str, Any]] = []
            t_def = time.perf_counter()
            called = call_defense(fed.defense, rows, ctx, check_finite=False)
            if called.decision is not None:
                dec = called.decision
                ok = [bool(x) for x in dec.accepted.tolist()]
                reasons = dict(dec.reasons)
                defense_state = dict(dec.state)
                agg = dec.aggregate
            else:  # e.g. Krum on a buffer too small for it
                ok = [False] * len(rows_jobs)
                reasons = {}
                agg = torch.zeros(dim, dtype=rows.dtype, device=rows.device)
                refused.append({"stage": "merge", "reason": called.refused, "clients": sorted(set(clients))})
            defense_time = time.perf_counter() - t_def
            acc_mask = torch.as_tensor(ok, dtype=torch.bool, device=fed.device)
            total = float(sizes[acc_mask].sum()) if bool(acc_mask.any()) else 0.0
            scale = float(w[acc_mask].sum()) / total if total > 0 else 1.0
            aggregate = agg if scale == 1.0 else agg * scale
            contributors = sorted({c for c, a in zip(clients, ok) if a})
            params, opt_state, prev_update, refusal = stages.server_step(
                fed, params, aggregate, opt_state, contributors, list(rows), clients)
            if refusal is not None:
                refused.append(refusal)
            if not contributors:
                extra["empty_round"] = sc.federation.empty_round
            if refused:
                extra["refused"] = refused
            version += 1
            acc, loss, scored = stages.evaluate(fed, params)
            extra.update(scored)
            # an active attack round needs an attacker's update in it (as in the synchronous loop)
            active = fed.plan.active(rnd) and any(bool(fed.is_malicious[c]) for c in clients)
            extra.update(standard_extra(fed.setup, rnd, active=active, start=start_info))
            accepted = [False] * n
            malicious = [False] * n
            participating = [False] * n
            rejected: dict[int, str] = {}
            for k, (j, a) in enumerate(zip(rows_jobs, ok)):
                participating[j.client] = True
                accepted[j.client] = accepted[j.client] or a
                malicious[j.client] = malicious[j.client] or j.malicious
                if not a:
                    rejected.setdefault(j.client, reasons.get(k, "rejected"))
            for c, why in pending.dropped.items():
                participating[c] = True
                rejected.setdefault(c, why)
                if c in pending.dropped_malicious:
                    malicious[c] = True
            extra["async"] = {
                "version": version, "time_s": now, "rows": len(rows_jobs), "clients": clients,
                "staleness": used, "true_staleness": true, "weights": s,
                "staleness_mean": sum(used) / len(used), "staleness_max": max(used), "scale": scale,
                "stale_dropped": len(pending.dropped),
                "misclaimed": sum(int(j.claimed != j.base) for j in rows_jobs),
                "malicious_rows": sum(int(j.malicious) for j in rows_jobs), "held": len(held)}
            rec = record(rnd, acc, loss, accepted=accepted, malicious=malicious, participating=participating,
                         dropped=dict(sorted(pending.dropped.items())), rejected=rejected,
                         bytes_on_wire=4 * dim * pending.transfers, sim_time_s=now - last_step_s, started=t0,
                         defense_time_s=defense_time, extra=extra)
            last_step_s = now
            pending.dropped.clear()
            pending.dropped_malicious.clear()
            pending.transfers = 0
            records.append(rec)
            if on_round is not None:
                on_round(rec)

        for c in range(n):
            start(c, 0.0)
        rounds = sc.federation.rounds
        while version < rounds:
            if not heap:
                if not held:  # pragma: no cover - every client always has a job or a held update
                    raise RedteamError("async: no job in flight and nothing held")
                for job in list(held):  # nothing else will happen: the holders must send
                    held.remove(job)
                    arrive(job, None)
                    if version >= rounds:
                        break
            else:
                now = heap[0][0]
                while heap and heap[0][0] == now and version < rounds:
                    _, jid, _ = heapq.heappop(heap)
                    job = jobs[jid]
                    answer = ask(job)
                    if answer is not None and answer.hold:
                        held.append(job)
                    else:
                        arrive(job, None if answer is None else answer.claimed_version)
            # the holders are asked again after the instant's events, until none lets go
            changed = True
            while held and changed and version < rounds:
                changed = False
                for job in list(held):
                    answer = ask(job)
                    if answer is None or not answer.hold:
                        held.remove(job)
                        arrive(job, None if answer is None else answer.claimed_version)
                        changed = True
                        if version >= rounds:
                            break
            for c in restart:
                start(c, now)
            restart.clear()

        self.final_params = params
        return result_of(fed.setup, records, time.perf_counter() - t_run,
                         **{"async": {"buffer_size": spec.buffer_size, "staleness": spec.staleness}})
