#!/bin/bash
# Issue 18: `spak sweep --family fmha_decode` on one GPU, time-boxed, into a COPY of the
# tuned-config store under $OUT (the repository's store is merged by hand afterwards: other
# families' entries may change in the same session). One shape per store class of the
# issue's grid (fp16, D 128, Hq 32; group 1/4/32, Sq 1/4, contiguous/paged), B = 8, 32k
# cache: the store key has no batch or cache length. Usage (GPU box, repo root):
#   OUT=... BUDGET=400 bash ci/decode_store_sweep.sh
set -u
BUDGET=${BUDGET:-400}
SHAPES=""
for hkv in 32 8 1; do
  for sq in "" "4:"; do
    c=""; [ -n "$sq" ] && c="/causal"
    for pg in "" "/page16"; do SHAPES="$SHAPES 8x32:${hkv}x${sq}32768x128${c}${pg}"; done
  done
done
mkdir -p "$OUT/sweep"
cp spak/data/tuned_configs.json "$OUT/sweep/store.json"
python3 -m spak sweep --family fmha_decode --kernel splitkv --plan plans/fmha_decode.toml \
  --shapes $SHAPES --dtype fp16 --out "$OUT/sweep/sweep.jsonl" --budget-s "$BUDGET" \
  --compile-jobs 14 --update-store --store "$OUT/sweep/store.json" > "$OUT/sweep/log.txt" 2>&1
echo "rc=$?" >> "$OUT/sweep/log.txt"
xz -9 "$OUT/sweep/sweep.jsonl" "$OUT/sweep/log.txt"
