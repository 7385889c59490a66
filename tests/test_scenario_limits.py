"""Hostile scenario files (issue 9 §3): each is refused with one line before any large allocation.

Every case is loaded in ONE subprocess whose address space is capped (what it uses after
importing torch and redteam, plus 1.5 GiB) and whose cases each get a 60 s alarm, so a
regression shows up as ``crash: MemoryError`` or ``hung`` in this test, not as a machine
that swaps or a CI job that never ends. The expected messages are written by hand from the
issue's rule: the file, the key, the value (cut to ~60 characters) and what was expected.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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

_WORKER = r"""
import json, os, resource, signal, sys, traceback
import torch  # before the cap: importing it maps a lot of address space
from redteam.errors import InvalidScenario
from redteam.matrix import load_matrix
with open("/proc/self/status") as fh:
    vm = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + 3 * 2**29, resource.getrlimit(resource.RLIMIT_AS)[1]))
class Hung(BaseException):
    pass
def alarm(*_):
    raise Hung()
signal.signal(signal.SIGALRM, alarm)
out = {}
for case in json.loads(sys.stdin.read()):
    saved = dict(os.environ)
    os.environ.update(case["env"])
    signal.alarm(60)
    try:
        load_matrix(case["entry"])
        out[case["name"]] = ["ok", ""]
    except InvalidScenario as exc:
        out[case["name"]] = ["invalid", str(exc)]
    except Hung:
        out[case["name"]] = ["hung", ""]
    except BaseException as exc:
        out[case["name"]] = ["crash", f"{type(exc).__name__}: {str(exc)[:200]}"]
    finally:
        signal.alarm(0)
        os.environ.clear()
        os.environ.update(saved)
