"""Griffe extension for the reference: the docstrings' Sphinx roles become cross-references.

The docstrings name other objects the way Sphinx does (``:class:`~redteam.types.Defense```,
``:func:`make_updates```, ``:mod:`.formulas```), and mkdocstrings would print those roles as
they are. mkdocstrings-python loads this file (``extensions:`` in mkdocs.yml), and it rewrites
every role before the docstring is parsed:

* a target that is an object of the documented packages becomes a link to it where the
  reference renders it, and its name in code where it does not (a private helper);
* a target inside the documented packages that names nothing (a renamed or removed object)
  becomes a required cross-reference: autorefs reports "Could not find cross-reference
  target", which fails ``mkdocs build --strict``;
* any other target (the standard library, torch) becomes its name in code.

Targets resolve as in Sphinx: ``~a.b.C`` shows ``C``, ``title <a.b.C>`` shows the title, ``!x``
is never a link. A dotted name whose first part is a documented package is absolute; a leading
dot is relative to the docstring's package, as in an import; otherwise the first part is looked
up in the docstring's scope (the object, its class, its module: members and imports).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

import griffe

#: the packages the reference documents: a role naming a missing object in them fails the build
PACKAGES = ("redteam", "defenses", "attacks", "provenance")

ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|data|mod|attr|exc|obj|const|type):`(?P<target>[^`\n]+)`")
_TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$")


def _relative(module: Any, target: str) -> str | None:
    """``.x`` / ``..x`` against the docstring's module, as a relative import reads them."""
    dots = len(target) - len(target.lstrip("."))
    base = module.path if module.is_init_module else (module.parent.path if module.parent else "")
    parts = base.split(".") if base else []
    if dots - 1 > len(parts) - 1:
        return None
    parts = parts[: len(parts) - (dots - 1)]
    rest = target[dots:]
    return ".".join([*parts, rest] if rest else parts) or None


class SphinxRoles(griffe.Extension):
    """Rewrite ``:role:`target``` in every docstring of a loaded package (see the module)."""

    def __init__(self, packages: list[str] | tuple[str, ...] = PACKAGES) -> None:
        super().__init__()
        self.packages = tuple(packages)

    # -- loading -----------------------------------------------------------------
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in self._objects(pkg):
            doc = obj.docstring
            if doc is not None and ":" in doc.value and ROLE.search(doc.value):
                doc.value = ROLE.sub(lambda m: self.replace(m, obj, loader), doc.value)

    def _objects(self, obj: griffe.Object) -> Any:
        yield obj
        for member in list(obj.members.values()):
            if not member.is_alias:
                yield from self._objects(member)

    # -- one role ----------------------------------------------------------------
    def replace(self, match: re.Match, obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
        text = match["target"].strip()
        titled = _TITLED.match(text)
        if titled:
            title, target = titled["title"], titled["target"].strip()
        else:
            target = text.lstrip("~!")
            title = target.rsplit(".", 1)[-1] if text.startswith("~") else target
        code = f"`{title}`"
        if text.startswith("!"):
            return code
        path, ours = self.resolve(target.removesuffix("()"), obj, loader)
        if path is None or not ours:
            return code
        found = self.lookup(path, loader)
        if found is None:
            return f"[{code}][{path}]"  # dangling: autorefs warns, --strict fails
        return f'<autoref identifier="{found}" optional>{code}</autoref>'

    def resolve(self, target: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> tuple[str | None, bool]:
        """``(full path or None, whether it lies in a documented package)``."""
        if target.startswith("."):
            path = _relative(obj.module, target)
            if path is not None and self.lookup(path, loader) is not None:
                return path, True
            target = target.lstrip(".")
        first, _, rest = target.partition(".")
        if first in self.packages:
            return target, True
        scope: Any = obj
        while scope is not None and not scope.is_module:  # a member of the class, inherited ones too
            if self.lookup(f"{scope.path}.{target}", loader) is not None:
                return f"{scope.path}.{target}", True
            scope = scope.parent
        try:
            base = obj.resolve(first)  # members and imports of the object's scopes
        except (griffe.NameResolutionError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            if rest and importlib.util.find_spec(first) is not None:
                return None, False  # another package's object (`tempfile.mkstemp`)
            # a name no scope knows: dangling, reported under the docstring's module
            return f"{obj.module.path}.{target}", True
        path = f"{base}.{rest}" if rest else base
        return path, path.partition(".")[0] in self.packages

    def lookup(self, path: str, loader: griffe.GriffeLoader, depth: int = 0) -> str | None:
        """The canonical path of the object at ``path`` (through imports), or ``None``."""
        parts = path.split(".")
        if depth > 8 or parts[0] not in self.packages:
            return None
        collection = loader.modules_collection
        if parts[0] not in collection.members:
            try:
                loader.load(parts[0], try_relative_path=False)
            except Exception:  # noqa: BLE001 (a package that does not load: the target is missing)
                return None
        node: Any = collection.members[parts[0]]
        for i, part in enumerate(parts[1:], start=1):
            if node.is_alias:
                try:
                    node = node.final_target
                except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                    return self.lookup(".".join([node.target_path, *parts[i:]]), loader, depth + 1)
            member = node.members.get(part)
            if member is None:
                try:
                    member = node.all_members.get(part)  # inherited
                except Exception:  # noqa: BLE001 (bases that do not resolve)
                    member = None
            if member is None:
                return None
            node = member
        if node.is_alias:
            try:
                return node.final_target.path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return self.lookup(node.target_path, loader, depth + 1)
        return node.path
