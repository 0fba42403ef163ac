"""Issue 36 probe: do the CPU compile helpers' cubins (spak.tune.cpu_compile) carry the cache
keys the real launches look up? For a few compile units of each family: build the unit on
the CPU (the family's stand_in_launches -> spak.gpu.launch_sig) into an empty cuTile cache,
then run the unit's real problem on the GPU as the sweep's worker does (inputs, gpu_call,
ct.launch) with the same cache, and count what the launches found there and what they had
to compile. Prints, per unit, "same" (every launch a disk-cache hit, nothing compiled) or
"different" with the demangled difference between the launch's signature and ours.

    python tools/cpu_compile_probe.py [--out probe.json] [--cpu-only] [--arch sm_90]

--cpu-only: the CPU half only (no GPU: checks the script and times the CPU compiles).
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: (family, kernel, problem, config overrides): fwd at the sweep's shapes (one ragged, one
#: bf16, hints), bwd unmasked and masked, decode contiguous (padded group of 7) and paged
UNITS = [("fmha_fwd", "fused", "4x16x4096x128/fp16", {"occupancy": 2}),
         ("fmha_fwd", "fused", "1x2x1000x64/bf16/causal", {}),
         ("fmha_fwd", "fused", "16x32x1024x64/fp16/causal", {"TILE_M": 128, "TILE_N": 64}),
         ("fmha_bwd", "fused", "2x4x512x64/fp16", {}),
         ("fmha_bwd", "fused", "1x2x200x128/bf16/causal/mask", {}),
         ("fmha_decode", "splitkv", "4x28:4x16384x128/fp16", {}),
         ("fmha_decode", "splitkv", "8x40:8x4:4096x128/bf16/causal/page64", {"MAX_ROWS": 128})]


def _entries(d) -> dict:
    p = os.path.join(d, "cache.db")
    if not os.path.exists(p):
        return {}
    with sqlite3.connect(p) as c:
        return {k: (json.loads(m or "{}").get("kernel_names") or [None])[0]
                for k, m in c.execute("select key, metadata from cache")}


def _diff(ours: list, theirs: str) -> str:
    """The demangled parameters where the launch's signature differs from ours (the one of
    ours for the same kernel function)."""
    from cuda.tile.compilation._name_mangling import demangle_kernel_name
    name, sig = demangle_kernel_name(theirs)
    for s in ours:
        n2, sig2 = demangle_kernel_name(s)
        if n2 != name:
            continue
        out = [] if sig.calling_convention == sig2.calling_convention else \
            [f"calling convention: launch {sig.calling_convention.name}, ours "
             f"{sig2.calling_convention.name}"]
        for i, (a, b) in enumerate(zip(sig.parameters, sig2.parameters)):
            if a != b:
                out.append(f"arg #{i}: launch {a} | ours {b}")
        return "; ".join(out) or "same signature, different bytecode (hints? options?)"
    return f"{name}: no CPU build of this kernel"


def _gpu_side(fam, kernel, p, cfg) -> None:
    """The sweep worker's first call of this config, as spak.tune.worker.GpuRunner does."""
    import torch
    import cuda.tile as ct
    from spak.device.calls import first_tensor, shared_alloc
    sets = fam.gpu_input_sets(p, 0, 1, "cuda")
    call = fam.gpu_call(kernel, p, sets[0], cfg, alloc=shared_alloc(first_tensor(sets[0])))
    stream = torch.cuda.current_stream()
    for L in call.launches:
        ct.launch(stream, L.grid, L.kernel, L.args)
    torch.cuda.synchronize()


def _cpu_build(item) -> dict:
    """One unit built on the CPU into its own fresh cache dir (a spawned process)."""
    fam_name, kernel, case, over, arch = item
    from cuda.tile._cext import default_tile_context as ctx
    from spak import families
    from spak.tune.cpu_compile import CpuCompiler
    fam = families.get(fam_name)
    p = fam.parse(case)
    cfg = {**fam.default_config(p, arch), **over}
    unit = fam.compile_unit(kernel, p, cfg, "probe")
    row = {"family": fam_name, "kernel": kernel, "case": case, "config": cfg}
    if unit is None:
        return {**row, "verdict": "no compile unit"}
    row["cache_dir"] = ctx.config.cache_dir = tempfile.mkdtemp(prefix="i36probe-")
    t0 = time.perf_counter()
    r = CpuCompiler(block_torch=True).compile({**unit, "family": fam_name, "arch": arch})
    return {**row, "cpu": r, "cpu_s": time.perf_counter() - t0,
            "verdict": "cpu-only" if r["status"] == "ok" else "unmapped"}


def _gpu_check(row) -> dict:
    """The unit's real problem launched as the worker does, with the CPU build's cache."""
    from cuda.tile._cext import default_tile_context as ctx
    from spak import families
    fam = families.get(row["family"])
    ctx.config.cache_dir = row["cache_dir"]
    before = _entries(row["cache_dir"])
    t0 = time.perf_counter()
    _gpu_side(fam, row["kernel"], fam.parse(row["case"]), row["config"])
    added = [s for k, s in _entries(row["cache_dir"]).items() if k not in before]
    return {**row, "gpu_s": time.perf_counter() - t0, "launch_compiled": added,
            "verdict": "same" if not added else "different",
            "diff": [_diff(row["cpu"]["kernels"], s) for s in added]}


def _print(row) -> None:
    print(f"probe {row['family']} {row['case']} {row.get('config', '')}: {row['verdict']}"
          f" (cpu {row.get('cpu_s', 0):.1f} s, gpu {row.get('gpu_s', 0):.1f} s)"
          + (f" {row.get('error', '')}" if row["verdict"] == "error" else "")
          + (f" {row['cpu'].get('error')}" if (row.get("cpu") or {}).get("error") else ""),
          flush=True)
    for d in row.get("diff") or ():
        print(f"    {d}", flush=True)


def main(argv=None) -> int:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--arch", default="sm_90", help="the GPU's (H100/H200: sm_90)")
    ns = ap.parse_args(argv)
    items = [(f, k, c, o, ns.arch) for f, k, c, o in UNITS]
    # the CPU builds in parallel, in fresh (spawned) processes, before this one touches CUDA
    with ProcessPoolExecutor(len(items), mp_context=mp.get_context("spawn")) as ex:
        futures = [ex.submit(_cpu_build, it) for it in items]
    rows = []
    for (fam_name, _, case, _, _), fut in zip(items, futures):
        try:
            row = fut.result()
            if row["verdict"] == "cpu-only" and not ns.cpu_only:
                row = _gpu_check(row)
        except Exception as exc:  # noqa: BLE001 -- one unit's failure is a line, not the end
            row = {"family": fam_name, "case": case, "verdict": "error",
                   "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append(row)
        _print(row)
        if ns.out:                      # after every unit: a timeout keeps what was probed
            Path(ns.out).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
