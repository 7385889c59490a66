"""What a Flower app gives redteam to be scored by a matrix (``[flower] app = "module:attribute"``).

The attribute is a factory, called once per run with an :class:`AppSpec`::

    def scored(spec: AppSpec) -> ScoredApp: ...

``spec`` carries the run's federation size (``clients`` partitions, ``rounds``), its ``seed`` (a
matrix cell's seed: the attacked run and its no-attack baseline get the same one, so the app must
draw its data split, its initial model and its clients' minibatches from it alone) and
``params`` (``[flower].params``, as written). The :class:`ScoredApp` it returns holds

* ``client_app(mods)``: the app's ``flwr.clientapp.ClientApp`` built with ``mods`` first in its
  mods (``ClientApp(mods=[*mods, ...])``); partition ``context.node_config["partition-id"]`` of
  ``num-partitions`` trains on its share, and calls
  :func:`~redteam.integrations.flower.poison` on the training data it loaded (a data attack's
  poisoned set on a chosen client, the data unchanged elsewhere). Its reply carries one
  ``ArrayRecord`` (the trained model) and one ``MetricRecord`` with ``num-examples``, as in
  Flower's quickstarts;
* ``initial_arrays``: the ``flwr.app.ArrayRecord`` of the model round 1 starts from;
* ``evaluate(arrays)``: the global model's ``{"accuracy": …, "loss": …}`` on the app's held-out
  test split (run by the server after every round, and on ``initial_arrays`` for the untrained
  reference the reports read);
* ``chance_accuracy`` (optional): the majority-class rate of that test split (what a model that
  ignores its input scores; the defender's summary reads it);
* ``train_config`` (optional): what the server's training messages carry besides
  ``server-round`` (Flower's ``train_config``).

:func:`load_app` imports the factory. Nothing here imports Flower.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ...errors import InvalidParameter

__all__ = ["AppSpec", "ScoredApp", "load_app"]


@dataclass(frozen=True, slots=True)
class AppSpec:
    """One run's settings for a scored Flower app (module docstring)."""

    clients: int
    rounds: int
    seed: int
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ScoredApp:
    """What a scored Flower app returns (module docstring)."""

    client_app: Callable[[Sequence[Any]], Any]
    initial_arrays: Any
    evaluate: Callable[[Any], Mapping[str, float]]
    chance_accuracy: float | None = None
    train_config: Mapping[str, Any] = field(default_factory=dict)


def load_app(ref: str, base_dir: str | Path = "") -> Callable[[AppSpec], ScoredApp]:
    """The factory ``ref`` (``"module:attribute"``), its module imported with ``base_dir`` (the
    scenario file's directory) first on ``sys.path``; a reference that does not resolve to a
    callable is refused naming what was missing."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise InvalidParameter(f'[flower].app = {ref!r}: expected "module:attribute"')
    added = str(Path(base_dir).resolve()) if base_dir else None
    if added is not None:
        sys.path.insert(0, added)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        where = f" (looked in {added!r} and on sys.path)" if added else ""
        raise InvalidParameter(f"[flower].app = {ref!r}: cannot import module {module_name!r}{where}: {exc}") from None
    finally:
        if added is not None and added in sys.path:
            sys.path.remove(added)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise InvalidParameter(f"[flower].app = {ref!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise InvalidParameter(f"[flower].app = {ref!r}: {attr!r} is a {type(target).__name__}, expected a factory "
                               "(a function of an AppSpec returning a ScoredApp)")
    return target
