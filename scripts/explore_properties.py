"""Draw fresh inputs for the property tests: a bounded explore pass that reports, never fails.

The suite's property tests run under the derandomized hypothesis profile ``ci`` (the same inputs
every run: a change lands or fails on its own merits). This pass runs some of them under
``REDTEAM_HYPOTHESIS=explore`` with a seed that changes every day, so that new inputs are drawn
routinely, and prints what it finds with the command that reproduces it. It exits 0 whatever it
finds (a new find is a lead to pin as an ``@example`` and fix, not a broken build); 2 only when it
could not run at all.

Which tests: the files under ``tests/`` that use hypothesis's ``@given``, in name order; each
pass takes ``--files`` of them starting at an offset derived from the seed, so successive days
walk through all of them. ``--budget`` bounds the wall time (the pytest run is stopped there and
what finished is reported).

    python scripts/explore_properties.py                      # today's seed (YYYYMMDD), 60 s
    python scripts/explore_properties.py --seed 20261206 --files 4 --budget 120
    python scripts/explore_properties.py --seed 7 tests/test_defenses_median_exact.py
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def property_files(tests: Path) -> list[Path]:
    """The test files that draw inputs with hypothesis (``@given``), in name order."""
    return sorted(p for p in tests.glob("test_*.py") if re.search(r"^(    )?@given\(", p.read_text(encoding="utf-8"),
                                                                  re.MULTILINE))


def pick(files: list[Path], seed: int, k: int) -> list[Path]:
    """``k`` of ``files`` (wrapping around), starting at ``seed``'s offset."""
    if not files:
        return []
    start = seed % len(files)
    return [files[(start + i) % len(files)] for i in range(min(k, len(files)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: today's date, YYYYMMDD, UTC)")
    ap.add_argument("--files", type=int, default=3, help="property-test files per pass (default 3)")
    ap.add_argument("--budget", type=float, default=60.0, help="wall-time bound in seconds (default 60)")
    ap.add_argument("paths", nargs="*", help="test files to explore instead of the day's rotation")
    args = ap.parse_args(argv)
    if args.files < 1 or not args.budget > 0:
        print(f"explore: --files = {args.files} must be ≥ 1 and --budget = {args.budget} > 0", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int(_dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d"))
    chosen = [Path(p).resolve() for p in args.paths] or pick(property_files(ROOT / "tests"), seed, args.files)
    if not chosen:
        print("explore: no property tests found under tests/", file=sys.stderr)
        return 2
    rel = [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in chosen]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "redteam_can_fail=false",
           "--hypothesis-seed", str(seed), "-m", "not slow", *rel]
    env = {**os.environ, "REDTEAM_HYPOTHESIS": "explore"}
    print(f"explore: seed {seed}, {', '.join(rel)} (budget {args.budget:g} s)", flush=True)
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.budget)
        out, code, cut = res.stdout + res.stderr, res.returncode, False
    except subprocess.TimeoutExpired as exc:
        raw = (exc.stdout or b"") + (exc.stderr or b"")
        out, code, cut = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw), None, True
    again = f"REDTEAM_HYPOTHESIS=explore python -m pytest --hypothesis-seed {seed} " + " ".join(rel)
    failed = re.findall(r"^FAILED (\S+)", out, re.MULTILINE)
    if failed or (code not in (0, 5, None)):
        print(f"explore: NEW FIND (seed {seed}): {len(failed)} test(s) failed on fresh inputs:")
        for line in out.splitlines():
            if line.startswith(("FAILED", "Falsifying example", "E ")) or "@example(" in line or \
                    line.strip().startswith(("x=", "data=")):
                print("  " + line)
        print(f"reproduce: {again}\npin each input above as an @example before fixing it (tests/conftest.py)")
    elif cut:
        print(f"explore: stopped at the {args.budget:g} s budget with nothing found so far")
    else:
        summary = [ln for ln in out.splitlines() if re.search(r"\d+ passed", ln)]
        print(f"explore: nothing new ({summary[-1].strip() if summary else 'no summary'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
