"""spak.fmha's autograd and torch.compile wiring, on the CPU (issues 16 and 20).

No GPU here: the cuTile launches (spak.gpu.launch.fmha_into / fmha_bwd_into) are replaced by
float64 torch stand-ins that compute what the kernels compute, from the arguments the kernels
would get (the expanded float32 mask, the LSE the forward wrote, the scale, the causal flag).
What is tested is SPAK's own code around them: the op registrations (schemas, fake
implementations, torch.library.opcheck), the choice between the inference and the training
forward, what setup_context saves (O(S), never S x S), the backward's argument order and
empty-size paths, GQA, masks, the SPAK errors, torch.compile(fullgraph=True) (tile lookup at
run time, not in the traced graph), activation checkpointing and a training step.
Expected gradients come from torch autograd of a float64 reference attention (independent of
the stand-in's closed-form backward). GPU tests: tests/test_gpu_bwd.py.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spak  # noqa: E402
from spak import api  # noqa: E402
from spak.tune import store as tuned  # noqa: E402

F16, BF16 = torch.float16, torch.bfloat16
GPU, ARCH = "NVIDIA H100 80GB HBM3", "sm_90"
REAL_VALIDATE = api.validate


# ------------------------------------------------------------------ float64 references

def _scores(q, k, mask, causal, scale):
    """float64 scores with the mask added and bottom-right causal applied; GQA expanded."""
    Hq, Sq, Hkv, Sk = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    kk = k.double().repeat_interleave(Hq // Hkv, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    if causal:
        i, j = torch.arange(Sq)[:, None], torch.arange(Sk)[None, :]
        s = s.masked_fill(j > i + Sk - Sq, -math.inf)
    return s


def ref_attention(q, k, v, mask=None, causal=False, scale=None):
    """(out, lse) in float64, differentiable; a row that sees no key: out 0, lse +inf."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _scores(q, k, mask, causal, scale)
    dead = torch.isneginf(s.amax(-1, keepdim=True))
    s = torch.where(dead, 0.0, s)          # a dead row's scores as constants: no NaN grads
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse).masked_fill(dead, 0.0)
    vv = v.double().repeat_interleave(q.shape[1] // v.shape[1], 1)
    return p @ vv, lse.masked_fill(dead, math.inf).squeeze(-1)


def closed_form_grads(q, k, v, dout, mask, causal, scale):
    """The backward the kernels compute (FlashAttention-2's formulas), in float64:
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K scale, dK = dS^T Q scale;
    dK, dV summed over the query heads of a GQA group."""
    B, Hq, Hkv = q.shape[0], q.shape[1], k.shape[1]
    g = Hq // Hkv
    with torch.no_grad():
        out, lse = ref_attention(q, k, v, mask, causal, scale)
        s = _scores(q, k, mask, causal, scale)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        kk, vv = (t.double().repeat_interleave(g, 1) for t in (k, v))
        do = dout.double()
        ds = p * (do @ vv.transpose(-1, -2) - (do * out).sum(-1, keepdim=True))
        dq = ds @ kk * scale
        dk = ds.transpose(-1, -2) @ q.double() * scale
        dv = p.transpose(-1, -2) @ do
    group = lambda t: t.reshape(B, Hkv, g, *t.shape[2:]).sum(2)   # noqa: E731
    return dq, group(dk), group(dv)


def rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# ------------------------------------------------------------------ the CPU stand-ins


@pytest.fixture
def cpu(monkeypatch, tmp_path):
    """spak.fmha on CPU tensors, with the kernels replaced by float64 stand-ins.

    cpu.fwd / cpu.bwd: the keyword arguments each launch got; cpu.lookups: for each tile
    lookup (the CUDA driver query), whether it ran while Dynamo was tracing."""
    import spak.gpu.launch as gl
    r = SimpleNamespace(fwd=[], bwd=[], lookups=[], store=tmp_path / "tuned.json")
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(r.store))

    def device_info(device):
        r.lookups.append(torch.compiler.is_compiling())
        return ARCH, GPU

    def fwd(kernel, q, k, v, out, *, mask=None, causal=False, scale=None, tiles=None,
            hints=None, stream=None, lse=None):
        assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        r.fwd.append(dict(kernel=kernel, mask=mask, causal=causal, scale=scale, tiles=tiles,
                          hints=hints, lse=lse is not None))
        o, l = ref_attention(q, k, v, mask, causal, scale)
        out.copy_(o)
        if lse is not None:
            assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
            lse.copy_(l)
        return out

    def bwd(kernel, q, k, v, out, dout, lse, dq, dk, dv, *, mask=None, causal=False,
            scale=None, tiles=None, stream=None, hints=None):
        for t in (q, k, v, out, dout, lse):
            assert t.is_contiguous()
        r.bwd.append(dict(kernel=kernel, mask=mask, causal=causal, scale=scale, lse=lse.clone(),
                          out=out.clone()))
        # the LSE handed back is the forward's (not recomputed, not NaN)
        assert torch.equal(lse, ref_attention(q, k, v, mask, causal, scale)[1].float())
        for d, g in zip((dq, dk, dv), closed_form_grads(q, k, v, dout, mask, causal, scale)):
            d.copy_(g)
        return dq, dk, dv

    monkeypatch.setattr(api, "validate", lambda *a, **kw: REAL_VALIDATE(*a, require_cuda=False,
                                                                        **kw))
    monkeypatch.setattr(api, "_device_info", device_info)
    monkeypatch.setattr(api, "_BWD_AVAILABLE", True)
    monkeypatch.setattr(gl, "fmha_into", fwd)
    monkeypatch.setattr(gl, "fmha_bwd_into", bwd)
    monkeypatch.setattr(gl, "current_raw_stream", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)   # CPU: index None
    api._VALIDATED.clear()
    api._lookup_cache.clear()
    torch._dynamo.reset()
    yield r
    api._VALIDATED.clear()        # filled without the CUDA check: not for other tests
    api._lookup_cache.clear()
    torch._dynamo.reset()


