"""The table ``redteam run`` prints: one row per run (the baseline, then the attacked run).

A terminal too narrow for every column gets the columns stacked, attack and defense
repeated (:mod:`redteam.report.fit`); no value is ever cut to ``…``. Every label is text,
never markup. A run whose model was destroyed (its ``model_destroyed``: a non-finite loss
to the end) reads ``model destroyed (non-finite loss from round k)`` in place of its final
accuracy: that number describes a broken model. A defense that flagged no update in any run
(tp + fp = 0) reads ``n/a (does not reject)`` for detection, as in the matrix report: a recall
of 0 would call a rule that never rejects a miss.
"""

from __future__ import annotations

from typing import Any

__all__ = ["flags_nothing", "print_run_table"]


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


def _final_accuracy(run: dict[str, Any]) -> str:
    if run.get("model_destroyed"):
        k = run.get("model_destroyed_round")
        return f"model destroyed (non-finite loss from round {k})" if k else "model destroyed (non-finite loss)"
    return _fmt(run["metrics"]["final_accuracy"], pct=True)


def _is_language_model(doc: dict[str, Any]) -> bool:
    """The runs carry bits per byte only when the workload is a language model (the JSON leaves
    the language-model metrics out for a classifier)."""
    return any(r.get("metrics", {}).get("final_bits_per_byte") is not None for r in doc.get("runs", ()))


def _quality_cells(run: dict[str, Any], lm: bool) -> tuple[str, str, str]:
    """(quality, change from baseline, rounds to target) in the workload's own metric: accuracy
    for a classifier, bits per byte for a language model (lower is better)."""
    m = run["metrics"]
    if not lm:
        return (_final_accuracy(run), _fmt(m.get("accuracy_drop"), pct=True) if not run["baseline"] else "—",
                _fmt(m["rounds_to_target"]))
    bpb = "model destroyed (non-finite loss)" if run.get("model_destroyed") else _fmt(m.get("final_bits_per_byte"))
    inc = m.get("bits_per_byte_increase")
    change = "—" if run["baseline"] or inc is None else f"{inc:+.3f}"
    return bpb, change, _fmt(m.get("rounds_to_target_loss")) if not run["baseline"] else "—"


def flags_nothing(doc: dict[str, Any]) -> bool:
    """The defense flagged no judged update in any run of ``doc`` (tp + fp = 0 in each, the
    baseline included): it does not reject, so its precision, recall and FPR say nothing
    (the matrix report's rule, :data:`redteam.report.defender.REJECT_RULE`). False when a
    run lacks the counts."""
    runs = doc.get("runs") or ()
    counts = [(r.get("metrics", {}).get("tp"), r.get("metrics", {}).get("fp")) for r in runs]
    return bool(counts) and all(isinstance(tp, int) and isinstance(fp, int) for tp, fp in counts) \
        and all(tp + fp == 0 for tp, fp in counts)


def print_run_table(console: Any, doc: dict[str, Any]) -> None:
    """One row per run; a terminal too narrow for every column gets the columns stacked
    (attack and defense repeated), never a value cut to ``…``. A language model's runs are
    shown in bits per byte (and its increase over the baseline, and the rounds to reach the
    baseline's final loss), a classifier's in accuracy; a backdoor's ASR where one ran."""
    from .fit import FitColumn, fit_tables

    sc = doc["scenario"]
    spec = sc["spec"]
    fed = spec["federation"]
    pl = spec.get("pipeline")
    who = (f"a {pl['stages']}-stage pipeline of {pl['stages'] * pl['peers_per_stage']} peers"
           if isinstance(pl, dict) else f"{fed['clients']} clients")
    title = (
        f"{sc['name']} — {spec['workload']['name']}, {who} "
        f"({len(doc['runs'][-1]['malicious'])} malicious), {fed['rounds']} rounds, seed {sc['seed']}"
    )
    lm = _is_language_model(doc)
    asr = any(r["metrics"].get("asr") is not None for r in doc["runs"])
    quality = (("bits/byte ↓", "Δ bits/byte", "rounds→baseline loss") if lm
               else ("final acc", "acc drop", f"rounds→{fed['target_accuracy']:.0%}"))
    names = ("attack", "defense", *quality, *(("ASR",) if asr else ()), "bytes on wire", "dropped", "rejected",
             "detect P / R", "FPR")
    columns = [FitColumn(col, "left" if col in ("attack", "defense") else "right") for col in names]
    from .defender import NO_REJECT

    silent = flags_nothing(doc)
    rows = []
    for run in doc["runs"]:
        m = run["metrics"]
        rows.append([_plain(v) for v in (
            run["attack"] + (" (baseline)" if run["baseline"] else ""),
            run["defense"],
            *_quality_cells(run, lm),
            *((_fmt(m.get("asr")),) if asr else ()),
            _bytes(m["bytes_on_wire"]),
            str(m["dropped_updates"]),
            str(m["rejected_updates"]),
            NO_REJECT if silent else f"{_fmt(m['precision'])} / {_fmt(m['recall'])}",
            "n/a" if silent else _fmt(m["fpr"]),
        )])
    console.print(_plain(title))
    for _, t in fit_tables(console.width, columns, rows, keep=2):
        console.print(t)
    if silent:
        console.print(_plain(f"{NO_REJECT}: {doc['runs'][-1]['defense']} flagged no update in any run "
                             "(tp + fp = 0), so detection precision, recall and FPR do not apply"))
