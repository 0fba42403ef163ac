"""What the sm_90 compiler does to a kernel's arithmetic, as the simulator models it.

Read from the SASS of the fused kernel (docs/numerics-sm90.md, "compiler"): a float32
multiply whose only use is an add/sub becomes one FFMA; a row sum of an mma result runs
in the accumulator-fragment order. Each rule is checked against an exact reference here.
"""
from fractions import Fraction

import numpy as np
import pytest
import cuda.tile as ct

from spak import sim
from spak.sim.fma import fma_f32
from spak.sim.numerics import fragment_row_sum_f32, tree_sum_f32

ConstInt = ct.Constant[int]


def _exact_f32(a, b, c):
    """a*b + c rounded once to float32 (round to nearest even), from exact rationals."""
    ex = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    f = np.float32(float(ex))                         # within one float32 step of ex
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    return min(cands, key=lambda x: (abs(Fraction(float(x)) - ex),
                                     int(np.float32(x).view(np.uint32)) & 1))


def test_fma_f32_rounds_once():
    rng = np.random.default_rng(1)
    n = 3000
    a = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(np.float32)
    b = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(np.float32)
    # c close to -a*b: heavy cancellation, where one rounding and two differ most
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(n) * 1e-5)).astype(np.float32)
    r = fma_f32(a, b, c)
    want = np.array([_exact_f32(*t) for t in zip(a, b, c)], np.float32)
    assert (r.view(np.uint32) == want.view(np.uint32)).all()
    assert (r != a * b + c).mean() > 0.9           # the two-rounding result really differs


def test_fragment_row_sum_is_two_chains_per_lane_then_the_quad_butterfly():
    rng = np.random.default_rng(2)
    for n in (8, 64, 128):
        x = (rng.standard_normal((3, 5, n)) * np.exp2(rng.integers(-12, 12, (3, 5, n))))
        x = x.astype(np.float32)
        want = np.empty(x.shape[:-1], np.float32)
        for idx in np.ndindex(x.shape[:-1]):
            row = x[idx]
            lane = []
            for t in range(4):
                even, odd = np.float32(0), np.float32(0)
                for k in range(n // 8):
                    even = np.float32(even + row[8 * k + 2 * t])
                    odd = np.float32(odd + row[8 * k + 2 * t + 1])
                lane.append(np.float32(odd + even))
            want[idx] = np.float32(np.float32(lane[0] + lane[2]) + np.float32(lane[1] + lane[3]))
        got = fragment_row_sum_f32(x)
        assert (got.view(np.uint32) == want.view(np.uint32)).all()
        if n == 128:   # a different order than a loaded tile's: the layout matters
            assert (got != tree_sum_f32(x, 2)).any()


@ct.kernel
def _axpy_kinds(X, Y, C, O1, O2, O3, O4, O5, T: ConstInt):
    """Four ways a product meets an add; which of them the compiler fuses."""
    i = ct.bid(0)
    x = ct.load(X, (i,), (T,))
    y = ct.load(Y, (i,), (T,))
    c = ct.load(C, (i,), (T,))
    ct.store(O1, (i,), x * y + c)            # one use: FFMA
    p = x * y
    ct.store(O2, (i,), c - p)                # one use (named): FFMA with -x
    q = x * y
    m = ct.max(q, axis=0, keepdims=True)     # used before the add: two uses, no FFMA
    ct.store(O3, (i,), q - m)
    r = x * y
    ct.store(O4, (i,), r + c)                # fused first, then used again below:
    ct.store(O5, (i,), ct.where(r > 1e30, r, c))   # -> the launcher re-runs it unfused


def test_single_use_products_fuse_and_shared_ones_do_not():
    rng = np.random.default_rng(3)
    T = 64
    x, y = (rng.standard_normal(T).astype(np.float32) * 3 for _ in range(2))
    c = -(x * y) + rng.standard_normal(T).astype(np.float32) * 1e-3
    outs = [np.zeros(T, np.float32) for _ in range(5)]
    sim.launch(_axpy_kinds, (1,), (x, y, c, *outs, T), model="sm_90")
    fused, unfused = fma_f32(x, y, c), np.float32(x * y) + c
    assert (outs[0] == fused).all() and (outs[0] != unfused).any()
    assert (outs[1] == fma_f32(-x, y, c)).all()
    q = x * y
    assert (outs[2] == q - q.max()).all()
    assert (outs[3] == unfused).all()          # r has two uses: never fused
    # the declared v0 model rounds every op on its own
    outs_v0 = [np.zeros(T, np.float32) for _ in range(5)]
    sim.launch(_axpy_kinds, (1,), (x, y, c, *outs_v0, T), model="sm_90-v0")
    assert (outs_v0[0] == unfused).all()


@ct.kernel
def _mma_rowsum(A, B, O, L, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    a = ct.load(A, (0, 0), (TM, TK))
    b = ct.load(B, (0, 0), (TK, TN))
    s = ct.mma(a, b, ct.full((TM, TN), 0.0, dtype=ct.float32))
    p = ct.exp2(s * 0.5, flush_to_zero=True)       # elementwise: stays in the mma layout
    ct.store(L, (0, 0), ct.sum(p, axis=-1, keepdims=True))
    ct.store(O, (0, 0), p)


@pytest.mark.parametrize("TN", [64, 128])
def test_row_sum_of_an_mma_result_uses_the_fragment_order(TN):
    rng = np.random.default_rng(4)
    TM, TK = 64, 32
    a = rng.standard_normal((TM, TK)).astype(np.float16)
    b = rng.standard_normal((TK, TN)).astype(np.float16)
    o, l = np.zeros((TM, TN), np.float32), np.zeros((TM, 1), np.float32)
    sim.launch(_mma_rowsum, (1,), (a, b, o, l, TM, TN, TK), model="sm_90")
    assert (l[:, 0] == fragment_row_sum_f32(o)).all()
    assert (l[:, 0] != tree_sum_f32(o, 1)).any()
