"""IEEE directed rounding and flush-to-zero for the ops whose stub takes `rounding_mode=` or
`flush_to_zero=` (add, sub, mul, truediv, sqrt, astype; the modes cuTile's compiler accepts
are in cuda.tile._ir.ops_utils' registries).

RZ, RM and RP are defined exactly by IEEE 754, so they are computed, not modelled: the
candidate r = RN(result) is one of the two target values around the exact result; the
exact sign of (r - exact) says whether r lies on the wrong side for the mode, and then r
moves one step. The sign comes from an exact float64 residual per op (TwoSum for add,
r*y - x for division, r*r - x for sqrt: products of <= 24-bit significands are exact in
float64). flush_to_zero (float32 only, as cuTile allows): subnormal inputs and results
become zeros of the same sign, as PTX's .ftz does.
"""
from __future__ import annotations

import numpy as np
import cuda.tile as ct

from . import dtypes
from .errors import SimNotSupported

RM = ct.RoundingMode
DIRECTED = (RM.RZ, RM.RM, RM.RP)
_TINY = {np.dtype(np.float32): np.float32(2.0 ** -126), np.dtype(np.float16): np.float16(2.0 ** -14),
         np.dtype(np.float64): np.float64(2.0 ** -1022)}


def ftz(x: np.ndarray) -> np.ndarray:
    """Subnormals -> zero of the same sign (float32 storage; other dtypes unchanged)."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        return x
    tiny = _TINY[x.dtype]
    return np.where(np.abs(x) < tiny, np.copysign(np.zeros((), x.dtype), x), x)


def _bits_view(v: np.ndarray, dtype):
    """(unsigned bit array, one-ulp step) for the storage of a float dtype."""
    if v.dtype == np.float16:
        return v.view(np.uint16).astype(np.int64), 1
    if dtype == ct.bfloat16:
        return v.view(np.uint32).astype(np.int64), 1 << 16
    return v.view(np.uint32 if v.dtype == np.float32 else np.uint64).astype(np.int64), 1


def _step(r: np.ndarray, dtype, up: np.ndarray, move: np.ndarray) -> np.ndarray:
    """r moved one representable value toward +inf (up) or -inf (~up) where `move`."""
    r = np.ascontiguousarray(r)
    bits, one = _bits_view(r, dtype)
    width = r.dtype.itemsize * 8
    sign = np.int64(1) << (width - 1)
    neg = (bits & sign) != 0
    mag = bits & ~sign
    # toward +inf: positive grows, negative shrinks; a zero of either sign becomes +tiny
    grow = np.where(up, ~neg, neg)
    zero = mag == 0
    new_mag = np.where(zero, one, np.where(grow, mag + one, mag - one))
    new_neg = np.where(zero, ~up, neg)
    out = np.where(new_neg, new_mag | sign, new_mag)
    out = np.where(move, out, bits)
    u = {16: np.uint16, 32: np.uint32, 64: np.uint64}[width]
    return out.astype(u).view(r.dtype)


def directed(candidate: np.ndarray, above: np.ndarray, dtype, mode) -> np.ndarray:
    """Fix an RN candidate (storage array) for a directed `mode`; `above` is the sign of
    (candidate - exact): +1 above, -1 below, 0 exact, NaN for NaN results."""
    if mode in (None, RM.RN):
        return candidate
    if mode not in DIRECTED:
        raise SimNotSupported(f"rounding_mode={mode} is not modelled by the simulator")
    c = np.asarray(candidate)
    with np.errstate(invalid="ignore"):
        hi, lo = above > 0, above < 0
        if mode is RM.RP:
            return _step(c, dtype, np.ones(c.shape, bool), lo)
        if mode is RM.RM:
            return _step(c, dtype, np.zeros(c.shape, bool), hi)
        # RZ: move toward zero when the candidate's magnitude exceeds the exact one
        pos = np.signbit(c) == 0
        return _step(c, dtype, ~pos, np.where(pos, hi, lo))


def _rn(model, x64: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(storage candidate, candidate as float64)."""
    c = dtypes.round_value(model, x64, dtype)
    return c, np.asarray(c, np.float64)


def _sign(d: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.sign(d)


def add(model, x, y, dtype, mode):
    """x + y (float storage arrays, broadcastable) rounded to `dtype` by `mode`."""
    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    with np.errstate(all="ignore"):
        s = a + b
        bb = s - a
        err = (a - (s - bb)) + (b - bb)          # TwoSum: s + err == a + b exactly
        c, r = _rn(model, s, dtype)
        above = _sign((r - s) - np.where(np.isfinite(s), err, 0.0))
    out = directed(c, above, dtype, mode)
    if mode is RM.RM:
        # IEEE: an exact zero sum of operands that are not both +0 is -0 when rounding down
        both_pos0 = (a == 0) & (b == 0) & ~np.signbit(a) & ~np.signbit(b)
        exact0 = (s == 0) & (err == 0)
        out = np.where(exact0 & ~both_pos0, -np.zeros((), out.dtype), out)
    return out


def mul(model, x, y, dtype, mode):
    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    with np.errstate(all="ignore"):
        p = a * b                                 # exact: <= 24-bit significands
        c, r = _rn(model, p, dtype)
        above = _sign(r - p)
    return directed(c, above, dtype, mode)


def div(model, x, y, dtype, mode):
    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    with np.errstate(all="ignore"):
        q = a / b
        c, r = _rn(model, q, dtype)
        above = _sign(r * b - a) * np.sign(b)    # r*b exact: the residual's sign
    return directed(c, above, dtype, mode)


def sqrt(model, x, dtype, mode):
    a = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        s = np.sqrt(a)
        c, r = _rn(model, s, dtype)
        above = _sign(r * r - a)
    return directed(c, above, dtype, mode)


def convert(model, x, dtype, mode):
    """float -> float conversion with a rounding mode (exact in float64 for the sources
    cuTile has: float64 values are their own exact value)."""
    a = np.asarray(x, np.float64)
    c, r = _rn(model, a, dtype)
    with np.errstate(invalid="ignore"):
        above = _sign(r - a)
    return directed(c, above, dtype, mode)
