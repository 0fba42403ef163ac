"""The sm_90 models added from the H100 run of issue 19 (results/samples-h100-2026-11-24):
bf16 ct.sum and fp16/bf16 ct.cumsum/ct.cumprod in the blocked orders with each op rounded
to the tile's dtype, MUFU.RSQ from its measured table, and bf16 products contracted into
one fused multiply-add. Each test can fail: the previous rules are checked to disagree."""
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import sim_ops_gpu as S  # noqa: E402

import cuda.tile as ct  # noqa: E402
from spak import sim  # noqa: E402
from spak.sim.fma import fma_bf16  # noqa: E402
from spak.sim.mufu import rsq_table, rsqrt_sm90  # noqa: E402
from spak.sim.numerics import _bf16_rne  # noqa: E402

DATA = ROOT / "results" / "samples-h100-2026-11-24"


@pytest.fixture(scope="module")
def recorded():
    meta, cases, gpu = S.load_recorded(DATA)
    assert meta["gpu"].startswith("NVIDIA H100") and len(cases) == 11
    return cases, gpu


def _fraction(cases, gpu, model):
    n = same = 0
    for c in cases:
        got = S.run_sim(c, model)
        for k, g in gpu[c.name].items():
            a, b, _, _ = S.compare(g, got[k])
            n, same = n + a, same + b
    return same / n


def test_half_sums_and_scans_match_the_h100(recorded):
    cases, gpu = recorded
    assert _fraction(cases, gpu, "sm_90") == 1.0


def test_the_previous_half_rules_disagree(recorded):
    """sm_90-v0 (one rounding of a float64 sum, sequential scans) on the same data."""
    cases, gpu = recorded
    assert _fraction(cases, gpu, "sm_90-v0") < 0.6


def _bf16_values(rng, n):
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    return _bf16_rne(x.astype(np.float32))


def _exact_bf16(a, b, c):
    """RNE to bf16 of the exact a*b + c (Fractions), as a float."""
    v = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if v == 0:
        return 0.0
    m, e = abs(v), 0
    while m >= 2:
        m, e = m / 2, e + 1
    while m < 1:
        m, e = m * 2, e - 1
    q = m * 2 ** 7                       # 8 significant bits
    lo = q.numerator // q.denominator
    r = q - lo
    lo += 1 if r > Fraction(1, 2) or (r == Fraction(1, 2) and lo % 2) else 0
    return float((1 if v > 0 else -1) * Fraction(lo) * Fraction(2) ** (e - 7))


def test_fma_bf16_rounds_once():
    rng = np.random.default_rng(5)
    a, b, c = (_bf16_values(rng, 400) for _ in range(3))
    # hard cases: a product exactly at a bf16 midpoint plus a tiny addend of either sign
    a[:4], b[:4] = np.float32(1.0), np.float32(1.0 + 2 ** -7)
    c[:4] = np.array([1e-30, -1e-30, 2.0 ** -60, -(2.0 ** -60)], np.float32)
    b[:4] = _bf16_rne(np.float32(1.0) + np.float32(2 ** -7))
    a[:4] = _bf16_rne(np.float32(1.0 + 2 ** -6))       # (1+2^-6)(1+2^-7) = 1 + 3*2^-7 + 2^-13
    got = fma_bf16(a, b, c)
    want = np.array([_exact_bf16(x, y, z) for x, y, z in zip(a, b, c)], np.float32)
    assert (got.view(np.uint32) == want.view(np.uint32)).all()
    two_roundings = _bf16_rne(_bf16_rne(a * b) + c)
    assert (two_roundings != want).any()


def test_rsqrt_table_follows_the_scaling_rule():
    tab = rsq_table()
    assert tab is not None and tab.shape == (1 << 24,) and set(np.unique(tab)) <= {-2, -1, 0, 1}
    rng = np.random.default_rng(9)
    x = (rng.random(2000) * 2.0 ** rng.integers(-140, 120, 2000)).astype(np.float32)
    x = x[x > 0]
    y, y4 = rsqrt_sm90(x, tab), rsqrt_sm90(x * np.float32(4), tab)
    normal = (x >= 2.0 ** -126) & (x < 2.0 ** 125)
    assert (y4[normal] * 2 == y[normal]).all()
    err = np.abs(y.astype(np.float64) * np.sqrt(x.astype(np.float64)) - 1)
    assert err.max() < 2.0 ** -21                                      # the PTX bound
    sp = rsqrt_sm90(np.array([0.0, -0.0, np.inf, -1.0, np.nan], np.float32), tab)
    assert np.isposinf(sp[0]) and np.isneginf(sp[1]) and sp[2] == 0 and np.isnan(sp[3:]).all()


