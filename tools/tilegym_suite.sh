#!/usr/bin/env bash
# TileGym tests/ops (cutile backend), unmodified, the WHOLE set at once on one multi-GPU host:
# (a) on the GPUs with plain pytest, P processes per GPU, and (b) the same ids in interpreter
# mode (spak.sim.pytest_plugin, CUDA hidden) on the CPU cores left, then joined by
# tools/tilegym_compare.py join (issue 37). Run from the repo root on the GPU machine after
# `source .carry/setup.sh`, TileGym at .peers/tilegym/{src,tests,pytest.ini} (or TG=DIR).
#
#   BUDGET_S=480   hard bound on the whole job's wall time, all in (collection, both sides,
#                  the join, the archive). No test is started after BUDGET_S-40 s; at
#                  BUDGET_S-25 s the running ones get SIGINT, 10 s later SIGKILL; every
#                  finished test was already written to its shard's tsv.
#   GPUS="0 1 2 3" P=7     GPU processes: P per GPU (cuTile's JIT compile is CPU-bound, ~6 s a
#                  test; GPU memory is plentiful); CUTILE_MAX_LAUNCH_TIMEOUT_SEC=60 so
#                  autotune's 5 s watchdog does not fail configs on a loaded host
#   CPU_SHARDS=30  interpreter-mode processes (default: nproc - 4 - GPU processes, at most 30;
#                  NUMBA/OMP/MKL threads 1 each);
#                  SPAK_SIM_TEST_TIMEOUT=120 per test (ci/tilegym.sh's bound); CPU_CUPTI=0
#                  sets TileGym's CUPTI=0 there (CUDA events/graphs; default: as the GPU side)
#   DRY=1          try the plumbing on a CPU machine: 4 ids, 2+2 processes, the "GPU side"
#                  also in interpreter mode (a CPU torch cannot load TileGym's conftest
#                  otherwise), CPU side as on the device; BUDGET_S=150
#   IDS=FILE       run these ids (one a line) instead of the collected cutile set
#   CPU_ORDER=1    the CPU side takes CPU_IDS in its own order (tools/tilegym_cpu_plan.py)
#   GPU_PREV=FILE  earlier GPU rows for the join (ids this GPU side does not rerun)
#   CPU_NICE       prefix of the CPU-side processes (default "nice -n 10": GPU compiles first)
#   EXTRA="F1 F2"  files copied into the archive
#   CPU_TAG=s2_    CPU-side file names cpu_s2_N.tsv (a second call's rows beside the first's)
#   CPU_THREADS=T  numba/OMP threads per CPU-side process (default 1; a few large tests on
#                  many cores: the simulator's mma runs its lanes in parallel); GPUS="": no GPU side
#   GPU_IDS=FILE / CPU_IDS=FILE   one side runs only these ids (in the run order), e.g. a
#                  second call: the GPU side the ids a first call left, the CPU side its GPU passes
# Both sides pass --continue-on-collection-errors: one module that fails to import (run 1: the
# device's transformers named torch.cuda.CUDAGraph in an annotation) stops only its own ids.
# Work distribution: tools/pytest_queue.py (one ordered list shared as a queue by every process
# of a side: an id runs once, where a process is free; finished ids form a prefix of the list).
# Order (tools/tilegym_compare.py order): ids that passed on the GPU before (H200 run), the
# rest of the CPU sample that passed or skipped, CI's subset, the other correctness tests, then test_perf
# (full-size benchmarks: 0 of 7 finished on a CPU in 60-90 s). Both sides use the same order, so
# the CPU's finished prefix is the first part of what the GPU finished.
# Estimate (why P=7, 30 shards on 64 cores): GPU 1223 ids x ~8.3 s (H200 2026-11-28: 65 ids,
# 539 s of test time, 5.75 s a test for the first 40, 70 s the longest) = ~10,200 s over 28
# processes = ~365 s of the ~395 s window; CPU ~655 correctness ids x ~10 s (this shared 2-core
# CPU, one thread: 10 random unsampled ids 89 s, median 0.7 s, max 73 s) = ~6,600 s over 30
# = ~220 s, then test_perf (most run past 120 s on a CPU). ~23,000 CPU-s of 30,700.
# Output: $OUT/i37.tar.gz: ids.txt (the order), gpu_*.tsv / cpu_*.tsv (outcome, seconds, id,
# reason per finished test), junit_{gpu,cpu}_*.xml, logs, probe.txt, join.txt (counts, ratio,
# reasons), join.tsv (per id). stdout: the counts.
set -u
T0=$(date +%s)
DRY=${DRY:-0}
if [[ $DRY == 1 ]]; then BUDGET_S=${BUDGET_S:-150}; else BUDGET_S=${BUDGET_S:-480}; fi
END=$((T0 + BUDGET_S))
OUT=${OUT:-/tmp/i37_out}
ROOT=$(pwd)
TG=${TG:-$ROOT/.peers/tilegym}
W=$(mktemp -d)
mkdir -p "$OUT" "$W/logs"
GPUS=${GPUS-"0 1 2 3"}   # GPUS="" (set, empty): no GPU side
P=${P:-7}
ng=0; for g in $GPUS; do ng=$((ng + 1)); done
# by default the cores the GPU processes leave (4 spare), at most 30
CPU_SHARDS=${CPU_SHARDS:-$(n=$(( $(nproc) - ng * P - 4 )); (( n > 30 )) && n=30; (( n < 2 )) && n=2; echo $n)}
CPU_TIMEOUT=${SPAK_SIM_TEST_TIMEOUT:-120}
# CPU_NICE="nice -n 10" (default): the CPU side yields to the GPU side's tileiras compiles
# (TileGym's own 5 s compile limit failed 77 GPU tests on a host loaded by 58 processes)
CPU_NICE=${CPU_NICE-nice -n 10}
CPU_THREADS=${CPU_THREADS:-1}    # numba/OMP threads of each CPU-side process
left() { echo $((END - $(date +%s))); }
archive() { [[ -n ${EXTRA:-} ]] && cp $EXTRA "$W/" 2>/dev/null; tar -C "$W" -czf "$OUT/i37.tar.gz" . 2>/dev/null; echo "i37: archive $OUT/i37.tar.gz ($(( $(date +%s) - T0 )) s)"; }
if [[ ! -d $TG/tests/ops || ! -d $TG/src/tilegym ]]; then
  echo "i37: SKIP: $TG needs src/ and tests/ (cp -r /work/shared/peers/tilegym/{src,tests,pytest.ini} .peers/tilegym/)" | tee "$W/join.txt"
  archive; exit 0
