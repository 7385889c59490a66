"""The contracts every attack and defense plugin must pass: ``check_attack``, ``check_defense``.

Both take a registry name (``"krum"``), a plugin class, or an instance, and by default
run ``max_examples`` generated inputs through hypothesis (derandomized, so CI sees the
same inputs every run). Given an explicit input (``ctx=`` / ``data=`` for an attack,
``updates=`` for a defense) they check that one input only, which is how to use them
inside your own ``@given`` test. A broken property raises ``AssertionError`` naming
the plugin, the property, what was seen and the input (a reproduce line such as
``DefenseCase(seed=3, n=5, d=2, ...)``, whose ``.updates()`` and ``.context()``
rebuild it). A passing check returns a :class:`ContractReport`.

Attacks (each hook the attack overrides or declares; ``craft_updates`` always):

* ``craft_updates``: returns ``(f, d)`` rows like ``own_updates``, same dtype and device;
  finite rows from finite inputs unless the class declares ``produces_nonfinite``;
  identical rows from a generator in the same state; no input tensor modified.
* ``poison_data``: a :class:`~redteam.types.ClientData` with inputs of the same dtype,
  device and per-sample shape, as many labels as inputs, labels in [0, num_classes);
  deterministic; the given dataset unmodified.
* ``tamper_chunks`` / ``forge_provenance``: well-formed deliveries / a manifest;
  deterministic; the context unmodified.

Defenses:

* the :class:`~redteam.types.Decision`: aggregate ``(d,)`` in the updates' dtype and
  device, ``accepted`` a bool ``(n,)`` mask, ``weights`` absent or ``(n,)``, every key of
  ``reasons`` a rejected client index; finite aggregate from finite updates;
* deterministic under the seed; no mutation of the updates or the context;
* feeding ``Decision.state`` back as next round's ``ctx.state`` works;
* when ``symmetric``: permuting the clients (rows, weights, ids together) leaves the
  aggregate unchanged up to rounding and permutes ``accepted`` with them (up to ties
  between identical rows);
* when ``symmetric`` and ``unanimity``: n copies of one update x give x. This is
  checked on a small x (‖x‖ = ``consensus_norm``, inside any sensible norm bound or
  clipping radius) in a world that agrees with it: the server's root update is x,
  its loss is lowest at x, the previous update is x.

The kit builds the context a plugin may need: weights, a previous update, a server
that can evaluate a quadratic loss and return a root update (``loss_check``,
``fltrust``), the server's defense for attacks that declare ``adaptive`` (default: a
rejecting norm bound at twice the median norm), n from 1 (defenses) or 3 (attacks)
to 10, so rules with a minimum n (Krum's 2f + 2 < n, Bulyan's n ≥ 4f + 3) meet
both inputs they refuse and inputs they accept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from redteam.types import Attack, AttackContext, ChunkDelivery, ClientData, Decision, Defense, Surface

from . import _checks as K
from .builders import AttackCase, DefenseCase, generator, make_deliveries, make_manifest, make_server_context

if TYPE_CHECKING:
    import torch

__all__ = ["ContractReport", "check_attack", "check_defense"]

_CTX_TENSORS = ("own_updates", "visible_updates", "global_params", "weights", "previous_update")
_SERVER_TENSORS = ("weights", "global_params", "previous_update")
_HOOKS = (("craft_updates", Surface.UPDATES), ("poison_data", Surface.DATA),
          ("tamper_chunks", Surface.TRANSPORT), ("forge_provenance", Surface.PROVENANCE))


@dataclass(frozen=True, slots=True)
class ContractReport:
    """What a passing check covered: the properties, on how many inputs, and what was
    refused (inputs the plugin declined with a redteam error) or not applicable."""

    plugin: str
    examples: int
    checked: tuple[str, ...]
    not_checked: tuple[tuple[str, str], ...] = ()
    refused: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [f"{self.plugin}: {len(self.checked)} properties on {self.examples} inputs"]
        lines += [f"  ✓ {p}" for p in self.checked]
        lines += [f"  – {p}: {why}" for p, why in self.not_checked]
        lines += [f"  refused: {r}" for r in self.refused]
        return "\n".join(lines)


# ---------------------------------------------------------------------- resolution
def _resolve(obj: Any, params: Mapping[str, Any] | None, kind: str, base: type) -> tuple[Any, str]:
    from redteam.registry import ATTACKS, DEFENSES

    registry = ATTACKS if kind == "attack" else DEFENSES
    if isinstance(obj, str):
        plugin = registry.create(obj, params or {})
        label = f"{kind} {obj!r} ({registry.info(obj).target})"
    elif isinstance(obj, type):
        plugin = obj(**dict(params or {}))
        label = f"{kind} {obj.__module__}:{obj.__qualname__}"
    else:
        if params:
            raise TypeError(f"check_{kind}: params={dict(params)!r} given with an instance; pass a name or a class")
        plugin = obj
        label = f"{kind} {type(obj).__module__}:{type(obj).__qualname__}"
    if not isinstance(plugin, base):
        raise AssertionError(f"{label}: is not a redteam.{base.__name__} (got {type(plugin).__name__})")
    if not dataclasses.is_dataclass(plugin) or not type(plugin).__dataclass_params__.frozen:  # type: ignore[attr-defined]
        K.fail(label, K.P_DECLARATION, "not a frozen dataclass", repr(plugin))
    try:
        again = dataclasses.replace(plugin)
    except Exception as exc:
        K.fail(label, K.P_DECLARATION, f"rebuilding it from its own fields raised {type(exc).__name__}: {exc}",
               repr(plugin))
    if again != plugin:
        K.fail(label, K.P_DECLARATION, f"rebuilt from its own fields it is {again!r}, not equal", repr(plugin))
    return plugin, label


def _run(strategy: Any, body: Callable[[Any], None], max_examples: int, derandomize: bool) -> None:
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(case: Any) -> None:
        body(case)

    run()


# ---------------------------------------------------------------------- attacks
def _overrides(plugin: Attack, hook: str) -> bool:
    return getattr(type(plugin), hook) is not getattr(Attack, hook)


def _check_updates(plugin: Attack, label: str, ctx: AttackContext, where: str, tally: K.Tally) -> None:
    import torch

    hook = "craft_updates"
    snap = K.snapshot(K.tensors_of(ctx, _CTX_TENSORS))
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


def _check_data(plugin: Attack, label: str, data: ClientData, client: int, seed: int, num_classes: int,
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
        K.fail(label, K.P_DETERMINISTIC, f"two calls with generators in the same state differ", where)
    tally.ok(hook)


def _check_transport(plugin: Attack, label: str, ctx: AttackContext, seed: int, where: str,
                     tally: K.Tally) -> None:
    hook = "tamper_chunks"
    snap = K.snapshot(K.tensors_of(ctx, _CTX_TENSORS))
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


def _check_provenance(plugin: Attack, label: str, ctx: AttackContext, seed: int, where: str,
                      tally: K.Tally) -> None:
    hook = "forge_provenance"
    snap = K.snapshot(K.tensors_of(ctx, _CTX_TENSORS))
    state = ctx.generator.get_state()
    client = ctx.malicious[0] if ctx.malicious else 0
    manifest = make_manifest(seed, client)
    before = repr(manifest)
    out = K.call(label, hook, lambda: plugin.forge_provenance(manifest, ctx), where, tally)
    if out is K.REFUSED:
        return
    if repr(manifest) != before:
        K.fail(label, K.P_MUTATION, f"{hook} modified the manifest it was given", where)
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{hook} modified ctx.{', ctx.'.join(changed)}", where)
    again = K.call(label, hook, lambda: plugin.forge_provenance(
        make_manifest(seed, client), dataclasses.replace(ctx, generator=K.regenerate(ctx.generator, state))),
        where, None)
    if repr(out) != repr(again):
        K.fail(label, K.P_DETERMINISTIC, "two calls with generators in the same state forge different manifests",
               where)
    tally.ok(hook)


def _default_defense() -> Defense:
    from redteam.registry import DEFENSES

    return DEFENSES.create("norm_bound", {"mode": "reject", "multiplier": 2.0})


def check_attack(
    attack: Any,
    /,
    *,
    params: Mapping[str, Any] | None = None,
    max_examples: int = 10,
    n: Any = (3, 10),
    f: Any = None,
    d: Any = (1, 12),
    dtypes: Sequence[Any] = ("float32", "float64"),
    device: "torch.device | str" = "cpu",
    omniscient: bool | None = None,
    defense: Any = None,
    num_classes: int = 10,
    sample_shape: tuple[int, ...] = (64,),
    ctx: AttackContext | None = None,
    data: ClientData | None = None,
    derandomize: bool = True,
) -> ContractReport:
    """Check the attack contracts (module docstring) and return what was covered.

    ``attack``: a registry name, an :class:`~redteam.types.Attack` subclass (built with
    ``params``) or an instance. Generated inputs: ``n`` participants, ``f`` of them
    malicious (default a minority), ``d`` coordinates, in each of ``dtypes`` on
    ``device``; the attack sees every honest row when it declares ``omniscient`` (or
    ``omniscient=True``); ``defense`` (a name or an instance) is what an ``adaptive``
    attack searches against; data attacks get ``sample_shape`` inputs in [0, 1) with
    labels in [0, num_classes). ``ctx`` / ``data`` check those inputs only.
    """
    from redteam.registry import DEFENSES

    plugin, label = _resolve(attack, params, "attack", Attack)
    surfaces = tuple(getattr(plugin, "surfaces", ()))
    for s in surfaces:
        if s not in Surface.ALL:
            K.fail(label, K.P_SURFACES, f"surfaces lists {s!r}, not one of {Surface.ALL}", repr(plugin))
    for hook, surface in _HOOKS:
        if _overrides(plugin, hook) and surface not in surfaces:
            K.fail(label, K.P_SURFACES, f"overrides {hook} but `surfaces` = {surfaces} lacks {surface!r}, so the "
                   "trainer never calls it", repr(plugin))
    hooks = [h for h, s in _HOOKS if h == "craft_updates" or _overrides(plugin, h) or s in surfaces]
    omni = bool(getattr(plugin, "omniscient", False)) if omniscient is None else bool(omniscient)
    adaptive = bool(getattr(plugin, "adaptive", False))
    dfn = None
    if adaptive:
        dfn = _default_defense() if defense is None else (DEFENSES.create(defense) if isinstance(defense, str)
                                                          else defense)
    tally = K.Tally()

    def body(case: AttackCase) -> None:
        where = f"{case!r} (rebuild: .context(omniscient={omni}), .data())"
        c = case.context(device=device, omniscient=omni, defense=dfn, num_classes=num_classes)
        if "craft_updates" in hooks:
            _check_updates(plugin, label, c, where, tally)
        if "poison_data" in hooks:
            cd = case.data(device=device, sample_shape=sample_shape, num_classes=num_classes)
            _check_data(plugin, label, cd, c.malicious[0], case.seed, num_classes, where, tally)
        if "tamper_chunks" in hooks:
            _check_transport(plugin, label, c, case.seed, where, tally)
        if "forge_provenance" in hooks:
            _check_provenance(plugin, label, c, case.seed, where, tally)

    if ctx is not None or data is not None:
        if ctx is not None:
            hooks_given = [h for h in hooks if h != "poison_data"]
            for h in hooks_given:
                {"craft_updates": lambda: _check_updates(plugin, label, ctx, "the given ctx", tally),
                 "tamper_chunks": lambda: _check_transport(plugin, label, ctx, 0, "the given ctx", tally),
                 "forge_provenance": lambda: _check_provenance(plugin, label, ctx, 0, "the given ctx", tally),
                 }[h]()
        if data is not None and "poison_data" in hooks:
            _check_data(plugin, label, data, 0, 0, num_classes, "the given data", tally)
        hooks = [h for h in hooks if (h == "poison_data" and data is not None)
                 or (h != "poison_data" and ctx is not None)]
    else:
        from .strategies import attack_cases

        _run(attack_cases(n, f, d, dtype=tuple(dtypes)), body, max_examples, derandomize)
    tally.require(label, hooks, "Pass inputs it accepts (n=, f=, d=, num_classes=, sample_shape=, or ctx= / "
                                "data=) or params= it can work with.")
    props = [K.P_DECLARATION, K.P_SURFACES, K.P_SHAPE, K.P_DETERMINISTIC, K.P_MUTATION]
    not_checked: list[tuple[str, str]] = []
    if getattr(plugin, "produces_nonfinite", False):
        not_checked.append((K.P_FINITE, "declares produces_nonfinite = True"))
    else:
        props.append(K.P_FINITE)
    if "poison_data" in hooks:
        props.append(K.P_LABELS)
    for h, s in _HOOKS:
        if h not in hooks:
            not_checked.append((h, "identity: not overridden, surface not declared"))
    return ContractReport(plugin=f"{label} [{', '.join(hooks)}]", examples=max(tally.done.values(), default=0),
                          checked=tuple(props), not_checked=tuple(not_checked), refused=tally.refused())


# ---------------------------------------------------------------------- defenses
def _check_decision(label: str, dec: Any, updates: "torch.Tensor", where: str, what: str) -> Decision:
    import torch

    n, d = updates.shape
    if not isinstance(dec, Decision):
        K.fail(label, K.P_SHAPE, f"{what} returned {type(dec).__name__}, not a Decision", where)
    agg, acc = dec.aggregate, dec.accepted
    if not isinstance(agg, torch.Tensor) or tuple(agg.shape) != (d,) or agg.dtype != updates.dtype \
            or agg.device != updates.device:
        got = f"{tuple(agg.shape)} {K.dtype_name(agg)} on {agg.device}" if isinstance(agg, torch.Tensor) else repr(agg)
        K.fail(label, K.P_SHAPE, f"{what}: aggregate is {got}; expected ({d},) {K.dtype_name(updates)} "
               f"on {updates.device}", where)
    if not isinstance(acc, torch.Tensor) or tuple(acc.shape) != (n,) or acc.dtype != torch.bool \
            or acc.device != updates.device:
        got = f"{tuple(acc.shape)} {K.dtype_name(acc)} on {acc.device}" if isinstance(acc, torch.Tensor) else repr(acc)
        K.fail(label, K.P_SHAPE, f"{what}: accepted is {got}; expected ({n},) bool on {updates.device}", where)
    if dec.weights is not None and (not isinstance(dec.weights, torch.Tensor) or tuple(dec.weights.shape) != (n,)):
        K.fail(label, K.P_SHAPE, f"{what}: weights has shape {tuple(getattr(dec.weights, 'shape', ()))}, "
               f"expected ({n},) or None", where)
    bad = [k for k in dec.reasons if not isinstance(k, int) or not 0 <= k < n or bool(acc[k])]
    if bad:
        K.fail(label, K.P_SHAPE, f"{what}: reasons name clients {bad} that are not rejected indices "
               f"(accepted = {acc.tolist()})", where)
    if K.finite(updates) and not K.finite(agg):
        K.fail(label, K.P_FINITE, f"{what}: non-finite aggregate {agg.tolist()} from finite updates", where)
    return dec


def _decide(plugin: Defense, label: str, updates: "torch.Tensor", ctx: Any, where: str, what: str,
            tally: K.Tally | None) -> Any:
    snap = K.snapshot({"updates": updates, **{f"ctx.{k}": v for k, v in
                                              K.tensors_of(ctx, _SERVER_TENSORS).items()}})
    dec = K.call(label, "decide", lambda: plugin(updates, ctx), where, tally)
    if dec is K.REFUSED:
        return dec
    if changed := K.mutated(snap):
        K.fail(label, K.P_MUTATION, f"{what} modified {', '.join(changed)}", where)
    return _check_decision(label, dec, updates, where, what)


def _same_decision(label: str, a: Decision, b: Decision, where: str, what: str) -> None:
    if not (K.same(a.aggregate, b.aggregate) and K.same(a.accepted, b.accepted)
            and (a.weights is None) == (b.weights is None)
            and (a.weights is None or K.same(a.weights, b.weights)) and set(a.reasons) == set(b.reasons)):
        K.fail(label, K.P_DETERMINISTIC, f"{what}: two calls with generators in the same state differ "
               f"(aggregate max |Δ| = {K.max_gap(a.aggregate, b.aggregate):.3g}, accepted "
               f"{a.accepted.tolist()} vs {b.accepted.tolist()})", where)


def _tie_groups(updates: "torch.Tensor") -> list[list[int]]:
    """Indices of rows grouped by exact equality (clients a rule cannot tell apart)."""
    groups: dict[bytes, list[int]] = {}
    for i, row in enumerate(updates.detach().cpu() + 0):  # + 0 turns −0.0 into 0.0
        groups.setdefault(row.numpy().tobytes(), []).append(i)
    return list(groups.values())


def _declares(defense: Any, attr: str) -> bool:
    """A ClassVar/property flag, conjoined over a pipeline's stages."""
    own = bool(getattr(defense, attr, True))
    stages = getattr(defense, "stages", None)
    if isinstance(stages, tuple):
        return own and all(_declares(s, attr) for s in stages)
    return own


