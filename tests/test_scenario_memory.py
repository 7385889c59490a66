"""The memory a scenario's settings make a run allocate, estimated at load and refused above the
budget (issue 35 §3): gossip over 100,000 nodes, an async buffer of 10⁶ updates, pipeline
micro-batches, 10⁶ validator seats, a text model of width 4096 and 64 layers. Each is one line
naming the setting, the estimate and the budget, before anything is allocated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from redteam.errors import InvalidScenario
from redteam.scenario import parse_scenario
from redteam.scenario_limits import Limits, memory_estimate

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30

HOSTILE = {
    "gossip_nodes": ({"federation": {"clients": 100_000, "rounds": 1}, "gossip": {"topology": "ring"}},
                     "[federation].clients = 100000"),
    "async_buffer": ({"federation": {"clients": 20, "rounds": 1}, "async": {"buffer_size": 1_000_000}},
                     "[async].buffer_size = 1000000"),
    "pipeline_micro_batch": ({"workload": {"name": "text", "context": 64, "width": 32, "layers": 3, "heads": 2},
                              "pipeline": {"micro_batch_size": 65_536}},
                             "[pipeline].micro_batch_size = 65536"),
    "pipeline_audit": ({"workload": {"name": "text", "context": 64, "width": 256, "layers": 2, "heads": 2},
                        "pipeline": {"micro_batches": 100_000, "micro_batch_size": 64, "stages": 8,
                                     "checks": [{"name": "activation_commitment"}]}},
                       "[pipeline].micro_batches = 100000"),
    "validators": ({"federation": {"clients": 6, "rounds": 1},
                    "defense": {"name": "gauntlet", "scoring": "min", "validators": 1_000_000}},
                   "[defense].validators = 1000000"),
    "text_model": ({"workload": {"name": "text", "width": 4096, "layers": 64, "heads": 8},
                    "federation": {"clients": 4, "rounds": 1}},
                   "[workload].width = 4096"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_setting_that_would_allocate_past_the_budget_is_refused_in_one_line(case):
    doc, setting = HOSTILE[case]
    with pytest.raises(InvalidScenario) as exc:
        parse_scenario(doc, file="s.toml", limits=Limits(memory_budget=8 * GIB))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("s.toml: ")
    assert setting in msg and "8.0 GiB" in msg and "REDTEAM_MEMORY_BUDGET" in msg, msg


def test_the_budget_can_be_raised_and_the_shipped_sizes_fit_it(monkeypatch):
    doc = HOSTILE["async_buffer"][0]
    monkeypatch.setenv("REDTEAM_MEMORY_BUDGET", str(1 << 50))
    assert parse_scenario(doc).asynchronous.buffer_size == 1_000_000
    monkeypatch.setenv("REDTEAM_MEMORY_BUDGET", "lots")
    with pytest.raises(InvalidScenario, match="REDTEAM_MEMORY_BUDGET"):
        parse_scenario(doc)
    monkeypatch.delenv("REDTEAM_MEMORY_BUDGET")
    sc = parse_scenario({"workload": {"name": "text"}, "pipeline": {}}, limits=Limits(memory_budget=8 * GIB))
    assert 0 < sum(b for _, _, b, _ in memory_estimate(sc)) < 64 << 20


def test_the_text_models_parameter_count_is_its_models():
    import torch

    from redteam.registry import WORKLOADS

    for params in ({}, {"context": 24, "width": 48, "layers": 3, "heads": 4}):
        w = WORKLOADS.create("text", params)
        model = w.build_model(torch.Generator().manual_seed(0))
        assert w.param_count() == sum(p.numel() for p in model.parameters())


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="RLIMIT_AS: Linux")
@pytest.mark.parametrize("case", ["gossip_nodes"])
def test_refused_under_a_hard_memory_cap_before_allocating(tmp_path, case):
    """`redteam run` on the file, in a process that cannot map more than 3 GiB: exit 2 and the one
    line (a MemoryError or a kill would mean the allocation was tried)."""
    import tomllib  # noqa: F401 - the document is written by hand below

    doc, setting = HOSTILE[case]
    lines = []
    for section, table in doc.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {v!r}".replace("'", '"') for k, v in table.items()]
    path = tmp_path / "s.toml"
    path.write_text("\n".join(lines) + "\n")
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "from redteam.cli import main\n"
            f"sys.exit(main(['run', {str(path)!r}]))\n")
    env = {k: v for k, v in os.environ.items() if k != "REDTEAM_MEMORY_BUDGET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and setting in err and "REDTEAM_MEMORY_BUDGET" in err, err
