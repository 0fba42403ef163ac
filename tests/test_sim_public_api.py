"""The public functions as a user calls them, in interpreter mode on the CPU (issue 37):
spak.fmha, spak.fmha_kvcache and spak.fmha_varlen on "cuda" tensors (sim.cuda_as_cpu: the
CPU), their kernels run by the simulator, numbers checked against float64 on fresh random
inputs. Small shapes: each call runs the real kernels block by block."""
import numpy as np
import pytest
import torch

import spak
from spak.sim import interpret

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="interpreter mode's simulated GPU is for CPU torch")


@pytest.fixture
def gpu():
    interpret.enable(cuda_as_cpu=True, tensor_is_cuda=True)
    yield
    interpret.disable()


def _rand(gen, *shape, dtype=torch.float16):
    return torch.randn(*shape, generator=gen, device="cuda").to(dtype)


def _attend(q, k, v, scale, allowed=None):
    """float64 softmax(q k^T scale) v over [B, H, S, D]; rows with no allowed key: 0."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v.double()


def _close(out, ref, what):
    """Within a few units of the output dtype's rounding (P and the output are rounded to
    it: fp16 2^-11, bf16 2^-8 relative)."""
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    err = (out.double() - ref).abs().max().item()
    tol = (2e-3 if out.dtype == torch.float16 else 1.2e-2) * max(1.0, ref.abs().max().item())
    assert err < tol, f"{what}: max error {err} (tolerance {tol})"
    assert ref.abs().max().item() > 0.05          # the reference is not zeros


@pytest.mark.parametrize("causal,dtype", [(True, torch.float16), (False, torch.bfloat16)])
def test_fmha(gpu, causal, dtype):
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    q, k, v = (_rand(gen, 1, 2, 64 + 16 * i, 64, dtype=dtype) for i in (0, 1, 1))
    q = q[:, :, :64]
    out = spak.fmha(q, k, v, is_causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    allowed = None
    if causal:                                 # spak.fmha: bottom-right (docstring)
        allowed = torch.arange(80)[None, :] <= torch.arange(64)[:, None] + 80 - 64
    _close(out, _attend(q, k, v, 64 ** -0.5, allowed), "spak.fmha")


def test_fmha_kvcache(gpu):
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    B, Hq, Hkv, D, cap = 2, 4, 2, 64, 96
    q = _rand(gen, B, 1, Hq, D)
    kc, vc = _rand(gen, B, cap, Hkv, D), _rand(gen, B, cap, Hkv, D)
    lens = torch.tensor([37, 96], dtype=torch.int32, device="cuda")
    out = spak.fmha_kvcache(q, kc, vc, lens)
    assert out.shape == (B, 1, Hq, D)
    for b in range(B):
        L = int(lens[b])
        kk = kc[b, :L].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        vv = vc[b, :L].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        ref = _attend(q[b].transpose(0, 1), kk, vv, D ** -0.5)      # [Hq, 1, D]
        _close(out[b].transpose(0, 1), ref, f"spak.fmha_kvcache sequence {b}")


def test_fmha_varlen(gpu):
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    lens_q, lens_k, H, D = [40, 17], [40, 50], 2, 64
    cu_q = torch.tensor([0, 40, 57], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 40, 90], dtype=torch.int32, device="cuda")
    q, k, v = _rand(gen, 57, H, D), _rand(gen, 90, H, D), _rand(gen, 90, H, D)
    out = spak.fmha_varlen(q, k, v, cu_q, cu_k, 40, 50, is_causal=True)
    assert out.shape == (57, H, D)
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        qs, ks = int(cu_q[b]), int(cu_k[b])
        qq, kk, vv = (t.transpose(0, 1) for t in (q[qs:qs + lq], k[ks:ks + lk], v[ks:ks + lk]))
        allowed = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + lk - lq
        ref = _attend(qq, kk, vv, D ** -0.5, allowed)
        _close(out[qs:qs + lq].transpose(0, 1), ref, f"spak.fmha_varlen sequence {b}")


@pytest.mark.parametrize("shape", ["2x8:2x100x64/page16", "3x4:1x2:70x64/causal"])
def test_decode_family_eager_call_is_the_public_function(gpu, monkeypatch, shape):
    """`spak run --timing eager` of fmha_decode times spak.fmha_kvcache itself (the
    family's eager_call) on the harness's input set: one public call per eager call, its
    output within the gate of the float64 reference; the other kernel names keep their
    planned launches (None)."""
    import spak.kvcache as kv
    from spak import families
    fam = families.get("fmha_decode")
    problem = fam.parse(shape)
    # the inputs made on the CPU: torch.Generator(device="cuda") is outside the emulation
    inputs = fam.gpu_inputs(problem, seed=int(np.random.SeedSequence().entropy % 2**31),
                            device="cpu")
    calls = []
    real = kv.fmha_kvcache
    monkeypatch.setattr(kv, "fmha_kvcache", lambda *a, **k: calls.append(1) or real(*a, **k))
    call = fam.eager_call(fam.kernels[0], problem, inputs)
    assert fam.eager_call("splitkv_pow2", problem, inputs) is None
    out = call()
    assert len(calls) == 1
    ref = fam.gpu_reference(problem, inputs)["out"]
    _close(out, ref.double(), f"eager_call {shape}")
