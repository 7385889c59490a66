"""The limits file (``redteam limits FILE.toml``): a proposal's numbers, validated.

Every table and key is checked; a mistake is one ``InvalidScenario`` line naming the file,
the key, the value and what was expected. See ``scenarios/limits.toml`` for every key with
a comment, and docs/limits.md for the formulas they feed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..errors import InvalidScenario
from ..scenario_limits import Limits, read_toml

__all__ = ["ModelShape", "GPU", "Training", "TransportPlan", "Peers", "Cluster", "NonIID", "LimitsConfig",
           "load_limits", "parse_limits"]

_CODECS = ("none", "fp16", "bf16", "int8", "topk", "randk")


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    vocab: int


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    memory_gb: float
    tflops: float  # dense 16-bit tensor throughput (fp32 accumulate), TFLOP/s
    price_per_hour: float
    power_w: float
    idle_power_w: float


@dataclass(frozen=True, slots=True)
class Training:
    precision: str = "bf16"
    optimizer: str = "adamw"
    seq_len: int = 2048
    micro_batch: int = 1
    grad_accum: int = 1
    inner_steps: int = 500
    mfu: float = 0.35
    overhead_gb: float = 1.0
    token_efficiency: float = 1.0
    attention: str = "flash"
    critical_batch_tokens: float = 2e6

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.micro_batch * self.grad_accum


@dataclass(frozen=True, slots=True)
class TransportPlan:
    codecs: tuple[tuple[str, dict[str, Any]], ...] = (("none", {}), ("bf16", {}), ("int8", {}),
                                                       ("topk", {"fraction": 0.01}))
    chunk_size: int = 4 << 20
    signed: bool = True
    segment_params: int = 1 << 30
    sample_params: int = 1 << 20


@dataclass(frozen=True, slots=True)
class Peers:
    counts: tuple[int, ...] = (10, 100, 1000)
    uplink_mbps: float = 20.0
    uplink_sigma: float = 0.8
    downlink_mbps: float = 100.0
    latency_ms: float = 50.0
    latency_sigma: float = 0.5
    compute_sigma: float = 0.4
    churn_leave: float = 0.05
    churn_join: float = 0.5
    deadline_factor: float | None = 1.5
    rounds: int = 50
    gpu: str = ""
    aggregator_uplink_mbps: float = 1000.0
    aggregator_ingress_mbps: float = 10_000.0


@dataclass(frozen=True, slots=True)
class Cluster:
    gpu: str = ""
    count: int = 256
    mfu: float = 0.4
    pue: float = 1.2
    batch_tokens: float = 2e6  # tokens per step; parse_limits' default: [limits.training] critical_batch_tokens


@dataclass(frozen=True, slots=True)
class NonIID:
    run: bool = True
    clients: int = 20
    rounds: int = 30
    alpha: float = 0.1
    local_steps: int = 10
    seed: int = 0


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    name: str
    seed: int
    target_tokens: float
    models: tuple[ModelShape, ...]
    gpus: tuple[GPU, ...]
    training: Training
    transport: TransportPlan
    peers: Peers
    cluster: Cluster
    noniid: NonIID
    results: Mapping[str, str] = field(default_factory=dict)
    file: str = ""
    base_dir: str = "."

    def gpu(self, name: str) -> GPU:
        return next(g for g in self.gpus if g.name == name)


class _Checker:
    def __init__(self, file: str) -> None:
        self.file = file

    def err(self, where: str, value: Any, expected: str) -> InvalidScenario:
        text = repr(value)
        text = text if len(text) <= 60 else text[:57] + "..."
        return InvalidScenario(f"{self.file}: {where} = {text}: {expected}")

    def table(self, doc: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
        v = doc.get(key, {})
        if not isinstance(v, dict):
            raise self.err(f"{where}", v, "must be a table")
        return v

    def keys(self, t: Mapping[str, Any], allowed: set[str], where: str) -> None:
        for k in t:
            if k not in allowed:
                named = repr(k) if len(k) <= 60 else repr(k[:59] + "…")  # a key may be as long as the file
                raise InvalidScenario(
                    f"{self.file}: {where}: unknown key {named} (allowed: {', '.join(sorted(allowed))})")

    def num(self, t: Mapping[str, Any], key: str, where: str, default: Any, *, low: float = 0.0,
            low_open: bool = True, high: float = math.inf, integer: bool = False) -> Any:
        v = t.get(key, default)
        if v is None:  # no default: the key is required (TOML has no null)
            raise InvalidScenario(f"{self.file}: {where}.{key}: missing: a required number")
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        if integer:
            ok = ok and (isinstance(v, int) or float(v).is_integer()) and abs(v) < 2**53
        if ok:
            ok = (v > low if low_open else v >= low) and v <= high
        if not ok:
            kind = "an integer" if integer else "a finite number"
            bound = f"{'>' if low_open else '≥'} {low:g}" + (f" and ≤ {high:g}" if high < math.inf else "")
            raise self.err(f"{where}.{key}", v, f"must be {kind} {bound}")
        return int(v) if integer else float(v)

    def text(self, t: Mapping[str, Any], key: str, where: str, default: str | None = None,
             choices: tuple[str, ...] | None = None) -> str:
        v = t.get(key, default)
        if not isinstance(v, str) or not v or len(v) > 200 or not v.isprintable():
            raise self.err(f"{where}.{key}", v, "must be a non-empty line of text")
        if choices is not None and v not in choices:
            raise self.err(f"{where}.{key}", v, f"must be one of {', '.join(choices)}")
        return v


def _model(c: _Checker, m: Any, i: int) -> ModelShape:
    where = f"[[limits.model]] #{i + 1}"
    if not isinstance(m, dict):
        raise c.err(where, m, "must be a table")
    c.keys(m, {"name", "params", "layers", "hidden", "heads", "vocab"}, where)
    layers = c.num(m, "layers", where, None, low=1, low_open=False, high=10_000, integer=True)
    hidden = c.num(m, "hidden", where, None, low=1, low_open=False, high=10**6, integer=True)
    heads = c.num(m, "heads", where, None, low=1, low_open=False, high=10**5, integer=True)
    vocab = c.num(m, "vocab", where, 50_257, low=1, low_open=False, high=10**8, integer=True)
    if hidden % heads:
        raise c.err(f"{where}.heads", heads, f"must divide hidden = {hidden}")
    from .formulas import transformer_params

    params = c.num(m, "params", where, transformer_params(layers, hidden, vocab), high=1e15)
    return ModelShape(c.text(m, "name", where), params, layers, hidden, heads, vocab)


def _gpu(c: _Checker, g: Any, i: int) -> GPU:
    where = f"[[limits.gpu]] #{i + 1}"
    if not isinstance(g, dict):
        raise c.err(where, g, "must be a table")
    c.keys(g, {"name", "memory_gb", "tflops", "price_per_hour", "power_w", "idle_power_w"}, where)
    power = c.num(g, "power_w", where, None, high=1e5)
    return GPU(
        name=c.text(g, "name", where),
        memory_gb=c.num(g, "memory_gb", where, None, high=1e5),
        tflops=c.num(g, "tflops", where, None, high=1e6),
        price_per_hour=c.num(g, "price_per_hour", where, None, low=0, low_open=False, high=1e5),
        power_w=power,
        idle_power_w=c.num(g, "idle_power_w", where, 0.1 * power, low=0, low_open=False, high=1e5),
    )


def parse_limits(doc: Mapping[str, Any], *, file: str = "<limits>", base_dir: str = ".") -> LimitsConfig:
    """Validate a parsed limits document (see ``scenarios/limits.toml``)."""
    c = _Checker(file)
    if set(doc) != {"limits"}:
        extra = sorted(set(doc) - {"limits"})
        if "limits" not in doc:
            raise InvalidScenario(f"{file}: no [limits] table: this is not a limits file "
                                  "(see scenarios/limits.toml)")
        raise InvalidScenario(f"{file}: unknown top-level table(s) {', '.join(extra)}: everything lives under [limits]")
    top = c.table(doc, "limits", "[limits]")
    c.keys(top, {"name", "seed", "target_tokens", "model", "gpu", "training", "transport", "peers", "cluster",
                 "noniid", "results"}, "[limits]")
    models_raw, gpus_raw = top.get("model", []), top.get("gpu", [])
    if not isinstance(models_raw, list) or not models_raw or len(models_raw) > 50:
        raise c.err("[[limits.model]]", models_raw, "must be 1–50 tables")
    if not isinstance(gpus_raw, list) or not gpus_raw or len(gpus_raw) > 50:
        raise c.err("[[limits.gpu]]", gpus_raw, "must be 1–50 tables")
    models = tuple(_model(c, m, i) for i, m in enumerate(models_raw))
    gpus = tuple(_gpu(c, g, i) for i, g in enumerate(gpus_raw))
    for what, names in (("model", [m.name for m in models]), ("gpu", [g.name for g in gpus])):
        if len(set(names)) != len(names):
            raise c.err(f"[[limits.{what}]].name", names, "names must be unique")
    gpu_names = tuple(g.name for g in gpus)

    t = c.table(top, "training", "[limits.training]")
    w = "[limits.training]"
    c.keys(t, {"precision", "optimizer", "seq_len", "micro_batch", "grad_accum", "inner_steps", "mfu",
               "overhead_gb", "token_efficiency", "attention", "critical_batch_tokens"}, w)
    training = Training(
        precision=c.text(t, "precision", w, "bf16", ("fp32", "bf16", "fp16")),
        optimizer=c.text(t, "optimizer", w, "adamw", ("sgd", "sgd_momentum", "adamw", "adamw_8bit")),
        seq_len=c.num(t, "seq_len", w, 2048, low=1, low_open=False, high=10**7, integer=True),
        micro_batch=c.num(t, "micro_batch", w, 1, low=1, low_open=False, high=10**6, integer=True),
        grad_accum=c.num(t, "grad_accum", w, 1, low=1, low_open=False, high=10**6, integer=True),
        inner_steps=c.num(t, "inner_steps", w, 500, low=1, low_open=False, high=10**7, integer=True),
        mfu=c.num(t, "mfu", w, 0.35, high=1.0),
        overhead_gb=c.num(t, "overhead_gb", w, 1.0, low=0, low_open=False, high=1e4),
        token_efficiency=c.num(t, "token_efficiency", w, 1.0, high=1.0),
        attention=c.text(t, "attention", w, "flash", ("flash", "standard")),
        critical_batch_tokens=c.num(t, "critical_batch_tokens", w, 2e6, high=1e15),
    )

    t = c.table(top, "transport", "[limits.transport]")
    w = "[limits.transport]"
    c.keys(t, {"codecs", "chunk_size", "signed", "segment_params", "sample_params"}, w)
    codecs_raw = t.get("codecs", [{"name": "none"}, {"name": "bf16"}, {"name": "int8"},
                                  {"name": "topk", "fraction": 0.01}])
    if not isinstance(codecs_raw, list) or not codecs_raw or len(codecs_raw) > 20:
        raise c.err(f"{w}.codecs", codecs_raw, "must be a list of 1–20 tables like { name = \"int8\" }")
    codecs = []
    for i, spec in enumerate(codecs_raw):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or spec["name"] not in _CODECS:
            raise c.err(f"{w}.codecs[{i}]", spec, f"must be a table with name in {', '.join(_CODECS)}")
        codecs.append((spec["name"], {k: v for k, v in spec.items() if k != "name"}))
    signed = t.get("signed", True)
    if not isinstance(signed, bool):
        raise c.err(f"{w}.signed", signed, "must be true or false")
    transport = TransportPlan(
        codecs=tuple(codecs),
        chunk_size=c.num(t, "chunk_size", w, 4 << 20, low=64, low_open=False, high=1 << 30, integer=True),
        signed=signed,
        segment_params=c.num(t, "segment_params", w, 1 << 30, low=1024, low_open=False, high=2**32 - 1,
                             integer=True),
        sample_params=c.num(t, "sample_params", w, 1 << 20, low=1024, low_open=False, high=1 << 24, integer=True),
    )

    t = c.table(top, "peers", "[limits.peers]")
    w = "[limits.peers]"
    c.keys(t, {"counts", "uplink_mbps", "uplink_sigma", "downlink_mbps", "latency_ms", "latency_sigma",
               "compute_sigma", "churn_leave", "churn_join", "deadline_factor", "rounds", "gpu",
               "aggregator_uplink_mbps", "aggregator_ingress_mbps"}, w)
    counts = t.get("counts", [10, 100, 1000])
    if (not isinstance(counts, list) or not counts or len(counts) > 20
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 100_000 for x in counts)):
        raise c.err(f"{w}.counts", counts, "must be a list of 1–20 integers in [1, 100000]")
    peer_gpu = c.text(t, "gpu", w, gpu_names[0], gpu_names)
    deadline = t.get("deadline_factor", 1.5)
    peers = Peers(
        counts=tuple(sorted(set(counts))),
        uplink_mbps=c.num(t, "uplink_mbps", w, 20.0, low=1e-6, low_open=False, high=1e6),
        uplink_sigma=c.num(t, "uplink_sigma", w, 0.8, low=0, low_open=False, high=5),
        downlink_mbps=c.num(t, "downlink_mbps", w, 100.0, low=1e-6, low_open=False, high=1e6),
        latency_ms=c.num(t, "latency_ms", w, 50.0, low=0, low_open=False, high=1e5),
        latency_sigma=c.num(t, "latency_sigma", w, 0.5, low=0, low_open=False, high=5),
        compute_sigma=c.num(t, "compute_sigma", w, 0.4, low=0, low_open=False, high=5),
        churn_leave=c.num(t, "churn_leave", w, 0.05, low=0, low_open=False, high=0.99),
        churn_join=c.num(t, "churn_join", w, 0.5, low=0, low_open=False, high=1.0),
        deadline_factor=None if deadline is False else c.num(t, "deadline_factor", w, 1.5, low=1.0,
                                                              low_open=False, high=100),
        rounds=c.num(t, "rounds", w, 50, low=1, low_open=False, high=10_000, integer=True),
        gpu=peer_gpu,
        aggregator_uplink_mbps=c.num(t, "aggregator_uplink_mbps", w, 1000.0, low=1e-6, low_open=False, high=1e7),
        aggregator_ingress_mbps=c.num(t, "aggregator_ingress_mbps", w, 10_000.0, low=1e-6, low_open=False,
                                      high=1e7),
    )

    t = c.table(top, "cluster", "[limits.cluster]")
    w = "[limits.cluster]"
    c.keys(t, {"gpu", "count", "mfu", "pue", "batch_tokens"}, w)
    cluster = Cluster(
        batch_tokens=c.num(t, "batch_tokens", w, training.critical_batch_tokens, high=1e15),
        gpu=c.text(t, "gpu", w, gpu_names[-1], gpu_names),
        count=c.num(t, "count", w, 256, low=1, low_open=False, high=10**7, integer=True),
        mfu=c.num(t, "mfu", w, 0.4, high=1.0),
        pue=c.num(t, "pue", w, 1.2, low=1.0, low_open=False, high=5.0),
    )

    t = c.table(top, "noniid", "[limits.noniid]")
    w = "[limits.noniid]"
    c.keys(t, {"run", "clients", "rounds", "alpha", "local_steps", "seed"}, w)
    run = t.get("run", True)
    if not isinstance(run, bool):
        raise c.err(f"{w}.run", run, "must be true or false")
    noniid = NonIID(
        run=run,
        clients=c.num(t, "clients", w, 20, low=2, low_open=False, high=200, integer=True),
        rounds=c.num(t, "rounds", w, 30, low=1, low_open=False, high=500, integer=True),
        alpha=c.num(t, "alpha", w, 0.1, high=1e4),
        local_steps=c.num(t, "local_steps", w, 10, low=1, low_open=False, high=1000, integer=True),
        seed=c.num(t, "seed", w, 0, low=0, low_open=False, high=2**32 - 1, integer=True),
    )

    results = c.table(top, "results", "[limits.results]")
    c.keys(results, {"envelope", "provenance"}, "[limits.results]")
    for k, v in results.items():
        if not isinstance(v, str) or not v or len(v) > 4096:
            raise c.err(f"[limits.results].{k}", v, "must be the path of a results directory")

    return LimitsConfig(
        name=c.text(top, "name", "[limits]", "limits"),
        seed=c.num(top, "seed", "[limits]", 0, low=0, low_open=False, high=2**32 - 1, integer=True),
        target_tokens=c.num(top, "target_tokens", "[limits]", 1e11, high=1e18),
        models=models, gpus=gpus, training=training, transport=transport, peers=peers,
        cluster=cluster, noniid=noniid, results=dict(results), file=file, base_dir=base_dir,
    )


def load_limits(path: str | Path) -> LimitsConfig:
    """Read and validate a limits file, under the same bounds as a scenario file (see
    :func:`redteam.scenario_limits.read_toml`: a regular file under ``REDTEAM_MAX_FILE_BYTES``,
    nesting, dotted keys, 64-bit integers)."""
    p = Path(path)
    doc = read_toml(p, Limits.from_env(), what="limits file")
    return parse_limits(doc, file=p.name, base_dir=str(p.resolve().parent))
