"""Core contracts: updates, contexts, decisions, round records, and the plugin bases.

These are the documented stubs the rest of redteam is written against. The docstrings
are the specification.

* ``Updates`` is a ``torch.Tensor`` of shape ``(n_clients, d)``: one flattened model
  delta (local − global) per row, float32 by default, on the run's device.
* An :class:`Attack` is a frozen dataclass whose fields are its parameters. It declares
  the surfaces it acts on and overrides the matching hooks; the defaults are identity.
* A :class:`Defense` is a frozen dataclass called as ``defense(updates, ctx)`` and
  returning a :class:`Decision`. The server's :class:`ServerContext` never tells it
  which clients are malicious; only the attack's :class:`AttackContext` knows that.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from .errors import InvalidParameter

if TYPE_CHECKING:  # torch stays out of the import path of the CLI's --help
    import torch

    Updates = torch.Tensor
else:
    Updates = Any

__all__ = [
    "Updates",
    "AttackContext",
    "ServerContext",
    "Decision",
    "RoundRecord",
    "ClientData",
    "ChunkDelivery",
    "Attack",
    "Defense",
    "Surface",
    "TrainingHook",
    "UpdateObservation",
    "Reconstruction",
    "ModelObservation",
    "StageContext",
    "GossipContext",
    "PipelineView",
    "AsyncContext",
    "AsyncSend",
    "ModelView",
]


class Surface:
    """Names of the surfaces an attack can act on (see the round's stages in
    :mod:`redteam.federation.loop`)."""

    DATA = "data"  # poison_data: a malicious client's training set
    UPDATES = "updates"  # craft_updates: the rows the malicious clients send
    TRANSPORT = "transport"  # tamper_chunks: chunks in flight
    PROVENANCE = "provenance"  # forge_provenance: manifests and keys
    HIERARCHY = "hierarchy"  # choose_identity, tamper_subaggregate: merge groups and sub-aggregators
    TRAINING = "training"  # training_hook: the malicious clients' own local training, step by step
    PIPELINE = "pipeline"  # tamper_activation, tamper_gradient, tamper_stage_update: a stage peer of a pipeline
    GOSSIP = "gossip"  # craft_gossip: what a Byzantine node of a gossip graph sends each honest neighbour
    ASYNC = "async"  # async_send: when an update of an asynchronous server lands, and the base version it claims
    PRIVACY = "privacy"  # reconstruct / membership_scores: a passive observer of one client's update or of the model

    ALL = (DATA, UPDATES, TRANSPORT, PROVENANCE, HIERARCHY, TRAINING, PIPELINE, GOSSIP, ASYNC, PRIVACY)


@dataclass(frozen=True, slots=True)
class AsyncContext:
    """What a malicious client of an asynchronous server knows when its update is ready, or while
    it holds one back (:mod:`redteam.federation.asyncrun`; the attackers collude).

    ``client``: the attacker; ``trained_from``: the model version its update was computed from;
    ``version``: the server's current version (server steps so far); ``time_s``: simulated time;
    ``buffer_size``: K, the arrivals the server merges per step; ``buffered``: the updates in the
    buffer now; ``buffered_malicious``: how many of those its colluders sent; ``holding``: the
    attackers holding a ready update now (itself included); ``attackers``: every attacker of the
    run; ``max_staleness``: the server's staleness bound (``None``: none); ``state``: the attack's
    memory for the run (the same dict as ``AttackContext.attack_state``)."""

    client: int
    trained_from: int
    version: int
    time_s: float
    buffer_size: int
    buffered: int
    buffered_malicious: int
    holding: tuple[int, ...]
    attackers: tuple[int, ...]
    max_staleness: int | None = None
    state: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AsyncSend:
    """An attacker's answer to :meth:`Attack.async_send`: ``hold`` its ready update back (it is
    asked again after the next event), or send it now claiming it was computed from model version
    ``claimed_version`` (``None``: the truth, ``trained_from``)."""

    hold: bool = False
    claimed_version: int | None = None


@dataclass(frozen=True, slots=True)
class GossipContext:
    """What the Byzantine neighbours of one honest node see in one gossip step
    (:mod:`redteam.federation.gossip`; they are omniscient and collude, as in the papers).

    ``target``: the honest node they send to, with model ``target_model`` ``(d,)``;
    ``neighbours`` / ``neighbour_models`` ``(h, d)`` / ``neighbour_weights`` ``(h,)``: its honest
    neighbours, their models and its mixing weights W_ij for them; ``self_weight``: W_ii;
    ``attackers`` / ``attacker_weights``: its Byzantine neighbours and their weights;
    ``own_models`` ``(k, d)``: those attackers' own (honestly trained) models. The graph of the
    honest nodes: ``honest`` (their node ids), ``honest_models`` ``(m, d)``, ``laplacian``
    ``(m, m)`` (of the honest subgraph, weighted by W), ``fiedler`` ``(m,)`` (its Fiedler vector)
    and ``position`` (the target's index in ``honest``). ``generator`` and ``state`` (the attack's
    memory for the run) as in :class:`AttackContext`; ``defense``: the rule the target merges its
    rows with (called as the regime calls it: rows centred on ``target_model``, its own zero row
    first, then ``neighbours``, then ``attackers``, weighted by W, ``ServerContext.own_row = 0``),
    for an attack that searches against it; ``None`` when unknown."""

    round: int
    step: int
    target: int
    target_model: "torch.Tensor"
    neighbours: tuple[int, ...]
    neighbour_models: "torch.Tensor"
    neighbour_weights: "torch.Tensor"
    self_weight: float
    attackers: tuple[int, ...]
    attacker_weights: "torch.Tensor"
    own_models: "torch.Tensor"
    honest: tuple[int, ...]
    honest_models: "torch.Tensor"
    laplacian: "torch.Tensor"
    fiedler: "torch.Tensor"
    position: int
    generator: "torch.Generator"
    state: dict = field(default_factory=dict)
    defense: Any = None


@dataclass(frozen=True, slots=True)
class StageContext:
    """What a stage peer of a model-parallel pipeline sees of one hop (:mod:`redteam.federation.swarm`).

    ``stage`` (0-based) of ``n_stages``; ``peer``: the peer's id (unique over all stages);
    ``micro_batch``: the hop's micro-batch, counted from the start of the run; ``generator``:
    the attack's random stream; ``state``: the attack's memory for the run (one dict, shared by
    every malicious peer: the attackers collude); ``pipeline``: what a peer knows of the training
    it joined (:class:`PipelineView`; given at the stage sync, ``None`` on a hop)."""

    round: int
    stage: int
    n_stages: int
    peer: int
    micro_batch: int
    generator: "torch.Generator"
    state: dict = field(default_factory=dict)
    pipeline: "PipelineView | None" = None


@dataclass(frozen=True, slots=True)
class PipelineView:
    """What a stage peer knows of the pipeline it joined, for attacks that prepare offline (the
    stage backdoor of Ersoy et al., arXiv 2604.02372, knows the *starting* weights of every stage):

    * ``params0``: the flat starting parameters of the whole model (read-only: never modify);
    * ``slices``: each stage's slice of the flat vector;
    * ``loss(flat, x, y)``: the whole model's differentiable mean loss with parameters ``flat`` on
      inputs ``x`` and targets ``y`` (targets −100 are masked), for offline training;
    * ``data_x``, ``data_y``: text of the task's distribution the peer may train on offline (the
      training pool: it stands in for the attacker's own corpus);
    * ``peers_per_stage``: the size of each stage's pool (the replicas a stage update is merged with).
    """

    params0: "torch.Tensor"
    slices: tuple[slice, ...]
    loss: Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]
    data_x: "torch.Tensor"
    data_y: "torch.Tensor"
    peers_per_stage: int


@dataclass(frozen=True, slots=True)
class ClientData:
    """One client's local dataset: inputs ``x`` (first dim = samples) and labels ``y``."""

    x: "torch.Tensor"
    y: "torch.Tensor"

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True, slots=True)
class TrainingHook:
    """How the malicious clients shape their own local training, step by step.

    Returned by :meth:`Attack.training_hook` (``Surface.TRAINING``); the trainer applies
    it to the malicious rows inside the same batched (``vmap``) program as the honest
    clients. At every local step t of a malicious client, with w its parameters and
    w_g the global model of the round:

    1. g = ∇_w [loss(w; batch) + ``extra_loss``(w, w_g, x_batch, y_batch)]
       (``extra_loss`` is called per client inside ``torch.func.vmap``: it sees one
       flat ``(d,)`` parameter row and that client's batch, returns a scalar, and must
       be vmap-able: torch operations only, no ``.item()`` or data-dependent Python
       control flow);
    2. g ← g ⊙ ``grad_mask`` (``(d,)`` for every malicious row, or ``(f, d)`` one per row in
       the order of ``ctx.malicious``), then the federation's FedProx term if any;
    3. w ← w − η·g with η = ``lr`` (the federation's local lr when ``None``), or the
       federation's local optimizer (AdamW) with that learning rate;
    4. W ← ``project``(W, w_g) for the ``(f, d)`` rows W of all malicious clients (e.g. onto
       an L2 ball of radius r around w_g: w_g + (W − w_g)·min(1, r/‖W − w_g‖) per row).

    ``poison_batch(x, y)`` rewrites the malicious rows' batches before step 1, every step:
    ``x`` is ``(f, B, *input)`` and ``y`` ``(f, B)`` (the batches they drew from their own clean
    data), and it returns the pair they train on (same shapes and dtypes): on-the-fly poisoning
    with a trigger the attack re-optimises each round (A3FL, IBA), as the authors' attackers stamp
    a share of every batch. It runs outside ``vmap`` (any torch code).

    ``batch`` (≤ the federation's batch size) computes step 1's gradient on the first ``batch``
    items of each drawn batch only (a lazy peer that does less work per step; the batches it
    draws, and so the honest stream, are unchanged).

    ``steps`` replaces the federation's number of local steps for the malicious clients
    (a per-client step mask keeps the batch one program; steps beyond the federation's
    draw their batches from the attack's generator, so the honest batch stream is the
    same with or without the hook). The delta the malicious clients then hold is their
    ``ctx.own_updates`` of the round's ``craft_updates``.
    """

    grad_mask: "torch.Tensor | None" = None
    project: "Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None" = None
    extra_loss: "Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None" = None
    poison_batch: "Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None" = None
    lr: float | None = None
    steps: int | None = None
    batch: int | None = None

    def __post_init__(self) -> None:
        import math

        if self.batch is not None and not (isinstance(self.batch, int) and not isinstance(self.batch, bool)
                                           and self.batch >= 1):
            raise param_error(self, "batch", self.batch, "must be an integer ≥ 1 or None")

        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise param_error(self, "lr", self.lr, "must be a finite number > 0 or None")
        if self.steps is not None and not (isinstance(self.steps, int) and not isinstance(self.steps, bool)
                                           and self.steps >= 1):
            raise param_error(self, "steps", self.steps, "must be an integer ≥ 1 or None")
        for name in ("project", "extra_loss", "poison_batch"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise param_error(self, name, fn, "must be callable or None")
        mask = self.grad_mask
        if mask is not None and getattr(mask, "ndim", None) not in (1, 2):
            raise param_error(self, "grad_mask", type(mask).__name__, "must be a (d,) or (f, d) tensor or None")


@dataclass(frozen=True, slots=True)
class ModelView:
    """The run's model as functions of a flat parameter row: what a white-box attacker that
    optimises against the global model (an adaptive trigger, a contrastive encoder) and a
    defense that inspects models (outputs on probe inputs, penultimate representations) read.

    * ``forward(flat, x)``: the outputs (logits) of the model with parameters ``flat`` ``(d,)`` on
      inputs ``x`` (a batch in the workload's input layout); differentiable in both;
    * ``loss(out, y)``: the workload's training loss (mean over the batch);
    * ``features(flat, x)``: the input of the model's last linear layer, flattened to
      ``(N, k)`` (its penultimate representation; ``(N·T, k)`` for a token model);
    * ``layers``: ``(name, start, stop, shape)`` of every parameter tensor in the flat order;
    * ``head``: the names of the last linear layer's weight (and bias), the output layer;
    * ``input_shape``: one input's shape; ``num_classes``: the label count (a token model's
      vocabulary; 0: not a classifier); ``input_kind``: the workload's (``"image"``, ``"tokens"``,
      ``"vector"``), so a defense that draws probe inputs draws token ids for a language model.
    """

    forward: "Callable[[torch.Tensor, torch.Tensor], torch.Tensor]"
    loss: "Callable[[torch.Tensor, torch.Tensor], torch.Tensor]"
    features: "Callable[[torch.Tensor, torch.Tensor], torch.Tensor]"
    layers: tuple[tuple[str, int, int, tuple[int, ...]], ...]
    head: tuple[str, ...]
    input_shape: tuple[int, ...]
    num_classes: int = 0
    input_kind: str = "image"

    @property
    def dim(self) -> int:
        return self.layers[-1][2] if self.layers else 0

    def span(self, name: str) -> slice:
        """The slice of the flat row that holds parameter ``name``."""
        for n, a, b, _ in self.layers:
            if n == name:
                return slice(a, b)
        raise KeyError(f"no parameter {name!r} in the model (has {', '.join(n for n, *_ in self.layers)})")

    def head_span(self) -> slice:
        """The slice of the flat row that holds the output layer (its weight, then its bias)."""
        spans = [self.span(n) for n in self.head]
        return slice(min(s.start for s in spans), max(s.stop for s in spans))

    def accuracy(self, flat: "torch.Tensor", x: "torch.Tensor", y: "torch.Tensor") -> float:
        """Top-1 accuracy of the model ``flat`` on ``(x, y)`` (a classifier's labels)."""
        import torch

        with torch.no_grad():
            out = self.forward(flat, x)
        return float((out.argmax(-1) == y).to(torch.float64).mean()) if y.numel() else 0.0


@dataclass(frozen=True, slots=True)
class UpdateObservation:
    """What an observer of one client's update sees (``Surface.PRIVACY`` attacks that
    ``observes = "update"``: a curious server, or an eavesdropper on the wire).

    * ``update`` ``(d,)``: the row as the observer received it (local − broadcast model, after the
      codec; under secure aggregation a masked row, which carries nothing on its own);
    * ``params`` ``(d,)``: the model the client trained from;
    * ``model``: the run's :class:`ModelView`;
    * ``lr``, ``local_steps``, ``batch_size``: the clients' local SGD procedure (public in FedSGD /
      FedAvg); for one step of plain SGD the gradient is ``-update / lr``;
    * ``num_samples``: how many samples the client's step averaged (the batch to reconstruct);
    * ``generator``: the observer's seeded stream (its random initial guess).
    """

    update: "torch.Tensor"
    params: "torch.Tensor"
    model: "ModelView"
    lr: float
    local_steps: int
    batch_size: int
    num_samples: int
    generator: "torch.Generator"


@dataclass(frozen=True, slots=True)
class Reconstruction:
    """An inversion's answer: ``images`` ``(B, *input_shape)`` in the workload's input scale and
    ``labels`` ``(B,)`` (int64; the labels it believes the samples carry)."""

    images: "torch.Tensor"
    labels: "torch.Tensor"


@dataclass(frozen=True, slots=True)
class ModelObservation:
    """What a membership-inference observer of the final global model sees (``Surface.PRIVACY``
    attacks that ``observes = "model"``).

    * ``params`` ``(d,)``: the released model; ``model``: its :class:`ModelView`;
    * ``candidates_x`` / ``candidates_y``: the points to score, members of the federation's
      training data and non-members from the same distribution, shuffled (which is which is hidden);
    * ``population_x`` / ``population_y``: the attacker's own data from the same distribution,
      disjoint from the candidates (what it trains shadow models on);
    * ``train(x, y, generator) -> (d,)``: trains a fresh model as the federation would (its
      initialisation distribution, its optimiser and budget) on ``(x, y)``: a shadow model;
    * ``train_size``: how many samples the target model was trained on (a shadow trains on as many);
    * ``generator``: the observer's seeded stream.
    """

    params: "torch.Tensor"
    model: "ModelView"
    candidates_x: "torch.Tensor"
    candidates_y: "torch.Tensor"
    population_x: "torch.Tensor"
    population_y: "torch.Tensor"
    train: "Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]"
    train_size: int
    generator: "torch.Generator"


@dataclass(frozen=True, slots=True)
class AttackContext:
    """What an attack may see in one round.

    ``own_updates`` holds the honest updates that the malicious clients themselves
    computed (shape ``(f, d)``, in the order of ``malicious``). ``visible_updates`` is
    what the threat model lets the attacker see of the honest clients: all honest rows
    for an omniscient attack, otherwise the same as ``own_updates``. ``malicious`` holds
    client ids; ``malicious_rows`` their positions among the round's participating rows
    (``n_clients`` rows, in the order ``weights`` uses) — they differ under churn. ``server_lr`` is
    the server step η (model replacement boosts by n/η) and ``server_optimizer`` the name of
    the server's step rule ("fedavg", "fedadam", "nesterov"). ``defense`` is the server's
    defense, given only to attacks that declare ``adaptive = True`` (they line-search
    against it, as a white-box adversary would).

    ``visible_clients`` are the client ids of the rows of ``visible_updates``. With worker
    momentum (``[federation] client_momentum``) the updates are what the clients *send*
    (their momenta), so an omniscient attacker crafts against the honest sent vectors, as
    in the papers. ``attack_state`` is the attack's memory: a mutable dict owned by the
    engine, fresh for every run and the same object in every round of that run (e.g. the
    mimic victim's client id); the attack may read and write it, nothing else does.

    ``model`` (a :class:`ModelView`) and ``own_data`` (the malicious clients' own clean training
    sets, in the order of ``malicious``) are given only to attacks that declare
    ``needs_model = True``: they optimise against the global model (a trigger, a generator, an
    encoder), as the white-box attacker of those papers does with the model it was sent.
    """

    round: int
    n_clients: int
    malicious: tuple[int, ...]
    own_updates: "torch.Tensor"
    visible_updates: "torch.Tensor"
    global_params: "torch.Tensor"
    generator: "torch.Generator"
    num_classes: int = 0
    weights: "torch.Tensor | None" = None
    previous_update: "torch.Tensor | None" = None
    server_lr: float = 1.0
    defense: Any = None
    state: Mapping[str, Any] = field(default_factory=dict)
    malicious_rows: tuple[int, ...] = ()
    server_optimizer: str = "fedavg"
    attack_state: dict[str, Any] = field(default_factory=dict)
    visible_clients: tuple[int, ...] = ()
    model: "ModelView | None" = None
    own_data: "tuple[ClientData, ...]" = ()

    @property
    def n_malicious(self) -> int:
        return len(self.malicious)

    @property
    def rows(self) -> tuple[int, ...]:
        """Positions of the malicious clients among this round's rows (what ``weights``
        and the server's ``(n, d)`` matrix are indexed by). Defaults to ``malicious``
        when every client takes part and ids equal positions."""
        return self.malicious_rows or self.malicious


@dataclass(frozen=True, slots=True)
class ServerContext:
    """What a defense may see in one round. It never says who is malicious.

    ``weights`` are the clients' sample counts (FedAvg weights), shape ``(n,)``.
    ``previous_update`` is the previous round's global update (``None`` in round 0).
    ``state`` is the defense's explicit state carried from its previous call
    (``Decision.state``), never hidden mutation. ``evaluate_loss`` evaluates the loss
    of a batch of candidate deltas ``(k, d)`` applied to ``global_params`` on
    server-held data (returns ``(k,)`` losses; ``evaluate_loss`` of a zero row is the
    current loss). ``root_update`` trains the global model on the server's small
    trusted root dataset with the clients' local procedure and returns that delta
    (FLTrust's g₀). Both are ``None`` when the server holds no data. For a defense that
    ``prepares_broadcast``, ``global_params`` is the model the server sent this round
    (:meth:`Defense.broadcast`), which the rows are deltas from.
    """

    round: int = 0
    n_clients: int = 0
    weights: "torch.Tensor | None" = None
    global_params: "torch.Tensor | None" = None
    previous_update: "torch.Tensor | None" = None
    generator: "torch.Generator | None" = None
    state: Mapping[str, Any] = field(default_factory=dict)
    evaluate_loss: Callable[["torch.Tensor"], "torch.Tensor"] | None = None
    root_update: Callable[[], "torch.Tensor"] | None = None
    client_ids: tuple[int, ...] = ()
    #: the gossip regime: the position of the merging node's own row (a zero row: the rows are
    #: x_j − x_i, centred on its model) among the rows; ``None`` on a server
    own_row: int | None = None
    #: verification of work (defenses/gauntlet.py): the loss of each candidate delta ``(k, d)``
    #: applied to ``global_params`` on a batch of the named client's *assigned* data (the data a
    #: permissionless trainer publicly assigns each peer, which a validator can therefore read),
    #: one client id per row; ``(k,)`` losses. ``None`` where the engine offers no assignment
    evaluate_loss_assigned: Callable[["torch.Tensor", tuple[int, ...]], "torch.Tensor"] | None = None
    #: commit-reveal (defenses/gauntlet.py): client id → (SHA-256 hex of the row it committed to,
    #: its commit time in units of the commit window, which closes at 1.0 when reveals open);
    #: ``None`` where the engine runs no commit phase
    commits: Mapping[int, tuple[str, float]] | None = None
    #: spot-check replay (defenses/spot_check.py): recompute, honestly, the named clients' updates
    #: of this round from what they committed to (the round's global model, their batch seed and
    #: their assigned data), one row per client id, ``(k, d)``; the verifier's own compute.
    #: ``None`` where the engine cannot replay the local procedure
    replay_work: Callable[[tuple[int, ...]], "torch.Tensor"] | None = None
    #: a rewarding validator's consensus (defenses/gauntlet.py, ``validators`` > 1): the score
    #: vectors that the validator seats an attacker holds report, given this round's peer ids and
    #: the honest validators' round scores ``(n,)``: ``(c, n)``, one row per colluding seat (c may
    #: be 0). ``None`` where no attacker holds a seat
    validator_reports: Callable[[tuple[int, ...], "torch.Tensor"], "torch.Tensor"] | None = None
    #: the model as functions of a flat row (:class:`ModelView`): a defense that inspects the
    #: clients' models (their outputs on probe inputs, their penultimate representations) builds
    #: each as ``global_params + row``. ``None`` where the regime offers none
    model: "ModelView | None" = None
    #: the server's own root sample ``(x, y)`` (``uses_server_data`` rules); ``None`` when it holds none
    root_data: "tuple[torch.Tensor, torch.Tensor] | None" = None
    #: under secure aggregation, how many clients each row sums (the rows are those sums' means,
    #: ``weights`` their summed sample weights, ``client_ids`` empty); ``None``: one client per row
    summed: "tuple[int, ...] | None" = None

    @classmethod
    def default(cls, updates: "torch.Tensor", **overrides: Any) -> "ServerContext":
        """A context for calling a defense on a bare ``(n, d)`` tensor: equal weights."""
        import torch

        n = int(updates.shape[0])
        base = dict(
            round=0,
            n_clients=n,
            weights=torch.ones(n, dtype=updates.dtype, device=updates.device),
            generator=torch.Generator(device="cpu").manual_seed(0),
            client_ids=tuple(range(n)),
        )
        base.update(overrides)
        return cls(**base)


@dataclass(frozen=True, slots=True)
class Decision:
    """The result of a defense on one round's updates.

    * ``aggregate``: the ``(d,)`` aggregate update.
    * ``accepted``: bool mask ``(n,)``; ``True`` where the client's update was used.
    * ``weights``: optional per-client weights the aggregate effectively used.
    * ``reasons``: for each rejected client index, why it was rejected.
    * ``state``: explicit state the defense wants back next round (e.g. centered
      clipping's previous aggregate).
    """

    aggregate: "torch.Tensor"
    accepted: "torch.Tensor"
    weights: "torch.Tensor | None" = None
    reasons: Mapping[int, str] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)

    @property
    def n_accepted(self) -> int:
        return int(self.accepted.sum())


