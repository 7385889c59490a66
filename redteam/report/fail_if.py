"""``--fail-if``: a tiny, safe condition language over a cell's metrics.

Grammar (Python's expression syntax, restricted by a whitelist)::

    condition  := comparison | condition "and" condition | condition "or" condition
                | "not" condition | "(" condition ")"
    comparison := operand (("<" | "<=" | ">" | ">=" | "==" | "!=") operand)+
    operand    := METRIC | NUMBER | "-" NUMBER | "+" NUMBER

``METRIC`` is a name of :data:`~redteam.report.aggregate.REPORT_METRICS` (e.g.
``accuracy_drop``, ``asr``, ``fpr``, ``tp``); numbers are decimal literals (``0.05``,
``1e-3``). Chained comparisons mean what they mean in Python (``0.1 < fpr <= 0.3``).

The text is parsed with :func:`ast.parse` and every node is checked against the
whitelist above, then compiled into a tree of closures: nothing is ever passed to
``eval``/``exec``/``compile``, and names, attributes, calls, subscripts, lambdas,
comprehensions, strings and booleans are all refused.

**Undefined metrics.** A metric that is undefined for a cell (``null``: e.g. ``asr`` of
an untargeted attack, ``precision`` when nothing was flagged, or a cell with no finished
seed) makes every comparison it takes part in *false*. ``not`` negates that result as
usual, so ``not asr < 0.2`` is *true* for a cell without an ASR; write
``asr >= 0.2`` rather than ``not asr < 0.2`` to gate only the cells that have one.

**No finished run, or a value that is not a number, fails closed** (``redteam report
--fail-if``): such a cell fails the gate whatever the condition says.

**A broken model fails closed.** ``redteam report --fail-if`` fails a cell whose model
broke in any finished seed (the round loop flagged ``model_nonfinite`` in a round's
``extra``, or the final loss is NaN/inf), whatever the condition says: metrics that are
undefined because training blew up must not pass a gate
(:func:`redteam.report.aggregate.model_broke`).
"""

from __future__ import annotations

import ast
import difflib
import math
import operator
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import RedteamError

__all__ = ["FailIf", "FailIfError", "parse_fail_if", "MAX_LENGTH"]

#: Longest expression accepted (characters); more is refused before parsing.
MAX_LENGTH = 2000
_MAX_DEPTH = 64

_CMP: dict[type, Callable[[float, float], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}
_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}

_Values = Mapping[str, float | None]
_Cond = Callable[[_Values], bool]
_Operand = Callable[[_Values], float | None]


class FailIfError(RedteamError):
    """A ``--fail-if`` expression is malformed or names an unknown metric."""


@dataclass(frozen=True, slots=True)
class FailIf:
    """A parsed condition; call :meth:`holds` with a cell's metric values."""

    text: str
    metrics: tuple[str, ...]  # the metric names it reads, in order of appearance
    _fn: _Cond = field(repr=False, compare=False)

    def holds(self, values: _Values) -> bool:
        """True when the condition holds (the cell fails the gate)."""
        return bool(self._fn(values))


def _where(node: ast.AST) -> str:
    col = getattr(node, "col_offset", None)
    return f" at column {col + 1}" if col is not None else ""


def _describe(node: ast.AST) -> str:
    kinds = {
        ast.Call: "a function call", ast.Attribute: "an attribute", ast.Subscript: "a subscript",
        ast.Lambda: "a lambda", ast.BinOp: "arithmetic", ast.IfExp: "a conditional expression",
        ast.NamedExpr: "an assignment", ast.Starred: "a starred expression",
        ast.List: "a list", ast.Tuple: "a tuple", ast.Dict: "a dict", ast.Set: "a set",
        ast.ListComp: "a comprehension", ast.SetComp: "a comprehension", ast.DictComp: "a comprehension",
        ast.GeneratorExp: "a comprehension", ast.JoinedStr: "a string", ast.Await: "await",
    }
    for t, text in kinds.items():
        if isinstance(node, t):
            return text
    if isinstance(node, ast.Compare):
        return "a comparison"
    return type(node).__name__


