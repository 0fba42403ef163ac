"""The FMHA backward on the CPU simulator: the float64 gradient reference (checked against
torch.autograd in float64), the forward's LSE, the backward kernels vs float64 under the
family's gates on small odd shapes, and every bad input the planner refuses.

Gates (spak.families.fmha_bwd.BWD_GATES: 1e-3 fp16, 8e-3 bf16, the forward's): the
errors measured on the 80 `gates` problems are 2.6e-4 .. 3.5e-4 (fp16) and 2.1e-3 ..
3.3e-3 (bf16) relative L2 for each of dQ, dK, dV, about the forward's own; the gates stay
>= 2.5x above them.
"""
from __future__ import annotations

import dataclasses
import math

import cuda.tile as ct
import numpy as np
import pytest

from spak import sim
from spak.attention.problems import make_inputs, parse_spec
from spak.attention.reference import attention_f64, attention_grads_f64
from spak.core.metrics import rel_l2, round_to_bf16
from spak.cpu.simrun import kernel_mask, simulate_fmha
from spak.cpu.simrun_bwd import simulate_fmha_bwd
from spak.families import fmha_bwd as fam_mod
from spak.gpu.kernels.fused import _log2_rowsum
from spak.gpu.plan import INT32_MAX, plan_fmha
from spak.gpu.plan_bwd import (BWD_LAUNCH_NAMES, BWD_TILE_KEYS, default_bwd_tiles,
                               plan_fmha_bwd)

FAM = fam_mod.FAMILY
T16 = {k: 16 for k in BWD_TILE_KEYS}          # many tiles on tiny shapes


def _dout(spec, seed=1):
    x = np.random.default_rng(seed).standard_normal((spec.B, spec.Hq, spec.Sq, spec.D),
                                                    dtype=np.float32)
    return x.astype(np.float16) if spec.dtype == "fp16" else round_to_bf16(x)


def _run(text, *, tiles=None, scale=None, mask_shape=None):
    spec = parse_spec(text)
    inp = make_inputs(spec, mask_shape=mask_shape)
    dout = _dout(spec)
    g, reports = simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, mask=inp.mask,
                                   causal=spec.causal, scale=scale, tiles=tiles,
                                   dtype=spec.dtype)
    ref = attention_grads_f64(inp.q, inp.k, inp.v, dout, mask=inp.mask, causal=spec.causal,
                              scale=scale)
    return spec, inp, dout, g, dict(zip(("dq", "dk", "dv"), ref)), reports


# ------------------------------------------------------------------ float64 reference

torch = pytest.importorskip("torch")


def _torch_grads(q, k, v, dout, mask, causal, scale):
    """float64 autograd through a plain attention (dead rows give zeros, as SDPA's
    convention in this project); GQA by repeating k/v, so autograd sums over the group."""
    t = lambda x: torch.tensor(np.asarray(x, np.float64), requires_grad=True)  # noqa: E731
    Q, K, V = t(q), t(k), t(v)
    g = q.shape[1] // k.shape[1]
    Kr, Vr = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)
    s = Q @ Kr.transpose(-1, -2) * scale
    if mask is not None:
        s = s + torch.tensor(np.where(mask, 0.0, -np.inf) if mask.dtype == bool
                             else mask.astype(np.float64))
    Sq, Sk = q.shape[2], k.shape[2]
    if causal:
        allowed = torch.arange(Sk)[None, :] <= torch.arange(Sq)[:, None] + (Sk - Sq)
        s = s.masked_fill(~allowed, -math.inf)
    mx = s.amax(-1, keepdim=True)
    dead = torch.isinf(mx) & (mx < 0)
    p = torch.exp(s - torch.where(dead, torch.zeros_like(mx), mx).detach())
    p = p / torch.where(dead, torch.ones_like(mx), p.sum(-1, keepdim=True))
    (p @ Vr).backward(torch.tensor(np.asarray(dout, np.float64)))
    return Q.grad.numpy(), K.grad.numpy(), V.grad.numpy()


