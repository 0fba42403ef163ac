"""The simulator's ops against a GPU, bit for bit (issue 19): small kernels written here run
with cuTile on the GPU, the recorded inputs and outputs come back as one .npz, and the
same kernels run through sim.launch on those inputs on the CPU.

    # on the GPU machine (cuTile + torch; no simulator needed):
    source .carry/setup.sh && python tools/sim_ops_gpu.py --record $OUT
    # here, on the CPU: per op family the fraction of output elements bit-identical
    python tools/sim_ops_gpu.py --check results/sim-ops-h100-2026-11-24
    # a dry run of the plumbing on the CPU (the simulator plays the GPU):
    python tools/sim_ops_gpu.py --record /tmp/x --backend sim && python tools/sim_ops_gpu.py --check /tmp/x

Families: unary transcendentals (exp, exp2, log, log2, sqrt, rsqrt, tanh, sin, cos; fp32,
a few fp16, the APPROX forms), ct.sum on loaded (non-mma) layouts, matmul accumulation
(the sample-style kernel of spak/cpu/matmul_sample.py: fp16, bf16, tf32, and ct.matmul),
atomics whose result does not depend on order (integer add/max/min, float adds of small
integers), gather/scatter, cumsum/cumprod. A case that fails to compile or run on one side
is reported, not fatal.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cuda.tile as ct  # noqa: E402

from spak.cpu.matmul_sample import grid as mm_grid, matmul_kernel  # noqa: E402

C = ct.Constant[int]
RM = ct.RoundingMode
T = 1024                 # elements per block in the 1-D kernels
NPZ = "sim_ops_gpu.npz"
META = "sim_ops_gpu.json"


# ------------------------------------------------------------------------------ kernels

@ct.kernel
def unary(X, Y, OP: C, TT: C):
    """Y = op(X), one op per compile (OP is a constant)."""
    x = ct.load(X, (ct.bid(0),), (TT,))
    if OP == 0:
        y = ct.exp(x)
    elif OP == 1:
        y = ct.exp(x, rounding_mode=RM.APPROX)
    elif OP == 2:
        y = ct.exp2(x)
    elif OP == 3:
        y = ct.exp2(x, flush_to_zero=True)
    elif OP == 4:
        y = ct.log(x)
    elif OP == 5:
        y = ct.log2(x)
    elif OP == 6:
        y = ct.sqrt(x)
    elif OP == 7:
        y = ct.rsqrt(x)
    elif OP == 8:
        y = ct.tanh(x)
    elif OP == 9:
        y = ct.tanh(x, rounding_mode=RM.APPROX)
    elif OP == 10:
        y = ct.sin(x)
    else:
        y = ct.cos(x)
    ct.store(Y, (ct.bid(0),), y)


UNARY_OPS = {"exp": 0, "exp_approx": 1, "exp2": 2, "exp2_ftz": 3, "log": 4, "log2": 5,
             "sqrt": 6, "rsqrt": 7, "tanh": 8, "tanh_approx": 9, "sin": 10, "cos": 11}


@ct.kernel
def row_sum(X, Y, TM: C, TN: C):
    x = ct.load(X, (ct.bid(0), 0), (TM, TN))
    ct.store(Y, (ct.bid(0),), ct.sum(x, axis=1))


@ct.kernel
def col_sum(X, Y, TM: C, TN: C):
    x = ct.load(X, (ct.bid(0), 0), (TM, TN))
    ct.store(Y, (ct.bid(0), 0), ct.reshape(ct.sum(x, axis=0), (1, TN)))


@ct.kernel
def vec_sum(X, Y, TT: C):
    x = ct.load(X, (ct.bid(0),), (TT,))
    ct.store(Y, (ct.bid(0),), ct.reshape(ct.sum(x, axis=0), (1,)))


@ct.kernel
def all_sum(X, Y, TM: C, TN: C):
    x = ct.load(X, (ct.bid(0), 0), (TM, TN))
    ct.store(Y, (ct.bid(0),), ct.reshape(ct.sum(x), (1,)))


@ct.kernel
def matmul_tf32(A, B, Cm, TM: C, TN: C, TK: C):
    """The sample's float32 path: operands cast to tf32 for the tensor cores."""
    bm, bn = ct.bid(0) // ct.cdiv(B.shape[1], TN), ct.bid(0) % ct.cdiv(B.shape[1], TN)
    acc = ct.full((TM, TN), 0, dtype=ct.float32)
    for k in range(ct.num_tiles(A, axis=1, shape=(TM, TK))):
        a = ct.load(A, (bm, k), (TM, TK), padding_mode=ct.PaddingMode.ZERO).astype(ct.tfloat32)
        b = ct.load(B, (k, bn), (TK, TN), padding_mode=ct.PaddingMode.ZERO).astype(ct.tfloat32)
        acc = ct.mma(a, b, acc)
    ct.store(Cm, (bm, bn), acc)


