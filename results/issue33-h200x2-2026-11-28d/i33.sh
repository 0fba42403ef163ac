#!/usr/bin/env bash
# Issue 33 (helper 33g): the decode gate's one-GPU slice with its peers, and the issue's
# missing figures, on ONE H200 (GPU ${GPU:-0}). From the repo root after
# `source .carry/setup.sh`; TileGym at .peers/tilegym/src (the lead copies it there).
#
#   C  CPU compile helpers build every kernel of A and B into cuTile's disk cache
#      (tools/decode_gate_plan.py --precompile 10): no CUDA context, no GPU work, so it runs
#      beside A; a kernel it misses is compiled by A's own first call (rows' first_call_s).
#   A  THE GATE (its slice): spak run --family fmha_decode --shapes models-gate
#      20 shapes, one of `models` per model (fp16, kernel mode, 3 turns, --no-sim); peers of
#      the same run: SDPA cuDNN/flash/efficient and TileGym's cuTile decode where they have a
#      form (10 contiguous full-length Sq-1 shapes), FlashInfer (a note: not on the GPU
#      machine, docs/fmha-decode.md), a same-size device copy on every shape. --plot.
#   B  a SECOND process: 3 of A's cases again (run-to-run stability: the same calls in two
#      processes, beside the same-size copy's two timings), then models-pages --dtype all:
#      qwen2.5-7b 8x28:4x16384 (group 7) and llama3.1-8b 32x32:8x4096 contiguous and in
#      16/64/256-key pages, fp16 and bf16 (paged vs contiguous, bf16 vs fp16), pairs kept
#      together so a cut leaves whole pairs. --plot.
#   S  the summary (tools/decode_models_table.py --summary): gate pass counts, ours / best
#      peer, of copy, paged / contiguous, bf16 / fp16, the stability pairs.
# Bounds: A `timeout 100`; B the rest of BUDGET_S=140 (at least 25 s); C inside A's time;
# with the summary and the tar <= ~150 s (145 s when A runs to its bound: A 100 + B 40;
# B at least 25 s). Estimates (tools/decode_gate_plan.py, warm cache): A
# ~87 s, B ~75 s for all of it, so B's tail (llama3.1-8b's pages) may be cut; rows are
# written as each shape finishes. Each part fails soft. Writes $OUT/i33.tar.gz
# (gate.jsonl, second.jsonl, *.png, *.log, summary.txt, table.txt).
#
#   DRY=1                 print the commands only (CPU check)
#   I33_PRECOMPILE=0      no CPU compile helpers (part C)
#   AGREE_GPU=N           also the simulator agreement of models-gate (fp16+bf16, --no-time)
#                         on GPU N, beside A/B (another GPU only), timeout 140
#   I33_GATE=full GPUS="0 1 2 3" FULL_S=540   the WHOLE gate instead of A/B: the 333
#                         `models` shapes dealt round-robin to the GPUs listed, one
#                         `spak run --no-sim` each (estimate ~1040 s warm on one GPU, so
#                         ~270 s each on 4), after/beside 48 CPU compile helpers
set -u
OUT=${OUT:-/tmp/i33_out}
W=$(mktemp -d)
export PYTHONPATH=".:.peers/tilegym/src:${PYTHONPATH:-}"
GPU=${GPU:-0}
BUDGET_S=${BUDGET_S:-140}     # A + B together (B gets the rest, at least 25 s)
STAB=("8x32:8x65536x128/noncausal/model=mistral-7b/fp16"
      "128x32:8x1024x128/noncausal/model=mixtral-8x7b/fp16"
      "128x28:4x4:1024x128/page64/causal/model=qwen2.5-7b/fp16")
run() {   # run NAME SECONDS CMD...: under a hard timeout, output to NAME.log
  local name=$1 secs=$2; shift 2
  if [[ -n "${DRY:-}" ]]; then echo "[$name ${secs}s] $*"; return 0; fi
  local t0=$SECONDS
  timeout -k 3 "$secs" "$@" > "$W/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s" >> "$W/summary.txt"
}
RUN=(python -m spak run --family fmha_decode --no-sim)

if [[ "${I33_GATE:-slice}" == full ]]; then
  read -r -a G <<< "${GPUS:-0 1 2 3}"
  n=${#G[@]}
  run precompile "${FULL_S:-540}" python tools/decode_gate_plan.py --shapes models \
      --precompile "${JOBS:-48}" &
  for i in "${!G[@]}"; do
    mapfile -t S < <(python -c "from spak.families.fmha_decode import FAMILY
print('\n'.join(FAMILY.shape_sets['models'][$i::$n]))")
    CUDA_VISIBLE_DEVICES=${G[$i]} run "full_$i" "${FULL_S:-540}" "${RUN[@]}" \
        --shapes "${S[@]}" --out "$W/full_$i.jsonl" &
  done
  wait
  cat "$W"/full_*.jsonl > "$W/gate_full.jsonl" 2>/dev/null   # one run's table: all shards
  FILES=("$W/gate_full.jsonl")
else
  [[ "${I33_PRECOMPILE:-1}" != 0 ]] && {  # A's kernels (fp16), B's pages (both), agreement bf16
    run precompile 60 python tools/decode_gate_plan.py --shapes models-gate --precompile 10
    run precompile_pages 40 python tools/decode_gate_plan.py --shapes models-pages \
        --dtype all --precompile 10
    [[ -n "${AGREE_GPU:-}" ]] && run precompile_bf16 40 python tools/decode_gate_plan.py \
        --shapes models-gate --dtype bf16 --precompile 10
  } &
  if [[ -n "${AGREE_GPU:-}" ]]; then
    CUDA_VISIBLE_DEVICES=$AGREE_GPU run agree 140 python -m spak run --family fmha_decode \
        --no-time --dtype all --shapes models-gate --out "$W/agree.jsonl" &
  fi
  export CUDA_VISIBLE_DEVICES=$GPU
  T0=$SECONDS
  run gate 100 "${RUN[@]}" --shapes models-gate --out "$W/gate.jsonl" --plot "$W/gate.png"
  left=$((BUDGET_S - (SECONDS - T0)))           # B takes what A left of the budget
  run second $((left > 25 ? left : 25)) "${RUN[@]}" --dtype all --shapes "${STAB[@]}" \
      models-pages --out "$W/second.jsonl" --plot "$W/pages.png"
  wait
  FILES=("$W/gate.jsonl" "$W/second.jsonl")
fi
if [[ -n "${DRY:-}" ]]; then rm -rf "$W"; exit 0; fi
sort "$W/summary.txt"
grep -h "SPAK kernel cases passed\|plot:" "$W"/*.log 2>/dev/null | head -10
grep -h "precompiled" "$W"/precompile*.log 2>/dev/null
python tools/decode_models_table.py --summary "${FILES[@]}" > "$W/table.txt" 2>&1
head -80 "$W/table.txt"
mkdir -p "$OUT"
tar -czf "$OUT/i33.tar.gz" -C "$W" $(cd "$W" && ls *.jsonl *.png *.log summary.txt table.txt \
  2>/dev/null)
echo "wrote $OUT/i33.tar.gz"
