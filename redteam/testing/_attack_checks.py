"""The attack hooks' contract checks (private; the public entry is ``check_attack``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from redteam.types import Attack, AttackContext, ChunkDelivery, ClientData, Surface

from . import _checks as K
from .builders import generator, make_deliveries, make_provenance, participant_ids

CTX_TENSORS = ("own_updates", "visible_updates", "global_params", "weights", "previous_update")
HOOKS = (("craft_updates", Surface.UPDATES), ("poison_data", Surface.DATA),
         ("tamper_chunks", Surface.TRANSPORT), ("forge_provenance", Surface.PROVENANCE),
         ("choose_identity", Surface.HIERARCHY), ("tamper_subaggregate", Surface.HIERARCHY),
         ("tamper_activation", Surface.PIPELINE), ("tamper_gradient", Surface.PIPELINE),
         ("tamper_stage_update", Surface.PIPELINE), ("craft_gossip", Surface.GOSSIP))
#: the tensors of a :class:`~redteam.types.GossipContext` a gossip attack must leave as they are
GOSSIP_TENSORS = ("target_model", "neighbour_models", "neighbour_weights", "attacker_weights", "own_models",
                  "honest_models", "laplacian", "fiedler")


def toy_pipeline(seed: int) -> Any:
    """A two-stage stand-in for a pipeline's view (:class:`~redteam.types.PipelineView`): a byte
    bigram model, embedding (256 × 8) then head (8 × 256), on random byte windows; small enough
    that an attack's offline preparation runs in the contract checks."""
    import torch
    import torch.nn.functional as F

    from redteam.types import PipelineView

    g = torch.Generator().manual_seed(seed)
    flat = 0.1 * torch.randn(2 * 256 * 8, generator=g)
    w = torch.randint(0, 256, (64, 13), generator=g)

    def loss(p: "torch.Tensor", x: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
        logits = p[: 256 * 8].reshape(256, 8)[x] @ p[256 * 8:].reshape(8, 256)
        return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1), ignore_index=-100)

    return PipelineView(params0=flat, slices=(slice(0, 256 * 8), slice(256 * 8, 2 * 256 * 8)), loss=loss,
                        data_x=w[:, :-1].contiguous(), data_y=w[:, 1:].contiguous(), peers_per_stage=2)


def _judge_stage_tensor(plugin: Attack, label: str, hook: str, call: Any, g: Any, state: Any, ref: Any, what: str,
                        snap: Any, where: str, tally: K.Tally) -> None:
    """The checks a stage hook's tensor result shares: ``call(generator)`` returns the same shape,
    dtype and device as ``ref``, finite (unless ``produces_nonfinite``), modifies nothing in
    ``snap``, and gives the same result for a generator in the same state."""
    import torch

    got = K.call(label, hook, lambda: call(g), where, tally)
    if got is K.REFUSED:
        return
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(ref.shape) or got.dtype != ref.dtype \
            or got.device != ref.device:
        K.fail(label, K.P_SHAPE, f"{hook} returned {getattr(got, 'shape', type(got).__name__)}; the stage's {what} is "
               f"{tuple(ref.shape)} {K.dtype_name(ref)} on {ref.device}", where)
    if not getattr(plugin, "produces_nonfinite", False) and not K.finite(got):
        K.fail(label, K.P_FINITE, f"{hook} returned non-finite entries from finite inputs", where)
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{hook} modified {', '.join(changed)} in place", where)
    again = K.call(label, hook, lambda: call(K.regenerate(g, state)), where, None)
    if not K.same(got, again):
        K.fail(label, K.P_DETERMINISTIC, "two calls with generators in the same state differ", where)
    tally.ok(hook)


