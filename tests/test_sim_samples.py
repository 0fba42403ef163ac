"""Kernels in the style of NVIDIA's cutile-python samples (written here, not copied),
exercising the same ops the samples use, run through sim.launch and interpreter mode and
checked against float64 numpy: layer norm forward and backward (a CAS lock between
blocks), gather/scatter vector add with torch dtypes, a swizzled tf32 matmul, transpose,
an MoE-style row gather + mma + scatter, and a DFT built from extract/cat."""
import math

import numpy as np
import pytest
import torch
import cuda.tile as ct

from spak import sim

C = ct.Constant[int]
ZERO = ct.PaddingMode.ZERO


# ------------------------------------------------------------------------------ layer norm

@ct.kernel
def ln_forward(X, W, B, Y, MEAN, RSTD, eps, TN: C):
    r = ct.bid(0)
    n = X.shape[1]
    tiles = ct.num_tiles(X, axis=1, shape=(1, TN))
    acc = ct.zeros((1, TN), ct.float32)
    for j in range(tiles):
        acc += ct.load(X, (r, j), (1, TN), padding_mode=ZERO)
    mean = ct.sum(acc, axis=1) / n
    var = ct.zeros((1, TN), ct.float32)
    for j in range(tiles):
        x = ct.load(X, (r, j), (1, TN), padding_mode=ZERO)
        inside = j * TN + ct.arange(TN, dtype=ct.int32) < n
        var += ct.where(inside, x - mean, 0) ** 2
    rstd = 1 / ct.sqrt(ct.sum(var, axis=1) / n + eps)
    ct.store(MEAN, (r,), mean)
    ct.store(RSTD, (r,), rstd)
    for j in range(tiles):
        x = ct.load(X, (r, j), (1, TN), padding_mode=ZERO)
        y = (x - mean) * rstd * ct.load(W, (j,), (TN,), padding_mode=ZERO) \
            + ct.load(B, (j,), (TN,), padding_mode=ZERO)
        ct.store(Y, (r, j), y.astype(Y.dtype))


@ct.kernel
def ln_backward(DX, DY, DW, DB, X, W, MEAN, RSTD, LOCKS, TN: C):
    """dX per row; partial dW/dB summed into GROUP rows under a per-group CAS lock."""
    r = ct.bid(0)
    n = X.shape[1]
    g = r % DW.shape[0]
    mean, rstd = ct.load(MEAN, (r,), (1,)), ct.load(RSTD, (r,), (1,))
    tiles = ct.num_tiles(X, axis=1, shape=(1, TN))
    c1 = ct.zeros((1, TN), ct.float32)
    c2 = ct.zeros((1, TN), ct.float32)
    for j in range(tiles):
        inside = j * TN + ct.arange(TN, dtype=ct.int32) < n
        xhat = ct.where(inside, (ct.load(X, (r, j), (1, TN), padding_mode=ZERO) - mean) * rstd, 0)
        wdy = ct.where(inside, ct.load(W, (j,), (TN,), padding_mode=ZERO)
                       * ct.load(DY, (r, j), (1, TN), padding_mode=ZERO), 0)
        c1 += xhat * wdy
        c2 += wdy
    c1, c2 = ct.sum(c1, axis=1) / n, ct.sum(c2, axis=1) / n
    for j in range(tiles):
        dy = ct.load(DY, (r, j), (1, TN), padding_mode=ZERO)
        xhat = (ct.load(X, (r, j), (1, TN), padding_mode=ZERO) - mean) * rstd
        wdy = ct.load(W, (j,), (TN,), padding_mode=ZERO) * dy
        ct.store(DX, (r, j), ((wdy - (xhat * c1 + c2)) * rstd).astype(DX.dtype))
        while ct.atomic_cas(LOCKS, g, 0, 1, memory_order=ct.MemoryOrder.ACQUIRE) == 1:
            pass
        dw = dy * xhat + ct.load(DW, (g, j), (1, TN), padding_mode=ZERO)
        db = dy + ct.load(DB, (g, j), (1, TN), padding_mode=ZERO)
        ct.store(DW, (g, j), dw)
        ct.store(DB, (g, j), db)
        ct.atomic_xchg(LOCKS, g, 0, memory_order=ct.MemoryOrder.RELEASE)


