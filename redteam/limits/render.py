"""The limits report: a terminal summary, JSON (``redteam.limits/v1``) and one HTML page
with plots (bandwidth against model size per codec, round time against peers, memory
against consumer cards, cost against model size), in the style of the matrix report."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["summary_lines", "render_html", "to_json", "human_bytes", "human_count"]

_E = html.escape


def human_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def human_count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def _secs(s: float) -> str:
    if not math.isfinite(s):
        return "∞"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s:.3g} s"


def _usd(x: float) -> str:
    return f"${human_count(x)}"


def summary_lines(res: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The report as titled tables: ``[(title, header, rows)]`` (the terminal prints them)."""
    out = [("assumptions used below (each set in the limits file; the JSON names each key)", ["assumption", "value"],
            [[a["assumption"], a["value"]] for a in res.get("assumptions", [])])]
    bw = res["bandwidth"]
    out.append((
        f"(1) bandwidth per round: each peer's upload and download of the merged update "
        f"({'signed' if bw['signed'] else 'unsigned'} headers, chunks of {human_bytes(bw['chunk_size'])}); "
        f"broadcast = P2P fluid bound to {bw['peers_for_broadcast']} peers; ingress = "
        f"{bw['peers_for_broadcast']} uploads into the aggregator's {bw['aggregator_ingress_mbps']:g} Mbit/s",
        ["model", "codec", "upload", "× fp32", "headers", "upload (median)", "upload (slowest 10%)", "download",
         "download (median)", "broadcast", "ingress", "ingress time"],
        [[r["model"], r["codec"], human_bytes(r["bytes"]), f"{r['ratio_vs_fp32']:.3f}", f"{100 * r['overhead']:.2f}%",
          _secs(r["upload_s_median"]), _secs(r["upload_s_slow10"]), human_bytes(r["download_bytes"]),
          _secs(r["download_s_median"]), _secs(r["broadcast_s"]), human_bytes(r["ingress_bytes"]),
          _secs(r["ingress_s"])] for r in bw["rows"]],
    ))
    st = res["stragglers"]
    out.append((
        f"(2) stragglers: one round on the simulator's devices ({st['gpu']}, codec {st['codec']}, churn, deadline); "
        "round total = max(compute + upload, aggregator ingress) + broadcast",
        ["model", "peers", "compute (median)", "compute + upload", "no deadline", "work dropped", "idle",
         "contributing", "ingress", "broadcast", "round total"],
        [[r["model"], str(r["peers"]), _secs(r["compute_s_median"]), _secs(r["round_s"]),
          _secs(r["round_s_no_deadline"]), f"{100 * r['dropped_work']:.1f}%", f"{100 * r['idle_fraction']:.1f}%",
          f"{r['contributing']:.1f}/{r['online']:.1f}", _secs(r["ingress_s"]), _secs(r["broadcast_s"]),
          _secs(r["round_total_s"])] for r in st["rows"]],
    ))
    ni = res["noniid"]
    if "runs" in ni:
        out.append((
            f"(3) FedAvg under non-IID data (digits, {ni['clients']} clients, {ni['rounds']} rounds, measured here)",
            ["partition", "final accuracy", "rounds to 90%"],
            [[k, f"{v['final_accuracy']:.3f}", str(v["rounds_to_90"] or "never")] for k, v in ni["runs"].items()]
            + [["gap", f"{ni['gap']:.3f}", ""]],
        ))
    vr = res["vram"]
    cards = [c["gpu"] for c in vr["cards"]]
    out.append((
        f"(4) VRAM: {vr['precision']} {vr['optimizer']} = {vr['bytes_per_param']['total']} bytes/param + "
        f"activations (seq {vr['seq_len']}, micro-batch {vr['micro_batch']}, {vr['attention']} attention: the "
        f"headline; {vr['other_attention']} attention beside it); fits: ✓ plain, ckpt = only with "
        "activation checkpointing, ✗ neither",
        ["model", "memory", "checkpointed", f"{vr['other_attention']} attention", *cards],
        [[m["model"], human_bytes(m["memory"]["total"]), human_bytes(m["memory_checkpointed"]["total"]),
          human_bytes(m["memory_other_attention"]["total"]),
          *["✓" if m["fits"][c] else ("ckpt" if m["fits_checkpointed"][c] else "✗") for c in cards]]
         for m in vr["models"]]
        + [["largest", "", "", "", *[f"{human_count(c['largest_params'])} / {human_count(c['largest_params_checkpointed'])}"
                                 for c in vr["cards"]]]],
    ))
    co = res["cost"]
    rows = []
    for r in co["rows"]:
        c, f = r["centralized"], r["federated"]
        fed = ("does not fit on " + co["peer_gpu"]) if not f.get("fits") else (
            f"{_usd(f['usd'])}, {human_count(f['kwh'])} kWh, {f['wall_days']:.3g} d, idle "
            f"{100 * f['idle_hours'] / f['gpu_hours']:.0f}%" if "usd" in f else "no peer contributes")
        ratio = f"{f['usd_ratio']:.2f}×" if "usd_ratio" in f else "—"
        eff = [human_count(f["batch_tokens"]), f"{f['token_efficiency']:.3g}",
               f"{f['rounds']:.3g} ({f['rounds_if_every_token_counted']:.3g})"] if "rounds" in f else ["—"] * 3
        rows.append([r["model"], str(r["peers"]), f"{_usd(c['usd'])}, {human_count(c['kwh'])} kWh, {c['wall_days']:.3g} d",
                     *eff, fed, ratio])
    out.append((
        f"(5) cost of {human_count(co['target_tokens'])} tokens: {co['cluster']['count']}× {co['cluster']['gpu']} "
        f"(MFU {co['cluster']['mfu']:g}, batch {human_count(co['cluster']['batch_tokens'])} tokens) against peers on "
        f"{co['peer_gpu']} (MFU {co['mfu']:g}); federated batch = contributing peers × tokens per step, token "
        f"efficiency = 1/(the batch's token factor (1 + B/B_crit)/(1 + B_cluster/B_crit), B_crit = "
        f"{human_count(co['critical_batch_tokens'])}; McCandlish et al. 2018) × token_efficiency "
        f"{co['token_efficiency']:g}; rounds needed (if every token counted)",
        ["model", "peers", "centralized", "fed batch", "token efficiency", "rounds", "federated", "fed ÷ central"], rows,
    ))
    for key, title in (("envelope", "(6) security envelope of the validation rules"),
                       ("provenance", "(7) data provenance")):
        e = res[key]
        if "cells" in e:
            ex = e["expectations"]
            out.append((f"{title}: {e['store']} ({ex['hold']}/{ex['total']} expectations hold)",
                        ["attack", "defense", "accuracy drop", "ASR", "recall"],
                        [[c["attack"], c["defense"], _f(c["accuracy_drop"]), _f(c["asr"]), _f(c["recall"])]
                         for c in e["cells"]]))
        else:
            out.append((f"{title}: not summarised ({e['unavailable']}); measure with: {e['command']}", [], []))
    return out


