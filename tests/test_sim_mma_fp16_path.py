"""The fp16 fast path of the sm_90 mma model (float32 products, int32 step sums: issue 19's
speed work) gives exactly the bits of the general path (_hopper_lane), on every input
class, and the sample-style matmul through sim.launch matches float64."""
import numpy as np
import pytest
import cuda.tile as ct

from spak import sim
from spak.cpu import bench_sim
from spak.cpu.matmul_sample import grid, matmul_kernel
from spak.sim import numerics as nm


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def both_paths(monkeypatch, a, b, c, kstep=16, fbits=25, ezero=-133):
    fast = nm.hopper_mma_f32(a, b, c, ct.float16, kstep, fbits, ezero)
    monkeypatch.setattr(nm, "FP16_PATH", False)
    general = nm.hopper_mma_f32(a, b, c, ct.float16, kstep, fbits, ezero)
    monkeypatch.setattr(nm, "FP16_PATH", True)
    return fast, general


def _values(rng, kind, shape):
    x = rng.standard_normal(shape)
    if kind == "wide":          # fp16 subnormals to the top of the range, in one step
        x *= 2.0 ** rng.integers(-26, 16, shape)
    elif kind == "zeros":
        x *= rng.random(shape) < 0.5
    elif kind == "subnormal":
        x *= 2.0 ** -18
    elif kind == "max":         # the largest terms: the int32 step sum's worst case
        x = np.sign(x) * 65504.0
    return np.clip(x, -65504, 65504).astype(np.float16)


@pytest.mark.parametrize("kind", ["normal", "wide", "zeros", "subnormal", "max"])
@pytest.mark.parametrize("arch", [(16, 25, -133), (8, 24, -132)])      # sm_90 / sm_120, sm_89
def test_fp16_path_is_bit_identical_to_the_general_path(monkeypatch, kind, arch):
    rng = np.random.default_rng(19)
    for k in (16, 32, 24, 5):
        a = _values(rng, kind, (3, 16, k))
        b = _values(rng, kind, (3, k, 8))
        b[:, :, 1] = -b[:, :, 0]                       # exact cancellation
        c = (rng.standard_normal((3, 16, 8)) * 2.0 ** rng.integers(-149, 127, (3, 16, 8)))
        c[0] = 0.0
        c[1, :4] = 3.3e38                              # the step sum overflows fp32: inf
        c = c.astype(np.float32)
        for aa in (a, a.astype(np.float64)):           # fp16 storage and float64 values
            fast, general = both_paths(monkeypatch, aa, b, c, *arch)
            assert (bits(fast) == bits(general)).all(), (kind, k, aa.dtype)


def test_fp16_path_falls_back_for_special_and_non_fp16_values(monkeypatch):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4, 8, 16))
    b = rng.standard_normal((4, 16, 8)).astype(np.float16)
    c = np.zeros((4, 8, 8), np.float32)
    a[0, 1, 2] = np.inf
    a[1, 2, 3] = np.nan
    c[2, 0, 0] = np.inf
    b[3, 3, 3] = -np.inf
    fast, general = both_paths(monkeypatch, a.astype(np.float16).astype(np.float64), b, c)
    assert (bits(fast) == bits(general)).all()
    assert (bits(fast[1, 2]) == 0x7FFFFFFF).all()      # canonical NaN (MMA-Sim)
    for scale in (1e-6, 1e6):                           # not fp16 values: general path
        fast, general = both_paths(monkeypatch, a * scale, b, c)
        assert (bits(fast) == bits(general)).all()


def test_sample_matmul_through_launch_matches_float64_and_both_paths(monkeypatch):
    rng = np.random.default_rng(3)
    m, n, k = 200, 160, 80                             # partial tiles on every axis
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    outs = []
    for fast in (True, False):
        monkeypatch.setattr(nm, "FP16_PATH", fast)
        c = np.full((m, n), np.nan, np.float32)
        sim.launch(matmul_kernel, grid(m, n, 64, 64), (a, b, c, 64, 64, 32))
        outs.append(c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isfinite(outs[0]).all()
    np.testing.assert_allclose(outs[0], ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    assert (bits(outs[0]) == bits(outs[1])).all()


def test_bench_sim_matmul_prints_seconds_and_ratio(capsys):
    assert bench_sim.main(["--problem", "matmul", "--size", "128x64x96", "--tiles", "64x32x32",
                           "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "matmul 128x64x96" in out and "ratio sim / numpy float32, 1 BLAS thread" in out
    err = float(out.split("max |error| vs float64 on 64 rows:")[1].split()[0])
    assert err < 0.05                                  # fp16 output of |C| ~ 10
