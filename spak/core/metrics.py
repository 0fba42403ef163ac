"""Error metrics and bit-level comparisons of kernel outputs.

Two kinds of question are asked of an output, and this module answers both:

* "Is it accurate?" -- `rel_l2`, `max_abs`, `nonfinite_count` against a float64
  reference, judged by the gates in `GATES` (`passes_gate`).
* "Is it the same bits?" -- `ulp_distance` and `fraction_bit_identical` between
  the simulator's output and the GPU's, for fp16, bf16 and fp32.

bf16 has no numpy dtype, so throughout SPAK bf16 values travel as float32
arrays whose low 16 bits are zero (`round_to_bf16` makes them), or as uint16
bit patterns. Everything here is numpy only: no torch, no cuTile.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = [
    "GATES", "gate_for", "passes_gate",
    "rel_l2", "max_abs", "nonfinite_count",
    "round_to_bf16", "float_bits", "ulp_distance", "max_ulp", "fraction_bit_identical",
    "NAN_ULP",
]

#: Relative-L2 gates vs float64 (issue 2): fp16 inputs 1e-3, bf16 8e-3 (bf16 keeps
#: 8 mantissa bits to fp16's 11, so its inputs alone carry ~8x the rounding error).
GATES = {"fp16": 1e-3, "bf16": 8e-3}

#: The ulp distance reported between a NaN and a non-NaN: larger than any real
#: distance, so a NaN can never hide inside a "worst case N ulp" figure.
NAN_ULP = np.iinfo(np.int64).max

_FORMATS = {  # name -> (bits, unsigned dtype of the bit pattern)
    "fp16": (16, np.uint16),
    "bf16": (16, np.uint16),
    "fp32": (32, np.uint32),
}


def gate_for(dtype: str) -> float:
    """The relative-L2 gate for inputs of `dtype` ("fp16" or "bf16")."""
    try:
        return GATES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(GATES)}, got {dtype!r}") from None


def passes_gate(rel: float, nonfinite: int, dtype: str) -> bool:
    """True iff the error is within the gate AND there is no NaN/Inf.

    Written so that a NaN error fails: `rel <= gate` is False for NaN.
    """
    return bool(nonfinite == 0 and rel <= gate_for(dtype))


def _pair(out, ref) -> tuple[np.ndarray, np.ndarray]:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"out has shape {out.shape} but ref has shape {ref.shape}")
    return out, ref


def rel_l2(out, ref) -> float:
    """||out - ref||_2 / ||ref||_2, computed in float64.

    A zero reference (e.g. every row fully masked) gives 0.0 when `out` is zero
    too and inf otherwise, rather than 0/0. NaN anywhere in `out` gives NaN.
    """
    out, ref = _pair(out, ref)
    num = float(np.linalg.norm((out - ref).ravel()))
    den = float(np.linalg.norm(ref.ravel()))
    if den == 0.0:
        return 0.0 if num == 0.0 else (num if math.isnan(num) else math.inf)
    return num / den


def max_abs(out, ref) -> float:
    """max |out - ref| in float64; NaN if any element of out is NaN (never hidden)."""
    out, ref = _pair(out, ref)
    if out.size == 0:
        return 0.0
    return float(np.max(np.abs(out - ref)))


def nonfinite_count(out) -> int:
    """Number of NaN or +-Inf elements."""
    return int(np.count_nonzero(~np.isfinite(np.asarray(out, dtype=np.float64))))


def round_to_bf16(x) -> np.ndarray:
    """Round float32 values to bf16 (round to nearest, ties to even).

    Returns float32 whose low 16 bits are zero. NaN stays a (quiet) NaN;
    values past the bf16 range round to +-inf as the hardware does.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    rounded = np.where(np.isnan(x), 0x7FC00000, rounded).astype(np.uint32)
    return rounded.view(np.float32)


