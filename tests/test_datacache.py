"""Generated datasets kept between processes (``redteam.workloads.datacache``): the same arrays as
generating them, read back only when their digest holds, never from someone else's directory."""

from __future__ import annotations

import os

import numpy as np
import pytest

from redteam.registry import WORKLOADS
from redteam.workloads import datacache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    where = tmp_path / "cache"
    monkeypatch.setenv(datacache.CACHE_ENV, str(where))
    return where


def _files(where):
    return sorted(p.name for p in where.glob("*.npz"))


def _no_sklearn(monkeypatch):
    """Generating again would fail: whatever loads now came from the cache."""
    import sklearn.datasets

    def refuse(*a, **k):
        raise AssertionError("generated again instead of read from the cache")

    monkeypatch.setattr(sklearn.datasets, "make_classification", refuse)
    monkeypatch.setattr(sklearn.datasets, "load_digits", refuse)


def test_the_synthetic_workload_reads_back_exactly_what_sklearn_generates(cache, monkeypatch):
    from sklearn.datasets import make_classification

    params = {"samples": 300, "features": 12, "informative": 5, "classes": 3, "class_sep": 0.7, "data_seed": 4}
    first = WORKLOADS.create("synthetic", params).load(0)
    (name,) = _files(cache)
    assert name.startswith("make_classification-")
    x, y = make_classification(n_samples=300, n_features=12, n_informative=5, n_redundant=2, n_classes=3,
                               n_clusters_per_class=1, class_sep=0.7, random_state=4)
    n_test = int(round(0.2 * 300))
    assert np.array_equal(first.train_x.numpy(), x[n_test:].astype(np.float32))
    assert np.array_equal(first.test_y.numpy(), y[:n_test])
    _no_sklearn(monkeypatch)
    again = WORKLOADS.create("synthetic", params).load(0)
    assert np.array_equal(again.train_x.numpy(), first.train_x.numpy())
    assert np.array_equal(again.train_y.numpy(), first.train_y.numpy())
    # other parameters are other data, under another name
    with pytest.raises(AssertionError, match="generated again"):
        WORKLOADS.create("synthetic", {**params, "data_seed": 5}).load(0)


def test_the_digits_workload_reads_back_what_load_digits_gives(cache, monkeypatch):
    from sklearn.datasets import load_digits

    first = WORKLOADS.create("digits", {}).load(0)
    _no_sklearn(monkeypatch)
    again = WORKLOADS.create("digits", {}).load(0)
    assert np.array_equal(again.train_x.numpy(), first.train_x.numpy())
    raw = load_digits()
    both = np.concatenate([first.train_x.numpy(), first.test_x.numpy()])
    assert both.shape == (1797, 64) and sorted(both.sum(axis=1).round(3)) == sorted(
        (raw.data / 16.0).astype(np.float32).sum(axis=1).round(3))


def _made(calls):
    def make():
        calls.append(1)
        return {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.array([1, 0], dtype=np.int64)}
    return make


def test_a_damaged_or_substituted_file_is_made_again_and_replaced(cache):
    calls: list[int] = []
    args = ("k", {"n": 1}, {"lib": "1"}, ("x", "y"))
    want = datacache.cached_arrays(*args, _made(calls))
    (path,) = cache.glob("*.npz")
    assert datacache.cached_arrays(*args, _made(calls))["x"].tolist() == want["x"].tolist() and len(calls) == 1
    # the same names, other values, the old digest: not used
    np.savez(path, x=np.zeros((2, 3), np.float32), y=np.array([1, 0]), __sha256__=np.array(datacache._digest(want)))
    assert datacache.cached_arrays(*args, _made(calls))["x"].tolist() == want["x"].tolist() and len(calls) == 2
    # a digest that holds for arrays of other names: not these
    other = {"z": np.ones(3)}
    np.savez(path, **other, __sha256__=np.array(datacache._digest(other)))
    assert set(datacache.cached_arrays(*args, _made(calls))) == {"x", "y"} and len(calls) == 3
    # bytes that are no npz at all, then a pickle (refused by allow_pickle=False)
    path.write_bytes(b"not an npz")
    datacache.cached_arrays(*args, _made(calls))
    np.savez(path, x=np.array([object()], dtype=object), y=np.array([1]), __sha256__=np.array("0"))
    datacache.cached_arrays(*args, _made(calls))
    assert len(calls) == 5
    # and what it wrote last is good again
    datacache.cached_arrays(*args, _made(calls))
    assert len(calls) == 5 and _files(cache) == [path.name]


def test_a_link_at_the_name_is_not_followed(cache, tmp_path):
    calls: list[int] = []
    args = ("k", {"n": 2}, {}, ("x", "y"))
    datacache.cached_arrays(*args, _made(calls))
    (path,) = cache.glob("*.npz")
    elsewhere = tmp_path / "elsewhere.npz"
    os.replace(path, elsewhere)  # a good file, but not in the cache
    path.symlink_to(elsewhere)
    datacache.cached_arrays(*args, _made(calls))
    assert len(calls) == 2 and not path.is_symlink() and elsewhere.exists()


def test_no_cache_where_the_directory_is_not_this_users_own_or_it_is_off(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv(datacache.CACHE_ENV, str(shared))
    calls: list[int] = []
    for _ in range(2):
        datacache.cached_arrays("k", {}, {}, ("x", "y"), _made(calls))
    assert len(calls) == 2 and _files(shared) == []
    for off in ("off", "0"):
        monkeypatch.setenv(datacache.CACHE_ENV, off)
        assert datacache.directory() is None
    monkeypatch.delenv(datacache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert datacache.directory() == (tmp_path / "xdg" / "redteam" / "data").resolve()
    assert (tmp_path / "xdg" / "redteam" / "data").stat().st_mode & 0o777 == 0o700


def test_a_write_that_fails_still_gives_the_arrays(cache, monkeypatch):
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(datacache.tempfile, "mkstemp", full)
    calls: list[int] = []
    got = datacache.cached_arrays("k", {}, {}, ("x", "y"), _made(calls))
    assert got["y"].tolist() == [1, 0] and _files(cache) == [] and not list(cache.glob(".*"))
