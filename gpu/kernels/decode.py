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
heads of ONE kv head (GT a power of two): with SQ_T query rows each, the block's
ROWS = SQ_T * GT rows share every K/V tile it loads, so K/V is read once per
(kv head, split) instead of once per query head and row (GQA packing). Row r is query
r // GT, head h0 + r % GT. Where GT divides the group (Hq/Hkv), h0 = t*GT and the rows
are exactly the [1, SQ_T, GT, D] box of Q, reshaped. Else (PAD: a group of 5, 7, 12, 71
heads) the group is covered by cdiv(group, GT) tiles whose last one is padded, so a kv
head's K/V is read cdiv(group, GT) times a split, not once per power-of-two piece. Q is
one box at head h0 through the launch's descriptor with element steps along the heads
(the padding rows read the next group's queries, harmless: their results are never
stored); Out / Acc are stored through a view that ends at the tile's last head
(Array.slice), so the padding rows fall outside it; m and l are scattered with a mask.
sm_90 (tileiras 13.4, group 7, D 128): these keep the split kernel at 256 threads x 255
registers and 8 bytes of stack (rows form) as for a power-of-two group, where scattering
the [ROWS, Dv] results took 384 threads x 168 registers and 272 bytes of stack (704 in
the keys form at Sq 3).

Splits: the block's key tiles are cut into num_blocks(1) equal runs, computed from the
sequence's own length on the device (so a short sequence in a large cache still spreads
over every split, and a CUDA graph captured once serves any lengths). With one split the
block normalises and writes Out; with several it writes its float32 partial state
(running max m in log2 units, sum l, unnormalised acc) to workspaces laid out with the
splits of a row adjacent (Acc [B, Sq, Hq, splits * Dv_tile], Mx/Lx [B, Sq, Hq, splits]),
and decode_combine_kernel merges them: one block per output row and column chunk, all
splits of the row in one load, a halving tree over the splits (deterministic, run to run).

Paged caches: with AHEAD each key step looks up the NEXT tile's page ids (_page_ids) and
carries them, so a step's K/V loads never wait on a block-table load (H100, 256-key pages:
0.94 -> 0.99 of contiguous, results/decode-paged-h100-2026-11-27).
Paged tiles of several pages (PAGE < TILE_N): one gathered load per tile
(ct.load_advanced_indexing with the tile's page ids as the sparse dimension; PAGE_MODE 1,
the default: 0.93-1.13 of contiguous with 16-key pages on an H100, where one box per page
concatenated, PAGE_MODE 0, reaches 0.29-0.76).

Causal (Sq > 1): bottom-right, query i of a sequence of length L sees keys j <= i + L - Sq.
Rows that see no key output zeros.