@pytest.mark.parametrize("text,scale", [
    ("1x8:2x13x16/causal/fp16", None),          # GQA 4:1
    ("2x4:1x7:19x8/causal/bf16", 0.7),           # Sq < Sk
    ("1x2x19:7x8/causal/fp16", -1.3),            # Sq > Sk: rows with no key
    ("2x4:2x11:9x8/noncausal/fp16/mask", None),  # additive mask, a fully masked row
    ("1x2x9x8/noncausal/fp16/boolmask", 0.0),
])
def test_grads_f64_match_torch_autograd(text, scale):
    spec = parse_spec(text)
    q, k, v, mask = make_inputs(spec)
    dout = _dout(spec)
    sc = 1 / math.sqrt(spec.D) if scale is None else scale
    want = _torch_grads(q, k, v, dout, mask, spec.causal, sc)
    got = attention_grads_f64(q, k, v, dout, mask=mask, causal=spec.causal, scale=scale)
    for w, g_ in zip(want, got):
        assert g_.dtype == np.float64 and np.isfinite(g_).all()
        np.testing.assert_allclose(g_, w, rtol=1e-10, atol=1e-12)


def test_grads_f64_dead_rows_are_zero_and_empty_inputs():
    spec = parse_spec("1x2x19:7x8/causal/fp16")
    q, k, v, _ = make_inputs(spec)
    dq, dk, dv = attention_grads_f64(q, k, v, _dout(spec), causal=True)
    # rows 0..11 see no key, row 12 one key (a constant softmax): zero; the rest not
    assert (dq[:, :, :13] == 0).all() and np.abs(dq[:, :, 13:]).min() > 0
    z = attention_grads_f64(q[:, :, :0], k, v, np.zeros((1, 2, 0, 8), np.float16))
    assert all((x == 0).all() for x in z) and z[1].shape == k.shape
    with pytest.raises(ValueError, match="dout"):
        attention_grads_f64(q, k, v, np.zeros((1, 2, 19, 9)))


# ------------------------------------------------------------------ forward LSE

