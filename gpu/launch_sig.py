"""The kernel signature ``ct.launch`` compiles for a planned launch, derived on the CPU.

A JIT launch specialises each array argument on facts read from the real tensor: per
dimension "extent is 1" (a shape constant), "extent divisible by 16", "stride is 1" and
"stride 16-byte divisible", plus "base address 16-byte aligned" and "elements disjoint";
it then compiles with the lowest calling convention those facts allow (cutile_python_v2
as soon as any extent is the constant 1, else v1), and cuTile's disk cache keys the cubin
by the bytecode, which carries the mangled symbol of that signature. So a cubin built
here with the same signature, kernel object (hints) and arch is the entry the launch
looks up: a compile helper needs no GPU, no CUDA context and no torch.

The rules below are cuTile 1.7's (cext/tile_kernel.cpp compute_array_specialization_bits
and parse_array_constraint; cuda/tile/jax models the same). They are checked on a GPU by
.gpujobs/i36.sh's probe (same symbol as the launch, or the difference) and in the sweep
by the worker's first-launch hit count; a wrong guess only costs the worker a compile.

    sig = launch_signature(kernel, launch.args)     # args: LaunchArray stand-ins, scalars
    symbol = compile_to_cache(launch, "sm_90", hints={"occupancy": 2})
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   ScalarConstraint)

__all__ = ["LaunchArray", "launch_array_constraint", "launch_signature", "compile_to_cache",
           "arch_capability", "Unmappable"]

_DTYPES = {"float16": (ct.float16, 16), "bfloat16": (ct.bfloat16, 16),
           "float32": (ct.float32, 32), "int32": (ct.int32, 32), "int64": (ct.int64, 64),
           "bool": (ct.bool_, 8), "int8": (ct.int8, 8), "uint8": (ct.uint8, 8)}
#: cuTile specialises strides and extents only up to this many dimensions (TMA's limit)
_SPECIALISED_NDIM = 5


class Unmappable(TypeError):
    """A launch argument this module cannot turn into the launch's constraint."""


