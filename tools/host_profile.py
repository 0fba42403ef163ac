"""Where spak.fmha's eager host time goes, layer by layer (seed shape, GPU needed).

    source .carry/setup.sh && python tools/host_profile.py [--shape 1x8x512x64] [--n 2000]

For a launch-bound shape the wall time per call of a loop of calls is the host time. Each
layer is timed alone, outermost first: spak.fmha (in plain eager mode: the validated-call
memo, then api._impl directly), torch.ops.spak.fmha (the custom op's dispatch + body, the
path taken under autograd, torch.compile and modes), api._impl (the body: output
allocation, device guard, gpu.launch.fmha_into), fmha_into (plan cache + ct.launch), and
ct.launch with prepared arguments; SDPA (cuDNN / flash) in the same run as the peer. Then a
cProfile of spak.fmha, top functions by own time.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_call_us(fn, n):
    import torch
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1x8x512x64")
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args(argv)
    import torch
    import cuda.tile as ct
    import spak
    from spak import api
    from spak.gpu import launch as gl
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, S, D = map(int, args.shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    scale = D ** -0.5
    t = api.resolve_tiles("fused", q.dtype, D, False, S, q.device)
    out = torch.empty_like(q)
    tiles = {"TILE_M": t["TILE_M"], "TILE_N": t["TILE_N"], "LAT_K": 0, "LAT_V": 0}
    hints = {"occupancy": t.get("occupancy"), "num_ctas": t.get("num_ctas")}
    op_args = (q, k, v, None, False, scale, "fused", t["TILE_M"], t["TILE_N"], 0, 0,
               int(t.get("occupancy") or 0), int(t.get("num_ctas") or 0))
    gl.fmha_into("fused", q, k, v, out, scale=scale, tiles=tiles, hints=hints)
    (L, _dummy) = next(iter(gl._FUSED_PLANS.values()))
    stream = torch.cuda.current_stream()

    layers = {
        "spak.fmha": lambda: spak.fmha(q, k, v),
        "torch.ops.spak.fmha": lambda: torch.ops.spak.fmha(*op_args),
        "api._impl": lambda: api._impl(*op_args),
        "gpu.launch.fmha_into": lambda: gl.fmha_into("fused", q, k, v, out, scale=scale,
                                                     tiles=tiles, hints=hints),
        "ct.launch (prepared)": lambda: ct.launch(stream, L.grid, L.kernel,
                                                  (q, k, v, out, _dummy) + L.args[5:]),
    }
    print(f"{torch.cuda.get_device_name()} {time.strftime('%Y-%m-%d %H:%M')} shape "
          f"{args.shape} fp16 non-causal, config {t}; us per call, loop of {args.n}:")
    for name, fn in layers.items():
        print(f"  {name:<24} {per_call_us(fn, args.n):8.1f}", flush=True)
    for name, be in (("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                     ("SDPA flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel(be):
            us = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
                             args.n)
        print(f"  {name:<24} {us:8.1f}", flush=True)

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.n):
        spak.fmha(q, k, v)
    torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    print(buf.getvalue())


if __name__ == "__main__":
    main()