def qkv(B=1, Hq=2, Hkv=2, Sq=24, Sk=24, D=16, Dv=None, dtype=F16, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    ts = [torch.randn(s, generator=g).to(dtype)
          for s in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, Dv or D))]
    return [t.requires_grad_(grad) for t in ts]


def spak_grads(q, k, v, dout, **kw):
    out = spak.fmha(q, k, v, **kw)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, (dq, dk, dv)


def expected_grads(q, k, v, dout, attn_mask=None, is_causal=False, scale=None, **_):
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, _ = ref_attention(qd, kd, vd, attn_mask, is_causal, scale)
    return out, torch.autograd.grad(out, (qd, kd, vd), dout.double())


def assert_close_grads(got, want, tol=2e-3):
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.dtype in (F16, BF16), name
        assert torch.isfinite(a).all(), name
        assert rel(a, b) <= tol, (name, rel(a, b))


# ------------------------------------------------------------------ schemas and fakes

def test_op_schemas():
    """torch.ops.spak.fmha keeps its schema (callers pass its arguments positionally);
    the training forward returns the LSE too; the backward returns one gradient per input."""
    args = ("(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool is_causal, float scale, "
            "str kernel, SymInt tile_m, SymInt tile_n, SymInt lat_k=0, SymInt lat_v=0, "
            "SymInt occupancy=0, SymInt num_ctas=0)")
    assert str(torch.ops.spak.fmha.default._schema) == "spak::fmha" + args + " -> Tensor"
    assert str(torch.ops.spak.fmha_fwd.default._schema) == "spak::fmha_fwd" + args + " -> Tensor"
    assert (str(torch.ops.spak.fmha_train.default._schema)
            == "spak::fmha_train" + args + " -> (Tensor, Tensor)")
    assert str(torch.ops.spak.fmha_bwd.default._schema) == (
        "spak::fmha_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor? attn_mask, bool is_causal, float scale) -> (Tensor, Tensor, Tensor)")


def test_fake_implementations_give_shapes_dtypes_and_devices():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 8, 100, 64, dtype=BF16, device="cuda")
        k, v = (torch.empty(2, 2, 300, d, dtype=BF16, device="cuda") for d in (64, 32))
        args = (None, True, 0.125, "fused", 64, 64)
        out = torch.ops.spak.fmha(q, k, v, *args)
        assert out.shape == (2, 8, 100, 32) and out.dtype == BF16 and out.device.type == "cuda"
        out, lse = torch.ops.spak.fmha_train(q, k, v, *args)
        assert out.shape == (2, 8, 100, 32) and lse.shape == (2, 8, 100)
        assert lse.dtype == torch.float32 and lse.device.type == "cuda"
        dq, dk, dv = torch.ops.spak.fmha_bwd(out, q, k, v, out, lse, None, True, 0.125)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        assert dq.dtype == dk.dtype == dv.dtype == BF16


