"""Markdown, JSON and CSV renderings of a :class:`~redteam.report.aggregate.Report`.

* **Markdown**: one attacks × defenses table per metric and settings group (as in the
  terminal), then the breakdown fraction, envelope utilisation and expectations.
* **JSON** (format ``redteam.report/v1``): the scenario, versions, reproduce command and,
  per cell, ``{"mean", "lo", "hi", "n"}`` for each metric and ``seeds``: each of its runs'
  replicate, seed, whether it finished and the ``redteam run`` command that reruns it
  (:func:`cell_seeds`); the breakdown, envelope and expectation rows, and ``defenders``
  (the defender's summary, :mod:`redteam.report.defender`). Undefined values are ``null``.
* **Markdown** and **HTML** list the same seeds and commands per cell.
* A cell whose per-seed values of a metric are exactly those of other attacks' cells under the
  same defense (:func:`~redteam.report.aggregate.shared_draws`) is marked ``†`` in the tables,
  with a line under them; JSON lists them under ``shared_draws`` and per cell
  (``cells[i].shared_draws``: metric → the cells sharing its draw).
* **CSV**: one row per cell: ``cell_id, attack, defense``, one column per matrix
  setting, ``seeds_planned, seeds_finished``, then ``M, M_lo, M_hi, M_n`` for each metric
  ``M`` (empty = undefined).

Names come from scenario files and plugins, so they are data, never markup: in Markdown
every label is escaped (Markdown punctuation with a backslash, ``<``/``>``/``&`` as HTML
entities, line breaks and control characters made visible) and code blocks use a fence
longer than any run of backticks inside; in CSV a text field that a spreadsheet would
run as a formula (first character ``= + - @``, tab or carriage return) is prefixed with
``'`` (the OWASP "CSV injection" advice); numbers are written as numbers.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any, Sequence

from .aggregate import REPORT_METRICS, Report, axis_labels, settings_groups, undefined_notes
from .defender import defenders_dict, na_note, rejects
from .tables import LEGEND, cell_text, fmt_value, group_title, metric_grids, short_key

__all__ = ["to_markdown", "to_json", "to_csv", "report_dict", "cell_seeds", "FORMAT_ID"]

FORMAT_ID = "redteam.report/v1"


def _f(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


_MD_SPECIAL = set("\\`*[]|~")
_MD_ENTITIES = {"<": "&lt;", "&": "&amp;"}  # ">" starts nothing inline


def md_text(text: object) -> str:
    """A label as literal inline Markdown text: no emphasis, code, links, HTML or table
    breaks. Escaped: ``\\ ` * [ ] | ~`` (backslash), ``_`` at a word boundary (inside
    a word, as in ``sign_flip``, it is literal already), ``< &`` (entities); line
    breaks and control characters are shown as escapes."""
    from ..runner.outputs import terminal_safe

    t = terminal_safe(text)
    out = []
    for i, ch in enumerate(t):
        if ch in _MD_ENTITIES:
            out.append(_MD_ENTITIES[ch])
        elif ch in _MD_SPECIAL:
            out.append("\\" + ch)
        elif ch == "_" and not (0 < i < len(t) - 1 and t[i - 1].isalnum() and t[i + 1].isalnum()):
            out.append("\\_")
        else:
            out.append(ch)
    return "".join(out)


def cell_seeds(report: Report) -> dict[str, list[dict[str, Any]]]:
    """Per cell id, its runs in replicate order: ``{"replicate", "seed", "finished",
    "reproduce"}``; ``seed`` is the one the run used (its ``[scenario].seed``) and
    ``reproduce`` the ``redteam run`` command that reruns it with its baseline.

    Read from the store the report was made from (read-only: nothing is written) when it
    still holds the same scenario (same digest); empty when the report was not made from
    a store, or the store now holds another one."""
    from ..runner.matrix_run import reproduce_command
    from ..runner.store import StoreError, read_store

    if report.digest is None:
        return {}
    try:
        view = read_store(report.source)
    except StoreError:
        return {}
    if view is None or view.meta.get("scenario_digest") != report.digest:
        return {}
    has_matrix = report.scenario_doc is None or "matrix" in report.scenario_doc
    return {
        cell: [{"replicate": rep, "seed": seed, "finished": done,
                "reproduce": reproduce_command(report.file, cell, seed, has_matrix)} for rep, seed, done in runs]
        for cell, runs in view.seeds_by_cell().items()
    }


def _seeds_markdown(report: Report) -> list[str]:
    """The seeds section: one row per run of each cell, with the command that reruns it."""
    seeds = cell_seeds(report)
    if not seeds:
        return []
    lines = ["## Seeds", "",
             "The seed each run of a cell used (its `[scenario].seed`), and the command that reruns it "
             "with its no-attack baseline.", ""]
    rows = [[md_text(c.cell_id), str(s["replicate"]), str(s["seed"]), "yes" if s["finished"] else "no",
             _md_code(s["reproduce"])] for c in report.cells for s in seeds.get(c.cell_id, ())]
    lines += _md_table(["cell", "replicate", "seed", "finished", "rerun"], rows, right_from=1)
    lines.append("")
    return lines


def _md_code(text: str) -> str:
    """Inline code in a table cell, to copy as it stands: a fence longer than any backtick
    run inside, ``|`` escaped (GitHub's tables split on it even in code)."""
    from ..runner.outputs import terminal_safe

    t = terminal_safe(text).replace("|", "\\|")
    run, best = 0, 0
    for ch in t:
        run = run + 1 if ch == "`" else 0
        best = max(best, run)
    fence = "`" * (best + 1)
    pad = " " if t.startswith("`") or t.endswith("`") else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def _fence(text: str) -> str:
    """A backtick fence longer than any backtick run in ``text`` (at least three)."""
    run, best = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        best = max(best, run)
    return "`" * max(3, best + 1)


