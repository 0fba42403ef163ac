#!/usr/bin/env bash
# Issue 35g's GPU job: the fused-dQ backward (kernel fused_dq / tiles DQ_FUSED 1) against
# the three-launch backward, SDPA cuDNN and SDPA flash, one GPU (${GPU:-0}). Hard wall
# bound: the parts' timeouts sum to 140 s, plus at most 2 s kill grace each (3 parts) and
# the summary's 2 s: <= 148 s. Fails soft: a part that fails or times out keeps what it wrote and the next
# part runs. Writes ONE archive, $OUT/i35.tar.gz (folder i35/):
#   precompile/  cuTile's disk cache filled in parallel (tools/precompile.py's build): the
#                A/B's exact configs (tools/bwd_fused_dq_ab.py --precompile) and the sim
#                part's fused_dq units: log.txt, log-sim.txt
#   ab/          tools/bwd_fused_dq_ab.py: 7 training shapes (the backward sweep's 8 less
#                D 256, where the fused pass does not apply) x fp16, bf16: do_bench-style
#                times (L2 flushed, each call alone; 2 rounds of rotated order) of cur
#                (three launches, the store's config), fused1 (+ DQ_FUSED 1), fused1e
#                (+ DQ_EARLY 1), sdpa-cudnn, sdpa-flash; fused deterministic (2 calls);
#                worst rel. L2 vs float64 of each, ratio to cuDNN's: ab.jsonl, log.txt
#   sim/         spak run --family fmha_bwd --kernel fused_dq --no-time: small odd shapes
#                (GQA length 1000 causal, 333 non-causal; fp16, bf16): GPU dQ/dK/dV vs the
#                CPU simulator bit for bit, vs float64, deterministic: run.jsonl, log.txt
# Dry run on a CPU: I35_DRY=1 bash .gpujobs/i35.sh (prints the commands only).
set -u
OUT=${OUT:-/tmp/i35-out}
W="$OUT/i35"
mkdir -p "$W"
export CUDA_VISIBLE_DEVICES=${GPU:-0}
export PYTHONUNBUFFERED=1
if [ -z "${I35_DRY:-}" ] && [ -f .carry/setup.sh ] && ! python3 -c "import cuda.tile" 2>/dev/null; then
  source .carry/setup.sh
fi
T0=$(date +%s)
PY=${PY:-python3}

part() {   # part NAME SECONDS CMD...: run with a hard bound, log, never stop the script
  local name=$1 limit=$2; shift 2
  mkdir -p "$W/$name"
  echo "== $name (<= ${limit}s): $*"
  if [ -n "${I35_DRY:-}" ]; then return 0; fi
  timeout -k 2 "$limit" "$@" > "$W/$name/log.txt" 2>&1
  echo "   rc=$? at $(( $(date +%s) - T0 ))s"
  grep -hE "^precompiled|SPAK kernel cases passed|^Traceback|Error" "$W/$name/log.txt" \
    | tail -n 4 | cut -c1-240
}

# the order is the priority: a part cut by its timeout keeps its first shapes' rows
AB="4x32:8x4096x128/causal 1x32:8x16384x128/causal 16x32:8x1000x128/causal \
4x28:4x4096x128/causal 16x12x1024x64/causal 32x12x512x64/noncausal 4x32x4096x96/causal"
SIM="1x4:2x1000x128/causal 1x2x333x64/noncausal"
part precompile 40 bash -c "$PY tools/bwd_fused_dq_ab.py --precompile 12 --shapes $AB & \
$PY tools/precompile.py --family fmha_bwd --kernel fused_dq --dtype all --jobs 4 $SIM \
> '$W/precompile/log-sim.txt' 2>&1 & wait"
part ab 62 $PY tools/bwd_fused_dq_ab.py --dtypes fp16 bf16 --reps 2 --target-s 0.1 \
  --budget-s 50 --shapes $AB --out "$W/ab/ab.jsonl"
part sim 38 $PY -m spak run --family fmha_bwd --kernel fused_dq --no-time --dtype all \
  --sim-work 67108864 --shapes $SIM --out "$W/sim/run.jsonl"

if [ -z "${I35_DRY:-}" ]; then
  echo "== summary"
  grep -E "^(fp16|bf16) " "$W/ab/log.txt" | cut -c1-300
  timeout 2 $PY - "$W/ab/ab.jsonl" "$W/sim/run.jsonl" <<'PYEOF' 2>&1 | cut -c1-260
import json, math, sys
def rows(p):
    try:
        return [json.loads(l) for l in open(p) if l.strip()]
    except OSError:
        return []
def geo(xs):
    xs = [x for x in xs if x]
    return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f} (n={len(xs)})" if xs else "-"
ab = rows(sys.argv[1])
for dt in ("fp16", "bf16"):
    rs = [r for r in ab if r.get("dtype") == dt and "cur" in r.get("ms", {})]
    t = lambda r, n: r["ms"].get(n)
    c_cud = [t(r, "sdpa-cudnn") / t(r, "cur") for r in rs if t(r, "sdpa-cudnn")]
    line = f"{dt}: vs cuDNN (speed geomean): cur {geo(c_cud)}"
    for n in ("fused1", "fused1e"):
        f_cur = [t(r, n) / t(r, "cur") for r in rs if t(r, n)]
        f_cud = [t(r, "sdpa-cudnn") / t(r, n) for r in rs if t(r, n) and t(r, "sdpa-cudnn")]
        line += (f"; {n}: time/cur {geo(f_cur)}, vs cuDNN {geo(f_cud)}, deterministic "
                 f"{all(r.get(n + '_deterministic') for r in rs)}")
    print(line)
for r in rows(sys.argv[2]):
    sim = r.get("sim") or {}
    print(f"sim {r.get('case')}: {r.get('provider')} passed {r.get('passed')} rel_l2 "
          f"{r.get('rel_l2')} det {r.get('deterministic')} bits "
          + (f"{100 * sim['fraction_bit_identical']:.3f}% of {sim.get('elements')} "
             f"max {sim.get('max_ulp')} ulp" if "fraction_bit_identical" in sim else str(sim)[:80]))
PYEOF
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$W/gpu.txt" 2>/dev/null
  echo "commit $(git rev-parse --short HEAD 2>/dev/null), wall $(( $(date +%s) - T0 ))s" \
    | tee "$W/wall.txt"
fi
tar -czf "$OUT/i35.tar.gz" -C "$OUT" i35 && echo "wrote $OUT/i35.tar.gz"
