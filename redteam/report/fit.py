"""Terminal tables that never lose a number.

Rich shrinks a table that is wider than the terminal by cutting cell text down to ``…``,
which in our tables means "not run yet". :func:`fit_tables` prevents that: every value
column is at least as wide as its widest value (values never wrap or shrink), headers
wrap onto several lines instead, and when the columns still do not fit they are
*stacked*: split into several tables, each repeating the row-label columns. As a last
resort (a single value wider than the terminal) text folds onto the next line; it is
never replaced by an ellipsis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

__all__ = ["FitColumn", "fit_tables", "table_width"]

Justify = Literal["left", "right", "center"]

# rich's default box: one vertical rule per column plus the closing one, one space of
# padding on each side of every cell
_PER_COLUMN = 3
_EDGE = 1


@dataclass(frozen=True, slots=True)
class FitColumn:
    """A column: its header (plain text, may wrap), alignment and style."""

    header: str
    justify: Justify = "right"
    style: str | None = None


def _cell_len(cell: Any) -> int:
    from rich.cells import cell_len
    from rich.text import Text

    text = cell.plain if isinstance(cell, Text) else str(cell)
    return max((cell_len(line) for line in text.split("\n")), default=0)


def _longest_word(text: str) -> int:
    from rich.cells import cell_len

    return max((cell_len(w) for w in text.split()), default=0)


def _needs(columns: Sequence[FitColumn], rows: Sequence[Sequence[Any]]) -> list[tuple[int, int, int]]:
    """Per column: (width of its widest value, width with the header wrapped at words,
    width with the header on one line)."""
    out = []
    for j, col in enumerate(columns):
        value = max((_cell_len(r[j]) for r in rows), default=0)
        out.append((value, max(value, _longest_word(col.header), 1), max(value, _cell_len(col.header), 1)))
    return out


def table_width(needs: Sequence[int]) -> int:
    """Width of a table whose columns need ``needs`` cells each."""
    return _EDGE + sum(n + _PER_COLUMN for n in needs)


def fit_tables(
    width: int,
    columns: Sequence[FitColumn],
    rows: Sequence[Sequence[Any]],
    *,
    keep: int = 1,
    **table_kwargs: Any,
) -> list[tuple[tuple[int, int] | None, Any]]:
    """One or more rich tables showing ``rows`` within ``width`` cells.

    The first ``keep`` columns (row labels) appear in every table. Returns
    ``[(span, table)]``: ``span`` is ``None`` when one table holds every column, else
    ``(first, last)``, the 1-based positions of the other columns that table shows.
    """
    from rich.table import Table
    from rich.text import Text

    needs = _needs(columns, rows)
    fixed = list(range(min(keep, len(columns))))
    rest = list(range(len(fixed), len(columns)))
    base = table_width([needs[j][1] for j in fixed])
    groups: list[list[int]] = []
    current: list[int] = []
    used = base
    for j in rest:
        w = needs[j][1] + _PER_COLUMN
        if current and used + w > width:
            groups.append(current)
            current, used = [], base
        current.append(j)
        used += w
    if current or not groups:
        groups.append(current)
    out = []
    for group in groups:
        shown = fixed + group
        # headers wrap only as much as needed: the room left goes to unwrapping them
        widths = {j: needs[j][1] for j in shown}
        slack = width - table_width(list(widths.values()))
        for j in shown:
            extra = max(0, min(slack, needs[j][2] - widths[j]))
            widths[j] += extra
            slack -= extra
        t = Table(**table_kwargs)
        for j in shown:
            col = columns[j]
            t.add_column(Text(col.header), justify=col.justify, style=col.style, min_width=needs[j][0],
                         max_width=max(widths[j], needs[j][0]), overflow="fold", no_wrap=False)
        for r in rows:
            t.add_row(*[r[j] for j in fixed + group])
        span = None if len(groups) == 1 else (group[0] - len(fixed) + 1, group[-1] - len(fixed) + 1) if group \
            else (0, 0)
        out.append((span, t))
    return out