@pytest.mark.parametrize("text,scale", [
    ("1x4:1x100:37x64/causal/fp16", None),      # Sq > Sk: dead rows get +inf
    ("2x4:2x77:130x80/noncausal/bf16/mask", 0.3),
    ("1x2x33x64/noncausal/fp16", -0.5),          # general path (scale < 0)
])
def test_forward_lse_and_unchanged_output(text, scale):
    spec = parse_spec(text)
    inp = make_inputs(spec)
    g, reports = simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, _dout(spec), mask=inp.mask,
                                   causal=spec.causal, scale=scale, dtype=spec.dtype)
    plain, _ = simulate_fmha("fused", inp.q, inp.k, inp.v, mask=inp.mask,
                             causal=spec.causal, scale=scale, dtype=spec.dtype)
    assert np.array_equal(g["out"], plain)            # same bits as the inference launch
    assert [r.kernel for r in reports][0] == "fmha_fwd_lse_kernel"
    # float64 lse
    q, k = inp.q.astype(np.float64), inp.k.astype(np.float64)
    sc = 1 / math.sqrt(spec.D) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, np.repeat(k, spec.group, 1)) * sc
    if inp.mask is not None:
        s = s + np.where(inp.mask, 0, -np.inf) if inp.mask.dtype == bool else s + inp.mask
    if spec.causal:
        s = np.where(np.arange(spec.Sk)[None] <= np.arange(spec.Sq)[:, None] + spec.Sk - spec.Sq,
                     s, -np.inf)
    mx = s.max(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ref = mx + np.log(np.exp(s - np.where(np.isfinite(mx), mx, 0)[..., None]).sum(-1))
    dead = np.isneginf(mx)
    assert (g["lse"][dead] == np.inf).all() and np.isfinite(g["lse"][~dead]).all()
    assert np.abs(g["lse"][~dead] - ref[~dead]).max() < 1e-5 * max(1.0, np.abs(ref[~dead]).max())
    assert dead.any() == (spec.Sq > spec.Sk or spec.mask is not None)


def _libdevice_log2f(x):
    """float32 log2 as the sm_90 code of ct.log2 computes it (libdevice's log2f, read from
    the SASS), in numpy with exact FMAs: the reference for fused._log2_rowsum."""
    from spak.sim.fma import fma_f32
    f32 = np.float32
    b = np.asarray(x, np.float32).view(np.int32)
    e = (b - np.int32(0x3F3504F3)) & np.int32(-0x800000)
    f = (b - e).view(np.float32) - f32(1)
    r = fma_f32(f, np.uint32(0x3DC6B27F).view(np.float32), f32(-0.16845393180847168))
    for c in (0.17168870568275452, -0.17900948226451874, 0.20512372255325317,
              -0.24046532809734344, 0.28857114911079407, -0.3606741726398468,
              0.4808982014656067, -0.7213475108146667):
        r = fma_f32(f, r, f32(c))
    r = fma_f32(f, f32(1.4426950216293335), f * (f * r))
    return e.astype(np.float32) * f32(2.0 ** -23) + r


@ct.kernel
def _log2_kernel(X, Y):
    ct.store(Y, index=(ct.bid(0),), tile=_log2_rowsum(ct.load(X, index=(ct.bid(0),),
                                                               shape=(1024,))))


def test_lse_log2_is_libdevice_log2f_bit_for_bit():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0.7, 2.0, 2048), np.exp2(rng.uniform(0, 24, 2048)),
                        [1.0, 0.70710677, 0.7071068, 1.4142135, 2.0 ** 24] + [3.0] * 1019]
                       ).astype(np.float32)
    y = np.full_like(x, np.nan)
    sim.launch(_log2_kernel, (len(x) // 1024,), (x, y))
    want = _libdevice_log2f(x)
    assert np.array_equal(y.view(np.int32), want.view(np.int32))
    exact = np.log2(x.astype(np.float64)).astype(np.float32)
    ulps = np.abs(y.view(np.int32).astype(np.int64) - exact.view(np.int32))
    assert ulps.max() <= 1 and 0.01 < np.mean(ulps != 0) < 0.2   # not ct.log2's model
    assert y[4096] == 0.0


def test_plan_fmha_lse_checks():
    q = np.zeros((1, 2, 5, 16), np.float16)
    k = np.zeros((1, 1, 7, 16), np.float16)
    lse = np.zeros((1, 2, 5), np.float32)
    (L,) = plan_fmha("fused", q, k, k, q.copy(), lse=lse)
    assert L.args[5] is lse and L.name == "fused"
    with pytest.raises(ValueError, match="'fused' kernel only"):
        plan_fmha("naive", q, k, k, q.copy(), lse=lse)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 2, 5\)"):
        plan_fmha("fused", q, k, k, q.copy(), lse=np.zeros((1, 2, 6), np.float32))
    with pytest.raises(TypeError, match="lse dtype must be float32"):
        plan_fmha("fused", q, k, k, q.copy(), lse=lse.astype(np.float64))
    with pytest.raises(ValueError, match="lse must be contiguous"):
        plan_fmha("fused", q, k, k, q.copy(), lse=np.zeros((1, 2, 10), np.float32)[..., ::2])


# ------------------------------------------------------------------ backward vs float64

CASES = [
    # (shape, tiles, scale)
    ("1x8:2x100x64/causal/fp16", None, None),                 # GQA 4:1
    ("1x4:1x17:100x128/causal/bf16", None, None),             # Sq < Sk, D=128, bf16
    ("1x4x100:17x64/causal/fp16", T16, None),                 # Sq > Sk: dead rows; 16-tiles
    ("2x4:2x77:130x64/noncausal/fp16/mask", None, None),      # additive mask, dead row
    ("1x2x100x80/causal/bf16/mask", T16, None),               # D=80 padded, mask + causal
    ("2x2x17x64/causal/bf16", None, 2.5),                     # S=17, large scale
    ("1x2x100x64/noncausal/fp16", T16, -0.2),                 # S=100, negative scale
    ("1x4:2x33x64/noncausal/fp16/boolmask", None, 0.01),      # bool mask, tiny scale
    ("1x2x40x128/causal/fp16", {"DKV_TILE_M": 16, "DKV_TILE_N": 32,
                                "DQ_TILE_M": 32, "DQ_TILE_N": 16}, None),
    ("1x4:2x70:90x256/causal/fp16", None, None),             # D 256: dK/dV in 2 parts
    ("1x2x50x64/noncausal/bf16", dict(T16, DKV_SPLIT=4), None),   # 4 parts of 16 columns
]


@pytest.mark.parametrize("text,tiles,scale", CASES, ids=[c[0] for c in CASES])
def test_backward_matches_float64(text, tiles, scale):
    spec, inp, dout, g, ref, reports = _run(text, tiles=tiles, scale=scale)
    gate = FAM.gate(spec, "dq")
    for name in ("dq", "dk", "dv"):
        assert np.isfinite(g[name]).all(), name
        err = rel_l2(g[name], ref[name])
        assert err <= gate, (name, err, gate)
        assert err > 0                              # the comparison can fail
    names = [r.kernel for r in reports]
    assert names == ["fmha_fwd_lse_kernel", "fmha_bwd_preprocess_kernel",
                     "fmha_bwd_dkdv_kernel", "fmha_bwd_dq_kernel"]
    assert all(r.clean for r in reports)            # no double or missing writes


def test_scale_zero_gives_zero_dq_dk():
    # scale 0: uniform weights (plus the mask); dQ = dK = 0 exactly, dV still exact-ish
    spec, _, _, g, ref, _ = _run("1x4:2x33x64/noncausal/fp16/boolmask", scale=0.0)
    assert (g["dq"] == 0).all() and (g["dk"] == 0).all() and (ref["dq"] == 0).all()
    assert 0 < rel_l2(g["dv"], ref["dv"]) <= FAM.gate(spec, "dv")


def test_dead_rows_give_exact_zero_gradients():
    # Sq > Sk causal: queries 0..82 see no key; the mask's fully masked row too
    _, _, _, g, _, _ = _run("1x4x100:17x64/causal/fp16")
    assert (g["dq"][:, :, :83] == 0).all() and (g["dq"][:, :, 83:] != 0).any()
    spec, inp, _, g, _, _ = _run("2x4:2x77:130x64/noncausal/fp16/mask")
    assert (g["dq"][0, :, spec.Sq // 2] == 0).all()


@pytest.mark.parametrize("text", ["1x2x1x64/noncausal/fp16", "1x4:1x1x128/causal/bf16"])
def test_one_key_gives_zero_dq_dk_and_exact_dv(text):
    # softmax over one key is constant: dQ = dK = 0 exactly; dV = dO (summed over the group)
    spec, inp, dout, g, ref, _ = _run(text)
    assert (ref["dq"] == 0).all() and (ref["dk"] == 0).all()
    scale = 1 / math.sqrt(spec.D)
    for name, other in (("dq", inp.k), ("dk", inp.q)):
        size = scale * np.linalg.norm(dout.astype(np.float64)) * np.abs(inp.v).max() \
            * np.abs(other).max() * spec.D
        assert np.linalg.norm(g[name].astype(np.float64)) <= 1e-3 * size
    assert rel_l2(g["dv"], ref["dv"]) <= FAM.gate(spec, "dv")
    inputs = fam_mod.BwdInputs(inp.q, inp.k, inp.v, inp.mask, dout)
    assert FAM.error("dq", g["dq"], ref["dq"], inputs) <= FAM.gate(spec, "dq")


@pytest.mark.parametrize("D", [1, 24, 200, 256])
def test_every_head_dim(D):
    text = f"1x2:1x20:23x{D}/causal/{'bf16' if D % 2 else 'fp16'}"
    spec, _, _, g, ref, _ = _run(text)
    for name in ("dq", "dk", "dv"):
        assert rel_l2(g[name], ref[name]) <= FAM.gate(spec, name), name


def test_empty_sequences():
    q = np.ones((1, 2, 0, 16), np.float16)
    k = np.ones((1, 1, 5, 16), np.float16)
    g, reports = simulate_fmha_bwd("fused", q, k, k, q)
    assert g["dk"].shape == k.shape and (g["dk"] == 0).all() and (g["dv"] == 0).all()
    q = np.ones((1, 2, 3, 16), np.float16)
    g, _ = simulate_fmha_bwd("fused", q, k[:, :, :0], k[:, :, :0], q)
    assert (g["dq"] == 0).all() and (g["lse"] == np.inf).all()


def test_given_out_and_lse_reproduce_the_backward_alone():
    spec = parse_spec("1x4:2x50:70x64/causal/fp16")
    inp = make_inputs(spec)
    dout = _dout(spec)
    g, _ = simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, causal=True)
    g2, reports = simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, causal=True,
                                    out=g["out"], lse=g["lse"])
    assert len(reports) == 3
    for n in ("dq", "dk", "dv"):
        assert np.array_equal(g[n], g2[n])


def test_int64_twins_compute_the_same_bits():
    from spak.gpu.plan import int64_variant
    from spak.cpu import simrun_bwd
    spec = parse_spec("1x4:2x30:40x64/causal/bf16/mask")
    inp = make_inputs(spec)
    dout = _dout(spec)
    g, _ = simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, mask=inp.mask, causal=True,
                             dtype="bf16")
    real = simrun_bwd.plan_fmha_bwd

    def twins(*a, **kw):
        return [dataclasses.replace(L, kernel=int64_variant(L.kernel)) for L in real(*a, **kw)]
    simrun_bwd.plan_fmha_bwd = twins
    try:
        g2, reports = simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, mask=inp.mask,
                                        causal=True, dtype="bf16")
    finally:
        simrun_bwd.plan_fmha_bwd = real
    assert [r.kernel for r in reports][1:] == ["fmha_bwd_preprocess_kernel_i64",
                                               "fmha_bwd_dkdv_kernel_i64",
                                               "fmha_bwd_dq_kernel_i64"]
    for n in ("dq", "dk", "dv"):
        assert np.array_equal(g[n], g2[n])


