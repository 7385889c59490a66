"""Generated datasets kept between processes, verified by content.

The ``synthetic`` workload draws its data with scikit-learn's ``make_classification``, and
importing ``sklearn.datasets`` costs a process about 2 to 3 CPU-seconds, more than a small
run's training (``digits`` reads ``load_digits`` the same way). Every process of a matrix, of a test run, of each ``redteam run`` paid it. The
arrays are a pure function of the workload's parameters and the library versions, so they are
kept in a cache directory and read back (numpy's ``.npz``, read with ``allow_pickle=False``:
nothing in a file can run code) by the next process that asks for the same ones.

* **Where**: ``$REDTEAM_DATA_CACHE`` when set (``off`` turns the cache off), else
  ``$XDG_CACHE_HOME/redteam/data`` (``~/.cache/redteam/data``), made mode 0o700, and only when
  it is this user's own and nobody else can write to it or replace it
  (:func:`redteam._cachedir.unsafe`); otherwise every process generates the data afresh, as
  before, and nothing is said (the cost is time, never a result).
* **Under what name**: the SHA-256 of the kind, the parameters and the versions of numpy and of
  the generating library, so a new version generates anew.
* **Verified**: each file holds the SHA-256 of its arrays (name, dtype, shape and bytes); a
  file whose arrays do not match it, or that cannot be read, is generated again and replaced
  (atomically: a temporary file renamed over it), never used.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CACHE_ENV", "cached_arrays", "directory"]

CACHE_ENV = "REDTEAM_DATA_CACHE"
_DIGEST = "__sha256__"
_MAX_FILE = 1 << 30  # a cache file over 1 GiB is not read


#: the checked directory per setting of the variables that name it: checked once per process,
#: not at every load (a load is on the path of every run and many tests)
_CHECKED: dict[tuple[str | None, ...], Path | None] = {}


def directory() -> Path | None:
    """The checked cache directory (made when missing), or None: no cache."""
    from .._cachedir import refused, user_cache

    given = os.environ.get(CACHE_ENV)
    if given is not None and given.strip().lower() in ("off", "0", "no", "false"):
        return None
    asked = (given, os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"))
    if asked not in _CHECKED:
        where = Path(given) if given else user_cache("data")
        _CHECKED[asked] = None if refused(where) is not None else where.resolve()
    return _CHECKED[asked]


def _digest(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read(path: Path, names: frozenset[str]) -> dict[str, np.ndarray] | None:
    """The arrays of ``path`` if it is a regular file holding exactly ``names`` and its digest."""
    try:
        st = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FILE:
            return None
        with np.load(path, allow_pickle=False) as z:
            got = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError):
        return None
    stored = got.pop(_DIGEST, None)
    if set(got) != names or stored is None or stored.dtype.kind != "U" or stored.shape != ():
        return None
    return got if str(stored) == _digest(got) else None


def _write(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Keep ``arrays`` at ``path`` (a temporary file renamed over it); a failure keeps nothing."""
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{_DIGEST: np.array(_digest(arrays))})
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def cached_arrays(kind: str, key: Mapping[str, Any], versions: Mapping[str, str], names: tuple[str, ...],
                  make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``make()`` (the arrays ``names``), read from the cache when an earlier process kept the
    same ``kind``, ``key`` and ``versions`` (of the libraries ``make`` uses; numpy's is added),
    else computed and kept. Without a cache directory, or when writing fails (a full or
    read-only disk), it is simply computed."""
    where = directory()
    if where is None:
        return make()
    blob = json.dumps({"kind": kind, "key": dict(key), "versions": {**versions, "numpy": np.__version__}},
                      sort_keys=True, default=str).encode()
    path = where / f"{kind}-{hashlib.sha256(blob).hexdigest()[:40]}.npz"
    got = _read(path, frozenset(names))
    if got is not None:
        return got
    arrays = make()
    if set(arrays) != set(names):
        raise ValueError(f"{kind}: made the arrays {sorted(arrays)}, not {sorted(names)}")
    _write(path, arrays)
    return arrays
