"""Run one scenario: its attack and defense, and its no-attack baseline with the same seed.

The JSON document this module produces is a stable, documented interface (docs/running.md,
"The JSON output")::

    {
      "format": "redteam.run/v1",
      "scenario": {"name", "file", "seed", "digest", "spec"},
      "versions": {"redteam", "torch", "python"},
      "device": "cpu",
      "runs": [
        {"attack": "none", "defense": "...", "baseline": true,
         "metrics": {"final_accuracy", "accuracy_drop", "bytes_on_wire", "dropped_updates", ...},
         "malicious": [client ids], "start": {"start_from_sha256", "warmup_sha256"},
         "rounds": [{"round", "accuracy", "loss", ...}, ...]},
        {"attack": "sign_flip", ... "baseline": false, ...}
      ]
    }

Each run also says whether its model was destroyed: ``"model_destroyed"`` is ``true``
when its loss is non-finite (NaN/inf, written ``null``) from some round to the end, or a
round was flagged ``model_nonfinite`` (:func:`redteam.report.aggregate.model_broke`, the
rule reports use); ``"model_destroyed_round"`` is the first round (1-based, as
``rounds_to_target``) of that, ``null`` when the model survived. ``"start"`` gives the SHA-256
of the model the run started from (:func:`redteam.federation.warmup.start_digests`: the
``start_from`` file's, the warm-up file's; ``{}`` from the initialisation).

Language-model metrics (:data:`~redteam.scoring.LANGUAGE_MODEL_METRICS`: bits per byte,
perplexity, their increases, the false-trigger and near-miss trigger rates) are in ``metrics`` only when the
workload is a language model (its class says ``input_kind = "tokens"``, e.g. ``text``);
a classifier's run (``digits``, ``synthetic``) leaves them out: they would be functions of
a cross-entropy over classes, not bits per byte of anything. Each round lists ``notes``:
what a defense said it had to give up in that round (:func:`redteam.merge.degradation_notes`,
e.g. a trimmed mean trimming less in a round thinned by churn); empty in most rounds.
"""

from __future__ import annotations

import json
import math
import platform
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..errors import InvalidParameter, InvalidScenario
from ..scenario import PluginSpec, Scenario
from ..scoring import summarize
from ..types import RoundRecord
from .outputs import sanitize

__all__ = ["run_scenario", "write_json", "sanitize", "FORMAT", "model_destroyed_round"]

FORMAT = "redteam.run/v1"


def _versions() -> dict[str, str]:
    import torch

    from .. import __version__

    return {"redteam": __version__, "torch": torch.__version__, "python": platform.python_version()}


def _round_dict(r: RoundRecord) -> dict[str, Any]:
    return {
        "round": r.round,
        "accuracy": r.accuracy,
        "loss": r.loss if math.isfinite(r.loss) else None,
        "accepted": r.accepted,
        "participating": r.participating,
        "dropped": {str(k): v for k, v in r.dropped.items()},
        "rejected": {str(k): v for k, v in r.rejected.items()},
        "bytes_on_wire": r.bytes_on_wire,
        "sim_time_s": r.sim_time_s,
        "wall_time_s": r.wall_time_s,
        "defense_time_s": r.defense_time_s,
        "notes": r.defense_notes,
    }


def model_destroyed_round(records: Sequence[RoundRecord]) -> int | None:
    """The first round (1-based) from which a run's model is destroyed, ``None`` if it
    was not: a round flagged ``model_nonfinite``, else, when the last round's loss is
    non-finite, the first of the rounds up to the end whose loss is non-finite (the
    rule of :func:`redteam.report.aggregate.model_broke`)."""
    from ..report.aggregate import MODEL_NONFINITE

    for r in records:
        if r.extra.get(MODEL_NONFINITE):
            return r.round + 1
    if not records or math.isfinite(records[-1].loss):
        return None
    k = len(records) - 1
    while k > 0 and not math.isfinite(records[k - 1].loss):
        k -= 1
    return records[k].round + 1


