"""spak.fmha's backward and torch integration on a CUDA GPU (issues 16 and 20).

Marked `gpu`: skipped without a CUDA GPU (conftest.py). Gradients are checked against float64
torch autograd of the reference attention, next to SDPA's own error on the same inputs;
torch.compile(fullgraph=True), CUDA graphs, compile + graphs, max-autotune inside an
nn.Module, activation checkpointing, determinism and the error paths. The benchmark is
`spak run --family fmha_bwd` (docs/fmha-training.md; ci/bwd_bench.py@f3e1eb2 before).
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

import spak  # noqa: E402

F16, BF16 = torch.float16, torch.bfloat16


def make(B, Hq, Hkv, Sq, Sk, D, dtype=F16, seed=0, grad=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ts = [torch.randn(s, device="cuda", dtype=dtype, generator=g)
          for s in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D), (B, Hq, Sq, D))]
    return [t.requires_grad_(grad) for t in ts[:3]] + [ts[3]]


def ref64(q, k, v, mask=None, causal=False, scale=None):
    """float64 attention, differentiable; bottom-right causal; rows with no key give 0."""
    Hq, Sq, D = q.shape[1], q.shape[2], q.shape[3]
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    kk = k.double().repeat_interleave(Hq // Hkv, 1)
    vv = v.double().repeat_interleave(Hq // Hkv, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    if causal:
        i = torch.arange(Sq, device="cuda")[:, None]
        j = torch.arange(Sk, device="cuda")[None, :]
        s = s.masked_fill(j > i + Sk - Sq, -math.inf)
    dead = torch.isneginf(s.amax(-1, keepdim=True))
    p = torch.softmax(torch.where(dead, 0.0, s), -1).masked_fill(dead, 0.0)
    return p @ vv


def grads(f, q, k, v, dout):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = f(q, k, v)
    return (out.detach(),) + torch.autograd.grad(out, (q, k, v), dout)


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def sdpa(mask=None, causal=False, group=1):
    """SDPA (default backend choice) on the same problem: the error yardstick."""
    def f(q, k, v):
        if group > 1:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        m = mask if mask is None or mask.dtype == torch.bool else mask.to(q.dtype)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                                is_causal=causal)
    return f


CASES = {   # (B, Hq, Hkv, Sq, Sk, D), kwargs, SDPA can compare (no top-left/bottom-right clash)
    "d64-causal": ((2, 4, 4, 512, 512, 64), dict(is_causal=True), True),
    "d128": ((1, 4, 4, 1000, 1000, 128), dict(), True),
    "gqa-4:1-causal": ((1, 8, 2, 384, 384, 64), dict(is_causal=True, enable_gqa=True), True),
    "sq<sk-causal": ((1, 4, 4, 200, 700, 64), dict(is_causal=True), False),
    "d80-bf16": ((1, 4, 4, 300, 300, 80), dict(dtype=BF16), True),
    "bool-mask": ((2, 4, 4, 256, 320, 64), dict(mask="bool"), True),
    "additive-mask-causal": ((1, 4, 4, 256, 256, 128), dict(mask="add", is_causal=True), True),
}


def _case(name):
    shape, kw, comparable = CASES[name]
    kw = dict(kw)
    dtype = kw.pop("dtype", F16)
    q, k, v, dout = make(*shape, dtype=dtype, seed=len(name))
    kind = kw.pop("mask", None)
    if kind:
        g = torch.Generator(device="cuda").manual_seed(11)
        keep = torch.rand(shape[0], 1, shape[3], shape[4], device="cuda", generator=g) > 0.2
        keep[..., 0] = True
        bias = torch.randn(keep.shape, device="cuda", generator=g).to(dtype).float()
        kw["attn_mask"] = keep if kind == "bool" else bias.masked_fill(~keep, -math.inf)
    return q, k, v, dout, kw, comparable


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_vs_float64_and_sdpa(name):
    q, k, v, dout, kw, comparable = _case(name)
    ours = grads(lambda q, k, v: spak.fmha(q, k, v, **kw), q, k, v, dout)
    # float64 leaves: the reference's gradients stay float64 (not cast back to fp16)
    want = grads(lambda q, k, v: ref64(q, k, v, kw.get("attn_mask"), kw.get("is_causal",
                                                                              False)),
                 q.double(), k.double(), v.double(), dout.double())
    errs = [rel(a, b) for a, b in zip(ours, want)]
    assert all(torch.isfinite(t).all() for t in ours)
    gate = 3e-2 if q.dtype == BF16 else 4e-3
    assert max(errs) <= gate, errs
    if comparable:
        theirs = grads(sdpa(kw.get("attn_mask"), kw.get("is_causal", False),
                            q.shape[1] // k.shape[1]), q, k, v, dout)
        peer = [rel(a, b) for a, b in zip(theirs, want)]
        for name_, e, p in zip(("out", "dq", "dk", "dv"), errs, peer):
            assert e <= 1.5 * p + 2e-4, (name_, e, p)


def test_fully_masked_rows_give_zero_gradients_never_nan():
    q, k, v, dout = make(1, 2, 2, 300, 100, 64)
    out, dq, dk, dv = grads(lambda q, k, v: spak.fmha(q, k, v, is_causal=True), q, k, v, dout)
    dead = slice(0, 200)                         # bottom-right: rows 0..199 see no key
    assert (out[:, :, dead] == 0).all() and (dq[:, :, dead] == 0).all()
    assert all(torch.isfinite(t).all() for t in (out, dq, dk, dv))


def test_backward_is_deterministic_and_the_ops_give_the_autograd_bits():
    from spak import api
    q, k, v, dout = make(2, 8, 2, 1000, 1000, 64)
    f = lambda q, k, v: spak.fmha(q, k, v, is_causal=True, enable_gqa=True)   # noqa: E731
    a, b = grads(f, q, k, v, dout), grads(f, q, k, v, dout)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    args = api._op_args(q, k, v, None, True, None, True, "fused", None)
    out, lse = torch.ops.spak.fmha_train(q, k, v, *args)
    assert lse.shape == (2, 8, 1000) and lse.dtype == torch.float32
    g = torch.ops.spak.fmha_bwd(dout, q, k, v, out, lse, None, True, 0.125)
    assert torch.equal(out, a[0]) and all(torch.equal(x, y) for x, y in zip(g, a[1:]))


def test_activation_checkpointing_gives_the_same_bits():
    from torch.utils.checkpoint import checkpoint
    q, k, v, dout = make(1, 4, 4, 512, 512, 128)
    f = lambda q, k, v: spak.fmha(q, k, v, is_causal=True)   # noqa: E731
    plain = grads(f, q, k, v, dout)
    for reentrant in (False, True):
        # .backward(), not autograd.grad: the reentrant variant supports only the former
        q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
        out = checkpoint(f, q2, k2, v2, use_reentrant=reentrant)
        out.backward(dout)
        ck = (out.detach(), q2.grad, k2.grad, v2.grad)
        assert all(torch.equal(x, y) for x, y in zip(plain, ck)), reentrant


def test_saved_state_is_o_s():
    q, k, v, _ = make(1, 8, 8, 4096, 4096, 64)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        spak.fmha(q, k, v, is_causal=True)
    assert max(t.numel() for t in saved) == q.numel()            # nothing S x S
    assert sum(t.dtype == torch.float32 for t in saved) == 1     # the LSE


def test_errors_on_the_gpu():
    q, k, v, dout = make(1, 2, 2, 128, 128, 64)
    bias = torch.zeros(128, 128, device="cuda", requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        spak.fmha(q, k, v, attn_mask=bias)
    out = spak.fmha(q, k, v, kernel="naive")
    with pytest.raises(NotImplementedError, match="kernel='naive' has no backward"):
        out.backward(dout)


# ------------------------------------------------------------------ issue 20: torch.compile

def test_fullgraph_compile_forward_matches_eager():
    """The issue's repro: torch.compile(fullgraph=True) of a function around spak.fmha."""
    q, k, v, _ = make(2, 8, 2, 256, 256, 64, grad=False)
    torch._dynamo.reset()
    f = lambda q, k, v: spak.fmha(q, k, v, is_causal=True, enable_gqa=True) * 2  # noqa: E731
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v))