def _ln_reference(x, w, dy, eps):
    x = x.astype(np.float64)
    mean = x.mean(1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    wdy = w * dy
    dx = (wdy - (xhat * (xhat * wdy).mean(1, keepdims=True) + wdy.mean(1, keepdims=True))) * rstd
    return xhat * w, mean[:, 0], rstd[:, 0], dx, (dy * xhat).sum(0), dy.sum(0)


def test_layer_norm_forward_and_backward_with_a_lock(rng):
    m, n, groups, eps = 24, 200, 4, 1e-5
    x = (rng.standard_normal((m, n)) * 0.7 - 2.0).astype(np.float32)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dy = (0.1 * rng.standard_normal((m, n))).astype(np.float32)
    y, mean, rstd = np.zeros_like(x), np.zeros(m, np.float32), np.zeros(m, np.float32)
    sim.launch(ln_forward, (m,), (x, w, b, y, mean, rstd, eps, 128))
    xw, ref_mean, ref_rstd, ref_dx, ref_dw, ref_db = _ln_reference(x, w, dy, eps)
    np.testing.assert_allclose(y, xw + b, rtol=0, atol=2e-5)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=2e-6)

    def backward():
        dx = np.zeros_like(x)
        dw, db = np.zeros((groups, n), np.float32), np.zeros((groups, n), np.float32)
        args = (dx, dy, dw, db, x, w, mean, rstd, np.zeros(groups, np.int32), 128)
        return args, sim.launch(ln_backward, (m,), args, resident=8)

    (dx, _, dw, db, *_), rep = backward()
    assert rep.mode == "cooperative" and rep.clean
    np.testing.assert_allclose(dx, ref_dx, rtol=0, atol=2e-5)
    np.testing.assert_allclose(dw.sum(0), ref_dw, rtol=0, atol=2e-5)
    np.testing.assert_allclose(db.sum(0), ref_db, rtol=0, atol=2e-5)
    (dx2, _, dw2, *_), _ = backward()
    np.testing.assert_array_equal(dw2, dw)         # the default order repeats bit for bit
    races = sim.find_races(ln_backward, (m,), backward()[0], orders=2, seed=5, resident=8)
    assert races.races == []                       # the lock orders every dW/dB update


# ------------------------------------------------------------------------ gather vector add

@ct.kernel
def vadd_gather(A, B, OUT, T: C):
    i = ct.bid(0) * T + ct.arange(T, dtype=torch.int32)
    ct.scatter(OUT, i, ct.gather(A, i) + ct.gather(B, i))


def test_gather_vector_add_with_torch_dtype_on_a_ragged_length(rng):
    n = 1001
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    sim.launch(vadd_gather, (math.ceil(n / 256),), (a, b, out, 256))
    np.testing.assert_array_equal(out, a + b)


# ------------------------------------------------------------------- matmul, transpose

def _swizzle(bid, m, n, tm, tn, group):
    nbm, nbn = ct.cdiv(m, tm), ct.cdiv(n, tn)
    first = bid // (group * nbn) * group
    size = min(nbm - first, group)
    return first + bid % size, (bid % (group * nbn)) // size


@ct.kernel
def matmul_swizzled(A, B, OUT, TM: C, TN: C, TK: C):
    bm, bn = _swizzle(ct.bid(0), A.shape[0], B.shape[1], TM, TN, 2)
    acc = ct.zeros((TM, TN), ct.float32)
    dt = ct.tfloat32 if A.dtype == ct.float32 else A.dtype
    for k in range(ct.num_tiles(A, axis=1, shape=(TM, TK))):
        a = ct.load(A, (bm, k), (TM, TK), padding_mode=ZERO).astype(dt)
        b = ct.load(B, (k, bn), (TK, TN), padding_mode=ZERO).astype(dt)
        acc = ct.mma(a, b, acc)
    ct.store(OUT, (bm, bn), acc.astype(OUT.dtype))


