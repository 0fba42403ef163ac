"""The sm_90 model as it was before issue 22 (commit 2b16970) against MMA-Sim's Hopper model,
on ci/mmasim_oracle.py's inputs: where the two fixes (fp32 accumulator register between
k16 steps, +0 for a zero result, zero-term exponent -133) changed bits.

    python results/mmasim-2026-11-24/old_sm90_vs_mmasim.py
"""
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import cuda.tile as ct

ROOT = Path(__file__).resolve().parents[2]
src = subprocess.run(["git", "-C", str(ROOT), "show", "2b16970:sim/numerics.py"], check=True,
                     capture_output=True, text=True).stdout
src = src.replace("from . import dtypes", "from spak.sim import dtypes")
tmp = Path(tempfile.mkdtemp()) / "numerics_old.py"
tmp.write_text(src)
sys.path.insert(0, str(tmp.parent))
import numerics_old  # noqa: E402

spec = importlib.util.spec_from_file_location("mmasim_oracle", ROOT / "ci" / "mmasim_oracle.py")
O = importlib.util.module_from_spec(spec)
spec.loader.exec_module(O)
tot = {}
for dt in O.DTYPES:
    for cls in O.CLASSES:
        n = s = 0
        for k in O.KS:
            rng = np.random.default_rng([0, O.DTYPES.index(dt), O.CLASSES.index(cls), k])
            a, b, c = O.inputs(cls, dt, k, 3, rng)
            want = O.oracle("sm_90", dt, a, b, c)
            got = numerics_old.hopper_mma_f32(a.astype(np.float64), b, c,
                                              ct.float16 if dt == "fp16" else ct.bfloat16)
            n += want.size
            s += int((got.view(np.uint32) == want.view(np.uint32)).sum())
        tot[(dt, cls)] = (n, s)
        print(f"| sm_90 before issue 22 | Hopper | {dt} | {cls} | {100 * s / n:.4f}% | {s:,} / {n:,} |")
n = sum(v[0] for v in tot.values())
s = sum(v[1] for v in tot.values())
print(f"| **sm_90 before issue 22** | **Hopper** | all | all | **{100 * s / n:.4f}%** | **{s:,} / {n:,}** |")
