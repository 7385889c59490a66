"""Scenario files: TOML → frozen, validated dataclasses.

A scenario names a workload, a federation, its transport and hierarchy, one attack and
one defense (or a pipeline of defenses)::

    [scenario]
    name = "smoke"
    seed = 0

    [workload]
    name = "digits"

    [federation]
    clients = 20
    malicious_fraction = 0.2
    rounds = 30

    [transport]
    codec = "topk"
    codec_params = { fraction = 0.1 }

    [attack]
    name = "sign_flip"
    variant = "own"

    [defense]
    pipeline = [ { name = "norm_bound", bound = 2.0 }, { name = "mean" } ]

Every key is checked: an unknown key, a value of the wrong type or out of range is an
:class:`~redteam.errors.InvalidScenario` that names the file, the key path, the value
and what was allowed (``smoke.toml: [federation].clients = -3: must be ≥ 1``). Plugin
names and parameters are checked against the registries, with close matches for typos.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from .errors import InvalidParameter, InvalidScenario, RedteamError
from .integrations.flower.spec import FlowerSpec
from .integrations.flower.spec import check_builtin as check_flower_builtin
from .integrations.flower.spec import check_document as check_flower_document
from .integrations.flower.spec import is_builtin as is_flower_builtin
from .registry import ATTACKS, DEFENSES, WORKLOADS, _coerce, _type_hints
from .scenario_limits import Limits, check_federation, check_memory, check_work, read_toml, shown
from .topology import REGIMES, check_keys, regime_section

__all__ = [
    "Scenario",
    "ScenarioInfo",
    "WorkloadSpec",
    "FederationSpec",
    "TransportSpec",
    "NetworkSpec",
    "HierarchySpec",
    "PluginSpec",
    "AttackWindow",
    "PipelineSpec",
    "GossipSpec",
    "AsyncSpec",
    "WINDOW_KEYS",
    "baseline_attack",
    "durability_params",
    "inherit_window",
    "parse_window",
    "load_scenario",
    "load_document",
    "parse_scenario",
]


def _rule(default: Any, check: Callable[[Any], bool] | None = None, expect: str = "", **kw: Any) -> Any:
    """A dataclass field with a validation rule: ``check(value)`` must hold, else ``expect``."""
    meta = {"check": check, "expect": expect}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and v >= 1


def _nonneg(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


def _pos(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _prob(v: Any) -> bool:
    return isinstance(v, (int, float)) and 0 <= v <= 1


def _requirement_ok(v: str) -> bool:
    kind, _, name = v.partition(":")
    if kind == "package":
        return 0 < len(name) <= 100 and all(part.isidentifier() for part in name.split("."))
    return kind in ("dataset", "device") and 0 < len(name) <= 100


def _window_ok(v: Any) -> bool:
    if v is None:
        return True
    try:
        parse_window(v)
    except ValueError:
        return False
    return True


def parse_window(v: Any) -> tuple[int, int | None]:
    """``"a:b"`` → (a, b) (rounds a ≤ r < b), ``"a:"`` → (a, None) (to the end), ``a`` or
    ``"a"`` → (a, a + 1) (single shot). Rounds count from 0, after any warm-up."""
    if isinstance(v, bool):
        raise ValueError(v)
    if isinstance(v, int):
        if v < 0:
            raise ValueError(v)
        return v, v + 1
    if not isinstance(v, str) or len(v) > 40:
        raise ValueError(v)
    text = v.strip()
    if ":" not in text:
        if not text.isdigit():
            raise ValueError(v)
        a = int(text)
        return a, a + 1
    left, right = (t.strip() for t in text.split(":", 1))
    if not left.isdigit() or (right and not right.isdigit()):
        raise ValueError(v)
    a, b = int(left), (int(right) if right else None)
    if b is not None and b <= a:
        raise ValueError(v)
    return a, b


@dataclass(frozen=True, slots=True)
class ScenarioInfo:
    name: str = "scenario"
    seed: int = _rule(0, lambda v: isinstance(v, int) and 0 <= v < 2**63, "must be an integer in [0, 2**63)")
    description: str = ""
    # model init and minibatches from their own seed (None: derived from ``seed`` as always)
    training_seed: int | None = _rule(None, lambda v: v is None or (isinstance(v, int) and 0 <= v < 2**63),
                                      "must be an integer in [0, 2**63)")
    # issue 20: start from a trained model. ``warmup_rounds``: a clean FedAvg warm-up of that
    # many rounds (attack none, defense mean), shared by every cell with the same warm-up;
    # ``start_from``: a model file in the safetensors format (never pickle), relative to the
    # scenario file (see :mod:`redteam.federation.warmup`)
    warmup_rounds: int = _rule(0, lambda v: isinstance(v, int) and 0 <= v <= 100_000,
                               "must be an integer in [0, 100000]")
    # the seed of the warm-up (None: the run's ``seed``). A matrix sets it per replicate from the
    # scenario seed and the replicate alone (:func:`redteam.matrix.replicate_seeds`), so cells that
    # differ only in settings share one pre-trained model per replicate: a paired comparison
    warmup_seed: int | None = _rule(None, lambda v: v is None or (isinstance(v, int) and 0 <= v < 2**63),
                                    "must be an integer in [0, 2**63)")
    start_from: str | None = _rule(None, lambda v: v is None or (isinstance(v, str) and 0 < len(v) <= 4096
                                                                 and v.endswith(".safetensors")),
                                   "must be the path of a .safetensors file")
    # what the scenario needs to run: "dataset:NAME" (a directory, REDTEAM_DATA_DIR or the
    # workload's own ``dir``), "device:cuda", "package:NAME"; unmet, the pytest plugin skips
    # it with the reason and ``redteam run`` refuses with it
    requires: tuple[str, ...] = _rule((), lambda v: all(isinstance(x, str) and _requirement_ok(x) for x in v),
                                      'must be a list like ["dataset:cifar10", "device:cuda", "package:mlxtend"]')


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """A plugin by registry name with its parameters (validated against the registry)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    name: str = "digits"
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FederationSpec:
    clients: int = _rule(20, _pos_int, "must be an integer ≥ 1")
    malicious_fraction: float = _rule(0.0, lambda v: _prob(v) and v < 1, "must be in [0, 1)")
    rounds: int = _rule(30, _pos_int, "must be an integer ≥ 1")
    partition: Literal["iid", "dirichlet", "shards", "quantity", "label_sorted", "by_group", "natural"] = "dirichlet"
    alpha: float = _rule(0.5, _pos, "must be > 0")
    shards_per_client: int = _rule(2, _pos_int, "must be an integer ≥ 1")
    quantity_beta: float = _rule(1.0, _pos, "must be > 0")
    min_samples: int = _rule(2, _pos_int, "must be an integer ≥ 1")
    local_steps: int = _rule(10, _pos_int, "must be an integer ≥ 1")
    local_epochs: float | None = _rule(None, lambda v: v is None or _pos(v), "must be > 0")
    batch_size: int = _rule(16, _pos_int, "must be an integer ≥ 1")
    lr: float = _rule(0.1, _pos, "must be > 0")
    prox_mu: float = _rule(0.0, _nonneg, "must be ≥ 0")
    server_optimizer: Literal["fedavg", "fedadam", "nesterov"] = "fedavg"
    server_lr: float | None = _rule(None, lambda v: v is None or _pos(v), "must be > 0")
    server_momentum: float = _rule(0.9, lambda v: _prob(v) and v < 1, "must be in [0, 1)")
    target_accuracy: float = _rule(0.9, _prob, "must be in [0, 1]")
    last_k: int = _rule(1, _pos_int, "must be an integer ≥ 1")  # final_accuracy_last_k averages k rounds
    omniscient: bool | None = None
    # issue 8 §1: what a reproduction of the worker-momentum / bucketing papers needs
    malicious_data: Literal["partition", "iid_overlap"] | None = None  # None: iid_overlap for label_sorted
    client_momentum: float = _rule(0.0, lambda v: _prob(v) and v < 1, "must be in [0, 1)")
    momentum_form: Literal["sgd", "ema"] = "sgd"
    # issue 19: what a malicious client sends under worker momentum. "raw" (the authors'
    # release: its bit-flip / label-flip workers keep no momentum): the round's fresh term,
    # Δ ("sgd") or (1−β)Δ ("ema"); "momentum": its momentum, as an honest client
    malicious_momentum: Literal["raw", "momentum"] = "raw"
    # issue 19: a round with no contributor. "skip" (torchft's DiLoCo: no commit, no outer
    # step): model and server-optimizer state kept bit for bit; "momentum": the server
    # optimizer steps on a zero update (its momentum still moves the model)
    empty_round: Literal["skip", "momentum"] = "skip"
    sampling: Literal["with_replacement", "without_replacement"] = "with_replacement"
    local_optimizer: Literal["sgd", "adamw"] = "sgd"
    local_weight_decay: float = _rule(0.0, _nonneg, "must be ≥ 0")
    local_betas: tuple[float, float] = _rule(
        (0.9, 0.999), lambda v: len(v) == 2 and all(_prob(b) and b < 1 for b in v), "must be two numbers in [0, 1)")
    root_samples: int | Literal["auto"] | None = _rule(
        None, lambda v: v is None or v == "auto" or (isinstance(v, int) and v >= 0), "must be an integer ≥ 0 or \"auto\"")
    # issue 20: K of N clients per round (None: every online client), drawn uniformly without
    # replacement from the run's own "sampling" stream; how attackers take part in a round
    # the attack acts in (redteam.federation.sampling)
    clients_per_round: int | None = _rule(None, lambda v: v is None or _pos_int(v), "must be an integer ≥ 1")
    attacker_selection: Literal["random", "every_round", "count"] = "random"
    attackers_per_round: int | None = _rule(None, lambda v: v is None or _pos_int(v), "must be an integer ≥ 1")
    # issue 34 §6: how the clients' gradients are computed (redteam.federation.training.resolve_batching):
    # "vmap" (every client in one batched program), "loop" (one client after another), "auto"
    # (the loop on CPU for a model with convolutions, vmap otherwise). Same results to float32 rounding
    batching: Literal["auto", "vmap", "loop"] = "auto"

    @property
    def malicious_data_rule(self) -> str:
        """``malicious_data``, its default resolved: the papers' ``iid_overlap`` for
        ``label_sorted``, ``partition`` (today's) for every other partition."""
        if self.malicious_data is not None:
            return self.malicious_data
        return "iid_overlap" if self.partition == "label_sorted" else "partition"

    @property
    def n_malicious(self) -> int:
        """round(fraction × clients), halves rounded up (0.5 × 5 → 3)."""
        return int(math.floor(self.malicious_fraction * self.clients + 0.5))


