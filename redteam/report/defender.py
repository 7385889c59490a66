"""The defender's summary: which defense, and at what cost (issue 11 §1).

For every defense of the matrix (per settings group, when the matrix has
``[matrix.settings]`` axes) the summary gives:

* **clean accuracy**: the final test accuracy of its no-attack baseline runs (attack
  ``none``, same defense, settings and seeds), mean over seeds with its interval;
* **cost vs mean**: clean accuracy of plain ``mean`` minus its own (positive = the
  defense costs that much accuracy when nobody attacks; the reference plugin is a
  parameter, default ``mean``, found under its matrix label, e.g. ``{ name = "mean",
  label = "fedavg" }``). Without it in the matrix the column is left out and the report
  says ``cost vs mean: n/a (mean not in the matrix)``;
* **worst case**: the largest seed-mean ``accuracy_drop`` over the matrix's attacks (the
  no-attack cell excluded) and which attack caused it;
* **worst ASR**: the largest seed-mean ``asr`` over the targeted attacks that ran, and which;
* **detection** (only where the rule can reject): the smallest seed-mean ``recall`` and the
  largest seed-mean ``fpr`` over the cells, each with its attack (none named for an FPR of 0).

**Which rules can reject** is decided from the data: a defense none of whose runs in the
matrix (every attack, settings group and seed, the no-attack baselines included) flagged
a single update (``tp + fp = 0`` in every run, so recall and FPR are 0 and precision
undefined, and no round lists a participating client as rejected) does not reject: its
detection figures read ``n/a (does not reject)`` instead of a recall of 0, here and in
the detection grids (``n/a``). Mean, median, trimmed mean and centered clipping fall
there by design (they weigh every update). A rule that flagged anything anywhere keeps
its figures everywhere, a recall of 0 included, because there the 0 is a miss; so does
a pipeline whose integrity checks (signatures, chunks) or non-finite screen rejected an
update. The plugin classes declare nothing that would settle it (``kind`` is
"aggregator" for Krum, which selects, as for the median, which does not; ``mean`` screens
non-finite rows), so the evidence is what the runs did.

**Ranking** (:data:`RANK_RULE`): by worst-case accuracy drop, smallest first; ties
(equal as printed, to 3 decimals) by clean accuracy, highest first; then matrix order.
While a matrix runs, a defense with some attacked cell unfinished (its worst case is only
over the finished ones, marked ``*``) is ranked after the complete ones, and one without
any finished attacked run last; a matrix without attacks ranks by clean accuracy alone.

Everything here is computed once, from the store's rows, by :func:`defender_summary`;
the writers (terminal, Markdown, HTML, JSON) only format it with the helpers below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..scoring import mean_ci
from .aggregate import CellSummary, Stat, _num, _settings

__all__ = [
    "RANK_RULE",
    "REJECT_RULE",
    "NO_REJECT",
    "DefenderRow",
    "DefenderGroup",
    "DefenderSummary",
    "DETECTION_RATES",
    "defender_summary",
    "reference_label",
    "rejects",
    "na_note",
    "defender_columns",
    "defender_notes",
    "defenders_dict",
    "print_defenders",
]

Settings = tuple[tuple[str, Any], ...]

RANK_RULE = ("ranked by worst-case accuracy drop (smallest first); ties (equal to 3 decimals) by clean accuracy "
             "(highest first), then matrix order")
REJECT_RULE = ("n/a (does not reject): no run of that defense in this matrix flagged any update (tp + fp = 0 "
               "everywhere, baselines included), as for aggregators that weigh every update by design")
NO_REJECT = "n/a (does not reject)"
#: Rates that read "n/a" for a defense that does not reject (the tp/fp/tn/fn counts stay as they are).
DETECTION_RATES = frozenset({"precision", "recall", "f1", "fpr"})


@dataclass(frozen=True, slots=True)
class DefenderRow:
    """One defense in one settings group (``None``: undefined or not run yet)."""

    rank: int  # 1 = best by :data:`RANK_RULE`
    defense: str
    clean: Stat  # final accuracy of the no-attack baselines, over seeds
    cost: float | None  # clean(reference) − clean(this); None without a reference
    worst_drop: float | None
    worst_drop_attack: str | None
    worst_asr: float | None
    worst_asr_attack: str | None
    rejects: bool  # some run of this defense flagged an update (see the module doc)
    worst_recall: float | None
    worst_recall_attack: str | None
    worst_fpr: float | None
    worst_fpr_attack: str | None
    attacked: int  # attacked cells (attack ≠ none) with at least one finished seed
    pending: int  # attacked cells with some seed not finished


@dataclass(frozen=True, slots=True)
class DefenderGroup:
    settings: Settings  # empty for a matrix without settings axes
    attacks: tuple[str, ...]  # the matrix's attacks in this group, ``none`` excluded
    targeted: tuple[str, ...]  # those with a defined ASR in some cell
    reference: str | None  # the reference defense label if it is in this group
    rows: tuple[DefenderRow, ...]  # in rank order


@dataclass(frozen=True, slots=True)
class DefenderSummary:
    reference: str  # the defense the cost is measured against ("mean")
    groups: tuple[DefenderGroup, ...]
    non_rejecting: frozenset[str] = field(default_factory=frozenset)

    def rejects(self, defense: str) -> bool:
        """Whether detection figures of ``defense`` mean anything (see the module doc)."""
        return defense not in self.non_rejecting


def rejects(report: Any, defense: str) -> bool:
    """Whether ``defense``'s detection rates mean anything in ``report`` (True without a summary)."""
    summary = getattr(report, "defenders", None)
    return summary is None or summary.rejects(defense)


