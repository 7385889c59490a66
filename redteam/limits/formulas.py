"""Closed-form models of the seven failure modes: every formula once, with its source.

Pure functions of numbers (no torch); :mod:`.compute` feeds them the project's own codec
sizes, manifest sizes and simulator draws. Units are SI unless the name says otherwise:
bytes, seconds, bits per second, FLOP/s, watts.

Sources:

* bandwidth — a payload of P values at b bits is P·b/8 bytes before compression; an upload
  takes bytes·8/uplink + RTT; the fluid minimum time to spread a file of S bytes from one
  seed to N peers (Kumar & Ross, "Peer-to-peer file distribution", 2006) is
  T_min = max{S/u_s, S/d_min, N·S/(u_s + Σu_i)};
* the aggregator's ingress — n peers each uploading S bytes into one aggregator link of
  rate r need at least n·S·8/r seconds however well the uploads overlap;
* stragglers — a synchronous round waits for max_i T_i, T_i = H·c_i + bytes_i/bw_i + RTT_i
  with log-normal device speeds; for n i.i.d. draws the q-quantile of the maximum is
  F⁻¹(q^{1/n}); for a log-normal with median m and log-σ s that is m·exp(s·Φ⁻¹(q^{1/n}));
  for i.i.d. Exp(λ) the expected maximum is H_n/λ (harmonic number);
* memory — mixed-precision Adam holds 16 bytes per parameter (2 weights + 2 gradients + 12
  fp32 master, m, v: Rajbhandari et al., "ZeRO", SC 2020); activations per transformer
  layer are s·b·h·(34 + 5·a·s/h) bytes with 16-bit activations and no recomputation, and
  2·s·b·h bytes with full recomputation (Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models", MLSys 2023, eqs. 1–2); the 5·a·s²·b term is
  the stored attention scores (softmax output, dropout mask and output), which
  FlashAttention-style kernels do not keep (Dao et al., "FlashAttention", NeurIPS 2022:
  they recompute them in the backward pass and keep one fp32 log-sum-exp per row and head,
  4·a·s·b bytes), so with them a layer stores s·b·h·34 + 4·a·s·b; the output logits
  add 4·s·b·V bytes (fp32 for the loss);
* token efficiency — data-parallel training at a batch of B tokens per step needs
  E = E_min·(1 + B/B_crit) tokens and S = S_min·(1 + B_crit/B) steps to reach a loss
  (McCandlish et al., "An Empirical Model of Large-Batch Training", 2018, eq. 2.11; B_crit
  is their critical batch B_noise): beyond B_crit more tokens per step buy few steps. A run
  at batch B therefore needs (1 + B/B_crit)/(1 + B_ref/B_crit) times the tokens of a
  reference run at batch B_ref; for LMs Kaplan et al. (2020, eq. 5.3) fit
  B_crit ≈ 2·10⁸/L^{4.8} tokens at loss L nats (≈ 1–2.5 M tokens at L = 3–2.5);
* compute and cost — training takes ≈ 6·P·D FLOPs for P parameters and D tokens (Kaplan
  et al., "Scaling Laws for Neural Language Models", 2020); wall time = FLOPs / (N·peak·MFU);
  GPU-hours × price and × power × PUE give money and energy.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = [
    "BITS",
    "raw_payload_bytes",
    "upload_seconds",
    "p2p_distribution_seconds",
    "ingress_seconds",
    "lognormal_quantile",
    "max_quantile_lognormal",
    "expected_max_exponential",
    "harmonic",
    "bytes_per_param",
    "ATTENTION",
    "activation_bytes",
    "transformer_params",
    "batch_token_factor",
    "training_flops",
    "cluster_seconds",
    "gpu_cost",
]

#: bits per value of each numeric format
BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8}


def raw_payload_bytes(params: float, bits: int) -> float:
    """P·b/8: the bytes of P values at b bits each, before any compression."""
    return params * bits / 8.0


def upload_seconds(nbytes: float, uplink_bps: float, rtt_s: float = 0.0) -> float:
    """bytes·8 / uplink + RTT (uplink in bit/s)."""
    if uplink_bps <= 0:
        raise ValueError(f"uplink_bps = {uplink_bps!r}: must be > 0")
    return nbytes * 8.0 / uplink_bps + rtt_s


def p2p_distribution_seconds(size_bytes: float, seed_up_bps: float, peer_up_bps: list[float] | tuple[float, ...],
                             min_down_bps: float) -> float:
    """Kumar & Ross's fluid lower bound for one seed spreading S bytes to N peers:
    max{S/u_s, S/d_min, N·S/(u_s + Σu_i)} (rates in bit/s, result in seconds)."""
    n = len(peer_up_bps)
    bits = size_bytes * 8.0
    return max(bits / seed_up_bps, bits / min_down_bps, n * bits / (seed_up_bps + float(sum(peer_up_bps))))


def ingress_seconds(nbytes: float, peers: float, ingress_bps: float) -> float:
    """n·S·8 / r: the least time for ``peers`` uploads of ``nbytes`` each to enter one link of
    ``ingress_bps`` bit/s (the aggregator's ingress)."""
    if ingress_bps <= 0:
        raise ValueError(f"ingress_bps = {ingress_bps!r}: must be > 0")
    return peers * nbytes * 8.0 / ingress_bps


def lognormal_quantile(median: float, sigma: float, q: float) -> float:
    """q-quantile of a log-normal with the given median and σ of its log: m·exp(σ·Φ⁻¹(q))."""
    return median * math.exp(sigma * NormalDist().inv_cdf(q))


def max_quantile_lognormal(median: float, sigma: float, n: int, q: float) -> float:
    """q-quantile of the maximum of n i.i.d. log-normals: m·exp(σ·Φ⁻¹(q^{1/n}))."""
    return lognormal_quantile(median, sigma, q ** (1.0 / n))


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + … + 1/n."""
    return float(sum(1.0 / k for k in range(1, n + 1)))


def expected_max_exponential(n: int, rate: float) -> float:
    """E[max of n i.i.d. Exp(λ)] = H_n/λ."""
    return harmonic(n) / rate


#: bytes per parameter of the optimizer state, by optimizer (fp32 state)
_OPT_STATE = {"sgd": 0, "sgd_momentum": 4, "adamw": 8, "adamw_8bit": 2}


def bytes_per_param(precision: str, optimizer: str) -> dict[str, int]:
    """Memory per parameter of weights, gradients and optimizer state.

    ``precision`` is the training precision: ``fp32``, or ``bf16``/``fp16`` mixed precision
    (16-bit weights and gradients plus an fp32 master copy, ZeRO's accounting). Adam/AdamW
    keep two fp32 moments (8 bytes), 8-bit Adam two 1-byte moments (2 bytes), SGD with
    momentum one fp32 buffer. Mixed-precision AdamW: 2 + 2 + 4 + 8 = 16 bytes; fp32 AdamW:
    4 + 4 + 8 = 16 bytes.
    """
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"precision = {precision!r}: expected fp32, bf16 or fp16")
    if optimizer not in _OPT_STATE:
        raise ValueError(f"optimizer = {optimizer!r}: expected one of {sorted(_OPT_STATE)}")
    w = 4 if precision == "fp32" else 2
    master = 0 if precision == "fp32" else 4
    return {"weights": w, "gradients": w, "master": master, "optimizer": _OPT_STATE[optimizer],
            "total": w + w + master + _OPT_STATE[optimizer]}


#: attention kernels the activation formula knows
ATTENTION = ("flash", "standard")


def activation_bytes(*, layers: int, hidden: int, heads: int, seq: int, batch: int, vocab: int,
                     checkpointing: bool, precision: str = "bf16", attention: str = "standard") -> float:
    """Activation memory of one micro-batch (Korthikanti et al. 2023).

    Without recomputation: L·s·b·h·(34 + 5·a·s/h) bytes (16-bit activations) with
    ``attention = "standard"`` (the a·s×s score matrices stored); with ``"flash"``
    (FlashAttention-style kernels: the scores are recomputed, one fp32 log-sum-exp per row and
    head kept) L·(s·b·h·34 + 4·a·s·b). With full
    activation checkpointing: each layer keeps its 16-bit input, 2·s·b·h bytes, and one layer
    at a time is recomputed in full during the backward pass. Plus 4·s·b·V for fp32 logits.
    fp32 training doubles the per-layer figures (every stored tensor is twice as wide).
    """
    if attention == "standard":
        per_layer = seq * batch * hidden * (34 + 5 * heads * seq / hidden)
    elif attention == "flash":
        per_layer = seq * batch * hidden * 34 + 4 * heads * seq * batch
    else:
        raise ValueError(f"attention = {attention!r}: expected one of {', '.join(ATTENTION)}")
    if checkpointing:
        body = layers * 2 * seq * batch * hidden + per_layer
    else:
        body = layers * per_layer
    if precision == "fp32":
        body *= 2
    return body + 4.0 * seq * batch * vocab


def transformer_params(layers: int, hidden: int, vocab: int) -> float:
    """≈ 12·L·h² + V·h: attention (4h²) and MLP (8h²) per layer, plus the embedding."""
    return 12.0 * layers * hidden * hidden + vocab * hidden


def batch_token_factor(batch: float, critical: float, reference: float) -> float:
    """(1 + B/B_crit)/(1 + B_ref/B_crit): the tokens a run at batch ``batch`` needs per token
    of a run at batch ``reference`` to reach the same loss (McCandlish et al. 2018)."""
    if critical <= 0:
        raise ValueError(f"critical = {critical!r}: must be > 0")
    return (1.0 + batch / critical) / (1.0 + reference / critical)


def training_flops(params: float, tokens: float) -> float:
    """≈ 6·P·D (forward 2PD + backward 4PD)."""
    return 6.0 * params * tokens


def cluster_seconds(flops: float, gpus: int, peak_flops: float, mfu: float) -> float:
    """FLOPs / (N · peak · MFU)."""
    return flops / (gpus * peak_flops * mfu)


def gpu_cost(gpu_hours: float, price_per_hour: float, power_w: float, pue: float = 1.0,
             idle_hours: float = 0.0, idle_power_w: float = 0.0) -> dict[str, float]:
    """Money and energy of ``gpu_hours`` busy and ``idle_hours`` idle GPU-hours.

    Money bills every hour (busy or idle): (busy + idle)·price. Energy (kWh) =
    (busy·P_busy + idle·P_idle)·PUE / 1000.
    """
    return {
        "usd": (gpu_hours + idle_hours) * price_per_hour,
        "kwh": (gpu_hours * power_w + idle_hours * idle_power_w) * pue / 1000.0,
    }
