"""Element-indexed and view memory ops (issue 19): gather/scatter, advanced indexing,
Array.slice, tiled views, raw memory, and the lock-step checker's reads."""
import numpy as np
import pytest
import cuda.tile as ct

from spak import sim

C = ct.Constant[int]


@ct.kernel
def gather_scatter_2d(A, B, OUT, TX: C, TY: C):
    x = (ct.bid(0) * TX + ct.arange(TX, dtype=ct.int32))[:, None]
    y = (ct.bid(1) * TY + ct.arange(TY, dtype=ct.int32))[None, :]
    a = ct.gather(A, (x, y))                                  # out of bounds: 0
    b = ct.gather(B, (x, y), mask=(y % 2) == 0, padding_value=-1.0)
    ct.scatter(OUT, (x, y), a + b)


def test_gather_scatter_ragged_with_mask_and_padding(rng):
    m, n = 37, 50
    a, b = rng.standard_normal((m, n)).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    sim.launch(gather_scatter_2d, (-(-m // 16), -(-n // 32)), (a, b, out, 16, 32))
    cols = np.arange(n)[None, :]
    np.testing.assert_array_equal(out, a + np.where(cols % 2 == 0, b, np.float32(-1)))


@ct.kernel
def gather_unchecked(A, OUT, N: C):
    i = ct.arange(N, dtype=ct.int32) + 4
    ct.store(OUT, (0,), ct.gather(A, i, check_bounds=False))


def test_gather_without_bounds_check_raises_out_of_bounds(rng):
    a, out = rng.standard_normal(8).astype(np.float32), np.zeros(8, np.float32)
    with pytest.raises(sim.SimulationError, match="check_bounds=False out of bounds in block"):
        sim.launch(gather_unchecked, (1,), (a, out, 8))


@ct.kernel
def scatter_collide(OUT, N: C):
    i = ct.arange(N, dtype=ct.int32) // 2                     # pairs hit one element
    ct.scatter(OUT, i, ct.arange(N, dtype=ct.int32))


def test_scatter_of_different_values_to_one_element_is_reported():
    out = np.zeros(4, np.int32)
    rep = sim.launch(scatter_collide, (1,), (out, 8), check=False)
    assert any("writes different values" in f for f in rep.findings)


@ct.kernel
def advanced(X, Y, ROWS, COL0: int, N: C):
    rows = ct.load(ROWS, (0,), (N,))
    t = ct.load_advanced_indexing(X, (rows, ct.Slice(COL0, 4)), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, (0, 0), t)
    ct.store_advanced_indexing(X, (rows + 1, ct.Slice(0, 4)), t * 2)


def test_advanced_indexing_load_and_store(rng):
    x = rng.integers(-100, 100, (8, 8)).astype(np.int32)
    x0 = x.copy()
    rows = np.array([0, 2, 4, 7], np.int32)
    y = np.zeros((4, 4), np.int32)
    sim.launch(advanced, (1,), (x, y, rows, 6, 4), check_unwritten=False)
    ref = np.zeros((4, 4), np.int32)
    ref[:, :2] = x0[rows][:, 6:8]                            # columns 8, 9: zero padding
    np.testing.assert_array_equal(y, ref)
    want = x0.copy()
    for r, row in zip(rows + 1, ref * 2):
        if r < 8:                                          # row 8 is outside: dropped
            want[r, :4] = row
    np.testing.assert_array_equal(x, want)


@ct.kernel
def views(X, Y, Z, OFF: int, T: C):
    sub = X.slice(axis=0, start=OFF, stop=OFF + 2 * T)
    ct.store(Y, (0,), ct.load(sub, (1,), (T,)))            # elements OFF+T .. OFF+2T-1
    tv = X.tiled_view((T,), traversal_steps=(T // 2,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Z, (0,), tv.load((3,)))                       # elements 3*T/2 ..
    raw = X.get_raw_memory()
    ct.store(Z, (1,), raw.load_offset(ct.arange(T, dtype=ct.int32) * 2))


def test_slice_tiled_view_and_raw_memory(rng):
    x = rng.standard_normal(64).astype(np.float32)
    y, z = np.zeros(8, np.float32), np.zeros(16, np.float32)
    sim.launch(views, (1,), (x, y, z, 5, 8))
    np.testing.assert_array_equal(y, x[13:21])
    np.testing.assert_array_equal(z[:8], x[12:20])
    np.testing.assert_array_equal(z[8:], x[0:16:2])


@ct.kernel
def transposed_rows(X, Y, OFF, N, H: C, D: C):
    """Rows [OFF, OFF + N) of X [T, H, D] seen as [H, N, D] (the varlen forward's view)."""
    rows = X.slice(0, OFF, OFF + N)
    view = ct.Array.from_foreign(rows.foreign_pointer, (H, N, D),
                                 (X.strides[1], X.strides[0], X.strides[2]))
    ct.store(Y, (0, 0, 0), ct.load(view, (0, 0, 0), (H, 8, D),
                                   padding_mode=ct.PaddingMode.ZERO))


def test_from_foreign_views_a_slice_with_permuted_strides(rng):
    x = rng.standard_normal((20, 2, 4)).astype(np.float32)
    y = np.full((2, 8, 4), np.nan, np.float32)
    sim.launch(transposed_rows, (1,), (x, y, 11, 6, 2, 4))
    want = np.zeros((2, 8, 4), np.float32)
    want[:, :6] = x[11:17].transpose(1, 0, 2)              # rows past N: the padding
    np.testing.assert_array_equal(y, want)


def test_from_foreign_past_the_pointers_memory_raises(rng):
    x, y = rng.standard_normal((20, 2, 4)).astype(np.float32), np.zeros((2, 8, 4), np.float32)
    with pytest.raises(sim.SimulationError, match="from_foreign.*reaches element"):
        sim.launch(transposed_rows, (1,), (x, y, 14, 6, 3, 4))    # a third head past x's end


@ct.kernel
def store_then_load(X, Y, T: C):
    b = ct.bid(0)
    ct.store(Y, (b,), ct.load(X, (b,), (T,)) * 2)
    ct.store(X, (b,), ct.load(Y, (b,), (T,)) + 1)          # sees its own store


def test_a_block_sees_its_own_earlier_store(rng):
    x = rng.standard_normal(32).astype(np.float32)
    x0, y = x.copy(), np.zeros(32, np.float32)
    sim.launch(store_then_load, (4,), (x, y, 8))
    np.testing.assert_array_equal(x, x0 * 2 + 1)


@ct.kernel
def reads_neighbour(X, Y, T: C):
    b = ct.bid(0)
    ct.store(X, (b,), ct.load(X, (b,), (T,)) + 1)
    ct.store(Y, (b,), ct.load(X, ((b + 1) % ct.num_blocks(0),), (T,)))


def test_lockstep_reports_reading_another_blocks_write(rng):
    x, y = rng.standard_normal(32).astype(np.float32), np.zeros(32, np.float32)
    with pytest.raises(sim.SimulationError, match="read of another block's write"):
        sim.launch(reads_neighbour, (4,), (x, y, 8), max_lanes=1)


def test_simarray_is_freed_without_the_cyclic_gc():
    # interpreter mode wraps arguments in SimArrays at every launch (a bf16 tensor's float32
    # copy, a written array's int64 write record): a root must not be a reference cycle, or
    # those buffers wait for a gc pass (TileGym's chunk_gated_delta_rule perf test: 24 GB)
    import gc
    import weakref
    from spak.sim.memory import SimArray
    was = gc.isenabled()
    gc.disable()
    try:
        a = SimArray(np.zeros((4, 8), np.float32), name="x")
        a._owner_flat()                              # the write record exists
        v = a._view(8, (2, 4), (4, 1), "x[2:4]")
        assert v._root is a and a._root is a and v.owner_view().shape == (2, 4)
        ra, rv = weakref.ref(a), weakref.ref(v)
        del a, v
        assert ra() is None and rv() is None
    finally:
        if was:
            gc.enable()
