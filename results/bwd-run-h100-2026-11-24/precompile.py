"""Fill cuTile's disk cache with the cubins `spak run --family fmha_bwd` compiles on its
first calls, in parallel (one process and CUDA context per worker), so that the run's
device time goes to checking and timing: each unit is the family's compile unit for a
problem and the config `spak run` uses (spak.families.fmha_bwd: the fused forward with
LSE and the three backward kernels, launched once on tiny arrays with the real launches'
JIT specialisation; the cubins land in cuTile's cache, where the run finds them).

    python precompile.py JOBS DTYPE SHAPE...
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import time


def units(shapes, dtype) -> list[dict]:
    from spak import families
    from spak.tune.space import config_id
    fam = families.get("fmha_bwd")
    out: dict = {}
    for p in fam.select(shapes, dtype=dtype, causal="both"):
        cfg = fam.gpu_config("fused", p, "cuda")
        u = fam.compile_unit("fused", p, cfg, config_id(cfg, fam.space_keys))
        if u is not None:
            out.setdefault(u["unit_id"], {**u, "family": fam.name})
    return list(out.values())


def build(unit) -> tuple[str, str, float]:
    import torch
    from spak import families
    t0 = time.time()
    try:
        families.get("fmha_bwd").compile_call(unit, "cuda")()
        torch.cuda.synchronize()
        return unit["case"], "ok", time.time() - t0
    except Exception as exc:  # noqa: BLE001 -- reported; the run compiles it itself
        return unit["case"], f"{type(exc).__name__}: {exc}"[:300], time.time() - t0


if __name__ == "__main__":
    jobs, dtype, shapes = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    todo = units(shapes, dtype)
    t0 = time.time()
    print(f"{len(todo)} compile units, {jobs} processes", flush=True)
    with mp.get_context("spawn").Pool(jobs) as pool:
        for case, status, secs in pool.imap_unordered(build, todo):
            print(f"{secs:6.1f} s  {status:<4} {case}", flush=True)
    print(f"precompiled in {time.time() - t0:.1f} s", flush=True)
