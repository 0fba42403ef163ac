#!/usr/bin/env bash
# issue 35 (round 2 on the GPU): the fused-dQ A/B one problem per process, small to large,
# each under its own timeout (round 1: every part hit its timeout with no row: a hang or a
# slow start could not be told apart). Hard bound: ~60 s precompile + 9 x 32 s.
set -u
OUT=${OUT:-/tmp/i35d}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${GPU:-0}
T0=$(date +%s)
SHAPES="1x2x128x64/causal 1x2x333x64/noncausal 16x12x1024x64/causal 32x12x512x64/noncausal 16x32:8x1000x128/causal 4x32:8x4096x128/causal 4x28:4x4096x128/causal 4x32x4096x96/causal 1x32:8x16384x128/causal"
timeout -k 2 ${I35_PRE:-60} python tools/bwd_fused_dq_ab.py --precompile 14 --shapes $SHAPES > "$OUT/precompile.txt" 2>&1
echo "precompile rc=$? $(( $(date +%s) - T0 ))s: $(grep -c ' ok ' "$OUT/precompile.txt") ok, $(tail -1 "$OUT/precompile.txt")"
for s in $SHAPES; do
  t=$(date +%s)
  timeout -k 2 ${I35_EACH:-30} python tools/bwd_fused_dq_ab.py --dtypes fp16 bf16 --reps 2 \
    --target-s 0.1 --shapes "$s" --out "$OUT/ab.jsonl" > "$OUT/ab-${s//[:\/]/_}.txt" 2>&1
  rc=$?
  echo "== $s rc=$rc $(( $(date +%s) - t ))s"; grep -v "^NVIDIA" "$OUT/ab-${s//[:\/]/_}.txt" | cut -c1-400 | tail -4
done
echo "i35d: $(( $(date +%s) - T0 ))s"
