"""sim/tile.py _f16_arith: float16 + - * through torch's CPU kernels gives numpy's bits (the
simulator's float16 arithmetic before; numpy's loops are ~35x slower), NaN results recomputed
by numpy (payloads), read-only / negative-stride operands left to numpy."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spak.sim import tile  # noqa: E402


def _bits(x):
    return np.asarray(x).view(np.uint16)


def _finite(codes):
    x = codes.astype(np.uint16).view(np.float16)
    return np.where(np.isfinite(x), x, np.float16(0))


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_same_bits_as_numpy_on_every_finite_float16(op):
    # finite operands (subnormals, signed zeros, overflow to inf included): no NaN result,
    # so every call here takes torch's kernels
    rng = np.random.default_rng(37)
    a = _finite(np.arange(65536, dtype=np.uint32)).reshape(256, 256)
    for _ in range(8):
        b = _finite(rng.integers(0, 65536, a.shape, dtype=np.uint32))
        with np.errstate(all="ignore"):
            want = tile._ARITH[op](a, b)
        assert not np.isnan(want).any()
        got = tile._f16_arith(op, a, b)
        assert got.dtype == np.float16 and got.shape == want.shape
        assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("op", ["add", "mul"])
def test_nan_results_keep_numpys_payloads(op):
    a = np.array([[0x7C01, 0x7E00, 0x3C00]], np.uint16).view(np.float16)   # sNaN, qNaN, 1
    b = np.array([[0x7E00, 0x7C01, 0x3C00]], np.uint16).view(np.float16)
    with np.errstate(all="ignore"):
        want = tile._ARITH[op](a, b)
    assert np.array_equal(_bits(tile._f16_arith(op, a, b)), _bits(want))


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_broadcast_and_finite_inputs_take_torch(op):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 256)).astype(np.float16)
    b = (rng.standard_normal((512, 256)) * 1e3).astype(np.float16)
    with np.errstate(all="ignore"):
        want = tile._ARITH[op](a, b)
    got = tile._f16_arith(op, a, b)
    assert np.isfinite(want).sum() > 0
    assert np.array_equal(_bits(got), _bits(want))


def test_read_only_and_negative_strides_fall_back():
    a = np.broadcast_to(np.float16(1.5), (4, 8))               # read-only view
    b = np.arange(32, dtype=np.float16).reshape(4, 8)[:, ::-1]   # negative stride
    for x, y in ((a, b), (b, b)):
        assert np.array_equal(_bits(tile._f16_arith("mul", x, y)), _bits(np.multiply(x, y)))
