"""scripts/mutation.py, our own mutation tester: the mutants it writes for a small source,
their stable ids, and that running one leaves the file as it was (fast: no pytest run of
the project; one tiny test file in a temporary folder)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "mutation.py"


@pytest.fixture(scope="module")
def mutation():
    spec = importlib.util.spec_from_file_location("mutation_tool", _PATH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutation_tool"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("mutation_tool", None)


SOURCE = '''"""A docstring: never mutated."""


def banned(flags: int, strikes: int = 2) -> bool:
    """At the strike limit."""
    if flags >= strikes and strikes > 0:
        raise ValueError(f"{flags} ≥ {strikes}")
    total = flags
    total += 1
    return max(total, 0) < 3
'''


def _by_op(pairs):
    out: dict[str, list[tuple[str, str]]] = {}
    for m, _ in pairs:
        out.setdefault(m.op, []).append((m.original, m.mutated))
    return out


def test_the_mutants_of_a_small_function(mutation):
    pairs = mutation.generate(SOURCE, "m.py")
    ops = _by_op(pairs)
    # the boundaries of both comparisons, and the return's
    assert ("flags >= strikes", "(flags > strikes)") in ops["comparison"]
    assert ("strikes > 0", "(strikes >= 0)") in ops["comparison"]
    assert ("max(total, 0) < 3", "(max(total, 0) <= 3)") in ops["comparison"]
    assert ops["and/or"] == [("flags >= strikes and strikes > 0", "(flags >= strikes or strikes > 0)")]
    assert sorted(ops["drop clause"]) == [("flags >= strikes and strikes > 0", "(flags >= strikes)"),
                                          ("flags >= strikes and strikes > 0", "(strikes > 0)")]
    assert ops["negate condition"] == [("flags >= strikes and strikes > 0",
                                        "(not (flags >= strikes and strikes > 0))")]
    assert ops["call swap"] == [("max(total, 0)", "(min(total, 0))")]
    assert ops["augmented operator"] == [("total += 1", "total -= 1")]
    assert ops["return None"] == [("max(total, 0) < 3", "(None)")]
    # the default 2 and the constants 0, 1, 3 off by one each way; the f-string and the raise untouched
    assert sorted(ops["constant"]) == sorted([("2", "(3)"), ("2", "(1)"), ("0", "(1)"), ("0", "(-1)"),
                                              ("1", "(2)"), ("1", "(0)"), ("0", "(1)"), ("0", "(-1)"),
                                              ("3", "(4)"), ("3", "(2)")])
    # `total = flags` binds a new name (deleting it only raises NameError); the update is deleted
    assert ops["delete statement"] == [("total += 1", "pass")]
    assert all("ValueError" not in m.original and "docstring" not in m.original for m, _ in pairs)
    assert len(pairs) == sum(len(v) for v in ops.values()) == 21
    # every mutant compiles and changes exactly its span: the rest of the text is kept
    for m, src in pairs:
        compile(src, "m.py", "exec")
        assert src != SOURCE and src.count("A docstring: never mutated.") == 1


def test_ids_are_stable_and_distinct(mutation):
    pairs = mutation.generate(SOURCE, "m.py")
    ids = [m.id for m, _ in pairs]
    assert len(set(ids)) == len(ids)  # the two `0 → 1` constants differ by their occurrence
    shifted = mutation.generate("import os\n\n" + SOURCE.split('\n', 1)[1], "m.py")
    assert [m.id for m, _ in shifted] == ids  # lines moved, the same ids
    assert [m.line for m, _ in shifted] == [m.line + 1 for m, _ in pairs]


def test_non_ascii_source_is_spliced_at_the_right_bytes(mutation):
    src = 'def f(x):\n    return "δ" if x <= 1 else "ε"\n'
    (m, out), = [p for p in mutation.generate(src, "m.py") if p[0].op == "comparison"]
    assert out == 'def f(x):\n    return "δ" if (x < 1) else "ε"\n'


def test_run_mutant_restores_the_file_and_judges(mutation, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # a bare pytest: the project's plugins are not needed
    (tmp_path / "m.py").write_text(SOURCE)
    (tmp_path / "test_m.py").write_text(
        "from m import banned\n\n"
        "def test_two_flags():\n    assert banned(0) is True and banned(2, 3) is False\n")
    pairs = {(m.op, m.original, m.mutated): (m, s) for m, s in mutation.generate(SOURCE, "m.py")}
    killed = mutation.run_mutant(tmp_path, *pairs[("comparison", "max(total, 0) < 3", "(max(total, 0) <= 3)")],
                                 ["test_m.py"], [], 60)
    assert killed.status == "killed"  # banned(2, 3): total 3 <= 3 is True
    survived = mutation.run_mutant(tmp_path, *pairs[("comparison", "strikes > 0", "(strikes >= 0)")],
                                   ["test_m.py"], [], 60)
    assert survived.status == "survived"
    broken = mutation.Mutant("x", "m.py", "banned", 1, 1, "test", "", "")
    assert mutation.run_mutant(tmp_path, broken, "def banned(:\n", ["test_m.py"], [], 60).status == "incompetent"
    assert (tmp_path / "m.py").read_text() == SOURCE  # restored after every run
    s = mutation.summarize([killed, survived, mutation.Mutant("y", "m.py", "", 1, 1, "", "", "", "equivalent")], 22)
    assert (s["run"], s["killed"], s["survived"], s["equivalent"], s["kill_rate"]) == (2, 1, 1, 1, 0.5)
    # a mutant no test reaches is not run, and counts as survived
    assert mutation.run_mutant(tmp_path, broken, "", [], [], 60).status == "uncovered"
    assert (tmp_path / "m.py").read_text() == SOURCE


def test_tests_are_selected_by_the_lines_they_run(mutation):
    cover = {"tests": ["t::a", "t::b", "t::c"], "lines": {"t::a": [5, 6], "t::b": [9], "t::c": [6, 9]},
             "import": [1, 4, 12]}

    def m(line, end):
        return mutation.Mutant("i", "m.py", "f", line, end, "op", "", "")

    assert mutation.select_tests(m(6, 6), cover, ["all"]) == ["t::a", "t::c"]  # in run order
    assert mutation.select_tests(m(8, 9), cover, ["all"]) == ["t::b", "t::c"]  # a span over two lines
    assert mutation.select_tests(m(7, 7), cover, ["all"]) == []  # nobody runs it: uncovered
    assert mutation.select_tests(m(12, 12), cover, ["all"]) == ["all"]  # runs at import only: every test
    assert mutation.select_tests(m(7, 7), None, ["all"]) == ["all"]  # no map


def test_equivalents_file_needs_a_reason(mutation, tmp_path):
    p = tmp_path / "eq.toml"
    p.write_text('[[equivalent]]\nmodule = "m.py"\nid = "abc"\nreason = ""\n')
    with pytest.raises(SystemExit, match="needs non-empty strings module, id and reason"):
        mutation.load_equivalents(p)
    p.write_text('[[equivalent]]\nmodule = "m.py"\nid = "abc"\nreason = "same floor"\n')
    assert mutation.load_equivalents(p) == {("m.py", "abc"): "same floor"}
