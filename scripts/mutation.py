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
import ast
import hashlib
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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: scope → (module, test files, extra pytest arguments)
SCOPES: dict[str, tuple[str, list[str], list[str]]] = {
    "swarm": ("redteam/federation/swarm.py", ["tests/test_swarm.py", "tests/test_swarm_edges.py"], []),
    "pipeline_checks": ("defenses/pipeline_checks.py", ["tests/test_swarm.py", "tests/test_swarm_edges.py"], []),
    "pipeline_attacks": ("attacks/pipeline.py", ["tests/test_swarm.py", "tests/test_swarm_edges.py"], []),
    "gauntlet": ("defenses/gauntlet.py", ["tests/test_verification_gauntlet.py", "tests/test_gauntlet_edges.py"], []),
    "commitments": ("redteam/federation/commitments.py", ["tests/test_verification_gauntlet.py",
                                                          "tests/test_gauntlet_edges.py"], []),
}

_CMP = {ast.Lt: [ast.LtE], ast.LtE: [ast.Lt], ast.Gt: [ast.GtE], ast.GtE: [ast.Gt], ast.Eq: [ast.NotEq],
        ast.NotEq: [ast.Eq], ast.Is: [ast.IsNot], ast.IsNot: [ast.Is], ast.In: [ast.NotIn], ast.NotIn: [ast.In]}
_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
        ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
#: called names swapped (a bare name or an attribute: ``max(...)``, ``x.max()``, ``np.argmax(...)``)
_CALLS = {"max": "min", "min": "max", "amax": "amin", "amin": "amax", "argmax": "argmin", "argmin": "argmax",
          "maximum": "minimum", "minimum": "maximum", "any": "all", "all": "any", "median": "mean"}
#: attribute calls only (a tensor's or an array's statistic): ``x.mean()`` → ``x.max()``
_ATTR_CALLS = {"mean": "max"}
#: keyword arguments whose values are not mutated (placement and copying: equivalent by construction)
_SKIP_KEYWORDS = {"device", "dtype", "copy", "non_blocking", "stacklevel"}


@dataclass(frozen=True, slots=True)
class Mutant:
    id: str
    module: str
    qualname: str
    line: int
    end_line: int
    op: str
    original: str
    mutated: str
    status: str = "pending"
    seconds: float = 0.0
    detail: str = ""


class _Collector(ast.NodeVisitor):
    """Walks a module and records (node, replacement node or source, operator) per mutant."""

    def __init__(self) -> None:
        self.out: list[tuple[ast.AST, ast.AST | str, str, str]] = []  # node, replacement, op, qualname
        self.scope: list[str] = []
        self.bound: list[set[str]] = []  # per enclosing function: the names bound so far

    def add(self, node: ast.AST, new: ast.AST | str, op: str) -> None:
        self.out.append((node, new, op, ".".join(self.scope) or "<module>"))

    # skipped subtrees --------------------------------------------------------------
    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return None

    def visit_Raise(self, node: ast.Raise) -> None:
        return None

    def _body(self, body: list[ast.stmt]) -> None:
        for i, st in enumerate(body):
            if i == 0 and isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) \
                    and isinstance(st.value.value, str):
                continue  # docstring
            self.visit(st)

    def visit_Module(self, node: ast.Module) -> None:
        for st in node.body:
            if isinstance(st, ast.If) and isinstance(st.test, ast.Name) and st.test.id == "TYPE_CHECKING":
                continue
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in st.targets):
                continue
            self.visit(st)

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        fn = not isinstance(node, ast.ClassDef)
        if fn:
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                self.visit(d)
            a = node.args
            self.bound.append({x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x})
        self._body(node.body)
        if fn:
            self.bound.pop()
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:  # a field's default; never the annotation
            self.visit(node.value)
            self._delete(node, [node.target])

    def visit_keyword(self, node: ast.keyword) -> None:
        if node.arg not in _SKIP_KEYWORDS:
            self.visit(node.value)

    # statements ----------------------------------------------------------------------
    def _delete(self, node: ast.stmt, targets: list[ast.expr] = ()) -> None:
        """Delete a statement inside a function: a call, an update, or an assignment that
        changes state or re-binds a name (not the first binding: that mutant only raises NameError)."""
        if not self.bound:
            return
        flat: list[ast.expr] = []
        todo = list(targets)
        while todo:
            t = todo.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                todo.extend(t.elts)
            else:
                flat.append(t.value if isinstance(t, ast.Starred) else t)
        targets = flat
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        new = names - self.bound[-1] if all(isinstance(t, ast.Name) for t in targets) else set()
        self.bound[-1] |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        if not new:
            self.add(node, "pass", "delete statement")

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        self._delete(node, node.targets)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if type(node.op) in _BIN:
            self.add(node, replace_node(node, op=_BIN[type(node.op)]()), "augmented operator")
        self.visit(node.value)
        self._delete(node, [node.target])

    def visit_Expr(self, node: ast.Expr) -> None:
        self.generic_visit(node)
        if isinstance(node.value, ast.Call):
            self._delete(node)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            self.add(node.value, ast.Constant(None), "return None")
        self.generic_visit(node)

    def _negate(self, test: ast.expr) -> None:
        self.add(test, ast.UnaryOp(ast.Not(), test), "negate condition")

    def visit_If(self, node: ast.If) -> None:
        self._negate(node.test)
        self.visit(node.test)
        self._body(node.body)
        self._body(node.orelse)

    def visit_While(self, node: ast.While) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        for cond in node.ifs:
            self._negate(cond)
        self.generic_visit(node)

    # expressions ---------------------------------------------------------------------
    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            for new in _CMP.get(type(op), []):
                ops = list(node.ops)
                ops[i] = new()
                self.add(node, replace_node(node, ops=ops), "comparison")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self.add(node, replace_node(node, op=other), "and/or")
        for i in range(len(node.values)):
            rest = node.values[:i] + node.values[i + 1:]
            self.add(node, rest[0] if len(rest) == 1 else replace_node(node, values=rest), "drop clause")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if type(node.op) in _BIN:
            self.add(node, replace_node(node, op=_BIN[type(node.op)]()), "arithmetic")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, (ast.USub, ast.Not, ast.Invert)):
            self.add(node, node.operand, "drop unary")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        swap = _CALLS.get(name or "") or (_ATTR_CALLS.get(name or "") if isinstance(f, ast.Attribute) else None)
        if swap:
            newf = ast.Name(swap, ast.Load()) if isinstance(f, ast.Name) else ast.Attribute(f.value, swap, ast.Load())
            self.add(node, replace_node(node, func=newf), "call swap")
        if name == "abs":  # drop an absolute value: abs(x), torch.abs(x), x.abs()
            if isinstance(f, ast.Attribute) and not node.args:
                self.add(node, f.value, "drop abs")
            elif len(node.args) == 1:
                self.add(node, node.args[0], "drop abs")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        v = node.value
        if isinstance(v, bool):
            self.add(node, ast.Constant(not v), "constant")
        elif isinstance(v, int):
            self.add(node, ast.Constant(v + 1), "constant")
            self.add(node, ast.Constant(v - 1), "constant")
        elif isinstance(v, float) and v == v and abs(v) != float("inf"):
            for new in ([1.0] if v == 0 else [v * 2, v / 2]):
                self.add(node, ast.Constant(new), "constant")


