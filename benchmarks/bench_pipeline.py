"""The simulated SWARM pipeline beside the same model trained in one process: micro-batches per
second of each, and their ratio.

    python benchmarks/bench_pipeline.py                                  # the defaults below, 1 thread
    python benchmarks/bench_pipeline.py --micro-batches 64 --rounds 2    # longer rounds
    python benchmarks/bench_pipeline.py --stages 2 --peers 4 --checks 0  # another cut, no check row
    python benchmarks/bench_pipeline.py --width 64 --layers 6 --threads 2

The pipeline is the ``[pipeline]`` regime (:mod:`redteam.federation.swarm`):
``SwarmRun(parse_scenario(doc)).run()`` on a scenario like ``scenarios/pipeline.toml``'s base —
the ``text`` workload (context 16, width 32, 3 layers, 2 heads, ``max_bytes`` 100,000), cut into
``--stages`` stages (3) of ``--peers`` peers each (3), SWARM routing, ``--micro-batches``
micro-batches (32) of ``--micro-batch-size`` windows (8) a round, ``--rounds`` rounds (3) at
lr 0.2, no attack, the ``mean`` defense. Each micro-batch goes forward through one peer per
stage (one ``functional_call`` per block on the peer's replica of its stage's slice), then
backward; after the round each stage's replicas are merged by the defense. With ``mean`` and
honest peers that is exactly one SGD step on the mean loss of the round's micro-batches
(``tests/test_swarm.py``), so the same work can be done in one process:

* **single process, module**: the same ``ByteTransformer`` (the run's ``model``, at the run's
  ``params0``) as a plain ``nn.Module``: for each micro-batch (the same windows: the run's training
  stream), forward, cross-entropy, ``backward()`` (the gradients accumulate), then per round one
  SGD step ``p -= lr * grad / M``. No evaluation. This is the reference of the ratio.
* **single process, functional**: the same, but through ``functional_call`` on the flat
  parameter vector (a leaf that accumulates the gradient) — how the tests' reference computes
  it; it separates the cost of ``functional_call``'s reparametrisation from the pipeline's own.

``SwarmRun.run()`` also scores the held-out set (246 windows here) before the first round and
after every round (``rounds + 1`` evaluations); the benchmark wraps ``run.trainer.evaluate`` to
time them and reports the pipeline's rate both with them and without them ("train"): the ratio
compares the training only. Construction of a ``SwarmRun`` (parsing, corpus, model, peers) is not
in the timed run: the table's header gives it, the first one (which reads the corpus) apart.

``--checks F`` (default 0.25; 0 leaves the row out) adds a row with
``{name = "redundant_recompute", fraction = F}`` in ``[pipeline].checks``: Lu et al.'s sampled
recomputation of a hop on another peer of the stage, one extra stage forward per checked hop
(no backward), the overhead ``scenarios/pipeline.toml`` scores. Its "recomputed" column counts
those extra stage forwards per run; the check also draws, on every hop, whether to recompute it,
so the extra time per recomputed forward printed below includes those draws.

Every way runs in this process, after one untimed warm-up of each; each timed repeat builds fresh
runs (untimed) and times the ways one after another, so drift on a shared machine hits all of
them; the table gives the median of ``--repeats``. The last lines give the per-hop overhead of
the pipeline over the plain module — (pipeline train s − module s) / hops, a hop being one stage's
forward and backward for one micro-batch — and check that the ways computed the same thing: the
largest difference between the pipeline's and the single process's final parameters (float32
sums in another order; not a test: ``tests/test_swarm.py`` is). Nothing is asserted.

Measured
--------
2026-11-27, ``OMP_NUM_THREADS=1 python benchmarks/bench_pipeline.py`` (the defaults: 3 stages × 3
peers, 3 rounds × 32 micro-batches × 8 windows, width 32, 3 layers, 55,328 parameters; median of
9; about 20 s in all), on the shared 2-core AMD EPYC, torch 2.13.0+cpu, python 3.11.7, 1 thread:

| way | s / run | of which eval s (evals) | train s | micro-batches / s (with eval) | micro-batches / s (train) | ratio to single process | recomputed stage forwards |
|---|---|---|---|---|---|---|---|
| pipeline | 0.441 | 0.074 (4) | 0.362 | 217.7 | 265.1 | 0.72 | 0 |
| pipeline + redundant_recompute 0.25 | 0.520 | 0.069 (4) | 0.440 | 184.5 | 218.1 | 0.64 | 72 |
| single process, module | 0.271 | - | 0.271 | - | 354.1 | 1.00 | - |
| single process, functional_call | 0.315 | - | 0.315 | - | 305.0 | 0.87 | - |

Pipeline overhead over the plain module 349 µs per hop; the check +15 % train time (72 of 288
hops recomputed, ~760 µs per recomputed stage forward, the per-hop draw on the other hops
included); final parameters agree to 1.2e-7. SwarmRun construction: 0.83 s the first time (the
corpus), 8 ms after. Three more default runs on the same machine (other jobs running) gave ratios
0.69, 0.75 and 0.68 for the pipeline (0.62 to 0.64 with the check; 0.81 to 0.90 for the
functional_call reference), and with the table's run 185 to 265 pipeline micro-batches / s
against 245 to 354 for the module: the absolute rates move with the machine's load, the paired
ratio much less.

* ``--threads 2``: ratio 0.82 (0.72 with the check), but every way is slower than with 1 thread
  (pipeline 135, module 178 micro-batches / s): these micro-batches are too small to split.
* ``--width 128 --layers 6 --heads 4 --repeats 5`` (1,257,728 parameters, 1 thread): pipeline
  42.3 micro-batches / s (train) against 48.9, ratio 0.91 (0.80 with the check); 704 µs per hop
  of overhead, now a smaller share of a hop's compute; the evaluations are 0.81 of the run's
  3.03 s (27 %).

Where the overhead goes (1 thread, width 32, one micro-batch through the 3 stages, min of 15 × 100
interleaved calls): forward through ``stage_forward`` 1.60 ms against the plain module's 0.97 ms,
forward + backward 3.87 against 2.77 ms. Of the forward's extra ~630 µs, rebuilding each stage's
name → tensor dicts from the flat slice (``torch.split`` and ``reshape`` of every parameter, the
block dicts by string prefix) is ~160 µs (the ``spec.names.index`` look-ups themselves ~18 µs) and
the rest is ``functional_call``'s reparametrisation, one per block and per embedding / head
module; the backward is ~465 µs longer per micro-batch too (among others, the backward nodes of
those split and reshape views). Routing (``_route``: pool list, numpy weights, ``choice``) is ~16 µs per hop.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run as `python benchmarks/bench_pipeline.py` from a checkout
    sys.path.insert(0, ROOT)


def _cpu_name() -> str:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _timing import cpu_name

    return cpu_name()


def _doc(args: argparse.Namespace, checks: float | None) -> dict[str, Any]:
    """The scenario: scenarios/pipeline.toml's base, with no attack and the sizes of ``args``."""
    pipeline: dict[str, Any] = {"stages": args.stages, "peers_per_stage": args.peers,
                                "micro_batches": args.micro_batches, "micro_batch_size": args.micro_batch_size,
                                "routing": args.routing}
    if checks is not None:
        pipeline["checks"] = [{"name": "redundant_recompute", "fraction": checks}]
    return {"scenario": {"name": "bench_pipeline", "seed": args.seed},
            "workload": {"name": "text", "context": args.context, "width": args.width, "layers": args.layers,
                         "heads": args.heads, "max_bytes": args.max_bytes},
            "federation": {"rounds": args.rounds, "lr": args.lr},
            "pipeline": pipeline,
            "attack": "none", "defense": "mean"}


