#!/usr/bin/env bash
# Issue 17 round 3, one GPU call: [re-sweep of the flagged store cells + store update]
# then ci/fwd_peers_bench.py (spak.fmha with the store as it is now vs NVIDIA's sample vs
# SDPA cuDNN/flash) on the 24 standard + seed shapes, fp16 and bf16, under one 600 s limit.
#   source .carry18/setup.sh && export SPAK_COMMIT=... && bash ci/fwd_round3_gpu.sh resweep
#   ... && bash ci/fwd_round3_gpu.sh bench-only
# BENCH_ARGS: extra ci/fwd_peers_bench.py arguments (e.g. "--dtypes bf16 fp16": bf16 first).
# Writes $OUT/round3.tar.xz (resweep/, peers/, the store after the update, nvidia-smi).
set -u
MODE=${1:-resweep}
LIMIT=${ROUND3_LIMIT_S:-585}          # seconds of this call the bench may still use
T0=$(date +%s)
export PYTHONUNBUFFERED=1
W=/tmp/round3 && rm -rf $W && mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $W/gpu.txt 2>&1
if [ "$MODE" = resweep ]; then
  python ci/fwd_store_resweep.py --out $W/resweep --update-store --budget-s ${RESWEEP_BUDGET_S:-190} ${RESWEEP_ARGS:-} \
    > $W/resweep-stdout.txt 2>&1
  echo "resweep rc $?" >> $W/resweep-stdout.txt
  cp spak/data/tuned_configs.json $W/tuned_configs.after.json
  (cd /tmp && tar cJf $OUT/resweep.tar.xz round3)   # kept even if the bench runs out of time
fi
USED=$(( $(date +%s) - T0 ))
BUDGET=$(( LIMIT - USED - 25 ))
echo "bench budget ${BUDGET} s (used ${USED} s)" > $W/bench-stdout.txt
python ci/fwd_peers_bench.py --out $W/peers --budget-s $BUDGET --compile-jobs 14 ${BENCH_ARGS:-} \
  >> $W/bench-stdout.txt 2>&1
echo "bench rc $?" >> $W/bench-stdout.txt
cd /tmp && tar cJf $OUT/round3.tar.xz round3 && ls -la $OUT
tail -30 $W/bench-stdout.txt
tail -45 $W/resweep-stdout.txt 2>/dev/null | grep -v "^  " | tail -45
