"""FMHA backward (FlashAttention-2's shape, deterministic: no atomics anywhere).

Forward: O = softmax(Z) V with Z = Q K^T * scale + M, P = softmax(Z) row-wise.
Given dO (the gradient of the loss w.r.t. O) and the forward's row log-sum-exp
lse = log(sum_j exp(Z_j)) (gpu/kernels/fused.py, fmha_fwd_lse_kernel):

    P  = exp(Z - lse)                      recomputed from Q, K and lse, never stored
    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - delta),  delta = rowsum(dO * O)   (= rowsum(P * dP))
    dQ = scale * dS K
    dK = scale * dS^T Q

Three launches (gpu/plan_bwd.py plans them):
  1. fmha_bwd_preprocess_kernel, grid (cdiv(Sq, TILE_M), B * Hq): delta, and the LSE
     converted to log2 units (lse2 = lse * log2(e)) so the two kernels below subtract a
     loaded value, never a pending product (keeps the FFMA of `s * c - lse2` unambiguous).
  2. fmha_bwd_dkdv_kernel, grid (cdiv(Sk, TILE_N), B * Hkv): block (j, b*Hkv + g) owns
     keys [j*TILE_N, (j+1)*TILE_N) of kv head g and keeps dK, dV in float32 registers while
     it walks every query head of the GQA group and, per head, every query tile that can
     see these keys. It works on the transposed scores S^T = K Q^T [TILE_N, TILE_M], so P^T
     and dS^T come out in the orientation dV += P^T dO and dK += dS^T Q need. The group's
     heads are summed inside the block, in a fixed order: deterministic, no atomics.
  3. fmha_bwd_dq_kernel, grid (cdiv(Sq, TILE_M), B * Hq): block (i, b*Hq + h) owns query
     rows [i*TILE_M, (i+1)*TILE_M) and walks the key tiles they can see, as the forward.

Masking, as in the forward: causal is bottom-right (query i sees key j iff
j <= i + Sk - Sq); an additive mask M (float32 [MB, MH, Sq, Sk], -inf entries) enters Z;
rows that see no key have lse = +inf, so their P is exactly 0 and their gradients are 0.
Query rows past Sq load lse2 = +inf (padding) and weigh nothing; key rows past Sk in the
dK/dV block compute rows that the bounds-checked store drops; keys past Sk in the dQ
block are masked (they would otherwise add to real rows).

All arithmetic in the base-2 domain as the forward: c = scale * log2(e), P = exp2(S c +
M log2(e) - lse2). Operands of the tensor-core products are rounded to the input dtype
(P and dS, as FlashAttention does); every accumulator is float32.
"""
import math

import cuda.tile as ct

from .common import LOG2E, causal_key_range

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

POS_INF = math.inf


# --------------------------------------------------------------------------------------
# 1. Preprocess: delta = rowsum(dO * O), lse2 = lse * log2(e)
# --------------------------------------------------------------------------------------
# A streaming kernel: occupancy 4 caps it at 64 registers (the compiler otherwise reserves
# 255 for the same code, one block per SM; cubin read on the CPU, gpu.resources).
@ct.kernel(occupancy=4)
def fmha_bwd_preprocess_kernel(Out, dOut, Lse, Delta, Lse2,
                               HEAD_DIM_V: ConstInt,   # tile width of Dv (power of two)
                               TILE_M: ConstInt):      # rows per block
    num_heads = Out.shape[1]
    _preprocess_block(Out, dOut, Lse, Delta, Lse2, ct.bid(1) // num_heads,
                      ct.bid(1) % num_heads, ct.bid(0), HEAD_DIM_V, TILE_M)


def _preprocess_block(Out, dOut, Lse, Delta, Lse2, b, h, bid_m, HEAD_DIM_V, TILE_M):
    # columns past Dv and rows past Sq load as zeros; those rows are dropped by the store
    o = ct.load(Out, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, HEAD_DIM_V),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM_V))
    do = ct.load(dOut, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, HEAD_DIM_V),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM_V))
    # In float64, products of fp16/bf16 values are exact and so, but for rows whose terms
    # span more than 2^31 in magnitude, is their sum: the order the GPU sums in cannot
    # change the result, which is rounded once to float32.
    delta = ct.sum(o.astype(ct.float64) * do.astype(ct.float64), axis=-1)    # [TM]
    delta = delta.astype(ct.float32)
    ct.store(Delta, index=(b, h, bid_m), tile=delta.reshape((1, 1, TILE_M)))
    lse = ct.load(Lse, index=(b, h, bid_m), shape=(1, 1, TILE_M),
                  padding_mode=ct.PaddingMode.POS_INF)
    ct.store(Lse2, index=(b, h, bid_m), tile=lse * LOG2E)     # +inf stays +inf


