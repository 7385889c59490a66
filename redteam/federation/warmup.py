"""Start from a trained model: a shared clean warm-up, or a model file.

The field's backdoor benchmarks attack a *trained* model (BackFed, Dao et al., arXiv
2507.04903, starts its attacks from a pre-trained checkpoint; so do Neurotoxin, Zhang et al.,
ICML 2022, and Bagdasaryan et al., AISTATS 2020). Two ways to say so in a scenario:

* ``[scenario] warmup_rounds = R``: before round 0, R rounds of clean FedAvg — the scenario's
  workload, federation, transport and seed (``warmup_seed`` where set), with attack ``none``,
  defense ``mean``, a flat hierarchy and no attack window (under ``[pipeline]``: R rounds of the
  same pipeline with no attacker and no hop checks, its stages merged by ``mean``). That warm-up
  does not depend on the cell's attack or defense, and a matrix seeds it by the replicate alone
  (:func:`redteam.matrix.replicate_seeds`), so every cell of a replicate whose settings leave
  the warm-up scenario unchanged shares it: it is computed once, kept in memory for the
  process, and written to the warm-up directory
  (``<out>/warmups/`` of a matrix, ``REDTEAM_WARMUP_DIR`` elsewhere) from which later runs
  and other worker processes read it back. Only the model is carried over: clients'
  momentum, error-feedback residuals and optimizer states, and the defenses' memory, start
  fresh at round 0 (as they do when a benchmark loads a checkpoint).
* ``[scenario] start_from = "model.safetensors"``: the model's parameters from a file in the
  safetensors format (a JSON header and raw tensors: nothing in it can run code; pickle files
  are refused). Every parameter of the workload's model must be there under its name
  (``torch.nn.Module.named_parameters``) with its shape, finite, and nothing else. A relative
  path is read from the scenario file's directory. With ``warmup_rounds`` as well, the
  warm-up starts from the file.

Warm-up files are safetensors as well (the same names), so one can be given as another
scenario's ``start_from``. A warm-up is stored under a key (the SHA-256 of the warm-up
scenario, the device type, the data and the start file's digest), and is verified by
content: when a warm-up file is written, its SHA-256 and size are recorded in the results
store it belongs to (table ``warmups``: a matrix's ``<out>/results.sqlite`` for its
``<out>/warmups/``, else a store in the warm-up directory itself), and a file is reused only
when its bytes, read once, have that digest. Any other file at that name (its weights
replaced, copied from someone else's directory, damaged, a link) is recomputed and
replaced, never read as a model: the warm-up is a cache of a computation this package can
repeat, so a mismatch costs the time to recompute it and never a wrong result, and round
0 records what was found (``extra["start"]["warmup"]["replaced"]``: the file's and the
store's digests). Round 0 records the SHA-256 of the model a run starts from
(``extra["start"]``: ``warmup.sha256``, the warm-up file's bytes, the same whether it was
computed or reused; ``start_from.sha256``), and :func:`start_digests` gives them for a run's
stored record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from collections import OrderedDict
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..errors import InvalidParameter

if TYPE_CHECKING:
    from ..scenario import Scenario
    from .params import ParamSpec

__all__ = ["load_model_file", "save_model_file", "warmup_scenario", "warmup_key", "start_params",
           "round0_params", "start_digests", "warmup_store", "warmup_is_stored", "WARMUP_DIR_ENV"]

WARMUP_DIR_ENV = "REDTEAM_WARMUP_DIR"
#: warm-ups kept in memory per process (a matrix cell's baseline and attacked run share one),
#: each with the SHA-256 of its file
_MEMO: "OrderedDict[str, tuple[torch.Tensor, str]]" = OrderedDict()
_MEMO_SIZE = 4
_MAX_FILE = 16 << 30  # a model file over 16 GiB is refused before it is read


def _sha256(path: Path) -> str:
    from ..workloads.files import sha256_file

    return sha256_file(path)


def resolve_start(scenario: "Scenario") -> Path | None:
    """The ``start_from`` file (relative to the scenario's directory), or ``None``."""
    name = scenario.scenario.start_from
    if name is None:
        return None
    p = Path(name)
    if not p.is_absolute():
        p = Path(scenario.base_dir or ".") / p
    if not p.is_file():
        raise InvalidParameter(f"[scenario].start_from = {name!r}: no such file ({p})")
    return p


_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})
_MAX_HEADER = 100 << 20  # the safetensors format's own cap on its JSON header