fi
export PYTHONPATH=$ROOT/tools:$TG/src${PYTHONPATH:+:$PYTHONPATH}
# TileGym's own knobs (tests/config.py): one benchmark repetition, on both sides
export WARMUP=0 REP=0 MIN_REP=1 INITIAL_REP=1
export CUTILE_MAX_LAUNCH_TIMEOUT_SEC=${CUTILE_MAX_LAUNCH_TIMEOUT_SEC:-60}
# cuTile's own compile bound (default 5 s): 28 GPU-side processes compiling at once on a
# 64-core host pushed tileiras past 5 s, and TileGym's autotune then found "no valid config"
# (22 of 23 GPU failures, 4x H200 2026-11-28 run 1); the host's load, not the program
export CUDA_TILE_COMPILER_TIMEOUT_SEC=${CUDA_TILE_COMPILER_TIMEOUT_SEC:-60}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1
cd "$TG"
G0=${GPUS%% *}
GP=()            # plain pytest on the GPUs
if [[ $DRY == 1 ]]; then
  # no GPU here: the "GPU side" runs the simulator too (a CPU torch cannot even load TileGym's
  # conftest without it), only to exercise the queue, the tsv rows and the join
  G0=""; GP=(-p spak.sim.pytest_plugin); export PYTHONPATH=$ROOT:$PYTHONPATH
fi

# 1. in parallel: the GPU-side collection, and on the CPU the interpreter-mode probe (what a
# CUDA build of torch with no visible device gives under the plugin; warms numba's cache)
{
  python -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>&1 | head -8
  nproc; free -g | head -2
  CUDA_VISIBLE_DEVICES="" PYTHONPATH=$ROOT:$PYTHONPATH timeout 60 python - <<'PY' 2>&1 | tail -12
import torch
print("CUDA hidden, before the plugin: is_available", torch.cuda.is_available(), "compiled", torch.backends.cuda.is_built())
import spak.sim.pytest_plugin  # noqa: F401  (switches interpreter mode on, as -p does)
x = torch.ones(3, device="cuda")
print("after: is_available", torch.cuda.is_available(), torch.cuda.get_device_name(), torch.cuda.get_device_capability("cuda"),
      "tensor on", x.device, "is_cuda", x.is_cuda, "sum", float((x.cuda() * 2).sum()))
torch.cuda.manual_seed(0); torch.cuda.empty_cache(); torch.cuda.synchronize()
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True); e0.record(); e1.record()
print("events ok", e0.elapsed_time(e1) >= 0, "clearCublasWorkspaces", torch._C._cuda_clearCublasWorkspaces() is None)
PY
} > "$W/probe.txt" 2>&1 &
PROBE=$!
if [[ -n ${IDS:-} ]]; then
  grep '::' "$IDS" > "$W/all.txt"
else
  CUDA_VISIBLE_DEVICES=$G0 timeout 90 python -m pytest "${GP[@]}" -p no:cacheprovider --collect-only -q tests/ops \
    > "$W/logs/collect.txt" 2>&1
  # the cutile backend's tests (ids naming cutile): not triton's, not the pytorch baselines
  grep '::' "$W/logs/collect.txt" | grep cutile > "$W/all.txt" || true
  if [[ ! -s $W/all.txt ]]; then     # the GPU collection failed: the ids the CPU side collects
    echo "i37: GPU-side collection gave no ids (logs/collect.txt); collecting in interpreter mode"
    CUDA_VISIBLE_DEVICES="" PYTHONPATH=$ROOT:$PYTHONPATH timeout 90 python -m pytest -p spak.sim.pytest_plugin \
      -p no:cacheprovider --collect-only -q tests/ops > "$W/logs/collect_cpu.txt" 2>&1
    grep '::' "$W/logs/collect_cpu.txt" | grep cutile > "$W/all.txt" || true
  fi
  if [[ $DRY == 1 ]]; then
    python "$ROOT/tools/tilegym_compare.py" order "$W/all.txt" 2>/dev/null | head -3 > "$W/dry.txt"
    grep 'test_perf' "$W/all.txt" | head -1 >> "$W/dry.txt"
    mv "$W/dry.txt" "$W/all.txt"
  fi
