"""The table ``redteam run`` prints: one row per run (the baseline, then the attacked run).

A terminal too narrow for every column gets the columns stacked, attack and defense
repeated (:mod:`redteam.report.fit`); no value is ever cut to ``…``. Every label is text,
never markup.
"""

from __future__ import annotations

from typing import Any

__all__ = ["print_run_table"]


def _plain(text: object) -> Any:
    from rich.text import Text

    from ..runner.outputs import terminal_safe

    return Text(terminal_safe(text))


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.1%}" if pct else f"{v:.3f}"
    return str(v)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def print_run_table(console: Any, doc: dict[str, Any]) -> None:
    """One row per run; a terminal too narrow for every column gets the columns stacked
    (attack and defense repeated), never a value cut to ``…``."""
    from .fit import FitColumn, fit_tables

    sc = doc["scenario"]
    spec = sc["spec"]
    fed = spec["federation"]
    title = (
        f"{sc['name']} — {spec['workload']['name']}, {fed['clients']} clients "
        f"({len(doc['runs'][-1]['malicious'])} malicious), {fed['rounds']} rounds, seed {sc['seed']}"
    )
    columns = [FitColumn(col, "left" if col in ("attack", "defense") else "right")
               for col in ("attack", "defense", "final acc", "acc drop", f"rounds→{fed['target_accuracy']:.0%}",
                           "bytes on wire", "dropped", "rejected", "detect P / R", "FPR")]
    rows = []
    for run in doc["runs"]:
        m = run["metrics"]
        rows.append([_plain(v) for v in (
            run["attack"] + (" (baseline)" if run["baseline"] else ""),
            run["defense"],
            _fmt(m["final_accuracy"], pct=True),
            _fmt(m.get("accuracy_drop"), pct=True) if not run["baseline"] else "—",
            _fmt(m["rounds_to_target"]),
            _bytes(m["bytes_on_wire"]),
            str(m["dropped_updates"]),
            str(m["rejected_updates"]),
            f"{_fmt(m['precision'])} / {_fmt(m['recall'])}",
            _fmt(m["fpr"]),
        )])
    console.print(_plain(title))
    for _, t in fit_tables(console.width, columns, rows, keep=2):
        console.print(t)
