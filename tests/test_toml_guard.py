"""The TOML guard (issue 22 §1): hostile scenario and limits files, and the guard's three layers.

The old pre-parse scan took the escaped quote in ``HIDE`` below (a backslash, then three
quotes, inside a triple-quoted string) for the end of the string, and the real closing quotes
for the start of another that never closed, so everything after that line went unchecked: a 100 KB file with a 50,000-part dotted key below it made ``tomllib``
allocate until a 3 GiB cap ran out (about 4 bytes × parts²), and ``redteam limits`` had no
guard at all. Each hostile file is loaded in ONE subprocess whose address space is capped at
what it uses after its imports plus 1 GiB, with a 60 s alarm per case, so a regression is a
``crash: MemoryError`` or ``hung`` here, never a machine that swaps.

Cases marked ``noscan`` run with the lexical scan switched off: they show that the bounds
which do not depend on our reading of TOML's syntax (the dot-work bound before the parser, the
depth and integer walk after it) refuse the same files on their own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from redteam.errors import InvalidScenario
from redteam.scenario_limits import Limits, check_document, check_dot_work, scan_text

ROOT = Path(__file__).resolve().parent.parent

BASE = """\
[scenario]
name = "t"
[workload]
name = "digits"
[federation]
clients = 4
rounds = 1
partition = "iid"
[attack]
name = "sign_flip"
[defense]
name = "mean"
"""

# TOML: the string 'x""" ' (an escaped quote, two quotes, a space, then the closing three).
# The old scan: a string closed by the last three quotes of \""" and a new one opened by """.
HIDE = 'note = """x\\""" """\n'
LIMITS = '[limits]\nname = "l"\n'


def _dotted(parts: int, head: str = "x") -> str:
    return head + ".a" * (parts - 1)


def _hidden(body: str) -> str:
    """A scenario whose [attack] table has the desynchronising string, then ``body``."""
    return BASE.replace("[attack]\n", "[attack]\n" + HIDE) + body


def _header_times_lines(header_parts: int, size: int = 900_000) -> str:
    head = "[" + _dotted(header_parts) + "]\n"
    lines, n, i = [head], len(head), 0
    while n < size:
        line = f"k{i}.b=1\n"
        lines.append(line)
        n, i = n + len(line), i + 1
    return "".join(lines)


