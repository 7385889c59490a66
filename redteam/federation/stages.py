"""The stages of one round, each a function with explicit inputs and outputs.

::

    broadcast → train → craft → encode → chunk (+ sign) → transport → verify/decode
          → defend/merge → server step → evaluate

``broadcast`` is the model the server sends the round's clients: the global model, or what a
defense that ``prepares_broadcast`` makes of it (:meth:`~redteam.types.Defense.broadcast`, e.g.
BackdoorIndicator planting its indicator task). Every later stage of the round reads that model
as ``rin.params``: the clients train from it, their rows are local − broadcast, the defense sees it
as ``ctx.global_params`` and the server steps from it.

:class:`~redteam.federation.loop.Federation` holds what is fixed for a run (its
:class:`~.setup.RunSetup`, and the server's network, codec, hierarchy, provenance gate and root
sample, as public attributes) and passes itself as ``fed``; what changes each round comes in a
:class:`RoundInputs` (the participants, their roles and data, the model). A stage reads those
and returns its results as a value (:class:`Trained`, :class:`Received`, :class:`Merged`): no
stage reads or writes another object's private state. What a client carries across rounds is
in ``fed.states`` (:class:`~.state.ClientStates`), what the defenses carry in the
:class:`~redteam.merge.DefenseMemory` given to :func:`defend`. A new workload or surface
plugs into one stage (an LLM workload with DiLoCo's inner AdamW only changes ``train``'s
local optimizer, which is a client-state matter).

Non-finite models are refused, not trained on: a merge node whose aggregate has a NaN or
±Inf entry passes nothing up (:func:`~redteam.merge.hierarchical_merge`), a non-finite
final aggregate is not applied, and a server step that would make the model non-finite
is undone; each is recorded in ``RoundRecord.extra["refused"]`` (stage, reason, client
ids). ``accepted`` stays as the defense decided, so detection metrics never count a
client as flagged for a refusal the defense did not make.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from ..errors import RedteamError
from ..merge import DefenseMemory, assign_groups, hierarchical_merge
from ..types import AttackContext, ModelView, ServerContext, Surface, TrainingHook
from .rounds import server_context
from .setup import Probes
from .state import apply_momentum
from .wire import Chunked, chunk, encode, transport

if TYPE_CHECKING:
    from .training import StackedData

#: the data-parallel run (:class:`~.loop.Federation`), whose public attributes the stages read;
#: named here, not imported (it imports this module)
Federation = Any

__all__ = ["broadcast", "train", "craft", "encode", "chunk", "transport", "receive", "defend", "server_step", "evaluate",
           "Received", "RowView", "Merged", "Chunked", "RoundInputs", "Trained"]


@dataclass(frozen=True)
class RoundInputs:
    """What changes from round to round: ``rnd`` (an asynchronous job's base version), the
    participants ``part`` (sorted ids; ``part_t`` as a tensor), who acts maliciously ``roles``
    ``(n,)``, the round's ``data`` and sample ``weights`` (clean outside the attack window), the
    model ``params`` it starts from and the previous round's applied update."""

    rnd: int
    part: np.ndarray
    part_t: torch.Tensor
    roles: np.ndarray
    data: "StackedData"
    weights: torch.Tensor
    params: torch.Tensor
    prev_update: torch.Tensor | None = None


@dataclass(frozen=True)
class Trained:
    """What local training gives the later stages: each participant's row (``sent``), the local
    steps each ran under the ``partial`` straggler policy (transport times them), and what a
    spot-check verifier needs to replay the call (``replay``)."""

    sent: torch.Tensor
    client_steps: dict[int, int] | None = None
    replay: tuple[Any, ...] | None = None


# ------------------------------------------------------------------ broadcast
def broadcast(fed: "Federation", rin: RoundInputs) -> tuple[RoundInputs, dict[str, Any]]:
    """The round's inputs with ``params`` replaced by the model the server sends: each stage of the
    defense that ``prepares_broadcast`` maps the model in turn (its ``broadcast(params, ctx)``),
    with a :class:`~redteam.types.ServerContext` of what the server holds before training. Returns
    them and the round's telemetry (``broadcast_shift``: ‖broadcast − global‖). A model that comes
    back non-finite is not sent: the round trains from the global model and says so
    (``refused``). ``(rin, {})`` when no stage prepares one."""
    planters = [st for st in fed.defense.parts() if st.prepares_broadcast]
    if not planters:
        return rin, {}
    d = fed.spec.dim
    part_t = rin.part_t
    ctx = server_context(
        fed.torch_rng["defense"], rnd=rin.rnd, weights=rin.weights[part_t], global_params=rin.params,
        previous_update=rin.prev_update, state={}, client_ids=[int(c) for c in rin.part.tolist()],
        model=model_view(fed), root_data=(fed.root.x, fed.root.y) if fed.root is not None else None)
    sent = rin.params
    for st in planters:
        out = st.broadcast(sent, dataclasses.replace(ctx, global_params=sent))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (d,):
            raise RedteamError(f"defense {type(st).__name__}: broadcast returned "
                               f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}, "
                               f"expected a ({d},) tensor")
        sent = out.detach().to(dtype=rin.params.dtype, device=rin.params.device)
    if not bool(torch.isfinite(sent).all()):
        return rin, {"refused": [{"stage": "broadcast", "reason": "the prepared model is not finite: the global "
                                  "model was sent instead", "clients": []}]}
    shift = float(torch.linalg.vector_norm((sent - rin.params).to(torch.float64)))
    return dataclasses.replace(rin, params=sent), {"broadcast_shift": shift}


