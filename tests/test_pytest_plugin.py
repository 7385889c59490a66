"""The pytest plugin: scenario expectations as items (pytester), failure text, summary, fixtures.

Expected values are fixed by construction, not measured:

* a cell whose attack is ``none`` *is* its own baseline, so its accuracy_drop is exactly 0
  for every seed (``max = 0.0`` holds, ``min = 0.5`` fails);
* accuracy lies in [0, 1], so ``final_accuracy max = -0.5`` fails for any run;
* an attack that sends its own honest update changes nothing (the attack has its own
  random stream), so it scores exactly like the baseline: accuracy_drop 0.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import ClassVar

import hypothesis  # noqa: F401
import pytest

# Imported here, before any pytester in-process run: such a run drops the modules it imported
# when it ends, torch cannot be imported twice into one process, and hypothesis's pytest
# plugin would import hypothesis afresh (seconds) in each run's terminal summary.
import redteam.federation.loop  # noqa: F401
import redteam.runner.matrix_run  # noqa: F401
from redteam.types import Attack, AttackContext, Surface

pytest_plugins = ["pytester"]

# tiny: 6 clients (2 malicious), 2 rounds of 2 local steps on 400 synthetic samples
BASE = """
[scenario]
name = "tiny"
seed = 7
[workload]
name = "synthetic"
samples = 400
[federation]
clients = 6
malicious_fraction = 0.34
rounds = 2
local_steps = 2
partition = "iid"
"""

MATRIX = BASE + """
[matrix]
attacks = ["none", "sign_flip"]
defenses = ["mean", "median"]
seeds = 2
[[expect]]
attack = "none"
defense = "mean"
metric = "accuracy_drop"
max = 0.0
[[expect]]
attack = "sign_flip"
defense = "mean"
metric = "final_accuracy"
max = -0.5
"""

SMALL = {
    "scenario": {"name": "t", "seed": 3},
    "workload": {"name": "synthetic", "samples": 400},
    "federation": {"clients": 6, "malicious_fraction": 0.34, "rounds": 2, "local_steps": 2, "partition": "iid"},
}


@dataclass(frozen=True, slots=True)
class Honest(Attack):
    """Sends the client's own honest update: an attack that does nothing (test fixture)."""

    gain: float = 1.0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "honest update times gain"

    def craft_updates(self, ctx: AttackContext):  # noqa: ANN201
        return self.gain * ctx.own_updates


def _project(pytester: pytest.Pytester, ini: str = "", **files: str) -> None:
    pytester.makeini("[pytest]\n" + ini)
    for name, text in files.items():
        p = pytester.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def _ids(result: pytest.RunResult) -> list[str]:
    return sorted(line.strip() for line in result.outlines if "::" in line and line.strip()[:1] not in "=<")


# ------------------------------------------------------------------- cheap import


