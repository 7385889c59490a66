"""Where numba keeps the sorting network's compiled code (issue 35 §9): a cache file is a pickle,
so whoever can write one runs code in the next process that loads it. The cache lives in a
directory of the user's own (``$XDG_CACHE_HOME/redteam/numba``, made 0o700), never beside the
installed package, and a directory that someone else owns or can write to is not used."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from defenses import _numba_cache  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, cache_home: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(XDG_CACHE_HOME=str(cache_home), PYTHONPATH=os.pathsep.join([str(cwd or ROOT), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_the_network_is_cached_in_the_users_directory_not_beside_the_package(tmp_path):
    done = _python("from defenses import _sortnet_drivers as D, _sortnet_kernels as K\n"
                   "from numba.core.registry import CPUDispatcher\n"
                   "for m in (D, K):\n"
                   "    for f in vars(m).values():\n"
                   "        if isinstance(f, CPUDispatcher):\n"
                   "            print(f._cache._cache_path)\n", tmp_path)
    assert done.returncode == 0, done.stderr
    paths = [Path(p) for p in done.stdout.split()]
    assert len(paths) > 10
    home = (tmp_path / "redteam" / "numba").resolve()
    assert all(p.is_relative_to(home) and not p.is_relative_to(ROOT) for p in paths), paths
    assert home.stat().st_mode & 0o777 == 0o700


def _plant(tmp_path: Path, mode: int) -> tuple[Path, Path]:
    """A module with one cached function, and a crafted index file where its cache would be:
    unpickling it creates ``marker``. Returns (module directory, marker)."""
    from numba.core.caching import _CacheLocator

    src = tmp_path / "src"
    src.mkdir()
    module = src / "rt_cached.py"
    module.write_text("from defenses._numba_cache import njit\n\n@njit(cache=True)\ndef inc(x):\n    return x + 1\n")
    home = tmp_path / "cache" / "redteam" / "numba"
    where = home / _CacheLocator.get_suitable_cache_subpath(str(module))
    where.mkdir(parents=True)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    abi = getattr(sys, "abiflags", "")
    name = f"rt_cached.inc-3.py{sys.version_info[0]}{sys.version_info[1]}{abi}.nbi"
    (where / name).write_bytes(pickle.dumps(Payload()))
    os.chmod(home, mode)
    return src, marker


def test_a_planted_cache_file_in_the_users_own_directory_is_where_numba_looks(tmp_path):
    """The control: in a directory only the user can write, numba reads the index file planted
    above (the user could have written it; nobody else could), so the next test's planting is
    where the cache would be looked up."""
    src, marker = _plant(tmp_path, 0o700)
    done = _python("import rt_cached; print(rt_cached.inc(1))", tmp_path / "cache", cwd=src)
    assert done.returncode == 0 and done.stdout.split() == ["2"], done.stderr
    assert marker.exists()


def test_a_cache_directory_others_can_write_to_is_not_used(tmp_path):
    src, marker = _plant(tmp_path, 0o770)
    done = _python("import rt_cached; print(rt_cached.inc(1))", tmp_path / "cache", cwd=src)
    assert done.returncode == 0 and done.stdout.split() == ["2"], done.stderr
    assert not marker.exists()
    assert "others can write to it" in done.stderr and "compiles without a cache" in done.stderr


def test_a_cache_directory_someone_else_owns_or_can_replace_is_refused(tmp_path, monkeypatch):
    home = tmp_path / "c"
    home.mkdir(mode=0o700)
    assert _numba_cache.unsafe(home) is None
    for mode in (0o720, 0o702):
        home.chmod(mode)
        assert "others can write to it" in _numba_cache.unsafe(home)
    home.chmod(0o700)
    shared = tmp_path / "shared"
    (shared / "c").mkdir(parents=True, mode=0o700)
    shared.chmod(0o777)
    assert "which others can write to" in _numba_cache.unsafe(shared / "c")
    shared.chmod(0o1777)  # sticky, as /tmp: nobody else can rename or remove c
    assert _numba_cache.unsafe(shared / "c") is None
    other = os.geteuid() + 1
    monkeypatch.setattr(_numba_cache.os, "geteuid", lambda: other)
    assert "owned by uid" in _numba_cache.unsafe(home)
    (tmp_path / "f").write_text("")
    assert "not a directory" in _numba_cache.unsafe(tmp_path / "f")


_FIRST_USE = """
import sys
from defenses import _numba_cache
_numba_cache.NOTE_AFTER = 0.3
import rt_cached
with _numba_cache.first_use("inc", [rt_cached.inc]):
    print(rt_cached.inc(1), flush=True)
