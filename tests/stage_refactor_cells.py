"""The cells of the stage-refactor regression fixture (tests/data/stage_refactor.json).

Each cell is a scenario document small enough to run in well under a second, chosen so
that together they walk every path of the round loop: codecs none / int8 / top-k with
error feedback, churn, a deadline with stragglers, a depth-2 hierarchy with random
grouping (and a rogue sub-aggregator), signed chunks, the provenance gate, transport
attacks, server data (FLTrust, loss check), FedAdam and Nesterov server steps, an
omniscient attack, and ``local_epochs``. The defenses are ones whose arithmetic is not
expected to change (mean, norm_bound, median, fltrust, loss_check, cosine_filter,
signed_chunks, provenance_gate).

The fixture was recorded from the loop *before* it was split into stages
(commit c049ecd), by running this module: ``python tests/stage_refactor_cells.py``
(with ``PYTHONPATH`` pointing at that checkout). Re-record only for an intended
numerical change elsewhere (an attack's or codec's arithmetic), and say so in the commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "data" / "stage_refactor.json"

_FED = {"clients": 8, "rounds": 3, "local_steps": 2, "batch_size": 8, "lr": 0.2, "malicious_fraction": 0.25,
        "partition": "iid"}
_WL = {"name": "digits", "hidden": 16}


def _cell(federation: dict | None = None, transport: dict | None = None, hierarchy: dict | None = None,
          attack: Any = "none", defense: Any = "mean", seed: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = {"scenario": {"seed": seed}, "workload": dict(_WL),
                           "federation": {**_FED, **(federation or {})}, "attack": attack, "defense": defense}
    if transport:
        doc["transport"] = transport
    if hierarchy:
        doc["hierarchy"] = hierarchy
    return doc


CELLS: dict[str, dict[str, Any]] = {
    "dense_sign_flip_mean": _cell(attack={"name": "sign_flip", "scale": 3.0}),
    "int8_ef_gaussian_norm_bound": _cell(
        transport={"codec": "int8"}, attack={"name": "gaussian", "std": 0.5},
        defense={"name": "norm_bound", "multiplier": 2.0, "mode": "reject"}),
    "topk_ef_ipm_omniscient_cosine": _cell(
        federation={"partition": "dirichlet", "alpha": 0.5},
        transport={"codec": "topk", "codec_params": {"fraction": 0.2}, "error_feedback": True},
        attack={"name": "ipm", "epsilon": 0.5}, defense={"name": "cosine_filter"}),
    "alie_median_shards": _cell(federation={"partition": "shards", "shards_per_client": 2},
                                attack="alie", defense="median"),
    "churn_label_flip_mean": _cell(
        federation={"rounds": 4}, transport={"network": {"churn_leave": 0.4, "churn_join": 0.5}},
        attack={"name": "label_flip", "mapping": "reverse"}),
    "deadline_stragglers": _cell(
        transport={"network": {"deadline_s": 0.05, "compute_s_per_step": 0.01, "compute_sigma": 0.8,
                               "bandwidth_mbps": 5.0}},
        attack={"name": "sign_flip"}, defense={"name": "norm_bound", "bound": 5.0}),
    "hierarchy_random_rogue_aggregator": _cell(
        federation={"clients": 12}, hierarchy={"fan_out": 2, "depth": 2, "grouping": "random"},
        attack={"name": "rogue_aggregator", "scale": 5.0}, defense="median"),
    "hierarchy_random_mean": _cell(
        federation={"clients": 12}, hierarchy={"fan_out": 2, "depth": 2, "grouping": "random",
                                               "upper_defense": "median"},
        attack={"name": "sign_flip"}, defense="mean"),
    "signed_chunk_tamper_relay": _cell(
        transport={"chunk_size": 1024, "network": {"relay_fraction": 0.5, "retries": 1}},
        attack={"name": "chunk_tamper"}, defense={"pipeline": [{"name": "signed_chunks"}, {"name": "mean"}]}),
    "unsigned_chunk_substitute": _cell(
        transport={"chunk_size": 1024, "network": {"relay_fraction": 0.5}},
        attack={"name": "chunk_substitute"}, defense="mean"),
    "signed_replay": _cell(
        federation={"rounds": 4}, transport={"chunk_size": 1024, "network": {"relay_fraction": 0.5}},
        attack={"name": "replay"}, defense={"pipeline": [{"name": "signed_chunks"}, {"name": "mean"}]}),
    "signed_equivocate_hierarchy": _cell(
        federation={"clients": 12}, hierarchy={"fan_out": 2, "depth": 2},
        transport={"chunk_size": 1024}, attack={"name": "equivocate"},
        defense={"pipeline": [{"name": "signed_chunks"}, {"name": "mean"}]}),
    "provenance_gate_manifest_mismatch": _cell(
        attack={"name": "manifest_mismatch"},
        defense={"pipeline": [{"name": "provenance_gate"}, {"name": "mean"}]}),
    "fltrust_fedadam": _cell(federation={"server_optimizer": "fedadam", "server_lr": 0.05},
                             attack={"name": "sign_flip", "scale": 2.0}, defense="fltrust"),
    "loss_check_nesterov": _cell(federation={"server_optimizer": "nesterov", "server_lr": 0.7},
                                 attack={"name": "gaussian", "std": 1.0}, defense="loss_check"),
    "local_epochs_quantity_min_max": _cell(
        federation={"partition": "quantity", "local_epochs": 0.5, "prox_mu": 0.01},
        attack="min_max", defense={"name": "norm_bound", "multiplier": 1.5}),
    "backdoor_int8_no_ef": _cell(transport={"codec": "int8", "error_feedback": False},
                                 attack={"name": "backdoor", "target": 0}, defense="median"),
}


def run_cell(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-round figures the fixture pins (everything but wall times)."""
    from redteam.federation.loop import Federation
    from redteam.scenario import parse_scenario

    res = Federation(parse_scenario(json.loads(json.dumps(doc)))).run()
    out = []
    for r in res.records:
        out.append({
            "accuracy": r.accuracy, "loss": r.loss, "accepted": r.accepted, "participating": r.participating,
            "bytes_on_wire": r.bytes_on_wire, "sim_time_s": r.sim_time_s,
            "rejected": {str(k): v for k, v in r.rejected.items()},
            "dropped": {str(k): v for k, v in r.dropped.items()},
            "asr": r.extra.get("asr"),
        })
    return out


def record() -> None:
    import redteam

    import attacks
    import defenses

    print("recording with", redteam.__file__, attacks.__file__, defenses.__file__, file=sys.stderr)
    data = {name: {"scenario": doc, "rounds": run_cell(doc)} for name, doc in CELLS.items()}
    FIXTURE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record()
