"""Issue 7's measure-first probe: where does the fused kernel stand, and which knobs move it?

    source .carry/setup.sh && python ci/perf_probe.py --out $OUT/perf.jsonl

For a few standard shapes (B*S = 16384, Hq*D = 2048) it times, in one run on one GPU:
PyTorch SDPA cuDNN and flash (FA2), NVIDIA's cuTile FMHA sample when a copy of it sits in
.peer/ (fetched from NVIDIA/cutile-python, never committed), and our fused kernel over
tiles x occupancy x load-latency hints. Prints TFLOPS per provider/config and the ratio of
the best of ours to cuDNN; one JSON line per measurement (fsync'd) in --out.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spak.device.timing import matmul_ceiling, time_events  # noqa: E402
from spak.attention.problems import ProblemSpec  # noqa: E402

SHAPES = [(64, 1024), (64, 8192), (128, 1024), (128, 8192)]     # (D, S)
TILES = {64: [(64, 64), (128, 64), (128, 128)], 128: [(64, 128), (128, 64), (128, 128)]}
OCCUPANCY = [None, 2]
LATENCY = [(0, 0), (2, 4)]


def spec_for(d, s, causal):
    return ProblemSpec(B=16384 // s, Hq=2048 // d, Hkv=2048 // d, Sq=s, Sk=s, D=d,
                       dtype="fp16", causal=causal)


def load_peer():
    path = ROOT / ".peer" / "nv_fmha_sample.py"
    if not path.exists():
        return None
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("nv_fmha_sample", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="perf.jsonl")
    ap.add_argument("--budget-s", type=float, default=480)
    args = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    from spak.gpu.launch import fmha_into
    from spak.gpu.plan import plan_fmha
    from spak.gpu.variants import with_hints
    from spak.gpu.launch import run as run_launches, torch_alloc

    t_start = time.time()
    out_f = open(args.out, "a")
    gpu = torch.cuda.get_device_name()
    peer = load_peer()
    ceiling = matmul_ceiling()["tflops"]
    print(f"{gpu}; fp16 matmul ceiling {ceiling:.0f} TFLOPS; peer sample: {peer is not None}")

    def emit(row):
        row.update(gpu=gpu, date=time.strftime("%Y-%m-%d"), ceiling_tflops=ceiling)
        out_f.write(json.dumps(row) + "\n")
        out_f.flush()
        os.fsync(out_f.fileno())
        print(f"  {row['provider']:<34} {row.get('tflops') or 0:7.1f} TFLOPS"
              + (f"  [{row['error'][:80]}]" if row.get("error") else ""), flush=True)

    summary = []
    for (d, s), causal in itertools.product(SHAPES, (False, True)):
        if time.time() - t_start > args.budget_s:
            print("budget reached; stopping")
            break
        spec = spec_for(d, s, causal)
        g = torch.Generator(device="cuda").manual_seed(d * 100000 + s + causal)
        sets = [tuple(torch.randn(sh, device="cuda", dtype=torch.float16, generator=g)
                      for sh in (spec.q_shape, spec.kv_shape, spec.kv_shape)) for _ in range(3)]
        out = torch.empty(spec.q_shape, device="cuda", dtype=torch.float16)
        print(f"{spec.case_id} ({spec.flops / 1e12:.2f} TFLOP)")
        best = {}

        def measure(name, fn, **extra):
            row = {"case": spec.case_id, "provider": name, **extra}
            try:
                fn(0)
                torch.cuda.synchronize()
                st = time_events(fn, len(sets), target_s=0.15)
                row.update(ms=st["ms_median"], tflops=spec.flops / (st["ms_median"] * 1e-3) / 1e12)
            except Exception as e:  # noqa: BLE001 - recorded, the probe goes on
                row.update(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            emit(row)
            return row.get("tflops")

        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def f(i, backend=backend):
                q, k, v = sets[i]
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            best[name] = measure(name, f)
        if peer is not None:
            for tm, tn in TILES[d]:
                def f(i, tm=tm, tn=tn):
                    q, k, v = sets[i]
                    peer.cutile_fmha(q, k, v, tile_m=tm, tile_n=tn, causal=causal)
                t = measure(f"nv_sample {tm}x{tn} occ2", f, tiles=[tm, tn])
                best["nv_sample"] = max(best.get("nv_sample") or 0, t or 0)
        for (tm, tn), occ, (lk, lv) in itertools.product(TILES[d], OCCUPANCY, LATENCY):
            tiles = {"TILE_M": tm, "TILE_N": tn, "LAT_K": lk, "LAT_V": lv}
            plans = []
            for q, k, v in sets:
                launches = plan_fmha("fused", q, k, v, out, causal=causal, tiles=tiles,
                                     alloc=torch_alloc(q))
                plans.append([type(L)(with_hints(L.kernel, occupancy=occ), L.grid, L.args, L.name)
                              for L in launches])
            name = f"ours {tm}x{tn} occ{occ or '-'} lat{lk},{lv}"
            t = measure(name, lambda i, plans=plans: run_launches(plans[i]),
                        tiles=[tm, tn], occupancy=occ, latency=[lk, lv])
            best["ours"] = max(best.get("ours") or 0, t or 0)
        summary.append((spec.case_id, best))
        del sets, out
        torch.cuda.empty_cache()

    print("\nbest per provider (TFLOPS), ours/cuDNN:")
    for case, b in summary:
        cu = b.get("sdpa_cudnn") or 0
        print(f"  {case:<34} ours {b.get('ours') or 0:6.1f}  sample {b.get('nv_sample') or 0:6.1f}"
              f"  cuDNN {cu:6.1f}  FA2 {b.get('sdpa_flash') or 0:6.1f}  "
              f"ratio {(b.get('ours') or 0) / cu if cu else 0:.2f}")


if __name__ == "__main__":
    main()