# name -> (file text ("|fifo" for a FIFO), loader, lexical scan on?, expected message parts)
CASES: dict[str, tuple[str, str, bool, tuple[str, ...]]] = {
    # the bypass itself: 100 KB, a 50,000-part dotted key under the desynchronising string
    "hidden_dotted_key": (_hidden("[attack.extra]\n" + _dotted(50_000) + " = 1\n"), "scenario", True,
                          ("s.toml: line 15: a dotted key of more than 16 parts", "REDTEAM_MAX_KEY_DEPTH")),
    "hidden_header": (_hidden("[attack." + _dotted(50_000) + "]\n"), "scenario", True,
                      ("s.toml: line 14: a dotted key of more than 16 parts",)),
    "hidden_nesting": (_hidden("[attack.extra]\nx = " + "[" * 300 + "]" * 300 + "\n"), "scenario", True,
                       ("s.toml: line 15: nested deeper than 32 brackets", "REDTEAM_MAX_NESTING")),
    # an escaped backslash does close the string; a literal string has no escapes at all
    "escaped_backslash": (BASE.replace("[attack]\n", '[attack]\nnote = """x\\\\"""\n')
                          + "[attack.extra]\n" + _dotted(20) + " = 1\n", "scenario", True,
                          ("s.toml: line 15: a dotted key of more than 16 parts",)),
    "literal_backslash": (BASE.replace("[attack]\n", "[attack]\nnote = '''x\\'''\n")
                          + "[attack.extra]\n" + _dotted(20) + " = 1\n", "scenario", True,
                          ("s.toml: line 15: a dotted key of more than 16 parts",)),
    # limits files: the same reader, the same bounds
    "limits_hidden_dotted_key": (LIMITS.replace("[limits]\n", "[limits]\n" + HIDE) + "[limits.peers]\n"
                                 + _dotted(50_000) + " = 1\n", "limits", True,
                                 ("l.toml: line 5: a dotted key of more than 16 parts",)),
    "limits_nesting": (LIMITS + "[limits.peers]\ncounts = " + "[" * 40 + "]" * 40 + "\n", "limits", True,
                       ("l.toml: line 4: nested deeper than 32 brackets",)),
    "limits_huge_int": (LIMITS + "[limits.noniid]\nclients = 9223372036854775808\n", "limits", True,
                        ("l.toml: [limits].noniid.clients = 9223372036854775808: integers must fit in 64 bits",)),
    "limits_fifo": ("|fifo", "limits", True, ("l.toml: is a FIFO: a limits file must be a regular file",)),
    "limits_too_large": (LIMITS + "#" * (1 << 20) + "\n", "limits", True,
                         ("larger than the 1048576-byte cap (REDTEAM_MAX_FILE_BYTES)",)),
    # a 400 KB key above 70,000 entries: the integer walk copied the key into each entry's path
    "long_key_many_entries": ('["' + "x" * 400_000 + '"]\n' + "".join(f"a{i}=1\n" for i in range(70_000)),
                              "scenario", True, ("s.toml: unknown section [xxxxxxxx", "…]")),
    "limits_long_key": (LIMITS + '[limits."' + "x" * 400_000 + '"]\n' + "".join(f"a{i}=1\n" for i in range(70_000)),
                        "limits", True, ("l.toml: [limits]: unknown key 'xxxxxxx", "…'")),
    # ---- the lexical scan switched off: the other two layers alone
    "noscan_dotted_key": (BASE + "[attack.extra]\n" + _dotted(50_000) + " = 1\n", "scenario", False,
                          ("s.toml: line 14 has 49999 dots", "REDTEAM_MAX_DOT_WORK")),
    "noscan_header": (BASE + "[attack." + _dotted(50_000) + "]\n", "scenario", False,
                      ("s.toml: line 13 has 50000 dots", "REDTEAM_MAX_DOT_WORK")),
    # a 1,400-part header above 0.9 MB of one-dot lines: 84 s and 1.2 GB of tomllib unguarded
    "noscan_header_times_lines": (_header_times_lines(1400), "scenario", False,
                                  ("s.toml: line 1 has 1399 dots", "REDTEAM_MAX_DOT_WORK")),
    "noscan_nesting_300": (BASE + "[attack.extra]\nx = " + "[" * 300 + "]" * 300 + "\n", "scenario", False,
                           ("s.toml: [attack].extra.x[0][0]", "nested more than 32 levels deep",
                            "REDTEAM_MAX_NESTING")),
    "noscan_tables_40": (BASE + "[attack.extra]\nx = " + "{a = " * 40 + "1" + "}" * 40 + "\n", "scenario", False,
                         ("s.toml: [attack].extra.x.a.a", "nested more than 32 levels deep")),
    "noscan_nesting_5000": (BASE + "x = " + "[" * 5000 + "]" * 5000 + "\n", "scenario", False,
                            ("s.toml: nested too deeply to parse",)),
    "noscan_limits_dotted_key": (LIMITS + "[limits.peers]\n" + _dotted(50_000) + " = 1\n", "limits", False,
                                 ("l.toml: line 4 has 49999 dots", "REDTEAM_MAX_DOT_WORK")),
    # and the shipped files still load with the scan off: the other layers do not refuse them
    "noscan_smoke": ("@scenarios/smoke.toml", "scenario", False, ()),
    "noscan_limits_shipped": ("@scenarios/limits.toml", "limits", False, ()),
}

