"""Why the fused forward keeps its dead-row guards on problems where every row has an allowed
key (issue 17, round 4: docs/perf-notes.md). No mask and Sq <= Sk: every row sees key 0, so
the SHAPES cannot give a dead row; but +-inf inside Q or K can put every score of a row, or
every score of its first key tile, at -inf. The float64 reference (and docs/errors.md's "NaN
and inf" table) then ignores those keys: zeros for a row with no finite score, the softmax of
the remaining keys otherwise. The epilogue guard (l_i == 0 -> 0) and the exponent offset's
clamp (max(m * c, -FLOAT32_MAX)) are what give that; the host cannot rule those inputs out
without a pass over Q and K. Simulator runs (the kernel's own code, bit-exact to the GPU).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from spak.attention.reference import attention_f64
from spak.cpu.simrun import simulate_fmha


def _inputs(Sq, Sk, D, seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float16)
                 for s in ((1, 1, Sq, D), (1, 1, Sk, D), (1, 1, Sk, D)))


def _both(q, k, v, causal):
    with warnings.catch_warnings(), np.errstate(invalid="ignore", over="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        out, _ = simulate_fmha("fused", q, k, v, causal=causal, tiles=(16, 16))
        return out, attention_f64(q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_a_row_whose_every_score_is_minus_inf_gives_the_references_zeros(causal):
    """+inf in Q row 30 against keys all negative in that dim: every score of the row is
    -inf. Without the epilogue guard the row would be 0/0 = NaN."""
    q, k, v = _inputs(40, 40, 16, seed=5)
    k[..., 0] = -np.abs(k[..., 0]) - np.float16(0.5)
    q[0, 0, 30, 0] = np.inf
    out, ref = _both(q, k, v, causal)
    assert (ref[0, 0, 30] == 0).all()
    np.testing.assert_array_equal(out[0, 0, 30], 0)
    assert np.isfinite(out).all()
    assert np.allclose(out, ref, atol=2e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_a_first_key_tile_of_minus_inf_scores_is_ignored(causal):
    """-inf in dim 0 of keys 0..15 (the first key tile) against positive Q: every row's
    first tile is all -inf, its later tiles finite. Without the offset's clamp the first
    tile gives exp2(-inf - -inf) = NaN and the whole row is NaN; the reference ignores
    those keys (causal rows 0..15 see only them: zeros)."""
    q, k, v = _inputs(48, 48, 16, seed=6)
    q[..., 0] = np.abs(q[..., 0]) + np.float16(0.25)
    k[0, 0, :16, 0] = -np.inf
    out, ref = _both(q, k, v, causal)
    assert np.isfinite(ref).all() and np.isfinite(out).all()
    assert np.allclose(out, ref, atol=2e-3)
    if causal:
        np.testing.assert_array_equal(out[0, 0, :16], 0)
