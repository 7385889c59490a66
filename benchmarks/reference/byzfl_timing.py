"""Time ByzFL's aggregators, each named exactly, on one (n, d) input.

    python byzfl_timing.py --n 100 --d 10000 --agg Median --agg "GeometricMedian:T=3,nu=1e-6" \\
        --agg "CenteredClipping:L=1,tau=10" --agg "Krum:f=10" --repeats 5 --json out.json

``--agg NAME[:key=value,...]``: NAME is one of :data:`AGGREGATORS` exactly (no substring
match: ``Median`` is the coordinate-wise median and nothing else), the keys are that
aggregator's constructor arguments (``f``; ``T`` and ``nu`` for ``GeometricMedian``; ``L`` and
``tau`` for ``CenteredClipping``). ``NNM+Average`` is ByzFL's nearest-neighbour mixing
followed by its average. ``CenteredClipping`` keeps its centre between calls, so every call
gets a fresh instance (centre zero, as redteam's rule without a previous aggregate).

The input is ``torch.randn((n, d), generator=torch.Generator().manual_seed(--seed))``,
float32, the stacked tensor ByzFL accepts directly (what ``bench_aggregators.py`` draws for
the same cell with the same seed: both sides time the same numbers). Each aggregator: one
warm-up call, then ``--repeats`` timed calls (min / median / max); the 1-minute load average
is read before and after. A cell whose largest temporary would exceed ``--mem-limit-gib`` is
skipped with the estimate (NNM gathers an (n, n − f, d) array).

This file runs in the reference environment (``setup.sh``); it never imports redteam.
``import byzfl`` runs the package's ``__init__``, which imports its training benchmark and
through it torchvision (not installed here: ``requirements-nodeps.txt``); the aggregators
need only numpy, scipy and torch, so their modules are imported under an empty ``byzfl``
package object instead.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
import types

import torch


def _byzfl_aggregators() -> types.ModuleType:
    """``byzfl.aggregators`` without ``byzfl/__init__.py`` (module docstring)."""
    if "byzfl" not in sys.modules:
        spec = importlib.util.find_spec("byzfl")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("byzfl_timing: byzfl is not installed (bash setup.sh)")
        pkg = types.ModuleType("byzfl")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["byzfl"] = pkg
    import byzfl.aggregators as agg

    return agg


def _build(name: str, p: dict, n: int):
    """(callable on the stacked input, bytes of its largest temporary) for one exact name."""
    A = _byzfl_aggregators()
    f = int(p.get("f", 0))
    if name == "Average":
        return A.Average(), 0
    if name == "Median":
        return A.Median(), 0
    if name == "TrMean":
        return A.TrMean(f=f), 0
    if name == "Krum":
        return A.Krum(f=f), 0
    if name == "MultiKrum":
        return A.MultiKrum(f=f), 0
    if name == "GeometricMedian":
        return A.GeometricMedian(nu=float(p.get("nu", 0.1)), T=int(p.get("T", 3))), 0
    if name == "CenteredClipping":
        L, tau = int(p.get("L", 1)), float(p.get("tau", 100.0))
        return (lambda v: A.CenteredClipping(L=L, tau=tau)(v)), 0
    if name == "NNM+Average":
        nnm, avg = A.NNM(f=f), A.Average()
        return (lambda v: avg(nnm(v))), n * (n - f)
    raise AssertionError(name)


#: the exact names --agg accepts, with the keys each takes
AGGREGATORS = {"Average": (), "Median": (), "TrMean": ("f",), "Krum": ("f",), "MultiKrum": ("f",),
               "GeometricMedian": ("T", "nu"), "CenteredClipping": ("L", "tau"), "NNM+Average": ("f",)}


def parse_agg(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    if name not in AGGREGATORS:
        raise argparse.ArgumentTypeError(f"--agg {text!r}: {name!r} is not one of {', '.join(AGGREGATORS)} "
                                         "(names are exact)")
    params = {}
    for item in filter(None, rest.split(",")):
        k, eq, v = item.partition("=")
        if not eq or k not in AGGREGATORS[name]:
            raise argparse.ArgumentTypeError(f"--agg {text!r}: {name} takes {', '.join(AGGREGATORS[name]) or 'no'} "
                                             f"keys, not {item!r}")
        params[k] = v
    return name, params


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--d", type=int, required=True)
    ap.add_argument("--agg", type=parse_agg, action="append", required=True, help="NAME[:key=value,...]")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--mem-limit-gib", type=float, default=8.0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    x = torch.randn((args.n, args.d), generator=torch.Generator().manual_seed(args.seed))
    out = []
    for name, params in args.agg:
        label = name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
        fn, rows = _build(name, params, args.n)
        cell = {"agg": label, "n": args.n, "d": args.d}
        need = rows * args.d * 4
        if need > args.mem_limit_gib * 2**30:
            cell["error"] = f"skipped: needs ~{need / 2**30:.0f} GiB (> --mem-limit-gib {args.mem_limit_gib:g})"
        else:
            cell["load_before"] = os.getloadavg()[0]
            fn(x)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - t0)
            cell.update(min=min(times), median=statistics.median(times), max=max(times), times=times,
                        load_after=os.getloadavg()[0])
        gc.collect()
        out.append(cell)
        shown = cell.get("error") or f"{cell['median'] * 1e3:.2f} ms (min {cell['min'] * 1e3:.2f}, max {cell['max'] * 1e3:.2f})"
        print(f"ByzFL {label} n={args.n} d={args.d}: {shown}", file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "results": out}, fh)


if __name__ == "__main__":
    main()
