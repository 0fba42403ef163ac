"""Oracles written from documented hardware facts, independent of the simulator's code:
what a calibration record for a GPU we lack (sm_120) must hold, worked out by hand or by
a separate implementation, so `spak calibrate --check`'s passing path is fed data the
model did not produce.
"""
from __future__ import annotations

import numpy as np


def warp_row_sums(x, chunk=(0, 2, 1, 3)):
    """The row sum of a loaded float32 tile as the compiled SASS computes it
    (docs/numerics-sm120.md; ci/sass_trace_mma.py reads it from the cubin): lane t holds
    x[4t .. 4t+3] (one 16-byte load) and adds them as (x[a] + x[b]) + (x[c] + x[d]) with
    chunk = (a, b, c, d) -- sm_120: (0, 2, 1, 3), sm_90/sm_89: (0, 1, 2, 3) -- then the
    lanes meet by butterfly shuffles, the widest first (lane t adds lane t ^ m,
    m = lanes/2 .. 1). Plain Python over lanes with float32 scalars; the last axis is summed."""
    x = np.asarray(x, np.float32)
    f = np.float32
    a, b, c, d = chunk
    out = []
    for row in x.reshape(-1, x.shape[-1]):
        v = [(f(row[4 * t + a]) + f(row[4 * t + b])) + (f(row[4 * t + c]) + f(row[4 * t + d]))
             for t in range(row.size // 4)]
        m = len(v) // 2
        while m:
            v = [f(v[t] + v[t ^ m]) for t in range(len(v))]
            m //= 2
        out.append(v[0])
    return np.array(out, np.float32).reshape(x.shape[:-1])


def hand_rows_sm120():
    """Rows of 128 float32 and their sm_120 row sums, worked out by hand (above's order).

    1. x0=1, x1=2^-24, x2=-1, x3=2^-24 (lane 0): (1 + -1) + (2^-24 + 2^-24) = 2^-23.
       (sm_90's (x0 + x1) + (x2 + x3) gives 1 + (-1 + 2^-24) = 2^-24: 1 + 2^-24 ties to 1.)
    2. x0=1 (lane 0), x4=2^-24 (lane 1), x64=-1 (lane 16), x68=2^-24 (lane 17): the xor-16
       shuffle first gives lane 0: 1 + -1 = 0, lane 1: 2^-23; xor 1 last: 2^-23.
       (xor 1 first would give (1 + 2^-24) + (-1 + 2^-24) = 2^-24.)
    3. x0=1, every other x=2^-24: lane 0 holds (1 + 2^-24) + 2^-23 = 1 + 2^-23 (the tie
       rounds to 1), lanes 1..31 hold 2^-22; xor 16: 1 + 3*2^-23, lanes 1..15: 2^-21;
       xor 8: 1 + 7*2^-23; xor 4: 1 + 15*2^-23; xor 2: 1 + 31*2^-23; xor 1: 1 + 63*2^-23.
    4. x = i - 64 for i = 0..127 (small integers, every partial sum exact): -64.
    """
    rows = np.zeros((4, 128), np.float32)
    rows[0, :4] = [1, 2.0 ** -24, -1, 2.0 ** -24]
    rows[1, [0, 4, 64, 68]] = [1, 2.0 ** -24, -1, 2.0 ** -24]
    rows[2, :] = 2.0 ** -24
    rows[2, 0] = 1
    rows[3] = np.arange(128) - 64
    sums = np.array([2.0 ** -23, 2.0 ** -23, 1 + 63 * 2.0 ** -23, -64], np.float32)
    return rows, sums