def check_stage_update(plugin: Attack, label: str, seed: int, where: str, tally: K.Tally) -> None:
    """A stage peer's update at the sync, on :func:`toy_pipeline`: same shape, dtype and device,
    finite, neither the update nor the view's parameters modified, the same output for the same
    generator state and a fresh memory."""
    import torch

    from redteam.types import StageContext

    hook = "tamper_stage_update"
    view = toy_pipeline(seed)
    upd = 0.01 * torch.randn(256 * 8, generator=torch.Generator().manual_seed(seed + 1))
    snap = K.snapshot({"update": upd, "ctx.pipeline.params0": view.params0})
    g = generator(seed)
    state = g.get_state()

    def call(gen: Any) -> Any:
        ctx = StageContext(round=0, stage=1, n_stages=2, peer=3, micro_batch=0, generator=gen, state={},
                           pipeline=view)
        return plugin.tamper_stage_update(upd, ctx)

    _judge_stage_tensor(plugin, label, hook, call, g, state, upd, "update", snap, where, tally)


def check_stage(plugin: Attack, label: str, hook: str, seed: int, where: str, tally: K.Tally) -> None:
    """A pipeline stage peer's hook on a (B, T, W) activation or gradient: same shape, dtype and
    device, finite from finite input, no input modified, the same output for the same generator
    state and a fresh memory."""
    import torch

    from redteam.types import StageContext

    g0 = torch.Generator().manual_seed(seed)
    out = torch.randn(2, 5, 6, generator=g0)
    inp = torch.randn(2, 5, 6, generator=g0)
    snap = K.snapshot({"out": out, "inp": inp})
    g = generator(seed)
    state = g.get_state()

    def call(gen: Any) -> Any:
        ctx = StageContext(round=0, stage=1, n_stages=3, peer=4, micro_batch=0, generator=gen, state={})
        if hook == "tamper_activation":
            return plugin.tamper_activation(out, inp, ctx)
        return plugin.tamper_gradient(out, ctx)

    _judge_stage_tensor(plugin, label, hook, call, g, state, out, "tensor", snap, where, tally)


def check_gossip(plugin: Attack, label: str, ctx: Any, where: str, tally: K.Tally) -> None:
    """What a Byzantine node of a gossip graph sends one honest neighbour
    (:meth:`~redteam.types.Attack.craft_gossip`, on a :func:`~.builders.make_gossip_context`):
    ``(len(ctx.attackers), d)`` models in the models' dtype and device, finite from finite input
    (unless ``produces_nonfinite``), no tensor of the context modified, and the same messages for
    a generator in the same state and a fresh memory."""
    import torch

    hook = "craft_gossip"
    snap = K.snapshot(K.tensors_of(ctx, GOSSIP_TENSORS))
    state = ctx.generator.get_state()
    out = K.call(label, hook, lambda: plugin.craft_gossip(ctx), where, tally)
    if out is K.REFUSED:
        return
    ref = ctx.own_models
    want = (len(ctx.attackers), int(ctx.target_model.shape[0]))
    if not isinstance(out, torch.Tensor):
        K.fail(label, K.P_SHAPE, f"{hook} returned a {type(out).__name__}, not a tensor", where)
    if tuple(out.shape) != want or out.dtype != ref.dtype or out.device != ref.device:
        K.fail(label, K.P_SHAPE, f"{hook} returned {tuple(out.shape)} {K.dtype_name(out)} on {out.device}; one "
               f"model per Byzantine neighbour is {want} {K.dtype_name(ref)} on {ref.device}", where)
    if not getattr(plugin, "produces_nonfinite", False) and not K.finite(out):
        K.fail(label, K.P_FINITE, f"{hook} returned {int((~torch.isfinite(out)).sum())} non-finite entries from "
               "finite inputs (declare `produces_nonfinite = True` if that is the attack's purpose)", where)
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{hook} modified ctx.{', ctx.'.join(changed)}", where)
    again = dataclasses.replace(ctx, generator=K.regenerate(ctx.generator, state), state={})
    out2 = K.call(label, hook, lambda: plugin.craft_gossip(again), where, None)
    if not K.same(out, out2):
        K.fail(label, K.P_DETERMINISTIC, f"two calls with generators in the same state differ "
               f"(max |Δ| = {K.max_gap(out, out2):.3g})", where)
    tally.ok(hook)


