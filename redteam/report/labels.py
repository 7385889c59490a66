"""Labels the report writers share: a settings group's title and an axis' short name.

Kept apart from :mod:`redteam.report.tables` and :mod:`redteam.report.defender` so that
both can use them without importing each other.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["group_title", "short_key"]


def short_key(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def group_title(settings: Sequence[tuple[str, Any]]) -> str:
    """``malicious_fraction=0.25, alpha=0.5`` (empty for the matrix without settings)."""
    return ", ".join(f"{short_key(k)}={v}" for k, v in settings)
