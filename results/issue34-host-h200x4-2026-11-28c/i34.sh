#!/usr/bin/env bash
# Issue 34 (follow-up 34e): the prepared host paths A/B'd in one process on one GPU.
#  part 1 (one process, <= 115 s: `host_cost_bench.py --ab --check`):
#    eager us per call (2000 calls, one sync, best of 3) of spak.fmha 1x2x16x64 (vs SDPA
#    cuDNN/flash/default and NVIDIA's sample if .peers/samples has it); the training step
#    1x2x16x64 (new: spak.bwd_ready's prepared backward; old: SPAK_BWD_READY off in this
#    process; SDPA; autograd multithreading off; sys.setswitchinterval 1e-6 / 1.0; pinned
#    to one CPU); spak.fmha_kvcache 1x32:8 x256 (new: kvcache.Prepared + decode_one_kernel;
#    old: SPAK_PREPARED off, still decode_one_kernel; SDPA; the Prepared launch alone, with
#    the caches + lens / all tensors as cached CAI objects; ct.launch of decode_one_kernel
#    vs the former one-split form, 6 vs 9 tensors); spak.fmha_varlen 2 seqs (new,
#    old, padded SDPA); spak.fmha again (last); the launch floor rows. Then the checks:
#    fwd+bwd gradients vs float64 over 3 steps (general, prepared, prepared with the kept
#    workspace; bits of steps 1 and 3 equal), decode 256/512 keys x 3 calls vs float64
#    (+ CUDA-graph GPU us per call), varlen vs float64 x 3 calls.
#  part 2 (<= 30 s): `spak run` of the one-split decode kernel (decode_one_kernel, new in
#    34e), contiguous and paged, fp16: float64 gate and bits vs the simulator (a slice).
# Hard wall-time bound: 115 + 30 s (timeouts) + tar: < 150 s. GPU ${GPU:-0} only.
# Writes $OUT/i34.tar.gz: host_cost.json, host_cost.md, decode_one_run.jsonl, log.txt.
# Run from the repo root after `source .carry/setup.sh`. Fails soft (each part, each row).
set -u
OUT=${OUT:-/tmp/i34_out}
W=$(mktemp -d)
export CUDA_VISIBLE_DEVICES=${GPU:-0}
echo "commit $(git rev-parse --short HEAD 2>/dev/null || cat .gpujobs/COMMIT 2>/dev/null)" \
    > "$W/log.txt"
echo "cpus $(nproc)" >> "$W/log.txt"
timeout -k 5 115 python tools/host_cost_bench.py --out "$W" --n 2000 --ab --check 2>&1 \
    | tee -a "$W/log.txt"
echo "bench rc=${PIPESTATUS[0]}" | tee -a "$W/log.txt"
timeout -k 5 30 python -m spak run --family fmha_decode --kernel splitkv \
    --shapes 1x32:8x256x64 2x8:2x4:60x64/causal/page16/lens=60:9 --dtype fp16 \
    --no-time --json --out "$W/decode_one_run.jsonl" 2>&1 | tail -20 | tee -a "$W/log.txt"
echo "decode run rc=${PIPESTATUS[0]}" | tee -a "$W/log.txt"
mkdir -p "$OUT"
tar czf "$OUT/i34.tar.gz" -C "$W" .
echo "i34: wrote $OUT/i34.tar.gz"
