#!/usr/bin/env bash
# TileGym tests/ops (cutile backend), unmodified, on GPUs: the pass list the CPU interpreter-mode
# run (results/tilegym_interpreter.md) is compared with (issue 37). Run from the repo root on the
# GPU machine with TileGym at .peers/tilegym/{src,tests,pytest.ini} (cp -r from
# /work/shared/peers/tilegym; src alone is not enough: the suite lives in tests/).
#   GPUS="0 1 2 3"  one shard per entry (interleaved node ids; "0 0 1 1": two a GPU); default ${GPU:-0}
#   (tools/tilegym_suite.sh runs the whole set on all GPUs and the CPU at once, with a queue)
#   SKIP=N          leave out the first N ids of the ordered list (run by an earlier call)
#   SHARD_S=230     each shard's wall-time bound (SIGINT, then -k 15); collection <= 60 s more
#   DRY=1           collection only;  K=EXPR  pytest -k EXPR (trying the script out)
# Order: ci/tilegym_sample.txt's ids (measured on the CPU) first, then the rest of the cutile set.
# Output: $OUT/i37.tar.gz with shard logs (pytest -v -rA), junit xml, node-id lists, counts.txt,
# and outcomes.tsv/compare.tsv from tools/tilegym_compare.py (parsed from the junit xml: TileGym
# ids contain spaces, so the -v lines are not split on whitespace); stdout: the counts.
set -u
OUT=${OUT:-/tmp/i37_out}
W=$(mktemp -d)
ROOT=$(pwd)
TG=$ROOT/.peers/tilegym
summary() { tar -C "$W" -czf "$OUT/i37.tar.gz" . 2>/dev/null; echo "i37: archive $OUT/i37.tar.gz"; }
mkdir -p "$OUT"
if [[ ! -d $TG/tests/ops || ! -d $TG/src/tilegym ]]; then
  echo "i37: SKIP: $TG needs src/ and tests/ (cp -r /work/shared/peers/tilegym/{src,tests,pytest.ini} .peers/tilegym/)" | tee "$W/counts.txt"
  summary; exit 0
fi
export PYTHONPATH=$TG/src${PYTHONPATH:+:$PYTHONPATH}
GPUS=${GPUS:-${GPU:-0}}
cd "$TG"
echo "i37: GPUs [$GPUS]; $(python -c 'import torch;print(torch.__version__, torch.cuda.get_device_name())' 2>&1 | tail -1)" \
  | tee "$W/device.txt"
CUDA_VISIBLE_DEVICES=${GPUS%% *} timeout 60 python -m pytest -p no:cacheprovider --collect-only -q tests/ops ${K:+-k "$K"} \
  > "$W/collect.txt" 2>&1
# the cutile backend's tests (ids naming cutile): not triton's, not the pytorch baselines
grep '::' "$W/collect.txt" | grep cutile > "$W/all.txt" || true
grep '::' "$ROOT/ci/tilegym_sample.txt" | grep -xF -f "$W/all.txt" > "$W/ids.txt" || true
grep -vxF -f "$W/ids.txt" "$W/all.txt" >> "$W/ids.txt" || true
if [[ ${SKIP:-0} -gt 0 ]]; then tail -n +$((SKIP+1)) "$W/ids.txt" > "$W/ids2.txt"; mv "$W/ids2.txt" "$W/ids.txt"; fi
echo "i37: $(wc -l < "$W/all.txt") cutile tests collected, $(wc -l < "$W/ids.txt") to run"
[[ ${DRY:-0} == 1 ]] && { summary; exit 0; }
n=0; for g in $GPUS; do n=$((n+1)); done
# TileGym's own knobs (tests/config.py): one benchmark repetition, as on the CPU
export WARMUP=0 REP=0 MIN_REP=1 INITIAL_REP=1
i=0
for g in $GPUS; do
  # files named by shard index, not GPU: GPUS="0 0 1 1" (two shards a GPU) must not collide
  awk -v n="$n" -v i="$i" 'NR % n == i' "$W/ids.txt" > "$W/ids_$i.txt"
  CUDA_VISIBLE_DEVICES=$g timeout -s INT -k 15 "${SHARD_S:-230}" python - "$W/ids_$i.txt" "$W/junit_$i.xml" \
    > "$W/shard_$i.log" 2>&1 <<'PY' &
import sys, pytest
ids = open(sys.argv[1]).read().split("\n")
sys.exit(pytest.main(["-p", "no:cacheprovider", "-v", "-rA", "--junitxml", sys.argv[2]]
                     + [i for i in ids if i]))
PY
  i=$((i+1))
done
wait
# outcomes from the junit xml (one row per finished test, tab-separated), joined with the CPU's
python "$ROOT/tools/tilegym_compare.py" "$W" "$W"/junit_*.xml > "$W/compare.txt" 2>&1 || true
{
  for k in PASSED FAILED SKIPPED ERROR; do
    echo "$k $(cut -f1 "$W/outcomes.tsv" 2>/dev/null | grep -cx "$k")"
  done
  echo "not-run $(( $(wc -l < "$W/ids.txt") - $(tail -n +2 "$W/outcomes.tsv" 2>/dev/null | wc -l) ))"
  grep -E '^pass on the GPU|differs' "$W/compare.txt"
} | tee "$W/counts.txt"
summary
