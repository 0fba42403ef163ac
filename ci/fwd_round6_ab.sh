#!/usr/bin/env bash
# Issue 17 round 6, one GPU call: the reverse bisection. Copies of NVIDIA's sample, each with
# one of SPAK's choices (ci/fwd_sample_variants.py: s_reversed, s_ourgrid, s_twoloop,
# s_rawmax, s_ours = all four, s_same = noise), launched as sample@spak (the sample at
# spak.fmha's tiles and hints), beside spak.fmha, the sample's configs, cuDNN and flash, in
# one fwd_peers_bench run with three timing rounds per shape (shuffled orders).
#   source .carry18d/setup.sh && export SPAK_COMMIT=... && bash ci/fwd_round6_ab.sh
# Shapes: the three D=64 causal shapes where the sample leads (rounds 2-5) and two D=128
# noncausal ones where sample@spak led in results/fwd-peers-repeats-h100-2026-11-24e.
# Round 6b: VARIANTS="s_same s_ours s_guards s_selmask s_params s_ours2"
#   SHAPES="32x32x512x64/causal 16x32x1024x64/causal 8x32x2048x64/causal"
# KIND=ours: copies of OUR kernel instead (ci/fwd_variants.py, --variant v_<name>): round
# 6c, ci/fwd_round6c_ab.sh. Writes $OUT/${TAG:-round6ab}.tar.xz. ~2-3 min on an H100.
set -u
export PYTHONUNBUFFERED=1
TAG=${TAG:-round6ab}
W=/tmp/$TAG && rm -rf $W && mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt 2>&1
if [ "${KIND:-sample}" = ours ]; then
  GEN=ci/fwd_variants.py; FLAG=--variant; PREFIX=v_
  NAMES=${VARIANTS:-"same maskadd minbias noguard_min"}
else
  GEN=ci/fwd_sample_variants.py; FLAG=--sample-variant; PREFIX=
  NAMES=${VARIANTS:-"s_same s_reversed s_ourgrid s_twoloop s_rawmax s_ours"}
fi
python $GEN $W/var > /dev/null || { echo "$GEN failed"; exit 1; }
V=""
for n in $NAMES; do V="$V $FLAG $PREFIX$n=$W/var/$n.py"; done
SHAPES=${SHAPES:-"32x32x512x64/causal 16x32x1024x64/causal 8x32x2048x64/causal \
  4x16x4096x128/noncausal 2x16x8192x128/noncausal"}
python ci/fwd_peers_bench.py --out $W/peers --budget-s ${AB_BUDGET_S:-300} --compile-jobs 14 \
  --dtypes fp16 --repeats 3 --shapes $SHAPES $V > $W/bench-stdout.txt 2>&1
echo "bench rc $?" >> $W/bench-stdout.txt
rm -rf $W/var
cd /tmp && tar cJf $OUT/$TAG.tar.xz $TAG && ls -la $OUT
tail -14 $W/bench-stdout.txt
