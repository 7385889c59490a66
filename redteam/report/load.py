"""Read a results store into a :class:`~redteam.report.aggregate.Report`.

The store is opened only after a read-only look has confirmed it is one (so pointing
``redteam report`` at some other SQLite file never adds tables to it); a missing,
corrupt or empty store, or a row that does not parse, is a one-line
:class:`~redteam.runner.store.StoreError` / :class:`~redteam.report.aggregate.ReportError`.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Mapping, Sequence

from .aggregate import (
    Report,
    ReportError,
    aggregate_cells,
    breakdown,
    check_expectations,
    convergence,
    envelope_utilisation,
    shared_draws,
)

__all__ = ["load_report", "report_from_rows"]


def _json_meta(store: Any, key: str) -> Any:
    raw = store.meta(key)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _check_readonly(db: Path) -> None:
    """Refuse, without writing to it, a file that is not a redteam store."""
    from ..runner.store import StoreError, check_store_file

    if not db.is_file():
        raise StoreError(f"{db}: no such results store")
    check_store_file(db)


def load_report(
    path: str | Path,
    *,
    confidence: float = 0.95,
    accuracy_margin: float = 0.05,
    asr_level: float = 0.5,
) -> Report:
    """Read the store at ``path`` (a results directory or its ``.sqlite`` file) into a
    :class:`Report`. A missing, corrupt or empty store raises :class:`~redteam.runner.store.StoreError` /
    :class:`ReportError` with a one-line message."""
    from ..runner.store import STORE_NAME, ResultsStore, StoreError

    p = Path(path)
    if not p.exists():
        raise StoreError(f"{p}: no such directory")
    if p.is_dir() and not (p / STORE_NAME).is_file():
        raise StoreError(f"{p}: no results store here (run `redteam matrix SCENARIO --out {p}` first)")
    _check_readonly(p / STORE_NAME if p.is_dir() else p)
    try:
        with ResultsStore(p, create=False, readonly=True) as store:  # a report writes nothing to the store
            rows = store.results(with_rounds=True)
            meta = {k: _json_meta(store, k) for k in
                    ("scenario_name", "scenario_file", "scenario_digest", "versions", "reproduce", "scenario_doc",
                     "expectations", "scenario_source")}
            source = store.path
    except sqlite3.Error as exc:
        raise StoreError(f"{p}: corrupt results store ({exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{p}: corrupt results store (unreadable row: {exc})") from None
    if not rows:
        raise ReportError(f"{source}: the store has no planned cells (did `redteam matrix` start?)")
    try:
        return report_from_rows(rows, source=source, meta=meta, confidence=confidence,
                                accuracy_margin=accuracy_margin, asr_level=asr_level)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StoreError(f"{source}: corrupt results store (unexpected content: {exc})") from None


def report_from_rows(
    rows: Sequence[Mapping[str, Any]],
    *,
    source: str | Path = "results.sqlite",
    meta: Mapping[str, Any] | None = None,
    confidence: float = 0.95,
    accuracy_margin: float = 0.05,
    asr_level: float = 0.5,
) -> Report:
    """A :class:`Report` from store rows (``ResultsStore.results(with_rounds=True)``) and the
    store's meta values (``scenario_name``, ``scenario_file``, ``scenario_digest``,
    ``versions``, ``reproduce``, ``scenario_doc``, ``expectations``, ``scenario_source``: the file
    as written; all optional)."""
    from .defender import defender_summary

    meta = dict(meta or {})
    source = Path(source)
    cells = aggregate_cells(rows, confidence=confidence)
    exps = meta.get("expectations")

    def text(key: str) -> str | None:
        v = meta.get(key)
        return v if isinstance(v, str) else None

    src = meta.get("scenario_source")
    written = src.get("text") if isinstance(src, dict) and isinstance(src.get("text"), str) else None
    return Report(
        source=source,
        scenario_text=written,
        scenario_text_truncated=bool(isinstance(src, dict) and src.get("truncated") is True),
        name=text("scenario_name") or source.parent.name or "results",
        file=text("scenario_file"),
        digest=text("scenario_digest"),
        versions=meta["versions"] if isinstance(meta.get("versions"), dict) else {},
        reproduce=text("reproduce"),
        scenario_doc=meta["scenario_doc"] if isinstance(meta.get("scenario_doc"), dict) else None,
        cells=cells,
        curves=convergence(rows),
        breakdown=breakdown(cells, accuracy_margin=accuracy_margin, asr_level=asr_level),
        envelope=envelope_utilisation(rows),
        expectations=check_expectations(cells, exps if isinstance(exps, list) else []),
        confidence=confidence,
        accuracy_margin=accuracy_margin,
        asr_level=asr_level,
        defenders=defender_summary(rows, cells, confidence=confidence, scenario_doc=meta.get("scenario_doc")),
        shared=shared_draws(rows),
    )
