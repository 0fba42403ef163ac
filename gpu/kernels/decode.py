"""Split-KV decode attention over a KV cache (contiguous or paged), with GQA packing.

    O = softmax(Q K^T * scale) V      per sequence b, over its first L_b = Lens[b] keys

Layouts (FlashAttention's flash_attn_with_kvcache / vLLM's):
  Q    [B, Sq, Hq, D]          the new queries (decode: Sq = 1, speculative: a few)
  K, V contiguous: [B, Sk_max, Hkv, D]          (PAGE == 0)
       paged:      [num_pages, PAGE, Hkv, D]    (PAGE > 0), through BT
  BT   int32 [B, max_pages]: page ids of sequence b in order (paged only; else a dummy)
  Lens int32 [B]: keys of sequence b (clamped to [0, capacity] here: the host cannot check
       device values without a sync)
  Out  [B, Sq, Hq, Dv]

One block per (query-head tile x query tile, key split, batch). A head tile is GT query
heads of ONE kv head (GT a power of two dividing Hq/Hkv): with SQ_T query rows each, the
block's ROWS = SQ_T * GT rows share every K/V tile it loads, so K/V is read once per
(kv head, split) instead of once per query head and row (GQA packing). Row r is query
r // GT, head t*GT + r % GT: exactly the [1, SQ_T, GT, D] box of Q, reshaped.

Splits: the block's key tiles are cut into num_blocks(1) equal runs, computed from the
sequence's own length on the device (so a short sequence in a large cache still spreads
over every split, and a CUDA graph captured once serves any lengths). With one split the
block normalises and writes Out; with several it writes its float32 partial state
(running max m in log2 units, sum l, unnormalised acc) and decode_combine_kernel merges
the splits in index order: deterministic, run to run.

Causal (Sq > 1): bottom-right, query i of a sequence of length L sees keys j <= i + L - Sq.
Rows that see no key output zeros.
"""
import cuda.tile as ct

from .common import LOG2E, NEG_INF

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