# ------------------------------------------------------------------ the planner

@dataclasses.dataclass(frozen=True)
class _A:                                       # shape-only stand-in (as gpu.compile's)
    shape: tuple
    dtype: str = "float16"


def _args(B=1, Hq=4, Hkv=2, Sq=50, Sk=70, D=64, Dv=64, dt="float16"):
    q, k, v = _A((B, Hq, Sq, D), dt), _A((B, Hkv, Sk, D), dt), _A((B, Hkv, Sk, Dv), dt)
    out = _A((B, Hq, Sq, Dv), dt)
    return [q, k, v, out, out, _A((B, Hq, Sq), "float32"), q, k, v]


def _alloc(shape, kind):
    return _A(tuple(shape), "float32" if kind == "float32" else "float16")


def test_plan_launches_grids_and_int64_switch():
    L = plan_fmha_bwd("fused", *_args(), causal=True, alloc=_alloc,
                      tiles={"DKV_TILE_N": 32, "DQ_TILE_M": 16})
    assert tuple(x.name for x in L) == BWD_LAUNCH_NAMES["fused"]
    t = default_bwd_tiles(64)
    assert L[1].grid == (3, 1 * 2, 1) and L[2].grid == (4, 1 * 4, 1)
    assert L[1].args[12:14] == (t["DKV_TILE_M"], 32)
    assert not L[1].kernel._annotated_function.pyfunc.__name__.endswith("_i64")
    big = _args(B=1, Hq=2, Hkv=1, Sq=2**23, Sk=2**10, D=128, Dv=128)
    assert math.prod(big[0].shape) > INT32_MAX
    L = plan_fmha_bwd("fused", *big, alloc=_alloc)       # 2^31-element q: int64 indexing
    assert all(x.kernel._annotated_function.pyfunc.__name__.endswith("_i64") for x in L)


