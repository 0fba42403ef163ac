"""Ahead-of-time compilation of the FMHA kernels to cubin: no GPU, no launch.

cuTile's front end type-checks the kernel and emits Tile IR bytecode; ``tileiras`` (the
nvidia-cuda-tileiras wheel) turns it into a cubin for the requested ``sm_XX``. This is how
CI proves the kernels compile for GPUs nobody here owns.

The signatures are derived from ``gpu.plan.plan_fmha`` itself (run on shape-only stand-in
arrays), so the compiled argument list is exactly the one a launch would pass.

    python -m gpu.compile                      # every variant, sm_90 and sm_120
    python -m gpu.compile --arch sm_89 --kernel fused --head-dim 128
"""
from __future__ import annotations

import argparse
import io
import itertools
import sys
import time
from dataclasses import dataclass
from typing import Optional

import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   ScalarConstraint, export_kernel)

from .plan import KERNELS, default_tiles, plan_fmha

#: --gpu-name values tileiras 13.4 lists (``tileiras --help``); sm_75 and older are refused.
TILEIRAS_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103",
                  "sm_107", "sm_110", "sm_120", "sm_121")
#: The archs this project targets (H100/H200 and RTX 5070).
TARGET_ARCHS = ("sm_90", "sm_120")

_CT_DTYPES = {"float16": ct.float16, "bfloat16": ct.bfloat16, "float32": ct.float32}


@dataclass(frozen=True)
class _ArraySpec:
    """Shape-and-dtype stand-in for an array: all that plan_fmha and a signature need."""
    shape: tuple
    dtype: str        # dtype name; plan's _dtype_name reads str(dtype)


def _array_constraint(spec: _ArraySpec) -> ArrayConstraint:
    # int32 indexing: the default for tensors below 2^31 elements. Non-negative strides,
    # no aliasing between q/k/v/out/workspaces, no internal aliasing (no zero strides).
    return ArrayConstraint(_CT_DTYPES[spec.dtype], len(spec.shape), index_dtype=ct.int32,
                           stride_lower_bound_incl=0, alias_groups=(),
                           may_alias_internally=False)


def _is_constant_param(kernel, index: int) -> bool:
    ann_fn = kernel._annotated_function
    name = list(ann_fn.pysig.parameters)[index]
    ann = ann_fn.pyfunc.__annotations__.get(name)
    return any(isinstance(m, ct.ConstantAnnotation)
               for m in getattr(ann, "__metadata__", ()))


def _signature(kernel, args) -> KernelSignature:
    params = []
    for i, a in enumerate(args):
        if isinstance(a, _ArraySpec):
            params.append(_array_constraint(a))
        elif _is_constant_param(kernel, i):
            params.append(a)                       # plain python value: a Constant
        elif isinstance(a, float):
            params.append(ScalarConstraint(ct.float32))   # what a launch passes a float as
        elif isinstance(a, int) and not isinstance(a, bool):
            params.append(ScalarConstraint(ct.int32))
        else:
            raise TypeError(f"argument #{i} ({a!r}) of {kernel} has no constraint mapping")
    return KernelSignature(params, CallingConvention.cutile_python_v1())


def variant_launches(kernel_name: str, *, dtype: str, head_dim: int, causal: bool,
                     has_mask: bool, tiles: Optional[dict] = None,
                     head_dim_v: Optional[int] = None):
    """The plan's launches for one variant, on shape-only stand-in arrays.

    Sequence lengths are irrelevant to compilation (they are run-time values); a ragged
    shape is used anyway so the plan takes its general path.
    """
    dv = head_dim if head_dim_v is None else head_dim_v
    B, Hq, Hkv, Sq, Sk = 1, 2, 1, 100, 100
    q = _ArraySpec((B, Hq, Sq, head_dim), dtype)
    k = _ArraySpec((B, Hkv, Sk, head_dim), dtype)
    v = _ArraySpec((B, Hkv, Sk, dv), dtype)
    out = _ArraySpec((B, Hq, Sq, dv), dtype)
    mask = _ArraySpec((1, 1, Sq, Sk), "float32") if has_mask else None

    def alloc(shape, kind):
        return _ArraySpec(tuple(shape), "float32" if kind == "float32" else dtype)

    return plan_fmha(kernel_name, q, k, v, out, mask=mask, causal=causal, tiles=tiles,
                     alloc=alloc)


