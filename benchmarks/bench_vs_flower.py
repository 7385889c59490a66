"""The full redteam round beside the bare batched round, plain-torch training of the same
federation and a Flower simulation of it, all measured in one run (issue 13's acceptance).

    python benchmarks/bench_vs_flower.py                       # 20 and 100 clients, 15 rounds
    python benchmarks/bench_vs_flower.py --clients 20 --rounds 10
    python benchmarks/bench_vs_flower.py --no-reference        # our side only

The federation is the one in ``fl_common.py`` of the reference-bench directory named by
``$PA_REFERENCE_DIR`` (not part of this repository): scikit-learn's
digits (pixels / 16), a per-class Dirichlet(0.5) label partition, the MLP 64-64-10 (4,810
parameters), 10 local SGD steps of batch 16 at lr 0.1 drawn with replacement, FedAvg
weighted by sample counts, the global model scored on the test split after every round.

**Our side** (in this process, one size after the other): ``Federation.run`` on a scenario
with those settings (codec ``none``, defense ``mean``, no attack, no root sample). Its round
wall time covers the whole round: batched local training, encode (error feedback), chunk +
SHA-256 + Merkle root + manifest, the simulated network (every chunk checked against its
digest), batched decode with the receiver's checks, merge, server step and evaluation. After
every full round, from the second on (the first includes lazy initialisation), one **bare
round** is timed from the on-round callback, as ``benchmarks/bench_scale.py`` does:
``BatchedTrainer.train`` of every client (from the initial model: the cost does not depend on
the values), the sample-weighted mean of the deltas and the step, nothing else (no evaluation:
~0.1 ms here). Our side runs twice, before and after the references, so that a change of the
machine's load while they ran shows as a gap between the two (both are printed); the table
pools the two: medians over rounds 2..R of both runs; "full ÷ bare" is the median of the
per-round ratios (each full round and the bare round right after it see the same load).

**The references**, right after ours, from their own virtual environment (``$PA_VENV``,
default ``pa-venv`` in the temp dir, built by ``bash $PA_REFERENCE_DIR/setup.sh``)
as subprocesses writing JSON; this project never imports them:

* ``bench_torch_fl.py --modes loop vmap``: the same federation in plain torch, a Python loop
  over one ``nn.Module`` per client, and ``torch.func.vmap`` over stacked parameters (the bare
  cost of batched training, with evaluation); steady rounds 2..R;
* ``bench_flower.py``: Flower 1.41 ``run_simulation`` on the Ray backend (one CPU per client
  actor); its round is the time between two server-side evaluations (steady: rounds 2..R), its
  start-up the time from ``run_simulation`` to the first client's first call.

Every process gets ``OMP_NUM_THREADS = --threads`` (default 1, what ``--threads auto`` gives a
digits run); ours also calls ``torch.set_num_threads``. Ray's actors run one thread each.

Where our federation differs from fl_common's (same sizes, not the same bytes):

* the test split: both 25 % stratified (1,347 train / 450 test), ours drawn with its own seed
  (the digits workload's ``test_fraction = 0.25``), theirs by sklearn's ``train_test_split``;
* the partition: the same rule (per class p ~ Dir(0.5·1ₙ), redrawn until every client has ≥ 2
  samples) from a different random stream, so client sizes differ;
* initial weights (our workload's initialiser, seeded) and minibatch indices (our own stream);
* our round also runs what the references do not: the simulated network's timing, hashing,
  verification and decoding of every update, the merge's checks; Flower's adds serialisation
  and Ray's message passing. All three evaluate every round.

Measured on this project's 2-core machine (shared; load average 1.0 at the start, 2.2 at the
end), one run of ``python benchmarks/bench_vs_flower.py --rounds 15`` (72 s in all); medians
of rounds 2..15, ours pooled from its passes before and after the references:

    | clients | redteam full | redteam bare | full ÷ bare | reference vmap | full ÷ vmap |
    |---|---|---|---|---|---|
    | 20  | 18.7 ms | 14.3 ms | 1.25× | 13.0 ms | 1.44× |
    | 100 | 52.3 ms | 40.8 ms | 1.30× | 33.7 ms | 1.55× |

    | clients | per-client loop | Flower round (steady) | Flower start-up | Flower ÷ redteam full |
    |---|---|---|---|---|
    | 20  | 54.5 ms  | 311 ms  | 6.40 s | 16.7× |
    | 100 | 276.1 ms | 1.07 s  | 7.43 s | 20.4× |

Final accuracy after 15 rounds: redteam 0.880 / 0.871, the three references 0.904 / 0.900
(the same model on a different split, partition and initialisation). "full ÷ bare", timed
interleaved, held in a second run whose load rose from 2.1 to 5.5 while it ran (1.15× / 1.31×);
the ratios across processes did not (Flower ÷ redteam full 4.9× / 11.8× there: our second pass
ran 2–3× slower than our first, Flower's two actors less so), so read those with the load.

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

REFERENCE = os.environ.get("PA_REFERENCE_DIR", "")  # the reference-bench directory, outside the repository


def scenario_doc(clients: int, rounds: int, seed: int) -> dict:
    """fl_common's federation as a redteam scenario (module docstring: what differs)."""
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


