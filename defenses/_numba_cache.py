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

The first call of a cached kernel in a process goes through :func:`first_use`: one process at a
time compiles (a lock file in the cache directory: the matrix's workers, or the processes of a
test run, wait for the first to write the cache, then load it, instead of each compiling the
same code), and when the call takes more than :data:`NOTE_AFTER` seconds one line on stderr says
what the pause is (compiling, loading, or waiting for another process that compiles).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from redteam._cachedir import refused, unsafe, user_cache  # noqa: F401 - unsafe: also this module's

_state: dict[str, Any] = {}

#: seconds a first call may take before :func:`first_use` says what the pause is
NOTE_AFTER = 1.0


def candidate() -> Path:
    """The cache directory asked for, unchecked: ``$NUMBA_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/redteam/numba`` (``~/.cache/redteam/numba``). Imports nothing heavy."""
    given = os.environ.get("NUMBA_CACHE_DIR")
    if not given and "numba" in sys.modules:
        given = sys.modules["numba"].config.CACHE_DIR
    if given:
        return Path(given)
    return user_cache("numba")


def one_for_this_run() -> Path | None:
    """Where the user's cache directory (:func:`candidate`) is refused, make a private one and
    set it in ``NUMBA_CACHE_DIR`` (and numba's config, if loaded), so that this process and every
    process started from it share one cache instead of each compiling without one; returns it
    (the caller removes it when done), or None when the user's directory is fine. For a test
    run (``tests/conftest.py``)."""
    import tempfile

    if refused(candidate()) is None:
        return None
    run = Path(tempfile.mkdtemp(prefix="redteam-numba-"))  # mode 0o700, this user's
    os.environ["NUMBA_CACHE_DIR"] = str(run)
    if "numba" in sys.modules:
        sys.modules["numba"].config.CACHE_DIR = str(run)
    _state.pop("dir", None)
    return run


def directory() -> Path | None:
    """The checked cache directory (created when missing), or None (said once, as a warning)."""
    if "dir" not in _state:
        where = candidate()
        why = refused(where)
        if not why:
            where = where.resolve()
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
        import numba

        dispatcher = numba.njit(**options)(py_func)
        where = directory() if cache else None
        if where is not None:
            try:
                dispatcher._cache = _function_cache(py_func, where)  # what Dispatcher.enable_caching sets
            except Exception:  # noqa: BLE001 - no locator for this file, or other caching internals: no cache
                pass
        return dispatcher

    return wrap


def cached(dispatcher: Any) -> bool:
    """Whether the cache holds compiled code of ``dispatcher`` for its current source (any
    signature): its first call then loads rather than compiles."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - no cache, or numba's internals moved: say "compiling"
        return False


def pause(what: str, where: Path | None, phase: str) -> str:
    """The one line :func:`first_use` prints: what the first call of ``what`` is doing (``phase``:
    ``waiting``, ``loading`` or ``compiling``)."""
    doing = {"waiting": "waiting for another process that compiles it",
             "loading": f"loading it from the cache in {where}"}.get(phase)
    if doing is None:
        doing = "compiling it (numba, 10-15 s of CPU; " + (
            f"once: then cached in {where})" if where is not None else "in every process: the cache is refused)")
    return f"redteam: {what}: {doing} ..."


@contextlib.contextmanager
def first_use(what: str, dispatchers: "list[Any]") -> Iterator[None]:
    """Around the first calls of ``dispatchers`` (numba-compiled ``what``) in this process: one
    process at a time, by an exclusive lock on ``.compile.lock`` in the cache directory (none
    without a cache), and a one-line note on stderr if it takes more than :data:`NOTE_AFTER` s."""
    where = directory()
    phase = {"now": "compiling"}
    lock = None
    if where is not None:
        try:
            import fcntl

            lock = open(where / ".compile.lock", "a")  # noqa: SIM115 - held until the end
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                phase["now"] = "loading" if all(cached(d) for d in dispatchers) else "compiling"
            except BlockingIOError:  # another process holds it: it compiles
                phase["now"] = "waiting"
        except (ImportError, OSError):  # no flock here: each process compiles as before
            lock = None

    def note() -> None:
        print(pause(what, where, phase["now"]), file=sys.stderr, flush=True)

    timer = threading.Timer(NOTE_AFTER, note)
    timer.daemon = True
    timer.start()
    try:
        if phase["now"] == "waiting":
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            phase["now"] = "loading" if all(cached(d) for d in dispatchers) else "compiling"
        yield
    finally:
        timer.cancel()
        if lock is not None:
            lock.close()  # releases the lock