fi
python "$ROOT/tools/tilegym_compare.py" order "$W/all.txt" > "$W/ids.txt"
wait $PROBE
cat "$W/probe.txt"
echo "i37: $(wc -l < "$W/ids.txt") cutile ids; GPUs [$GPUS] x P=$P; CPU shards $CPU_SHARDS; $(left) s left" | tee "$W/plan.txt"

# 2. both sides at once; no test starts after END-40, SIGINT at END-25, SIGKILL 10 s later
export PYTEST_QUEUE_DEADLINE=$((END - 40))
side_ids() {   # side_ids FILE|"": the run order restricted to FILE's ids (all without FILE)
  if [[ -n $1 ]]; then grep -xF -f "$1" "$W/ids.txt" > "$W/ids_$2.txt" || true; else cp "$W/ids.txt" "$W/ids_$2.txt"; fi
  echo "$W/ids_$2.txt"
}
GQ=$(side_ids "${GPU_IDS:-}" gpu); CQ=$(side_ids "${CPU_IDS:-}" cpu)
# CPU_ORDER=1: the CPU side runs CPU_IDS in that file's own order (tools/tilegym_cpu_plan.py:
# longest expected first), not the run order
if [[ ${CPU_ORDER:-0} == 1 && -n ${CPU_IDS:-} ]]; then grep '::' "$CPU_IDS" > "$W/ids_cpu.txt"; CQ=$W/ids_cpu.txt; fi
# GPU_PREV=FILE: earlier GPU rows (pytest_queue tsv) the join counts for ids this run's GPU
# side does not rerun; named to sort before gpu_0.tsv, so this run's rows win
[[ -n ${GPU_PREV:-} ]] && cp "$GPU_PREV" "$W/gpu_-prev.tsv"
echo "i37: GPU side $(wc -l < "$GQ") ids, CPU side $(wc -l < "$CQ") ids" | tee -a "$W/plan.txt"
stop=$(( $(left) - 25 ))
k=0
for ((r = 0; r < P; r++)); do
  for g in $GPUS; do
    [[ $DRY == 1 && $k -ge 2 ]] && break 2
    [[ $DRY == 1 ]] && g=""
    CUDA_VISIBLE_DEVICES=$g PYTEST_QUEUE_IDS=$GQ PYTEST_QUEUE_CLAIMS=$W/claims_gpu PYTEST_QUEUE_OUT=$W/gpu_$k.tsv \
      timeout -s INT -k 10 "$stop" python -m pytest "${GP[@]}" -p pytest_queue -p no:cacheprovider -q -rfE \
      --continue-on-collection-errors \
      --junitxml "$W/junit_gpu_$k.xml" tests/ops > "$W/logs/gpu_$k.log" 2>&1 &
    k=$((k + 1))
  done
done
ncpu=$CPU_SHARDS; [[ $DRY == 1 ]] && ncpu=2
for ((c = 0; c < ncpu; c++)); do
  # CPU_CUPTI unset (default): TileGym's default, as on the GPU side (perf tests time with
  # torch.profiler's CUDA activity: sim.profiler reports the simulated launches); CPU_CUPTI=0
  # is TileGym's switch to CUDA events / CUDA graphs (sim.cuda_graph)
  CUDA_VISIBLE_DEVICES="" PYTHONPATH=$ROOT:$PYTHONPATH SPAK_SIM_TEST_TIMEOUT=$CPU_TIMEOUT \
    PYTEST_QUEUE_IDS=$CQ PYTEST_QUEUE_CLAIMS=$W/claims_cpu PYTEST_QUEUE_OUT=$W/cpu_${CPU_TAG:-}$c.tsv \
    timeout -s INT -k 10 "$stop" $CPU_NICE env ${CPU_CUPTI:+CUPTI=$CPU_CUPTI} \
    NUMBA_NUM_THREADS=$CPU_THREADS OMP_NUM_THREADS=$CPU_THREADS MKL_NUM_THREADS=$CPU_THREADS python -m pytest -p spak.sim.pytest_plugin -p pytest_queue \
    -p no:cacheprovider -q -rfE --continue-on-collection-errors --junitxml "$W/junit_cpu_${CPU_TAG:-}$c.xml" tests/ops > "$W/logs/cpu_${CPU_TAG:-}$c.log" 2>&1 &
done
wait

# 3. the join: GPU counts, CPU outcomes of the GPU passes, the ratio, a reason per disagreement
python "$ROOT/tools/tilegym_compare.py" join "$W" > "$W/join.txt" 2>&1 || echo "i37: join failed" >> "$W/join.txt"
head -40 "$W/join.txt"
archive
