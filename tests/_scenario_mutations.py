"""Hostile mutations of scenario documents, and a small TOML writer for them.

Shared by the scenario fuzz test (tests/test_scenario_fuzz.py) and its subprocess worker.
A mutation picks a key path in a parsed scenario document (any depth, list items too)
and replaces its value with a hostile one, deletes it, or adds a new key beside it;
the writer turns the result back into TOML text that ``tomllib`` reads back to the same
document (every table inline below its section, every key quoted).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent


SECTIONS = {"scenario", "workload", "federation", "transport", "hierarchy", "attack", "defense", "matrix", "expect"}


def shipped_documents() -> list[dict[str, Any]]:
    """The parsed shipped scenarios (TOML files of scenarios/ made of scenario sections only;
    e.g. the ``[limits]`` input of ``redteam limits`` is not a scenario)."""
    docs = []
    for p in sorted((ROOT / "scenarios").rglob("*.toml")):
        try:
            doc = tomllib.loads(p.read_text("utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if doc and set(doc) <= SECTIONS:
            docs.append(doc)
    return docs


def limits_documents() -> list[dict[str, Any]]:
    """The parsed shipped limits file (the input of ``redteam limits``)."""
    return [tomllib.loads((ROOT / "scenarios" / "limits.toml").read_text("utf-8"))]


# ------------------------------------------------------------------------- writer


def _key(k: str) -> str:
    return _string(k)


def _string(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif 0x20 <= o < 0x7F:
            out.append(ch)
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04X}")
        else:
            out.append(f"\\U{o:08X}")
    out.append('"')
    return "".join(out)


def _value(v: Any) -> str:
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
        return _string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, _Raw):
        return v.text
    raise TypeError(type(v))


class _Raw:
    """Value text written verbatim (deep arrays that ``tomllib`` itself cannot read back)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"_Raw({self.text[:40]!r}…)"


def dump(doc: dict[str, Any]) -> str:
    """TOML text for ``doc``: top-level scalars and arrays first, then one section per table."""
    lines = []
    for k, v in doc.items():
        if not isinstance(v, dict):
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{_key(k)}]")
            lines.extend(f"{_key(kk)} = {_value(vv)}" for kk, vv in v.items())
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ mutations


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*prefix, k))
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((*prefix, i))
            out.extend(_paths(v, (*prefix, i)))
    return out


HUGE_INTS = [10**9, 10**12, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 + 7, -(2**63), -1, 0, 10**300]
SPECIAL_FLOATS = [math.inf, -math.inf, math.nan, 1e308, -0.0, 5e-324, 1e-300]
KNOWN_KEYS = ["name", "pipeline", "label", "include", "seeds", "settings", "attacks", "defenses", "defender_metric",
              "codec_params", "metric", "min", "max", "attack", "defense", "network", "upper_defense",
              "federation.clients", "federation.batch_size", "federation.local_steps",
              "federation.local_epochs", "federation.rounds", "federation.malicious_fraction",
              "workload.samples", "workload.hidden", "workload.features", "transport.chunk_size"]


def _deep(depth: int, leaf: str = "1") -> _Raw:
    return _Raw("[" * depth + leaf + "]" * depth)


#: Strings that once desynchronised the pre-parse scan (issue 22 §1): in a triple-quoted basic
#: string, a backslash-escaped quote followed by two quotes looked like the closing, and the
#: real closing like the start of a string that never closed, so nothing after it was checked.
#: (The last two close where they seem to: a literal string has no escapes, and an escaped
#: backslash escapes nothing after it.) Each is followed, on the next line of the same table,
#: by something the scan must still see.
DESYNC_STRINGS = ['"""x\\""" """', '"""\\"""\\""" """', "'''x\\'''", '"""x\\\\"""']
HIDDEN_TAILS = ["k" + ".a" * 19 + " = 1", "k" + ".a" * 2_000 + " = 1", "k" + ".a" * 50_000 + " = 1",
                "[k" + ".a" * 50_000 + "]", "k = " + "[" * 40 + "]" * 40, "k = " + "[" * 300 + "]" * 300,
                "k = " + "{a = " * 40 + "1" + "}" * 40, "k = " + "[" * 5000 + "]" * 5000]