def _check_defense_case(plugin: Defense, label: str, case: DefenseCase | None, updates: "torch.Tensor",
                        ctx: Any, where: str, tally: K.Tally, consensus_norm: float) -> None:
    import torch

    n, d = updates.shape
    seed = case.seed if case is not None else 0
    g0 = getattr(ctx, "generator", None)
    gen_state = g0.get_state() if g0 is not None else None

    def fresh(c: Any) -> Any:  # the same context with a generator in the starting state
        if gen_state is None:
            return c
        return dataclasses.replace(c, generator=K.regenerate(g0, gen_state))

    dec = _decide(plugin, label, updates, ctx, where, "the call", tally)
    if dec is K.REFUSED:
        return
    again = _decide(plugin, label, updates, fresh(ctx), where, "a second call", None)
    _same_decision(label, dec, again, where, "the call")
    # next round: its own state back (with fresh updates when the kit built the input)
    nxt = case.updates(device=updates.device, seed_offset=1) if case is not None else updates
    if case is not None:
        ctx2 = case.context(nxt, state=dict(dec.state), round=1, previous=dec.aggregate.detach().clone())
    else:
        ctx2 = dataclasses.replace(ctx, state=dict(dec.state), round=ctx.round + 1)
    d2 = _decide(plugin, label, nxt, fresh(ctx2), where, "round 2 with its own Decision.state", None)
    d3 = _decide(plugin, label, nxt, fresh(ctx2), where, "round 2 again", None)
    _same_decision(label, d2, d3, where, "round 2 with its own Decision.state")
    tol = K.TOLERANCE.get(K.dtype_name(updates), 1e-4)
    if _declares(plugin, "symmetric") and n > 1:
        perm = torch.randperm(n, generator=generator(seed + 7))
        w = getattr(ctx, "weights", None)
        ids = tuple(getattr(ctx, "client_ids", ()) or ())
        ctx_p = dataclasses.replace(
            fresh(ctx), weights=None if w is None else w[perm.to(w.device)],
            client_ids=tuple(ids[i] for i in perm.tolist()) if len(ids) == n else ids)
        up = updates[perm.to(updates.device)]
        dp = _decide(plugin, label, up, ctx_p, where, f"the call on clients permuted by {perm.tolist()}", None)
        scale = float(updates.abs().max()) if updates.numel() else 0.0
        if not K.close(dp.aggregate, dec.aggregate, tol, scale):
            K.fail(label, K.P_PERMUTATION, f"permuting the clients by {perm.tolist()} moved the aggregate by "
                   f"{K.max_gap(dp.aggregate, dec.aggregate):.3g} (tolerance {tol:g} × {scale:.3g})", where)
        back = torch.empty_like(dp.accepted)
        back[perm.to(back.device)] = dp.accepted
        for group in _tie_groups(updates):
            if int(back[group].sum()) != int(dec.accepted[group].sum()):
                K.fail(label, K.P_PERMUTATION, f"permuting the clients by {perm.tolist()} changed who is accepted: "
                       f"{dec.accepted.tolist()} became {back.tolist()} (mapped back to the original order)", where)
    if _declares(plugin, "symmetric") and _declares(plugin, "unanimity"):
        row = updates[0].to(torch.float64) if n else torch.zeros(d, dtype=torch.float64, device=updates.device)
        if not bool(torch.isfinite(row).all()) or float(row.norm()) == 0.0:
            row = torch.ones(d, dtype=torch.float64, device=updates.device)
        x = (row * (consensus_norm / float(row.norm()))).to(updates.dtype) if d else row.to(updates.dtype)
        same_rows = x.expand(max(n, 1), d).clone()
        ctx_i = make_server_context(same_rows, seed, weights=getattr(case, "weights", "random"),
                                    previous=x.clone(), target=x, client_ids="positions")
        di = _decide(plugin, label, same_rows, ctx_i, where, f"{max(n, 1)} identical rows x", None)
        if not K.close(di.aggregate, x, tol, consensus_norm):
            K.fail(label, K.P_IDENTITY, f"{max(n, 1)} copies of x = {x.tolist()} aggregated to "
                   f"{di.aggregate.tolist()} (declare `unanimity = False` if changing that is the rule's point)",
                   where)
    tally.ok("decide")