Packed variable-length prefill (spak.fmha_varlen) is not here: it runs the padded forward's
block at each sequence's row offsets (gpu/kernels/fused.py, fmha_varlen_kernel).
"""
import cuda.tile as ct

from .common import LOG2E, NEG_INF

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

#: K loads as K^T through the load's axis order: the cache's (page/batch, seq, head, dim)
#: read as (page/batch, dim, head, seq), so a [1, D, 1, TILE_N] box is K^T of one head.
_KT_ORDER = (0, 3, 2, 1)
#: The keys-in-M form keeps its row sums as a [TILE_N, ROWS] float32 tile up to this
#: many elements (32 registers a thread at 256 threads), else sums them every step. The
#: per-step column sum costs more than the tile where both fit (sm_90 compiles, MQA Sq 4,
#: 128 rows, TILE_N 64: 1240 B/thread of spill with per-step sums, 200 with the tile).
L_TILE_FLOATS = 8192


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
                        PAGE_MODE: ConstInt,    # several pages a tile: 0 boxes, 1 gathered
                        SPLIT: ConstBool,       # write partials (several splits)
                        CAUSAL: ConstBool,
                        PAD: ConstBool,         # GT does not divide the group: masked rows
                        KT_FORM: ConstInt = 0,  # 0 rows in M; 1, 2 keys in M (KT_FORMS)
                        LAT: ConstInt = 0,      # DRAM latency hint of K/V loads; 0 none
                        AHEAD: ConstBool = False):  # paged: page ids one tile ahead
    _decode_block(Q, K, V, Lens, BT, Out, Acc, Mx, Lx, scale, HEAD_DIM, HEAD_DIM_V, SQ_T,
                  GT, TILE_N, PAGE, PAGE_MODE, SPLIT, CAUSAL, PAD, KT_FORM, LAT, AHEAD)


@ct.kernel
def decode_one_kernel(Q, K, V, Lens, BT, Out,
                      scale: float,
                      HEAD_DIM: ConstInt,
                      HEAD_DIM_V: ConstInt,
                      SQ_T: ConstInt,
                      GT: ConstInt,
                      TILE_N: ConstInt,
                      PAGE: ConstInt,
                      PAGE_MODE: ConstInt,
                      CAUSAL: ConstBool,
                      PAD: ConstBool,
                      KT_FORM: ConstInt = 0,
                      LAT: ConstInt = 0,
                      AHEAD: ConstBool = False):
    """decode_split_kernel with one split (SPLIT False: acc / l into Out), without the
    never-read workspace arguments: each array argument of a launch costs ~1.3 us of host
    time (DLPack), and a short cache's decode call is host-bound (issue 34). The same
    block, the same bits. Out stands in for the workspaces the dead SPLIT branch names."""
    _decode_block(Q, K, V, Lens, BT, Out, Out, Out, Out, scale, HEAD_DIM, HEAD_DIM_V, SQ_T,
                  GT, TILE_N, PAGE, PAGE_MODE, False, CAUSAL, PAD, KT_FORM, LAT, AHEAD)


def _decode_block(Q, K, V, Lens, BT, Out, Acc, Mx, Lx, scale, HEAD_DIM, HEAD_DIM_V, SQ_T, GT,
                  TILE_N, PAGE, PAGE_MODE, SPLIT, CAUSAL, PAD, KT_FORM, LAT, AHEAD):
    """One block of the split kernel (see decode_split_kernel's parameters)."""
    t, qt, kv_h, h0, nh = _tile_coords(ct.bid(0), Q.shape[2], K.shape[2], GT, PAD)
    split = ct.bid(1)
    b = ct.bid(2)
    L = _seq_len(Lens, BT, K, b, PAGE)
    q = _load_q(Q, b, qt, t, h0, SQ_T, GT, HEAD_DIM, PAD)
    if KT_FORM == 0:
        m_i, l_i, acc = _attend(q, K, V, BT, b, kv_h, qt, split, ct.num_blocks(1), L,
                                Q.shape[1], scale, HEAD_DIM, HEAD_DIM_V, SQ_T, GT, TILE_N,
                                PAGE, PAGE_MODE, CAUSAL, Q.dtype, LAT, AHEAD)
        _finish(Out, Acc, Mx, Lx, m_i, l_i, acc, b, qt, t, h0, nh, split, SQ_T, GT,
                HEAD_DIM_V, SPLIT, PAD)
    else:
        m_i, l_i, acc = _attend_keys(ct.transpose(q), K, V, BT, b, kv_h, qt, split,
                                     ct.num_blocks(1), L, Q.shape[1], scale, HEAD_DIM,
                                     HEAD_DIM_V, SQ_T, GT, TILE_N, PAGE, PAGE_MODE, CAUSAL,
                                     Q.dtype, KT_FORM == 2, LAT, AHEAD)
        ROWS = SQ_T * GT
        _finish(Out, Acc, Mx, Lx, m_i.reshape((ROWS, 1)), l_i.reshape((ROWS, 1)), acc,
                b, qt, t, h0, nh, split, SQ_T, GT, HEAD_DIM_V, SPLIT, PAD)


def _load_q(Q, b, qt, t, h0, SQ_T, GT, HEAD_DIM, PAD):
    """The block's query rows [SQ_T * GT, D tile]: one box of Q (PAD: at head h0)."""
    if not PAD:
        return ct.load(Q, index=(b, qt, t, 0), shape=(1, SQ_T, GT, HEAD_DIM),
                       padding_mode=ct.PaddingMode.ZERO).reshape((SQ_T * GT, HEAD_DIM))
    # a box at head h0 through the launch's descriptor (element steps along the heads):
    # rows past the group read the next kv head's queries (or zeros past the array);
    # their results are never stored
    view = Q.tiled_view((1, SQ_T, GT, HEAD_DIM), traversal_steps=(1, SQ_T, 1, HEAD_DIM),
                        padding_mode=ct.PaddingMode.ZERO)
    return view.load((b, qt, h0, 0)).reshape((SQ_T * GT, HEAD_DIM))


def _finish(Out, Acc, Mx, Lx, m_i, l_i, acc, b, qt, t, h0, nh, split, SQ_T, GT, HEAD_DIM_V,
            SPLIT, PAD):
    """The block's result: the partial state (m, l [ROWS, 1], acc [ROWS, Dv]) of its
    split into the workspaces, or, with one split, acc / l into Out. PAD: rows past the
    tile's nh heads belong to no head of this kv head and are never stored."""
    ROWS = SQ_T * GT
    if SPLIT:
        # partial state of this split; rows past Sq fall outside the arrays and are dropped.
        # m and l go element by element (scatter): a [SQ_T, GT] box of float32 is too
        # narrow a tile for the bulk-copy path, and these are a few bytes per row
        q_idx, h_idx, keep = _row_index(qt, h0, nh, SQ_T, GT, PAD)
        ct.scatter(Mx, (b, q_idx, h_idx, split), m_i.reshape((ROWS,)), mask=keep)
        ct.scatter(Lx, (b, q_idx, h_idx, split), l_i.reshape((ROWS,)), mask=keep)
        if PAD:
            # a view that ends at the tile's last head: the padding rows fall outside it
            ct.store(Acc.slice(2, h0, h0 + nh), index=(b, qt, 0, split),
                     tile=acc.reshape((1, SQ_T, GT, HEAD_DIM_V)))
        else:
            ct.store(Acc, index=(b, qt, t, split),
                     tile=acc.reshape((1, SQ_T, GT, HEAD_DIM_V)))
    else:
        _store_out(Out, acc, l_i, b, qt, t, h0, nh, SQ_T, GT, HEAD_DIM_V, PAD)


# occupancy 4 (TileGym's reduce's hint; a scheduling hint, the same arithmetic and bits):
# H100, results/decode-h100-2026-11-24e run 2, the whole call 0.99-1.09x of the hintless
# combine (64x32:1x1:8192 2408 -> 2626 GB/s, 8x32:1x1:8192 1632 -> 1707); sm_90 only
# (measured there)
@ct.kernel(occupancy=ct.ByTarget(sm_90=4))
def decode_combine_kernel(Acc, Mx, Lx, Out,
                          SPLITS_T: ConstInt,     # power of two >= the split count
                          DV_T: ConstInt):        # output columns per block
    """Merge the splits' partial states of one output row (b, i, h), DV_T columns of it.

    Acc is the split kernel's workspace [B, Sq, Hq, splits * Dv_tile] seen as
    [B * Sq, Hq, splits, Dv_tile] (the host passes that view; tiles index boxes, so the
    split kernel needs the first to store a split's [SQ_T, GT] rows, this one the second
    to read a row's splits). Grid (Hq * cdiv(Dv, DV_T), Sq, B): one block per row and
    column chunk, so the merge
    runs on as many SMs as there are rows (a decode batch of one has only Hq of them).
    Every split's partial state of the row is ONE load (the splits are adjacent in the
    workspace); the global max comes first, then the weighted states are added in a
    halving tree over the split axis: a fixed order (deterministic, run to run), log2
    depth instead of one dependent load per split."""
    n_dv = ct.cdiv(Out.shape[3], DV_T)
    h = ct.bid(0) // n_dv
    dc = ct.bid(0) % n_dv
    q = ct.bid(1)
    b = ct.bid(2)
    s_idx = ct.arange(SPLITS_T, dtype=ct.int32)
    # splits past the count read as m = -inf, l = 0, acc = 0: weight 0, adding exactly 0
    m_s = ct.gather(Mx, (b, q, h, s_idx), padding_value=NEG_INF).reshape((SPLITS_T, 1))
    l_s = ct.gather(Lx, (b, q, h, s_idx), padding_value=0.0).reshape((SPLITS_T, 1))
    a_s = ct.load(Acc, index=(b * Out.shape[1] + q, h, 0, dc), shape=(1, 1, SPLITS_T, DV_T),
                  padding_mode=ct.PaddingMode.ZERO).reshape((SPLITS_T, DV_T))
    m = ct.max(m_s, axis=0, keepdims=True)
    # m == -inf: no split saw a key for this row; subtract 0 so the weights are exp2(-inf)
    w = ct.exp2(m_s - ct.where(m == NEG_INF, 0.0, m), flush_to_zero=True)
    l_i, acc = _merge_tree(l_s, a_s, w, SPLITS_T, DV_T)
    out = _normalise(acc, l_i).astype(Out.dtype)
    ct.store(Out, index=(b, q, h, dc), tile=out.reshape((1, 1, 1, DV_T)))


def _merge_tree(l_s, a_s, w, SPLITS_T, DV_T):
    """(sum_s w_s l_s, sum_s w_s acc_s) of [SPLITS_T, 1] / [SPLITS_T, DV_T] tiles: first
    half + second half, halving to one row. The first level weights both halves,
    (l0 * w0) + (l1 * w1): the compiler fuses the left product into the add (one FFMA),
    as the simulator's sm_90 model does; later levels are plain adds."""
    half = SPLITS_T // 2
    w0 = ct.extract(w, (0, 0), (half, 1))
    w1 = ct.extract(w, (1, 0), (half, 1))
    l_i = ct.extract(l_s, (0, 0), (half, 1)) * w0 + ct.extract(l_s, (1, 0), (half, 1)) * w1
    acc = (ct.extract(a_s, (0, 0), (half, DV_T)) * w0
           + ct.extract(a_s, (1, 0), (half, DV_T)) * w1)
    for n in ct.static_iter([SPLITS_T >> k for k in range(2, SPLITS_T.bit_length())]):
        l_i = ct.extract(l_i, (0, 0), (n, 1)) + ct.extract(l_i, (1, 0), (n, 1))
        acc = ct.extract(acc, (0, 0), (n, DV_T)) + ct.extract(acc, (1, 0), (n, DV_T))
    return l_i, acc


# --------------------------------------------------------------------------------------
# Coordinates and lengths
# --------------------------------------------------------------------------------------
def _tile_coords(bid, num_heads, num_kv_heads, GT, PAD):
    """(head tile, query tile, kv head, the tile's first query head h0, its heads nh) of
    the flattened block index.

    Head counts come from the array shapes at run time, so one compiled variant serves
    every head count; the head tile is the fastest index, so the blocks of one kv head and
    split (which read the same K/V) run side by side and share it in L2. PAD: each kv
    head's group takes cdiv(group, GT) tiles, the last one holding the group's remainder
    (nh < GT); else GT divides the group and every tile is whole."""
    group = num_heads // num_kv_heads
    if PAD:
        per_kv = ct.cdiv(group, GT)
        num_tiles = num_kv_heads * per_kv
        t = bid % num_tiles
        kv_h = t // per_kv
        first = (t % per_kv) * GT                # the tile's first head within the group
        return t, bid // num_tiles, kv_h, kv_h * group + first, min(group - first, GT)
    num_tiles = num_heads // GT
    t = bid % num_tiles
    return t, bid // num_tiles, (t * GT) // group, t * GT, GT


def _row_index(qt, h0, nh, SQ_T, GT, PAD):
    """(query index, head index, keep) of each of the block's SQ_T * GT rows, [ROWS] each:
    keep (PAD only, else None) is False on the padding rows past the tile's nh heads."""
    r = ct.arange(SQ_T * GT, dtype=ct.int32)
    keep = None
    if PAD:
        keep = (r % GT) < nh
    return qt * SQ_T + r // GT, h0 + r % GT, keep


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
            HEAD_DIM, HEAD_DIM_V, SQ_T, GT, TILE_N, PAGE, PAGE_MODE, CAUSAL, in_dtype, LAT,
            AHEAD):
    """(m, l, acc) of the block's rows over its split's keys; m in log2 units. LAT: the
    K/V loads' DRAM latency hint (1..10; 0 the compiler's choice). AHEAD (paged caches):
    each step looks up the NEXT tile's page ids (_page_ids), so a tile's K/V addresses
    are known when its step starts instead of waiting on a block-table load."""
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
    ahead = AHEAD and PAGE > 0
    pg = 0                                 # the current tile's page ids (ahead only)
    if ahead:
        pg = _page_ids(BT, b, j0, L, TILE_N, PAGE)
    for j in range(j0, mid):
        if ahead:
            pg_next = _page_ids(BT, b, j + 1, L, TILE_N, PAGE)
        k_t, v = _kv_tile(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE,
                          PAGE_MODE, LAT, pg, ahead)
        s = ct.mma(q, k_t, ct.full((ROWS, TILE_N), 0.0, dtype=ct.float32)) * c
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, in_dtype)
        if ahead:
            pg = pg_next
    for j in range(mid, j1):               # pg: tile mid's ids, from the loop above or j0's
        if ahead:
            pg_next = _page_ids(BT, b, j + 1, L, TILE_N, PAGE)
        k_t, v = _kv_tile(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE,
                          PAGE_MODE, LAT, pg, ahead)
        if ahead:
            pg = pg_next
        s = ct.mma(q, k_t, ct.full((ROWS, TILE_N), 0.0, dtype=ct.float32)) * c
        s, v = _mask_tail(s, v, j * TILE_N, key_offs, L, q_pos, CAUSAL, TILE_N)
        m_i, l_i, acc = _softmax_step(s, v, m_i, l_i, acc, in_dtype)
    return m_i, l_i, acc


