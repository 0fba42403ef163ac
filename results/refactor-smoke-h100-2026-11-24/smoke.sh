# The refactor's GPU smoke run (device machine, repo root; .base/old = commit 9808213,
# .base/new = the commit under test, both `git archive` exports, carried as .base/trees.tar.xz):
# the same `spak run` on both trees, compared row by row, and the GPU tests of the new one
# (the three at once: correctness only, nothing is timed).
here=results/refactor-smoke-h100-2026-11-24
tar -C .base -xJf .base/trees.tar.xz
CMD="run --kernel all --shapes seed 1x8:2x100:300x64/mask 2x4x77:130x80/causal --dtype all --no-time --json"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "old $(cat .base/old/COMMIT) new $(cat .base/new/COMMIT)"; date -u; } > $OUT/compare.txt 2>&1
(cd .base/old && SPAK_COMMIT=$(cat COMMIT) python -m spak $CMD --out $OUT/run-old.jsonl \
    > $OUT/run-old.json 2> $OUT/run-old.log; echo "old exit $?" >> $OUT/run-old.log) &
(cd .base/new && SPAK_COMMIT=$(cat COMMIT) python -m spak $CMD --out $OUT/run-new.jsonl \
    > $OUT/run-new.json 2> $OUT/run-new.log; echo "new exit $?" >> $OUT/run-new.log) &
(cd .base/new && timeout 420 python -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider) \
    > $OUT/pytest-gpu.txt 2>&1 &
wait
python $here/compare.py $OUT/run-old.jsonl $OUT/run-new.jsonl >> $OUT/compare.txt 2>&1
echo "compare exit $?" >> $OUT/compare.txt
tail -3 $OUT/run-old.log $OUT/run-new.log; head -4 $OUT/compare.txt; sed -n 5,9p $OUT/compare.txt
tail -4 $OUT/pytest-gpu.txt