def _build(args: argparse.Namespace, checks: float | None):
    from redteam.federation.swarm import SwarmRun
    from redteam.scenario import parse_scenario

    t = time.perf_counter()
    run = SwarmRun(parse_scenario(_doc(args, checks)))
    return run, time.perf_counter() - t


def _time_pipeline(run) -> dict[str, Any]:
    """``run.run()``, timed, with its evaluations timed apart."""
    spent = [0.0, 0]
    evaluate = run.trainer.evaluate

    def timed_evaluate(*a, **kw):
        t = time.perf_counter()
        out = evaluate(*a, **kw)
        spent[0] += time.perf_counter() - t
        spent[1] += 1
        return out

    run.trainer.evaluate = timed_evaluate
    t = time.perf_counter()
    res = run.run()
    total = time.perf_counter() - t
    recomputed = sum(r.extra["pipeline"]["recomputed_hops"] for r in res.records)
    hops = sum(r.extra["pipeline"]["hops"] for r in res.records)
    return {"s": total, "eval_s": spent[0], "evals": spent[1], "train_s": total - spent[0],
            "recomputed": recomputed, "hops": hops, "final": run.final_params}


def _time_single(run, args: argparse.Namespace, functional: bool) -> dict[str, Any]:
    """The same rounds in one process: the run's model at its ``params0``, the run's micro-batches
    (its training stream, drawn as ``SwarmRun.run`` draws them), one SGD step a round on the mean
    gradient of the round's micro-batches. ``run`` is a fresh, unrun ``SwarmRun``."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call

    model, spec = run.model, run.spec
    x_all, y_all = run.train_x, run.train_y
    gen = run.torch_rng["train"]  # the run's training stream
    M, B, lr = args.micro_batches, args.micro_batch_size, args.lr
    n = x_all.shape[0]
    t = time.perf_counter()
    if functional:
        flat = run.params0.clone().requires_grad_(True)
        for _ in range(args.rounds):
            for _ in range(M):
                idx = torch.randint(0, n, (B,), generator=gen)
                out = functional_call(model, spec.unflatten(flat), (x_all[idx],))
                F.cross_entropy(out.reshape(-1, out.shape[-1]), y_all[idx].reshape(-1)).backward()
            with torch.no_grad():
                flat -= (lr / M) * flat.grad
            flat.grad = None
        final = flat.detach()
    else:
        params = list(model.parameters())  # in ParamSpec order, at params0
        for _ in range(args.rounds):
            for _ in range(M):
                idx = torch.randint(0, n, (B,), generator=gen)
                out = model(x_all[idx])
                F.cross_entropy(out.reshape(-1, out.shape[-1]), y_all[idx].reshape(-1)).backward()
            with torch.no_grad():
                for p in params:
                    p.sub_(p.grad, alpha=lr / M)
                    p.grad = None
        final = spec.flatten(model).detach()
    return {"s": time.perf_counter() - t, "final": final}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=3, help="pipeline stages (default 3; at most --layers)")
    ap.add_argument("--peers", type=int, default=3, help="peers per stage (default 3)")
    ap.add_argument("--micro-batches", type=int, default=32, help="micro-batches per round, M (default 32)")
    ap.add_argument("--micro-batch-size", type=int, default=8, help="windows per micro-batch (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per run, R (default 3)")
    ap.add_argument("--width", type=int, default=32, help="transformer width (default 32)")
    ap.add_argument("--layers", type=int, default=3, help="transformer blocks (default 3)")
    ap.add_argument("--heads", type=int, default=2, help="attention heads (default 2; must divide --width)")
    ap.add_argument("--context", type=int, default=16, help="window length in bytes (default 16)")
    ap.add_argument("--max-bytes", type=int, default=100_000, help="corpus cap (default 100000)")
    ap.add_argument("--lr", type=float, default=0.2, help="SGD learning rate (default 0.2)")
    ap.add_argument("--routing", default="swarm", choices=("swarm", "round_robin"))
    ap.add_argument("--checks", type=float, default=0.25,
                    help="fraction of hops recomputed in the extra redundant_recompute row (default 0.25; 0: no row)")
    ap.add_argument("--repeats", type=int, default=9, help="timed runs per way, after one warm-up (default 9)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default 1: these models are too small to gain from more; "
                         "0 keeps torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.stages > args.layers:
        ap.error(f"--stages {args.stages}: every stage needs a block (--layers {args.layers})")
    if args.width % args.heads:
        ap.error(f"--heads {args.heads} must divide --width {args.width}")
    if not 0 <= args.checks <= 1:
        ap.error("--checks must be in [0, 1]")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    R, M = args.rounds, args.micro_batches
    mbs = R * M
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU {_cpu_name()} "
          f"({os.cpu_count()} logical cores), python {platform.python_version()}")

    ways: list[tuple[str, str, float | None]] = [("pipeline", "pipeline", None)]
    if args.checks > 0:
        ways.append((f"pipeline + redundant_recompute {args.checks:g}", "pipeline", args.checks))
    ways += [("single process, module", "module", None), ("single process, functional_call", "functional", None)]

    build_s: list[float] = []
    first_run, first_build = _build(args, None)  # reads the corpus (cached after)
    print(f"text transformer: context {args.context}, width {args.width}, {args.layers} layers, {args.heads} heads, "
          f"{first_run.spec.dim:,} parameters; {first_run.train_x.shape[0]:,} training windows, "
          f"{first_run.test_x.shape[0]} held-out")
    print(f"pipeline: {args.stages} stages x {args.peers} peers, {args.routing} routing; {R} rounds x {M} "
          f"micro-batches x {args.micro_batch_size} windows = {mbs} micro-batches a run ({mbs * args.stages} hops), "
          f"lr {args.lr}, attack none, defense mean")

    def one(kind: str, checks: float | None) -> dict[str, Any]:
        run, b = _build(args, checks)
        build_s.append(b)
        if kind == "pipeline":
            return _time_pipeline(run)
        return _time_single(run, args, functional=(kind == "functional"))

    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in ways}
    for label, kind, checks in ways:  # warm-up
        one(kind, checks)
    for _ in range(args.repeats):
        for label, kind, checks in ways:
            results[label].append(one(kind, checks))
    print(f"SwarmRun construction (not timed in the runs): first {first_build:.2f} s (reads the corpus), "
          f"then median {statistics.median(build_s) * 1e3:.1f} ms over {len(build_s)}\n")

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in results[label])

    def paired(label: str, key: str, f) -> float:
        """Median over the repeats of ``f(way's key, module's s)``: each repeat timed the ways back
        to back, so a slow spell of the machine hits both sides of a pair."""
        return statistics.median(f(r[key], m["s"]) for r, m in zip(results[label], results[REF]))

    REF = "single process, module"
    print(f"median of {args.repeats} runs; micro-batches / s = {R} x {M} / s; ratio = the way's micro-batches / s "
          f"(train) over the single-process module's, median of the {args.repeats} paired repeats "
          f"(below 1: slower than one process)\n")
    print("| way | s / run | of which eval s (evals) | train s | micro-batches / s (with eval) | "
          "micro-batches / s (train) | ratio to single process | recomputed stage forwards |")
    print("|---|---|---|---|---|---|---|---|")
    for label, kind, _ in ways:
        s = med(label, "s")
        key = "train_s" if kind == "pipeline" else "s"
        ratio = paired(label, key, lambda a, b: b / a)
        if kind == "pipeline":
            ev, tr = med(label, "eval_s"), med(label, "train_s")
            n_ev = results[label][0]["evals"]
            rec = results[label][0]["recomputed"]
            print(f"| {label} | {s:.3f} | {ev:.3f} ({n_ev}) | {tr:.3f} | {mbs / s:.1f} | {mbs / tr:.1f} | "
                  f"{ratio:.2f} | {rec} |")
        else:
            print(f"| {label} | {s:.3f} | - | {s:.3f} | - | {mbs / s:.1f} | {ratio:.2f} | - |")

    hops = results["pipeline"][0]["hops"]
    over = paired("pipeline", "train_s", lambda a, b: a - b) / hops
    print(f"\npipeline overhead over the plain module: {over * 1e6:.0f} us per hop ({hops} hops a run; "
          f"paired median of (pipeline train s - module s) / hops)")
    if args.checks > 0:
        lab = ways[1][0]
        extra = statistics.median(c["train_s"] - p["train_s"] for c, p in zip(results[lab], results["pipeline"]))
        rec = results[lab][0]["recomputed"]
        per = f", {extra / rec * 1e6:.0f} us per recomputed stage forward" if rec else ""
        print(f"redundant_recompute {args.checks:g}: +{extra / med('pipeline', 'train_s') * 100:.0f} % train time "
              f"({rec} recomputed of {hops} hops{per}; paired median)")
    p0 = first_run.params0
    for label, kind, _ in ways:
        if kind == "pipeline":
            continue
        fin_p, fin_s = results["pipeline"][-1]["final"], results[label][-1]["final"]
        print(f"agreement, pipeline vs {label}: max |difference| of final parameters = "
              f"{float((fin_p - fin_s).abs().max()):.2e} (largest update {float((fin_s - p0).abs().max()):.2e})")


if __name__ == "__main__":
    main()
