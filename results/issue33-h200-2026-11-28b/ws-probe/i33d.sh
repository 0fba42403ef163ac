#!/usr/bin/env bash
# Issue 33d: locate the 1-ulp fp16 difference of the padded rows-form decode (splitkv) on
# qwen2.5-7b and mistral-large (results/issue33-h200-2026-11-28b). The planned splitkv call
# runs on the GPU with its split workspaces (Acc, Mx, Lx) kept; this host's CPU runs the
# simulator's slice of it (batch 0, kv head 0's heads, the GPU call's tiles and splits)
# with its workspaces kept; i33d_ws.py compares them value by value and names every m, l
# or acc entry whose float32 bits differ (head, split, column, both values, ulps).
# One process a shape, in parallel; each bound 150 s (compile ~30-60 s, simulator ~15-30 s
# a shape). Hard bound ~160 s with the tar. GPU ${GPU:-0} only; each part fails soft.
# Writes $OUT/i33d.tar.gz (ws_probe_*.json/.log, summary.txt). DRY=1: print the commands;
# PROBE_SIM=1: both sides on the simulator (a CPU dry run: expect 0 differences).
set -u
OUT=${OUT:-/tmp/i33d_out}
W=$(mktemp -d)
export CUDA_VISIBLE_DEVICES=${GPU:-0}
export PYTHONPATH=".:${PYTHONPATH:-}"
HERE=$(cd "$(dirname "$0")" && pwd)
CASES=("4x28:4x32768x128/model=qwen2.5-7b" "8x96:8x16384x128/model=mistral-large")
# I33D_CASES="a b": other shapes (the CPU dry run needs small ones)
[[ -n "${I33D_CASES:-}" ]] && read -r -a CASES <<< "$I33D_CASES"
i=0
for c in "${CASES[@]}"; do
  mkdir -p "$W/$i"
  cmd=(python "$HERE/i33d_ws.py" "$W/$i" "$c")
  if [[ -n "${DRY:-}" ]]; then echo "[ws_probe_$i 150s] ${cmd[*]}"; i=$((i + 1)); continue; fi
  ( timeout -k 3 150 "${cmd[@]}" > "$W/ws_probe_$i.log" 2>&1
    echo "ws_probe_$i rc=$?" >> "$W/summary.txt"
    mv "$W/$i/ws_probe.json" "$W/ws_probe_$i.json" 2>/dev/null ) &
  i=$((i + 1))
done
wait
[[ -n "${DRY:-}" ]] && exit 0
cat "$W/summary.txt"; grep -h "ws_probe\|{'array'" "$W"/ws_probe_*.log | head -30
mkdir -p "$OUT"
tar -czf "$OUT/i33d.tar.gz" -C "$W" $(cd "$W" && ls ws_probe_* summary.txt 2>/dev/null)
echo "wrote $OUT/i33d.tar.gz"
