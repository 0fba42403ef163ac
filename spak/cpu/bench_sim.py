"""Benchmark: the simulator's speed on issue 2's reference problem, beside numpy.

    python -m spak.cpu.bench_sim [--shape 1x8x2048x64] [--kernel fused] [--tiles 64x64] [--repeat 3]

Prints the simulated seconds of the whole kernel (median of --repeat runs, after one
warm-up run that pays numba's compile/cache load) and, measured in the same process, a
plain numpy float32 attention (scores, softmax, PV per head) and torch CPU SDPA when
torch is installed. The figure of record lives in results/sim-speed.md.
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spak.cpu.bench_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1x8x2048x64/fp16/noncausal")
    ap.add_argument("--kernel", default="fused", choices=("fused", "naive"))
    ap.add_argument("--tiles", default=None, help="MxN, default: the kernel's default tiles")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
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