@ct.kernel
def matmul_op(A, B, Cm, TM: C, TN: C, TK: C):
    """ct.matmul of two fp16 tiles: fp32 accumulation, fp16 result."""
    bm, bn = ct.bid(0) // ct.cdiv(B.shape[1], TN), ct.bid(0) % ct.cdiv(B.shape[1], TN)
    ct.store(Cm, (bm, bn), ct.matmul(ct.load(A, (bm, 0), (TM, TK)), ct.load(B, (0, bn), (TK, TN))))


@ct.kernel
def atomics_int(IDX, V, CNT, MX, MN, TT: C):
    i = ct.load(IDX, (ct.bid(0),), (TT,))
    v = ct.load(V, (ct.bid(0),), (TT,))
    ct.atomic_add(CNT, i, ct.full((TT,), 1, ct.int32))
    ct.atomic_max(MX, i, v)
    ct.atomic_min(MN, i, v)


@ct.kernel
def atomic_fadd(IDX, V, S, TT: C):
    ct.atomic_add(S, ct.load(IDX, (ct.bid(0),), (TT,)), ct.load(V, (ct.bid(0),), (TT,)))


@ct.kernel
def gather_1d(X, P, Y, TT: C):
    p = ct.load(P, (ct.bid(0),), (TT,))
    ct.store(Y, (ct.bid(0),), ct.gather(X, p, mask=p < 3000, padding_value=-7.0))


@ct.kernel
def gather_2d(X, R, CI, Y, TR: C, TC: C):
    r = ct.reshape(ct.load(R, (ct.bid(0),), (TR,)), (TR, 1))
    c = ct.reshape(ct.load(CI, (0,), (TC,)), (1, TC))
    ct.store(Y, (ct.bid(0), 0), ct.gather(X, (r, c)))


@ct.kernel
def scatter_1d(X, P, Y, TT: C):
    ct.scatter(Y, ct.load(P, (ct.bid(0),), (TT,)), ct.load(X, (ct.bid(0),), (TT,)))


@ct.kernel
def scan(X, Y, AX: C, REV: C, PROD: C, TM: C, TN: C):
    x = ct.load(X, (ct.bid(0), 0), (TM, TN))
    if PROD:
        y = ct.cumprod(x, axis=AX, reverse=REV == 1)
    else:
        y = ct.cumsum(x, axis=AX, reverse=REV == 1)
    ct.store(Y, (ct.bid(0), 0), y)


# --- --shapes (issue 19): the rules of docs/numerics-sm90.md 13-15 on other tile shapes -------

@ct.kernel
def f32_mm(A, B, Cc, O, MODE: C, M: C, K: C, N: C):
    """fp32 ct.matmul (MODE 0) or ct.mma with an accumulator (MODE 1): FMUL+FADD chains."""
    a, b = ct.load(A, (0, 0), (M, K)), ct.load(B, (0, 0), (K, N))
    if MODE == 0:
        r = ct.matmul(a, b)
    else:
        r = ct.mma(a, b, ct.load(Cc, (0, 0), (M, N)))
    ct.store(O, (0, 0), r)


@ct.kernel
def fma_rules(S, Cc, X, Y, O1, O2, O3, M: C, N: C):
    """p + x*y with p = s*c stored too (no FFMA on sm_90), x*y + p (x*y fused), and
    (s + c) + x*y (fused)."""
    s, c = ct.load(S, (0, 0), (M, N)), ct.load(Cc, (0, 0), (M, N))
    x, y = ct.load(X, (0, 0), (M, N)), ct.load(Y, (0, 0), (M, N))
    p = s * c
    ct.store(O1, (0, 0), p + x * y)
    ct.store(O2, (0, 0), p)
    ct.store(O3, (0, 0), (s + c) + x * y)


@ct.kernel
def bcast_product(S, K, O1, O2, O3, c: float, M: C, N: C):
    """s + k[:, None] * c and its mirror (FMUL on the column, FADD), s + k[:, None] * s (FFMA)."""
    s = ct.load(S, (0, 0), (M, N))
    k = ct.load(K, (0,), (M,))
    ct.store(O1, (0, 0), s + k[:, None] * c)
    ct.store(O2, (0, 0), k[:, None] * c + s)
    ct.store(O3, (0, 0), s + k[:, None] * s)


@ct.kernel
def mma_row_sum(Q, K, O, MODE: C, TM: C, TN: C, D: C):
    """Row sums of an fp16 mma tile: the tile itself (MODE 0) or TileGym's exp2(s*c - m)."""
    q = ct.load(Q, (0, 0), (TM, D))
    k = ct.load(K, (0, 0), (D, TN), order=(1, 0))
    qk = ct.mma(q, k, ct.full((TM, TN), 0.0, dtype=ct.float32))
    if MODE == 1:
        m = ct.max(qk, axis=-1, keepdims=True) * 0.18033688
        qk = ct.exp2(qk * 0.18033688 - m, flush_to_zero=True)
    ct.store(O, (0,), ct.sum(qk, axis=-1))