@dataclass(slots=True)
class ChunkDelivery:
    """One chunk in flight: ``data`` as it will arrive, sent by ``author`` via ``relay``.

    Transport attacks receive the round's list of deliveries and may change ``data``
    (tamper, substitute), drop entries (withhold) or add entries (replay). ``index == -1``
    is the update's header (its manifest, or the signed envelope of it), announced
    before the chunks; ``relay == author`` means the delivery came straight from its author.
    """

    author: int
    index: int
    relay: int
    data: bytes
    round: int = 0


@dataclass(slots=True)
class RoundRecord:
    """What happened in one round; the scorer reads only these.

    ``accepted`` and ``malicious`` are per client (``len == n_clients``). A client whose
    update never reached aggregation (straggler, churned out, bad chunk, undecodable)
    appears in ``dropped`` with its reason and is not accepted. ``detections`` lists
    the clients some check flagged in this round, with the reason. ``extra["defense_notes"]``
    (read as :attr:`defense_notes`) lists, in plain words, what a defense had to give up in
    this round — a trimmed mean trimming fewer than b per side, RLR's θ above the round's
    n, DnC removing fewer than ⌊c·f⌋ — in the rule's own words, collected by
    :func:`redteam.merge.degradation_notes`.
    """

    round: int
    accuracy: float
    loss: float
    accepted: list[bool]
    malicious: list[bool]
    participating: list[bool]
    dropped: dict[int, str] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    bytes_on_wire: int = 0
    sim_time_s: float = 0.0
    wall_time_s: float = 0.0
    defense_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def defense_notes(self) -> list[str]:
        """What a defense said it gave up in this round (empty: it ran as configured)."""
        notes = self.extra.get("defense_notes", ())
        return [str(n) for n in notes] if isinstance(notes, (list, tuple)) else []

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (client-keyed dicts get string keys; see :meth:`from_dict`)."""
        out = dataclasses.asdict(self)
        out["dropped"] = {str(k): v for k, v in self.dropped.items()}
        out["rejected"] = {str(k): v for k, v in self.rejected.items()}
        out["extra"] = {
            k: ({str(c): x for c, x in v.items()} if isinstance(v, dict) else v) for k, v in self.extra.items()
        }
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RoundRecord":
        """Inverse of :meth:`to_dict`: client ids become ints again."""

        def ints(m: Any) -> Any:
            if isinstance(m, Mapping) and all(isinstance(k, str) and k.lstrip("-").isdigit() for k in m):
                return {int(k): v for k, v in m.items()}
            return m

        kw = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
        kw["dropped"] = ints(kw.get("dropped", {}))
        kw["rejected"] = ints(kw.get("rejected", {}))
        kw["extra"] = {k: ints(v) for k, v in dict(kw.get("extra", {})).items()}
        return cls(**kw)


def _check_fields(obj: Any) -> None:
    """Shared ``__post_init__`` hook: call each field's ``validate_<field>`` if defined."""
    for f in dataclasses.fields(obj):
        check = getattr(obj, f"validate_{f.name}", None)
        if check is not None:
            check(getattr(obj, f.name))


