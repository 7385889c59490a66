"""Resource limits of scenario and limits files: what a hostile or mistaken file may not make us do.

A scenario file crosses a trust boundary (CI runs files from pull requests), and so does the
input of ``redteam limits``. Both are read by :func:`read_toml`, which refuses, with a one-line
:class:`~redteam.errors.InvalidScenario` and *before* any large allocation:

* a file that is not a regular file (``/dev/zero``, a FIFO, a directory: opened with
  ``O_NONBLOCK`` so that a FIFO without a writer cannot block us), or larger than
  ``max_file_bytes``;
* a document nested deeper than ``max_nesting`` levels of tables and arrays (however they are
  written: ``[a.b]`` headers, dotted keys, brackets or braces), or with a dotted key of more
  than ``max_key_depth`` parts;
* integers outside the signed 64-bit range, anywhere in the document;

and the scenario loader then refuses:

* an ``include`` outside the including scenario's directory (unless allowed);
* a matrix of more than ``max_cells`` cells or ``max_seeds`` replicates, counted from the
  axis lengths before anything is expanded, or more than ``max_expectations`` ``[[expect]]``
  rows (each is matched against every cell);
* a federation whose per-round work exceeds the caps below (clients, rounds, local steps,
  local epochs, batch size, shards per client, and clients × batch size samples in one
  batched step).
* a scenario whose main tensors, estimated from its settings before anything is built
  (:func:`memory_estimate`: the clients' models and updates, a gossip graph's n × n matrices,
  an async buffer, a pipeline's activations, validator seats, the model's parameter count),
  exceed ``memory_budget`` bytes: this machine's physical memory unless
  ``REDTEAM_MEMORY_BUDGET`` says otherwise (issue 35 §3).

How the TOML guard works, and why it cannot be talked past
----------------------------------------------------------

``tomllib`` is the parser; we do not rely on a lexer of our own to keep it cheap. What it
costs was measured (CPython 3.11; tests/test_toml_guard.py repeats the hostile cases):

* Almost everything it does is linear in the text: at most about 150 bytes of memory and a
  few seconds per MiB in the worst inputs we could build (empty tables or arrays by the
  hundred thousand, a million hex digits). ``max_file_bytes`` bounds that.
* Nesting costs a few Python frames per level: it is bounded by the interpreter's recursion
  limit (``RecursionError``, turned into one line), a few hundred levels at the default limit.
* Keys are the one superlinear cost. A key of *p* parts is rebuilt as a tuple once per part
  (time ∝ *p*²), and a ``key.with.parts = value`` line keeps a tuple for every prefix of the
  key until the next table header (memory ∝ *p*²: about 4 bytes × *p*², 250 MB at 8,000
  parts; a 100 KB line of 50,000 parts ran out of a 3 GiB cap after 17 s). Every statement
  also walks the current header's parts, so a header of *h* parts makes each of the lines
  below it cost *h* (a 0.9 MB file under a 1,400-part header: 57 s; with one dot on each
  line, 1.2 GB as well).

So the guard is three layers, and only the first depends on understanding TOML's syntax:

1. :func:`scan_text`, a lexical pass that knows strings and comments, refuses too deep
   brackets and too long dotted keys with the line they are on. It gives the precise message;
   it is not what keeps the parser cheap. (It once took a backslash-escaped quote inside a
   triple-quoted string for the string's end, and a 100 KB file could then hide a dotted key
   of 50,000 parts from it: issue 22.) The cap on a key's parts rests on this layer alone; were
   it fooled again, the next two still bound the parser's work and the document's depth.
2. :func:`check_dot_work` needs no syntax at all. A TOML key cannot span lines (only spaces and
   tabs may surround its dots; quoted parts are one-line strings), so a key or header has at
   most one part more than its line has dots, whatever strings or comments share the line;
   and each statement starts on a line of its own. With *D* the most dots on one line, *T*
   the dots in the file and *L* its lines, the parser's work on keys is therefore below
   (*D* + 1) × (*L* + *T*), which is refused above ``max_dot_work``. Strings, numbers and
   comments can only make the count larger, never hide a key. The default, 2²¹, allows under
   a second and about 15 MB of parsing at worst (measured), 700 times what the largest
   shipped file needs (2,933); a false refusal takes a line of over a thousand dots (a long array of
   floats on one line) in a file of some size, and the message says to split the line or
   raise the budget.
3. :func:`check_document` walks what the parser built, without recursion: no path deeper than
   ``max_nesting`` tables and arrays, every integer in 64 bits. It sees the real document, so
   nothing the lexer missed gets past it, and it builds key paths only for its message (a
   long key above many entries once made it copy the key for each of them: a 1 MB file ran
   out of a 3 GiB cap).

Parsing in a child process under a memory cap would also bound the parser without knowing its
syntax, but costs about 40 ms per file (measured on the test machine), a way to send the
document back, and rlimits that not every platform has; the dot bound is tight enough to make
it unnecessary.

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
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import InvalidScenario

__all__ = ["Limits", "read_toml", "read_scenario_bytes", "scan_text", "check_dot_work", "check_document",
           "check_integers", "check_federation", "shown", "memory_estimate", "check_memory", "machine_memory"]

_INT64 = 2**63


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps on scenario files; see the module docstring. Override through ``from_env``."""

    max_file_bytes: int = 1 << 20
    max_nesting: int = 32
    max_key_depth: int = 16
    max_dot_work: int = 1 << 21           # (most dots on a line + 1) × (lines + dots): bounds tomllib's keys
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
    max_text_files: int = 100_000         # files under a text workload's text_dir
    max_text_bytes: int = 1 << 30         # their total size (every file is read whole, for its digest)
    # bytes the main tensors of one run may take (memory_estimate); 0: this machine's physical memory
    memory_budget: int = 0
    # the memory one dataset read may take (redteam.workloads.files), estimated before allocating:
    # decompressed sizes, header-declared dimensions, parsed JSON, decoded Arrow columns and images
    max_data_bytes: int = 2 << 30
    allow_include_outside: bool = False
    # a text workload's text_dir (any file under it becomes training text, named in manifests):
    # inside the scenario's directory or the working directory unless allowed
    allow_text_dir_outside: bool = False
    # a workload's dataset dir, hf_dir or file (read as training data): the same rule as text_dir
    allow_data_dir_outside: bool = False

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