def _hidden(pair: tuple[str, str]) -> _Raw:
    return _Raw(f"{pair[0]}\n{pair[1]}")


def hidden_values() -> st.SearchStrategy[_Raw]:
    """A desynchronising string as a value, then a deep key or deep nesting on the next line."""
    return st.tuples(st.sampled_from(DESYNC_STRINGS), st.sampled_from(HIDDEN_TAILS)).map(_hidden)


def hostile_corpus(docs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Fixed hostile files, run on every fuzz run whatever its budget: each desynchronising
    string with each hidden tail, in the first table of the first document."""
    import copy

    out = []
    for i, head in enumerate(DESYNC_STRINGS):
        for j, tail in enumerate(HIDDEN_TAILS):
            doc = copy.deepcopy(docs[0])
            section = next(k for k, v in doc.items() if isinstance(v, dict))
            doc[section]["note"] = _hidden((head, tail))
            out.append((f"desync{i}-tail{j}", dump(doc)))
    return out


def hostile_values() -> st.SearchStrategy[Any]:
    scalar = st.one_of(
        st.sampled_from(HUGE_INTS),
        st.integers(),
        st.sampled_from(SPECIAL_FLOATS),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.text(max_size=12),
        st.sampled_from(["", "none", "mean", "sign_flip", "topk", "digits", "synthetic", "x" * 500]),
    )
    nested = st.recursive(
        scalar,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=6), inner, max_size=3),
        ),
        max_leaves=6,
    )
    return st.one_of(
        scalar,
        scalar,
        nested,
        st.sampled_from([50, 200, 1000, 5000]).map(_deep),
        hidden_values(),
        st.sampled_from([[{}], [[]], {"name": 5}, {"name": ["mean"]}, {"name": {"x": 1}}, {"pipeline": {}},
                         {"pipeline": [[]]}, {"pipeline": [5]}, ["mean", 5], [[1, 2], {"a": 1}]]),
    )


def _same_type(v: Any) -> st.SearchStrategy[Any]:
    if isinstance(v, bool):
        return st.booleans()
    if isinstance(v, int):
        return st.one_of(st.integers(0, 64), st.integers(-(2**63), 2**63 - 1), st.sampled_from(HUGE_INTS))
    if isinstance(v, float):
        return st.one_of(st.floats(0, 1), st.floats(-1e6, 1e6), st.sampled_from(SPECIAL_FLOATS))
    if isinstance(v, str):
        return st.sampled_from(["none", "mean", "median", "krum", "sign_flip", "alie", "topk", "int8", "iid",
                                "digits", "synthetic", "fedadam", "nesterov", "reject", "paper", v + "x", ""])
    if isinstance(v, list):
        return st.just(v[: len(v) // 2]) | st.just(v + v[:1])
    return st.just(v)


@st.composite
def mutated_documents(draw: st.DrawFn, docs: list[dict[str, Any]]) -> dict[str, Any]:
    """A shipped document with one to three hostile edits."""
    import copy

    doc = copy.deepcopy(draw(st.sampled_from(docs)))
    for _ in range(draw(st.integers(1, 2))):
        paths = _paths(doc)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for p in path[:-1]:
            parent = parent[p]
        last = path[-1]
        op = draw(st.sampled_from(["nudge", "nudge", "replace", "replace", "delete", "add"]))
        if op == "nudge":  # same type, any value: most such files are valid, and reach deeper code
            parent[last] = draw(_same_type(parent[last]))
        elif op == "replace":
            parent[last] = draw(hostile_values())
        elif op == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(KNOWN_KEYS) | st.text(min_size=1, max_size=8))] = draw(hostile_values())
        else:
            parent.append(draw(hostile_values()))
    return doc
