"""Fingerprint every shipped scenario at reduced rounds: a hash of each run's round records
(wall times left out) and of its final model, for every distinct run of every matrix cell.

Used to show that a refactor of the engine changes no stored result: record before, record
after, compare (``--compare``). Runs one seed (the first replicate) of every cell, its
no-attack baseline included, with ``[federation] rounds`` cut to ``--rounds`` and any warm-up
to ``--warmup-rounds``; scenarios whose requirements are not met here are listed as skipped.

    python scripts/regime_fingerprint.py --out before.json
    python scripts/regime_fingerprint.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


#: wall-clock figures inside a record's extra (they differ from run to run)
_WALL = ("sign_s", "verify_s")


def _records_digest(records: list) -> str:
    rows = []
    for r in records:
        d = r.to_dict()
        d.pop("wall_time_s", None)
        d.pop("defense_time_s", None)
        extra = dict(d.get("extra") or {})
        for k in _WALL:
            extra.pop(k, None)
        if isinstance(extra.get("provenance_gate"), dict):
            extra["provenance_gate"] = {k: v for k, v in extra["provenance_gate"].items() if k != "time_s"}
        d["extra"] = extra
        rows.append(d)
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _params_digest(run) -> str:
    p = getattr(run, "final_params", None)
    if p is None:
        return "-"
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(p.detach().cpu().numpy()).tobytes()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="scenario files (default: all shipped)")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from redteam.federation.regimes import make_run
    from redteam.requirements import unmet
    from redteam.runner.matrix_run import plan_units
    try:
        from redteam.matrix import load_matrix
    except ImportError:  # before issue 32 it lived in redteam.scenario
        from redteam.scenario import load_matrix  # type: ignore[attr-defined,no-redef]
    from redteam.scenario import parse_scenario

    files = [Path(f) for f in args.only] if args.only else sorted((ROOT / "scenarios").rglob("*.toml"))
    out: dict[str, dict[str, str]] = {}
    warm = tempfile.mkdtemp(prefix="fp-warm-")
    for f in files:
        rel = str(f.relative_to(ROOT)) if f.is_absolute() else str(f)
        t0 = time.perf_counter()
        try:
            base, matrix, _ = load_matrix(f)
        except Exception as exc:  # noqa: BLE001
            out[rel] = {"_error": f"{type(exc).__name__}: {exc}"[:300]}
            print(rel, "load error", exc, flush=True)
            continue
        missing = unmet(base.scenario.requires, dict(base.workload.params))
        if missing:
            out[rel] = {"_skipped": "; ".join(missing)[:300]}
            print(rel, "skipped", missing, flush=True)
            continue
        _, baselines, attacked = plan_units(matrix, base.seed, f.name, base_dir=f.parent)
        res: dict[str, str] = {}
        first = min((u.replicate for u in [*baselines, *attacked]), default=0)
        for u in [*baselines, *attacked]:
            if u.replicate != first:
                continue
            doc = json.loads(json.dumps(u.doc))
            doc.pop("_run", None)
            doc["federation"] = {**doc.get("federation", {}), "rounds": min(args.rounds, int(doc.get("federation", {}).get("rounds", args.rounds)))}
            sc_ = doc.get("scenario", {})
            if int(sc_.get("warmup_rounds", 0) or 0):
                doc["scenario"] = {**sc_, "warmup_rounds": args.warmup_rounds}
            key = f"{u.cell_id}|{u.attack}|{'base' if u.baseline else 'atk'}"
            try:
                try:
                    sc = parse_scenario(doc, file=f.name, base_dir=f.parent)
                except Exception:  # noqa: BLE001 - e.g. an attack window past the cut: keep the rounds
                    doc["federation"]["rounds"] = json.loads(json.dumps(u.doc))["federation"]["rounds"]
                    sc = parse_scenario(doc, file=f.name, base_dir=f.parent)
                run = make_run(sc, device="cpu", warmup_dir=warm)
                r = run.run()
                res[key] = f"{_records_digest(r.records)}:{_params_digest(run)}"
            except Exception as exc:  # noqa: BLE001
                res[key] = f"ERROR {type(exc).__name__}: {str(exc)[:200]}"
        out[rel] = res
        print(f"{rel}: {len(res)} runs, {time.perf_counter() - t0:.1f} s", flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        diff = 0
        for rel in sorted(set(before) | set(out)):
            b, a = before.get(rel, {}), out.get(rel, {})
            for k in sorted(set(b) | set(a)):
                if b.get(k) != a.get(k):
                    diff += 1
                    print(f"DIFF {rel} {k}: {b.get(k)} -> {a.get(k)}")
        print(f"{diff} differences")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
