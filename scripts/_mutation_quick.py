"""The quick stage of ``scripts/mutation.py`` (``--quick TESTS``): fast unit tests run in this
process against each mutant, before any scratch-copy run.

The mutant's source is executed into a fresh module object that takes the module's place in
``sys.modules`` (no file is written); the quick test files are imported anew (so their
``from module import name`` binds the mutant's names) and run with ``pytest.main``; then
``sys.modules`` is put back as it was. A mutant a quick test fails on is *killed* — by a test of
the scope, in-process; the others go on to the full run in a scratch copy. The unmutated module
is run the same way first: if the quick tests do not pass on it, the stage is refused (a
stage that cannot tell would call every mutant killed). Modules first imported during a quick
run stay imported (re-importing C extensions is unsafe); they bind whichever copy of the module
was in place then, which the baseline run makes an unmutated one. Only a quick test that imports the
module itself sees the mutant; one that reaches it through another module sees the original,
which can only send a mutant on to the full run, never kill it wrongly.
"""

from __future__ import annotations

import contextlib
import io
import sys
import types
from pathlib import Path


def run_quick(root: Path, module: str, source: str, tests: list[str]) -> str:
    """``"killed"``, ``"survived"`` or ``"incompetent"`` (the mutant does not even execute)."""
    import importlib

    import pytest

    name = module[:-3].replace("/", ".")
    package, _, leaf = name.rpartition(".")
    importlib.import_module(name)  # the original and its package, so that putting them back restores them
    saved = dict(sys.modules)
    parent = sys.modules.get(package)
    had = parent is not None and hasattr(parent, leaf)
    old = getattr(parent, leaf, None) if had else None
    mod = types.ModuleType(name)
    mod.__file__ = str(root / module)
    mod.__package__ = package
    sys.modules[name] = mod
    if parent is not None:
        setattr(parent, leaf, mod)
    test_files = {str(root / t.split("::")[0]) for t in tests}
    try:
        try:
            exec(compile(source, str(root / module), "exec"), mod.__dict__)  # noqa: S102 - our own mutant
        except Exception:  # noqa: BLE001 - a mutant that cannot execute
            return "incompetent"
        for k in [k for k, m in sys.modules.items()
                  if k.rpartition(".")[2].startswith("test_") or getattr(m, "__file__", None) in test_files]:
            del sys.modules[k]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--rootdir", str(root),
                              *[str(root / t) for t in tests]])
        return {0: "survived", 1: "killed"}.get(int(rc), "incompetent")
    finally:  # the module back; the test files are imported anew next time (other imports stay: C extensions)
        sys.modules[name] = saved[name]
        for k in [k for k, m in sys.modules.items()
                  if k.rpartition(".")[2].startswith("test_") or getattr(m, "__file__", None) in test_files]:
            del sys.modules[k]
        if parent is not None:
            if had:
                setattr(parent, leaf, old)
            else:
                delattr(parent, leaf)
