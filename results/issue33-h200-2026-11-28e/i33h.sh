#!/usr/bin/env bash
# Issue 33 (helper 33h): the plan rules INDEX32 (a contiguous cache past 2^31 elements in
# 32-bit launches over batch ranges) and TN_FIT (64-key tiles where sm_90 spills a gathered
# 128-key tile in the rows form), before and after, on ONE H200 (GPU ${GPU:-0}). From the
# repo root after `source .carry/setup.sh`; TileGym at .peers/tilegym/src (optional).
#
#   P  CPU compile helpers fill cuTile's disk cache with A's launches (all 5 kernels), then
#      C's configs and D's bf16 (tools/decode_gate_plan.py --precompile 12; no CUDA context), beside A;
#      a unit not yet built when its row comes is compiled by that row's first call.
#   A  spak run --family fmha_decode --no-sim --kernel all on the models-gate's worst rows
#      (Yi-34B group 7 contiguous 2^31 elements, Falcon-7B Sq 4 group 71 64-key pages,
#      Mixtral-8x22B Sq 4 16-key pages, Phi-3-medium, Qwen2.5-72B) and 3 more rows the
#      TN_FIT rule changes or must leave alone (Llama-3.1-70B Sq 4 16-key pages, Falcon-7B
#      batch 1, Qwen2.5-7B Sq 4 64-key pages): splitkv (after) and splitkv_prev (before:
#      tiles INDEX32 0, TN_FIT 0) in ONE process beside the keys forms, the former tiling,
#      SDPA (Yi only) and a same-size copy. timeout 100.
#   C  alternatives, ONE process (tools/decode_tiles_probe.py: the family's planned call per
#      config, float64-checked, beside a same-size copy): Falcon-7B's row tiles (MAX_ROWS
#      32/64/128/256 x TILE_N 64/128: fewer tiles read K/V fewer times but spill on sm_90;
#      128 and 256 rows over clusters of 2 / 4 CTAs at 64 keys: no stack on sm_90 and the
#      K/V tiles multicast to the cluster, UTMALDG.MULTICAST),
#      Mixtral-8x22B's (16 rows, keys_vt at 64 keys, 32-key tiles, page ids a tile ahead, 2
#      splits), and the split count /
#      key tile of the two ragged rows (Phi-3-medium, Qwen2.5-72B); last, Yi-34B on 256-key
#      pages with a pool past 2^31 elements (INDEX32 cannot cut a pool: the int64 twin's
#      cost on a paged plan). timeout 75.
#   D  simulator agreement (--no-time, fp16 and bf16): the gate rows of the changed forms
#      (Yi's batch ranges, Mixtral's and Falcon's fitted tiles; slices: batch 0, kv head 0)
#      and the groups set's two new CI cases; --sim-work 2^27 keeps Falcon's slice at one
#      padded tile of 16 heads (all 71 are ~14 s a dtype on a 2-core CPU). timeout 55.
#   S  tools/decode_ab_table.py: per case each kernel's ms and share of the copy,
#      after/before; the agreement lines.
# Bound: 100 + 75 + 55 + ~5 s (summary, tar) <= 235 s; P (CPU only) runs beside A and C. Each part fails
# soft. Writes $OUT/i33h.tar.gz (a.jsonl, c.jsonl, d.jsonl, *.log, summary.txt, table.txt).
#
#   DRY=1              print the commands only (CPU check)
#   I33H_PRECOMPILE=0  no CPU compile helpers
set -u
OUT=${OUT:-/tmp/i33h_out}
W=$(mktemp -d)
export PYTHONPATH=".:.peers/tilegym/src:${PYTHONPATH:-}"
export CUDA_VISIBLE_DEVICES=${GPU:-0}
ROWS=("128x56:8x16384x128/noncausal/model=yi-34b/fp16"
      "128x71:1x4:16384x64/causal/page64/model=falcon-7b/fp16"
      "32x48:8x4:4096x128/causal/page16/model=mixtral-8x22b/fp16"
      "32x40:10x1024x128/noncausal/page16/ragged/model=phi3-medium/fp16"
      "8x64:8x4096x128/noncausal/page256/ragged/model=qwen2.5-72b/fp16"
      "8x64:8x4:1024x128/causal/page16/model=llama3.1-70b/fp16"
      "1x71:1x4:4096x64/causal/page64/model=falcon-7b/fp16"
      "128x28:4x4:1024x128/causal/page64/model=qwen2.5-7b/fp16")
FAL="128x71:1x4:16384x64/causal/page64/model=falcon-7b/fp16"
FAL_C=('{"TN_FIT": 0}' '{}' '{"MAX_ROWS": 32, "TN_FIT": 0}'
       '{"MAX_ROWS": 128, "TILE_N": 64, "TN_FIT": 0}' '{"MAX_ROWS": 128, "TN_FIT": 0}'
       '{"MAX_ROWS": 256, "TILE_N": 64, "TN_FIT": 0}'
       '{"MAX_ROWS": 128, "TILE_N": 64, "NUM_CTAS": 2, "TN_FIT": 0}'
       '{"MAX_ROWS": 256, "TILE_N": 64, "NUM_CTAS": 4, "TN_FIT": 0}')
