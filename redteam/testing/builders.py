"""Deterministic builders of the inputs the contract kit feeds to plugins.

Every builder takes a plain integer ``seed`` and small integers, so one line such as
``make_attack_context(seed=7, n=5, f=2, d=3)`` rebuilds exactly the input a failing
check saw. The hypothesis strategies (:mod:`redteam.testing.strategies`) draw those
integers; the builders turn them into tensors through a seeded ``torch.Generator``
(fast: nothing element-wise goes through hypothesis). Nothing here imports hypothesis.

Update matrices come in a few *kinds*, chosen to reach the corners plugins get wrong:

* ``"gaussian"``: i.i.d. N(0, 1) rows;
* ``"clustered"``: a shared direction plus noise, like real training deltas;
* ``"duplicates"``: clustered, some rows exact copies of others (ties in sorts and
  distance rankings);
* ``"zeros"``: clustered, some rows exactly zero (free riders, zero norms);
* ``"outlier"``: clustered, one row 50× longer than the rest;
* ``"sparse"``: clustered, about 70 % of the entries zero (top-k-compressed updates);
* ``"identical"``: every row the same vector (zero spread: MAD, std and distances 0).

and two degenerate kinds the defense checks draw as well (:data:`DEFENSE_KINDS`):

* ``"huge"``: clustered rows rescaled so that the largest entry is 0.99 × the dtype's
  largest finite value (rows near ±3.4e38 in float32: any sum of two overflows);
* ``"zero"``: every row exactly zero.

Everything is drawn on the CPU in float64, scaled by ``scale`` and then cast to the
requested dtype and moved to the device, so a seed gives the same values everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from redteam.types import AttackContext, ChunkDelivery, ClientData, GossipContext, ModelView, ServerContext

if TYPE_CHECKING:
    import torch

__all__ = [
    "KINDS",
    "DEFENSE_KINDS",
    "QuadraticLoss",
    "FixedUpdate",
    "AssignedLoss",
    "RowReplay",
    "generator",
    "make_updates",
    "make_server_context",
    "make_attack_context",
    "make_client_data",
    "toy_model_view",
    "make_deliveries",
    "make_provenance",
    "participant_ids",
    "AttackCase",
    "DefenseCase",
]

#: the kinds of update matrices :func:`make_updates` builds (see the module docstring)
KINDS: tuple[str, ...] = ("gaussian", "clustered", "duplicates", "zeros", "outlier", "sparse", "identical")
#: the kinds the defense checks draw: :data:`KINDS` plus rows near the dtype's overflow and all-zero rows
DEFENSE_KINDS: tuple[str, ...] = KINDS + ("huge", "zero")

Kind = Literal["gaussian", "clustered", "duplicates", "zeros", "outlier", "sparse", "identical", "huge", "zero"]


def generator(seed: int) -> "torch.Generator":
    """A CPU ``torch.Generator`` seeded with ``seed`` (the trainer's generators are CPU ones)."""
    import torch

    return torch.Generator(device="cpu").manual_seed(int(seed) % (2**63))


def _dtype(dtype: "torch.dtype | str | None") -> "torch.dtype":
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        got = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(got, torch.dtype):
            raise ValueError(f"dtype = {dtype!r}: not a torch dtype name (e.g. 'float32')")
        return got
    return dtype


def make_updates(
    seed: int,
    n: int,
    d: int,
    *,
    dtype: "torch.dtype | str | None" = None,
    device: "torch.device | str" = "cpu",
    kind: Kind = "clustered",
    scale: float = 1.0,
    finite: bool = True,
) -> "torch.Tensor":
    """An ``(n, d)`` update matrix of the given ``kind`` (module docstring), times ``scale``.

    With ``finite=False`` about 10 % of the entries (at least one) become NaN, +Inf or −Inf.
    """
    import torch

    if n < 0 or d < 0:
        raise ValueError(f"make_updates: (n, d) = ({n}, {d}): both must be ≥ 0")
    if kind not in DEFENSE_KINDS:
        raise ValueError(f"make_updates: kind = {kind!r}: must be one of {', '.join(DEFENSE_KINDS)}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"make_updates: scale = {scale!r}: must be a finite number > 0")
    g = generator(seed)
    f64 = torch.float64
    if kind == "gaussian":
        x = torch.randn(n, d, generator=g, dtype=f64)
    else:
        base = torch.randn(d, generator=g, dtype=f64)
        x = base + 0.5 * torch.randn(n, d, generator=g, dtype=f64)
    if n > 1 and kind == "duplicates":
        src = torch.randint(0, n, (n,), generator=g)
        copy = torch.rand(n, generator=g, dtype=f64) < 0.4
        x = torch.where(copy[:, None], x[src], x)
    elif n > 1 and kind == "zeros":
        zero = torch.rand(n, generator=g, dtype=f64) < 0.3
        i = int(torch.randint(0, n, (1,), generator=g))
        zero[i] = True  # at least one zero row ...
        zero[(i + 1 + int(torch.randint(0, n - 1, (1,), generator=g))) % n] = False  # ... never all
        x = torch.where(zero[:, None], torch.zeros_like(x), x)
    elif kind == "outlier" and n:
        x[int(torch.randint(0, n, (1,), generator=g))] *= 50.0
    elif kind == "sparse":
        x = x * (torch.rand(n, d, generator=g, dtype=f64) < 0.3)
    elif kind == "identical":
        x = x[:1].expand(n, d).clone() if n else x
    elif kind == "zero":
        x = torch.zeros_like(x)
    if kind == "huge":
        top = float(x.abs().max()) if x.numel() else 0.0
        x = x * (0.99 * torch.finfo(_dtype(dtype)).max / top) if top > 0 else x
    else:
        x = x * float(scale)
    if not finite and n * d > 0:
        bad = torch.rand(n, d, generator=g, dtype=f64) < 0.1
        bad.view(-1)[int(torch.randint(0, n * d, (1,), generator=g))] = True
        pick = torch.randint(0, 3, (n, d), generator=g)
        values = torch.tensor([math.nan, math.inf, -math.inf], dtype=f64)[pick]
        x = torch.where(bad, values, x)
    return x.to(dtype=_dtype(dtype)).to(device)


@dataclass(frozen=True, slots=True)
class QuadraticLoss:
    """A server-side loss for tests: ``L(w + Δ) = ½‖Δ − target‖²`` for each candidate row.

    It has the shape of ``ServerContext.evaluate_loss``: ``(k, d)`` deltas → ``(k,)``
    losses (float64, on the deltas' device). An update moving towards ``target``
    lowers the loss; the zero delta scores ½‖target‖².
    """

    target: "torch.Tensor"

    def __call__(self, deltas: "torch.Tensor") -> "torch.Tensor":
        import torch

        t = self.target.to(device=deltas.device, dtype=torch.float64)
        return 0.5 * (deltas.to(torch.float64) - t).square().sum(dim=1)


@dataclass(frozen=True, slots=True)
class AssignedLoss:
    """Each client's assigned-batch loss for tests (``ServerContext.evaluate_loss_assigned``):
    ``L_c(w + Δ) = ½‖Δ − t_c‖²`` with ``t_c`` the client's own row (its assignment is what it
    trained on; a non-finite row's target is zero). ``(k, d)`` deltas and ``k`` client ids →
    ``(k,)`` losses (float64)."""

    ids: tuple[int, ...]
    rows: "torch.Tensor"

    def __call__(self, deltas: "torch.Tensor", clients: tuple[int, ...]) -> "torch.Tensor":
        import torch

        where = {c: k for k, c in enumerate(self.ids)}
        t = self.rows.to(device=deltas.device, dtype=torch.float64)
        t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
        rows = t[[where[int(c)] for c in clients]] if len(clients) else t[:0]
        return 0.5 * (deltas.to(torch.float64) - rows).square().sum(dim=1)


@dataclass(frozen=True, slots=True)
class FixedUpdate:
    """A server root update for tests (``ServerContext.root_update``): returns a copy of
    ``vector`` on every call, so a defense that modifies it cannot change the next call."""

    vector: "torch.Tensor"

    def __call__(self) -> "torch.Tensor":
        return self.vector.clone()


@dataclass(frozen=True, slots=True)
class RowReplay:
    """A replay oracle for tests (``ServerContext.replay_work``): client ``ids[i]``'s honest
    work is ``rows[i]`` (by default the row it sent: every client honest). Returns a copy of
    the named clients' rows, ``(k, d)``; an id it does not know is a :class:`RedteamError`."""

    ids: tuple[int, ...]
    rows: "torch.Tensor"

    def __call__(self, clients: tuple[int, ...]) -> "torch.Tensor":
        import torch

        from redteam.errors import RedteamError

        where = {c: i for i, c in enumerate(self.ids)}
        unknown = [c for c in clients if c not in where]
        if unknown:
            raise RedteamError(f"replay_work: client(s) {unknown} did not train this round")
        if not clients:
            return self.rows[:0].clone()
        return torch.stack([self.rows[where[c]] for c in clients]).clone()


def _consensus(updates: "torch.Tensor") -> "torch.Tensor":
    """Coordinate median of the finite rows (zeros when there are none): the server's
    idea of the right direction in the test world."""
    import torch

    ok = torch.isfinite(updates).all(dim=1)
    if updates.shape[0] == 0 or not bool(ok.any()):
        return torch.zeros(updates.shape[1], dtype=updates.dtype, device=updates.device)
    return updates[ok].median(dim=0).values


#: the toy model view's inputs: one-channel 4×4 images (:func:`toy_model_view`)
TOY_IMAGE: tuple[int, ...] = (1, 4, 4)


def toy_model_view(d: int, num_classes: int = 10) -> ModelView:
    """A :class:`~redteam.types.ModelView` over flat rows of any length ``d``, for contract checks:
    a linear classifier of ``TOY_IMAGE`` images whose ``17·num_classes`` weights are read from the
    row cyclically (entry k is ``flat[k mod d]``), so every coordinate moves the output and any
    ``d`` works. ``features`` is the flattened image (the classifier's input); the one layer
    ``"w"`` spans the row and is the output layer."""
    import torch

    k = 16
    c = max(int(num_classes), 2)

    def weights(flat: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        idx = torch.arange((k + 1) * c, device=flat.device) % int(flat.shape[-1])
        p = flat[..., idx]
        return p[..., : k * c].reshape(*flat.shape[:-1], k, c), p[..., k * c:]

    def forward(flat: "torch.Tensor", x: "torch.Tensor") -> "torch.Tensor":
        w, b = weights(flat)
        return x.reshape(x.shape[0], k).to(w.dtype) @ w + b

    def features(flat: "torch.Tensor", x: "torch.Tensor") -> "torch.Tensor":
        return x.reshape(x.shape[0], k).to(flat.dtype)

    def loss(out: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
        return torch.nn.functional.cross_entropy(out, y)

    return ModelView(forward=forward, loss=loss, features=features, layers=(("w", 0, int(d), (int(d),)),),
                     head=("w",), input_shape=TOY_IMAGE, num_classes=c)


def toy_images(seed: int, n: int, num_classes: int = 10, *, dtype: "torch.dtype | str | None" = None,
               device: "torch.device | str" = "cpu") -> ClientData:
    """``n`` random :data:`TOY_IMAGE` images in [0, 1) with labels in [0, num_classes)."""
    import torch

    g = generator(seed * 7 + 5)
    x = torch.rand((n, *TOY_IMAGE), generator=g, dtype=torch.float64).to(dtype=_dtype(dtype), device=device)
    y = torch.randint(0, max(int(num_classes), 2), (n,), generator=g).to(device)
    return ClientData(x, y)


def make_server_context(
    updates: "torch.Tensor",
    seed: int = 0,
    *,
    weights: Literal["random", "equal"] | None = "random",
    previous: bool | "torch.Tensor" = True,
    server_data: bool = True,
    target: "torch.Tensor | None" = None,
    client_ids: Literal["positions", "sparse"] = "sparse",
    round: int = 0,
    state: dict[str, Any] | None = None,
) -> ServerContext:
    """A :class:`ServerContext` for ``updates`` with everything a defense may ask for.

    * ``weights``: random sample counts in [1, 100] (``"random"``), all ones, or ``None``;
      float32 like the trainer's, on the updates' device;
    * ``previous``: a previous global update (random, or the tensor given) or none;
    * ``server_data``: give the server data: ``evaluate_loss`` is a
      :class:`QuadraticLoss` and ``root_update`` a :class:`FixedUpdate`, both centred on
      ``target`` (default: the coordinate median of the finite rows), ``evaluate_loss_assigned`` an
      :class:`AssignedLoss` centred on each client's own row, and ``replay_work`` a
      :class:`RowReplay` of the rows themselves (every client did its work);
    * ``client_ids``: ``"positions"`` (0 … n−1) or ``"sparse"`` (distinct, increasing
      ids from a larger population, as under churn);
    * the generator is a CPU generator seeded from ``seed``.
    """
    import torch

    n, d = int(updates.shape[0]), int(updates.shape[1])
    dev, dt = updates.device, updates.dtype
    g = generator(seed * 2 + 1)
    w = None
    if weights == "random":
        w = torch.randint(1, 101, (n,), generator=g).to(device=dev, dtype=torch.float32)
    elif weights == "equal":
        w = torch.ones(n, dtype=torch.float32, device=dev)
    if isinstance(previous, bool):
        prev = torch.randn(d, generator=g, dtype=torch.float64).to(dtype=dt, device=dev) if previous else None
    else:
        prev = previous
    if client_ids == "sparse" and n:
        ids = tuple(sorted(torch.randperm(3 * n, generator=g)[:n].tolist()))
    else:
        ids = tuple(range(n))
    evaluate = root = replay = assigned = None
    if server_data:
        t = _consensus(updates) if target is None else target.to(dtype=dt, device=dev)
        evaluate, root = QuadraticLoss(t.clone()), FixedUpdate(t.clone())
        replay = RowReplay(ids, updates.detach().clone())
        assigned = AssignedLoss(ids, updates.detach().clone())
    return ServerContext(
        round=round,
        n_clients=n,
        weights=w,
        global_params=torch.randn(d, generator=g, dtype=torch.float64).to(dtype=dt, device=dev),
        previous_update=prev,
        generator=generator(seed),
        state=dict(state or {}),
        evaluate_loss=evaluate,
        root_update=root,
        client_ids=ids,
        replay_work=replay,
        evaluate_loss_assigned=assigned,
        model=toy_model_view(d),
        root_data=(lambda r: (r.x, r.y))(toy_images(seed, 16, dtype=dt, device=dev)) if server_data else None,
    )


def make_attack_context(
    seed: int,
    n: int,
    f: int,
    d: int,
    *,
    dtype: "torch.dtype | str | None" = None,
    device: "torch.device | str" = "cpu",
    kind: Kind = "clustered",
    scale: float = 1.0,
    omniscient: bool = False,
    previous: bool = True,
    churn: bool = False,
    server_lr: float = 1.0,
    num_classes: int = 10,
    round: int = 0,
    defense: Any = None,
    model: bool = False,
) -> AttackContext:
    """An :class:`AttackContext` for one round with ``n`` participants, ``f`` of them malicious.

    The round's honest updates are a :func:`make_updates` matrix; the malicious rows are
    ``f`` positions drawn from the seed. As in the trainer, ``own_updates`` holds the
    malicious clients' honest updates, ``visible_updates`` is every honest row when
    ``omniscient`` and otherwise the very same tensor as ``own_updates``. With ``churn``
    the client ids come from a larger population, so ``malicious`` (ids) and
    ``malicious_rows`` (positions) differ. ``weights`` are random sample counts. With ``model``
    the context carries a :func:`toy_model_view` of the rows and 16 :func:`toy_images` per
    malicious client as ``own_data`` (what a ``needs_model`` attack reads).
    """
    import torch

    if not (n >= 1 and 0 <= f <= n):
        raise ValueError(f"make_attack_context: (n, f) = ({n}, {f}): need n ≥ 1 and 0 ≤ f ≤ n")
    full = make_updates(seed, n, d, dtype=dtype, device=device, kind=kind, scale=scale)
    g = generator(seed * 2 + 1)
    rows = sorted(torch.randperm(n, generator=g)[:f].tolist())
    honest = [i for i in range(n) if i not in set(rows)]
    ids = sorted(torch.randperm(2 * n, generator=g)[:n].tolist()) if churn else list(range(n))
    own = full[rows]
    visible = full[honest] if omniscient else own
    prev = torch.randn(d, generator=g, dtype=torch.float64).to(dtype=full.dtype, device=full.device) \
        if previous else None
    w = torch.randint(1, 101, (n,), generator=g).to(device=full.device, dtype=torch.float32)
    return AttackContext(
        round=round,
        n_clients=n,
        malicious=tuple(ids[i] for i in rows),
        own_updates=own,
        visible_updates=visible,
        global_params=torch.randn(d, generator=g, dtype=torch.float64).to(dtype=full.dtype, device=full.device),
        generator=generator(seed),
        num_classes=num_classes,
        weights=w,
        previous_update=prev,
        server_lr=server_lr,
        defense=defense,
        malicious_rows=tuple(rows),
        model=toy_model_view(d, num_classes) if model else None,
        own_data=tuple(toy_images(seed * 31 + i, 16, num_classes, dtype=full.dtype, device=full.device)
                       for i in range(f)) if model else (),
    )


def make_gossip_context(
    seed: int,
    n: int,
    f: int,
    d: int,
    *,
    dtype: "torch.dtype | str | None" = None,
    device: "torch.device | str" = "cpu",
    kind: Kind = "clustered",
    scale: float = 1.0,
    step: int = 0,
) -> GossipContext:
    """A :class:`~redteam.types.GossipContext`: what the Byzantine neighbours of one honest node of
    a gossip graph see in one step (``Surface.GOSSIP``, :meth:`~redteam.types.Attack.craft_gossip`).

    The graph has m = max(2, n − b) honest nodes 0 … m−1 (a ring plus chords drawn from the seed,
    so it is connected) and b = max(1, f) Byzantine nodes m … m+b−1, each linked to every honest
    node (as in Gaucher et al.'s setting); the models are a :func:`make_updates` matrix of
    ``kind``; the mixing weights are Metropolis–Hastings with the Byzantine nodes announcing
    degree 1 (as the ``[gossip]`` regime does in the attack window); the target is an honest node
    drawn from the seed; ``laplacian`` / ``fiedler`` are those of the honest subgraph weighted by W.
    """
    import numpy as np
    import torch

    from redteam.federation import graphs

    if not (n >= 1 and d >= 1 and f >= 0):
        raise ValueError(f"make_gossip_context: (n, f, d) = ({n}, {f}, {d}): need n ≥ 1, f ≥ 0, d ≥ 1")
    b = max(1, f)
    m = max(2, n - b)
    g = generator(seed * 2 + 1)
    adj = np.zeros((m + b, m + b), dtype=bool)
    for i in range(m):
        adj[i, (i + 1) % m] = adj[(i + 1) % m, i] = True
    chords = (torch.rand(m, m, generator=g, dtype=torch.float64) < 0.3).numpy()
    chords = np.triu(chords, 1)
    adj[:m, :m] |= chords | chords.T
    adj[m:, :m] = adj[:m, m:] = True
    np.fill_diagonal(adj, False)
    claimed = adj.sum(1)
    claimed[m:] = 1
    w = graphs.mixing_matrix(adj, degrees=claimed)
    x = make_updates(seed, m + b, d, dtype=dtype, device=device, kind=kind, scale=scale)
    t = int(torch.randint(0, m, (1,), generator=g))
    honest = list(range(m))
    hon = [j for j in np.flatnonzero(adj[t]).tolist() if j < m]
    byz = list(range(m, m + b))
    lap = graphs.laplacian(adj[:m, :m], w[:m, :m])

    def tensor(a: Any) -> "torch.Tensor":
        return torch.as_tensor(np.asarray(a, dtype=np.float64)).to(dtype=x.dtype, device=x.device)

    return GossipContext(
        round=0, step=step, target=t, target_model=x[t], neighbours=tuple(hon), neighbour_models=x[hon],
        neighbour_weights=tensor([w[t, j] for j in hon]), self_weight=float(w[t, t]), attackers=tuple(byz),
        attacker_weights=tensor([w[t, j] for j in byz]), own_models=x[byz], honest=tuple(honest),
        honest_models=x[honest], laplacian=tensor(lap), fiedler=tensor(graphs.fiedler_vector(lap)), position=t,
        generator=generator(seed), state={})


def make_client_data(
    seed: int,
    *,
    samples: int = 16,
    sample_shape: tuple[int, ...] = (64,),
    num_classes: int = 10,
    dtype: "torch.dtype | str | None" = None,
    device: "torch.device | str" = "cpu",
) -> ClientData:
    """A client dataset: inputs uniform in [0, 1) of shape ``(samples, *sample_shape)``
    (default 64 values, the 8×8 digits images) and int64 labels in [0, num_classes)."""
    import torch

    g = generator(seed)
    x = torch.rand((samples, *sample_shape), generator=g, dtype=torch.float64)
    y = torch.randint(0, num_classes, (samples,), generator=g)
    return ClientData(x=x.to(dtype=_dtype(dtype)).to(device), y=y.to(device))


def make_deliveries(seed: int, ctx: AttackContext, *, chunks: int = 3, chunk_size: int = 32) -> list[ChunkDelivery]:
    """The chunk deliveries of one round: ``chunks`` chunks of random bytes from each
    participating client (the malicious ones included), each via a random relay."""
    import torch

    g = generator(seed * 2 + 1)
    bad, honest = participant_ids(ctx)
    ids = bad + honest
    out = []
    for author in ids:
        for index in range(chunks):
            data = bytes(torch.randint(0, 256, (chunk_size,), generator=g, dtype=torch.uint8).tolist())
            relay = ids[int(torch.randint(0, len(ids), (1,), generator=g))]
            out.append(ChunkDelivery(author=author, index=index, relay=relay, data=data, round=ctx.round))
    return out


def participant_ids(ctx: AttackContext) -> tuple[list[int], list[int]]:
    """(malicious ids, made-up honest ids) of the round's participants: the honest ones
    are the smallest ids not taken by the attackers (the context does not name them)."""
    bad = set(ctx.malicious)
    honest = [i for i in range(ctx.n_clients + len(bad)) if i not in bad][: ctx.n_clients - len(bad)]
    return sorted(bad), honest


def make_provenance(seed: int, client: int, clean: ClientData, actual: ClientData,
                    capabilities: tuple[str, ...] = (), dataset: str = "synthetic") -> tuple[Any, dict[str, Any]]:
    """What the trainer hands ``forge_provenance``: the curator's manifest of the clean
    data, and the ``ctx.state`` entries ``client``, ``shards`` (the bytes actually trained
    on) and ``keyring`` (the client's enrolled key stolen with ``"enrolled_key"``, a log
    key with ``"log_key"``; keys drawn from ``seed``)."""
    import numpy as np

    from redteam.federation.provenance import Keyring, dataset_manifest, shards_of
    from redteam.transport.signing import derive_key

    rng = np.random.default_rng(seed)
    key, log_key = derive_key(rng, "p256"), derive_key(rng, "ed25519")
    ring = Keyring({client: key.public}, stolen={client: key} if "enrolled_key" in capabilities else {},
                   log_key=log_key if "log_key" in capabilities else None, origin="redteam.testing/log",
                   log_size=1 + seed % 5)
    state = {"client": client, "keyring": ring, "shards": shards_of(actual)}
    return dataset_manifest(client, shards_of(clean), dataset), state


@dataclass(frozen=True, slots=True)
class AttackCase:
    """The handful of numbers one generated attack input is built from.

    Its ``repr`` is a reproduce line: ``AttackCase(seed=3, n=5, f=2, d=4, ...).context()``
    rebuilds the very context (and ``.data()`` the client dataset) a check saw.
    """

    seed: int
    n: int
    f: int
    d: int
    dtype: str = "float32"
    kind: Kind = "clustered"
    scale: float = 1.0
    previous: bool = True
    churn: bool = False
    server_lr: float = 1.0
    samples: int = 16

    def context(self, *, device: "torch.device | str" = "cpu", omniscient: bool = False,
                defense: Any = None, num_classes: int = 10, model: bool = False) -> AttackContext:
        return make_attack_context(
            self.seed, self.n, self.f, self.d, dtype=self.dtype, device=device, kind=self.kind,
            scale=self.scale, omniscient=omniscient, previous=self.previous, churn=self.churn,
            server_lr=self.server_lr, num_classes=num_classes, defense=defense, model=model,
        )

    def data(self, *, device: "torch.device | str" = "cpu", sample_shape: tuple[int, ...] = (64,),
             num_classes: int = 10) -> ClientData:
        return make_client_data(self.seed, samples=self.samples, sample_shape=sample_shape,
                                num_classes=num_classes, device=device)

    def gossip(self, *, device: "torch.device | str" = "cpu") -> GossipContext:
        """The :func:`make_gossip_context` of this case (a gossip attack's input)."""
        return make_gossip_context(self.seed, self.n, self.f, self.d, dtype=self.dtype, device=device,
                                   kind=self.kind, scale=self.scale)


@dataclass(frozen=True, slots=True)
class DefenseCase:
    """The handful of numbers one generated defense input is built from (``repr`` rebuilds it)."""

    seed: int
    n: int
    d: int
    dtype: str = "float32"
    kind: Kind = "clustered"
    scale: float = 1.0
    weights: Literal["random", "equal"] | None = "random"
    previous: bool = True
    client_ids: Literal["positions", "sparse"] = "sparse"
    finite: bool = True

    def updates(self, *, device: "torch.device | str" = "cpu", seed_offset: int = 0) -> "torch.Tensor":
        return make_updates(self.seed + seed_offset, self.n, self.d, dtype=self.dtype, device=device,
                            kind=self.kind, scale=self.scale, finite=self.finite)

    def context(self, updates: "torch.Tensor", **overrides: Any) -> ServerContext:
        kw: dict[str, Any] = dict(weights=self.weights, previous=self.previous, client_ids=self.client_ids)
        kw.update(overrides)
        return make_server_context(updates, self.seed, **kw)
