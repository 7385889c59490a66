"""Shared by the example-plugin tests: pip-install an example package into a fresh directory
and make it importable for one test only."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


def install_example(example: Path, module: str, tmp_path_factory: Any) -> Path:
    """``example`` pip-installed (no deps, no index) into a fresh directory, built from a copy of
    its source so that no build/ or *.egg-info appears in the repository."""
    src = tmp_path_factory.mktemp("src") / example.name
    shutil.copytree(example, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
           "--no-cache-dir", "--disable-pip-version-check", "--target", str(target), str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    assert done.returncode == 0, f"pip install of the example failed:\n{done.stdout}\n{done.stderr}"
    assert (target / module / "__init__.py").is_file()
    return target


@contextmanager
def importable(site: Path, module: str, registry: Any, name: str) -> Iterator[Path]:
    """The installed example importable inside the block, then gone without a trace (its
    module unloaded and its registry entry, with the cached class, dropped)."""
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        yield site
    finally:
        sys.path.remove(str(site))
        sys.modules.pop(module, None)
        registry.unregister(name)
        importlib.invalidate_caches()
