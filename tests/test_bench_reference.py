"""The comparison benchmarks find their references inside the repository and parse their
arguments (issue 24 §2, issue 23 §3). Nothing here times anything or needs the references'
venv: the scripts are imported and their argument parsing is exercised."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(os.path.dirname(path))
    return mod


def test_references_live_next_to_the_benchmarks() -> None:
    vs = _load(os.path.join(BENCH, "bench_vs_flower.py"), "bench_vs_flower_t")
    agg = _load(os.path.join(BENCH, "bench_aggregators.py"), "bench_aggregators_t")
    for ref in (vs.REFERENCE, agg.REFERENCE):
        assert os.path.realpath(ref) == os.path.realpath(os.path.join(BENCH, "reference"))
        for f in ("setup.sh", "requirements.txt", "requirements-nodeps.txt", "fl_federation.py", "flower_sim.py",
                  "byzfl_timing.py"):
            assert os.path.isfile(os.path.join(ref, f)), f
    for f in ("bench_vs_flower.py", "bench_aggregators.py"):
        with open(os.path.join(BENCH, f)) as fh:
            assert "PA_REFERENCE_DIR" not in fh.read()


def test_bench_vs_flower_refuses_bad_arguments() -> None:
    vs = _load(os.path.join(BENCH, "bench_vs_flower.py"), "bench_vs_flower_t")
    for argv in (["--rounds", "2"], ["--clients", "0"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            vs.main(argv)


def test_byzfl_pairs_are_exact_names() -> None:
    agg = _load(os.path.join(BENCH, "bench_aggregators.py"), "bench_aggregators_t")
    assert agg.byzfl_spec("median", 100, 7) == "Median"
    assert agg.byzfl_spec("geometric_median (3 iterations)", 100, 7) == "GeometricMedian:T=3,nu=1e-6"
    assert agg.byzfl_spec("geometric_median (to convergence)", 100, 7) == "GeometricMedian:T=7,nu=1e-6"
    assert agg.byzfl_spec("krum (f = n/10)", 50, 1) == "Krum:f=5"
    timing = _load(os.path.join(BENCH, "reference", "byzfl_timing.py"), "byzfl_timing_t")
    assert timing.parse_agg("GeometricMedian:T=3,nu=1e-6") == ("GeometricMedian", {"T": "3", "nu": "1e-6"})
    for bad in ("median", "Med", "GeometricMedian:f=1"):
        with pytest.raises(argparse.ArgumentTypeError):
            timing.parse_agg(bad)