# ------------------------------------------------------------------ train
def attack_context(fed: "Federation", rin: RoundInputs, own: torch.Tensor, visible: torch.Tensor,
                   visible_clients: tuple[int, ...]) -> AttackContext:
    """The attack's view of a round (its memory ``attack_state`` is the run's one dict)."""
    part = rin.part
    mal_pos = np.flatnonzero(rin.roles[part]).tolist()
    return AttackContext(
        round=rin.rnd,
        n_clients=len(part),
        malicious=tuple(int(part[k]) for k in mal_pos),
        malicious_rows=tuple(mal_pos),
        own_updates=own,
        visible_updates=visible,
        global_params=rin.params,
        generator=fed.torch_rng["attack"],
        num_classes=fed.num_classes,
        weights=rin.weights[torch.as_tensor(part, dtype=torch.long, device=fed.device)],
        previous_update=rin.prev_update,
        server_lr=fed.server_lr,
        server_optimizer=fed.scenario.federation.server_optimizer,
        defense=fed.defense if fed.attack.adaptive else None,
        attack_state=fed.states.attack,
        visible_clients=visible_clients,
        model=model_view(fed) if fed.attack.needs_model else None,
        own_data=tuple(rin.data.client(int(part[k])) for k in mal_pos) if fed.attack.needs_model else (),
    )


def model_view(fed: Any) -> ModelView:
    """The run's :class:`~redteam.types.ModelView` (built once per run, on its trainer)."""
    view = getattr(fed, "_model_view", None)
    if view is None:
        view = fed.trainer.view(fed.num_classes, tuple(fed.test_x.shape[1:]))
        fed._model_view = view
    return view


def training_hook(fed: "Federation", rin: RoundInputs) -> tuple[TrainingHook | None, list[int]]:
    """Ask a ``Surface.TRAINING`` attack how its clients train this round (previous round's view)."""
    part = rin.part
    mal_pos = np.flatnonzero(rin.roles[part]).tolist()
    if not mal_pos or Surface.TRAINING not in fed.attack.surfaces:
        return None, []
    d = fed.spec.dim
    sent = fed.states.ensure("last_sent", (d,))
    honest = np.asarray(part)[~rin.roles[part]].tolist()
    mal = torch.as_tensor([int(part[k]) for k in mal_pos], dtype=torch.long, device=fed.device)
    own = sent[mal]
    visible = sent[torch.as_tensor(honest, dtype=torch.long, device=fed.device)] if (fed.omniscient and honest) else own
    ctx = attack_context(fed, rin, own, visible, tuple(honest) if fed.omniscient and honest else
                         tuple(int(c) for c in mal.tolist()))
    hook = fed.attack.training_hook(ctx)
    if hook is not None and not isinstance(hook, TrainingHook):
        raise RedteamError(f"attack {fed.attack_spec.name!r}: training_hook returned {type(hook).__name__}, "
                           "expected a redteam.types.TrainingHook or None")
    mask = hook.grad_mask if hook is not None else None
    if mask is not None and (mask.shape[-1] != d or (mask.ndim == 2 and mask.shape[0] != len(mal_pos))):
        raise RedteamError(f"attack {fed.attack_spec.name!r}: TrainingHook.grad_mask has shape {tuple(mask.shape)}, "
                           f"expected ({d},) or ({len(mal_pos)}, {d})")
    return hook, mal_pos