def float_bits(x, dtype: str) -> np.ndarray:
    """The raw bit patterns of `x` as uint16 (fp16, bf16) or uint32 (fp32).

    Accepts values (float16 for fp16, float32 for fp32 and bf16) or bit patterns
    already (uint16/int16 for fp16/bf16, uint32/int32 for fp32). bf16 given as
    float32 must be exact bf16 values: a nonzero low half raises ValueError, so
    an unrounded float32 array is never compared as if it were bf16.
    """
    if dtype not in _FORMATS:
        raise ValueError(f"dtype must be one of {sorted(_FORMATS)}, got {dtype!r}")
    nbits, udt = _FORMATS[dtype]
    a = np.ascontiguousarray(x)
    if a.dtype.kind in "ui" and a.dtype.itemsize * 8 == nbits:
        return a.view(udt)
    if dtype == "fp16" and a.dtype == np.float16:
        return a.view(np.uint16)
    if dtype == "fp32" and a.dtype == np.float32:
        return a.view(np.uint32)
    if dtype == "bf16" and a.dtype == np.float32:
        b = a.view(np.uint32)
        if np.any(b & 0xFFFF):
            raise ValueError("bf16 values given as float32 must have zero low 16 bits "
                             "(round them with round_to_bf16 first)")
        return (b >> 16).astype(np.uint16)
    raise TypeError(f"cannot read {dtype} bit patterns from an array of dtype {a.dtype}")


def _ordered(bits: np.ndarray, nbits: int) -> np.ndarray:
    """Map sign-magnitude float bits to int64 so that float order = integer order.

    Positive floats keep their bits; negative ones become -(magnitude). Adjacent
    floats then differ by exactly 1, +0 and -0 both map to 0, and +-inf sit one
    step past the largest finite value.
    """
    b = bits.astype(np.int64)
    sign = np.int64(1) << (nbits - 1)
    mag = b & (sign - 1)
    return np.where(b & sign, -mag, mag)


def _is_nan(bits: np.ndarray, dtype: str) -> np.ndarray:
    b = bits.astype(np.int64)
    if dtype == "fp16":
        return ((b & 0x7C00) == 0x7C00) & ((b & 0x03FF) != 0)
    if dtype == "bf16":
        return ((b & 0x7F80) == 0x7F80) & ((b & 0x007F) != 0)
    return ((b & 0x7F800000) == 0x7F800000) & ((b & 0x007FFFFF) != 0)


def ulp_distance(a, b, dtype: str) -> np.ndarray:
    """Elementwise distance in units in the last place of `dtype`, as int64.

    The distance is the number of representable values between a and b, so it
    is exact across binades and across zero (+0 and -0 are 0 apart, the
    smallest positive and negative subnormals 2 apart). NaN policy, explicit:
    NaN vs NaN (any payloads) is 0 -- both sides failed the same way -- and
    NaN vs anything else is NAN_ULP, which no tolerance admits.
    """
    ba, bb = float_bits(a, dtype), float_bits(b, dtype)
    if ba.shape != bb.shape:
        raise ValueError(f"a has shape {ba.shape} but b has shape {bb.shape}")
    nbits = _FORMATS[dtype][0]
    d = np.abs(_ordered(ba, nbits) - _ordered(bb, nbits))
    na, nb = _is_nan(ba, dtype), _is_nan(bb, dtype)
    d = np.where(na & nb, 0, d)
    return np.where(na ^ nb, NAN_ULP, d).astype(np.int64)


def max_ulp(a, b, dtype: str) -> int:
    """The worst `ulp_distance` over all elements (0 for empty arrays)."""
    d = ulp_distance(a, b, dtype)
    return int(d.max()) if d.size else 0


def fraction_bit_identical(a, b, dtype: str) -> float:
    """Fraction of elements whose bit patterns are identical.

    Strict: +0 vs -0 differ, and NaNs match only with the same payload. An
    empty pair is 1.0 (nothing differs).
    """
    ba, bb = float_bits(a, dtype), float_bits(b, dtype)
    if ba.shape != bb.shape:
        raise ValueError(f"a has shape {ba.shape} but b has shape {bb.shape}")
    if ba.size == 0:
        return 1.0
    return float(np.count_nonzero(ba == bb)) / ba.size
