"""Progress as plain lines, for when stderr is not a terminal (CI logs, ``2> file``).

A live progress bar needs a terminal; in a log it prints nothing until the end. There
:class:`PlainProgress` writes one line at most every ``interval`` seconds (default 5, or
``REDTEAM_PROGRESS_S``) and always for the last step::

    redteam: matrix 12/48 runs, 0:00:31 elapsed, ETA 0:01:33, just finished: mean[ipm] seed 0

The ETA extrapolates the rate of the steps done *in this process* (a resumed matrix's
earlier runs do not count as fast ones); ``ETA ?`` until one step has finished.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Callable, TextIO

__all__ = ["PlainProgress", "progress_interval"]


def progress_interval() -> float:
    """Seconds between lines: ``REDTEAM_PROGRESS_S`` (a number ≥ 0), else 5."""
    raw = os.environ.get("REDTEAM_PROGRESS_S", "")
    try:
        v = float(raw)
    except ValueError:
        return 5.0
    return v if math.isfinite(v) and v >= 0 else 5.0


def _clock(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class PlainProgress:
    """``update(done, total, label)`` prints a line when due (see the module docstring)."""

    def __init__(self, what: str, unit: str, *, interval: float | None = None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from .outputs import terminal_safe

        self.what = terminal_safe(what)
        self.unit = unit
        self.interval = progress_interval() if interval is None else interval
        self.stream = stream
        self.clock = clock
        self.t0 = clock()
        self.first_done: int | None = None
        self.last_print: float | None = None
        self.last_done = -1

    def update(self, done: int, total: int, label: str) -> None:
        from .outputs import terminal_safe

        now = self.clock()
        if self.first_done is None:
            self.first_done = done
        finished_one = done > self.last_done and self.last_done >= 0
        self.last_done = done
        due = self.last_print is None or now - self.last_print >= self.interval
        if not (done >= total or (finished_one and due)):
            return
        elapsed = now - self.t0
        ran = done - self.first_done
        eta = "ETA ?" if ran <= 0 else f"ETA {_clock(elapsed / ran * max(0, total - done))}"
        line = (f"redteam: {self.what} {done}/{total} {self.unit}, {_clock(elapsed)} elapsed, {eta}, "
                f"just finished: {terminal_safe(label)}")
        print(line, file=self.stream or sys.stderr, flush=True)
        self.last_print = now