def test_plan_returns_nothing_for_empty_problems():
    assert plan_fmha_bwd("fused", *_args(B=0), alloc=_alloc) == []


BAD = [
    (dict(kernel="naive"), ValueError, "kernel_name must be one of"),
    (dict(i=4, x=_A((1, 4, 50, 32))), ValueError, r"dout must have shape \(1, 4, 50, 64\)"),
    (dict(i=4, x=_A((1, 4, 50, 64), "bfloat16")), TypeError, r"dout dtype \(bfloat16\)"),
    (dict(i=5, x=_A((1, 4, 51), "float32")), ValueError, "lse must have shape"),
    (dict(i=5, x=_A((1, 4, 50), "float16")), TypeError, "lse dtype must be float32"),
    (dict(i=6, x=_A((1, 4, 50, 64), "bfloat16")), TypeError, r"dq dtype \(bfloat16\)"),
    (dict(i=7, x=_A((1, 2, 71, 64))), ValueError, r"dk must have shape \(1, 2, 70, 64\)"),
    (dict(i=8, x=_A((1, 2, 70))), ValueError, "dv must have shape"),
    (dict(i=0, x=_A((1, 3, 50, 64))), ValueError, "multiple of k/v heads"),
    (dict(tiles={"TILE_M": 64}), ValueError, "unknown keys"),
    (dict(tiles={"DQ_TILE_N": 48}), ValueError, "power of two"),
    (dict(tiles={"DKV_TILE_M": 8}), ValueError, r"must be in \[16, 256\]"),
    (dict(tiles={"DKV_SPLIT": 3}), ValueError, r"tiles\['DKV_SPLIT'\] must be one of"),
    (dict(tiles=(64, 64)), TypeError, "tiles must be a dict"),
    (dict(scale=math.inf), ValueError, "scale must be a finite"),
    (dict(causal=1), TypeError, "causal must be a bool"),
    (dict(mask=_A((1, 1, 50, 69), "float32")), ValueError, "mask must have shape"),
    (dict(mask=_A((1, 1, 50, 70), "float16")), TypeError, "mask dtype must be float32"),
]