def _safetensors_header(path: Path, what: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, dtype)}`` of a safetensors file, from its header alone (an 8-byte
    little-endian length, then that much JSON): what the file holds is checked against the model
    before any tensor is read, so a large tensor the model does not have is never loaded."""
    import struct

    from ..workloads.files import _Budget, _parse_json

    try:
        with path.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= min(_MAX_HEADER, path.stat().st_size - 8):
                raise ValueError(f"a header length of {n}")
            raw = f.read(n)
        # parsed once its cost is charged: 100 MB of "[]," would take gigabytes
        header = _parse_json(raw, path, f"{what} header", _Budget(what))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            shape, dtype = info.get("shape"), info.get("dtype")  # type: ignore[union-attr]
            if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                    and isinstance(dtype, str)):
                raise ValueError(f"tensor {name[:80]!r} has no valid shape and dtype")
            out[name] = (tuple(shape), dtype)
        return out
    except (OSError, ValueError, RecursionError, AttributeError, struct.error) as exc:
        raise InvalidParameter(f"{what} = {str(path)!r}: not a readable safetensors file ({exc})") from None


def load_model_file(path: Path, spec: "ParamSpec", what: str = "[scenario].start_from") -> torch.Tensor:
    """The flat float32 parameter vector stored in a safetensors file, checked against ``spec``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    size = path.stat().st_size
    if size > _MAX_FILE:
        raise InvalidParameter(f"{what} = {str(path)!r}: {size} bytes, more than the cap of {_MAX_FILE}")
    with path.open("rb") as f:
        head = f.read(2)
    if head[:1] == b"\x80" or head == b"PK":  # a pickle stream, or torch.save's zip of pickles
        raise InvalidParameter(f"{what} = {str(path)!r}: a pickle / torch.save file; only the safetensors "
                               "format is read (safetensors.torch.save_file(model.state_dict(), PATH))")
    where = f"{what} = {str(path)!r}"
    declared = _safetensors_header(path, what)
    _check_names(declared, spec, where)
    for name, shape in zip(spec.names, spec.shapes):  # from the header: nothing is loaded yet
        got_shape, dtype = declared[name]
        if got_shape != tuple(shape):
            raise InvalidParameter(f"{where}: {name} has shape {got_shape}, the model's is {tuple(shape)}")
        if dtype not in _FLOAT_DTYPES:
            raise InvalidParameter(f"{where}: {name} is {dtype}, not a float tensor")
    try:
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise InvalidParameter(f"{where}: not a readable safetensors file ({exc})") from None
    return _flat_of(tensors, spec, where)


def _check_names(names: Mapping[str, Any], spec: "ParamSpec", where: str) -> None:
    """Every parameter of ``spec`` by name in ``names`` and nothing else (``where`` starts the error)."""
    missing = [n for n in spec.names if n not in names]
    extra = sorted(set(names) - set(spec.names))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}")
        if extra:
            parts.append(f"not in the model: {', '.join(extra[:5])}{' …' if len(extra) > 5 else ''}")
        raise InvalidParameter(f"{where}: its tensors do not match the workload's model ({'; '.join(parts)})")


def _flat_of(tensors: dict[str, torch.Tensor], spec: "ParamSpec", where: str) -> torch.Tensor:
    """The flat float32 vector of ``tensors``: every parameter of ``spec`` by name, with its
    shape, a finite float tensor, and nothing else (``where`` starts each error)."""
    _check_names(tensors, spec, where)
    rows = []
    for name, shape in zip(spec.names, spec.shapes):
        t = tensors[name]
        if tuple(t.shape) != tuple(shape):
            raise InvalidParameter(f"{where}: {name} has shape {tuple(t.shape)}, the model's is {tuple(shape)}")
        if not t.is_floating_point():
            raise InvalidParameter(f"{where}: {name} is {t.dtype}, not a float tensor")
        t = t.to(torch.float32)
        if not bool(torch.isfinite(t).all()):
            raise InvalidParameter(f"{where}: {name} has NaN or infinite entries")
        rows.append(t.reshape(-1))
    return torch.cat(rows) if rows else torch.zeros(0)


def _model_bytes(flat: torch.Tensor, spec: "ParamSpec", metadata: dict[str, str] | None = None) -> bytes:
    """A flat parameter vector as a safetensors file's bytes (named tensors). The same
    vector and metadata give the same bytes in every process as long as the metadata has at
    most one entry (safetensors writes a larger one in a per-process hash order)."""
    from safetensors.torch import save

    named = {n: t.detach().to("cpu").contiguous().clone() for n, t in spec.unflatten(flat.to("cpu")).items()}
    return save(named, metadata=metadata or {})


def save_model_file(path: Path, flat: torch.Tensor, spec: "ParamSpec", metadata: dict[str, str] | None = None) -> Path:
    """Write a flat parameter vector as named tensors (safetensors), atomically (a fresh
    temporary file beside ``path``, renamed over it: a link planted there is replaced, never
    written through)."""
    from ..runner.outputs import atomic_write_bytes

    return atomic_write_bytes(path, _model_bytes(flat, spec, metadata), option="model file")


