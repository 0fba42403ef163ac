#!/usr/bin/env bash
# issue 35 round 4 (session 2026-11-28e): the fused-dQ backward after the acquire fix
# (ct.atomic_add(..., 0.0, ACQUIRE) in place of a weak ct.load spin). Stages:
#  probe  (<= 45 s): i35e.py on 1x2x128x64 causal fp16: does synchronize return?
#  sim    (<= 60 s): spak run --kernel fused_dq --no-time: GPU bits vs the CPU simulator
#  ab     (<= 200 s): tools/bwd_fused_dq_ab.py on the 7 training shapes, fp16 + bf16
# Only if the probe completes do sim and ab run. Writes $OUT/i35h.tar.gz.
set -u
OUT=${OUT:-/tmp/i35h}; W=$OUT/i35h; mkdir -p $W/probe $W/sim $W/ab
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${GPU:-0} SPAK_BWD_FUSED_DQ_GPU=1
T0=$(date +%s)
AB="4x32:8x4096x128/causal 1x32:8x16384x128/causal 16x32:8x1000x128/causal \
4x28:4x4096x128/causal 16x12x1024x64/causal 32x12x512x64/noncausal 4x32x4096x96/causal"
SIM="1x4:2x1000x128/causal 1x2x333x64/noncausal"
( timeout -k 2 70 python tools/bwd_fused_dq_ab.py --precompile 12 --shapes $AB > $W/ab/precompile.txt 2>&1 ) &
OUT=$W/probe I35_DTYPES=fp16 I35_BUDGET=20 timeout -k 2 45 python .gpujobs/i35e.py 1x2x128x64/causal > $W/probe/log.txt 2>&1
echo "probe rc=$? $(( $(date +%s) - T0 ))s"; grep -vE "^ *File|^Thread|^Current|^\s*$" $W/probe/log.txt | cut -c1-300 | tail -8
if grep -q "i35e done" $W/probe/log.txt; then
  timeout -k 2 60 python -m spak run --family fmha_bwd --kernel fused_dq --no-time --dtype all \
    --sim-work 67108864 --shapes $SIM --out $W/sim/run.jsonl > $W/sim/log.txt 2>&1
  echo "sim rc=$? $(( $(date +%s) - T0 ))s"; tail -15 $W/sim/log.txt | cut -c1-300
  wait
  timeout -k 2 230 python tools/bwd_fused_dq_ab.py --dtypes fp16 bf16 --reps 2 --target-s 0.1 \
    --budget-s 200 --shapes $AB --out $W/ab/ab.jsonl > $W/ab/log.txt 2>&1
  echo "ab rc=$? $(( $(date +%s) - T0 ))s"; grep -E "^(fp16|bf16) |Error|Traceback" $W/ab/log.txt | cut -c1-400
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/gpu.txt 2>/dev/null
echo "commit $(git rev-parse --short HEAD) wall $(( $(date +%s) - T0 ))s" | tee $W/wall.txt
tar -czf $OUT/i35h.tar.gz -C $OUT i35h
