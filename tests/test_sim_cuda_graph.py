"""Interpreter mode's CUDA graphs (sim.cuda_graph, issue 37): a captured sequence of cuTile
launches and torch ops replays on the tensors as they are at replay, memory that existed
before the capture is left as it was by the capture itself, and what a capture cannot hold
raises naming it."""
import numpy as np
import pytest
import torch

import cuda.tile as ct
from spak.sim import SimNotSupported, interpret, launch_memo

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter mode on CPU torch")
T = 32


@ct.kernel
def _scaled_exp(X, Y, a: float):
    x = ct.load(X, (ct.bid(0), 0), (1, T))
    ct.store(Y, (ct.bid(0), 0), ct.exp(x * a))


@ct.kernel
def _add_into(X, Y):
    y = ct.load(Y, (ct.bid(0), 0), (1, T))
    ct.store(Y, (ct.bid(0), 0), y + ct.load(X, (ct.bid(0), 0), (1, T)))


@pytest.fixture
def gpu():
    interpret.enable(cuda_as_cpu=True)
    launch_memo.clear()
    yield
    interpret.disable()
    launch_memo.clear()


def _rand(*shape, seed):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _program(x, w):
    """torch ops around a cuTile kernel, as a benchmark's fn() does (new tensors each call)."""
    h = (x @ w).contiguous()
    y = torch.empty_like(h)
    ct.launch(torch.cuda.current_stream(), (h.shape[0],), _scaled_exp, (h, y, 0.25))
    return y.sum(dim=1) + x[:, 0]


def _reference(x, w):
    h = x.double() @ w.double()
    return torch.exp(h * 0.25).sum(dim=1) + x[:, 0].double()


def test_replay_runs_on_the_inputs_as_they_are_now(gpu):
    x, w = _rand(8, 16, seed=1).cuda(), _rand(16, T, seed=2).cuda()
    _program(x, w)                                     # warm-up, as benchmarks do
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = _program(x, w)
    assert torch.allclose(out.double(), _reference(x, w), rtol=1e-4, atol=1e-4)
    for seed in (3, 4):
        x.copy_(_rand(8, 16, seed=seed))               # in place: the captured addresses
        w.mul_(0.5)
        g.replay()
        assert torch.allclose(out.double(), _reference(x, w), rtol=1e-4, atol=1e-4)
    assert not torch.cuda.is_current_stream_capturing()


def test_capture_leaves_existing_memory_as_it_was(gpu):
    x, acc = _rand(4, T, seed=5), torch.zeros(4, T)
    count = torch.zeros(3)
    g = torch.cuda.CUDAGraph()
    g.capture_begin(pool=torch.cuda.graph_pool_handle())
    assert torch.cuda.is_current_stream_capturing()
    ct.launch(None, (4,), _add_into, (x, acc))         # a kernel's store into existing memory
    count += 1                                         # an in-place torch op
    g.capture_end()
    assert torch.all(acc == 0) and torch.all(count == 0)
    for _ in range(3):
        g.replay()
    assert torch.all(count == 3)
    assert torch.allclose(acc.double(), 3 * x.double(), rtol=1e-6)
    g.reset()
    with pytest.raises(RuntimeError, match="before a capture"):
        g.replay()


def test_graph_of_repeats_and_the_memo(gpu):
    x = _rand(8, T, seed=6)
    y = torch.empty_like(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=g.pool()):
        for _ in range(4):
            ct.launch(None, (8,), _scaled_exp, (x, y, 0.5))
    g.replay()
    assert launch_memo.stats["misses"] == 1            # the inputs never changed
    assert torch.allclose(y.double(), torch.exp(x.double() * np.float32(0.5)), rtol=1e-6)


def test_what_a_capture_cannot_hold_is_named(gpu):
    x = _rand(4, T, seed=7)
    with pytest.raises(SimNotSupported, match="_local_scalar_dense"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            float(x.sum())                             # a host sync
    with pytest.raises(SimNotSupported, match="nonzero"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.nonzero(x > 0)
    assert not torch.cuda.is_current_stream_capturing()   # the failed capture ended
    with pytest.raises(SimNotSupported, match="make_graphed_callables"):
        torch.cuda.make_graphed_callables(lambda t: t, (x,))