def _md_cell(text: str) -> str:
    """A table cell: labels arrive escaped by :func:`md_text`; values never hold ``|``."""
    return text.replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int = 1) -> list[str]:
    out = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
           "|" + "|".join("---" if i < right_from else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return out


def to_markdown(report: Report, metrics: Sequence[str]) -> str:
    lines = [f"# redteam report: {md_text(report.name)}", ""]
    seeds = max((c.planned for c in report.cells), default=0)
    lines.append(f"{len(report.cells)} cells × {seeds} seed(s); "
                 f"{sum(c.finished for c in report.cells)}/{sum(c.planned for c in report.cells)} runs finished. "
                 f"{LEGEND}.")
    lines.append("")
    lines += defenders_markdown(report)
    for m in metrics:
        lines += [f"## {m}", "", f"{REPORT_METRICS[m]}.", ""]
        if (note := na_note(report, m)) is not None:
            lines += [md_text(note) + ".", ""]
        marked = report.shared_cells(m)
        for group, attacks, defenses, by in metric_grids(report.cells):
            if group:
                lines += [f"### {md_text(group_title(group))}", ""]
            lines += _md_table(["attack \\ defense", *map(md_text, defenses)],
                               [[md_text(a), *[cell_text(c := by.get((a, d)), m, rejects(report, d),
                                                         c is not None and c.cell_id in marked) for d in defenses]]
                                for a in attacks])
            lines.append("")
        if notes := undefined_notes(report.cells, m):
            lines += [f"- — {md_text(line)}" for line in notes] + [""]
        if shared := report.shared_notes(m):
            lines += [f"- {md_text(line)}" for line in shared] + [""]
    if report.breakdown:
        lines += [f"## Breakdown fraction ({md_text(short_key(report.breakdown[0].axis))})", "",
                  f"Smallest malicious fraction at which accuracy_drop > {report.accuracy_margin:g} "
                  f"or asr > {report.asr_level:g} (seed means); `>max` = never on the axis.", ""]
        for group, rows in settings_groups(report.breakdown).items():
            if group:
                lines += [f"### {md_text(group_title(group))}", ""]
            attacks, defenses = axis_labels(rows)
            by = {(r.attack, r.defense): r for r in rows}
            lines += _md_table(["attack \\ defense", *map(md_text, defenses)],
                               [[md_text(a), *[_bd_text(by.get((a, d))) for d in defenses]] for a in attacks])
            lines.append("")
    if report.envelope:
        lines += ["## Envelope utilisation", "",
                  "Worst case over seeds: largest accepted malicious norm / bound, smallest accepted "
                  "malicious cosine, and its margin over the threshold.", ""]
        lines += _md_table(["cell", "norm / bound", "min cosine", "cosine margin"],
                           [[md_text(e.cell_id), fmt_value("envelope_norm", e.norm), fmt_value("envelope_cos", e.cos),
                             fmt_value("envelope_cos_margin", e.cos_margin)] for e in report.envelope])
        lines.append("")
    if report.expectations:
        bad = [e for e in report.expectations if e.failure]
        lines += ["## Expectations", "", f"{len(report.expectations) - len(bad)} of {len(report.expectations)} hold.",
                  ""]
        lines += _md_table(["#", "expectation", "cell", "value", "verdict"],
                           [[str(e.index + 1), md_text(e.description), md_text(e.cell_id),
                             fmt_value(e.metric, e.value),
                             "holds" if not e.failure else f"FAILS: {md_text(e.failure)}"] for e in report.expectations],
                           right_from=3)
        lines.append("")
    lines += _seeds_markdown(report)
    if report.reproduce:
        fence = _fence(report.reproduce)
        lines += ["## Reproduce", "", fence, report.reproduce, fence, ""]
    if report.versions:
        lines.append("Versions: " + ", ".join(f"{md_text(k)} {md_text(v)}" for k, v in sorted(report.versions.items())))
        lines.append("")
    return "\n".join(lines)


def defenders_markdown(report: Report) -> list[str]:
    """The defender's summary section (one table per settings group), or nothing."""
    from .defender import defender_columns, defender_notes

    summary = report.defenders
    if summary is None or not summary.groups:
        return []
    lines = ["## Defender's summary", ""]
    for g in summary.groups:
        if g.settings:
            lines += [f"### {md_text(group_title(g.settings))}", ""]
        lines += [f"**{md_text(h)}**" + ("  " if i < len(g.headline) - 1 else "") for i, h in enumerate(g.headline)]
        if g.headline:
            lines.append("")
        header, body = defender_columns(g, summary)
        # the header names the reference defense by its label ("cost vs LABEL"): a scenario's string
        lines += _md_table([md_text(h) for h in header],
                           [[md_text(r[0]), md_text(r[1]), *[md_text(x) for x in r[2:]]] for r in body], right_from=2)
        lines += ["", " ".join(md_text(n) for n in defender_notes(g, summary)), ""]
    return lines


def _bd_text(row: Any) -> str:
    if row is None:
        return ""
    if row.fraction is None:
        return f">{max(p[0] for p in row.points):g}"
    return f"{row.fraction:g}"


def report_dict(report: Report, metrics: Sequence[str]) -> dict[str, Any]:
    """The JSON document (``redteam.report/v1``) for ``metrics``."""
    seeds = cell_seeds(report)
    return {
        "format": FORMAT_ID,
        "scenario": {"name": report.name, "file": report.file, "digest": report.digest,
                     "doc": report.scenario_doc},
        "versions": dict(report.versions),
        "reproduce": report.reproduce,
        "confidence": report.confidence,
        "metrics": {m: REPORT_METRICS[m] for m in metrics},
        "defenders": defenders_dict(report.defenders),
        "shared_draws": [{"metric": d.metric, "defense": d.defense, "settings": dict(d.settings),
                          "attacks": list(d.attacks), "cell_ids": list(d.cell_ids),
                          "replicates": list(d.replicates), "values": [_f(v) for v in d.values],
                          "note": d.note()} for d in report.shared if d.metric in metrics],
        "cells": [
            {
                "cell_id": c.cell_id, "attack": c.attack, "defense": c.defense, "settings": dict(c.settings),
                "seeds_planned": c.planned, "seeds_finished": c.finished,
                "seeds": seeds.get(c.cell_id, []),
                "metrics": {m: {"mean": _f(s.mean), "lo": _f(s.lo), "hi": _f(s.hi), "n": s.n}
                            for m in metrics if (s := c.metrics.get(m)) is not None},
                "undefined": {m: c.undefined[m] for m in metrics if m in c.undefined},
                "shared_draws": {m: list(d.cell_ids) for m in metrics
                                 if (d := report.shared_draw(c.cell_id, m)) is not None},
            }
            for c in report.cells
        ],
        "breakdown": {
            "accuracy_margin": report.accuracy_margin, "asr_level": report.asr_level,
            "rows": [{"attack": r.attack, "defense": r.defense, "settings": dict(r.settings), "axis": r.axis,
                      "points": [{"fraction": f, "accuracy_drop": _f(d), "asr": _f(a)} for f, d, a in r.points],
                      "breakdown_fraction": r.fraction} for r in report.breakdown],
        },
        "envelope": [{"cell_id": e.cell_id, "attack": e.attack, "defense": e.defense, "settings": dict(e.settings),
                      "envelope_norm": _f(e.norm), "envelope_cos": _f(e.cos),
                      "envelope_cos_margin": _f(e.cos_margin)} for e in report.envelope],
        "expectations": [{"index": e.index, "expectation": e.description, "cell_id": e.cell_id,
                          "metric": e.metric, "value": _f(e.value), "holds": e.failure is None, "failure": e.failure}
                         for e in report.expectations],
    }


def to_json(report: Report, metrics: Sequence[str]) -> str:
    return json.dumps(report_dict(report, metrics), indent=2, allow_nan=False, default=str) + "\n"


def to_csv(report: Report, metrics: Sequence[str]) -> str:
    keys: list[str] = []
    for c in report.cells:
        for k, _ in c.settings:
            if k not in keys:
                keys.append(k)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    header = ["cell_id", "attack", "defense", *keys, "seeds_planned", "seeds_finished"]
    for m in metrics:
        header += [m, f"{m}_lo", f"{m}_hi", f"{m}_n"]
    w.writerow([csv_safe(h) for h in header])
    for c in report.cells:
        s = dict(c.settings)
        row: list[Any] = [csv_safe(c.cell_id), csv_safe(c.attack), csv_safe(c.defense),
                          *[csv_safe(s.get(k, "")) for k in keys], c.planned, c.finished]
        for m in metrics:
            st = c.metrics.get(m)
            row += ["" if v is None else repr(float(v)) for v in (st.mean, st.lo, st.hi)] + [st.n]
        w.writerow(row)
    return buf.getvalue()


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(v: Any) -> Any:
    """A CSV field a spreadsheet will not run: text starting like a formula gets a
    leading ``'``; numbers (and booleans) are left as they are."""
    if isinstance(v, (bool, int, float)) or v is None:
        return v
    text = str(v)
    return "'" + text if text.startswith(_FORMULA_START) else text


# ------------------------------------------------------------------- TOML-ish dump

_BARE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _toml_str(s: str) -> str:
    # JSON's string escapes are TOML's basic-string escapes; TOML also forbids a raw DEL
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_key(k: Any) -> str:
    k = str(k)
    return k if k and set(k) <= _BARE else _toml_str(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if v is None:
        return '""'
    return _toml_str(str(v))


def toml_dump(doc: Any, _prefix: str = "") -> str:
    """A readable TOML rendering of a scenario document (scalars first, then ``[tables]``
    and ``[[arrays of tables]]``; ``null`` values, which TOML cannot hold, are left out)."""
    if not isinstance(doc, dict):
        return _toml_value(doc) + "\n"
    scalars, tables, arrays = [], [], []
    for k, v in doc.items():
        if v is None:
            continue
        if isinstance(v, dict):
            tables.append((k, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((k, v))
        else:
            scalars.append((k, v))
    out = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars]
    for k, v in tables:
        name = f"{_prefix}{_toml_key(k)}"
        body = toml_dump(v, name + ".")
        has_scalars = any(x is not None and not isinstance(x, dict)
                          and not (isinstance(x, list) and x and all(isinstance(y, dict) for y in x))
                          for x in v.values())
        if out:
            out.append("")
        if has_scalars or not v:
            out.append(f"[{name}]")
        out.append(body.rstrip("\n"))
    for k, items in arrays:
        name = f"{_prefix}{_toml_key(k)}"
        for item in items:
            if out:
                out.append("")
            out.append(f"[[{name}]]")
            out.append(toml_dump(item, name + ".").rstrip("\n"))
    return "\n".join(line for line in out) + "\n"
