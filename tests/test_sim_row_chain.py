"""sm_90: the row sum of a 256-row mma accumulator tile is ONE sequential chain per lane in
fragment order, starting from the first value, then the quad's butterflies (xor 2, xor 1);
read from the SASS of TileGym's FMHA forward with LSE (TILE_M 256, TILE_N 128) and measured
on an H100 through its LSE = m + log2(l) (results/samples-h100-2026-11-24,
kernels_extract3.npz: head 0's Q and K and the 128 recorded LSE values): 26 of 512 LSE
values (11 of head 0's 128) 1 ulp -> 100%. Smaller tiles keep the two chains from +0 of
the fused kernel's SASS (numerics.fragment_row_sum_f32). Only 256 x 128 was measured."""
import math
from pathlib import Path

import numpy as np
import pytest

import cuda.tile as ct
from spak import sim
from spak.sim.numerics import Sm90

EXTRACT = Path(__file__).resolve().parents[1] / "results" / "samples-h100-2026-11-24" / \
    "kernels_extract3.npz"
C = ct.Constant[int]
INV_LOG_2 = 1.0 / math.log(2)


class _Sm90Before(Sm90):
    """sm_90 with the two-chain row sum for every tile (the previous rule)."""
    row_chain_256 = False


@ct.kernel
def _causal_lse(Q, K, LSE, scale: float, TM: C, TN: C, D: C):
    """One causal tile of m + log2(sum exp2(s - m)), TileGym's op sequence."""
    q = ct.load(Q, (0, 0), (TM, D), padding_mode=ct.PaddingMode.ZERO)
    k = ct.load(K, (0, 0), (D, TN), order=(1, 0))
    qk = ct.mma(q, k, ct.full((TM, TN), 0.0, dtype=ct.float32))
    rows = ct.arange(TM, dtype=ct.int32)[:, None]
    cols = ct.arange(TN, dtype=ct.int32)[None, :]
    qk += ct.where(rows >= cols, 0.0, -math.inf)
    c = scale * INV_LOG_2
    m = ct.max(qk, axis=-1, keepdims=True) * c
    p = ct.exp2(qk * c - m, flush_to_zero=True)
    lse = m + ct.log2(ct.sum(p, axis=-1, keepdims=True))
    ct.store(LSE, (0,), lse.reshape((TM,)))


def _run(rec, model):
    out = np.zeros(256, np.float32)
    sim.launch(_causal_lse, (1,), (rec["lse_q"], rec["lse_k"], out, 0.125, 256, 128, 64),
               model=model)
    return out[:128]


@pytest.fixture(scope="module")
def rec():
    return dict(np.load(EXTRACT))


def test_256_row_sums_match_the_h100(rec):
    want = rec["lse_out"]
    assert np.isfinite(want).all()
    got = _run(rec, "sm_90")
    assert (got.view(np.uint32) == want.view(np.uint32)).all()
    before = _run(rec, _Sm90Before())
    assert (before.view(np.uint32) != want.view(np.uint32)).sum() >= 5
