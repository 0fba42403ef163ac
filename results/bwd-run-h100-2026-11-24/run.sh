# The device script (repo root, after `source .carry/setup.sh`): the GPU's facts, the
# cubins precompiled in parallel (precompile.py), then the one `spak run` of the backward.
here=results/bwd-run-h100-2026-11-24
SHAPES="seed 1x8:2x100:300x64/mask 2x4x77:130x80/causal"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python -c "import torch, cuda.tile as ct; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cuTile', ct.__version__)"
  echo "commit $SPAK_COMMIT"; date -u; nproc; } > $OUT/env.txt 2>&1
t0=$(date +%s)
python $here/precompile.py 14 all $SHAPES > $OUT/precompile.txt 2>&1
echo "precompile exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/env.txt
timeout 170 python -m spak run --family fmha_bwd --shapes $SHAPES --dtype all \
    --sim-work 67108864 --json --out $OUT/run.jsonl > $OUT/run.json 2> $OUT/run.log
echo "run exit $? after $(( $(date +%s) - t0 )) s" >> $OUT/env.txt
cat $OUT/env.txt; tail -40 $OUT/run.log