# --------------------------------------------------------------------------------------
# 2. dK, dV: one block per (key tile, batch, kv head)
# --------------------------------------------------------------------------------------
# occupancy 2 on sm_90: at D <= 128 with 64x64 tiles both kernels then compile to 256
# threads x 128 registers without spills; the compiler's default (384 threads x 168
# registers) spills (cubins read on the CPU, gpu.resources; not yet timed on a GPU).
@ct.kernel(occupancy=ct.ByTarget(sm_90=2))
def fmha_bwd_dkdv_kernel(Q, K, V, dOut, Lse2, Delta, Mask, dK, dV,
                         scale: float,             # softmax scale (float32), any finite
                         HEAD_DIM: ConstInt,       # tile width of D (power of two >= D)
                         HEAD_DIM_V: ConstInt,     # tile width of Dv
                         TILE_M: ConstInt,         # query rows per inner step
                         TILE_N: ConstInt,         # keys per block
                         CAUSAL: ConstBool,
                         HAS_MASK: ConstBool,
                         SPLIT: ConstInt = 1):    # column parts of dK/dV (grid z)
    # Key tile 0 has the most work under causal (every query sees it): bid(0) order,
    # which the GPU starts first, is already longest first.
    num_kv_heads = K.shape[1]
    b = ct.bid(1) // num_kv_heads
    kv_h = ct.bid(1) % num_kv_heads
    _dkdv_block(Q, K, V, dOut, Lse2, Delta, Mask, dK, dV, scale, b, kv_h, ct.bid(0),
                HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK, SPLIT)