def overrides(plugin: Attack, hook: str) -> bool:
    return getattr(type(plugin), hook) is not getattr(Attack, hook)


def check_updates(plugin: Attack, label: str, ctx: AttackContext, where: str, tally: K.Tally) -> None:
    import torch

    hook = "craft_updates"
    snap = K.snapshot(K.tensors_of(ctx, CTX_TENSORS))
    state = ctx.generator.get_state()
    out = K.call(label, hook, lambda: plugin.craft_updates(ctx), where, tally)
    if out is K.REFUSED:
        return
    own = ctx.own_updates
    if not isinstance(out, torch.Tensor):
        K.fail(label, K.P_SHAPE, f"{hook} returned a {type(out).__name__}, not a tensor", where)
    if tuple(out.shape) != tuple(own.shape) or out.dtype != own.dtype or out.device != own.device:
        K.fail(label, K.P_SHAPE, f"{hook} returned {tuple(out.shape)} {K.dtype_name(out)} on {out.device}; "
               f"own_updates is {tuple(own.shape)} {K.dtype_name(own)} on {own.device}", where)
    if not getattr(plugin, "produces_nonfinite", False) and not K.finite(out):
        K.fail(label, K.P_FINITE, f"{hook} returned {int((~torch.isfinite(out)).sum())} non-finite entries from "
               "finite inputs (declare `produces_nonfinite = True` if that is the attack's purpose)", where)
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{hook} modified ctx.{', ctx.'.join(changed)}", where)
    again = dataclasses.replace(ctx, generator=K.regenerate(ctx.generator, state))
    out2 = K.call(label, hook, lambda: plugin.craft_updates(again), where, None)
    if not K.same(out, out2):
        K.fail(label, K.P_DETERMINISTIC, f"two calls with generators in the same state differ "
               f"(max |Δ| = {K.max_gap(out, out2):.3g})", where)
    tally.ok(hook)


def check_data(plugin: Attack, label: str, data: ClientData, client: int, seed: int, num_classes: int,
                where: str, tally: K.Tally) -> None:
    import torch

    hook = "poison_data"
    snap = K.snapshot({"data.x": data.x, "data.y": data.y})
    g = generator(seed)
    state = g.get_state()
    out = K.call(label, hook, lambda: plugin.poison_data(data, client, g), where, tally)
    if out is K.REFUSED:
        return
    if not isinstance(out, ClientData) or not all(isinstance(t, torch.Tensor) for t in (out.x, out.y)):
        K.fail(label, K.P_SHAPE, f"{hook} returned {type(out).__name__}, not a ClientData of tensors", where)
    x, y = out.x, out.y
    for name, got, ref in (("x", x, data.x), ("y", y, data.y)):
        if got.dtype != ref.dtype or tuple(got.shape[1:]) != tuple(ref.shape[1:]) or got.device != ref.device:
            K.fail(label, K.P_SHAPE, f"{hook} returned {name} {tuple(got.shape)} {K.dtype_name(got)} on "
                   f"{got.device}; the client's {name} is {tuple(ref.shape)} {K.dtype_name(ref)} on {ref.device}",
                   where)
    if x.shape[0] != y.shape[0]:
        K.fail(label, K.P_SHAPE, f"{hook} returned {x.shape[0]} inputs but {y.shape[0]} labels", where)
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        K.fail(label, K.P_LABELS, f"labels span [{int(y.min())}, {int(y.max())}], outside [0, {num_classes})", where)
    if not getattr(plugin, "produces_nonfinite", False) and not K.finite(x):
        K.fail(label, K.P_FINITE, f"{hook} returned non-finite inputs from finite ones", where)
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{hook} modified {', '.join(changed)} in place", where)
    out2 = K.call(label, hook, lambda: plugin.poison_data(data, client, K.regenerate(g, state)), where, None)
    if not (K.same(x, out2.x) and K.same(y, out2.y)):
        K.fail(label, K.P_DETERMINISTIC, "two calls with generators in the same state differ", where)
    tally.ok(hook)


