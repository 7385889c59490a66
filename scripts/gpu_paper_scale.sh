#!/usr/bin/env bash
# The prepared GPU check for the field's protocol at paper scale (issue 20 §5), from the
# repository root on a CUDA machine:   OUT=/some/dir bash scripts/gpu_paper_scale.sh
# 1. tests/test_cuda.py (CPU/CUDA agreement, the protocol cell and the papers' nets included);
# 2. benchmarks/bench_paper_scale.py on CUDA: a ResNet-18 round of 10 clients, batched beside a
#    per-client loop;
# 3. the BackFed CIFAR-10 scenario (scenarios/literature/backfed_cifar10.toml) at reduced length
#    on *fabricated* CIFAR-format files (random pixels: a timing of the paper-scale round with
#    its warm-up, K = 10 of N = 100, ResNet-18 and the attack window, not an accuracy).
# Each part has its own time limit; everything is logged to $OUT/log.txt.
set -u
PY=${PY:-python3}
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
LOG="$OUT/log.txt"
T_TESTS=${T_TESTS:-200}; T_BENCH=${T_BENCH:-120}; T_RUN=${T_RUN:-200}
export PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
  echo "== 1. tests/test_cuda.py"
  timeout "$T_TESTS" "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py -q --durations=5 2>&1 | tail -30
  echo "tests rc=${PIPESTATUS[0]}"
  echo "== 2. benchmarks/bench_paper_scale.py --device cuda"
  timeout "$T_BENCH" "$PY" benchmarks/bench_paper_scale.py --device cuda --steps 16 --repeats 3 2>&1 | tail -25
  echo "bench rc=${PIPESTATUS[0]}"
  echo "== 3. BackFed CIFAR-10 scenario, reduced, on fabricated CIFAR-format files"
  DATA=/tmp/redteam_data; mkdir -p "$DATA/cifar10/cifar-10-batches-bin"
  "$PY" - "$DATA/cifar10/cifar-10-batches-bin" <<'PY'
import sys, numpy as np, pathlib
d = pathlib.Path(sys.argv[1]); rng = np.random.default_rng(0)
for name, n in [*[(f"data_batch_{i}.bin", 10000) for i in range(1, 6)], ("test_batch.bin", 10000)]:
    rec = np.empty((n, 3073), dtype=np.uint8)
    rec[:, 0] = rng.integers(0, 10, n); rec[:, 1:] = rng.integers(0, 256, (n, 3072))
    (d / name).write_bytes(rec.tobytes())
print("fabricated", d)
PY
  "$PY" - <<'PY'
import re, pathlib
s = pathlib.Path("scenarios/literature/backfed_cifar10.toml").read_text()
s = s.replace("warmup_rounds = 2000", "warmup_rounds = 10").replace("rounds = 600", "rounds = 20")
s = s.replace('window = "0:300"', 'window = "0:10"').replace("after_k = 100", "after_k = 5")
s = s.replace("seeds = 3", "seeds = 1").replace('requires = ["dataset:cifar10", "device:cuda"]', "")
s = re.sub(r'defenses = \[.*?\n\]', 'defenses = ["mean"]', s, flags=re.S)
s = s[:s.index("\n[[expect]]")]
pathlib.Path("/tmp/backfed_small.toml").write_text(s)
PY
  start=$(date +%s)
  REDTEAM_DATA_DIR="$DATA" timeout "$T_RUN" "$PY" -m redteam.cli matrix /tmp/backfed_small.toml --out "$OUT/backfed" \
      --device cuda --executor local --quiet 2>&1 | tail -25
  echo "backfed rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start )) s"
  "$PY" - "$OUT/backfed" <<'PY' 2>&1
import json, sqlite3, sys, pathlib
p = pathlib.Path(sys.argv[1]) / "results.sqlite"
if not p.exists(): print("no store"); raise SystemExit
con = sqlite3.connect(p)
for cell, base, wall, rounds in con.execute("select cell_id, baseline, wall_time_s, rounds from runs"):
    rs = json.loads(rounds)
    per = sorted(r["wall_time_s"] for r in rs)
    print(f"{cell} baseline={base} run wall {wall:.1f} s, rounds {len(rs)}, median round {per[len(per)//2]:.3f} s,"
          f" start {rs[0]['extra'].get('start', {})}")
PY
  date -u
} 2>&1 | tee "$LOG"
