"""cuTile dtypes as the simulator stores them, and cuTile's promotion rules.

Every tile value lives in a numpy array of a *storage* dtype. Most cuTile dtypes have a
numpy twin; bfloat16 has none, so bf16 values are held exactly in float32 arrays and
re-rounded to bf16 (round-to-nearest-even) after every operation that produces them.
"""
from __future__ import annotations

import numpy as np
import cuda.tile as ct
from cuda.tile._datatype import promote_dtypes as _ct_promote

from .errors import SimTypeError

STORAGE = {
    ct.bool_: np.dtype(np.bool_),
    ct.int8: np.dtype(np.int8), ct.int16: np.dtype(np.int16),
    ct.int32: np.dtype(np.int32), ct.int64: np.dtype(np.int64),
    ct.uint8: np.dtype(np.uint8), ct.uint16: np.dtype(np.uint16),
    ct.uint32: np.dtype(np.uint32), ct.uint64: np.dtype(np.uint64),
    ct.float16: np.dtype(np.float16),
    ct.bfloat16: np.dtype(np.float32),   # bf16 values held exactly in float32
    ct.float32: np.dtype(np.float32),
    ct.float64: np.dtype(np.float64),
}

_FROM_NUMPY = {
    np.dtype(np.bool_): ct.bool_,
    np.dtype(np.int8): ct.int8, np.dtype(np.int16): ct.int16,
    np.dtype(np.int32): ct.int32, np.dtype(np.int64): ct.int64,
    np.dtype(np.uint8): ct.uint8, np.dtype(np.uint16): ct.uint16,
    np.dtype(np.uint32): ct.uint32, np.dtype(np.uint64): ct.uint64,
    np.dtype(np.float16): ct.float16, np.dtype(np.float32): ct.float32,
    np.dtype(np.float64): ct.float64,
}

FLOATS = (ct.float16, ct.bfloat16, ct.float32, ct.float64)
INTS = (ct.int8, ct.int16, ct.int32, ct.int64, ct.uint8, ct.uint16, ct.uint32, ct.uint64)


def is_float(dt) -> bool:
    return dt in FLOATS


def is_int(dt) -> bool:
    return dt in INTS


def storage(dt) -> np.dtype:
    try:
        return STORAGE[dt]
    except KeyError:
        raise NotImplementedError(f"spak sim: dtype {dt} is not supported by the simulator") from None


def from_numpy(npdt) -> "ct.DType":
    try:
        return _FROM_NUMPY[np.dtype(npdt)]
    except KeyError:
        raise SimTypeError(f"numpy dtype {np.dtype(npdt)} has no cuTile equivalent") from None


def as_ct_dtype(dt) -> "ct.DType":
    """Accept a cuTile DType or a numpy dtype/type (as NVIDIA's samples write np.float32)."""
    if isinstance(dt, ct.DType):
        return dt
    return from_numpy(dt)


def promote(a, b) -> "ct.DType":
    """cuTile's implicit promotion of two typed operands (the table in cuda.tile._datatype)."""
    if a == b:
        return a
    try:
        return _ct_promote(a, b)
    except Exception as e:  # cuTile raises TileTypeError
        raise SimTypeError(str(e)) from None


def loose_dtype(value, other) -> "ct.DType":
    """dtype a python constant takes when combined with a typed operand of dtype `other`.

    Measured with cuTile's compiler: f16_tile * 1.5 stays f16; int32_tile * 0.5 is f32;
    a python int adopts the other operand's dtype; a python bool only stays bool with bool.
    """
    if isinstance(value, bool):
        return other if other == ct.bool_ else other
    if isinstance(value, int):
        return ct.int32 if other == ct.bool_ else other
    if isinstance(value, float):
        return other if is_float(other) else ct.float32
    raise SimTypeError(f"unsupported scalar operand {value!r} of type {type(value).__name__}")


def loose_default(value) -> "ct.DType":
    """dtype of a lone python constant (cuTile: bool -> bool, int -> int32, float -> float32)."""
    if isinstance(value, bool):
        return ct.bool_
    if isinstance(value, int):
        if -2**31 <= value < 2**31:
            return ct.int32
        return ct.int64
    if isinstance(value, float):
        return ct.float32
    raise SimTypeError(f"unsupported scalar {value!r} of type {type(value).__name__}")
