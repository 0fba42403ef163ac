"""Naive FMHA forward (recipe step 2): three kernels through global memory.

    S = Q K^T * scale + M      (float32; -inf where causal hides a key, or past Sk)
    P = softmax_rows(S)        (input dtype; all-masked rows -> 0)
    O = P V                    (float32 accumulation, stored in the input dtype)

The baseline the fused kernel is checked and timed against: every score makes a round
trip through global memory, the softmax reads S three times. Nothing is skipped for
causal attention: hidden tiles are computed and written as -inf / 0.

Layouts as in fused.py: Q [B, Hq, Sq, D], K [B, Hkv, Sk, D], V [B, Hkv, Sk, Dv],
Mask float32 [MB, MH, Sq, Sk] (MB in {1, B}, MH in {1, Hq}; a never-read dummy when
HAS_MASK is False). Causal is bottom-right: query i sees key j iff j <= i + (Sk - Sq).

S and P are [B, Hq, Sq', Sk'] with Sq', Sk' rounded up to whole tiles (gpu/plan.py).

Grids: scores (cdiv(Sq, TILE_M), cdiv(Sk, TILE_N), B*Hq); softmax and P V
(cdiv(Sq, TILE_M), B*Hq, 1).
"""
import cuda.tile as ct

from .common import LOG2E, NEG_INF

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def _head_coords(bid_bh, Q, K):
    """(batch, query head, kv head) of a flattened B*Hq block index; head counts come
    from the array shapes at run time. GQA: query head h reads kv head h // (Hq // Hkv)."""
    num_q_heads = Q.shape[1]
    group = num_q_heads // K.shape[1]
    h = bid_bh % num_q_heads
    return bid_bh // num_q_heads, h, h // group


# --------------------------------------------------------------------------------------
# (a) scores: one [TILE_M, TILE_N] tile of S per block.
# --------------------------------------------------------------------------------------
@ct.kernel
def naive_scores_kernel(Q, K, Mask, S,
                        scale: float,
                        HEAD_DIM: ConstInt,
                        TILE_M: ConstInt,
                        TILE_N: ConstInt,
                        CAUSAL: ConstBool,
                        HAS_MASK: ConstBool):
    bid_m = ct.bid(0)
    bid_n = ct.bid(1)
    b, h, kv_h = _head_coords(ct.bid(2), Q, K)

    # Partial tiles read as zeros (rows past Sq give scores nobody reads).
    q = ct.load(Q, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))
    k_t = ct.load(K, index=(b, kv_h, 0, bid_n), shape=(1, 1, HEAD_DIM, TILE_N),
                  order=(0, 1, 3, 2),              # K^T through the load's axis order
                  padding_mode=ct.PaddingMode.ZERO).reshape((HEAD_DIM, TILE_N))
    s = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    s = ct.mma(q, k_t, s) * scale

    if HAS_MASK:
        # Broadcast mask dims (extent 1) are indexed at 0, full ones at b / h.
        mask_b = min(b, Mask.shape[0] - 1)
        mask_h = min(h, Mask.shape[1] - 1)
        s = s + ct.load(Mask, index=(mask_b, mask_h, bid_m, bid_n),
                        shape=(1, 1, TILE_M, TILE_N),
                        padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_N))

    # S is padded to whole tiles (gpu/plan.py): keys past Sk get -inf, probability 0.
    key_pos = (bid_n * TILE_N + ct.arange(TILE_N, dtype=ct.int32))[None, :]
    if (bid_n + 1) * TILE_N > K.shape[2]:
        s = ct.where(key_pos < K.shape[2], s, NEG_INF)
    if CAUSAL:
        diag = K.shape[2] - Q.shape[2]
        q_pos = (bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32) + diag)[:, None]
        s = ct.where(key_pos <= q_pos, s, NEG_INF)

    ct.store(S, index=(b, h, bid_m, bid_n), tile=s.reshape((1, 1, TILE_M, TILE_N)))


