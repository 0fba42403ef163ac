"""sm_90: a float32 product that an add broadcasts is not contracted. `s + k[:, None] * c`
compiles (tileiras, sm_90 SASS read here) to 4 FMUL (the column times c, once, before the
broadcast) and 16 FADD, no FFMA, as does `k[:, None] * c + s`; `s + k[:, None] * s` (the
product already has the add's shape) is 16 FFMA. No H100-recorded program has the form:
the rule rests on the SASS alone (docs/numerics-sm90.md section 15)."""
import numpy as np

import cuda.tile as ct
from spak import sim
from spak.sim.fma import fma_f32
from spak.sim.numerics import Sm90

C = ct.Constant[int]


class _Sm90Before(Sm90):
    fma_no_broadcast = False


@ct.kernel
def _col_scale(S, K, O1, O2, O3, c: float, N: C, M: C):
    s = ct.load(S, (0, 0), (N, M))
    k = ct.load(K, (0,), (N,))
    ct.store(O1, (0, 0), s + k[:, None] * c)
    ct.store(O2, (0, 0), k[:, None] * c + s)
    ct.store(O3, (0, 0), s + k[:, None] * s)


def _run(model, s, k, c):
    outs = [np.zeros_like(s) for _ in range(3)]
    sim.launch(_col_scale, (1,), (s, k, *outs, c, *s.shape), model=model)
    return outs


def test_broadcast_product_is_fmul_then_fadd():
    rng = np.random.default_rng(19)
    s = rng.standard_normal((64, 32)).astype(np.float32)
    k = rng.standard_normal(64).astype(np.float32)
    c = 0.3
    o1, o2, o3 = _run("sm_90", s, k, c)
    col = (k * np.float32(c)).astype(np.float32)[:, None]
    unfused = (s + col).astype(np.float32)
    assert (o1 == unfused).all() and (o2 == unfused).all()
    assert (o3 == fma_f32(np.broadcast_to(k[:, None], s.shape), s, s)).all()
    ref = s.astype(np.float64) + k[:, None].astype(np.float64) * c
    assert np.isfinite(o1).all() and np.abs(o1 - ref).max() <= 1e-6 * np.abs(ref).max()
    b1, _, _ = _run(_Sm90Before(), s, k, c)
    assert (b1 != unfused).any()
