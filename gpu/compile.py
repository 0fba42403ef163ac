"""Ahead-of-time compilation of the FMHA kernels to cubin: no GPU, no launch.

cuTile's front end type-checks the kernel and emits Tile IR bytecode; ``tileiras`` (the
nvidia-cuda-tileiras wheel) turns it into a cubin for the requested ``sm_XX``. This is how
CI proves the kernels compile for GPUs nobody here owns.

The signatures are derived from ``gpu.plan.plan_fmha`` itself (run on shape-only stand-in
arrays), so the compiled argument list is exactly the one a launch would pass. By default
the array constraints are those ``ct.launch`` derives for contiguous, aligned tensors with
ragged sequence lengths (``assume="launch"``); ``assume="none"`` compiles the fully general
signature instead, and ``int64=True`` the int64-indexed twins plan_fmha uses for huge arrays.
"launch" is close to, not equal to, the JIT's own signature (an H200 probe, 2026-11-28c: the
JIT declares extents of 1 as constants, every extent divisible by 16, and calling convention
v2 where an extent is 1): spak.gpu.launch_sig derives that one exactly (the sweep's CPU
compile helpers use it). These checks keep "launch", whose resource figures the docs quote.

    python -m gpu.compile                      # 64 variants, sm_90 and sm_120 (~3 min)
    python -m gpu.compile --arch sm_89 --kernel fused --head-dim 128
    python -m gpu.compile --assume none        # the general signatures (~9 min)
"""
from __future__ import annotations

import argparse
import io
import itertools
import sys
import time
from dataclasses import dataclass, replace
from typing import Optional

import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   ScalarConstraint, export_kernel)

from .plan import KERNELS, default_tiles, int64_variant, plan_fmha
from .resources import kernel_facts
from .variants import check_hints, with_hints

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
    dtype: str            # dtype name; plan's _dtype_name reads str(dtype)
    role: str = "head"    # "head": rows are head_dim long (q, k, v, out) or whole tiles
    #                       (naive's S, P); "seq": rows are Sk long (the mask), so their
    #                       strides may be odd


#: What the compiled signature assumes about the arrays (see _array_constraint).
ASSUMES = ("launch", "none")


