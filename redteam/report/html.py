"""The self-contained HTML report: one file, inline CSS, figures as base64 PNG data URIs.

Sections: expectations (verdicts first), heatmaps (attacks × defenses) of the chosen
metrics, accuracy drop against the malicious fraction (when the matrix has that axis),
convergence curves (accuracy per round, attacked vs baseline, one small panel per cell,
seed means), detection rates, breakdown fraction, envelope utilisation, every metric of
every cell, each cell's seeds with the command that reruns each run (whole, wrapping, never
cut), the scenario file as written when the matrix ran (a store made before it was kept: its
parsed definition written out as TOML, said so), versions and the reproduce command. Wide
tables scroll sideways inside the page. Nothing on the page refers to the network; no script
runs.

Figures are drawn with matplotlib's object API on the Agg canvas (no ``pyplot``, so the
caller's backend and global figure state are never touched).
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
import shlex
from pathlib import Path
from typing import Any, Sequence

from .aggregate import (REPORT_METRICS, SHARED_MARK, CellSummary, Curve, Report, axis_labels, fraction_axis,
                        settings_groups, undefined_notes)
from .formats import _bd_text, toml_dump
from .tables import LEGEND, cell_text, fmt_stat, fmt_value, group_title, metric_grids, short_key

__all__ = ["render_html", "write_html", "default_html_metrics", "heatmap_figure", "convergence_figure",
           "fraction_figure", "figure_data_uri"]

_E = html.escape

#: Heatmaps drawn by default (``asr`` only when some cell has one).
DEFAULT_HTML_METRICS = ("accuracy_drop", "asr", "recall", "fpr")
#: A language model's heatmaps, in its own unit (bits per byte), its backdoor's rates, detection.
DEFAULT_LM_HTML_METRICS = ("final_bits_per_byte", "bits_per_byte_increase", "asr", "false_trigger_rate",
                           "near_miss_trigger_rate", "recall", "fpr")

_UNIT = {"final_accuracy", "final_accuracy_last_k", "asr", "precision", "recall", "f1", "fpr", "false_trigger_rate",
         "near_miss_trigger_rate"}
_GOOD_HIGH = {"final_accuracy", "precision", "recall", "f1", "tp", "tn"}
_CENTERED = {"accuracy_drop", "bits_per_byte_increase", "perplexity_increase", "slowdown_rounds",
             "envelope_cos_margin"}


def _mpl(text: str) -> str:
    """Text for matplotlib, taken literally: ``$`` would start mathtext."""
    return text.replace("$", r"\$")


def _wrap(label: str, width: int = 24) -> str:
    """Break a long cell label (``norm_bound(mode=reject,multiplier=2.0)``) after ``(`` or ``,``
    (and escape it for matplotlib)."""
    label = _mpl(label)
    if len(label) <= width:
        return label
    lines, cur = [], ""
    for tok in re.split(r"(?<=[(,+])", label):
        if cur and len(cur) + len(tok) > width:
            lines.append(cur)
            cur = ""
        cur += tok
    lines.append(cur)
    return "\n".join(lines)


def default_html_metrics(report: Report) -> list[str]:
    """The default heatmaps: accuracy drop, ASR and detection for a classifier; bits per byte, its
    increase, ASR, false-trigger rates and detection for a language model (only those defined).
    A scenario that declares its defender metric (``[matrix] defender_metric``) gets that one
    first: the figure its defender's summary ranks by."""
    if report.language_model() is True:
        out = [m for m in DEFAULT_LM_HTML_METRICS if m in ("recall", "fpr") or report.defined(m)]
    else:
        out = [m for m in DEFAULT_HTML_METRICS if m != "asr" or report.defined("asr")]
    declared = getattr(report.defenders, "metric", None)
    if declared is not None and report.applies(declared):
        out = [declared, *(m for m in out if m != declared)]
    return out


# ---------------------------------------------------------------------- figures


def figure_data_uri(fig: Any, dpi: int = 100) -> str:
    """``data:image/png;base64,...`` of a matplotlib figure (Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _scale(metric: str, values: list[float]) -> tuple[str, float, float]:
    """Colour map and range: green where higher is better, red where lower is better (darker =
    more of it), red–blue around 0 for the signed changes (red = worse), viridis where neither."""
    from ..scoring import HIGHER_IS_BETTER

    better_high = HIGHER_IS_BETTER.get(metric)
    good = metric in _GOOD_HIGH or better_high is True
    if metric in _UNIT:
        return ("Greens" if good else "Reds"), 0.0, 1.0
    finite = [v for v in values if math.isfinite(v)]
    if metric in _CENTERED:
        lim = max([abs(v) for v in finite] + [0.05 if metric in ("accuracy_drop", "bits_per_byte_increase") else 1.0])
        return "RdBu_r", -lim, lim
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    return ("Greens" if good else "Reds" if better_high is False else "viridis"), lo, hi


def heatmap_figure(cells: Sequence[CellSummary], metric: str, no_reject: frozenset[str] = frozenset(),
                   shared: frozenset[str] = frozenset()) -> Any:
    """One attacks × defenses heatmap of ``metric`` per settings group, side by side; the cells
    whose ids are in ``shared`` (one draw shared across attacks) carry the marker ``†``."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    from .defender import DETECTION_RATES

    grids = metric_grids(cells)

    def _rejects(defense: str) -> bool:  # False: detection rates of a rule that never rejects read n/a (grey)
        return metric not in DETECTION_RATES or defense not in no_reject

    all_vals = [v for c in cells if (v := c.value(metric)) is not None]
    cmap_name, vmin, vmax = _scale(metric, all_vals)
    cmap = colormaps[cmap_name].with_extremes(bad="#e6e6e6")
    norm = Normalize(vmin, vmax)
    n_a = max(len(g[1]) for g in grids)
    n_d = max(len(g[2]) for g in grids)
    label_w = min(max(len(a) for g in grids for a in g[1]), 24) * 0.075 + 0.4
    w, h = label_w + 1.1 * n_d + 0.4, 0.55 * n_a + 1.7
    cols = max(1, min(len(grids), 3, int(12.5 // w)))  # side by side while the page is wide enough
    rows = math.ceil(len(grids) / cols)
    fig = Figure(figsize=(w * cols + 0.9, h * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    image = None
    for ax, (group, attacks, defenses, by) in zip(axes, grids):
        data = np.full((len(attacks), len(defenses)), np.nan)
        for i, a in enumerate(attacks):
            for j, d in enumerate(defenses):
                c = by.get((a, d))
                v = None if c is None or not _rejects(c.defense) else c.value(metric)
                if v is not None:
                    data[i, j] = v
        image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto")
        ax.set_xticks(range(len(defenses)), [_wrap(d, 18) for d in defenses], fontsize=7)
        ax.set_yticks(range(len(attacks)), [_wrap(a) for a in attacks], fontsize=8)
        ax.set_title(_mpl(group_title(group)) or metric, fontsize=9)
        for i, a in enumerate(attacks):
            for j, d in enumerate(defenses):
                c = by.get((a, d))
                text = cell_text(c, metric, _rejects(d), c is not None and c.cell_id in shared).replace(" ± ", "\n±")
                v = data[i, j]
                dark = math.isfinite(v) and sum(cmap(norm(v))[:3]) < 1.5
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "#222")
    for ax in axes[len(grids):]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=list(axes[: len(grids)]), shrink=0.8 if rows == 1 else 0.5, aspect=20 * rows,
                     label=metric)
    return fig


def convergence_figure(curves: Sequence[Curve]) -> Any:
    """Small multiples (attacks × defenses) of seed-mean accuracy per round: attacked (solid)
    vs baseline (dashed)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    attacks, defenses = axis_labels(curves)
    by = {(c.attack, c.defense): c for c in curves}
    lows = [v for c in curves for v in (*c.attacked, *c.baseline) if math.isfinite(v)]
    ylo = max(0.0, min(lows) - 0.05) if lows else 0.0
    yhi = min(1.0, max(lows) + 0.05) if lows else 1.0
    fig = Figure(figsize=(0.6 + 1.9 * len(defenses), 0.7 + 1.45 * len(attacks)), layout="constrained")
    axes = fig.subplots(len(attacks), len(defenses), squeeze=False, sharex=True, sharey=True)
    for i, a in enumerate(attacks):
        for j, d in enumerate(defenses):
            ax = axes[i][j]
            c = by.get((a, d))
            if c is not None and c.attacked:
                many = max(len(c.attacked), len(c.baseline)) > 12
                mk = {} if many else {"marker": "o", "markersize": 2.5}
                if c.baseline:
                    ax.plot(range(1, len(c.baseline) + 1), c.baseline, ls="--", color="0.45", lw=1.2,
                            label="baseline", **mk)
                ax.plot(range(1, len(c.attacked) + 1), c.attacked, color="#c0392b", lw=1.4, label="attacked", **mk)
            else:
                ax.text(0.5, 0.5, "not run", transform=ax.transAxes, ha="center", va="center", fontsize=7,
                        color="0.5")
            ax.set_ylim(ylo, yhi)
            ax.tick_params(labelsize=6)
            ax.grid(alpha=0.3, lw=0.5)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if i == 0:
                ax.set_title(_wrap(d), fontsize=7)
            if j == 0:
                ax.set_ylabel(_wrap(a), fontsize=7)
            if i == len(attacks) - 1:
                ax.set_xlabel("round", fontsize=7)
    handles, labels = [], []
    for row in axes:
        for ax in row:
            h, lab = ax.get_legend_handles_labels()
            if len(h) > len(handles):
                handles, labels = h, lab
    if handles:
        fig.legend(handles, labels, loc="outside upper right", fontsize=7, ncols=2, frameon=False)
    return fig


def fraction_figure(report: Report) -> Any | None:
    """Accuracy drop (seed mean, 95 % interval) against the malicious fraction, one panel per
    attack (and other-settings group), one line per defense."""
    axis = fraction_axis(report.cells)
    if axis is None:
        return None
    from matplotlib.figure import Figure

    panels: dict[tuple, dict[str, list[tuple[float, Any]]]] = {}
    for c in report.cells:
        s = dict(c.settings)
        if c.attack == "none" or not isinstance(s.get(axis), (int, float)) or c.finished == 0:
            continue
        others = tuple((k, v) for k, v in c.settings if k != axis)
        panels.setdefault((c.attack, others), {}).setdefault(c.defense, []).append(
            (float(s[axis]), c.metrics["accuracy_drop"]))
    if not panels or all(len(p) == 1 and len(next(iter(p.values()))) < 2 for p in panels.values()):
        return None
    keys = list(panels)
    cols = min(len(keys), 4)
    rows = math.ceil(len(keys) / cols)
    fig = Figure(figsize=(0.6 + 2.7 * cols, 0.8 + 2.1 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).ravel()
    for ax, (attack, others) in zip(axes, keys):
        for defense, pts in panels[(attack, others)].items():
            pts = sorted((f, s) for f, s in pts if s.mean is not None)
            if not pts:
                continue
            xs = [f for f, _ in pts]
            ys = [s.mean for _, s in pts]
            err = [[s.mean - s.lo if s.lo is not None else 0.0 for _, s in pts],  # clamped intervals are asymmetric
                   [s.hi - s.mean if s.hi is not None else 0.0 for _, s in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", ms=3, lw=1.2, capsize=2, label=_wrap(defense, 40))
        ax.axhline(report.accuracy_margin, color="0.4", ls=":", lw=1)
        ax.set_title(_mpl(attack + (f" [{group_title(others)}]" if others else "")), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, lw=0.5)
        ax.set_xlabel(short_key(axis), fontsize=7)
        ax.set_ylabel("accuracy_drop", fontsize=7)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    handles, labels = max((ax.get_legend_handles_labels() for ax in axes), key=lambda hl: len(hl[0]))
    if handles:  # one legend for all panels: the defenses
        fig.legend(handles, labels, loc="outside right upper", fontsize=7, frameon=False, title="defense",
                   title_fontsize=7)
    return fig


# ------------------------------------------------------------------------- page

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d1d1f;margin:0;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:1.2em 1.6em 3em}
h1{font-size:1.6em;margin:.2em 0}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
h3{font-size:1.05em;margin:1.2em 0 .4em}
nav a{margin-right:1em;color:#2557a7;text-decoration:none}nav{margin:.6em 0 1em}
table{border-collapse:collapse;margin:.4em 0 1em;background:#fff;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f0f0f3}td.l,th.l{text-align:left}
figure{margin:.6em 0 1.4em;background:#fff;border:1px solid #e3e3e3;padding:.6em;overflow-x:auto}
figure img{max-width:100%;height:auto}figcaption{color:#555;font-size:12px;margin-top:.3em}
pre{background:#f4f4f6;border:1px solid #e3e3e3;padding:.7em 1em;overflow-x:auto;font-size:12.5px}
pre.src{white-space:pre-wrap;overflow-wrap:anywhere}
.tw{max-width:100%;overflow-x:auto;margin:.4em 0 1em}.tw table{margin:0}
table.wrap td{white-space:normal}td.cmd{white-space:normal;text-align:left;min-width:24em}
td.cmd code{overflow-wrap:anywhere;user-select:all}
.ok{color:#17803d;font-weight:600}.bad{color:#b3261e;font-weight:600}.muted{color:#666}
.summary{display:flex;gap:1.5em;flex-wrap:wrap}.summary div{background:#fff;border:1px solid #e3e3e3;padding:.5em .9em}
.summary b{display:block;font-size:1.3em}
details summary{cursor:pointer;font-weight:600;margin:.5em 0}
"""


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1, raw: bool = False, *,
           wrap: bool = False, command: int | None = None) -> str:
    """An HTML table in a box that scrolls sideways when the page is narrower (never cut off);
    cells are escaped unless ``raw`` (then the caller escaped them). ``wrap``: cells wrap between
    words; ``command``: the column of shell commands, which wrap anywhere, whole and selectable."""
    esc = (lambda s: s) if raw else _E

    def cls(i: int) -> str:
        return ' class="cmd"' if i == command else (' class="l"' if i < left else "")

    head = "".join(f'<th class="l">{_E(h)}</th>' if i < left or i == command else f"<th>{_E(h)}</th>"
                   for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{esc(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    table = '<table class="wrap">' if wrap else "<table>"
    return f'<div class="tw">{table}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _img(fig: Any, alt: str, caption: str, dpi: int = 100) -> str:
    uri = figure_data_uri(fig, dpi)
    return f'<figure><img src="{uri}" alt="{_E(alt)}"><figcaption>{_E(caption)}</figcaption></figure>'


def _expectations(report: Report) -> str:
    if not report.expectations:
        return '<p class="muted">The scenario states no <code>[[expect]]</code> rows.</p>'
    bad = [e for e in report.expectations if e.failure]
    head = (f'<p><span class="{"bad" if bad else "ok"}">{len(report.expectations) - len(bad)} of '
            f'{len(report.expectations)} hold</span> (seed means of the matching cells).</p>')
    rows = [[str(e.index + 1), _E(e.description), _E(e.cell_id), _E(fmt_value(e.metric, e.value)),
             '<span class="ok">holds</span>' if not e.failure else f'<span class="bad">fails</span>: {_E(e.failure)}']
            for e in sorted(report.expectations, key=lambda e: (e.failure is None, e.index))]
    return head + _table(["#", "expectation", "cell", "value", "verdict"], rows, left=3, raw=True)


def _defenders(report: Report) -> str:
    from .defender import defender_columns, defender_notes

    summary = report.defenders
    if summary is None or not summary.groups:
        return '<p class="muted">No defense has a finished run yet.</p>'
    out = []
    for g in summary.groups:
        if g.settings:
            out.append(f"<h3>{_E(group_title(g.settings))}</h3>")
        if g.headline:
            out.append('<p class="headline">' + "<br>".join(f"<strong>{_E(h)}</strong>" for h in g.headline) + "</p>")
        header, body = defender_columns(g, summary)
        out.append(_table(header, body, left=2, wrap=True))
        out.append('<p class="muted">' + _E(" ".join(defender_notes(g, summary))) + "</p>")
    return "".join(out)


def _mark(report: Report, c: CellSummary, metric: str, text: str) -> str:
    """``text`` with the shared-draw marker when ``c``'s ``metric`` is one draw shared across attacks."""
    return text + SHARED_MARK if report.shared_draw(c.cell_id, metric) is not None else text


def _shared_list(report: Report, metrics: Sequence[str]) -> str:
    """The shared-draw lines of ``metrics``, one paragraph each (empty when there are none)."""
    return "".join(f'<p class="muted">{_E(line)}</p>' for m in metrics for line in report.shared_notes(m))


def _detection(report: Report) -> str:
    from .defender import NO_REJECT, REJECT_RULE

    rows = []
    summary = report.defenders
    skipped = 0
    rate_names, count_names = ("precision", "recall", "f1", "fpr"), ("tp", "fp", "tn", "fn")
    for c in report.cells:
        counts = [c.metrics[k].mean for k in count_names]
        if summary is not None and not summary.rejects(c.defense):
            skipped += 1
            rates = [NO_REJECT] * 4
        else:
            rates = [_mark(report, c, m, fmt_stat(m, c.metrics.get(m))) for m in rate_names]
        rows.append([c.cell_id, *rates, *[_mark(report, c, k, fmt_value(k, v)) for k, v in zip(count_names, counts)]])
    note = f'<p class="muted">{_E(REJECT_RULE)}.</p>' if skipped else ""
    return (_table(["cell", "precision", "recall", "f1", "fpr", "tp", "fp", "tn", "fn"], rows) + note
            + _shared_list(report, (*rate_names, *count_names))
            + '<p class="muted">Over judged updates (those that reached a defense or an integrity check): flagged = '
              'not accepted, positive = malicious. Rates: seed means ± half-width of the 95 % interval; counts: '
              'seed means. — = undefined (0/0, e.g. recall without malicious clients).</p>')


def _breakdown(report: Report) -> str:
    if not report.breakdown:
        return ('<p class="muted">No <code>*.malicious_fraction</code> axis in <code>[matrix.settings]</code>: '
                'add one to measure the breakdown fraction.</p>')
    out = [f'<p>Smallest malicious fraction ({_E(short_key(report.breakdown[0].axis))}) at which the seed-mean '
           f"accuracy_drop exceeds {report.accuracy_margin:g} or the seed-mean asr exceeds {report.asr_level:g}; "
           "<code>&gt;x</code>: never broken up to the largest fraction tried, x.</p>"]
    for group, rows in settings_groups(report.breakdown).items():
        if group:
            out.append(f"<h3>{_E(group_title(group))}</h3>")
        attacks, defenses = axis_labels(rows)
        by = {(r.attack, r.defense): r for r in rows}
        out.append(_table(["attack \\ defense", *defenses],
                          [[a, *[_bd_text(by.get((a, d))) for d in defenses]] for a in attacks]))
    return "".join(out)


def _envelope(report: Report) -> str:
    if not report.envelope:
        return ('<p class="muted">No accepted malicious update was measured against a norm bound or a cosine '
                "filter (no such validation rule in the pipeline, or every malicious update was rejected).</p>")
    rows = [[e.cell_id, fmt_value("envelope_norm", e.norm), fmt_value("envelope_cos", e.cos),
             fmt_value("envelope_cos_margin", e.cos_margin)] for e in report.envelope]
    return (_table(["cell", "max norm / bound", "min cosine", "cosine margin"], rows)
            + '<p class="muted">Worst case over seeds among <em>accepted malicious</em> updates: 1.0 = a norm '
              "exactly on the bound; a margin of 0 = a cosine exactly on the threshold.</p>")


def _seeds(report: Report) -> str:
    """Per cell, each run's replicate, the seed it used and the command that reruns it."""
    from .formats import cell_seeds

    seeds = cell_seeds(report)
    if not seeds:
        return '<p class="muted">The seeds are read from the results store, which is not at hand.</p>'
    rows = [[_E(c.cell_id), str(s["replicate"]), str(s["seed"]), "yes" if s["finished"] else "no",
             f"<code>{_E(s['reproduce'])}</code>"] for c in report.cells for s in seeds.get(c.cell_id, ())]
    return ('<p>The seed each run of a cell used (its <code>[scenario].seed</code>); the command reruns it '
            "with its no-attack baseline.</p>"
            + _table(["cell", "replicate", "seed", "finished", "rerun"], rows, raw=True, command=4))


def _all_metrics(report: Report) -> str:
    ms = report.applicable(REPORT_METRICS)  # not a classifier's "perplexity"
    rows = [[c.cell_id, f"{c.finished}/{c.planned}", *[_mark(report, c, m, fmt_stat(m, c.metrics.get(m))) for m in ms]]
            for c in report.cells]
    return ("<details><summary>every metric of every cell</summary>"
            + _table(["cell", "seeds", *ms], rows) + _shared_list(report, ms) + "</details>")


def render_html(report: Report, metrics: Sequence[str] | None = None) -> str:
    """The whole page as a string; ``metrics`` = the heatmaps (default: accuracy_drop, asr
    where defined, recall, fpr)."""
    metrics = list(metrics) if metrics else default_html_metrics(report)
    n_seeds = max((c.planned for c in report.cells), default=0)
    done, total = sum(c.finished for c in report.cells), sum(c.planned for c in report.cells)
    attacks, defenses = axis_labels(report.cells)
    bad = sum(1 for e in report.expectations if e.failure)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>redteam report: {_E(report.name)}</title><style>{_CSS}</style></head><body><main>",
        f"<h1>redteam report: {_E(report.name)}</h1>",
        '<div class="summary">',
        f"<div>cells<b>{len(report.cells)}</b>{len(attacks)} attacks × {len(defenses)} defenses</div>",
        f"<div>seeds per cell<b>{n_seeds}</b>runs finished: {done}/{total}</div>",
    ]
    if report.expectations:
        cls = "bad" if bad else "ok"
        parts.append(f'<div>expectations<b class="{cls}">{len(report.expectations) - bad}/'
                     f"{len(report.expectations)}</b>hold</div>")
    parts.append("</div>")
    sections = [("defenders", "Defender's summary"), ("expectations", "Expectations"), ("heatmaps", "Heatmaps"), ("fraction", "Against the fraction"),
                ("convergence", "Convergence"), ("detection", "Detection"), ("breakdown", "Breakdown fraction"),
                ("envelope", "Envelope utilisation"), ("metrics", "All metrics"), ("seeds", "Seeds"),
                ("scenario", "Scenario"),
                ("reproduce", "Versions and reproduce")]
    parts.append("<nav>" + "".join(f'<a href="#{i}">{_E(t)}</a>' for i, t in sections) + "</nav>")

    parts.append('<h2 id="defenders">Defender\'s summary</h2>' + _defenders(report))
    parts.append('<h2 id="expectations">Expectations</h2>' + _expectations(report))

    parts.append('<h2 id="heatmaps">Heatmaps</h2>')
    parts.append(f'<p class="muted">Attacks as rows, defenses as columns. {_E(LEGEND)}; grey = undefined.</p>')
    for m in metrics:
        notes = "".join(f'<p class="muted">— {_E(line)}</p>' for line in undefined_notes(report.cells, m))
        if not report.defined(m):
            parts.append(f'<h3>{_E(m)}</h3><p class="muted">{_E(m)} is undefined for every cell.</p>' + notes)
            continue
        parts.append(f"<h3>{_E(m)}</h3>")
        from .defender import na_note

        no_reject = report.defenders.non_rejecting if report.defenders is not None else frozenset()
        note = na_note(report, m)
        parts.append(_img(heatmap_figure(report.cells, m, no_reject, report.shared_cells(m)), f"heatmap of {m}",
                          f"{m}: {REPORT_METRICS[m]}" + (f"; {note}" if note else "")) + notes
                     + _shared_list(report, [m]))

    parts.append('<h2 id="fraction">Accuracy drop against the malicious fraction</h2>')
    fig = fraction_figure(report)
    if fig is None:
        parts.append('<p class="muted">The matrix has no malicious-fraction axis with two or more values.</p>')
    else:
        parts.append(_img(fig, "accuracy drop against the malicious fraction",
                          f"Seed mean with its 95 % interval; dotted: the breakdown margin "
                          f"{report.accuracy_margin:g}."))

    parts.append('<h2 id="convergence">Convergence</h2>')
    for group, curves in settings_groups(report.curves).items():
        if group:
            parts.append(f"<h3>{_E(group_title(group))}</h3>")
        parts.append(_img(convergence_figure(curves), "convergence curves " + group_title(group),
                          "Clean test accuracy per round, mean over seeds: attacked (solid) vs the no-attack "
                          "baseline of the same seeds (dashed). Rows: attacks; columns: defenses.", dpi=90))

    parts.append('<h2 id="detection">Detection</h2>' + _detection(report))
    parts.append('<h2 id="breakdown">Breakdown fraction</h2>' + _breakdown(report))
    parts.append('<h2 id="envelope">Envelope utilisation</h2>' + _envelope(report))
    parts.append('<h2 id="metrics">All metrics</h2>' + _all_metrics(report))
    parts.append('<h2 id="seeds">Seeds</h2>' + _seeds(report))

    parts.append('<h2 id="scenario">Scenario</h2>')
    where = f" from <code>{_E(report.file)}</code>" if report.file else ""
    digest = f", digest <code>{_E(report.digest[:16])}…</code>" if report.digest else ""
    parts.append(f"<p>{_E(report.name)}{where}{digest}</p>")
    if report.scenario_text is not None:  # the file as written, comments and line breaks included
        cut = (f" (its first {len(report.scenario_text):,} characters)" if report.scenario_text_truncated else "")
        parts.append(f'<p class="muted">The file as written when the matrix ran{cut}.</p>')
        parts.append(f'<pre class="src">{_E(report.scenario_text)}</pre>')
    elif report.scenario_doc:
        parts.append('<p class="muted">The store predates keeping the file as written: its parsed '
                     "definition, written out again as TOML.</p>")
        parts.append(f'<pre class="src">{_E(toml_dump(report.scenario_doc))}</pre>')
    else:
        parts.append("<pre>(not recorded in the store)</pre>")

    parts.append('<h2 id="reproduce">Versions and reproduce</h2>')
    parts.append(_table(["package", "version"], [[k, str(v)] for k, v in sorted(report.versions.items())]))
    cmds = [report.reproduce or "(no reproduce command recorded)", f"redteam report {shlex.quote(str(report.out_dir))}"]
    parts.append(f"<pre>{_E(chr(10).join(cmds))}</pre>")
    parts.append(f'<p class="muted">Store: <code>{_E(str(report.source))}</code></p>')
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def write_html(report: Report, out: str | Path | None = None, metrics: Sequence[str] | None = None) -> Path:
    """Render the page and write it atomically to ``out`` (default ``DIR/report.html``),
    through an unpredictable temporary file (see :mod:`redteam.runner.outputs`)."""
    from ..runner.outputs import OutputError, atomic_write_text
    from .aggregate import ReportError

    path = Path(out) if out is not None else report.out_dir / "report.html"
    text = render_html(report, metrics)
    try:
        return atomic_write_text(path, text, option="--out")
    except OutputError as exc:
        raise ReportError(str(exc)) from None
