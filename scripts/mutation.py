"""Our own mutation tester: small ``ast`` mutants of one module, judged by its targeted tests.

Each mutant is one small change a bug could make — a comparison's boundary (``<`` ↔ ``<=``),
``and`` ↔ ``or``, a dropped clause of an ``and``/``or``, ``+`` ↔ ``-``, ``*`` ↔ ``/``, ``&`` ↔
``|``, a constant off by one (floats halved and doubled), ``True`` ↔ ``False``, a negated
condition, a dropped ``-``/``not``/``abs``, ``max`` ↔ ``min`` (``argmax``, ``amax``,
``maximum``), a tensor's ``.mean()`` ↔ ``.max()`` and ``.median()`` → ``.mean()``, a return
value replaced by ``None``, an assignment or call statement deleted — spliced into the
source at the node's place (the rest of the file is kept byte for byte). Docstrings, strings,
f-strings, annotations, decorators and ``raise`` statements (messages) are not mutated.

The tests run in a scratch copy of the working tree (tracked and untracked-not-ignored files),
never in the tree itself: for each mutant the module's copy is overwritten, its bytecode
removed, the tests run (``python -m pytest -x -q -p no:cacheprovider TESTS``), and the original
restored in a ``finally``. Verdicts: **killed** (a test failed), **survived** (all passed),
**timeout** (past ``--timeout``: counted as killed), **incompetent** (the tests could not even
be collected, e.g. the mutant breaks the import; left out of the rate). Mutants listed in
``--equivalents`` (TOML, ``[[equivalent]]`` with ``module``, ``id``, ``reason``) are not run and
are left out of the rate; an id there that the module no longer yields is reported as stale.

Mutant ids are stable across edits elsewhere in the file: a hash of the module, the enclosing
function, the operator, the original and mutated text, and the occurrence among identical ones::

    python scripts/mutation.py --list                                # the scopes
    python scripts/mutation.py --scope gauntlet --show               # the mutants, not run
    python scripts/mutation.py --scope gauntlet --limit 80 --seed 1 --json out.json
    python scripts/mutation.py --module defenses/spot_check.py --tests tests/test_spot_check.py
    python scripts/mutation.py --scope swarm --ids 1a2b3c4d,5e6f7a8b   # re-run some

Not part of CI (minutes per module). The historical mutmut-driven scopes are in
``scripts/mutation_mutmut.py``; the figures are in ``benchmarks/MUTATION.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mutation_ops import Mutant, generate  # noqa: E402 - the operators, in their own module

#: scope → (module, test files, extra pytest arguments, quick test files: run in-process first)
_PIPE = ["tests/test_swarm.py", "tests/test_swarm_edges.py"]
_PIPE_ATT = [*_PIPE, "tests/test_pipeline_attack_edges.py"]  # + the stage backdoor's edges
_GAUNT = ["tests/test_verification_gauntlet.py", "tests/test_gauntlet_edges.py"]
_LOOP = [*_PIPE, "tests/test_swarm_run_edges.py"]  # the regime's loop on a tiny pipeline (seconds, in-process)
SCOPES: dict[str, tuple[str, list[str], list[str], list[str]]] = {
    "swarm": ("redteam/federation/swarm.py", _LOOP, [], _LOOP[::-1]),
    "pipeline_checks": ("defenses/pipeline_checks.py", _PIPE, [], _PIPE[::-1]),
    "pipeline_attacks": ("attacks/pipeline.py", _PIPE_ATT, [], _PIPE_ATT[::-1]),
    "gauntlet": ("defenses/gauntlet.py", _GAUNT, [], _GAUNT[::-1]),
    "commitments": ("redteam/federation/commitments.py", _GAUNT, [], _GAUNT[::-1]),
}

def load_equivalents(path: Path | None) -> dict[tuple[str, str], str]:
    """(module, id) → reason from a TOML file of ``[[equivalent]]`` tables."""
    if path is None or not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = {}
    for i, e in enumerate(data.get("equivalent", [])):
        if not all(isinstance(e.get(k), str) and e.get(k) for k in ("module", "id", "reason")):
            raise SystemExit(f"{path}: [[equivalent]] #{i + 1} needs non-empty strings module, id and reason")
        out[(e["module"], e["id"])] = e["reason"]
    return out


def copy_tree(dest: Path) -> None:
    """The working tree's tracked and untracked-not-ignored files, copied under ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)