def check_transport(plugin: Attack, label: str, ctx: AttackContext, seed: int, where: str,
                     tally: K.Tally) -> None:
    hook = "tamper_chunks"
    snap = K.snapshot(K.tensors_of(ctx, CTX_TENSORS))
    state = ctx.generator.get_state()

    def run(c: AttackContext) -> Any:
        return plugin.tamper_chunks(make_deliveries(seed, c), c)

    out = K.call(label, hook, lambda: run(ctx), where, tally)
    if out is K.REFUSED:
        return
    try:
        items = list(out)
    except TypeError:
        K.fail(label, K.P_SHAPE, f"{hook} returned {type(out).__name__}, not a list of ChunkDelivery", where)
    for item in items:
        if not isinstance(item, ChunkDelivery) or not isinstance(item.data, (bytes, bytearray, memoryview)) \
                or not all(isinstance(v, int) for v in (item.author, item.index, item.relay, item.round)):
            K.fail(label, K.P_SHAPE, f"{hook} returned {item!r:.120}, not a ChunkDelivery with bytes data", where)
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{hook} modified ctx.{', ctx.'.join(changed)}", where)
    again = K.call(label, hook, lambda: run(dataclasses.replace(ctx, generator=K.regenerate(ctx.generator, state))),
                   where, None)

    def key(seq: Any) -> list[tuple[Any, ...]]:
        return [(d.author, d.index, d.relay, bytes(d.data), d.round) for d in seq]

    if key(items) != key(list(again)):
        K.fail(label, K.P_DETERMINISTIC, "two calls with generators in the same state deliver different chunks", where)
    tally.ok(hook)


def _fingerprint(out: Any) -> Any:
    """A comparable form of what ``forge_provenance`` returned (keys by their key id)."""
    import json

    if hasattr(out, "to_json") and not hasattr(out, "envelope"):
        return ("manifest", out.to_json())
    if hasattr(out, "envelope"):
        signer = getattr(out, "signer", None)
        proof = json.dumps(out.proof, sort_keys=True, default=str) if getattr(out, "proof", None) else None
        return ("presentation", out.client, out.envelope, getattr(signer, "keyid", signer), out.statement,
                out.log, proof)
    return ("other", repr(out))


def check_provenance(plugin: Attack, label: str, ctx: AttackContext, clean: ClientData, seed: int, where: str,
                     tally: K.Tally) -> None:
    """As the trainer calls it: the curator's manifest of the clean data, and ``ctx.state``
    with the client, the shards it trains on (poisoned by the attack's own
    ``poison_data``) and the keyring its declared ``capabilities`` grant."""
    from provenance.manifest import DatasetManifest
    from redteam.federation.provenance import Presentation

    hook = "forge_provenance"
    client = ctx.malicious[0] if ctx.malicious else 0
    caps = tuple(getattr(plugin, "capabilities", ()))
    actual = K.call(label, "poison_data", lambda: plugin.poison_data(clean, client, generator(seed)), where, tally)
    if actual is K.REFUSED:
        return
    manifest, state = make_provenance(seed, client, clean, actual, caps)
    c = dataclasses.replace(ctx, state={**dict(ctx.state), **state})
    snap = K.snapshot(K.tensors_of(c, CTX_TENSORS))
    gen_state = c.generator.get_state()
    before = manifest.to_json()
    out = K.call(label, hook, lambda: plugin.forge_provenance(manifest, c), where, tally)
    if out is K.REFUSED:
        return
    if not isinstance(out, (DatasetManifest, Presentation)):
        K.fail(label, K.P_SHAPE, f"{hook} returned {type(out).__name__}, expected a DatasetManifest (for the "
               "curator to sign) or a Presentation", where)
    if manifest.to_json() != before:
        K.fail(label, K.P_MUTATION, f"{hook} changed the manifest it was given", where)
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{hook} modified ctx.{', ctx.'.join(changed)}", where)
    manifest2, state2 = make_provenance(seed, client, clean, actual, caps)
    c2 = dataclasses.replace(ctx, state={**dict(ctx.state), **state2},
                             generator=K.regenerate(c.generator, gen_state))
    again = K.call(label, hook, lambda: plugin.forge_provenance(manifest2, c2), where, None)
    if _fingerprint(out) != _fingerprint(again):
        K.fail(label, K.P_DETERMINISTIC, "two calls with generators (and keys) in the same state forge different "
               "presentations", where)
    tally.ok(hook)