class _Compiler:
    def __init__(self, known: Mapping[str, str]) -> None:
        self.known = known
        self.names: list[str] = []

    def fail(self, msg: str) -> FailIfError:
        return FailIfError(f"--fail-if: {msg}")

    def condition(self, node: ast.AST, depth: int = 0) -> _Cond:
        if depth > _MAX_DEPTH:
            raise self.fail(f"expression nested more than {_MAX_DEPTH} levels deep")
        if isinstance(node, ast.BoolOp):
            parts = [self.condition(v, depth + 1) for v in node.values]
            if isinstance(node.op, ast.And):
                return lambda vals: all(p(vals) for p in parts)
            return lambda vals: any(p(vals) for p in parts)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.condition(node.operand, depth + 1)
            return lambda vals: not inner(vals)
        if isinstance(node, ast.Compare):
            return self.compare(node)
        if isinstance(node, ast.Name):
            self.operand(node)  # unknown names get their close-match message first
            raise self.fail(f"{node.id!r}{_where(node)} is a metric, not a condition: compare it, e.g. "
                            f"'{node.id} > 0.1'")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)):
            raise self.fail(f"{node.value!r}{_where(node)} is a number, not a condition")
        raise self.fail(f"{_describe(node)}{_where(node)} is not allowed "
                        "(allowed: metric names, numbers, < <= > >= == !=, and, or, not, parentheses)")

    def compare(self, node: ast.Compare) -> _Cond:
        ops = []
        for op in node.ops:
            fn = _CMP.get(type(op))
            if fn is None:
                raise self.fail(f"operator {type(op).__name__}{_where(node)} is not allowed "
                                f"(comparisons: {' '.join(_CMP_TEXT.values())})")
            ops.append(fn)
        operands = [self.operand(node.left)] + [self.operand(c) for c in node.comparators]

        def run(vals: _Values) -> bool:
            xs = [o(vals) for o in operands]
            if any(x is None for x in xs):
                return False  # an undefined metric makes the comparison false (documented)
            return all(op(a, b) for op, a, b in zip(ops, xs, xs[1:]))

        return run

    def operand(self, node: ast.AST) -> _Operand:
        if isinstance(node, ast.Name):
            name = node.id
            if name not in self.known:
                close = difflib.get_close_matches(name.lower(), list(self.known), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise self.fail(f"unknown metric {name!r}{_where(node)}{hint}")
            if name not in self.names:
                self.names.append(name)

            def metric(vals: _Values) -> float | None:
                v = vals.get(name)
                if v is None or isinstance(v, bool):
                    return None
                f = float(v)
                return f if math.isfinite(f) else None

            return metric
        sign = 1.0
        inner = node
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
            inner = node.operand
        if isinstance(inner, ast.Constant) and type(inner.value) in (int, float):
            value = sign * float(inner.value)
            if not math.isfinite(value):
                raise self.fail(f"number {inner.value!r}{_where(inner)} is not finite")
            return lambda vals: value
        if isinstance(inner, ast.Constant):
            raise self.fail(f"{inner.value!r}{_where(inner)} is not allowed: operands are metric names and numbers")
        raise self.fail(f"{_describe(node)}{_where(node)} is not allowed as an operand "
                        "(operands are metric names and numbers)")


def parse_fail_if(text: str, known: Mapping[str, str] | None = None) -> FailIf:
    """Parse and compile ``text``; ``known`` = the metric names allowed (default: every
    report metric). Raises :class:`FailIfError` with a one-line message."""
    if known is None:
        from .aggregate import REPORT_METRICS

        known = REPORT_METRICS
    if not isinstance(text, str) or not text.strip():
        raise FailIfError("--fail-if: empty expression (e.g. --fail-if 'asr > 0.2 or accuracy_drop > 0.05')")
    if len(text) > MAX_LENGTH:
        raise FailIfError(f"--fail-if: expression is {len(text)} characters long; at most {MAX_LENGTH}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        col = f" at column {exc.offset}" if exc.offset else ""
        raise FailIfError(f"--fail-if {text!r}: syntax error{col} ({exc.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise FailIfError("--fail-if: expression could not be parsed (too deeply nested or malformed)") from None
    comp = _Compiler(known)
    fn = comp.condition(tree.body)
    return FailIf(text.strip(), tuple(comp.names), fn)
