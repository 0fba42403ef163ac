#!/usr/bin/env bash
# Issue 17 round 4, one GPU call (prepared, NOT yet run): what SPAK's guards cost at the current
# store configs, in the peers harness (do_bench, the sample and cuDNN in the same run, each
# variant's output bits compared with spak.fmha's). Variants from ci/fwd_variants.py:
#   same (noise), minbias (the causal mask as min with a +-inf bias: semantics kept),
#   epilogue / nosafe / noguard / noguard_min (guards off: NOT safe for +-inf inputs or huge
#   logits; they price what the non-finite promise costs, docs/perf-notes.md Round 4).
#   source .carry18/setup.sh && export SPAK_COMMIT=... && bash ci/fwd_round4_ab.sh
# Writes $OUT/round4ab.tar.xz. ~4-5 min on an H100 (14 fp16 cases x 13 providers).
set -u
export PYTHONUNBUFFERED=1
W=/tmp/round4ab && rm -rf $W && mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $W/gpu.txt 2>&1
python ci/fwd_variants.py $W/var > /dev/null
V=""
for n in same minbias epilogue nosafe noguard noguard_min; do V="$V --variant $n=$W/var/$n.py"; done
python ci/fwd_peers_bench.py --out $W/peers --budget-s ${AB_BUDGET_S:-330} --compile-jobs 14 \
  --dtypes fp16 --shapes 32x32x512x64 16x32x1024x64 8x32x2048x64 16x16x2048x64 2x8x512x64 \
  4x32x4096x64 16x16x1024x128 $V > $W/bench-stdout.txt 2>&1
echo "bench rc $?" >> $W/bench-stdout.txt
rm -rf $W/var
cd /tmp && tar cJf $OUT/round4ab.tar.xz round4ab && ls -la $OUT
tail -25 $W/bench-stdout.txt
