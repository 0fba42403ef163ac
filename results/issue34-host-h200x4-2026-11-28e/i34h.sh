#!/usr/bin/env bash
# Issue 34 (helper 34h): the eager host cost of spak.fmha_kvcache and of a training step
# (and the other entry points) against SDPA's backends, in one process, timed in
# interleaved blocks (tools/host_cost_i34h.py; the new code only, the before is the
# 2026-11-28d run: results/issue34-host-h200x2-2026-11-28d/run2-h200):
#   1. kvcache 1x1x32:8 x256 (spak, SDPA cuDNN/flash/default; floors: its launch alone,
#      ct.launch alone, one empty_like), fwd+bwd 1x2x16x64 causal (spak, SDPA x3, both with
#      autograd multithreading off, spak with PREALLOC_BYTES 0; floors: the step's 4
#      launches alone, its 5 allocations alone), fmha 1x2x16x64 and 4x16x512x64 causal (+ NVIDIA's sample if .peers has it),
#      varlen 2 seqs: ${I34H_BLOCKS:-9} blocks of ${I34H_N:-1000} calls (training 300 steps)
#      per row, one synchronize a block; median, best, SPAK/SDPA paired ratio per problem;
#   2. float64 checks (fmha both shapes; fwd+bwd gradients over 3 steps incl. the prepared
#      path's LSE; decode 256/512 keys; varlen), a non-contiguous cache still refused;
#   3. launches and tensor arguments per call.
# Hard wall-time bound: 140 s (timeout -k 3) + tar: < 150 s. GPU ${GPU:-0} only.
# Writes $OUT/i34h.tar.gz: host_cost.json, host_cost.md, log.txt. Prints the table.
# Run from the repo root after `source .carry/setup.sh`. Fails soft (each part, each row).
set -u
OUT=${OUT:-/tmp/i34h_out}
W=$(mktemp -d)
export CUDA_VISIBLE_DEVICES=${GPU:-0}
echo "commit $(git rev-parse --short HEAD 2>/dev/null || cat .gpujobs/COMMIT 2>/dev/null)" \
    > "$W/log.txt"
echo "cpus $(nproc); $(date -u)" >> "$W/log.txt"
timeout -k 3 ${I34H_T:-140} python tools/host_cost_i34h.py --out "$W" --n ${I34H_N:-1000} \
    --n-train ${I34H_NTRAIN:-300} --blocks ${I34H_BLOCKS:-9} 2>&1 | tee -a "$W/log.txt"
echo "i34h rc=${PIPESTATUS[0]}" | tee -a "$W/log.txt"
mkdir -p "$OUT"
tar czf "$OUT/i34h.tar.gz" -C "$W" .
echo "i34h: wrote $OUT/i34h.tar.gz"
