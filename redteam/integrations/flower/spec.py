"""``[flower]``: a scenario that scores a user's own Flower app (no Flower import here).

A scenario with a ``[flower]`` section runs each matrix cell in Flower: the app named by
``app = "module:attribute"`` (a factory that follows :mod:`.protocol`) gives the ClientApp, the
initial model and the server-side evaluation; redteam puts the cell's attack in the ClientApp's
mods (and, for an omniscient attack, a colluding stand-in around the server's strategy) and the
cell's defense in the ServerApp's strategy: a redteam defense wrapped as
:class:`~redteam.integrations.flower.DefenseStrategy`, or one of Flower's own strategies named
``"flower:<Name>"`` (:data:`BUILTINS`). This module holds the section's spec and the checks the
scenario parser runs on it; :mod:`.run` runs it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

__all__ = ["FlowerSpec", "BUILTINS", "FEDERATION_KEYS", "SCENARIO_KEYS", "check_document", "check_builtin",
           "is_builtin", "APP_REF"]

#: ``module:attribute``: a dotted module path and a dotted attribute path in it
APP_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _app_ok(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= 300 and bool(APP_REF.match(v))


@dataclass(frozen=True, slots=True)
class FlowerSpec:
    """``[flower]``: ``app``, the factory ``module:attribute`` (the module is imported with the
    scenario file's directory first on ``sys.path``); ``engine``, where the ClientApps run:
    ``"local"`` (in this process, one after another: deterministic, no Ray) or ``"ray"`` (Flower's
    simulation engine, ``flwr.simulation.run_simulation``, on ``ray_cpus`` CPUs); ``params``, the
    app's own settings, handed to the factory as they are."""

    app: str = field(default="", metadata={"check": _app_ok, "expect": 'must be "module:attribute" (e.g. '
                                                                     '"quickstart_app:scored")'})
    engine: Literal["local", "ray"] = "local"
    ray_cpus: int = field(default=2, metadata={"check": lambda v: isinstance(v, int) and 1 <= v <= 1024,
                                               "expect": "must be an integer in [1, 1024]"})
    params: Mapping[str, Any] = field(default_factory=dict)


def _beta_ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 0.5


#: Flower's own strategies a defense entry may name as ``"flower:<Name>"``: their parameters, each
#: with its check and what it expects. These rules keep every reply (they merge coordinate-wise), so
#: a run records every participating client as accepted; Flower's Krum, MultiKrum and Bulyan select
#: replies without reporting which, and are not offered (redteam's own ``krum``, ``multi_krum`` and
#: ``bulyan`` run wrapped, with their selections recorded).
BUILTINS: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "FedAvg": {},
    "FedMedian": {},
    "FedTrimmedAvg": {"beta": (_beta_ok, "must be a number in [0, 0.5)")},
}

#: the ``[federation]`` keys a Flower scenario reads; the app decides everything else about training
FEDERATION_KEYS = ("clients", "malicious_fraction", "rounds", "target_accuracy", "last_k")
#: the ``[scenario]`` keys a Flower scenario reads
SCENARIO_KEYS = ("name", "seed", "description", "requires")
#: sections that describe what a Flower app itself decides (its data, model, transport)
_NOT_READ = {"workload": "the app loads its own data and model", "transport": "Flower carries the updates",
             "hierarchy": "one Flower server aggregates", "privacy": "the app's evaluation scores accuracy only"}


def is_builtin(name: str) -> bool:
    return name.startswith("flower:")


def check_builtin(name: str, params: Mapping[str, Any], file: str) -> str | None:
    """Why defense ``name`` (``"flower:<Name>"``) with ``params`` is refused, or ``None``."""
    rule = name.split(":", 1)[1]
    if rule not in BUILTINS:
        return (f"{file}: [defense].name = {name!r}: not one of Flower's strategies redteam runs "
                f"({', '.join('flower:' + b for b in BUILTINS)})")
    allowed = BUILTINS[rule]
    for key, value in params.items():
        if key not in allowed:
            return (f"{file}: [defense] {name}: unknown parameter {key!r} "
                    f"(it takes {', '.join(allowed) or 'none'})")
        ok, expect = allowed[key]
        if not ok(value):
            return f"{file}: [defense] {name}: {key} = {value!r}: {expect}"
    return None


def check_document(data: Mapping[str, Any], defenses: tuple[Any, ...], file: str) -> str | None:
    """Why a scenario document with ``[flower]`` is refused (a section or key the regime does not
    read, a Flower defense in a pipeline), or ``None``; and a ``"flower:"`` defense without
    ``[flower]``. ``defenses``: the parsed ``[defense]`` stages."""
    flower = "flower" in data
    builtin = [d.name for d in defenses if is_builtin(d.name)]
    if builtin and not flower:
        return (f"{file}: [defense].name = {builtin[0]!r} is one of Flower's strategies; it runs in a scenario with "
                "a [flower] section (a Flower app)")
    if not flower:
        return None
    if builtin and len(defenses) > 1:
        return (f"{file}: [defense].pipeline: {builtin[0]!r} is a whole Flower strategy; it cannot be a stage of a "
                "pipeline")
    for section, why in _NOT_READ.items():
        if section in data:
            return f"{file}: [{section}] does not apply to a [flower] scenario ({why}); remove it"
    for section, keys in (("federation", FEDERATION_KEYS), ("scenario", SCENARIO_KEYS)):
        table = data.get(section)
        if isinstance(table, Mapping):
            extra = [k for k in table if k not in keys]
            if extra:
                return (f"{file}: [{section}].{extra[0]} does not apply to a [flower] scenario (the app decides its "
                        f"training; it reads [{section}] {', '.join(keys)}); set it in the app or in [flower].params")
    return None