def test_the_composite_op_picks_the_training_forward_only_when_a_gradient_is_needed(cpu):
    # FakeTensors on "cuda" cannot record autograd on a CPU-only torch (no CUDA device
    # guard): CPU tensors and the stand-in kernels instead
    from torch.utils._python_dispatch import TorchDispatchMode
    seen = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))
    q, k, v = qkv(grad=False)
    args = (None, False, 0.25, "fused", 64, 64)
    with Ops():
        torch.ops.spak.fmha(q, k, v, *args)
        q.requires_grad_()
        out = torch.ops.spak.fmha(q, k, v, *args)
        with torch.no_grad():
            torch.ops.spak.fmha(q, k, v, *args)
    assert [s for s in seen if "spak" in s] == ["spak.fmha_fwd", "spak.fmha_train",
                                                "spak.fmha_fwd"]
    assert out.requires_grad and [f["lse"] for f in cpu.fwd] == [False, True, False]


@pytest.mark.parametrize("which", ["fmha_fwd", "fmha_train", "fmha_train_grad", "fmha"])
def test_opcheck_forward_ops(cpu, which):
    q, k, v = qkv(Hq=4, Hkv=2, Sq=20, Sk=28, grad=which.endswith("grad") or which == "fmha")
    mask = torch.rand(20, 28, generator=torch.Generator().manual_seed(1)) > 0.2
    op = getattr(torch.ops.spak, which.replace("_grad", ""))
    for m in (None, api.kernel_mask(mask, 1, 4, 20, 28)):
        torch.library.opcheck(op, (q, k, v, m, True, 0.3, "fused", 64, 64))


def test_opcheck_backward_op(cpu):
    q, k, v = qkv(Hq=4, Hkv=1, Sq=20, Sk=12, grad=False)
    out, lse = ref_attention(q, k, v, None, True, 0.3)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(F16)
    torch.library.opcheck(torch.ops.spak.fmha_bwd,
                          (dout, q, k, v, out.to(F16), lse.float(), None, True, 0.3))


# ------------------------------------------------------------------ gradients

CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "gqa-4:1-causal": dict(shape=dict(Hq=8, Hkv=2), is_causal=True, enable_gqa=True),
    "mqa": dict(shape=dict(Hq=4, Hkv=1), enable_gqa=True),
    "sq<sk-causal": dict(shape=dict(Sq=9, Sk=40), is_causal=True),
    "sq>sk-causal-dead-rows": dict(shape=dict(Sq=40, Sk=9), is_causal=True),
    "bool-mask": dict(mask="bool"),
    "additive-mask-per-head": dict(mask="float", shape=dict(B=2)),
    "dv!=d": dict(shape=dict(D=16, Dv=8)),
    "scale-negative": dict(scale=-0.7),
    "bf16": dict(shape=dict(dtype=BF16)),
}


def _case(name):
    c = dict(CASES[name])
    shape = c.pop("shape", {})
    q, k, v = qkv(**shape, seed=len(name))
    kind = c.pop("mask", None)
    if kind:
        g = torch.Generator().manual_seed(7)
        B, Hq, Sq, Sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        keep = torch.rand(B, Hq, Sq, Sk, generator=g) > 0.25
        keep[0, 0, 3] = False                                     # one fully masked row
        c["attn_mask"] = keep if kind == "bool" else torch.where(
            keep, torch.randn(keep.shape, generator=g), -math.inf)
    dout = torch.randn(q.shape[:3] + v.shape[3:], generator=torch.Generator().manual_seed(3))
    return q, k, v, dout.to(q.dtype), c


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_float64_autograd(cpu, name):
    q, k, v, dout, kw = _case(name)
    out, got = spak_grads(q, k, v, dout, **kw)
    ref_out, want = expected_grads(q, k, v, dout, **kw)
    assert rel(out, ref_out) <= 2e-3
    tol = 2e-2 if q.dtype == BF16 else 2e-3
    assert_close_grads(got, want, tol)
    (f,), (b,) = cpu.fwd, cpu.bwd
    assert f["lse"] and f["kernel"] == "fused"
    assert b["scale"] == f["scale"] == (kw.get("scale") or 1 / math.sqrt(q.shape[3]))
    assert b["causal"] == f["causal"] == kw.get("is_causal", False)
    if "attn_mask" in kw:                  # the kernels' float32 mask, both directions
        assert b["mask"].dtype == torch.float32 and torch.equal(b["mask"], f["mask"])
    if name == "bool-mask" or name.endswith("dead-rows"):
        assert (got[0].abs().sum(-1) == 0).any()     # fully masked rows: zero dq, not NaN