@ct.kernel
def mma_col_sum(K, Q, O, MODE: C, TN: C, G: C, D: C):
    """Axis-0 sums of a [TN, G] mma tile (the decode kernels' ct.sum(l_i, 0))."""
    q = ct.transpose(ct.load(Q, (0, 0), (G, D)))
    k = ct.load(K, (0, 0), (TN, D))
    qk = ct.mma(k, q, ct.full((TN, G), 0.0, dtype=ct.float32))
    if MODE == 1:
        qk = qk * 0.18033688
        qk = ct.exp2(qk - ct.max(qk, 0)[None, :])
    ct.store(O, (0, 0), ct.sum(qk, 0).reshape((1, G)))


@ct.kernel
def gather_sum(X, Y, N: C):
    """ct.sum of a 1-D gather of N consecutive elements."""
    g = ct.gather(X, ct.bid(0) * N + ct.arange(N, dtype=ct.int32))
    ct.store(Y, (ct.bid(0),), ct.reshape(ct.sum(g, axis=0), (1,)))


@ct.kernel
def gather2_row_sum(X, Y, TR: C, TC: C):
    """Row sums of a 2-D gather (rows TR*bid.., all TC columns)."""
    r = ct.reshape(ct.bid(0) * TR + ct.arange(TR, dtype=ct.int32), (TR, 1))
    c = ct.reshape(ct.arange(TC, dtype=ct.int32), (1, TC))
    ct.store(Y, (ct.bid(0),), ct.sum(ct.gather(X, (r, c)), axis=1))


@ct.kernel
def conv_dots(Dl, O, dO, F, MODE: C, TM: C, TD: C):
    """fp32 sums of converted fp16 loads: rows (MODE 0), axis 0 (MODE 1), and a product with
    an fp32 load (MODE 2)."""
    o = ct.load(O, (ct.bid(0), 0), (TM, TD)).astype(ct.float32)
    if MODE == 2:
        do = ct.load(F, (ct.bid(0), 0), (TM, TD))
    else:
        do = ct.load(dO, (ct.bid(0), 0), (TM, TD)).astype(ct.float32)
    if MODE == 1:
        ct.store(Dl, (ct.bid(0), 0), ct.reshape(ct.sum(o * do, axis=0), (1, TD)))
    else:
        ct.store(Dl, (ct.bid(0),), ct.sum(o * do, axis=-1))


# -------------------------------------------------------------------------------- cases

@dataclass
class Case:
    name: str
    family: str
    kernel: object
    grid: tuple
    args: list                  # ("in", key) / ("out", key) / a constant
    arrays: dict                # key -> numpy array (inputs, and outputs' initial values)
    bf16: set = field(default_factory=set)      # keys held as bf16 (float32 storage here)


def _specials(kind):
    base = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0 ** -149, 2.0 ** -126,
            3.4e38, -3.4e38, 0.5, 2.0]
    extra = {"exp": [88.72283, 88.72284, -87.33655, -103.0, -104.0, 1e-8],
             "exp2": [127.99999, 128.0, -126.0, -149.0, -150.0, 0.5e-7],
             "log": [1.0 + 2.0 ** -23, 1.0 - 2.0 ** -24, 0.70710677, 1.4142135],
             "trig": [3.1415927, 1.5707964, 1e4, 1e6, 105414.36, -6.2831855]}
    return np.array(base + extra.get(kind, []), np.float64)


def _domain(rng, kind, n):
    """n float64 inputs for a unary op: the typical range, wide exponents, specials."""
    q = n // 4
    if kind == "exp":
        parts = [rng.uniform(-87.3, 88.7, q), rng.standard_normal(q) * 4,
                 rng.standard_normal(q) * 2.0 ** rng.integers(-30, 0, q)]
    elif kind == "exp2":
        parts = [rng.uniform(-150, 128, q), rng.standard_normal(q) * 8,
                 rng.standard_normal(q) * 2.0 ** rng.integers(-30, 0, q)]
    elif kind == "log":          # positive, every binade incl. subnormals, and near 1
        parts = [2.0 ** rng.uniform(-149, 128, q), rng.uniform(0.5, 2.0, q),
                 1.0 + rng.standard_normal(q) * 2.0 ** rng.integers(-24, -4, q)]
    elif kind == "tanh":
        parts = [rng.standard_normal(q) * 3,
                 rng.choice([-1, 1], q) * 2.0 ** rng.uniform(-30, 5, q), rng.uniform(-10, 10, q)]
    else:                        # trig
        parts = [rng.uniform(-100, 100, q), rng.standard_normal(q) * 3,
                 rng.uniform(-1e4, 1e4, q)]
    x = np.concatenate(parts)
    x = np.concatenate([x, rng.standard_normal(n - len(x) - len(_specials(kind)))])
    return np.concatenate([x, _specials(kind)])[:n]


_UNARY_DOMAIN = {"exp": "exp", "exp_approx": "exp", "exp2": "exp2", "exp2_ftz": "exp2",
                 "log": "log", "log2": "log", "sqrt": "log", "rsqrt": "log", "tanh": "tanh",
                 "tanh_approx": "tanh", "sin": "trig", "cos": "trig"}


