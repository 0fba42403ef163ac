"""Recipe step 1: the online softmax prototype matches the global softmax to <= 1e-12."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from spak.attention.reference import attention_f64
from spak.cpu.softmax_proto import (PROTOTYPE_GATE, LOG2E, check_prototype, online_attention_f64,
                                online_softmax_f64, online_softmax_stats, softmax_f64)


def test_global_softmax_definition(rng):
    x = rng.standard_normal((3, 11))
    e = np.exp(x)
    np.testing.assert_allclose(softmax_f64(x), e / e.sum(-1, keepdims=True), rtol=1e-14)
    x[1] = -np.inf
    p = softmax_f64(x)
    assert np.all(p[1] == 0) and not np.isnan(p).any()


@given(rows=st.integers(1, 6), n=st.integers(1, 300), block=st.integers(1, 300),
       spread=st.sampled_from([1.0, 10.0, 300.0]), masked=st.floats(0.0, 0.9),
       seed=st.integers(0, 2**32 - 1))
def test_online_softmax_matches_global(rows, n, block, spread, masked, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)) * spread
    x[rng.random((rows, n)) < masked] = -np.inf
    x[0] = -np.inf  # always one fully masked row
    got, want = online_softmax_f64(x, block), softmax_f64(x)
    assert not np.isnan(got).any()
    assert np.all(got[0] == 0)
    assert np.max(np.abs(got - want)) <= PROTOTYPE_GATE


def test_rescaling_is_exercised(rng):
    """An ascending row in blocks of 1: the running max grows at every step."""
    x = np.sort(rng.standard_normal(500) * 20)
    m, l = online_softmax_stats(x[None], 1)
    assert m[0] == pytest.approx(x.max() * LOG2E, rel=1e-15)
    assert l[0] == pytest.approx(np.exp(x - x.max()).sum(), rel=1e-12)
    assert np.max(np.abs(online_softmax_f64(x, 1) - softmax_f64(x))) <= PROTOTYPE_GATE
    # Without rescaling the sum would be wrong by orders of magnitude: the check has teeth.
    naive_l = sum(np.exp2(x[j] * LOG2E - x[:j + 1].max() * LOG2E) for j in range(len(x)))
    assert abs(naive_l - l[0]) > 1e-3


@given(B=st.integers(1, 2), Hkv=st.integers(1, 2), group=st.sampled_from([1, 4]),
       Sq=st.integers(1, 70), Sk=st.integers(1, 70), D=st.sampled_from([16, 64, 128]),
       causal=st.booleans(), mask=st.booleans(), block_n=st.sampled_from([1, 16, 64, 128]),
       seed=st.integers(0, 2**32 - 1))
def test_online_attention_matches_reference(B, Hkv, group, Sq, Sk, D, causal, mask, block_n, seed):
    rng = np.random.default_rng(seed)
    Hq = Hkv * group
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float16)
    k = rng.standard_normal((B, Hkv, Sk, D)).astype(np.float16)
    v = rng.standard_normal((B, Hkv, Sk, D)).astype(np.float16)
    m = None
    if mask:
        m = np.where(rng.random((B, 1, Sq, Sk)) < 0.25, -np.inf, rng.standard_normal((B, 1, Sq, Sk)))
        m[0, 0, Sq // 2] = -np.inf
    got = online_attention_f64(q, k, v, mask=m, causal=causal, block_n=block_n)
    want = attention_f64(q, k, v, mask=m, causal=causal)
    assert not np.isnan(got).any()
    assert np.max(np.abs(got - want)) <= PROTOTYPE_GATE
    if mask:
        assert np.all(got[0, :, Sq // 2] == 0)


def test_online_attention_causal_rows_without_keys(rng):
    q = rng.standard_normal((1, 2, 9, 32))
    k = rng.standard_normal((1, 2, 3, 32))
    got = online_attention_f64(q, k, k, causal=True, block_n=2)
    assert np.all(got[:, :, :6] == 0) and not np.isnan(got).any()
    assert np.max(np.abs(got - attention_f64(q, k, k, causal=True))) <= PROTOTYPE_GATE


def test_check_prototype_passes():
    r = check_prototype(seed=3)
    assert r["passed"] and r["softmax_max_abs"] <= PROTOTYPE_GATE
    assert r["attention_max_abs"] <= PROTOTYPE_GATE


def test_bad_block():
    with pytest.raises(ValueError, match="block"):
        online_softmax_f64(np.ones(4), 0)
    with pytest.raises(ValueError, match="block_n"):
        online_attention_f64(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), block_n=0)