def _run_tests(work: Path, tests: list[str], extra: list[str], timeout: float,
               cover: tuple[Path, Path] | None = None) -> tuple[str, float, str]:
    cmd = ["nice", "-n", "10", sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           *tests, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    if cover is not None:  # the clean run: which lines of the module each test runs (_mutation_cover.py)
        cmd[cmd.index("-x"):cmd.index("-x")] = ["-p", "_mutation_cover"]
        env.update(PYTHONPATH=os.pathsep.join([str(work / "scripts"), env.get("PYTHONPATH", "")]),
                   MUTATION_COVER_FILE=os.path.realpath(cover[0]), MUTATION_COVER_OUT=str(cover[1]))
    t0 = time.time()
    try:
        res = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.time() - t0, ""
    tail = (res.stdout + res.stderr).strip().splitlines()[-1:] or [""]
    status = {0: "survived", 1: "killed"}.get(res.returncode, "incompetent")
    return status, time.time() - t0, tail[0][:200]


def select_tests(m: Mutant, cover: dict | None, tests: list[str]) -> list[str]:
    """The tests that run a line of ``m``'s span, in run order (all of ``tests`` without a
    coverage map, or for a line that runs only at import: a field default, a class body)."""
    if cover is None:
        return tests
    span = set(range(m.line, m.end_line + 1))
    hit = [t for t in cover["tests"] if span & set(cover["lines"].get(t, ()))]
    if not hit and span & set(cover["import"]):
        return tests
    return hit


def run_mutant(work: Path, m: Mutant, src: str, tests: list[str], extra: list[str], timeout: float) -> Mutant:
    """Apply ``m`` to the copy under ``work``, run the tests, restore the original (always).
    No tests: the mutant is ``uncovered`` (no test runs its line; counted as survived)."""
    if not tests:
        return replace(m, status="uncovered")
    path = work / m.module
    original = path.read_bytes()
    pyc = Path(importlib.util.cache_from_source(str(path)))
    try:
        path.write_text(src, encoding="utf-8")
        pyc.unlink(missing_ok=True)
        status, secs, tail = _run_tests(work, tests, extra, timeout)
    finally:
        path.write_bytes(original)
        pyc.unlink(missing_ok=True)
    return replace(m, status=status, seconds=round(secs, 1), detail=tail)


def summarize(ms: list[Mutant], generated: int) -> dict:
    count = {s: sum(1 for m in ms if m.status == s) for s in ("killed", "timeout", "survived", "uncovered",
                                                              "incompetent", "equivalent")}
    judged = count["killed"] + count["timeout"] + count["survived"] + count["uncovered"]
    rate = (count["killed"] + count["timeout"]) / judged if judged else float("nan")
    return {"generated": generated, "run": judged + count["incompetent"], **count, "kill_rate": rate}


def _quick_stage(module: str, todo: list[tuple[Mutant, str]], quick: list[str]) -> list[Mutant]:
    """Run the quick tests in-process on every mutant; return the killed and incompetent ones."""
    sys.path.insert(0, str(ROOT))
    from _mutation_quick import run_quick

    if run_quick(ROOT, module, (ROOT / module).read_text(encoding="utf-8"), quick) != "survived":
        raise SystemExit(f"the quick tests {' '.join(quick)} do not pass in-process on the unmutated {module}")
    out = []
    for m, src in todo:
        t0 = time.time()
        status = run_quick(ROOT, module, src, quick)
        if status != "survived":
            out.append(replace(m, status=status, seconds=round(time.time() - t0, 1), detail="quick"))
        print(f"quick {status:11s} {time.time() - t0:6.1f}s {m.id} {m.qualname}:{m.line} [{m.op}]",
              file=sys.stderr, flush=True)
    return out


def _full_stage(module: str, todo: list[tuple[Mutant, str]], tests: list[str], extra: list[str],
                args: argparse.Namespace) -> list[Mutant]:
    """Run each mutant's tests in scratch copies of the tree (``--jobs`` of them)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still removes the scratch copies
    scratch = Path(tempfile.mkdtemp(prefix="mutation-"))
    try:
        copies = queue.Queue()
        for j in range(min(args.jobs, max(1, len(todo)))):
            work = scratch / f"w{j}"
            copy_tree(work)
            copies.put(work)
        first = copies.get()
        probe = f"import {module[:-3].replace('/', '.')} as m; print(m.__file__)"
        where = subprocess.run([sys.executable, "-c", probe],
                               cwd=first, capture_output=True, text=True)
        if not where.stdout.strip().startswith(str(first)):
            raise SystemExit(f"{module} is not imported from the scratch copy ({where.stdout.strip() or where.stderr})")
        cover_out = scratch / "cover.json"
        status, secs, tail = _run_tests(first, tests, extra, 3600, None if args.no_cover else
                                        (first / module, cover_out))
        copies.put(first)
        if status != "survived":
            raise SystemExit(f"the tests fail on the unmutated tree ({tail}); fix them first")
        cover = None if args.no_cover else json.loads(cover_out.read_text())
        timeout = args.timeout or 3 * secs + 30
        print(f"# {module}: {len(todo)} mutants to run in scratch copies (clean run {secs:.0f} s, "
              f"timeout {timeout:.0f} s)",
              file=sys.stderr, flush=True)
        lock = threading.Lock()

        def one(pair: tuple[Mutant, str]) -> Mutant:
            work = copies.get()
            try:
                r = run_mutant(work, *pair, select_tests(pair[0], cover, tests), extra, timeout)
            finally:
                copies.put(work)
            with lock:
                print(f"{r.status:11s} {r.seconds:6.1f}s {r.id} {r.qualname}:{r.line} [{r.op}] "
                      f"{r.original[:60]!r} -> {r.mutated[:60]!r}", file=sys.stderr, flush=True)
            return r

        pool = ThreadPoolExecutor(max_workers=args.jobs)
        try:
            return list(pool.map(one, todo))
        finally:  # on a kill, the mutants not started are dropped
            pool.shutdown(wait=False, cancel_futures=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scope", choices=sorted(SCOPES), help="a registered module and its tests (--list)")
    ap.add_argument("--module", help="the module to mutate, relative to the repository root")
    ap.add_argument("--tests", nargs="+", default=[], help="the test files (or node ids) that target it")
    ap.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    ap.add_argument("--only", default="", help="mutate only these functions (comma-separated qualname prefixes)")
    ap.add_argument("--ids", default="", help="run only these mutant ids (comma-separated)")
    ap.add_argument("--limit", type=int, help="run a random sample of this many mutants (--seed)")
    ap.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    ap.add_argument("--jobs", type=int, default=1, help="parallel scratch copies (default 1)")
    ap.add_argument("--timeout", type=float, help="seconds per mutant (default: 3 × the clean run + 30)")
    ap.add_argument("--equivalents", type=Path, default=ROOT / "benchmarks" / "mutation_equivalents.toml",
                    help="TOML of [[equivalent]] module/id/reason: not run, left out of the rate")
    ap.add_argument("--json", type=Path, help="write every mutant and its verdict here")
    ap.add_argument("--list", action="store_true", help="list the scopes and exit")
    ap.add_argument("--quick", nargs="+", default=[],
                    help="fast test files run in-process against every mutant first (scripts/_mutation_quick.py); "
                         "the mutants they kill are not run again")
    ap.add_argument("--no-quick", action="store_true", help="skip the scope's quick stage")
    ap.add_argument("--quick-only", action="store_true",
                    help="stop after the quick stage (its survivors reported as survived: a first look only)")
    ap.add_argument("--no-cover", action="store_true",
                    help="run every test for every mutant (default: only the tests that run its lines)")
    ap.add_argument("--show", action="store_true", help="print the mutants (after --only/--ids/--limit) and exit")
    args = ap.parse_args(argv)
    if args.list:
        for k, (m, t, e, q) in SCOPES.items():
            print(f"{k:17s} {m}  tests: {' '.join(t + e)}  quick: {' '.join(q)}")
        return 0
    module, tests, extra, quick = (SCOPES[args.scope] if args.scope else (args.module, args.tests, [], []))
    tests, extra, quick = list(args.tests or tests), extra + args.pytest_args.split(), list(args.quick or quick)
    quick = [] if args.no_quick else [q for q in quick if (ROOT / q).exists()]
    if not module:
        ap.error("give --scope or --module")
    if not (ROOT / module).is_file() or not module.endswith(".py"):
        ap.error(f"--module {module!r}: no such Python file under {ROOT.name}/")
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: must be ≥ 1")
    tests = [t for t in tests if (ROOT / t.split("::")[0]).exists()]
    if not tests and not args.show:
        ap.error("no test file of the scope exists; give --tests")
    pairs = generate((ROOT / module).read_text(encoding="utf-8"), module)
    generated = len(pairs)
    equiv = load_equivalents(args.equivalents)
    ids_here = {m.id for m, _ in pairs}
    stale = sorted(i for (mod, i) in equiv if mod == module and i not in ids_here)
    if args.only:
        prefixes = tuple(p.strip() for p in args.only.split(",") if p.strip())
        pairs = [(m, s) for m, s in pairs if m.qualname.startswith(prefixes)]
    if args.ids:
        want = {i.strip() for i in args.ids.split(",") if i.strip()}
        pairs = [(m, s) for m, s in pairs if m.id in want]
    if args.limit is not None and args.limit < len(pairs):
        pairs = sorted(random.Random(args.seed).sample(pairs, args.limit), key=lambda p: p[0].line)
    done = [replace(m, status="equivalent", detail=equiv[(module, m.id)]) for m, _ in pairs if (module, m.id) in equiv]
    todo = [(m, s) for m, s in pairs if (module, m.id) not in equiv]
    if args.show:
        for m, _ in todo:
            print(f"{m.id} {m.qualname}:{m.line} [{m.op}] {m.original!r} -> {m.mutated!r}")
        print(f"# {len(todo)} of {generated} mutants of {module}", file=sys.stderr)
        return 0
    if quick:
        done += _quick_stage(module, todo, quick)
        todo = [(m, s) for m, s in todo if m.id not in {d.id for d in done}]
        if args.quick_only:
            done += [replace(m, status="survived", detail="quick only") for m, _ in todo]
            todo = []
    if todo:
        done += _full_stage(module, todo, tests, extra, args)
    summary = {"module": module, "tests": tests, "quick": quick, "quick_only": bool(args.quick_only),
               "seed": args.seed, "limit": args.limit, **summarize(done, generated), "stale_equivalents": stale}
    print(json.dumps(summary))
    for m in sorted(done, key=lambda m: m.line):
        if m.status in ("survived", "uncovered", "incompetent"):
            print(f"{m.status}: {m.id} {m.qualname}:{m.line} [{m.op}] {m.original!r} -> {m.mutated!r}")
    if args.json:
        args.json.write_text(json.dumps({**summary, "mutants": [asdict(m) for m in done]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