def check_identity(plugin: Attack, label: str, ctx: AttackContext, n_groups: int, where: str,
                   tally: K.Tally) -> None:
    hook = "choose_identity"
    for client in ctx.malicious:
        out = K.call(label, hook, lambda: plugin.choose_identity(client, n_groups), where, tally)
        if out is K.REFUSED:
            return
        if not isinstance(out, str) or not out:
            K.fail(label, K.P_SHAPE, f"{hook}({client}, {n_groups}) returned {out!r}, not a non-empty str", where)
        again = K.call(label, hook, lambda: plugin.choose_identity(client, n_groups), where, None)
        if again != out:
            K.fail(label, K.P_DETERMINISTIC, f"{hook}({client}, {n_groups}) returned {out!r}, then {again!r}", where)
    tally.ok(hook)


def check_subaggregate(plugin: Attack, label: str, ctx: AttackContext, where: str, tally: K.Tally) -> None:
    """Two merge groups: every participant (led by the smallest id), and one led by a
    malicious client; the partial aggregate is the mean of the rows the context holds."""
    import torch

    hook = "tamper_subaggregate"
    bad, honest = participant_ids(ctx)
    rows = torch.cat([ctx.own_updates, ctx.visible_updates]) if ctx.visible_updates is not ctx.own_updates \
        else ctx.own_updates
    groups = [(0, tuple(sorted(bad + honest))), (1, tuple(bad[:1] + honest[: len(honest) // 2]))]
    for group, members in groups:
        agg = rows.to(torch.float64).mean(dim=0).to(rows.dtype)
        snap = K.snapshot({"aggregate": agg, **K.tensors_of(ctx, CTX_TENSORS)})
        state = ctx.generator.get_state()
        out = K.call(label, hook, lambda: plugin.tamper_subaggregate(agg, group, members, ctx), where, tally)
        if out is K.REFUSED:
            return
        if not isinstance(out, torch.Tensor) or out.shape != agg.shape or out.dtype != agg.dtype \
                or out.device != agg.device:
            got = f"{tuple(out.shape)} {K.dtype_name(out)} on {out.device}" if isinstance(out, torch.Tensor) \
                else type(out).__name__
            K.fail(label, K.P_SHAPE, f"{hook} returned {got}; the partial aggregate is {tuple(agg.shape)} "
                   f"{K.dtype_name(agg)} on {agg.device}", where)
        if not getattr(plugin, "produces_nonfinite", False) and not K.finite(out):
            K.fail(label, K.P_FINITE, f"{hook} returned a non-finite partial aggregate from a finite one", where)
        if changed := K.mutated(snap):
            K.fail(label, K.P_MUTATION, f"{hook} modified {', '.join(changed)}", where)
        again = dataclasses.replace(ctx, generator=K.regenerate(ctx.generator, state))
        out2 = K.call(label, hook, lambda: plugin.tamper_subaggregate(agg, group, members, again), where, None)
        if not K.same(out, out2):
            K.fail(label, K.P_DETERMINISTIC, f"{hook}: two calls with generators in the same state differ", where)
    tally.ok(hook)
