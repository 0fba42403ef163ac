"""The float64 reference against a direct, loop-by-loop computation of the definition."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import spak.attention.reference as reference
from spak.attention.reference import attention_f64


def naive_attention(q, k, v, mask=None, causal=False, scale=None):
    """The definition, written as plainly as possible: one query row at a time."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    full_mask = None
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == bool:
            m = np.where(m, 0.0, -np.inf)
        full_mask = np.broadcast_to(m.astype(np.float64), (B, Hq, Sq, Sk))
    out = np.zeros((B, Hq, Sq, v.shape[3]))
    for b in range(B):
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            for i in range(Sq):
                s = np.array([q[b, h, i] @ k[b, kv, j] for j in range(Sk)]) * scale
                if full_mask is not None:
                    s = s + full_mask[b, h, i]
                if causal:
                    s = np.array([s[j] if j <= i + Sk - Sq else -np.inf for j in range(Sk)])
                if np.all(s == -np.inf):
                    continue  # no allowed key: zeros
                w = np.exp(s - s.max())
                out[b, h, i] = (w / w.sum()) @ v[b, kv]
    return out


def rand(rng, *shape, dtype=np.float16):
    return rng.standard_normal(shape).astype(dtype)


def test_matches_naive_plain(rng):
    q, k, v = rand(rng, 2, 3, 17, 64), rand(rng, 2, 3, 17, 64), rand(rng, 2, 3, 17, 64)
    got = attention_f64(q, k, v)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, naive_attention(q, k, v), rtol=1e-12, atol=1e-13)


@given(B=st.integers(1, 2), Hkv=st.integers(1, 3), group=st.sampled_from([1, 2, 4]),
       Sq=st.integers(1, 40), Sk=st.integers(1, 40), D=st.sampled_from([1, 8, 64]),
       causal=st.booleans(), mask=st.sampled_from([None, "add", "bool"]),
       seed=st.integers(0, 2**32 - 1))
def test_matches_naive_property(B, Hkv, group, Sq, Sk, D, causal, mask, seed):
    rng = np.random.default_rng(seed)
    Hq = Hkv * group
    q, k, v = rand(rng, B, Hq, Sq, D), rand(rng, B, Hkv, Sk, D), rand(rng, B, Hkv, Sk, D)
    m = None
    if mask == "add":
        m = np.where(rng.random((B, 1, Sq, Sk)) < 0.3, -np.inf, rng.standard_normal((B, 1, Sq, Sk)))
    elif mask == "bool":
        m = rng.random((1, Hq, Sq, Sk)) > 0.3
    got = attention_f64(q, k, v, mask=m, causal=causal)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, naive_attention(q, k, v, m, causal), rtol=1e-11, atol=1e-12)


def test_gqa_uses_head_div_group(rng):
    """Query head h reads kv head h // group, i.e. MHA with each kv head repeated group times."""
    q, k, v = rand(rng, 1, 8, 9, 16), rand(rng, 1, 2, 11, 16), rand(rng, 1, 2, 11, 16)
    got = attention_f64(q, k, v)
    want = attention_f64(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1))
    np.testing.assert_array_equal(got, want)
    wrong = attention_f64(q, np.tile(k, (1, 4, 1, 1)), np.tile(v, (1, 4, 1, 1)))  # h % Hkv
    assert not np.allclose(got, wrong)


@pytest.mark.parametrize("mshape", [(13,), (5, 13), (2, 1, 1, 13), (1, 3, 5, 13), (2, 3, 5, 13)])
def test_mask_broadcast(rng, mshape):
    q, k, v = rand(rng, 2, 3, 5, 8), rand(rng, 2, 3, 13, 8), rand(rng, 2, 3, 13, 8)
    m = rng.standard_normal(mshape)
    got = attention_f64(q, k, v, mask=m)
    np.testing.assert_allclose(got, naive_attention(q, k, v, np.broadcast_to(m, (2, 3, 5, 13))),
                               rtol=1e-12, atol=1e-13)
    assert not np.allclose(got, attention_f64(q, k, v))  # the mask did something


def test_bad_mask_shape_names_mask(rng):
    q = rand(rng, 1, 2, 5, 8)
    with pytest.raises(ValueError, match="mask"):
        attention_f64(q, q, q, mask=np.zeros((4, 5)))


def test_neg_inf_mask_equals_dropping_keys(rng):
    q, k, v = rand(rng, 1, 1, 6, 16), rand(rng, 1, 1, 10, 16), rand(rng, 1, 1, 10, 16)
    m = np.zeros(10)
    m[[1, 4, 7]] = -np.inf
    keep = m == 0
    np.testing.assert_allclose(attention_f64(q, k, v, mask=m),
                               attention_f64(q, k[:, :, keep], v[:, :, keep]), rtol=1e-13)


def test_causal_bottom_right_sq_lt_sk(rng):
    """Sq < Sk: query i sees keys 0 .. i + Sk - Sq; the last query sees every key."""
    Sq, Sk = 4, 10
    q, k, v = rand(rng, 1, 2, Sq, 32), rand(rng, 1, 2, Sk, 32), rand(rng, 1, 2, Sk, 32)
    got = attention_f64(q, k, v, causal=True)
    for i in range(Sq):
        n = i + Sk - Sq + 1
        want = attention_f64(q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n])
        np.testing.assert_allclose(got[:, :, i:i + 1], want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got[:, :, -1], attention_f64(q, k, v)[:, :, -1], rtol=1e-12, atol=1e-14)


