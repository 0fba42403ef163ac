"""Two sm_90 rules from the H100 recording of NVIDIA's programs (issue 19,
results/samples-h100-2026-11-24, docs/numerics-sm90.md section 14), replayed by kernels
written here with the op sequences of those programs, on the inputs and against the
outputs they had on the H100 (kernels_extract2.npz):

* fp32 ct.matmul is FMUL + FADD chains on the CUDA cores (k ascending from +0, then the
  accumulator added): the FFT sample, 35.16% -> 100%;
* an add whose left operand is a multiply that cannot be fused stays an FADD even when its
  right operand is a single-use product: TileGym's recurrent gated delta rule
  (State * e + K * D), 51.16% -> 100%;
* a loaded fp16/bf16 tile converted to float32 keeps the 2-byte load's layout for ct.sum:
  TileGym's FMHA backward preprocess row sums, 41.41% -> 100%.
Each test also shows the previous rule disagreeing, so it can fail."""
from pathlib import Path

import numpy as np
import pytest

import cuda.tile as ct
from spak import sim
from spak.sim.numerics import Sm90

EXTRACT = Path(__file__).resolve().parents[1] / "results" / "samples-h100-2026-11-24" / \
    "kernels_extract2.npz"
C = ct.Constant[int]


class _Sm90Before(Sm90):
    """sm_90 with this change's two rules switched off (what the simulator did before)."""
    mma_f32_chain = None
    fma_left_mul_first = False


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint32)


@pytest.fixture(scope="module")
def rec():
    return dict(np.load(EXTRACT))


# --- the delta rule: State * e, an axis-0 sum of State * k, then State + k * d --------------

@ct.kernel
def _delta_rule(O, S_out, Q, K, V, G, Bt, S0, T: C, D: C):
    s = ct.load(S0, (0, 0), (D, D))
    for t in range(T):
        q = ct.load(Q, (t, 0), (1, D)).reshape((D, 1)) * 0.125
        k = ct.load(K, (t, 0), (1, D)).reshape((D, 1))
        v = ct.load(V, (t, 0), (1, D)).reshape((D,))
        s = s * ct.exp(ct.gather(G, (t,)))          # a product used twice: never fused
        d = (v - ct.sum(s * k, axis=0)) * ct.gather(Bt, (t,))
        s = s + k * ct.expand_dims(d, axis=0)      # no FFMA on sm_90: its left is s * e
        ct.store(O, (t, 0), ct.sum(s * q, axis=0).reshape((1, D)))
    ct.store(S_out, (0, 0), s)


def _delta(rec, model):
    o, s = np.zeros_like(rec["gdr_o"]), np.zeros_like(rec["gdr_state"])
    sim.launch(_delta_rule, (1,), (o, s, rec["gdr_q"], rec["gdr_k"], rec["gdr_v"], rec["gdr_g"],
                                   rec["gdr_beta"], rec["gdr_s0"], 16, 64), model=model)
    return o, s


def test_delta_rule_matches_the_h100(rec):
    o, s = _delta(rec, "sm_90")
    assert (_bits(o) == _bits(rec["gdr_o"])).all()
    assert (_bits(s) == _bits(rec["gdr_state"])).all()
    o0, _ = _delta(rec, _Sm90Before())
    assert (_bits(o0) != _bits(rec["gdr_o"])).mean() > 0.2


# --- the FFT sample's op sequence (N = 64 = 4 x 4 x 4, batch 1): complex fp32 matmuls -------

def _ri(t, n, shape):
    """real and imaginary planes of a loaded tile of n interleaved (re, im) pairs, each
    reshaped to `shape`."""
    t = t.reshape((n, 2))
    return (ct.extract(t, (0, 0), (n, 1)).reshape(shape),
            ct.extract(t, (0, 1), (n, 1)).reshape(shape))


