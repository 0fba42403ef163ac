#!/usr/bin/env bash
# issue 37 (session 2026-11-28e, branch issue-37h): the TileGym GPU passes not yet shown on a
# CPU, in interpreter mode on the GPU host's CPU cores (NO GPU use), in ONE call of <= 550 s.
#  - ids: results/issue37-cpu-2026-11-28e/gpu_host_ids.tsv (20 ids: 15 expected to fit a
#    ~480 s window, longest first, then 5 expected past it, shortest first): the GPU passes
#    not yet shown on a CPU that this session's interpreter may finish (chunk_gated_delta_rule
#    T16384 with SPAK_SIM_MEMO_MB=6144, attention causal 8192 / non-causal 4096-4097 / 8192,
#    bmm 2x8192^3, matmul 16384^3 fp8, mla
#    4096 (its torch reference needs > 23 GB), attention_sink 10820^2); expected seconds from
#    this session's measured CPU rows (README there);
#  - how: tools/tilegym_suite.sh's CPU side only (GPUS=""), I37H_CPU processes (default
#    min(nproc - 2, 30)), one numba/OMP thread each, SPAK_SIM_TEST_TIMEOUT = the window;
#    on a host with too few cores for the expected load (5,484 CPU-s: 30 processes, all at once)
#    the fitting ids run shortest first instead (most passes in the window);
#  - needs nvidia-h200-x2 (32 cores, 256 GiB: chunk T16384 peaks near 32 GB) or larger;
#    `I37H_DRY=1` checks the plumbing (list, plan, env) without running tests.
# Hard wall bound: I37H_S (default 545 s) all in; the suite stops starting tests 40 s before
# its end, interrupts at 25 s, archives. Output: $OUT/i37h.tar.gz (cpu_*.tsv rows: outcome,
# seconds, id, reason; junit; logs; probe.txt; join.txt against the earlier GPU rows; the id
# list); stdout: the join's counts and the per-id CPU outcomes.
set -u
T0=$(date +%s)
# I37H_LOCAL=1: a CPU machine with cuTile installed (no .carry), TileGym at TG (plumbing check)
[[ ${I37H_DRY:-0} == 1 || ${I37H_LOCAL:-0} == 1 ]] || { source .carry/setup.sh || exit 1; }
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/i37h_out}; mkdir -p "$OUT"
if [[ ! -d .peers/tilegym/tests/ops && ${I37H_DRY:-0} != 1 && ${I37H_LOCAL:-0} != 1 ]]; then
  [[ -f .peers_pack/peers.tar.xz ]] && tar xJf .peers_pack/peers.tar.xz
  if [[ -f .peers_pack/tilegym_full.tar.xz ]]; then
    mkdir -p /tmp/tg && tar -C /tmp/tg -xJf .peers_pack/tilegym_full.tar.xz
    mkdir -p .peers/tilegym && cp -r /tmp/tg/tilegym/src /tmp/tg/tilegym/tests /tmp/tg/tilegym/pytest.ini .peers/tilegym/
  fi
fi
LIST=${I37H_LIST:-results/issue37-cpu-2026-11-28e/gpu_host_ids.tsv}
PLAN=$(mktemp -d)
python - results/issue37-tilegym-h200x4-2026-11-28c/join.tsv.xz "$PLAN/prev_join.tsv" <<'PY'
import lzma, sys
open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())
PY
# the earlier GPU rows (gpu_prev.tsv) and every id (all_ids.txt), for the join
python tools/tilegym_cpu_plan.py "$PLAN/prev_join.tsv" "$PLAN" --window 470 > /dev/null
LEFT=$(( ${I37H_S:-545} - ($(date +%s) - T0) ))
WINDOW=$(( LEFT - 65 ))          # the suite's start (probe) and its last 40 s start no test
NCPU=${I37H_CPU:-$(n=$(( $(nproc) - 2 )); (( n > 30 )) && n=30; (( n < 1 )) && n=1; echo $n)}
# ids expected to fit, in the list's order (longest first), then those expected past it
awk -F'\t' -v w="$WINDOW" 'NR > 1 && $2 <= w {print $2 "\t" $1}' "$LIST" > "$PLAN/fit.tsv"
awk -F'\t' -v w="$WINDOW" 'NR > 1 && $2 > w {print $1}' "$LIST" > "$PLAN/past.txt"
LOAD=$(awk -F'\t' '{s += $1} END {print s + 0}' "$PLAN/fit.tsv")
if (( LOAD > NCPU * WINDOW * 8 / 10 )); then         # not all fit: the most ids, shortest first
  sort -n -k1,1 "$PLAN/fit.tsv" | cut -f2 > "$PLAN/cpu_ids.txt"; ORDER="shortest first"
else
  cut -f2 "$PLAN/fit.tsv" > "$PLAN/cpu_ids.txt"; ORDER="longest first"
fi
cat "$PLAN/past.txt" >> "$PLAN/cpu_ids.txt"
echo "i37h: $(wc -l < "$PLAN/cpu_ids.txt") ids ($(wc -l < "$PLAN/fit.tsv") expected to fit, ${LOAD} CPU-s, $ORDER), $NCPU processes, window ${WINDOW} s, $(nproc) cores" | tee "$PLAN/plan.txt"
cp "$LIST" "$PLAN/"
if [[ ${I37H_DRY:-0} == 1 ]]; then
  head -3 "$PLAN/cpu_ids.txt"; echo "i37h: dry run, $(( $(date +%s) - T0 )) s"; exit 0
fi
export SPAK_SIM_MEMO_MB=${SPAK_SIM_MEMO_MB:-6144}
IDS=$PLAN/all_ids.txt CPU_IDS=$PLAN/cpu_ids.txt CPU_ORDER=1 GPU_PREV=$PLAN/gpu_prev.tsv \
  GPUS="" CPU_SHARDS=$NCPU CPU_NICE="" SPAK_SIM_TEST_TIMEOUT=$WINDOW \
  EXTRA="$PLAN/plan.txt $PLAN/cpu_ids.txt $PLAN/gpu_host_ids.tsv" OUT=$OUT BUDGET_S=$LEFT \
  bash tools/tilegym_suite.sh > "$PLAN/suite.log" 2>&1
[[ -f $OUT/i37.tar.gz ]] && mv "$OUT/i37.tar.gz" "$OUT/i37h.tar.gz"
grep '^i37:' "$PLAN/suite.log" | tail -4
# the join's counts (this call's CPU rows against the earlier GPU rows), then this call's
# per-id CPU outcomes (outcome, seconds, id)
mkdir -p "$PLAN/res" && tar -C "$PLAN/res" -xzf "$OUT/i37h.tar.gz" 2>/dev/null
head -9 "$PLAN/res/join.txt" 2>/dev/null
cat "$PLAN"/res/cpu_*.tsv 2>/dev/null | grep -v '^STARTED' | cut -f1-3 | sed 's#tests/ops/##' | sort -k1,1 -s
echo "i37h: CPU outcomes: $(cat "$PLAN"/res/cpu_*.tsv 2>/dev/null | grep -v '^STARTED' | cut -f1 | sort | uniq -c | tr '\n' ' ')"
echo "i37h: done in $(( $(date +%s) - T0 )) s"
