"""Resource limits of scenario files: what a hostile or mistaken file may not make us do.

A scenario file crosses a trust boundary (CI runs files from pull requests), so the loader
refuses, with a one-line :class:`~redteam.errors.InvalidScenario` and *before* any large
allocation:

* a file that is not a regular file (``/dev/zero``, a FIFO, a directory: opened with
  ``O_NONBLOCK`` so that a FIFO without a writer cannot block us), or larger than
  ``max_file_bytes``;
* text nested deeper than ``max_nesting`` brackets or braces, or with a dotted key of more
  than ``max_key_depth`` parts (``tomllib`` recurses on nesting and is quadratic in the depth
  of a dotted key: a 200 KB key takes tens of GB), found by a cheap lexical scan before parsing;
* integers outside the signed 64-bit range, anywhere in the document;
* an ``include`` outside the including scenario's directory (unless allowed);
* a matrix of more than ``max_cells`` cells or ``max_seeds`` replicates, counted from the
  axis lengths before anything is expanded, or more than ``max_expectations`` ``[[expect]]``
  rows (each is matched against every cell);
* a federation whose per-round work exceeds the caps below (clients, rounds, local steps,
  local epochs, batch size, shards per client, and clients × batch size samples in one
  batched step).

Every limit is a field of :class:`Limits`; the defaults are generous for real studies.
Each can be raised through an environment variable ``REDTEAM_<FIELD NAME IN CAPITALS>``
(``REDTEAM_MAX_CELLS=50000``), or by passing ``limits=`` to the loader functions;
``REDTEAM_ALLOW_INCLUDE_OUTSIDE=1`` lets includes leave the scenario's directory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import InvalidScenario

__all__ = ["Limits", "read_scenario_bytes", "scan_text", "check_integers", "check_federation", "shown"]

_INT64 = 2**63


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps on scenario files; see the module docstring. Override through ``from_env``."""

    max_file_bytes: int = 1 << 20
    max_nesting: int = 32
    max_key_depth: int = 16
    max_cells: int = 10_000
    max_seeds: int = 1_000
    max_expectations: int = 1_000
    max_clients: int = 100_000
    max_rounds: int = 100_000
    max_local_steps: int = 100_000
    max_local_epochs: float = 1_000.0
    max_batch_size: int = 65_536
    max_shards_per_client: int = 10_000
    max_samples_per_step: int = 1 << 22
    # issue 22 §4: the plugin parameters that scale work or memory (checked by check_work)
    max_plugin_iterations: int = 10_000   # attack / defense loops: steps, niters, n_iter, max_iter
    max_model_width: int = 8_192          # workload width / hidden / channels / embed
    max_model_layers: int = 256           # workload layers / heads
    max_label_chars: int = 200            # a matrix entry's label
    allow_include_outside: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Limits":
        """Defaults, with each ``REDTEAM_<FIELD>`` variable that is set overriding its field."""
        env = os.environ if environ is None else environ
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            var = "REDTEAM_" + f.name.upper()
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            if f.default is False or f.default is True:
                if raw.lower() not in ("0", "1", "true", "false", "yes", "no"):
                    raise InvalidScenario(f"environment {var} = {shown(raw)}: expected 1 or 0")
                kw[f.name] = raw.lower() in ("1", "true", "yes")
                continue
            try:
                val: float = float(raw) if isinstance(f.default, float) else int(raw, 10)
            except ValueError:
                raise InvalidScenario(f"environment {var} = {shown(raw)}: expected a number") from None
            if not (math.isfinite(val) and val >= 1):
                raise InvalidScenario(f"environment {var} = {shown(raw)}: must be ≥ 1")
            kw[f.name] = val
        return cls(**kw)


