"""spak.fmha on a CUDA GPU: both kernels vs float64 and vs SDPA; edge cases; torch.compile.

Marked `gpu`: skipped without a CUDA GPU (conftest.py). Run on an H100/H200 with
`python -m pytest -m gpu -v`; the recorded output is in results/.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

import spak  # noqa: E402
from spak.core.metrics import GATES  # noqa: E402

KERNELS = ("fused", "naive")
DT = {"fp16": torch.float16, "bf16": torch.bfloat16}


def ref64(q, k, v, *, mask=None, causal=False, scale=None):
    """float64 attention on the GPU; bottom-right causal; dead rows -> 0."""
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    g = Hq // Hkv
    kk = k.double().repeat_interleave(g, dim=1)
    vv = v.double().repeat_interleave(g, dim=1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    if causal:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Sk - Sq, -math.inf)
    mx = s.amax(-1, keepdim=True)
    dead = torch.isneginf(mx)
    p = torch.exp(s - torch.where(dead, 0.0, mx))
    o = (p @ vv) / torch.where(dead, 1.0, p.sum(-1, keepdim=True))
    return torch.where(dead, 0.0, o)


def rel(a, b):
    a, b = a.double(), b.double()
    d = torch.linalg.vector_norm(b)
    return float(torch.linalg.vector_norm(a - b) / d) if d else float(torch.linalg.vector_norm(a))


def make(B, Hq, Hkv, Sq, Sk, D, dtype="fp16", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: torch.randn(s, device="cuda", dtype=DT[dtype], generator=g)  # noqa: E731
    return mk(B, Hq, Sq, D), mk(B, Hkv, Sk, D), mk(B, Hkv, Sk, D)


SHAPES = [  # seed shapes + awkward ones: (B, Hq, Hkv, Sq, Sk, D)
    (16, 16, 16, 2048, 2048, 64), (2, 8, 8, 512, 512, 64), (1, 8, 8, 512, 512, 64),
    (4, 16, 16, 2048, 2048, 128),
    (1, 2, 2, 1, 1, 64), (1, 2, 2, 17, 17, 128), (1, 4, 4, 1000, 1000, 64),
    (1, 4, 4, 1000, 1000, 128), (2, 4, 1, 1, 1000, 128),      # decode, GQA 4:1
    (1, 4, 4, 100, 300, 64), (1, 4, 4, 300, 100, 64),          # Sq < Sk, Sq > Sk
    (1, 16, 2, 1000, 1000, 64), (2, 8, 1, 333, 333, 128),      # GQA 8:1
]


def _id(s):
    return "x".join(map(str, s))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_vs_float64_and_sdpa_fp16(kernel, causal, shape):
    B, Hq, Hkv, Sq, Sk, D = shape
    if kernel == "naive" and B * Hq * Sq * Sk > 2 ** 28:
        pytest.skip("naive workspace too large for a unit test")
    q, k, v = make(*shape)
    out = spak.fmha(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv, kernel=kernel)
    assert out.shape == (B, Hq, Sq, D) and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    ref = ref64(q, k, v, causal=causal)
    assert rel(out, ref) <= GATES["fp16"]
    # SDPA with an explicit bottom-right mask when Sq != Sk (its is_causal is top-left)
    if causal and Sq != Sk:
        i = torch.arange(Sq, device="cuda")[:, None]
        m = torch.arange(Sk, device="cuda")[None, :] <= i + Sk - Sq
        sd = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                              enable_gqa=Hq != Hkv)
        # rows that see no key: SPAK gives zeros, SDPA does not (NaN, or a mean of V)
        sd = torch.nan_to_num(sd).masked_fill(~m.any(-1, keepdim=True), 0.0)
    else:
        sd = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                              enable_gqa=Hq != Hkv)
    assert rel(out, sd) <= 2 * GATES["fp16"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [(1, 2, 2, 17, 17, 64), (1, 4, 4, 1000, 1000, 128),
                                   (1, 16, 2, 512, 512, 64), (1, 4, 1, 1, 1000, 64)], ids=_id)
def test_bf16(kernel, shape):
    q, k, v = make(*shape, dtype="bf16")
    for causal in (False, True):
        out = spak.fmha(q, k, v, is_causal=causal, enable_gqa=True, kernel=kernel)
        assert torch.isfinite(out).all()
        assert rel(out, ref64(q, k, v, causal=causal)) <= GATES["bf16"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_masks_and_fully_masked_rows_are_zero(kernel):
    B, H, Sq, Sk, D = 2, 4, 77, 130, 64
    q, k, v = make(B, H, H, Sq, Sk, D)
    g = torch.Generator(device="cuda").manual_seed(1)
    keep = torch.rand(B, 1, Sq, Sk, device="cuda", generator=g) >= 0.2
    keep[0, 0, 5] = False                                   # a dead row
    add = torch.randn(B, 1, Sq, Sk, device="cuda", generator=g).masked_fill(~keep, -math.inf)
    for mask in (keep, add, add.half(), keep[0, 0]):        # bool, float32, fp16, 2D
        for causal in (False, True):
            out = spak.fmha(q, k, v, attn_mask=mask, is_causal=causal, kernel=kernel)
            assert not torch.isnan(out).any()
            ref = ref64(q, k, v, mask=mask, causal=causal)
            assert rel(out, ref) <= GATES["fp16"]
            assert (out[0, :, 5] == 0).all()
    # Sq > Sk causal: the first Sq - Sk rows see no key -> zeros
    q, k, v = make(1, 2, 2, 300, 100, 64)
    out = spak.fmha(q, k, v, is_causal=True, kernel=kernel)
    assert (out[:, :, :200] == 0).all() and torch.isfinite(out).all()


@pytest.mark.parametrize("scale", [0.0, -0.3, 0.05, 2.0])
def test_zero_and_negative_scales(scale):
    q, k, v = make(1, 2, 2, 100, 130, 64)
    for causal in (False, True):
        out = spak.fmha(q, k, v, scale=scale, is_causal=causal)
        assert rel(out, ref64(q, k, v, scale=scale, causal=causal)) <= GATES["fp16"]


def _extreme_cases():
    """(name, q, k, v, scale): logits far outside training ranges, for the fused kernel's
    RAW_MAX path (gpu/kernels/fused.py, _raw_max_step), on the GPU and in the simulator."""
    q, k, v = make(1, 2, 2, 40, 70, 64, seed=5)
    yield "scale 1e30 (every row huge)", q, k, v, 1e30
    yield "scale 300 (logits ~1e3..1e4)", q, k, v, 300.0
    # rows whose max crosses |m * c| = 2^24 between the two key tiles (logit = 64 * k * 250;
    # as in tests/test_edge_cases.py, scaled to 64-wide tiles)
    for name, lo, hi, win in (("up", 693.0, 0.0, 736.0), ("down", -2500.0, 62.0, 65.0)):
        q, k, v = make(1, 1, 1, 64, 128, 64, seed=21)
        q.fill_(1.0)
        k[:, :, :64], k[:, :, 64:] = lo, hi
        k[:, :, 69] = win
        yield f"switching {name}", q, k, v, 250.0


def test_extreme_logits_bit_identical_to_the_simulator():
    from spak.cpu.simrun import simulate_fmha
    for name, q, k, v, scale in _extreme_cases():
        for causal in (False, True):
            out = spak.fmha(q, k, v, scale=scale, is_causal=causal, kernel="fused",
                            tiles={"TILE_M": 64, "TILE_N": 64})
            sim, _ = simulate_fmha("fused", q.cpu().numpy(), k.cpu().numpy(),
                                   v.cpu().numpy(), scale=scale, causal=causal,
                                   tiles=(64, 64), model="sm_90")
            assert torch.isfinite(out).all(), name
            assert torch.equal(out.cpu(), torch.from_numpy(sim)), (name, causal)


def test_non_contiguous_inputs_and_zero_sizes():
    q, k, v = make(1, 4, 4, 256, 256, 64)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)          # non-contiguous view
    assert not qt.is_contiguous()
    assert torch.equal(spak.fmha(qt, k, v), spak.fmha(q, k, v))
    assert spak.fmha(q[:, :, :0], k, v).shape == (1, 4, 0, 64)
    assert (spak.fmha(q, k[:, :, :0], v[:, :, :0]) == 0).all()


def test_explicit_tiles_agree():
    q, k, v = make(1, 4, 4, 1000, 1000, 64)
    ref = ref64(q, k, v, causal=True)
    for tm, tn in ((64, 64), (128, 64), (64, 128), (128, 128), (64, 32)):
        out = spak.fmha(q, k, v, is_causal=True, tiles={"TILE_M": tm, "TILE_N": tn})
        assert rel(out, ref) <= GATES["fp16"], (tm, tn)


def test_custom_op_under_torch_compile():
    q, k, v = make(2, 8, 2, 256, 256, 64)

    def f(q, k, v):
        return spak.fmha(q * 1.0, k, v, is_causal=True, enable_gqa=True) + 1

    def g(q, k, v):    # the op itself in a full graph
        return torch.ops.spak.fmha(q, k, v, None, True, 0.125, "fused", 64, 64).float() * 2

    eager = f(q, k, v)
    torch._dynamo.reset()
    compiled = torch.compile(f)(q, k, v)
    assert torch.equal(eager, compiled)
    full = torch.compile(g, fullgraph=True)(q, k, v)
    assert torch.equal(full, g(q, k, v))


def test_compile_error_is_explained(monkeypatch):
    """A cuTile compile failure reaches the user with the set-up diagnosis attached."""
    from spak.device import env as gpu_env
    import spak.gpu.launch as _gpu_launch_mod

    def boom(*a, **k):
        raise RuntimeError("failed to compile Tile IR program")
    monkeypatch.setattr(_gpu_launch_mod, "fmha_into", boom)
    q, k, v = make(1, 1, 1, 64, 64, 64)
    with pytest.raises(gpu_env.CompilerSetupError, match="cuTile compiler set-up"):
        spak.fmha(q, k, v)


# ------------------------------------------------- the GPU loop (spak run, the sweep worker)

@pytest.mark.parametrize("case", ["2x4:2x77:130x64/causal/fp16/mask",
                                  "1x8:2x300:100x128/causal/bf16",
                                  "1x2x1000x64/noncausal/fp16/boolmask"])
def test_spak_run_case_passes_and_agrees_with_the_simulator(case):
    """spak.device.case.run_case on the GPU through the FMHA forward family: both kernels
    pass the float64 gate and the simulator reproduces the GPU's slice bit for bit."""
    from types import SimpleNamespace
    from spak.device import case as run_case_mod
    from spak.device.gpurun import RunEnv
    from spak.families.fmha_fwd import FAMILY
    spec = FAMILY.parse(case)
    args = SimpleNamespace(no_time=True, no_sim=False, no_sdpa=False, max_sets=2, seed=0,
                           naive_max_gb=16.0, tiles=None, model=None, sim_heads=1,
                           sim_work=1 << 27, dump=None)
    rows = run_case_mod.run_case(spec, ("fused", "naive"), args, RunEnv([]), None,
                                 lambda r: None, FAMILY)
    assert [r["provider"] for r in rows] == ["spak-fused", "spak-naive"]
    for r in rows:
        assert r["passed"] and r["error"] is None and r["family"] == "fmha_fwd", r
        assert r["sim"]["fraction_bit_identical"] == 1.0, r["sim"]
        assert r["rel_l2_vs_sdpa"] < 2 * GATES[spec.dtype]


