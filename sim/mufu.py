"""MUFU.RSQ, the sm_90 hardware reciprocal square root behind ct.rsqrt (rsqrt.approx.f32),
from a table measured on an H100 (issue 19; ci/mufu_probe.py, results/samples-h100-2026-11-24).

The probe ran ct.rsqrt on every fp32 in [1, 4) (2^24 inputs: the exponent's parity
matters) and found rsqrt(4x) = rsqrt(x) / 2 on all of them, so for a normal x = 2^(2k) x',
x' in [1, 4): MUFU.RSQ(x) = 2^-k MUFU.RSQ(x'). sim/data/sm90_rsq.npz holds, per x', the
result minus the correctly rounded 1/sqrt(x') in ulps (-2..1; 78.3% are 0). Subnormal
inputs are scaled by 2^24 first (checked on the recorded subnormals); zeros give inf of
their sign, negatives NaN, +inf +0.
"""
from __future__ import annotations

import os

import numpy as np

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sm90_rsq.npz")
_cache: dict = {}


def rsq_table(path: str = TABLE):
    """The int8 offsets (2^24), or None when the file is missing."""
    if path not in _cache:
        _cache[path] = np.load(path)["rsqrt_off"] if os.path.exists(path) else None
    return _cache[path]


def rsqrt_sm90(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """ct.rsqrt of float32 values as the H100 computes it (NaN results canonicalised by the
    caller)."""
    x = np.ascontiguousarray(x, np.float32)
    b = x.view(np.uint32)
    pos = (b >> 31) == 0
    sub = pos & ((b & 0x7F800000) == 0) & ((b & 0x7FFFFF) != 0)
    with np.errstate(all="ignore"):
        xs = np.where(sub, x * np.float32(2.0 ** 24), x)
    bs = xs.view(np.uint32)
    e = ((bs >> 23) & 0xFF).astype(np.int64) - 127
    p = e & 1
    frac = (bs & 0x7FFFFF).astype(np.int64)
    xr = ((((127 + p) << 23) | frac).astype(np.uint32)).view(np.float32)
    with np.errstate(all="ignore"):
        ref = (1 / np.sqrt(xr.astype(np.float64))).astype(np.float32)
    idx = np.where(pos & np.isfinite(x) & (x != 0), (p << 23) | frac, 0)
    y = (ref.view(np.int32) + table[idx].astype(np.int32)).view(np.float32)
    k = (e - p) // 2 + np.where(sub, -12, 0)
    y = np.ldexp(y.astype(np.float64), -k).astype(np.float32)
    y = np.where(x == 0, np.copysign(np.float32(np.inf), x), y)
    y = np.where(np.isposinf(x), np.float32(0), y)
    y = np.where(~pos & (x != 0), np.float32(np.nan), y)
    return np.where(np.isnan(x), np.float32(np.nan), y).astype(np.float32)
