"""The contracts every attack and defense plugin must pass: ``check_attack``, ``check_defense``.

Both take a registry name (``"krum"``), a plugin class, or an instance, and by default
run ``max_examples`` generated inputs through hypothesis (``derandomize``: ``True`` the same
inputs every run, ``False`` fresh ones, ``None`` whatever the loaded hypothesis settings
profile says, fresh ones unless a profile sets ``derandomize``; a failure prints the input's
reproduce line). ``check_defense``
also runs a fixed list of degenerate inputs every time (:data:`DEGENERATE`: n = 1,
d = 1, all-zero rows, identical rows, rows near the dtype's overflow, NaN/±Inf rows). Given an explicit input (``ctx=`` / ``data=`` for an attack,
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
* ``tamper_chunks``: a list of :class:`~redteam.types.ChunkDelivery` with bytes data;
  deterministic; the context unmodified.
* ``forge_provenance``, called as the trainer calls it (the curator's manifest of the
  clean data; ``ctx.state`` with the client, the shards it trains on after its own
  ``poison_data``, and a keyring holding what its ``capabilities`` grant): a
  ``DatasetManifest`` or a ``Presentation``; deterministic (keys and signatures are);
  the manifest and the context unmodified.
* ``choose_identity``: a non-empty name, the same on every call; ``tamper_subaggregate``:
  a ``(d,)`` partial aggregate like the one given, finite from finite, deterministic,
  inputs unmodified.
* ``craft_gossip`` (``Surface.GOSSIP``), on a gossip graph's view of one honest node
  (:func:`~redteam.testing.builders.make_gossip_context`, or one with the given ctx's sizes):
  one model per Byzantine neighbour, ``(len(attackers), d)`` in the models' dtype and
  device; finite from finite unless ``produces_nonfinite``; no tensor of the context
  modified; the same messages from a generator in the same state and a fresh memory.

Defenses:

* the :class:`~redteam.types.Decision`: aggregate ``(d,)`` in the updates' dtype and
  device, ``accepted`` a bool ``(n,)`` mask, ``weights`` absent or ``(n,)``, every key of
  ``reasons`` a rejected client index; finite aggregate from finite updates (rows near
  the dtype's overflow included: a rule may refuse with a redteam error instead);
* rows with a NaN/±Inf entry are not accepted and each has a reason, and the aggregate
  stays finite while any row is finite (unless the class declares
  ``screens_nonfinite = False``, leaving that to a filter before it);
* deterministic under the seed; no mutation of the updates or the context;
* feeding ``Decision.state`` back as next round's ``ctx.state`` works;
* when ``symmetric``: permuting the clients (rows, weights, ids together) leaves the
  aggregate unchanged up to rounding and permutes ``accepted`` with them (up to ties
  between identical rows);
* when ``symmetric`` and ``unanimity``: n copies of one update x give x. This is
  checked on a small x (‖x‖ = ``consensus_norm``, inside any sensible norm bound or
  clipping radius) in a world that agrees with it: the server's root update is x,
  its loss is lowest at x, the previous update is x.

Every plugin is also checked as a declaration: a frozen dataclass that rebuilds equal
from its own fields (its parameters re-validate), and an attack lists the surface of
every hook it overrides (else the trainer would never call it). A plugin that cannot
handle an input raises a :class:`~redteam.errors.RedteamError` naming the parameter
and the bound; such refusals are counted and listed in the report, any other exception
is a failure, and a plugin that refuses every generated input fails with what it said.

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

from redteam.types import Attack, AttackContext, ClientData, Defense, Surface

from . import _attack_checks as A
from . import _checks as K
from . import _defense_checks as D
from .builders import AttackCase, DefenseCase

if TYPE_CHECKING:
    import torch


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
        params = dict(params or {})
        for name in getattr(registry.get(obj), "from_malicious_count", ()):
            params.setdefault(name, 1)  # a scenario fills these with its malicious count; stand in f = 1
        plugin = registry.create(obj, params)
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


def _run(strategy: Any, body: Callable[[Any], None], max_examples: int, derandomize: bool | None) -> None:
    from hypothesis import HealthCheck, given, settings

    if derandomize is None:  # the loaded profile's (a test suite's conftest may pin it)
        derandomize = bool(settings.default.derandomize)
    from hypothesis.control import currently_in_test_context

    if currently_in_test_context():
        raise TypeError("check_attack / check_defense called inside a @given test without an input: pass the one "
                        "to check (ctx= / data= / updates=, drawn with redteam.testing.strategies) instead of "
                        "letting the kit run hypothesis inside hypothesis")

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(case: Any) -> None:
        body(case)

    run()


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
    derandomize: bool | None = None,
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
    # an attack whose ``surfaces`` is a property computes them (e.g. ``compose`` from its
    # parts); it overrides every hook as a pass-through, so only the listed ones must act
    dynamic = isinstance(getattr(type(plugin), "surfaces", None), property)
    for hook, surface in A.HOOKS:
        if not dynamic and A.overrides(plugin, hook) and surface not in surfaces:
            K.fail(label, K.P_SURFACES, f"overrides {hook} but `surfaces` = {surfaces} lacks {surface!r}, so the "
                   "trainer never calls it", repr(plugin))
    hooks = [h for h, s in A.HOOKS if h == "craft_updates" or A.overrides(plugin, h) or s in surfaces]
    omni = bool(getattr(plugin, "omniscient", False)) if omniscient is None else bool(omniscient)
    adaptive = bool(getattr(plugin, "adaptive", False))
    needs_model = bool(getattr(plugin, "needs_model", False))
    dfn = None
    if adaptive:
        dfn = _default_defense() if defense is None else (DEFENSES.create(defense) if isinstance(defense, str)
                                                          else defense)
    tally = K.Tally()

    def body(case: AttackCase) -> None:
        where = f"{case!r} (rebuild: .context(omniscient={omni}, model={needs_model}), .data())"
        c = case.context(device=device, omniscient=omni, defense=dfn, num_classes=num_classes, model=needs_model)
        if "craft_updates" in hooks:
            A.check_updates(plugin, label, c, where, tally)
        if "poison_data" in hooks:
            cd = case.data(device=device, sample_shape=sample_shape, num_classes=num_classes)
            A.check_data(plugin, label, cd, c.malicious[0], case.seed, num_classes, where, tally)
        if "tamper_chunks" in hooks:
            A.check_transport(plugin, label, c, case.seed, where, tally)
        if "forge_provenance" in hooks:
            cd = case.data(device=device, sample_shape=sample_shape, num_classes=num_classes)
            A.check_provenance(plugin, label, c, cd, case.seed, where, tally)
        if "choose_identity" in hooks:
            A.check_identity(plugin, label, c, 2 + case.seed % 3, where, tally)
        if "tamper_subaggregate" in hooks:
            A.check_subaggregate(plugin, label, c, where, tally)
        for stage_hook in ("tamper_activation", "tamper_gradient"):
            if stage_hook in hooks:
                A.check_stage(plugin, label, stage_hook, case.seed, where, tally)
        if "tamper_stage_update" in hooks:
            A.check_stage_update(plugin, label, case.seed, where, tally)
        if "craft_gossip" in hooks:
            A.check_gossip(plugin, label, case.gossip(device=device), f"{case!r} (rebuild: .gossip())", tally)

    if ctx is not None or data is not None:
        hooks = [h for h in hooks if (data is not None if h == "poison_data" else ctx is not None)]
        if ctx is not None:  # the caller's generator is not advanced: the checks use a copy
            ctx = dataclasses.replace(ctx, generator=K.regenerate(ctx.generator, ctx.generator.get_state()))
        for h in hooks:
            if h == "craft_updates":
                A.check_updates(plugin, label, ctx, "the given ctx", tally)
            elif h == "poison_data":
                A.check_data(plugin, label, data, 0, 0, num_classes, "the given data", tally)
            elif h == "tamper_chunks":
                A.check_transport(plugin, label, ctx, 0, "the given ctx", tally)
            elif h == "forge_provenance":
                clean = data if data is not None else AttackCase(0, 1, 1, 1).data(device=ctx.own_updates.device,
                                                                                 sample_shape=sample_shape,
                                                                                 num_classes=num_classes)
                A.check_provenance(plugin, label, ctx, clean, 0, "the given ctx", tally)
            elif h == "choose_identity":
                A.check_identity(plugin, label, ctx, 4, "the given ctx", tally)
            elif h in ("tamper_activation", "tamper_gradient"):
                A.check_stage(plugin, label, h, 0, "the given ctx", tally)
            elif h == "tamper_stage_update":
                A.check_stage_update(plugin, label, 0, "the given ctx", tally)
            elif h == "craft_gossip":
                from .builders import make_gossip_context

                own = ctx.own_updates
                g = make_gossip_context(0, ctx.n_clients, len(ctx.malicious), int(own.shape[1]), dtype=own.dtype,
                                        device=own.device)
                A.check_gossip(plugin, label, g, f"make_gossip_context(0, {ctx.n_clients}, {len(ctx.malicious)}, "
                               f"{int(own.shape[1])}) (the given ctx's sizes)", tally)
            else:
                A.check_subaggregate(plugin, label, ctx, "the given ctx", tally)
    else:
        from .strategies import attack_cases

        _run(attack_cases(n, f, d, dtype=tuple(dtypes)), body, max_examples, derandomize)
    tally.require(label, hooks, "Pass inputs it accepts (n=, f=, d=, num_classes=, sample_shape=, or ctx= / "
                                "data=) or params= it can work with.")
    props = [K.P_DECLARATION, K.P_SURFACES, K.P_SHAPE, K.P_DETERMINISTIC, K.P_MUTATION]
    not_checked: list[tuple[str, str]] = []
    observes = getattr(plugin, "observes", "")
    if observes == "model":  # a membership observer: its scores on a small world (redteam.testing.membership)
        from .membership import check_membership_attack

        check_membership_attack(plugin)
        props.append("membership_scores")
    elif observes == "update":
        not_checked.append(("reconstruct", "an inversion's quality is judged by its tests, not by a contract"))
    if getattr(plugin, "produces_nonfinite", False):
        not_checked.append((K.P_FINITE, "declares produces_nonfinite = True"))
    else:
        props.append(K.P_FINITE)
    if "poison_data" in hooks:
        props.append(K.P_LABELS)
    for h, s in A.HOOKS:
        if h not in hooks:
            not_checked.append((h, "identity: not overridden, surface not declared"))
    return ContractReport(plugin=f"{label} [{', '.join(hooks)}]", examples=max(tally.done.values(), default=0),
                          checked=tuple(props), not_checked=tuple(not_checked), refused=tally.refused())


# ---------------------------------------------------------------------- defenses
#: the degenerate defense inputs every ``check_defense`` run includes
DEGENERATE: tuple[DefenseCase, ...] = (
    DefenseCase(seed=1, n=1, d=1),
    DefenseCase(seed=2, n=1, d=7, finite=False),
    DefenseCase(seed=3, n=9, d=1, kind="duplicates"),
    DefenseCase(seed=4, n=6, d=5, kind="zero", weights=None),
    DefenseCase(seed=5, n=7, d=4, kind="identical", dtype="float64"),
    DefenseCase(seed=6, n=8, d=3, kind="huge"),
    DefenseCase(seed=7, n=11, d=6, kind="huge", dtype="float64", weights="equal"),
    DefenseCase(seed=8, n=9, d=5, finite=False),
    DefenseCase(seed=9, n=12, d=3, kind="huge", finite=False, client_ids="positions"),
    DefenseCase(seed=10, n=10, d=16, kind="outlier", scale=1e30),
)


def check_defense(
    defense: Any,
    /,
    *,
    params: Mapping[str, Any] | None = None,
    max_examples: int = 10,
    n: Any = (1, 16),
    d: Any = (1, 64),
    dtypes: Sequence[Any] = ("float32", "float64"),
    device: "torch.device | str" = "cpu",
    updates: "torch.Tensor | None" = None,
    ctx: Any = None,
    permutation: Sequence[int] | None = None,
    consensus_norm: float = 1e-2,
    derandomize: bool | None = None,
    degenerate: bool = True,
) -> ContractReport:
    """Check the defense contracts (module docstring) and return what was covered.

    ``defense``: a registry name, a :class:`~redteam.types.Defense` subclass (built with
    ``params``) or an instance (a :class:`~redteam.pipeline.Pipeline` too). Generated
    inputs: ``n`` clients, ``d`` coordinates, each of ``dtypes``, on ``device``.
    ``degenerate`` adds the fixed :data:`DEGENERATE` inputs (those within ``dtypes``).
    ``updates`` (with an optional ``ctx``; default :meth:`ServerContext.default`) checks
    that one input only; its permuted copy has row ``permutation[j]`` at position j
    (default: a random n-cycle, so every client moves). ``consensus_norm`` is ‖x‖ in
    the identity check.
    """
    from redteam.types import ServerContext

    plugin, label = _resolve(defense, params, "defense", Defense)
    tally = K.Tally()

    def body(case: DefenseCase) -> None:
        u = case.updates(device=device)
        where = f"{case!r} (rebuild: .updates(), .context(updates))"
        D.check_case(plugin, label, case, u, case.context(u), where, tally, consensus_norm)

    if updates is not None:
        c = ctx if ctx is not None else ServerContext.default(updates)
        if getattr(c, "generator", None) is not None:  # leave the caller's generator where it was
            c = dataclasses.replace(c, generator=K.regenerate(c.generator, c.generator.get_state()))
        D.check_case(plugin, label, None, updates, c, "the given updates", tally, consensus_norm, permutation)
    else:
        from .strategies import defense_cases

        if degenerate:
            names = {str(t).removeprefix("torch.") for t in dtypes}
            for case in DEGENERATE:
                if case.dtype in names:
                    body(case)
        _run(defense_cases(n, d, dtype=tuple(dtypes)), body, max_examples, derandomize)
    tally.require(label, ["decide"], "Pass inputs it accepts (n=, d=, or updates= / ctx=) or params= it can "
                                     "work with.")
    props = [K.P_DECLARATION, K.P_SHAPE, K.P_FINITE, K.P_MUTATION, K.P_DETERMINISTIC, K.P_STATE]
    not_checked: list[tuple[str, str]] = []
    if D.declares(plugin, "screens_nonfinite"):
        props.append(K.P_NONFINITE)
    else:
        not_checked.append((K.P_NONFINITE, "declares screens_nonfinite = False"))
    if D.declares(plugin, "symmetric"):
        props.append(K.P_PERMUTATION)
        if D.declares(plugin, "unanimity"):
            props.append(K.P_IDENTITY)
        else:
            not_checked.append((K.P_IDENTITY, "declares unanimity = False"))
    else:
        not_checked += [(K.P_PERMUTATION, "declares symmetric = False"), (K.P_IDENTITY, "declares symmetric = False")]
    return ContractReport(plugin=label, examples=tally.done.get("decide", 0), checked=tuple(props),
                          not_checked=tuple(not_checked), refused=tally.refused())
