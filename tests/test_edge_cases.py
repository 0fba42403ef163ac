"""Edge cases that must compute right: both kernels on the simulator vs the float64 reference.

S = 1 (decode), Sq = 1 against a long KV cache, fully masked rows (exact zeros, never NaN),
extreme logits (|Q K^T * scale| ~ 1e4: no overflow, the exact one-hot limit), GQA 8:1 and
1:1, head dims 64/128 (and non powers of two) at S not a tile multiple, zero-size dims,
tiny and huge scales, and NaN/inf inside Q/K/V/mask (docs/errors.md, "NaN and inf").
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from spak.core.metrics import gate_for, rel_l2
from spak.attention.reference import attention_f64
from spak.cpu.simrun import simulate_fmha

KERNELS = ("fused", "naive")


def inputs(B, Hq, Hkv, Sq, Sk, D, dtype="fp16", seed=0, Dv=None, amp=1.0):
    rng = np.random.default_rng(seed)

    def draw(*shape):
        x = (amp * rng.standard_normal(shape)).astype(np.float32)
        if dtype == "fp16":
            return x.astype(np.float16)
        return (x.view(np.uint32) & 0xFFFF0000).view(np.float32)   # bf16 values (truncated)
    return draw(B, Hq, Sq, D), draw(B, Hkv, Sk, D), draw(B, Hkv, Sk, Dv or D)


def run(kernel, q, k, v, dtype="fp16", **kw):
    out, _ = simulate_fmha(kernel, q, k, v, dtype=dtype, **kw)
    return out


def check(kernel, q, k, v, dtype="fp16", **kw):
    """Simulate, compare with float64: no NaN/Inf, rel L2 within the gate; returns out."""
    out = run(kernel, q, k, v, dtype, **kw)
    ref = attention_f64(q, k, v, **{a: kw[a] for a in ("mask", "causal", "scale") if a in kw})
    assert np.isfinite(out).all()
    err = rel_l2(out, ref)
    assert err <= gate_for(dtype), f"{kernel}: rel L2 {err:.2e}"
    assert (out[ref == 0] == 0).all()          # rows with no allowed key: exact zeros
    return out


# ---------------------------------------------------------------- decode shapes

@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
def test_single_token_single_key_is_exactly_v(kernel, dtype, D):
    """S = 1: softmax over one key is exactly 1, so the output is V's row, bit for bit."""
    q, k, v = inputs(2, 8, 2, 1, 1, D, dtype, seed=D)
    for causal in (False, True):
        out = check(kernel, q, k, v, dtype, causal=causal)
        np.testing.assert_array_equal(out, np.repeat(v, 4, axis=1))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [False, True])
def test_decode_one_query_against_a_long_cache(kernel, causal):
    """Sq = 1, Sk = 4000 (not a tile multiple): bottom-right causal sees every key."""
    q, k, v = inputs(1, 4, 1, 1, 4000, 64, seed=3)
    check(kernel, q, k, v, causal=causal)
    out = check(kernel, q, k, v, causal=causal, tiles=(64, 64))
    if causal:      # the last query sees all keys: causal changes nothing at Sq = 1
        np.testing.assert_array_equal(out, run(kernel, q, k, v, causal=False, tiles=(64, 64)))


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_bf16_d128_gqa(kernel):
    q, k, v = inputs(2, 16, 2, 1, 1500, 128, "bf16", seed=4)
    check(kernel, q, k, v, "bf16", causal=True, tiles=(64, 64))


# ---------------------------------------------------------------- fully masked rows

@pytest.mark.parametrize("kernel", KERNELS)
def test_fully_masked_rows_are_exact_zeros(kernel):
    q, k, v = inputs(2, 2, 2, 70, 90, 64, seed=5)
    rng = np.random.default_rng(5)
    add = np.where(rng.random((2, 1, 70, 90)) < 0.3, -np.inf, rng.standard_normal((2, 1, 70, 90)))
    add = add.astype(np.float32)
    add[0, 0, [0, 17, 69]] = -np.inf                   # dead rows, in three different blocks
    add[1, 0, :, :40] = -np.inf                        # with causal (row i sees keys <= i+20):
                                                       # rows < 20 see nothing
    boolm = np.isfinite(add)                           # True = attend
    for mask in (add, boolm):
        for causal in (False, True):
            out = check(kernel, q, k, v, mask=mask, causal=causal)
            assert (out[0, :, [0, 17, 69]] == 0).all()
            if causal:
                assert (out[1, :, :20] == 0).all() and (out[1, :, 30:] != 0).any(-1).all()