def na_note(report: Any, metric: str) -> str | None:
    """The one-line legend of ``n/a`` in a ``metric`` grid, when some entry of it reads so."""
    summary = getattr(report, "defenders", None)
    if metric not in DETECTION_RATES or summary is None or not summary.non_rejecting:
        return None
    return f"n/a = the defense does not reject: {', '.join(sorted(summary.non_rejecting))} (see the defender's summary)"


# ------------------------------------------------------------------- computing


def _last_accuracy(rounds: Any) -> float | None:
    recs = [r for r in rounds if isinstance(r, Mapping)] if isinstance(rounds, list) else []
    if not recs:
        return None
    return _num(max(recs, key=lambda r: r.get("round", 0)).get("accuracy"))


def _rounds_flagged(rounds: Any) -> bool:
    """Some participating client was rejected (flagged) in some round."""
    if not isinstance(rounds, list):
        return False
    for r in rounds:
        if not isinstance(r, Mapping) or not r.get("rejected"):
            continue
        part = r.get("participating") or []
        acc = r.get("accepted") or []
        for key in r["rejected"]:
            i = int(key) if str(key).lstrip("-").isdigit() else -1
            if 0 <= i < len(acc) and not acc[i] and (i >= len(part) or part[i]):
                return True
    return False


def _clean_by_seed(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, Settings], dict[Any, float]]:
    """Per (defense, settings), the baseline final accuracy per replicate."""
    out: dict[tuple[str, Settings], dict[Any, float]] = {}
    for r in rows:
        key = (str(r["defense"]), _settings(r["settings"]))
        seed = r.get("replicate", r.get("seed"))
        acc = _last_accuracy(r.get("baseline_rounds"))
        if acc is None and r.get("finished") and isinstance(r.get("metrics"), Mapping):
            # no rounds in the rows: the attacked run's accuracy plus its drop is the baseline's
            fa, drop = _num(r["metrics"].get("final_accuracy")), _num(r["metrics"].get("accuracy_drop"))
            acc = fa + drop if fa is not None and drop is not None else None
        if acc is not None:
            out.setdefault(key, {}).setdefault(seed, acc)
    return out


def _flagged(metrics: Any) -> bool:
    """A run's metrics show at least one flagged update (tp + fp > 0; recall or FPR above 0 and
    a defined precision imply it too, for rows that carry only the rates)."""
    if not isinstance(metrics, Mapping):
        return False
    count = (_num(metrics.get("tp")) or 0) + (_num(metrics.get("fp")) or 0)
    rates = (_num(metrics.get("recall")) or 0) + (_num(metrics.get("fpr")) or 0)
    return count > 0 or rates > 0 or _num(metrics.get("precision")) is not None


