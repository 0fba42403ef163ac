"""sm_90: a sum down the rows (axis 0) of an mma accumulator tile, `ct.sum(l_i, 0)` of
TileGym's decode kernels ([TILE_N, group] = 128 x 8 in flash_decode, 128 x 16 in the MLA
decoders): a thread adds its rows 8 apart, then its m64 blocks; the lanes by xor 16, 8, 4,
the warps (w0 + w2) + (w1 + w3) (numerics.fragment_col_sum_f32). Fitted to the H100
recording (results/samples-h100-2026-11-24): the 1-ulp LSE outputs of flash_decode,
mla_decoding and mla_decoding_split_kv -> 100% (7 values). This kernel has flash_decode's
op sequence for one KV split of one head (kernels_extract3.npz: head 2's q and K and its
two recorded split LSEs, the first of which the previous rule missed). Only M = 128 was
measured."""
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
    """sm_90 with axis-0 sums of mma tiles as before (chunks of 4, halving)."""
    col_sums_mma = False


@ct.kernel
def _split_lse(Q, K, LSE, scale: float, TN: C, G: C, D: C):
    s = ct.bid(0)
    q = ct.transpose(ct.load(Q, (0, 0), (G, D), padding_mode=ct.PaddingMode.ZERO))
    k = ct.load(K, (s, 0), (TN, D))
    qk = ct.mma(k, q, ct.full((TN, G), 0.0, dtype=ct.float32))
    qk = qk * (scale * INV_LOG_2)
    m = ct.maximum(ct.full((G,), -math.inf, dtype=ct.float32), ct.max(qk, 0))
    p = ct.exp2(qk - m[None, :])
    alpha = ct.exp2(ct.full((G,), -math.inf, dtype=ct.float32) - m)
    l_i = ct.full((TN, G), 1.0, dtype=ct.float32) * alpha[None, :] + p
    lse = m + ct.log2(ct.sum(l_i, 0))
    ct.store(LSE, (s, 0), lse.reshape((1, G)))


def _run(rec, model):
    out = np.zeros((2, 8), np.float32)
    sim.launch(_split_lse, (2,), (rec["dec_q"].reshape(1, 64), rec["dec_k"], out, 0.125,
                                  128, 8, 64), model=model)
    return np.ascontiguousarray(out[:, 0])


@pytest.fixture(scope="module")
def rec():
    return dict(np.load(EXTRACT))


def test_decode_lse_matches_the_h100(rec):
    want = rec["dec_lse"].astype(np.float32)
    assert np.isfinite(want).all()
    assert (_run(rec, "sm_90").view(np.uint32) == want.view(np.uint32)).all()
    before = _run(rec, _Sm90Before())
    assert (before.view(np.uint32) != want.view(np.uint32)).sum() == 1
