"""Interpreter mode's launch memo (sim.launch_memo, issue 37): a launch equal to an earlier one
restores its result; any change the kernel could see (an input element, a scalar, an output
buffer it reads, how its arrays overlap) simulates again, and findings are reported on a hit."""
import numpy as np
import pytest
import torch

import cuda.tile as ct
from spak.sim import interpret, launch_memo, oob

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter mode on CPU torch")
T = 16


@ct.kernel
def _affine(X, Y, a: float):
    x = ct.load(X, (ct.bid(0), 0), (1, T))
    ct.store(Y, (ct.bid(0), 0), x * a + 1.0)


@ct.kernel
def _accumulate(X, Y):
    y = ct.load(Y, (ct.bid(0), 0), (1, T))
    ct.store(Y, (ct.bid(0), 0), y + ct.load(X, (ct.bid(0), 0), (1, T)))


@ct.kernel
def _first_rows(X, Y):
    # writes only the rows of the first half of the grid's blocks (the rest stay as they are)
    if ct.bid(0) < 2:
        ct.store(Y, (ct.bid(0), 0), ct.load(X, (ct.bid(0), 0), (1, T)))


@ct.kernel
def _past_the_end(X, Y):
    # block 3 loads and stores a tile wholly outside X (24 elements): padded and dropped
    x = ct.load(X, (ct.bid(0),), (8,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(X, (ct.bid(0),), x)
    ct.store(Y, (ct.bid(0),), x + 1.0)


@pytest.fixture
def interp(monkeypatch):
    monkeypatch.delenv("SPAK_SIM_MEMO_MB", raising=False)
    interpret.enable(cuda_as_cpu=True)
    launch_memo.clear()
    yield
    interpret.disable()
    launch_memo.clear()


def _rand(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _affine_ref(x, a):
    return (x.double() * np.float32(a) + 1.0)


def _run_affine(x, a):
    y = torch.empty_like(x)          # fresh garbage each call: an output is not part of the key
    ct.launch(None, (x.shape[0],), _affine, (x, y, a))
    return y


def test_repeat_is_a_hit_and_any_change_simulates_again(interp):
    x = _rand(4, T, seed=1)
    y0 = _run_affine(x, 1.5)
    y1 = _run_affine(x, 1.5)
    assert launch_memo.stats["misses"] == 1 and launch_memo.stats["hits"] == 1
    assert torch.equal(y0, y1)
    assert torch.allclose(y1.double(), _affine_ref(x, 1.5), rtol=1e-6, atol=1e-6)
    x[2, 5] += 1.0                                     # one input element
    y2 = _run_affine(x, 1.5)
    assert launch_memo.stats["misses"] == 2
    assert torch.allclose(y2.double(), _affine_ref(x, 1.5), rtol=1e-6, atol=1e-6)
    y3 = _run_affine(x, 2.5)                           # one scalar
    assert launch_memo.stats["misses"] == 3
    assert torch.allclose(y3.double(), _affine_ref(x, 2.5), rtol=1e-6, atol=1e-6)


def test_an_output_the_kernel_reads_is_part_of_the_key(interp):
    x, y = _rand(4, T, seed=2), _rand(4, T, seed=3)
    ref = y.double() + x.double()
    ct.launch(None, (4,), _accumulate, (x, y))
    ct.launch(None, (4,), _accumulate, (x, y))         # y changed: not the same launch
    assert launch_memo.stats["hits"] == 0 and launch_memo.stats["misses"] == 2
    assert torch.allclose(y.double(), ref + x.double(), rtol=1e-6, atol=1e-6)


def test_overlap_is_part_of_the_key(interp):
    x = _rand(4, T, seed=4)
    twin = x.clone()
    ct.launch(None, (4,), _accumulate, (x, twin))      # twin = 2x
    x2 = x.clone()
    ct.launch(None, (4,), _accumulate, (x2, x2))       # same bytes, one buffer: a fresh run
    assert launch_memo.stats["hits"] == 0
    assert torch.allclose(x2.double(), 2 * x.double(), rtol=1e-6)


def test_a_hit_writes_only_what_the_kernel_wrote(interp):
    x = _rand(4, T, seed=5)
    y = torch.zeros(4, T)
    ct.launch(None, (4,), _first_rows, (x, y))
    y2 = torch.full((4, T), 7.0)
    ct.launch(None, (4,), _first_rows, (x, y2))
    assert launch_memo.stats["hits"] == 1
    assert torch.equal(y2[:2], x[:2]) and torch.all(y2[2:] == 7.0)


def test_out_of_bounds_findings_are_reported_on_a_hit(interp):
    x, before = _rand(24, seed=6), None
    before = oob.total()
    r1 = ct.launch(None, (4,), _past_the_end, (x, torch.empty(32)))
    n1 = oob.total() - before
    y = torch.empty(32)
    r2 = ct.launch(None, (4,), _past_the_end, (x, y))
    assert launch_memo.stats["hits"] == 1 and n1 >= 2      # a load and a store outside
    assert oob.total() - before == 2 * n1                 # counted again, as a re-run would
    assert r1.oob and not r2.oob                          # first seen by the first launch
    assert torch.allclose(y[:24].double(), x.double() + 1, rtol=1e-6)


def test_strict_mode_simulates_a_hit_that_had_findings(interp):
    x = _rand(24, seed=7)
    ct.launch(None, (4,), _past_the_end, (x, torch.empty(32)))
    old = oob.set_strict(True)
    try:
        with pytest.raises(Exception, match="out of bounds"):
            ct.launch(None, (4,), _past_the_end, (x, torch.empty(32)))
    finally:
        oob.set_strict(old)


def test_size_zero_turns_it_off(interp, monkeypatch):
    monkeypatch.setenv("SPAK_SIM_MEMO_MB", "0")
    x = _rand(4, T, seed=8)
    _run_affine(x, 1.5)
    _run_affine(x, 1.5)
    assert launch_memo.stats["hits"] == launch_memo.stats["misses"] == 0


def test_lru_evicts_by_bytes(interp, monkeypatch):
    monkeypatch.setenv("SPAK_SIM_MEMO_MB", str(3 * 4 * T * 4 / 2**20))   # three outputs
    xs = [_rand(4, T, seed=10 + i) for i in range(5)]
    _run_affine(xs[0], 1.5)                            # a hit: the kernel stays stored
    for x in xs:
        _run_affine(x, 1.5)
    assert launch_memo.stats["evicted"] == 2
    assert launch_memo.stats["bytes"] <= 3 * 4 * T * 4
    y = _run_affine(xs[0], 1.5)                        # evicted: simulated again, correct
    assert launch_memo.stats["misses"] == 6
    assert torch.allclose(y.double(), _affine_ref(xs[0], 1.5), rtol=1e-6, atol=1e-6)


def test_dtype_and_enum_constants_are_keys():
    key = launch_memo._scalar_key
    assert key(torch.float16) != key(torch.bfloat16) and key(torch.float16) is not None
    assert key(ct.float16) != key(ct.bfloat16) and key(ct.float16) is not None
    assert key(ct.PaddingMode.ZERO) != key(ct.PaddingMode.NAN)
    assert key(object()) is None                       # unknown identity: not memoised
    assert key(1) != key(True) and key(1.0) != key(1)


def test_a_kernel_never_hit_stops_being_stored(interp):
    # a new scalar each call (TileGym's dropout seed): nothing to gain from holding outputs
    x = _rand(4, T, seed=20)
    for i in range(launch_memo.STOP_AFTER + 3):
        y = _run_affine(x, 1.0 + i)
        assert torch.allclose(y.double(), _affine_ref(x, 1.0 + i), rtol=1e-6, atol=1e-6)
    assert launch_memo.stats["stored"] == launch_memo.STOP_AFTER
    assert launch_memo.stats["misses"] == launch_memo.STOP_AFTER + 3


def test_interpreted_autotuner_tries_the_largest_tiles_first():
    from types import SimpleNamespace as NS
    space = [NS(TILE_M=64, TILE_N=64, occupancy=2), NS(TILE_M=256, TILE_N=128, occupancy=1),
             NS(TILE_M=128, TILE_N=256, occupancy=2), {"BLOCK_M": 32}]
    order = interpret._largest_tiles_first(iter(space))
    assert order == [space[1], space[2], space[0], space[3]]     # stable among equal volumes
    assert interpret._largest_tiles_first([(24, 32), (16, 32)]) == [(24, 32), (16, 32)]


def test_bad_memo_size_is_named(interp, monkeypatch):
    monkeypatch.setenv("SPAK_SIM_MEMO_MB", "lots")
    with pytest.raises(ValueError, match="SPAK_SIM_MEMO_MB"):
        _run_affine(_rand(4, T, seed=30), 1.0)


@ct.kernel
def _gather_rows(X, I, Y):
    # reads X only through a gather (indexing.read_elements), at rows named by I
    r = ct.gather(I, (ct.bid(0),))
    ct.store(Y, (ct.bid(0), 0), ct.gather(X, (r, ct.arange(T, dtype=ct.int32))).reshape((1, T)))


def test_gathered_arrays_are_part_of_the_key(interp):
    x = _rand(6, T, seed=40)
    idx = torch.tensor([5, 0, 3, 3], dtype=torch.int32)
    y1 = torch.empty(4, T)
    ct.launch(None, (4,), _gather_rows, (x, idx, y1))
    x[3, 7] = 100.0                                   # a gathered element
    y2 = torch.empty(4, T)
    ct.launch(None, (4,), _gather_rows, (x, idx, y2))
    idx[1] = 2                                        # an index
    y3 = torch.empty(4, T)
    ct.launch(None, (4,), _gather_rows, (x, idx, y3))
    assert launch_memo.stats["hits"] == 0 and launch_memo.stats["misses"] == 3
    assert torch.equal(y2, x[[5, 0, 3, 3]]) and torch.equal(y3, x[[5, 2, 3, 3]])
    y4 = torch.empty(4, T)
    ct.launch(None, (4,), _gather_rows, (x, idx, y4))  # unchanged: a hit, the same rows
    assert launch_memo.stats["hits"] == 1 and torch.equal(y4, y3)


def test_hinted_copy_of_a_kernel_shares_entries(interp):
    # TileGym's autotuned ops: exhaustive_search runs the plain kernel, then the op launches
    # kernel.replace_hints(...) (compiler hints the simulator does not read) on the same
    # arguments: a hit, with the result the plain kernel computed
    x = _rand(4, T, seed=3)
    y0 = _run_affine(x, 0.75)
    hinted = _affine.replace_hints(occupancy=2)
    assert hinted is not _affine
    y1 = torch.empty_like(x)
    ct.launch(None, (x.shape[0],), hinted, (x, y1, 0.75))
    assert launch_memo.stats["misses"] == 1 and launch_memo.stats["hits"] == 1
    assert torch.equal(y0, y1)
    assert torch.allclose(y1.double(), _affine_ref(x, 0.75), rtol=1e-6, atol=1e-6)
    ct.launch(None, (x.shape[0],), hinted, (x, y1, 1.25))  # a new scalar: simulated
    assert launch_memo.stats["misses"] == 2
    assert torch.allclose(y1.double(), _affine_ref(x, 1.25), rtol=1e-6, atol=1e-6)