def _flagging_defenses(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """The defenses some run of which (attacked or baseline) flagged an update."""
    seen: set[str] = set()
    for r in rows:
        if ((r.get("finished") and _flagged(r.get("metrics"))) or _rounds_flagged(r.get("rounds"))
                or _rounds_flagged(r.get("baseline_rounds"))):
            seen.add(str(r["defense"]))
    return seen


def _extreme(cells: Sequence[CellSummary], metric: str, worst: Callable[[float, float], bool]) -> tuple[
        float | None, str | None]:
    """The worst seed mean of ``metric`` over ``cells`` and its attack (first in matrix order on ties)."""
    best: tuple[float | None, str | None] = (None, None)
    for c in cells:
        v = c.value(metric)
        if v is not None and (best[0] is None or worst(v, best[0])):
            best = (v, c.attack)
    return best


def reference_label(defenses: Sequence[str], scenario_doc: Any, name: str = "mean") -> str:
    """The matrix label of plugin ``name`` with its default parameters: ``name`` itself when a
    defense is labelled so, else the ``label`` of a ``[matrix].defenses`` entry ``{ name = "mean",
    label = "fedavg" }`` (no other parameter) found in ``defenses``; else ``name``."""
    if name in defenses:
        return name
    matrix = scenario_doc.get("matrix") if isinstance(scenario_doc, Mapping) else None
    entries = matrix.get("defenses") if isinstance(matrix, Mapping) else None
    for e in entries if isinstance(entries, list) else []:
        if (isinstance(e, Mapping) and e.get("name") == name and set(e) <= {"name", "label"}
                and e.get("label") in defenses):
            return str(e["label"])
    return name


def defender_summary(
    rows: Sequence[Mapping[str, Any]],
    cells: Sequence[CellSummary],
    *,
    reference: str = "mean",
    confidence: float = 0.95,
    scenario_doc: Any = None,
) -> DefenderSummary:
    """The summary from the store's rows (``ResultsStore.results(with_rounds=True)``, for the
    baselines) and the aggregated cells (:func:`~redteam.report.aggregate.aggregate_cells`).
    ``reference`` is the plugin the cost is measured against; its label in the matrix is
    found with :func:`reference_label` (``scenario_doc``: the scenario as stored)."""
    reference = reference_label(list(dict.fromkeys(c.defense for c in cells)), scenario_doc, reference)
    clean = _clean_by_seed(rows)
    flagging = _flagging_defenses(rows)
    defenses_all = list(dict.fromkeys(c.defense for c in cells))
    non_rejecting = frozenset(d for d in defenses_all if d not in flagging)

    by_group: dict[Settings, list[CellSummary]] = {}
    for c in cells:
        by_group.setdefault(c.settings, []).append(c)

    groups = []
    for settings, cs in by_group.items():
        defenses = list(dict.fromkeys(c.defense for c in cs))
        attacks = tuple(dict.fromkeys(c.attack for c in cs if c.attack != "none"))
        targeted = tuple(dict.fromkeys(c.attack for c in cs if c.attack != "none" and c.value("asr") is not None))
        stats = {}
        for d in defenses:
            ci = mean_ci(list(clean.get((d, settings), {}).values()), confidence)
            stats[d] = Stat(ci["mean"], ci["lo"], ci["hi"], ci["n"])
        ref = reference if reference in defenses else None
        ref_clean = stats[ref].mean if ref is not None else None
        rows_out = []
        for pos, d in enumerate(defenses):
            mine = [c for c in cs if c.defense == d]
            hit = [c for c in mine if c.attack != "none" and c.finished > 0]
            drop, drop_a = _extreme(hit, "accuracy_drop", lambda v, b: v > b)
            asr, asr_a = _extreme(hit, "asr", lambda v, b: v > b)
            done = [c for c in mine if c.finished > 0]
            rec, rec_a = _extreme(done, "recall", lambda v, b: v < b)
            fpr, fpr_a = _extreme(done, "fpr", lambda v, b: v > b)
            fpr_a = fpr_a if fpr else None  # no honest update flagged anywhere: no attack to name
            own = stats[d].mean
            cost = ref_clean - own if ref_clean is not None and own is not None else None
            can_reject = d not in non_rejecting
            rows_out.append((pos, DefenderRow(
                0, d, stats[d], cost, drop, drop_a, asr, asr_a, can_reject,
                rec if can_reject else None, rec_a if can_reject else None,
                fpr if can_reject else None, fpr_a if can_reject else None,
                len(hit), sum(1 for c in mine if c.attack != "none" and c.finished < c.planned))))

        def key(item: tuple[int, DefenderRow]) -> tuple[Any, ...]:
            pos, r = item
            tier = 2 if r.worst_drop is None else (1 if r.pending else 0)
            drop = round(r.worst_drop, 3) if r.worst_drop is not None else 0.0
            clean_key = -round(r.clean.mean, 3) if r.clean.mean is not None else math.inf
            return (tier, drop, clean_key, pos)

        ranked = tuple(_with_rank(r, i + 1) for i, (_, r) in enumerate(sorted(rows_out, key=key)))
        groups.append(DefenderGroup(settings, attacks, targeted, ref, ranked))
    return DefenderSummary(reference, tuple(groups), non_rejecting)


def _with_rank(row: DefenderRow, rank: int) -> DefenderRow:
    from dataclasses import replace

    return replace(row, rank=rank)


# ------------------------------------------------------------------- rendering


def _v(v: float | None, attack: str | None = None, signed: bool = False, stacked: bool = False,
       star: str = "") -> str:
    if v is None:
        return "—"
    text = (f"{v:+.3f}" if signed else f"{v:.3f}") + star
    if attack is None:
        return text
    from ..runner.outputs import terminal_safe

    attack = terminal_safe(attack)  # control characters as escapes: the only line break is the stacked one
    return f"{text}\n{attack}" if stacked else f"{text} ({attack})"


def _clean_text(s: Stat) -> str:
    from .tables import fmt_stat

    return "…" if s.mean is None else fmt_stat("final_accuracy", s)


def defender_columns(group: DefenderGroup, summary: DefenderSummary, *, stacked: bool = False) -> tuple[
        list[str], list[list[str]]]:
    """Header and plain-text rows of one group's table. Columns the group has no data for
    (no ``mean``, no attack, no targeted attack, no defense that rejects) are left out;
    :func:`defender_notes` says why in one line each. A worst case reads ``0.276 (sign_flip)``,
    or with ``stacked`` (narrow terminals) the attack on a line of its own. Labels are raw
    text: each writer escapes."""
    any_rejects = any(r.rejects for r in group.rows)
    header = ["#", "defense", "clean accuracy"]
    if group.reference is not None:
        header.append(f"cost vs {summary.reference}")
    if group.attacks:
        header.append("worst accuracy drop (attack)")
    if group.targeted:
        header.append("worst ASR (attack)")
    if any_rejects:
        header += ["worst recall (attack)", "worst FPR (attack)"]
    body = []
    for r in group.rows:
        line = [str(r.rank), r.defense, _clean_text(r.clean)]
        if group.reference is not None:
            line.append("reference" if r.defense == group.reference else _v(r.cost, signed=True))
        if group.attacks:
            star = "*" if r.pending and r.attacked else ""
            line.append(_v(r.worst_drop, r.worst_drop_attack, stacked=stacked, star=star) if r.attacked
                        else "… (not run yet)")
        if group.targeted:
            line.append(_v(r.worst_asr, r.worst_asr_attack, stacked=stacked))
        if any_rejects:
            line += ([_v(r.worst_recall, r.worst_recall_attack, stacked=stacked),
                      _v(r.worst_fpr, r.worst_fpr_attack, stacked=stacked)] if r.rejects else [NO_REJECT, NO_REJECT])
        body.append(line)
    return header, body


def defender_notes(group: DefenderGroup, summary: DefenderSummary) -> list[str]:
    """One line per fact the table needs: the ranking rule, the cost's sign, the columns left out."""
    notes = [f"{RANK_RULE[0].upper()}{RANK_RULE[1:]}."]
    if group.reference is None:
        notes.append(f"cost vs {summary.reference}: n/a ({summary.reference} not in the matrix).")
    else:
        notes.append(f"cost vs {summary.reference} = clean accuracy of {summary.reference} minus the defense's "
                     "(positive: accuracy paid when nobody attacks).")
    if any(r.pending for r in group.rows):
        notes.append("* = some attacked cells of that defense have not finished: its worst case is over the "
                     "finished ones (ranked after the complete defenses).")
    if not group.attacks:
        notes.append("worst case: n/a (no attack in the matrix, only the no-attack baseline).")
    if not group.targeted:
        notes.append("worst ASR: n/a (no targeted attack in the matrix).")
    if not any(r.rejects for r in group.rows):
        notes.append("detection: n/a (no defense in the matrix rejects updates).")
    elif any(not r.rejects for r in group.rows):
        notes.append(REJECT_RULE + ".")
    return notes


def _shown(header: list[str], body: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The text as the terminal shows it (control characters as escapes, so widths are right);
    the only line breaks left are the stacked layout's own (labels were made safe there)."""
    from ..runner.outputs import terminal_safe

    def safe(i: int, x: str) -> str:
        return terminal_safe(x) if i == 1 else "\n".join(terminal_safe(p) for p in x.split("\n"))

    return [terminal_safe(h) for h in header], [[safe(i, x) for i, x in enumerate(line)] for line in body]


def _fit_widths(header: Sequence[str], body: Sequence[Sequence[str]], room: int) -> list[int]:
    """Column widths within ``room`` characters: each column starts at its longest line and the
    widest one gives up a character at a time, down to its longest word (labels over 24
    characters may fold). The sum exceeds ``room`` only when the longest words do."""
    cells = [[h, *(line[i] for line in body)] for i, h in enumerate(header)]
    lines = [[ln for c in col for ln in c.split("\n")] for col in cells]
    widths = [max(len(ln) for ln in col) for col in lines]
    floor = [min(max(len(w) for ln in col for w in (ln.split() or [""])), 24) for col in lines]
    while sum(widths) > room:
        slack = [w - f for w, f in zip(widths, floor)]
        i = max(range(len(widths)), key=lambda j: (slack[j] > 0, widths[j]))
        if slack[i] <= 0:
            break
        widths[i] -= 1
    return widths


def defenders_dict(summary: DefenderSummary | None) -> dict[str, Any] | None:
    """The JSON form (``null`` values for undefined; ``rejects`` false = detection n/a)."""
    if summary is None:
        return None
    return {
        "reference": summary.reference,
        "rank_rule": RANK_RULE,
        "reject_rule": REJECT_RULE,
        "groups": [
            {
                "settings": dict(g.settings),
                "reference_in_matrix": g.reference is not None,
                "attacks": list(g.attacks),
                "targeted_attacks": list(g.targeted),
                "defenses": [
                    {
                        "rank": r.rank, "defense": r.defense,
                        "clean_accuracy": {"mean": r.clean.mean, "lo": r.clean.lo, "hi": r.clean.hi, "n": r.clean.n},
                        "cost_vs_reference": r.cost,
                        "worst_accuracy_drop": {"value": r.worst_drop, "attack": r.worst_drop_attack},
                        "worst_asr": {"value": r.worst_asr, "attack": r.worst_asr_attack},
                        "rejects": r.rejects,
                        "worst_recall": ({"value": r.worst_recall, "attack": r.worst_recall_attack}
                                         if r.rejects else None),
                        "worst_fpr": {"value": r.worst_fpr, "attack": r.worst_fpr_attack} if r.rejects else None,
                        "attacked_cells": r.attacked, "pending_cells": r.pending,
                    }
                    for r in g.rows
                ],
            }
            for g in summary.groups
        ],
    }


def print_defenders(console: Any, summary: DefenderSummary | None, escape: Callable[[object], str]) -> None:
    """The summary on a rich console: per settings group a title, a table, and its notes.
    Long entries wrap inside their column (nothing is cut off)."""
    if summary is None or not summary.groups:
        return
    from rich import box
    from rich.table import Table

    from .tables import group_title

    width = getattr(console, "width", 200) or 200
    for g in summary.groups:
        title = "Defender's summary" + (f" · {group_title(g.settings)}" if g.settings else "")
        header, body = _shown(*defender_columns(g, summary))
        if sum(_fit_widths(header, body, 10_000)) + len(header) - 1 > width:
            header, body = _shown(*defender_columns(g, summary, stacked=True))
        # light rules, one space between columns, widths fitted here (rich's own fitting would
        # cut the last column off at 80 characters): text wraps between words, never inside one
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=0)
        for i, (h, w) in enumerate(zip(header, _fit_widths(header, body, width - len(header) + 1))):
            t.add_column(escape(h), justify="left" if i == 1 else "right", overflow="fold", width=w)
        for line in body:
            t.add_row(*["\n".join(escape(part) for part in x.split("\n")) for x in line])
        console.print(f"[bold]{escape(title)}[/bold]")
        console.print(t)
        for n in defender_notes(g, summary):
            console.print(f"[dim]{escape(n)}[/dim]")