@pytest.mark.parametrize("kernel", KERNELS)
def test_more_queries_than_keys_causal_gives_leading_zero_rows(kernel):
    q, k, v = inputs(1, 4, 2, 100, 30, 64, "bf16", seed=6)
    out = check(kernel, q, k, v, "bf16", causal=True, tiles=(32, 16))
    assert (out[:, :, :70] == 0).all() and np.abs(out[:, :, 70:]).sum(-1).min() > 0


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_key_masked_everywhere_is_all_zeros(kernel):
    q, k, v = inputs(1, 2, 2, 33, 50, 64, seed=7)
    mask = np.full((33, 50), -np.inf, np.float32)
    out = run(kernel, q, k, v, mask=mask)
    assert (out == 0).all()
    out = run(kernel, q, k, v, mask=np.zeros((1, 50), bool), causal=True)
    assert (out == 0).all()


# ---------------------------------------------------------------- zero-size dims

@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dims", [
    (0, 2, 2, 8, 8), (1, 2, 2, 0, 8), (1, 2, 2, 8, 0), (1, 0, 0, 8, 8), (2, 4, 1, 0, 0)],
    ids=["B=0", "Sq=0", "Sk=0", "H=0", "Sq=Sk=0"])
def test_zero_size_dims_give_the_reference_shape_and_values(kernel, dims):
    B, Hq, Hkv, Sq, Sk = dims
    q, k, v = inputs(B, Hq, Hkv, Sq, Sk, 64, seed=8, Dv=32)
    out = run(kernel, q, k, v, causal=True)
    assert out.shape == (B, Hq, Sq, 32)
    assert (out == 0).all()          # Sk = 0: no key at all -> zeros; else nothing to write


# ---------------------------------------------------------------- extreme logits

def _one_hot_rows(q, k, scale, causal, gap):
    """Rows whose largest logit beats the second by more than `gap` (natural log units),
    and the index of that key: there softmax is one-hot to far below fp16/bf16 precision."""
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale
    if causal:
        Sq, Sk = s.shape[-2:]
        s = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + Sk - Sq, s, -np.inf)
    top2 = np.sort(s, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0] > gap, s.argmax(-1), np.abs(s[np.isfinite(s)]).max()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scale", [50.0, 300.0, -300.0])
@pytest.mark.parametrize("causal", [False, True])
def test_extreme_logits_no_overflow_and_the_exact_one_hot_limit(kernel, scale, causal):
    q, k, v = inputs(1, 2, 2, 100, 100, 64, seed=9)
    out = check(kernel, q, k, v, scale=scale, causal=causal)
    dom, arg, biggest = _one_hot_rows(q, k, scale, causal, gap=40.0)
    assert biggest > (1e3 if abs(scale) == 50 else 8e3)       # |QK^T*scale| reaches ~1e4
    assert dom.mean() > 0.6                                   # most rows are one-hot
    vsel = np.take_along_axis(v[:, :, None], arg[..., None, None], axis=3)[..., 0, :]
    if kernel == "fused" and scale > 0:
        # The FFMA path (RAW_MAX): the max score's weight is 2^(m*c - fl(m*c)), within
        # 2^-11 of 1 at |m*c| ~ 2^14, and P V uses it rounded to fp16 while l sums it
        # unrounded, so the row is V's to one fp16 ulp (bit-exact at scale 50, where the
        # weight rounds to 1).
        ulp = np.spacing(np.abs(vsel[dom]).astype(np.float16)).astype(np.float32)
        assert (np.abs(out[dom] - vsel[dom]) <= ulp).all()
        if scale == 50.0:
            np.testing.assert_array_equal(out[dom], vsel[dom])
    else:
        np.testing.assert_array_equal(out[dom], vsel[dom])    # exactly V's row of the argmax