print(json.dumps(out))
"""


def _fed(extra: str) -> str:
    return BASE.replace("rounds = 1\n", "rounds = 1\n" + extra + "\n")


def _settings_axes(k: int, size: int) -> str:
    keys = ["federation.lr", "federation.alpha", "federation.prox_mu", "federation.server_momentum"][:k]
    rows = [f'"{key}" = [{", ".join(str(0.001 * (i + 1)) for i in range(size))}]' for key in keys]
    return BASE + "[matrix.settings]\n" + "\n".join(rows) + "\n"


# name -> (files in the scenario's directory, entry file, environment, expected message parts)
CASES: dict[str, tuple[dict[str, str], str, dict[str, str], tuple[str, ...]]] = {
    # 10**9 replicates would be a 10**9-element tuple of seeds before anything runs
    "seeds_1e9": ({"s.toml": BASE + "[matrix]\nseeds = 1000000000\n"}, "s.toml", {},
                  ("s.toml: [matrix].seeds = 1000000000", "more than the cap of 1000", "REDTEAM_MAX_SEEDS")),
    # 4 setting axes of 100 values: 1 attack × 1 defense × 100**4 = 10**8 cells, counted, never built
    "cells_1e8": ({"s.toml": _settings_axes(4, 100)}, "s.toml", {},
                  ("s.toml: [matrix] expands to 1 × 1 × 100 × 100 × 100 × 100 = 100000000 cells",
                   "cap of 10000", "REDTEAM_MAX_CELLS")),
    # 2 × 2 = 4 cells against a cap lowered to 3 (the cap is the user's to set)
    "cells_cap_env": ({"s.toml": _settings_axes(2, 2)}, "s.toml", {"REDTEAM_MAX_CELLS": "3"},
                      ("= 4 cells, more than the cap of 3",)),
    "cells_within_cap": ({"s.toml": _settings_axes(2, 2)}, "s.toml", {"REDTEAM_MAX_CELLS": "4"}, ()),
    # 1,001 rows (each would be matched against every cell) against the cap of 1,000
    "expect_rows": ({"s.toml": BASE + '[[expect]]\nmetric = "recall"\nmin = 0\n' * 1001}, "s.toml", {},
                    ("s.toml: [[expect]] has 1001 rows, more than the cap of 1000", "REDTEAM_MAX_EXPECTATIONS")),
    "expect_rows_at_cap": ({"s.toml": BASE + '[[expect]]\nmetric = "recall"\nmin = 0\n' * 1000}, "s.toml", {}, ()),
    "include_deep": ({"s.toml": 'include = "b.toml"\n' + BASE, "b.toml": "x = " + "[" * 40 + "]" * 40 + "\n"},
                     "s.toml", {}, ("b.toml: line 1: nested deeper than 32 brackets (REDTEAM_MAX_NESTING) "
                                    "(included from s.toml)",)),
    "include_dev_zero": ({"s.toml": 'include = "/dev/zero"\n' + BASE}, "s.toml", {},
                         ('s.toml: include = "/dev/zero": must stay inside', "REDTEAM_ALLOW_INCLUDE_OUTSIDE")),
    "include_dev_zero_allowed": ({"s.toml": 'include = "/dev/zero"\n' + BASE}, "s.toml",
                                 {"REDTEAM_ALLOW_INCLUDE_OUTSIDE": "1"},
                                 ("/dev/zero: is a device: a scenario must be a regular file (included from s.toml)",)),
    "include_parent": ({"s.toml": 'include = "../outside.toml"\n' + BASE}, "s.toml", {},
                       ('s.toml: include = "../outside.toml": must stay inside',)),
    "include_parent_allowed": ({"s.toml": 'include = "../outside.toml"\n' + BASE}, "s.toml",
                               {"REDTEAM_ALLOW_INCLUDE_OUTSIDE": "1"}, ()),
    "include_symlink_out": ({"s.toml": 'include = "link.toml"\n' + BASE, "link.toml": "->../outside.toml"},
                            "s.toml", {}, ('s.toml: include = "link.toml": must stay inside',)),
    "include_subdir": ({"s.toml": 'include = "sub/base.toml"\n' + BASE, "sub/base.toml": "[federation]\nrounds = 2\n"},
                       "s.toml", {}, ()),
    "fifo": ({"s.toml": "|fifo"}, "s.toml", {}, ("s.toml: is a FIFO: a scenario must be a regular file",)),
    "include_fifo": ({"s.toml": 'include = "pipe.toml"\n' + BASE, "pipe.toml": "|fifo"}, "s.toml", {},
                     ("pipe.toml: is a FIFO", "(included from s.toml)")),
    "directory": ({"s.toml": 'include = "sub"\n' + BASE, "sub/x.toml": ""}, "s.toml", {},
                  ("sub: is a directory",)),
    # a comment makes it 1 MiB + 1 byte: refused by size before a byte of TOML is parsed
    "too_large": ({"s.toml": BASE + "#" * ((1 << 20) - len(BASE) - 1) + "\n" + "#"}, "s.toml", {},
                  ("s.toml: ", "larger than the 1048576-byte cap", "REDTEAM_MAX_FILE_BYTES")),
    "too_large_allowed": ({"s.toml": BASE + "#" * ((1 << 20) - len(BASE) - 1) + "\n" + "#"}, "s.toml",
                          {"REDTEAM_MAX_FILE_BYTES": str(2 << 20)}, ()),
    # 200 KB of one dotted key: tomllib's flags are quadratic in its depth (tens of GB)
    "dotted_key_100k": ({"s.toml": BASE + "[attack.x" + ".a" * 100_000 + "]\n"}, "s.toml", {},
                        ("s.toml: line 13: a dotted key of more than 16 parts", "REDTEAM_MAX_KEY_DEPTH")),
    "dotted_key_inline": ({"s.toml": BASE + "y = {" + ".".join(["b"] * 17) + " = 1}\n"}, "s.toml", {},
                          ("line 13: a dotted key of more than 16 parts",)),
    "array_5000_deep": ({"s.toml": BASE + "x = " + "[" * 5000 + "]" * 5000 + "\n"}, "s.toml", {},
                        ("s.toml: line 13: nested deeper than 32 brackets", "REDTEAM_MAX_NESTING")),
    "table_5000_deep": ({"s.toml": BASE + "x = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n"}, "s.toml", {},
                        ("line 13: nested deeper than 32 brackets",)),
    # 10**70 has 71 digits: shown as its first 12 and a count (values are cut to ~60 characters)
    "huge_int": ({"s.toml": BASE.replace("clients = 4", "clients = " + "1" + "0" * 70)}, "s.toml", {},
                 ("s.toml: [federation].clients = 100000000000…(71 digits): integers must fit in 64 bits",)),
    "int_2_63": ({"s.toml": BASE.replace("clients = 4", "clients = 9223372036854775808")}, "s.toml", {},
                 ("s.toml: [federation].clients = 9223372036854775808: integers must fit in 64 bits",)),
    "int_5000_digits": ({"s.toml": BASE.replace("clients = 4", "clients = " + "7" * 5000)}, "s.toml", {},
                        ("s.toml: line 6: a number of 5000 digits: integers must fit in 64 bits",)),
    "batch_size": ({"s.toml": _fed("batch_size = 1000000000")}, "s.toml", {},
                   ("s.toml: [federation].batch_size = 1000000000: must be ≤ 65536", "REDTEAM_MAX_BATCH_SIZE")),
    "local_steps": ({"s.toml": _fed("local_steps = 1000000000")}, "s.toml", {},
                    ("s.toml: [federation].local_steps = 1000000000: must be ≤ 100000",)),
    "local_epochs": ({"s.toml": _fed("local_epochs = 1e9")}, "s.toml", {},
                     ("s.toml: [federation].local_epochs = 1000000000.0: must be ≤ 1000",)),
    "shards": ({"s.toml": _fed("shards_per_client = 1000000000")}, "s.toml", {},
               ("s.toml: [federation].shards_per_client = 1000000000: must be ≤ 10000",)),
    "rounds": ({"s.toml": BASE.replace("rounds = 1", "rounds = 1000000000")}, "s.toml", {},
               ("[federation].rounds = 1000000000: must be ≤ 100000",)),
    # the default batch of 16: 100,000 × 16 = 1,600,000 samples per step ≤ 2**22 = 4,194,304: accepted
    "samples_per_step": ({"s.toml": BASE.replace("clients = 4", "clients = 100000")}, "s.toml", {}, ()),
    # 100,000 clients × batch 64 = 6,400,000 samples in one batched step > 2**22 = 4,194,304
    "samples_per_step_over": ({"s.toml": _fed("batch_size = 64").replace("clients = 4", "clients = 100000")},
                              "s.toml", {}, ("clients × batch_size = 6400000 samples per batched step",
                                             "more than 4194304")),
    "synthetic_samples": ({"s.toml": BASE.replace('name = "digits"', 'name = "synthetic"\nsamples = 1000000000000')},
                          "s.toml", {}, ("s.toml: [workload]", "Synthetic.samples = 1000000000000: must be in [20, 10**6]")),
    "synthetic_features": ({"s.toml": BASE.replace('name = "digits"', 'name = "synthetic"\nfeatures = 100000')},
                           "s.toml", {}, ("Synthetic.features = 100000: must be in [2, 10**4]",)),
    "digits_hidden": ({"s.toml": BASE.replace('name = "digits"', 'name = "digits"\nhidden = 1000000000')},
                      "s.toml", {}, ("s.toml: [workload]", "Digits.hidden = 1000000000: must be an integer in [1, 4096]")),
    "attack_name_int": ({"s.toml": BASE.replace('name = "sign_flip"', "name = 5")}, "s.toml", {},
                        ("s.toml: [attack].name = 5: must be a registered name",)),
    "matrix_pipeline_name_int": ({"s.toml": BASE + "[matrix]\ndefenses = [{pipeline = [{name = 5}]}]\n"}, "s.toml",
                                 {}, ('s.toml: [matrix].defenses[0].pipeline = [{"name": 5}]: must be a non-empty list',)),
    "matrix_attack_name_list": ({"s.toml": BASE + '[matrix]\nattacks = [{name = ["alie"]}]\n'}, "s.toml", {},
                                ('s.toml: [matrix].attacks[0].name = ["alie"]: must be a string',)),
    "expect_attack_list": ({"s.toml": BASE + '[[expect]]\nattack = ["sign_flip"]\nmetric = "recall"\nmin = 0\n'},
                           "s.toml", {}, ('s.toml: [[expect]] #1: attack = ["sign_flip"]: must be a string, number',)),
    "expect_metric_table": ({"s.toml": BASE + "[[expect]]\nmetric = {a = 1}\nmin = 0\n"}, "s.toml", {},
                            ('s.toml: [[expect]] #1: metric = {"a": 1}: must be a string, number',)),
    "expect_setting_list": ({"s.toml": _settings_axes(1, 2) + '[[expect]]\nlr = [0.001]\nmetric = "recall"\nmin = 0\n'},
                            "s.toml", {}, ("s.toml: [[expect]] #1: lr = [0.001]: must be a string, number",)),
    # a nan bound holds for every value (x < nan is false): an expectation that cannot fail
    "expect_nan": ({"s.toml": BASE + '[[expect]]\nmetric = "recall"\nmin = nan\n'}, "s.toml", {},
                   ("s.toml: [[expect]] #1: min = nan: must be a number, not nan",)),
    "codec_params_int": ({"s.toml": BASE + '[transport]\ncodec = "topk"\ncodec_params = 5\n'}, "s.toml", {},
                         ("s.toml: [transport].codec_params = 5: must be a table of the codec's parameters",)),
    "codec_params_list": ({"s.toml": BASE + '[transport]\ncodec = "topk"\ncodec_params = [["fraction", 0.1]]\n'},
                          "s.toml", {}, ('s.toml: [transport].codec_params = [["fraction", 0.1]]: must be a table',)),
    "setting_through_scalar": ({"s.toml": BASE + '[matrix.settings]\n"federation.clients.x" = [1]\n'}, "s.toml", {},
                               ('s.toml: [matrix].settings key "federation.clients.x": \'clients\' is not a table',)),
}


def _materialise(root: Path, name: str, files: dict[str, str]) -> Path:
    d = root / name / "scenarios"
    d.mkdir(parents=True)
    (root / name / "outside.toml").write_text("[federation]\nrounds = 3\n")
    for rel, content in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if content == "|fifo":
            os.mkfifo(p)
        elif content.startswith("->"):
            p.symlink_to(content[2:])
        else:
            p.write_text(content, "utf-8")
    return d


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    cases = []
    for name, (files, entry, env, _) in CASES.items():
        d = _materialise(root, name, files)
        cases.append({"name": name, "entry": str(d / entry), "env": env})
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDTEAM_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_file_is_one_line_error(outcomes, name):
    kind, msg = outcomes[name]
    expected = CASES[name][3]
    if not expected:
        assert kind == "ok", f"{name}: {kind}: {msg}"
        return
    assert kind == "invalid", f"{name}: {kind}: {msg}"
    assert "\n" not in msg and len(msg) < 400, msg
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"


# ------------------------------------------------------------------ the lexical scan, alone

from hypothesis import given, settings, strategies as st  # noqa: E402

from redteam.errors import InvalidScenario  # noqa: E402
from redteam.scenario_limits import Limits, scan_text  # noqa: E402

import tomllib  # noqa: E402


def _nest(kinds: list[str]) -> str:
    """A value nested len(kinds) deep: "a" = array, "t" = inline table (key k)."""
    text = "1"
    for k in reversed(kinds):
        text = f"[{text}]" if k == "a" else f"{{k = {text}}}"
    return text


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(st.sampled_from("at"), min_size=1, max_size=40), cap=st.integers(1, 40))
def test_scan_counts_nesting_exactly(kinds, cap):
    # `x = <value>` sits at depth 0; each bracket or brace opens one level, so the deepest
    # point of the line is len(kinds) levels: refused exactly when that exceeds the cap.
    text = f"x = {_nest(kinds)}\n"
    tomllib.loads(text)  # it is valid TOML
    limits = Limits(max_nesting=cap)
    if len(kinds) > cap:
        with pytest.raises(InvalidScenario, match=f"f.toml: line 1: nested deeper than {cap} brackets"):
            scan_text(text, limits, "f.toml")
    else:
        scan_text(text, limits, "f.toml")


@settings(max_examples=60, deadline=None)
@given(parts=st.integers(1, 30), where=st.sampled_from(["line", "header", "inline", "array_table"]))
def test_scan_counts_dotted_key_parts(parts, where):
    # a key of `parts` parts has parts − 1 dots; refused exactly when parts > max_key_depth (16)
    key = ".".join(f"k{i}" for i in range(parts))
    text = {"line": f"{key} = 1\n", "header": f"[{key}]\nz = 1\n", "inline": f"x = {{{key} = 1}}\n",
            "array_table": f"[[{key}]]\n"}[where]
    tomllib.loads(text)
    if parts > 16:
        with pytest.raises(InvalidScenario, match="line 1: a dotted key of more than 16 parts"):
            scan_text(text, Limits(), "f.toml")
    else:
        scan_text(text, Limits(), "f.toml")


def test_scan_ignores_strings_comments_and_values():
    # brackets, braces and dots inside strings and comments, and dots in numbers and dates,
    # are not structure: none of these counts toward a limit
    text = (
        'a = "[[[[[[[[[[{{{{{{{{a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r"\n'
        "b = '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['\n"
        'c = """\n[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n\\" ]]] """\n'
        "d = '''\n{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{'''\n"
        "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[ a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r\n"
        '"q.u.o.t.e.d.k.e.y.w.i.t.h.m.a.n.y.d.o.t.s" = [1.5, 2.25, 1979-05-27T07:32:00.999]\n'
        "e = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]\n"
    )
    tomllib.loads(text)
    scan_text(text, Limits(max_nesting=2, max_key_depth=2), "f.toml")


