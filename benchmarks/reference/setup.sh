#!/usr/bin/env bash
# Build the virtual environment of the reference benchmarks (Flower, ByzFL, plain torch).
#
#   bash benchmarks/reference/setup.sh            # idempotent: a second run only checks
#
# Where: $REDTEAM_BENCH_VENV (default /tmp/redteam-bench-venv); ~1 GB.
# torch: the CPU build of the version constraints.txt pins (torch==2.13.0), installed first
#   from $TORCH_INDEX_URL (default https://download.pytorch.org/whl/cpu; set it empty to use
#   pip's configured sources, e.g. a local wheel directory); everything else then comes from
#   requirements.txt under -c constraints.txt, so the resolver keeps that torch, and ByzFL
#   from requirements-nodeps.txt without its dependencies (that file says why). The script
#   fails if the result is a CUDA build or has nvidia-* packages.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${REDTEAM_BENCH_VENV:-/tmp/redteam-bench-venv}
PY=${PYTHON:-python3}
TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
TORCH_PIN=$(grep -E '^torch==' "$ROOT/constraints.txt")

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${TORCH_PIN#torch==}')" 2>/dev/null; then
  if [ -n "$TORCH_INDEX_URL" ]; then
    "${PIP[@]}" install -q "$TORCH_PIN" --index-url "$TORCH_INDEX_URL"
  else
    "${PIP[@]}" install -q "$TORCH_PIN"
  fi
fi
"${PIP[@]}" install -q -r "$HERE/requirements.txt" -c "$ROOT/constraints.txt"
"${PIP[@]}" install -q --no-deps -r "$HERE/requirements-nodeps.txt"

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md, sys
import torch
bad = [d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia")]
if torch.version.cuda is not None or bad:
    sys.exit(f"setup.sh: a CUDA build came in (torch.version.cuda = {torch.version.cuda}, {bad})")
for name in ("torch", "flwr", "ray", "byzfl", "numpy", "scipy"):
    print(f"{name} {md.version(name)}")
PY
du -sh "$VENV" 2>/dev/null || true