def test_first_gradient_input_can_be_any_of_q_k_v(cpu):
    q, k, v, dout, _ = _case("plain")
    for grads in ((False, True, False), (False, False, True), (True, False, True)):
        q_, k_, v_ = (t.detach().requires_grad_(g) for t, g in zip((q, k, v), grads))
        spak.fmha(q_, k_, v_).backward(dout)
        _, want = expected_grads(q, k, v, dout)
        for t, w, g in zip((q_, k_, v_), want, grads):
            assert (t.grad is not None) == g
            if g:
                assert rel(t.grad, w) <= 2e-3


def test_non_contiguous_inputs_and_gradient(cpu):
    q, k, v, dout, _ = _case("causal")
    qt = q.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    assert not qt.is_contiguous()
    out = spak.fmha(qt, k, v, is_causal=True)
    dq, dk, dv = torch.autograd.grad(out, (qt, k, v), dout.transpose(1, 2).contiguous()
                                     .transpose(1, 2))
    assert_close_grads((dq, dk, dv), expected_grads(q, k, v, dout, is_causal=True)[1])


@pytest.mark.parametrize("empty", ["sq", "sk", "batch"])
def test_empty_sizes_give_zero_gradients_without_a_launch(cpu, empty):
    shape = {"sq": dict(Sq=0), "sk": dict(Sk=0), "batch": dict(B=0)}[empty]
    q, k, v = qkv(**shape)
    out = spak.fmha(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out),
                                     allow_unused=False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert not any(t.any() for t in (dq, dk, dv)) and cpu.bwd == []


def test_saved_state_is_o_s_never_s_by_s(cpu):
    """What autograd keeps between forward and backward: q, k, v, out, the float32 LSE and
    the caller's own mask tensor (not an expanded copy): nothing S x S is created for it."""
    Sq = Sk = 64
    q, k, v = qkv(Hq=4, Hkv=2, Sq=Sq, Sk=Sk)
    mask = torch.rand(Sq, Sk, generator=torch.Generator().manual_seed(4)) > 0.1
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        spak.fmha(q, k, v, enable_gqa=True, attn_mask=mask)
    shapes = sorted(tuple(t.shape) for t in saved)
    assert shapes == sorted([tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(q.shape),
                             (1, 4, Sq), (Sq, Sk)])
    assert any(t is mask for t in saved)
    lse = [t for t in saved if t.dtype == torch.float32]
    assert len(lse) == 1 and lse[0].shape == (1, 4, Sq)


def test_the_forward_writes_the_lse_only_when_a_gradient_is_needed(cpu):
    q, k, v = qkv()
    with torch.no_grad():
        spak.fmha(q, k, v)
    spak.fmha(q.detach(), k.detach(), v.detach())
    spak.fmha(q, k, v)
    assert [f["lse"] for f in cpu.fwd] == [False, False, True]


def test_the_training_forward_launches_what_inference_launches(cpu):
    """Same tiles, knobs and hints (from the tuned store) with and without the LSE."""
    tuned.write_store({"version": 1, "configs": [tuned.make_entry(
        GPU, "fused", "fp16", 16, True, 24, {"TILE_M": 32, "TILE_N": 16, "LAT_K": 2,
                                             "occupancy": 2})]}, cpu.store)
    q, k, v = qkv()
    with torch.no_grad():
        spak.fmha(q, k, v, is_causal=True)
    spak.fmha(q, k, v, is_causal=True)
    inf, train = cpu.fwd
    assert inf["tiles"] == train["tiles"] == {"TILE_M": 32, "TILE_N": 16, "LAT_K": 2,
                                              "LAT_V": 0}
    assert inf["hints"] == train["hints"] == {"occupancy": 2, "num_ctas": None}


# ------------------------------------------------------------------ errors

