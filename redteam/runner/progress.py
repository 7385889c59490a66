"""Progress as plain lines, for when stderr is not a terminal (CI logs, ``2> file``).

A live progress bar needs a terminal; in a log it prints nothing until the end. There
:class:`PlainProgress` writes one line at most every ``interval`` seconds (default 5, or
``REDTEAM_PROGRESS_S``) and always for the last step::

    redteam: matrix 12/48 runs, 0:00:31 elapsed, ETA 0:01:33, just finished: mean[ipm] seed 0

The ETA (:class:`Eta`, also the terminal's progress bar's) extrapolates the rate of the steps
done *in this process* (a resumed matrix's earlier runs do not count as fast ones), counted from
the end of the first of them: the first step also pays what the process pays once (imports,
compiled kernels, data, a warm-up), which made the first estimate twice the real time and more.
``ETA ?`` until :data:`ETA_AFTER` steps have finished after that first one (with parallel
workers the first ones finish together).
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Callable, TextIO

__all__ = ["Eta", "PlainProgress", "progress_interval"]

#: steps finished after the first one before an ETA is given
ETA_AFTER = 2


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


class Eta:
    """The remaining time of ``total`` steps from ``update(done)`` calls (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.start: int | None = None  # steps done when this process began
        self.anchor: tuple[float, int] | None = None  # (when, done) at the first step finished here

    def update(self, done: int) -> None:
        if self.start is None:
            self.start = done
        elif self.anchor is None and done > self.start:
            self.anchor = (self.clock(), done)

    def text(self, done: int, total: int) -> str:
        """``ETA 0:01:10``, ``ETA 0:00:00`` when all are done, or ``ETA ?`` (too few steps yet)."""
        if done >= total:
            return "ETA 0:00:00"
        if self.anchor is None or done - self.anchor[1] < ETA_AFTER:
            return "ETA ?"
        rate = (self.clock() - self.anchor[0]) / (done - self.anchor[1])
        return f"ETA {_clock(rate * (total - done))}"


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
        self.eta = Eta(clock)
        self.last_print: float | None = None
        self.last_done = -1

    def update(self, done: int, total: int, label: str) -> None:
        from .outputs import terminal_safe

        now = self.clock()
        self.eta.update(done)
        finished_one = done > self.last_done and self.last_done >= 0
        self.last_done = done
        due = self.last_print is None or now - self.last_print >= self.interval
        if not (done >= total or (finished_one and due)):
            return
        elapsed = now - self.t0
        line = (f"redteam: {self.what} {done}/{total} {self.unit}, {_clock(elapsed)} elapsed, "
                f"{self.eta.text(done, total)}, "
                f"just finished: {terminal_safe(label)}")
        print(line, file=self.stream or sys.stderr, flush=True)
        self.last_print = now
