"""redteam inside a Flower app (``pip install "redteam[flower]"``; Flower ≥ 1.42, its message API).

* :class:`DefenseStrategy` (:mod:`.strategy`): any registered redteam defense as a Flower
  strategy, with its memory across rounds and its rejections in Flower's metrics;
* :class:`AttackMod` (:mod:`.attack`): a client mod that makes the chosen clients (by
  ``partition-id``) send a redteam update attack's crafted update, and applies a data attack
  through :func:`poison`, one line in the ClientApp's data loading;
* :class:`ColludingAttack` (:mod:`.attack`): a server-side stand-in for colluding attackers that
  see every honest update of the round (omniscient attacks such as ALIE), around any Flower
  strategy, for simulations;
* a user's own app scored by ``redteam matrix``: a scenario's ``[flower] app = "module:attribute"``
  names a factory following :mod:`.protocol` (:class:`AppSpec` → :class:`ScoredApp`), which
  :class:`FlowerRun` (:mod:`.run`) runs on an engine of :mod:`.engine`.

Flower is imported only when one of these names is first used (``import redteam`` never imports
it). The guide is docs/flower.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DefenseStrategy", "FlowerRound", "AttackMod", "ColludingAttack", "poison", "flatten", "unflatten",
           "layout_of", "AppSpec", "ScoredApp", "FlowerRun", "LocalGrid"]

_WHERE = {
    "DefenseStrategy": "strategy", "FlowerRound": "strategy",
    "AttackMod": "attack", "ColludingAttack": "attack", "poison": "attack",
    "flatten": "_records", "unflatten": "_records", "layout_of": "_records",
    "FlowerRun": "run", "LocalGrid": "engine",
}
#: names that need no Flower (the app protocol)
_PLAIN = {"AppSpec": "protocol", "ScoredApp": "protocol"}


def __getattr__(name: str) -> Any:
    if name in _PLAIN:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_PLAIN[name]}"), name)
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import flwr  # noqa: F401
    except ImportError as exc:
        raise ImportError("redteam.integrations.flower needs Flower: pip install \"redteam[flower]\" "
                          "(flwr[simulation]>=1.42)") from exc
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
