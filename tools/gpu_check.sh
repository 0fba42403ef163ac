#!/usr/bin/env bash
# The GPU loop on an H100/H200, in one call: set-up diagnosis, a smoke test, the GPU tests,
# and `spak run`. Logs and results go to $OUT (default ./gpu-out); a summary prints last.
#   bash tools/gpu_check.sh smoke   # diagnosis, tiny fmha vs SDPA, pytest -m gpu, spak run seed
#   bash tools/gpu_check.sh awkward # only the awkward-shape correctness run
#   bash tools/gpu_check.sh full    # pytest -m gpu; spak run: standard+seed (both kernels, timed),
#                                # awkward shapes (correctness), standard bf16 (fused, timed)
# On this workplace's GPU machine, first: source .carry/setup.sh (cuTile + tileiras bundle).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mode=${1:-smoke}
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
py=${PYTHON:-python3}
sum="$OUT/summary.txt"; : > "$sum"
step() {  # step NAME TIMEOUT CMD...: run, log to $OUT/NAME.txt, record rc
  local name=$1 t=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/$name.txt"
  local s=$SECONDS
  timeout "$t" "$@" 2>&1 | tee -a "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc $((SECONDS - s))s" | tee -a "$sum"
}

awkward() {  # correctness of both kernels on awkward shapes, fp16 and bf16, no timing
  step run-awkward "$1" $py -m spak run --kernel all --no-time --dtype all --causal both \
    --shapes default 1x16:2x1000x64 2x8:1x333x128/mask 1x8:1x1:4096x128 1x4x17x128/boolmask \
    --out "$OUT/run-awkward.jsonl"
}

if [[ $mode == awkward ]]; then
  awkward 300
elif [[ $mode == smoke ]]; then
  step env 120 bash -c "nvidia-smi -L; $py -c 'import torch, cuda.tile as ct; print(torch.__version__, torch.version.cuda, ct.__version__, torch.cuda.get_device_name())'; $py -m spak.device.env"
  step smoke 300 $py - <<'PY'
import math, time, torch, spak
torch.manual_seed(0)
for kernel in ("fused", "naive"):
    for causal in (False, True):
        q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        t = time.time()
        o = spak.fmha(q, k, v, is_causal=causal, kernel=kernel)
        r = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        print(kernel, causal, "rel vs SDPA %.2e" % ((o.float() - r.float()).norm() / r.float().norm()).item(),
              "nan", int(o.isnan().sum()), "%.1fs" % (time.time() - t), flush=True)
PY
  step pytest 420 $py -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu.py
  step run-seed 300 $py -m spak run --kernel all --shapes seed --out "$OUT/run-seed.jsonl"
else   # ordered by priority, each step bounded so the whole fits a 10-minute call
  step run-standard 240 $py -m spak run --kernel all --naive-max-gb 64 --shapes standard seed \
    --out "$OUT/run.jsonl"
  step pytest 180 $py -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu.py
  awkward 150
  step run-standard 60 $py -m spak run --kernel fused --dtype bf16 --shapes standard \
    --out "$OUT/run.jsonl"
fi
echo "==== summary ($mode)"; cat "$sum"
for f in "$OUT"/*.txt; do grep -h -E "passed|failed|SPAK kernel cases|Error" "$f" | tail -3; done 2>/dev/null | tail -20
! grep -q -v " rc=0 " "$sum"     # exit 1 if any step failed or timed out