@pytest.mark.parametrize("bad,exc,msg", BAD, ids=[b[2][:30] for b in BAD])
def test_plan_rejects_bad_inputs(bad, exc, msg):
    args = _args()
    if "i" in bad:
        args[bad["i"]] = bad["x"]
    kw = {k: v for k, v in bad.items() if k in ("tiles", "scale", "causal", "mask")}
    with pytest.raises(exc, match=msg):
        plan_fmha_bwd(bad.get("kernel", "fused"), *args, alloc=_alloc, **kw)


def test_plan_needs_alloc_for_non_numpy_and_contiguous_arrays():
    with pytest.raises(ValueError, match="alloc"):
        plan_fmha_bwd("fused", *_args())
    q = np.zeros((1, 2, 8, 16), np.float16)
    k = np.zeros((1, 2, 8, 16), np.float16)
    lse = np.zeros((1, 2, 8), np.float32)
    assert len(plan_fmha_bwd("fused", q, k, k, q, q, lse, q.copy(), k.copy(), k.copy())) == 3
    bad = np.zeros((1, 2, 8, 32), np.float16)[..., ::2]
    with pytest.raises(ValueError, match="dout must be contiguous"):
        plan_fmha_bwd("fused", q, k, k, q, bad, lse, q.copy(), k.copy(), k.copy())


def test_simulate_rejects_bad_inputs():
    q = np.zeros((1, 2, 8, 16), np.float16)
    with pytest.raises(ValueError, match="both out and lse"):
        simulate_fmha_bwd("fused", q, q, q, q, out=q)
    with pytest.raises(ValueError, match="dout must have shape"):
        simulate_fmha_bwd("fused", q, q, q, q[:, :1])
    with pytest.raises(TypeError, match="dout dtype must be float16"):
        simulate_fmha_bwd("fused", q, q, q, q.astype(np.float32))
    with pytest.raises(TypeError, match="lse dtype must be float32"):
        simulate_fmha_bwd("fused", q, q, q, q, out=q, lse=np.zeros((1, 2, 8)))
    with pytest.raises(ValueError, match="dtype must be one of"):
        simulate_fmha_bwd("fused", q, q, q, q, dtype="fp32")