def train(fed: "Federation", rin: RoundInputs, hook: TrainingHook | None, hook_rows: list[int]) -> Trained:
    """Local training of the participating clients; returns what each would send ``(m, d)``
    (:attr:`Trained.sent`): its delta (local − global), or its worker momentum of deltas
    (:func:`~.state.apply_momentum`).

    A malicious client (of an attack that acts on something: under ``none`` the would-be
    attackers are honest) follows ``[federation] malicious_momentum``: ``"raw"`` (default, the
    authors' release, whose bit-flipping and label-flipping workers keep no momentum) gives it
    no momentum — its row, the ``own_updates`` an attack crafts from and what a data or
    training attack sends, is its round's fresh term (Δ under ``momentum_form = "sgd"``,
    (1 − β)·Δ under ``"ema"``); ``"momentum"`` gives it the honest clients' momentum over its
    own deltas. Either way what the attack then sends instead (``craft``) does not feed back
    into any state, and an omniscient attack's ``visible_updates`` are the honest momenta."""
    # the "partial" straggler policy: each client runs the steps it can finish before the
    # deadline (one that cannot finish a step runs them all and arrives late, as under "drop")
    part_t, params = rin.part_t, rin.params
    client_steps = None
    steps_t = None
    if fed.network.config.stragglers == "partial" and fed.network.config.deadline_s is not None:
        h = fed.local.steps
        payload = fed.compressor.codec.payload_size(fed.spec.dim)
        n_chunks = -(-payload // fed.scenario.transport.chunk_size)
        # upload estimate: the payload plus a generous allowance for the (signed) header's digests
        k = fed.network.steps_by_deadline(part_t.tolist(), h, payload + 1024 + 200 * n_chunks)
        k = np.where(k >= 1, k, h)
        client_steps = dict(zip(part_t.tolist(), k.tolist()))
        steps_t = torch.as_tensor(k, dtype=torch.int64, device=part_t.device)
    replay = None
    if fed.replays_work:  # what a spot-check verifier needs to replay this call (ServerContext.replay_work)
        replay = (fed.torch_rng["train"].get_state(), part_t, steps_t, _draws(fed, rin.data, part_t))
    local = fed.trainer.train(params, rin.data, part_t, fed.local, fed.torch_rng["train"], states=fed.states,
                              hook=hook, hook_rows=hook_rows, hook_generator=fed.torch_rng["attack"],
                              client_steps=steps_t,
                              noise_generator=fed.torch_rng["privacy"] if fed.local.dp_clip is not None else None)
    deltas = local - params
    fedspec = fed.scenario.federation
    raw = None
    if fedspec.client_momentum and fedspec.malicious_momentum == "raw" and fed.attack.surfaces:
        raw = torch.as_tensor(rin.roles[part_t.cpu().numpy()], dtype=torch.bool, device=deltas.device)
    sent = apply_momentum(fed.states, part_t, deltas, fedspec.client_momentum, fedspec.momentum_form, raw)
    return Trained(sent, client_steps, replay)


def _draws(fed: "Federation", data: "StackedData", part_t: torch.Tensor) -> int:
    """How many batch draws :meth:`~.training.BatchedTrainer.train` makes from the round's stream:
    the federation's step count, or under ``local_epochs`` the most steps any participant runs
    on the data it actually trains on."""
    cfg = fed.local
    if cfg.epochs is None:
        return int(cfg.steps)
    sizes = data.sizes.to(part_t.device)[part_t].to(torch.float64)
    return int(torch.ceil(cfg.epochs * sizes / cfg.batch_size).max()) if int(part_t.shape[0]) else 0


def _replay_work(fed: "Federation", params: torch.Tensor, trained: Trained | None
                 ) -> Callable[[tuple[int, ...]], torch.Tensor] | None:
    """``ServerContext.replay_work``: the named participants' honest updates of this round,
    recomputed from the round's global model, the batch stream's state before training and
    their assigned (clean) data."""
    inputs = trained.replay if trained is not None else None
    if not fed.replays_work or inputs is None:
        return None
    state, part_t, steps_t, draws = inputs
    where = {int(c): i for i, c in enumerate(part_t.tolist())}

    def replay(clients: tuple[int, ...]) -> torch.Tensor:
        missing = [int(c) for c in clients if int(c) not in where]
        if missing:
            raise RedteamError(f"replay_work: client(s) {missing} did not train this round; a verifier can replay "
                               "only this round's participants")
        rows = [where[int(c)] for c in clients]
        local = fed.trainer.replay(params, fed.committed_data, part_t, fed.local, state, rows, draws=draws,
                                   client_steps=steps_t)
        return local - params

    return replay


# ------------------------------------------------------------------ craft
def craft(fed: "Federation", rin: RoundInputs, sent: torch.Tensor) -> tuple[torch.Tensor, AttackContext | None]:
    """The malicious rows replaced by the attack's (``Surface.UPDATES``); also the round's context."""
    part = rin.part
    if Surface.TRAINING in fed.attack.surfaces:
        fed.states.put("last_sent", torch.as_tensor(part, dtype=torch.long, device=fed.device), sent)
    roles = rin.roles[part]
    mal_pos = np.flatnonzero(roles).tolist()
    if not (mal_pos and fed.attack.surfaces):
        return sent, None
    honest_pos = np.flatnonzero(~roles).tolist()
    own = sent[mal_pos]
    omni = fed.omniscient and bool(honest_pos)
    visible = sent[honest_pos] if omni else own
    shown = tuple(int(part[k]) for k in (honest_pos if omni else mal_pos))
    actx = attack_context(fed, rin, own, visible, shown)
    if Surface.UPDATES in fed.attack.surfaces:
        crafted = fed.attack.craft_updates(actx)
        if tuple(crafted.shape) != tuple(own.shape):
            raise RedteamError(
                f"attack {fed.attack_spec.name!r}: craft_updates returned shape "
                f"{tuple(crafted.shape)}, expected {tuple(own.shape)}"
            )
        sent = sent.clone()
        sent[mal_pos] = crafted.to(sent.dtype)
    return sent, actx


# ------------------------------------------------------------------ verify / decode
class RowView(Sequence[torch.Tensor]):
    """The rows of a matrix ``(m, d)`` as a read-only sequence (each row a view, made
    when read): a round's decoded updates without one tensor object per client."""

    __slots__ = ("matrix",)

    def __init__(self, matrix: torch.Tensor) -> None:
        self.matrix = matrix

    def __len__(self) -> int:
        return int(self.matrix.shape[0])

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self.matrix[j] for j in range(len(self))[k]]
        return self.matrix[k]


