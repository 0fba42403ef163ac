"""Exact float32 fused multiply-add, a*b + c with one rounding, as a numpy ufunc.

The sm_90 compiler contracts a float32 multiply whose result feeds an add or subtract into
one FFMA (read from the SASS of the fused kernel: `s * c - m` and `l * alpha + sum`), so a
model that rounds the product first is off by up to half an ulp of the product there.
numba lowers `llvm.fma.f32` to the CPU's FMA instruction (or libm's correctly rounded
fmaf where there is none), so this is the IEEE fusedMultiplyAdd, not a float64 imitation.
"""
from __future__ import annotations

import os

import numba
from numba import types as nbtypes
from numba.extending import intrinsic

_CACHE = os.environ.get("SPAK_NUMBA_CACHE", "1") != "0"


@intrinsic
def _llvm_fma_f32(typingctx, a, b, c):
    sig = nbtypes.float32(nbtypes.float32, nbtypes.float32, nbtypes.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return sig, codegen


@numba.vectorize(["float32(float32, float32, float32)"], cache=_CACHE)
def fma_f32(a, b, c):
    """Elementwise a*b + c rounded once to float32 (broadcasting like any ufunc)."""
    return _llvm_fma_f32(a, b, c)
