"""fp8 encoding (sim.fp8.encode: RNE, saturating, NaN kept) by arithmetic in numba gives
the codes of the table search it replaced (sim.fp8._encode_np) on every input class: every
fp8 value, the midpoints between neighbours (ties) and the floats next to them, zeros of
both signs, infinities, NaN, float64 extremes, random values over 60 binades; float64,
float32 and float16 inputs."""
import numpy as np
import pytest

from spak.sim import fp8


def _inputs(dtype):
    rng = np.random.default_rng(8)
    vals = fp8._table(dtype)[0]
    fin = np.sort(np.unique(vals[np.isfinite(vals)].astype(np.float64)))
    mids = (fin[1:] + fin[:-1]) / 2
    return [rng.standard_normal(50000) * 2.0 ** rng.integers(-30, 30, 50000),
            np.concatenate([fin, -fin, [-0.0, 0.0, np.inf, -np.inf, np.nan, 1e300, -1e300,
                                        5e-324, -5e-324]]),
            np.concatenate([mids, -mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                            fin * (1 + 1e-7), fin * (1 - 1e-7)])]


@pytest.mark.parametrize("dtype", fp8.FP8, ids=lambda d: d.name)
@pytest.mark.parametrize("storage", [np.float64, np.float32, np.float16])
def test_encode_matches_the_table_search(dtype, storage):
    for x in _inputs(dtype):
        with np.errstate(over="ignore"):
            xx = x.astype(storage).reshape(-1, 1)[: (x.size // 2) * 2].reshape(2, -1)
        got, want = fp8.encode(xx, dtype), fp8._encode_np(xx, dtype)
        assert got.dtype == np.uint8 and got.shape == want.shape
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (xx.reshape(-1)[bad[:5]], got.reshape(-1)[bad[:5]])
    # round trip: every finite value encodes to itself
    vals = fp8._table(dtype)[0]
    fin = np.isfinite(vals)
    assert (fp8.decode(fp8.encode(vals[fin], dtype), dtype) == vals[fin]).all()