@dataclass(frozen=True, slots=True)
class NetworkSpec:
    bandwidth_mbps: float = _rule(50.0, _pos, "must be > 0")
    bandwidth_sigma: float = _rule(0.5, _nonneg, "must be ≥ 0")
    latency_ms: float = _rule(40.0, _nonneg, "must be ≥ 0")
    latency_sigma: float = _rule(0.3, _nonneg, "must be ≥ 0")
    loss: float = _rule(0.0, lambda v: _prob(v) and v < 1, "must be in [0, 1)")
    relay_fraction: float = _rule(0.0, _prob, "must be in [0, 1]")
    retries: int = _rule(1, lambda v: isinstance(v, int) and v >= 0, "must be an integer ≥ 0")
    deadline_s: float | None = _rule(None, lambda v: v is None or _pos(v), "must be > 0")
    compute_s_per_step: float = _rule(0.01, _nonneg, "must be ≥ 0")
    compute_sigma: float = _rule(0.3, _nonneg, "must be ≥ 0")
    churn_leave: float = _rule(0.0, _prob, "must be in [0, 1]")
    churn_join: float = _rule(0.5, _prob, "must be in [0, 1]")
    stragglers: Literal["drop", "partial"] = "drop"  # with deadline_s: drop late clients, or send partial work


@dataclass(frozen=True, slots=True)
class TransportSpec:
    codec: str = "none"
    codec_params: Mapping[str, Any] = field(default_factory=dict)
    error_feedback: bool = True
    chunk_size: int = _rule(16384, lambda v: isinstance(v, int) and 64 <= v <= 2**26, "must be in [64, 2**26]")
    network: NetworkSpec = field(default_factory=NetworkSpec)


