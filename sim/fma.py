"""Exact float32 fused multiply-add, a*b + c with one rounding, as a numpy ufunc.

The sm_90 compiler contracts a float32 multiply whose result feeds an add or subtract into
one FFMA (read from the SASS of the fused kernel: `s * c - m` and `l * alpha + sum`), so a
model that rounds the product first is off by up to half an ulp of the product there.
numba lowers `llvm.fma.f32` to the CPU's FMA instruction (or libm's correctly rounded
fmaf where there is none), so this is the IEEE fusedMultiplyAdd, not a float64 imitation.
"""
from __future__ import annotations

import os

import numpy as np

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


def _odd(v, err, ftype, toward):
    """Round-to-odd: where the rounded `v` is inexact (err != 0 / v != toward), step to the
    odd neighbour in the direction of the exact value, so a later rounding to a precision
    2+ bits shorter is correct (no double rounding)."""
    itype = np.uint64 if ftype == np.float64 else np.uint32
    inexact = (err != 0) & np.isfinite(v)
    even = (np.ascontiguousarray(v).view(itype) & 1) == 0
    step = inexact & even
    return np.where(step, np.nextafter(v, toward), v).astype(ftype)


def fma_bf16(a, b, c):
    """a*b + c of bf16 values (held in float32) rounded once to bf16, as HFMA2.BF16 does
    (the sm_90 compiler contracts a bf16 product feeding an add, like float32: TileGym's
    RoPE `x1 * cos - x2 * sin` measured 100% on an H100 this way, 76% without; issue 19).
    Returned in float32 holding the bf16 value."""
    from .numerics import _bf16_rne
    with np.errstate(all="ignore"):
        p = np.asarray(a, np.float64) * np.asarray(b, np.float64)   # exact: 8-bit significands
        c = np.asarray(c, np.float64)
        s = p + c
        bp = s - c
        err = (p - bp) + (c - (s - bp))                            # TwoSum: s + err = p + c
        s = _odd(s, np.where(np.isfinite(err), err, 0), np.float64, s + err)
        f = s.astype(np.float32)
        f = _odd(f, np.where(np.isfinite(s), f.astype(np.float64) - s, 0), np.float32,
                 s.astype(np.float32) * 0 + np.where(s > f, np.float32(np.inf), np.float32(-np.inf)))
    return _bf16_rne(f)