def compile_variant(kernel_name: str, *, arch: str, dtype: str, head_dim: int,
                    causal: bool, has_mask: bool, tiles: Optional[dict] = None,
                    head_dim_v: Optional[int] = None, use_cache: bool = False) -> dict:
    """Compile every kernel of one variant to a cubin for ``arch``; launch nothing.

    Returns dict(ok, seconds, cubin_bytes, error, kernels): ``seconds`` and ``cubin_bytes``
    are summed over the variant's kernels (naive has three), ``kernels`` lists each one as
    dict(name, seconds, cubin_bytes). ``error`` is None or "ExceptionType: message" of the
    first failure. The cuTile disk cache is bypassed unless ``use_cache``, so the times are
    real compile times.
    """
    result = {"ok": False, "seconds": 0.0, "cubin_bytes": 0, "error": None, "kernels": []}
    start = time.perf_counter()
    try:
        launches = variant_launches(kernel_name, dtype=dtype, head_dim=head_dim,
                                    causal=causal, has_mask=has_mask, tiles=tiles,
                                    head_dim_v=head_dim_v)
        seen = set()
        with _disk_cache(use_cache):
            for launch in launches:
                if launch.name in seen:
                    continue
                seen.add(launch.name)
                t0 = time.perf_counter()
                buf = io.BytesIO()
                export_kernel(launch.kernel, [_signature(launch.kernel, launch.args)], buf,
                              gpu_code=arch, output_format="cubin")
                n = len(buf.getvalue())
                result["kernels"].append({"name": launch.name, "cubin_bytes": n,
                                          "seconds": time.perf_counter() - t0})
                result["cubin_bytes"] += n
        result["ok"] = True
    except Exception as exc:   # a failed variant is a result, not a crash
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = time.perf_counter() - start
    return result


class _disk_cache:
    """Temporarily turn cuTile's cubin disk cache (~/.cache/cutile-python) on or off."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        from cuda.tile._cext import default_tile_context
        self.config = default_tile_context.config
        self.saved = self.config.cache_dir
        if not self.enabled:
            self.config.cache_dir = None

    def __exit__(self, *exc):
        self.config.cache_dir = self.saved
        return False


def all_variants(archs=TARGET_ARCHS, kernels=KERNELS, dtypes=("float16", "bfloat16"),
                 head_dims=(64, 128), causals=(False, True), masks=(False, True)):
    """Every combination, as keyword dicts for compile_variant (tiles: the defaults)."""
    for arch, kernel, dtype, d, causal, has_mask in itertools.product(
            archs, kernels, dtypes, head_dims, causals, masks):
        yield dict(kernel_name=kernel, arch=arch, dtype=dtype, head_dim=d, causal=causal,
                   has_mask=has_mask, tiles=default_tiles(d, arch))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpu.compile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append", choices=TILEIRAS_ARCHS,
                    help=f"target (repeatable); default {' '.join(TARGET_ARCHS)}")
    ap.add_argument("--kernel", action="append", choices=KERNELS)
    ap.add_argument("--dtype", action="append", choices=("float16", "bfloat16"))
    ap.add_argument("--head-dim", action="append", type=int)
    ap.add_argument("--causal", choices=("yes", "no", "both"), default="both")
    ap.add_argument("--mask", choices=("yes", "no", "both"), default="both")
    ap.add_argument("--tile-m", type=int)
    ap.add_argument("--tile-n", type=int)
    ns = ap.parse_args(argv)
    flags = {"yes": (True,), "no": (False,), "both": (False, True)}
    failures = 0
    total = time.perf_counter()
    for kw in all_variants(archs=ns.arch or TARGET_ARCHS, kernels=ns.kernel or KERNELS,
                           dtypes=ns.dtype or ("float16", "bfloat16"),
                           head_dims=ns.head_dim or (64, 128),
                           causals=flags[ns.causal], masks=flags[ns.mask]):
        if ns.tile_m:
            kw["tiles"]["TILE_M"] = ns.tile_m
        if ns.tile_n:
            kw["tiles"]["TILE_N"] = ns.tile_n
        r = compile_variant(**kw)
        failures += not r["ok"]
        tiles = f"{kw['tiles']['TILE_M']}x{kw['tiles']['TILE_N']}"
        status = "ok  " if r["ok"] else "FAIL"
        print(f"{status} {kw['arch']:7} {kw['kernel_name']:6} {kw['dtype']:9} "
              f"D={kw['head_dim']:<4} causal={kw['causal']!s:5} mask={kw['has_mask']!s:5} "
              f"tiles={tiles:8} {r['seconds']:6.2f}s {r['cubin_bytes']:>8} B"
              + ("" if r["ok"] else f"  {r['error'].splitlines()[0][:200]}"), flush=True)
    print(f"{failures} failure(s), {time.perf_counter() - total:.1f}s total")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
