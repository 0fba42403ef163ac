"""The compile helpers' CPU role: build a unit's cubins with no GPU, no CUDA context and no
torch (spak.tune.worker --role compile-cpu).

A GPU helper (the "compile" role) JIT-compiles a unit by launching it on tiny tensors, so
each one imports torch and opens a CUDA context on a timed GPU: on a 4x H200 host 32 such
helpers starting beside the 4 measuring workers made every start-up 13-15 s instead of ~4 s
(results/issue36-h200x4-2026-11-28). This role instead plans the unit's launches on shape
stand-ins of its real problem (the family's ``stand_in_launches``), derives the signature
ct.launch would (spak.gpu.launch_sig) and compiles it into cuTile's disk cache, where the
worker's first launch finds it (the worker counts those hits: spak.tune.worker).

A unit this role cannot model, or whose CPU compile fails, is answered "unmapped": the
driver hands it to a GPU helper (spak.tune.compile_ahead), so a wrong guess here costs a
compile, never a wrong or missing result.
"""
from __future__ import annotations

import os
import sys
import time

__all__ = ["CpuCompiler"]


class CpuCompiler:
    """The runner of a CPU compile helper: hello() and compile(unit)."""

    def __init__(self, block_torch: bool = False):
        t0 = time.perf_counter()
        if block_torch and "torch" not in sys.modules:
            # cuTile's extension imports torch (when it can) only to know torch's dtype
            # objects; our kernels name cuTile dtypes, so the bytecode, hence the cache key,
            # is the same without it (checked: tests/test_tune_cpu_compile.py), and the
            # helper starts in ~1 s instead of the 5-6 s torch took 36 processes at once.
            sys.modules["torch"] = None
        import cuda.tile  # noqa: F401 -- the compiler front end; no driver, no context
        from spak import families  # noqa: F401
        self.phases = {"cutile_import": time.perf_counter() - t0}
        self.info = {"runner": "cpu-compile", "pid": os.getpid()}

    def hello(self) -> dict:
        return self.info

    def compile(self, unit: dict) -> dict:
        """Build every launch of ``unit`` for ``unit["arch"]`` (the driver adds it: the
        measuring workers' arch). {"status": "ok", "seconds", "kernels": [symbols]} or
        {"status": "unmapped", "error": why} (a GPU helper takes the unit over)."""
        from spak import families
        from spak.gpu.launch_sig import compile_to_cache, launch_signature
        t0 = time.perf_counter()

        def unmapped(why: str) -> dict:
            return {"status": "unmapped", "error": why, "seconds": time.perf_counter() - t0}
        arch = unit.get("arch")
        if not arch:
            return unmapped("the GPUs' arch is not known (no worker said hello yet)")
        fam = families.get(unit.get("family", families.DEFAULT))
        try:
            launches = fam.stand_in_launches(unit, arch)
        except Exception as exc:  # noqa: BLE001 -- the GPU helper plans it for real
            return unmapped(f"planning on stand-ins failed: {type(exc).__name__}: {exc}")
        if launches is None:
            return unmapped(f"{fam.name} does not model this unit on stand-ins")
        done, symbols = set(), []
        try:
            for launch in launches:
                key = (id(launch.kernel), launch_signature(launch.kernel, launch.args).symbol)
                if key in done:
                    continue
                done.add(key)
                symbols.append(compile_to_cache(launch, arch))
        except Exception as exc:  # noqa: BLE001 -- incl. compile errors: the GPU path decides
            return unmapped(f"CPU compile failed: {type(exc).__name__}: {str(exc)[:300]}")
        return {"status": "ok", "seconds": time.perf_counter() - t0, "kernels": symbols}