def test_gpu_reference_paths_agree_on_the_gpu(monkeypatch):
    """The float64 reference computed in torch on the GPU equals the CPU one."""
    from spak.device import gpu_reference
    from spak.families.fmha_fwd import FAMILY
    spec = FAMILY.parse("2x4:2x200:333x64/causal/fp16/mask")
    x = FAMILY.gpu_inputs(spec, 0, 0, "cuda")
    cpu = FAMILY.gpu_reference(spec, x)["out"]
    monkeypatch.setattr(gpu_reference, "CPU_REF_MAX_FLOPS", 0)
    dev = FAMILY.gpu_reference(spec, x)["out"]
    assert dev.is_cuda and torch.allclose(cpu, dev, rtol=1e-10, atol=1e-12)


def test_sweep_worker_times_a_config_and_a_peer():
    from spak.tune.worker import GpuRunner
    r = GpuRunner({"warmup": 1, "batches": 3, "batch_ms": 5.0, "max_sets": 2})
    job = {"family": "fmha_fwd", "kernel": "fused", "case": "2x8x512x64/fp16/causal",
           "provider": "spak-fused", "config_id": "default", "config": None, "flops": 1.0}
    ours = r.run(job)
    assert ours["status"] == "ok" and ours["rel_l2_vs_sdpa"] < 2e-3, ours
    assert ours["ms_median"] > 0 and ours["runs"] == 3 * ours["per_batch"]
    peer = r.run({**job, "provider": "sdpa-flash", "config_id": "-"})
    assert peer["status"] == "ok" and peer["ms_median"] > 0, peer
    compiled = r.compile({"unit_id": "u", "kernel": "fused", "config_id": "64x64",
                          "config": {"TILE_M": 64, "TILE_N": 64}, "dtype": "fp16",
                          "causal": True, "q": [1, 8, 16, 64], "k": [1, 8, 16, 64]})
    assert compiled["status"] == "ok", compiled