def check_defense(
    defense: Any,
    /,
    *,
    params: Mapping[str, Any] | None = None,
    max_examples: int = 10,
    n: Any = (1, 10),
    d: Any = (1, 12),
    dtypes: Sequence[Any] = ("float32", "float64"),
    device: "torch.device | str" = "cpu",
    updates: "torch.Tensor | None" = None,
    ctx: Any = None,
    consensus_norm: float = 1e-2,
    derandomize: bool = True,
) -> ContractReport:
    """Check the defense contracts (module docstring) and return what was covered.

    ``defense``: a registry name, a :class:`~redteam.types.Defense` subclass (built with
    ``params``) or an instance (a :class:`~redteam.pipeline.Pipeline` too). Generated
    inputs: ``n`` clients, ``d`` coordinates, each of ``dtypes``, on ``device``.
    ``updates`` (with an optional ``ctx``; default :meth:`ServerContext.default`) checks
    that one input only.
    """
    from redteam.types import ServerContext

    plugin, label = _resolve(defense, params, "defense", Defense)
    tally = K.Tally()

    def body(case: DefenseCase) -> None:
        u = case.updates(device=device)
        _check_defense_case(plugin, label, case, u, case.context(u), f"{case!r} (rebuild: .updates(), "
                            f".context(updates))", tally, consensus_norm)

    if updates is not None:
        c = ctx if ctx is not None else ServerContext.default(updates)
        _check_defense_case(plugin, label, None, updates, c, "the given updates", tally, consensus_norm)
    else:
        from .strategies import defense_cases

        _run(defense_cases(n, d, dtype=tuple(dtypes)), body, max_examples, derandomize)
    tally.require(label, ["decide"], "Pass inputs it accepts (n=, d=, or updates= / ctx=) or params= it can "
                                     "work with.")
    props = [K.P_DECLARATION, K.P_SHAPE, K.P_FINITE, K.P_MUTATION, K.P_DETERMINISTIC, K.P_STATE]
    not_checked: list[tuple[str, str]] = []
    if _declares(plugin, "symmetric"):
        props.append(K.P_PERMUTATION)
        if _declares(plugin, "unanimity"):
            props.append(K.P_IDENTITY)
        else:
            not_checked.append((K.P_IDENTITY, "declares unanimity = False"))
    else:
        not_checked += [(K.P_PERMUTATION, "declares symmetric = False"), (K.P_IDENTITY, "declares symmetric = False")]
    return ContractReport(plugin=label, examples=tally.done.get("decide", 0), checked=tuple(props),
                          not_checked=tuple(not_checked), refused=tally.refused())
