"""The mutants of ``scripts/mutation.py``: which small changes, where, and their stable ids.

A mutant is one operator applied at one node of the module's ``ast`` (the module docstring of
``scripts/mutation.py`` lists them), spliced into the source at the node's byte span, so the
rest of the file is kept byte for byte. A mutant that does not compile, or whose tree equals
the original's, is dropped.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass

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