def shown(value: Any, width: int = 60) -> str:
    """A value as it appears in an error message: JSON-like, cut to ``width`` characters."""
    import json

    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 4 * width:
        return f"an integer of about {int(abs(value).bit_length() * 0.30103) + 1} digits"  # no str(): it is quadratic
    try:
        text = json.dumps(value, ensure_ascii=False) if isinstance(value, (str, list, dict, bool)) else repr(value)
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except (ValueError, RecursionError):  # e.g. a list holding an integer of 10,000 digits
            text = f"<a {type(value).__name__}>"
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > width:
        return f"{text[:12]}…({len(text)} digits)"
    return text if len(text) <= width else text[: width - 1] + "…"


# ------------------------------------------------------------------------ reading


def read_scenario_bytes(path: Path, limits: Limits, origin: str = "") -> bytes:
    """The bytes of a scenario file, refusing non-regular files and files over the size cap."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InvalidScenario(f"{path}: no such scenario file{origin}") from None
    except OSError as exc:
        raise InvalidScenario(f"{path}: cannot read: {exc.strerror}{origin}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else (
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else (
                    "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a plain file"))
            raise InvalidScenario(f"{path}: is {kind}: a scenario must be a regular file{origin}")
        cap = limits.max_file_bytes
        if st.st_size > cap:
            raise InvalidScenario(
                f"{path}: {st.st_size} bytes: larger than the {cap}-byte cap (REDTEAM_MAX_FILE_BYTES){origin}"
            )
        parts, total = [], 0
        while True:  # the file may grow after fstat: never read past the cap
            try:
                block = os.read(fd, min(1 << 16, cap + 1 - total))
            except OSError as exc:
                raise InvalidScenario(f"{path}: cannot read: {exc.strerror}{origin}") from None
            if not block:
                break
            parts.append(block)
            total += len(block)
            if total > cap:
                raise InvalidScenario(f"{path}: larger than the {cap}-byte cap (REDTEAM_MAX_FILE_BYTES){origin}")
        return b"".join(parts)
    finally:
        os.close(fd)


def scan_text(text: str, limits: Limits, file: str) -> None:
    """Refuse, before ``tomllib`` sees it, text nested too deep or with too deep a dotted key.

    A single pass over the characters that knows TOML's four string forms and comments
    (so brackets and dots inside them do not count). ``[``/``{`` nesting is counted
    everywhere; dots are counted only where a key is expected: at the start of a line,
    inside a table header, and after ``{`` or ``,`` in an inline table.
    """
    stack: list[str] = []  # "{" inline table, "[" array, "h" table header
    in_key = True
    dots = 0
    line = 1
    i, n = 0, len(text)
    max_nest, max_dots = limits.max_nesting, limits.max_key_depth - 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            if not stack or stack[-1] == "h":
                stack.clear()
                in_key, dots = True, 0
            i += 1
            continue
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c == '"' or c == "'":
            triple = text.startswith(c * 3, i)
            if triple:
                end = text.find(c * 3, i + 3)
                if end < 0:
                    return  # unterminated: tomllib reports it
                while text.startswith(c, end + 3) and end + 3 < n:  # up to two quotes may close it
                    end += 1
                line += text.count("\n", i, end)
                i = end + 3
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if (c == '"' and text[j] == "\\") else 1
            i = j + 1
            continue
        if c == "[" or c == "{":
            if c == "[" and in_key and not stack:
                stack.append("h")
                if text.startswith("[[", i):
                    i += 1
            else:
                stack.append(c)
                in_key = c == "{"
                if in_key:
                    dots = 0
            if len(stack) > max_nest:
                raise InvalidScenario(
                    f"{file}: line {line}: nested deeper than {max_nest} brackets (REDTEAM_MAX_NESTING)"
                )
        elif c == "]" or c == "}":
            if stack:
                stack.pop()
            in_key = False  # after a closed value (or header) comes ',', '}', ']' or the line's end
        elif c == "=":
            in_key, dots = False, 0
        elif c == ",":
            if stack and stack[-1] == "{":
                in_key, dots = True, 0
        elif c.isdigit():  # a number literal (or bare key) of absurd length: refuse before int()
            j = i
            while j < n and (text[j].isdigit() or text[j] == "_"):
                j += 1
            if j - i > 100:
                raise InvalidScenario(
                    f"{file}: line {line}: a number of {j - i} digits: integers must fit in 64 bits"
                )
            i = j
            continue
        elif c == "." and in_key:
            dots += 1
            if dots > max_dots:
                raise InvalidScenario(
                    f"{file}: line {line}: a dotted key of more than {limits.max_key_depth} parts "
                    "(REDTEAM_MAX_KEY_DEPTH)"
                )
        i += 1


def check_integers(node: Any, file: str, path: str = "") -> None:
    """Every integer in a parsed document must fit a signed 64-bit integer."""
    todo: list[tuple[Any, str]] = [(node, path)]
    while todo:
        v, p = todo.pop()
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            if not -_INT64 <= v < _INT64:
                raise InvalidScenario(f"{file}: {p or 'value'} = {shown(v)}: integers must fit in 64 bits")
        elif isinstance(v, dict):
            todo.extend((x, f"{p}.{k}" if p else f"[{k}]") for k, x in v.items())
        elif isinstance(v, list):
            todo.extend((x, f"{p}[{i}]") for i, x in enumerate(v))


def check_federation(fed: Any, limits: Limits, file: str) -> None:
    """The ``[federation]`` sizes against the caps (the per-round work a file may ask for)."""
    caps = (
        ("clients", limits.max_clients, "REDTEAM_MAX_CLIENTS"),
        ("rounds", limits.max_rounds, "REDTEAM_MAX_ROUNDS"),
        ("local_steps", limits.max_local_steps, "REDTEAM_MAX_LOCAL_STEPS"),
        ("batch_size", limits.max_batch_size, "REDTEAM_MAX_BATCH_SIZE"),
        ("local_epochs", limits.max_local_epochs, "REDTEAM_MAX_LOCAL_EPOCHS"),
        ("shards_per_client", limits.max_shards_per_client, "REDTEAM_MAX_SHARDS_PER_CLIENT"),
    )
    for key, cap, var in caps:
        v = getattr(fed, key, None)
        if v is not None and v > cap:
            raise InvalidScenario(f"{file}: [federation].{key} = {shown(v)}: must be ≤ {cap:g} ({var} raises the cap)")
    per_step = fed.clients * fed.batch_size
    if per_step > limits.max_samples_per_step:
        raise InvalidScenario(
            f"{file}: [federation].batch_size = {fed.batch_size}: clients × batch_size = {per_step} samples per "
            f"batched step, more than {limits.max_samples_per_step} (REDTEAM_MAX_SAMPLES_PER_STEP raises the cap)"
        )


#: plugin parameters that count iterations of a loop (capped by ``max_plugin_iterations``)
ITERATION_KEYS = ("steps", "niters", "n_iter", "max_iter", "iterations", "n_steps")
#: workload parameters that size the model (``max_model_width`` / ``max_model_layers``)
WIDTH_KEYS = ("width", "hidden", "channels", "embed")
DEPTH_KEYS = ("layers", "heads")


def check_work(section: str, params: Mapping[str, Any], limits: "Limits", file: str, kind: str = "") -> None:
    """Refuse a plugin parameter that would scale work or memory past its cap (one line, naming
    the key, the cap and the variable that raises it). ``kind``: ``"workload"`` for the model's sizes."""
    caps = [(ITERATION_KEYS, limits.max_plugin_iterations, "REDTEAM_MAX_PLUGIN_ITERATIONS")]
    if kind == "workload":
        caps += [(WIDTH_KEYS, limits.max_model_width, "REDTEAM_MAX_MODEL_WIDTH"),
                 (DEPTH_KEYS, limits.max_model_layers, "REDTEAM_MAX_MODEL_LAYERS")]
    for keys, cap, var in caps:
        for k in keys:
            v = params.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > cap:
                raise InvalidScenario(f"{file}: [{section}].{k} = {v}: more than the cap of {cap} ({var} raises it)")