def ours(clients: int, rounds: int, seed: int) -> dict:
    """Full rounds of ``Federation.run`` and, interleaved, bare batched rounds."""
    import torch

    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    t = time.perf_counter()
    fed = Federation(parse_scenario(scenario_doc(clients, rounds, seed)), device="cpu")
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
    return {"clients": clients, "rounds": rounds, "build_s": build_s, "round1_s": res.records[0].wall_time_s,
            "full_rounds_s": full, "bare_rounds_s": bare, "acc": res.records[-1].accuracy,
            "sizes": [int(s) for s in fed.data.sizes.tolist()]}


def pooled(runs: list[dict]) -> dict:
    """Medians over the timed rounds of every run of one size (before and after the references)."""
    full = [s for r in runs for s in r["full_rounds_s"]]
    bare = [s for r in runs for s in r["bare_rounds_s"]]
    return {
        "clients": runs[0]["clients"], "rounds": runs[0]["rounds"], "acc": runs[0]["acc"],
        "full_s": statistics.median(full), "bare_s": statistics.median(bare),
        "full_over_bare": statistics.median(f / b for f, b in zip(full, bare)),
        "per_run": [(statistics.median(r["full_rounds_s"]), statistics.median(r["bare_rounds_s"])) for r in runs],
    }


def references(python: str, clients: list[int], rounds: int, reps: int, env: dict, tmp: str,
               timeout: int) -> tuple[dict, dict]:
    """(plain-torch cells keyed by (mode, clients), Flower runs keyed by clients) from the venv."""
    torch_json, flower_json = os.path.join(tmp, "torch_fl.json"), os.path.join(tmp, "flower.json")
    cs = [str(c) for c in clients]
    runs = [
        ("plain torch (loop, vmap)", [python, "bench_torch_fl.py", "--clients", *cs, "--modes", "loop", "vmap",
                                      "--rounds", str(rounds), "--reps", str(reps), "--json", torch_json]),
        ("Flower simulation", [python, "bench_flower.py", "--clients", *cs, "--rounds", str(rounds),
                               "--reps", str(reps), "--logdir", os.path.join(tmp, "flower_logs"),
                               "--json", flower_json]),
    ]
    for label, cmd in runs:
        print(f"  {label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        try:
            out = subprocess.run(cmd, cwd=REFERENCE, env=env, capture_output=True, text=True, timeout=timeout,
                                 check=False)
            if out.returncode != 0:
                tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
                print(f"  ({label} failed, rc {out.returncode}: {' / '.join(tail)})", file=sys.stderr)
        except subprocess.TimeoutExpired:
            print(f"  ({label} ran past {timeout} s)", file=sys.stderr)
    torch_cells: dict = {}
    flower_runs: dict = {}
    if os.path.exists(torch_json):
        with open(torch_json) as fh:
            for cell in json.load(fh).get("results", []):
                torch_cells[(cell["mode"], cell["clients"])] = cell
    if os.path.exists(flower_json):
        with open(flower_json) as fh:
            for r in json.load(fh).get("results", []):
                if "error" in r:
                    log = r.get("log")
                    if log and os.path.exists(log):
                        with open(log) as lf:
                            last = lf.read().strip().splitlines()[-3:]
                        print(f"  (Flower at {r['clients']} clients failed: {' / '.join(last)})", file=sys.stderr)
                    continue
                flower_runs.setdefault(r["clients"], []).append(r)
    return torch_cells, flower_runs


def _ms(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _x(a: float | None, b: float | None) -> str:
    if not (a and b):
        return "—"
    return f"{a / b:.2f}×" if a / b < 100 else f"{a / b:,.0f}×"


def table(o: dict, torch_cells: dict, flower_runs: list[dict] | None, absent: str) -> None:
    """One side-by-side table for one client count; ``absent`` fills a reference's empty cells."""
    n = o["clients"]
    full = o["full_s"]
    loop, vmap = torch_cells.get(("loop", n)), torch_cells.get(("vmap", n))
    fl_steady = fl_start = fl_acc = None
    if flower_runs:
        fl_steady = statistics.median(s for r in flower_runs for s in r["round_s"][1:])
        starts = [r["startup_s"] for r in flower_runs if r.get("startup_s") is not None]
        fl_start = statistics.median(starts) if starts else None
        fl_acc = statistics.median(r["acc"][-1] for r in flower_runs)

    def acc(cell: dict | None) -> str:
        return f"{statistics.median(cell['final_acc']):.3f}" if cell else "—"

    rows = [
        ("redteam full round (Federation.run)", _ms(full), "1", f"{o['acc']:.3f}"),
        ("redteam bare batched round (train + weighted mean + step)", _ms(o["bare_s"]), _x(o["bare_s"], full), "—"),
        ("reference bare vmap round (plain torch, with evaluation)",
         _ms(vmap["median"]) if vmap else absent, _x(vmap["median"], full) if vmap else "—", acc(vmap)),
        ("reference per-client loop (plain torch)",
         _ms(loop["median"]) if loop else absent, _x(loop["median"], full) if loop else "—", acc(loop)),
        ("Flower 1.41 round, steady (Ray simulation)",
         _ms(fl_steady) if fl_steady else absent, _x(fl_steady, full), f"{fl_acc:.3f}" if fl_acc else "—"),
        ("Flower start-up (run_simulation → first client call, once)",
         _ms(fl_start) if fl_start else absent, _x(fl_start, full), "—"),
    ]
    runs = " and ".join(f"full {_ms(f)} / bare {_ms(b)}" for f, b in o["per_run"])
    where = "before and after the references, pooled" if len(o["per_run"]) > 1 else "one run"
    print(f"\n{n} clients, medians of rounds 2..{o['rounds']} (redteam: {where}: {runs})\n")
    print(f"| | per round | ÷ redteam full | accuracy after {o['rounds']} rounds |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\nfull ÷ bare: {o['full_over_bare']:.2f}× (median of per-round ratios; "
          f"{_x(full, o['bare_s'])} of medians); full ÷ reference vmap: "
          f"{_x(full, vmap['median']) if vmap else '—'}; Flower ÷ redteam full: {_x(fl_steady, full)}; "
          f"per-client loop ÷ redteam full: {_x(loop['median'], full) if loop else '—'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 100], help="client counts (≤ 100: digits)")
    ap.add_argument("--rounds", type=int, default=15, help="rounds per run (≥ 3; round 1 is not counted)")
    ap.add_argument("--reps", type=int, default=1, help="whole runs per reference cell")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of every process (OMP_NUM_THREADS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-reference", action="store_true", help="time our side only")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds allowed to each reference script")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error(f"--rounds = {args.rounds}: must be ≥ 3 (round 1 is start-up, the median needs rounds 2..R)")
    if any(not 1 <= c <= 100 for c in args.clients):
        ap.error(f"--clients = {args.clients}: each must be in [1, 100] (the references use digits up to 100)")
    if args.threads < 1:
        ap.error(f"--threads = {args.threads}: must be ≥ 1")

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    print(f"cores {os.cpu_count()}, {args.threads} intra-op thread(s) per process, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    mine: dict[int, list[dict]] = {n: [] for n in args.clients}

    def our_side(when: str) -> None:
        for n in args.clients:
            o = ours(n, args.rounds, args.seed)
            mine[n].append(o)
            print(f"  redteam {n} clients ({when}): full {_ms(statistics.median(o['full_rounds_s']))}, "
                  f"bare {_ms(statistics.median(o['bare_rounds_s']))}", file=sys.stderr, flush=True)

    our_side("before the references")
    load_ours = os.getloadavg()[0]

    torch_cells: dict = {}
    flower_runs: dict = {}
    venv = os.environ.get("PA_VENV", os.path.join(tempfile.gettempdir(), "pa-venv"))
    python = os.path.join(venv, "bin", "python")
    have_ref = not args.no_reference and bool(REFERENCE) and os.path.exists(python) and os.path.isdir(REFERENCE)
    if not args.no_reference and not have_ref:
        print(f"\n(references skipped: set PA_REFERENCE_DIR to the reference-bench directory and build its venv "
              f"with `bash $PA_REFERENCE_DIR/setup.sh` (PA_VENV chooses where; now: {venv}), then run this again)")
    if have_ref:
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        with tempfile.TemporaryDirectory() as tmp:
            torch_cells, flower_runs = references(python, args.clients, args.rounds, args.reps, env, tmp,
                                                  args.timeout)
        after = f", {os.getloadavg()[0]:.1f} after the references"
        our_side("after the references")  # brackets the references: a load change shows as a gap
        after += f", {os.getloadavg()[0]:.1f} after our second pass"
    else:
        after = ""
    print(f"load average {load_ours:.1f} after our side{after}")
    absent = "failed" if have_ref else "not run" if args.no_reference else "no venv"
    for n in args.clients:
        table(pooled(mine[n]), torch_cells, flower_runs.get(n), absent)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"redteam": [o for n in args.clients for o in mine[n]], "torch_fl": [dict(c) for c in torch_cells.values()],
                       "flower": [r for rs in flower_runs.values() for r in rs]}, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
