"""The simulator's tile semantics and its checker, on small kernels with known answers."""
import numpy as np
import pytest
import cuda.tile as ct

from spak import sim
from tests import sim_kernels as K

RNG = np.random.default_rng(1234)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------- loads

@pytest.mark.parametrize("shape,tiles", [((64, 64), (16, 32)), ((50, 70), (16, 32)), ((1, 3), (1, 4))])
def test_copy_covers_every_element_including_ragged_edges(shape, tiles):
    x = randn(*shape)
    y = np.full(shape, np.nan, np.float32)
    grid = (-(-shape[0] // tiles[0]), -(-shape[1] // tiles[1]))
    rep = sim.launch(K.copy2d, grid, (x, y, *tiles))
    np.testing.assert_array_equal(y, x)
    assert rep.clean and rep.stores == grid[0] * grid[1]


def test_order_permutes_array_axes():
    x = randn(48, 80)
    y = np.full_like(x, np.nan)
    sim.launch(K.copy2d_transposed, (3, 5), (x, y, 16, 16))
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("mode,fill", [(0, 0.0), (1, -np.inf), (2, np.nan)])
def test_padding_modes_fill_the_out_of_bounds_part(mode, fill):
    x = randn(12)
    y = np.zeros(16, np.float32)
    sim.launch(K.load_with_padding, (2,), (x, y, 8, mode))
    np.testing.assert_array_equal(y[:12], x)
    np.testing.assert_array_equal(y[12:], np.full(4, fill, np.float32))


# ---------------------------------------------------------------------------------- checker

@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("SPAK_SIM_STRICT", "1")


def test_checker_catches_planted_out_of_bounds_store(strict):
    x, y = randn(32), np.zeros(32, np.float32)
    with pytest.raises(sim.SimulationError) as e:
        sim.launch(K.planted_oob_store, (4,), (x, y, 8))
    msg = str(e.value)
    assert "ct.store out of bounds" in msg and "block (1, 0, 0)" in msg
    assert "sim_kernels.py:" in msg and "'Y'" in msg


def test_checker_catches_planted_out_of_bounds_load(strict):
    x, y = randn(32), np.zeros(32, np.float32)
    with pytest.raises(sim.SimulationError, match=r"ct.load out of bounds in block \(0, 0, 0\)"):
        sim.launch(K.planted_oob_load, (4,), (x, y, 8))


def test_out_of_bounds_store_is_dropped_and_reported_by_default(monkeypatch):
    """cuTile leaves a tile wholly outside undefined; the GPU drops the store: so does the
    simulator by default, listing the access in report.oob (not a checker failure)."""
    monkeypatch.delenv("SPAK_SIM_STRICT", raising=False)
    x = randn(32)
    y32 = np.full(32, 7.0, np.float32)
    rep = sim.launch(K.planted_oob_store, (4,), (x, y32, 8), check=False)
    assert len(rep.oob) == 1 and "ct.store out of bounds in block (1, 0, 0)" in rep.oob[0]
    np.testing.assert_array_equal(y32[:8], x[:8])
    np.testing.assert_array_equal(y32[8:16], np.full(8, 7.0, np.float32))   # block 1: dropped
    np.testing.assert_array_equal(y32[16:], x[16:])
    assert len(rep.findings) == 1 and "8 of 32 elements" in rep.findings[0]


def test_out_of_bounds_load_is_padding_by_default(monkeypatch):
    monkeypatch.delenv("SPAK_SIM_STRICT", raising=False)
    x, y = randn(32), np.full(32, 7.0, np.float32)
    rep = sim.launch(K.planted_oob_load, (4,), (x, y, 8))
    assert len(rep.oob) == 1 and "ct.load out of bounds in block (0, 0, 0)" in rep.oob[0]
    np.testing.assert_array_equal(y, np.zeros(32, np.float32))   # every tile: ZERO padding


def test_checker_catches_planted_unwritten_tile():
    x, y = randn(32), np.zeros(32, np.float32)
    with pytest.raises(sim.SimulationError) as e:
        sim.launch(K.planted_unwritten, (4,), (x, y, 8))
    assert "8 of 32 elements of output 'Y'" in str(e.value)
    assert "first at index (16,)" in str(e.value)
    rep = sim.launch(K.planted_unwritten, (4,), (x, y, 8), check=False)
    assert len(rep.findings) == 1


def test_checker_catches_planted_double_write():
    x, y = randn(32), np.zeros(32, np.float32)
    with pytest.raises(sim.SimulationError) as e:
        sim.launch(K.planted_double_write, (4,), (x, y, 8))
    msg = str(e.value)
    assert "double write" in msg and "block (0, 0, 0)" in msg and "block (1, 0, 0)" in msg
    assert "unwritten" in msg       # tile 1 was never stored


# ---------------------------------------------------------------------------------- control flow

def test_block_dependent_loop_trip_counts():
    x = randn(6, 6 * 8)
    y = np.full((6, 8), np.nan, np.float32)
    rep = sim.launch(K.divergent_loop, (6,), (x, y, 8))
    want = np.stack([x[i, :(i + 1) * 8].reshape(i + 1, 8).sum(0) for i in range(6)])
    np.testing.assert_allclose(y, want, rtol=1e-6)
    assert rep.splits >= 1


def test_lock_step_groups_match_one_block_at_a_time():
    x = randn(6, 48)
    y1 = np.full((6, 8), np.nan, np.float32)
    y2 = np.full((6, 8), np.nan, np.float32)
    sim.launch(K.divergent_loop, (6,), (x, y1, 8))
    sim.launch(K.divergent_loop, (6,), (x, y2, 8), max_lanes=1)
    np.testing.assert_array_equal(y1, y2)


# ---------------------------------------------------------------------------------- dtypes

def test_promotion_follows_cutile():
    a, b = randn(16, dtype=np.float16), randn(16, dtype=np.float16)
    o16, o32 = np.zeros(16, np.float16), np.zeros(16, np.float32)
    sim.launch(K.promote_ops, (1,), (a, b, o16, o32, 0.1, 16))
    want16 = (a * np.float16(1.5)) + b            # f16 arithmetic, RNE at each step
    np.testing.assert_array_equal(o16, want16)
    np.testing.assert_array_equal(o32, a.astype(np.float32) * np.float32(0.1))


def test_narrowing_store_is_rejected_like_cutile():
    a, o16 = randn(16, dtype=np.float16), np.zeros(16, np.float16)
    with pytest.raises(sim.SimTypeError, match="cannot implicitly cast float32 to float16"):
        sim.launch(K.bad_narrowing_store, (1,), (a, o16, 0.5, 16))


def test_bf16_conversion_is_round_to_nearest_even():
    # values exactly between two bf16 neighbours round to the even one
    base = np.array([1.0, 1.0078125, 3.0, -2.0], np.float32)      # bf16 spacing at 1 is 2^-7
    halfway = base + np.array([2**-8, 2**-8, 2**-7, -2**-7], np.float32)
    x = np.concatenate([halfway, randn(12)]).astype(np.float32)
    y = sim.SimArray(np.zeros(16, np.float32), ct.bfloat16)
    sim.launch(K.to_bf16, (1,), (x, y, 16))
    assert y.data[0] == 1.0                    # tie -> even (1.0)
    assert y.data[1] == 1.015625               # tie -> even (odd neighbour rounded up)
    bits = y.data.view(np.uint32)
    assert (bits & 0xFFFF == 0).all()          # every value is a bf16
    np.testing.assert_allclose(y.data[4:], x[4:], rtol=2**-8)


def test_reductions():
    x = randn(16, 16)
    s, m = np.zeros(16, np.float32), np.zeros((1, 16), np.float32)
    sim.launch(K.reductions, (1,), (x, s, m, 16), model="sm_90-v0")   # v0: one rounding
    np.testing.assert_array_equal(s, x.astype(np.float64).sum(1).astype(np.float32))
    np.testing.assert_array_equal(m, x.max(0, keepdims=True))


@pytest.mark.parametrize("dtype", [np.float16, "bf16"])
def test_mma_is_exact_products_with_one_rounding(dtype):
    a, b = randn(32, 64), randn(64, 16)
    if dtype == "bf16":
        A, B = sim.SimArray(a, ct.bfloat16), sim.SimArray(b, ct.bfloat16)
        a64, b64 = A.data.astype(np.float64), B.data.astype(np.float64)
    else:
        A, B = a.astype(np.float16), b.astype(np.float16)
        a64, b64 = A.astype(np.float64), B.astype(np.float64)
    c = np.zeros((32, 16), np.float32)
    sim.launch(K.mma_kernel, (1,), (A, B, c, 32, 16, 64), model="sm_90-v0")  # v0's declared mma
    np.testing.assert_array_equal(c, (a64 @ b64).astype(np.float32))


def test_exp2_flushes_subnormal_results_to_zero():
    x = np.array([0.0, 1.0, -1.0, 10.5, -126.0, -127.0, -140.0, -np.inf] + [0.25] * 8, np.float32)
    y = np.zeros(16, np.float32)
    sim.launch(K.exp2_kernel, (1,), (x, y, 16))
    assert y[0] == 1 and y[1] == 2 and y[2] == 0.5
    assert y[4] == 2.0**-126                   # smallest normal survives
    assert y[5] == 0 and y[6] == 0 and y[7] == 0
    np.testing.assert_allclose(y[3], 2**10.5, rtol=1e-7)


def test_unsupported_op_names_itself():
    x, y = randn(16), np.zeros(16, np.float32)
    with pytest.raises(NotImplementedError, match=r"ct\.mma_scaled is not supported"):
        sim.launch(K.uses_unsupported, (1,), (x, y, 16))


def test_bad_launch_arguments_are_named():
    x, y = randn(16), np.zeros(16, np.float32)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        sim.launch(K.copy2d, (1,), (x, y))
    with pytest.raises(ValueError, match="grid"):
        sim.launch(K.exp2_kernel, (0,), (x, y, 16))
    with pytest.raises(ValueError, match="C-contiguous"):
        sim.launch(K.copy2d, (1, 1), (np.ones((8, 8), np.float32).T[::2], y.reshape(4, 4), 4, 4))
    with pytest.raises(ValueError, match="unknown numeric model"):
        sim.launch(K.exp2_kernel, (1,), (x, y, 16), model="sm_00")
