"""Can each [[expect]] row of a scenario fail? Re-run the scenario with its attacks replaced and
list the rows that still hold.

A row that holds whatever the attack does (a bound a clean run meets, a comparison of two cells
the attack does not touch) cannot show what it claims. This script writes a copy of the scenario
in which every attack of the ``[matrix]`` (or those named with ``--only``) is replaced — by
``none`` (default), or by another attack table (``--by '{ name = "sign_flip", scale = 2.0 }'``,
for a row credited to what a staleness attack adds to a plain flip) — keeping each entry's label,
runs its rows with pytest, and prints which rows failed (good: the row depends on the attack) and
which still held (a row that cannot fail). The suite's ``<file>::can_fail`` item
(``redteam/can_fail.py``) judges the same from the runs a session already stored (the no-attack
baselines, and the plain mean cells it ran); this script is the full re-run, for what those cannot
tell (a mean cell no row runs, an attack replaced by another).

    python scripts/rows_can_fail.py scenarios/gossip.toml
    python scripts/rows_can_fail.py scenarios/async.toml --only stale_replay --by '{ name = "sign_flip", scale = 2.0 }'
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} as TOML")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario")
    ap.add_argument("--by", default='{ name = "none" }', help="the attack table put in their place (TOML inline table)")
    ap.add_argument("--only", nargs="*", default=None, help="labels of the attacks to replace (default: all)")
    args = ap.parse_args(argv)
    src = Path(args.scenario).resolve()
    text = src.read_text(encoding="utf-8")
    doc = tomllib.loads(text)
    by = tomllib.loads(f"x = {args.by}")["x"]
    attacks = doc.get("matrix", {}).get("attacks")
    if not isinstance(attacks, list):
        print(f"{src.name}: no [matrix] attacks to replace", file=sys.stderr)
        return 2
    labels = []
    new = []
    for a in attacks:
        label = a.get("label", a.get("name")) if isinstance(a, dict) else a
        labels.append(label)
        if args.only is None or label in args.only:
            new.append({**by, "label": label})
        else:
            new.append(a if isinstance(a, dict) else {"name": a})
    block = "attacks = [\n" + "".join(f"    {_toml_value(a)},\n" for a in new) + "]"
    # the [matrix] attacks list is replaced in the text, so everything else (comments, rows) stays
    # (the first top-level `attacks = [` line after `[matrix]`: a compose entry's own `attacks` list is
    # inline, never at the start of a line)
    out, n = re.subn(r"(?ms)^attacks = \[\s*$.*?^\]", lambda _: block, text, count=1)
    if n != 1:  # a list on one line
        out, n = re.subn(r"(?m)^attacks = \[.*\]\s*$", lambda _: block, text, count=1)
    if n != 1:
        print(f"{src.name}: could not find the [matrix] attacks list", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / src.name
        copy.write_text(out, encoding="utf-8")
        for extra in src.parent.glob("*.safetensors"):  # start_from files beside it
            (Path(tmp) / extra.name).write_bytes(extra.read_bytes())
        app = doc.get("flower", {}).get("app") if isinstance(doc.get("flower"), dict) else None
        if isinstance(app, str) and ":" in app:  # a [flower] app's module beside it
            module = src.parent / (app.split(":", 1)[0].replace(".", "/") + ".py")
            if module.is_file():
                (Path(tmp) / module.name).write_bytes(module.read_bytes())
        # (the copy's own can_fail item would only repeat, on the replaced runs, what this reports)
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rN",
                              "-o", "redteam_can_fail=false", str(copy)],
                             capture_output=True, text=True)
    if res.returncode not in (0, 1) or not re.search(r"\d+ (passed|failed)", res.stdout):
        # a copy that did not run (a parse error, a collection error) proves nothing either way
        print(f"{src.name}: the copy with the attacks replaced did not run (pytest exit {res.returncode}):\n"
              + (res.stdout + res.stderr)[-2000:], file=sys.stderr)
        return 2
    failed = sorted({int(m) for m in re.findall(r"expect #(\d+) \(", res.stdout)})
    rows = doc.get("expect", [])
    held = [i + 1 for i in range(len(rows)) if i + 1 not in failed and (
        args.only is None or rows[i].get("attack") in args.only)]
    print(f"{src.name}, attacks {'all' if args.only is None else ', '.join(args.only)} replaced by {_toml_value(by)}:")
    print(f"  rows that failed (they depend on the attack): {failed or 'none'}")
    print(f"  rows that still held (they cannot fail this way): {held or 'none'}")
    return 1 if held else 0


if __name__ == "__main__":
    sys.exit(main())
