"""Benchmark: the simulator's speed on issue 2's reference problem, beside numpy.

    python -m spak.cpu.bench_sim [--shape 1x8x2048x64] [--kernel fused] [--tiles 64x64] [--repeat 3]
    python -m spak.cpu.bench_sim --problem matmul [--size 2048] [--tiles 128x128x32] [--repeat 3]

Prints the simulated seconds of the whole kernel (median of --repeat runs, after one
warm-up run that pays numba's compile/cache load) and, measured in the same process, a
plain numpy float32 attention (scores, softmax, PV per head) and torch CPU SDPA when
torch is installed. The figure of record lives in results/sim-speed.md.

--problem matmul (issue 19): an fp16 matmul (M, N, K = --size, or MxNxK) through the
sample-style kernel of spak/cpu/matmul_sample.py (fp32 accumulation in ct.mma, fp16 out),
beside numpy's float32 matmul of the same size with one BLAS thread (as the simulator
pins it) and with every core.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from spak.attention.problems import make_inputs, parse_spec
from spak.cpu.simrun import simulate_fmha


def numpy_attention_f32(q, k, v, scale):
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.float32(scale)
    s -= s.max(-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(-1, keepdims=True)
    return np.matmul(s, v)


def _median_time(fn, repeat):
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), min(ts), max(ts)


def _machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d')}")


def _print_rows(rows, repeat):
    for name, (med, lo, hi) in rows:
        print(f"  {name:<34} {med:8.3f} s  (min {lo:.3f}, max {hi:.3f}, {repeat} runs)")


def _parse_size(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in text.lower().split("x")]
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) < 1:
        raise SystemExit(f"--size: want N or MxNxK with positive ints, got {text!r}")
    return tuple(parts)


def bench_matmul(size: str, tiles: str | None, repeat: int) -> int:
    """The simulator on an fp16 matmul beside numpy's float32 matmul of the same size."""
    from spak import sim
    from spak.cpu.matmul_sample import grid, matmul_kernel
    from spak.sim.numerics import set_blas_threads
    m, n, k = _parse_size(size)
    tm, tn, tk = (int(t) for t in (tiles or "128x128x32").split("x"))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = np.zeros((m, n), np.float16)

    def run_sim():
        sim.launch(matmul_kernel, grid(m, n, tm, tn), (a, b, c, tm, tn, tk))

    run_sim()  # warm-up: numba compile or cache load
    sim_t = _median_time(run_sim, repeat)
    # sanity: 64 rows against float64 (fp16 output: half an fp16 ulp of |C| ~ sqrt(K))
    rows = rng.choice(m, min(m, 64), replace=False)
    ref = a[rows].astype(np.float64) @ b.astype(np.float64)
    err = float(np.abs(c[rows].astype(np.float64) - ref).max())
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    np1 = _median_time(lambda: a32 @ b32, repeat)
    rows_out = [("spak sim matmul (sm_90 model)", sim_t), ("numpy float32, 1 BLAS thread", np1)]
    if set_blas_threads(os.cpu_count() or 1):
        rows_out.append((f"numpy float32, {os.cpu_count()} BLAS threads",
                         _median_time(lambda: a32 @ b32, repeat)))
        set_blas_threads(1)       # the simulator's setting again
    print(f"matmul {m}x{n}x{k} fp16 -> fp32 acc -> fp16, tiles {tm}x{tn}x{tk}, "
          f"grid {grid(m, n, tm, tn)[0]}; {_machine()}")
    _print_rows(rows_out, repeat)
    print(f"  max |error| vs float64 on 64 rows: {err:.3g}")
    for name, t in rows_out[1:]:
        print(f"  ratio sim / {name}: {sim_t[0] / t[0]:.1f}x")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spak.cpu.bench_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", default="fmha", choices=("fmha", "matmul"))
    ap.add_argument("--shape", default="1x8x2048x64/fp16/noncausal")
    ap.add_argument("--kernel", default="fused", choices=("fused", "naive"))
    ap.add_argument("--tiles", default=None,
                    help="fmha: MxN, default: the kernel's default tiles; matmul: MxNxK, "
                         "default 128x128x32")
    ap.add_argument("--size", default="2048", help="matmul: N (square) or MxNxK")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    if args.problem == "matmul":
        return bench_matmul(args.size, args.tiles, args.repeat)
    spec = parse_spec(args.shape)
    tiles = tuple(int(t) for t in args.tiles.split("x")) if args.tiles else None
    inp = make_inputs(spec, seed=0)
    scale = 1.0 / np.sqrt(spec.D)

    def run_sim():
        simulate_fmha(args.kernel, inp.q, inp.k, inp.v, causal=spec.causal, tiles=tiles,
                      dtype=spec.dtype)

    run_sim()  # warm-up: numba compile or cache load
    sim_t = _median_time(run_sim, args.repeat)
    np_t = _median_time(lambda: numpy_attention_f32(inp.q, inp.k, inp.v, scale), args.repeat)
    rows = [("spak sim " + args.kernel, sim_t), ("numpy float32 attention", np_t)]
    try:
        import torch
        tq, tk, tv = (torch.from_numpy(x.astype(np.float32)) for x in (inp.q, inp.k, inp.v))
        rows.append(("torch CPU SDPA float32", _median_time(
            lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv), args.repeat)))
    except ImportError:
        pass
    print(f"{spec.case_id}, kernel {args.kernel}, tiles {args.tiles or 'default'}; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}")
    for name, (med, lo, hi) in rows:
        print(f"  {name:<26} {med:8.3f} s  (min {lo:.3f}, max {hi:.3f}, {args.repeat} runs)")
    print(f"  ratio sim / numpy float32: {sim_t[0] / np_t[0]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
