"""A/B of the fused kernel against an earlier version of itself, cuDNN in the same run.

    source .carry/setup.sh && python ci/ab_fused.py --peer prev=.peer/prev.py \
        --general prev --out $OUT/ab.jsonl

A peer is a copy of gpu/kernels/fused.py from an earlier commit or an experiment (`git show
REV:gpu/kernels/fused.py`, its `from .common` import made absolute), kept out of the repo;
a peer that is a copy of the current file measures the run's noise.
For each standard shape (fp16) every provider runs the same tile config (the tuned store's
entry for --store-gpu, else the default) on the same rotating inputs, alternating, twice;
the best median counts. A peer's arguments are ours matched by parameter name; a peer with
a RAW_MAX parameter (the FFMA fast path: in 3243cd4, dropped in aafbfa8, back with a guard
for huge logits in 2afcd18) gets ours, and --general NAME also runs that peer with
RAW_MAX=False. Peers whose output differs from ours bit for bit
are named (expected only for a different arithmetic). A peer module may define
`peer_grid(grid[, config])`: its launch grid from ours (a peer that maps blocks to work
differently; config: the tile sizes, occupancy and num_ctas), `peer_config(config, D)`:
its own tile config instead of ours (its bits then differ from ours by the summation order),
and `peer_args(ours)`: its argument tuple from ours by name (a kernel with another
signature, e.g. NVIDIA's cuTile sample through ci/peers/ab_sample.py).
Prints ratios per shape and geometric means.
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

from spak.device.timing import time_alternating  # noqa: E402
from spak.attention.problems import select_cases  # noqa: E402


def _params(kernel) -> list[str]:
    code = kernel._annotated_function.pyfunc.__code__
    return list(code.co_varnames[:code.co_argcount])


def _peer_args(launch, peer_kernel, **extra) -> tuple:
    """Our launch's arguments re-laid for a peer's signature, matched by parameter name;
    ``extra`` adds or overrides parameters (RAW_MAX=False for --general)."""
    given = {**dict(zip(_params(launch.kernel), launch.args)), **extra}
    return tuple(given[n] for n in _params(peer_kernel))


def _peer_grid(peer, grid, config):
    """A peer's launch grid: ours, or its ``peer_grid(grid[, config])`` (config: the tiles
    and hints, for grids sized to the resident blocks)."""
    if not hasattr(peer, "peer_grid"):
        return grid
    if peer.peer_grid.__code__.co_argcount >= 2:
        return peer.peer_grid(grid, config)
    return peer.peer_grid(grid)


def load_peer(path):
    spec = importlib.util.spec_from_file_location("fused_peer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer", required=True, action="append",
                    help="NAME=PATH of another fused.py (repeatable; see the docstring)")
    ap.add_argument("--general", default=None, metavar="NAME",
                    help="also run this peer with RAW_MAX=False (as NAME_general)")
    ap.add_argument("--out", default="ab.jsonl")
    ap.add_argument("--store-gpu", default="NVIDIA H200",
                    help="whose tuned configs to use (default: NVIDIA H200)")
    ap.add_argument("--shapes", nargs="+", default=["standard"])
    ap.add_argument("--budget-s", type=float, default=420)
    args = ap.parse_args(argv)

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from spak.gpu.launch import plan_torch, run
    from spak.gpu.plan import default_tiles
    from spak.gpu.variants import apply_hints, split_config, with_hints
    from spak.tune import store as tuned
    import dataclasses

    peers = {}
    for item in args.peer:
        name, _, path = item.partition("=")
        peers[name] = load_peer(path)
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
        names = ["new", *peers] + ([f"{args.general}_general"] if args.general else [])
        outs = {name: [torch.empty(spec.q_shape, device="cuda", dtype=torch.float16)
                       for _ in sets] for name in names}
        scale = 1.0 / math.sqrt(spec.D)

        def plans_for(name):
            ps = []
            for (q, k, v), o in zip(sets, outs[name]):
                L = apply_hints(plan_torch("fused", q, k, v, o, causal=spec.causal,
                                           scale=scale, tiles=tiles), hints)
                if name != "new":
                    peer = peers[name.removesuffix("_general")]
                    extra = {"RAW_MAX": False} if name.endswith("_general") else {}
                    p_tiles, p_hints = tiles, hints
                    if hasattr(peer, "peer_config"):     # the peer's own tile config
                        p_tiles, p_hints = split_config(
                            peer.peer_config({**tiles, **hints}, spec.D))
                        L = apply_hints(plan_torch("fused", q, k, v, o, causal=spec.causal,
                                                   scale=scale, tiles=p_tiles), p_hints)
                    if hasattr(peer, "peer_args"):    # a kernel with another signature
                        a = peer.peer_args(dict(zip(_params(L[0].kernel), L[0].args)))
                    else:
                        a = _peer_args(L[0], peer.fmha_fwd_kernel, **extra)
                    grid = _peer_grid(peer, L[0].grid, {**p_tiles, **p_hints})
                    L = [dataclasses.replace(L[0], kernel=with_hints(peer.fmha_fwd_kernel,
                                                                     **p_hints), args=a,
                                             grid=grid)]
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
            differ = [n for n in outs if n != "new" and not torch.equal(
                outs["new"][0].view(torch.int16), outs[n][0].view(torch.int16))]
            ms = time_alternating(fns, fns["cudnn"], spec.Sq)   # order-debiased
        tf = {k: spec.flops / (v * 1e-3) / 1e12 for k, v in ms.items()}
        row = {"case": spec.case_id, "gpu": gpu, "date": time.strftime("%Y-%m-%d"),
               "config": {**tiles, **{k: v for k, v in hints.items() if v is not None}},
               "peers_differing_bits": differ,
               **{f"{k}_ms": v for k, v in ms.items()}, **{f"{k}_tflops": v for k, v in tf.items()}}
        out_f.write(json.dumps(row) + "\n")
        out_f.flush()
        os.fsync(out_f.fileno())
        rows.append(row)
        print(f"  {spec.case_id:<34} " + " ".join(f"{n} {tf[n]:6.1f}" for n in fns) + " | "
              + " ".join(f"new/{n} {ms[n] / ms['new']:.3f}" for n in fns if n != "new")
              + (f"  BITS DIFFER: {differ}" if differ else ""), flush=True)
        del sets, outs, plans, fns
    if rows:
        others = [n for n in rows[0] if n.endswith("_ms") and n != "new_ms"]
        gms = {n[:-3]: math.exp(sum(math.log(r[n] / r["new_ms"]) for r in rows) / len(rows))
               for n in others}
        print(f"geomean over {len(rows)} shapes (new/X, > 1: new faster): "
              + ", ".join(f"new/{n} {g:.3f}" for n, g in gms.items())
              + f"; new >= 1.0x cuDNN on {sum(r['cudnn_ms'] >= r['new_ms'] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
