#!/usr/bin/env bash
# Issue 34 (helper 34g): the eager host path on one GPU, new paths A/B'd in one process.
#   python tools/host_cost_i34g.py --n 2000 (one process, timeout 85 s):
#   1. us per eager call (2000 calls, one synchronize, best of 3) of spak.fmha 1x2x16x64
#      and 4x16x512x64 causal, fmha_kvcache 1x32:8 x256, fmha_varlen 2 seqs (each new inline
#      path vs old: api.INLINE off), forward+backward 1x2x16x64 (new; dq/dk/dv
#      allocated by the backward again; autograd multithreading off), beside SDPA
#      cuDNN/flash/default and NVIDIA's sample (when .peers/samples has it);
#   2. the floor: ct.launch of a trivial kernel (no argument; 5 tensors + 8 scalars),
#      spak.fmha's prepared fused launch, one allocation (empty / empty_like / new_empty);
#   3. float64 checks once each: spak.fmha both shapes, fwd+bwd gradients over 3 steps
#      (steps 1 and 3 bit-identical), decode 256/512 keys, varlen;
#   4. launches and tensor arguments per call of each entry point.
# Hard wall-time bound: 85 s (timeout) + tar: < 90 s. GPU ${GPU:-0} only.
# Writes $OUT/i34.tar.gz: host_cost.json, host_cost.md, log.txt. Prints the table.
# Run from the repo root after `source .carry/setup.sh`. Fails soft (each part, each row).
set -u
OUT=${OUT:-/tmp/i34_out}
W=$(mktemp -d)
export CUDA_VISIBLE_DEVICES=${GPU:-0}
echo "commit $(git rev-parse --short HEAD 2>/dev/null || cat .gpujobs/COMMIT 2>/dev/null)" \
    > "$W/log.txt"
echo "cpus $(nproc); $(date -u)" >> "$W/log.txt"
timeout -k 3 ${I34_T:-85} python tools/host_cost_i34g.py --out "$W" --n ${I34_N:-2000} --rounds ${I34_ROUNDS:-1} 2>&1 | tee -a "$W/log.txt"
echo "i34g rc=${PIPESTATUS[0]}" | tee -a "$W/log.txt"
mkdir -p "$OUT"
tar czf "$OUT/i34.tar.gz" -C "$W" .
echo "i34: wrote $OUT/i34.tar.gz"