def test_a_mask_that_requires_grad_is_refused(cpu):
    q, k, v = qkv()
    bias = torch.zeros(24, 24, requires_grad=True)
    with pytest.raises(ValueError, match=r"attn_mask requires grad.*attn_mask\.detach\(\)"):
        spak.fmha(q, k, v, attn_mask=bias)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        spak.fmha(q.detach(), k.detach(), v.detach(), attn_mask=bias)
    out = spak.fmha(q, k, v, attn_mask=bias.detach())                 # the advice works
    out.sum().backward()
    assert q.grad is not None and bias.grad is None
    with torch.no_grad():
        spak.fmha(q, k, v, attn_mask=bias)                             # no gradient: fine


def test_the_naive_kernel_runs_forward_and_says_it_has_no_backward(cpu):
    q, k, v = qkv()
    out = spak.fmha(q, k, v, kernel="naive")
    assert out.requires_grad and cpu.fwd[-1]["kernel"] == "naive" and not cpu.fwd[-1]["lse"]
    assert rel(out, ref_attention(q, k, v)[0]) <= 2e-3
    with pytest.raises(NotImplementedError, match=r"kernel='naive' has no backward.*"
                                                  r"kernel='fused'"):
        out.sum().backward()
    assert cpu.bwd == []


def test_without_the_backward_kernels_the_error_is_spaks(cpu, monkeypatch):
    monkeypatch.setattr(api, "_BWD_AVAILABLE", False)
    q, k, v = qkv()
    out = spak.fmha(q, k, v)
    assert not cpu.fwd[-1]["lse"]             # no LSE kernel to ask for
    with pytest.raises(NotImplementedError, match="spak.fmha has no backward yet"):
        out.float().sum().backward()


def test_backward_available_reports_this_build():
    import importlib.util
    import inspect
    from spak.gpu.plan import plan_fmha
    api._BWD_AVAILABLE = None
    try:
        expect = (importlib.util.find_spec("spak.gpu.plan_bwd") is not None
                  and "lse" in inspect.signature(plan_fmha).parameters)
        assert api.backward_available() is expect
    finally:
        api._BWD_AVAILABLE = None


# ------------------------------------------------------------------ torch.compile

def test_fullgraph_compile_looks_tiles_up_at_run_time(cpu):
    """The issue's repro: under torch.compile(fullgraph=True) the tile lookup (a CUDA driver
    query and a file read) runs in the op's body at run time, never while tracing."""
    q, k, v = qkv(grad=False)
    f = torch.compile(lambda q, k, v: spak.fmha(q, k, v, is_causal=True) * 2, fullgraph=True,
                      backend="aot_eager")
    out = f(q, k, v)
    assert rel(out, 2 * ref_attention(q, k, v, causal=True)[0]) <= 2e-3
    assert cpu.lookups and not any(cpu.lookups)


def test_compiled_and_eager_calls_launch_the_same_config(cpu):
    tuned.write_store({"version": 1, "configs": [tuned.make_entry(
        GPU, "fused", "fp16", 16, False, 24, {"TILE_M": 32, "TILE_N": 16, "LAT_V": 3,
                                              "num_ctas": 2})]}, cpu.store)
    q, k, v = qkv(grad=False)
    for kw in (dict(), dict(tiles={"TILE_M": 16}), dict(tiles={"TILE_M": 32, "TILE_N": 32}),
               dict(kernel="naive"), dict(is_causal=True)):
        spak.fmha(q, k, v, **kw)
        torch.compile(lambda q, k, v: spak.fmha(q, k, v, **kw), fullgraph=True,
                      backend="aot_eager")(q, k, v)
        eager, compiled = cpu.fwd[-2:]
        assert eager["tiles"] == compiled["tiles"] and eager["hints"] == compiled["hints"], kw
    assert cpu.fwd[0]["tiles"]["TILE_M"] == 32 and cpu.fwd[0]["hints"]["num_ctas"] == 2
    assert cpu.fwd[2]["tiles"]["TILE_N"] == 128           # TILE_M given: TILE_N a default


def test_fullgraph_compile_trains(cpu):
    q, k, v, dout, kw = _case("gqa-4:1-causal")
    f = torch.compile(lambda q, k, v: spak.fmha(q, k, v, **kw), fullgraph=True,
                      backend="aot_eager")
    out = f(q, k, v)
    got = torch.autograd.grad(out, (q, k, v), dout)
    assert_close_grads(got, expected_grads(q, k, v, dout, **kw)[1])
    assert [f["lse"] for f in cpu.fwd] == [True] and len(cpu.bwd) == 1


