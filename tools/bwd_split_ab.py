"""A/B of the backward's dK/dV pass at D 256 (issue 35): the old kernel (dK/dV 32 x 32, one
block per key tile, DKV_SPLIT 1: its [keys, 256] float32 accumulators spill, 1200 bytes a
thread on sm_90) against the new default (64 x 64 in two column parts, DKV_SPLIT 2: no
spills), in one run on one GPU. On a GPU:

    python tools/bwd_split_ab.py [--pairs 20] [--dtypes fp16 bf16]

Per shape (Gemma-2's heads, D 256, causal): the forward with LSE once (spak's training op),
then the backward's launches alone (spak.gpu.launch.fmha_bwd_into) with each config, timed
in alternating pairs (CUDA events; the median of new/old time ratios) and as TFLOPS (2.5x
the forward's FLOPs); dQ, dK, dV of the two compared bit for bit (the simulator says they
are identical). Errors against float64 and cuDNN, the simulator's bits and the new default's
speed beside SDPA are `spak run --family fmha_bwd --shapes 2x16:8x4096x256/causal`'s
(docs/harness.md). Prediction recorded before the run (gpu/plan_bwd.default_dkdv_split):
the backward at 0.7-0.85x the old time.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: (model, B, Hq, Hkv, S): Gemma-2 9B and 2B heads (D 256), training-sized batches
SHAPES = [("Gemma-2 9B", 2, 16, 8, 4096), ("Gemma-2 2B", 4, 8, 4, 4096),
          ("Gemma-2 9B", 8, 16, 8, 1000)]
OLD = {"DKV_TILE_M": 32, "DKV_TILE_N": 32, "DKV_SPLIT": 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"])
    a = ap.parse_args()
    import torch
    import spak  # noqa: F401 -- registers torch.ops.spak
    from spak import api
    import spak.gpu.launch as gl
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), flush=True)
    for dt in a.dtypes:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        for model, B, Hq, Hkv, S in SHAPES:
            D = 256
            g = torch.Generator(device=dev).manual_seed(B * 1000 + S)
            q = torch.randn(B, Hq, S, D, device=dev, dtype=dtype, generator=g)
            k = torch.randn(B, Hkv, S, D, device=dev, dtype=dtype, generator=g)
            v = torch.randn(B, Hkv, S, D, device=dev, dtype=dtype, generator=g)
            dout = torch.randn(B, Hq, S, D, device=dev, dtype=dtype, generator=g)
            out, lse = torch.ops.spak.fmha_train(
                q, k, v, *api._op_args(q, k, v, None, True, None, Hq != Hkv, "fused", None))
            scale = 1 / math.sqrt(D)
            grads = {n: tuple(torch.empty_like(t) for t in (q, k, v)) for n in ("old", "new")}
            tiles = {"old": OLD, "new": None}

            def call(n):
                gl.fmha_bwd_into("fused", q, k, v, out, dout, lse, *grads[n], causal=True,
                                 scale=scale, tiles=tiles[n])
            for n in ("old", "new"):
                call(n)
            torch.cuda.synchronize()
            same = [float((x.view(torch.int16) == y.view(torch.int16)).float().mean())
                    for x, y in zip(grads["old"], grads["new"])]
            ms = {"old": [], "new": []}
            for i in range(a.pairs):
                for n in (("old", "new") if i % 2 else ("new", "old")):
                    e0, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    e0.record()
                    call(n)
                    e1.record()
                    e1.synchronize()
                    ms[n].append(e0.elapsed_time(e1))
            ratio = statistics.median(x / y for x, y in zip(ms["new"], ms["old"]))
            flops = 2.5 * 4.0 * B * Hq * S * S * D / 2
            tf = {n: flops / (statistics.median(ms[n]) * 1e9) for n in ms}
            print(f"{dt} {B}x{Hq}:{Hkv}x{S}x{D} causal ({model}): backward new/old time "
                  f"{ratio:.3f}; TFLOPS old {tf['old']:.0f} new {tf['new']:.0f}; bits equal "
                  f"dq/dk/dv {same[0]:.4%} {same[1]:.4%} {same[2]:.4%}", flush=True)
            del q, k, v, dout, out, lse, grads
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