@pytest.mark.parametrize("dtype,atol", [(np.float16, 3e-2), (np.float32, 2e-2)])
def test_swizzled_matmul(rng, dtype, atol):
    m, k, n = 96, 80, 64
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    sim.launch(matmul_swizzled, (math.ceil(m / 32) * math.ceil(n / 32),), (a, b, out, 32, 32, 32))
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=0, atol=atol)


@ct.kernel
def transpose(X, Y, TM: C, TN: C):
    ct.store(Y, (ct.bid(1), ct.bid(0)), ct.transpose(ct.load(X, (ct.bid(0), ct.bid(1)), (TM, TN))))


def test_transpose(rng):
    x = rng.standard_normal((64, 96)).astype(np.float32)
    y = np.zeros((96, 64), np.float32)
    sim.launch(transpose, (2, 3), (x, y, 32, 32))
    np.testing.assert_array_equal(y, x.T)


# ------------------------------------------------------------------------------------ MoE

@ct.kernel
def moe_rows(A, W, OUT, ROWS, EXPERT, TM: C, TN: C, TK: C):
    """Rows ROWS[bid*TM:...] of A times expert EXPERT[bid]'s weights, scattered back."""
    rows = ct.gather(ROWS, ct.bid(0) * TM + ct.arange(TM, dtype=ct.int32))
    e = ct.load(EXPERT, (ct.bid(0),), ())
    acc = ct.zeros((TM, TN), ct.float32)
    for k in range(ct.cdiv(A.shape[1], TK)):
        cols = k * TK + ct.arange(TK, dtype=ct.int32)
        a = ct.gather(A, (rows[:, None], cols[None, :]))        # row -1: padding 0
        w = ct.load(W, (e, k, 0), (1, TK, TN), padding_mode=ZERO).reshape((TK, TN))
        acc = ct.mma(a, w, acc)
    ct.scatter(OUT, (rows[:, None], ct.arange(TN, dtype=ct.int32)[None, :]), acc.astype(OUT.dtype))


