"""Local training of all clients at once.

Clients are simulated as a batch: one flat parameter row per client, stacked into an
``(n, d)`` matrix, and trained together with ``torch.func`` — ``vmap`` over the client
dimension of ``grad`` of the functional model — so that one step of every client is a
handful of batched kernels instead of ``n`` separate models in a Python loop.

How the rows' gradients are computed is a setting (``[federation] batching``,
:func:`resolve_batching`): ``"vmap"`` is the batched program above; ``"loop"`` computes
``grad(loss)`` of one row at a time (the same functional model, the same batches, the same
SGD on the stacked rows: only the gradient call differs); ``"auto"`` (default) takes the loop
on CPU for a model with a convolution and ``vmap`` otherwise. Under ``vmap`` a convolution
with per-client weights becomes one grouped convolution over every client's images, which on
CPU is slower than the clients' own convolutions one after another and holds every client's
activations at once (``benchmarks/bench_batching.py``: a CIFAR ResNet-18 of width 16, 10
clients × batch 32, trains in 0.75–0.84 of vmap's time looped, with a third of the peak memory,
on 1 CPU thread; ``benchmarks/bench_paper_scale.py``: 0.48 at batch 64); on CUDA, and for
models without convolutions on CPU (the 2NN: vmap 1.25–2.07× as fast in six runs of seven),
``vmap`` is as fast or faster. The two paths agree to float32 rounding, not bit for bit
(``tests/test_batching.py``: one or two ulps after a few steps); every gradient of a training
call — the honest rows, a hook's rows, a spot-check replay — takes the trainer's one path, so a
replay reproduces what its path computed.

Each client draws its own minibatches from its own data (all client datasets live in
one pooled tensor; client c owns rows ``offsets[c] : offsets[c] + sizes[c]``), seeded by
the explicit generator. ``sampling`` names how:

* ``"with_replacement"`` (default): every index of every batch uniform over the client's data;
* ``"without_replacement"`` (epoch-style): each client walks through a stream made of
  independent random permutations of its data, one per epoch; a step takes the next B
  items of the stream (a batch may straddle two epochs), and the position in the stream is
  client state that carries over to the next round (as a data loader's iterator does).
  A client takes items only on the steps it runs (one that finished its own steps while
  others, or an attacker's hook, run more keeps its place).

The local optimizer (``optimizer``) is SGD, with an optional FedProx proximal term (Li et
al., "Federated Optimization in Heterogeneous Networks", MLSys 2020: the gradient gains
μ·(w − w_global)) and optional L2 weight decay λ·w added to the gradient (as
``torch.optim.SGD(weight_decay=λ)``), or AdamW (Loshchilov & Hutter, "Decoupled Weight Decay
Regularization", ICLR 2019; as ``torch.optim.AdamW``): with step count t,
m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², w ← w − ηλw − η·(m/(1−β₁ᵗ)) / (√(v/(1−β₂ᵗ)) + ε).
AdamW's m, v and t are per-client state kept across rounds (DiLoCo's inner optimizer,
Douillard et al. 2023), batched as ``(n, d)`` tensors.

``local_epochs`` (instead of ``local_steps``) gives client c ⌈epochs·|D_c| / B⌉ steps;
clients that finish early stop moving (a per-client mask), so the batch stays one
tensor program.

A :class:`~redteam.types.TrainingHook` shapes the training of some rows (the malicious
clients) inside the same batched program: their gradient is recomputed with the hook's
extra loss (a second ``vmap`` over those rows only), multiplied by its mask, stepped with
its learning rate and step count, and projected after every step. Steps beyond the
federation's own count draw their batches from the hook's generator, so the honest
clients' batch stream is the same with or without a hook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.func import functional_call, grad, vmap

from ..types import ClientData, ModelView, TrainingHook
from .params import ParamSpec

if TYPE_CHECKING:
    from ..workloads.base import Workload
    from .state import ClientStates

__all__ = ["StackedData", "BatchedTrainer", "LocalTraining", "batch_uniforms", "batch_positions",
           "LOCAL_OPTIMIZERS", "SAMPLINGS", "BATCHINGS",
           "resolve_batching", "has_convolution"]

LOCAL_OPTIMIZERS = ("sgd", "adamw")
SAMPLINGS = ("with_replacement", "without_replacement")
#: ``[federation] batching``: how the clients' gradients are computed (:func:`resolve_batching`)
BATCHINGS = ("auto", "vmap", "loop")


def has_convolution(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a convolution layer (``torch.nn.Conv1d`` / ``2d`` / ``3d`` or a
    transposed one) among its modules."""
    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())