@ct.kernel
def _fft64(Y, X, W0, W1, W2, T0, T1):
    xr, xi = _ri(ct.load(X, (0, 0, 0), (1, 2, 64)), 64, (4, 16))
    w0r, w0i = _ri(ct.load(W0, (0, 0, 0), (4, 4, 2)), 16, (4, 4))
    w1r, w1i = _ri(ct.load(W1, (0, 0, 0), (4, 4, 2)), 16, (4, 4))
    w2r, w2i = _ri(ct.load(W2, (0, 0, 0), (4, 4, 2)), 16, (4, 4))
    t0r, t0i = _ri(ct.load(T0, (0, 0, 0), (4, 16, 2)), 64, (64, 1))
    t1r, t1i = _ri(ct.load(T1, (0, 0, 0), (4, 4, 2)), 16, (16, 1))
    # stage 0 over the first factor, twiddles, then the factors rotate (a, b, c) -> (b, c, a)
    yr = (ct.matmul(w0r, xr) - ct.matmul(w0i, xi)).reshape((64, 1))
    yi = (ct.matmul(w0i, xr) + ct.matmul(w0r, xi)).reshape((64, 1))
    xr = ct.permute((t0r * yr - t0i * yi).reshape((4, 4, 4)), (1, 2, 0)).reshape((4, 16))
    xi = ct.permute((t0i * yr + t0r * yi).reshape((4, 4, 4)), (1, 2, 0)).reshape((4, 16))
    yr = (ct.matmul(w1r, xr) - ct.matmul(w1i, xi)).reshape((16, 4))
    yi = (ct.matmul(w1i, xr) + ct.matmul(w1r, xi)).reshape((16, 4))
    xr = ct.permute((t1r * yr - t1i * yi).reshape((4, 4, 4)), (1, 2, 0)).reshape((4, 16))
    xi = ct.permute((t1i * yr + t1r * yi).reshape((4, 4, 4)), (1, 2, 0)).reshape((4, 16))
    yr = ct.permute((ct.matmul(w2r, xr) - ct.matmul(w2i, xi)).reshape((4, 4, 4)), (0, 2, 1))
    yi = ct.permute((ct.matmul(w2i, xr) + ct.matmul(w2r, xi)).reshape((4, 4, 4)), (0, 2, 1))
    out = ct.cat((yr.reshape((64, 1)), yi.reshape((64, 1))), axis=-1)
    ct.store(Y, (0, 0, 0), out.reshape((1, 2, 64)))


def _fft(rec, model):
    y = np.zeros_like(rec["fft_x"])
    sim.launch(_fft64, (1,), (y, rec["fft_x"], rec["fft_w0"], rec["fft_w1"], rec["fft_w2"],
                              rec["fft_t0"], rec["fft_t1"]), model=model)
    return y


def test_fft_sample_matches_the_h100(rec):
    y = _fft(rec, "sm_90")
    assert (_bits(y) == _bits(rec["fft_y"])).all()
    # and it is the DFT (float64 reference from the same input)
    x = rec["fft_x"].reshape(64, 2).astype(np.float64)
    ref = np.fft.fft(x[:, 0] + 1j * x[:, 1])
    got = y.reshape(64, 2)
    np.testing.assert_allclose(got[:, 0] + 1j * got[:, 1], ref, rtol=0, atol=2e-5 * np.abs(ref).max())
    assert (_bits(_fft(rec, _Sm90Before())) != _bits(rec["fft_y"])).mean() > 0.3


# --- the chain itself on fresh inputs ----------------------------------------------------------

@ct.kernel
def _mm(A, B, Cc, O, M: C, K: C, N: C):
    a, b = ct.load(A, (0, 0), (M, K)), ct.load(B, (0, 0), (K, N))
    ct.store(O, (0, 0), ct.mma(a, b, ct.load(Cc, (0, 0), (M, N))))


def test_f32_mma_is_a_k_ascending_chain_then_the_accumulator():
    rng = np.random.default_rng(19)
    m, k, n = 8, 32, 16
    a, b = (rng.standard_normal(s).astype(np.float32) * 3 for s in ((m, k), (k, n)))
    c = rng.standard_normal((m, n)).astype(np.float32)
    o = np.zeros((m, n), np.float32)
    sim.launch(_mm, (1,), (a, b, c, o, m, k, n))
    s = np.zeros((m, n), np.float32)
    for i in range(k):
        s = s + a[:, i:i + 1] * b[i:i + 1, :]           # float32: each product, each add rounded
    assert (_bits(o) == _bits(c + s)).all()
    ref = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(o, ref, rtol=0, atol=1e-4)
    exact = np.float32(ref)
    assert (_bits(o) != _bits(exact)).any()             # not one rounding of the exact sum


# --- a converted fp16 load keeps the fp16 load's layout: TileGym's FMHA backward preprocess ---

@ct.kernel
def _row_dots(Dl, O, dO, TM: C, TD: C):
    o = ct.load(O, (ct.bid(0), 0), (TM, TD)).astype(ct.float32)
    do = ct.load(dO, (ct.bid(0), 0), (TM, TD)).astype(ct.float32)
    ct.store(Dl, (ct.bid(0),), ct.sum(o * do, axis=-1))


def test_row_sums_of_converted_fp16_loads_match_the_h100(rec):
    """rows of 32x64 fp16 tiles: 8 neighbours a thread as loaded, not fp32's 4 (41% before)"""
    d = np.zeros(64, np.float32)
    sim.launch(_row_dots, (2,), (d, rec["pre_o"], rec["pre_do"], 32, 64))
    assert (_bits(d) == _bits(rec["pre_delta"])).all()
    ref = (rec["pre_o"].astype(np.float64) * rec["pre_do"].astype(np.float64)).sum(-1)
    np.testing.assert_allclose(d, ref, rtol=0, atol=1e-5)
    o32, do32 = rec["pre_o"].astype(np.float32), rec["pre_do"].astype(np.float32)
    d0 = np.zeros(64, np.float32)         # the same values loaded as fp32: the 4-wide order
    sim.launch(_row_dots, (2,), (d0, o32, do32, 32, 64))
    assert (_bits(d0) != _bits(rec["pre_delta"])).mean() > 0.3
