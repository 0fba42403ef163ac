"""Fill cuTile's disk cache, in parallel, with the cubins `spak run` compiles on its first
calls, so that a short GPU job spends its time checking and timing instead of compiling
kernels one after another (a backward shape's four kernels took ~6-10 s on an H100 host,
results/bwd-run-h100-2026-11-24). One process (and CUDA context) per worker; each unit is
the family's compile unit (KernelFamily.compile_unit: small arrays with the real launch's
JIT specialisation) for a problem and the config `spak run` would use, launched once
(KernelFamily.compile_call). A unit that fails is reported; the run compiles it itself.

    python tools/precompile.py --family fmha_bwd --dtype all --jobs 8 SHAPE...
    python tools/precompile.py --family fmha_fwd --tiles default,128x128 SHAPE...
    python tools/precompile.py --family fmha_bwd --config '{"DKV_TILE_M": 32}' SHAPE...
    python tools/precompile.py --family fmha_bwd --kernel fused_dq SHAPE...
    python tools/precompile.py --list ...   # the units only, default configs (no GPU)

--tiles: `spak run --tiles` values (MxN) or "default" (the tuned store's entry, else the
defaults: what `spak run` takes without --tiles); --config: a JSON config laid over the
family's default config (e.g. tools/bwd_split_ab.py's old dK/dV tiles).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def units(family: str, shapes, dtype: str = "fp16", tiles=("default",), config=None,
          device: str = "cuda", kernel=None) -> list[dict]:
    """The distinct compile units of the family's kernel (default: its first) for every
    selected problem and every config asked for (``tiles`` items: "default" or an (M, N)
    pair)."""
    from spak import families
    from spak.tune.space import config_id
    fam = families.get(family)
    kernel = kernel or fam.kernels[0]
    out: dict = {}
    for p in fam.select(shapes, dtype=dtype, causal="both"):
        for t in tiles:
            if config is not None:
                cfg = {**fam.default_config(p), **config}
            elif t == "default" and device != "cuda" and kernel == fam.kernels[0]:
                cfg = fam.default_config(p)             # --list here: no store lookup
            else:
                cfg = fam.gpu_config(kernel, p, device, tiles=None if t == "default" else t)
            u = fam.compile_unit(kernel, p, cfg, config_id(cfg, fam.space_keys))
            if u is not None:
                out.setdefault(u["unit_id"], {**u, "family": fam.name})
    return list(out.values())


def build(unit) -> tuple[str, str, float]:
    """Launch one unit's compile call on the GPU: (case, "ok" or the error, seconds)."""
    import torch
    from spak import families
    t0 = time.time()
    try:
        families.get(unit["family"]).compile_call(unit, "cuda")()
        torch.cuda.synchronize()
        return unit["case"], "ok", time.time() - t0
    except Exception as exc:  # noqa: BLE001 -- reported; the run compiles it itself
        return unit["case"], f"{type(exc).__name__}: {exc}"[:300], time.time() - t0


def _tiles_list(text: str) -> list:
    from spak.cli.args import parse_tiles
    return [t if t == "default" else parse_tiles(t) for t in text.split(",") if t]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="+", metavar="SHAPE")
    ap.add_argument("--family", default="fmha_fwd")
    ap.add_argument("--dtype", choices=("fp16", "bf16", "all"), default="fp16")
    ap.add_argument("--tiles", type=_tiles_list, default=["default"],
                    help="comma-separated: default and/or MxN (default: default)")
    ap.add_argument("--config", type=json.loads, default=None)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--kernel", default=None, help="the family's kernel (default: its first; "
                    "e.g. fmha_bwd's fused_dq)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    todo = units(a.family, a.shapes, a.dtype, a.tiles, a.config,
                 "cpu" if a.list else "cuda", a.kernel)
    print(f"{len(todo)} compile units of {a.family}, {a.jobs} processes", flush=True)
    if a.list:
        for u in todo:
            print(f"  {u['config_id']:24s} {u['case']}")
        return 0
    t0 = time.time()
    bad = 0
    with mp.get_context("spawn").Pool(max(1, min(a.jobs, len(todo)))) as pool:
        for case, status, secs in pool.imap_unordered(build, todo):
            bad += status != "ok"
            print(f"{secs:6.1f} s  {status:<4} {case}", flush=True)
    print(f"precompiled {len(todo) - bad}/{len(todo)} in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
