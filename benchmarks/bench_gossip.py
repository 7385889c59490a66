"""Serverless gossip beside the synchronous data-parallel round: rounds per second of each on the
same workload and clients, and the gossip step alone, batched against the per-node loop.

    python benchmarks/bench_gossip.py            # the tables below (a few minutes on 2 cores)
    python benchmarks/bench_gossip.py --quick    # fewer rounds and repeats
    python benchmarks/bench_gossip.py --nodes 20 --topology complete
    python benchmarks/bench_gossip.py --server-rules-only          # the server rules' table alone
    python benchmarks/bench_gossip.py --server-rules-only --server-d 10000 100000 --repeats 5

Workload: ``digits`` (the MLP, d = 4810), ``--nodes`` clients (20 and 100), iid partition, local
training 10 steps of batch 16 at lr 0.1 (the setting the speed targets use), no attack.

* **full round** — ``make_run(parse_scenario(doc)).run()``, the records' ``wall_time_s``: the data-parallel federation (training batched over the
  clients, transport, the server's ``mean``, one evaluation of the global model) beside the
  ``[gossip]`` regime on the same clients (``--topology``, default ``exponential``: degree
  2⌈log₂ n⌉ − 1 or so; one gossip step; training batched over the nodes, every node's merge by the
  rule, and an evaluation of *every* honest node's model, which a server round does once). The
  gossip step's own share is the records' ``defense_time_s``.
* **gossip step** — one :func:`redteam.federation.gossip.gossip_step` on models of dimension d
  (the nodes' models after a round), 10 % of the nodes Byzantine sending noise, batched (today's
  step: ``mean`` as one matrix product, ClippedGossip / CS+ / IOS over the padded neighbourhoods)
  against the per-node loop it replaced (each node's rule called on its own rows;
  ``geometric_median`` runs node by node in both: its ratio shows how much the machine's noise
  alone moves a ratio). The Byzantine nodes' noise is drawn once, before the timing, and handed
  to the step ready made: its drawing (``torch.randn`` of every Byzantine neighbourhood, about as
  costly as a ``mean`` step at d = 4810) is the attacker's work, timed on its own in the table's
  last column, not the gossip step's.
* **server rules over neighbourhoods** — one gossip step with ``median``, ``trimmed_mean`` (b = the
  most Byzantine neighbours a node has), ``krum`` and ``multi_krum`` (their defaults), batched
  (:mod:`defenses._gossip_batch`: every neighbourhood of a chunk of nodes at once) against the
  per-node loop, 100 nodes on an exponential graph (degree 14) and an Erdős–Rényi graph
  (p = 0.15: degrees vary), 10 % Byzantine nodes sending noise, d = 10⁴ and 10⁵; the two called
  alternately, ``--repeats`` times each: median wall time [min – max], and whether the models are
  bit for bit the loop's (they must be).

Full rounds: the fastest round (after each run's first; its gossip step beside it) over 3 runs
of each configuration, the configurations run in turn. One step: the fastest of the
repeats, the two implementations called alternately (on a shared machine the minimum is the least
disturbed figure). The machine's load average and CPU model are printed first and the load
average again at the end. Nothing here is asserted: this is a measurement.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import numpy as np
import redteam  # noqa: F401  (before torch: its OMP_WAIT_POLICY reaches OpenMP)
import torch

from _timing import cpu_name
from redteam.federation import graphs
from redteam.federation.gossip import StepResult, _merge_node, _neighbourhood, gossip_step
from redteam.federation.regimes import make_run
from redteam.registry import DEFENSES
from redteam.scenario import parse_scenario

BASE = {"scenario": {"seed": 0}, "workload": {"name": "digits"},
        "federation": {"clients": 20, "rounds": 6, "local_steps": 10, "batch_size": 16, "lr": 0.1,
                       "partition": "iid", "min_samples": 1},
        "attack": "none", "defense": "mean"}


def round_rate(nodes: int, rounds: int, gossip: dict | None, defense: str | dict = "mean") -> dict:
    doc = copy.deepcopy(BASE)
    doc["federation"].update(clients=nodes, rounds=rounds)
    doc["defense"] = defense
    if gossip is not None:
        doc["gossip"] = gossip
    res = make_run(parse_scenario(doc)).run()
    recs = res.records[1:]  # the first round includes lazy initialisation
    fastest = min(recs, key=lambda r: r.wall_time_s)  # the round least disturbed by other work
    wall, step = fastest.wall_time_s, fastest.defense_time_s
    return {"round_ms": wall * 1e3, "rps": 1.0 / wall, "step_ms": step * 1e3, "accuracy": res.records[-1].accuracy}


def per_node_loop(x, adj, w, merging, defense, messages, byzantine) -> StepResult:
    """The per-node loop the batched step replaced (each node's rule on its own rows, in turn)."""
    res = StepResult(x.clone())
    gen = torch.Generator().manual_seed(0)
    for i in merging:
        hon, byz = _neighbourhood(adj, i, byzantine)
        sent = messages(i, hon, byz).to(x.dtype) if byz else None
        _merge_node(x, w, i, hon, byz, sent, defense, res, 0, gen, {})
    return res


def gossip_case(nodes: int, topology: str, d: int, **graph_args):
    """The timed step's inputs, seeded: (adjacency, mixing matrix, models, merging nodes, the
    Byzantine set, their send function, the most Byzantine neighbours of a merging node). The
    send function hands out messages drawn here, once (:func:`draw_messages`), so that the step's
    timing holds the step only."""
    rng = np.random.default_rng(0)
    adj = graphs.build_graph(topology, nodes, rng, **graph_args)
    byz = sorted(rng.choice(nodes, size=max(1, nodes // 10), replace=False).tolist())
    claimed = adj.sum(1)
    claimed[byz] = 1
    w = graphs.mixing_matrix(adj, degrees=claimed)
    x = torch.randn(nodes, d, generator=torch.Generator().manual_seed(0))
    merging = [i for i in range(nodes) if i not in byz]

    bset = frozenset(byz)
    drawn = draw_messages(x, adj, merging, bset)

    def send(i, hon, b):
        return drawn[i]

    b = int(max(adj[i, byz].sum() for i in merging))
    return adj, w, x, merging, bset, send, b


def draw_messages(x: torch.Tensor, adj: np.ndarray, merging: list[int], byzantine: frozenset[int]
                  ) -> dict[int, torch.Tensor]:
    """The noise each merging node receives from its Byzantine neighbours: its own model plus
    5 × N(0, 1) per Byzantine neighbour, seeded by the node (the attacker's work)."""
    out = {}
    for i in merging:
        byz = _neighbourhood(adj, i, byzantine)[1]
        if byz:
            out[i] = x[i] + 5.0 * torch.randn(len(byz), x.shape[1], generator=torch.Generator().manual_seed(i))
    return out


def message_ms(nodes: int, topology: str, d: int, repeats: int, **graph_args) -> float:
    """The fastest of ``repeats`` drawings of every Byzantine message of one step (ms)."""
    adj, _, x, merging, bset, _, _ = gossip_case(nodes, topology, d, **graph_args)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        draw_messages(x, adj, merging, bset)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def step_times(nodes: int, topology: str, d: int, repeats: int) -> list[tuple[str, float, float]]:
    adj, w, x, merging, bset, send, b = gossip_case(nodes, topology, d, probability=0.3, bridges=2)
    out = []
    for name, params in (("mean", {}), ("clipped_gossip", {"b": b}), ("cs_plus", {"b": b}), ("ios", {"b": b}),
                         ("geometric_median", {})):
        rule = DEFENSES.create(name, params)
        batched, looped = interleaved(lambda: gossip_step(x, adj, w, merging, rule, send, bset),
                                      lambda: per_node_loop(x, adj, w, merging, rule, send, bset), repeats)
        out.append((f"{name}" + (f" (b = {b})" if "b" in params else ""), batched, looped))
    return out


def server_rule_times(nodes: int, topology: str, d: int, repeats: int
                      ) -> list[tuple[str, list[float], list[float], bool]]:
    """One step of each server rule, batched and by the per-node loop, called alternately: (label,
    batched times, loop times, models bit for bit equal)."""
    adj, w, x, merging, bset, send, b = gossip_case(nodes, topology, d, probability=0.15)
    out = []
    for name, params in (("median", {}), ("trimmed_mean", {"b": b}), ("krum", {}), ("multi_krum", {})):
        rule = DEFENSES.create(name, params)
        same = torch.equal(gossip_step(x, adj, w, merging, rule, send, bset).models,
                           per_node_loop(x, adj, w, merging, rule, send, bset).models)
        ta, tb = [], []
        for _ in range(repeats):
            for fn, times in ((lambda: gossip_step(x, adj, w, merging, rule, send, bset), ta),
                              (lambda: per_node_loop(x, adj, w, merging, rule, send, bset), tb)):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        out.append((name + (f" (b = {b})" if "b" in params else ""), ta, tb, same))
    return out


def _spread(times: list[float]) -> str:
    return f"{statistics.median(times) * 1e3:.0f} [{min(times) * 1e3:.0f} – {max(times) * 1e3:.0f}]"


def server_rules_table(nodes: int, dims: list[int], repeats: int) -> None:
    print(f"\n## Server rules over gossip neighbourhoods: one step, {nodes} nodes, 10 % Byzantine nodes sending "
          f"noise; batched vs per-node loop, {repeats} alternating calls each\n")
    print("| graph | d | rule | batched ms median [min – max] | loop ms median [min – max] | loop / batched "
          "(medians) | bit for bit | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|")
    for topology in ("exponential", "erdos_renyi"):
        for d in dims:
            for name, ta, tb, same in server_rule_times(nodes, topology, d, repeats):
                load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
                ratio = statistics.median(tb) / statistics.median(ta)
                print(f"| {topology} | {d} | {name} | {_spread(ta)} | {_spread(tb)} | {ratio:.2f}x | "
                      f"{'yes' if same else 'NO'} | {load:.2f} |", flush=True)


def interleaved(a, b, repeats: int) -> tuple[float, float]:
    """The fastest of ``repeats`` timed calls of each, alternating a and b (after a warm-up of
    each), so that a change of the machine's load hits both alike; the minimum is the figure
    least disturbed by other work on a shared machine."""
    a()
    b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, times in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return min(ta), min(tb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", type=int, nargs="*", default=[20, 100])
    ap.add_argument("--topology", default="exponential", choices=graphs.TOPOLOGIES)
    ap.add_argument("--server-rules-only", action="store_true", help="only the server rules' table")
    ap.add_argument("--server-nodes", type=int, default=100)
    ap.add_argument("--server-d", type=int, nargs="*", default=[10000, 100000])
    ap.add_argument("--repeats", type=int, default=None, help="calls of each variant in the server rules' table")
    args = ap.parse_args()
    rounds = 4 if args.quick else 8
    reps = 3 if args.quick else 15
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    server_reps = args.repeats or (3 if args.quick else 5)
    if args.server_rules_only:
        server_rules_table(args.server_nodes, args.server_d, server_reps)
        load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
        print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        return

    print(f"## Full round, digits (d = 4810), 10 local steps x batch 16, no attack; gossip on {args.topology}, "
          "1 step\n")
    print("| nodes | regime | rule | round ms | rounds/s | of which gossip step ms | final accuracy |")
    print("|---|---|---|---|---|---|---|")
    trials = 1 if args.quick else 3
    for n in args.nodes:
        g = {"topology": args.topology, "attackers": 0, "steps": 1, "bridges": 2}
        configs = [("data-parallel (server)", "mean", None, "mean"), ("gossip", "mean", g, "mean"),
                   ("gossip", "cs_plus (b = 1)", g, {"name": "cs_plus", "b": 1})]
        best: dict[int, dict] = {}
        for _ in range(trials):  # the configurations in turn, so that a change of load hits each alike
            for k, (_, _, gossip, rule) in enumerate(configs):
                r = round_rate(n, rounds, gossip, rule)
                if k not in best or r["round_ms"] < best[k]["round_ms"]:
                    best[k] = r
        for k, (regime, label, _, _) in enumerate(configs):
            r = best[k]
            print(f"| {n} | {regime} | {label} | {r['round_ms']:.1f} | {r['rps']:.2f} | {r['step_ms']:.2f} | "
                  f"{r['accuracy']:.3f} |")

    print(f"\n## One gossip step, d = 4810, {args.topology}, 10 % Byzantine nodes sending noise (drawn before the "
          "timing; the drawing, the attacker's work, timed apart)\n")
    print("| nodes | rule | batched ms (min) | per-node loop ms (min) | loop / batched | attacker's messages ms (min) |")
    print("|---|---|---|---|---|---|")
    for n in args.nodes:
        drawing = message_ms(n, args.topology, 4810, reps, probability=0.3, bridges=2)
        for name, batched, looped in step_times(n, args.topology, 4810, reps):
            print(f"| {n} | {name} | {batched * 1e3:.2f} | {looped * 1e3:.2f} | {looped / batched:.1f}x | "
                  f"{drawing:.2f} |")
    server_rules_table(args.server_nodes, args.server_d, server_reps)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"\nload average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