@dataclass(frozen=True, slots=True)
class HierarchySpec:
    fan_out: int = _rule(4, lambda v: isinstance(v, int) and v >= 2, "must be an integer ≥ 2")
    depth: int = _rule(1, lambda v: isinstance(v, int) and 1 <= v <= 8, "must be an integer in [1, 8]")
    grouping: Literal["random", "region", "hash"] = "random"
    upper_defense: PluginSpec = field(default_factory=lambda: PluginSpec("mean"))


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """``[pipeline]``: the model-parallel regime (SWARM, Ryabinin et al., ICML 2023): the
    ``text`` transformer cut into ``stages``, each served by ``peers_per_stage`` peers
    (:mod:`redteam.federation.swarm`)."""

    stages: int = _rule(2, lambda v: isinstance(v, int) and 2 <= v <= 64, "must be an integer in [2, 64]")
    peers_per_stage: int = _rule(3, lambda v: isinstance(v, int) and 1 <= v <= 1024, "must be an integer in [1, 1024]")
    micro_batches: int = _rule(8, lambda v: isinstance(v, int) and 1 <= v <= 100_000, "must be an integer in [1, 100000]")
    micro_batch_size: int = _rule(8, lambda v: isinstance(v, int) and 1 <= v <= 65_536, "must be an integer in [1, 65536]")
    routing: Literal["swarm", "flow", "round_robin"] = "swarm"
    # how each stage applies its merged update: "sgd" (the merged step −lr·g as it is) or "adam"
    # (Adam, Kingma & Ba, ICLR 2015, with bias correction, β = (0.9, 0.999), ε = 1e-8, step size
    # [federation] lr, on the merged gradient g = −merged/lr; SWARM trains with an adaptive
    # optimizer). The peers' rows the [defense] merges are −lr·g either way.
    optimizer: Literal["sgd", "adam"] = "sgd"
    # the clean warm-up ([scenario] warmup_rounds) with another optimizer and step size than the
    # attacked run (unset: the run's): pre-training with Adam, then post-training by plain
    # averaged SGD steps, where a stage update adds to the weights as task arithmetic assumes
    warmup_optimizer: Literal["sgd", "adam"] | None = None
    warmup_lr: float | None = _rule(None, lambda v: v is None or _pos(v), "must be > 0")
    attacker_stage: int = _rule(1, lambda v: isinstance(v, int) and v >= 0, "must be an integer ≥ 0")
    attackers: int = _rule(0, lambda v: isinstance(v, int) and v >= 0, "must be an integer ≥ 0")
    throughput_sigma: float = _rule(0.5, _nonneg, "must be ≥ 0")
    # churn: the chance that an honest peer crashes on a hop it serves (it is gone until the round
    # ends and its round's work is lost); crash_tolerance: re-route the hop to another peer of the
    # stage (GWTF) instead of losing the micro-batch
    churn: float = _rule(0.0, lambda v: _prob(v) and v < 1, "must be in [0, 1)")
    crash_tolerance: bool = True
    # simulated time: a hop (a stage's forward and backward on one micro-batch) takes
    # hop_time_s / speed on its peer; a recomputation (a forward) a third of that
    hop_time_s: float = _rule(0.01, _pos, "must be > 0")
    checks: tuple[PluginSpec, ...] = ()
    # reputation in the router: a peer's routing weight is its advertised throughput times its
    # reputation (starts at 1), multiplied by reputation_penalty at each failed check and raised
    # by reputation_recovery (up to 1) at each passed one; 1 and 0: no reputation. A weight never
    # falls below 1e-6 of the truth, so a flagged peer still gets probed and can reach its ban;
    # round_robin routing ignores reputation
    reputation_penalty: float = _rule(1.0, lambda v: isinstance(v, (int, float)) and 0 < v <= 1,
                                      "must be in (0, 1] (to cut a peer off at its first failure, use strikes = 1)")
    reputation_recovery: float = _rule(0.0, lambda v: isinstance(v, (int, float)) and 0 <= v <= 1, "must be in [0, 1]")
    # links: a hop's sends (activations forward, gradients back) take latency_ms plus the bytes
    # over the sender's uplink, drawn log-normal around bandwidth_mbps (0: links not modelled)
    bandwidth_mbps: float = _rule(0.0, lambda v: _nonneg(v) and v <= 1e9, "must be in [0, 1e9] (0: not modelled)")
    bandwidth_sigma: float = _rule(0.0, lambda v: _nonneg(v) and v <= 10, "must be in [0, 10]")
    latency_ms: float = _rule(0.0, lambda v: _nonneg(v) and v <= 1e7, "must be in [0, 1e7]")


@dataclass(frozen=True, slots=True)
class GossipSpec:
    """``[gossip]``: the serverless gossip regime (:mod:`redteam.federation.gossip`): the
    ``[federation] clients`` are the nodes of a graph, each with its own model; after its local
    training each honest node merges its neighbours' models by the ``[defense]`` rule
    (:mod:`redteam.federation.graphs` for the topologies and mixing weights)."""

    topology: Literal["ring", "torus", "erdos_renyi", "exponential", "two_worlds", "complete"] = "ring"
    # erdos_renyi: each pair's edge probability; torus: grid rows (unset: the divisor of n nearest
    # √n); two_worlds: edges from each node of the first half into the second
    probability: float = _rule(0.3, lambda v: _prob(v) and v > 0, "must be in (0, 1]")
    rows: int | None = _rule(None, lambda v: v is None or (isinstance(v, int) and v >= 1), "must be an integer ≥ 1")
    bridges: int = _rule(1, lambda v: isinstance(v, int) and v >= 1, "must be an integer ≥ 1")
    mixing: Literal["metropolis_hastings", "uniform"] = "metropolis_hastings"
    # gossip steps after each round's local training
    steps: int = _rule(1, lambda v: isinstance(v, int) and 1 <= v <= 1000, "must be an integer in [1, 1000]")
    attackers: int = _rule(0, lambda v: isinstance(v, int) and v >= 0, "must be an integer ≥ 0")
    # random: the attackers are nodes of the graph drawn at random; hubs: the highest-degree nodes;
    # everywhere: the graph is built on the honest nodes and each attacker is linked to every
    # honest node (Gaucher et al.'s setting: b = attackers Byzantine neighbours per honest node)
    placement: Literal["random", "hubs", "everywhere"] = "random"
    # time-varying graph: each round, each edge is down with this probability (weights recomputed)
    churn: float = _rule(0.0, lambda v: _prob(v) and v < 1, "must be in [0, 1)")
    # the degree the Byzantine nodes announce while the attack acts: "one" (the default) draws the
    # largest Metropolis–Hastings weight each honest neighbour i can give, 1/(1 + deg_i), the
    # Byzantine weight the robust rules' analyses assume; "true": they announce their real degree
    byzantine_degree: Literal["one", "true"] = "one"


@dataclass(frozen=True, slots=True)
class AsyncSpec:
    """``[async]``: the asynchronous server (FedBuff, Nguyen et al., AISTATS 2022; asynchronous
    DiLoCo, Liu et al. 2024; :mod:`redteam.federation.asyncrun`): every client trains from the model
    version it last downloaded and sends its update when it is done (at a time drawn from the
    ``[transport.network]`` compute and link draws); the server buffers arrivals and steps every
    ``buffer_size`` of them, each weighted by its staleness τ (server steps since its base version):
    s(τ) = 1 (``"constant"``) or 1/(1 + τ)^``exponent`` (``"polynomial"``). A server step is one
    round of the record."""

    buffer_size: int = _rule(10, lambda v: isinstance(v, int) and 1 <= v <= 1_000_000, "must be an integer ≥ 1")
    staleness: Literal["constant", "polynomial"] = "polynomial"
    exponent: float = _rule(0.5, lambda v: _nonneg(v) and v <= 100, "must be in [0, 100]")
    # an update staler than this is dropped on arrival (None: any staleness is merged)
    max_staleness: int | None = _rule(None, lambda v: v is None or (isinstance(v, int) and v >= 0),
                                      "must be an integer ≥ 0 (or unset)")
    # the server step's lr (None: [federation] server_lr, else the server optimizer's default)
    server_lr: float | None = _rule(None, lambda v: v is None or _pos(v), "must be > 0")
    # true: the server takes the base version a client claims (peers fetch models from each other);
    # false: it uses the version it served that client (a lie then changes nothing)
    trust_claims: bool = True
    # σ of a log-normal factor on each job's duration (0: a client takes the same time every job)
    jitter: float = _rule(0.0, lambda v: _nonneg(v) and v <= 10, "must be in [0, 10]")