def run_scenario(
    scenario: Scenario,
    *,
    device: str = "cpu",
    on_round: Callable[[str, RoundRecord], None] | None = None,
    threads: str | int | None = None,
) -> dict[str, Any]:
    """Run the baseline (attack ``none``) and, unless the scenario's attack is ``none``,
    the attacked federation; return the JSON-ready document. ``threads``: the intra-op
    thread policy (:mod:`.threads`)."""
    from ..federation.regimes import make_run
    from ..federation.warmup import start_digests
    from .threads import run_threads

    target = scenario.federation.target_accuracy
    runs: list[tuple[str, Any]] = []
    with plugin_errors_located(scenario, scenario.source or "scenario"):
        baseline = make_run(scenario, device=device, attack=PluginSpec("none"))
        with run_threads(baseline, threads):
            b_res = baseline.run(on_round=(lambda r: on_round("baseline", r)) if on_round else None)
        runs.append(("baseline", b_res))
        attacked_res = None
        if scenario.attack.name != "none":
            fed = make_run(scenario, device=device)
            with run_threads(fed, threads):
                attacked_res = fed.run(on_round=(lambda r: on_round("attacked", r)) if on_round else None)
            runs.append(("attacked", attacked_res))

    kind_of_input = getattr(baseline.workload, "input_kind", None)
    is_lm = kind_of_input == "tokens" if isinstance(kind_of_input, str) else None
    out_runs = []
    for kind, res in runs:
        metrics = summarize(res.records, b_res.records, target_accuracy=target,
                            last_k=scenario.federation.last_k, is_language_model=is_lm,
                            after_k=scenario.window.after_k, lifespan_threshold=scenario.window.lifespan_threshold)
        destroyed = model_destroyed_round(res.records)
        out_runs.append(
            {
                "attack": res.attack,
                "attack_params": dict(scenario.attack.params) if kind == "attacked" else {},
                "defense": res.defense,
                "baseline": kind == "baseline",
                "metrics": metrics,
                "model_destroyed": destroyed is not None,
                "model_destroyed_round": destroyed,
                "malicious": res.malicious,
                "start": start_digests(res.records[0].extra.get("start") if res.records else None),
                "wall_time_s": res.wall_time_s,
                "rounds": [_round_dict(r) for r in res.records],
            }
        )
    return {
        "format": FORMAT,
        "scenario": {
            "name": scenario.name,
            "file": scenario.source,
            "seed": scenario.seed,
            "digest": scenario.digest(),
            "spec": scenario.to_dict(),
        },
        "versions": _versions(),
        "device": str(baseline.device),
        "dataset": getattr(baseline, "dataset_source", ""),
        "runs": out_runs,
    }


def plugin_section(exc: Exception, scenario: Scenario) -> str | None:
    """The scenario section whose plugin raised ``exc`` (a parameter error that only shows
    once the run knows n, e.g. ``TrimmedMean.b = 100: must satisfy 2b < n``): found from
    the class name the message starts with; ``None`` if no plugin of the scenario has it."""
    from ..registry import ATTACKS, DEFENSES

    head = str(exc).split(" ", 1)[0]
    if "." not in head:
        return None
    cls = head.split(".", 1)[0]

    def named(reg: Any, spec: PluginSpec) -> bool:
        try:
            return reg.get(spec.name).__name__ == cls
        except Exception:  # noqa: BLE001 - an unknown plugin simply does not match
            return False

    if named(ATTACKS, scenario.attack):
        return "[attack]"
    for i, spec in enumerate(scenario.defense):
        if named(DEFENSES, spec):
            return "[defense]" if len(scenario.defense) == 1 else f"[defense].pipeline[{i}]"
    if named(DEFENSES, scenario.hierarchy.upper_defense):
        return "[hierarchy].upper_defense"
    return None


@contextmanager
def plugin_errors_located(scenario: Scenario, where: str) -> Iterator[None]:
    """Re-raise a plugin's :class:`InvalidParameter` as :class:`InvalidScenario` naming
    ``where`` (the file, or the matrix cell) and the section of the plugin."""
    try:
        yield
    except InvalidParameter as exc:
        section = plugin_section(exc, scenario)
        if section is None:
            raise
        raise InvalidScenario(f"{where}: {section}: {exc}") from None


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    """Write atomically and safely (unpredictable temp file in the target's directory,
    then rename), so an interrupted write loses nothing old and no planted symlink is
    followed; an unwritable path is an :class:`~redteam.runner.outputs.OutputError`."""
    from .outputs import atomic_write_text

    return atomic_write_text(path, json.dumps(sanitize(doc), indent=2, allow_nan=False) + "\n", option="--json")