def warmup_scenario(scenario: "Scenario") -> "Scenario":
    """The clean FedAvg run a scenario's warm-up is (its ``rounds`` = ``warmup_rounds``)."""
    from ..scenario import AttackWindow, HierarchySpec, PluginSpec

    info, fed = scenario.scenario, scenario.federation
    pipeline = scenario.pipeline
    if pipeline is not None:  # the same pipeline, honest and unchecked; what only the attacked
        # run or the simulated clock reads is set to its default, so cells share the warm-up
        from ..scenario import PipelineSpec

        d = PipelineSpec()
        pipeline = dataclasses.replace(pipeline, attackers=0, checks=(), attacker_stage=d.attacker_stage,
                                       reputation_penalty=d.reputation_penalty,
                                       reputation_recovery=d.reputation_recovery, bandwidth_mbps=d.bandwidth_mbps,
                                       bandwidth_sigma=d.bandwidth_sigma, latency_ms=d.latency_ms,
                                       hop_time_s=d.hop_time_s, optimizer=pipeline.warmup_optimizer or pipeline.optimizer,
                                       warmup_optimizer=None, warmup_lr=None)
        if scenario.pipeline.warmup_lr is not None:
            fed = dataclasses.replace(fed, lr=scenario.pipeline.warmup_lr)
    return dataclasses.replace(
        scenario,
        pipeline=pipeline,
        scenario=dataclasses.replace(info, warmup_rounds=0, requires=(), name="warmup", description="",
                                     seed=info.seed if info.warmup_seed is None else info.warmup_seed,
                                     warmup_seed=None),
        federation=dataclasses.replace(fed, rounds=info.warmup_rounds, attacker_selection="random",
                                       attackers_per_round=None),
        attack=PluginSpec("none"),
        defense=(PluginSpec("mean"),),
        hierarchy=HierarchySpec(),
        window=AttackWindow(),
    )