# SPLIT > 1 (D 256): block (j, b*Hkv + g, c) keeps only columns [c*D/SPLIT, (c+1)*D/SPLIT)
# of dK and dV in registers; S^T and dP^T still take the whole head dim, so each part
# recomputes them (the dK/dV pass does 1.5x its matmul work at SPLIT 2). At D 256 the two
# [keys, 256] float32 accumulators spill at every tile (sm_90 cubins, 1032-6448 bytes a
# thread); each column of dK/dV is summed over the same query tiles in the same order
# either way.
def _dkdv_block(Q, K, V, dOut, Lse2, Delta, Mask, dK, dV, scale, b, kv_h, bid_n,
                HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK, SPLIT=1):
    seq_q = Q.shape[2]
    seq_k = K.shape[2]
    diag = seq_k - seq_q                 # query i sees key j iff j <= i + diag
    group = Q.shape[1] // K.shape[1]
    c = scale * LOG2E

    k = ct.load(K, index=(b, kv_h, bid_n, 0), shape=(1, 1, TILE_N, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, HEAD_DIM))
    v = ct.load(V, index=(b, kv_h, bid_n, 0), shape=(1, 1, TILE_N, HEAD_DIM_V),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, HEAD_DIM_V))
    part = ct.bid(2) if SPLIT > 1 else 0
    dk = ct.full((TILE_N, HEAD_DIM // SPLIT), 0.0, dtype=ct.float32)
    dv = ct.full((TILE_N, HEAD_DIM_V // SPLIT), 0.0, dtype=ct.float32)
    key_pos = (bid_n * TILE_N + ct.arange(TILE_N, dtype=ct.int32))[:, None]     # [TN, 1]

    m_tiles, m_start, m_full = _query_tiles(bid_n, seq_q, diag, TILE_M, TILE_N, CAUSAL)

    mask_b = min(b, Mask.shape[0] - 1)
    for g in range(group):               # the GQA group's query heads, in order
        h = kv_h * group + g
        mask_h = min(h, Mask.shape[1] - 1)
        for i in range(m_start, m_full):         # the causal diagonal band
            dk, dv = _dkdv_step(Q, dOut, Lse2, Delta, Mask, k, v, dk, dv, key_pos, c,
                                b, h, mask_b, mask_h, bid_n, i, diag, HEAD_DIM,
                                HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK, SPLIT, part)
        for i in range(m_full, m_tiles):         # every key visible (or non-causal)
            dk, dv = _dkdv_step(Q, dOut, Lse2, Delta, Mask, k, v, dk, dv, key_pos, c,
                                b, h, mask_b, mask_h, bid_n, i, diag, HEAD_DIM,
                                HEAD_DIM_V, TILE_M, TILE_N, False, HAS_MASK, SPLIT, part)

    dk = (dk * scale).astype(dK.dtype).reshape((1, 1, TILE_N, HEAD_DIM // SPLIT))
    ct.store(dK, index=(b, kv_h, bid_n, part), tile=dk)       # rows past Sk dropped
    ct.store(dV, index=(b, kv_h, bid_n, part),
             tile=dv.astype(dV.dtype).reshape((1, 1, TILE_N, HEAD_DIM_V // SPLIT)))


def _query_tiles(bid_n, seq_q, diag, TILE_M, TILE_N, CAUSAL):
    """(m_tiles, m_start, m_full): the query tiles a key block visits. m_start: the first
    tile with a row that sees one of these keys; from m_full on every row sees every key of
    the block (no element-wise test). Keys past Sk count as visible: their rows are dropped
    by the store anyway."""
    m_tiles = ct.cdiv(seq_q, TILE_M)
    if CAUSAL:
        m_start = min(max(bid_n * TILE_N - diag, 0) // TILE_M, m_tiles)
        last_key = bid_n * TILE_N + TILE_N - 1
        m_full = max(min(ct.cdiv(max(last_key - diag, 0), TILE_M), m_tiles), m_start)
    else:
        m_start = 0
        m_full = 0
    return m_tiles, m_start, m_full


def _dkdv_step(Q, dOut, Lse2, Delta, Mask, k, v, dk, dv, key_pos, c, b, h, mask_b, mask_h,
               bid_n, i, diag, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK,
               SPLIT=1, part=0, WANT_DS=False):
    """Fold query tile i of head h into (dk, dv), on transposed [TN, TM] tiles; with
    SPLIT > 1, into columns part of SPLIT of dk and dv. WANT_DS (the fused-dQ kernel):
    also return dS^T, rounded to the input dtype as the dK product takes it."""
    q = ct.load(Q, index=(b, h, i, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))
    do = ct.load(dOut, index=(b, h, i, 0), shape=(1, 1, TILE_M, HEAD_DIM_V),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM_V))
    # rows past Sq: lse2 = +inf, so their weights are exactly 0
    lse2 = ct.load(Lse2, index=(b, h, i), shape=(1, 1, TILE_M),
                   padding_mode=ct.PaddingMode.POS_INF).reshape((1, TILE_M))
    delta = ct.load(Delta, index=(b, h, i), shape=(1, 1, TILE_M),
                    padding_mode=ct.PaddingMode.ZERO).reshape((1, TILE_M))

    st = ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32)
    st = ct.mma(k, q.permute((1, 0)), st)                    # S^T = K Q^T
    x = st * c
    if HAS_MASK:
        m_t = ct.load(Mask, index=(mask_b, mask_h, bid_n, i), shape=(1, 1, TILE_N, TILE_M),
                      order=(0, 1, 3, 2),                   # M^T via the load's axis order
                      padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_M))
        x = x + m_t * LOG2E
    p_t = ct.exp2(x - lse2, flush_to_zero=True)             # P^T [TN, TM]
    if CAUSAL:
        q_pos = (i * TILE_M + ct.arange(TILE_M, dtype=ct.int32) + diag)[None, :]
        p_t = ct.where(key_pos <= q_pos, p_t, 0.0)
    do_part, q_part = do, q
    if SPLIT > 1:           # this block's columns of dO and Q (loaded again: L2 hits)
        dv_w, d_w = HEAD_DIM_V // SPLIT, HEAD_DIM // SPLIT
        do_part = ct.load(dOut, index=(b, h, i, part), shape=(1, 1, TILE_M, dv_w),
                          padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, dv_w))
        q_part = ct.load(Q, index=(b, h, i, part), shape=(1, 1, TILE_M, d_w),
                         padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, d_w))
    dv = ct.mma(p_t.astype(v.dtype), do_part, dv)           # dV += P^T dO

    dpt = ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32)
    dpt = ct.mma(v, do.permute((1, 0)), dpt)                # dP^T = V dO^T
    ds_t = (p_t * (dpt - delta)).astype(k.dtype)            # dS^T
    dk = ct.mma(ds_t, q_part, dk)                           # dK += dS^T Q (scaled at the end)
    if WANT_DS:
        return dk, dv, ds_t
    return dk, dv


# --------------------------------------------------------------------------------------
# 3. dQ: one block per (query tile, batch, query head)
# --------------------------------------------------------------------------------------
@ct.kernel(occupancy=ct.ByTarget(sm_90=2))
def fmha_bwd_dq_kernel(Q, K, V, dOut, Lse2, Delta, Mask, dQ,
                       scale: float,
                       HEAD_DIM: ConstInt, HEAD_DIM_V: ConstInt,
                       TILE_M: ConstInt,           # query rows per block
                       TILE_N: ConstInt,           # keys per inner step
                       CAUSAL: ConstBool,
                       HAS_MASK: ConstBool):
    bid_m = ct.bid(0)
    if CAUSAL:
        bid_m = ct.num_blocks(0) - 1 - bid_m    # longest first, as the forward
    num_q_heads = Q.shape[1]
    group = num_q_heads // K.shape[1]
    h = ct.bid(1) % num_q_heads
    _dq_block(Q, K, V, dOut, Lse2, Delta, Mask, dQ, scale, ct.bid(1) // num_q_heads, h,
              h // group, bid_m, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK)


def _dq_block(Q, K, V, dOut, Lse2, Delta, Mask, dQ, scale, b, h, kv_h, bid_m,
              HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK):
    seq_q = Q.shape[2]
    seq_k = K.shape[2]
    diag = seq_k - seq_q
    c = scale * LOG2E

    q = ct.load(Q, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))
    do = ct.load(dOut, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, HEAD_DIM_V),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM_V))
    lse2 = ct.load(Lse2, index=(b, h, bid_m), shape=(1, 1, TILE_M),
                   padding_mode=ct.PaddingMode.POS_INF).reshape((TILE_M, 1))
    delta = ct.load(Delta, index=(b, h, bid_m), shape=(1, 1, TILE_M),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, 1))
    q_pos = (bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32) + diag)[:, None]   # [TM, 1]

    # key tiles to visit, as the forward (common.causal_key_range)
    kv_end, mask_from = causal_key_range(bid_m, seq_q, seq_k, TILE_M, TILE_N, CAUSAL)
    num_tiles = ct.cdiv(kv_end, TILE_N)
    mask_b = min(b, Mask.shape[0] - 1)
    mask_h = min(h, Mask.shape[1] - 1)

    dq = ct.full((TILE_M, HEAD_DIM), 0.0, dtype=ct.float32)
    for j in range(0, min(mask_from, num_tiles)):
        dq = _dq_step(K, V, Mask, q, do, lse2, delta, dq, q_pos, c, b, kv_h, mask_b, mask_h,
                      bid_m, j, seq_k, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, False, False,
                      HAS_MASK)
    for j in range(mask_from, num_tiles):
        dq = _dq_step(K, V, Mask, q, do, lse2, delta, dq, q_pos, c, b, kv_h, mask_b, mask_h,
                      bid_m, j, seq_k, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, True, CAUSAL,
                      HAS_MASK)

    dq = (dq * scale).astype(dQ.dtype).reshape((1, 1, TILE_M, HEAD_DIM))
    ct.store(dQ, index=(b, h, bid_m, 0), tile=dq)             # rows past Sq dropped