def _unary_cases(rng, n):
    out = []
    for op, code in UNARY_OPS.items():
        x = _domain(rng, _UNARY_DOMAIN[op], n).astype(np.float32)
        out.append(Case(op, "unary fp32", unary, (n // T,), [("in", "x"), ("out", "y"), code, T],
                        {"x": x, "y": np.zeros(n, np.float32)}))
    for op in ("exp", "log", "sqrt", "tanh"):
        x = np.clip(_domain(rng, _UNARY_DOMAIN[op], n), -65504, 65504)
        x = np.where(np.isfinite(x), x, 0.0).astype(np.float16)
        out.append(Case(op + "_fp16", "unary fp16", unary, (n // T,),
                        [("in", "x"), ("out", "y"), UNARY_OPS[op], T],
                        {"x": x, "y": np.zeros(n, np.float16)}))
    return out


def _wide(rng, shape):
    """Signed values over 40 binades: the order of a sum shows in the bits."""
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, shape)).astype(np.float32)


def _sum_cases(rng):
    g = 2
    out = []
    for tm, tn, data in ((16, 128, "normal"), (16, 128, "wide"), (4, 1024, "wide"),
                         (2, 4096, "wide"), (16, 32, "wide")):
        g = 4 if tn <= 128 else 2
        x = _wide(rng, (g * tm, tn)) if data == "wide" else \
            rng.standard_normal((g * tm, tn)).astype(np.float32)
        out.append(Case(f"row_sum {tm}x{tn} {data}", "sum (loaded layout)", row_sum, (g,),
                        [("in", "x"), ("out", "y"), tm, tn],
                        {"x": x, "y": np.zeros(g * tm, np.float32)}))
    g = 2
    x = _wide(rng, (g * 64, 64))
    out.append(Case("col_sum 64x64", "sum (loaded layout)", col_sum, (g,),
                    [("in", "x"), ("out", "y"), 64, 64], {"x": x, "y": np.zeros((g, 64), np.float32)}))
    g = 16
    x = _wide(rng, g * 256)
    out.append(Case("vec_sum 256", "sum (loaded layout)", vec_sum, (g,),
                    [("in", "x"), ("out", "y"), 256], {"x": x, "y": np.zeros(g, np.float32)}))
    x = _wide(rng, (g * 16, 16))
    out.append(Case("all_sum 16x16", "sum (loaded layout)", all_sum, (g,),
                    [("in", "x"), ("out", "y"), 16, 16], {"x": x, "y": np.zeros(g, np.float32)}))
    g = 4
    x = rng.standard_normal((g * 16, 128)).astype(np.float16)
    out.append(Case("row_sum 16x128 fp16", "sum (loaded layout)", row_sum, (g,),
                    [("in", "x"), ("out", "y"), 16, 128], {"x": x, "y": np.zeros(g * 16, np.float16)}))
    return out


