"""The float32 path of the sm_90 mma model for bf16, tf32 and fp8 operands (interpreter
mode's speed work, issue 37) gives exactly the bits of the float64 path (_hopper_lane) on
every input class: values in its range, values outside it (their lanes fall back), zeros,
fp32 subnormal and huge accumulators, special values."""
import numpy as np
import pytest
import cuda.tile as ct

from spak.sim import numerics as nm
from spak.sim.dtypes import round_tf32


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def both_paths(monkeypatch, a, b, c, in_dtype, arch):
    fast = nm.hopper_mma_f32(a, b, c, in_dtype, *arch)
    monkeypatch.setattr(nm, "GENERAL_F32_PATH", False)
    general = nm.hopper_mma_f32(a, b, c, in_dtype, *arch)
    monkeypatch.setattr(nm, "GENERAL_F32_PATH", True)
    return fast, general


def _bf16(x):
    return nm.get_model("ieee").round_to(np.asarray(x, np.float32), ct.bfloat16)


def _fp8(x, mant, emin, top):
    """Values of an fp8 format with `mant` fraction bits, least normal exponent emin,
    largest finite `top` (round to nearest on a float64 grid; subnormals included)."""
    x = np.clip(np.asarray(x, np.float64), -top, top)
    e = np.maximum(np.floor(np.log2(np.maximum(np.abs(x), 1e-300))), emin)
    q = 2.0 ** (e - mant)
    return np.round(x / q) * q


FORMATS = {
    "bf16": (ct.bfloat16, lambda x: _bf16(x).astype(np.float64), np.float32),
    "tf32": (ct.tfloat32, lambda x: round_tf32(np.asarray(x, np.float32)).astype(np.float64),
             np.float64),
    "e4m3": (ct.float8_e4m3fn, lambda x: _fp8(x, 3, -6, 448.0), np.float64),
    "e5m2": (ct.float8_e5m2, lambda x: _fp8(x, 2, -14, 57344.0), np.float64),
}


def _values(rng, kind, shape, cast):
    x = rng.standard_normal(shape)
    if kind == "wide":          # across the path's range and past both ends, in one step
        x *= 2.0 ** rng.integers(-70, 70, shape)
    elif kind == "zeros":
        x *= rng.random(shape) < 0.5
    elif kind == "tiny":        # every product below 2^ezero (bf16/tf32): the scalar rule
        x *= 2.0 ** -70
    elif kind == "edge":        # the range's ends exactly
        x = np.sign(x) * 2.0 ** rng.choice([nm.G_EMIN, nm.G_EMIN - 1, nm.G_EMAX, nm.G_EMAX + 1],
                                           shape)
    return cast(x)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("kind", ["normal", "wide", "zeros", "tiny", "edge"])
@pytest.mark.parametrize("arch", [(16, 25, -133), (8, 25, -133), (8, 24, -132)])
def test_general_f32_path_is_bit_identical_to_the_float64_path(monkeypatch, fmt, kind, arch):
    in_dtype, cast, b_storage = FORMATS[fmt]
    rng = np.random.default_rng(37)
    for k in (16, 32, 24, 5):
        a = _values(rng, kind, (4, 16, k), cast)
        b = _values(rng, kind, (4, k, 8), cast)
        b[:, :, 1] = -b[:, :, 0]                       # exact cancellation
        c = (rng.standard_normal((4, 16, 8)) * 2.0 ** rng.integers(-149, 127, (4, 16, 8)))
        c[0] = 0.0
        c[1, :4] = 3.3e38                              # the step sum overflows fp32: inf
        c[2] *= 2.0 ** -140                            # fp32 subnormal accumulators
        c = c.astype(np.float32)
        fast, general = both_paths(monkeypatch, a, b.astype(b_storage), c, in_dtype, arch)
        assert (bits(fast) == bits(general)).all(), (fmt, kind, k)


def test_general_f32_path_falls_back_for_special_values(monkeypatch):
    rng = np.random.default_rng(5)
    a = _bf16(rng.standard_normal((5, 8, 16))).astype(np.float64)
    b = _bf16(rng.standard_normal((5, 16, 8)))
    c = np.zeros((5, 8, 8), np.float32)
    a[0, 1, 2] = np.inf
    a[1, 2, 3] = np.nan
    c[2, 0, 0] = np.inf
    b[3, 3, 3] = -np.inf
    a[4, 0, 0] = 1.0 + 2.0 ** -40                      # not a float32 number: float64 path
    fast, general = both_paths(monkeypatch, a, b, c, ct.bfloat16, (16, 25, -133))
    assert (bits(fast) == bits(general)).all()
    assert (bits(fast[1, 2]) == 0x7FFFFFFF).all()      # canonical NaN (MMA-Sim)
    np.testing.assert_allclose(fast[4], a[4] @ b[4].astype(np.float64), rtol=1e-5, atol=1e-5)


def _takes_path(x):
    return nm._prepg(x, np.empty(x.shape, np.float32), np.empty(x.shape, np.int32))


def test_the_path_is_taken_for_in_range_values_only():
    # the comparisons above would pass if every lane fell back: check the lane test itself
    rng = np.random.default_rng(1)
    x = _bf16(rng.standard_normal((16, 16))).astype(np.float64)
    assert _takes_path(x) and _takes_path(x.astype(np.float32))
    x[3, 3] = 0.0
    assert _takes_path(x)
    for v in (2.0 ** (nm.G_EMIN - 1), 2.0 ** (nm.G_EMAX + 1), np.inf, np.nan, 1 + 2.0 ** -40):
        y = x.copy()
        y[5, 7] = v
        assert not _takes_path(y), v
    for v in (2.0 ** nm.G_EMIN, 2.0 ** nm.G_EMAX * 1.5):
        y = x.copy()
        y[5, 7] = v
        assert _takes_path(y), v
