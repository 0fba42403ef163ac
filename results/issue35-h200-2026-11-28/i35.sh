#!/usr/bin/env bash
# Issue 35's GPU job, measured through the harness (`spak run`, docs/harness.md), one GPU
# (${GPU:-0}). Hard wall bound: the parts' `timeout`s sum to 222 s, plus at most 2 s kill
# grace each (8 parts): <= 238 s. Fails soft: a part that fails or times out keeps the rows
# it wrote (spak run appends each row as it finishes) and the next part runs. Writes ONE
# archive, $OUT/i35.tar.gz (folder i35/):
#   precompile/  tools/precompile.py: cuTile's disk cache filled in parallel with every
#                kernel the parts below launch (compiling them one after another in the
#                runs would take most of the budget), logs only
#   bwd-fp16/    spak run --family fmha_bwd, fp16, 7 `--shapes train` shapes (off-16 next to
#                aligned: Llama-3 8B heads 16x1000 vs 16x1024, GPT-2 12 heads D 64 1000 vs
#                1024; Gemma-2 9B D 256, the DKV_SPLIT 2 default; Llama-3 8B 4k and 16k),
#                peers sdpa (cuDNN, flash, and their fwd+bwd) in the same run, timing flush
#                (do_bench: L2 flushed, each call alone), rows with err_ratio (ours / each
#                peer's error vs float64) and deterministic (a second call's bits): run.jsonl,
#                log.txt, plot.png (where matplotlib is)
#   bwd-bf16/    the same on 4 of them, bf16
#   sim/         spak run --no-time with the simulator on (--sim-work 2^26): bit agreement of
#                dQ/dK/dV with the CPU simulator on exact slices, off-16 lengths: GPT-2 heads
#                fp16, Llama-3 heads bf16, Gemma-2 D 256 fp16 and bf16
#   fwd-d64/     spak run --family fmha_fwd, D 64 non-causal 16x16x1000 vs 16x16x1024 (the
#                off-grid config), then the old 128x128 tiles (--tiles 128x128, no hints) on
#                both (run-old128.jsonl), flush timing, SDPA in the same runs
#   split-ab/    tools/bwd_split_ab.py, fp16: D 256 backward, old dK/dV (32x32 whole) vs
#                DKV_SPLIT 2, alternating pairs, bits compared
#   eager/       spak run --family fmha_bwd --timing kernel,eager (GPT-2 16x1024): the
#                backward and the fwd+bwd step through spak.fmha's autograd (eager) next to
#                the planned launches (kernel)
#   report/      spak report of the bwd rows (fwd+bwd table, off-16 lines) and of fwd-d64
# Dry run on a CPU: I35_DRY=1 bash .gpujobs/i35.sh (prints the commands only).
set -u
OUT=${OUT:-/tmp/i35-out}
W="$OUT/i35"
mkdir -p "$W"
export CUDA_VISIBLE_DEVICES=${GPU:-0}
export PYTHONUNBUFFERED=1      # a part cut by its timeout keeps the lines it printed
if [ -z "${I35_DRY:-}" ] && [ -f .carry/setup.sh ] && ! python3 -c "import cuda.tile" 2>/dev/null; then
  source .carry/setup.sh
fi
T0=$(date +%s)
PY=${PY:-python3}
SPAK="$PY -m spak"

part() {   # part NAME SECONDS CMD...: run with a hard bound, log, never stop the script
  local name=$1 limit=$2; shift 2
  mkdir -p "$W/$name"
  echo "== $name (<= ${limit}s): $*"
  if [ -n "${I35_DRY:-}" ]; then return 0; fi
  timeout -k 2 "$limit" "$@" > "$W/$name/log.txt" 2>&1
  echo "   rc=$? at $(( $(date +%s) - T0 ))s"
  grep -hE "^precompiled|SPAK kernel cases passed|new/old|^Traceback|Error" "$W/$name/log.txt" \
    | tail -n 4 | cut -c1-240
}

# in priority order within each part (a part cut short keeps its first shapes' rows)
BWD16="16x32:8x1000x128/causal 16x32:8x1024x128/causal 16x12x1000x64/causal 16x12x1024x64/causal 2x16:8x4096x256/causal 4x32:8x4096x128/causal 1x32:8x16384x128/causal"
BWD_BF16="16x32:8x1000x128/causal 16x32:8x1024x128/causal 2x16:8x4096x256/causal 4x32:8x4096x128/causal"
SIM="1x12x1000x64/causal/fp16 1x32:8x1000x128/causal/bf16 1x16:8x1000x256/causal/fp16 1x16:8x1000x256/causal/bf16"
FWD="16x16x1000x64/noncausal 16x16x1024x64/noncausal"
SPLIT_OLD='{"DKV_TILE_M": 32, "DKV_TILE_N": 32, "DKV_SPLIT": 1}'
BWD_RUN="--family fmha_bwd --peers sdpa --no-sim --timing flush --repeats 2"
FWD_RUN="--family fmha_fwd --peers sdpa --no-sim --timing flush --repeats 2 --dtype fp16"
PRE="$PY tools/precompile.py"
with_dtype() { local d=$1; shift; for s in "$@"; do printf '%s/%s ' "$s" "$d"; done; }

part precompile 40 bash -c "$PRE --family fmha_bwd --jobs 8 --dtype all \
$(with_dtype fp16 $BWD16) $(with_dtype bf16 $BWD_BF16) $SIM & \
$PRE --family fmha_fwd --jobs 3 --tiles default,128x128 $FWD & \
$PRE --family fmha_bwd --jobs 3 --config '$SPLIT_OLD' 2x16:8x4096x256/causal \
4x8:4x4096x256/causal 8x16:8x1000x256/causal & wait"
part bwd-fp16 70 $SPAK run $BWD_RUN --dtype fp16 --shapes $BWD16 \
  --out "$W/bwd-fp16/run.jsonl" --plot "$W/bwd-fp16/plot.png"
