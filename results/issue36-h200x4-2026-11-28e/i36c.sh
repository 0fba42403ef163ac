#!/usr/bin/env bash
# Issue 36 (round 4: 60 shapes, 1260 jobs, the same 152 compile units; n4 then n1 (n2 with N2=1); after the
# driver's per-row fsync and scheduler scans were cut; probe only with PROBE=1)
# Issue 36 (round 2): `spak sweep --gpus` with CPU compile helpers (no torch, no CUDA
# context: spak.tune.cpu_compile), on ONE host with 4 GPUs (run it ALONE: it uses every GPU).
#
#   bash .gpujobs/i36.sh [--budget S] [--faults] [--dry-run]
#
# 0. Probe (GPU 0, <= 45 s): tools/cpu_compile_probe.py builds 5 compile units (3 forward,
#    2 backward, one masked) on the CPU (in parallel) into empty cuTile caches, then runs each unit's
#    real problem as the sweep's worker does with that cache: "same" (the launches found
#    every cubin, compiled nothing) or "different" with the demangled signature difference.
# 1. The same scaling sweep as 2026-11-28 (fused, the plan's sm_90 space: 18 configs x 16
#    shapes, fp16, causal and not: 336 jobs, 152 compile units) with --gpus 0,1,2,3, then
#    0,1, then 0; each COLD (its own empty cuTile cache dir); default helpers (CPU ones,
#    CPUs - GPUs of them). Per run: wall, the time breakdown (now with the helpers by kind
#    and the workers' first launches: cubins found in the disk cache vs compiled).
# 2. --faults: the fault runs of 2026-11-28 (worker killed + hang; driver killed + resume).
# 3. Ranking agreement, per-GPU speed, store update, report (spak.tune.scaling).
# Output: $OUT/i36.tar.gz (JSONL, logs, probe.json/txt, summary.txt, analysis.json, stores).
# Expected wall on 4x H200: probe ~30 s, n4 ~40 s, n2 ~60 s, n1 ~105 s, analysis ~20 s:
# ~260 s. Hard bound: --budget (default 300 s) + ~25 s (every step under `timeout`, each
# sweep under --budget-s; a step with too little time left is skipped and says so).
# --dry-run: the same steps on the CPU with fake workers (spak.tune.worker.FakeRunner);
# the probe runs its CPU half only.
set -u
BUDGET=560
DRY=0
FAULTS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) BUDGET=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --faults) FAULTS=1; shift ;;
    *) echo "usage: $0 [--budget S] [--faults] [--dry-run]"; exit 2 ;;
  esac
done
T0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
tl() { local l; l=$(left); [ "$l" -gt 8 ] && echo $(( l - 5 )) || echo 3; }   # a step's timeout
W=${I36_WORK:-/tmp/i36work}
rm -rf "$W"; mkdir -p "$W"
OUT=${OUT:-$W/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=python3
command -v $PY >/dev/null || PY=python
unset CUDA_VISIBLE_DEVICES        # a multi-GPU job: every GPU of the host
SHAPES="16x32x1024x64 8x32x2048x64 4x32x4096x64 2x32x8192x64 16x16x1024x128 8x16x2048x128 4x16x4096x128 2x16x8192x128 32x32x512x64 12x32x1536x64 6x32x3072x64 3x32x6144x64 24x16x768x128 12x16x1536x128 6x16x3072x128 3x16x6144x128 2x32x12288x64 2x16x12288x128 4x32x5120x64 8x32x2560x64 2x32x10240x64 16x32x1280x64 10x32x2048x64 48x32x256x64 4x16x5120x128 8x16x2560x128 2x16x10240x128 16x16x1280x128 10x16x2048x128 48x16x512x128"
FSHAPES="8x32x2048x64 4x32x4096x64 8x16x2048x128 4x16x4096x128"
if [ $DRY = 1 ]; then
  export SPAK_SWEEP_RUNNER='fake:{"delay_s":0.03,"compile_delay_s":0.05,"startup_s":1.0,"cpu_unmapped":["128x128/o2/c1"]}'
  ALL=0,1,2,3; CJ=2
  SHAPES="8x32x2048x64 4x32x4096x64 8x16x2048x128 4x16x4096x128"
  FSHAPES="8x32x2048x64 8x16x2048x128"
else
  $PY -c "import cuda.tile, torch" 2>/dev/null || { [ -f .carry/setup.sh ] && source .carry/setup.sh; }
  ALL=all; CJ=auto
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv > "$W/gpus.csv" 2>&1
fi
{ echo "commit ${SPAK_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}; nproc $(nproc); budget $BUDGET s; dry $DRY"
  $PY -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())" 2>&1 | tail -1
} > "$W/env.txt"
COMMON="--kernel fused --dtype fp16 --compile-jobs $CJ"
say() { echo "[i36 +$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/steps.txt"; }

