"""The full redteam round beside the bare batched round, plain-torch training of the same
federation and a Flower simulation of it, measured interleaved in one run (issue 13's
acceptance; issue 23 §3 and issue 24 §2).

    bash benchmarks/reference/setup.sh                          # once: the references' venv
    python benchmarks/bench_vs_flower.py                        # 20 and 100 clients, 15 rounds, 2 reps
    python benchmarks/bench_vs_flower.py --clients 10 --rounds 4 --reps 2
    python benchmarks/bench_vs_flower.py --no-reference         # our side only
    python benchmarks/bench_vs_flower.py --export fed.npz --clients 20   # only write the federation

**One federation.** redteam builds it (a ``Federation`` of the scenario in
:func:`scenario_doc`: scikit-learn's digits (pixels / 16), a fixed stratified 25 % test split
(1,347 train / 450 test), a per-class Dirichlet(0.5) label partition redrawn until every
client has ≥ 2 samples, the MLP 64-64-10 (4,810 parameters), 10 local SGD steps of batch 16 at
lr 0.1 drawn with replacement, FedAvg weighted by sample counts, the global model scored on
the test split after every round) and writes it to a file: every client's rows, the test
split, the initial weights and every minibatch of every round exactly as redteam's trainer
draws them. The references in ``benchmarks/reference/`` (our code, their own venv) train that
file, so all sides start from the same weights and see the same batches in the same order;
their accuracy curves must agree with ours to float rounding, and the table prints the
largest per-round difference ("Δacc") as the check that the comparison is like for like.

(Before issue 23, the references drew their own split, partition, initial weights and
batches: redteam reached 0.880 / 0.871 after 15 rounds at 20 / 100 clients against their
0.904 / 0.900. Given the same file, a plain per-client torch loop reproduces redteam's
curve round for round (0.880 / 0.871 at 20 / 100 clients, seed 0; final parameters within
2.4e-7 at 20), and over seeds 0..7 of the run and the test split together redteam's own final
accuracy spreads from 0.856 to 0.918 at 20 clients (sd 0.019) and from 0.867 to 0.913 at 100
(sd 0.017): the gap was one draw of split, partition, initialisation and batches against
another, not a difference in training.)

**Our side** (in this process): ``Federation.run`` of that scenario (codec ``none``, defense
``mean``, no attack, no root sample). Its round wall time covers the whole round: batched
local training, encode (error feedback), chunk + SHA-256 + Merkle root + manifest, the
simulated network (every chunk checked against its digest), batched decode with the
receiver's checks, merge, server step and evaluation. After every full round, from the second
on (the first includes lazy initialisation), one **bare round** is timed from the on-round
callback, as ``benchmarks/bench_scale.py`` does: ``BatchedTrainer.train`` of every client
(from the initial model: the cost does not depend on the values), the sample-weighted mean of
the deltas and the step, nothing else (no evaluation: ~0.1 ms here). "full ÷ bare" is the
median of the per-round ratios (each full round and the bare round right after it see the
same load).

**The references**, from their own virtual environment (``$REDTEAM_BENCH_VENV``, default
``/tmp/redteam-bench-venv``, built by ``bash benchmarks/reference/setup.sh``), found next to
this file in ``benchmarks/reference/`` and run as subprocesses that write JSON; this project
never imports them:

* ``fl_federation.py --modes loop vmap``: the federation in plain torch, a Python loop over one
  ``nn.Module`` per client, and ``torch.func.vmap`` over stacked parameters (the bare cost of
  batched training, with evaluation);
* ``flower_sim.py``: Flower's ``run_simulation`` on the Ray backend (one CPU per client actor),
  a fresh process per run; its round is the time between two server-side evaluations, its
  start-up the time from calling ``run_simulation`` to the end of round 1 (Flower evaluates
  the initial model before Ray starts; round 1 starts Ray and creates the actors).

**Interleaved, with the load.** ``--reps`` passes; in each, per client count, the three sides
run one after the other, in reverse order on odd passes (ours, torch, Flower; then Flower,
torch, ours), so that a load that drifts during the run falls on both sides. Every side's
timed rounds (2..R of every pass) give min / median / max, and the 1-minute load average is
read before and after each of its runs. A ratio across processes is printed only when the two
sides' loads (the median over their runs of the load read just before each run: the reading
after includes the run's own processes, and Ray's raise it by themselves) differ by at most
``--load-bound`` (default 0.5): a ratio of two timings says something about the code only if
both sides competed for the cores alike, and on a shared 2-core machine half a runnable
process more on one side moves its timings by tens of percent (issue 23 saw Flower ÷ full
swing from 120× to 8× in one run as the load changed). Otherwise the cell reads "load differs"
and both loads are printed. "full ÷ bare" is always printed (same process, per round).

Every process gets ``OMP_NUM_THREADS = --threads`` (default 1); ours also calls
``torch.set_num_threads``. Ray's actors run one thread each. Our round also does what the
references do not: the simulated network's timing, hashing, verification and decoding of
every update, the merge's checks; Flower's adds serialisation and Ray's message passing. All
sides evaluate every round.

Nothing here is asserted; the machine is shared and the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
#: the reference implementations (our code), next to this file
REFERENCE = os.path.join(HERE, "reference")
#: their virtual environment, built by reference/setup.sh; $REDTEAM_BENCH_VENV overrides
DEFAULT_VENV = "/tmp/redteam-bench-venv"


def venv_python() -> str:
    return os.path.join(os.environ.get("REDTEAM_BENCH_VENV", DEFAULT_VENV), "bin", "python")


def scenario_doc(clients: int, rounds: int, seed: int) -> dict:
    """The compared federation as a redteam scenario (module docstring)."""
    return {
        "scenario": {"name": f"vs-flower-{clients}", "seed": seed},
        "workload": {"name": "digits", "hidden": 64, "test_fraction": 0.25},
        "federation": {"clients": clients, "rounds": rounds, "partition": "dirichlet", "alpha": 0.5,
                       "min_samples": 2, "local_steps": 10, "batch_size": 16, "lr": 0.1,
                       "malicious_fraction": 0.0, "root_samples": 0},
        "transport": {"codec": "none"},
        "attack": {"name": "none"},
        "defense": {"name": "mean"},
    }


def build(clients: int, rounds: int, seed: int):
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    return Federation(parse_scenario(scenario_doc(clients, rounds, seed)), device="cpu")


def export(clients: int, rounds: int, seed: int, path: str) -> None:
    """Write the federation a fresh ``Federation`` of :func:`scenario_doc` will train: every
    client's rows, the test split, the initial flat weights, the learning rate, and the
    minibatch positions of every round and step as ``BatchedTrainer.train`` draws them (its
    ``with_replacement`` branch: per step one ``(n, B)`` float64 draw from the ``train``
    stream, floor(u · size))."""
    import numpy as np
    import torch

    fed = build(clients, rounds, seed)
    loc = fed.local
    fc = fed.scenario.federation
    if (loc.sampling != "with_replacement" or loc.epochs is not None or loc.optimizer != "sgd" or loc.prox_mu
            or loc.weight_decay or fc.clients_per_round or fed.malicious or fed.server_lr != 1.0):
        raise SystemExit("export: the scenario no longer is plain FedAvg with i.i.d. batches; update export()")
    gen = torch.Generator()
    gen.set_state(fed.torch_rng["train"].get_state())  # the stream the run's training will draw from
    n, steps, b = clients, loc.steps, loc.batch_size
    sizes = fed.data.sizes.cpu()
    batches = np.empty((rounds, steps, n, b), dtype=np.int64)
    for r in range(rounds):
        for s in range(steps):
            u = torch.rand((n, b), generator=gen, dtype=torch.float64)
            batches[r, s] = torch.floor(u * sizes[:, None]).to(torch.int64).numpy()
    np.savez(path, x=fed.data.x.cpu().numpy(), y=fed.data.y.cpu().numpy(), offsets=fed.data.offsets.cpu().numpy(),
             sizes=sizes.numpy(), x_test=fed.test_x.cpu().numpy(), y_test=fed.test_y.cpu().numpy(),
             init=fed.params0.cpu().numpy(), hidden=np.int64(fed.workload.hidden), lr=np.float64(loc.lr),
             batches=batches)


def ours(clients: int, rounds: int, seed: int) -> dict:
    """Full rounds of ``Federation.run`` and, interleaved, bare batched rounds."""
    import torch

    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    fed = build(clients, rounds, seed)
    build_s = time.perf_counter() - t
    part_t = torch.arange(clients)
    gen = torch.Generator().manual_seed(seed + 1)  # the bare rounds' own stream
    w = fed.weights / fed.weights.sum()
    full: list[float] = []
    bare: list[float] = []

    def bare_round(params: torch.Tensor) -> float:
        t0 = time.perf_counter()
        local = fed.trainer.train(params, fed.data, part_t, fed.local, gen)
        _ = params + (w[:, None] * (local - params)).sum(0)
        return time.perf_counter() - t0

    def on_round(rec) -> None:
        if rec.round == 0:
            bare_round(fed.params0)  # warm-up, as the full round 1 is
            return
        full.append(rec.wall_time_s)
        bare.append(bare_round(fed.params0))

    res = fed.run(on_round=on_round)
    return {"side": "redteam", "clients": clients, "build_s": build_s, "round1_s": res.records[0].wall_time_s,
            "round_s": full, "bare_round_s": bare, "acc": [r.accuracy for r in res.records],
            "load_before": load0, "load_after": os.getloadavg()[0]}


def _subprocess(label: str, cmd: list[str], env: dict, timeout: int, out: str) -> list[dict]:
    """Run one reference script; its JSON results (empty on failure, with the reason printed)."""
    print(f"  {label}: {' '.join(os.path.basename(c) if i < 2 else c for i, c in enumerate(cmd))}",
          file=sys.stderr, flush=True)
    try:
        p = subprocess.run(cmd, cwd=REFERENCE, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if p.returncode != 0:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            print(f"  ({label} failed, rc {p.returncode}: {' / '.join(tail)})", file=sys.stderr)
    except subprocess.TimeoutExpired:
        print(f"  ({label} ran past {timeout} s)", file=sys.stderr)
    if not os.path.exists(out):
        return []
    with open(out) as fh:
        results = json.load(fh).get("results", [])
    os.unlink(out)
    return results


def spread(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{_ms(min(xs))} / {_ms(statistics.median(xs))} / {_ms(max(xs))}"


def _ms(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def side_load(runs: list[dict]) -> float | None:
    """A side's load: the median over its runs of the load average read just before the run
    (the one after includes the run's own processes: Ray's raylet, GCS and actors raise it
    during a Flower run by themselves)."""
    vals = [r["load_before"] for r in runs if "load_before" in r]
    return statistics.median(vals) if vals else None


def steady(r: dict) -> list[float]:
    return r["round_s"] if r["side"] == "redteam" else r["round_s"][1:]


def report(n: int, rounds: int, sides: dict[str, list[dict]], bound: float, absent: str,
           skipped: tuple[str, ...] = ()) -> None:
    ours_runs = sides["redteam"]
    acc0 = ours_runs[0]["acc"]
    print(f"\n{n} clients, rounds 2..{rounds} of {len(ours_runs)} pass(es): min / median / max per round; "
          "load average before → after each run\n")
    print(f"| side | per round (min / median / max) | load | accuracy after {rounds} rounds | max Δacc vs redteam |")
    print("|---|---|---|---|---|")

    def row(label: str, runs: list[dict], key: str = "round_s") -> None:
        if not runs:
            print(f"| {label} | {'not run' if runs is sides.get('flower') and 'flower' in skipped else absent} | | | |")
            return
        xs = [s for r in runs for s in (r[key] if r["side"] == "redteam" else r[key][1:])]
        loads = ", ".join(f"{r['load_before']:.2f} → {r['load_after']:.2f}" for r in runs)
        accs = " / ".join(f"{r['acc'][-1]:.3f}" for r in runs) if key == "round_s" else "—"
        delta = "—"
        if key == "round_s" and all(len(r["acc"]) == len(acc0) for r in runs):
            delta = f"{max(abs(a - b) for r in runs for a, b in zip(r['acc'], acc0)):.4f}"
        print(f"| {label} | {spread(xs)} | {loads} | {accs} | {delta} |")

    row("redteam full round (Federation.run)", ours_runs)
    row("redteam bare batched round (train + weighted mean + step)", ours_runs, "bare_round_s")
    row("plain torch, vmap round (with evaluation)", sides["vmap"])
    row("plain torch, per-client loop round", sides["loop"])
    row("Flower round, steady (Ray simulation)", sides["flower"])
    fl = sides["flower"]
    if fl:
        starts = [r["startup_s"] for r in fl if r.get("startup_s") is not None]
        print(f"\nFlower start-up (run_simulation called → end of round 1: Ray, the actors, the first round), "
              f"min / median / max: {spread(starts)}")
    full = [s for r in ours_runs for s in r["round_s"]]
    bare = [s for r in ours_runs for s in r["bare_round_s"]]
    print(f"\nfull ÷ bare (same process, median of per-round ratios): "
          f"{statistics.median(f / b for f, b in zip(full, bare)):.2f}×")
    for label, side, flip in (("full ÷ vmap", "vmap", False), ("per-client loop ÷ full", "loop", True),
                              ("Flower ÷ full", "flower", True)):
        if not sides[side]:
            continue
        a, b = (sides[side], ours_runs) if flip else (ours_runs, sides[side])
        print(f"{label}: {ratio_steady(a, b, bound)}")


def ratio_steady(a: list[dict], b: list[dict], bound: float) -> str:
    xa = [s for r in a for s in steady(r)]
    xb = [s for r in b for s in steady(r)]
    la, lb = side_load(a), side_load(b)
    loads = f"loads {la:.2f} and {lb:.2f}"
    if abs(la - lb) > bound:
        return f"not printed: {loads} differ by more than ±{bound:g}"
    q = statistics.median(xa) / statistics.median(xb)
    return (f"{q:.2f}×" if q < 100 else f"{q:,.0f}×") + f" (medians; {loads})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 100], help="client counts (≤ 100: digits)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds per run (≥ 3; round 1 is not counted)")
    ap.add_argument("--reps", type=int, default=2, help="interleaved passes (odd passes run the sides in reverse)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of every process (OMP_NUM_THREADS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-reference", action="store_true", help="time our side only")
    ap.add_argument("--no-flower", action="store_true", help="leave Flower out (plain torch only)")
    ap.add_argument("--load-bound", type=float, default=0.5,
                    help="largest difference of two sides' load averages for which a ratio is printed")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds allowed to each reference run")
    ap.add_argument("--export", metavar="PATH", help="only write the federation of the first --clients to PATH")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args(argv)
    if args.rounds < 3:
        ap.error(f"--rounds = {args.rounds}: must be ≥ 3 (round 1 is start-up, the median needs rounds 2..R)")
    if any(not 1 <= c <= 100 for c in args.clients):
        ap.error(f"--clients = {args.clients}: each must be in [1, 100] (digits)")
    if args.threads < 1 or args.reps < 1:
        ap.error("--threads and --reps must be ≥ 1")

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    if args.export:
        export(args.clients[0], args.rounds, args.seed, args.export)
        print(f"wrote {args.export}: {args.clients[0]} clients, {args.rounds} rounds, seed {args.seed}")
        return
    python = venv_python()
    have_ref = not args.no_reference and os.path.exists(python)
    print(f"cores {os.cpu_count()}, {args.threads} intra-op thread(s) per process, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.2f} at start; references: "
          + (f"{REFERENCE} with {python}" if have_ref else "not run"), flush=True)
    if not args.no_reference and not have_ref:
        print(f"(references skipped: no venv at {os.path.dirname(os.path.dirname(python))}; build it with "
              "`bash benchmarks/reference/setup.sh` ($REDTEAM_BENCH_VENV chooses where), then run this again)")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "FLWR_TELEMETRY_ENABLED": "0",
           "PYTHONPATH": REFERENCE}
    sides = {n: {"redteam": [], "loop": [], "vmap": [], "flower": []} for n in args.clients}
    with tempfile.TemporaryDirectory() as tmp:
        feds = {}
        if have_ref:
            for n in args.clients:
                feds[n] = os.path.join(tmp, f"fed{n}.npz")
                export(n, args.rounds, args.seed, feds[n])

        def run_ours(n: int) -> None:
            o = ours(n, args.rounds, args.seed)
            sides[n]["redteam"].append(o)
            print(f"  redteam {n} clients: full {_ms(statistics.median(o['round_s']))}, "
                  f"bare {_ms(statistics.median(o['bare_round_s']))}", file=sys.stderr, flush=True)

        def run_torch(n: int) -> None:
            out = os.path.join(tmp, "torch.json")
            cmd = [python, "fl_federation.py", "--federation", feds[n], "--modes", "loop", "vmap",
                   "--threads", str(args.threads), "--json", out]
            for r in _subprocess(f"plain torch, {n} clients", cmd, env, args.timeout, out):
                sides[n][r["mode"]].append({**r, "side": r["mode"]})

        def run_flower(n: int) -> None:
            out = os.path.join(tmp, "flower.json")
            cmd = [python, "flower_sim.py", "--federation", feds[n], "--json", out]
            for r in _subprocess(f"Flower, {n} clients", cmd, env, args.timeout, out):
                sides[n]["flower"].append({**r, "side": "flower"})

        for rep in range(args.reps):
            for n in args.clients:
                order = [run_ours] + ([run_torch] if have_ref else []) + (
                    [run_flower] if have_ref and not args.no_flower else [])
                for fn in (order if rep % 2 == 0 else order[::-1]):
                    fn(n)
    print(f"load average {os.getloadavg()[0]:.2f} at the end; ratios across processes only where the two "
          f"sides' loads differ by ≤ {args.load_bound:g}")
    absent = "failed" if have_ref else "not run"
    for n in args.clients:
        report(n, args.rounds, sides[n], args.load_bound, absent, ("flower",) if args.no_flower else ())
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({str(n): s for n, s in sides.items()}, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
