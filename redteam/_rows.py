"""Row screens shared by the engine and the defenses."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["finite_rows"]


def finite_rows(updates: "torch.Tensor") -> "torch.Tensor":
    """Bool mask ``(n,)``: rows whose every entry is finite.

    A row sum is non-finite whenever an entry is NaN/±Inf (or the sum overflows), so
    one fast reduction screens every row and only the flagged rows are checked entry
    by entry (``torch.isfinite`` over the whole matrix is ~25× slower on CPU).
    """
    import torch

    ok = torch.isfinite(updates.sum(dim=1))
    if not bool(ok.all()):
        flagged = (~ok).nonzero().flatten()
        ok[flagged] = torch.isfinite(updates.index_select(0, flagged)).all(dim=1)
    return ok
