"""MUFU.RSQ (ct.rsqrt) and MUFU.TANH (ct.tanh APPROX) on a GPU (issue 19): what the sm_90
model needs to make them bit-exact, recorded in one run.

    source .carry/setup.sh && python ci/mufu_probe.py --out $OUT        # on the GPU
    python ci/mufu_probe.py --out /tmp/m --backend sim                  # dry run here

rsqrt: every fp32 in [1, 4) (two binades: the exponent's parity matters), as offsets
from the correctly rounded result in ulps (int8, 2^24 entries), and whether
rsqrt(4x) = rsqrt(x) / 2 holds on all of them (then the table is the whole function for
normal inputs). tanh APPROX: for each binade 2^e, e in [-20, 4], all 2^23 inputs: the
largest s such that the result is constant on aligned runs of 2^s inputs, the fewest
trailing zero bits of the results, odd symmetry; the results at run starts when runs
are long (a table), and 4096 random inputs per binade with their results (a check).
Writes mufu_probe.npz and mufu_probe.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "ci"))

from sim_ops_gpu import UNARY_OPS, unary  # noqa: E402

T = 1024
N23 = 1 << 23


class Gpu:
    def __init__(self):
        import torch
        import cuda.tile as ct
        self.torch, self.ct = torch, ct

    def op(self, name, x):
        t = self.torch
        X = t.as_tensor(x, device="cuda")
        Y = t.empty_like(X)
        self.ct.launch(t.cuda.current_stream(), (X.numel() // T,), unary, (X, Y, UNARY_OPS[name], T))
        t.cuda.synchronize()
        return Y.cpu().numpy()


class Sim:
    def op(self, name, x):
        from spak import sim
        y = np.empty_like(x)
        sim.launch(unary, (x.size // T,), (x, y, UNARY_OPS[name], T), check=False)
        return y


def binade(e, n=N23):
    f = np.arange(n, dtype=np.uint32) * (N23 // n)
    return (np.uint32((127 + e) << 23) | f).view(np.float32)


def rsqrt_part(be, n):
    x = np.concatenate([binade(0, n), binade(1, n)])
    y = be.op("rsqrt", x)
    y4 = be.op("rsqrt", (x * np.float32(4)).astype(np.float32))
    ref = (1 / np.sqrt(x.astype(np.float64))).astype(np.float32)
    off = y.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64)
    return {"rsqrt_off": off.astype(np.int8)}, {
        "rsqrt_inputs": int(x.size), "rsqrt_off_hist": {str(k): int(v) for k, v in zip(*np.unique(off, return_counts=True))},
        "rsqrt_scale4_exact": int((y4 * np.float32(2) == y).sum())}


def tanh_part(be, n, emin, emax, rng):
    arrays, info = {}, {}
    for e in range(emin, emax + 1):
        x = binade(e, n)
        y = be.op("tanh_approx", x)
        yb = y.view(np.uint32)
        run = 0
        for s in range(1, 24):
            if n >> s == 0 or not (yb.reshape(-1, 1 << s) == yb.reshape(-1, 1 << s)[:, :1]).all():
                break
            run = s
        tz = int(np.min([(int(v) & -int(v)).bit_length() - 1 if v else 32 for v in
                         np.unique(yb & np.uint32(0x7FFFFF))[:4096]]))
        neg = be.op("tanh_approx", -x[: 64 * T])
        info[str(e)] = {"run_log2": run, "min_trailing_zeros": tz, "distinct": int(np.unique(yb).size),
                        "odd": bool((neg == -y[: 64 * T]).all())}
        if run >= 10:
            arrays[f"tanh_e{e}"] = y[:: 1 << run]
        pick = np.sort(rng.choice(n, 4096, replace=False))
        arrays[f"tanh_x_e{e}"], arrays[f"tanh_y_e{e}"] = x[pick], y[pick]
    return arrays, info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("gpu", "sim"), default="gpu")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    be = Gpu() if args.backend == "gpu" else Sim()
    n = N23 if args.backend == "gpu" else 1 << 12      # the dry run samples each binade
    t0 = time.perf_counter()
    arrays, info = rsqrt_part(be, n)
    a2, i2 = tanh_part(be, n, -20, 4, np.random.default_rng(7))
    arrays.update(a2)
    info["tanh"] = i2
    info["seconds"] = round(time.perf_counter() - t0, 1)
    if args.backend == "gpu":
        import torch
        info["gpu"] = torch.cuda.get_device_name()
    np.savez_compressed(out / "mufu_probe.npz", **arrays)
    (out / "mufu_probe.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