def replace_node(node: ast.AST, **fields: object) -> ast.AST:
    """A shallow copy of ``node`` with ``fields`` replaced."""
    new = type(node)(**{f: getattr(node, f) for f in node._fields})
    for k, v in fields.items():
        setattr(new, k, v)
    return new


def _span(lines: list[bytes], node: ast.AST) -> tuple[int, int]:
    """The byte offsets of ``node`` in the source (``col_offset`` counts UTF-8 bytes)."""
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))
    return starts[node.lineno - 1] + node.col_offset, starts[node.end_lineno - 1] + node.end_col_offset


def generate(source: str, module: str = "<string>") -> list[tuple[Mutant, str]]:
    """Every mutant of ``source`` that compiles and differs from it: (mutant, mutated source)."""
    tree = ast.parse(source)
    raw = source.encode()
    lines = raw.splitlines(keepends=True)
    col = _Collector()
    col.visit(tree)
    base = ast.dump(tree)
    seen: dict[tuple, int] = {}
    out: list[tuple[Mutant, str]] = []
    for node, new, op, qual in col.out:
        a, b = _span(lines, node)
        text = new if isinstance(new, str) else ast.unparse(new)
        if isinstance(node, ast.expr):
            text = f"({text})"
        mutated = raw[:a] + text.encode() + raw[b:]
        try:
            src = mutated.decode()
            tree2 = ast.parse(src)
            compile(tree2, module, "exec")
        except (SyntaxError, ValueError):
            continue
        if ast.dump(tree2) == base:
            continue
        orig = raw[a:b].decode()
        key = (module, qual, op, orig, text)
        k = seen[key] = seen.get(key, -1) + 1
        mid = hashlib.sha256(repr((*key, k)).encode()).hexdigest()[:8]
        out.append((Mutant(mid, module, qual, node.lineno, node.end_lineno, op, orig, text), src))
    return out


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
    ap.add_argument("--no-cover", action="store_true",
                    help="run every test for every mutant (default: only the tests that run its lines)")
    ap.add_argument("--show", action="store_true", help="print the mutants (after --only/--ids/--limit) and exit")
    args = ap.parse_args(argv)
    if args.list:
        for k, (m, t, e) in SCOPES.items():
            print(f"{k:17s} {m}  tests: {' '.join(t + e)}")
        return 0
    module, tests, extra = (SCOPES[args.scope] if args.scope else (args.module, args.tests, []))
    tests, extra = list(args.tests or tests), extra + args.pytest_args.split()
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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still removes the scratch copies
    scratch = Path(tempfile.mkdtemp(prefix="mutation-"))
    try:
        copies = queue.Queue()
        for j in range(min(args.jobs, max(1, len(todo)))):
            work = scratch / f"w{j}"
            copy_tree(work)
            copies.put(work)
        first = copies.get()
        where = subprocess.run([sys.executable, "-c", f"import {module[:-3].replace('/', '.')} as m; print(m.__file__)"],
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
        print(f"# {module}: {generated} mutants, {len(todo)} to run (clean run {secs:.0f} s, timeout {timeout:.0f} s)",
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

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            done += list(pool.map(one, todo))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {"module": module, "tests": tests, "seed": args.seed, "limit": args.limit, **summarize(done, generated),
               "stale_equivalents": stale}
    print(json.dumps(summary))
    for m in sorted(done, key=lambda m: m.line):
        if m.status in ("survived", "uncovered", "incompetent"):
            print(f"{m.status}: {m.id} {m.qualname}:{m.line} [{m.op}] {m.original!r} -> {m.mutated!r}")
    if args.json:
        args.json.write_text(json.dumps({**summary, "mutants": [asdict(m) for m in done]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