def launch_divisibility(shape, dtype: str) -> dict:
    """The divisibility facts ct.launch declares for a contiguous, 16-byte-aligned tensor
    of ``shape`` (dtype name): outer strides 16-byte divisible and the last extent
    divisible by 16, each where the row allows. Without the stride fact tileiras cannot
    use TMA (gpu.compile_decode's stand-ins once compiled a non-TMA varlen kernel)."""
    ndim, row = len(shape), shape[-1]
    elem = 4 if dtype in ("float32", "int32") else 2
    out = {}
    if ndim > 1 and row * elem % 16 == 0:
        out["stride_divisible_by"] = (16 // elem,) * (ndim - 1) + (1,)
    if row % 16 == 0:
        out["shape_divisible_by"] = (1,) * (ndim - 1) + (16,)
    return out


def _array_constraint(spec: _ArraySpec, index_dtype, assume: str) -> ArrayConstraint:
    """Constraint for one array argument.

    assume="none": nothing beyond the basics (non-negative strides, no aliasing between
    arguments or within one): the most general cubin.
    assume="launch": what ``ct.launch`` specialises to for contiguous, 16-byte-aligned
    tensors with ragged sequence lengths: last stride the constant 1, base address
    16-byte aligned; outer strides declared 16-byte divisible only for q/k/v/out (they
    are multiples of the head dim, and naive's S/P rows are whole tiles), not for the
    mask (rows of Sk, which may be odd); only the last extent declared divisible by 16. This is a variant the
    GPU actually runs, and it compiles ~3x faster to a ~3x smaller cubin than "none".
    """
    dtype = _CT_DTYPES[spec.dtype]
    ndim = len(spec.shape)
    extra = {}
    if assume == "launch":
        extra = dict(stride_constant=(None,) * (ndim - 1) + (1,), base_addr_divisible_by=16)
        if spec.role == "head":
            extra.update(launch_divisibility(spec.shape, spec.dtype))
    elif assume != "none":
        raise ValueError(f"assume must be one of {ASSUMES}, got {assume!r}")
    return ArrayConstraint(dtype, ndim, index_dtype=index_dtype, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False, **extra)


def _signature(kernel, args, assume: str) -> KernelSignature:
    """The signature a launch of ``kernel`` with ``args`` (from plan_fmha) compiles for:
    arrays -> ArrayConstraint (index dtype from the parameter's annotation), Constant
    parameters -> their python value, a python float -> float32 scalar (what a launch
    passes), a python int -> int32 scalar."""
    params = []
    for i, (a, ann) in enumerate(zip(args, kernel._annotated_function.parameter_annotations)):
        if isinstance(a, _ArraySpec):
            index_dtype = ann.array.index_dtype if ann.array is not None else ct.int32
            params.append(_array_constraint(a, index_dtype, assume))
        elif ann.constant:
            params.append(a)
        elif isinstance(a, float):
            params.append(ScalarConstraint(ct.float32))
        elif isinstance(a, int) and not isinstance(a, bool):
            params.append(ScalarConstraint(ct.int32))
        else:
            raise TypeError(f"argument #{i} ({a!r}) of {kernel} has no constraint mapping")
    return KernelSignature(params, CallingConvention.cutile_python_v1())


def _stand_ins(dtype: str, head_dim: int, head_dim_v: Optional[int], has_mask: bool):
    """q, k, v, out and the mask (or None) of a variant as _ArraySpecs: B 1, Hq 2, Hkv 1,
    Sq = Sk = 100 (lengths are run-time values; a ragged one takes the general path)."""
    dv = head_dim if head_dim_v is None else head_dim_v
    B, Hq, Hkv, Sq, Sk = 1, 2, 1, 100, 100
    return (_ArraySpec((B, Hq, Sq, head_dim), dtype), _ArraySpec((B, Hkv, Sk, head_dim), dtype),
            _ArraySpec((B, Hkv, Sk, dv), dtype), _ArraySpec((B, Hq, Sq, dv), dtype),
            _ArraySpec((1, 1, Sq, Sk), "float32", "seq") if has_mask else None)


def variant_launches(kernel_name: str, *, dtype: str, head_dim: int, causal: bool,
                     has_mask: bool, tiles: Optional[dict] = None,
                     head_dim_v: Optional[int] = None, int64: bool = False):
    """The plan's launches for one variant, on shape-only stand-in arrays.

    Sequence lengths are irrelevant to compilation (they are run-time values); a ragged
    shape is used anyway so the plan takes its general path. int64: the kernels' int64-
    indexed twins, which plan_fmha picks for arrays past 2^31 elements.
    """
    q, k, v, out, mask = _stand_ins(dtype, head_dim, head_dim_v, has_mask)

    def alloc(shape, kind):
        # naive's S and P workspaces are padded to whole tiles: aligned like q/k/v rows
        return _ArraySpec(tuple(shape), "float32" if kind == "float32" else dtype, "head")

    launches = plan_fmha(kernel_name, q, k, v, out, mask=mask, causal=causal, tiles=tiles,
                         alloc=alloc)
    if int64:
        launches = [replace(l, kernel=int64_variant(l.kernel)) for l in launches]
    return launches


def compile_variant(kernel_name: str, *, arch: str, dtype: str, head_dim: int,
                    causal: bool, has_mask: bool, tiles: Optional[dict] = None,
                    head_dim_v: Optional[int] = None, assume: str = "launch",
                    int64: bool = False, use_cache: bool = False,
                    hints: Optional[dict] = None) -> dict:
    """Compile every kernel of one variant to a cubin for ``arch``; launch nothing.

    hints: the sweeper's compiler hints (occupancy, num_ctas; gpu.variants), which change
    the cubin: tileiras sizes registers and shared-memory buffers for them.

    assume: "launch" (default) compiles the variant ct.launch builds for contiguous,
    aligned tensors with ragged sequence lengths; "none" the fully general one (see
    _array_constraint). int64: the int64-indexed twins used for arrays past 2^31 elements.

    Returns dict(ok, seconds, cubin_bytes, error, kernels): ``seconds`` and ``cubin_bytes``
    are summed over the variant's kernels (naive has three), ``kernels`` lists each one as
    dict(name, seconds, cubin_bytes, registers, threads, shared_bytes, stack_bytes,
    code_sha1, blocks_per_sm, limited_by): what the cubin asks of an SM (gpu.resources;
    the last two are None for an arch without known SM limits). ``error`` is None or
    "ExceptionType: message" of the first failure. The cuTile disk cache is bypassed unless ``use_cache``, so the times are
    real compile times.
    """
    return compile_launches(
        lambda: variant_launches(kernel_name, dtype=dtype, head_dim=head_dim, causal=causal,
                                 has_mask=has_mask, tiles=tiles, head_dim_v=head_dim_v,
                                 int64=int64),
        lambda launch: export_cubin(launch, arch, assume=assume, hints=hints), arch,
        use_cache=use_cache)


def compile_launches(plan, export, arch: str, *, use_cache: bool = True, **fields) -> dict:
    """Compile a variant: plan() its launches, export(launch) -> cubin for each launch name
    once, timing each. The result dict of compile_variant (plus ``fields``); a variant
    that fails to plan or compile is a result with ``error`` set, not a crash.
    use_cache False bypasses cuTile's disk cache (real compile times)."""
    result = {"ok": False, "seconds": 0.0, "cubin_bytes": 0, "error": None, "kernels": [],
              **fields}
    start = time.perf_counter()
    try:
        launches = plan()
        seen = set()
        with _disk_cache(use_cache):
            for launch in launches:
                if launch.name in seen:
                    continue
                seen.add(launch.name)
                t0 = time.perf_counter()
                cubin = export(launch)
                result["kernels"].append({"name": launch.name, "cubin_bytes": len(cubin),
                                          "seconds": time.perf_counter() - t0,
                                          **kernel_facts(cubin, arch)})
                result["cubin_bytes"] += len(cubin)
        result["ok"] = True
    except Exception as exc:   # a failed variant is a result, not a crash
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["seconds"] = time.perf_counter() - start
    return result


def bwd_variant_launches(*, dtype: str, head_dim: int, causal: bool, has_mask: bool,
                         tiles: Optional[dict] = None, head_dim_v: Optional[int] = None,
                         int64: bool = False):
    """The backward's launches for one variant (gpu.plan_bwd.plan_fmha_bwd), preceded by
    the forward-with-LSE launch it needs (plan_fmha(..., lse=)), on shape-only stand-ins
    as variant_launches. tiles: the backward's (BWD_TILE_KEYS); the forward's are its
    defaults. Per-row float32 arrays (lse, delta) have rows of Sq: "seq" constraints."""
    from .plan_bwd import plan_fmha_bwd
    q, k, v, out, mask = _stand_ins(dtype, head_dim, head_dim_v, has_mask)
    lse = _ArraySpec(q.shape[:3], "float32", "seq")

    def alloc(shape, kind):
        role = "seq" if len(shape) == 3 else "head"
        return _ArraySpec(tuple(shape), "float32" if kind == "float32" else dtype, role)

    launches = plan_fmha("fused", q, k, v, out, mask=mask, causal=causal, alloc=alloc, lse=lse)
    launches = [replace(launches[0], name="fused.lse")]
    launches += plan_fmha_bwd("fused", q, k, v, out, out, lse, q, k, v, mask=mask,
                              causal=causal, tiles=tiles, alloc=alloc)
    if int64:
        launches = [replace(l, kernel=int64_variant(l.kernel)) for l in launches]
    return launches


def compile_bwd_variant(*, arch: str, dtype: str, head_dim: int, causal: bool,
                        has_mask: bool, tiles: Optional[dict] = None,
                        head_dim_v: Optional[int] = None, assume: str = "launch",
                        int64: bool = False, use_cache: bool = False,
                        hints: Optional[dict] = None) -> dict:
    """compile_variant for the backward: the forward-with-LSE kernel and the backward's
    three kernels (bwd_variant_launches), each to a cubin for ``arch``; the same result
    dict (``kernels`` named fused.lse, bwd.preprocess, bwd.dkdv, bwd.dq). hints apply to
    every kernel."""
    return compile_launches(
        lambda: bwd_variant_launches(dtype=dtype, head_dim=head_dim, causal=causal,
                                     has_mask=has_mask, tiles=tiles, head_dim_v=head_dim_v,
                                     int64=int64),
        lambda launch: export_cubin(launch, arch, assume=assume, hints=hints), arch,
        use_cache=use_cache)


def export_cubin(launch, arch: str, *, assume: str = "launch",
                 hints: Optional[dict] = None) -> bytes:
    """The cubin of one planned launch's kernel (with the sweeper's hints) for ``arch``."""
    kernel = with_hints(launch.kernel, **check_hints(hints))
    buf = io.BytesIO()
    export_kernel(kernel, [_signature(kernel, launch.args, assume)], buf, gpu_code=arch,
                  output_format="cubin")
    return buf.getvalue()


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
    ap.add_argument("--assume", choices=ASSUMES, default="launch")
    ap.add_argument("--int64", action="store_true", help="the int64-indexed kernel twins")
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
        r = compile_variant(**kw, assume=ns.assume, int64=ns.int64)
        failures += not r["ok"]
        tiles = f"{kw['tiles']['TILE_M']}x{kw['tiles']['TILE_N']}"
        status = "ok  " if r["ok"] else "FAIL"
        print(f"{status} {kw['arch']:7} {kw['kernel_name']:6} {kw['dtype']:9} "
              f"D={kw['head_dim']:<4} causal={kw['causal']!s:5} mask={kw['has_mask']!s:5} "
              f"tiles={tiles:8} {ns.assume}{' int64' if ns.int64 else ''} {r['seconds']:6.2f}s {r['cubin_bytes']:>8} B"
              + ("" if r["ok"] else f"  {r['error'].splitlines()[0][:200]}"), flush=True)
    print(f"{failures} failure(s), {time.perf_counter() - total:.1f}s total")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