# sweep NAME GPUS CACHE BUDGET_S [more spak sweep args...]: one sweep, its cache dir, logs
sweep() {
  local name=$1 gpus=$2 cache=$3 b=$4; shift 4
  local l; l=$(left)
  if [ "$l" -lt $(( b / 3 + 40 )) ]; then say "$name: skipped (${l}s left)"; return 1; fi
  [ "$b" -gt $(( l - 40 )) ] && b=$(( l - 40 ))     # 25 s kept for the analysis
  local t=$(date +%s)
  CUDA_TILE_CACHE_DIR="$W/cache-$cache" timeout -k 5 $(( b + 12 )) \
    $PY -m spak sweep $COMMON --gpus "$gpus" --out "$W/$name.jsonl" --budget-s "$b" "$@" \
    > "$W/$name.log" 2>&1
  local rc=$?
  say "$name: rc=$rc wall=$(( $(date +%s) - t ))s (--gpus $gpus, cache $cache, budget ${b}s)"
  grep -E "^time:|^  gpu[0-9]+:|^  compile helpers|^  first launches|^spak sweep: |^GPUs of one model" "$W/$name.log" | tee -a "$W/steps.txt"
  return 0
}

# ---------------------------------------------------------------- 0. probe (GPU 0)
say "start; $(cat "$W/env.txt" | tr '\n' ' ')"
PROBE_ARGS="--out $W/probe.json"; PT=45
[ $DRY = 1 ] && { PROBE_ARGS="$PROBE_ARGS --cpu-only"; PT=120; }    # a 2-core CPU: slower
[ "${PROBE:-0}" = 1 ] && CUDA_VISIBLE_DEVICES=0 timeout -k 5 $PT $PY tools/cpu_compile_probe.py $PROBE_ARGS \
  > "$W/probe.txt" 2>&1
say "probe: rc=$?"
grep -E "^probe|^    " "$W/probe.txt" | tee -a "$W/steps.txt"

# ---------------------------------------------------------------- 1. scaling, cold caches
sweep n4 $ALL c4 150 --shapes $SHAPES
[ "${N2:-0}" = 1 ] && sweep n2 0,1 c2 200 --shapes $SHAPES
sweep n1 0 c1 380 --shapes $SHAPES