#: K loads as K^T through the load's axis order: the cache's (page/batch, seq, head, dim)
#: read as (page/batch, dim, head, seq), so a [1, D, 1, TILE_N] box is K^T of one head.
_KT_ORDER = (0, 3, 2, 1)


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------
@ct.kernel
def decode_split_kernel(Q, K, V, Lens, BT, Out, Acc, Mx, Lx,
                        scale: float,           # softmax scale, any finite value
                        HEAD_DIM: ConstInt,     # tile width of D (power of two >= D)
                        HEAD_DIM_V: ConstInt,   # tile width of Dv
                        SQ_T: ConstInt,         # query rows (positions) per block
                        GT: ConstInt,           # query heads per block, one kv head
                        TILE_N: ConstInt,       # keys per step
                        PAGE: ConstInt,         # page size; 0: contiguous cache
                        SPLIT: ConstBool,       # write partials (several splits)
                        CAUSAL: ConstBool):
    t, qt, kv_h = _tile_coords(ct.bid(0), Q, K, GT)
    split = ct.bid(1)
    b = ct.bid(2)
    L = _seq_len(Lens, BT, K, b, PAGE)
    q = ct.load(Q, index=(b, qt, t, 0), shape=(1, SQ_T, GT, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((SQ_T * GT, HEAD_DIM))
    m_i, l_i, acc = _attend(q, K, V, BT, b, kv_h, qt, split, ct.num_blocks(1), L,
                            Q.shape[1], scale, HEAD_DIM, HEAD_DIM_V, SQ_T, GT, TILE_N,
                            PAGE, CAUSAL, Q.dtype)
    if SPLIT:
        # partial state of this split; rows past Sq fall outside the arrays and are dropped.
        # m and l go element by element (scatter): a [SQ_T, GT] box of float32 is too
        # narrow a tile for the bulk-copy path, and these are a few bytes per row
        q_idx, h_idx = _row_index(qt, t, SQ_T, GT)
        ct.scatter(Mx, (b, split, q_idx, h_idx), m_i.reshape((SQ_T * GT,)))
        ct.scatter(Lx, (b, split, q_idx, h_idx), l_i.reshape((SQ_T * GT,)))
        ct.store(Acc, index=(b * ct.num_blocks(1) + split, qt, t, 0),
                 tile=acc.reshape((1, SQ_T, GT, HEAD_DIM_V)))
    else:
        _store_out(Out, acc, l_i, b, qt, t, SQ_T, GT, HEAD_DIM_V)


@ct.kernel
def decode_combine_kernel(Acc, Mx, Lx, Out,
                          HEAD_DIM_V: ConstInt, SQ_T: ConstInt, GT: ConstInt):
    """Merge the splits' partial states of one (head tile, query tile, batch) block.

    Grid (tiles, B, 1), tiles as in decode_split_kernel. The global max comes first (a
    pass over every split's m), then the splits are added in index order, each weighted
    by exp2(m_s - m): the same algebra as the online softmax, in a fixed order."""
    num_heads = Out.shape[2]
    t = ct.bid(0) % (num_heads // GT)
    qt = ct.bid(0) // (num_heads // GT)
    b = ct.bid(1)
    splits = Mx.shape[1]
    ROWS = SQ_T * GT
    q_idx, h_idx = _row_index(qt, t, SQ_T, GT)
    m = ct.full((ROWS,), NEG_INF, dtype=ct.float32)
    for s in range(splits):
        # rows past Sq read as -inf: weight 0, never NaN
        m = ct.maximum(m, ct.gather(Mx, (b, s, q_idx, h_idx), padding_value=NEG_INF))
    m = m.reshape((ROWS, 1))
    # m == -inf: no split saw a key for this row; subtract 0 so the weights are exp2(-inf)
    m_safe = ct.where(m == NEG_INF, 0.0, m)
    l_i = ct.full((ROWS, 1), 0.0, dtype=ct.float32)
    acc = ct.full((ROWS, HEAD_DIM_V), 0.0, dtype=ct.float32)
    for s in range(splits):
        m_s = ct.gather(Mx, (b, s, q_idx, h_idx), padding_value=NEG_INF).reshape((ROWS, 1))
        l_s = ct.gather(Lx, (b, s, q_idx, h_idx), padding_value=0.0).reshape((ROWS, 1))
        a_s = ct.load(Acc, index=(b * splits + s, qt, t, 0), shape=(1, SQ_T, GT, HEAD_DIM_V),
                      padding_mode=ct.PaddingMode.ZERO).reshape((ROWS, HEAD_DIM_V))
        w = ct.exp2(m_s - m_safe, flush_to_zero=True)
        l_i = l_i + w * l_s
        acc = acc + w * a_s
    _store_out(Out, acc, l_i, b, qt, t, SQ_T, GT, HEAD_DIM_V)


# --------------------------------------------------------------------------------------
# Coordinates and lengths
# --------------------------------------------------------------------------------------
def _tile_coords(bid, Q, K, GT):
    """(head tile, query tile, kv head) of the flattened block index.

    Head counts come from the array shapes at run time, so one compiled variant serves
    every head count; the head tile is the fastest index, so the blocks of one kv head and
    split (which read the same K/V) run side by side and share it in L2."""
    num_tiles = Q.shape[2] // GT
    t = bid % num_tiles
    group = Q.shape[2] // K.shape[2]
    return t, bid // num_tiles, (t * GT) // group


def _row_index(qt, t, SQ_T, GT):
    """(query index, head index) of each of the block's SQ_T * GT rows, [ROWS] each."""
    r = ct.arange(SQ_T * GT, dtype=ct.int32)
    return qt * SQ_T + r // GT, t * GT + r % GT


def _seq_len(Lens, BT, K, b, PAGE):
    """Lens[b] clamped to [0, capacity]: a length past the cache would read out of bounds."""
    if PAGE > 0:
        cap = BT.shape[1] * PAGE
    else:
        cap = K.shape[1]
    L = ct.load(Lens, index=(b,), shape=())
    return min(max(L, 0), cap)


# --------------------------------------------------------------------------------------
# One block: the split's key tiles through an online softmax
# --------------------------------------------------------------------------------------
def _attend(q, K, V, BT, b, kv_h, qt, split, num_splits, L, seq_q, scale,
            HEAD_DIM, HEAD_DIM_V, SQ_T, GT, TILE_N, PAGE, CAUSAL, in_dtype):
    """(m, l, acc) of the block's rows over its split's keys; m in log2 units."""
    ROWS = SQ_T * GT
    first_q = qt * SQ_T
    diag = L - seq_q                       # row i sees keys j <= i + diag (causal)
    if CAUSAL:
        last_q = min(first_q + SQ_T, seq_q) - 1
        kv_end = max(min(L, last_q + diag + 1), 0)      # past the last key any row sees
        clean_keys = max(min(L, first_q + diag + 1), 0)  # keys every row of the block sees
    else:
        kv_end = L
        clean_keys = L
    # the split's run of key tiles [j0, j1); tiles before `mid` need no mask
    per_split = ct.cdiv(ct.cdiv(kv_end, TILE_N), num_splits)
    j0 = split * per_split
    j1 = min(j0 + per_split, ct.cdiv(kv_end, TILE_N))
    mid = max(min(clean_keys // TILE_N, j1), j0)

    c = scale * LOG2E                      # scores in log2 units: exp2(s - m) is the weight
    q_pos = (first_q + ct.arange(ROWS, dtype=ct.int32) // GT + diag)[:, None]   # [ROWS, 1]
    key_offs = ct.arange(TILE_N, dtype=ct.int32)[None, :]                      # [1, TN]
    m_i = ct.full((ROWS, 1), NEG_INF, dtype=ct.float32)
    l_i = ct.full((ROWS, 1), 0.0, dtype=ct.float32)
    acc = ct.full((ROWS, HEAD_DIM_V), 0.0, dtype=ct.float32)
    # two loops: interior tiles take no index arithmetic or selects (as in fused.py)
    for j in range(j0, mid):
        k_t, v = _kv_tile(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE)
        s = ct.mma(q, k_t, ct.full((ROWS, TILE_N), 0.0, dtype=ct.float32)) * c
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, in_dtype)
    for j in range(mid, j1):
        k_t, v = _kv_tile(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE)
        s = ct.mma(q, k_t, ct.full((ROWS, TILE_N), 0.0, dtype=ct.float32)) * c
        key_pos = j * TILE_N + key_offs
        keep = key_pos < L                 # the ragged end of the sequence
        if CAUSAL:
            keep = keep & (key_pos <= q_pos)
        s = ct.where(keep, s, NEG_INF)
        # V rows past L are zeroed: a cache slot never written may hold NaN/inf, and
        # p == 0 times NaN would still be NaN in the product
        v = ct.where((j * TILE_N + key_offs.reshape((TILE_N, 1))) < L, v, 0.0)
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, in_dtype)
    return m_i, l_i, acc


def _softmax_step(s, v, m_i, l_i, acc, in_dtype):
    """Fold one key tile's scores s [ROWS, TN] (log2 units) and values v into the state."""
    m_new = ct.maximum(m_i, ct.max(s, axis=-1, keepdims=True))
    # a row with every key masked so far has m_new == -inf: exp2(-inf - -inf) would be
    # NaN, so subtract 0 instead (its scores are -inf: p == 0)
    m_safe = ct.where(m_new == NEG_INF, 0.0, m_new)
    p = ct.exp2(s - m_safe, flush_to_zero=True)
    alpha = ct.exp2(m_i - m_safe, flush_to_zero=True)
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    # P rounded to the input dtype for the tensor cores; keys past L have p == 0 and
    # zeroed V rows, so they add exactly 0
    acc = ct.mma(p.astype(in_dtype), v, acc * alpha)
    return m_new, l_i, acc


def _store_out(Out, acc, l_i, b, qt, t, SQ_T, GT, HEAD_DIM_V):
    """acc / l in Out's dtype; rows that saw no key (l == 0) give 0. Rows past Sq and
    columns past Dv fall outside Out and are dropped by the bounds-checked store."""
    has_keys = l_i != 0.0                  # != keeps a NaN sum NaN, as in the fused kernel
    out = ct.truediv(acc, ct.where(has_keys, l_i, 1.0), flush_to_zero=True,
                     rounding_mode=ct.RoundingMode.APPROX)
    out = ct.where(has_keys, out, 0.0).astype(Out.dtype)
    ct.store(Out, index=(b, qt, t, 0), tile=out.reshape((1, SQ_T, GT, HEAD_DIM_V)))


# --------------------------------------------------------------------------------------
# K/V tiles: contiguous or through the page table
# --------------------------------------------------------------------------------------
def _kv_tile(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE):
    """(K^T [D, TN], V [TN, Dv]) of key tile j of sequence b, kv head kv_h."""
    if PAGE == 0:
        k_t = ct.load(K, index=(b, 0, kv_h, j), shape=(1, HEAD_DIM, 1, TILE_N),
                      order=_KT_ORDER, padding_mode=ct.PaddingMode.ZERO)
        v = ct.load(V, index=(b, j, kv_h, 0), shape=(1, TILE_N, 1, HEAD_DIM_V),
                    padding_mode=ct.PaddingMode.ZERO)
        return k_t.reshape((HEAD_DIM, TILE_N)), v.reshape((TILE_N, HEAD_DIM_V))
    if TILE_N <= PAGE:
        # the tile lies inside one page: one table lookup serves K and V
        per_page = PAGE // TILE_N
        page = ct.load(BT, index=(b, j // per_page), shape=())
        sub = j % per_page
        k_t = ct.load(K, index=(page, 0, kv_h, sub), shape=(1, HEAD_DIM, 1, TILE_N),
                      order=_KT_ORDER, padding_mode=ct.PaddingMode.ZERO)
        v = ct.load(V, index=(page, sub, kv_h, 0), shape=(1, TILE_N, 1, HEAD_DIM_V),
                    padding_mode=ct.PaddingMode.ZERO)
        return k_t.reshape((HEAD_DIM, TILE_N)), v.reshape((TILE_N, HEAD_DIM_V))
    # several pages per tile: one box per page, concatenated (ct.cat takes pairs); pages
    # past the sequence's last one re-read that page (their keys are masked), so no table
    # entry past the sequence is ever read
    n = TILE_N // PAGE
    first = j * n
    last = ct.cdiv(L, PAGE) - 1
    k_t = _pages(K, BT, b, kv_h, first, last, n, HEAD_DIM, PAGE, True)
    v = _pages(V, BT, b, kv_h, first, last, n, HEAD_DIM_V, PAGE, False)
    return k_t, v


def _pages(X, BT, b, kv_h, first, last, N, DIM, PAGE, IS_K):
    """Pages first .. first+N-1 (N in {2, 4, 8}) of one head, side by side: K^T
    [D, N*PAGE] (IS_K) or V [N*PAGE, Dv]."""
    axis = 1 if IS_K else 0
    x = _page_pair(X, BT, b, kv_h, first, last, DIM, PAGE, IS_K)
    if N >= 4:
        x = ct.cat((x, _page_pair(X, BT, b, kv_h, first + 2, last, DIM, PAGE, IS_K)), axis)
    if N == 8:
        y = ct.cat((_page_pair(X, BT, b, kv_h, first + 4, last, DIM, PAGE, IS_K),
                    _page_pair(X, BT, b, kv_h, first + 6, last, DIM, PAGE, IS_K)), axis)
        x = ct.cat((x, y), axis)
    return x


def _page_pair(X, BT, b, kv_h, p, last, DIM, PAGE, IS_K):
    return ct.cat((_page(X, BT, b, kv_h, p, last, DIM, PAGE, IS_K),
                   _page(X, BT, b, kv_h, p + 1, last, DIM, PAGE, IS_K)), 1 if IS_K else 0)


def _page(X, BT, b, kv_h, p, last, DIM, PAGE, IS_K):
    """One page of one head: K^T [D, PAGE] or V [PAGE, Dv]; page p clamped to `last`."""
    page = ct.load(BT, index=(b, min(p, last)), shape=())
    if IS_K:
        k_t = ct.load(X, index=(page, 0, kv_h, 0), shape=(1, DIM, 1, PAGE), order=_KT_ORDER,
                      padding_mode=ct.PaddingMode.ZERO)
        return k_t.reshape((DIM, PAGE))
    v = ct.load(X, index=(page, 0, kv_h, 0), shape=(1, PAGE, 1, DIM),
                padding_mode=ct.PaddingMode.ZERO)
    return v.reshape((PAGE, DIM))