def test_fullgraph_compile_refuses_a_mask_that_requires_grad(cpu):
    q, k, v = qkv()
    bias = torch.zeros(24, 24, requires_grad=True)
    f = torch.compile(lambda q, k, v, m: spak.fmha(q, k, v, attn_mask=m), fullgraph=True,
                      backend="aot_eager")
    # spak's ValueError, raised while Dynamo traces with fake tensors (Dynamo wraps it in
    # its TorchRuntimeError, a RuntimeError, naming the ValueError and its message)
    with pytest.raises(RuntimeError, match=r"ValueError\('attn_mask requires grad"):
        f(q, k, v, bias)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing(cpu, reentrant):
    from torch.utils.checkpoint import checkpoint
    q, k, v, dout, kw = _case("causal")
    out = checkpoint(lambda q, k, v: spak.fmha(q, k, v, **kw), q, k, v,
                     use_reentrant=reentrant)
    out.backward(dout)
    assert_close_grads((q.grad, k.grad, v.grad), expected_grads(q, k, v, dout, **kw)[1])
    # the forward ran twice (the second time in the backward, recording the LSE)
    assert len(cpu.fwd) == 2 and cpu.fwd[-1]["lse"] and len(cpu.bwd) == 1


class Block(torch.nn.Module):
    """A small attention block: qkv projection, attention, output projection."""

    def __init__(self, attend, dim=32, heads=2):
        super().__init__()
        self.attend, self.heads = attend, heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        o = self.attend(q.half(), k.half(), v.half()).float()
        return self.proj(o.transpose(1, 2).reshape(B, S, C))


def test_a_training_step_matches_sdpa(cpu):
    """One step of a block through spak.fmha (eager and compiled fullgraph) gives the
    weight gradients a float32 SDPA block gives, within fp16 rounding."""
    torch.manual_seed(0)
    x = torch.randn(2, 24, 32)
    ours = Block(lambda q, k, v: spak.fmha(q, k, v, is_causal=True))
    theirs = Block(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True))
    theirs.load_state_dict(ours.state_dict())
    theirs(x).square().mean().backward()
    for model in (ours, torch.compile(ours, fullgraph=True, backend="aot_eager")):
        ours.zero_grad()
        model(x).square().mean().backward()
        for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
            assert rel(a.grad, b.grad) <= 5e-3, name
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    before = ours(x).square().mean().item()
    opt.step()
    assert ours(x).square().mean().item() < before


# ------------------------------------------------------------------ end to end on the simulator

@pytest.fixture
def sim_kernels(monkeypatch, tmp_path):
    """spak.fmha on CPU tensors with the real launch plans (forward with LSE, the backward's
    three launches) executed by the CPU simulator: every ct.launch becomes sim.launch on
    numpy views of the torch tensors (bf16 through a float32 copy, written back)."""
    import cuda.tile as ct
    import numpy as np
    from spak import sim
    from spak.gpu.plan_bwd import PARTIAL_WRITERS
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(tmp_path / "none.json"))   # default tiles
    monkeypatch.setattr(api, "validate", lambda *a, **kw: REAL_VALIDATE(*a, require_cuda=False,
                                                                        **kw))
    monkeypatch.setattr(api, "_device_info", lambda device: (ARCH, GPU))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    import spak.gpu.launch as gl
    monkeypatch.setattr(gl, "current_raw_stream", lambda device=None: 0)
    names = []

    def launch(stream, grid, kernel, args):
        arrays, back = [], []
        for a in args:
            if isinstance(a, torch.Tensor):
                if a.dtype == BF16:
                    arr = sim.SimArray(a.float().numpy(), ct.bfloat16)
                    back.append((a, arr))
                else:
                    arr = sim.SimArray(a.numpy())
                arrays.append(arr)
            else:
                arrays.append(a)
        # the fused-dQ pass leaves parts of its workspaces unwritten by design
        sim.launch(kernel, grid, tuple(arrays), model="sm_90",
                   check_unwritten=kernel not in PARTIAL_WRITERS)
        for t, arr in back:
            t.copy_(torch.from_numpy(np.asarray(arr.data)))
        names.append(kernel._annotated_function.pyfunc.__name__)
    monkeypatch.setattr(ct, "launch", launch)
    from spak import bwd_ready
    caches = (api._VALIDATED, gl._FUSED_PLANS, gl._BWD_PLANS, bwd_ready)
    for cache in caches:
        cache.clear()
    yield names
    for cache in caches:
        cache.clear()


