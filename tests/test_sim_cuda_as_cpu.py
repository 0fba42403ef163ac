"""Interpreter mode's cuda_as_cpu option (issue 19): host code that allocates on "cuda" by
name (TileGym's layer_norm_legacy) runs unchanged on a CPU torch, and disable() gives torch
its refusal back."""
import numpy as np
import pytest
import torch

import cuda.tile as ct
from spak.sim import interpret

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the option is for CPU builds of torch")


@ct.kernel
def _scale_rows(X, Y, S, T: ct.Constant[int]):
    x = ct.load(X, (ct.bid(0), 0), (1, T))
    ct.store(Y, (ct.bid(0), 0), x * 2.0)
    ct.store(S, (ct.bid(0),), ct.sum(x, 1))


def _gpu_host_code(x):
    """Written for a GPU: everything named "cuda"."""
    x = x.cuda()
    y = torch.empty_like(x)
    s = torch.empty((x.shape[0],), dtype=torch.float32, device="cuda")
    w = torch.ones(3).to("cuda:0")
    ct.launch(torch.cuda.current_stream(), (x.shape[0],), _scale_rows, (x, y, s, x.shape[1]))
    torch.cuda.synchronize()
    return y, s, w


@pytest.fixture
def interp():
    yield interpret
    interpret.disable()


def test_cuda_by_name_runs_on_cpu(interp):
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32))
    interp.enable()
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        _gpu_host_code(x)                      # off by default: torch refuses "cuda"
    interp.enable(cuda_as_cpu=True)
    y, s, w = _gpu_host_code(x)
    assert y.device.type == s.device.type == w.device.type == "cpu"
    assert torch.equal(y, x * 2)
    ref = x.double().sum(1)
    assert torch.allclose(s.double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.cuda.is_available()           # the simulated GPU (sim/host_gpu.py)
    interp.disable()
    assert not torch.cuda.is_available()       # and torch's own answer again
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        torch.empty(2, device="cuda")


def test_environment_switch(interp, monkeypatch):
    monkeypatch.setenv("SPAK_SIM_CUDA_AS_CPU", "1")
    interp.enable()
    assert torch.zeros(2, device="cuda").device.type == "cpu"
    interp.disable()
    monkeypatch.setenv("SPAK_SIM_CUDA_AS_CPU", "0")
    interp.enable()
    with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        torch.zeros(2, device="cuda")