_WORKER = r"""
import json, os, resource, signal, sys
import torch  # before the cap: importing it maps a lot of address space
import redteam.scenario_limits as SL
from redteam.errors import InvalidScenario
from redteam.limits import load_limits
from redteam.matrix import load_matrix
with open("/proc/self/status") as fh:
    vm = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))
class Hung(BaseException):
    pass
def alarm(*_):
    raise Hung()
signal.signal(signal.SIGALRM, alarm)
scan = SL.scan_text
out = {}
for case in json.loads(sys.stdin.read()):
    SL.scan_text = scan if case["scan"] else (lambda *a, **k: None)
    signal.alarm(60)
    try:
        (load_limits if case["loader"] == "limits" else load_matrix)(case["path"])
        out[case["name"]] = ["ok", ""]
    except InvalidScenario as exc:
        out[case["name"]] = ["invalid", str(exc)]
    except Hung:
        out[case["name"]] = ["hung", ""]
    except BaseException as exc:
        out[case["name"]] = ["crash", f"{type(exc).__name__}: {str(exc)[:200]}"]
    finally:
        signal.alarm(0)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("guard")
    cases = []
    for name, (text, loader, scan, _) in CASES.items():
        if text.startswith("@"):
            path = ROOT / text[1:]
        else:
            d = root / name
            d.mkdir()
            path = d / ("l.toml" if loader == "limits" else "s.toml")
            if text == "|fifo":
                os.mkfifo(path)
            else:
                path.write_text(text, "utf-8")
        cases.append({"name": name, "path": str(path), "loader": loader, "scan": scan})
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDTEAM_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_toml_is_one_line_error(outcomes, name):
    kind, msg = outcomes[name]
    expected = CASES[name][3]
    if not expected:
        assert kind == "ok", f"{name}: {kind}: {msg}"
        return
    assert kind == "invalid", f"{name}: {kind}: {msg}"
    assert "\n" not in msg and len(msg) < 400, msg[:1000]
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_the_bypass_text_is_what_it_claims():
    # tomllib reads the string as x""" and a space, and the dotted key below it as a key
    text = _hidden("[attack.extra]\n" + _dotted(20) + " = 1\n")
    doc = tomllib.loads(text)
    assert doc["attack"]["note"] == 'x""" '
    assert "x" in doc["attack"]["extra"]
    assert 90_000 < len(CASES["hidden_dotted_key"][0]) < 110_000  # "a 100 KB file"


# ------------------------------------------------------------------ the lexical scan, against tomllib

_CHARS = st.lists(st.sampled_from(['"', '""', '"""', "'", "'''", "\\", "[", "]", "{", ".", "a", " ", "\n", "#", "="]),
                  max_size=10).map("".join)


