"""Record the GPU's inexact arithmetic for the simulator's numeric model (issue 6).

    source .carry/setup.sh && python tools/numerics_probe.py --out $OUT

Runs gpu/probes kernels on crafted and random inputs and saves inputs and outputs as
.npz files (mma fp16/bf16 for K = 16 and 64, exp2 with flush-to-zero, approximate
division, fp32 -> fp16/bf16 casts, row sums), plus a one-line agreement summary per op
against the simulator's current model, so the model can be fitted on a CPU afterwards.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def mma_cases(rng, n, k, kind):
    """A [n,64,k], B [n,k,64] (float32 holding fp16/bf16 values later), C [n,64,64]."""
    a = rng.standard_normal((n, 64, k))
    b = rng.standard_normal((n, k, 64))
    c = rng.standard_normal((n, 64, 64))
    q = n // 4
    # wide exponent ranges
    a[q:2 * q] *= 2.0 ** rng.integers(-12, 12, (q, 64, k))
    b[q:2 * q] *= 2.0 ** rng.integers(-12, 12, (q, k, 64))
    # cancellation: b's columns make a.b nearly cancel, c small
    a[2 * q:3 * q] = np.round(a[2 * q:3 * q] * 8) / 8
    b[2 * q:3 * q] = np.round(b[2 * q:3 * q] * 8) / 8
    c[2 * q:3 * q] *= 2.0 ** -20
    # large accumulator against small products
    c[3 * q:] *= 2.0 ** 10
    return a, b, c


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=".")
    ap.add_argument("--no-summary", action="store_true",
                    help="skip the per-op agreement lines (spak calibrate --check prints them)")
    args = ap.parse_args()
    out = Path(args.out)
    import torch
    import cuda.tile as ct
    from spak.gpu.probes import kernels as P
    st = torch.cuda.current_stream()
    rng = np.random.default_rng(2026)
    dev = "cuda"

    def launch(kernel, grid, *a):
        ct.launch(st, grid, kernel, a)
        torch.cuda.synchronize()

    arrays = {}
    for dt_name, tdt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        for k in (16, 64):
            n = 128
            a, b, c = mma_cases(rng, n, k, dt_name)
            A = torch.tensor(a, dtype=torch.float32).to(tdt).to(dev)
            B = torch.tensor(b, dtype=torch.float32).to(tdt).to(dev)
            C = torch.tensor(c, dtype=torch.float32, device=dev)
            D = torch.full((n, 64, 64), float("nan"), dtype=torch.float32, device=dev)
            launch(P.mma_probe, (n, 1, 1), A, B, C, D, 64, 64, k)
            arrays[f"mma_{dt_name}_k{k}_a"] = A.float().cpu().numpy()
            arrays[f"mma_{dt_name}_k{k}_b"] = B.float().cpu().numpy()
            arrays[f"mma_{dt_name}_k{k}_c"] = C.cpu().numpy()
            arrays[f"mma_{dt_name}_k{k}_d"] = D.cpu().numpy()
            # one file per (dtype, K): the device tool returns files of at most 16 MB
            np.savez_compressed(out / f"probe_mma_{dt_name}_k{k}.npz",
                                **{key: arrays[key] for key in arrays if key.startswith(f"mma_{dt_name}_k{k}_")})

    T, n = 1024, 1 << 18
    x = np.concatenate([rng.uniform(-160, 2, n // 2), rng.uniform(-30, 0.5, n // 2)]).astype(np.float32)
    X = torch.tensor(x, device=dev)
    Y = torch.empty_like(X)
    launch(P.exp2_probe, (n // T, 1, 1), X, Y, T)
    ex = {"x": x, "y": Y.cpu().numpy()}
    z = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    w = (rng.uniform(0.5, 5000, n)).astype(np.float32)
    Z, W = torch.tensor(z, device=dev), torch.tensor(w, device=dev)
    Yd = torch.empty_like(Z)
    launch(P.div_approx_probe, (n // T, 1, 1), Z, W, Yd, T)
    ex.update(div_x=z, div_y=w, div_q=Yd.cpu().numpy())
    xc = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 16, n)).astype(np.float32)
    Xc = torch.tensor(xc, device=dev)
    Y16 = torch.empty(n, dtype=torch.float16, device=dev)
    YB = torch.empty(n, dtype=torch.bfloat16, device=dev)
    launch(P.cast_probe, (n // T, 1, 1), Xc, Y16, YB, T)
    ex.update(cast_x=xc, cast_f16=Y16.cpu().numpy(), cast_bf16=YB.float().cpu().numpy())
    xs = (rng.standard_normal((128, 64, 128)) * 2.0 ** rng.integers(-8, 8, (128, 64, 1))).astype(np.float32)
    Xs = torch.tensor(xs, device=dev)
    Ys = torch.empty((128, 64), dtype=torch.float32, device=dev)
    launch(P.rowsum_probe, (128, 1, 1), Xs, Ys, 64, 128)
    ex.update(sum_x=xs, sum_y=Ys.cpu().numpy())
    np.savez_compressed(out / "probe_elementwise.npz", **ex)

    print("files:", sorted(os.listdir(out)))
    if args.no_summary:
        return
    # agreement with the simulator's models, op by op (the same code as `spak calibrate --check`)
    from spak.device.calibrate import agreement
    for model in ("sm_90", "sm_90-v0"):
        for op, group, pct, worst in agreement(model, out):
            print(f"{model} {op} {group}: {pct:.4f}% bit-identical, worst {worst} ulp")


if __name__ == "__main__":
    main()