# ---------------------------------------------------------------- 2. faults (warm cache c4)
if [ $FAULTS = 1 ]; then
# a) gpu2's worker killed mid-sweep, and one config that hangs on gpu1 (once)
HANGCFG=128x64/o2/c1
export SPAK_SWEEP_FAULTS="{\"1\": {\"hang\": [\"$HANGCFG\"], \"once\": \"$W/hang.fired\"}}"
if [ "$(left)" -gt 70 ]; then
  ( $PY - "$W/fa.jsonl" <<'EOF'
import json, os, signal, sys, time
out, t0 = sys.argv[1], time.time()
def rows():
    try:
        return [json.loads(l) for l in open(out) if l.strip()]
    except (OSError, ValueError):
        return []
pid = None
while time.time() - t0 < 90:
    rs = rows()
    start = next((r for r in rs if r.get("kind") == "start"), None)
    n = sum(1 for r in rs if r.get("kind") == "result")
    if start and n >= 25:
        gs = {g["gpu_index"]: g["pid"] for g in start["gpus"]}
        pid = gs.get(2, gs[max(gs, key=str)])        # gpu2, or the last GPU of a smaller host
        os.kill(pid, signal.SIGKILL)
        break
    time.sleep(0.1)
print(f"killed gpu2 worker pid {pid} after {n if pid else '-'} rows", flush=True)
EOF
  ) > "$W/fa.kill.txt" 2>&1 &
  KW=$!
  sweep fa $ALL c4 120 --shapes $FSHAPES --timeout 15
  wait $KW; cat "$W/fa.kill.txt" | tee -a "$W/steps.txt"
else
  say "fa: skipped ($(left)s left)"
fi
unset SPAK_SWEEP_FAULTS
# b) the driver killed mid-sweep, then --resume
if [ "$(left)" -gt 70 ]; then
  t=$(date +%s)
  CUDA_TILE_CACHE_DIR="$W/cache-c4" $PY -m spak sweep $COMMON --gpus $ALL --shapes $FSHAPES \
    --out "$W/fb.jsonl" --budget-s 100 > "$W/fb.log" 2>&1 &
  DP=$!
  $PY - "$W/fb.jsonl" "$DP" <<'EOF' | tee -a "$W/steps.txt"
import json, os, signal, sys, time
out, pid, t0 = sys.argv[1], int(sys.argv[2]), time.time()
n = 0
while time.time() - t0 < 90:
    try:
        n = sum(1 for l in open(out) if '"kind": "result"' in l)
    except OSError:
        n = 0
    if n >= 40:
        break
    time.sleep(0.1)
os.kill(pid, signal.SIGKILL)
print(f"fb: driver pid {pid} SIGKILLed after {n} result rows", flush=True)
EOF
  wait $DP 2>/dev/null
  sleep 2
  mv "$W/fb.log" "$W/fb.first.log"
  sweep fb $ALL c4 100 --shapes $FSHAPES --resume
  say "fb: kill + resume wall $(( $(date +%s) - t ))s"
else
  say "fb: skipped ($(left)s left)"
fi

else
  say "fa, fb: skipped (no --faults; they passed on 2026-11-28)"
fi

# ---------------------------------------------------------------- 3. analysis, store, report
timeout "$(tl)" $PY -m spak.tune.scaling "$W" > "$W/summary.txt" 2> "$W/analysis.err"
for f in n1 n2 n4; do
  [ -s "$W/$f.jsonl" ] && timeout "$(tl)" $PY -m spak store --store "$W/store-$f.json" \
    update "$W/$f.jsonl" > "$W/store-$f.txt" 2>&1
done
ls "$W"/n?.jsonl >/dev/null 2>&1 && timeout "$(tl)" $PY -m spak store --store "$W/store-all.json" \
  update "$W"/n?.jsonl > "$W/store-all.txt" 2>&1
if [ $FAULTS = 1 ]; then
  for f in fa fb; do
    [ -s "$W/$f.jsonl" ] && timeout "$(tl)" $PY -m spak sweep --list --arch sm_90 --kernel fused \
      --dtype fp16 --shapes $FSHAPES > "$W/$f.expected.txt" 2>&1
  done
fi
cat "$W/summary.txt"
grep -h "WARNING\|wrote" "$W"/store-*.txt 2>/dev/null | head -20
grep -h "^  compile helpers\|^  first launches\|^time:" "$W"/n?.log 2>/dev/null
say "done"
tar -C "$W" --exclude='cache-*' --exclude=./out -czf "$OUT/i36.tar.gz" . && echo "wrote $OUT/i36.tar.gz ($(du -h "$OUT/i36.tar.gz" | cut -f1))"