def _f(v: Any) -> str:
    return "—" if v is None else f"{v:.3f}"


def to_json(res: dict[str, Any]) -> str:
    def clean(o: Any) -> Any:
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    return json.dumps(clean(res), indent=2, sort_keys=False) + "\n"


# ------------------------------------------------------------------ figures
def _fig(w: float = 6.4, h: float = 3.6) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h))
    return fig, fig.add_subplot(1, 1, 1)


def _finish(fig: Any, ax: Any, xlabel: str, ylabel: str, *, logx: bool = True, logy: bool = False,
            grid: bool = True) -> Any:
    """Axis labels, scales, grid and legend shared by the limits plots."""
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if grid:
        ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _bandwidth_fig(res: dict[str, Any]) -> Any:
    fig, ax = _fig()
    rows = res["bandwidth"]["rows"]
    for codec in dict.fromkeys(r["codec"] for r in rows):
        pts = sorted((r["params"], r["bytes"]) for r in rows if r["codec"] == codec)
        ax.plot([p for p, _ in pts], [b for _, b in pts], marker="o", label=codec)
    return _finish(fig, ax, "parameters", "bytes per peer per round", logy=True)


def _straggler_fig(res: dict[str, Any]) -> Any:
    fig, ax = _fig()
    rows = res["stragglers"]["rows"]
    for model in dict.fromkeys(r["model"] for r in rows):
        pts = [r for r in rows if r["model"] == model]
        ax.plot([r["peers"] for r in pts], [r["round_s_no_deadline"] / r["compute_s_median"] for r in pts],
                marker="o", label=f"{model}: no deadline")
    first = [r for r in rows if r["model"] == rows[0]["model"]]
    ax.plot([r["peers"] for r in first], [r["max_compute_median_analytic"] / r["compute_s_median"] for r in first],
            linestyle="--", color="black", label="compute only: m·exp(σ·Φ⁻¹(0.5^{1/n}))/m")
    return _finish(fig, ax, "peers", "round time ÷ median compute time")


def _vram_fig(res: dict[str, Any]) -> Any:
    fig, ax = _fig()
    vr = res["vram"]
    names = [m["model"] for m in vr["models"]]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [m["memory"]["total"] / 1e9 for m in vr["models"]], width=0.4, label="plain")
    ax.bar([i + 0.2 for i in x], [m["memory_checkpointed"]["total"] / 1e9 for m in vr["models"]], width=0.4,
           label="activation checkpointing")
    for c in vr["cards"]:
        ax.axhline(c["memory_gb"], linestyle="--", linewidth=0.8, color="grey")
        ax.text(len(names) - 0.5, c["memory_gb"], f" {c['gpu']}", fontsize=7, va="bottom", ha="right")
    ax.set_xticks(list(x), names)
    return _finish(fig, ax, "model", "training memory (GB)", logx=False, logy=True, grid=False)