def test_limits_from_env():
    assert Limits.from_env({}) == Limits()
    lim = Limits.from_env({"REDTEAM_MAX_CELLS": "50000", "REDTEAM_ALLOW_INCLUDE_OUTSIDE": "1",
                           "REDTEAM_MAX_LOCAL_EPOCHS": "2.5"})
    assert (lim.max_cells, lim.allow_include_outside, lim.max_local_epochs) == (50000, True, 2.5)
    with pytest.raises(InvalidScenario, match='environment REDTEAM_MAX_CELLS = "lots": expected a number'):
        Limits.from_env({"REDTEAM_MAX_CELLS": "lots"})
    with pytest.raises(InvalidScenario, match='environment REDTEAM_MAX_SEEDS = "0": must be ≥ 1'):
        Limits.from_env({"REDTEAM_MAX_SEEDS": "0"})


def test_a_symlinked_scenario_includes_beside_the_link(tmp_path):
    # includes are resolved from the directory the user named the scenario in; a link to a
    # file elsewhere does not move that directory (nor open the target's directory instead)
    from redteam.scenario import load_document

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "real.toml").write_text('include = "base.toml"\n[federation]\nrounds = 2\n')
    (tmp_path / "elsewhere" / "base.toml").write_text("[federation]\nclients = 99\n")
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "base.toml").write_text("[federation]\nclients = 7\n")
    (tmp_path / "here" / "s.toml").symlink_to(tmp_path / "elsewhere" / "real.toml")
    assert load_document(tmp_path / "here" / "s.toml")["federation"] == {"clients": 7, "rounds": 2}


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("[]{}=.,\"'\n#0123456789_abk \\-+:etrufalsinx")), max_size=120))
def test_the_reader_turns_any_text_into_a_document_or_one_error(text):
    # the lexical scan must survive any text (unterminated strings, stray brackets, escapes)
    # and the reader must end in a dict or an InvalidScenario, never anything else
    import tempfile

    from redteam.scenario import _read_toml

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.toml"
        p.write_text(text, "utf-8")
        try:
            assert isinstance(_read_toml(p, limits=Limits(max_nesting=3, max_key_depth=2)), dict)
        except InvalidScenario as exc:
            assert "\n" not in str(exc)


