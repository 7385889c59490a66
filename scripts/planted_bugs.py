"""Issue 14's planted bugs in the verdict glue: each must make at least one test fail.

For every bug this script copies the working tree (tracked files) into a scratch
directory, applies the one-line change there, runs the test file that targets the module
and reports CAUGHT (a test failed) or SURVIVED. Exit status 1 if any bug survives::

    python scripts/planted_bugs.py          # about two minutes on two cores

The shared tree is never modified.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (name, file, original text, planted text, test file)
BUGS: list[tuple[str, str, str, str, str]] = [
    ("norm_bound rejects a norm exactly on the bound", "defenses/norm.py",
     "    return norms <= bound * (1.0 + NORM_RTOL)", "    return norms < bound", "tests/test_defenses_norm.py"),
    ("norm_bound clip mode under-scales", "defenses/norm.py",
     "scale = torch.clamp(m / norms.clamp_min(1e-30), max=1.0)",
     "scale = torch.clamp(0.9 * m / norms.clamp_min(1e-30), max=1.0)", "tests/test_defenses_norm.py"),
    ("norm_bound's adaptive bound uses the mean, not the median", "defenses/norm.py",
     "return float(self.multiplier * finite.median())", "return float(self.multiplier * finite.mean())",
     "tests/test_defenses_norm.py"),
    ("float32-accumulated norm at the bound (norm_hug rows rejected)", "defenses/norm.py",
     "    return _redo(updates, norms, (norms - near).abs() <= _NEAR * abs(near))", "    return norms",
     "tests/test_defenses_norm.py"),
    ("sign_flip variant='mean' no longer flips", "attacks/basic.py",
     "return (-self.scale * mean)", "return (self.scale * mean)", "tests/test_sign_flip.py"),
    ("scoring counts stragglers and churned clients as judged", "redteam/scoring.py",
     "            judged = acc or i in r.rejected\n", "            judged = True\n", "tests/test_scoring.py"),
    ("scoring counts clients that did not take part", "redteam/scoring.py",
     "            if not part:\n                continue\n", "", "tests/test_scoring.py"),
    ("merge: a group rejected upstairs keeps its clients accepted", "redteam/merge.py",
     "                            accepted[r] = False\n", "                            pass\n",
     "tests/test_merge_rejection.py"),
    ("[[expect]] on an undefined metric passes", "redteam/matrix.py",
     '            return f"{self.metric} is undefined (null) for this cell"', "            return None",
     "tests/test_expect.py"),
]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="planted-"))
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        for rel in files.decode().split("\0"):
            if rel and (ROOT / rel).is_file():
                (work / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, work / rel)
        env = dict(os.environ, PYTHONPATH=str(work), OMP_NUM_THREADS="1")
        survived = 0
        for name, path, old, new, test in BUGS:
            target = work / path
            src = target.read_text(encoding="utf-8")
            if src.count(old) != 1:
                print(f"STALE   : {name}: the original text is not in {path} (update this script)")
                survived += 1
                continue
            target.write_text(src.replace(old, new), encoding="utf-8")
            try:
                r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test],
                                   cwd=work, env=env, capture_output=True, text=True, check=False)
            finally:
                target.write_text(src, encoding="utf-8")
            first = next((ln for ln in r.stdout.splitlines() if ln.startswith("FAILED")), "")
            if r.returncode == 0:
                survived += 1
            print(f"{'CAUGHT  ' if r.returncode else 'SURVIVED'}: {name}  {first}", flush=True)
        return 1 if survived else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