@dataclass(frozen=True, slots=True)
class Attack:
    """Base of every attack. Subclass as a frozen dataclass; fields are parameters.

    Class attributes a subclass sets:

    * ``surfaces``: which hooks it overrides (subset of :class:`Surface`.ALL);
    * ``omniscient``: ``True`` if it needs every honest update of the round;
    * ``summary`` and ``reference``: one line each, shown by ``redteam attacks list``;
    * ``produces_nonfinite``: ``True`` when sending NaN/Inf is the attack's purpose
      (the contract kit then does not require finite rows from finite inputs).
    """

    surfaces: ClassVar[tuple[str, ...]] = ()
    omniscient: ClassVar[bool] = False
    produces_nonfinite: ClassVar[bool] = False
    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    # -- capabilities the engine reads (docs/plugins.md, "What the engine asks of an attack") --
    #: ``True``: the attack's context carries the server's defense (``AttackContext.defense``)
    adaptive: ClassVar[bool] = False
    #: rounds of recorded traffic a transport attack is shown (``ctx.state["history"]``)
    history_rounds: ClassVar[int] = 0
    #: validator seats the attacker holds (a consensus of validators; ``report_scores``)
    validator_seats: ClassVar[int] = 0
    #: what a provenance attacker holds (``"enrolled_key"``, ``"log_key"``)
    capabilities: ClassVar[tuple[str, ...]] = ()
    #: a pipeline peer that skips its compute (it is never busy in simulated time)
    skips_compute: ClassVar[bool] = False
    #: a pipeline peer that leaves just before its stage's sync
    leaves_before_sync: ClassVar[bool] = False
    #: a pipeline peer's accomplices vouch for it when they are drawn to recompute its hop (the
    #: attackers collude unless an attack says otherwise)
    colluding_verifiers: ClassVar[bool] = True
    #: the attack's context carries the model (``AttackContext.model``) and the malicious clients'
    #: own clean data (``AttackContext.own_data``)
    needs_model: ClassVar[bool] = False
    #: the trigger changes from round to round (it is optimised): ``targeted_test`` is asked again
    #: before every evaluation, so the ASR is that of the trigger the attacker holds then
    dynamic_trigger: ClassVar[bool] = False
    #: a ``Surface.PRIVACY`` observer: ``"update"`` (one client's update: :meth:`reconstruct`) or
    #: ``"model"`` (the final global model: :meth:`membership_scores`)
    observes: ClassVar[str] = ""

    #: the capabilities above, by name (the plugin guide documents each)
    CAPABILITIES: ClassVar[tuple[str, ...]] = (
        "surfaces", "omniscient", "produces_nonfinite", "adaptive", "history_rounds", "validator_seats",
        "capabilities", "skips_compute", "leaves_before_sync", "colluding_verifiers", "needs_model",
        "dynamic_trigger", "observes", "targeted_test", "clean_test",
        "near_miss_test", "targeted_parts", "report_scores")

    def __post_init__(self) -> None:
        _check_fields(self)

    # -- what a targeted attack is scored on (None: not targeted) -------------------
    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> "tuple[torch.Tensor, torch.Tensor] | None":
        """The test inputs (with the trigger) and the labels the attack wants for them, from the
        workload's test split ``(x, y)``: its attack success rate. ``None``: not a targeted attack."""
        return None

    def clean_test(self, x: "torch.Tensor", y: "torch.Tensor") -> "tuple[torch.Tensor, torch.Tensor] | None":
        """A text backdoor's prompts without the trigger, scored like ``targeted_test``: its
        false-trigger rate. ``None``: none."""
        return None

    def near_miss_test(self, x: "torch.Tensor", y: "torch.Tensor"
                       ) -> "Mapping[str, tuple[torch.Tensor, torch.Tensor]] | None":
        """Prompts with a partial trigger, by kind: the near-miss trigger rate. ``None``: none."""
        return None

    def targeted_parts(self, x: "torch.Tensor", y: "torch.Tensor"
                       ) -> "Mapping[str, tuple[torch.Tensor, torch.Tensor]] | None":
        """A distributed trigger's local triggers, each scored alone (``extra["asr_parts"]``). ``None``: none."""
        return None

    def report_scores(self, peers: tuple[int, ...], scores: "torch.Tensor", own: tuple[int, ...]) -> "torch.Tensor":
        """The ``(validator_seats, len(peers))`` scores the attacker's validator seats report, given
        the honest ``scores`` and its own peers ``own`` (only called when ``validator_seats > 0``)."""
        raise NotImplementedError(f"{type(self).__name__} holds validator seats but does not report scores")

    # -- hooks (identity by default) ------------------------------------------------
    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        """Return the training set malicious ``client`` trains on."""
        return data

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        """Return the ``(f, d)`` rows the malicious clients send this round."""
        return ctx.own_updates

    def tamper_chunks(self, deliveries: list[ChunkDelivery], ctx: AttackContext) -> list[ChunkDelivery]:
        """Return the chunk deliveries as they arrive (transport attacks)."""
        return deliveries

    def forge_provenance(self, manifest: Any, ctx: AttackContext) -> Any:
        """Return the dataset manifest a malicious client presents."""
        return manifest

    def choose_identity(self, client: int, n_groups: int) -> str:
        """Return the public name malicious ``client`` enrolls under (hash grouping reads it)."""
        return str(client)

    def tamper_subaggregate(self, aggregate: "torch.Tensor", group: int, members: tuple[int, ...],
                            ctx: AttackContext) -> "torch.Tensor":
        """Return the ``(d,)`` partial aggregate bottom ``group`` (client ids ``members``) passes up."""
        return aggregate

    def tamper_activation(self, out: "torch.Tensor", inp: "torch.Tensor", ctx: StageContext) -> "torch.Tensor":
        """A malicious stage peer's forward pass: return what it sends to the next stage, given the
        stage's honest output ``out`` (computed from its input ``inp``). Differentiable operations
        on ``out`` keep the backward pass through the peer's layers; returning something built
        without ``out`` (a lazy peer) means its layers get no gradient."""
        return out

    def advertise_throughput(self, speed: float) -> float:
        """A malicious stage peer's advertised throughput (SWARM routes in proportion to it), given
        its true one: more than the truth draws more traffic (routing capture)."""
        return speed

    def tamper_gradient(self, grad: "torch.Tensor", ctx: StageContext) -> "torch.Tensor":
        """A malicious stage peer's backward pass: return the gradient it sends to the previous
        stage, given the honest gradient with respect to its input."""
        return grad

    def tamper_stage_update(self, update: "torch.Tensor", ctx: StageContext) -> "torch.Tensor":
        """A malicious stage peer's update at its stage's sync: return the ``(d_stage,)`` change to
        its stage's parameters it submits, given its honest one (``ctx.pipeline`` is set)."""
        return update

    def craft_gossip(self, ctx: "GossipContext") -> "torch.Tensor":
        """What the Byzantine neighbours of honest node ``ctx.target`` send it in one gossip step:
        ``(len(ctx.attackers), d)`` models, one per Byzantine neighbour (``Surface.GOSSIP``; a
        Byzantine node may send each neighbour something else). Default: their own models."""
        return ctx.own_models

    def async_send(self, ctx: "AsyncContext") -> "AsyncSend | None":
        """When a malicious client's update lands on an asynchronous server (``Surface.ASYNC``):
        called when it is ready and again after every event while it is held; ``None`` sends it now
        with the true base version."""
        return None

    def reconstruct(self, obs: "UpdateObservation") -> "Reconstruction":
        """A privacy observer of one client's update (``Surface.PRIVACY``, ``observes = "update"``):
        return its reconstruction of the samples the client trained on. Passive: what it returns
        changes nothing in the run; the engine scores it against the client's data."""
        raise NotImplementedError(f"{type(self).__name__} does not reconstruct updates")

    def membership_scores(self, obs: "ModelObservation") -> "torch.Tensor":
        """A membership-inference observer of the final model (``Surface.PRIVACY``, ``observes =
        "model"``): return one score per candidate ``(m,)``, higher = more likely a member. The
        engine scores them against the hidden truth (AUC, TPR at low FPR)."""
        raise NotImplementedError(f"{type(self).__name__} does not score membership")

    def training_hook(self, ctx: AttackContext) -> "TrainingHook | None":
        """Return how the malicious clients train this round (``None``: like honest clients).

        Called each round before local training when ``Surface.TRAINING`` is declared;
        ``ctx.own_updates`` / ``ctx.visible_updates`` are the PREVIOUS round's (zero rows in
        round 0, or for clients that did not take part then); ``ctx.global_params`` is the
        model the round trains from. See :class:`TrainingHook`."""
        return None