def read_scenario_bytes(path: Path, limits: Limits, origin: str = "", what: str = "scenario") -> bytes:
    """The bytes of a scenario file (or a ``what`` file), refusing non-regular files and files
    over the size cap."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InvalidScenario(f"{path}: no such {what}{'' if what.endswith('file') else ' file'}{origin}") from None
    except OSError as exc:
        raise InvalidScenario(f"{path}: cannot read: {exc.strerror}{origin}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else (
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else (
                    "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a plain file"))
            raise InvalidScenario(f"{path}: is {kind}: a {what} must be a regular file{origin}")
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

    The first layer of :func:`read_toml`, for its messages (they name the line); the bounds
    that do not depend on it are :func:`check_dot_work` and :func:`check_document`.
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
                j = i + 3
                end = text.find(c * 3, j)
                while c == '"' and end >= 0:  # a backslash escapes the next character, a quote too
                    esc = text.find("\\", j, end)
                    if esc < 0:
                        break
                    j = esc + 2  # j only moves forward: linear however many escapes
                    if j > end:  # the escape took the first quote of that closing
                        end = text.find(c * 3, j)
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


def check_dot_work(text: str, limits: Limits, file: str) -> None:
    """Refuse text on which ``tomllib``'s work on keys could exceed ``max_dot_work``.

    Needs no knowledge of TOML's syntax. A key never spans lines, so a key or table header
    has at most (dots on its line) + 1 parts, and every statement starts on a line of its own.
    The parser's key handling costs, per statement, about the parts of the current header
    plus those of the key, and, for a dotted key, that many pointers for each of its parts.
    With D the most dots on one line, T the dots in the file and L its lines, all of that is
    below (D + 1) × (L + T), whatever is inside strings or comments: that product is refused
    above the budget.
    """
    budget = limits.max_dot_work
    total = text.count(".")
    lines = text.count("\n") + 1
    if (total + 1) * (lines + total) <= budget:  # D ≤ T: nearly every file stops here
        return
    worst, worst_line = 0, 0
    for number, line in enumerate(text.split("\n"), 1):  # "\n" only: other line breaks can sit in a key
        d = line.count(".")
        if d > worst:
            worst, worst_line = d, number
    work = (worst + 1) * (lines + total)
    if work > budget:
        raise InvalidScenario(
            f"{file}: line {worst_line} has {worst} dots, in a file of {lines} lines and {total} dots: "
            f"({worst} + 1) × ({lines} + {total}) = {work}, more than {budget} (dotted keys and table "
            "headers cost the TOML parser about that; split long lines, or REDTEAM_MAX_DOT_WORK raises the budget)"
        )


def _path_text(link: Any) -> str:
    """``[section].key[3].sub`` for a path kept as nested ``(parent, key)`` pairs; long keys cut."""
    parts: list[Any] = []
    while link is not None:
        link, key = link
        parts.append(key)
    parts.reverse()
    out = []
    for i, k in enumerate(parts):
        if isinstance(k, int):
            out.append(f"[{k}]")
        else:
            k = str(k)
            k = k if k.isprintable() else repr(k)[1:-1]  # a key may hold a newline: the message is one line
            k = k if len(k) <= 40 else k[:39] + "…"
            out.append(f"[{k}]" if i == 0 else f".{k}")
    text = "".join(out)
    return text if len(text) <= 200 else text[:99] + "…" + text[-100:]


def check_document(node: Any, limits: Limits | None, file: str) -> None:
    """What the parser built: no path deeper than ``max_nesting`` tables and arrays (``limits``
    None: no depth cap), and every integer in a signed 64-bit integer.

    Iterative, and a key's path is kept as a link to its parent's, turned into text only for
    the message: building each path eagerly copied a long key once per entry beneath it.
    """
    cap = limits.max_nesting if limits is not None else None
    todo: list[tuple[Any, int, Any]] = [(node, 0, None)]
    while todo:
        v, depth, link = todo.pop()
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            if not -_INT64 <= v < _INT64:
                where = _path_text(link) or "value"
                raise InvalidScenario(f"{file}: {where} = {shown(v)}: integers must fit in 64 bits")
            continue
        if isinstance(v, (dict, list)):
            if cap is not None and depth > cap:
                raise InvalidScenario(
                    f"{file}: {_path_text(link)}: nested more than {cap} levels deep (tables and arrays, "
                    "however written) (REDTEAM_MAX_NESTING)"
                )
            items = v.items() if isinstance(v, dict) else enumerate(v)
            todo.extend((x, depth + 1, (link, k)) for k, x in items)


def check_integers(node: Any, file: str, path: str = "") -> None:
    """Every integer in a parsed document must fit a signed 64-bit integer."""
    check_document(node if not path else {path: node}, None, file)


def read_toml(path: Path, limits: Limits, *, origin: str = "", what: str = "scenario") -> dict[str, Any]:
    """Read a TOML file from a user under ``limits``: the one way scenario and limits files are read.

    A regular file under ``max_file_bytes``; UTF-8; :func:`scan_text` (precise messages),
    :func:`check_dot_work` (bounds the parser whatever the lexer thinks), ``tomllib``, then
    :func:`check_document` on what it built. Every refusal is one :class:`InvalidScenario` line
    naming the file (``origin``, e.g. " (included from a.toml)", is appended).
    """
    raw = read_scenario_bytes(path, limits, origin, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidScenario(f"{path}: not UTF-8 text{origin}") from None
    try:
        scan_text(text, limits, f"{path}")  # nesting and dotted-key depth, with the line
        check_dot_work(text, limits, f"{path}")  # the parser's quadratic work, context-free
    except InvalidScenario as exc:
        raise InvalidScenario(f"{exc}{origin}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message can quote a whole key: cut it, keep "(at line …)"
        why = str(exc) if len(str(exc)) <= 200 else str(exc)[:139] + "…" + str(exc)[-60:]
        raise InvalidScenario(f"{path}: invalid TOML: {why}{origin}") from None
    except ValueError as exc:  # e.g. an integer literal over Python's digit limit
        raise InvalidScenario(f"{path}: invalid TOML: {shown(str(exc), 100)}{origin}") from None
    except RecursionError:
        raise InvalidScenario(f"{path}: nested too deeply to parse{origin}") from None
    try:
        check_document(data, limits, path.name)
    except InvalidScenario as exc:
        raise InvalidScenario(f"{exc}{origin}") from None
    return data


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


# ------------------------------------------------------------------------ memory


def machine_memory() -> int:
    """This machine's physical memory in bytes (64 GiB where the platform does not say)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 64 << 30