@dataclass(frozen=True)
class LaunchArray:
    """Shape-and-dtype stand-in for a tensor as torch allocates it: contiguous (strides the
    products of later extents unless given) and 16-byte aligned (torch's caching allocator
    hands out 512-byte aligned blocks). ``dtype`` a name ("float16"); str(dtype) is the
    name too, which the planners' dtype checks read."""
    shape: tuple
    dtype: str
    strides: Optional[tuple] = None
    aligned16: bool = True

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))
        if self.dtype not in _DTYPES:
            raise Unmappable(f"dtype {self.dtype!r} of a launch stand-in is not one of "
                             f"{sorted(_DTYPES)}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def stride_values(self) -> tuple:
        if self.strides is not None:
            return tuple(int(s) for s in self.strides)
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    def reshape(self, shape):            # spak.device.calls.distinct's views stay contiguous
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return LaunchArray(tuple(shape), self.dtype, None, self.aligned16)


def _disjoint(shape, strides) -> bool:
    """Whether no two elements share an address (tile_kernel.cpp's check: sorted by stride,
    each stride positive and at least the previous stride times its extent)."""
    pairs = sorted(zip(strides, shape))
    if not pairs:
        return True
    ok = pairs[0][0] > 0
    for (s0, d0), (s1, _) in zip(pairs, pairs[1:]):
        ok = ok and s1 > 0 and s1 >= s0 * d0
    return ok


def launch_array_constraint(a: LaunchArray, index_dtype=ct.int32) -> ArrayConstraint:
    """The ArrayConstraint ct.launch derives for a tensor like ``a`` (see the module doc).
    ArrayConstraint itself drops what a constant makes redundant (lower bounds and
    divisibility of constant strides and extents), as it does for the launch's."""
    dtype, bits = _DTYPES[a.dtype]
    shape, strides = a.shape, a.stride_values()
    nd = a.ndim
    s_const, e_const, s_div, e_div = [None] * nd, [None] * nd, [1] * nd, [1] * nd
    divisor = 128 // bits if 128 % bits == 0 else 1
    if index_dtype is ct.int32 and any(v > 2 ** 31 - 1 for v in shape + strides):
        raise Unmappable(f"array {shape} needs int64 indexing (the launch refuses it)")
    if nd <= _SPECIALISED_NDIM:
        for i, (d, s) in enumerate(zip(shape, strides)):
            e_const[i] = 1 if d == 1 else None
            s_const[i] = 1 if s == 1 else None
            if s * bits % 8 == 0 and (s * bits // 8) % 16 == 0:
                s_div[i] = divisor
            if d * bits % 8 == 0 and d % 16 == 0:
                e_div[i] = 16
    return ArrayConstraint(dtype, nd, index_dtype=index_dtype, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=not _disjoint(shape, strides),
                           stride_constant=tuple(s_const), shape_constant=tuple(e_const),
                           stride_divisible_by=tuple(s_div), shape_divisible_by=tuple(e_div),
                           base_addr_divisible_by=16 if a.aligned16 else 1)


def _param_constraint(i, a, ann, kernel):
    """One argument's constraint, as the launch's dispatcher builds it."""
    if ann.constant:
        if isinstance(a, (bool, int, float)) or a is None:
            return a                                   # KernelSignature's shorthand
        raise Unmappable(f"constant argument #{i} ({a!r}) of {kernel} is not a scalar")
    if isinstance(a, LaunchArray):
        index_dtype = ann.array.index_dtype if ann.array is not None else ct.int32
        return launch_array_constraint(a, index_dtype)
    if isinstance(a, bool):
        return ScalarConstraint(ct.bool_)
    if isinstance(a, int):
        wide = ann.scalar is not None and ann.scalar.dtype == ct.int64
        return ScalarConstraint(ct.int64 if wide else ct.int32)
    if isinstance(a, float):
        return ScalarConstraint(ct.float32)
    raise Unmappable(f"argument #{i} ({type(a).__name__}) of {kernel} has no launch "
                     f"constraint mapping (tuples, lists and other arrays are not modelled)")


def launch_signature(kernel, args) -> KernelSignature:
    """The KernelSignature (symbol mangled as compile_tile does) a JIT launch of ``kernel``
    compiles for ``args``: LaunchArray stand-ins for tensors, python scalars as passed.
    Unmappable (a TypeError) for an argument kind not modelled."""
    anns = kernel._annotated_function.parameter_annotations
    if len(anns) != len(args):
        raise Unmappable(f"{kernel} takes {len(anns)} arguments, the launch passes {len(args)}")
    params = [_param_constraint(i, a, ann, kernel) for i, (a, ann) in enumerate(zip(args, anns))]
    v2 = any(isinstance(p, ArrayConstraint) and any(c is not None for c in p.shape_constant)
             for p in params)
    cc = CallingConvention.cutile_python_v2() if v2 else CallingConvention.cutile_python_v1()
    return KernelSignature(params, cc).with_mangled_symbol(
        kernel._annotated_function.pyfunc.__name__)


def arch_capability(arch: str) -> tuple:
    """"sm_90" -> (9, 0), "sm_120" -> (12, 0): what kernel._compile takes."""
    digits = arch[3:] if arch.startswith("sm_") else ""
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"arch must look like 'sm_90', got {arch!r}")
    return int(digits[:-1]), int(digits[-1])


def compile_to_cache(launch, arch: str, hints: Optional[dict] = None) -> str:
    """Build the cubin of one planned launch (on LaunchArray stand-ins) for ``arch`` the way
    the launch's JIT does (kernel._compile with cuTile's default context, so it goes to
    the disk cache; a cached one is only looked up). hints: the sweeper's compiler hints,
    applied as the worker applies them. Returns the kernel's symbol."""
    from cuda.tile._cext import default_tile_context
    from .variants import apply_hints
    [launch] = apply_hints([launch], hints or {})
    sig = launch_signature(launch.kernel, launch.args)
    launch.kernel._compile(sig, default_tile_context, arch_capability(arch))
    return sig.symbol
