#!/usr/bin/env bash
# call 4 (2026-11-28c): issue 34 host bench (GPU 0, cores 0-3) + issue 33 agreement (GPU 1,
# cores 8-63) in parallel, then issue 37's whole TileGym suite (GPUs + CPU interpreter)
set -u
source .carry/setup.sh || exit 1
export PYTHONUNBUFFERED=1 SPAK_COMMIT=$(cat .gpujobs/COMMIT)
tar xJf .peers_pack/peers.tar.xz
mkdir -p /tmp/tg && tar -C /tmp/tg -xJf .peers_pack/tilegym_full.tar.xz
mkdir -p .peers/tilegym && cp -r /tmp/tg/tilegym/src /tmp/tg/tilegym/tests /tmp/tg/tilegym/pytest.ini .peers/tilegym/
ls .peers .peers/tilegym | head
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $OUT/gpus.csv
t0=$(date +%s)
( GPU=0 taskset -c 0-3 bash .gpujobs/i34.sh > $OUT/i34.log 2>&1 ) &
( GPU=1 taskset -c 8-63 bash .gpujobs/i33.sh > $OUT/i33.log 2>&1 ) &
wait
echo "i33+i34 wall $(( $(date +%s) - t0 ))s"
BUDGET_S=${I37_S:-400} bash .gpujobs/i37.sh 2>&1 | tail -30
tail -25 $OUT/i34.log; tail -15 $OUT/i33.log