@dataclass
class Received:
    """What arrived. ``rows`` (one decoded update per client of ``clients``); ``matrix``,
    when set, holds those rows stacked ``(m, d)`` and ``rows`` is its :class:`RowView`."""

    rows: Sequence[torch.Tensor] = field(default_factory=list)
    clients: list[int] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)
    banned: dict[int, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    matrix: torch.Tensor | None = None


def receive(fed: "Federation", rnd: int, part: np.ndarray, tx: Any) -> Received:
    """What arrived: detections of the transport checks, equivocations, decoded rows."""
    out = Received()
    out.dropped.update(tx.dropped)
    # a check that failed but was repaired by a re-fetch (a tampered relayed chunk
    # fetched again from another peer) is a detection, not a rejected update
    repaired: dict[int, str] = {}
    for c, why in tx.detections.items():
        if c in tx.payloads:
            repaired[c] = why
        else:
            out.rejected[c] = why
    if repaired:
        out.extra["repaired"] = repaired
    if tx.mismatches:
        flagged: dict[int, int] = {}
        for _, _, r in tx.mismatches:
            flagged[r] = flagged.get(r, 0) + 1
        out.extra["flagged_relays"] = flagged
    # gossip of signed headers: two valid signatures for one (sender, round)
    if fed.signed_chunks is not None:
        for c, why in fed.signed_chunks.equivocations(tx.headers, rnd).items():
            tx.payloads.pop(c, None)
            tx.alternates.pop(c, None)
            out.dropped[c] = out.rejected[c] = why
            if fed.signed_chunks.ban:
                out.banned[c] = f"banned in round {rnd}: {why}"
    d = fed.spec.dim
    payloads = tx.payloads
    present = [c for c in np.asarray(part).tolist() if c in payloads]
    if present:  # one batched decode (the same checks and messages as decoding row by row)
        decoded, errors = fed.compressor.codec.decode_many([payloads[c] for c in present], d)
        decoded = decoded.to(fed.device)
        if errors.count(None) == len(errors):  # every row decoded: the rows are the batch's
            out.matrix = decoded
            out.rows = RowView(decoded)
            out.clients = present
        else:
            rows: list[torch.Tensor] = []
            out.rows = rows
            for k, (c, err) in enumerate(zip(present, errors)):
                if err is None:
                    rows.append(decoded[k])
                    out.clients.append(c)
                else:
                    out.dropped[c] = f"undecodable update: {err}"
                    out.rejected[c] = out.dropped[c]
    return out


# ------------------------------------------------------------------ defend / merge
@dataclass
class Merged:
    aggregate: torch.Tensor
    accepted: dict[int, bool]
    rejected: dict[int, str]
    extra: dict[str, Any]
    refused: list[dict[str, Any]]


def defend(fed: "Federation", rin: RoundInputs, rec: Received, tx: Any, memory: DefenseMemory,
           actx: AttackContext | None, trained: Trained | None = None,
           summed: tuple[int, ...] | None = None) -> Merged:
    """Group the rows, run the defense at every merge node, pass sub-aggregates up. ``summed``:
    under secure aggregation, how many clients each row sums (``ServerContext.summed``)."""
    from .telemetry import envelope_telemetry, place_alternates

    rnd, params, prev_update = rin.rnd, rin.params, rin.prev_update
    d, dev, n = fed.spec.dim, fed.device, fed.scenario.federation.clients
    row_clients = list(rec.clients)
    extra: dict[str, Any] = {}
    if not len(rec.rows):
        return Merged(torch.zeros(d, dtype=torch.float32, device=dev), {}, {}, extra, [])
    primary = len(rec.rows)
    groups = assign_groups(row_clients, n, fed.hierarchy, fed.rng["merge"], fed.identities)
    if rec.matrix is not None and (tx is None or not tx.alternates):
        upd = rec.matrix.clone()  # what stacking its rows gives (no equivocation copies to place)
    else:
        rows = list(rec.rows)
        place_alternates(fed, tx, rows, row_clients, groups, d, extra)
        upd = torch.stack(rows)
    w = rin.weights[torch.as_tensor(row_clients, device=dev)]

    # one server-data oracle per round: every merge node sees the same root update
    evaluate_loss = _evaluate_loss(fed, params)
    root_update = _root_update(fed, params)
    evaluate_assigned = _evaluate_assigned(fed, params)
    commits = _commits(fed, rin, rec, row_clients, upd, actx, extra) if _wants_commits(fed) else None
    replay_work = _replay_work(fed, params, trained)
    validator_reports = _validator_reports(fed, rnd, actx)
    view = model_view(fed)
    root_data = (fed.root.x, fed.root.y) if fed.root is not None else None

    def make_ctx(wts: torch.Tensor, rows_: list[int], key: str) -> ServerContext:
        # a bottom node's inputs are its clients; an upper node's are its children
        # (sub-aggregates), which carry no client ids
        bottom = len(rows_) == int(wts.shape[0])
        members = [row_clients[r] for r in rows_] if bottom else []
        return server_context(
            fed.torch_rng["defense"], rnd=rnd, weights=wts, global_params=params, previous_update=prev_update,
            state=memory.start(key, members), client_ids=members, evaluate_loss=evaluate_loss,
            root_update=root_update, evaluate_loss_assigned=evaluate_assigned, commits=commits,
            replay_work=replay_work, validator_reports=validator_reports, model=view, root_data=root_data,
            summed=tuple(summed[r] for r in rows_) if summed is not None and bottom else None)

    ctx_h = actx if Surface.HIERARCHY in fed.attack.surfaces else None

    def tamper_group(gi: int, rows_: list[int], agg: torch.Tensor) -> torch.Tensor:
        members = tuple(row_clients[r] for r in rows_)
        return fed.attack.tamper_subaggregate(agg, gi, members, ctx_h)

    merged = hierarchical_merge(
        upd, w, groups, fed.defense, fed.upper_defense, fed.hierarchy.fan_out, make_ctx,
        tamper_group if ctx_h is not None else None,
    )
    memory.record(merged.state, [[row_clients[r] for r in g] for g in groups])
    accepted: dict[int, bool] = {}
    rejected: dict[int, str] = {}
    accepted_rows = [bool(x) for x in merged.accepted.tolist()]
    if len(row_clients) == primary:  # one row per client (no equivocation copies): row = client
        accepted = dict(zip(row_clients, accepted_rows))
        for pos in [p for p, ok in enumerate(accepted_rows) if not ok]:
            rejected[row_clients[pos]] = merged.reasons.get(pos, "rejected")
    else:
        for pos, c in enumerate(row_clients):
            ok = accepted_rows[pos]
            accepted[c] = accepted.get(c, False) or ok
            if not ok and pos < primary:
                rejected[c] = merged.reasons.get(pos, "rejected")
    refused = [{"stage": "merge", "node": key, "reason": ev["reason"],
                "clients": sorted({row_clients[r] for r in ev["rows"]})} for key, ev in merged.refused.items()]
    extra.update(envelope_telemetry(upd, row_clients, groups, merged.state))
    extra.update(_verification_telemetry(merged.state, len(groups)))
    if merged.notes:  # a rule that could not run as configured this round says so (RoundRecord.defense_notes)
        extra["defense_notes"] = list(merged.notes)
    return Merged(merged.aggregate, accepted, rejected, extra, refused)


def _evaluate_loss(fed: "Federation", params: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
    root = fed.root
    if root is None:
        return None

    def evaluate(deltas: torch.Tensor) -> torch.Tensor:
        return fed.trainer.losses(params + deltas, root.x, root.y)

    return evaluate


def _verification_telemetry(state: dict[str, dict], n_groups: int) -> dict[str, Any]:
    """Per-peer rewards, round scores and ratings of a rewarding validator (defenses/gauntlet.py),
    and a spot-check verifier's replays and catches (defenses/spot_check.py), from the bottom
    nodes' states (a pipeline's stages too), for ``RoundRecord.extra``."""
    out: dict[str, Any] = {}
    for gi in range(n_groups):
        st = state.get(f"0.{gi}", {})
        for stage in [v for k, v in sorted(st.items()) if k.isdigit() and isinstance(v, dict)] or [st]:
            spot = stage.get("spot_check")
            if isinstance(spot, dict):  # defenses/spot_check.py: replays this round, catches so far
                sc = out.setdefault("spot_check", {"checked": [], "rows": 0, "caught": {}})
                sc["checked"] = sorted(set(sc["checked"]) | set(spot.get("checked", ())))
                sc["rows"] += int(spot.get("rows", 0))
                for c, r in dict(stage.get("caught") or {}).items():
                    sc["caught"][int(c)] = min(int(r), sc["caught"].get(int(c), int(r)))
            if isinstance(stage.get("rewards"), dict):
                for key in ("rewards", "scores", "flags"):
                    out.setdefault(key, {}).update(stage.get(key) or {})
                rating = stage.get("rating") or {}
                out.setdefault("ratings", {}).update({c: rating[c] for c in stage["rewards"] if c in rating})
    if "rewards" in out and n_groups > 1:  # one pool per round: each group's shares over the groups
        out["rewards"] = {c: v / n_groups for c, v in out["rewards"].items()}
    return out


def _evaluate_assigned(fed: "Federation", params: torch.Tensor
                       ) -> Callable[[torch.Tensor, tuple[int, ...]], torch.Tensor] | None:
    """Losses of candidate deltas on each named client's assigned page (``fed.assigned``)."""
    pages = fed.assigned
    if pages is None:
        return None

    @torch.no_grad()
    def evaluate(deltas: torch.Tensor, clients: tuple[int, ...]) -> torch.Tensor:
        from torch.func import vmap

        ids = torch.as_tensor(list(clients), dtype=torch.long, device=pages.offsets.device)
        sizes = pages.sizes[ids]
        flats = params + deltas
        if bool((sizes == sizes[0]).all()) and int(sizes[0]) > 0:  # one batched call
            idx = pages.offsets[ids][:, None] + torch.arange(int(sizes[0]), device=ids.device)[None, :]
            return vmap(fed.trainer._loss)(flats, pages.x[idx], pages.y[idx])
        out = [fed.trainer.losses(flats[k:k + 1], pages.client(int(c)).x, pages.client(int(c)).y)[0]
               for k, c in enumerate(clients)]
        return torch.stack(out)

    return evaluate


def _validator_reports(fed: "Federation", rnd: int, actx: AttackContext | None
                       ) -> Callable[[tuple[int, ...], torch.Tensor], torch.Tensor] | None:
    """``ServerContext.validator_reports``: the score vectors of the validator seats the attack
    holds (its ``validator_seats``; attacks/verification.py), in a round it acts in. The seats
    know their own identities (this round's malicious participants) and see the honest scores
    (validators publish what they score, as on a chain)."""
    seats = int(fed.attack.validator_seats or 0)
    report = fed.attack.report_scores
    if seats <= 0 or actx is None or not actx.malicious:
        return None
    own = tuple(int(c) for c in actx.malicious)

    def reports(peers: tuple[int, ...], scores: torch.Tensor) -> torch.Tensor:
        out = torch.as_tensor(report(tuple(int(c) for c in peers), scores.detach().clone(), own))
        if tuple(out.shape) != (seats, len(peers)):
            raise RedteamError(f"attack {fed.attack_spec.name!r}: report_scores returned shape {tuple(out.shape)}; "
                               f"expected ({seats}, {len(peers)}): one score per peer for each of its seats")
        return out

    return reports


def _wants_commits(fed: "Federation") -> bool:
    return any(st.commit_reveal for st in fed.defense.parts())


def _commits(fed: "Federation", rin: RoundInputs, rec: "Received", row_clients: list[int], upd: torch.Tensor,
             actx: AttackContext | None, extra: dict[str, Any]) -> dict[int, tuple[str, float]]:
    """The commit phase of commit-reveal (defenses/gauntlet.py), in simulated time.

    Each peer commits the SHA-256 of the row it will reveal (float32, little-endian) before
    the commit window closes (time 1.0); reveals open then. An honest peer commits at
    (rank + 1)/(m + 1) in its row order (no random stream moves). A malicious row crafted
    from other peers' rows of this round (an omniscient attack acting this round) can only
    be made after those rows are revealed, so its commit comes at 1 + (rank + 1)/(m + 1):
    late. Recorded in ``extra["commitments"]`` (client → digest, time) for the ledger
    (:func:`redteam.federation.commitments.write_commitment_ledger`)."""
    import hashlib

    m = len(row_clients)
    omni = actx is not None and bool(fed.omniscient) and Surface.UPDATES in fed.attack.surfaces
    out: dict[int, tuple[str, float]] = {}
    for pos, c in enumerate(row_clients[:len(rec.rows)]):
        if c in out:
            continue
        row = upd[pos].detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
        t = (pos + 1) / (m + 1)
        if omni and bool(rin.roles[c]):
            t += 1.0
        out[c] = (hashlib.sha256(row.tobytes()).hexdigest(), t)
    extra["commitments"] = {c: {"digest": dg, "time": t} for c, (dg, t) in out.items()}
    return out


def _root_update(fed: "Federation", params: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    if fed.root is None:
        return None
    cache: dict[str, torch.Tensor] = {}
    gen = fed.torch_rng["root"]
    root_cfg = dataclasses.replace(fed.local, optimizer="sgd", sampling="with_replacement")

    def update() -> torch.Tensor:
        if "g0" not in cache:
            zero = torch.zeros(1, dtype=torch.long, device=fed.device)
            cache["g0"] = (fed.trainer.train(params, fed.root, zero, root_cfg, gen) - params)[0]
        return cache["g0"]

    return update


# ------------------------------------------------------------------ server step, evaluate
def server_step(fed: "Federation", params: torch.Tensor, aggregate: torch.Tensor, opt_state: Any,
                contributors: list[int], rows: Sequence[torch.Tensor], row_clients: list[int],
                ) -> tuple[torch.Tensor, Any, torch.Tensor, dict[str, Any] | None]:
    """The server optimizer's step, refused when the aggregate or the new model is not finite.

    Returns ``(params, opt_state, applied update, refusal or None)``; a refused step keeps
    the model and the optimizer state, and its applied update is zero.

    A round with no contributor (``contributors`` empty: every update rejected, dropped or
    absent) follows ``[federation] empty_round`` (:data:`~.server_opt.EMPTY_ROUNDS`):
    ``"skip"`` (default; torchft's DiLoCo steps the outer optimizer only when the round
    commits) keeps the model and the optimizer state bit for bit, applied update zero;
    ``"momentum"`` steps the server optimizer on the (zero) aggregate, so an outer momentum
    or Adam state still moves the model."""
    if not contributors and empty_round_rule(fed) == "skip":
        return params, opt_state, torch.zeros_like(aggregate), None
    if not bool(torch.isfinite(aggregate).all()):
        return params, opt_state, torch.zeros_like(aggregate), {
            "stage": "aggregate", "reason": "non-finite aggregate: step refused, model kept",
            "clients": _suspects(contributors, rows, row_clients)}
    new, state = fed.server_opt.step(params, aggregate.to(params.dtype), opt_state)
    if not bool(torch.isfinite(new).all()):
        return params, opt_state, torch.zeros_like(aggregate), {
            "stage": "server_step", "reason": "server step gave a non-finite model: step refused, model kept",
            "clients": _suspects(contributors, rows, row_clients)}
    if not _outputs_finite(fed, new) and _outputs_finite(fed, params):
        # finite but huge parameters (an accepted row near 3e38 averaged in float64): the
        # model's outputs overflow, and every honest client would train to NaN from it
        return params, opt_state, torch.zeros_like(aggregate), {
            "stage": "server_step",
            "reason": "the stepped model's outputs are not finite on held-out inputs: step refused, model kept",
            "clients": _suspects(contributors, rows, row_clients)}
    return new, state, aggregate, None


def empty_round_rule(fed: "Federation") -> str:
    """``[federation] empty_round`` of the run (``"skip"`` for a bare server without a scenario)."""
    return getattr(getattr(getattr(fed, "scenario", None), "federation", None), "empty_round", "skip")


#: held-out inputs the server runs a stepped model on (no labels are read: outputs only)
OUTPUT_PROBE = 32


@torch.no_grad()
def _outputs_finite(fed: "Federation", params: torch.Tensor) -> bool:
    """Whether the model ``params`` gives finite outputs on the first held-out inputs."""
    from torch.func import functional_call

    trainer, x = getattr(fed, "trainer", None), getattr(fed, "test_x", None)
    if trainer is None or x is None:  # a bare server (tests): nothing to probe with
        return True
    out = functional_call(trainer.model, trainer.spec.unflatten(params), (x[:OUTPUT_PROBE],))
    return bool(torch.isfinite(out).all())


def _suspects(contributors: list[int], rows: Sequence[torch.Tensor], row_clients: list[int]) -> list[int]:
    """Accepted clients whose row is non-finite or whose float32 norm overflows; all accepted if none."""
    used = set(contributors)
    bad = sorted({c for r, c in zip(rows, row_clients)
                  if c in used and not bool(torch.isfinite(torch.linalg.vector_norm(r)))})
    return bad or sorted(used)


def evaluate(fed: "Federation", params: torch.Tensor) -> tuple[float, float, dict[str, Any]]:
    """Clean accuracy and loss on the test split; what a targeted attack is scored on
    (:meth:`~.setup.Probes.evaluate`: ASR, false-trigger and near-miss rates, per-trigger ASR)."""
    acc, loss = fed.trainer.evaluate(params, fed.test_x, fed.test_y)
    if fed.attack.dynamic_trigger:  # the trigger the attacker holds now (it re-optimises it)
        fed.probes = Probes.of((fed.attack,), fed.test_x, fed.test_y, fed.device)
    return acc, loss, fed.probes.evaluate(fed.trainer, params)
