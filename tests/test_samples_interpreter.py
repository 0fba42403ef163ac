"""Interpreter mode for other people's host code (issue 19): what NVIDIA's samples and
TileGym's ops needed (tensor.is_cuda on CPU tensors, lists of arrays as kernel arguments,
UNDETERMINED padding read as zeros), and, where .peers/ exists (python tools/peers_fetch.py;
not vendored, so CI skips it), a few of those programs through tools/samples_gpu.py."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cuda.tile as ct
from spak import sim
from spak.sim import interpret
from spak.sim.memory import set_undetermined_padding

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def interp():
    yield interpret
    interpret.disable()
    set_undetermined_padding("poison")


@ct.kernel
def _add_lists(As, Bs, Cs, T: ct.Constant[int]):
    for g in range(len(As)):
        ct.store(Cs[g], (ct.bid(0),), ct.load(As[g], (ct.bid(0),), (T,)) + ct.load(Bs[g], (ct.bid(0),), (T,)))


def _host_refusing_cpu(a, b):
    """Host code as NVIDIA's samples write it."""
    if not a.is_cuda or not b.is_cuda:
        raise ValueError("Input tensors must be on a CUDA device.")
    c = [torch.empty_like(x) for x in a.split(64)]
    ct.launch(torch.cuda.current_stream(), (2,), _add_lists, (list(a.split(64)), list(b.split(64)), c, 32))
    return torch.cat(c)


def test_is_cuda_shim_and_list_arguments(interp):
    a, b = torch.randn(128), torch.randn(128)
    interp.enable(tensor_is_cuda=False)
    with pytest.raises(ValueError, match="CUDA device"):
        _host_refusing_cpu(a, b)
    interp.enable(tensor_is_cuda=True)
    assert torch.equal(_host_refusing_cpu(a, b), a + b)
    interp.disable()
    assert not a.is_cuda                       # torch's own property answers again


@ct.kernel
def _masked_by_add(X, Y, T: ct.Constant[int]):
    x = ct.load(X, (0,), (T,))                 # past the end: UNDETERMINED padding
    m = ct.arange(T, dtype=ct.int32) >= X.shape[0]
    ct.store(Y, (0,), ct.sum(ct.exp(x + ct.where(m, -1.0e6, 0.0)), 0, keepdims=True))


def test_undetermined_padding_poison_or_zero(interp):
    x = np.random.default_rng(1).standard_normal(100).astype(np.float32)
    y = np.zeros(1, np.float32)
    sim.launch(_masked_by_add, (1,), (x, y, 128))
    assert np.isnan(y[0])                      # the default poison exposes the dependence
    interp.enable(undetermined_padding="zero")
    sim.launch(_masked_by_add, (1,), (x, y, 128))
    assert np.isclose(y[0], np.exp(x.astype(np.float64)).sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="undetermined_padding"):
        set_undetermined_padding("garbage")


@pytest.mark.skipif(not (ROOT / ".peers" / "SOURCES.json").exists(),
                    reason="no .peers/ (python tools/peers_fetch.py): NVIDIA's code is not vendored")
def test_nvidia_programs_record_and_replay(tmp_path, interp):
    sys.path.insert(0, str(ROOT / "tools"))
    import samples_gpu as SG
    only = "s_vec_add_1d_gather,s_matmul_fp16,t_softmax,t_rope"
    assert SG.record(tmp_path, "sim", 2026, only) == 0
    assert SG.check(tmp_path, only, json_out=str(tmp_path / "rows.json")) == 0
    import json
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert len(rows) == 5
    for r in rows:
        assert r["launch_identical"] == r["launch_elements"] > 0
        assert r["ref_err_sim"] is not None and r["ref_err_sim"] <= max(SG.PROGRAMS[0].tol, 4e-3)