"""


def test_a_first_call_waits_while_another_process_compiles_and_says_what_it_does(tmp_path):
    """issue 40 §2: the first call of a cached kernel takes the cache directory's compile lock
    (another process compiling the same code holds it: this one waits, then loads), and a pause
    longer than NOTE_AFTER is said in one line on stderr: waiting, compiling, or loading."""
    import fcntl
    import time

    src = tmp_path / "src"
    src.mkdir()
    (src / "rt_cached.py").write_text("from defenses._numba_cache import njit\n\n"
                                      "@njit(cache=True)\ndef inc(x):\n    return x + 1\n")
    home = tmp_path / "cache" / "redteam" / "numba"
    home.mkdir(parents=True, mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join([str(src), str(ROOT)]))
    with open(home / ".compile.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as a process compiling would
        proc = subprocess.Popen([sys.executable, "-c", _FIRST_USE], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        line = proc.stderr.readline()  # blocks until the note (or the process ends)
        assert line == "redteam: inc: waiting for another process that compiles it ...\n"
        time.sleep(0.2)
        assert proc.poll() is None  # still held up
    out, err = proc.communicate(timeout=120)
    assert out.split() == ["2"]
    done = subprocess.run([sys.executable, "-c", _FIRST_USE.replace("0.3", "0.0")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["2"] and done.stderr.startswith("redteam: inc: loading it from the cache in "), done.stderr


def test_the_pause_note_says_compiling_then_loading(tmp_path, monkeypatch):
    import importlib

    src = tmp_path / "src"
    src.mkdir()
    (src / "rt_note.py").write_text("from defenses._numba_cache import njit\n\n"
                                    "@njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setattr(_numba_cache, "_state", {"dir": home})
    monkeypatch.syspath_prepend(str(src))
    mod = importlib.import_module("rt_note")
    assert not _numba_cache.cached(mod.twice)
    assert mod.twice(3) == 6
    assert _numba_cache.cached(mod.twice)
    assert _numba_cache.pause("twice", home, "loading") == f"redteam: twice: loading it from the cache in {home} ..."
    assert "once: then cached in" in _numba_cache.pause("twice", home, "compiling")
    assert "the cache is refused" in _numba_cache.pause("twice", None, "compiling")


def test_a_test_run_shares_one_cache_even_where_the_users_is_refused(tmp_path, monkeypatch):
    """issue 39: numba compiles once per suite run. With the user's directory usable nothing
    changes; where it is refused (here: a home others can write to), one private directory is
    made and set in NUMBA_CACHE_DIR, which every process the run starts inherits."""
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(_numba_cache, "_state", {})
    import numba

    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    good = tmp_path / "good"
    monkeypatch.setenv("XDG_CACHE_HOME", str(good))
    assert _numba_cache.one_for_this_run() is None and "NUMBA_CACHE_DIR" not in os.environ
    bad = tmp_path / "bad"
    (bad / "redteam" / "numba").mkdir(parents=True, mode=0o700)
    bad.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(bad))
    made = _numba_cache.one_for_this_run()
    try:
        assert made is not None and os.environ["NUMBA_CACHE_DIR"] == str(made) == numba.config.CACHE_DIR
        assert _numba_cache.directory() == made.resolve() and made.stat().st_mode & 0o777 == 0o700
        child = subprocess.run([sys.executable, "-c", "from defenses import _numba_cache as c; print(c.directory())"],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        assert child.stdout.strip() == str(made.resolve()), child.stderr
    finally:
        bad.chmod(0o700)
        if made is not None:
            made.rmdir()