@ct.kernel
def _rope_like(X, C, S_, Y, T: ct.Constant[int]):
    x = ct.load(X, (0,), (T,))
    y = ct.load(C, (0,), (T,))
    s = ct.load(S_, (0,), (T,))
    ct.store(Y, (0,), x * y - s * x)


def test_bf16_product_feeding_a_subtract_is_fused():
    rng = np.random.default_rng(3)
    x, c, s = (_bf16_values(rng, 256) for _ in range(3))
    out = np.zeros(256, np.float32)
    args = [sim.SimArray(v.copy(), ct.bfloat16) for v in (x, c, s)] + [sim.SimArray(out, ct.bfloat16), 256]
    sim.launch(_rope_like, (1,), args)
    want = fma_bf16(x, c, -_bf16_rne(s * x))
    assert (args[3].data.view(np.uint32) == want.view(np.uint32)).all()
    assert (want != _bf16_rne(_bf16_rne(x * c) - _bf16_rne(s * x))).any()


# --- kernels written here with the op sequences of TileGym's softmax and RoPE, on the inputs
# those programs had on the H100 (results/samples-h100-2026-11-24/kernels_extract.npz)

EXTRACT = DATA / "kernels_extract.npz"


@ct.kernel
def _softmax_rows(Y, X, NR: ct.Constant[int], T: ct.Constant[int]):
    offs = ct.arange(T, dtype=ct.int32)
    for r in range(ct.bid(0), NR, ct.num_blocks(0)):
        row = ct.gather(X, (r, offs), check_bounds=True, padding_value=-float("inf"))
        num = ct.exp(row - ct.max(row, 0, keepdims=True), rounding_mode=ct.RoundingMode.APPROX)
        den = ct.sum(num, 0, keepdims=True)
        ct.scatter(Y, (r, offs), ct.truediv(num, den, rounding_mode=ct.RoundingMode.APPROX,
                                            flush_to_zero=True), check_bounds=True)


def test_gathered_row_sum_order_matches_the_h100():
    d = np.load(EXTRACT)
    x, g = d["softmax_x"], d["softmax_y"]
    y = np.zeros_like(x)
    sim.launch(_softmax_rows, (64,), (y, x, 64, 256))
    assert (y.view(np.uint32) == g.view(np.uint32)).all()
    y0 = np.zeros_like(x)                 # the loaded-tile order the simulator used before
    sim.launch(_softmax_rows, (64,), (y0, x, 64, 256), model="sm_90-v0")
    assert (y0.view(np.uint32) != g.view(np.uint32)).mean() > 0.2


@ct.kernel
def _rope_rows(Q, C, S_, H: ct.Constant[int], D2: ct.Constant[int]):
    r = ct.bid(0)
    c = ct.load(C, (0, r, 0), (1, 1, D2)).reshape((1, D2))
    s = ct.load(S_, (0, r, 0), (1, 1, D2)).reshape((1, D2))
    q1 = ct.load(Q, (0, 0, r, 0), (1, H, 1, D2)).reshape((H, D2))
    q2 = ct.load(Q, (0, 0, r, 1), (1, H, 1, D2)).reshape((H, D2))
    ct.store(Q, (0, 0, r, 0), (q1 * c - q2 * s).reshape((1, H, 1, D2)))
    ct.store(Q, (0, 0, r, 1), (q2 * c + q1 * s).reshape((1, H, 1, D2)))


def _bf16_f32(bits):
    return (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)


def test_bf16_rope_matches_the_h100():
    d = np.load(EXTRACT)
    q = sim.SimArray(_bf16_f32(d["rope_q"]).copy(), ct.bfloat16)
    cs = [sim.SimArray(_bf16_f32(d[k]), ct.bfloat16) for k in ("rope_cos", "rope_sin")]
    sim.launch(_rope_rows, (32,), (q, *cs, 4, 32))
    assert (q.data.view(np.uint32) == _bf16_f32(d["rope_qout"]).view(np.uint32)).all()
