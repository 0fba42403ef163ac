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
    ct.tfloat32: np.dtype(np.float32),   # tf32 values (10-bit fraction) held in float32
    # fp8 tiles hold exact values in float32; fp8 arrays hold raw uint8 codes (sim.fp8)
    ct.float8_e4m3fn: np.dtype(np.float32), ct.float8_e5m2: np.dtype(np.float32),
}
FP8 = (ct.float8_e4m3fn, ct.float8_e5m2)

_FROM_NUMPY = {
    np.dtype(np.bool_): ct.bool_,
    np.dtype(np.int8): ct.int8, np.dtype(np.int16): ct.int16,
    np.dtype(np.int32): ct.int32, np.dtype(np.int64): ct.int64,
    np.dtype(np.uint8): ct.uint8, np.dtype(np.uint16): ct.uint16,
    np.dtype(np.uint32): ct.uint32, np.dtype(np.uint64): ct.uint64,
    np.dtype(np.float16): ct.float16, np.dtype(np.float32): ct.float32,
    np.dtype(np.float64): ct.float64,
}

FLOATS = (ct.float16, ct.bfloat16, ct.float32, ct.float64, ct.tfloat32) + FP8
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


def known_numpy(npdt) -> bool:
    """Whether a numpy dtype holds a cuTile dtype (from_numpy answers)."""
    return np.dtype(npdt) in _FROM_NUMPY


def from_numpy(npdt) -> "ct.DType":
    try:
        return _FROM_NUMPY[np.dtype(npdt)]
    except KeyError:
        raise SimTypeError(f"numpy dtype {np.dtype(npdt)} has no cuTile equivalent") from None


# torch dtypes by name: cuTile accepts them in kernels (NVIDIA's gather sample writes
# `ct.arange(TILE, dtype=torch.int32)`); matched by duck typing so sim/ never imports torch
_TORCH = {
    "torch.bool": ct.bool_, "torch.int8": ct.int8, "torch.int16": ct.int16,
    "torch.int32": ct.int32, "torch.int64": ct.int64, "torch.uint8": ct.uint8,
    "torch.uint16": ct.uint16, "torch.uint32": ct.uint32, "torch.uint64": ct.uint64,
    "torch.float16": ct.float16, "torch.bfloat16": ct.bfloat16, "torch.float32": ct.float32,
    "torch.float64": ct.float64, "torch.float8_e4m3fn": ct.float8_e4m3fn,
    "torch.float8_e5m2": ct.float8_e5m2, "torch.float8_e8m0fnu": ct.float8_e8m0fnu,
}


def is_torch_dtype(dt) -> bool:
    return type(dt).__name__ == "dtype" and type(dt).__module__ == "torch"


def as_ct_dtype(dt) -> "ct.DType":
    """Accept a cuTile DType, a torch dtype or a numpy dtype/type (NVIDIA's samples write
    np.float32 and torch.int32 inside kernels)."""
    if isinstance(dt, ct.DType):
        return dt
    if is_torch_dtype(dt):
        try:
            return _TORCH[str(dt)]
        except KeyError:
            raise SimTypeError(f"torch dtype {dt} has no cuTile equivalent") from None
    return from_numpy(dt)


def round_tf32(x: np.ndarray) -> np.ndarray:
    """float32 -> tf32 (1+8+10 bits), round to nearest even on the bit pattern; NaN and inf
    pass. Not verified on hardware: cuTile may lower the conversion as cvt.rna (ties away)."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    finite = (b & 0x7F800000) != 0x7F800000
    lsb = (b >> 13) & 1
    r = np.where(finite, ((b + 0xFFF + lsb) >> 13) << 13, b).astype(np.uint32)
    return r.view(np.float32)


def round_value(model, x, dtype) -> np.ndarray:
    """x rounded to `dtype`'s storage: the model's rounding, plus the dtypes it lacks."""
    if dtype == ct.tfloat32:
        return round_tf32(np.asarray(x, np.float32))
    if dtype in FP8:
        from .fp8 import round_fp8
        return round_fp8(x, dtype)
    return model.round_to(x, dtype)


def array_storage(dt) -> np.dtype:
    """numpy dtype of an array (in memory) of cuTile dtype dt: fp8 codes are bytes."""
    return np.dtype(np.uint8) if dt in FP8 else storage(dt)


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
