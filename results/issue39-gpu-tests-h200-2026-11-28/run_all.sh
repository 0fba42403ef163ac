#!/usr/bin/env bash
# Lead's orchestrator: run helper jobs in parallel lanes, one lane per GPU.
#   bash .gpujobs/run_all.sh BUDGET_S "i33:0" "i35:1" "i34,i38:2" "i37,i39:3"
# Each job: GPU=<n> bash .gpujobs/<job>.sh, its own archive in $OUT/<job>.tar.gz;
# stdout+stderr of every job go to $OUT/logs.tar.gz (the tool returns <= 8 files).
budget=${1:?budget}; shift
export PYTHONUNBUFFERED=1
source .carry/setup.sh || { echo "carry setup failed"; exit 1; }
mkdir -p .peers && tar xJf .peers_pack/peers.tar.xz 2>/dev/null
mkdir -p /tmp/tg && tar -C /tmp/tg -xJf .peers_pack/tilegym_full.tar.xz 2>/dev/null
export TILEGYM_ROOT=/tmp/tg/tilegym
mkdir -p .peers/tilegym && cp -r /tmp/tg/tilegym/src /tmp/tg/tilegym/tests /tmp/tg/tilegym/pytest.ini .peers/tilegym/ 2>/dev/null
export SPAK_COMMIT=$(cat .gpujobs/COMMIT 2>/dev/null || echo unknown)
logs=/tmp/joblogs; rm -rf $logs; mkdir -p $logs
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $logs/gpus.csv
python3 -c "import torch;print(torch.__version__)" >> $logs/gpus.csv 2>&1
start=$(date +%s)
for lane in "$@"; do
  jobs_=${lane%%:*}; gpu=${lane##*:}
  ( for j in ${jobs_//,/ }; do
      left=$(( budget - ($(date +%s) - start) ))
      [ $left -gt 20 ] || { echo "$j: no time left" > $logs/$j.log; continue; }
      t0=$(date +%s)
      GPU=$gpu timeout -k 10 $left bash .gpujobs/$j.sh > $logs/$j.log 2>&1
      echo "== $j rc=$? wall=$(( $(date +%s) - t0 ))s gpu=$gpu" | tee -a $logs/$j.log
    done ) &
done
wait
tar -C $logs -czf $OUT/logs.tar.gz .
for f in $logs/*.log; do echo "#### $f"; tail -n 15 $f; done
