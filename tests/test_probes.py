"""The numeric probe kernels run in the simulator and agree with its model exactly
(the v0 model's formulas; the measured sm_90 model: tests/test_numerics_model.py)."""
import numpy as np
import cuda.tile as ct

from spak import sim
from spak.gpu.probes import kernels as P


def test_mma_probe_in_the_simulator():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 64, 16)).astype(np.float16)
    b = rng.standard_normal((3, 16, 64)).astype(np.float16)
    c = rng.standard_normal((3, 64, 64)).astype(np.float32)
    d = np.full_like(c, np.nan)
    sim.launch(P.mma_probe, (3,), (a, b, c, d, 64, 64, 16), model="sm_90-v0")
    want = (np.matmul(a.astype(np.float64), b.astype(np.float64)) + c).astype(np.float32)
    np.testing.assert_array_equal(d, want)


def test_elementwise_probes_in_the_simulator():
    rng = np.random.default_rng(1)
    x = rng.uniform(-150, 2, 2048).astype(np.float32)
    y = np.zeros_like(x)
    sim.launch(P.exp2_probe, (2,), (x, y, 1024))
    assert (y[x < -126] == 0).all() and np.isfinite(y).all()
    z, w = rng.standard_normal(1024).astype(np.float32), rng.uniform(1, 9, 1024).astype(np.float32)
    q = np.zeros_like(z)
    sim.launch(P.div_approx_probe, (1,), (z, w, q, 1024))
    np.testing.assert_allclose(q, z / w, rtol=2e-7)
    y16 = np.zeros(1024, np.float16)
    yb = sim.SimArray(np.zeros(1024, np.float32), ct.bfloat16)
    sim.launch(P.cast_probe, (1,), (z, y16, yb, 1024))
    np.testing.assert_array_equal(y16, z.astype(np.float16))
    xs = rng.standard_normal((2, 64, 128)).astype(np.float32)
    ys = np.zeros((2, 64), np.float32)
    sim.launch(P.rowsum_probe, (2,), (xs, ys, 64, 128), model="sm_90-v0")
    np.testing.assert_array_equal(ys, xs.astype(np.float64).sum(2).astype(np.float32))
