"""Error metrics, gates, bf16 rounding and ulp distances, checked on known values and exhaustively."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from spak.core.metrics import (GATES, NAN_ULP, float_bits, fraction_bit_identical, gate_for, max_abs,
                          max_ulp, nonfinite_count, passes_gate, rel_l2, round_to_bf16, ulp_distance)


def test_rel_l2_and_max_abs_known(rng):
    ref = rng.standard_normal((4, 5))
    assert rel_l2(ref * (1 + 1e-3), ref) == pytest.approx(1e-3, rel=1e-9)
    assert rel_l2(ref, ref) == 0.0
    out = ref.copy()
    out[2, 3] += 0.5
    assert max_abs(out, ref) == pytest.approx(0.5)
    assert rel_l2(out, ref) == pytest.approx(0.5 / np.linalg.norm(ref))
    assert max_abs(out.astype(np.float16), ref) > 0  # fp16 outputs are compared as float64


def test_zero_reference():
    z = np.zeros(6)
    assert rel_l2(z, z) == 0.0
    assert rel_l2(z + 1e-3, z) == math.inf


def test_nan_never_passes():
    ref = np.ones(8)
    out = ref.copy()
    out[3] = np.nan
    assert math.isnan(rel_l2(out, ref)) and math.isnan(max_abs(out, ref))
    assert nonfinite_count(out) == 1
    assert not passes_gate(rel_l2(out, ref), nonfinite_count(out), "fp16")
    assert not passes_gate(float("nan"), 0, "bf16")
    assert not passes_gate(0.0, 1, "fp16")           # an Inf alone fails
    assert passes_gate(GATES["fp16"], 0, "fp16") and not passes_gate(2e-3, 0, "fp16")
    assert passes_gate(7.9e-3, 0, "bf16")
    with pytest.raises(ValueError, match="dtype"):
        gate_for("fp8")


def test_nonfinite_count():
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0], dtype=np.float16)
    assert nonfinite_count(x) == 3


def test_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        rel_l2(np.ones(3), np.ones(4))


def test_round_to_bf16_ties_to_even():
    one = 1.0
    cases = {one + 2**-8: one,                      # halfway, 1.0 is even -> down
             one + 3 * 2**-8: one + 2**-6,          # halfway, odd below -> up
             one + 2**-8 + 2**-20: one + 2**-7,     # just past halfway -> up
             -(one + 2**-8): -one,
             3.4e38: np.inf,                        # past bf16's max -> inf
             1e-40: 1e-40}                          # subnormal in fp32 and bf16
    x = np.array(list(cases), dtype=np.float32)
    got = round_to_bf16(x)
    assert got.dtype == np.float32
    assert np.all(got.view(np.uint32) & 0xFFFF == 0)
    np.testing.assert_array_equal(got[:5], np.array(list(cases.values())[:5], dtype=np.float32))
    assert got[5] == pytest.approx(1e-40, rel=2**-7)
    assert np.isnan(round_to_bf16(np.array([np.nan], np.float32))).all()
    inf = np.array([np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(round_to_bf16(inf), inf)


def test_round_to_bf16_matches_torch(rng):
    torch = pytest.importorskip("torch")
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[~np.isnan(x)]
    want = torch.from_numpy(x.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(round_to_bf16(x).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_ulp_exhaustive_neighbours(dtype):
    """Every pair of adjacent representable values, over all 2^16 patterns, is 1 ulp apart."""
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore"):  # signalling NaN patterns
        if dtype == "fp16":
            vals = bits.view(np.float16).astype(np.float64)
        else:
            vals = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    keep = ~np.isnan(vals) & ~((vals == 0) & np.signbit(vals))  # one zero, no NaN
    order = np.argsort(vals[keep], kind="stable")
    sorted_bits = bits[keep][order]
    d = ulp_distance(sorted_bits[:-1], sorted_bits[1:], dtype)
    assert np.all(d == 1), np.unique(d)
    mant = 10 if dtype == "fp16" else 7
    assert len(sorted_bits) == 2**16 - 2 * (2**mant - 1) - 1  # all but NaNs and -0


def test_ulp_known_values():
    h = lambda *v: np.array(v, dtype=np.float16)  # noqa: E731
    assert ulp_distance(h(1.0), h(1.0), "fp16")[0] == 0
    assert ulp_distance(h(1.0), h(2.0), "fp16")[0] == 1024           # 10 mantissa bits
    assert ulp_distance(h(1.0), h(-1.0), "fp16")[0] == 2 * 0x3C00     # across zero
    assert ulp_distance(h(0.0), h(-0.0), "fp16")[0] == 0
    tiny = np.float16(2**-24)                                         # smallest subnormal
    assert ulp_distance(h(tiny), h(-tiny), "fp16")[0] == 2
    assert ulp_distance(h(65504), h(np.inf), "fp16")[0] == 1          # max finite to inf
    b = lambda *v: round_to_bf16(np.array(v, np.float32))  # noqa: E731
    assert ulp_distance(b(1.0), b(2.0), "bf16")[0] == 128             # 7 mantissa bits
    f = lambda *v: np.array(v, np.float32)  # noqa: E731
    assert ulp_distance(f(1.0), f(2.0), "fp32")[0] == 2**23
    assert ulp_distance(f(1.0), np.nextafter(f(1.0), f(2.0)), "fp32")[0] == 1
    assert max_ulp(h(1.0, 2.0), h(1.0, 2.001), "fp16") == 1


def test_ulp_nan_policy():
    a = np.array([np.nan, np.nan, 1.0, np.inf], np.float16)
    b = np.array([np.nan, 1.0, np.nan, np.inf], np.float16)
    np.testing.assert_array_equal(ulp_distance(a, b, "fp16"), [0, NAN_ULP, NAN_ULP, 0])
    other_nan = np.array([0x7E01], np.uint16)  # a NaN with another payload
    assert ulp_distance(np.array([np.nan], np.float16), other_nan, "fp16")[0] == 0
    assert max_ulp(a, b, "fp16") == NAN_ULP


@given(st.lists(st.floats(-1e4, 1e4, width=16, allow_subnormal=True), min_size=2, max_size=50))
def test_ulp_is_a_metric_on_sorted_values(xs):
    """Monotone: for a <= b <= c, d(a, c) = d(a, b) + d(b, c) (zeros counted once)."""
    v = np.sort(np.array(xs, dtype=np.float16))
    v = np.where(v == 0, np.float16(0), v)  # +0 and -0 are the same point
    d = ulp_distance(v[:-1], v[1:], "fp16")
    assert d.sum() == ulp_distance(v[:1], v[-1:], "fp16")[0]


def test_fraction_bit_identical():
    a = np.array([1.0, 2.0, 0.0, 3.0], np.float16)
    b = np.array([1.0, 2.0, -0.0, 3.001], np.float16)
    assert fraction_bit_identical(a, b, "fp16") == 0.5   # -0 differs from +0 in bits
    assert fraction_bit_identical(a, a, "fp16") == 1.0
    x = round_to_bf16(np.array([1.5, -2.25], np.float32))
    assert fraction_bit_identical(x, float_bits(x, "bf16"), "bf16") == 1.0


def test_float_bits_rejects_unrounded_bf16():
    with pytest.raises(ValueError, match="bf16"):
        float_bits(np.array([1.0 + 2**-20], np.float32), "bf16")
    with pytest.raises(TypeError):
        float_bits(np.array([1.0]), "fp16")  # float64 is not an fp16 pattern
    with pytest.raises(ValueError, match="dtype"):
        float_bits(np.array([1.0], np.float32), "fp64")
