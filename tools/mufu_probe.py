"""MUFU.RSQ (ct.rsqrt) and MUFU.TANH (ct.tanh APPROX) on a GPU (issue 19): what the sm_90
model needs to make them bit-exact, recorded in one run.

    source .carry/setup.sh && python tools/mufu_probe.py --out $OUT        # on the GPU
    python tools/mufu_probe.py --out /tmp/m --backend sim                  # dry run here
    python tools/mufu_probe.py --out $OUT --tanh-table     # MUFU.TANH alone: the whole table

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
sys.path.insert(0, str(ROOT / "tools"))

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


def run_log2(yb):
    """The largest s such that yb is constant on aligned runs of 2^s entries."""
    run = 0
    for s in range(1, 24):
        if yb.size >> s == 0 or not (yb.reshape(-1, 1 << s) == yb.reshape(-1, 1 << s)[:, :1]).all():
            break
        run = s
    return run


def tanh_table_part(be, n, emin=-8, emax=2):
    """--tanh-table: every fp32 of the binades 2^emin .. 2^emax and their negatives. Per
    binade: the run length (constancy checked on every input of both signs), odd symmetry
    on every input, and the run starts' result bits as a first value plus int16/int32
    differences (monotone, small steps: xz/zlib pack them; no libm needed to rebuild)."""
    arrays, info = {}, {}
    for e in range(emin, emax + 1):
        x = binade(e, n)
        y = be.op("tanh_approx", x)
        yn = be.op("tanh_approx", -x)
        yb = y.view(np.uint32)
        odd_bad = np.flatnonzero(yn.view(np.uint32) != (-y).view(np.uint32))
        run = run_log2(yb)
        starts = yb[:: 1 << run].astype(np.int64)
        d = np.diff(starts)
        dt = np.int16 if d.size and np.abs(d).max() < 2 ** 15 else np.int32
        arrays[f"t{e}_first"] = starts[:1].astype(np.uint32)
        arrays[f"t{e}_diff"] = d.astype(dt)
        ref = np.tanh(x[:: 1 << run].astype(np.float64)).astype(np.float32)
        off = starts - ref.view(np.uint32).astype(np.int64)
        info[str(e)] = {"run_log2": run, "runs": int(starts.size), "odd_failures": int(odd_bad.size),
                        "odd_fail_first": [float(v) for v in x[odd_bad[:8]]],
                        "diff_dtype": np.dtype(dt).name, "diff_min": int(d.min()) if d.size else 0,
                        "diff_max": int(d.max()) if d.size else 0,
                        "off_min": int(off.min()), "off_max": int(off.max()),
                        "off_mean": float(off.mean()), "sign_bits": int((yb >> 31).sum())}
        print(f"tanh e={e}: {info[str(e)]}", flush=True)
    return arrays, info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("gpu", "sim"), default="gpu")
    ap.add_argument("--tanh-table", action="store_true",
                    help="only MUFU.TANH's table: every fp32 in [2^-8, 8) and its negative "
                         "(writes tanh_table.npz / .json; the rsqrt part is not re-run)")
    ap.add_argument("--binades", default="-8,2", metavar="EMIN,EMAX",
                    help="--tanh-table: the binades 2^EMIN .. 2^EMAX (default the table's -8,2)")
    ap.add_argument("--rsqrt-only", action="store_true",
                    help="MUFU.RSQ's table only, not the tanh survey of 25 binades (the "
                         "slow part; spak calibrate --check reads only rsqrt_off of this file)")
    args = ap.parse_args(argv)
    emin, emax = (int(e) for e in args.binades.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    be = Gpu() if args.backend == "gpu" else Sim()
    n = N23 if args.backend == "gpu" else 1 << 12      # the dry run samples each binade
    t0 = time.perf_counter()
    if args.tanh_table:
        arrays, info = tanh_table_part(be, n, emin, emax)
        stem = "tanh_table"
    else:
        arrays, info = rsqrt_part(be, n)
        if not args.rsqrt_only:
            a2, i2 = tanh_part(be, n, -20, 4, np.random.default_rng(7))
            arrays.update(a2)
            info["tanh"] = i2
        stem = "mufu_probe"
    info["seconds"] = round(time.perf_counter() - t0, 1)
    if args.backend == "gpu":
        import torch
        info["gpu"] = torch.cuda.get_device_name()
    np.savez_compressed(out / f"{stem}.npz", **arrays)
    (out / f"{stem}.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
