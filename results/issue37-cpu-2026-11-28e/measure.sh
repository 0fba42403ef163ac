#!/usr/bin/env bash
# usage: i37g_measure.sh IDS_FILE OUT_TSV [per-test timeout s] -- each id in its own pytest process
set -u
IDS=$1; OUTF=$2; TO=${3:-300}
source /work/venv/bin/activate
export PYTHONPATH=${SPAK_ROOT:-/work/wt/i37h}:/work/shared/peers/tilegym/src
export WARMUP=0 REP=0 MIN_REP=1 INITIAL_REP=1 OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MKL_NUM_THREADS=1 QUIET=1
[[ ${MCUPTI:-0} != default ]] && export CUPTI=${MCUPTI:-0}
cd /work/shared/peers/tilegym
while IFS= read -r id; do
  [[ -z $id ]] && continue
  t0=$(date +%s.%N)
  out=$(timeout -k 5 "$TO" python -m pytest -p spak.sim.pytest_plugin -p no:cacheprovider -q -x "$id" 2>&1)
  rc=$?
  t1=$(date +%s.%N)
  res=$(echo "$out" | grep -E "passed|failed|error|skipped" | tail -1)
  memo=$(echo "$out" | grep "spak sim:.*launch" | tail -1)
  reason=$(echo "$out" | grep -E "^E " | head -2 | tr '\n' ' ' | cut -c1-200)
  printf '%s\t%.1f\t%s\t%s\t%s\t%s\n' "$rc" "$(echo "$t1 - $t0" | bc)" "$id" "$res" "$memo" "$reason" >> "$OUTF"
done < "$IDS"
