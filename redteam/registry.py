"""Plugin registries over entry points, lazy, validated, with clear errors.

Three groups: ``redteam.attacks``, ``redteam.defenses``, ``redteam.workloads``.
Built-ins register through the same entry points as third-party packages, so there
is exactly one way in. Nothing is imported until a plugin is asked for by name.

>>> import redteam
>>> redteam.defense("norm_bound", bound=1.0)            # doctest: +SKIP
NormBound(bound=1.0, multiplier=None, mode='reject')
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import types
import typing
import weakref
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal, Mapping

from .errors import InvalidParameter, UnknownPlugin

__all__ = [
    "ATTACKS",
    "DEFENSES",
    "WORKLOADS",
    "Registry",
    "PluginInfo",
    "attack",
    "defense",
    "workload",
]


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """What ``redteam attacks list`` shows about one plugin."""

    name: str
    target: str  # "module:attr"
    distribution: str  # the package that provides it
    summary: str
    reference: str
    parameters: tuple[tuple[str, str, Any], ...]  # (name, type, default)


#: the entry points found, per group, with what they were found under (:func:`_scan_key`)
_SCANNED: dict[str, Any] = {"key": None, "groups": {}}


def _scan_key() -> tuple[tuple[str, int | None], ...]:
    """What the installed distributions are looked up in: each ``sys.path`` entry with its
    modification time (installing or removing a package changes the directory it goes in)."""
    out = []
    for p in sys.path:
        try:
            out.append((p, os.stat(p or ".").st_mtime_ns))
        except OSError:
            out.append((p, None))
    return tuple(out)


def entry_points(group: str) -> tuple[metadata.EntryPoint, ...]:
    """``importlib.metadata.entry_points(group=group)``, scanned again only when ``sys.path`` or
    a directory on it changed: a scan reads every installed distribution's metadata (about 20 ms
    here), and collecting the shipped scenarios asked for one 87 times."""
    key = _scan_key()
    if _SCANNED["key"] != key:
        _SCANNED["key"], _SCANNED["groups"] = key, {}
    groups = _SCANNED["groups"]
    if group not in groups:
        groups[group] = tuple(metadata.entry_points(group=group))
    return groups[group]


class Registry:
    """One entry-point group. Lookups are lazy; loaded classes are cached."""

    def __init__(self, group: str, kind: str) -> None:
        self.group = group
        self.kind = kind
        self._loaded: dict[str, type] = {}
        self._extra: dict[str, type] = {}

    # -- discovery -----------------------------------------------------------------
    def _entry_points(self) -> dict[str, metadata.EntryPoint]:
        found: dict[str, metadata.EntryPoint] = {}
        for ep in entry_points(self.group):
            found.setdefault(ep.name, ep)
        return found

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(set(self._entry_points()) | set(self._extra))

    def register(self, name: str, cls: type) -> None:
        """Register a class at run time (tests, notebooks). Entry points are preferred."""
        self._extra[name] = cls
        self._loaded.pop(name, None)

    def unregister(self, name: str) -> None:
        self._extra.pop(name, None)
        self._loaded.pop(name, None)

    def get(self, name: str) -> type:
        """The plugin class registered as ``name``; unknown names list close matches."""
        if not isinstance(name, str):
            raise UnknownPlugin(f"{self.kind} name must be a string, got {name!r}")
        if name in self._extra:
            return self._extra[name]
        if name in self._loaded:
            return self._loaded[name]
        eps = self._entry_points()
        if name not in eps:
            raise UnknownPlugin(self._unknown_message(name, list(eps) + list(self._extra)))
        try:
            cls = eps[name].load()
        except Exception as exc:  # a broken third-party package must not look like ours
            raise UnknownPlugin(
                f"{self.kind} {name!r} is registered by {eps[name].value!r} but failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._loaded[name] = cls
        return cls

    def _unknown_message(self, name: str, known: list[str]) -> str:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        listing = ", ".join(sorted(known)) or "none registered"
        return f"unknown {self.kind} {name!r}{hint} (known: {listing})"

    def create(self, name: str, params: Mapping[str, Any] | None = None, *, where: str = "") -> Any:
        """Instantiate ``name`` with ``params``, validating names and basic types.

        ``where`` prefixes error messages (e.g. ``"smoke.toml: [attack]"``).
        """
        cls = self.get(name)
        params = dict(params or {})
        prefix = f"{where} " if where else ""
        if not dataclasses.is_dataclass(cls):
            try:
                return cls(**params)
            except TypeError as exc:
                raise InvalidParameter(f"{prefix}{self.kind} {name!r}: {exc}") from exc
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        for key in params:
            if key not in fields:
                close = difflib.get_close_matches(key, list(fields), n=2, cutoff=0.5)
                hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
                allowed = ", ".join(fields) or "none"
                raise InvalidParameter(
                    f"{prefix}{self.kind} {name!r} has no parameter {key!r}{hint} (parameters: {allowed})"
                )
        hints = _type_hints(cls)
        coerced = {k: _coerce(v, hints.get(k, Any), f"{prefix}{self.kind} {name!r}: parameter {k!r}")
                   for k, v in params.items()}
        try:
            return cls(**coerced)
        except InvalidParameter as exc:
            raise InvalidParameter(f"{prefix}{exc}") from None

    def info(self, name: str) -> PluginInfo:
        cls = self.get(name)
        ep = self._entry_points().get(name)
        dist = ""
        if ep is not None and getattr(ep, "dist", None) is not None:
            dist = ep.dist.name
        params: list[tuple[str, str, Any]] = []
        if dataclasses.is_dataclass(cls):
            hints = _type_hints(cls)
            for f in dataclasses.fields(cls):
                if not f.init:
                    continue
                if f.default is not dataclasses.MISSING:
                    default = f.default
                elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                    default = f.default_factory()  # type: ignore[misc]
                else:
                    default = "<required>"
                params.append((f.name, _type_name(hints.get(f.name, Any)), default))
        doc = (cls.__doc__ or "").strip().splitlines()
        summary = getattr(cls, "summary", "") or (doc[0] if doc else "")
        return PluginInfo(
            name=name,
            target=ep.value if ep is not None else f"{cls.__module__}:{cls.__qualname__}",
            distribution=dist or "(registered at run time)",
            summary=summary,
            reference=getattr(cls, "reference", ""),
            parameters=tuple(params),
        )


#: a plugin class's resolved annotations: ``typing.get_type_hints`` re-evaluates every string
#: annotation of the class and its bases on each call (most of a matrix plan's time went there),
#: and a class's annotations do not change once it is defined (weak keys: a class defined in a
#: test goes away with it)
_HINTS: "weakref.WeakKeyDictionary[type, dict[str, Any]]" = weakref.WeakKeyDictionary()


def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)`` (read-only; {} when they cannot be resolved), once per class."""
    hints = _HINTS.get(cls)
    if hints is None:
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            hints = {}
        _HINTS[cls] = hints
    return hints