def _dq_step(K, V, Mask, q, do, lse2, delta, dq, q_pos, c, b, kv_h, mask_b, mask_h, bid_m,
             j, seq_k, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, BOUNDARY, CAUSAL, HAS_MASK):
    """Fold key tile j into dq. BOUNDARY: keys past Sk (and, if CAUSAL, keys right of the
    diagonal) get weight 0."""
    k = ct.load(K, index=(b, kv_h, j, 0), shape=(1, 1, TILE_N, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, HEAD_DIM))
    v_t = ct.load(V, index=(b, kv_h, 0, j), shape=(1, 1, HEAD_DIM_V, TILE_N),
                  order=(0, 1, 3, 2),                       # V^T via the load's axis order
                  padding_mode=ct.PaddingMode.ZERO).reshape((HEAD_DIM_V, TILE_N))
    s = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    s = ct.mma(q, k.permute((1, 0)), s)                     # S = Q K^T
    x = s * c
    if HAS_MASK:
        m_tile = ct.load(Mask, index=(mask_b, mask_h, bid_m, j), shape=(1, 1, TILE_M, TILE_N),
                         padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_N))
        x = x + m_tile * LOG2E
    p = ct.exp2(x - lse2, flush_to_zero=True)                # P [TM, TN]
    if BOUNDARY:
        key_pos = (j * TILE_N + ct.arange(TILE_N, dtype=ct.int32))[None, :]   # [1, TN]
        keep = key_pos < seq_k
        if CAUSAL:
            keep = keep & (key_pos <= q_pos)
        p = ct.where(keep, p, 0.0)

    dp = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    dp = ct.mma(do, v_t, dp)                                 # dP = dO V^T
    ds = p * (dp - delta)
    return ct.mma(ds.astype(k.dtype), k, dq)                 # dQ += dS K (scaled at the end)