def _bytes_text(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def _param_count(workload: Any) -> int | None:
    """The workload's model size, from :meth:`~redteam.workloads.base.Workload.param_count`
    (None: an unknown workload, or one that does not say)."""
    from .errors import RedteamError
    from .registry import WORKLOADS

    try:
        count = WORKLOADS.create(workload.name, dict(workload.params)).param_count()
    except RedteamError:  # unknown, or refused by its own checks (parsed without them)
        return None
    except Exception:  # noqa: BLE001 - a third-party workload's param_count: no model term, not a traceback
        return None
    return count if isinstance(count, int) and count > 0 else None


def _defense_parts(scenario: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """(section, params) of each defense stage and of the tables listed in its params (the parts
    of a composition), as :func:`check_work` walks them."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    many = len(scenario.defense) > 1
    for i, stage in enumerate(scenario.defense):
        section = f"defense.pipeline[{i}]" if many else "defense"
        out.append((section, stage.params))
        for k, v in stage.params.items():
            if isinstance(v, list):
                out += [(f"{section}.{k}[{j}]", part) for j, part in enumerate(v) if isinstance(part, Mapping)]
    return out


def memory_estimate(scenario: Any, *, plugins: bool = True) -> list[tuple[str, Any, int, str]]:
    """The main tensors a run of ``scenario`` (a parsed :class:`~redteam.scenario.Scenario`) will
    hold, from its settings alone (nothing is built): ``(setting, its value, bytes, what)`` per
    item, float32 parameters (4 bytes). A lower bound: the run needs these and more.

    With P the model's parameters (:meth:`~redteam.workloads.base.Workload.param_count`; the
    terms that need it are left out where the workload does not say) and K the clients of a round:

    * the server's model and its state: 4 × P × 4;
    * a round's clients: their trained models and updates, 2 × K × P × 4;
    * ``[gossip]``: a model per node and the next step's, 2 × n × P × 4; the adjacency, the
      mixing matrix and its symmetric copy for the spectral gap (bool, float64, float64), 17 × n²;
    * ``[async]``: the buffered updates and their stack, 2 × buffer_size × P × 4, beside a row per
      client in flight, n × P × 4;
    * ``[pipeline]`` (the text model, T = context, w = width, L = layers): one micro-batch's
      activations, micro_batch_size × T × (16·L·w + 2·256) × 4; the hop inputs an auditing check
      keeps to the round's end, fraction × micro_batches × stages × micro_batch_size × T × w × 4;
      the peers' replicas of their stage and its gradient, 2 × peers_per_stage × P × 4;
    * ``validators`` = V (Gauntlet's consensus): the seats' reports and their pairwise
      comparison, V × K × 8 + V² × K.

    ``plugins = False`` (a parse without plugin checks, as the pytest plugin's collection makes:
    it imports no workload or defense, so no torch) leaves out the terms that need a plugin to say
    its size: the model's parameters and the share of hops a pipeline check keeps. The full parse
    before a run includes them.
    """
    fed = scenario.federation
    params = _param_count(scenario.workload) if plugins else None
    out: list[tuple[str, Any, int, str]] = []
    model = ""
    if params is not None:
        wl = scenario.workload
        keys = [k for k in (*WIDTH_KEYS, *DEPTH_KEYS, "context", "features", "classes") if k in wl.params]
        named = ", ".join(f"[workload].{k} = {shown(wl.params[k])}" for k in keys) or f"[workload].name = {shown(wl.name)}"
        model = f"{params:,} parameters ({named})"
        out.append((f"[workload].{keys[0]}" if keys else "[workload].name", wl.params[keys[0]] if keys else wl.name,
                    16 * params, f"the server's model of {model} and its state"))
    n = fed.clients
    k = fed.clients_per_round or n
    k_key = "[federation].clients_per_round" if fed.clients_per_round else "[federation].clients"
    if scenario.gossip is not None:
        out.append(("[federation].clients", n, 17 * n * n, f"the gossip graph's n × n matrices over {n:,} nodes"))
        if params is not None:
            out.append(("[federation].clients", n, 8 * n * params, f"a model per node, twice: {n:,} × {model}"))
    elif scenario.asynchronous is not None:
        b = scenario.asynchronous.buffer_size
        if params is not None:
            out.append(("[async].buffer_size", b, 8 * b * params, f"{b:,} buffered updates, twice, of {model}"))
            out.append(("[federation].clients", n, 4 * n * params, f"{n:,} clients' updates in flight"))
    elif scenario.pipeline is not None:
        pl, wl = scenario.pipeline, scenario.workload.params
        t, w, layers = (v if isinstance(v := wl.get(x), int) and v > 0 else d
                        for x, d in (("context", 64), ("width", 64), ("layers", 2)))
        bt = pl.micro_batch_size * t
        out.append(("[pipeline].micro_batch_size", pl.micro_batch_size, 4 * bt * (16 * layers * w + 512),
                    f"one micro-batch's activations ({pl.micro_batch_size:,} windows of {t} bytes, width {w}, "
                    f"{layers} layers)"))
        kept = 0.0
        for check in pl.checks:
            kept = max(kept, _audited_share(check) if plugins else 0.0)
        if kept:
            out.append(("[pipeline].micro_batches", pl.micro_batches,
                        int(kept * pl.micro_batches * pl.stages * bt * w * 4),
                        f"the hop inputs an audit keeps to the round's end ({kept:g} of {pl.micro_batches:,} "
                        f"micro-batches × {pl.stages} stages)"))
        if params is not None:
            out.append(("[pipeline].peers_per_stage", pl.peers_per_stage, 8 * pl.peers_per_stage * params,
                        f"the peers' replicas of their stages and their gradients, of {model}"))
    elif params is not None:
        out.append((k_key, k, 8 * k * params, f"{k:,} clients' models and updates of {model}"))
    for section, part in _defense_parts(scenario):
        v = part.get("validators")
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            out.append((f"[{section}].validators", v, v * k * 8 + v * v * k,
                        f"{v:,} validator seats' reports on {k:,} peers and their pairwise comparison"))
    return out


def _audited_share(check: Any) -> float:
    """The share of hops a pipeline check keeps whole to the round's end (0: it keeps none)."""
    from .errors import RedteamError
    from .registry import DEFENSES

    try:
        cls = DEFENSES.get(check.name)
    except RedteamError:
        return 0.0
    if not getattr(cls, "audits", False):
        return 0.0
    share = check.params.get("fraction", getattr(cls, "fraction", 1.0))
    return float(share) if isinstance(share, (int, float)) and 0 <= share <= 1 else 1.0


def check_memory(scenario: Any, limits: Limits, file: str, *, plugins: bool = True) -> None:
    """Refuse, in one line naming the largest item's setting, a scenario whose
    :func:`memory_estimate` exceeds ``limits.memory_budget`` (0: :func:`machine_memory`);
    ``plugins`` as there."""
    items = memory_estimate(scenario, plugins=plugins)
    total = sum(b for _, _, b, _ in items)
    budget = limits.memory_budget or machine_memory()
    if total <= budget:
        return
    setting, value, size, what = max(items, key=lambda item: item[2])
    raise InvalidScenario(
        f"{file}: {setting} = {shown(value)}: the run would hold about {_bytes_text(total)} ({what}: "
        f"{_bytes_text(size)}), more than the memory budget of {_bytes_text(budget)} "
        f"({'this machine' + chr(39) + 's memory; ' if not limits.memory_budget else ''}"
        "REDTEAM_MEMORY_BUDGET=BYTES raises it)"
    )
