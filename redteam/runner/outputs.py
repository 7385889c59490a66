"""Output files: checked before any work is done, written atomically and safely.

* :func:`check_output_file` / :func:`check_output_dir` look at a path the user gave
  (``--json OUT``, ``--out DIR``) *before* a run starts, so a directory where a file is
  wanted, a file where a directory is wanted, or an unwritable parent is a one-line
  :class:`OutputError` instead of a traceback after the results were computed.
* :func:`atomic_write_text` writes a file the safe way: the temporary file is created
  with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under an unpredictable name in the target's own
  directory (:func:`tempfile.mkstemp`), so a symlink planted at a guessable name is never
  written through; it is then renamed over the target (``rename`` replaces a symlink at
  the target itself, it does not follow it). The final file gets the mode the umask
  gives a new file (``mkstemp`` would leave it ``0600``). A failed write leaves nothing
  behind and the old file untouched.
* :func:`is_disk_full` tells a full disk (or an exhausted quota) in an exception or
  anything it was raised from: ``ENOSPC``/``EDQUOT``, SQLite's ``SQLITE_FULL``
  ("database or disk is full"), a library's own wording of them; :class:`DiskFull` is the
  one-line error the commands turn it into.
* :func:`terminal_safe` makes text that came from a scenario file, a plugin or a path
  safe to print on one terminal line: control characters (newlines, ``ESC``, C1 codes,
  ``DEL``) become visible escapes.
"""

from __future__ import annotations

import errno
import math
import os
import re
import sqlite3
import stat
import tempfile
from pathlib import Path
from typing import Any

from ..errors import RedteamError

__all__ = ["OutputError", "DiskFull", "atomic_write_bytes", "atomic_write_text", "check_output_dir",
           "check_output_file", "terminal_safe", "is_disk_full", "disk_full_path"]


class OutputError(RedteamError):
    """An output path cannot be used (the message names the option and the path);
    ``errno`` is the operating system's error number when one caused it."""

    errno: int | None = None
    path: str | None = None


class DiskFull(RedteamError):
    """The disk (or the quota) filled up while a command was writing its results."""


_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# how libraries that do not raise OSError say it (safetensors: Rust's io::ErrorKind)
_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "StorageFull", "database or disk is full")


def _chain(exc: BaseException | None) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and all(exc is not e for e in out):
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, says the disk or the quota is full."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        if isinstance(e, OutputError) and e.errno in _FULL_ERRNOS:
            return True
        if isinstance(e, sqlite3.Error) and getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        if isinstance(e, DiskFull) or any(w in str(e) for w in _FULL_WORDS):
            return True
    return False


def disk_full_path(exc: BaseException) -> str | None:
    """The file a disk-full ``exc`` (or what it was raised from) was writing, when it says."""
    for e in _chain(exc):
        name = getattr(e, "filename", None) or getattr(e, "path", None)
        if isinstance(name, (str, bytes, os.PathLike)):
            return os.fsdecode(name)
    return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def terminal_safe(text: object) -> str:
    """``text`` with every control character shown as an escape (``\\n``, ``\\x1b``)."""

    def sub(m: re.Match[str]) -> str:
        c = m.group(0)
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
            f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")

    return _CONTROL.sub(sub, str(text))


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_text(path: str | Path, text: str, *, option: str = "--out", make_parents: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, creating missing parent
    directories when ``make_parents``; errors are :class:`OutputError`."""
    return atomic_write_bytes(path, text.encode("utf-8"), option=option, make_parents=make_parents)


def atomic_write_bytes(path: str | Path, data: bytes, *, option: str = "--out", make_parents: bool = True) -> Path:
    """:func:`atomic_write_text` for bytes."""
    p = Path(path)
    where = f"{option} {terminal_safe(p)}"
    if p.is_dir():
        raise OutputError(f"{where}: is a directory; give a file name")
    tmp: str | None = None
    try:
        if make_parents:
            p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, p)
        tmp = None
    except OSError as exc:
        err = OutputError(f"{where}: cannot write ({exc.strerror or exc})")
        err.errno, err.path = exc.errno, str(p)
        raise err from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and not q.is_symlink() and q != q.parent:
        q = q.parent
    return q


def check_output_file(path: str | Path, *, option: str) -> Path:
    """Refuse, before any work, a file output that cannot be written: an existing
    directory, a parent that is a file, a parent that is not writable."""
    p = Path(path)
    where = f"{option} {terminal_safe(p)}"
    if str(path) == "" or p.name in ("", ".", ".."):
        raise OutputError(f"{where}: expected a file name")
    if p.is_dir():
        raise OutputError(f"{where}: is a directory; give a file name (e.g. {terminal_safe(p / 'results.json')})")
    base = _nearest_existing(p.parent)
    if base.exists() and not base.is_dir():
        raise OutputError(f"{where}: {terminal_safe(base)} is a file, not a directory")
    if base.exists() and not os.access(base, os.W_OK | os.X_OK):
        raise OutputError(f"{where}: directory {terminal_safe(base)} is not writable")
    if p.exists() and not stat.S_ISREG(p.stat().st_mode):
        raise OutputError(f"{where}: exists and is not a regular file")
    return p


def check_output_dir(path: str | Path, *, option: str, sqlite_file_ok: bool = True) -> Path:
    """Refuse, before any work, a results directory that cannot be one: an existing
    regular file (other than a ``.sqlite`` store when ``sqlite_file_ok``), a path under
    a file, an unwritable parent."""
    p = Path(path)
    where = f"{option} {terminal_safe(p)}"
    if str(path) == "":
        raise OutputError(f"{where}: expected a directory")
    if sqlite_file_ok and p.suffix == ".sqlite":
        return check_output_file(p, option=option)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{where}: exists and is not a directory (a results directory, or a FILE.sqlite store)")
    base = _nearest_existing(p)
    if base != p:
        if base.exists() and not base.is_dir():
            raise OutputError(f"{where}: {terminal_safe(base)} is a file, not a directory")
        if base.exists() and not os.access(base, os.W_OK | os.X_OK):
            raise OutputError(f"{where}: cannot create it: {terminal_safe(base)} is not writable")
    elif not os.access(p, os.W_OK | os.X_OK):
        raise OutputError(f"{where}: directory is not writable")
    return p


def sanitize(o: Any) -> Any:
    """JSON has no NaN or infinity: they become ``null``; unknown objects become strings."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): sanitize(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [sanitize(v) for v in o]
    if o is None or isinstance(o, (bool, int, str)):
        return o
    return str(o)