def _basic(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _ml_basic(s: str, escape: str) -> str:
    body = s.replace("\\", "\\\\")
    if escape == "all":  # every quote escaped
        body = body.replace('"', '\\"')
    elif escape == "first":  # the first quote of each run: a run of three gives issue 22's bypass
        body = re.sub(r'(?<!")"', lambda m: '\\"', body)
    else:  # only what would close the string
        body = body.replace('"""', '""\\"')
    if body.endswith('"') and not body.endswith('\\"'):
        body = body[:-1] + '\\"'
    return '"""' + body + '"""'


@settings(max_examples=600, deadline=None)
@example(content='a"""b', form="ml_basic_first", parts=20, deep=0)  # issue 22: the bypass
@example(content='a"""b', form="ml_basic_first", parts=1, deep=40)
@given(content=_CHARS, form=st.sampled_from(["basic", "literal", "ml_basic", "ml_basic_all", "ml_basic_first",
                                             "ml_literal"]),
       parts=st.integers(1, 24), deep=st.integers(0, 40))
def test_scan_reads_strings_as_tomllib_does(content, form, parts, deep):
    # a string of each form holding quotes, backslashes, brackets, dots and newlines, then a
    # dotted key and a nested value: the scan refuses exactly when tomllib's document is
    # over a cap, so no string can hide what follows it
    if form == "basic":
        value = _basic(content)
    elif form == "literal":
        value = "'" + content + "'"
    elif form == "ml_literal":
        value = "'''" + content + "'''"
    else:
        value = _ml_basic(content, form.removeprefix("ml_basic").lstrip("_"))
    text = f"s = {value}\n{_dotted(parts, 'k')} = {'[' * deep}1{']' * deep}\n"
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return  # not every content fits every form (a literal string has no escapes)
    node, n = doc.get("k"), 1
    while isinstance(node, dict):
        node, n = node.get("a"), n + 1
    if n != parts:  # the content closed its string early and changed what follows: not this test's case
        return
    limits = Limits(max_nesting=32, max_key_depth=16)
    if parts > 16:
        with pytest.raises(InvalidScenario, match="line [0-9]+: a dotted key of more than 16 parts"):
            scan_text(text, limits, "f.toml")
    elif deep > 32:
        with pytest.raises(InvalidScenario, match="line [0-9]+: nested deeper than 32 brackets"):
            scan_text(text, limits, "f.toml")
    else:
        scan_text(text, limits, "f.toml")


def test_scan_is_linear_in_escapes():
    # the escape handling re-searches for the closing quotes only past an escape that took one
    import time

    text = 's = """' + "\\n" * 200_000 + '"""\n' + _dotted(20, "k") + " = 1\n"
    t = time.perf_counter()
    with pytest.raises(InvalidScenario, match="line 2: a dotted key"):
        scan_text(text, Limits(), "f.toml")
    assert time.perf_counter() - t < 5


# ------------------------------------------------------------------ the bounds that need no lexer


def _shipped() -> list[Path]:
    return sorted((ROOT / "scenarios").rglob("*.toml")) + sorted((ROOT / "examples").rglob("*.toml"))


def test_shipped_files_are_far_inside_the_syntax_free_bounds():
    limits = Limits()
    for p in _shipped():
        text = p.read_text("utf-8")
        d = max(line.count(".") for line in text.split("\n"))
        work = (d + 1) * (text.count("\n") + 1 + text.count("."))
        assert work * 100 < limits.max_dot_work, (p, work)
        check_dot_work(text, limits, p.name)
        check_document(tomllib.loads(text), limits, p.name)


@pytest.mark.parametrize("dots", [1, 40, 1000])
def test_dot_work_refuses_exactly_above_the_budget(dots):
    text = "x = [" + ", ".join(["1.5"] * dots) + "]\n"  # one line of `dots` dots, 2 lines in all
    work = (dots + 1) * (2 + dots)
    check_dot_work(text, Limits(max_dot_work=work), "f.toml")
    with pytest.raises(InvalidScenario, match=rf"f.toml: line 1 has {dots} dots, in a file of 2 lines and {dots} "
                                              rf"dots: \({dots} \+ 1\) × \(2 \+ {dots}\) = {work}, more than "
                                              rf"{work - 1} .*REDTEAM_MAX_DOT_WORK"):
        check_dot_work(text, Limits(max_dot_work=work - 1), "f.toml")


def test_dot_work_counts_dots_wherever_they_are():
    # in a string, a comment or a float: a dot is a dot, so nothing can hide a key's dots
    for line in ['s = "' + "." * 3000 + '"', "# " + "." * 3000, "x = [" + "1.0," * 3000 + "]",
                 "k" + ".k" * 3000 + " = 1"]:
        with pytest.raises(InvalidScenario, match="line 1 has 3000 dots"):
            check_dot_work(line + "\n", Limits(), "f.toml")


def test_dot_work_at_the_budget_keeps_tomllib_small():
    # the worst shapes the default budget lets through: many keys of 100 parts, or a
    # 1,000-part header above a thousand dotted lines. tomllib's peak stays in tens of MB.
    import tracemalloc

    shapes = ["".join(f"k{i}" + ".a" * 100 + " = 1\n" for i in range(200)),
              "[" + _dotted(1000) + "]\n" + "".join(f"k{i}.b = 1\n" for i in range(500))]
    for text in shapes:
        check_dot_work(text, Limits(), "f.toml")
        tracemalloc.start()
        try:
            tomllib.loads(text)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20, peak


@pytest.mark.parametrize("cap", [1, 5, 32])
def test_document_depth_counts_tables_and_arrays_however_written(cap):
    limits = Limits(max_nesting=cap)
    # a header's parts, dotted keys, inline tables and arrays all count as levels
    at_cap = tomllib.loads("[" + _dotted(cap) + "]\n") if cap > 1 else {"x": {}}
    check_document(at_cap, limits, "f.toml")
    over = {"s": {"k": [[{"a": [1]}]]}} if cap == 1 else tomllib.loads(f"[{_dotted(cap - 1)}]\ny = [[1]]\n")
    with pytest.raises(InvalidScenario, match=rf"f.toml: \[.*: nested more than {cap} levels deep"):
        check_document(over, limits, "f.toml")


def test_document_walk_names_the_path_and_cuts_long_keys():
    doc = {"federation": {"k" * 10_000: [1, {"v": 2**63}]}}
    with pytest.raises(InvalidScenario) as exc:
        check_document(doc, Limits(), "f.toml")
    msg = str(exc.value)
    assert msg.startswith("f.toml: [federation].kkkk") and "…[1].v = 9223372036854775808: integers must fit" in msg
    assert len(msg) < 200