# ------------------------------------------------------------------ the family

def test_family_registered_and_its_cost_and_config():
    from spak import families
    assert families.get("fmha_bwd") is FAM and "fmha_bwd" in families.names()
    spec = parse_spec("2x8:2x1000x128/causal")
    assert FAM.flops(spec) == 2.5 * spec.flops
    assert FAM.outputs == ("dq", "dk", "dv") and FAM.kernels == ("fused", "fused_dq")
    assert FAM.default_config(spec) == default_bwd_tiles(128, "sm_90", True)
    assert FAM.store_key(spec)["head_dim"] == 128
    assert fam_mod.bwd_tiles_dict((32, 64)) == {"DKV_TILE_M": 32, "DKV_TILE_N": 64,
                                                "DQ_TILE_M": 32, "DQ_TILE_N": 64}
    with pytest.raises(TypeError, match="tiles must be"):
        fam_mod.bwd_tiles_dict("64x64")
    with pytest.raises(ValueError, match="output must be one of"):
        FAM.gate(spec, "out")
    a, b = FAM.make_inputs(spec.replace(B=1, Sq=5, Sk=5), 0), \
        FAM.make_inputs(spec.replace(B=1, Sq=5, Sk=5), 0)
    assert np.array_equal(a.dout, b.dout) and not np.array_equal(a.dout, a.q)


def test_family_sim_case_rows():
    row = FAM.sim_case("fused", parse_spec("1x2x1x64/fp16"))   # one key: dq = dk = 0
    assert row["passed"] and set(row["outputs"]) == {"dq", "dk", "dv"}
    assert all(math.isfinite(o["rel_l2"]) for o in row["outputs"].values())
    row = FAM.sim_case("fused", parse_spec("1x4:2x33:20x64/causal/bf16/mask"), tiles=(16, 32))
    assert row["passed"] and 0 < row["rel_l2"] <= row["gate"] == 8e-3
    assert [x["kernel"] for x in row["launches"]][1:] == [
        "fmha_bwd_preprocess_kernel", "fmha_bwd_dkdv_kernel", "fmha_bwd_dq_kernel"]


def test_spak_sim_family_fmha_bwd(capsys):
    from spak.cli import main
    rc = main(["sim", "--family", "fmha_bwd", "--shapes", "1x4:2x17:30x64/causal/fp16/mask"])
    out = capsys.readouterr().out
    assert rc == 0 and "PASS" in out and "fmha_bwd" in out


def test_dkdv_split_gives_the_whole_kernels_bits():
    """DKV_SPLIT (issue 35): dK/dV in column parts (grid z), each part summing its columns
    over the same query tiles in the same order: the same bits as one block per key tile;
    D 256 takes 2 parts by default (the whole [keys, 256] accumulators spill on sm_90)."""
    outs = {}
    for split in (1, 2):
        tiles = {"DKV_TILE_M": 32, "DKV_TILE_N": 32, "DKV_SPLIT": split}
        _, _, _, g, ref, _ = _run("1x4:2x40:60x256/causal/bf16", tiles=tiles)
        outs[split] = g
    for name in ("dq", "dk", "dv"):
        assert np.array_equal(np.asarray(outs[1][name]).view(np.uint16),
                              np.asarray(outs[2][name]).view(np.uint16)), name
    L = plan_fmha_bwd("fused", *_args(D=256, Dv=256), alloc=_alloc)
    assert L[1].grid[2] == 2 and L[1].args[-1] == 2
    assert default_bwd_tiles(256)["DKV_TILE_N"] == 64
    L = plan_fmha_bwd("fused", *_args(), alloc=_alloc)
    assert L[1].grid[2] == 1 and L[1].args[-1] == 1
