"""Subprocess body of the scenario fuzz test: hostile scenario files against the loader and CLI.

Run as ``python tests/_scenario_fuzz_worker.py N OUT.json [SEED]``. After its imports it caps
its own address space (``RLIMIT_AS``) at what it uses plus 2 GiB, so that a file which
makes the loader allocate without bound fails here with ``MemoryError`` instead of taking
the machine. Each of ``N`` mutated shipped scenarios is written to a file and fed to

* ``redteam matrix FILE`` (the loader, matrix expansion, expectations and the run plan;
  stopped just before anything is written or run),
* ``redteam run FILE`` (the loader; stopped just before training), and
* the pytest plugin's collection path (``load_document`` + ``expand(check_plugins=False)``);

and each of ``N`` mutated copies of ``scenarios/limits.toml`` to ``redteam limits FILE`` (stopped
before computing) and ``load_limits``. Before those, a fixed hostile corpus
(``hostile_corpus``: strings that once desynchronised the pre-parse scan, each followed by a
deep key or deep nesting; issue 22 §1) goes through the same entry points, scenario and limits
files alike, and every one of them must be refused.

Each must accept the file or refuse it with a one-line ``InvalidScenario`` (the CLI: exit 2
and one ``redteam: error:`` line). Anything else is recorded as a failure with the file.
The summary (cases, accepted, refused, corpus, limits_*, failures) is written to OUT.json.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: F401,E402  (imported before the cap: its import maps a lot of address space)
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

import _scenario_mutations as M  # noqa: E402
import redteam.limits.compute as limits_compute  # noqa: E402
import redteam.runner.matrix_run as matrix_run  # noqa: E402
import redteam.runner.single as single  # noqa: E402
from redteam.cli import main  # noqa: E402
from redteam.errors import InvalidScenario  # noqa: E402
from redteam.limits import load_limits  # noqa: E402
from redteam.matrix import expand  # noqa: E402
from redteam.matrix import load_matrix  # noqa: E402
from redteam.scenario import load_document  # noqa: E402

MAX_MESSAGE = 1500  # unknown-name errors list every registered name


class _Reached(Exception):
    """The CLI got past loading: the file was accepted."""


def _stop(*_a, **_k):
    raise _Reached


def _vm_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def _cli(args: list[str]) -> tuple[str, str]:
    """('accepted' | 'refused', detail) or raise on anything else."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(args)
        except _Reached:
            return "accepted", ""
    text = err.getvalue()
    lines = text.strip().splitlines()
    if rc != 2 or len(lines) != 1 or not lines[0].startswith("redteam: error: ") or len(lines[0]) > MAX_MESSAGE:
        raise AssertionError(f"redteam {args[0]}: exit {rc}, stderr {text[:MAX_MESSAGE]!r}")
    return "refused", lines[0]


def _check_message(exc: InvalidScenario) -> None:
    msg = str(exc)
    if "\n" in msg or len(msg) > MAX_MESSAGE:
        raise AssertionError(f"InvalidScenario message is not one short line: {msg[:MAX_MESSAGE]!r}")


def _failure(exc: BaseException, text: str, name: str = "") -> dict[str, str]:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/tests/" not in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "at": where, "case": name, "file": text[:3000]}


def _scenario_verdict(path: Path, tmp: Path) -> str:
    """'accepted' or 'refused' by every entry point, or raise."""
    verdict, _ = _cli(["matrix", str(path), "--quiet", "--out", str(tmp / "out")])
    _cli(["run", str(path), "--quiet"])  # may refuse more (e.g. a matrix without an [attack])
    try:
        plugin_doc = load_document(path)
        expand(plugin_doc, path.name, check_plugins=False)
    except InvalidScenario as exc:
        _check_message(exc)
        if verdict == "accepted":
            raise AssertionError(f"collection refused an accepted file: {exc}") from None
    if verdict == "refused":  # the library loader too (the CLI may refuse more, e.g. an empty file)
        try:
            load_matrix(path)
        except InvalidScenario as exc:
            _check_message(exc)
    return verdict


def _limits_verdict(path: Path) -> str:
    """``redteam limits FILE`` (stopped before computing) and ``load_limits``: 'accepted' or 'refused'."""
    verdict, _ = _cli(["limits", str(path), "--quiet"])
    try:
        load_limits(path)
        if verdict == "refused":
            raise AssertionError("load_limits accepted a file the CLI refused")
    except InvalidScenario as exc:
        _check_message(exc)
    return verdict


def run(n: int, out: Path, seed: int | None) -> None:
    single.run_scenario = _stop  # `redteam run` stops where training would start
    matrix_run.ResultsStore = _stop  # `redteam matrix` stops after the plan, before the store
    limits_compute.compute_all = _stop  # `redteam limits` stops after loading the file
    docs = M.shipped_documents()
    limits_docs = M.limits_documents()
    tmp = Path(tempfile.mkdtemp(prefix="scfuzz-"))
    path = tmp / "fuzzed.toml"
    stats = {"cases": 0, "accepted": 0, "refused": 0, "corpus": 0, "limits_cases": 0, "limits_accepted": 0,
             "limits_refused": 0, "failures": []}
    cap = _vm_bytes() + (2 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))

    # the fixed hostile corpus (issue 22 §1), every run: each must be refused in one line
    for kind, corpus in (("scenario", M.hostile_corpus(docs)), ("limits", M.hostile_corpus(limits_docs))):
        for name, text in corpus:
            stats["corpus"] += 1
            path.write_text(text, "utf-8")
            try:
                verdict = _scenario_verdict(path, tmp) if kind == "scenario" else _limits_verdict(path)
                if verdict != "refused":
                    raise AssertionError(f"{kind} corpus file {name} was accepted")
            except (Exception, MemoryError, RecursionError) as exc:  # noqa: BLE001 - every crash is a finding
                stats["failures"].append(_failure(exc, text, f"{kind} corpus {name}"))

    @settings(max_examples=n, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(M.mutated_documents(docs))
    def case(doc):
        stats["cases"] += 1
        text = M.dump(doc)
        path.write_text(text, "utf-8")
        try:
            stats[_scenario_verdict(path, tmp)] += 1
        except (Exception, MemoryError, RecursionError) as exc:  # noqa: BLE001 - every crash is a finding
            stats["failures"].append(_failure(exc, text))

    @settings(max_examples=n, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(M.mutated_documents(limits_docs))
    def limits_case(doc):
        stats["limits_cases"] += 1
        text = M.dump(doc)
        path.write_text(text, "utf-8")
        try:
            stats["limits_" + _limits_verdict(path)] += 1
        except (Exception, MemoryError, RecursionError) as exc:  # noqa: BLE001 - every crash is a finding
            stats["failures"].append(_failure(exc, text, "limits"))

    if seed is not None:
        from hypothesis import seed as hseed

        case = hseed(seed)(case)
        limits_case = hseed(seed)(limits_case)
    case()
    limits_case()
    out.write_text(json.dumps(stats, indent=1), "utf-8")


if __name__ == "__main__":
    run(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
