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


@ct.kernel
def _fp8_causal_attention(Q, K, V, O, T: ct.Constant[int], D: ct.Constant[int]):
    """One query tile of causal attention the way TileGym's FMHA writes it: Q padded with
    ZERO, K (transposed) and V loaded past the sequence end with UNDETERMINED padding,
    the padded key columns masked by adding -inf to their scores, p cast back to fp8."""
    bx = ct.bid(0)
    q = ct.load(Q, (bx, 0), (T, D), padding_mode=ct.PaddingMode.ZERO)
    rows = bx * T + ct.arange(T, dtype=ct.int32)[:, None]
    m_i = ct.full((T, 1), -np.inf, dtype=ct.float32)
    l_i = ct.full((T, 1), 0.0, dtype=ct.float32)
    acc = ct.full((T, D), 0.0, dtype=ct.float32)
    for j in range(bx + 1):
        k = ct.load(K, (0, j), (D, T), order=(1, 0))
        qk = ct.mma(q, k, ct.full((T, T), 0.0, dtype=ct.float32))
        cols = j * T + ct.arange(T, dtype=ct.int32)[None, :]
        qk = qk + ct.where((rows >= cols) & (cols < K.shape[0]), 0.0, -np.inf)
        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True))
        p = ct.exp(qk - m_ij)
        alpha = ct.exp(m_i - m_ij)
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        v = ct.load(V, (j, 0), (T, D))
        acc = ct.mma(p.astype(Q.dtype), v, acc * alpha)
        m_i = m_ij
    ct.store(O, (bx, 0), acc / l_i)


def test_fp8_e5m2_ragged_tail_zero_padding(interp):
    """TileGym's FMHA test at float8_e5m2, S=1025: its last query row was NaN in interpreter
    mode (fine on an H200) because fp8 loads took the NaN poison for UNDETERMINED padding
    even with undetermined_padding="zero". S = 2 tiles + 1 row: the last tile's one row."""
    T, D, S = 32, 32, 65
    g = torch.Generator().manual_seed(37)
    q, k, v = (torch.randn(S, D, generator=g).to(torch.float8_e5m2) for _ in range(3))
    o = torch.full((S, D), 7.0)
    run = lambda: ct.launch(torch.cuda.current_stream(), (-(-S // T),), _fp8_causal_attention,
                            (q, k, v, o, T, D))
    interp.enable(undetermined_padding="zero")
    run()
    assert torch.isfinite(o).all()
    qd, kd, vd = (x.double() for x in (q, k, v))
    s = (qd @ kd.T).masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), -np.inf)
    ref = torch.softmax(s, -1) @ vd
    # p is rounded to e5m2 (2 mantissa bits: relative error <= 2^-3 each, mostly cancelling
    # over a row) before the second mma: measured max error 0.072 for max|v| = 4
    assert torch.allclose(o.double(), ref, rtol=0.0, atol=0.05 * vd.abs().max().item())
    set_undetermined_padding("poison")       # the poison still exposes the reliance
    run()
    assert torch.isnan(o[-1]).all() and torch.isfinite(o[:-1]).all()