@dataclass(frozen=True, slots=True)
class PrivacySpec:
    """``[privacy]``: passive privacy observers scored on the same run as the poisoning, and
    secure aggregation (:mod:`redteam.privacy`).

    * ``observers``: ``Surface.PRIVACY`` attacks (at most one that ``observes = "update"``, a
      gradient inversion, and one that ``observes = "model"``, a membership inference);
    * ``observe``: what the inversion sees: ``"row"`` (one client's update as the server receives
      it: a curious server or an eavesdropper) or ``"aggregate"`` (the update the server applies in
      that round, as anyone who downloads the model sees it);
    * ``observe_round``: the round whose update is inverted; ``victim``: the observed client (unset:
      the first honest participant of that round; under ``"aggregate"`` every participant's samples
      are the truth);
    * ``candidates``: members and non-members (each) a membership observer scores;
    * ``delta``: the δ at which ε is reported (a defense that ``accounts_privacy``);
    * ``secure_aggregation``: the clients mask their rows pairwise (Bonawitz et al., CCS 2017) so the
      server reads only sums; ``secagg_buckets``: sums over that many random buckets, two clients
      at least in each (a defense
      that needs per-client rows runs on the bucket means; 1: one sum, and such a defense is
      refused); ``secagg_dropout``: each client's chance to drop after the key exchange (its
      masks are then removed from Shamir shares); ``secagg_clip`` / ``secagg_frac_bits`` /
      ``secagg_modulus_bits``: the fixed-point encoding of the rows in the ring. The ``secagg_*``
      keys are read only with ``secure_aggregation = true`` (a matrix can switch it per cell);
    * ``dp_sgd_clip`` / ``dp_sgd_noise_multiplier``: DP-SGD in the clients' local steps (Abadi et
      al., CCS 2016): each example's gradient clipped to the bound, N(0, (σ·clip)²) on their sum;
      the run reports its example-level ε (``example_epsilon``)."""

    observers: tuple[PluginSpec, ...] = ()
    observe: Literal["row", "aggregate"] = "row"
    observe_round: int = _rule(0, lambda v: isinstance(v, int) and v >= 0, "must be an integer ≥ 0")
    victim: int | None = _rule(None, lambda v: v is None or (isinstance(v, int) and v >= 0), "must be an integer ≥ 0")
    candidates: int = _rule(200, lambda v: isinstance(v, int) and 2 <= v <= 100_000, "must be an integer in [2, 100000]")
    delta: float = _rule(1e-5, lambda v: _prob(v) and 0 < v < 1, "must be in (0, 1)")
    secure_aggregation: bool = False
    secagg_buckets: int = _rule(1, _pos_int, "must be an integer ≥ 1")
    secagg_dropout: float = _rule(0.0, lambda v: _prob(v) and v < 1, "must be in [0, 1)")
    secagg_clip: float = _rule(8.0, _pos, "must be > 0")
    secagg_frac_bits: int = _rule(16, lambda v: isinstance(v, int) and 1 <= v <= 40, "must be an integer in [1, 40]")
    secagg_modulus_bits: Literal[32, 64] = 32
    # DP-SGD on the clients (Abadi et al., CCS 2016): per-example clipping and Gaussian noise in
    # every local step (unset: off); its example-level ε is reported as example_epsilon
    dp_sgd_clip: float | None = _rule(None, lambda v: v is None or _pos(v), "must be > 0 (or unset: no DP-SGD)")
    dp_sgd_noise_multiplier: float = _rule(0.0, _nonneg, "must be ≥ 0")


#: keys of ``[attack]`` that say *when* the attack acts (and how its durability is scored),
#: not parameters of the attack plugin (:class:`AttackWindow`)
WINDOW_KEYS = ("window", "every", "after_k", "lifespan_threshold")


def baseline_attack(table: Any) -> dict[str, Any]:
    """The ``[attack]`` table of a run's no-attack baseline: ``none``, keeping the window keys
    (the participation draws and the durability metrics follow the window, so the baseline
    draws the same clients in the same rounds as the attacked run)."""
    keep = {k: table[k] for k in WINDOW_KEYS if k in table} if isinstance(table, Mapping) else {}
    return {"name": "none", **keep}