def _bf16(x):
    """float32 values rounded to bf16 (RNE), kept in float32."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)


def _matmul_cases(rng):
    m, n, k = 128, 64, 128
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    out = []
    for tm, tn, tk in ((64, 64, 32), (128, 64, 64)):
        out.append(Case(f"matmul fp16 {tm}x{tn}x{tk}", "matmul accumulation", matmul_kernel,
                        mm_grid(m, n, tm, tn), [("in", "a"), ("in", "b"), ("out", "c"), tm, tn, tk],
                        {"a": a, "b": b, "c": np.zeros((m, n), np.float32)}))
    k = 64                      # the bf16/tf32 operands are float32 here: keep them small
    ab = _bf16(rng.standard_normal((m, k)) * 2.0 ** rng.integers(-8, 8, (m, k)))
    bb = _bf16(rng.standard_normal((k, n)))
    out.append(Case("matmul bf16 64x64x32", "matmul accumulation", matmul_kernel,
                    mm_grid(m, n, 64, 64), [("in", "a"), ("in", "b"), ("out", "c"), 64, 64, 32],
                    {"a": ab, "b": bb, "c": np.zeros((m, n), np.float32)}, bf16={"a", "b"}))
    a32 = rng.standard_normal((m, k)).astype(np.float32)
    b32 = rng.standard_normal((k, n)).astype(np.float32)
    out.append(Case("matmul tf32 64x64x32", "matmul accumulation", matmul_tf32,
                    mm_grid(m, n, 64, 64), [("in", "a"), ("in", "b"), ("out", "c"), 64, 64, 32],
                    {"a": a32, "b": b32, "c": np.zeros((m, n), np.float32)}))
    out.append(Case("ct.matmul fp16 64x64x64", "matmul accumulation", matmul_op,
                    mm_grid(m, n, 64, 64), [("in", "a"), ("in", "b"), ("out", "c"), 64, 64, 64],
                    {"a": a, "b": b, "c": np.zeros((m, n), np.float16)}))
    return out


def _memory_cases(rng):
    g, bins = 4, 64
    idx = rng.integers(0, bins, g * T).astype(np.int32)
    v = rng.integers(-10**6, 10**6, g * T).astype(np.int32)
    out = [Case("atomic_add/max/min int32", "atomics (order-free)", atomics_int, (g,),
                [("in", "idx"), ("in", "v"), ("out", "cnt"), ("out", "mx"), ("out", "mn"), T],
                {"idx": idx, "v": v, "cnt": np.zeros(bins, np.int32),
                 "mx": np.full(bins, -2**31, np.int32), "mn": np.full(bins, 2**31 - 1, np.int32)})]
    fv = rng.integers(-50, 50, g * T).astype(np.float32)     # sums of small ints: exact
    out.append(Case("atomic_add float32 small ints", "atomics (order-free)", atomic_fadd, (g,),
                    [("in", "idx"), ("in", "v"), ("out", "s"), T],
                    {"idx": idx, "v": fv, "s": np.zeros(bins, np.float32)}))
    x = rng.standard_normal(g * T).astype(np.float32)
    p = rng.permutation(g * T).astype(np.int32)
    p[::97] = -1                                          # out of bounds: padding
    p[5::101] = g * T + 3
    out.append(Case("gather 1-d, mask + bounds", "gather/scatter", gather_1d, (g,),
                    [("in", "x"), ("in", "p"), ("out", "y"), T],
                    {"x": x, "p": p, "y": np.zeros(g * T, np.float32)}))
    x2 = rng.standard_normal((64, 64)).astype(np.float32)
    r = rng.integers(0, 64, g * 16).astype(np.int32)
    c = rng.integers(0, 64, 32).astype(np.int32)
    out.append(Case("gather 2-d broadcast indices", "gather/scatter", gather_2d, (g,),
                    [("in", "x"), ("in", "r"), ("in", "c"), ("out", "y"), 16, 32],
                    {"x": x2, "r": r, "c": c, "y": np.zeros((g * 16, 32), np.float32)}))
    out.append(Case("scatter 1-d permutation", "gather/scatter", scatter_1d, (g,),
                    [("in", "x"), ("in", "p"), ("out", "y"), T],
                    {"x": x, "p": rng.permutation(g * T).astype(np.int32),
                     "y": np.zeros(g * T, np.float32)}))
    return out


def _scan_cases(rng):
    g, tm, tn = 1, 8, 256
    out = []
    for name, ax, rev, prod, x in (
            ("cumsum f32 axis 1", 1, 0, 0, _wide(rng, (g * tm, tn))),
            ("cumsum f32 axis 1 normal", 1, 0, 0, rng.standard_normal((g * tm, tn)).astype(np.float32)),
            ("cumsum f32 axis 0", 0, 0, 0, _wide(rng, (g * tm, tn))),
            ("cumsum f32 axis 1 reverse", 1, 1, 0, _wide(rng, (g * tm, tn))),
            ("cumsum int32 axis 1", 1, 0, 0, rng.integers(-10**6, 10**6, (g * tm, tn)).astype(np.int32)),
            ("cumprod f32 axis 1", 1, 0, 1, (1 + 0.01 * rng.standard_normal((g * tm, tn))).astype(np.float32))):
        out.append(Case(name, "cumsum/cumprod", scan, (g,),
                        [("in", "x"), ("out", "y"), ax, rev, prod, tm, tn],
                        {"x": x, "y": np.zeros_like(x)}))
    return out


def _extra_cases(rng):
    """--extra (issue 19 remainder): half-precision sums of loaded tiles and fp16/bf16
    scans, whose orders the fp32 SASS reading did not cover."""
    out = []
    for tm, tn, axis, dt in ((16, 128, 1, "bf16"), (4, 1024, 1, "bf16"), (64, 64, 0, "bf16"),
                             (4, 1024, 1, "fp16"), (64, 64, 0, "fp16")):
        g = 2
        x = rng.standard_normal((g * tm, tn))
        if dt == "fp16":
            x, bf = x.astype(np.float16), set()
        else:
            x, bf = _bf16(x), {"x", "y"}
        kern, yshape, args = (row_sum, (g * tm,), [tm, tn]) if axis == 1 else \
            (col_sum, (g, tn), [tm, tn])
        out.append(Case(f"{'row' if axis else 'col'}_sum {tm}x{tn} {dt}", "sum half (extra)", kern,
                        (g,), [("in", "x"), ("out", "y")] + args,
                        {"x": x, "y": np.zeros(yshape, x.dtype)}, bf16=bf))
    g, tm, tn = 1, 8, 256
    for name, ax, prod, dt in (("cumsum fp16 axis 1", 1, 0, "fp16"), ("cumsum fp16 axis 0", 0, 0, "fp16"),
                               ("cumsum bf16 axis 1", 1, 0, "bf16"), ("cumsum bf16 axis 0", 0, 0, "bf16"),
                               ("cumprod fp16 axis 1", 1, 1, "fp16"), ("cumprod bf16 axis 1", 1, 1, "bf16")):
        x = (1 + 0.01 * rng.standard_normal((g * tm, tn))) if prod else 0.25 * rng.standard_normal((g * tm, tn))
        x, bf = (x.astype(np.float16), set()) if dt == "fp16" else (_bf16(x), {"x", "y"})
        out.append(Case(name, "scan half (extra)", scan, (g,),
                        [("in", "x"), ("out", "y"), ax, 0, prod, tm, tn],
                        {"x": x, "y": np.zeros_like(x)}, bf16=bf))
    return out


def _shape_cases(rng):
    """--shapes (issue 19): each rule that docs/numerics-sm90.md 13-15 measured on one
    shape (or read from the SASS only), on other shapes; the measured shape is kept as a
    control where it is cheap."""
    return (_shape_f32_cases(rng) + _shape_mma_sum_cases(rng) + _shape_gather_cases(rng)
            + _shape_conv_cases(rng))


def _shape_f32_cases(rng):
    out = []
    for mode, (m, k, n) in ((0, (4, 4, 16)), (0, (8, 8, 16)), (0, (16, 32, 16)), (0, (32, 64, 32)),
                            (1, (16, 4, 8)), (1, (16, 16, 32)), (1, (64, 8, 64))):
        a, b = (rng.standard_normal(sh).astype(np.float32) * 3 for sh in ((m, k), (k, n)))
        name = f"{'matmul' if mode == 0 else 'mma+acc'} f32 {m}x{k}x{n}"
        out.append(Case(name, "fp32 matmul chain (shapes)", f32_mm, (1,),
                        [("in", "a"), ("in", "b"), ("in", "c"), ("out", "o"), mode, m, k, n],
                        {"a": a, "b": b, "c": rng.standard_normal((m, n)).astype(np.float32),
                         "o": np.zeros((m, n), np.float32)}))
    for m, n in ((16, 128), (128, 16), (64, 64)):
        arr = {k: rng.standard_normal((m, n)).astype(np.float32) for k in ("s", "c", "x", "y")}
        arr.update({k: np.zeros((m, n), np.float32) for k in ("o1", "o2", "o3")})
        out.append(Case(f"fma rules {m}x{n}", "contraction (shapes)", fma_rules, (1,),
                        [("in", "s"), ("in", "c"), ("in", "x"), ("in", "y"),
                         ("out", "o1"), ("out", "o2"), ("out", "o3"), m, n], arr))
    for m, n in ((64, 32), (128, 16), (16, 256)):
        arr = {"s": rng.standard_normal((m, n)).astype(np.float32),
               "k": rng.standard_normal(m).astype(np.float32)}
        arr.update({k: np.zeros((m, n), np.float32) for k in ("o1", "o2", "o3")})
        out.append(Case(f"broadcast product {m}x{n}", "contraction (shapes)", bcast_product, (1,),
                        [("in", "s"), ("in", "k"), ("out", "o1"), ("out", "o2"), ("out", "o3"),
                         0.7071067, m, n], arr))
    return out


def _shape_mma_sum_cases(rng):
    out = []
    for mode in (1, 0):
        for tm, tn, d in ((256, 128, 64), (256, 64, 64), (256, 128, 128), (128, 128, 64),
                          (128, 64, 128), (64, 128, 64)):
            q = (rng.standard_normal((tm, d)) * 2).astype(np.float16)
            k = (rng.standard_normal((tn, d)) * 2).astype(np.float16)
            out.append(Case(f"mma row sum {'exp2' if mode else 'plain'} {tm}x{tn} d{d}",
                            "mma sums (shapes)", mma_row_sum, (1,),
                            [("in", "q"), ("in", "k"), ("out", "o"), mode, tm, tn, d],
                            {"q": q, "k": k, "o": np.zeros(tm, np.float32)}))
        for tn, g, d in ((128, 8, 64), (64, 16, 64), (256, 16, 64), (128, 32, 128), (256, 64, 64)):
            q = (rng.standard_normal((g, d)) * 2).astype(np.float16)
            k = (rng.standard_normal((tn, d)) * 2).astype(np.float16)
            out.append(Case(f"mma col sum {'exp2' if mode else 'plain'} {tn}x{g} d{d}",
                            "mma sums (shapes)", mma_col_sum, (1,),
                            [("in", "k"), ("in", "q"), ("out", "o"), mode, tn, g, d],
                            {"k": k, "q": q, "o": np.zeros((1, g), np.float32)}))
    return out


def _shape_gather_cases(rng):
    out = []
    for n in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
        g = max(2, min(16, 16384 // n))
        out.append(Case(f"gather sum {n}", "gather sums (shapes)", gather_sum, (g,),
                        [("in", "x"), ("out", "y"), n],
                        {"x": _wide(rng, g * n), "y": np.zeros(g, np.float32)}))
    for tr, tc in ((16, 32), (4, 256)):
        g = 2
        out.append(Case(f"gather 2-d row sum {tr}x{tc}", "gather sums (shapes)", gather2_row_sum, (g,),
                        [("in", "x"), ("out", "y"), tr, tc],
                        {"x": _wide(rng, (g * tr, tc)), "y": np.zeros(g * tr, np.float32)}))
    return out


def _shape_conv_cases(rng):
    out = []
    for mode, tm, td in ((0, 32, 64), (0, 16, 128), (0, 64, 32), (0, 8, 256), (1, 32, 64),
                         (1, 64, 16), (2, 32, 64), (2, 16, 128)):
        g = 2
        o = rng.standard_normal((g * tm, td)).astype(np.float16)
        do = rng.standard_normal((g * tm, td)).astype(np.float16)
        f = rng.standard_normal((g * tm, td)).astype(np.float32)
        dl = np.zeros((g, td), np.float32) if mode == 1 else np.zeros(g * tm, np.float32)
        what = ("rows", "axis 0", "rows x fp32")[mode]
        out.append(Case(f"converted fp16 {what} {tm}x{td}", "converted-fp16 sums (shapes)",
                        conv_dots, (g,), [("out", "dl"), ("in", "o"), ("in", "do"), ("in", "f"),
                                          mode, tm, td],
                        {"dl": dl, "o": o, "do": do, "f": f}))
    return out


def build_cases(seed=2026, n_unary=3072, extra=False, shapes=False):
    rng = np.random.default_rng(seed)
    cases = (_unary_cases(rng, n_unary) + _sum_cases(rng) + _matmul_cases(rng)
             + _memory_cases(rng) + _scan_cases(rng))
    cases += _extra_cases(np.random.default_rng(seed + 1)) if extra else []
    return cases + (_shape_cases(np.random.default_rng(seed + 2)) if shapes else [])


# ---------------------------------------------------------------------------- backends

def _outputs(case):
    return [a[1] for a in case.args if isinstance(a, tuple) and a[0] == "out"]


def run_gpu(case):
    import torch
    dev = "cuda"
    tens = {}
    for key, arr in case.arrays.items():
        t = torch.from_numpy(np.ascontiguousarray(arr)).to(dev)
        tens[key] = t.to(torch.bfloat16) if key in case.bf16 else t
    args = [tens[a[1]] if isinstance(a, tuple) else a for a in case.args]
    ct.launch(torch.cuda.current_stream(), case.grid, case.kernel, tuple(args))
    torch.cuda.synchronize()
    return {k: (tens[k].float() if k in case.bf16 else tens[k]).cpu().numpy() for k in _outputs(case)}


def run_sim(case, model="sm_90"):
    from spak import sim
    arrs = {}
    for key, arr in case.arrays.items():
        a = np.array(arr, copy=True)
        arrs[key] = sim.SimArray(a, ct.bfloat16) if key in case.bf16 else a
    args = [arrs[a[1]] if isinstance(a, tuple) else a for a in case.args]
    sim.launch(case.kernel, case.grid, args, model=model, check=False)
    return {k: (arrs[k].data if k in case.bf16 else arrs[k]) for k in _outputs(case)}


# ------------------------------------------------------------------------------ record

def record(out: Path, backend: str, seed: int, n_unary: int, extra: bool = False,
           shapes: bool = False, only: str | None = None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in build_cases(seed, n_unary, extra, shapes)
             if not only or only in c.name or only in c.family]
    store, meta = {}, {"seed": seed, "n_unary": n_unary, "backend": backend, "cases": {},
                       "extra": extra, "shapes": shapes,
                       "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "commit": os.environ.get("SPAK_COMMIT", "unknown")}
    if backend == "gpu":
        import torch
        meta["gpu"] = torch.cuda.get_device_name()
        meta["torch"] = torch.__version__
    try:
        from importlib.metadata import version
        meta["cuda_tile"] = version("cuda-tile")
    except Exception:          # a wheel installed with --target may carry no metadata
        meta["cuda_tile"] = getattr(ct, "__version__", "unknown")
    blobs: dict[int, str] = {}          # id(array) -> its key: shared inputs stored once
    for case in cases:
        t0 = time.perf_counter()
        try:
            got = run_gpu(case) if backend == "gpu" else run_sim(case)
            err = None
        except Exception as e:  # one failing case must not cost the whole run
            got, err = {}, f"{type(e).__name__}: {e}"
            traceback.print_exc(limit=2)
        refs = {}
        for key, arr in case.arrays.items():
            refs[key] = blobs.setdefault(id(arr), f"{case.name}|in|{key}")
            store.setdefault(refs[key], arr)
        for key, arr in got.items():
            store[f"{case.name}|out|{key}"] = arr
        meta["cases"][case.name] = {"family": case.family, "error": err, "inputs": refs,
                                    "seconds": round(time.perf_counter() - t0, 3)}
        print(f"{case.name:<34} {'ERROR ' + err if err else 'ok'} "
              f"({time.perf_counter() - t0:.2f} s)", flush=True)
    np.savez_compressed(out / NPZ, **store)
    (out / META).write_text(json.dumps(meta, indent=1))
    print(f"wrote {out / NPZ} ({(out / NPZ).stat().st_size / 1e6:.2f} MB) and {out / META}")
    return 0


# ------------------------------------------------------------------------------- check

def _bits(x):
    x = np.ascontiguousarray(x)
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize])


def compare(gpu, simv):
    """(elements, identical, max ulp distance among finite pairs, NaN-pattern-only diffs)."""
    g, s = np.ascontiguousarray(gpu).reshape(-1), np.ascontiguousarray(simv).reshape(-1)
    same = _bits(g) == _bits(s)
    nan_only = 0
    ulp = 0
    if g.dtype.kind == "f":
        both_nan = np.isnan(g) & np.isnan(s)
        nan_only = int((both_nan & ~same).sum())
        fin = np.isfinite(g) & np.isfinite(s) & ~same
        if fin.any():
            ulp = int(np.abs(_ordered(g[fin]) - _ordered(s[fin])).max())
    elif g.dtype.kind in "iu":
        ulp = int(np.abs(g.astype(np.int64) - s.astype(np.int64)).max()) if (~same).any() else 0
    return int(g.size), int(same.sum()), ulp, nan_only


def _ordered(v):
    """Floats -> integers in the same order, adjacent floats differing by 1."""
    b = _bits(v).astype(np.int64)
    top = 1 << (8 * v.itemsize - 1)
    return np.where(b >= top, top - b, b)


def load_recorded(d: Path):
    meta = json.loads((d / META).read_text())
    data = np.load(d / NPZ)
    cases = build_cases(meta["seed"], meta["n_unary"], meta.get("extra", False),
                        meta.get("shapes", False))
    # a recording may hold a subset of the cases (results/samples-h100-2026-11-24 keeps
    # only the --extra ones)
    cases = [c for c in cases if c.name in meta["cases"]]
    for case in cases:
        refs = meta["cases"][case.name]["inputs"]
        for key in case.arrays:
            # a recording kept with its outputs only (inputs_dropped: the seed rebuilds
            # them bit for bit, checked when it was slimmed) keeps the generated inputs
            if refs[key] in data:
                case.arrays[key] = data[refs[key]]
    gpu = {c.name: {k: data[f"{c.name}|out|{k}"] for k in _outputs(c)
                    if f"{c.name}|out|{k}" in data} for c in cases}
    return meta, cases, gpu


def measure(d: Path, model: str, only: str | None = None):
    """(meta, rows, families) of the model on DIR's recording: rows (family, case, outputs,
    bit-identical, max ulp, NaN-bits-only, note), families {family: [outputs, identical,
    max ulp]} (spak calibrate --check reads the latter)."""
    meta, cases, gpu = load_recorded(d)
    rows, fam = [], {}
    for case in cases:
        if only and only not in case.name and only not in case.family:
            continue
        err = meta["cases"].get(case.name, {}).get("error")
        if err:
            rows.append((case.family, case.name, None, None, None, None, "GPU: " + err))
            continue
        try:
            got = run_sim(case, model)
        except Exception as e:
            rows.append((case.family, case.name, None, None, None, None, f"sim: {type(e).__name__}: {e}"))
            continue
        n = same = ulp = nan_only = 0
        for key, g in gpu[case.name].items():
            a, b, u, z = compare(g, got[key])
            n, same, ulp, nan_only = n + a, same + b, max(ulp, u), nan_only + z
        rows.append((case.family, case.name, n, same, ulp, nan_only, ""))
        f = fam.setdefault(case.family, [0, 0, 0])
        f[0] += n
        f[1] += same
        f[2] = max(f[2], ulp)
    return meta, rows, fam


def check(d: Path, model: str, only: str | None) -> int:
    meta, rows, fam = measure(d, model, only)
    gpu_name = meta.get("gpu", meta["backend"])
    print(f"GPU outputs: {gpu_name}, recorded {meta['date']} (commit {meta['commit']}, "
          f"cuda-tile {meta.get('cuda_tile')}); simulator model {model}\n")
    print("| family | outputs | bit-identical |\n|---|---|---|")
    for name, (n, same, _) in fam.items():
        print(f"| {name} | {n} | {100 * same / n:.2f}% |")
    print("\n| case | family | outputs | bit-identical | max ulp (finite) | NaN bits only | note |")
    print("|---|---|---|---|---|---|---|")
    for family, name, n, same, ulp, nan_only, note in rows:
        pct = f"{100 * same / n:.2f}%" if n else "-"
        print(f"| {name} | {family} | {n if n is not None else '-'} | {pct} | "
              f"{ulp if ulp is not None else '-'} | {nan_only if nan_only is not None else '-'} | {note} |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--record", metavar="DIR", help="run the kernels and save inputs/outputs")
    g.add_argument("--check", metavar="DIR", help="run the simulator on DIR's inputs, compare")
    ap.add_argument("--backend", choices=("gpu", "sim"), default="gpu",
                    help="--record: cuTile on the GPU, or the simulator (a dry run)")
    ap.add_argument("--model", default="sm_90", help="--check: the simulator's numeric model")
    ap.add_argument("--only", default=None, help="cases or families containing this")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--n-unary", type=int, default=3072, help="inputs per unary op (multiple of 1024)")
    ap.add_argument("--extra", action="store_true",
                    help="--record: also half-precision sums and scans (issue 19 remainder)")
    ap.add_argument("--shapes", action="store_true",
                    help="--record: also the section 13-15 rules on other tile shapes "
                         "(with --only '(shapes)': those alone)")
    args = ap.parse_args(argv)
    if args.record:
        return record(Path(args.record), args.backend, args.seed, args.n_unary, args.extra,
                      args.shapes, args.only)
    return check(Path(args.check), args.model, args.only)


if __name__ == "__main__":
    raise SystemExit(main())
