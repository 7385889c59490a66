"""Import circles among the project's own modules: the strongly connected components (of more
than one module) of the graph of every import, lazy and ``TYPE_CHECKING`` ones included. A
package's ``__init__`` is left out (it re-exports its modules by design).

    python scripts/import_circles.py          # prints the count, then each circle
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("redteam", "attacks", "defenses", "provenance")


def modules(root: Path = ROOT) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for p in (root / pkg).rglob("*.py"):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def _targets(mods: dict[str, Path], name: str, node: ast.AST, is_pkg: bool) -> list[str]:
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = name.split(".")
            if not is_pkg:
                pkg = pkg[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    found = []
    for n in names:
        while n and n not in mods:
            n = n.rpartition(".")[0]
        if n and n != name:
            found.append(n)
    return found


def circles(root: Path = ROOT) -> list[list[str]]:
    mods = modules(root)
    inits = {m for m, p in mods.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {m: set() for m in mods if m not in inits}
    for m in graph:
        p = mods[m]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[m].update(t for t in _targets(mods, m, node, False) if t not in inits)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in graph:
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    found = circles()
    print(f"{len(found)} circles")
    for c in found:
        print(f"  {len(c)}: {', '.join(c)}")
