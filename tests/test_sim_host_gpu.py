"""Interpreter mode's simulated GPU as host code sees it (issue 37): torch.cuda answers as the
simulated arch, host<->device moves stay copies, SDPA's GPU-only backends fall back to math,
what cannot be emulated names itself; and the entry points themselves (`python -m spak.sim`
SCRIPT / -m pytest, SPAK_SIM=1) run unchanged GPU programs on the CPU."""
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

import pytest
import torch

import cuda.tile as ct
from spak.sim import SimNotSupported, interpret, oob

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="interpreter mode's simulated GPU is for CPU torch")


@pytest.fixture
def gpu():
    interpret.enable(model="sm_120", cuda_as_cpu=True)
    yield
    interpret.disable()


def test_queries_answer_as_the_simulated_arch(gpu):
    c = torch.cuda
    assert c.is_available() and c.device_count() == 1 and c.current_device() == 0
    assert c.get_device_capability("cuda") == (12, 0)
    p = c.get_device_properties(0)
    assert p.multi_processor_count == 48 and p.total_memory == 12 * 2**30
    assert "RTX 5070" in c.get_device_name()
    c.set_device(0)
    c.set_device("cuda:0")
    with pytest.raises(ValueError, match="device 0"):
        c.set_device(1)
    c.synchronize()
    c.empty_cache()
    c.reset_peak_memory_stats()
    assert c.max_memory_allocated() == 0 and c.memory_stats()["allocated_bytes.all.peak"] == 0


def test_seeds_streams_and_events(gpu):
    torch.cuda.manual_seed(7)
    a = torch.randn(5, device="cuda")
    torch.cuda.manual_seed_all(7)
    assert torch.equal(a, torch.randn(5, device="cuda"))     # the generator "cuda" tensors use
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        s.wait_stream(torch.cuda.current_stream())
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    e1.record()
    e1.synchronize()
    assert 0.0 <= e0.elapsed_time(e1) < 1e4                  # host wall ms
    # a class, so code that only names it imports (transformers annotates with
    # `torch.cuda.CUDAGraph | None`; a function there stopped TileGym's test_rope collecting);
    # capture and replay: tests/test_sim_cuda_graph.py
    assert isinstance(torch.cuda.CUDAGraph | None, types.UnionType)
    assert isinstance(torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph)
    with pytest.raises(SimNotSupported, match="make_graphed_callables"):
        torch.cuda.make_graphed_callables(lambda t: t, (torch.ones(1),))


def test_moves_copy_as_on_a_gpu(gpu):
    host = torch.randn(4, requires_grad=True)
    dev = host.cuda()
    assert dev is not host and dev.device.type == "cpu"
    assert dev.cuda() is dev and dev.to("cuda") is dev       # already on the device
    back = dev.cpu()
    assert back is not dev and back.cpu() is back
    with torch.no_grad():                                     # the aliasing the GPU lacks
        d2 = host.to("cuda")
        d2.mul_(2)
    assert torch.equal(host.detach() * 2, d2)
    z = torch.zeros(3, device="cuda")
    assert z.cpu() is not z and (z + 1).cpu() is not z


def test_sdpa_gpu_only_backend_falls_back_to_math(gpu):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(1, 2, 8, 16, device="cuda")
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    ref = torch.softmax(q.double() @ q.double().transpose(-1, -2) / 4.0, -1) @ q.double()
    assert torch.allclose(out.double(), ref, atol=1e-5)


def test_disable_restores_torch(gpu):
    interpret.disable()
    assert not torch.cuda.is_available()
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.get_device_capability("cuda")


_PROGRAM = '''
import torch, cuda.tile as ct

@ct.kernel
def shift(X, Y, T: ct.Constant[int]):
    b = ct.bid(0)
    ct.store(Y, (b,), ct.load(X, (b + 1,), (T,), padding_mode=ct.PaddingMode.ZERO) + 1.0)

def test_main():
    assert torch.cuda.is_available()
    x = torch.arange(32, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    ct.launch(torch.cuda.current_stream(), (4,), shift, (x, y, 8))
    torch.cuda.synchronize()
    assert torch.equal(y[:24], x[8:] + 1) and torch.equal(y[24:], torch.ones(8)), y
    print("ok", torch.cuda.get_device_name())

if __name__ == "__main__":
    test_main()
'''