@pytest.mark.parametrize("direction", ["up", "down"])
def test_fused_rows_switching_to_and_from_the_huge_row_multiplier(direction):
    """RAW_MAX rows whose max crosses HUGE_ROW (|m * c| = 2^24 log2 units) between key
    tiles change multiplier (c <-> its power of two): no inf or NaN from the rescale, and
    the one-hot limit where one key dominates. up: key tile 0 at 1.60e7 log2 units, just
    below, tile 1 with one key at 1.70e7, just above (rescaling the old state with the old
    multiplier would overflow here, or keep it at weight 1 if clamped). down: tile 0 at
    -5.8e7 (huge, negative), tile 1 at 1.4e6 with one key 5.8e4 above the rest."""
    q, k, v = inputs(1, 1, 1, 16, 32, 16, seed=21)
    q[:] = np.float16(1.0)                          # logit = 16 * k * scale 250
    if direction == "up":
        k[0, 0, :16], k[0, 0, 16:] = np.float16(2772.0), np.float16(0.0)
        k[0, 0, 21] = np.float16(2946.0)
    else:
        k[0, 0, :16], k[0, 0, 16:] = np.float16(-10000.0), np.float16(250.0)
        k[0, 0, 21] = np.float16(260.0)
    out = check("fused", q, k, v, scale=250.0, tiles=(16, 16))
    np.testing.assert_array_equal(out[0, 0], np.broadcast_to(v[0, 0, 21], out.shape[2:]))


@pytest.mark.parametrize("kernel", KERNELS)
def test_large_inputs_and_large_mask_values(kernel):
    """fp16 inputs of magnitude ~100 (logits ~1e4 with the default scale) and an additive
    mask of +-1e4 on top."""
    q, k, v = inputs(1, 2, 1, 64, 80, 128, seed=10, amp=40.0)
    rng = np.random.default_rng(10)
    mask = (1e4 * rng.standard_normal((1, 1, 64, 80))).astype(np.float32)
    out = check(kernel, q, k, v, mask=mask, causal=True)
    assert np.abs(out).max() <= np.abs(v).max()


# ---------------------------------------------------------------- GQA and head dims

@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("group", [1, 8])
def test_gqa_equals_repeated_kv_bit_for_bit(kernel, group):
    """GQA 8:1 (and 1:1) gives, per query head, the same bits as plain attention on K/V
    repeated to Hq heads."""
    q, k, v = inputs(2, 8, 8 // group, 77, 130, 64, seed=11)
    out = check(kernel, q, k, v, causal=True)
    rep = run(kernel, q, np.repeat(k, group, axis=1), np.repeat(v, group, axis=1), causal=True)
    np.testing.assert_array_equal(out, rep)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("D", [64, 128, 80, 96])
@pytest.mark.parametrize("S", [17, 129, 255])
def test_head_dims_at_sequence_lengths_not_a_tile_multiple(kernel, D, S):
    dtype = "bf16" if S == 129 else "fp16"
    q, k, v = inputs(1, 2, 1, S, S + 3, D, dtype, seed=D + S)
    check(kernel, q, k, v, dtype, causal=S != 17)
    check(kernel, q, k, v, dtype, causal=False, tiles=(64, 32))


@pytest.mark.parametrize("kernel", KERNELS)
def test_value_head_dim_differs_from_query_head_dim(kernel):
    q, k, v = inputs(1, 4, 2, 50, 70, 64, seed=12, Dv=24)
    check(kernel, q, k, v, causal=True)


# ---------------------------------------------------------------- scales

@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("scale", [1e-46, 1e-40, 1e-30, 0.0, -0.0, 1e30, -1e30])
def test_tiny_and_huge_scales(kernel, scale):
    """Scales that are 0/subnormal in float32 (1e-46, 1e-40) once gave the fused kernel
    all-zero rows (its raw-max fast path multiplied -inf by c == 0: such scales now take
    the general path), and huge ones (1e30) NaN rows under the sm_90 model (the fused
    x*c - m left the max score the product's rounding error, 2^(~1e24) = inf; huge rows
    now take a power-of-two multiplier, gpu/kernels/fused.py _raw_max_step); |scale| >
    gpu.plan.MAX_SCALE is a ValueError (tests/test_bad_inputs.py)."""
    q, k, v = inputs(1, 2, 2, 20, 20, 16, seed=13)
    check(kernel, q, k, v, scale=scale)
    check(kernel, q, k, v, scale=scale, causal=True)


# ---------------------------------------------------------------- NaN and inf

def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*a, **kw)


def _planted(where, value, seed=14, S=100, causal=False):
    """q, k, v (B=1, H=2, S x 64, fp16) with `value` planted at head 0, row/key 37, dim 3
    of Q, K or V; or an additive mask with `value` at head 0 (broadcast), row 37, key 37."""
    q, k, v = inputs(1, 2, 2, S, S, 64, seed=seed)
    mask = None
    if where == "mask":
        mask = np.zeros((1, 1, S, S), np.float32)
        mask[0, 0, 37, 37] = value
    else:
        {"q": q, "k": k, "v": v}[where][0, 0, 37, 3] = value
    ref = _quiet(attention_f64, q, k, v, mask=mask, causal=causal)
    return q, k, v, mask, ref


