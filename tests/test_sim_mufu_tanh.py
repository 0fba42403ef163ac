"""sm_90: ct.tanh(x, rounding_mode=APPROX) is MUFU.TANH, bit for bit, from the table that
tools/mufu_probe.py --tanh-table recorded on an H100 (every fp32 in [2^-8, 8) and its negative;
results/samples-h100-2026-11-24c). The fixture tanh_check.npz (26 KB) holds 1856 inputs of
that run (anywhere inside a run, both signs, including the runs right after the table's
steps back) and 1600 of the earlier, independent probe run (results/samples-h100-2026-11-24,
binades 2^-20 .. 2^4: the x-itself and +-1 ranges too), each with the GPU's result."""
from pathlib import Path

import numpy as np
import pytest

import cuda.tile as ct
from spak import sim
from spak.sim import mufu
from spak.sim.numerics import tanh_approx_sm90

FIXTURE = Path(__file__).resolve().parents[1] / "results" / "samples-h100-2026-11-24c" / \
    "tanh_check.npz"
C = ct.Constant[int]


@ct.kernel
def _tanh_approx(X, Y, T: C):
    x = ct.load(X, (ct.bid(0),), (T,))
    ct.store(Y, (ct.bid(0),), ct.tanh(x, rounding_mode=ct.RoundingMode.APPROX))


def _run(x, model="sm_90", t=256):
    n = -(-x.size // t) * t
    xp = np.resize(x.astype(np.float32), n)
    y = np.zeros(n, np.float32)
    sim.launch(_tanh_approx, (n // t,), (xp, y, t), model=model)
    return y[: x.size]


@pytest.fixture(scope="module")
def rec():
    return np.load(FIXTURE)


def _bits(v):
    return np.ascontiguousarray(v, np.float32).view(np.uint32)


@pytest.mark.parametrize("which", ["", "_prev"])
def test_tanh_approx_matches_the_h100_bit_for_bit(rec, which):
    x, y = rec["x" + which], rec["y" + which]
    got = _run(x)
    assert (_bits(got) == _bits(y)).all(), int((_bits(got) != _bits(y)).sum())
    # the hardware's tanh is an approximation: within its documented 2^-10.987 of tanh
    ref = np.tanh(x.astype(np.float64))
    assert np.all(np.abs(got - ref) <= 2.0 ** -10.9 * np.abs(ref))


def test_the_previous_rule_fails_on_the_recording(rec):
    """correctly rounded between 2^-8 and 8 (the rule before the table): most differ."""
    x, y = rec["x"], rec["y"]
    assert (_bits(tanh_approx_sm90(x)) != _bits(y)).mean() > 0.5


def test_table_shape_odd_and_the_simple_ranges():
    emin, runs, starts, bits = mufu.tanh_table()
    assert emin == -8 and list(runs) == [6, 6, 6, 5, 5, 4, 4, 4, 3, 2, 3]
    assert bits.size == sum(1 << (23 - int(r)) for r in runs) == 6684672
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(4096) * 2.0 ** rng.uniform(-12, 4, 4096)).astype(np.float32)
    x = np.concatenate([x, np.float32([0.0, -0.0, 2.0 ** -149, -2.0 ** -149, 8.0, -8.0,
                                       np.inf, -np.inf, 7.9999995, 2.0 ** -8, -2.0 ** -8])])
    y = _run(x)
    assert (_bits(_run(-x)) == _bits(-y)).all()
    small = np.abs(x) < 2.0 ** -8
    assert (_bits(y[small]) == _bits(x[small])).all()
    assert (y[np.abs(x) >= 8] == np.sign(x[np.abs(x) >= 8])).all()
    assert np.isnan(_run(np.float32([np.nan]))).all()


def test_other_models_keep_the_rule_without_the_table(rec):
    """sm_120 / sm_89: nothing measured there, the table is sm_90's only."""
    x = rec["x"][:256]
    assert (_bits(_run(x, "sm_120")) == _bits(tanh_approx_sm90(x))).all()
