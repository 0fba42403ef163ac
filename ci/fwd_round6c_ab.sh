#!/usr/bin/env bash
# Issue 17 round 6c, one GPU call: our kernel's causal mask forms (ci/fwd_variants.py: maskadd,
# minbias, noguard_min; same = noise) beside spak.fmha, the sample, cuDNN and flash, three
# timing rounds per shape (round 6b: the select form costs the sample 4-6%). Writes
# $OUT/round6c.tar.xz. ~2 min on an H100.
#   source .carry18d/setup.sh && export SPAK_COMMIT=... && bash ci/fwd_round6c_ab.sh
KIND=ours TAG=round6c VARIANTS="same maskadd minbias noguard_min" \
SHAPES="32x32x512x64/causal 16x32x1024x64/causal 8x32x2048x64/causal 16x16x2048x64/causal \
  2x8x512x64/causal 8x32x2048x64/noncausal 16x16x1024x128/causal" \
exec bash "$(dirname "$0")/fwd_round6_ab.sh"
