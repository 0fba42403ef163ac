"""MUFU.RSQ and MUFU.TANH, the sm_90 hardware reciprocal square root behind ct.rsqrt
(rsqrt.approx.f32) and tanh behind ct.tanh(..., rounding_mode=APPROX) (tanh.approx.f32),
from tables measured on an H100 (issue 19; tools/mufu_probe.py, results/samples-h100-2026-11-24
and results/samples-h100-2026-11-24c).

The probe ran ct.rsqrt on every fp32 in [1, 4) (2^24 inputs: the exponent's parity
matters) and found rsqrt(4x) = rsqrt(x) / 2 on all of them, so for a normal x = 2^(2k) x',
x' in [1, 4): MUFU.RSQ(x) = 2^-k MUFU.RSQ(x'). sim/data/sm90_rsq.npz holds, per x', the
result minus the correctly rounded 1/sqrt(x') in ulps (-2..1; 78.3% are 0). Subnormal
inputs are scaled by 2^24 first (checked on the recorded subnormals); zeros give inf of
their sign, negatives NaN, +inf +0.
"""
from __future__ import annotations

import lzma
import os

import numpy as np

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sm90_rsq.npz")
TANH_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sm90_tanh.npz")
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


# ---------------------------------------------------------------------------- MUFU.TANH
#
# tools/mufu_probe.py --tanh-table ran tanh.approx.f32 on every fp32 in [2^-8, 8) and on its
# negative (results/samples-h100-2026-11-24c): odd on all of them; in binade 2^e the result
# is constant on aligned runs of 2^s inputs (s = 6, 6, 6, 5, 5, 4, 4, 4, 3, 2, 3 for
# e = -8 .. 2: the hardware reads the top 23 - s mantissa bits); below 2^-8 it is x itself
# (binades 2^-20 .. 2^-9 all checked), from 8 on +-1. Not monotone (steps back at aligned
# segment ends) and no formula found, so sim/data/sm90_tanh.npz holds, per binade, the
# first run's result bits and the int16 steps between runs (6,684,672 runs), xz-packed
# (123 KB); rebuilt once into a uint32 table of the result bits.


def tanh_table(path: str = TANH_TABLE):
    """(emin, run_log2 per binade, offsets of each binade in the table, uint32 result bits
    per run), or None when the file is missing."""
    if path not in _cache:
        _cache[path] = _build_tanh(path) if os.path.exists(path) else None
    return _cache[path]


def _build_tanh(path):
    z = np.load(path)
    runs = z["run_log2"].astype(np.int64)
    steps = np.frombuffer(lzma.decompress(z["diff_xz"].tobytes()), np.int16).astype(np.int64)
    sizes = 1 << (23 - runs)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    bits = np.empty(int(starts[-1]), np.int64)
    pos = 0
    for i, n in enumerate(sizes):
        bits[starts[i]] = int(z["first"][i])
        bits[starts[i] + 1:starts[i + 1]] = steps[pos:pos + n - 1]
        pos += n - 1
    # within a binade the steps add up to the bits; binade boundaries restart from "first"
    out = np.empty_like(bits)
    for i in range(len(sizes)):
        out[starts[i]:starts[i + 1]] = np.cumsum(bits[starts[i]:starts[i + 1]])
    return int(z["emin"]), runs, starts[:-1], out.astype(np.uint32)


def tanh_sm90(x: np.ndarray, table) -> np.ndarray:
    """tanh.approx.f32 of float32 values as the H100 computes it (NaN results canonicalised
    by the caller)."""
    emin, runs, starts, bits = table
    x = np.ascontiguousarray(x, np.float32)
    b = x.view(np.uint32)
    a = (b & 0x7FFFFFFF).view(np.float32)
    e = ((b >> 23) & 0xFF).astype(np.int64) - 127
    mid = (a >= np.float32(2.0 ** emin)) & (a < 8)
    k = np.clip(e - emin, 0, len(runs) - 1)
    idx = starts[k] + ((b & 0x7FFFFF).astype(np.int64) >> runs[k])
    y = bits[np.where(mid, idx, 0)] | (b & 0x80000000)        # odd: the input's sign
    y = np.where(mid, y, b).view(np.float32)                  # x itself below 2^emin
    y = np.where(a >= 8, np.copysign(np.float32(1), x), y)
    return np.where(np.isnan(x), np.float32(np.nan), y).astype(np.float32)