# --------------------------------------------------------------------------------------
# 4. Fused dQ (opt-in, tiles["DQ_FUSED"] = 1): dK, dV and dQ in one pass, two launches
# --------------------------------------------------------------------------------------
# The three-launch backward does 7 matrix products per (query tile, key tile) pair, because
# the dQ kernel recomputes S and dP; here the dK/dV block also forms dQ's part dS K from
# the dS^T it already has (5 products). Each dQ tile of TILE_M rows then takes one part
# from every key tile that sees it, from different blocks. They are summed in float32 in
# a FIXED order, the last key tile first and key tile 0 last, through a workspace DqAcc:
# the block of rank r in that order waits until the tile's counter reads r (acquire),
# adds its part to the workspace, and sets the counter to r + 1 (release). Same order on
# every run: deterministic bits, and the simulator can follow them. Key tile 0 adds last
# and writes dQ itself (scaled, cast), so there is no third launch.
#
# Why this order: under causal masking key tile j sees query tiles j.., so a block started
# with the others reaches query tile i at its step i - j. Tile i's parts then arrive
# highest key tile first without anyone waiting, when blocks of a (batch, kv head) start
# together. Which blocks start first is up to the GPU: each block takes a logical id from
# an atomic ticket (Start) at its start, as decoupled look-back scans do, and serves key
# tile n_kt - 1 - id (per batch and kv head). A block only ever waits on blocks of smaller
# ids, which have started, so the waits cannot deadlock however few blocks fit at once.
# Counters and the ticket are float32 (the workspaces' one dtype; exact below 2^24).

@ct.kernel(occupancy=4)
def fmha_bwd_preprocess_dq_kernel(Out, dOut, Lse, Delta, Lse2, Count, Start,
                                  HEAD_DIM_V: ConstInt, TILE_M: ConstInt):
    """The preprocess, plus the fused pass's counters (one per query row; the dK/dV pass
    uses the first row's of each of its query tiles) and the ticket set to zero."""
    num_heads = Out.shape[1]
    b = ct.bid(1) // num_heads
    h = ct.bid(1) % num_heads
    _preprocess_block(Out, dOut, Lse, Delta, Lse2, b, h, ct.bid(0), HEAD_DIM_V, TILE_M)
    ct.store(Count, index=(b, h, ct.bid(0)),
             tile=ct.full((1, 1, TILE_M), 0.0, dtype=ct.float32))
    if ct.bid(0) == 0 and ct.bid(1) == 0:
        ct.store(Start, index=(0,), tile=ct.full((1,), 0.0, dtype=ct.float32))