MIX="32x48:8x4:4096x128/causal/page16/model=mixtral-8x22b/fp16"
MIX_C=('{"TN_FIT": 0}' '{}' '{"MAX_ROWS": 16}' '{"KT_FORM": 2, "TILE_N": 64}' '{"TILE_N": 32}'
       '{"PAGE_AHEAD": 1}' '{"num_splits": 2}')
PHI="32x40:10x1024x128/noncausal/page16/ragged/model=phi3-medium/fp16"
PHI_C=('{}' '{"num_splits": 2}' '{"num_splits": 4}' '{"TILE_N": 64}')
QW="8x64:8x4096x128/noncausal/page256/ragged/model=qwen2.5-72b/fp16"
QW_C=('{}' '{"num_splits": 1}' '{"num_splits": 4}' '{"num_splits": 8}' '{"TILE_N": 64}')
# last (cut first by the bound): a paged pool past 2^31 elements, still the int64 twin
BIGP="32x56:8x65536x128/noncausal/page256/model=yi-34b/fp16"
ALT=("$FAL" "${FAL_C[@]}" "$MIX" "${MIX_C[@]}" "$PHI" "${PHI_C[@]}" "$QW" "${QW_C[@]}"
     "$BIGP" '{}')
AGREE=("128x56:8x16384x128/noncausal/model=yi-34b"
       "128x71:1x4:16384x64/causal/page64/model=falcon-7b"
       "32x48:8x4:4096x128/causal/page16/model=mixtral-8x22b"
       "2x12:2x4:100x128/causal/page16/lens=100:37/splits=2"
       "1x71:1x4:150x64/causal/page64/lens=150")
run() {   # run NAME SECONDS CMD...: under a hard timeout, output to NAME.log
  local name=$1 secs=$2; shift 2
  if [[ -n "${DRY:-}" ]]; then echo "[$name ${secs}s] $*"; return 0; fi
  local t0=$SECONDS
  timeout -k 3 "$secs" "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s" >> "$W/summary.txt"
}
RUN=(python -m spak run --family fmha_decode)
T0=$SECONDS
if [[ "${I33H_PRECOMPILE:-1}" != 0 ]]; then   # A's 5 kernels x 8 rows, then C's, D's bf16
  { run precompile 100 python tools/decode_gate_plan.py --shapes "${ROWS[@]}" --kernels all \
        --precompile 12
    PC=(python tools/decode_gate_plan.py --precompile 12 --shapes)
    run precompile_c1 30 "${PC[@]}" "$FAL" --configs "${FAL_C[@]}"
    run precompile_c2 30 "${PC[@]}" "$MIX" --configs "${MIX_C[@]}"
    run precompile_c3 30 "${PC[@]}" "$PHI" "$QW" --configs "${PHI_C[@]}" "${QW_C[@]}"
    run precompile_d 40 "${PC[@]}" "${AGREE[@]}" --dtype all; } &
fi
run a 100 "${RUN[@]}" --no-sim --kernel all --shapes "${ROWS[@]}" --out "$W/a.jsonl"
run c ${I33H_C:-75} python tools/decode_tiles_probe.py --out "$W/c.jsonl" "${ALT[@]}"
run d 55 "${RUN[@]}" --no-time --dtype all --sim-work 134217728 --shapes "${AGREE[@]}" \
    --out "$W/d.jsonl"
wait
if [[ -n "${DRY:-}" ]]; then
  python tools/decode_ab_table.py --agree /dev/null > /dev/null && echo "table tool ok"
  rm -rf "$W"; exit 0
fi
echo "total $((SECONDS - T0)) s" >> "$W/summary.txt"
sort "$W/summary.txt"
grep -h "cases passed\|Error\|error:" "$W"/a.log "$W"/c.log "$W"/d.log 2>/dev/null | head -12
grep -h "precompiled" "$W"/precompile*.log 2>/dev/null
{ python tools/decode_ab_table.py "$W/a.jsonl" --agree "$W/d.jsonl"
  echo; echo "alternatives (C): case | config | ms | of copy | TILE_N | grid | check"
  python -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r.get("case"), "|", json.dumps(r.get("config")), "|", "%.4f" % r["ms"] if "ms" in r
          else r.get("error"), "|", "%.2f" % r.get("of_copy", 0), "|", r.get("tile_n"), "|",
          r.get("grid"), "|", r.get("passed"), r.get("rel_l2"))' "$W/c.jsonl"; } \
    > "$W/table.txt" 2>&1
cat "$W/table.txt" | cut -c1-400 | head -60
mkdir -p "$OUT"
tar -czf "$OUT/i33h.tar.gz" -C "$W" $(cd "$W" && ls *.jsonl *.log summary.txt table.txt \
  2>/dev/null)
echo "wrote $OUT/i33h.tar.gz"