def test_values_in_messages_are_cut_to_about_60_characters():
    from redteam.scenario import parse_scenario
    from redteam.scenario_limits import shown

    assert shown(-3) == "-3" and shown("ten") == '"ten"' and shown([1, "a"]) == '[1, "a"]'
    assert shown("x" * 100) == '"' + "x" * 58 + "…"  # 60 characters: the quote, 58 x, the ellipsis
    assert shown(10**70) == "100000000000…(71 digits)"  # 71 digits: the first 12 and the count
    # 10**5000 has 16,610 bits; 16,610 × log10(2) = 5000.1 → "about 5001"; str() of it would raise
    assert shown(10**5000) == "an integer of about 5001 digits"
    assert shown([10**5000]) == "<a list>"
    with pytest.raises(InvalidScenario) as ei:  # a Python dict can carry what TOML cannot
        parse_scenario({"federation": {"clients": 10**5000}}, file="api")
    assert str(ei.value) == ("api: [federation].clients = an integer of about 5001 digits: must be ≤ 100000 "
                             "(REDTEAM_MAX_CLIENTS raises the cap)")


@pytest.mark.parametrize("doc,says", [
    ({"workload": {"name": "text", "width": 100_000}}, "[workload].width = 100000: more than the cap of 8192"),
    ({"workload": {"name": "text", "layers": 10_000}}, "REDTEAM_MAX_MODEL_LAYERS"),
    ({"defense": {"name": "dnc", "niters": 10**7}}, "[defense].niters"),
    ({"defense": {"pipeline": [{"name": "centered_clipping", "n_iter": 10**9}, {"name": "mean"}]}},
     "[defense.pipeline[0]].n_iter"),
    ({"attack": {"name": "compose", "attacks": [{"name": "neurotoxin", "steps": 10**6}]}}, "[attack.attacks[0]].steps"),
])
def test_parameters_that_scale_work_are_capped(doc, says):
    """issue 22 §4: the text model's size and the plugins' loops (hangs and allocation tracebacks)."""
    from redteam.scenario import parse_scenario

    with pytest.raises(InvalidScenario) as e:
        parse_scenario(doc)
    assert says in str(e.value)


def test_the_work_caps_are_raised_from_the_environment(monkeypatch):
    from redteam.scenario import parse_scenario

    monkeypatch.setenv("REDTEAM_MAX_PLUGIN_ITERATIONS", "20000000")
    parse_scenario({"defense": {"name": "dnc", "niters": 10**7}})


def test_a_huge_matrix_label_is_refused():
    from redteam.matrix import expand

    with pytest.raises(InvalidScenario, match="REDTEAM_MAX_LABEL_CHARS"):
        expand({"matrix": {"attacks": [{"name": "sign_flip", "label": "x" * 100_000}]}}, "t.toml")
