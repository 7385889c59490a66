"""Directories of the user's own for what this package caches between processes.

A cache is only as trustworthy as the directory it sits in: a file there decides what the next
process computes with (numba's compiled kernels, which are pickles, in
:mod:`defenses._numba_cache`; generated datasets in :mod:`redteam.workloads.datacache`). Both use
a directory that this user owns and nobody else can write to or replace (:func:`unsafe`), and
compute afresh, without a cache, where there is none.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["unsafe", "user_cache", "refused"]


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


def user_cache(name: str) -> Path:
    """``$XDG_CACHE_HOME/redteam/<name>`` (``~/.cache/redteam/<name>``), unchecked."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "redteam" / name


def refused(where: Path) -> str | None:
    """Why ``where`` cannot be a cache (it cannot be made, or :func:`unsafe`), or None; makes
    it (mode 0o700) when missing."""
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        where.mkdir(mode=0o700, exist_ok=True)
        where = where.resolve()
    except OSError as e:
        return f"cannot be made ({e.strerror or e})"
    return unsafe(where)