def resolve_batching(setting: str, model: torch.nn.Module, device: torch.device | str) -> str:
    """The gradient path, ``"vmap"`` or ``"loop"``, that ``setting`` (one of :data:`BATCHINGS`)
    selects for ``model`` on ``device``.

    ``"vmap"`` / ``"loop"`` are taken as they are. ``"auto"``: ``"loop"`` on CPU for a model
    with a convolution (:func:`has_convolution`), else ``"vmap"`` (every model on CUDA; MLPs,
    LSTMs and transformers on CPU). The figures behind it, loop time ÷ vmap time on CPU (below 1:
    the loop is faster; ``benchmarks/bench_batching.py``, 1 thread, 10 clients × 1 step × batch
    32, a 2-core machine kept busy by another job, so ranges over repeated runs): the CIFAR
    ResNet-18 of width 16 0.75–0.84 with peak RSS 0.65 GiB looped against 2.0 GiB batched
    (``benchmarks/bench_paper_scale.py`` on the idle machine, batch 64: 0.48); McMahan's MNIST
    CNN 0.86–1.06 at 8 channels and 0.82–0.99 at 32, with less memory looped (471 against
    751 MiB at 32); the 2NN (784-200-200-10) 1.25–2.07 in six runs of seven (vmap faster). On
    an H100 the batched ResNet-18 is 1.0–2.6× as fast as a per-client loop (``bench_paper_scale.py``).
    """
    if setting not in BATCHINGS:
        raise ValueError(f"batching {setting!r}: one of {', '.join(map(repr, BATCHINGS))}")
    if setting != "auto":
        return setting
    return "loop" if torch.device(device).type == "cpu" and has_convolution(model) else "vmap"