SIM_CASES = {
    "gqa-causal-sq<sk-mask-fp16": dict(shape=dict(Hq=4, Hkv=2, Sq=40, Sk=72), dtype=F16,
                                       is_causal=True, enable_gqa=True, mask=True),
    "causal-sq>sk-bf16": dict(shape=dict(Sq=70, Sk=33), dtype=BF16, is_causal=True),
}


@pytest.mark.parametrize("name", list(SIM_CASES))
def test_gradients_through_the_real_kernels_on_the_simulator(sim_kernels, name):
    """spak.fmha's autograd runs the fused forward's LSE entry point and the backward's
    launches (run here by the simulator): the gradients are the simulator's own
    (spak.cpu.simrun_bwd, bit for bit) and near float64."""
    import spak.gpu.launch as gl
    c = dict(SIM_CASES[name])
    shape, dtype, has_mask = c.pop("shape"), c.pop("dtype"), c.pop("mask", False)
    for seed in (5, 6):     # the second call reuses the planned recipes with new tensors
        q, k, v = qkv(**shape, D=32, dtype=dtype, seed=seed)
        check_against_the_simulator(q, k, v, has_mask, c, seed)
    assert sim_kernels == ["fmha_fwd_lse_kernel", "fmha_bwd_preprocess_kernel",
                           "fmha_bwd_dkdv_kernel", "fmha_bwd_dq_kernel"] * 2
    assert len(gl._BWD_PLANS) == 1


def test_the_prepared_backward_gives_the_simulators_bits(sim_kernels):
    """Issue 34: the first backward of a call signature keeps its launcher (spak.bwd_ready);
    the second step runs it, the third with the workspace it kept: each step's gradients
    are the simulator's own (simrun_bwd, bit for bit) and near float64."""
    from spak import bwd_ready
    for seed in (21, 22, 23):
        q, k, v = qkv(Sq=40, Sk=40, D=32, seed=seed)
        check_against_the_simulator(q, k, v, False, dict(is_causal=True), seed)
    (ready,) = bwd_ready._READY.values()
    assert len(ready.kept) == 1                      # steps 2 and 3 shared one workspace
    assert sim_kernels == ["fmha_fwd_lse_kernel", "fmha_bwd_preprocess_kernel",
                           "fmha_bwd_dkdv_kernel", "fmha_bwd_dq_kernel"] * 3


def test_a_stored_fused_dq_config_trains_through_spak_fmha(sim_kernels, monkeypatch):
    """Issue 35: a store entry with DQ_FUSED 1 (here: spak.api._bwd_config's answer) makes
    spak.fmha's backward the two-launch fused-dQ pass, twice (the second step through the
    prepared launcher and its kept workspaces); its gradients are the simulator's own for
    that plan, bit for bit, and near float64."""
    import numpy as np
    from spak.cpu.simrun_bwd import simulate_fmha_bwd
    from spak.gpu.plan import default_tiles
    monkeypatch.setattr(api, "_bwd_config", lambda *a: ({"DQ_FUSED": 1}, None))
    for seed in (31, 32):
        q, k, v = qkv(Hq=4, Hkv=2, Sq=70, Sk=70, D=32, seed=seed)
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q.dtype)
        out, got = spak_grads(q, k, v, dout, is_causal=True, enable_gqa=True)
        held = lambda t: t.detach().numpy()                      # noqa: E731
        ref, _ = simulate_fmha_bwd("fused", held(q), held(k), held(v), held(dout), causal=True,
                                   fwd_tiles=default_tiles(32, ARCH, True),
                                   tiles={"DQ_FUSED": 1}, dtype="fp16")
        for name_, t in zip(("dq", "dk", "dv"), got):
            assert np.array_equal(held(t), ref[name_]), name_
        _, want = expected_grads(q, k, v, dout, is_causal=True, enable_gqa=True)
        assert_close_grads(got, want, 3e-3)
    assert sim_kernels == ["fmha_fwd_lse_kernel", "fmha_bwd_preprocess_dq_kernel",
                           "fmha_bwd_dkdvdq_kernel"] * 2


