"""Tile-only ops added for issue 19, against numpy / exact references on random inputs."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import cuda.tile as ct

from spak import sim
from spak.sim.numerics import hopper_mma_f32

C = ct.Constant[int]
RM = ct.RoundingMode


@ct.kernel
def extract_insert(X, Y, Z, M: C, N: C):
    x = ct.load(X, (0, 0), (M, N))
    sub = ct.extract(x, (1, 0), shape=(M // 2, N // 4))
    ct.store(Y, (0, 0), sub)
    z = x.insert((0, 3), sub * 2)                 # the Tile method form
    ct.store(Z, (0, 0), z)


def test_extract_and_insert_match_numpy_slicing(rng):
    x = rng.integers(-1000, 1000, (8, 16)).astype(np.int32)
    y, z = np.zeros((4, 4), np.int32), np.zeros_like(x)
    sim.launch(extract_insert, (1,), (x, y, z, 8, 16))
    np.testing.assert_array_equal(y, x[4:8, 0:4])
    ref = x.copy()
    ref[0:4, 12:16] = x[4:8, 0:4] * 2
    np.testing.assert_array_equal(z, ref)


@ct.kernel
def atan2_divmod(A, B, Q, R, T, I, J, N: C):
    a, b = ct.load(A, (0,), (N,)), ct.load(B, (0,), (N,))
    ct.store(T, (0,), ct.atan2(a, b))
    i, j = ct.load(I, (0,), (N,)), ct.load(J, (0,), (N,))
    q, r = divmod(i, j)                            # the builtin, through Tile.__divmod__
    q2, r2 = ct.divmod(i, j)
    ct.store(Q, (0,), q + (q2 - q))
    ct.store(R, (0,), r + (r2 - r))


def test_atan2_and_integer_divmod(rng):
    n = 64
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    b[:4] = 0
    i = rng.integers(-50, 50, n).astype(np.int32)
    j = rng.integers(1, 9, n).astype(np.int32) * rng.choice([-1, 1], n).astype(np.int32)
    t, q, r = np.zeros(n, np.float32), np.zeros(n, np.int32), np.zeros(n, np.int32)
    sim.launch(atan2_divmod, (1,), (a, b, q, r, t, i, j, n))
    np.testing.assert_array_equal(t, np.arctan2(a.astype(np.float64), b).astype(np.float32))
    np.testing.assert_array_equal(q, i // j)       # floor semantics, like Python
    np.testing.assert_array_equal(r, i % j)


@ct.kernel
def bytes_roundtrip(X, B, Y, N: C):
    x = ct.load(X, (0,), (N,))
    b = ct.pack_to_bytes(x)
    ct.store(B, (0,), b)
    ct.store(Y, (0,), ct.unpack_from_bytes(b, ct.float16))


def test_pack_and_unpack_bytes_are_little_endian_views(rng):
    x = rng.integers(-2**31, 2**31 - 1, 8).astype(np.int32)
    b, y = np.zeros(32, np.uint8), np.zeros(16, np.float16)
    sim.launch(bytes_roundtrip, (1,), (x, b, y, 8))
    np.testing.assert_array_equal(b, x.view(np.uint8))
    np.testing.assert_array_equal(y.view(np.uint16), x.view(np.uint16))


@ct.kernel
def scans(X, F, S, SR, P, MX, N: C):
    x = ct.load(X, (0, 0), (4, N))
    ct.store(S, (0, 0), ct.cumsum(x, axis=1))
    ct.store(SR, (0, 0), ct.cumsum(x, axis=0, reverse=True))
    ct.store(P, (0, 0), ct.cumprod(x % 3 + 1, axis=1))
    ct.store(MX, (0, 0), ct.scan(x, 1, lambda a, b: ct.maximum(a, b), -2**31))
    f = ct.astype(x, ct.float32) * 0.37
    ct.store(F, (0, 0), ct.cumsum(f, axis=1))


def test_cumsum_cumprod_and_custom_scan(rng):
    n = 16
    x = rng.integers(-20, 20, (4, n)).astype(np.int32)
    outs = [np.zeros((4, n), np.float32)] + [np.zeros_like(x) for _ in range(4)]
    sim.launch(scans, (1,), (x, *outs, n))
    f, s, sr, p, mx = outs
    np.testing.assert_array_equal(s, np.cumsum(x, axis=1))
    np.testing.assert_array_equal(sr, np.flip(np.cumsum(np.flip(x, 0), axis=0), 0))
    np.testing.assert_array_equal(p, np.cumprod(x % 3 + 1, axis=1).astype(np.int32))
    np.testing.assert_array_equal(mx, np.maximum.accumulate(x, axis=1))
    # float32 cumsum, sm_90 (the default model): the SASS scans a 4x16 row in chunks of 8
    # lanes (SHFL.UP 4, 8, 16): Hillis-Steele inside a chunk, the second chunk then adds
    # the first's total (docs/numerics-sm90.md section 12)
    v = x.astype(np.float32) * np.float32(0.37)

    def hillis_steele(c):
        for d in (1, 2, 4):
            c = np.concatenate([c[:, :d], c[:, d:] + c[:, :-d]], axis=1)
        return c
    lo, hi = hillis_steele(v[:, :8]), hillis_steele(v[:, 8:])
    np.testing.assert_array_equal(f, np.concatenate([lo, hi + lo[:, -1:]], axis=1))
    # the ieee model: one rounding per step, left to right (numpy's cumsum does the same)
    sim.launch(scans, (1,), (x, *outs, n), model="ieee")
    np.testing.assert_array_equal(outs[0], np.cumsum(v, axis=1))


@ct.kernel
def reductions(X, S, AM, N: C):
    x = ct.load(X, (0, 0), (4, N))
    ct.store(S, (0,), ct.reduce(x, 1, lambda a, b: a + b, 0))
    idx = ct.broadcast_to(ct.arange(N, dtype=ct.int32)[None, :], (4, N))

    def pick(v1, i1, v2, i2):
        take2 = (v2 > v1) | ((v2 == v1) & (i2 < i1))
        return ct.where(take2, v2, v1), ct.where(take2, i2, i1)
    _, am = ct.reduce((x, idx), 1, pick, (-2**31, 0))
    ct.store(AM, (0,), am)


def test_custom_reduce_single_and_tuple(rng):
    n = 32
    x = rng.integers(-9, 9, (4, n)).astype(np.int32)
    s, am = np.zeros(4, np.int32), np.zeros(4, np.int32)
    sim.launch(reductions, (1,), (x, s, am, n))
    np.testing.assert_array_equal(s, x.sum(1))
    np.testing.assert_array_equal(am, x.argmax(1))


# ---------------------------------------------------------------------------- rounding modes

@ct.kernel
def rounded(A, B, OUT, N: C, OP: C, MODE: C):
    a, b = ct.load(A, (0,), (N,)), ct.load(B, (0,), (N,))
    mode = (RM.RN, RM.RZ, RM.RM, RM.RP)[MODE]
    if OP == 0:
        r = ct.add(a, b, rounding_mode=mode)
    elif OP == 1:
        r = ct.mul(a, b, rounding_mode=mode)
    elif OP == 2:
        r = ct.truediv(a, b, rounding_mode=mode)
    else:
        r = ct.sqrt(ct.abs(a), rounding_mode=mode)
    ct.store(OUT, (0,), r)


def _directed(exact: Fraction, mode: int) -> np.float32:
    """float32 rounding of an exact rational, by bracketing (an independent reference)."""
    r = np.float32(float(exact))                   # within one ulp of exact
    lo = r if Fraction(float(r)) <= exact else np.nextafter(r, np.float32(-np.inf))
    hi = lo if Fraction(float(lo)) == exact else np.nextafter(lo, np.float32(np.inf))
    if lo == hi:
        return lo
    return {1: lo if exact > 0 else hi, 2: lo, 3: hi}[mode]


@pytest.mark.parametrize("op", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", [1, 2, 3])
def test_directed_rounding_is_exact(rng, op, mode):
    n = 64
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    out = np.zeros(n, np.float32)
    sim.launch(rounded, (1,), (a, b, out, n, op, mode))
    for k in range(n):
        fa, fb = Fraction(float(a[k])), Fraction(float(b[k]))
        if op == 3:
            # sqrt: the answer r is the float32 with r <= sqrt(|a|) < next(r) (RM/RZ) etc.
            x = abs(fa)
            r = out[k]
            below, above = Fraction(float(r)) ** 2 <= x, Fraction(float(np.nextafter(r, np.float32(np.inf)))) ** 2 > x
            if mode in (1, 2):
                assert below and above, (a[k], r)
            else:
                prev = np.nextafter(r, np.float32(-np.inf))
                assert Fraction(float(r)) ** 2 >= x > Fraction(float(prev)) ** 2, (a[k], r)
            continue
        exact = {0: fa + fb, 1: fa * fb, 2: fa / fb}[op]
        assert out[k] == _directed(exact, mode), (op, mode, a[k], b[k], out[k])


@ct.kernel
def ftz_ops(A, B, OUT, N: C):
    a, b = ct.load(A, (0,), (N,)), ct.load(B, (0,), (N,))
    ct.store(OUT, (0, 0), ct.reshape(ct.add(a, b, flush_to_zero=True), (1, N)))
    ct.store(OUT, (1, 0), ct.reshape(ct.mul(a, b, flush_to_zero=True), (1, N)))
    ct.store(OUT, (2, 0), ct.reshape(ct.maximum(a, b, flush_to_zero=True), (1, N)))


def test_flush_to_zero_flushes_subnormal_inputs_and_results(rng):
    n = 16
    tiny = np.float32(2.0 ** -130)                 # subnormal
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    a[:4], b[:4] = tiny, 0.0                       # subnormal inputs: flushed
    a[4:8], b[4:8] = np.float32(2.0 ** -70), np.float32(2.0 ** -60)   # product subnormal
    out = np.full((3, n), np.nan, np.float32)
    sim.launch(ftz_ops, (1,), (a, b, out, n))
    assert (out[:, :4] == 0).all()
    assert (out[1, 4:8] == 0).all()
    np.testing.assert_array_equal(out[0, 8:], a[8:] + b[8:])
    np.testing.assert_array_equal(out[1, 8:], a[8:] * b[8:])


@ct.kernel
def convert_rz(X, H, N: C):
    ct.store(H, (0,), ct.astype(ct.load(X, (0,), (N,)), ct.float16, rounding_mode=RM.RZ))


def test_astype_round_toward_zero(rng):
    x = rng.standard_normal(64).astype(np.float32) * 100
    h = np.zeros(64, np.float16)
    sim.launch(convert_rz, (1,), (x, h, 64))
    rn = x.astype(np.float16)
    ref = np.where(np.abs(rn.astype(np.float32)) > np.abs(x),
                   np.nextafter(rn, np.float16(0)), rn)
    np.testing.assert_array_equal(h, ref)


# ---------------------------------------------------------------------------- dtypes and mma

@ct.kernel
def torch_dtypes(Y, Z, N: C):
    i = ct.arange(N, dtype=torch.int32)            # as NVIDIA's gather sample writes it
    ct.store(Y, (0,), i * 3)
    ct.store(Z, (0,), ct.full((N,), 1.5, dtype=torch.float16))


def test_torch_dtype_objects_are_cutile_dtypes():
    y, z = np.zeros(8, np.int32), np.zeros(8, np.float16)
    sim.launch(torch_dtypes, (1,), (y, z, 8))
    np.testing.assert_array_equal(y, np.arange(8) * 3)
    assert (z == 1.5).all()


@ct.kernel
def tf32_int8(A, B, C32, I, J, K32, M: C, KD: C, N: C):
    a = ct.load(A, (0, 0), (M, KD)).astype(ct.tfloat32)
    b = ct.load(B, (0, 0), (KD, N)).astype(ct.tfloat32)
    ct.store(C32, (0, 0), ct.mma(a, b, ct.zeros((M, N), ct.float32)))
    i, j = ct.load(I, (0, 0), (M, KD)), ct.load(J, (0, 0), (KD, N))
    ct.store(K32, (0, 0), ct.mma(i, j, ct.full((M, N), 7, ct.int32)))


def _tf32(x):
    b = x.view(np.uint32).astype(np.uint64)
    return (((b + 0xFFF + ((b >> 13) & 1)) >> 13) << 13).astype(np.uint32).view(np.float32)


def test_tf32_and_int8_mma(rng):
    m, k, n = 16, 32, 16
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    i, j = rng.integers(-128, 127, (m, k)).astype(np.int8), rng.integers(-128, 127, (k, n)).astype(np.int8)
    c, kk = np.zeros((m, n), np.float32), np.zeros((m, n), np.int32)
    sim.launch(tf32_int8, (1,), (a, b, c, i, j, kk, m, k, n), model="sm_90-v0")
    ref = (_tf32(a).astype(np.float64) @ _tf32(b).astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(c, ref)          # v0: exact products, one rounding
    assert not np.array_equal(_tf32(a), a)         # the inputs really were rounded
    # sm_90: Hopper's tf32 fused sum in k8 steps (measured on an H100, tools/sim_ops_gpu.py)
    c90 = np.zeros((m, n), np.float32)
    sim.launch(tf32_int8, (1,), (a, b, c90, i, j, kk.copy(), m, k, n))
    want = hopper_mma_f32(_tf32(a)[None].astype(np.float64), _tf32(b)[None],
                          np.zeros((1, m, n), np.float32), ct.tfloat32, 8, 25, -133)[0]
    np.testing.assert_array_equal(c90, want)
    np.testing.assert_allclose(c90, ref, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(kk, i.astype(np.int64) @ j.astype(np.int64) + 7)


@ct.kernel
def dot1d(X, Y, OUT, N: C):
    x, y = ct.load(X, (0,), (N,)), ct.load(Y, (0,), (N,))
    ct.store(OUT, (0,), x @ y)


def test_matmul_of_vectors_is_a_dot_product(rng):
    x, y = rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    out = np.zeros(1, np.float32)
    # the ieee model: one rounding of the exact dot product (sm_90 runs fp32 matmuls as
    # FMUL + FADD chains: tests/test_sim_f32_chains.py)
    sim.launch(dot1d, (1,), (x, y, out, 32), model="ieee")
    assert out[0] == np.float32(np.dot(x.astype(np.float64), y.astype(np.float64)))


@ct.kernel
def scaled(X, Y, N: C):
    x = ct.load(X, (0,), (N,))
    ct.store(Y, (0,), ct.mma_scaled(x, x, x, x, x))


def test_mma_scaled_refuses_with_its_reason():
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    with pytest.raises(NotImplementedError, match="mma_scaled is not supported.*sm_100"):
        sim.launch(scaled, (1,), (x, y, 8))


@ct.kernel
def fp8_path(A, B, C8, OUT, M: C, KD: C, N: C):
    a = ct.load(A, (0, 0), (M, KD))                      # float8_e4m3fn codes in memory
    b = ct.load(B, (0, 0), (KD, N))
    acc = ct.mma(a, b, ct.zeros((M, N), ct.float32))
    ct.store(OUT, (0, 0), acc)
    ct.store(C8, (0, 0), acc.astype(ct.float8_e5m2))


def test_fp8_arrays_mma_and_saturating_conversion(rng):
    from spak.sim.fp8 import decode
    m, k, n = 16, 32, 16
    a = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.float8_e4m3fn)
    b = torch.from_numpy(rng.standard_normal((k, n)).astype(np.float32) * 30).to(torch.float8_e4m3fn)
    a8 = sim.SimArray(a.view(torch.uint8).numpy().copy(), ct.float8_e4m3fn)
    b8 = sim.SimArray(b.view(torch.uint8).numpy().copy(), ct.float8_e4m3fn)
    c8 = sim.SimArray(np.zeros((m, n), np.uint8), ct.float8_e5m2)
    out = np.zeros((m, n), np.float32)
    sim.launch(fp8_path, (1,), (a8, b8, c8, out, m, k, n))
    ref = a.double().numpy() @ b.double().numpy()
    np.testing.assert_array_equal(out, ref.astype(np.float32))
    # float -> e5m2 by torch (RNE) wherever torch does not overflow; the simulator saturates
    want = torch.from_numpy(out).to(torch.float8_e5m2).view(torch.uint8).numpy()
    big = np.abs(out) > 57344
    np.testing.assert_array_equal(c8.data[~big], want[~big])
    assert (decode(c8.data[big], ct.float8_e5m2) == np.sign(out[big]) * 57344).all()
    from spak.sim.fp8 import encode
    sat = decode(encode(np.array([1e6, -1e6, np.inf, 464.0, 0.0]), ct.float8_e4m3fn), ct.float8_e4m3fn)
    np.testing.assert_array_equal(sat, [448, -448, 448, 448, 0])
    assert np.isnan(decode(encode(np.array([np.nan]), ct.float8_e4m3fn), ct.float8_e4m3fn)).all()


@ct.kernel
def host_level(X, Y, N: C):
    if N > 8:
        raise ct.static_exception(ValueError(f"N={N} is too big"))
    ct.grid_dependency_control_wait()
    with ct.compiler_timeout(5):
        x = ct.load(X, (0,), (N,))
    ct.grid_dependency_control_launch_dependents()
    ct.store(Y, (0,), x + 1)


def test_static_exception_and_launch_control_ops():
    x, y = np.arange(16, dtype=np.float32), np.zeros(16, np.float32)
    sim.launch(host_level, (1,), (x, y, 8), check_unwritten=False)
    np.testing.assert_array_equal(y[:8], x[:8] + 1)
    with pytest.raises(ValueError, match="N=16 is too big"):
        sim.launch(host_level, (1,), (x, y, 16))


@ct.kernel
def approx_unary(X, E, T, N: C):
    x = ct.load(X, (0,), (N,))
    ct.store(E, (0,), ct.exp(x, rounding_mode=RM.APPROX))
    ct.store(T, (0,), ct.tanh(x, rounding_mode=RM.APPROX))


def test_approximate_exp_and_tanh(rng):
    x = (rng.standard_normal(64) * 4).astype(np.float32)
    e, t = np.zeros(64, np.float32), np.zeros(64, np.float32)
    sim.launch(approx_unary, (1,), (x, e, t, 64))
    arg = x * np.float32(1.4426950408889634)          # rounded to float32, as ex2.approx takes it
    # sm_90: ex2.approx.f32 of it (MUFU.EX2, measured: 100% on an H100, tools/sim_ops_gpu.py)
    m = sim.numerics.get_model("sm_90")
    np.testing.assert_array_equal(e, sim.libdevice.exp2f(arg, m.mufu_ex2))
    np.testing.assert_allclose(e, np.exp(x.astype(np.float64)), rtol=2e-6, atol=0)
    # tanh.approx.f32: MUFU.TANH from its measured table (sim.mufu), within the hardware's
    # documented 2^-10.987 relative error
    from spak.sim import mufu
    np.testing.assert_array_equal(t, mufu.tanh_sm90(x, mufu.tanh_table()))
    np.testing.assert_allclose(t, np.tanh(x.astype(np.float64)), rtol=2.0 ** -10.9, atol=0)


@ct.kernel
def printing(X, T: C):
    x = ct.load(X, (ct.bid(0),), (T,))
    ct.print(f"x={x} s={ct.sum(x):.1f}")
    print("twice", x * 2)                          # the builtin print is ct.print in a kernel
    ct.printf("n=%d\n", ct.sum(ct.astype(x, ct.int32)))


def test_print_shows_each_blocks_own_values(capsys):
    x = np.arange(8, dtype=np.float32)
    sim.launch(printing, (2,), (x, 4))
    out = capsys.readouterr().out.splitlines()
    assert "[block (0, 0, 0)] x=[0.000000, 1.000000, 2.000000, 3.000000] s=6.0" in out
    assert "[block (1, 0, 0)] x=[4.000000, 5.000000, 6.000000, 7.000000] s=22.0" in out
    assert "[block (1, 0, 0)] twice [8.000000, 10.000000, 12.000000, 14.000000]" in out
    assert "[block (0, 0, 0)] n=6" in out