def _row_by_row(fn: Callable[..., torch.Tensor], in_dims: tuple[int | None, ...], args: tuple[Any, ...],
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``vmap(fn, in_dims)(*args)`` computed as a Python loop over the rows: ``fn`` of row i of
    every batched argument (``in_dims`` 0; ``None``: passed whole), stacked (into ``out`` when
    given). Each row's result depends on that row's inputs only."""
    n = next(int(a.shape[0]) for a, d in zip(args, in_dims) if d is not None)
    res = out
    for i in range(n):
        gi = fn(*(a if d is None else a[i] for a, d in zip(args, in_dims)))
        if res is None:
            res = gi.new_empty((n, *gi.shape))
        res[i] = gi
    if res is None:  # no rows: the first batched argument's shape (a gradient has its row's shape)
        first = next(a for a, d in zip(args, in_dims) if d is not None)
        res = first.new_empty(first.shape)
    return res


def batch_uniforms(generator: torch.Generator, n: int, batch: int) -> torch.Tensor:
    """One local step's draw from the batch stream (sampling with replacement): ``(n, batch)``
    float64 uniforms on the CPU, one row per client; :func:`batch_positions` turns them into
    item positions. Training, the spot-check replay and the privacy observer's truth draw alike."""
    return torch.rand((n, batch), generator=generator, dtype=torch.float64)


def batch_positions(u: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Each client's item positions ``floor(u · size)`` in its own data, ``(n, batch)`` int64."""
    return torch.floor(u * sizes[:, None]).to(torch.int64)


@dataclass(frozen=True, slots=True)
class LocalTraining:
    """Hyper-parameters of the clients' local procedure."""

    steps: int = 10
    epochs: float | None = None
    batch_size: int = 16
    lr: float = 0.1
    prox_mu: float = 0.0
    optimizer: str = "sgd"
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    sampling: str = "with_replacement"
    #: DP-SGD (Abadi et al., CCS 2016): each example's gradient clipped to this L2 norm (None: off)
    dp_clip: float | None = None
    #: DP-SGD's noise multiplier σ: N(0, (σ·dp_clip)²) added to each step's sum of clipped gradients
    dp_noise_multiplier: float = 0.0


@dataclass(frozen=True, slots=True)
class StackedData:
    """Every client's dataset in one pooled tensor, with per-client offsets and sizes."""

    x: torch.Tensor
    y: torch.Tensor
    offsets: torch.Tensor  # (n,) int64
    sizes: torch.Tensor  # (n,) int64

    @classmethod
    def stack(cls, clients: list[ClientData]) -> "StackedData":
        sizes = torch.tensor([len(c) for c in clients], dtype=torch.int64)
        offsets = torch.zeros_like(sizes)
        if len(sizes) > 1:
            offsets[1:] = torch.cumsum(sizes, 0)[:-1]
        return cls(
            x=torch.cat([c.x for c in clients]),
            y=torch.cat([c.y for c in clients]),
            offsets=offsets,
            sizes=sizes,
        )

    def client(self, i: int) -> ClientData:
        a, b = int(self.offsets[i]), int(self.offsets[i] + self.sizes[i])
        return ClientData(self.x[a:b], self.y[a:b])

    def to(self, device: torch.device | str) -> "StackedData":
        return StackedData(self.x.to(device), self.y.to(device), self.offsets.to(device), self.sizes.to(device))


def _refuse_running_statistics(model: torch.nn.Module) -> None:
    """A normalisation layer that keeps running statistics cannot be trained here: the trainer
    carries one flat vector of parameters per client and no per-client buffers (the running
    mean would be one tensor for every client, updated in place inside ``grad``). Constant
    buffers (a fixed mask, a positional table) are read-only and allowed."""
    from ..errors import InvalidParameter

    tracked = [name for name, m in model.named_modules()
               if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats]
    if tracked:
        shown = ", ".join(tracked[:4]) + (f", … ({len(tracked)} in all)" if len(tracked) > 4 else "")
        raise InvalidParameter(
            f"{type(model).__name__} has normalisation layers with running-statistics buffers ({shown}): the "
            "batched trainer keeps one flat vector of parameters per client and no per-client buffers; use "
            "GroupNorm, or BatchNorm with track_running_stats=False (batch statistics in training and "
            "evaluation; redteam.workloads.nets, norm = \"group\" / \"batch\")")


class BatchedTrainer:
    """Trains stacked client parameter rows with ``vmap(grad(loss))`` (or ``grad(loss)`` row by
    row: ``batching``, :func:`resolve_batching`, resolved for the device of the rows trained).

    Built once per federation (it holds the functional model); :meth:`train` is pure
    given its arguments: same inputs and generator state → same outputs.
    """

    def __init__(self, workload: "Workload", model: torch.nn.Module, spec: ParamSpec, *,
                 batching: str = "auto") -> None:
        if batching not in BATCHINGS:
            raise ValueError(f"BatchedTrainer: batching {batching!r}: one of {', '.join(map(repr, BATCHINGS))}")
        self.workload = workload
        self.spec = spec
        self.model = model
        self.batching = batching
        self._paths: dict[str, str] = {}
        _refuse_running_statistics(model)
        loss_of = workload.loss

        def loss(flat: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
            out = functional_call(model, spec.unflatten(flat), (xb,))
            return loss_of(out, yb)

        self._loss = loss
        self._grad_one: Callable[..., torch.Tensor] = grad(loss)
        self._vmapped: Callable[..., torch.Tensor] = vmap(self._grad_one)
        self._per_example: Callable[..., torch.Tensor] | None = None
        self._rows = int(getattr(workload, "cpu_grad_rows", 0) or 0)  # a bare workload (tests) declares none

    def view(self, num_classes: int, input_shape: tuple[int, ...]) -> ModelView:
        """The model as functions of a flat row (:class:`~redteam.types.ModelView`), for attacks
        that declare ``needs_model`` and defenses that inspect models."""
        model, spec = self.model, self.spec
        linears = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        if linears:
            head_name, head = linears[-1]
            prefix = head_name + "." if head_name else ""
            head_params = tuple(prefix + n for n, _ in head.named_parameters(recurse=False))
        else:
            head, head_params = None, ()

        def forward(flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return functional_call(model, spec.unflatten(flat), (x,))

        def features(flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            if head is None:
                raise ValueError("ModelView.features: the model has no linear output layer")
            seen: list[torch.Tensor] = []
            handle = head.register_forward_pre_hook(lambda _m, inp: seen.append(inp[0]))
            try:
                functional_call(model, spec.unflatten(flat), (x,))
            finally:
                handle.remove()
            return seen[-1].reshape(-1, seen[-1].shape[-1])

        bounds, at = [], 0
        for name, numel, shape in zip(spec.names, spec.numels, spec.shapes):
            bounds.append((name, at, at + numel, tuple(shape)))
            at += numel
        return ModelView(forward=forward, loss=self.workload.loss, features=features, layers=tuple(bounds),
                         head=head_params, input_shape=tuple(input_shape), num_classes=int(num_classes),
                         input_kind=str(getattr(self.workload, "input_kind", "image") or "image"))

    def path(self, device: torch.device | str) -> str:
        """The gradient path (``"vmap"`` or ``"loop"``) this trainer takes for rows on ``device``."""
        kind = torch.device(device).type
        got = self._paths.get(kind)
        if got is None:
            got = self._paths[kind] = resolve_batching(self.batching, self.model, kind)
        return got

    def row_grads(self, fn: Callable[..., torch.Tensor], in_dims: tuple[int | None, ...],
                  device: torch.device | str) -> Callable[..., torch.Tensor]:
        """``grad(fn)`` (with respect to its first argument) of every row, on this trainer's path for
        ``device``: ``vmap(grad(fn), in_dims)`` or the same row by row."""
        g = grad(fn)
        if self.path(device) == "vmap":
            return vmap(g, in_dims=in_dims)
        return lambda *args: _row_by_row(g, in_dims, args)

    def _chunked(self, params: torch.Tensor) -> bool:
        return (0 < self._rows < int(params.shape[0]) and params.device.type == "cpu"
                and self.path(params.device) == "vmap")

    def _grads(self, params: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """The gradient of each row ``params`` on its batch, on the trainer's path: ``grad(loss)``
        row by row (``"loop"``), or ``vmap(grad(loss))``; on CPU, with the workload's
        ``cpu_grad_rows``, that many rows per call (the activations of a few clients stay in cache;
        a workload sets it where the rows' gradients do not depend on the chunking). Gathered into
        ``out`` when given (looped or chunked)."""
        if self.path(params.device) == "loop":
            return _row_by_row(self._grad_one, (0, 0, 0), (params, xb, yb), out=out)
        if not self._chunked(params):
            return self._vmapped(params, xb, yb)
        k = self._rows
        parts = [self._vmapped(params[i:i + k], xb[i:i + k], yb[i:i + k])
                 for i in range(0, int(params.shape[0]), k)]
        return torch.cat(parts) if out is None else torch.cat(parts, out=out)

    def _dp_grads(self, params: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, cfg: LocalTraining,
                  generator: torch.Generator) -> torch.Tensor:
        """DP-SGD's noisy mean of per-example clipped gradients, for every row ``(n, d)``."""
        if self._per_example is None:
            loss = self._loss

            def one(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return loss(flat, x.unsqueeze(0), y.unsqueeze(0))

            self._per_example = vmap(vmap(grad(one), in_dims=(None, 0, 0)), in_dims=(0, 0, 0))
        g = self._per_example(params, xb, yb)  # (n, B, d)
        norms = torch.linalg.vector_norm(g, dim=2, keepdim=True)
        g = g * torch.clamp(float(cfg.dp_clip) / torch.clamp(norms, min=1e-12), max=1.0)
        total = g.sum(dim=1)
        if cfg.dp_noise_multiplier:
            noise = torch.randn(tuple(total.shape), generator=generator, dtype=torch.float32, device="cpu")
            total = total + float(cfg.dp_noise_multiplier) * float(cfg.dp_clip) * noise.to(total)
        return total / int(xb.shape[1])

    def train(
        self,
        global_params: torch.Tensor,
        data: StackedData,
        clients: torch.Tensor,
        cfg: LocalTraining,
        generator: torch.Generator,
        *,
        states: "ClientStates | None" = None,
        hook: TrainingHook | None = None,
        hook_rows: list[int] | None = None,
        hook_generator: torch.Generator | None = None,
        client_steps: torch.Tensor | None = None,
        noise_generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Return the local parameters ``(len(clients), d)`` after local training.

        With ``cfg.dp_clip`` set, each step is DP-SGD's (Abadi et al., CCS 2016): every example's
        gradient is clipped to ``dp_clip``, the clipped gradients are summed, Gaussian noise of
        standard deviation ``dp_noise_multiplier · dp_clip`` is added (drawn from
        ``noise_generator``, on the CPU) and the sum is divided by the batch size.

        ``global_params`` is the ``(d,)`` model every client starts from, or ``(len(clients), d)``:
        one starting row per client (the gossip regime's nodes, each with its own model; FedProx's
        term then pulls each row towards its own start).

        ``clients`` indexes rows of ``data`` (the participating clients, in order).
        ``states`` holds per-client state (AdamW moments, the sampler's position) read and
        written for ``clients``; it is required for ``optimizer="adamw"`` and
        ``sampling="without_replacement"``. ``hook`` applies to the rows ``hook_rows``
        (positions among ``clients``). ``client_steps`` (``(len(clients),)`` int): how many
        of the ``cfg.steps`` local steps each client runs (partial work before a deadline).
        """
        n = int(clients.shape[0])
        device = global_params.device
        if global_params.ndim == 2:  # each client from its own start (a gossip node's model)
            if hook is not None or int(global_params.shape[0]) != n:
                raise ValueError("BatchedTrainer.train: per-client starting rows need one row per client and no hook")
            params = global_params.clone()
        else:
            params = global_params.unsqueeze(0).expand(n, -1).clone()
        if n == 0:
            return params
        stateful = cfg.optimizer != "sgd" or cfg.sampling != "with_replacement"
        if stateful and states is None:
            raise ValueError("BatchedTrainer.train: this LocalTraining needs per-client states")
        clients = clients.to(device)
        offsets = data.offsets.to(device)[clients]
        sizes = data.sizes.to(device)[clients]
        if cfg.epochs is not None:
            steps_each = torch.ceil(cfg.epochs * sizes.to(torch.float64) / cfg.batch_size).to(torch.int64)
            total = int(steps_each.max())
        else:
            steps_each = None
            total = cfg.steps
            if client_steps is not None:
                steps_each = client_steps.to(device=device, dtype=torch.int64).clamp(0, cfg.steps)
        hooked = _Hooked.build(hook, hook_rows, n, cfg, steps_each, total, device) if hook is not None else None
        if hooked is not None:
            steps_each = hooked.steps_each
        last = max(total, hooked.total) if hooked is not None else total
        b = cfg.batch_size
        sampler = _Sampler(states, clients, sizes, b, int(data.sizes.max())) if cfg.sampling == "without_replacement" else None
        adam = _AdamW(cfg, states, clients, params) if cfg.optimizer == "adamw" else None
        # (n, d) buffers reused from step to step: a matrix over glibc's largest mmap threshold
        # (32 MiB: 64 clients of the default text model) is otherwise page-faulted in at every
        # allocation, which cost as much as the arithmetic
        gbuf = torch.empty_like(params) if self._chunked(params) or self.path(device) == "loop" else None
        spare: torch.Tensor | None = None
        for step in range(last):
            gen = generator if step < total or hook_generator is None else hook_generator
            if sampler is not None:  # only the clients that run this step take items from their stream
                pos = sampler.next(gen, (step < steps_each) if steps_each is not None else None)
            else:
                # per-client batch indices into the pooled data, drawn on CPU for determinism
                pos = batch_positions(batch_uniforms(gen, n, b).to(device), sizes)
            idx = offsets[:, None] + pos
            xb, yb = data.x[idx], data.y[idx]
            if cfg.dp_clip is not None:
                g = self._dp_grads(params, xb, yb, cfg, noise_generator or gen)
            else:
                g = self._grads(params, xb, yb, out=gbuf)
            if hooked is not None:
                g = hooked.gradient(self, g, params, global_params, xb, yb)
            if cfg.prox_mu:
                g = g + cfg.prox_mu * (params - global_params)
            if cfg.weight_decay and cfg.optimizer == "sgd":  # coupled L2, as torch.optim.SGD(weight_decay=λ)
                g = g + cfg.weight_decay * params
            active = (step < steps_each) if steps_each is not None else None
            if active is not None:
                g = g * active.to(g.dtype)[:, None]
            lr: Any = cfg.lr if hooked is None or hooked.lr is None else hooked.lr
            if adam is not None:
                # the rows stepped from are read no more (train's own copy): their buffer takes the next result
                spare, params = params, adam.step(params, g, lr, active, out=spare)
            elif hooked is None and not isinstance(lr, torch.Tensor):
                # in place, the same two roundings as params - lr * g: the rows are train's own copy
                # and no hook holds them; a new (n, d) matrix at every step cost more than the
                # arithmetic (page faults: 11 ms against 1.9 for 10 rows of 199,210 values)
                params.sub_(g.mul_(lr))
            else:
                params = params - (lr * g if not isinstance(lr, torch.Tensor) else lr[:, None] * g)
            if hooked is not None:
                params = hooked.project(params, global_params)
        if adam is not None:
            adam.save()
        if sampler is not None:
            sampler.save()
        return params

    def replay(
        self,
        global_params: torch.Tensor,
        data: StackedData,
        clients: torch.Tensor,
        cfg: LocalTraining,
        generator_state: torch.Tensor,
        rows: list[int],
        *,
        draws: int,
        client_steps: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Recompute honestly the local parameters of the participants at positions ``rows``
        of one :meth:`train` call (a verifier's spot-check replay): ``(len(rows), d)``.

        ``clients``, ``cfg`` and ``client_steps`` are the call's; ``generator_state`` is its
        generator's state before the call and ``draws`` the number of batch draws it made from
        that generator (its own step count: ``cfg.steps``, or the most steps any client ran
        under ``local_epochs``). ``data`` is what each client was meant to train on. The
        replayed rows draw the same uniforms as in the call (all ``len(clients)`` rows of
        every draw are regenerated and the replayed ones kept), so an honest client's batches
        are the same; no hook applies. Only the stateless procedure can be replayed from the
        round's inputs: plain SGD with batches drawn with replacement (AdamW's moments and the
        epoch sampler's position are client state a verifier does not hold).

        The gradients take the trainer's path (``batching``), as :meth:`train` did. Float
        rounding: under ``"loop"`` each row's gradient is computed alone in both, so an honest
        row replays bit for bit; under ``"vmap"`` the gradients are computed for ``len(rows)``
        rows at once instead of ``len(clients)``, which may change the last bits of a batched
        product (bit for bit when every row is replayed), so a verifier compares within a
        tolerance (``defenses/spot_check.py`` measures the honest gap).
        """
        if cfg.optimizer != "sgd" or cfg.sampling != "with_replacement":
            raise ValueError("BatchedTrainer.replay: only SGD with batches drawn with replacement can be replayed "
                             "from the round's inputs")
        device = global_params.device
        n, k = int(clients.shape[0]), len(rows)
        pos_rows = torch.as_tensor(rows, dtype=torch.long)
        params = global_params.unsqueeze(0).expand(k, -1).clone()
        if k == 0:
            return params
        gen = torch.Generator(device="cpu")  # the federation's streams are CPU generators
        gen.set_state(generator_state)
        chosen = clients.to(device)[pos_rows.to(device)]
        offsets = data.offsets.to(device)[chosen]
        sizes = data.sizes.to(device)[chosen]
        b = cfg.batch_size
        steps_each = None
        if cfg.epochs is not None:
            steps_each = torch.ceil(cfg.epochs * sizes.to(torch.float64) / b).to(torch.int64)
        elif client_steps is not None:
            steps_each = client_steps.to(device=device, dtype=torch.int64)[pos_rows.to(device)].clamp(0, cfg.steps)
        for step in range(int(draws)):
            idx = offsets[:, None] + batch_positions(batch_uniforms(gen, n, b)[pos_rows].to(device), sizes)
            g = self._grads(params, data.x[idx], data.y[idx])
            if cfg.prox_mu:
                g = g + cfg.prox_mu * (params - global_params)
            if cfg.weight_decay:
                g = g + cfg.weight_decay * params
            if steps_each is not None:
                g = g * (step < steps_each).to(g.dtype)[:, None]
            params = params - cfg.lr * g
        return params

    @torch.no_grad()
    def evaluate(self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        """(accuracy, mean loss) of the flat parameters on ``(x, y)``."""
        out = functional_call(self.model, self.spec.unflatten(flat), (x,))
        loss = float(self.workload.loss(out, y))
        acc = float(self.workload.correct(out, y).to(torch.float64).mean())
        if math.isnan(loss):
            loss = float("inf")
        return acc, loss

    @torch.no_grad()
    def losses(self, flats: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Loss of each parameter row ``(k, d)`` on the same data, batched: ``(k,)``."""
        return vmap(self._loss, in_dims=(0, None, None))(flats, x, y)


class _Hooked:
    """A :class:`TrainingHook` bound to rows of one training call."""

    def __init__(self, hook: TrainingHook, rows: torch.Tensor, steps_each: torch.Tensor | None, total: int,
                 lr: torch.Tensor | None) -> None:
        self.hook, self.rows, self.steps_each, self.total, self.lr = hook, rows, steps_each, total, lr
        self._extra_grads: Callable[..., torch.Tensor] | None = None

    @classmethod
    def build(cls, hook: TrainingHook, rows: list[int] | None, n: int, cfg: LocalTraining,
              steps_each: torch.Tensor | None, total: int, device: torch.device) -> "_Hooked | None":
        if not rows:
            return None
        rows_t = torch.as_tensor(rows, dtype=torch.long, device=device)
        lr = None
        if hook.lr is not None:
            lr = torch.full((n,), float(cfg.lr), dtype=torch.float32, device=device)
            lr[rows_t] = float(hook.lr)
        if hook.steps is not None:
            base = steps_each if steps_each is not None else torch.full((n,), total, dtype=torch.int64, device=device)
            steps_each = base.clone()
            steps_each[rows_t] = int(hook.steps)
            total = max(total, int(hook.steps))
        return cls(hook, rows_t, steps_each, total, lr)

    def gradient(self, trainer: "BatchedTrainer", g: torch.Tensor, params: torch.Tensor,
                 global_params: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        hook, r = self.hook, self.rows
        part = hook.batch is not None and hook.batch < int(xb.shape[1])
        if hook.extra_loss is None and hook.grad_mask is None and not part and hook.poison_batch is None:
            return g
        g = g.clone()
        xr, yr = (xb[r][:, :hook.batch], yb[r][:, :hook.batch]) if part else (xb[r], yb[r])
        if hook.poison_batch is not None:
            px, py = hook.poison_batch(xr, yr)
            if px.shape != xr.shape or py.shape != yr.shape or px.dtype != xr.dtype or py.dtype != yr.dtype:
                raise ValueError(f"TrainingHook.poison_batch returned {tuple(px.shape)} {px.dtype} / "
                                 f"{tuple(py.shape)} {py.dtype}, expected {tuple(xr.shape)} {xr.dtype} / "
                                 f"{tuple(yr.shape)} {yr.dtype}")
            xr, yr = px.detach(), py.detach()
            part = True  # the rows' gradient is recomputed on what they train on
        if hook.extra_loss is not None:
            if self._extra_grads is None:
                base, extra = trainer._loss, hook.extra_loss

                def total_loss(flat: torch.Tensor, gp: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                    return base(flat, x, y) + extra(flat, gp, x, y)

                self._extra_grads = trainer.row_grads(total_loss, (0, None, 0, 0), params.device)
            g[r] = self._extra_grads(params[r], global_params, xr, yr)
        elif part:  # a lazy peer's smaller batch: the first items of the batch it drew
            g[r] = trainer._grads(params[r], xr, yr)
        if hook.grad_mask is not None:
            g[r] = g[r] * hook.grad_mask.to(device=g.device, dtype=g.dtype)
        return g

    def project(self, params: torch.Tensor, global_params: torch.Tensor) -> torch.Tensor:
        if self.hook.project is None:
            return params
        out = self.hook.project(params[self.rows], global_params)
        if tuple(out.shape) != (int(self.rows.shape[0]), params.shape[1]):
            raise ValueError(f"TrainingHook.project returned shape {tuple(out.shape)}, "
                             f"expected {(int(self.rows.shape[0]), params.shape[1])}")
        params = params.clone()
        params[self.rows] = out.to(params.dtype)
        return params


class _AdamW:
    """AdamW over client rows, its moments and step counts read from / written to client state."""

    def __init__(self, cfg: LocalTraining, states: "ClientStates", clients: torch.Tensor, params: torch.Tensor) -> None:
        d = params.shape[1]
        self.cfg, self.states, self.clients = cfg, states, clients
        self.m = states.rows("adamw_m", clients, (d,))
        self.v = states.rows("adamw_v", clients, (d,))
        self.t = states.rows("adamw_t", clients, (), torch.int64)
        self._scratch: tuple[torch.Tensor, torch.Tensor] | None = None

    def step(self, params: torch.Tensor, g: torch.Tensor, lr: Any, active: torch.Tensor | None,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """One step of every active row (the new rows written into ``out`` when given). Whole-matrix
        ``(n, d)`` ops, updating the moments in place (they are this object's copies of the client
        state) and reusing two scratch matrices: the same operations in the same order as
        m ← β₁m + (1−β₁)g, v ← β₂v + ((1−β₂)g)g, w ← w(1 − ηλ) − (η(m/c₁)) / (√(v/c₂) + ε), so the
        same bits as written that way."""
        b1, b2 = self.cfg.betas
        on = None if active is None or bool(active.all()) else active[:, None]
        self.t = self.t + (1 if on is None else on[:, 0].to(torch.int64))
        if self._scratch is None:
            self._scratch = (torch.empty_like(g), torch.empty_like(g))
        tmp, upd = self._scratch
        torch.mul(g, 1 - b1, out=tmp)
        if on is None:
            m = self.m.mul_(b1).add_(tmp)
            v = self.v.mul_(b2).add_(torch.mul(g, 1 - b2, out=tmp).mul_(g))
        else:  # a row that has finished its steps keeps its moments
            m = torch.where(on, torch.mul(self.m, b1).add_(tmp), self.m)
            v = torch.where(on, torch.mul(self.v, b2).add_(torch.mul(g, 1 - b2, out=tmp).mul_(g)), self.v)
        tf = self.t.clamp_min(1).to(torch.float64)
        c1 = (1 - b1 ** tf).to(params.dtype)[:, None]
        c2 = (1 - b2 ** tf).to(params.dtype)[:, None]
        lr_rows = lr[:, None] if isinstance(lr, torch.Tensor) else lr
        denom = torch.div(v, c2, out=tmp).sqrt_().add_(self.cfg.eps)
        new = torch.mul(params, 1 - lr_rows * self.cfg.weight_decay, out=out)
        new.sub_(torch.div(m, c1, out=upd).mul_(lr_rows).div_(denom))
        self.m, self.v = m, v
        return new if on is None else torch.where(on, new, params)

    def save(self) -> None:
        self.states.put("adamw_m", self.clients, self.m)
        self.states.put("adamw_v", self.clients, self.v)
        self.states.put("adamw_t", self.clients, self.t)


class _Sampler:
    """Epoch-style batches: each client's stream of independent permutations of its data.

    Client state: ``sampler_perm`` (its current permutation, padded to the largest
    client), ``sampler_pos`` (its position in it) and ``sampler_init`` (whether it has one)."""

    def __init__(self, states: "ClientStates", clients: torch.Tensor, sizes: torch.Tensor, batch: int,
                 width: int) -> None:
        self.states, self.clients, self.sizes, self.b = states, clients, sizes, batch
        self.width = width
        self.perm = states.rows("sampler_perm", clients, (width,), torch.int64)
        self.pos = states.rows("sampler_pos", clients, (), torch.int64)
        self.init = states.rows("sampler_init", clients, (), torch.bool)

    def _permutations(self, gen: torch.Generator) -> torch.Tensor:
        n = int(self.clients.shape[0])
        keys = torch.rand((n, self.width), generator=gen, dtype=torch.float64).to(self.sizes.device)
        cols = torch.arange(self.width, device=self.sizes.device)
        keys = torch.where(cols[None, :] < self.sizes[:, None], keys, torch.full_like(keys, 2.0))
        return torch.argsort(keys, dim=1)  # the first sizes[c] entries: a permutation of 0..sizes[c]-1

    def next(self, gen: torch.Generator, active: torch.Tensor | None = None) -> torch.Tensor:
        """The next batch positions ``(n, B)``; rows not ``active`` (a client that has
        finished its steps) get positions but keep their place in the stream."""
        fresh = self._permutations(gen)
        if not bool(self.init.all()):
            self.perm = torch.where(self.init[:, None], self.perm, fresh)
            self.pos = torch.where(self.init, self.pos, torch.zeros_like(self.pos))
            self.init = torch.ones_like(self.init)
            fresh = self._permutations(gen)
        at = self.pos[:, None] + torch.arange(self.b, device=self.pos.device)[None, :]
        size = self.sizes[:, None]
        # items past the end of this epoch come from the next permutation (wrapping for tiny clients)
        mine = torch.gather(self.perm, 1, at.clamp_max(self.width - 1))
        nxt = torch.gather(fresh, 1, ((at - size) % size).clamp_max(self.width - 1))
        out = torch.where(at < size, mine, nxt)
        end = self.pos + self.b
        rolled = end >= self.sizes
        moved = torch.where(rolled, (end - self.sizes) % self.sizes, end)
        if active is not None:
            rolled = rolled & active
            moved = torch.where(active, moved, self.pos)
        self.perm = torch.where(rolled[:, None], fresh, self.perm)
        self.pos = moved
        return out

    def save(self) -> None:
        self.states.put("sampler_perm", self.clients, self.perm)
        self.states.put("sampler_pos", self.clients, self.pos)
        self.states.put("sampler_init", self.clients, self.init)