part bwd-bf16 30 $SPAK run $BWD_RUN --dtype bf16 --shapes $BWD_BF16 --out "$W/bwd-bf16/run.jsonl"
part sim 25 $SPAK run --family fmha_bwd --no-time --dtype all --sim-work 67108864 \
  --shapes $SIM --out "$W/sim/run.jsonl"
part fwd-d64 20 bash -c "$SPAK run $FWD_RUN --shapes $FWD --out '$W/fwd-d64/run.jsonl'; \
$SPAK run $FWD_RUN --tiles 128x128 --shapes $FWD --out '$W/fwd-d64/run-old128.jsonl'"
part split-ab 20 $PY tools/bwd_split_ab.py --pairs 8 --dtypes fp16
part eager 12 $SPAK run --family fmha_bwd --peers sdpa --no-sim --timing kernel,eager \
  --repeats 2 --dtype fp16 --shapes 16x12x1024x64/causal --out "$W/eager/run.jsonl"
part report 5 bash -c "$SPAK report '$W'/bwd-*/run.jsonl --family fmha_bwd --no-plots \
--out-dir '$W/report/bwd'; $SPAK report '$W/fwd-d64/run.jsonl' --no-plots --out-dir '$W/report/fwd'"

if [ -z "${I35_DRY:-}" ]; then
  echo "== summary"
  $PY - "$W"/bwd-fp16/run.jsonl "$W"/bwd-bf16/run.jsonl "$W"/sim/run.jsonl \
    "$W"/fwd-d64/run.jsonl "$W"/fwd-d64/run-old128.jsonl "$W"/eager/run.jsonl <<'PYEOF' 2>&1 | cut -c1-260
import json, math, sys
seen = {}
def geo(xs):
    xs = [x for x in xs if x]
    return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f} over {len(xs)}" if xs else "-"
for path in sys.argv[1:]:
    try:
        rows = [json.loads(l) for l in open(path) if l.strip()]
    except OSError:
        print(f"{path}: none"); continue
    cases = {}
    for r in rows:
        if r.get("case") and r.get("provider") != "matmul-fp16-8192":
            cases.setdefault(r["case"], {})[r["provider"]] = r
    print(f"-- {path.split('/i35/')[-1]}: {len(cases)} shapes")
    ratios = {}
    for case, by in cases.items():
        ours = by.get("spak-fused") or {}
        tf = lambda p: (by.get(p) or {}).get("tflops")
        cells = []
        for mine, peer in (("spak-fused", "sdpa-cudnn"), ("spak-fused", "sdpa-flash"),
                           ("fwd+bwd:spak-fused", "fwd+bwd:sdpa-cudnn")):
            if tf(mine) and tf(peer):
                ratios.setdefault(f"{mine}/{peer}", []).append(tf(mine) / tf(peer))
                cells.append(f"{mine.split(':')[0][:7]}/{peer.split('-')[1]} {tf(mine) / tf(peer):.3f}")
        er = (ours.get("err_ratio") or {})
        sim = ours.get("sim") or {}
        print(f"{case:34s} {('%.0f' % tf('spak-fused')) if tf('spak-fused') else '-':>4} TF "
              f"(fwd+bwd {('%.0f' % tf('fwd+bwd:spak-fused')) if tf('fwd+bwd:spak-fused') else '-'}) "
              + " ".join(cells)
              + (f" err/cudnn {er['sdpa-cudnn']:.2f}" if er.get("sdpa-cudnn") else "")
              + f" det {ours.get('deterministic')} pass {ours.get('passed')}"
              + (f" sim {100 * sim['fraction_bit_identical']:.3f}% {sim.get('max_ulp')}ulp"
                 if "fraction_bit_identical" in sim else f" sim-err {sim['error'][:60]}" if sim.get("error") else "")
              + (f" ERROR {str(ours.get('error'))[:80]}" if ours.get("error") else ""))
        for p, r in by.items():
            if len(r.get("modes") or {}) > 1:
                print("    " + p + " " + " ".join(f"{m} {st.get('ms_median', 0):.4f}ms"
                                             for m, st in r["modes"].items()))
    for k, v in ratios.items():
        print(f"   geomean {k}: {geo(v)}")
    seen[path.split("/i35/")[-1]] = cases
new, old = seen.get("fwd-d64/run.jsonl", {}), seen.get("fwd-d64/run-old128.jsonl", {})
for case in new:
    a, b = (new[case].get("spak-fused") or {}), (old.get(case, {}).get("spak-fused") or {})
    if a.get("tflops") and b.get("tflops"):
        print(f"   forward {case}: config {a.get('tiles')} {a['tflops']:.0f} TFLOPS, "
              f"128x128 {b['tflops']:.0f}: new/old {a['tflops'] / b['tflops']:.3f}")
PYEOF
  sed -n '/### Forward + backward/,/^Geometric/p' "$W"/report/bwd/report.md 2>/dev/null \
    | grep -E "^(Geometric|\| shape)" 
  awk '/^## /{print} /### Lengths off the 16-grid/{f=1; next} /^###/{f=0} f && /^- /' \
    "$W"/report/*/report.md 2>/dev/null
  grep -h "new/old" "$W/split-ab/log.txt" 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$W/gpu.txt" 2>/dev/null
  echo "commit $(git rev-parse --short HEAD 2>/dev/null), wall $(( $(date +%s) - T0 ))s" \
    | tee "$W/wall.txt"
fi
tar -czf "$OUT/i35.tar.gz" -C "$OUT" i35 && echo "wrote $OUT/i35.tar.gz"
