"""The seven answers, computed: the formulas of :mod:`.formulas` fed with what the harness
itself produces (codec payload sizes, manifest and signature sizes, the simulator's device
draws, real federations for the non-IID gap).

Each ``*_section`` returns plain JSON-ready data; :mod:`.render` prints and plots it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import formulas as F
from .config import GPU, LimitsConfig, ModelShape

__all__ = ["header_bytes", "payload_bytes", "bandwidth_section", "straggler_section", "vram_section",
           "cost_section", "noniid_section", "assumptions_section", "round_stats", "results_section", "compute_all", "step_seconds",
           "simulate_rounds"]


# ------------------------------------------------------------------ bytes the transport produces
def _codec(name: str, params: dict[str, Any]) -> Any:
    from ..transport.compression import make_codec

    return make_codec(name, **params)


def _label(name: str, params: dict[str, Any]) -> str:
    """A short codec label: its name and the parameters the file gave (``topk(fraction=0.01)``)."""
    return name + (f"({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")


def payload_bytes(codec: Any, params: float, segment: int) -> tuple[int, int]:
    """(bytes, segments): an update of ``params`` values sent as segments of at most
    ``segment`` values (the wire format's dimension is a uint32), each its own payload."""
    p = int(round(params))
    full, rest = divmod(p, segment)
    total = full * codec.payload_size(segment) if full else 0
    if rest:
        total += codec.payload_size(rest)
    return total, full + (1 if rest else 0)


def _digit_sum(m: int) -> int:
    """Σ_{i=1}^{m} (number of decimal digits of i)."""
    total, k, lo = 0, 1, 1
    while lo <= m:
        hi = min(m, 10 * lo - 1)
        total += k * (hi - lo + 1)
        k, lo = k + 1, lo * 10
    return total


def header_bytes(codec_spec: str, payload_len: int, chunk_size: int, signed: bool) -> int:
    """Bytes of the header the transport sends for one payload: its update manifest
    (canonical JSON), or with ``signed`` the DSSE envelope of its in-toto statement.

    Exact for manifests: one manifest with the real lengths and one digest is measured, and
    each further chunk adds one hex digest (``,"<64 hex>"``, 67 bytes). For signed headers the
    statement's length is exact the same way (chunk i's subject grows with the digits of i),
    base64 makes it 4·⌈L/3⌉, and the envelope's remaining bytes (payload type, key id, the DER
    signature) are measured on a real signature: within a few bytes (DER lengths vary).
    No payload of the model's size is ever built.
    """
    from ..transport.chunking import UpdateManifest
    from ..transport.signing import derive_key, sign_update, update_statement

    n = max(1, math.ceil(payload_len / chunk_size))

    def manifest(k: int) -> UpdateManifest:
        return UpdateManifest(round=0, client=0, parent_digest="0" * 64, codec=codec_spec, payload_len=payload_len,
                              chunk_size=chunk_size, chunk_digests=("0" * 64,) * k, merkle_root="0" * 64,
                              nonce="0" * 32)

    if not signed:
        return len(manifest(1).to_json()) + 67 * (n - 1)
    one, two = len(update_statement(manifest(1))), len(update_statement(manifest(2)))
    entry1 = two - one  # the subject of chunk 1 (one digit), with its comma
    stmt = one + (n - 1) * (entry1 - 1) + _digit_sum(n - 1)
    envelope_one = len(sign_update(manifest(1), derive_key(np.random.default_rng(0))))
    rest = envelope_one - 4 * math.ceil(one / 3)
    return 4 * math.ceil(stmt / 3) + rest


def _header_total(codec_spec: str, payload: int, segments: int, segment_payload: int, chunk_size: int,
                  signed: bool) -> int:
    """Headers of an update sent as ``segments`` payloads (all but the last of ``segment_payload`` bytes)."""
    if segments == 1:
        return header_bytes(codec_spec, payload, chunk_size, signed)
    last = payload - (segments - 1) * segment_payload
    return ((segments - 1) * header_bytes(codec_spec, segment_payload, chunk_size, signed)
            + header_bytes(codec_spec, last, chunk_size, signed))


def bandwidth_section(cfg: LimitsConfig) -> dict[str, Any]:
    """(1) per model × codec, one round's traffic: a peer's upload (bytes, time at the median
    and the slow-tenth uplink), its download of the merged update (bytes, time at the median
    downlink; the broadcast bound to the largest peer count), and the aggregator's ingress
    (every peer of the largest count uploading into ``aggregator_ingress_mbps``)."""
    import torch

    tp, pe = cfg.transport, cfg.peers
    gen = torch.Generator().manual_seed(cfg.seed)
    sample = (torch.randn((1, tp.sample_params), generator=gen) * 1e-3)
    rows, measured = [], []
    up_med = pe.uplink_mbps * 1e6
    up_p90 = F.lognormal_quantile(pe.uplink_mbps, pe.uplink_sigma, 0.1) * 1e6  # the slow tenth
    rtt = pe.latency_ms / 1000.0
    n_max = max(pe.counts)
    for name, params in tp.codecs:
        codec = _codec(name, params)
        got = len(codec.encode_many(sample, gen)[0][0])
        want = codec.payload_size(tp.sample_params)
        if got != want:  # pragma: no cover - a codec whose size formula disagrees with its encoder
            raise RuntimeError(f"codec {codec.spec}: encoded {got} bytes, payload_size says {want}")
        measured.append({"codec": _label(name, params), "spec": codec.spec, "sample_params": tp.sample_params, "encoded_bytes": got,
                         "bytes_per_param": got / tp.sample_params})
        for m in cfg.models:
            payload, segs = payload_bytes(codec, m.params, tp.segment_params)
            header = _header_total(codec.spec, payload, segs, codec.payload_size(tp.segment_params),
                                   tp.chunk_size, tp.signed)
            download = _download_bytes(codec, m, tp)
            total = payload + header
            rows.append({
                "model": m.name, "params": m.params, "codec": _label(name, params), "payload_bytes": payload,
                "header_bytes": header, "bytes": total, "overhead": header / payload,
                "ratio_vs_fp32": total / F.raw_payload_bytes(m.params, 32),
                "upload_s_median": F.upload_seconds(total, up_med, rtt),
                "upload_s_slow10": F.upload_seconds(total, up_p90, rtt),
                "download_bytes": download,
                "download_s_median": F.upload_seconds(download, pe.downlink_mbps * 1e6, rtt),
                "broadcast_s": broadcast_seconds(cfg, download, n_max),
                "ingress_bytes": n_max * total,
                "ingress_s": F.ingress_seconds(total, n_max, pe.aggregator_ingress_mbps * 1e6),
            })
    return {"rows": rows, "measured": measured, "signed": tp.signed, "chunk_size": tp.chunk_size,
            "peers_for_broadcast": n_max, "aggregator_ingress_mbps": pe.aggregator_ingress_mbps}


def broadcast_seconds(cfg: LimitsConfig, nbytes: float, n: int) -> float:
    """Kumar & Ross's bound for the aggregator (the seed) spreading the merged update to ``n``
    peers whose uplinks are the median and whose slowest downlink is the 1 % quantile."""
    pe = cfg.peers
    return F.p2p_distribution_seconds(nbytes, pe.aggregator_uplink_mbps * 1e6, [pe.uplink_mbps * 1e6] * n,
                                      F.lognormal_quantile(pe.downlink_mbps, pe.uplink_sigma, 0.01) * 1e6)


def _download_bytes(codec: Any, m: ModelShape, tp: Any) -> int:
    """The global update every peer fetches: in the same codec when dense; a sum of sparse
    updates is no longer sparse, so sparse codecs come back as dense bf16."""
    from ..transport.compression import make_codec

    dense = codec if codec.spec.split("(")[0] in ("none", "fp16", "bf16", "int8") else make_codec("bf16")
    return payload_bytes(dense, m.params, tp.segment_params)[0]


# ------------------------------------------------------------------ stragglers
def step_seconds(params: float, tokens_per_step: int, gpu: GPU, mfu: float) -> float:
    """One inner step: 6·P·tokens / (peak · MFU)."""
    return F.training_flops(params, tokens_per_step) / (gpu.tflops * 1e12 * mfu)


def round_stats(t: np.ndarray, compute: np.ndarray, deadline: float) -> dict[str, float]:
    """One round of the online peers with arrival times ``t`` and compute times ``compute``:
    the round ends at min(max t, deadline); a peer arriving after the deadline is late and its
    compute is dropped work (share of all compute this round); idle = the share of
    peers × round time not spent computing (a late peer computes for the whole round)."""
    late = t > deadline
    rt = float(min(t.max(), deadline))
    return {"round_s": rt, "round_s_no_deadline": float(t.max()),
            "dropped_work": float(compute[late].sum() / compute.sum()),
            "idle_fraction": 1.0 - float(np.minimum(compute, rt).sum()) / (rt * len(compute)),
            "contributing": float((~late).sum())}


def simulate_rounds(cfg: LimitsConfig, n: int, step_s: float, nbytes: float, rng: np.random.Generator,
                    ) -> dict[str, float]:
    """Rounds of ``n`` peers on the simulator's devices (:class:`~redteam.transport.network.Network`
    draws: log-normal uplink, latency and compute), with churn and a deadline.

    T_i = H·c_i + bytes/bw_i + RTT_i (the simulator's arrival time of a direct upload);
    the deadline is ``deadline_factor`` × the median T_i; a peer arriving later is a
    straggler whose compute is wasted. Returns means over rounds.
    """
    from ..transport.network import Network, NetworkConfig

    pe, h = cfg.peers, cfg.training.inner_steps
    net = Network(NetworkConfig(bandwidth_mbps=pe.uplink_mbps, bandwidth_sigma=pe.uplink_sigma,
                                latency_ms=pe.latency_ms, latency_sigma=pe.latency_sigma,
                                compute_s_per_step=step_s, compute_sigma=pe.compute_sigma,
                                churn_leave=pe.churn_leave, churn_join=pe.churn_join), n, rng)
    compute = h * net.compute_s
    t = compute + nbytes / net.bytes_per_s + net.latency_s
    deadline = pe.deadline_factor * float(np.median(t)) if pe.deadline_factor else math.inf
    online = np.ones(n, dtype=bool)
    times, waits, dropped, idle, contributing, online_n = [], [], [], [], [], []
    for r in range(pe.rounds):
        if r:
            online = net.churn(online, rng)
        if not online.any():
            continue
        one = round_stats(t[online], compute[online], deadline)
        times.append(one["round_s"])
        waits.append(one["round_s_no_deadline"])
        dropped.append(one["dropped_work"])
        idle.append(one["idle_fraction"])
        contributing.append(one["contributing"])
        online_n.append(float(online.sum()))
    return {
        "peers": n, "round_s": float(np.mean(times)), "round_s_no_deadline": float(np.mean(waits)),
        "deadline_s": deadline, "dropped_work": float(np.mean(dropped)), "idle_fraction": float(np.mean(idle)),
        "contributing": float(np.mean(contributing)), "online": float(np.mean(online_n)),
        "compute_s_median": h * step_s,
        "max_compute_median_analytic": F.max_quantile_lognormal(h * step_s, pe.compute_sigma, n, 0.5),
        "max_compute_median_simulated": float(np.median(
            (h * step_s) * np.exp(pe.compute_sigma * rng.standard_normal((201, n))).max(axis=1))),
    }


def _cheapest_codec(cfg: LimitsConfig) -> Any:
    tp = cfg.transport
    return min(tp.codecs, key=lambda np_: _codec(*np_).payload_size(tp.sample_params))


def straggler_section(cfg: LimitsConfig) -> dict[str, Any]:
    """(2) round time, dropped work and idle time against the number of peers, per model.

    The whole round (``round_total_s``) = max(the simulated upload phase, the aggregator's
    ingress of the contributing peers' uploads) + the broadcast of the merged update: the
    ingress term is a lower bound (it assumes the uploads overlap perfectly), the phases do
    not overlap each other."""
    name, params = _cheapest_codec(cfg)
    codec = _codec(name, params)
    gpu = cfg.gpu(cfg.peers.gpu)
    rng = np.random.default_rng(cfg.seed)
    rows = []
    for m in cfg.models:
        nbytes = payload_bytes(codec, m.params, cfg.transport.segment_params)[0]
        step = step_seconds(m.params, cfg.training.tokens_per_step, gpu, cfg.training.mfu)
        for n in cfg.peers.counts:
            row = simulate_rounds(cfg, n, step, nbytes, rng)
            download = _download_bytes(codec, m, cfg.transport)
            ingress = F.ingress_seconds(nbytes, row["contributing"], cfg.peers.aggregator_ingress_mbps * 1e6)
            broadcast = broadcast_seconds(cfg, download, n)
            row.update(model=m.name, codec=_label(name, params), upload_bytes=nbytes, step_s=step,
                       download_bytes=download, ingress_s=ingress, broadcast_s=broadcast,
                       round_total_s=max(row["round_s"], ingress) + broadcast)
            rows.append(row)
    return {"rows": rows, "codec": _label(name, params), "gpu": gpu.name}


# ------------------------------------------------------------------ VRAM
def _model_memory(m: ModelShape, cfg: LimitsConfig, checkpointing: bool,
                  attention: str | None = None) -> dict[str, float]:
    """Training memory of ``m``; ``attention`` (``flash`` or ``standard``) defaults to
    ``[limits.training] attention``, the one the headline uses."""
    tr = cfg.training
    per = F.bytes_per_param(tr.precision, tr.optimizer)
    act = F.activation_bytes(layers=m.layers, hidden=m.hidden, heads=m.heads, seq=tr.seq_len,
                             batch=tr.micro_batch, vocab=m.vocab, checkpointing=checkpointing,
                             precision=tr.precision, attention=attention or tr.attention)
    states = {k: v * m.params for k, v in per.items() if k != "total"}
    total = sum(states.values()) + act + tr.overhead_gb * 1e9
    return {**states, "activations": act, "overhead": tr.overhead_gb * 1e9, "total": total}


def _family(cfg: LimitsConfig, params: float) -> ModelShape:
    """A transformer of ``params`` parameters shaped like the configured ones: the median
    hidden/layers aspect ratio, 128-wide heads, the largest configured vocabulary."""
    aspect = float(np.median([m.hidden / m.layers for m in cfg.models]))
    vocab = max(m.vocab for m in cfg.models)
    lo, hi = 1.0, 1e4
    for _ in range(100):  # bisection on the layer count: 12·L·(aL)² + V·aL = P
        mid = (lo + hi) / 2
        if F.transformer_params(mid, aspect * mid, vocab) < params:
            lo = mid
        else:
            hi = mid
    layers = max(1, round(lo))
    hidden = max(128, int(round(aspect * lo / 128)) * 128)
    return ModelShape(f"{params:.3g}", params, layers, hidden, max(1, hidden // 128), vocab)


def largest_trainable(cfg: LimitsConfig, gpu: GPU, checkpointing: bool) -> float:
    """The largest parameter count whose training memory fits ``gpu`` (bisection in log P)."""
    lo, hi = 1e6, 1e13
    if _model_memory(_family(cfg, lo), cfg, checkpointing)["total"] > gpu.memory_gb * 1e9:
        return 0.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if _model_memory(_family(cfg, mid), cfg, checkpointing)["total"] <= gpu.memory_gb * 1e9:
            lo = mid
        else:
            hi = mid
    return lo


def vram_section(cfg: LimitsConfig) -> dict[str, Any]:
    """(4) memory per model (with and without activation checkpointing) against each card,
    under the configured attention kernel (the headline: ``memory``, ``fits``) and the other
    one beside it (``memory_other_attention``)."""
    tr = cfg.training
    other = "standard" if tr.attention == "flash" else "flash"
    models = []
    for m in cfg.models:
        plain, ckpt = _model_memory(m, cfg, False), _model_memory(m, cfg, True)
        models.append({"model": m.name, "params": m.params, "memory": plain, "memory_checkpointed": ckpt,
                       "memory_other_attention": _model_memory(m, cfg, False, other),
                       "fits": {g.name: plain["total"] <= g.memory_gb * 1e9 for g in cfg.gpus},
                       "fits_checkpointed": {g.name: ckpt["total"] <= g.memory_gb * 1e9 for g in cfg.gpus}})
    cards = [{"gpu": g.name, "memory_gb": g.memory_gb,
              "largest_params": largest_trainable(cfg, g, False),
              "largest_params_checkpointed": largest_trainable(cfg, g, True),
              "states_only_bound": max(0.0, (g.memory_gb - tr.overhead_gb) * 1e9)
              / F.bytes_per_param(tr.precision, tr.optimizer)["total"]} for g in cfg.gpus]
    return {"models": models, "cards": cards, "precision": tr.precision, "optimizer": tr.optimizer,
            "attention": tr.attention, "other_attention": other,
            "bytes_per_param": F.bytes_per_param(tr.precision, tr.optimizer), "seq_len": tr.seq_len,
            "micro_batch": tr.micro_batch}


# ------------------------------------------------------------------ cost
def cost_section(cfg: LimitsConfig, stragglers: dict[str, Any], vram: dict[str, Any],
                 bandwidth: dict[str, Any]) -> dict[str, Any]:
    """(5) GPU-hours, energy and money to train on ``target_tokens``: the centralized cluster
    against the federation (idle time waiting for stragglers and communication included).

    ``target_tokens`` (D) is what the cluster needs at its batch (``[limits.cluster]
    batch_tokens``, default the critical batch). A federation's effective batch is
    B = contributing peers × tokens per inner step (every peer's step feeds one outer update);
    it needs D·(1 + B/B_crit)/(1 + B_cluster/B_crit) / token_efficiency tokens (McCandlish
    et al. 2018; ``batch_efficiency`` = D ÷ that), so rounds = those tokens ÷ (contributing ·
    H · tokens per step). Every online peer is billed for every round's total time."""
    tr, cl = cfg.training, cfg.cluster
    big, peer = cfg.gpu(cl.gpu), cfg.gpu(cfg.peers.gpu)
    d = cfg.target_tokens
    rows = []
    by_model = {r["model"]: r for r in vram["models"]}
    for m in cfg.models:
        flops = F.training_flops(m.params, d)
        secs = F.cluster_seconds(flops, cl.count, big.tflops * 1e12, cl.mfu)
        hours = cl.count * secs / 3600.0
        central = {"gpu_hours": hours, "wall_days": secs / 86400.0,
                   **F.gpu_cost(hours, big.price_per_hour, big.power_w, cl.pue)}
        fits = by_model[m.name]["fits_checkpointed"][peer.name]
        for s in (r for r in stragglers["rows"] if r["model"] == m.name):
            fed: dict[str, Any] = {"fits": fits}
            if fits and s["contributing"] > 0:
                batch = s["contributing"] * tr.tokens_per_step
                factor = F.batch_token_factor(batch, tr.critical_batch_tokens, cl.batch_tokens)
                needed = d * factor / tr.token_efficiency
                tokens_round = s["contributing"] * tr.inner_steps * tr.tokens_per_step
                rounds = needed / tokens_round
                round_s = s["round_total_s"]
                billed = rounds * s["online"] * round_s / 3600.0
                # compute-busy time per online peer per round, as simulated (stragglers' wasted
                # work included: it burned energy); the rest of the billed round is idle
                busy = rounds * s["online"] * s["round_s"] * (1.0 - s["idle_fraction"]) / 3600.0
                fed.update(batch_tokens=batch, batch_factor=factor, tokens_needed=needed,
                           token_efficiency=d / needed, rounds_if_every_token_counted=d / tokens_round,
                           rounds=rounds, wall_days=rounds * round_s / 86400.0, gpu_hours=billed,
                           busy_hours=busy, idle_hours=billed - busy,
                           **F.gpu_cost(busy, peer.price_per_hour, peer.power_w, 1.0, billed - busy,
                                        peer.idle_power_w))
                fed["usd_ratio"] = fed["usd"] / central["usd"] if central["usd"] else math.inf
            rows.append({"model": m.name, "params": m.params, "peers": s["peers"], "flops": flops,
                         "centralized": central, "federated": fed})
    return {"rows": rows, "target_tokens": d, "cluster": {"gpu": big.name, "count": cl.count, "mfu": cl.mfu,
                                                          "batch_tokens": cl.batch_tokens},
            "peer_gpu": peer.name, "mfu": tr.mfu, "critical_batch_tokens": tr.critical_batch_tokens,
            "token_efficiency": tr.token_efficiency}


# ------------------------------------------------------------------ (3) non-IID, measured
def noniid_section(cfg: LimitsConfig, progress: Any = None, threads: str | int | None = None) -> dict[str, Any]:
    """(3) FedAvg under non-IID data: the same digits federation with IID and Dirichlet(α)
    clients (same seed), trained here; final accuracy, rounds to 90 %, the curves. Each runs
    under the thread policy ``threads`` (:mod:`redteam.runner.threads`; ``None``: the default)."""
    ni = cfg.noniid
    if not ni.run:
        return {"skipped": "[limits.noniid] run = false"}
    from ..federation.loop import Federation
    from ..runner.threads import run_threads
    from ..scenario import parse_scenario

    out: dict[str, Any] = {"alpha": ni.alpha, "clients": ni.clients, "rounds": ni.rounds, "runs": {}}
    for label, part in (("iid", {"partition": "iid"}), (f"dirichlet({ni.alpha:g})",
                                                        {"partition": "dirichlet", "alpha": ni.alpha})):
        doc = {"scenario": {"name": f"limits-noniid-{label}", "seed": ni.seed}, "workload": {"name": "digits"},
               "federation": {"clients": ni.clients, "rounds": ni.rounds, "local_steps": ni.local_steps,
                              "batch_size": 16, "lr": 0.1, "target_accuracy": 0.9, **part}}
        fed = Federation(parse_scenario(doc, file="limits.toml"), device="cpu")
        with run_threads(fed, threads):
            res = fed.run()
        acc = [r.accuracy for r in res.records]
        hit = next((i + 1 for i, a in enumerate(acc) if a >= 0.9), None)
        out["runs"][label] = {"final_accuracy": acc[-1], "rounds_to_90": hit, "accuracy": acc}
        if progress is not None:
            progress(f"non-IID: {label} done")
    runs = list(out["runs"].values())
    out["gap"] = runs[0]["final_accuracy"] - runs[1]["final_accuracy"]
    return out


# ------------------------------------------------------------------ (6), (7) from the stores
_HOW = {"envelope": "redteam matrix scenarios/envelope.toml --out results/envelope",
        "provenance": "redteam matrix scenarios/provenance.toml --out results/provenance"}


def results_section(cfg: LimitsConfig) -> dict[str, Any]:
    """(6) the envelope of the validation rules and (7) the provenance gate: summarised from
    their results stores when ``[limits.results]`` names them, else how to measure them."""
    from pathlib import Path

    out: dict[str, Any] = {}
    for key in ("envelope", "provenance"):
        path = cfg.results.get(key)
        entry: dict[str, Any] = {"scenario": f"scenarios/{key}.toml", "command": _HOW[key]}
        if path:
            p = Path(path) if Path(path).is_absolute() else Path(cfg.base_dir) / path
            try:
                from ..report.load import load_report

                rep = load_report(p)
                entry["store"] = str(p)
                entry["cells"] = [{"attack": c.attack, "defense": c.defense,
                                   **{m: c.value(m) for m in ("accuracy_drop", "asr", "recall", "fpr")}}
                                  for c in rep.cells]
                entry["expectations"] = {"hold": sum(1 for e in rep.expectations if not e.failure),
                                         "total": len(rep.expectations)}
            except Exception as exc:  # a missing or unreadable store is reported, never fatal
                entry["unavailable"] = str(exc).splitlines()[0][:300] if str(exc) else f"{p}: {type(exc).__name__}"
        else:
            entry["unavailable"] = "no store named in [limits.results]"
        out[key] = entry
    return out


def assumptions_section(cfg: LimitsConfig) -> list[dict[str, str]]:
    """The stated assumptions every output lists: ``[{"assumption", "value", "key"}]``, the
    value as used and the file key that sets it."""
    tr, pe, cl = cfg.training, cfg.peers, cfg.cluster
    rows = [
        ("target tokens D", f"{cfg.target_tokens:g}", "target_tokens"),
        ("peer uplink (median, σ)", f"{pe.uplink_mbps:g} Mbit/s, σ {pe.uplink_sigma:g}",
         "peers.uplink_mbps, peers.uplink_sigma"),
        ("peer downlink (median)", f"{pe.downlink_mbps:g} Mbit/s", "peers.downlink_mbps"),
        ("latency (median, σ)", f"{pe.latency_ms:g} ms, σ {pe.latency_sigma:g}",
         "peers.latency_ms, peers.latency_sigma"),
        ("aggregator uplink", f"{pe.aggregator_uplink_mbps:g} Mbit/s", "peers.aggregator_uplink_mbps"),
        ("aggregator ingress", f"{pe.aggregator_ingress_mbps:g} Mbit/s", "peers.aggregator_ingress_mbps"),
        ("compute σ", f"{pe.compute_sigma:g}", "peers.compute_sigma"),
        ("churn leave / join", f"{pe.churn_leave:g} / {pe.churn_join:g}", "peers.churn_leave, peers.churn_join"),
        ("deadline", "none" if pe.deadline_factor is None else f"{pe.deadline_factor:g} × median",
         "peers.deadline_factor"),
        ("inner steps H", str(tr.inner_steps), "training.inner_steps"),
        ("tokens per inner step", f"{tr.tokens_per_step:g}", "training.seq_len × micro_batch × grad_accum"),
        ("critical batch B_crit", f"{tr.critical_batch_tokens:g} tokens", "training.critical_batch_tokens"),
        ("cluster batch", f"{cl.batch_tokens:g} tokens", "cluster.batch_tokens"),
        ("token efficiency (same batch)", f"{tr.token_efficiency:g}", "training.token_efficiency"),
        ("peer MFU / cluster MFU", f"{tr.mfu:g} / {cl.mfu:g}", "training.mfu, cluster.mfu"),
        ("precision, optimizer", f"{tr.precision}, {tr.optimizer}", "training.precision, training.optimizer"),
        ("attention (VRAM headline)", tr.attention, "training.attention"),
        ("peer GPU", pe.gpu, "peers.gpu"),
        ("cluster", f"{cl.count}× {cl.gpu}, PUE {cl.pue:g}", "cluster.count, cluster.gpu, cluster.pue"),
    ]
    rows += [(f"price: {g.name}", f"${g.price_per_hour:g}/h, {g.power_w:g} W, idle {g.idle_power_w:g} W",
              "[[limits.gpu]] price_per_hour, power_w, idle_power_w") for g in cfg.gpus]
    return [{"assumption": a, "value": v, "key": k} for a, v, k in rows]


def compute_all(cfg: LimitsConfig, progress: Any = None, threads: str | int | None = None) -> dict[str, Any]:
    """Every section, in the order of the seven failure modes, under the thread policy
    ``threads`` (``--threads``; ``None``: ``REDTEAM_THREADS`` or ``auto``): ``auto`` gives the
    small torch work here (encoding ``sample_params`` values per codec, the digits
    federations) one intra-op thread, as ``redteam run`` does; the caller's count is restored."""
    import torch

    from ..runner.threads import default_policy, threads_for

    policy = default_policy() if threads is None else threads
    before = torch.get_num_threads()
    torch.set_num_threads(threads_for(policy, work=float(cfg.transport.sample_params)))
    try:
        return _compute_all(cfg, progress, policy)
    finally:
        torch.set_num_threads(before)


def _compute_all(cfg: LimitsConfig, progress: Any, threads: str | int) -> dict[str, Any]:
    say = progress or (lambda msg: None)
    bw = bandwidth_section(cfg)
    say("(1) bandwidth done")
    st = straggler_section(cfg)
    say("(2) stragglers done")
    ni = noniid_section(cfg, say, threads)
    say("(3) non-IID done")
    vr = vram_section(cfg)
    say("(4) VRAM done")
    co = cost_section(cfg, st, vr, bw)
    say("(5) cost done")
    rs = results_section(cfg)
    return {"format": "redteam.limits/v1", "name": cfg.name, "file": cfg.file,
            "assumptions": assumptions_section(cfg), "bandwidth": bw,
            "stragglers": st, "noniid": ni, "vram": vr, "cost": co, "envelope": rs["envelope"],
            "provenance": rs["provenance"]}
