"""A/B of the fused kernel against an earlier version of itself, cuDNN in the same run.

    source .carry/setup.sh && python ci/ab_fused.py --peer .peer/fused_prev.py --out $OUT/ab.jsonl

The peer is a copy of gpu/kernels/fused.py from an earlier commit (`git show
REV:gpu/kernels/fused.py`, its `from .common` import made absolute), kept out of the repo.
For each standard shape (fp16) every provider runs the same tile config (the tuned store's
entry for --store-gpu, else the default) on the same rotating inputs, alternating, twice;
the best median counts. The peer runs both of its paths (RAW_MAX True and False; its
argument list is ours: e.g. `git show 3243cd4:gpu/kernels/fused.py`), and ours must equal
its RAW_MAX=True output bit for bit (same arithmetic). Prints ratios per shape and
geometric means.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spak.gpurun import time_events  # noqa: E402
from spak.problems import select_cases  # noqa: E402


def load_peer(path):
    spec = importlib.util.spec_from_file_location("fused_peer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, help="earlier fused.py (see the docstring)")
    ap.add_argument("--out", default="ab.jsonl")
    ap.add_argument("--store-gpu", default="NVIDIA H200",
                    help="whose tuned configs to use (default: NVIDIA H200)")
    ap.add_argument("--shapes", nargs="+", default=["standard"])
    ap.add_argument("--budget-s", type=float, default=420)
    args = ap.parse_args(argv)

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from gpu.launch import plan_torch, run
    from gpu.plan import default_tiles
    from gpu.variants import apply_hints, split_config, with_hints
    from spak import tuned
    import dataclasses

    peer = load_peer(args.peer)
    gpu = torch.cuda.get_device_name()
    t_start = time.time()
    out_f = open(args.out, "a")
    rows = []
    print(f"{gpu} {time.strftime('%Y-%m-%d %H:%M')}; configs from the store for "
          f"{args.store_gpu}", flush=True)
    for spec in select_cases(args.shapes, dtype="fp16", causal="both"):
        if time.time() - t_start > args.budget_s:
            print("budget reached; stopping", flush=True)
            break
        cfg = tuned.lookup(args.store_gpu, "fused", "fp16", spec.D, spec.causal, spec.Sk) \
            or default_tiles(spec.D, "sm_90", spec.causal)
        tiles, hints = split_config({**default_tiles(spec.D, "sm_90", spec.causal), **cfg})
        g = torch.Generator(device="cuda").manual_seed(spec.Sq * 13 + spec.D + spec.causal)
        sets = [tuple(torch.randn(sh, device="cuda", dtype=torch.float16, generator=g)
                      for sh in (spec.q_shape, spec.kv_shape, spec.kv_shape)) for _ in range(3)]
        outs = {name: [torch.empty(spec.q_shape, device="cuda", dtype=torch.float16)
                       for _ in sets] for name in ("new", "prev_raw", "prev_general")}
        scale = 1.0 / math.sqrt(spec.D)

        def plans_for(name):
            ps = []
            for (q, k, v), o in zip(sets, outs[name]):
                L = apply_hints(plan_torch("fused", q, k, v, o, causal=spec.causal,
                                           scale=scale, tiles=tiles), hints)
                if name != "new":
                    a = list(L[0].args)
                    a[12] = name == "prev_raw"                  # RAW_MAX
                    L = [dataclasses.replace(L[0], kernel=with_hints(peer.fmha_fwd_kernel,
                                                                     **hints), args=tuple(a))]
                ps.append(L)
            return ps

        plans = {name: plans_for(name) for name in outs}
        fns = {name: (lambda i, p=p: run(p[i])) for name, p in plans.items()}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            fns["cudnn"] = lambda i: torch.nn.functional.scaled_dot_product_attention(
                *sets[i], is_causal=spec.causal)
            for name in outs:                       # compile + the bit check
                fns[name](0)
            torch.cuda.synchronize()
            same = bool(torch.equal(outs["new"][0].view(torch.int16),
                                    outs["prev_raw"][0].view(torch.int16)))
            res = {}
            for rep in range(2):
                for name, fn in fns.items():
                    res.setdefault(name, []).append(time_events(fn, 3, target_s=0.15)["ms_median"])
        ms = {k: min(v) for k, v in res.items()}
        tf = {k: spec.flops / (v * 1e-3) / 1e12 for k, v in ms.items()}
        row = {"case": spec.case_id, "gpu": gpu, "date": time.strftime("%Y-%m-%d"),
               "config": {**tiles, **{k: v for k, v in hints.items() if v is not None}},
               "new_equals_prev_raw": same,
               **{f"{k}_ms": v for k, v in ms.items()}, **{f"{k}_tflops": v for k, v in tf.items()}}
        out_f.write(json.dumps(row) + "\n")
        out_f.flush()
        os.fsync(out_f.fileno())
        rows.append(row)
        print(f"  {spec.case_id:<34} new {tf['new']:6.1f} prev_raw {tf['prev_raw']:6.1f} "
              f"prev_general {tf['prev_general']:6.1f} cuDNN {tf['cudnn']:6.1f} | "
              f"new/prev_raw {ms['prev_raw'] / ms['new']:.3f} new/prev_gen "
              f"{ms['prev_general'] / ms['new']:.3f} new/cuDNN {ms['cudnn'] / ms['new']:.3f}"
              f"{'' if same else '  BITS DIFFER'}", flush=True)
        del sets, outs, plans, fns
    if rows:
        def gm(key):
            return math.exp(sum(math.log(r["cudnn_ms" if key == "cudnn" else f"{key}_ms"]
                                         / r["new_ms"]) for r in rows) / len(rows))
        print(f"geomean over {len(rows)} shapes: new/prev_raw {gm('prev_raw'):.3f} "
              f"new/prev_general {gm('prev_general'):.3f} new/cuDNN {gm('cudnn'):.3f}; "
              f"new >= 1.0x cuDNN on {sum(r['cudnn_ms'] >= r['new_ms'] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
