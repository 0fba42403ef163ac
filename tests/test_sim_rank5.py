"""cuTile arrays of rank 5 and more (TileGym's chunk_gated_delta_rule stores 5-D tiles):
the simulator folds such a box into its 4-D movers (sim/memory.py _fold). Checked against
numpy slicing, on a contiguous array, a strided view (transposed, so dims do not merge)
and a 6-D array whose trailing dims the tile covers whole; out-of-bounds lanes pad/skip."""
import numpy as np
import pytest

import cuda.tile as ct
from spak import sim
from spak.sim.errors import SimulationError

C = ct.Constant[int]


@ct.kernel
def _copy5(X, Y, A: C, B: C):
    i, j, k = ct.bid(0), ct.bid(1), ct.bid(2)
    t = ct.load(X, (i, j, k, 0, 0), (1, 1, 1, A, B), padding_mode=ct.PaddingMode.ZERO)
    t2 = ct.reshape(t, (A, B)) * 2.0 + 1.0
    ct.store(Y, (i, j, k, 0, 0), ct.reshape(t2, (1, 1, 1, A, B)))


@ct.kernel
def _copy6(X, Y, A: C, B: C, D: C):
    i, j = ct.bid(0), ct.bid(1)
    t = ct.load(X, (i, 0, j, 0, 0, 0), (1, 2, 1, A, B, D))
    ct.store(Y, (i, 0, j, 0, 0, 0), t + 1.0)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_5d_load_store_matches_numpy():
    x = _rand((2, 3, 2, 8, 4), 1)
    y = np.zeros_like(x)
    sim.launch(_copy5, (2, 3, 2), (x, y, 8, 4))
    np.testing.assert_array_equal(y, x * np.float32(2) + np.float32(1))


def test_5d_partial_box_pads_and_skips():
    # the tile (8, 8) overhangs the last two dims (6, 5): loads pad 0, stores drop the rest
    x = _rand((2, 1, 3, 6, 5), 2)
    y = np.full_like(x, -7.0)
    sim.launch(_copy5, (2, 1, 3), (x, y, 8, 8))
    np.testing.assert_array_equal(y, x * np.float32(2) + np.float32(1))


def test_5d_strided_view():
    base = _rand((4, 2, 3, 2, 8), 3)
    x = base.transpose(1, 2, 3, 4, 0)                  # (2, 3, 2, 8, 4), not contiguous
    y = np.zeros(x.shape, np.float32)
    sim.launch(_copy5, (2, 3, 2), (sim.SimArray.strided(x, name="x"), y, 8, 4))
    np.testing.assert_array_equal(y, x * np.float32(2) + np.float32(1))


def test_6d_contiguous_dims_merge():
    x = _rand((3, 2, 2, 4, 2, 2), 4)
    y = np.zeros_like(x)
    sim.launch(_copy6, (3, 2), (x, y, 4, 2, 2))
    np.testing.assert_array_equal(y, x + np.float32(1))


def test_5d_box_outside_raises(monkeypatch):
    """Strict mode raises; by default the 5-D box wholly outside is a finding (sim.oob)."""
    x = _rand((2, 1, 1, 8, 4), 5)
    monkeypatch.setenv("SPAK_SIM_STRICT", "1")
    with pytest.raises(SimulationError, match="lies entirely outside array 'X'"):
        sim.launch(_copy5, (3, 1, 1), (x, np.zeros_like(x), 8, 4))
    monkeypatch.delenv("SPAK_SIM_STRICT")
    y = np.zeros_like(x)
    rep = sim.launch(_copy5, (3, 1, 1), (x, y, 8, 4))
    assert rep.oob and "block (2, 0, 0)" in rep.oob[0] and "entirely outside" in rep.oob[0]
    np.testing.assert_array_equal(y, x * np.float32(2) + np.float32(1))   # block 2: dropped
