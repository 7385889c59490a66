"""Fuzzing the scenario loader and CLI with mutated shipped scenarios (issue 9 §3).

Hypothesis mutates the documents of ``scenarios/*.toml`` (huge and special numbers, deep
arrays, wrong types, deleted and added keys; see tests/_scenario_mutations.py), writes each
one to a file and gives it to ``redteam matrix``, ``redteam run`` (both stopped before any
training) and the pytest plugin's collection path; ``scenarios/limits.toml`` is mutated the
same way for ``redteam limits``. A fixed corpus of hostile files runs first, every time (issue
22 §1: strings that once desynchronised the pre-parse scan, each followed by a deep key or deep
nesting; all must be refused). Every file must be accepted, or refused
with a one-line ``InvalidScenario``; the worker runs in a subprocess with a capped address
space (``RLIMIT_AS``: what it uses after its imports plus 2 GiB), so unbounded allocation
fails the test instead of exhausting the machine.

The default is a fixed (derandomized) set of examples that runs in seconds;
``REDTEAM_FUZZ_EXAMPLES=2000`` runs more, with a random seed (``REDTEAM_FUZZ_SEED`` fixes it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from _scenario_mutations import DESYNC_STRINGS, HIDDEN_TAILS, dump, limits_documents, shipped_documents

HERE = Path(__file__).resolve().parent


def test_writer_round_trips_shipped_scenarios():
    # the fuzzer's TOML writer must give back exactly the document it was handed, or the
    # mutations would not be the ones tested
    docs = shipped_documents()
    assert len(docs) >= 3
    for doc in docs + limits_documents():
        assert tomllib.loads(dump(doc)) == doc


def test_mutated_scenarios_are_accepted_or_refused_in_one_line(tmp_path):
    n = int(os.environ.get("REDTEAM_FUZZ_EXAMPLES", "20"))
    seed = os.environ.get("REDTEAM_FUZZ_SEED")
    if seed is None and "REDTEAM_FUZZ_EXAMPLES" in os.environ:
        seed = str(int.from_bytes(os.urandom(4), "big"))
    out = tmp_path / "fuzz.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDTEAM_MAX") and k != "REDTEAM_ALLOW_INCLUDE_OUTSIDE"}
    env["OMP_NUM_THREADS"] = "1"
    args = [sys.executable, str(HERE / "_scenario_fuzz_worker.py"), str(n), str(out)] + ([seed] if seed else [])
    proc = subprocess.run(args, capture_output=True, text=True, timeout=3000, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    stats = json.loads(out.read_text())
    failures = stats["failures"]
    report = "\n\n".join(f"{f['error']} at {f['at']}\n--- file ---\n{f['file'][:1500]}" for f in failures[:3])
    assert not failures, f"{len(failures)} of {stats['cases']} cases crashed (seed {seed}):\n{report}"
    assert stats["cases"] == n and stats["limits_cases"] == n
    assert stats["corpus"] == 2 * len(DESYNC_STRINGS) * len(HIDDEN_TAILS)  # scenario and limits files
    # the mutations must reach past the first checks: some files are valid
    assert stats["accepted"] >= 1 and stats["refused"] >= 1, stats
    assert stats["limits_accepted"] >= 1 and stats["limits_refused"] >= 1, stats
