#!/bin/bash
# issue 19 (task 19e), one GPU call: MUFU.TANH's whole table in [2^-8, 8) (both signs) and
# the section 13-15 rules of docs/numerics-sm90.md on other tile shapes.
#   source .carry18/setup.sh && export SPAK_COMMIT=... && bash ci/gpu_19e.sh
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
date -u | tee -a $OUT/gpu.txt
( time timeout 150 python3 ci/mufu_probe.py --out $OUT --tanh-table ) > $OUT/tanh.log 2>&1
tail -3 $OUT/tanh.log
( time timeout 200 python3 ci/sim_ops_gpu.py --record $OUT --shapes --only "(shapes)" ) > $OUT/shapes.log 2>&1
tail -5 $OUT/shapes.log
ls -la $OUT
