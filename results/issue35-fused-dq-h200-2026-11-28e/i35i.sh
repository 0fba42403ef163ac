#!/usr/bin/env bash
set -u
OUT=${OUT:-/tmp/i35i}; W=$OUT/i35i; mkdir -p $W
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${GPU:-0} SPAK_BWD_FUSED_DQ_GPU=1
T0=$(date +%s)
S1="1x8:2x2048x128/causal 4x8:2x2048x128/causal 8x8:2x2048x128/causal"
AB="4x32:8x4096x128/causal 16x12x1024x64/causal 16x32:8x1000x128/causal 4x28:4x4096x128/causal 32x12x512x64/noncausal 4x32x4096x96/causal 1x32:8x16384x128/causal"
timeout -k 2 60 python tools/bwd_fused_dq_ab.py --precompile 14 --shapes $S1 $AB > $W/precompile.txt 2>&1
echo "precompile rc=$? $(( $(date +%s) - T0 ))s $(tail -1 $W/precompile.txt)"
OUT=$W I35_DTYPES=fp16 I35_BUDGET=${I35_B1:-150} timeout -k 2 ${I35_T1:-200} python .gpujobs/i35i.py $S1 $AB > $W/fp16.txt 2>&1
echo "fp16 rc=$? $(( $(date +%s) - T0 ))s"; grep -E "HANG|^\+.*(TFLOPS|check)|Error|not run" $W/fp16.txt | cut -c1-420
OUT=$W I35_DTYPES=bf16 I35_BUDGET=${I35_B2:-120} timeout -k 2 ${I35_T2:-150} python .gpujobs/i35i.py $AB > $W/bf16.txt 2>&1
echo "bf16 rc=$? $(( $(date +%s) - T0 ))s"; grep -E "HANG|^\+.*TFLOPS|Error|not run" $W/bf16.txt | cut -c1-420
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/gpu.txt
echo "commit $(git rev-parse --short HEAD) wall $(( $(date +%s) - T0 ))s" | tee $W/wall.txt
tar -czf $OUT/i35i.tar.gz -C $OUT i35i