@dataclass(frozen=True, slots=True)
class Defense:
    """Base of every defense. Subclass as a frozen dataclass; fields are parameters.

    Call it as ``defense(updates, ctx=None)``. Subclasses implement
    :meth:`decide`; ``__call__`` validates the input and builds a default
    :class:`ServerContext` when none is given.
    """

    summary: ClassVar[str] = ""
    reference: ClassVar[str] = ""
    #: True when the result does not depend on the order of the clients.
    symmetric: ClassVar[bool] = True
    #: True when n copies of one update x aggregate to x (unanimity); False for rules
    #: whose point is to change that result (added noise, down-weighting look-alikes).
    unanimity: ClassVar[bool] = True
    # -- capabilities the engine reads (docs/plugins.md, "What the engine asks of a defense") --
    #: where the engine runs it: "aggregate" (a merge node's rows), "transport" (chunk headers and
    #: signatures), "admission" (dataset manifests before round 0); pipeline hop checks are their own
    #: kind (:class:`PipelineCheck`)
    acts_at: ClassVar[str] = "aggregate"
    #: reads the server's root data (``ctx.evaluate_loss``, ``ctx.root_update``)
    uses_server_data: ClassVar[bool] = False
    #: reads the clients' models through ``ctx.model`` (a :class:`ModelView`)
    inspects_models: ClassVar[bool] = False
    #: recomputes peers' local training (``ctx.replay_work``)
    replays_work: ClassVar[bool] = False
    #: needs the round's commit phase (``ctx.commits``)
    commit_reveal: ClassVar[bool] = False
    #: validators in a consensus that reads ``ctx.validator_reports`` (0: reads none)
    validators: ClassVar[int] = 0
    #: a pipeline stage's kind: "filter", "pre", "aggregator", "post" (:mod:`redteam.pipeline`)
    kind: ClassVar[str] = "aggregator"
    #: the stages of a composed defense (``()`` for a single rule)
    stages: ClassVar[tuple["Defense", ...]] = ()
    #: fields that default to the scenario's malicious count when left unset
    from_malicious_count: ClassVar[tuple[str, ...]] = ()
    #: a rule over many neighbourhoods at once (gossip): ``decide_batch(rows, weights, valid, own_row)``
    #: returning a ``defenses.gossip.BatchDecision``; ``None``: node by node
    decide_batch: ClassVar[Any] = None
    #: entries of the padded neighbourhood tensor ``decide_batch`` gets at a time (``None``: the engine's)
    chunk_entries: ClassVar["int | None"] = None
    #: a node's batched result does not depend on the padding, so nodes may be grouped by degree
    sort_by_degree: ClassVar[bool] = False
    #: the server prepares the model it sends each round (:meth:`broadcast`, e.g. plants an indicator
    #: task in it): the clients train from that model, their rows are local − broadcast, ``decide``'s
    #: ``ctx.global_params`` is the broadcast model and the server steps from it
    prepares_broadcast: ClassVar[bool] = False
    #: the rule reads each client's row. Under secure aggregation (``[privacy] secure_aggregation``)
    #: the server reads only sums: such a rule runs on the bucket sums' means (``secagg_buckets`` > 1,
    #: ``ServerContext.summed`` says how many clients each row sums) or is refused; a rule that needs
    #: only the sum (the mean, noise on the aggregate) sets it ``False``
    needs_client_rows: ClassVar[bool] = True
    #: the rule is a differentially private mechanism whose ε the run reports (:meth:`dp_mechanism`)
    accounts_privacy: ClassVar[bool] = False

    #: the capabilities above and the methods below, by name (the plugin guide documents each)
    CAPABILITIES: ClassVar[tuple[str, ...]] = (
        "symmetric", "unanimity", "acts_at", "uses_server_data", "inspects_models", "replays_work", "commit_reveal", "validators",
        "kind", "stages", "from_malicious_count", "decide_batch", "chunk_entries", "sort_by_degree", "batch_ready", "value_from_malicious_count",
        "check_capacity", "degradation", "prepares_broadcast", "broadcast", "needs_client_rows", "accounts_privacy",
        "client_side", "dp_mechanism")

    def __post_init__(self) -> None:
        _check_fields(self)

    def parts(self) -> tuple["Defense", ...]:
        """Its stages when composed, else itself alone."""
        return tuple(self.stages) or (self,)

    def batch_ready(self) -> bool:
        """Whether ``decide_batch`` can decide with the parameters as set."""
        return self.decide_batch is not None

    @staticmethod
    def value_from_malicious_count(name: str, f: int) -> int:
        """The value a field of ``from_malicious_count`` takes for f malicious clients (default f)."""
        return int(f)

    def check_capacity(self, most: int) -> None:
        """Refuse (``InvalidParameter``) parameters no round of at most ``most`` rows can meet."""
        return None

    def degradation(self, state: Mapping[str, Any], accepted: int) -> "str | None":
        """A note when the rule could not run as configured this round (``RoundRecord.defense_notes``)."""
        return None

    def broadcast(self, params: "torch.Tensor", ctx: ServerContext) -> "torch.Tensor":
        """The ``(d,)`` model the server sends this round's clients, given the global model ``params``
        (called before local training, in every round, only when ``prepares_broadcast`` is set; the
        regimes that cannot call it refuse such a defense). ``ctx`` is what the server holds then:
        ``round``, ``n_clients`` and ``client_ids`` (this round's participants), ``weights``,
        ``global_params`` (= ``params``), ``previous_update``, ``generator`` (the defense's stream),
        ``model`` (a :class:`ModelView`) and ``root_data``; no rows yet, ``state`` empty. The
        clients train from the returned model, send local − broadcast, ``decide`` sees it as
        ``ctx.global_params``, and the server's optimizer steps from it: the new global model is
        broadcast + server step(aggregate). Default: ``params`` unchanged."""
        return params

    def client_side(self, rows: "torch.Tensor") -> "torch.Tensor":
        """What each client applies to its own row before secure aggregation masks it (DP-FedAvg's
        clipping, which the server cannot do on a sum). ``rows`` ``(m, d)``; default unchanged."""
        return rows

    def dp_mechanism(self, population: int, per_round: int, rounds: int) -> Any:
        """The run's mechanism for the accountant (:class:`redteam.privacy.accountant.ClientLevelDP`)
        when ``accounts_privacy``: ``population`` clients, ``per_round`` drawn each round, ``rounds``."""
        return None

    def __call__(self, updates: "torch.Tensor", ctx: ServerContext | None = None) -> Decision:
        if getattr(updates, "ndim", None) != 2:
            raise InvalidParameter(
                f"{type(self).__name__}: updates must be a 2-D tensor (n_clients, d), "
                f"got shape {tuple(getattr(updates, 'shape', ()))}"
            )
        if updates.shape[0] == 0:
            raise InvalidParameter(f"{type(self).__name__}: no updates to aggregate (n_clients = 0)")
        if ctx is None:
            ctx = ServerContext.default(updates)
        from ._omp import rule_threads

        with rule_threads():  # torch imported before redteam: the rule on redteam's own threads
            return self.decide(updates, ctx)

    def decide(self, updates: "torch.Tensor", ctx: ServerContext) -> Decision:  # pragma: no cover
        """Aggregate one round: ``updates`` are its ``(n, d)`` rows (n ≥ 1), ``ctx`` what the
        server may see. Return a :class:`Decision`: a ``(d,)`` aggregate in the updates' dtype and
        device, an ``(n,)`` bool ``accepted`` mask, a reason for each rejected row. A rule that
        cannot work on an input raises :class:`~redteam.errors.InvalidParameter` (built with
        :func:`param_error`)."""
        raise NotImplementedError


def param_error(obj: Any, name: str, value: Any, expected: str) -> InvalidParameter:
    """Build the standard message ``Krum.f = 9: must satisfy 2f + 2 < n (n = 10)``."""
    return InvalidParameter(f"{type(obj).__name__}.{name} = {value!r}: {expected}")


def sample_weights(ctx: ServerContext, n: int, like: "torch.Tensor") -> "torch.Tensor":
    """The context's per-client weights as a float tensor like ``like`` (ones if absent)."""
    import torch

    if ctx.weights is None:
        return torch.ones(n, dtype=like.dtype, device=like.device)
    return ctx.weights.to(dtype=like.dtype, device=like.device)

