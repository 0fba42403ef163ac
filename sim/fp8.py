"""float8_e4m3fn and float8_e5m2: how the simulator holds and converts them.

Arrays hold the raw 8-bit codes (numpy uint8; torch float8 tensors are viewed as bytes);
tiles hold the exact values in float32 (every fp8 value is a float32 value). Loads
decode by table, stores and astype encode: round to nearest even, saturating to the
largest finite value (PTX's cvt.rn.satfinite.e4m3/e5m2, the only rounding cuTile offers
for conversions to fp8); NaN stays NaN. Not verified on hardware.

Formats (OCP 8-bit floating point): e4m3fn: bias 7, no infinities, NaN = S.1111.111,
max 448; e5m2: bias 15, IEEE-like with infinities, max 57344.
"""
from __future__ import annotations

import math
import os

import numba
import numpy as np
import cuda.tile as ct

_CACHE = os.environ.get("SPAK_NUMBA_CACHE", "1") != "0"

_FORMATS = {ct.float8_e4m3fn: (4, 3, 7, False), ct.float8_e5m2: (5, 2, 15, True)}
FP8 = tuple(_FORMATS)
_tables: dict = {}


def _decode_code(code, ebits, mbits, bias, ieee):
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    top = (1 << ebits) - 1
    if ieee and e == top:
        return sign * np.inf if m == 0 else np.nan
    if not ieee and e == top and m == (1 << mbits) - 1:
        return np.nan
    if e == 0:
        return sign * m / (1 << mbits) * 2.0 ** (1 - bias)
    return sign * (1 + m / (1 << mbits)) * 2.0 ** (e - bias)


def _table(dtype):
    t = _tables.get(dtype)
    if t is None:
        ebits, mbits, bias, ieee = _FORMATS[dtype]
        values = np.array([_decode_code(c, ebits, mbits, bias, ieee) for c in range(256)],
                          np.float32)
        finite = [c for c in range(128) if np.isfinite(values[c])]
        t = _tables[dtype] = (values, np.array(finite, np.uint8), values[finite].astype(np.float64),
                              0x7F if not ieee else 0x7E)
    return t


def decode(codes: np.ndarray, dtype) -> np.ndarray:
    """uint8 codes -> float32 values."""
    return _table(dtype)[0][np.asarray(codes, np.uint8)]


@numba.njit(cache=_CACHE)
def _encode_nb(x, mbits, bias, top, nan_code, out):
    """_encode_np's rule by arithmetic, element by element: |v| clamped to the largest
    finite `top`, its binade's quantum q (subnormals: the least normal binade's), rint
    (ties to even: the even significand is the even code) -> significand -> code. Same
    codes as the table search on every input class (tests/test_sim_fp8_encode.py); an fp8
    attention perf test spent 17 s of 37 in _encode_np."""
    emin = 1 - bias
    for i in range(x.size):
        v = np.float64(x[i])
        if v != v:
            out[i] = nan_code
            continue
        a = min(abs(v), top)
        c = 0
        if a != 0.0:
            e = max(math.frexp(a)[1] - 1, emin)
            m = np.int64(np.rint(a / math.ldexp(1.0, e - mbits)))
            if m == 2 << mbits:                         # rounded up into the next binade
                e += 1
                m = 1 << mbits
            c = m if m < (1 << mbits) else ((e + bias) << mbits) | (m - (1 << mbits))
        out[i] = c | 0x80 if math.copysign(1.0, v) < 0 else c


def encode(x: np.ndarray, dtype) -> np.ndarray:
    """float values -> uint8 codes: RNE, saturating to the largest finite, NaN kept."""
    _, _, pos, nan_code = _table(dtype)
    _, mbits, bias, _ = _FORMATS[dtype]
    x = np.asarray(x)
    if x.dtype != np.float32 and x.dtype != np.float64:
        x = x.astype(np.float32 if x.dtype == np.float16 else np.float64)   # exact
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.size, np.uint8)
    _encode_nb(flat, mbits, bias, pos[-1], nan_code, out)
    return out.reshape(x.shape)


def _encode_np(x: np.ndarray, dtype) -> np.ndarray:
    """encode's rule in numpy (the tests compare the two on every input class)."""
    _, codes, pos, nan_code = _table(dtype)
    x = np.asarray(x, np.float64)
    a = np.minimum(np.abs(x), pos[-1])                     # satfinite (inf included)
    hi = np.clip(np.searchsorted(pos, a), 0, len(pos) - 1)
    lo = np.maximum(hi - 1, 0)
    dlo, dhi = a - pos[lo], pos[hi] - a
    even_hi = (codes[hi] & 1) == 0
    pick_hi = (dhi < dlo) | ((dhi == dlo) & even_hi)
    c = np.where(pick_hi, codes[hi], codes[lo]).astype(np.uint8)
    c = np.where(np.signbit(x), c | 0x80, c).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(nan_code), c).astype(np.uint8)


def round_fp8(x, dtype) -> np.ndarray:
    """Values rounded to the fp8 dtype, as float32."""
    return decode(encode(x, dtype), dtype)


def pad_code(dtype, padding_mode) -> int:
    """The code a padded fp8 element reads; UNDETERMINED gets the NaN poison here (the
    interpreter's "zero" fill is decided before, in sim.memory._pad_bits)."""
    PM = ct.PaddingMode
    codes = {PM.ZERO: 0x00, PM.NEG_ZERO: 0x80, PM.NAN: _table(dtype)[3],
             None: _table(dtype)[3], PM.UNDETERMINED: _table(dtype)[3]}
    if dtype == ct.float8_e5m2:
        codes.update({PM.POS_INF: 0x7C, PM.NEG_INF: 0xFC})
    if padding_mode not in codes:
        from .errors import SimTypeError
        raise SimTypeError(f"padding_mode={padding_mode} has no {dtype.name} value")
    return codes[padding_mode]
