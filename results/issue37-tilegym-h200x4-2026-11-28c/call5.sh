#!/usr/bin/env bash
# call 5 (2026-11-28c): issue 37 second half: the GPU side runs the ids call 4 left (or failed
# on tileiras' 5 s limit), the CPU side (interpreter mode) every id but call 4's GPU skips
set -u
source .carry/setup.sh || exit 1
export PYTHONUNBUFFERED=1 SPAK_COMMIT=$(cat .gpujobs/COMMIT)
tar xJf .peers_pack/peers.tar.xz
mkdir -p /tmp/tg && tar -C /tmp/tg -xJf .peers_pack/tilegym_full.tar.xz
mkdir -p .peers/tilegym && cp -r /tmp/tg/tilegym/src /tmp/tg/tilegym/tests /tmp/tg/tilegym/pytest.ini .peers/tilegym/
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $OUT/gpus.csv
GPU_IDS=$PWD/.gpujobs/gpu_ids_r2.txt CPU_IDS=$PWD/.gpujobs/cpu_ids_r2.txt BUDGET_S=${I37_S:-330} \
  bash tools/tilegym_suite.sh 2>&1 | tail -25