def test_moe_style_row_gather_mma_scatter(rng):
    tokens, k, n, experts, tm = 20, 64, 32, 3, 8
    a = rng.standard_normal((tokens, k)).astype(np.float16)
    w = rng.standard_normal((experts, k, n)).astype(np.float16)
    assign = rng.integers(0, experts, tokens)
    rows, expert = [], []
    for e in range(experts):                       # each expert's tokens, padded to tm with -1
        mine = list(np.flatnonzero(assign == e))
        mine += [-1] * (-len(mine) % tm)
        rows += mine
        expert += [e] * (len(mine) // tm)
    rows, expert = np.array(rows, np.int32), np.array(expert, np.int32)
    out = np.full((tokens, n), np.nan, np.float16)
    sim.launch(moe_rows, (len(expert),), (a, w, out, rows, expert, tm, n, 32))
    ref = np.einsum("tk,tkn->tn", a.astype(np.float64), w[assign].astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=0, atol=3e-2)


# ------------------------------------------------------------------------------------- DFT

@ct.kernel
def dft(XRI, WRI, YRI, N: C):
    """Y = W X on interleaved (re, im) pairs, split with extract and joined with cat."""
    x = ct.load(XRI, (ct.bid(0), 0, 0), (1, N, 2)).reshape((N, 2))
    w = ct.load(WRI, (0, 0, 0), (N, N, 2))
    xr, xi = ct.extract(x, (0, 0), (N, 1)), ct.extract(x, (0, 1), (N, 1))
    wr = ct.extract(w, (0, 0, 0), (N, N, 1)).reshape((N, N))
    wi = ct.extract(w, (0, 0, 1), (N, N, 1)).reshape((N, N))
    yr = ct.matmul(wr, xr) - ct.matmul(wi, xi)
    yi = ct.matmul(wi, xr) + ct.matmul(wr, xi)
    ct.store(YRI, (ct.bid(0), 0, 0), ct.cat((yr, yi), axis=-1).reshape((1, N, 2)))


def test_dft_from_extract_and_cat(rng):
    bs, n = 3, 16
    xc = rng.standard_normal((bs, n)) + 1j * rng.standard_normal((bs, n))
    wc = np.exp(-2j * np.pi * np.outer(np.arange(n), np.arange(n)) / n)
    xri = np.ascontiguousarray(np.stack([xc.real, xc.imag], -1).astype(np.float32))
    wri = np.ascontiguousarray(np.stack([wc.real, wc.imag], -1).astype(np.float32))
    yri = np.zeros_like(xri)
    sim.launch(dft, (bs,), (xri, wri, yri, n))
    got = yri[..., 0] + 1j * yri[..., 1]
    assert np.abs(got - np.fft.fft(xc, axis=-1)).max() < 1e-4


# ------------------------------------------------------------------------ interpreter mode

def test_interpreter_mode_runs_ct_launch_on_cpu_tensors(rng):
    a = torch.from_numpy(rng.standard_normal(300).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(300).astype(np.float32))
    out = torch.empty_like(a)
    x = torch.from_numpy(rng.standard_normal((8, 64)).astype(np.float32)).to(torch.bfloat16)
    y = torch.zeros(64, 8, dtype=torch.bfloat16)
    sim.enable()
    try:
        assert sim.is_enabled()
        ct.launch(None, (2,), vadd_gather, (a, b, out, 256))
        ct.launch(None, (1, 2), transpose, (x, y, 8, 32))
        with pytest.raises(TypeError, match="kernel_args must be a tuple"):
            ct.launch(None, (1,), vadd_gather, a)
    finally:
        sim.disable()
    assert not sim.is_enabled() and ct.launch is not sim.interpret.launch
    assert torch.equal(out, a + b)
    assert torch.equal(y, x.T)                     # bf16 written back to the tensor


@ct.kernel
def halves_product(A, B, OUT, TN: C):
    r = ct.bid(0)
    ct.store(OUT, (r, 0), ct.load(A, (r, 0), (1, TN)) * ct.load(B, (r, 0), (1, TN)))


def test_interpreter_mode_takes_strided_views_and_gpu_style_host_code(rng):
    ab = torch.from_numpy(rng.standard_normal((6, 64)).astype(np.float32))
    a, b = ab.chunk(2, dim=-1)                     # strided views of one buffer
    out = torch.zeros(6, 32)
    sim.enable()
    try:
        # host code written for the GPU: passes torch.cuda.current_stream() (None here)
        ct.launch(torch.cuda.current_stream(), (6,), halves_product, (a, b, out, 32))
    finally:
        sim.disable()
    assert torch.equal(out, a * b)
    if not torch.cuda.is_available():
        with pytest.raises((AssertionError, RuntimeError)):
            torch.cuda.current_stream()            # restored after disable()


def test_interpreter_mode_autotuner_picks_the_first_config_that_runs(rng):
    x = torch.from_numpy(rng.standard_normal((64, 96)).astype(np.float32))
    y = torch.zeros(96, 64)
    space = [(24, 32), (16, 32), (32, 32)]           # 24 is not a power of two: fails
    sim.enable()
    try:
        res = ct.tune.exhaustive_search(space, torch.cuda.current_stream(),
                                        lambda c: (64 // c[0], 96 // c[1]), transpose,
                                        lambda c: (x, y, *c), quiet=True)
        assert torch.cuda.get_device_capability() == (9, 0) or torch.cuda.is_available()
    finally:
        sim.disable()
    assert res.best.config == (16, 32) and len(res.failures) == 1
    assert torch.equal(y, x.T)