def test_causal_sq_gt_sk_rows_without_keys_are_zero(rng):
    Sq, Sk = 10, 4
    q, k, v = rand(rng, 1, 2, Sq, 8), rand(rng, 1, 2, Sk, 8), rand(rng, 1, 2, Sk, 8)
    got = attention_f64(q, k, v, causal=True)
    assert not np.isnan(got).any()
    assert np.all(got[:, :, :Sq - Sk] == 0)          # rows 0..5 see no key
    assert np.all(np.abs(got[:, :, Sq - Sk:]).sum(-1) > 0)


def test_fully_masked_rows_zero_not_nan(rng):
    q, k, v = rand(rng, 2, 2, 7, 16), rand(rng, 2, 2, 9, 16), rand(rng, 2, 2, 9, 16)
    m = rng.standard_normal((2, 1, 7, 9))
    m[0, 0, 3] = -np.inf
    m[1, 0, 6] = -np.inf
    got = attention_f64(q, k, v, mask=m)
    assert not np.isnan(got).any()
    assert np.all(got[0, :, 3] == 0) and np.all(got[1, :, 6] == 0)
    assert np.count_nonzero(np.abs(got).sum(-1) == 0) == 4  # exactly those rows, both heads
    bool_mask = np.ones((7, 9), bool)
    bool_mask[2] = False
    assert np.all(attention_f64(q, k, v, mask=bool_mask)[:, :, 2] == 0)


def test_scale(rng):
    q, k, v = rand(rng, 1, 1, 5, 64), rand(rng, 1, 1, 8, 64), rand(rng, 1, 1, 8, 64)
    np.testing.assert_array_equal(attention_f64(q, k, v), attention_f64(q, k, v, scale=1 / 8))
    # scale 0: uniform weights -> the mean of the values, exactly the definition
    np.testing.assert_allclose(attention_f64(q, k, v, scale=0.0)[0, 0],
                               np.broadcast_to(v[0, 0].astype(np.float64).mean(0), (5, 64)), rtol=1e-13)
    neg = attention_f64(q, k, v, scale=-0.3)
    np.testing.assert_allclose(neg, naive_attention(q, k, v, scale=-0.3), rtol=1e-12)
    for bad, exc in ((float("nan"), ValueError), (float("inf"), ValueError), ("1", TypeError)):
        with pytest.raises(exc, match="scale"):
            attention_f64(q, k, v, scale=bad)


def test_inputs_upcast_exactly(rng):
    """fp16 and bf16-valued float32 inputs give the same result as their exact float64 values."""
    from spak.core.metrics import round_to_bf16
    q32 = round_to_bf16(rng.standard_normal((1, 2, 12, 64)).astype(np.float32))
    q16 = rng.standard_normal((1, 2, 12, 64)).astype(np.float16)
    for q in (q32, q16):
        np.testing.assert_array_equal(attention_f64(q, q, q, causal=True),
                                      attention_f64(*(q.astype(np.float64),) * 3, causal=True))


def test_chunked_rows_match_unchunked(rng, monkeypatch):
    q, k, v = rand(rng, 1, 4, 50, 16), rand(rng, 1, 2, 30, 16), rand(rng, 1, 2, 30, 16)
    m = rng.standard_normal((50, 30))
    whole = attention_f64(q, k, v, mask=m, causal=True)
    monkeypatch.setattr(reference, "_CHUNK_ELEMS", 7 * 30)  # 7 rows per chunk, uneven tail
    np.testing.assert_allclose(attention_f64(q, k, v, mask=m, causal=True), whole, rtol=1e-12, atol=1e-14)


def test_nan_input_propagates_to_its_row_only(rng):
    q, k, v = rand(rng, 1, 1, 4, 8, dtype=np.float64), rand(rng, 1, 1, 6, 8), rand(rng, 1, 1, 6, 8)
    q[0, 0, 2, 3] = np.nan
    got = attention_f64(q, k, v)
    assert np.isnan(got[0, 0, 2]).all() and not np.isnan(got[0, 0, [0, 1, 3]]).any()


def test_s2048_fits(rng):
    q = rand(rng, 1, 2, 2048, 64)
    out = attention_f64(q, q, q, causal=True)
    assert out.shape == (1, 2, 2048, 64) and np.isfinite(out).all()
    np.testing.assert_allclose(out[0, 0, 0], q[0, 0, 0].astype(np.float64), rtol=1e-15)  # row 0 sees key 0


@pytest.mark.parametrize("args, match", [
    (((1, 2, 5, 8), (1, 2, 5), (1, 2, 5, 8)), "k must be 4-D"),
    (((1, 3, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)), "multiple"),
    (((1, 2, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8)), "batch"),
    (((1, 2, 5, 8), (1, 2, 5, 4), (1, 2, 5, 4)), "head dim"),
    (((1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 6, 8)), "k and v"),
])
def test_validation_names_argument(args, match):
    q, k, v = (np.ones(s, np.float16) for s in args)
    with pytest.raises(ValueError, match=match):
        attention_f64(q, k, v)
    with pytest.raises(TypeError, match="q"):
        attention_f64(np.ones((1, 1, 2, 2), np.int32), k, v)


def test_empty_sequences():
    q = np.ones((1, 1, 3, 4), np.float16)
    assert np.all(attention_f64(q, q[:, :, :0], q[:, :, :0]) == 0)
    assert attention_f64(q[:, :, :0], q, q).shape == (1, 1, 0, 4)
