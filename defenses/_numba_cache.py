"""numba's ``njit`` with its compile cache in a directory of the user's own (issue 35 §9).

A numba cache file is a pickle: whoever can write one runs code in the next process that
compiles the function. numba's default puts the files beside the source, in the installed
package's ``__pycache__`` (writable by whoever installed it, shared by every user of a
site-wide install), or in the user's cache directory, and uses whichever it can write to.
Here they go to ``$NUMBA_CACHE_DIR`` when the user set it, else to
``$XDG_CACHE_HOME/redteam/numba`` (``~/.cache/redteam/numba``), made mode 0o700, and only when
that directory, resolved, is owned by this user and nobody else can write to it or to any
directory above it (root-owned or sticky ones aside, like ``/tmp``). Otherwise the functions
are compiled afresh in each process, without a cache, and a RuntimeWarning says why once.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Any, Callable

import numba

_state: dict[str, Any] = {}


def unsafe(path: Path) -> str | None:
    """Why a process of this user must not load code from the directory ``path`` (resolved),
    or None: it is not a directory, another user owns it, or someone else can write to it or
    replace it (a directory above it that another user owns, or that others can write to
    without the sticky bit)."""
    uid = os.geteuid()
    try:
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            return "is not a directory"
        if st.st_uid != uid:
            return f"is owned by uid {st.st_uid}, not by this user ({uid})"
        if st.st_mode & 0o022:
            return f"has mode {stat.S_IMODE(st.st_mode):o}: others can write to it"
        for above in path.parents:
            st = os.stat(above)
            if st.st_uid not in (0, uid):
                return f"lies in {above}, owned by uid {st.st_uid}"
            if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                return f"lies in {above}, which others can write to"
    except OSError as e:
        return f"cannot be checked ({e.strerror or e})"
    return None


def directory() -> Path | None:
    """The checked cache directory (created when missing), or None (said once, as a warning)."""
    if "dir" not in _state:
        given = numba.config.CACHE_DIR
        if given:
            where = Path(given)
        else:
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            where = Path(base) / "redteam" / "numba"
        why = None
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.mkdir(mode=0o700, exist_ok=True)
            where = where.resolve()
        except OSError as e:
            why = f"cannot be made ({e.strerror or e})"
        why = why or unsafe(where)
        if why:
            warnings.warn(f"redteam: the numba cache directory {where} {why}; the sorting network compiles "
                          "without a cache in each process (set NUMBA_CACHE_DIR to a directory of your own, "
                          "mode 700)", RuntimeWarning, stacklevel=4)
        _state["dir"] = None if why else where
    return _state["dir"]


def _function_cache(py_func: Callable[..., Any], where: Path) -> Any:
    """numba's cache of compiled ``py_func`` kept in ``where`` (one subdirectory per source
    directory, as numba names them)."""
    from numba.core import caching

    class Locator(caching.UserProvidedCacheLocator):
        def __init__(self, func: Any, py_file: str) -> None:
            super().__init__(func, py_file)
            self._cache_path = str(where / self.get_suitable_cache_subpath(py_file))

        @classmethod
        def from_function(cls, func: Any, py_file: str) -> Any:
            # the source-file locator's own checks (the file exists, the directory is writable),
            # without UserProvidedCacheLocator's test of NUMBA_CACHE_DIR
            return super(caching.UserProvidedCacheLocator, cls).from_function(func, py_file)

    class Impl(caching.CompileResultCacheImpl):
        _locator_classes = [Locator]

    class Cache(caching.FunctionCache):
        _impl_class = Impl

    return Cache(py_func)


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(**options)``; with ``cache=True`` the compiled code is kept in
    :func:`directory` (or nowhere, when it is refused), never beside the source."""
    cache = options.pop("cache", False)

    def wrap(py_func: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**options)(py_func)
        where = directory() if cache else None
        if where is not None:
            try:
                dispatcher._cache = _function_cache(py_func, where)  # what Dispatcher.enable_caching sets
            except Exception:  # noqa: BLE001 - no locator for this file, or other caching internals: no cache
                pass
        return dispatcher

    return wrap