@ct.kernel(occupancy=ct.ByTarget(sm_90=2))
def fmha_bwd_dkdvdq_kernel(Q, K, V, dOut, Lse2, Delta, Mask, dK, dV, dQ, DqAcc, Count, Start,
                           scale: float,
                           HEAD_DIM: ConstInt, HEAD_DIM_V: ConstInt,
                           TILE_M: ConstInt,       # query rows per step (and per dQ tile)
                           TILE_N: ConstInt,       # keys per block
                           CAUSAL: ConstBool,
                           HAS_MASK: ConstBool,
                           DQ_PARTS: ConstInt = 1,   # dQ's columns in parts (_dq_add)
                           DQ_EARLY: ConstBool = False):   # the product before the wait
    n_kt = ct.num_blocks(0)
    lid = ct.atomic_add(Start, 0, 1.0).astype(ct.int32)      # logical id, in start order
    bid_n = n_kt - 1 - lid % n_kt
    chain = lid // n_kt
    num_kv_heads = K.shape[1]
    _dkdvdq_block(Q, K, V, dOut, Lse2, Delta, Mask, dK, dV, dQ, DqAcc, Count, scale,
                  chain // num_kv_heads, chain % num_kv_heads, bid_n, n_kt,
                  HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK, DQ_PARTS, DQ_EARLY)


def _dkdvdq_block(Q, K, V, dOut, Lse2, Delta, Mask, dK, dV, dQ, DqAcc, Count, scale, b,
                  kv_h, bid_n, n_kt, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK,
                  DQ_PARTS, DQ_EARLY):
    seq_q = Q.shape[2]
    seq_k = K.shape[2]
    diag = seq_k - seq_q
    group = Q.shape[1] // K.shape[1]
    c = scale * LOG2E
    k = ct.load(K, index=(b, kv_h, bid_n, 0), shape=(1, 1, TILE_N, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, HEAD_DIM))
    v = ct.load(V, index=(b, kv_h, bid_n, 0), shape=(1, 1, TILE_N, HEAD_DIM_V),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, HEAD_DIM_V))
    dk = ct.full((TILE_N, HEAD_DIM), 0.0, dtype=ct.float32)
    dv = ct.full((TILE_N, HEAD_DIM_V), 0.0, dtype=ct.float32)
    key_pos = (bid_n * TILE_N + ct.arange(TILE_N, dtype=ct.int32))[:, None]     # [TN, 1]

    m_tiles, m_start, m_full = _query_tiles(bid_n, seq_q, diag, TILE_M, TILE_N, CAUSAL)

    mask_b = min(b, Mask.shape[0] - 1)
    for g in range(group):
        h = kv_h * group + g
        mask_h = min(h, Mask.shape[1] - 1)
        if bid_n == 0:       # query tiles no key sees (causal, Sq > Sk): dQ = 0
            for i in range(0, m_start):
                ct.store(dQ, index=(b, h, i, 0),
                         tile=ct.full((1, 1, TILE_M, HEAD_DIM), 0.0, dtype=dQ.dtype))
        for i in range(m_start, m_full):
            dk, dv, ds_t = _dkdv_step(Q, dOut, Lse2, Delta, Mask, k, v, dk, dv, key_pos, c,
                                      b, h, mask_b, mask_h, bid_n, i, diag, HEAD_DIM,
                                      HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK,
                                      WANT_DS=True)
            _dq_add(K, dQ, DqAcc, Count, ds_t, k, scale, b, kv_h, h, i, bid_n, n_kt, diag,
                    HEAD_DIM, TILE_M, TILE_N, CAUSAL, DQ_PARTS, DQ_EARLY)
        for i in range(m_full, m_tiles):
            dk, dv, ds_t = _dkdv_step(Q, dOut, Lse2, Delta, Mask, k, v, dk, dv, key_pos, c,
                                      b, h, mask_b, mask_h, bid_n, i, diag, HEAD_DIM,
                                      HEAD_DIM_V, TILE_M, TILE_N, False, HAS_MASK,
                                      WANT_DS=True)
            _dq_add(K, dQ, DqAcc, Count, ds_t, k, scale, b, kv_h, h, i, bid_n, n_kt, diag,
                    HEAD_DIM, TILE_M, TILE_N, CAUSAL, DQ_PARTS, DQ_EARLY)

    dk = (dk * scale).astype(dK.dtype).reshape((1, 1, TILE_N, HEAD_DIM))
    ct.store(dK, index=(b, kv_h, bid_n, 0), tile=dk)
    ct.store(dV, index=(b, kv_h, bid_n, 0),
             tile=dv.astype(dV.dtype).reshape((1, 1, TILE_N, HEAD_DIM_V)))


