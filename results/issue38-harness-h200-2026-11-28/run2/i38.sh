#!/usr/bin/env bash
# Issue 38 on the GPU (helper 38c's version): the forward headline's same-run peer table.
#  fwd:     `spak run` on 2 standard shapes (D 128 noncausal, D 64 causal), fp16, timing
#           kernel + eager, 3 shuffled turns, peers sdpa (flash/cuDNN/efficient) and NVIDIA's
#           cuTile sample (its own config per D). Bound 85 s.
#  tilegym: the first of those shapes against TileGym's tile_fmha alone (it autotunes 4
#           configs on its first call, ~15-20 s, which the 2026-11-28 run showed eats the
#           fwd part's budget), timing kernel. Bound min(40 s, what is left of 140 s).
# Hard wall bound: 150 s (setup <= ~10 s + 85 + 40 + tar). GPU ${GPU:-0} only. Fails soft:
# rows are written as each shape finishes, so a part cut by its timeout keeps them.
# Output: $OUT/i38.tar.gz with i38/{fwd,tilegym}.{jsonl,png,log}, summary.txt.
# Dry run on a CPU: DRY=1 bash .gpujobs/i38.sh (prints the commands only).
set -u
START=$(date +%s)
[ -z "${DRY:-}" ] && [ -f .carry/setup.sh ] && source .carry/setup.sh   # from the repo root
# NVIDIA's sample travels as .peers_pack/peers.tar.xz (python tools/peers_fetch.py here)
if [ ! -d .peers/samples ] && [ -f .peers_pack/peers.tar.xz ]; then
  tar xJf .peers_pack/peers.tar.xz
fi
export CUDA_VISIBLE_DEVICES=${GPU:-0}
export PYTHONPATH="$PWD/.peers/tilegym/src${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/i38-out}
W=$(mktemp -d)/i38
mkdir -p "$W" "$OUT"
SHAPES="4x16x4096x128/noncausal 8x32x2048x64/causal"
run() {   # name seconds args...: one run, its log kept, failure noted
  local name=$1 secs=$2; shift 2
  echo "== $name: spak run $* (limit ${secs}s)" | tee -a "$W/summary.txt"
  if [ -n "${DRY:-}" ]; then return 0; fi
  timeout -k 5 "$secs" python -m spak run "$@" --out "$W/$name.jsonl" --plot "$W/$name.png" \
    >"$W/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc at $(( $(date +%s) - START )) s" | tee -a "$W/summary.txt"
  grep -E "^spak run on|passed|^fused|^    (spak|sdpa|nvidia|tilegym|flashinfer|copy)" "$W/$name.log" \
    | head -40 | tee -a "$W/summary.txt"
}
# shellcheck disable=SC2086
run fwd 85 --shapes $SHAPES --dtype fp16 --no-sim --timing kernel,eager --repeats 3 \
  --peers sdpa,nvidia-sample
left=$(( 140 - ($(date +%s) - START) ))
(( left > 40 )) && left=40
if (( left >= 20 )); then
  run tilegym "$left" --shapes ${SHAPES%% *} --dtype fp16 --no-sim --timing kernel --repeats 3 \
    --peers tilegym
else
  echo "== tilegym: not run (${left}s left)" | tee -a "$W/summary.txt"
fi
echo "wall $(( $(date +%s) - START )) s" | tee -a "$W/summary.txt"
tar czf "$OUT/i38.tar.gz" -C "$(dirname "$W")" i38 && echo "-> $OUT/i38.tar.gz"