def durability_params(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``after_k`` and ``lifespan_threshold`` of a (validated) scenario document's ``[attack]``."""
    table = doc.get("attack")
    table = table if isinstance(table, Mapping) else {}
    default = AttackWindow()
    return {"after_k": int(table.get("after_k", default.after_k)),
            "lifespan_threshold": float(table.get("lifespan_threshold", default.lifespan_threshold))}


def inherit_window(entry: Mapping[str, Any], base: Any) -> dict[str, Any]:
    """A matrix attack entry with the base ``[attack]`` table's window keys it does not set itself."""
    out = dict(entry)
    if isinstance(base, Mapping):
        for k in WINDOW_KEYS:
            if k in base and k not in out:
                out[k] = base[k]
    return out


@dataclass(frozen=True, slots=True)
class AttackWindow:
    """When the attack acts (``[attack] window`` / ``every``), and the durability metrics'
    parameters (issue 20; Neurotoxin, Zhang et al., ICML 2022, measure a backdoor's lifespan
    after the attackers leave).

    * ``window``: ``"a:b"`` — rounds a ≤ r < b; ``"a:"`` — from round a to the end; ``a`` —
      that one round (single shot). Unset: every round. Rounds count from 0 after any
      warm-up. Outside the window the malicious clients are honest: they train on their
      clean data, their training is not hooked and their updates are not replaced.
    * ``every``: multi-shot — inside the window, the attack acts in rounds a, a + k, a + 2k, …
    * ``after_k``: ``asr_after_k`` is the ASR k rounds after the window's last round;
    * ``lifespan_threshold``: the lifespan counts the rounds after the window while the
      ASR stays ≥ this.
    """

    window: str | int | None = _rule(None, _window_ok,
                                     'must be "a:b" (rounds a ≤ r < b), "a:" (from a on) or a round a (single shot)')
    every: int = _rule(1, _pos_int, "must be an integer ≥ 1")
    after_k: int = _rule(10, _pos_int, "must be an integer ≥ 1")
    lifespan_threshold: float = _rule(0.5, lambda v: _prob(v) and v > 0, "must be in (0, 1]")

    @property
    def bounds(self) -> tuple[int, int | None]:
        """(first round, end round exclusive or None); the whole run when no window is set."""
        return (0, None) if self.window is None else parse_window(self.window)

    def active(self, rnd: int) -> bool:
        a, b = self.bounds
        return rnd >= a and (b is None or rnd < b) and (rnd - a) % self.every == 0

    @property
    def is_full(self) -> bool:
        """True when the attack acts in every round (no window, ``every = 1``)."""
        return self.window is None and self.every == 1


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario. ``defense`` is a tuple of stages (one stage = that defense)."""

    scenario: ScenarioInfo = field(default_factory=ScenarioInfo)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    federation: FederationSpec = field(default_factory=FederationSpec)
    transport: TransportSpec = field(default_factory=TransportSpec)
    hierarchy: HierarchySpec = field(default_factory=HierarchySpec)
    attack: PluginSpec = field(default_factory=lambda: PluginSpec("none"))
    defense: tuple[PluginSpec, ...] = (PluginSpec("mean"),)
    window: AttackWindow = field(default_factory=AttackWindow)
    pipeline: PipelineSpec | None = None
    gossip: GossipSpec | None = None
    # ``[async]`` (``async`` is a Python keyword)
    asynchronous: AsyncSpec | None = None
    privacy: PrivacySpec | None = None
    # ``[flower]``: a user's own Flower app (redteam.integrations.flower.spec)
    flower: FlowerSpec | None = None
    source: str = ""
    # the scenario file's directory (relative ``start_from`` paths); not part of the digest
    base_dir: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def workload_params(self) -> dict[str, Any]:
        """``[workload]``'s params with its relative paths read from the scenario file's
        directory (:func:`resolve_workload_paths`): what the workload is built with."""
        return resolve_workload_paths(self.workload.params, self.base_dir)

    @property
    def seed(self) -> int:
        return self.scenario.seed

    def defense_label(self) -> str:
        return "+".join(s.name for s in self.defense)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source", None)
        d.pop("base_dir", None)
        # keys added by issue 20 appear only when set, so that every earlier scenario keeps
        # its digest (a results store made before them still resumes)
        for section, defaults in _LATE_DEFAULTS.items():
            tab = d.get(section) or {}
            for key, default in defaults.items():
                if key in tab and tab[key] == default:
                    del tab[key]
            if section == "window" and not tab:
                d.pop("window", None)
        if d.get("pipeline", 0) is None:
            d.pop("pipeline")
        if d.get("gossip", 0) is None:
            d.pop("gossip")
        if d.get("asynchronous", 0) is None:
            d.pop("asynchronous")
        if d.get("privacy", 0) is None:
            d.pop("privacy")
        if d.get("flower", 0) is None:
            d.pop("flower")
        return json.loads(json.dumps(d, default=str))

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the validated scenario (what was run); with
        ``start_from``, the model file's own SHA-256 too, so a replaced file is a new run."""
        d = self.to_dict()
        start = self.scenario.start_from
        if start is not None:
            p = Path(start) if Path(start).is_absolute() else Path(self.base_dir or ".") / start
            if p.is_file():
                h = hashlib.sha256()
                with p.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                d["start_from_sha256"] = h.hexdigest()
        blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    def replace(self, **changes: Any) -> "Scenario":
        return dataclasses.replace(self, **changes)

    def with_attack(self, spec: PluginSpec) -> "Scenario":
        return dataclasses.replace(self, attack=spec)


#: keys added after results stores existed: left out of :meth:`Scenario.to_dict` at their default
_LATE_DEFAULTS: dict[str, dict[str, Any]] = {
    "scenario": {"warmup_rounds": 0, "warmup_seed": None, "start_from": None, "requires": ()},
    "federation": {"clients_per_round": None, "attacker_selection": "random", "attackers_per_round": None,
                   "batching": "auto"},
    "window": {"window": None, "every": 1, "after_k": 10, "lifespan_threshold": 0.5},
    "pipeline": {"reputation_penalty": 1.0, "reputation_recovery": 0.0, "bandwidth_mbps": 0.0,
                 "bandwidth_sigma": 0.0, "latency_ms": 0.0},
}


# --------------------------------------------------------------------------- parsing


class _Where:
    def __init__(self, file: str) -> None:
        self.file = file

    def err(self, path: str, value: Any, expect: str) -> InvalidScenario:
        return InvalidScenario(f"{self.file}: {path} = {shown(value)}: {expect}")


def _section_path(section: str, key: str) -> str:
    return f"[{section}].{key}"


def _build(cls: type, table: Any, section: str, where: _Where, nested: Mapping[str, Callable] | None = None) -> Any:
    if not isinstance(table, Mapping):
        raise where.err(f"[{section}]", table, "must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = _type_hints(cls)  # resolved once per section class
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=2, cutoff=0.6)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise InvalidScenario(
                f"{where.file}: [{section}] has unknown key {key!r}{hint} (allowed: {', '.join(fields)})"
            )
        path = _section_path(section, key)
        if nested and key in nested:
            kwargs[key] = nested[key](value, f"{section}.{key}")
            continue
        raw = value
        try:
            value = _coerce(value, hints.get(key, Any), "")
        except InvalidParameter:
            raise where.err(path, raw, f"expected {_describe(hints.get(key, Any))}") from None
        meta = fields[key].metadata
        check = meta.get("check") if meta else None
        if check is not None and not check(value):
            raise where.err(path, raw, meta.get("expect") or "invalid value")
        kwargs[key] = value
    return cls(**kwargs)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(a) for a in typing.get_args(tp))
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType")):
        parts = [_describe(a) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(parts)
    return str(tp)


def _plugin(table: Any, section: str, where: _Where, registry: Any, check: bool = True,
            limits: Limits | None = None, image_shape: tuple[int, ...] = ()) -> PluginSpec:
    """The ``[section]`` table as a :class:`PluginSpec`, checked by the plugin itself
    (``check``). ``image_shape``: the workload's image shape, which the check gives an attack
    that leaves ``image_shape`` unset, as the run does (:func:`fill_image_shape`):
    a trigger is judged against the images it will be stamped on. The spec keeps the params
    as written."""
    if isinstance(table, str):
        table = {"name": table}
    if not isinstance(table, Mapping):
        raise where.err(f"[{section}]", table, "must be a table with a 'name' key, or a name")
    if "name" not in table:
        raise InvalidScenario(f"{where.file}: [{section}] needs a 'name' key")
    name = table["name"]
    params = {k: v for k, v in table.items() if k != "name"}
    if not isinstance(name, str) or not name or len(name) > 100:
        raise where.err(f"[{section}].name", name, "must be a registered name (a short string)")
    if check:  # the plugin's own checks first: its message is the more precise
        try:
            checked = params
            if image_shape:
                checked = dict(fill_image_shape(PluginSpec(name, params), image_shape).params)
            registry.create(name, checked)
        except RedteamError as exc:
            raise InvalidScenario(f"{where.file}: [{section}]: {exc}") from None
    lim = limits if limits is not None else Limits.from_env()
    check_work(section, params, lim, where.file, kind=section)
    for k, v in params.items():  # a composition's parts (compose, adaptive) carry their own loops
        if isinstance(v, list):
            for i, part in enumerate(v):
                if isinstance(part, Mapping):
                    check_work(f"{section}.{k}[{i}]", part, lim, where.file)
    return PluginSpec(name, params)


def parse_scenario(
    data: Mapping[str, Any], *, file: str = "<scenario>", check_plugins: bool = True, limits: Limits | None = None,
    base_dir: str | Path = "",
) -> Scenario:
    """Validate a parsed TOML document (a dict) into a :class:`Scenario`.

    ``limits`` caps the federation's sizes (default: :meth:`Limits.from_env`); ``base_dir``
    is the directory relative paths in it (``start_from``) are read from.
    """
    where = _Where(file)
    if not isinstance(data, Mapping):
        raise where.err("document", data, "must be a table of sections")
    allowed = ("scenario", "workload", "federation", "transport", "hierarchy", "attack", "defense",
               "pipeline", "gossip", "async", "privacy", "flower", "matrix", "expect")
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"; did you mean [{close[0]}]?" if close else ""
            named = key if len(key) <= 60 else key[:59] + "…"  # a key may be as long as the file
            raise InvalidScenario(f"{file}: unknown section [{named}]{hint} (allowed: {', '.join(allowed)})")
    kw: dict[str, Any] = {"source": file, "base_dir": str(base_dir)}
    if "scenario" in data:
        kw["scenario"] = _build(ScenarioInfo, data["scenario"], "scenario", where)
        if kw["scenario"].warmup_seed is not None and kw["scenario"].warmup_rounds == 0:
            raise where.err("[scenario].warmup_seed", kw["scenario"].warmup_seed,
                            "sets the warm-up's seed, and there is none ([scenario] warmup_rounds = 0)")
    if "workload" in data:
        spec = _plugin(data["workload"], "workload", where, WORKLOADS, check_plugins)
        kw["workload"] = WorkloadSpec(spec.name, spec.params)
        _confine_text_dir(kw["workload"], base_dir, limits, where)
    if "federation" in data:
        fed = _build(FederationSpec, data["federation"], "federation", where)
        if fed.malicious_fraction > 0 and fed.n_malicious == 0:
            raise where.err(
                "[federation].malicious_fraction", data["federation"]["malicious_fraction"],
                f"gives no malicious client among {fed.clients} (need ≥ {0.5 / fed.clients:.3g}, or 0 for none)",
            )
        check_federation(fed, limits if limits is not None else Limits.from_env(), file)
        kw["federation"] = fed
    if "transport" in data:
        cp = data["transport"].get("codec_params") if isinstance(data["transport"], Mapping) else None
        if cp is not None and not isinstance(cp, Mapping):
            raise where.err("[transport].codec_params", cp, "must be a table of the codec's parameters")
        kw["transport"] = _build(
            TransportSpec,
            data["transport"],
            "transport",
            where,
            nested={"network": lambda v, s: _build(NetworkSpec, v, s, where)},
        )
        if check_plugins:
            _check_codec(kw["transport"], where)
    if "hierarchy" in data:
        kw["hierarchy"] = _build(
            HierarchySpec,
            data["hierarchy"],
            "hierarchy",
            where,
            nested={"upper_defense": lambda v, s: _plugin(v, s, where, DEFENSES, check_plugins)},
        )
    if "attack" in data:
        table = data["attack"]
        if isinstance(table, Mapping):
            window = {k: table[k] for k in WINDOW_KEYS if k in table}
            table = {k: v for k, v in table.items() if k not in WINDOW_KEYS}
            if window:
                kw["window"] = _build(AttackWindow, window, "attack", where)
        shape = _workload_image_shape(kw.get("workload", WorkloadSpec())) if check_plugins else ()
        kw["attack"] = _plugin(table, "attack", where, ATTACKS, check_plugins, image_shape=shape)
    if "defense" in data:
        kw["defense"] = _defense(data["defense"], where, check_plugins)
    if "pipeline" in data:
        def checks(v: Any, sec: str) -> tuple[PluginSpec, ...]:
            if not isinstance(v, list):
                raise where.err("[pipeline].checks", v, "must be a list of check tables, e.g. "
                                '[{ name = "redundant_recompute", fraction = 0.25 }]')
            specs = tuple(_plugin(c, f"pipeline.checks[{i}]", where, DEFENSES, check_plugins) for i, c in enumerate(v))
            if check_plugins:
                for i, c in enumerate(specs):
                    if DEFENSES.create(c.name, c.params).acts_at != "pipeline":
                        raise where.err(f"[pipeline].checks[{i}].name", c.name,
                                        "is not a pipeline check (redteam defenses list: acts_at pipeline)")
            return specs

        kw["pipeline"] = _build(PipelineSpec, data["pipeline"], "pipeline", where, nested={"checks": checks})
        pl = kw["pipeline"]
        if pl.attacker_stage >= pl.stages:
            raise where.err("[pipeline].attacker_stage", pl.attacker_stage, f"must be a stage in [0, {pl.stages - 1}]")
        if pl.attackers > pl.peers_per_stage:
            raise where.err("[pipeline].attackers", pl.attackers, f"is more than the stage's {pl.peers_per_stage} peers")
        info = kw.get("scenario", ScenarioInfo())
        for key in ("warmup_optimizer", "warmup_lr"):
            if getattr(pl, key) is not None and info.warmup_rounds == 0:
                raise where.err(f"[pipeline].{key}", getattr(pl, key),
                                "sets the warm-up, and there is none ([scenario] warmup_rounds = 0)")
    if "gossip" in data:
        kw["gossip"] = _check_gossip(_build(GossipSpec, data["gossip"], "gossip", where),
                                     kw.get("federation", FederationSpec()), where)
    if "async" in data:
        kw["asynchronous"] = _build(AsyncSpec, data["async"], "async", where)
    if "privacy" in data:
        kw["privacy"] = _privacy(data["privacy"], kw, where, check_plugins)
    if "flower" in data:
        kw["flower"] = _flower(data["flower"], kw, where)
    refusal = check_flower_document(data, kw.get("defense", ()), file)
    if refusal is not None:
        raise InvalidScenario(refusal)
    _check_regime(data, kw, where)
    _check_protocol(kw.get("federation", FederationSpec()), kw.get("window", AttackWindow()), where)
    scenario = Scenario(**kw)
    check_memory(scenario, limits if limits is not None else Limits.from_env(), file, plugins=check_plugins)
    return scenario


def _check_regime(data: Mapping[str, Any], kw: Mapping[str, Any], where: _Where) -> None:
    """One rule for every regime (:mod:`redteam.topology`): one regime section at most, and the
    keys that regime does not read at their defaults."""
    try:
        support = regime_section(data)
    except InvalidScenario as exc:
        raise InvalidScenario(f"{where.file}: {exc}") from None
    if "privacy" in data and not support.privacy:
        homes = " or ".join(r.label for r in REGIMES if r.privacy)
        raise InvalidScenario(f"{where.file}: [privacy] does not apply to the {support.label} regime (its observers "
                              f"and secure aggregation run in the {homes} regime)")
    fed = kw.get("federation", FederationSpec())
    values = {
        "federation.clients_per_round": fed.clients_per_round,
        "federation.attacker_selection": fed.attacker_selection,
        "federation.malicious_fraction": fed.malicious_fraction,
        "federation.batching": fed.batching,
        "scenario.warmup_rounds": kw.get("scenario", ScenarioInfo()).warmup_rounds,
        "hierarchy.depth": kw.get("hierarchy", HierarchySpec()).depth,
        "transport.codec": kw.get("transport", TransportSpec()).codec,
        "workload.name": kw.get("workload", WorkloadSpec()).name,
    }
    check_keys(support, values, where.file)


def _privacy(table: Any, kw: Mapping[str, Any], where: _Where, check: bool) -> PrivacySpec:
    """``[privacy]``: its observers are ``Surface.PRIVACY`` attacks, one of each kind at most."""
    def observers(v: Any, sec: str) -> tuple[PluginSpec, ...]:
        if not isinstance(v, list):
            raise where.err("[privacy].observers", v, 'must be a list of observers, e.g. ["idlg", '
                            '{ name = "lira", shadows = 8 }]')
        specs = tuple(_plugin(o, f"privacy.observers[{i}]", where, ATTACKS, check) for i, o in enumerate(v))
        if check:
            kinds: dict[str, str] = {}
            for i, o in enumerate(specs):
                plugin = ATTACKS.create(o.name, o.params)
                if plugin.observes not in ("update", "model"):
                    raise where.err(f"[privacy].observers[{i}].name", o.name,
                                    "is not a privacy observer (redteam attacks list: the privacy surface)")
                if plugin.observes in kinds:
                    raise where.err(f"[privacy].observers[{i}].name", o.name,
                                    f"observes the {plugin.observes}, as {kinds[plugin.observes]!r} does: one "
                                    "inversion and one membership observer per scenario (compare several with "
                                    "one scenario each)")
                kinds[plugin.observes] = o.name
        return specs

    spec = _build(PrivacySpec, table, "privacy", where, nested={"observers": observers})
    fed = kw.get("federation", FederationSpec())
    if spec.observe_round >= fed.rounds:
        raise where.err("[privacy].observe_round", spec.observe_round, f"must be a round in [0, {fed.rounds - 1}]")
    if spec.victim is not None and spec.victim >= fed.clients:
        raise where.err("[privacy].victim", spec.victim, f"must be a client in [0, {fed.clients - 1}]")
    if spec.secure_aggregation and kw.get("hierarchy", HierarchySpec()).depth > 1:
        raise where.err("[privacy].secure_aggregation", True, "sums the round's rows at one server; leave "
                        "[hierarchy].depth at 1 (secagg_buckets gives the merge its groups)")
    return spec


def _check_gossip(g: GossipSpec, fed: FederationSpec, where: _Where) -> GossipSpec:
    """``[gossip]`` against the federation: the nodes are its clients, the attackers ``[gossip]``'s."""
    n = fed.clients
    if g.attackers >= n:
        raise where.err("[gossip].attackers", g.attackers, f"must leave an honest node among the {n} clients")
    honest = n - g.attackers if g.placement == "everywhere" else n
    if honest < 2:
        raise where.err("[gossip].attackers", g.attackers, f"leaves {honest} honest node(s) to build the graph on")
    if g.topology == "torus" and g.rows is not None and honest % g.rows:
        raise where.err("[gossip].rows", g.rows, f"must divide the {honest} nodes of the torus")
    if g.topology == "two_worlds" and g.bridges > honest - honest // 2:
        raise where.err("[gossip].bridges", g.bridges, f"must be ≤ {honest - honest // 2}, the second half's size")
    return g


def check_protocol(scenario: "Scenario", file: str) -> None:
    """Re-check the sampling and window keys of a scenario changed after parsing (``--rounds``)."""
    _check_protocol(scenario.federation, scenario.window, _Where(file))


def _check_protocol(fed: FederationSpec, window: AttackWindow, where: _Where) -> None:
    """The sampling and window keys against each other and the federation's size."""
    a, b = window.bounds
    if window.window is not None and a >= fed.rounds:
        raise where.err("[attack].window", window.window,
                        f"starts at round {a}, but the run has rounds 0..{fed.rounds - 1}: the attack would never act")
    if window.window is not None and b is not None and b > fed.rounds:
        raise where.err("[attack].window", window.window,
                        f"ends after the run's last round {fed.rounds - 1} (use \"{a}:\" for \"to the end\")")
    k = fed.clients_per_round
    if k is not None and k > fed.clients:
        raise where.err("[federation].clients_per_round", k, f"is more than the {fed.clients} clients")
    if fed.attacker_selection == "count":
        if fed.attackers_per_round is None:
            raise InvalidScenario(f"{where.file}: [federation].attacker_selection = \"count\" needs "
                                  "attackers_per_round = the number of attackers in each round the attack acts in")
        if fed.attackers_per_round > fed.n_malicious:
            raise where.err("[federation].attackers_per_round", fed.attackers_per_round,
                            f"is more than the {fed.n_malicious} malicious clients")
        if k is not None and fed.attackers_per_round > k:
            raise where.err("[federation].attackers_per_round", fed.attackers_per_round,
                            f"is more than clients_per_round = {k}")
    elif fed.attackers_per_round is not None:
        raise where.err("[federation].attackers_per_round", fed.attackers_per_round,
                        'is read only with attacker_selection = "count"')
    if fed.attacker_selection != "random" and k is None:
        raise where.err("[federation].attacker_selection", fed.attacker_selection,
                        "chooses who of K sampled clients are attackers: set clients_per_round = K")
    if fed.attacker_selection == "every_round" and k is not None and fed.n_malicious > k:
        raise where.err("[federation].attacker_selection", "every_round",
                        f"puts all {fed.n_malicious} malicious clients in a round of clients_per_round = {k}")


def _flower(table: Any, kw: Mapping[str, Any], where: _Where) -> FlowerSpec:
    """``[flower]``: the app's factory reference (required), its engine, and its own params."""
    def params(v: Any, sec: str) -> dict[str, Any]:
        if not isinstance(v, Mapping):
            raise where.err("[flower].params", v, "must be a table of the app's own settings")
        return dict(v)

    spec = _build(FlowerSpec, table, "flower", where, nested={"params": params})
    if not spec.app:
        raise InvalidScenario(f'{where.file}: [flower] needs app = "module:attribute" (the app\'s factory, '
                              "docs/flower.md)")
    if not kw.get("window", AttackWindow()).is_full:
        raise InvalidScenario(f"{where.file}: [attack] window / every: a [flower] run attacks in every round "
                              "(the Flower regime sets no attack window)")
    return spec


def _defense(table: Any, where: _Where, check: bool) -> tuple[PluginSpec, ...]:
    if isinstance(table, Mapping) and isinstance(table.get("name"), str) and is_flower_builtin(table["name"]):
        params = {k: v for k, v in table.items() if k != "name"}
        refusal = check_flower_builtin(table["name"], params, where.file)
        if refusal is not None:
            raise InvalidScenario(refusal)
        return (PluginSpec(table["name"], params),)
    if isinstance(table, str) and is_flower_builtin(table):
        return _defense({"name": table}, where, check)
    if isinstance(table, Mapping) and "pipeline" in table:
        extra = [k for k in table if k != "pipeline"]
        if extra:
            raise InvalidScenario(
                f"{where.file}: [defense] with 'pipeline' takes no other keys, got {', '.join(map(repr, extra))}"
            )
        stages = table["pipeline"]
        if not isinstance(stages, list) or not stages:
            raise where.err("[defense].pipeline", stages, "must be a non-empty list of tables")
        for i, st in enumerate(stages):
            name = st.get("name") if isinstance(st, Mapping) else st
            if isinstance(name, str) and is_flower_builtin(name):
                raise where.err(f"[defense].pipeline[{i}].name", name, "is a whole Flower strategy; it cannot be a "
                                "stage of a pipeline")
        specs = tuple(_plugin(s, f"defense.pipeline[{i}]", where, DEFENSES, check) for i, s in enumerate(stages))
        if check:
            from .federation.builders import build_defense

            try:
                build_defense(specs)
            except RedteamError as exc:
                raise InvalidScenario(f"{where.file}: [defense].pipeline: {exc}") from None
        return specs
    return (_plugin(table, "defense", where, DEFENSES, check),)


def _check_codec(spec: TransportSpec, where: _Where) -> None:
    from .federation.builders import build_compressor

    try:
        build_compressor(spec)
    except RedteamError as exc:
        raise InvalidScenario(f"{where.file}: [transport]: {exc}") from None


def _read_toml(p: Path, via: str = "", limits: Limits | None = None) -> dict[str, Any]:
    origin = f" (included from {via})" if via else ""
    limits = limits if limits is not None else Limits.from_env()
    return read_toml(p, limits, origin=origin)  # size, nesting, dotted keys, integers: see scenario_limits


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: tables merge key by key, anything else in ``over`` replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def load_document(
    path: str | Path, _stack: tuple[Path, ...] = (), *, limits: Limits | None = None, _home: Path | None = None
) -> dict[str, Any]:
    """Read a scenario file with its includes resolved (a raw, unvalidated dict).

    ``include = "base.toml"`` (or a list) names files relative to the including file;
    they are merged in order, and the including file's own keys win. An include must
    stay inside the top scenario's directory unless ``limits.allow_include_outside``
    (``REDTEAM_ALLOW_INCLUDE_OUTSIDE=1``); see :mod:`redteam.scenario_limits` for the caps.
    """
    limits = limits if limits is not None else Limits.from_env()
    p = Path(path)
    resolved = p.resolve()
    if resolved in _stack:
        chain = " -> ".join(x.name for x in (*_stack, resolved))
        raise InvalidScenario(f"{p.name}: include cycle: {chain}")
    data = _read_toml(p, _stack[-1].name if _stack else "", limits)
    inc = data.pop("include", None)
    if inc is None:
        return data
    if isinstance(inc, str):
        inc = [inc]
    if not isinstance(inc, list) or not all(isinstance(i, str) for i in inc):
        raise InvalidScenario(f"{p.name}: include = {shown(inc)}: must be a file name or a list of them")
    home = _home if _home is not None else p.parent.resolve()  # the top scenario's directory
    merged: dict[str, Any] = {}
    for name in inc:
        target = p.parent / name
        if not limits.allow_include_outside and not target.resolve().is_relative_to(home):
            raise InvalidScenario(
                f"{p.name}: include = {shown(name)}: must stay inside {shown(str(home))} "
                "(REDTEAM_ALLOW_INCLUDE_OUTSIDE=1 allows it)"
            )
        merged = _merge(merged, load_document(target, (*_stack, resolved), limits=limits, _home=home))
    return _merge(merged, data)


#: the ``[workload]`` keys that name a file or a directory
WORKLOAD_PATH_KEYS = ("dir", "file", "text_dir", "hf_dir")


def resolve_workload_paths(params: Mapping[str, Any], base_dir: str | Path) -> dict[str, Any]:
    """``params`` with each relative path of :data:`WORKLOAD_PATH_KEYS` joined onto ``base_dir``,
    the scenario file's directory — the one rule for every relative path of a scenario, as for
    ``start_from`` (a path starting with ``~`` is the user's, absolute). Without ``base_dir`` (a
    scenario built in Python) the paths stay as given, relative to the working directory. The
    scenario itself keeps them as written (its digest does not depend on where it lies); a data
    directory from ``REDTEAM_DATA_DIR`` is not a workload param and is not touched."""
    out = dict(params)
    if not base_dir:
        return out
    for key in WORKLOAD_PATH_KEYS:
        v = out.get(key)
        if isinstance(v, str) and v and not Path(v).expanduser().is_absolute():
            out[key] = str(Path(base_dir) / v)
    return out


def fill_image_shape(spec: PluginSpec, shape: tuple[int, ...]) -> PluginSpec:
    """``spec`` with ``image_shape = shape`` where its attack (or a part of a composition) has
    that parameter and leaves it unset: pixel-pattern attacks address the workload's images."""

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


def _workload_image_shape(workload: "WorkloadSpec") -> tuple[int, ...]:
    """The image shape of ``workload`` (``()`` for a workload without images, or one that does
    not build: its own check has reported that already). The class attributes only: nothing is
    read."""
    try:
        wl = WORKLOADS.create(workload.name, dict(workload.params))
    except Exception:  # noqa: BLE001 - the workload's own check reports it
        return ()
    if getattr(wl, "input_kind", None) != "image":
        return ()
    return tuple(int(v) for v in (getattr(wl, "image_shape", None) or ()))


def _confine_text_dir(workload: "WorkloadSpec", base_dir: str | Path, limits: Limits | None, where: _Where) -> None:
    """A file's data paths (a relative one read from the scenario's directory, as the workload
    reads it: :func:`resolve_workload_paths`) must stay inside the scenario's directory or the
    working directory: ``text_dir`` (every file under it becomes training text and is named in
    the run's manifests), and ``dir``, ``hf_dir`` and ``file`` (a dataset's files, read as
    training data), so a hostile scenario must not point them at ``~/.ssh``.
    ``REDTEAM_ALLOW_TEXT_DIR_OUTSIDE=1`` allows ``text_dir`` outside, ``REDTEAM_ALLOW_DATA_DIR_OUTSIDE=1``
    the others (and ``text_dir``); a data directory from ``REDTEAM_DATA_DIR`` is the user's own and
    not checked. A scenario built in Python (no file, no ``base_dir``) is not checked."""
    if not base_dir:
        return
    params = dict(workload.params)
    lim = limits if limits is not None else Limits.from_env()
    homes = (Path(base_dir).resolve(), Path.cwd().resolve())
    for key in WORKLOAD_PATH_KEYS:
        v = params.get(key)
        if not isinstance(v, str) or not v:
            continue
        if lim.allow_data_dir_outside or (key == "text_dir" and lim.allow_text_dir_outside):
            continue
        target = Path(resolve_workload_paths({key: v}, base_dir)[key]).expanduser().resolve()
        if not any(target.is_relative_to(h) for h in homes):
            var = "REDTEAM_ALLOW_TEXT_DIR_OUTSIDE" if key == "text_dir" else "REDTEAM_ALLOW_DATA_DIR_OUTSIDE"
            raise where.err(f"[workload].{key}", v, f"must stay inside the scenario's directory {str(homes[0])!r} or "
                            f"the working directory {str(homes[1])!r} ({var}=1 allows it)")


def load_scenario(path: str | Path, *, limits: Limits | None = None) -> Scenario:
    """Read and validate a scenario file (its base scenario, if it has a ``[matrix]``)."""
    p = Path(path)
    return parse_scenario(load_document(p, limits=limits), file=p.name, limits=limits, base_dir=p.parent)
