#!/usr/bin/env bash
# Issue 17 round 6c, one GPU call: our kernel's causal mask forms (ci/fwd_variants.py: maskadd,
# minbias, noguard_min; same = noise) beside spak.fmha, the sample, cuDNN and flash, three
# timing rounds per shape (round 6b: the select form costs the sample 4-6%).
#   source .carry18d/setup.sh && export SPAK_COMMIT=... && bash ci/fwd_round6c_ab.sh
# Writes $OUT/round6c.tar.xz. ~2 min on an H100.
set -u
export PYTHONUNBUFFERED=1
W=/tmp/round6c && rm -rf $W && mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt 2>&1
python ci/fwd_variants.py $W/var > /dev/null || { echo "fwd_variants failed"; exit 1; }
V=""
for n in same maskadd minbias noguard_min; do V="$V --variant v_$n=$W/var/$n.py"; done
python ci/fwd_peers_bench.py --out $W/peers --budget-s 300 --compile-jobs 14 --dtypes fp16 \
  --repeats 3 --shapes 32x32x512x64/causal 16x32x1024x64/causal 8x32x2048x64/causal \
  16x16x2048x64/causal 2x8x512x64/causal 8x32x2048x64/noncausal 16x16x1024x128/causal $V \
  > $W/bench-stdout.txt 2>&1
echo "bench rc $?" >> $W/bench-stdout.txt
rm -rf $W/var
cd /tmp && tar cJf $OUT/round6c.tar.xz round6c && ls -la $OUT
tail -12 $W/bench-stdout.txt
