"""Mutation testing of the verdict modules with mutmut (not part of CI: minutes to hours).

Each *scope* is a set of modules to mutate and the fast tests that target them. For every
scope this script copies the working tree (tracked files, with their uncommitted edits)
into a scratch directory, appends a ``[tool.mutmut]`` section to the copy's
``pyproject.toml``, runs ``mutmut run`` there (the shared tree never sees a mutant or a
``mutants/`` folder) and reads the verdicts back::

    pip install mutmut==3.8.1
    python scripts/mutation_mutmut.py                        # every scope, report on stdout
    python scripts/mutation_mutmut.py scoring matrix -j 2    # some scopes, two workers
    python scripts/mutation_mutmut.py --list                 # the scopes and their tests
    python scripts/mutation_mutmut.py norm --report benchmarks/MUTATION.md --keep /tmp/mut

Per scope it prints killed / survived / total (timeouts and segfaults count as killed,
"no tests" as survived) and the diff of every surviving mutant (``mutmut show``), which
is the raw material for ``benchmarks/MUTATION.md``: each survivor is either killed by a
new test or explained there as equivalent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: scope → (modules or packages to mutate, test files that target them, extra pytest args)
SCOPES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "scoring": (["redteam/scoring.py"], ["tests/test_scoring.py"], []),
    "matrix": (["redteam/matrix.py"], ["tests/test_expect.py", "tests/test_matrix.py"],
               ["-k", "not kill and not concurrent and not parallel and not store"]),
    "norm": (["defenses/norm.py"], ["tests/test_defenses_norm.py"], []),
    "basic": (["attacks/basic.py"], ["tests/test_sign_flip.py"], []),
    "merge": (["redteam/merge.py"], ["tests/test_merge.py", "tests/test_merge_rejection.py",
                                     "tests/test_defense_memory.py"], []),
    "envelope": (["attacks/envelope.py"], ["tests/test_attacks_envelope.py", "tests/test_envelope_params.py",
                                           "tests/test_defenses_norm.py"], []),
    "defenses": (["defenses/*"], ["tests/test_defenses_*.py", "tests/test_defense_memory.py",
                                  "tests/test_provenance_trainer.py", "tests/test_attacks_transport.py"], []),
    "attacks": (["attacks/*"], ["tests/test_attacks_*.py", "tests/test_sign_flip.py", "tests/test_envelope_params.py",
                                "tests/test_llm_attacks.py", "tests/test_training_hook.py",
                                "tests/test_provenance_trainer.py"], []),
    "federation": (["redteam/federation/*"], ["tests/test_federation.py", "tests/test_loop_paths.py",
                                               "tests/test_server_opt.py", "tests/test_partition.py"],
                   ["-m", "not slow"]),
    # one module each: the modules issue 19 changed (benchmarks/MUTATION.md, "Issue 19")
    "training": (["attacks/training.py"], ["tests/test_attacks_training.py", "tests/test_training_hook.py",
                                           "tests/test_mutation_pins.py"], []),
    "compose": (["attacks/compose.py"], ["tests/test_attacks_compose.py", "tests/test_attacks_strength2.py"], []),
    "tailored": (["attacks/tailored.py"], ["tests/test_attacks_tailored.py", "tests/test_tailored_selection.py"], []),
    "rlr": (["defenses/rlr.py"], ["tests/test_defenses_rlr.py", "tests/test_defense_defaults2.py",
                                  "tests/test_mutation_pins.py"], []),
    "dnc": (["defenses/dnc.py"], ["tests/test_defenses_dnc.py", "tests/test_defense_defaults2.py",
                                  "tests/test_mutation_pins.py"], []),
    "signguard": (["defenses/signguard.py"], ["tests/test_defenses_signguard.py", "tests/test_defense_defaults2.py",
                                              "tests/test_mutation_pins.py"], []),
    "fldetector": (["defenses/fldetector.py"], ["tests/test_defenses_fldetector.py", "tests/test_defense_defaults2.py",
                                                "tests/test_mutation_pins.py"], []),
}
#: mutmut exit-code verdicts that mean "a test failed" (killed)
KILLED = {"killed", "timeout", "segfault"}
#: verdicts of mutants that were never run (a scope stopped at its --time-limit)
UNCHECKED = {"not checked", "check was interrupted by user"}


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if not rel or not (ROOT / rel).is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _expand(patterns: list[str]) -> list[str]:
    out: list[str] = []
    for p in patterns:
        hits = sorted(str(x.relative_to(ROOT)) for x in ROOT.glob(p)) if "*" in p else [p]
        out.extend(h for h in hits if (ROOT / h).exists())
    return out


# one process prints every survivor's diff (``mutmut show`` per mutant costs seconds each)
_SHOW = """
import json, sys
from mutmut.__main__ import find_mutant
from mutmut.mutation.diff_apply import get_diff_for_mutant
out = {}
for name in json.load(sys.stdin):
    try:
        out[name] = get_diff_for_mutant(name, path=find_mutant(name).path)
    except Exception as exc:  # noqa: BLE001 - report, do not stop
        out[name] = f"(no diff: {exc})"