def warmup_key(scenario: "Scenario", device: torch.device, data_source: str = "") -> str:
    """What a warm-up is stored under: the warm-up scenario, the device type, the start file and
    what the data is (a workload reading files names their digest in it)."""
    ws = warmup_scenario(scenario)
    start = resolve_start(scenario)
    blob = json.dumps({"scenario": ws.digest(), "device": device.type, "data": data_source,
                       "start_from": _sha256(start) if start is not None else None}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _warmup_dir(explicit: str | Path | None) -> Path | None:
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get(WARMUP_DIR_ENV)
    return Path(env) if env else None


def warmup_store(folder: Path) -> Path:
    """The results store that keeps the digests of the warm-up files in ``folder``: the
    one beside it (a matrix's ``<out>/results.sqlite`` for its ``<out>/warmups``), else one
    in ``folder`` itself (``REDTEAM_WARMUP_DIR``, a caller's own directory)."""
    from ..runner.store import STORE_NAME

    beside = folder.parent / STORE_NAME
    return beside if beside.is_file() else folder / STORE_NAME


def _read_plain(file: Path, size: int | None) -> tuple[str | None, bytes | None]:
    """The SHA-256 of the regular file ``file`` and, when it is ``size`` bytes long, its
    bytes (read once: what is checked is what is loaded); ``(None, None)`` when it is
    missing, a link, not a regular file, over the cap or unreadable."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(file, flags)
    except OSError:
        return None, None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FILE:
                return None, None
            if size is not None and st.st_size == size:
                data = f.read(size + 1)
                return hashlib.sha256(data).hexdigest(), data if len(data) == size else None
            h = hashlib.sha256()
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            return h.hexdigest(), None
    except OSError:
        return None, None


def _stored(file: Path, key: str, spec: "ParamSpec") -> tuple[torch.Tensor | None, dict[str, Any]]:
    """The warm-up ``key`` stored in ``file`` and its SHA-256, when the file's bytes are
    those its results store recorded; else ``None`` and what was found there (``{}``: no
    file)."""
    from safetensors.torch import load

    from ..runner.store import warmup_digest

    if not os.path.lexists(file):
        return None, {}
    recorded = warmup_digest(warmup_store(file.parent), key)
    sha, data = _read_plain(file, recorded[1] if recorded else None)
    found = {"file_sha256": sha, "store_sha256": recorded[0] if recorded else None}
    if recorded is None or data is None or sha != recorded[0]:
        return None, found
    try:
        return _flat_of(load(data), spec, f"warm-up file {str(file)!r}"), {"sha256": sha}
    except (InvalidParameter, _SafetensorError, ValueError, RuntimeError):
        return None, found  # recorded by this package, so never expected: recomputed all the same


def warmup_is_stored(folder: Path, key: str) -> bool:
    """Whether ``folder`` holds the warm-up ``key`` with the digest its store recorded."""
    from ..runner.store import warmup_digest

    recorded = warmup_digest(warmup_store(folder), key)
    return recorded is not None and _read_plain(folder / f"{key}.safetensors", None)[0] == recorded[0]


def _store_warmup(file: Path, key: str, data: bytes, sha: str) -> None:
    """Write the warm-up file and record its digest in its results store."""
    from ..runner.outputs import atomic_write_bytes
    from ..runner.store import ResultsStore

    atomic_write_bytes(file, data, option="warm-up file")
    with ResultsStore(warmup_store(file.parent)) as store:
        store.put_warmup(key, sha, len(data))


def start_params(scenario: "Scenario", spec: "ParamSpec", init: torch.Tensor, device: torch.device,
                 warmup_dir: str | Path | None = None, data_source: str = "",
                 compute: "Callable[[Scenario, torch.Tensor, torch.device], torch.Tensor] | None" = None
                 ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The model round 0 starts from, and what it is (recorded in round 0's ``extra["start"]``).
    ``compute(warm-up scenario, start, device)`` runs a warm-up that is not stored yet (the
    regimes' :func:`~.regimes.compute_warmup`)."""
    info: dict[str, Any] = {}
    start = resolve_start(scenario)
    params = init
    if start is not None:
        params = load_model_file(start, spec).to(device)
        info["start_from"] = {"file": scenario.scenario.start_from, "sha256": _sha256(start)}
    rounds = scenario.scenario.warmup_rounds
    if rounds <= 0:
        return params, info
    key = warmup_key(scenario, device, data_source)
    info["warmup"] = warm = {"rounds": rounds, "key": key, "reused": True}
    if key in _MEMO:
        _MEMO.move_to_end(key)
        flat, warm["sha256"] = _MEMO[key]
        return flat.to(device).clone(), info
    folder = _warmup_dir(warmup_dir)
    file = folder / f"{key}.safetensors" if folder is not None else None
    if file is not None:
        flat, found = _stored(file, key, spec)
        if flat is not None:
            warm["sha256"] = found["sha256"]
            _remember(key, flat, found["sha256"])
            return flat.to(device), info
        if found:  # a file that is not the one recorded: recomputed and replaced, and said so
            warm["replaced"] = found
    if compute is None:
        raise InvalidParameter("[scenario].warmup_rounds: this caller cannot compute a warm-up (no runner given)")
    flat = compute(warmup_scenario(scenario), params, device)
    data = _model_bytes(flat, spec, {"redteam_warmup_key": key})
    warm["reused"], warm["sha256"] = False, hashlib.sha256(data).hexdigest()
    _remember(key, flat, warm["sha256"])
    if file is not None:
        _store_warmup(file, key, data, warm["sha256"])
    return flat.clone(), info


def start_digests(start: Any) -> dict[str, str]:
    """The SHA-256 digests of what a run started from, from its round 0's ``extra["start"]``
    (``start``): ``start_from_sha256`` (the ``start_from`` file) and ``warmup_sha256`` (the
    warm-up file), each only where the run has one; ``{}`` for a run from the
    initialisation."""
    out: dict[str, str] = {}
    if isinstance(start, dict):
        for name, field in (("start_from", "start_from_sha256"), ("warmup", "warmup_sha256")):
            part = start.get(name)
            if isinstance(part, dict) and isinstance(part.get("sha256"), str):
                out[field] = part["sha256"]
    return out


def round0_params(scenario: "Scenario", spec: "ParamSpec", init: torch.Tensor, device: torch.device,
                  warmup_dir: str | Path | None, data_source: str,
                  start: torch.Tensor | None = None,
                  compute: "Callable[[Scenario, torch.Tensor, torch.device], torch.Tensor] | None" = None
                  ) -> tuple[torch.Tensor, dict[str, Any]]:
    """What every regime's round 0 starts from: ``start`` when given (a caller's own model, e.g.
    a warm-up being computed), else :func:`start_params`; refused when its size is not the
    workload model's."""
    if start is not None:
        params0, info = start.to(device, torch.float32).clone(), {}
    else:
        params0, info = start_params(scenario, spec, init, device, warmup_dir, data_source, compute)
    if params0.shape != init.shape:
        raise InvalidParameter(f"the starting model has {params0.numel()} parameters, the workload's "
                               f"model {init.numel()}")
    return params0, info


try:
    from safetensors import SafetensorError as _SafetensorError
except ImportError:  # pragma: no cover - a declared dependency
    class _SafetensorError(Exception):  # type: ignore[no-redef]
        pass


def _remember(key: str, flat: torch.Tensor, sha: str) -> None:
    _MEMO[key] = (flat.detach().to("cpu").clone(), sha)
    while len(_MEMO) > _MEMO_SIZE:
        _MEMO.popitem(last=False)