def _cost_fig(res: dict[str, Any]) -> Any:
    fig, ax = _fig()
    rows = res["cost"]["rows"]
    central = sorted({(r["params"], r["centralized"]["usd"]) for r in rows})
    ax.plot([p for p, _ in central], [u for _, u in central], marker="s", color="black", label="centralized")
    for n in sorted({r["peers"] for r in rows}):
        pts = sorted((r["params"], r["federated"]["usd"]) for r in rows if r["peers"] == n and "usd" in r["federated"])
        if pts:
            ax.plot([p for p, _ in pts], [u for _, u in pts], marker="o", label=f"federated, {n} peers")
    return _finish(fig, ax, "parameters", f"USD for {human_count(res['cost']['target_tokens'])} tokens", logy=True)


def _noniid_fig(res: dict[str, Any]) -> Any | None:
    runs = res["noniid"].get("runs")
    if not runs:
        return None
    fig, ax = _fig(6.4, 3.0)
    for label, r in runs.items():
        ax.plot(range(1, len(r["accuracy"]) + 1), r["accuracy"], label=label)
    return _finish(fig, ax, "round", "test accuracy", logx=False)


def _table(header: list[str], rows: list[list[str]]) -> str:
    if not header:
        return ""
    head = "".join(f"<th>{_E(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_E(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_CSS = ("body{font-family:system-ui,sans-serif;margin:0;background:#fafafa;color:#222}main{max-width:1100px;"
        "margin:auto;padding:1em 2em}table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.9em}"
        "td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}td:first-child,th:first-child"
        "{text-align:left}th{background:#eee}img{max-width:100%}.muted{color:#666}code,pre{background:#f0f0f0}")

_FORMULAS = """
<ul>
<li>(1) payload = the codec's exact wire size (<code>Codec.payload_size</code>, checked against a real encoded
tensor), one payload per segment of at most <code>segment_params</code> values; headers = the transport's update
manifests (and DSSE envelopes when signed), measured; upload = bytes·8/uplink + RTT; download of the merged update
(dense: a sum of sparse updates is not sparse) = bytes·8/downlink + RTT; broadcast = Kumar &amp; Ross
(2006) fluid bound max{S/u<sub>s</sub>, S/d<sub>min</sub>, N·S/(u<sub>s</sub>+Σu<sub>i</sub>)}; aggregator ingress
= N·S·8/r (the least time N uploads take to enter one link of rate r).</li>
<li>(2) T<sub>i</sub> = H·c<sub>i</sub> + bytes/bw<sub>i</sub> + RTT<sub>i</sub> on the simulator's log-normal
devices; deadline = factor × median T; the median of the maximum of n log-normals is
m·exp(σ·Φ<sup>−1</sup>(0.5<sup>1/n</sup>)); the whole round = max(that, the ingress of the contributing
peers' uploads) + the broadcast.</li>
<li>(3) two digits federations trained here, IID and Dirichlet(α), same seed.</li>
<li>(4) weights + gradients + fp32 master + optimizer state (ZeRO's 16 bytes/param for mixed-precision Adam),
activations s·b·h·(34 + 5·a·s/h) per layer with standard attention (the a·s×s scores stored), s·b·h·34 + 4·a·s·b
with FlashAttention-style kernels (scores recomputed; Dao et al. 2022), 2·s·b·h with checkpointing (Korthikanti
et al. 2023), + 4·s·b·V logits + a fixed overhead.</li>
<li>(5) 6·P·D FLOPs; cluster time = FLOPs/(N·peak·MFU); federated: the effective batch B = contributing peers ·
tokens per step needs D·(1 + B/B<sub>crit</sub>)/(1 + B<sub>cluster</sub>/B<sub>crit</sub>)/token_efficiency tokens
(McCandlish et al. 2018: E = E<sub>min</sub>(1 + B/B<sub>crit</sub>)); rounds = those tokens/(contributing peers·H·tokens
per step), every online peer billed for every round's total time (idle included), energy at busy/idle power.</li>
</ul>"""


def render_html(res: dict[str, Any]) -> str:
    from ..report.html import figure_data_uri

    def img(fig: Any, alt: str) -> str:
        return f'<img alt="{_E(alt)}" src="{figure_data_uri(fig)}">'

    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>redteam limits: {_E(res['name'])}</title><style>{_CSS}</style></head><body><main>",
             f"<h1>The seven limits: {_E(res['name'])}</h1>",
             f"<p class=\"muted\">From <code>{_E(res['file'])}</code>. Every number below is computed from the "
             "formulas listed at the end, fed with the harness's own codecs, manifests and simulator.</p>"]
    figs = {"(1)": _bandwidth_fig(res), "(2)": _straggler_fig(res), "(3)": _noniid_fig(res), "(4)": _vram_fig(res),
            "(5)": _cost_fig(res)}
    for title, header, rows in summary_lines(res):
        parts.append(f"<h2>{_E(title)}</h2>")
        fig = figs.get(title[:3])
        if fig is not None:
            parts.append(img(fig, title))
        parts.append(_table(header, rows))
    parts.append("<h2>Formulas and sources</h2>" + _FORMULAS)
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def write_outputs(res: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    from ..runner.outputs import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    return {"json": atomic_write_text(out_dir / "limits.json", to_json(res), option="--out"),
            "html": atomic_write_text(out_dir / "limits.html", render_html(res), option="--out")}