def test_fullgraph_compile_trains_with_the_eager_bits():
    q, k, v, dout = make(1, 8, 2, 640, 640, 128)
    f = lambda q, k, v: spak.fmha(q, k, v, is_causal=True, enable_gqa=True)   # noqa: E731
    torch._dynamo.reset()
    eager = grads(f, q, k, v, dout)
    compiled = grads(torch.compile(f, fullgraph=True), q, k, v, dout)
    assert all(torch.equal(x, y) for x, y in zip(eager, compiled))


def test_cuda_graph_capture_forward_and_backward():
    q, k, v, dout = make(1, 4, 4, 512, 512, 64)
    f = lambda q, k, v: spak.fmha(q, k, v, is_causal=True)   # noqa: E731
    eager = grads(f, q, k, v, dout)
    sq, sk, sv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    sdout = dout.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                          # warm-up: compiles, plans, allocator
        for _ in range(2):
            out = f(sq, sk, sv)
            torch.autograd.grad(out, (sq, sk, sv), sdout)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = f(sq, sk, sv)
        gq, gk, gv = torch.autograd.grad(out, (sq, sk, sv), sdout)
    q2, k2, v2, dout2 = make(1, 4, 4, 512, 512, 64, seed=3, grad=False)
    with torch.no_grad():
        for dst, src in ((sq, q2), (sk, k2), (sv, v2), (sdout, dout2)):
            dst.copy_(src)
    graph.replay()
    again = grads(f, q2, k2, v2, dout2)
    assert all(torch.equal(x, y) for x, y in zip((out, gq, gk, gv), again))
    assert not all(torch.equal(x, y) for x, y in zip(again, eager))   # new inputs, new values


def test_compile_with_cuda_graphs_reduce_overhead():
    q, k, v, _ = make(1, 8, 8, 512, 512, 64, grad=False)
    torch._dynamo.reset()
    f = lambda q, k, v: spak.fmha(q, k, v, is_causal=True) + 1   # noqa: E731
    g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for seed in range(3):                    # record, then replay with new inputs
        q2, k2, v2, _ = make(1, 8, 8, 512, 512, 64, seed=seed, grad=False)
        assert torch.equal(g(q2, k2, v2).clone(), f(q2, k2, v2))


class Block(torch.nn.Module):
    """LayerNorm, attention, residual: no matmul for max-autotune to search over."""

    def __init__(self, heads=8, dim=64):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.norm = torch.nn.LayerNorm(heads * dim, dtype=F16)

    def forward(self, x):
        B, S, C = x.shape
        h = self.norm(x).view(B, S, self.heads, self.dim).transpose(1, 2)
        o = spak.fmha(h, h, h, is_causal=True)
        return x + o.transpose(1, 2).reshape(B, S, C)


def test_module_with_max_autotune():
    torch._dynamo.reset()
    block = Block().cuda()
    x = torch.randn(2, 512, 512, device="cuda", dtype=F16)
    with torch.no_grad():
        want = block(x)
        got = torch.compile(block, mode="max-autotune", fullgraph=True)(x)
    assert rel(got, want) <= 1e-3