def test_self_attention_with_one_tensor_for_q_k_v_on_the_simulator(sim_kernels):
    """q is k is v: the backward's recipe cannot tell them apart, so it is not cached."""
    import spak.gpu.launch as gl
    x = qkv(Sq=40, Sk=40, D=32, seed=12)[0]
    check_against_the_simulator(x, x, x, False, dict(is_causal=True), 12)
    assert not gl._BWD_PLANS
    check_against_the_simulator(*qkv(Sq=40, Sk=40, D=32, seed=13), False,
                                dict(is_causal=True), 13)
    assert len(gl._BWD_PLANS) == 1


def check_against_the_simulator(q, k, v, has_mask, c, seed):
    from spak.cpu.simrun_bwd import simulate_fmha_bwd
    from spak.gpu.plan import default_tiles
    c = dict(c)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).to(q.dtype)
    if has_mask:
        keep = torch.rand(q.shape[2], k.shape[2], generator=torch.Generator().manual_seed(8))
        c["attn_mask"] = torch.where(keep > 0.2, keep, -math.inf)        # additive, float32
    if q is k:
        out = spak.fmha(q, k, v, **c)
        (dx,) = torch.autograd.grad(out, (q,), dout)
    else:
        out, got = spak_grads(q, k, v, dout, **c)
    held = (lambda t: t.detach().numpy()) if q.dtype == F16 else \
        (lambda t: t.detach().float().numpy())
    mask = c.get("attn_mask")
    ref, _ = simulate_fmha_bwd(
        "fused", held(q), held(k), held(v), held(dout),
        mask=None if mask is None else mask.numpy(), causal=c.get("is_causal", False),
        fwd_tiles=default_tiles(q.shape[3], ARCH, c.get("is_causal", False)),
        dtype="fp16" if q.dtype == F16 else "bf16")
    assert np.array_equal(held(out), ref["out"])
    if q is k:      # the three gradients of one tensor add up (in float32 here)
        total = sum(torch.from_numpy(ref[n]).float() for n in ("dq", "dk", "dv"))
        assert rel(dx, total) <= 2e-3
        return
    _, want = expected_grads(q, k, v, dout, **c)
    assert_close_grads(got, want, 3e-2 if q.dtype == BF16 else 3e-3)
    for name_, t in zip(("dq", "dk", "dv"), got):
        assert np.array_equal(held(t), ref[name_]), name_


def test_compiled_training_through_the_simulator_gives_the_eager_bits(sim_kernels):
    q, k, v = qkv(Hq=4, Hkv=1, Sq=33, Sk=50, D=16, seed=9)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(10)).to(F16)
    kw = dict(is_causal=True, enable_gqa=True)
    eager = spak_grads(q, k, v, dout, **kw)
    f = torch.compile(lambda q, k, v: spak.fmha(q, k, v, **kw), fullgraph=True,
                      backend="aot_eager")
    out = f(q, k, v)
    compiled = (out, torch.autograd.grad(out, (q, k, v), dout))
    assert torch.equal(eager[0], compiled[0])
    assert all(torch.equal(a, b) for a, b in zip(eager[1], compiled[1]))


def test_the_plan_cache_keeps_no_call_tensors_alive(monkeypatch):
    """gpu.launch's cached fused plans hold None in the call tensors' places (and one dummy
    mask per device): a cached output from a CUDA-graph pool is an error for torch.compile's
    CUDA graphs, and any cached output is memory never given back."""
    import gc
    import weakref
    import cuda.tile as ct
    import spak.gpu.launch as gl
    launched = []
    monkeypatch.setattr(ct, "launch", lambda stream, grid, kernel, args: launched.append(args))
    gl._FUSED_PLANS.clear()
    for lse in (None, torch.empty(1, 2, 100, dtype=torch.float32)):
        q, k, v, out = (torch.randn(1, 2, 100, 64, dtype=F16) for _ in range(4))
        gl.fmha_into("fused", q, k, v, out, causal=True, scale=0.125, stream=0, lse=lse)
        assert all(a is b for a, b in zip(launched[-1][:4], (q, k, v, out)))
        refs = [weakref.ref(t) for t in (q, k, v, out)]
        del q, k, v, out
        launched.clear()
        gc.collect()
        assert all(r() is None for r in refs)
    (L1, d1), (L2, d2) = gl._FUSED_PLANS.values()
    assert L1.args[:4] == (None,) * 4 and L2.args[:4] == (None,) * 4 and L2.args[5] is None
    assert d1 is d2 is L1.args[4]
    gl._FUSED_PLANS.clear()