def test_importing_the_plugin_and_collecting_imports_no_torch(tmp_path):
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "m.toml").write_text(MATRIX)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    code = textwrap.dedent(f"""
        import sys
        import redteam.pytest_plugin
        assert "torch" not in sys.modules, "import"
        import pytest
        rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", {str(tmp_path)!r}])
        assert rc == 0, rc
        assert "torch" not in sys.modules, "collection"
        print("NO-TORCH")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "NO-TORCH" in out.stdout, out.stdout + out.stderr
    assert "m.toml::mean[none]" in out.stdout


# --------------------------------------------------------------------- collection


def test_items_are_the_cells_with_expectations_marked_attacks(pytester):
    _project(pytester, **{"scenarios/m.toml": MATRIX, "scenarios/plain.toml": BASE})
    res = pytester.runpytest("--collect-only", "-q")
    # 4 cells, 2 of them named by an [[expect]] row; plain.toml has no [[expect]]: no items
    assert _ids(res) == ["scenarios/m.toml::mean[none]", "scenarios/m.toml::mean[sign_flip]"]
    res = pytester.runpytest("--collect-only", "-q", "-m", "not attacks")
    assert _ids(res) == []
    res = pytester.runpytest("--collect-only", "-q", "-m", "attacks")
    assert len(_ids(res)) == 2


def test_testpaths_runs_skip_scenarios_unless_m_attacks(pytester):
    _project(pytester, "testpaths = tests\nredteam_scenarios = more\n",
             **{"scenarios/m.toml": MATRIX, "more/x.toml": MATRIX, "tests/test_a.py": "def test_a():\n    pass\n"})
    plain = _ids(pytester.runpytest("--collect-only", "-q"))
    assert plain == ["tests/test_a.py::test_a"]
    attacks = _ids(pytester.runpytest("--collect-only", "-q", "-m", "attacks"))
    assert attacks == ["more/x.toml::mean[none]", "more/x.toml::mean[sign_flip]",
                       "scenarios/m.toml::mean[none]", "scenarios/m.toml::mean[sign_flip]"]
    forced = _ids(pytester.runpytest("--collect-only", "-q", "--redteam"))
    assert forced == sorted([*attacks, "tests/test_a.py::test_a"])


def test_explicit_toml_is_collected_once(pytester):
    _project(pytester, "redteam_scenarios = scenarios\n",
             **{"elsewhere/y.toml": MATRIX, "scenarios/m.toml": MATRIX})
    assert len(_ids(pytester.runpytest("--collect-only", "-q", "elsewhere/y.toml"))) == 2
    # the default root, the ini path and an explicit file all name m.toml: its items appear once
    res = pytester.runpytest("--collect-only", "-q", "scenarios", "scenarios/m.toml")
    assert _ids(res) == ["scenarios/m.toml::mean[none]", "scenarios/m.toml::mean[sign_flip]"]
    res = pytester.runpytest("--collect-only", "-q", "scenarios/m.toml::mean[none]")
    assert _ids(res) == ["scenarios/m.toml::mean[none]"]
    # a second name for the same file (a symlink) adds nothing
    (pytester.path / "scenarios" / "n.toml").symlink_to(pytester.path / "scenarios" / "m.toml")
    assert [i.split("::")[1] for i in _ids(pytester.runpytest("--collect-only", "-q", "scenarios"))] == [
        "mean[none]", "mean[sign_flip]"]


def test_two_files_of_one_directory_on_the_command_line(pytester):
    # pytest walks scenarios/ once per path given inside it; both files' items are
    # collected and run (this used to collect nothing and exit 4: "not found: b.toml")
    _project(pytester, **{"scenarios/a.toml": MATRIX, "scenarios/b.toml": MATRIX, "scenarios/c.toml": MATRIX})
    res = pytester.runpytest("--collect-only", "-q", "scenarios/a.toml", "scenarios/b.toml")
    assert res.ret == 0
    assert _ids(res) == ["scenarios/a.toml::mean[none]", "scenarios/a.toml::mean[sign_flip]",
                         "scenarios/b.toml::mean[none]", "scenarios/b.toml::mean[sign_flip]"]
    res = pytester.runpytest("--collect-only", "-q", "scenarios/c.toml", "scenarios/a.toml::mean[none]")
    assert res.ret == 0
    assert _ids(res) == ["scenarios/a.toml::mean[none]", "scenarios/c.toml::mean[none]",
                         "scenarios/c.toml::mean[sign_flip]"]


def test_ini_marks(pytester):
    _project(pytester, "markers = slow\nredteam_marks = m.toml: slow\n",
             **{"scenarios/m.toml": MATRIX, "scenarios/n.toml": MATRIX})
    res = pytester.runpytest("--collect-only", "-q", "-m", "attacks and not slow")
    assert _ids(res) == ["scenarios/n.toml::mean[none]", "scenarios/n.toml::mean[sign_flip]"]


@pytest.mark.parametrize(
    "text, message",
    [
        (MATRIX + "[federation\n", "invalid TOML"),
        (MATRIX.replace('"median"]', '"medain"]'),
         "[defense].name = 'medain': unknown defense; did you mean 'median',"),
        (MATRIX.replace("clients = 6", "clients = -3"), "[federation].clients = -3: must be an integer ≥ 1"),
        (MATRIX.replace('metric = "final_accuracy"', 'metric = "final_acuracy"'),
         "did you mean 'final_accuracy'"),
    ],
)
def test_broken_scenario_is_a_one_line_collection_error(pytester, text, message):
    _project(pytester, **{"scenarios/bad.toml": text})
    res = pytester.runpytest("-q")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    out = res.stdout.str()
    assert "ERROR collecting scenarios/bad.toml" in out
    line = next(ln for ln in res.outlines if ln.startswith("InvalidScenario: "))
    assert "bad.toml: " in line and message in line, line
    assert "Traceback" not in out and "site-packages" not in out and "def collect" not in out


# -------------------------------------------------------------------- running items
#
# Sessions that run items go through a subprocess: pytester's in-process runs drop the
# modules they imported when they end, and torch / numpy extensions cannot be imported
# twice into one process. One session covers most of the behaviour to keep this fast.

AUTHOR_TESTS = """
def test_contracts(check_defense, check_attack, redteam_registries):
    import redteam.testing
    assert "median" in redteam_registries.DEFENSES.names()
    assert check_attack is redteam.testing.check_attack
    assert "invariance to permuting clients" in str(check_defense("median", max_examples=2))

def test_register(redteam_registries):
    from attacks.basic import SignFlip
    from redteam.scenario import parse_scenario
    redteam_registries.ATTACKS.register("flip_for_test", SignFlip)
    parse_scenario({"attack": {"name": "flip_for_test"}})

def test_registration_was_undone(redteam_registries):
    assert "flip_for_test" not in redteam_registries.ATTACKS.names()

def test_ledger(redteam_ledger):
    assert redteam_ledger.size == 0
    assert redteam_ledger.checkpoint().startswith("redteam.pytest/ledger\\n0\\n")
"""

NO_RUNS_CONFTEST = """
import os
if os.environ.get("REDTEAM_FORBID_RUNS"):
    import redteam.runner.matrix_run as m

    def forbidden(*args, **kwargs):
        raise AssertionError("a run was recomputed although the store holds it")

    m.execute_unit = forbidden
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One pytest session (subprocess) over: m.toml (a passing and a failing expectation),
    p.toml (a plugin parameter that only instantiation rejects) and a test file using the
    fixtures; the scenario results are kept with --redteam-out."""
    root = tmp_path_factory.mktemp("proj")
    bad_param = MATRIX.replace('"sign_flip"]', '{ name = "sign_flip", scale = -1.0, label = "sign_flip" }]')
    files = {"pytest.ini": "[pytest]\n", "conftest.py": NO_RUNS_CONFTEST, "scenarios/m.toml": MATRIX,
             "scenarios/p.toml": bad_param, "test_mine.py": AUTHOR_TESTS}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    keep = root / "keep"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", f"--redteam-out={keep}"]
    out = subprocess.run([*args, "-rA"], capture_output=True, text=True, cwd=root, timeout=300)
    return root, keep, args, out


def test_session_outcomes(session):
    _, _, _, out = session
    text = out.stdout
    assert out.returncode == 1, text + out.stderr
    assert "3 failed, 5 passed" in text, text
    for line in ("PASSED scenarios/m.toml::mean[none]", "FAILED scenarios/m.toml::mean[sign_flip]",
                 "FAILED scenarios/p.toml::mean[none]", "FAILED scenarios/p.toml::mean[sign_flip]",
                 "PASSED test_mine.py::test_registration_was_undone", "PASSED test_mine.py::test_ledger"):
        assert line in text, line
    assert "Traceback" not in text


def test_failure_shows_metrics_against_expectations_and_reproduce_lines(session):
    _, keep, _, out = session
    lines = out.stdout.splitlines()
    at = lines.index(next(ln for ln in lines if ln.startswith("_") and " m.toml::mean[sign_flip] " in ln))
    block = lines[at + 1:at + 13]
    assert block[0].startswith("expect #2 (final_accuracy ≤ -0.5): final_accuracy = ")
    assert block[0].endswith(" > max -0.5")
    assert block[2] == ("mean[sign_flip] in scenarios/m.toml: 1 of 1 expectation(s) failed; "
                        "metrics are means over 2 seeds:")
    assert block[3].split() == ["metric", "mean", "95%", "CI", "per", "seed", "bound"]
    row = block[4].split()
    assert row[0] == "final_accuracy" and row[-3:] == ["≤", "-0.5", "FAIL"]
    mean, per_seed = float(row[1]), [float(row[4].rstrip(",")), float(row[5])]
    assert mean == pytest.approx(sum(per_seed) / 2, abs=1e-3)  # the mean over the 2 seeds shown
    assert block[5].split()[0] == "accuracy_drop"
    assert block[7:10] == [
        "reproduce:",
        "  pytest 'scenarios/m.toml::mean[sign_flip]'",
        f"  redteam matrix scenarios/m.toml --out {next(keep.glob('m-*'))} --resume   "
        "# this cell's runs are in the store already",
    ]
    assert block[10] == f"  redteam report {next(keep.glob('m-*'))}"


def test_bad_plugin_parameter_fails_cleanly_at_run_time(session):
    _, _, _, out = session
    lines = out.stdout.splitlines()
    at = lines.index(next(ln for ln in lines if ln.startswith("_") and " p.toml::mean[none] " in ln))
    assert lines[at + 1].startswith("InvalidScenario: p.toml: [matrix].attacks[1]: ")  # the entry at fault
    assert "scale" in lines[at + 1] and "must be a finite number > 0" in lines[at + 1]
    assert lines[at + 3] == "reproduce:"


def test_terminal_summary_table(session):
    _, _, _, out = session
    lines = out.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if "redteam: attacks × defenses (accuracy_drop)" in ln)
    assert lines[at + 1].startswith("scenarios/m.toml  (✓ every expectation holds")
    assert lines[at + 2].split() == ["attack", "\\", "defense", "mean"]
    assert lines[at + 3].split() == ["none", "0", "✓"]  # no attack: its own baseline, drop exactly 0
    assert lines[at + 4].split()[0] == "sign_flip" and lines[at + 4].split()[-1] == "✗"
    assert lines[at + 5].startswith("  results: redteam report ")
    assert lines[at + 6].startswith("scenarios/p.toml") and lines[at + 8].split() == ["none", "—", "!"]


def test_store_shares_baselines_and_resumes(session):
    from redteam.runner.store import ResultsStore

    root, keep, args, _ = session
    with ResultsStore(next(keep.glob("m-*")), create=False) as store:
        runs = len(store.finished_keys())
        done = [(r["cell_id"], r["replicate"]) for r in store.results() if r["finished"]]
    # mean[none] is the baseline of mean[sign_flip]: 2 baselines + 2 attacked runs, not 6
    assert runs == 4
    assert done == [("mean[none]", 0), ("mean[none]", 1), ("mean[sign_flip]", 0), ("mean[sign_flip]", 1)]
    # a later session with the same --redteam-out computes nothing (execute_unit is forbidden)
    env = {**__import__("os").environ, "REDTEAM_FORBID_RUNS": "1"}
    again = subprocess.run([*args, "scenarios/m.toml"], capture_output=True, text=True, cwd=root, env=env,
                           timeout=300)
    assert "1 failed, 1 passed" in again.stdout, again.stdout + again.stderr
    assert "recomputed" not in again.stdout


# ------------------------------------------------------------- fixtures, directly


def test_run_cell_of_no_attack_is_its_own_baseline(run_cell):
    m = run_cell("none", "mean", scenario=SMALL, seeds=2)
    assert len(m.per_seed) == 2
    assert m["accuracy_drop"] == 0.0 and all(s["accuracy_drop"] == 0.0 for s in m.per_seed)
    assert m["final_accuracy"] == pytest.approx(sum(s["final_accuracy"] for s in m.per_seed) / 2)
    assert m.label == "mean[none]"


def test_attack_vs_all_defenses_with_own_attack(attack_vs_all_defenses, redteam_registries):
    from redteam.registry import ATTACKS

    table = attack_vs_all_defenses(Honest(), defenses=["mean", "median", "no_such_defense"], scenario=SMALL)
    assert list(table) == ["mean", "median"]
    assert "no_such_defense" in table.skipped and "unknown defense" in table.skipped["no_such_defense"]
    for name, m in table.items():
        assert m["accuracy_drop"] == 0.0, name  # an honest "attack" is the baseline
    text = table.table(("accuracy_drop",))
    assert f"attack {__name__}.Honest" in text and "median" in text and "skipped" in text
    assert f"{__name__}.Honest" in ATTACKS.names()  # registered for this test only (undone at teardown)


def test_registrations_are_undone():
    from redteam._pytest_fixtures import _Registrations
    from redteam.registry import ATTACKS

    regs = _Registrations()
    assert regs.table(Honest(gain=2.0), ATTACKS, "attack") == {"name": f"{__name__}.Honest", "gain": 2.0}
    assert ATTACKS.get(f"{__name__}.Honest") is Honest
    assert regs.table("sign_flip", ATTACKS, "attack") == {"name": "sign_flip"}
    from attacks.basic import SignFlip  # a registered class keeps its registered name

    assert regs.table(SignFlip(scale=2.0), ATTACKS, "attack") == {"name": "sign_flip", "variant": "own", "scale": 2.0}
    regs.undo()
    assert f"{__name__}.Honest" not in ATTACKS.names()


def test_redteam_federation_factory(redteam_federation):
    fed = redteam_federation(SMALL, attack="sign_flip", defense=["norm_bound", "mean"],
                             overrides={"federation.clients": 9, "federation.rounds": 1})
    assert fed.scenario.federation.clients == 9 and len(fed.malicious) == 3  # round(0.34 * 9)
    assert [s.name for s in fed.scenario.defense] == ["norm_bound", "mean"]
    res = redteam_federation(SMALL, attack=Honest(gain=1.0), run=True)
    assert len(res.records) == 2 and res.attack.endswith("Honest")
    with pytest.raises(pytest.UsageError, match="key path"):
        redteam_federation(SMALL, overrides={"rounds": 2})



def test_workers_run_a_cells_seeds_side_by_side_with_the_same_results(pytester):
    """--redteam-workers 2 runs a cell's seeds (baselines first, then the attacked runs) in worker
    processes; the stored metrics are exactly those of the in-process path (1 worker). A bad
    value is a usage error naming the option and the variable."""
    import json
    import sqlite3

    _project(pytester, **{"scenarios/m.toml": MATRIX})

    def metrics(workers: str, out: str) -> dict:
        res = pytester.runpytest("-q", "-p", "no:cacheprovider", f"--redteam-workers={workers}", f"--redteam-out={out}")
        res.assert_outcomes(passed=1, failed=1)  # MATRIX's second row is made to fail
        (db,) = (pytester.path / out).glob("*/results.sqlite")
        with sqlite3.connect(db) as con:
            return {k: {n: v for n, v in json.loads(m).items() if not ("time" in n and n.endswith("_s"))}  # timings differ
                    for k, m in con.execute("select run_key, metrics from runs")}

    one, two = metrics("1", "one"), metrics("2", "two")
    assert len(one) >= 4 and one.keys() == two.keys()
    diff = {(k, n): (one[k][n], two[k].get(n)) for k in one for n in one[k] if one[k][n] != two[k].get(n)}
    assert not diff, diff  # the 2 cells' seeds and their baselines, equal to the bit
    bad = pytester.runpytest("-q", "--redteam-workers=0")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--redteam-workers / REDTEAM_PYTEST_WORKERS = '0': must be an integer ≥ 1" in bad.stderr.str()
