#!/usr/bin/env bash
# Issue 17 round 5, one GPU call (prepared 2026-11-24d, NOT yet run): where NVIDIA's sample
# gains 5-10% at identical tiles at D=64 S <= 2048 causal, outside the loop bodies'
# instruction counts (docs/perf-notes.md "Round 5"). Peers harness (do_bench, the sample at
# its configs and at spak's, cuDNN, flash in the same run; each variant's bits compared with
# spak.fmha's). Variants from ci/fwd_variants.py, each bit-identical to spak on finite inputs:
#   same (noise), natural (no longest-first reversal: the sample's block order),
#   flatgrid (the sample's grid (tiles, B*Hq, 1): variant_grid, + a run-time division),
#   oneloop (one key loop with a branch, the sample's form), noguard_min (round 4's: the
#   sample's loop lengths), samplelike (all of them + lat24: every known source difference).
#   source .carry18/setup.sh && export SPAK_COMMIT=... && bash ci/fwd_round5_ab.sh
# Pass 1: 6 shapes x 2 causal modes (D=64 S <= 2048 + controls 4x32x4096x64, 16x16x1024x128);
# pass 2: the 4 D=64 S <= 2048 shapes again (single do_bench readings there carry ~+-10%).
# Writes $OUT/round5ab.tar.xz. ~4-5 min on an H100 (compiles run first, in parallel).
set -u
export PYTHONUNBUFFERED=1
W=/tmp/round5ab && rm -rf $W && mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv > $W/gpu.txt 2>&1
python ci/fwd_variants.py $W/var > /dev/null || { echo "fwd_variants failed"; exit 1; }
V=""
for n in same natural flatgrid oneloop noguard_min samplelike; do V="$V --variant v_$n=$W/var/$n.py"; done
D64="32x32x512x64 16x32x1024x64 8x32x2048x64 16x16x2048x64"
python ci/fwd_peers_bench.py --out $W/peers1 --budget-s ${AB_BUDGET_S:-240} --compile-jobs 14 \
  --dtypes fp16 --shapes $D64 4x32x4096x64 16x16x1024x128 $V > $W/bench1-stdout.txt 2>&1
echo "bench rc $?" >> $W/bench1-stdout.txt
python ci/fwd_peers_bench.py --out $W/peers2 --budget-s ${AB_BUDGET_S2:-140} --compile-jobs 14 \
  --dtypes fp16 --shapes $D64 $V > $W/bench2-stdout.txt 2>&1
echo "bench rc $?" >> $W/bench2-stdout.txt
rm -rf $W/var
cd /tmp && tar cJf $OUT/round5ab.tar.xz round5ab && ls -la $OUT
tail -20 $W/bench1-stdout.txt; tail -12 $W/bench2-stdout.txt