def _run(args, tmp_path, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SPAK_SIM")}
    e.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable] + args, cwd=tmp_path, env=e, capture_output=True,
                          text=True, timeout=300)


def test_python_m_spak_sim_runs_a_gpu_program(tmp_path):
    (tmp_path / "prog.py").write_text(_PROGRAM)
    r = _run(["-m", "spak.sim", "prog.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ok NVIDIA H100 (spak sim sm_90)" in r.stdout
    # block 3 loaded a tile wholly past the end: padding, and a finding at exit
    assert "out-of-bounds tile access" in r.stderr and "block (3, 0, 0)" in r.stderr
    assert "1 kernel launch(es)" in r.stderr and "launch memo: 0 hit(s), 1 simulated" in r.stderr
    r = _run(["-m", "spak.sim", "prog.py"], tmp_path, SPAK_SIM_STRICT="1")
    assert r.returncode != 0 and "lies entirely outside" in r.stderr


def test_spak_sim_environment_and_pytest_entry(tmp_path):
    (tmp_path / "prog.py").write_text("import spak.sim\n" + _PROGRAM)
    r = _run(["prog.py"], tmp_path, SPAK_SIM="1", SPAK_SIM_CUDA_AS_CPU="1")
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    (tmp_path / "test_prog.py").write_text(_PROGRAM)
    r = _run(["-m", "spak.sim", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_prog.py"],
             tmp_path)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    assert "spak sim: out-of-bounds tile accesses" in r.stdout
    assert "launch memo: 0 hit(s), 1 simulated" in r.stdout


def test_tf32_matmul_reference_as_cublas(gpu):
    """allow_tf32 on: a float32 product of "cuda" tensors uses TF32-rounded inputs (10-bit
    mantissa), as cuBLAS does; off: full float32."""
    a = torch.randn(16, 64, device="cuda")
    b = torch.randn(64, 8, device="cuda")
    exact = a.double() @ b.double()
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        t = a @ b
        ra = ((a.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
        rb = ((b.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
        assert torch.allclose(t.double(), ra.double() @ rb.double(), atol=1e-4)
        assert (t.double() - exact).abs().max() > 1e-4          # visibly not float32
        torch.backends.cuda.matmul.allow_tf32 = False
        assert (torch.mm(a, b).double() - exact).abs().max() < 1e-4
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def test_profiler_cuda_activity_reports_simulated_launches(gpu):
    # TileGym's benchmark_fn_cupti sums self_device_time_total of the CUDA events and refuses 0
    from torch.profiler import ProfilerActivity, profile
    x = torch.randn(4, 64, device="cuda")
    y = torch.empty_like(x)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            ct.launch(None, (4,), _double_rows, (x, y))
    cuda = [e for e in prof.key_averages() if str(e.device_type) == "DeviceType.CUDA"]
    assert [e.key for e in cuda] == ["_double_rows"] and cuda[0].count == 2
    assert cuda[0].self_device_time_total > 0
    assert torch.equal(y, x * 2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:   # no CUDA asked: none added
        ct.launch(None, (4,), _double_rows, (x, y))
    assert not [e for e in prof.key_averages() if str(e.device_type) == "DeviceType.CUDA"]


@ct.kernel
def _double_rows(X, Y):
    ct.store(Y, (ct.bid(0), 0), ct.load(X, (ct.bid(0), 0), (1, 64)) * 2.0)


def test_half_matmul_reference_as_cublas(gpu):
    # fp16/bf16 products of "cuda" tensors: float32 sums rounded once (cuBLAS), not CPU
    # torch's half GEMM (same sums, 100x slower); autograd flows through
    g = torch.Generator().manual_seed(11)
    for dt in (torch.float16, torch.bfloat16):
        a = torch.randn(3, 64, 96, generator=g).to(dt).cuda().requires_grad_()
        b = torch.randn(3, 96, 48, generator=g).to(dt).cuda()
        out = torch.bmm(a, b)
        assert out.dtype == dt and out.shape == (3, 64, 48)
        exact = a.detach().double() @ b.double()
        ulp = exact.abs().clamp_min(1e-3) * (2.0 ** -10 if dt == torch.float16 else 2.0 ** -7)
        assert torch.all((out.detach().double() - exact).abs() <= ulp)
        out.sum().backward()
        assert torch.allclose(a.grad.double(), b.double().sum(-1)[:, None, :].expand(3, 64, 96),
                              rtol=2e-2, atol=2e-2)
