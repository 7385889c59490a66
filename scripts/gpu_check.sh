#!/usr/bin/env bash
# The prepared GPU check (issue 20 §5): run on a CUDA machine from the repository root.
#   OUT=/some/dir bash scripts/gpu_check.sh
# 1. tests/test_cuda.py (CPU/CUDA agreement), 2. benchmarks/bench_gpu.py (round overhead at
# 1,000 and 10,000 clients; aggregator table on GPU beside CPU), 3. one literature table at its
# full length on CUDA (Karimireddy et al., 60 rounds, 120 cells), each under its own time limit
# so a slow part cannot starve the others. Every output goes to $OUT.
set -u
PY=${PY:-python3}
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
LOG="$OUT/log.txt"
T_TESTS=${T_TESTS:-170}; T_BENCH=${T_BENCH:-200}; T_TABLE=${T_TABLE:-200}
export PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
  "$PY" -c "import redteam, attacks, defenses; from redteam.registry import DEFENSES; print('redteam importable;', len(list(DEFENSES.names())), 'defenses')" 2>&1 || true
  echo "== 1. tests/test_cuda.py"
  timeout "$T_TESTS" "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py -x -q --durations=5 2>&1 | tail -40
  echo "tests rc=${PIPESTATUS[0]}"
  echo "== 2. benchmarks/bench_gpu.py"
  timeout "$T_BENCH" "$PY" benchmarks/bench_gpu.py 2>&1
  echo "bench rc=$?"
  echo "== 3. Karimireddy table, full length, --device cuda"
  start=$(date +%s)
  timeout "$T_TABLE" "$PY" -m redteam.cli matrix scenarios/literature/karimireddy.toml --out "$OUT/kar" \
      --device cuda --executor process --workers "${WORKERS:-6}" --quiet 2>&1 | tail -30
  echo "table rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start )) s"
  "$PY" - "$OUT/kar" <<'PY' 2>&1
import sqlite3, sys, pathlib
p = next(pathlib.Path(sys.argv[1]).glob("*.sqlite"), None)
if p is None: print("no store"); raise SystemExit
con = sqlite3.connect(p)
for (name,) in con.execute("select name from sqlite_master where type='table'"):
    print(name, con.execute(f"select count(*) from {name}").fetchone()[0])
PY
  date -u
} 2>&1 | tee "$LOG"
