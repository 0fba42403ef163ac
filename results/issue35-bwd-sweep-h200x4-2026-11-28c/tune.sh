#!/usr/bin/env bash
# Store sweeps on every GPU of the host (issues 35 and 33), one after the other:
#   1. fmha_bwd: the plan's sm_90 space (12 configs) x the 8 training shapes x fp16/bf16
#   2. fmha_decode: models-sweep (26 models x Sq 1/4 x contiguous/page64 x fp16/bf16), space
#      KT_FORM=0,2 MAX_ROWS=64,128 (8 configs; the plan's 18 did not fit this call)
# Writes $OUT/tune.tar.gz (JSONL rows with gpu_index, logs, stores built from the rows).
#   TUNE_S=400 (both sweeps' budget, split 40/60)
set -u
W=/tmp/tunework; rm -rf $W; mkdir -p $W
B=${TUNE_S:-400}
unset CUDA_VISIBLE_DEVICES
export CUDA_TILE_CACHE_DIR=$W/cache
t0=$(date +%s)
timeout -k 10 $((B + 30)) python -m spak sweep --family fmha_bwd --gpus all --dtype all \
  --budget-s $((B*9/10)) --out $W/bwd.jsonl --shapes 4x32:8x4096x128/causal \
  1x32:8x16384x128/causal 16x32:8x1000x128/causal 4x28:4x4096x128/causal 16x12x1024x64/causal \
  32x12x512x64/noncausal 4x32x4096x96/causal 2x16:8x4096x256/causal > $W/bwd.log 2>&1
echo "bwd rc=$? wall=$(( $(date +%s) - t0 ))s"; grep -E "^time:|^spak sweep:" $W/bwd.log
left=$(( B - ($(date +%s) - t0) ))
t1=$(date +%s)
if [ "${TUNE_DECODE:-0}" = 1 ]; then
timeout -k 10 $((left + 30)) python -m spak sweep --family fmha_decode --gpus all --dtype all \
  --shapes models-sweep --space KT_FORM=0,2 MAX_ROWS=64,128 --budget-s $left \
  --out $W/decode.jsonl > $W/decode.log 2>&1
echo "decode rc=$? wall=$(( $(date +%s) - t1 ))s"; grep -E "^time:|^spak sweep:" $W/decode.log
fi
for f in bwd decode; do
  [ -s $W/$f.jsonl ] && timeout 60 python -m spak store --family $([ $f = bwd ] && echo fmha_bwd || echo fmha_decode) --store $W/store-$f.json update $W/$f.jsonl > $W/store-$f.txt 2>&1
done
tail -3 $W/store-*.txt
rm -rf $W/cache; gzip -9 $W/*.jsonl
tar -C $W -czf $OUT/tune.tar.gz . && echo "wrote $OUT/tune.tar.gz"
