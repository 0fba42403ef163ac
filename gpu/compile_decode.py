"""Ahead-of-time compilation of the decode kernels (gpu/kernels/decode.py) to cubins, on
the CPU: the signatures come from gpu.plan_decode run on shape-only stand-ins, like
gpu.compile does for the FMHA kernels (int32 lengths and page table included).
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Optional

import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   ScalarConstraint, export_kernel)

from .compile import compile_launches, launch_divisibility
from .plan_decode import plan_decode, plan_varlen
from .variants import check_hints, with_hints

_DTYPES = {"float16": ct.float16, "bfloat16": ct.bfloat16, "float32": ct.float32,
           "int32": ct.int32}


@dataclass(frozen=True)
class _Spec:
    shape: tuple
    dtype: str

    def reshape(self, shape):
        """A view of the same elements (the plan's combine view of its workspace)."""
        return _Spec(tuple(shape), self.dtype)


def _constraint(spec: _Spec) -> ArrayConstraint:
    """What ct.launch specialises to for contiguous, 16-byte-aligned tensors (with
    gpu.compile.launch_divisibility's facts)."""
    nd = len(spec.shape)
    return ArrayConstraint(_DTYPES[spec.dtype], nd, index_dtype=ct.int32,
                           stride_lower_bound_incl=0, alias_groups=(),
                           may_alias_internally=False, stride_constant=(None,) * (nd - 1) + (1,),
                           base_addr_divisible_by=16,
                           **launch_divisibility(spec.shape, spec.dtype))


def _signature(kernel, args) -> KernelSignature:
    params = []
    for a, ann in zip(args, kernel._annotated_function.parameter_annotations):
        if isinstance(a, _Spec):
            params.append(_constraint(a))
        elif ann.constant:
            params.append(a)
        elif isinstance(a, float):
            params.append(ScalarConstraint(ct.float32))
        else:
            params.append(ScalarConstraint(ct.int32))
    return KernelSignature(params, CallingConvention.cutile_python_v1())


def decode_launches(*, dtype: str, head_dim: int, causal: bool, page: int = 0,
                    seq_q: int = 1, heads=(32, 8), splits: int = 4, tiles=None,
                    capacity: int = 4096):
    """The plan's launches for one variant on stand-in arrays (lengths are run-time; a
    paged cache's capacity, keys a sequence, is its block table's width: the rows form's
    fitted TILE_N depends on it, plan_decode.fit_tile_n)."""
    dt = {"fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)
    hq, hkv = heads
    q = _Spec((2, seq_q, hq, head_dim), dt)
    k = _Spec((64, page, hkv, head_dim) if page else (2, 1000, hkv, head_dim), dt)
    bt = _Spec((2, -(-capacity // page)), "int32") if page else None
    lens, out = _Spec((2,), "int32"), _Spec((2, seq_q, hq, head_dim), dt)
    return plan_decode(q, k, k, lens, out, block_table=bt, causal=causal, num_splits=splits,
                       tiles=tiles, alloc=lambda shape, kind: _Spec(tuple(shape), "float32"))


def varlen_launches(*, dtype: str, head_dim: int, causal: bool, heads=(32, 8), tiles=None,
                    arch: str = "sm_90", whole: bool = False):
    """The varlen plan's launch on stand-in packed arrays (offsets are run-time); whole:
    two runs of 256 queries and keys, so the plan takes the kernel's WHOLE form."""
    dt = {"fp16": "float16", "bf16": "bfloat16"}.get(dtype, dtype)
    hq, hkv = heads
    tq, tk, mq, mk = (512, 512, 256, 256) if whole else (300, 500, 200, 300)
    q, out = _Spec((tq, hq, head_dim), dt), _Spec((tq, hq, head_dim), dt)
    k = _Spec((tk, hkv, head_dim), dt)
    cu = _Spec((3,), "int32")
    return plan_varlen(q, k, k, cu, cu, out, max_seqlen_q=mq, max_seqlen_k=mk,
                       causal=causal, tiles=tiles, arch=arch)


def compile_decode_variant(*, arch: str, dtype: str, head_dim: int, causal: bool,
                           page: int = 0, seq_q: int = 1, heads=(32, 8), tiles=None,
                           hints: Optional[dict] = None, kernel: str = "splitkv",
                           whole: bool = False, splits: int = 4) -> dict:
    """Compile one variant's kernels for `arch`, launching nothing: the split and combine
    kernels (kernel "splitkv"; splits 1: the one-split kernel alone), or the varlen kernel
    ("varlen"; page and seq_q unused; whole: its WHOLE form).
    Returns dict(ok, seconds, cubin_bytes, error, kernels, tiles) like gpu.compile."""
    def plan():
        if kernel == "varlen":
            return varlen_launches(dtype=dtype, head_dim=head_dim, causal=causal,
                                   heads=heads, tiles=tiles, arch=arch, whole=whole)
        return decode_launches(dtype=dtype, head_dim=head_dim, causal=causal, page=page,
                               seq_q=seq_q, heads=heads, tiles=tiles, splits=splits)

    def export(launch):
        k = with_hints(launch.kernel, **check_hints(hints))
        buf = io.BytesIO()
        export_kernel(k, [_signature(k, launch.args)], buf, gpu_code=arch,
                      output_format="cubin")
        return buf.getvalue()
    return compile_launches(plan, export, arch, tiles=tiles)
