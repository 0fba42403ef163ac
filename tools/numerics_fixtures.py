"""Slice the H200 numerics probe data (tools/numerics_probe.py output, 31 MB, kept outside
the repo) into the small committed fixture tests/data/numerics_sm90.npz.

    python tools/numerics_fixtures.py /path/to/probe-data

mma: 2 cases per case group (random, wide exponents, cancellation, large accumulator)
per (dtype, K), each cut to 16 rows x 16 columns (rows and columns of an mma are
independent, so a cut keeps the GPU's answer); row sums: 4 cases x 8 rows of 128;
exp2, approximate division, bf16 casts: 2048 samples each.
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "numerics_sm90.npz"


def main(src):
    src = Path(src)
    out = {}
    cases = np.array([0, 1, 32, 33, 64, 65, 96, 97])       # 2 per group of 32
    for dt in ("fp16", "bf16"):
        for k in (16, 64):
            f = np.load(src / f"probe_mma_{dt}_k{k}.npz")
            b = f"mma_{dt}_k{k}"
            a, bb, c, d = (f[b + s][cases] for s in ("_a", "_b", "_c", "_d"))
            a, bb, c, d = a[:, :16, :], bb[:, :, :16], c[:, :16, :16], d[:, :16, :16]
            st = np.float16 if dt == "fp16" else np.float32
            out[b + "_a"], out[b + "_b"] = a.astype(st), bb.astype(st)
            out[b + "_c"], out[b + "_d"] = c, d
    e = np.load(src / "probe_elementwise.npz")
    rng = np.random.default_rng(6)
    n = e["x"].size
    for key, names in (("exp2", ("x", "y")), ("div", ("div_x", "div_y", "div_q")),
                       ("cast", ("cast_x", "cast_bf16", "cast_f16"))):
        idx = np.sort(rng.choice(n, 2048, replace=False))
        for nm in names:
            out[f"{key}__{nm}"] = e[nm][idx]
    out["sum_x"] = e["sum_x"][:4, :8]
    out["sum_y"] = e["sum_y"][:4, :8]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(OUT, OUT.stat().st_size, "bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/work/probe-data")