print(json.dumps(out))
"""


def _diffs(work: Path, env: dict, names: list[str], verdicts: dict[str, str]) -> dict[str, str]:
    res = subprocess.run([sys.executable, "-c", _SHOW], cwd=work, env=env, input=json.dumps(names),
                         capture_output=True, text=True, check=False)
    try:
        raw = json.loads(res.stdout)
    except json.JSONDecodeError:  # another mutmut version: one `mutmut show` per mutant
        return {k: subprocess.run(["mutmut", "show", k], cwd=work, env=env, capture_output=True, text=True,
                                  check=False).stdout for k in names}
    return {k: f"# {k}: {verdicts[k]}\n{raw.get(k, '')}" for k in names}


def run_scope(name: str, jobs: int, keep: Path | None, time_limit: float | None = None) -> dict:
    mutate, tests, extra = SCOPES[name]
    work = Path(tempfile.mkdtemp(prefix=f"mut-{name}-", dir=keep))
    _copy_tree(work)
    only = [m if m.endswith((".py", "*")) else m + "/*" for m in mutate]
    cfg = (
        "\n\n[tool.mutmut]\n"
        'source_paths = ["redteam", "attacks", "defenses", "provenance"]\n'
        f"only_mutate = {_toml_list(only)}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(_expand(tests))}\n"
        f"pytest_add_cli_args = {_toml_list(['-p', 'no:cacheprovider', '-x', '-q', *extra])}\n"
    )
    with open(work / "pyproject.toml", "a", encoding="utf-8") as fh:
        fh.write(cfg)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.time()
    log = work / "mutmut-run.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(["mutmut", "run", "--max-children", str(jobs)], cwd=work, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=time_limit)
        except subprocess.TimeoutExpired:  # stop here; the verdicts so far are kept
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
    res = subprocess.run(["mutmut", "results", "--all", "true"], cwd=work, env=env,
                         capture_output=True, text=True, check=False).stdout
    verdicts: dict[str, str] = {}
    for line in res.splitlines():
        key, _, status = line.strip().rpartition(": ")
        if key:
            verdicts[key] = status
    unchecked = sum(1 for v in verdicts.values() if v in UNCHECKED)
    verdicts = {k: v for k, v in verdicts.items() if v not in UNCHECKED}
    survivors = sorted(k for k, v in verdicts.items() if v not in KILLED)
    diffs = _diffs(work, env, survivors, verdicts)
    killed = sum(1 for v in verdicts.values() if v in KILLED)
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return {"scope": name, "modules": mutate, "tests": tests, "total": len(verdicts), "killed": killed,
            "survived": len(survivors), "unchecked": unchecked, "seconds": round(time.time() - t0), "survivors": diffs,
            "dir": str(work) if keep is not None else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scopes", nargs="*", help=f"scopes to run (default: all): {', '.join(SCOPES)}")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="mutmut workers (default 2)")
    ap.add_argument("--keep", type=Path, help="keep the scratch copies under this folder")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--list", action="store_true", help="list the scopes and exit")
    ap.add_argument("--time-limit", type=float, metavar="S",
                    help="stop each scope after S seconds and report the mutants checked so far")
    args = ap.parse_args(argv)
    if args.list:
        for k, (m, t, e) in SCOPES.items():
            print(f"{k:10s} mutate {' '.join(m)}  tests {' '.join(t)} {' '.join(e)}")
        return 0
    unknown = [s for s in args.scopes if s not in SCOPES]
    if unknown:
        ap.error(f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(SCOPES)}")
    if shutil.which("mutmut") is None:
        ap.error("mutmut is not installed: pip install mutmut==3.8.1")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    results = []
    for scope in args.scopes or list(SCOPES):
        r = run_scope(scope, args.jobs, args.keep, args.time_limit)
        results.append(r)
        pct = 100.0 * r["killed"] / r["total"] if r["total"] else float("nan")
        print(f"## {scope}: {r['killed']}/{r['total']} killed ({pct:.1f} %), {r['survived']} survived, "
              f"{r['seconds']} s" + (f", {r['unchecked']} not checked (time limit)" if r["unchecked"] else ""),
              flush=True)
        for diff in r["survivors"].values():
            print(diff.rstrip(), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
