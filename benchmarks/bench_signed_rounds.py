"""What signed update headers and the provenance gate cost in a federated round.

    OMP_NUM_THREADS=1 python benchmarks/bench_signed_rounds.py   # 20 and 100 clients on digits
    OMP_NUM_THREADS=1 python benchmarks/bench_signed_rounds.py --quick  # 20 clients, fewer rounds

For each client count: the CPU time per round (process time; on a shared machine the
wall time mostly measures the neighbours) and the median wall time of a round with
``mean`` alone and with
``signed_chunks`` (every client signs its header, the server verifies it: P-256 ECDSA over
an in-toto statement in a DSSE envelope), the time spent signing and verifying, the
header bytes per client with and without signatures, and the one-off admission time of
``provenance_gate`` (manifests over every client's shards, signatures, one ledger
transaction, inclusion proofs, attestation). Figures are medians over rounds after a
warm-up run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

from redteam.federation.loop import Federation
from redteam.scenario import parse_scenario


def _scenario(clients: int, rounds: int, defense: list[str]):
    return parse_scenario({
        "scenario": {"seed": 0},
        "workload": {"name": "digits"},
        "federation": {"clients": clients, "rounds": rounds, "partition": "iid", "local_steps": 10,
                       "batch_size": 16, "min_samples": 1},
        "defense": {"pipeline": [{"name": d} for d in defense]},
    })


def measure(clients: int, rounds: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for label, defense in (("plain", ["mean"]), ("signed", ["signed_chunks", "mean"])):
        Federation(_scenario(clients, 1, defense)).run()  # warm-up
        fed = Federation(_scenario(clients, rounds, defense))
        cpu = time.process_time()
        recs = fed.run().records
        out[f"{label}_round_cpu_ms"] = 1e3 * (time.process_time() - cpu) / rounds
        out[f"{label}_round_ms"] = 1e3 * statistics.median(r.wall_time_s for r in recs)
        out[f"{label}_header_B"] = statistics.median(r.extra["header_bytes"] for r in recs) / clients
        out[f"{label}_wire_kB"] = statistics.median(r.bytes_on_wire for r in recs) / 1e3
        if label == "signed":
            out["sign_ms"] = 1e3 * statistics.median(r.extra["sign_s"] for r in recs)
            out["verify_ms"] = 1e3 * statistics.median(r.extra["verify_s"] for r in recs)
    t = time.perf_counter()
    fed = Federation(_scenario(clients, 1, ["provenance_gate", "mean"]))
    out["federation_with_gate_init_ms"] = 1e3 * (time.perf_counter() - t)
    out["gate_admission_ms"] = 1e3 * fed.admission.time_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sizes, rounds = ((20,), 5) if args.quick else ((20, 100), 10)
    for n in sizes:
        m = measure(n, rounds)
        over = m["signed_round_cpu_ms"] - m["plain_round_cpu_ms"]
        print(f"clients={n}: round CPU {m['plain_round_cpu_ms']:.1f} ms plain, {m['signed_round_cpu_ms']:.1f} ms "
              f"signed (+{over:.1f} ms; wall {m['plain_round_ms']:.0f} / {m['signed_round_ms']:.0f} ms; sign "
              f"{m['sign_ms']:.2f} ms, verify {m['verify_ms']:.2f} ms for all clients); "
              f"header {m['plain_header_B']:.0f} B -> {m['signed_header_B']:.0f} B per client; wire "
              f"{m['plain_wire_kB']:.1f} kB -> {m['signed_wire_kB']:.1f} kB "
              f"(+{100 * (m['signed_wire_kB'] / m['plain_wire_kB'] - 1):.1f} %); "
              f"gate admission {m['gate_admission_ms']:.1f} ms once")


if __name__ == "__main__":
    main()
