"""spak.fmha at head dim 64 on lengths off the tile grid (issue 18's varlen runs saw the
padded forward at D 64, 16 x 1000 non-causal, read 247 TFLOPS where the varlen kernel with
the same tiles read 377: results/varlen-h100-2026-11-27 run 14). On a GPU, in one go:

    python ci/fmha_d64_probe.py [--pairs 30]

Per batch (Hq 32, Hkv 8, D 64, fp16, non-causal): spak.fmha at its config (the tuned
store's) against the same call with other scheduling hints / tiles (`tiles=`), and
spak.fmha_varlen on the same rows packed; each as the median time ratio over pairs timed
back to back (ci/decode_bench.paired_ratios). Prints one line per batch; every variant's
output is compared with the default's (bits: hints and TILE_M do not change a row).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: (B, L, D): lengths off the tile grid beside whole ones, D 128 as a control
BATCHES = [(16, 1000, 64), (16, 1008, 64), (16, 992, 64), (16, 1024, 64), (16, 960, 64),
           (16, 1000, 128), (16, 1024, 128)]
#: name -> (tiles over the config's, occupancy hint); "same" relaunches the config itself
#: old128: 128 x 128 tiles with no hint, spak.fmha's config at D 64 before issue 35 for keys
#: off the 16-grid (spak.api.off_grid_config now takes 64 x 128 at occupancy 2 there)
VARIANTS = {"same": ({}, None), "o2": ({}, 2), "o4": ({}, 4), "m64o2": ({"TILE_M": 64}, 2),
            "old128": ({"TILE_M": 128, "TILE_N": 128}, None)}


def _launch(q, k, v, tiles, occupancy):
    """spak.fmha's kernel planned with `tiles` (gpu.plan.plan_fmha) and an occupancy hint,
    launched on the current stream (spak.fmha takes tiles, not hints)."""
    import cuda.tile as ct
    import torch
    from spak.gpu.plan import plan_fmha
    from spak.gpu.variants import with_hints
    out = torch.empty_like(q)
    (L,) = plan_fmha("fused", q, k, v, out, causal=False, tiles=tiles,
                     alloc=lambda shape, kind: torch.zeros(shape, device=q.device))
    kernel = with_hints(L.kernel, occupancy=occupancy or None)

    def call():
        ct.launch(torch.cuda.current_stream(), L.grid, kernel, L.args)
        return out
    return call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=30)
    a = ap.parse_args()
    import torch
    import spak
    from spak.api import resolve_tiles
    from decode_bench import _graph, paired_ratios
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev))
    for B, L, D in BATCHES:
        q = torch.randn(B, 32, L, D, device=dev, dtype=torch.float16)
        k = torch.randn(B, 8, L, D, device=dev, dtype=torch.float16)
        v = torch.randn_like(k)
        base = resolve_tiles("fused", q.dtype, D, False, L, dev, rows=B * 32 * L)
        fns = {"default": lambda: spak.fmha(q, k, v, enable_gqa=True)}
        for n, (t, occ) in VARIANTS.items():
            keep = ("TILE_M", "TILE_N", "LAT_K", "LAT_V")
            tiles = {**{x: base[x] for x in keep if x in base}, **t}
            if n == "old128" and D > 64:
                continue
            fns[n] = _launch(q, k, v, tiles, base.get("occupancy") if n == "same" else occ)
        qp, kp, vp = (x.transpose(1, 2).reshape(B * L, x.shape[1], D).contiguous()
                      for x in (q, k, v))
        cu = torch.arange(0, B * L + 1, L, device=dev, dtype=torch.int32)
        fns["varlen"] = lambda: spak.fmha_varlen(qp, kp, vp, cu, cu, L, L)
        ref = fns["default"]()
        same = {}
        for n, f in fns.items():
            o = f()
            if n == "varlen":
                o = o.view(B, L, 32, D).transpose(1, 2)
            same[n] = float((o == ref).float().mean().item())
        runs = {n: _graph([f]) for n, f in fns.items()}
        ratios = paired_ratios(runs, "default", a.pairs)
        ms = []
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            runs["default"]()
            e1.record()
            e1.synchronize()
            ms.append(e0.elapsed_time(e1))
        tf = 4.0 * B * 32 * L * L * D / (sorted(ms)[2] * 1e9)
        print(f"{B}x{L} D{D} nc: config {base}; default {tf:.0f} TFLOPS; time / default: "
              + "  ".join(f"{n} {r:.3f}" for n, r in ratios.items())
              + "; identical to default: " + "  ".join(f"{n} {s:.4%}" for n, s in same.items()))
        del runs, q, k, v, qp, kp, vp
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