def _dq_add(K, dQ, DqAcc, Count, ds_t, k, scale, b, kv_h, h, i, bid_n, n_kt, diag, HEAD_DIM,
            TILE_M, TILE_N, CAUSAL, DQ_PARTS, DQ_EARLY):
    """Add this key tile's part dS K to query tile i's dQ, at its rank in the tile's fixed
    order (see the section's comment). The workspace is read and written without TMA: the
    counter's release/acquire orders the block's ordinary stores and loads. DQ_PARTS > 1:
    dQ's columns in that many parts, one after the other (K's columns loaded again), so
    fewer float32 registers are live at once. DQ_EARLY: the product dS K first (from zero),
    then the wait, then the workspace added to it, so the product can run while the block
    waits; else the product accumulates into the loaded workspace (one fewer add). The two
    round differently; each is deterministic."""
    last_n = n_kt - 1                    # the highest key tile that sees query tile i
    if CAUSAL:                           # block j visits i iff j * TILE_N < (i+1)*TILE_M + diag
        last_n = min(ct.cdiv((i + 1) * TILE_M + diag, TILE_N), n_kt) - 1
    rank = last_n - bid_n
    if rank > 0 and not DQ_EARLY:
        _wait_rank(Count, b, h, i, rank, TILE_M)
    ds = ds_t.permute((1, 0))                                # dS [TM, TN]
    width = HEAD_DIM // DQ_PARTS
    for part in range(DQ_PARTS):
        k_part = k
        if DQ_PARTS > 1:
            k_part = ct.load(K, index=(b, kv_h, bid_n, part), shape=(1, 1, TILE_N, width),
                             padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, width))
        dq = ct.full((TILE_M, width), 0.0, dtype=ct.float32)
        if DQ_EARLY:
            dq = ct.mma(ds, k_part, dq)
            if rank > 0:
                if part == 0:
                    _wait_rank(Count, b, h, i, rank, TILE_M)
                dq = dq + _load_acc(DqAcc, b, h, i, part, TILE_M, width)
        else:
            if rank > 0:
                dq = _load_acc(DqAcc, b, h, i, part, TILE_M, width)
            dq = ct.mma(ds, k_part, dq)                      # dQ += dS K (scaled at the end)
        if bid_n == 0:                   # the last part: dQ itself
            ct.store(dQ, index=(b, h, i, part),
                     tile=(dq * scale).astype(dQ.dtype).reshape((1, 1, TILE_M, width)))
        else:
            ct.store(DqAcc, index=(b, h, i, part), tile=dq.reshape((1, 1, TILE_M, width)),
                     allow_tma=False)
    if bid_n != 0:
        ct.store(Count, index=(b, h, i * TILE_M), tile=rank + 1.0,
                 memory_order=ct.MemoryOrder.RELEASE, memory_scope=ct.MemoryScope.DEVICE)


def _wait_rank(Count, b, h, i, rank, TILE_M):
    """Spin until query tile i's counter reads rank (acquire: the parts before are seen).
    The read is an atomic add of 0, not an acquire ct.load: tileiras 13.4 compiled that
    load, in this warp-specialised kernel, to an async global-to-shared copy (LDGSTS.E, a
    weak load through L1), and the spin never saw the other block's release store: the
    kernel hung on an H200 (1x2x128x64 causal, 2026-11-28). An atomic always reads L2."""
    while ct.atomic_add(Count, (b, h, i * TILE_M), 0.0,
                        memory_order=ct.MemoryOrder.ACQUIRE,
                        memory_scope=ct.MemoryScope.DEVICE) < rank:
        pass


def _load_acc(DqAcc, b, h, i, part, TILE_M, width):
    return ct.load(DqAcc, index=(b, h, i, part), shape=(1, 1, TILE_M, width),
                   padding_mode=ct.PaddingMode.ZERO, allow_tma=False).reshape((TILE_M, width))