def _mask_tail(s, v, first_key, key_offs, L, q_pos, CAUSAL, N):
    """Scores of keys past L (and, causal, past a row's diagonal) to -inf; V rows past L
    to 0: a cache slot never written may hold NaN/inf, and p == 0 times NaN would still
    be NaN in the product."""
    key_pos = first_key + key_offs
    keep = key_pos < L                     # the ragged end of the sequence
    if CAUSAL:
        keep = keep & (key_pos <= q_pos)
    s = ct.where(keep, s, NEG_INF)
    v = ct.where((first_key + key_offs.reshape((N, 1))) < L, v, 0.0)
    return s, v


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


# --------------------------------------------------------------------------------------
# The keys-in-M form (KT_FORM 1, 2): S^T = K Q^T
# --------------------------------------------------------------------------------------
def _attend_keys(q_t, K, V, BT, b, kv_h, qt, split, num_splits, L, seq_q, scale,
                 HEAD_DIM, HEAD_DIM_V, SQ_T, GT, TILE_N, PAGE, PAGE_MODE, CAUSAL, in_dtype,
                 VT, LAT, AHEAD):
    """(m [1, ROWS], l [1, ROWS], acc [ROWS, Dv]) like _attend, with the keys in the
    tensor cores' M dimension: S^T [TN, ROWS] = K [TN, D] @ Q^T [D, ROWS]. K is used as
    loaded (no [TN, D] -> [D, TN] transpose, which a gathered page tile must do in
    registers), and the packed rows (as few as 16) are the small N side, so an MQA block
    of 32 heads holds a [TN, 32] score tile instead of padding rows in M. The softmax runs
    down the columns (axis 0). VT: O^T [Dv, ROWS] += V^T P^T (V read transposed, as K^T
    is in the rows form); else O [ROWS, Dv] += P V with P^T transposed (a [TN, ROWS]
    half-precision tile, smaller than V's). The row sums: where a [TN, ROWS] float32
    tile is small (L_TILE_FLOATS), a tile added into element by element and summed once
    at the end (no cross-warp sum per step); else summed down the columns every step
    (a 128-row block's [128, 128] tile would cost 64 registers a thread)."""
    ROWS = SQ_T * GT
    L_TILE = TILE_N * ROWS <= L_TILE_FLOATS
    first_q = qt * SQ_T
    diag = L - seq_q
    if CAUSAL:
        last_q = min(first_q + SQ_T, seq_q) - 1
        kv_end = max(min(L, last_q + diag + 1), 0)
        clean_keys = max(min(L, first_q + diag + 1), 0)
    else:
        kv_end = L
        clean_keys = L
    per_split = ct.cdiv(ct.cdiv(kv_end, TILE_N), num_splits)
    j0 = split * per_split
    j1 = min(j0 + per_split, ct.cdiv(kv_end, TILE_N))
    mid = max(min(clean_keys // TILE_N, j1), j0)

    c = scale * LOG2E
    q_pos = (first_q + ct.arange(ROWS, dtype=ct.int32) // GT + diag)[None, :]   # [1, ROWS]
    key_offs = ct.arange(TILE_N, dtype=ct.int32)[:, None]                      # [TN, 1]
    m_i = ct.full((1, ROWS), NEG_INF, dtype=ct.float32)
    if L_TILE:
        l_t = ct.full((TILE_N, ROWS), 0.0, dtype=ct.float32)
    else:
        l_t = ct.full((1, ROWS), 0.0, dtype=ct.float32)
    if VT:
        acc = ct.full((HEAD_DIM_V, ROWS), 0.0, dtype=ct.float32)
    else:
        acc = ct.full((ROWS, HEAD_DIM_V), 0.0, dtype=ct.float32)
    ahead = AHEAD and PAGE > 0             # as in _attend
    pg = 0
    if ahead:
        pg = _page_ids(BT, b, j0, L, TILE_N, PAGE)
    for j in range(j0, mid):
        if ahead:
            pg_next = _page_ids(BT, b, j + 1, L, TILE_N, PAGE)
        k, v = _kv_tile_keys(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE,
                             PAGE_MODE, VT, LAT, pg, ahead)
        s = ct.mma(k, q_t, ct.full((TILE_N, ROWS), 0.0, dtype=ct.float32)) * c
        m_i, l_t, acc = _softmax_step_keys(s, v, m_i, l_t, acc, in_dtype, ROWS, VT, L_TILE)
        if ahead:
            pg = pg_next
    for j in range(mid, j1):
        if ahead:
            pg_next = _page_ids(BT, b, j + 1, L, TILE_N, PAGE)
        k, v = _kv_tile_keys(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE,
                             PAGE_MODE, VT, LAT, pg, ahead)
        if ahead:
            pg = pg_next
        s = ct.mma(k, q_t, ct.full((TILE_N, ROWS), 0.0, dtype=ct.float32)) * c
        s, v = _mask_tail_keys(s, v, j * TILE_N, key_offs, L, q_pos, CAUSAL, TILE_N, VT)
        m_i, l_t, acc = _softmax_step_keys(s, v, m_i, l_t, acc, in_dtype, ROWS, VT, L_TILE)
    if L_TILE:
        l_t = ct.sum(l_t, axis=0, keepdims=True)
    if VT:
        acc = ct.transpose(acc)
    return m_i, l_t, acc


def _kv_tile_keys(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE, PAGE_MODE,
                  VT, LAT, pg, AHEAD):
    """(K [TN, D] as stored, V [TN, Dv] or V^T [Dv, TN] (VT)) of key tile j for the
    keys-in-M form; pg: the tile's page ids where AHEAD (_page_ids)."""
    k = _tile(K, BT, b, kv_h, j, L, HEAD_DIM, TILE_N, PAGE, PAGE_MODE, False, LAT, pg, AHEAD)
    v = _tile(V, BT, b, kv_h, j, L, HEAD_DIM_V, TILE_N, PAGE, PAGE_MODE, VT, LAT, pg, AHEAD)
    return k, v


def _mask_tail_keys(s, v, first_key, key_offs, L, q_pos, CAUSAL, N, VT):
    """_mask_tail for S^T [TN, ROWS]: keys down the rows; V (or V^T) rows (columns) of
    keys past L to 0."""
    key_pos = first_key + key_offs        # [TN, 1]
    keep = key_pos < L
    if CAUSAL:
        keep = keep & (key_pos <= q_pos)
    s = ct.where(keep, s, NEG_INF)
    if VT:
        v = ct.where((first_key + key_offs.reshape((1, N))) < L, v, 0.0)
    else:
        v = ct.where(key_pos < L, v, 0.0)
    return s, v


def _softmax_step_keys(s, v, m_i, l_t, acc, in_dtype, ROWS, VT, L_TILE):
    """_softmax_step for S^T [TN, ROWS]: max down the columns; l_t [TN, ROWS] gathers
    the weights element by element (L_TILE: summed once after the loop), or l [1, ROWS]
    takes their column sums."""
    m_new = ct.maximum(m_i, ct.max(s, axis=0, keepdims=True))
    m_safe = ct.where(m_new == NEG_INF, 0.0, m_new)
    p = ct.exp2(s - m_safe, flush_to_zero=True)
    alpha = ct.exp2(m_i - m_safe, flush_to_zero=True)            # [1, ROWS]
    if L_TILE:
        l_t = l_t * alpha + p
    else:
        l_t = l_t * alpha + ct.sum(p, axis=0, keepdims=True)
    if VT:
        acc = ct.mma(v, p.astype(in_dtype), acc * alpha)
    else:
        acc = ct.mma(ct.transpose(p.astype(in_dtype)), v, acc * alpha.reshape((ROWS, 1)))
    return m_new, l_t, acc


def _normalise(acc, l_i):
    """acc / l in float32; rows that saw no key (l == 0) give 0."""
    has_keys = l_i != 0.0                  # != keeps a NaN sum NaN, as in the fused kernel
    out = ct.truediv(acc, ct.where(has_keys, l_i, 1.0), flush_to_zero=True,
                     rounding_mode=ct.RoundingMode.APPROX)
    return ct.where(has_keys, out, 0.0)


def _store_out(Out, acc, l_i, b, qt, t, h0, nh, SQ_T, GT, HEAD_DIM_V, PAD):
    """acc / l in Out's dtype. Rows past Sq and columns past Dv fall outside Out and are
    dropped by the bounds-checked store; PAD: rows past the tile's heads are masked."""
    out = _normalise(acc, l_i).astype(Out.dtype)
    if PAD:
        # a view that ends at the tile's last head: the padding rows fall outside it
        ct.store(Out.slice(2, h0, h0 + nh), index=(b, qt, 0, 0),
                 tile=out.reshape((1, SQ_T, GT, HEAD_DIM_V)))
    else:
        ct.store(Out, index=(b, qt, t, 0), tile=out.reshape((1, SQ_T, GT, HEAD_DIM_V)))


# --------------------------------------------------------------------------------------
# K/V tiles: contiguous or through the page table
# --------------------------------------------------------------------------------------
def _page_ids(BT, b, j, L, TILE_N, PAGE):
    """The page ids key tile j of sequence b reads: one (a 0-d tile) where a tile lies in
    one page (TILE_N <= PAGE), else its TILE_N // PAGE pages [n]. Pages past the sequence's
    last clamp to it and a sequence without keys reads padding (gather is bounds-checked),
    so a look-up one tile past a split's end (the step-ahead of AHEAD) stays in bounds."""
    last = ct.cdiv(L, PAGE) - 1
    if TILE_N <= PAGE:
        return ct.gather(BT, (b, min(j // (PAGE // TILE_N), last)))
    n = TILE_N // PAGE
    return ct.gather(BT, (b, ct.minimum(j * n + ct.arange(n, dtype=ct.int32), last)))


def _kv_tile(K, V, BT, b, kv_h, j, L, HEAD_DIM, HEAD_DIM_V, TILE_N, PAGE, PAGE_MODE, LAT,
             pg, AHEAD):
    """(K^T [D, TN], V [TN, Dv]) of key tile j of sequence b, kv head kv_h, of 4D caches.
    AHEAD: pg holds the tile's page ids (_page_ids, looked up a step earlier); else they
    are looked up here."""
    lat = LAT if LAT > 0 else None             # the loads' latency hint; None: the compiler's
    if PAGE == 0:
        k_t = ct.load(K, index=(b, 0, kv_h, j), shape=(1, HEAD_DIM, 1, TILE_N),
                      order=_KT_ORDER, padding_mode=ct.PaddingMode.ZERO,
                      latency=lat)
        v = ct.load(V, index=(b, j, kv_h, 0), shape=(1, TILE_N, 1, HEAD_DIM_V),
                    padding_mode=ct.PaddingMode.ZERO,
                    latency=lat)
        return k_t.reshape((HEAD_DIM, TILE_N)), v.reshape((TILE_N, HEAD_DIM_V))
    if TILE_N <= PAGE:
        # the tile lies inside one page: one table lookup serves K and V
        per_page = PAGE // TILE_N
        if AHEAD:
            page = pg
        else:
            page = ct.load(BT, index=(b, j // per_page), shape=())
        sub = j % per_page
        k_t = ct.load(K, index=(page, 0, kv_h, sub), shape=(1, HEAD_DIM, 1, TILE_N),
                      order=_KT_ORDER, padding_mode=ct.PaddingMode.ZERO,
                      latency=lat)
        v = ct.load(V, index=(page, sub, kv_h, 0), shape=(1, TILE_N, 1, HEAD_DIM_V),
                    padding_mode=ct.PaddingMode.ZERO,
                    latency=lat)
        return k_t.reshape((HEAD_DIM, TILE_N)), v.reshape((TILE_N, HEAD_DIM_V))
    # several pages per tile; pages past the sequence's last one re-read that page (their
    # keys are masked), so no table entry past the sequence is ever read
    n = TILE_N // PAGE
    first = j * n
    last = ct.cdiv(L, PAGE) - 1
    if PAGE_MODE == 1:
        # one load per tile: the tile's page ids are the sparse dimension of the cache,
        # [n, PAGE, 1, D] in one go instead of n small boxes concatenated
        if AHEAD:
            pages = pg
        else:
            pages = _page_ids(BT, b, j, L, TILE_N, PAGE)
        k = ct.load_advanced_indexing(K, (pages, ct.Slice(0, PAGE), ct.Slice(kv_h, 1),
                                          ct.Slice(0, HEAD_DIM)),
                                      padding_mode=ct.PaddingMode.ZERO,
                                      latency=lat)
        v = ct.load_advanced_indexing(V, (pages, ct.Slice(0, PAGE), ct.Slice(kv_h, 1),
                                          ct.Slice(0, HEAD_DIM_V)),
                                      padding_mode=ct.PaddingMode.ZERO,
                                      latency=lat)
        return (ct.transpose(k.reshape((TILE_N, HEAD_DIM))),
                v.reshape((TILE_N, HEAD_DIM_V)))
    # else one box per page, concatenated (ct.cat takes pairs)
    k_t = _pages(K, BT, b, kv_h, first, last, n, HEAD_DIM, PAGE, True, pg, AHEAD)
    v = _pages(V, BT, b, kv_h, first, last, n, HEAD_DIM_V, PAGE, False, pg, AHEAD)
    return k_t, v


def _tile(X, BT, b, kv_h, j, L, DIM, TILE_N, PAGE, PAGE_MODE, T, LAT, pg, AHEAD):
    """Key tile j of sequence b, kv head kv_h, of a 4D cache: X [TN, DIM] as stored, or
    X^T [DIM, TN] (T): contiguous and in-page tiles read transposed through the load's
    axis order, gathered pages transposed in registers, boxes concatenated side by side."""
    lat = LAT if LAT > 0 else None             # the loads' latency hint; None: the compiler's
    if PAGE == 0:
        if T:
            x = ct.load(X, index=(b, 0, kv_h, j), shape=(1, DIM, 1, TILE_N),
                        order=_KT_ORDER, padding_mode=ct.PaddingMode.ZERO,
                        latency=lat)
            return x.reshape((DIM, TILE_N))
        x = ct.load(X, index=(b, j, kv_h, 0), shape=(1, TILE_N, 1, DIM),
                    padding_mode=ct.PaddingMode.ZERO,
                    latency=lat)
        return x.reshape((TILE_N, DIM))
    if TILE_N <= PAGE:
        per_page = PAGE // TILE_N
        if AHEAD:
            page = pg                          # looked up a step earlier (_page_ids)
        else:
            page = ct.load(BT, index=(b, j // per_page), shape=())
        sub = j % per_page
        if T:
            x = ct.load(X, index=(page, 0, kv_h, sub), shape=(1, DIM, 1, TILE_N),
                        order=_KT_ORDER, padding_mode=ct.PaddingMode.ZERO,
                        latency=lat)
            return x.reshape((DIM, TILE_N))
        x = ct.load(X, index=(page, sub, kv_h, 0), shape=(1, TILE_N, 1, DIM),
                    padding_mode=ct.PaddingMode.ZERO,
                    latency=lat)
        return x.reshape((TILE_N, DIM))
    n = TILE_N // PAGE
    first = j * n
    last = ct.cdiv(L, PAGE) - 1
    if PAGE_MODE == 1:
        if AHEAD:
            pages = pg
        else:
            pages = _page_ids(BT, b, j, L, TILE_N, PAGE)
        x = ct.load_advanced_indexing(X, (pages, ct.Slice(0, PAGE), ct.Slice(kv_h, 1),
                                          ct.Slice(0, DIM)),
                                      padding_mode=ct.PaddingMode.ZERO,
                                      latency=lat)
        x = x.reshape((TILE_N, DIM))
        if T:
            return ct.transpose(x)
        return x
    return _pages(X, BT, b, kv_h, first, last, n, DIM, PAGE, T, pg, AHEAD)


def _pages(X, BT, b, kv_h, first, last, N, DIM, PAGE, IS_K, pg, AHEAD):
    """Pages first .. first+N-1 (N in {2, 4, 8}) of one head, side by side: K^T
    [D, N*PAGE] (IS_K) or V [N*PAGE, Dv]. AHEAD: their ids are pg [N] (_page_ids, looked
    up a step earlier), else each box loads its own from the table."""
    axis = 1 if IS_K else 0
    x = _page_pair(X, BT, b, kv_h, first, 0, last, DIM, PAGE, IS_K, pg, AHEAD)
    if N >= 4:
        x = ct.cat((x, _page_pair(X, BT, b, kv_h, first, 2, last, DIM, PAGE, IS_K, pg,
                                  AHEAD)), axis)
    if N == 8:
        y = ct.cat((_page_pair(X, BT, b, kv_h, first, 4, last, DIM, PAGE, IS_K, pg, AHEAD),
                    _page_pair(X, BT, b, kv_h, first, 6, last, DIM, PAGE, IS_K, pg, AHEAD)),
                   axis)
        x = ct.cat((x, y), axis)
    return x


def _page_pair(X, BT, b, kv_h, first, i, last, DIM, PAGE, IS_K, pg, AHEAD):
    return ct.cat((_page(X, BT, b, kv_h, first, i, last, DIM, PAGE, IS_K, pg, AHEAD),
                   _page(X, BT, b, kv_h, first, i + 1, last, DIM, PAGE, IS_K, pg, AHEAD)),
                  1 if IS_K else 0)


def _page(X, BT, b, kv_h, first, i, last, DIM, PAGE, IS_K, pg, AHEAD):
    """Page first + i of one head: K^T [D, PAGE] or V [PAGE, Dv]; clamped to `last`."""
    if AHEAD:
        page = ct.extract(pg, (i,), (1,)).item()
    else:
        page = ct.load(BT, index=(b, min(first + i, last)), shape=())
    if IS_K:
        k_t = ct.load(X, index=(page, 0, kv_h, 0), shape=(1, DIM, 1, PAGE), order=_KT_ORDER,
                      padding_mode=ct.PaddingMode.ZERO)
        return k_t.reshape((DIM, PAGE))
    v = ct.load(X, index=(page, 0, kv_h, 0), shape=(1, PAGE, 1, DIM),
                padding_mode=ct.PaddingMode.ZERO)
    return v.reshape((PAGE, DIM))
