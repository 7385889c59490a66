"""Turn validated scenario specs into live objects (defense pipelines, codecs, attacks)."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import InvalidParameter
from ..pipeline import Pipeline
from ..registry import ATTACKS, DEFENSES, WORKLOADS
from ..types import Attack, Defense

# the scenario's specs (redteam.scenario's PluginSpec, HierarchySpec, TransportSpec) are read by
# their fields; this module does not import the scenario module, which imports it
PluginSpec = HierarchySpec = TransportSpec = Any

__all__ = ["build_defense", "build_upper_defense", "build_attack", "build_workload", "build_compressor",
           "needs_server_data"]


def build_defense(specs: "Sequence[PluginSpec] | PluginSpec", n_malicious: int | None = None,
                  most_updates: int | None = None) -> Defense:
    """One spec → that defense; several → a :class:`~redteam.pipeline.Pipeline`.

    A defense class may list in ``from_malicious_count`` the fields that default to the
    scenario's malicious count (trimmed mean's ``b``, DnC's ``f``); when ``n_malicious`` is
    given, each such field the spec leaves unset is filled with it before the defense is built
    (or with ``cls.value_from_malicious_count(field, n_malicious)`` where the class defines
    that rule: RLR's θ = f + 1).

    ``most_updates`` is the most updates one call can ever see (the federation's client
    count; an upper merge node's fan-out). A stage with a ``check_capacity(most)`` method
    is asked whether its parameters can be met by any such round, so that a setting no
    round can satisfy (RLR's θ above the client count) is refused before the run starts,
    not half-way through it; rounds smaller than that (churn, stragglers) are the
    defense's to handle."""
    if not isinstance(specs, (list, tuple)):
        specs = (specs,)
    stages = [DEFENSES.create(s.name, _with_malicious_count(s, n_malicious)) for s in specs]
    for s, st in zip(specs, stages):
        if not isinstance(st, Defense):
            raise InvalidParameter(f"defense {s.name!r} is not a redteam.Defense (got {type(st).__name__})")
        if most_updates is not None:
            st.check_capacity(int(most_updates))
    if len(stages) == 1:
        return stages[0]
    return Pipeline(tuple(stages))


def build_upper_defense(hierarchy: "HierarchySpec", n_malicious: int | None = None) -> Defense:
    """The defense of the merge levels above the bottom groups (``[hierarchy] upper_defense``).

    An upper node aggregates the sub-aggregates of at most ``fan_out`` children, not
    clients, so the count that matters to it is how many of its inputs may carry an
    attacker's influence: at most min(f, fan_out) (each attacker sits in one group, and
    a node has at most ``fan_out`` children; with depth 2 the root's children are the
    groups themselves). Fields listed in ``from_malicious_count`` (trimmed mean's ``b``)
    are filled with that count, and with ``depth > 1`` the stages' ``check_capacity`` is
    asked about rounds of ``fan_out`` inputs. Errors say they concern the upper level."""
    f = None if n_malicious is None else min(int(n_malicious), hierarchy.fan_out)
    if hierarchy.depth <= 1:  # flat merge: the upper level never runs
        return build_defense(hierarchy.upper_defense, n_malicious=f)
    try:
        return build_defense(hierarchy.upper_defense, n_malicious=f, most_updates=hierarchy.fan_out)
    except InvalidParameter as exc:
        filled = "" if f is None else f"; unset counts are min(f, fan_out) = {f}"
        raise InvalidParameter(f"[hierarchy].upper_defense (merges at most fan_out = {hierarchy.fan_out} "
                               f"sub-aggregates{filled}): {exc}") from None


def _with_malicious_count(spec: "PluginSpec", n_malicious: int | None) -> dict:
    params = dict(spec.params)
    if n_malicious is None:
        return params
    cls = DEFENSES.get(spec.name)
    if not (isinstance(cls, type) and issubclass(cls, Defense)):
        return params  # refused by build_defense, naming it
    for name in cls.from_malicious_count:
        if params.get(name) is None:
            params[name] = int(cls.value_from_malicious_count(name, int(n_malicious)))
    return params


def build_attack(spec: "PluginSpec") -> Attack:
    atk = ATTACKS.create(spec.name, spec.params)
    if not isinstance(atk, Attack):
        raise InvalidParameter(f"attack {spec.name!r} is not a redteam.Attack (got {type(atk).__name__})")
    return atk


def build_workload(name: str, params: dict) -> object:
    """The workload ``name``; one that is not a :class:`~redteam.workloads.base.Workload` is refused
    by name (the engine reads the attributes that base declares: ``input_kind``, ``image_shape``)."""
    from ..workloads.base import Workload

    wl = WORKLOADS.create(name, params)
    if not isinstance(wl, Workload):
        raise InvalidParameter(f"workload {name!r} is not a redteam.workloads.base.Workload (got {type(wl).__name__}); "
                               "subclass it (docs/plugins.md)")
    return wl


def build_compressor(spec: "TransportSpec") -> object:
    from ..transport.compression import Compressor, make_codec

    codec = make_codec(spec.codec, **dict(spec.codec_params))
    return Compressor(codec=codec, error_feedback=spec.error_feedback)


def needs_server_data(*defenses: Defense) -> bool:
    """Whether any stage of these defenses reads the server's root data (their declared
    ``uses_server_data``)."""
    return any(stage.uses_server_data for d in defenses for stage in d.parts())