def _visible(S, causal):
    """[S] bool: the rows that can see key 37."""
    return np.arange(S) + 0 >= 37 if causal else np.ones(S, bool)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("causal", [False, True])
def test_nonfinite_v_reaches_exactly_the_rows_that_see_it(kernel, value, causal):
    """A NaN/inf in V row j reaches every row with a nonzero weight on key j, as in SDPA (and
    the float64 reference), and leaves the other heads alone. Rows that cannot see key j
    (causal): SDPA's math backend and the reference give NaN there too (0 * NaN); SPAK
    gives NaN only where a block loads that V tile, else the right finite value
    (docs/errors.md)."""
    S = 100
    q, k, v, mask, ref = _planted("v", value, causal=causal)
    out = _quiet(run, kernel, q, k, v, causal=causal, tiles=(16, 16))
    see = _visible(S, causal)
    o, r = out[0, 0, see], ref[0, 0, see]
    np.testing.assert_array_equal(np.isnan(o), np.isnan(r))
    np.testing.assert_array_equal(np.isposinf(o), np.isposinf(r))
    np.testing.assert_array_equal(np.isneginf(o), np.isneginf(r))
    assert np.isfinite(out[0, 1]).all()                        # the other head is untouched
    v0 = v.copy()
    v0[0, 0, 37, 3] = 0
    ok = attention_f64(q, k, v0, causal=causal)[0, 0, ~see]     # what the blind rows should be
    blind = out[0, 0, ~see]
    fin = np.isfinite(blind).all(-1)
    assert fin[:32].all() or kernel == "naive"                 # fused: blocks before j's tile
    assert np.allclose(blind[fin], ok[fin], atol=2e-3)


@pytest.mark.parametrize("where,value", [("q", np.nan), ("k", np.nan), ("k", np.inf),
                                         ("k", -np.inf), ("q", np.inf), ("mask", np.nan),
                                         ("mask", np.inf)])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_propagates_nonfinite_scores_like_sdpa(where, value, causal):
    """NaN/inf in Q or K (or NaN/+inf in the mask) makes a score NaN or +inf: the rows that
    see it are NaN in the naive kernel exactly where they are in the reference (= SDPA's
    math backend, tests/test_edge_cases.py::test_reference_nonfinite_pattern_is_sdpas),
    and every other row is right."""
    q, k, v, mask, ref = _planted(where, value, causal=causal)
    out = _quiet(run, "naive", q, k, v, mask=mask, causal=causal)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.isnan(ref).any()
    fin = np.isfinite(ref)
    assert np.allclose(out[fin], ref[fin], atol=2e-3)


@pytest.mark.parametrize("where,value", [("q", np.nan), ("k", np.nan), ("k", np.inf),
                                         ("mask", np.inf)])
def test_fused_propagates_nonfinite_scores_like_sdpa(where, value):
    q, k, v, mask, ref = _planted(where, value)
    out = _quiet(run, "fused", q, k, v, mask=mask)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))


@pytest.mark.parametrize("where,value", [("q", np.nan), ("k", np.nan), ("k", np.inf),
                                         ("mask", np.inf)])
def test_fused_nonfinite_scores_leave_the_other_rows_right(where, value):
    """Rows that do not see the non-finite score are unaffected by it."""
    q, k, v, mask, ref = _planted(where, value, causal=True)
    out = _quiet(run, "fused", q, k, v, mask=mask, causal=True)
    bad = np.isnan(ref).any(-1)
    assert bad.any() and np.isnan(out[bad]).all()
    assert np.isfinite(out[~bad]).all() and np.allclose(out[~bad], ref[~bad], atol=2e-3)


def test_reference_nonfinite_pattern_is_sdpas():
    """The float64 reference's NaN/inf pattern is torch SDPA's (math backend, float64)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional.scaled_dot_product_attention
    for where in "qkv":
        for value in (np.nan, np.inf, -np.inf):
            for causal in (False, True):
                q, k, v, _, ref = _planted(where, value, S=40, causal=causal)
                t = [torch.from_numpy(x.astype(np.float64)) for x in (q, k, v)]
                o = F(*t, is_causal=causal).numpy()
                for f in (np.isnan, np.isposinf, np.isneginf):
                    np.testing.assert_array_equal(f(o), f(ref), err_msg=f"{where} {value}")
                fin = np.isfinite(ref)
                assert np.allclose(o[fin], ref[fin], atol=1e-12)