def _type_name(tp: Any) -> str:
    if tp is Any:
        return "any"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, what: str) -> Any:
    """Check ``value`` against the simple annotation ``tp``; widen int→float, list→tuple."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, what)
            except InvalidParameter as exc:
                errors.append(str(exc))
        raise InvalidParameter(f"{what} = {value!r}: expected {_type_name(tp)}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise InvalidParameter(
                f"{what} = {value!r}: must be one of {', '.join(repr(a) for a in allowed)}"
            )
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise InvalidParameter(f"{what} = {value!r}: expected a list")
        args = typing.get_args(tp)
        if args and (len(args) == 2 and args[1] is Ellipsis):
            items = [_coerce(v, args[0], what) for v in value]
        elif args and len(args) == len(value):
            items = [_coerce(v, a, what) for v, a in zip(value, args)]
        else:
            items = list(value)
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise InvalidParameter(f"{what} = {value!r}: expected a table")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise InvalidParameter(f"{what} = {value!r}: expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidParameter(f"{what} = {value!r}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidParameter(f"{what} = {value!r}: expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise InvalidParameter(f"{what} = {value!r}: expected a string")
        return value
    return value


ATTACKS = Registry("redteam.attacks", "attack")
DEFENSES = Registry("redteam.defenses", "defense")
WORKLOADS = Registry("redteam.workloads", "workload")


def attack(name: str, **params: Any) -> Any:
    """Build the attack registered as ``name``: ``redteam.attack("sign_flip", variant="mean")``."""
    return ATTACKS.create(name, params)


def defense(name: str, **params: Any) -> Any:
    """Build the defense registered as ``name``: ``redteam.defense("norm_bound", bound=2.0)``.

    A defense is callable on a plain ``(n, d)`` tensor and returns a :class:`Decision`.
    """
    return DEFENSES.create(name, params)


def workload(name: str, **params: Any) -> Any:
    """Build the workload registered as ``name``: ``redteam.workload("digits")``."""
    return WORKLOADS.create(name, params)