# --------------------------------------------------------------------------------------
# (b) row softmax of S into P: three passes over the row's key tiles.
# --------------------------------------------------------------------------------------
@ct.kernel
def naive_softmax_kernel(S, P,
                         TILE_M: ConstInt,
                         TILE_N: ConstInt):
    bid_m = ct.bid(0)
    bid_bh = ct.bid(1)
    num_heads = S.shape[1]
    b = bid_bh // num_heads
    h = bid_bh % num_heads
    num_tiles = ct.cdiv(S.shape[3], TILE_N)

    # Pass 1: row max. Keys past Sk read as -inf, so they never win the max and
    # contribute exp2(-inf) = 0 to the sum below.
    m = ct.full((TILE_M, 1), NEG_INF, dtype=ct.float32)
    for j in range(0, num_tiles):
        s = _load_scores(S, b, h, bid_m, j, TILE_M, TILE_N)
        m = ct.maximum(m, ct.max(s, axis=-1, keepdims=True))
    # A row with no allowed key has m == -inf: subtract 0 instead so that
    # exp2(-inf - -inf) = NaN never happens (its exps are all exp2(-inf) = 0).
    m = ct.where(m == NEG_INF, 0.0, m)

    # Pass 2: row sum of exp(s - m) = exp2((s - m) * log2(e)).
    l = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    for j in range(0, num_tiles):
        s = _load_scores(S, b, h, bid_m, j, TILE_M, TILE_N)
        l = l + ct.sum(ct.exp2((s - m) * LOG2E, flush_to_zero=True), axis=-1, keepdims=True)
    # l == 0 only for rows with no allowed key; dividing 0 by 1 gives P == 0 there.
    l = ct.where(l > 0.0, l, 1.0)

    # Pass 3: normalised probabilities, rounded to the input dtype (what P V consumes).
    for j in range(0, num_tiles):
        s = _load_scores(S, b, h, bid_m, j, TILE_M, TILE_N)
        p = ct.truediv(ct.exp2((s - m) * LOG2E, flush_to_zero=True), l,
                       flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
        p = p.astype(P.dtype).reshape((1, 1, TILE_M, TILE_N))
        ct.store(P, index=(b, h, bid_m, j), tile=p)


def _load_scores(S, b, h, i, j, TILE_M, TILE_N):
    """Score tile with out-of-range entries read as -inf (ignored by max and sum)."""
    return ct.load(S, index=(b, h, i, j), shape=(1, 1, TILE_M, TILE_N),
                   padding_mode=ct.PaddingMode.NEG_INF).reshape((TILE_M, TILE_N))


# --------------------------------------------------------------------------------------
# (c) O = P V, float32 accumulation over the key tiles.
# --------------------------------------------------------------------------------------
@ct.kernel
def naive_pv_kernel(P, V, Out,
                    HEAD_DIM_V: ConstInt,
                    TILE_M: ConstInt,
                    TILE_N: ConstInt):
    bid_m = ct.bid(0)
    b, h, kv_h = _head_coords(ct.bid(1), P, V)
    num_tiles = ct.cdiv(V.shape[2], TILE_N)

    acc = ct.full((TILE_M, HEAD_DIM_V), 0.0, dtype=ct.float32)
    for j in range(0, num_tiles):
        # Zero padding on both sides: a key past Sk contributes 0 * 0.
        p = ct.load(P, index=(b, h, bid_m, j), shape=(1, 1, TILE_M, TILE_N),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_N))
        v = ct.load(V, index=(b, kv_h, j, 0), shape=(1, 1, TILE_N, HEAD_DIM_V),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, HEAD_DIM_V))
        acc = ct.mma(p, v, acc)

    out = acc.astype(Out.dtype).reshape((1, 1, TILE_M, HEAD_DIM_V))
    ct.store(Out, index=(b, h, bid_m, 0), tile=out)
