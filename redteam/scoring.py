"""Every metric, defined once. The scorer reads only :class:`~redteam.types.RoundRecord` lists.

Definitions (also in the README's "Metrics" section):

* ``final_accuracy`` / ``final_loss``: clean test accuracy and loss after the last round.
* ``accuracy_drop``: baseline final accuracy − attacked final accuracy (same seed and
  settings, attack ``none``); positive = the attack hurt.
* ``rounds_to_target``: the first round (1-based) whose accuracy reaches the target;
  ``None`` if never. ``slowdown``: attacked rounds_to_target − baseline's (``None``
  if either never reaches it).
* detection, counted over (round, client) pairs whose update was *judged*: the client
  took part and its update reached a check (a defense, a chunk-digest or decoding
  check); stragglers and churned clients are not judged. A judged update is *flagged*
  when it was not accepted. Positives are malicious clients. ``precision`` =
  TP/(TP+FP), ``recall`` = TP/(TP+FN), ``f1``, ``fpr`` = FP/(FP+TN). Undefined ratios
  (0/0) are ``None``.
* ``bytes_on_wire``: every byte transmitted in all rounds (payloads, retries, manifests).
* ``dropped_updates``: updates that never reached aggregation (any reason).
* ``wall_time_per_round_s``, ``defense_time_per_round_s``, ``sim_time_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .types import RoundRecord

__all__ = [
    "final_accuracy",
    "final_loss",
    "accuracy_drop",
    "rounds_to_target",
    "detection",
    "Detection",
    "summarize",
]


def final_accuracy(records: Sequence[RoundRecord]) -> float:
    return records[-1].accuracy if records else float("nan")


def final_loss(records: Sequence[RoundRecord]) -> float:
    return records[-1].loss if records else float("nan")


def accuracy_drop(attacked: Sequence[RoundRecord], baseline: Sequence[RoundRecord]) -> float:
    return final_accuracy(baseline) - final_accuracy(attacked)


def rounds_to_target(records: Sequence[RoundRecord], target: float) -> int | None:
    for r in records:
        if r.accuracy >= target:
            return r.round + 1
    return None


@dataclass(frozen=True, slots=True)
class Detection:
    tp: int
    fp: int
    tn: int
    fn: int

    @staticmethod
    def _ratio(a: int, b: int) -> float | None:
        return a / b if b else None

    @property
    def precision(self) -> float | None:
        return self._ratio(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> float | None:
        return self._ratio(self.tp, self.tp + self.fn)

    @property
    def fpr(self) -> float | None:
        return self._ratio(self.fp, self.fp + self.tn)

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if p is None or r is None or p + r == 0:
            return None if (p is None or r is None) else 0.0
        return 2 * p * r / (p + r)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp, "fp": self.fp, "tn": self.tn, "fn": self.fn,
            "precision": self.precision, "recall": self.recall, "f1": self.f1, "fpr": self.fpr,
        }


def detection(records: Sequence[RoundRecord]) -> Detection:
    tp = fp = tn = fn = 0
    for r in records:
        for i, (part, mal, acc) in enumerate(zip(r.participating, r.malicious, r.accepted)):
            if not part:
                continue
            judged = acc or i in r.rejected
            if not judged:
                continue
            flagged = not acc
            if mal and flagged:
                tp += 1
            elif mal:
                fn += 1
            elif flagged:
                fp += 1
            else:
                tn += 1
    return Detection(tp, fp, tn, fn)


def _clean(x: float | None) -> float | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None if x is None or math.isnan(x) else x
    return x


def summarize(
    records: Sequence[RoundRecord],
    baseline: Sequence[RoundRecord] | None = None,
    *,
    target_accuracy: float = 0.9,
) -> dict[str, Any]:
    """The metrics of one run (and its comparison with a baseline run, if given)."""
    det = detection(records)
    n = max(len(records), 1)
    rtt = rounds_to_target(records, target_accuracy)
    out: dict[str, Any] = {
        "final_accuracy": final_accuracy(records),
        "final_loss": _clean(final_loss(records)),
        "rounds_to_target": rtt,
        "target_accuracy": target_accuracy,
        "bytes_on_wire": sum(r.bytes_on_wire for r in records),
        "dropped_updates": sum(len(r.dropped) for r in records),
        "rejected_updates": sum(len(r.rejected) for r in records),
        "detection": det.as_dict(),
        "wall_time_per_round_s": sum(r.wall_time_s for r in records) / n,
        "defense_time_per_round_s": sum(r.defense_time_s for r in records) / n,
        "sim_time_s": sum(r.sim_time_s for r in records),
    }
    if baseline is not None:
        out["accuracy_drop"] = accuracy_drop(records, baseline)
        b_rtt = rounds_to_target(baseline, target_accuracy)
        out["slowdown_rounds"] = (rtt - b_rtt) if (rtt is not None and b_rtt is not None) else None
    return out
