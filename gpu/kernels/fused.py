"""Fused FMHA forward (recipe step 3): one pass over K/V with an online softmax.

    O = softmax(Q K^T * scale + M) V

Layouts: Q [B, Hq, Sq, D], K [B, Hkv, Sk, D], V [B, Hkv, Sk, Dv], Out [B, Hq, Sq, Dv]
(fp16 or bf16, last dim contiguous); Mask float32 [MB, MH, Sq, Sk], MB in {1, B},
MH in {1, Hq} (a (1,1,1,1) dummy when HAS_MASK is False; it is then never read).

Grid: (cdiv(Sq, TILE_M), Hq, B). Block (i, h, b) owns query rows
[i*TILE_M, (i+1)*TILE_M) of batch b, head h and walks the key tiles left to right keeping, per row,
the running max m (base-2 log domain), the running sum l and the unnormalised output acc,
all in float32.

Causal convention (bottom-right): query i may attend key j iff j <= i + (Sk - Sq).
Rows that can attend no key (Sq > Sk, or a mask row of all -inf) produce exact zeros.

Read top to bottom: constants and entry point, then the per-block implementation, then
the one-key-tile step of the online softmax.
"""
import math

import cuda.tile as ct

from .common import FLOAT32_MAX, LOG2E, NEG_INF, causal_key_range

LN2 = math.log(2.0)     # the LSE is stored in natural-log units (log2 units * ln 2)
POS_INF = math.inf

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


# --------------------------------------------------------------------------------------
# Entry point: block ids -> coordinates, then the body. Kept small on purpose.
# --------------------------------------------------------------------------------------
# occupancy 2 on sm_90: two blocks per SM hide each other's softmax behind the other's
# tensor-core work. Measured on an H200 (results/perf-probe-h200-2026-11-22.md): +20-45%
# over the compiler's default at every standard shape and tile. Other archs: unmeasured.
@ct.kernel(occupancy=ct.ByTarget(sm_90=2))
def fmha_fwd_kernel(Q, K, V, Out, Mask,
                    scale: float,            # softmax scale (float32 on the GPU), any finite
                    scale_log2_pow2: float,  # RAW_MAX only: a power of two in (c/2, c],
                                             # c = scale*log2(e) (gpu.plan.raw_max_args)
                    HEAD_DIM: ConstInt,      # tile width of D (power of two >= Q's D)
                    HEAD_DIM_V: ConstInt,    # tile width of Dv (power of two >= V's Dv)
                    TILE_M: ConstInt,        # query rows per block
                    TILE_N: ConstInt,        # keys per inner-loop step
                    CAUSAL: ConstBool,
                    HAS_MASK: ConstBool,
                    RAW_MAX: ConstBool,      # scale > 0 and no mask: the FFMA form (below)
                    GROUP: ConstInt,         # query heads per KV head, Hq // Hkv (_head_coords)
                    LAT_K: ConstInt = 0,     # DRAM latency hint for K loads, 1..10; 0: compiler
                    LAT_V: ConstInt = 0):    # same for V loads (tuning knobs for the sweeper)
    bid_m = ct.bid(0)
    if CAUSAL:
        # Longest first: with x the fastest block index, the GPU starts blocks in bid(0)
        # order, and a causal block's work grows with its row index. Reversed, the long
        # blocks start early and the short ones fill the last wave's gaps.
        bid_m = ct.num_blocks(0) - 1 - bid_m
    b, h, kv_h = _head_coords(GROUP)
    _fmha_fwd_block(Q, K, V, Out, Mask, None, scale, scale_log2_pow2, b, h, kv_h, bid_m,
                    HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK, RAW_MAX,
                    LAT_K, LAT_V, False)


# The same forward that also stores the row log-sum-exp for a backward pass (training).
# A second entry point rather than a new parameter of fmha_fwd_kernel: inference launches
# keep their exact argument list and compiled code. The shared body takes WRITE_LSE as a
# compile-time constant: fmha_fwd_kernel passes False (and no Lse array), which compiles
# the LSE code away.
@ct.kernel(occupancy=ct.ByTarget(sm_90=2))
def fmha_fwd_lse_kernel(Q, K, V, Out, Mask,
                        Lse,                     # float32 [B, Hq, Sq]: natural-log LSE
                        scale: float, scale_log2_pow2: float,
                        HEAD_DIM: ConstInt, HEAD_DIM_V: ConstInt,
                        TILE_M: ConstInt, TILE_N: ConstInt,
                        CAUSAL: ConstBool, HAS_MASK: ConstBool, RAW_MAX: ConstBool,
                        GROUP: ConstInt, LAT_K: ConstInt = 0, LAT_V: ConstInt = 0):
    bid_m = ct.bid(0)
    if CAUSAL:
        bid_m = ct.num_blocks(0) - 1 - bid_m      # longest first, as fmha_fwd_kernel
    b, h, kv_h = _head_coords(GROUP)
    _fmha_fwd_block(Q, K, V, Out, Mask, Lse, scale, scale_log2_pow2, b, h, kv_h, bid_m,
                    HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK, RAW_MAX,
                    LAT_K, LAT_V, True)


def _head_coords(GROUP):
    """(batch, query head, kv head) of this block: the grid's z and y, and h // GROUP.

    GQA/MQA: query head h reads kv head h // (Hq // Hkv). Batch and head come from their
    own grid axes and the group size is a compile-time constant, so the block computes
    its coordinates with no run-time integer division. Reading the head counts from the
    array shapes and dividing a flattened B*Hq index (as before) put three divisions by
    run-time values (~130 SASS instructions, in the producer and consumer warps alike)
    ahead of each block's first load, which matters where blocks are short (D=64 causal).
    With the causal test below: +0.5..5% on the H100's D=64 causal shapes, neutral elsewhere,
    same output bits (results/fwd-variants-h100-2026-11-24, run 4).
    One compiled variant now serves every head count and batch; one per group size.
    """
    h = ct.bid(1)
    return ct.bid(2), h, h // GROUP


# --------------------------------------------------------------------------------------
# One block: load Q once, stream K/V tiles, normalise, store.
# --------------------------------------------------------------------------------------
# Its steps are helpers (_scores, _online_softmax_step, _store_lse); what is left reads
# top to bottom: set-up, loop bounds, the two loops, the store.
# long: one block's whole forward, in reading order
def _fmha_fwd_block(Q, K, V, Out, Mask, Lse, scale, scale_log2_pow2, b, h, kv_h, bid_m,
                    HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK, RAW_MAX,
                    LAT_K, LAT_V, WRITE_LSE, ROWS=False, q0=0, k0=0, lq=0, lk=0,
                    WHOLE=False):
    # ROWS (fmha_varlen_kernel): Q, K, V, Out are packed [total, H, D] arrays and this
    # block's sequence owns query rows [q0, q0 + lq) and key rows [k0, k0 + lk) (b is 0);
    # WHOLE: lq and lk are whole numbers of tiles (no ragged-tile paths compiled).
    if ROWS:
        seq_q = lq
        seq_k = lk
    else:
        seq_q = Q.shape[2]
        seq_k = K.shape[2]
    # Bottom-right causal alignment: row i sees keys j <= i + diag.
    diag = seq_k - seq_q

    # scale and log2(e) folded into one multiplier c: scores live in log2 units,
    # s = (Q K^T * scale + M) * log2(e), so exp2(s - max) is the softmax numerator.
    # General path (any scale, masks): scores are scaled (and rounded) BEFORE the row max.
    # RAW_MAX path (scale > 0, no mask): the max is taken on the raw scores x and the
    # exponent `x * c - mb` is one FFMA per score instead of FMUL + FADD (~6% faster on an
    # H100, docs/perf-notes.md). See _raw_max_step for why it is safe for huge logits.
    qk_scale_log2 = scale * LOG2E
    # RAW_MAX: raw row maxima with |m| >= huge_max are huge (|m| * c >= HUGE_ROW), see
    # _raw_max_step. A threshold, so the fast approximate division does (once per block).
    huge_max = ct.truediv(HUGE_ROW, qk_scale_log2, flush_to_zero=True,
                          rounding_mode=ct.RoundingMode.APPROX)
    multipliers = (qk_scale_log2, scale_log2_pow2, huge_max)    # for _raw_max_step

    # Query tile stays in registers for the whole loop. Rows past Sq load as zeros
    # (they are computed harmlessly and dropped by the bounds-checked store).
    if ROWS:      # rows past the sequence are the next one's: their output is never stored
        q = _row_view(Q, TILE_M, HEAD_DIM).load((q0 + bid_m * TILE_M, h, 0)
                                                ).reshape((TILE_M, HEAD_DIM))
    else:
        q = ct.load(Q, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, HEAD_DIM),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HEAD_DIM))

    # Absolute query positions shifted onto the key axis: key j visible iff j <= q_pos.
    q_pos = (bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32) + diag)[:, None]  # [TM, 1]
    key_offs = ct.arange(TILE_N, dtype=ct.int32)[None, :]                          # [1, TN]

    # ---- which key tiles to visit (common.causal_key_range) ----------------------------
    kv_end, mask_from = causal_key_range(bid_m, seq_q, seq_k, TILE_M, TILE_N, CAUSAL)
    num_tiles = ct.cdiv(kv_end, TILE_N)

    # MB/MH are 1 (broadcast) or full: min() picks index 0 when broadcast.
    mask_b = min(b, Mask.shape[0] - 1)
    mask_h = min(h, Mask.shape[1] - 1)

    # ---- online softmax state (float32) -----------------------------------------------
    m_i = ct.full((TILE_M, 1), NEG_INF, dtype=ct.float32)   # running max (log2 units,
                                                            # raw scores if RAW_MAX)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)       # running sum of exp2
    acc = ct.full((TILE_M, HEAD_DIM_V), 0.0, dtype=ct.float32)

    # Two loops rather than one with a branch: interior tiles need no masking, and a loop
    # body without control flow is what the compiler pipelines best.
    for j in range(0, min(mask_from, num_tiles)):
        qk = _scores(q, K, Mask, b, kv_h, mask_b, mask_h, bid_m, j, qk_scale_log2,
                     HEAD_DIM, TILE_M, TILE_N, HAS_MASK, RAW_MAX, LAT_K, ROWS, k0)
        m_i, l_i, acc = _online_softmax_step(
            qk, m_i, l_i, acc, V, b, kv_h, j, multipliers,
            TILE_N, HEAD_DIM_V, Q.dtype, RAW_MAX, LAT_V, ROWS, k0)
    # Boundary tiles only: keys past Sk (ragged end) and, if causal, keys right of the
    # diagonal get -inf, i.e. probability exactly 0 (_boundary_step).
    if ROWS:
        # V rows past the sequence are the next one's (maybe inf or NaN, and p = 0 times
        # NaN is NaN): the ragged last tile (at most one) reads V through a view that ends
        # at the sequence, zeros past it; only the blocks reaching that tile make one.
        n_whole = min(seq_k // TILE_N, num_tiles)
        if WHOLE:
            n_whole = num_tiles
        for j in range(mask_from, n_whole):
            m_i, l_i, acc = _boundary_step(
                q, K, V, Mask, b, kv_h, mask_b, mask_h, bid_m, j, qk_scale_log2, multipliers,
                m_i, l_i, acc, q_pos, key_offs, seq_k, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N,
                CAUSAL, HAS_MASK, RAW_MAX, LAT_K, LAT_V, Q.dtype, True, k0, True)
        # WHOLE: not even an empty loop. The compiler keeps a loop it cannot prove empty,
        # and this one's view code slowed whole causal batches by 1.5-9% (H100,
        # results/issue18-h100-2026-11-28 run 21: 8 x 2048 causal 1.039 -> 0.994 of
        # spak.fmha's time, bf16 2 x 8192 1.069 -> 0.978)
        if not WHOLE:
            for j in range(n_whole, num_tiles):
                m_i, l_i, acc = _boundary_step(
                    q, K, _sequence_view(V, k0, seq_k), Mask, b, kv_h, mask_b, mask_h, bid_m,
                    j, qk_scale_log2, multipliers, m_i, l_i, acc, q_pos, key_offs, seq_k,
                    HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL, HAS_MASK, RAW_MAX, LAT_K,
                    LAT_V, Q.dtype, True, k0, False)
    else:
        for j in range(mask_from, num_tiles):
            m_i, l_i, acc = _boundary_step(
                q, K, V, Mask, b, kv_h, mask_b, mask_h, bid_m, j, qk_scale_log2, multipliers,
                m_i, l_i, acc, q_pos, key_offs, seq_k, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N,
                CAUSAL, HAS_MASK, RAW_MAX, LAT_K, LAT_V, Q.dtype, False, 0, False)

    # ---- normalise and store ----------------------------------------------------------
    # l_i == 0 exactly when the row saw no allowed key: output 0 there, never 0/0.
    # (!= rather than >: a NaN sum, from NaN/inf in Q, K or the mask, must stay NaN as
    # in SDPA instead of turning the row into zeros)
    has_keys = l_i != 0.0
    l_safe = ct.where(has_keys, l_i, 1.0)
    out = ct.truediv(acc, l_safe, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    out = ct.where(has_keys, out, 0.0)
    if ROWS:
        _store_rows(Out, out.astype(Out.dtype), h, bid_m, q0, seq_q, TILE_M, HEAD_DIM_V,
                    WHOLE)
    else:
        out = out.astype(Out.dtype).reshape((1, 1, TILE_M, HEAD_DIM_V))
        ct.store(Out, index=(b, h, bid_m, 0), tile=out)   # rows past Sq are dropped
    if WRITE_LSE:
        _store_lse(Lse, m_i, l_i, has_keys, qk_scale_log2, b, h, bid_m, TILE_M, RAW_MAX)


def _store_lse(Lse, m_i, l_i, has_keys, c, b, h, bid_m, TILE_M, RAW_MAX):
    """Row log-sum-exp, natural log: lse = ln(sum_j exp(scale * s_j + M_j)); +inf for a
    row that saw no key, so that the backward's exp(x - lse) is exactly 0 there.

    In log2 units the sum is 2^m * l (m: the row max the exponents were taken against,
    l: the row sum), so lse = (m + log2(l)) * ln(2). RAW_MAX keeps the raw max: m * c,
    rounded on its own as the exponent offset mb was (the max() keeps the product out of
    an FFMA). Rows with huge scores (|m * c| >= HUGE_ROW), which the forward ran at the
    power-of-two multiplier, get their LSE at the true c: finite, but float32 then holds
    it to >= 1 log2 unit, so their gradients are as approximate as their forward."""
    if RAW_MAX:
        m_i = ct.maximum(m_i * c, -FLOAT32_MAX)
    l_safe = ct.where(has_keys, l_i, 1.0)
    lse2 = m_i + _log2_rowsum(l_safe)                      # log2 units
    lse = ct.where(has_keys, lse2 * LN2, POS_INF)          # [TM, 1]
    ct.store(Lse, index=(b, h, bid_m), tile=lse.reshape((1, 1, TILE_M)))  # rows past Sq dropped


# log2(1 + f) = f * (LOG2_P[-1] + f * (... + f * LOG2_P[0])): the coefficients of the
# float32 log2 the compiler emits for ct.log2 (libdevice's log2f, read from the sm_90 SASS).
LOG2_P = (0.09702014178037643, -0.16845393180847168, 0.17168870568275452,
          -0.17900948226451874, 0.20512372255325317, -0.24046532809734344,
          0.28857114911079407, -0.3606741726398468, 0.4808982014656067,
          -0.7213475108146667)
LOG2E_F32 = 1.4426950216293335      # log2(e) rounded to float32


def _log2_rowsum(x):
    """log2 of a positive, normal float32 tile (the row sums: >= ~0.7, dead rows 1).

    The same operations the compiler emits for ct.log2 (libdevice's log2f, <= 1 ulp from
    the exact value), written out because the simulator models ct.log2 as correctly
    rounded: they differ in ~8% of values, which would show as LSE and gradient bits
    that disagree with the GPU. Written with integer ops and FFMAs the simulator runs bit
    for bit: x = 2^k * m with m in [sqrt(1/2), sqrt(2)), log2(x) = k + log2(1 + f), f = m - 1.
    No subnormal, zero, inf or NaN handling: the row sums never are (a NaN sum gives a
    meaningless LSE, for a row whose output is NaN anyway)."""
    bits = ct.bitcast(x, ct.int32)
    e = (bits - 0x3F3504F3) & -8388608             # 2^23 * k, k = round-ish(log2(x))
    f = ct.bitcast(bits - e, ct.float32) - 1.0      # m - 1 in [-0.293, 0.415)
    r = f * LOG2_P[0] + LOG2_P[1]                   # Horner: one FFMA per coefficient
    r = r * f + LOG2_P[2]
    r = r * f + LOG2_P[3]
    r = r * f + LOG2_P[4]
    r = r * f + LOG2_P[5]
    r = r * f + LOG2_P[6]
    r = r * f + LOG2_P[7]
    r = r * f + LOG2_P[8]
    r = r * f + LOG2_P[9]
    r = f * (f * r)
    return e.astype(ct.float32) * (2.0 ** -23) + (f * LOG2E_F32 + r)


def _boundary_step(q, K, V, Mask, b, kv_h, mask_b, mask_h, bid_m, j, c, multipliers,
                   m_i, l_i, acc, q_pos, key_offs, seq_k, HEAD_DIM, HEAD_DIM_V, TILE_M,
                   TILE_N, CAUSAL, HAS_MASK, RAW_MAX, LAT_K, LAT_V, in_dtype, K_ROWS, k0,
                   V_ROWS):
    """One boundary key tile j: scores, the element-wise mask, the online-softmax step.
    K_ROWS / V_ROWS: K / V is a packed array read at row k0 + j * TILE_N (else 4D)."""
    qk = _scores(q, K, Mask, b, kv_h, mask_b, mask_h, bid_m, j, c,
                 HEAD_DIM, TILE_M, TILE_N, HAS_MASK, RAW_MAX, LAT_K, K_ROWS, k0)
    key_pos = j * TILE_N + key_offs                     # [1, TN]
    if CAUSAL:
        # key_pos <= q_pos also keeps every key past Sk out of a real row: a row i < Sq
        # has q_pos = i + Sk - Sq <= Sk - 1. Only the padding rows past Sq see such keys
        # (zeros by the load's padding, or the next sequence's) and they are never
        # stored. One compare per score instead of two.
        keep = key_pos <= q_pos                         # [TM, TN]
    else:
        keep = key_pos < seq_k                          # [1, TN]
    qk = ct.where(keep, qk, NEG_INF)
    return _online_softmax_step(qk, m_i, l_i, acc, V, b, kv_h, j, multipliers,
                                TILE_N, HEAD_DIM_V, in_dtype, RAW_MAX, LAT_V, V_ROWS, k0)


def _scores(q, K, Mask, b, kv_h, mask_b, mask_h, bid_m, j, c,
            HEAD_DIM, TILE_M, TILE_N, HAS_MASK, RAW_MAX, LAT_K, ROWS=False, k0=0):
    """Scores of key tile j, float32 [TM, TN]: in log2 units, (Q K^T * scale + M) * log2(e),
    or raw Q K^T if RAW_MAX (scaled inside the exponent's FFMA, _raw_max_step). ROWS: K is
    packed [total, Hkv, D], tile j at row k0 + j * TILE_N."""
    if ROWS:
        k_t = ct.transpose(_row_view(K, TILE_N, HEAD_DIM).load(
            (k0 + j * TILE_N, kv_h, 0),
            latency=LAT_K if LAT_K > 0 else None).reshape((TILE_N, HEAD_DIM)))
    else:
        k_t = ct.load(K, index=(b, kv_h, 0, j), shape=(1, 1, HEAD_DIM, TILE_N),
                      order=(0, 1, 3, 2),                # K^T via the load's axis order
                      padding_mode=ct.PaddingMode.ZERO,
                      latency=LAT_K if LAT_K > 0 else None).reshape((HEAD_DIM, TILE_N))
    qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    qk = ct.mma(q, k_t, qk)                          # tensor cores, float32 accumulation
    if not RAW_MAX:
        qk = qk * c
    if HAS_MASK:
        m_tile = ct.load(Mask, index=(mask_b, mask_h, bid_m, j),
                         shape=(1, 1, TILE_M, TILE_N),
                         padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_N))
        qk = qk + m_tile * LOG2E
    return qk


def _online_softmax_step(s, m_i, l_i, acc, V, b, kv_h, j, multipliers,
                         TILE_N, HEAD_DIM_V, in_dtype, RAW_MAX, LAT_V, ROWS=False, k0=0):
    """Fold one key tile of scores ``s`` [TM, TN] into (m_i, l_i, acc)."""
    if RAW_MAX:
        m_new, p, alpha = _raw_max_step(s, m_i, *multipliers)
    else:
        m_new = ct.maximum(m_i, ct.max(s, axis=-1, keepdims=True))
        # A row with every key masked so far has m_new == -inf; subtracting it would give
        # exp2(-inf - -inf) = NaN. Subtract 0 instead: its scores are -inf, so p == 0.
        m_safe = ct.where(m_new == NEG_INF, 0.0, m_new)
        p = ct.exp2(s - m_safe, flush_to_zero=True)                     # [TM, TN]
        alpha = ct.exp2(m_i - m_safe, flush_to_zero=True)               # rescale old state
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)

    # P V on the tensor cores: P rounded to the input dtype, accumulation stays float32.
    # Keys past Sk load as zero rows of V (and have p == 0), so they add exactly 0.
    if ROWS:                 # packed [total, Hkv, Dv], tile j at row k0 + j * TILE_N
        v = _row_view(V, TILE_N, HEAD_DIM_V).load(
            (k0 + j * TILE_N, kv_h, 0),
            latency=LAT_V if LAT_V > 0 else None).reshape((TILE_N, HEAD_DIM_V))
    else:
        v = ct.load(V, index=(b, kv_h, j, 0), shape=(1, 1, TILE_N, HEAD_DIM_V),
                    padding_mode=ct.PaddingMode.ZERO,
                    latency=LAT_V if LAT_V > 0 else None).reshape((TILE_N, HEAD_DIM_V))
    acc = ct.mma(p.astype(in_dtype), v, acc * alpha)
    # Keep the true max (possibly -inf), not m_safe: a later finite tile must rescale
    # against its own max, not against the placeholder 0.
    return m_new, l_i, acc


# Rows whose |max score| * c reaches this (log2 units) take the power-of-two multiplier.
HUGE_ROW = 2.0 ** 24


def _raw_max_step(x, m_i, c, c_pow2, huge_max):
    """(m_new, p, alpha) for raw scores x [TM, TN]: p = exp2(x * c_row - mb), one FFMA each.

    The GPU fuses `x * c - mb` into one FFMA, so the product is exact and mb = fl(m * c)
    is not: for the max score x = m the exponent is m*c - fl(m*c), the product's rounding
    error, at most ulp(m*c)/2. Below HUGE_ROW that is <= 0.5: p <= 1.41, harmless (one
    offset per row, it cancels in acc / l). Past ~2^31 it would overflow exp2 to inf and
    give NaN rows. Rows at or past HUGE_ROW therefore use c_row = c_pow2, a power of two
    within 2x of c: x * c_pow2 and m * c_pow2 are exact, the max score gets exp2(0) = 1 and
    nothing overflows. Their temperature differs from c by < 2x, on rows where adjacent
    float32 scores are already >= 1 log2 unit apart (the rounding of Q K^T alone moves a
    weight by up to 2^0.5 there).

    alpha rescales the old state with the NEW multiplier, exp2(m_i * c_row - mb) (one FFMA):
    m_i <= m_new keeps it <= 1.41 however the row's multiplier changed. It differs from
    the old offset's exp2(fl(m_i * c) - mb) by the rounding error of fl(m_i * c), the same
    size as the general path's rounding of every scaled score. Per-row work is kept to a
    few ops: it runs once per row and key tile, against one FFMA saved per score.
    """
    m_new = ct.maximum(m_i, ct.max(x, axis=-1, keepdims=True))     # raw units, [TM, 1]
    # Huge rows take the power of two; -inf (no key seen yet) counts as huge, stays -inf.
    c_row = ct.where(ct.abs(m_new) >= huge_max, c_pow2, c)
    # A row that has seen no key (every x is -inf) gets a finite offset, so that
    # x * c_row - mb is -inf (p == 0) rather than -inf + inf = NaN.
    mb = ct.maximum(m_new * c_row, -FLOAT32_MAX)
    p = ct.exp2(x * c_row - mb, flush_to_zero=True)                    # FFMA + EX2
    alpha = ct.exp2(m_i * c_row - mb, flush_to_zero=True)              # FFMA + EX2
    return m_new, p, alpha


# --------------------------------------------------------------------------------------
# Packed variable-length batches: the same block over one sequence's rows
# --------------------------------------------------------------------------------------
@ct.kernel(occupancy=ct.ByTarget(sm_90=2))      # as fmha_fwd_kernel
def fmha_varlen_kernel(Q, K, V, Out, CuQ, CuK,
                       scale: float, scale_log2_pow2: float,
                       HEAD_DIM: ConstInt, HEAD_DIM_V: ConstInt,
                       TILE_M: ConstInt, TILE_N: ConstInt,
                       CAUSAL: ConstBool, RAW_MAX: ConstBool, GROUP: ConstInt,
                       LAT_K: ConstInt = 0, LAT_V: ConstInt = 0,
                       HEADS: ConstInt = 1,       # query heads a block, one after another
                       WHOLE: ConstBool = False):  # every run a whole number of tiles
    """The forward over a packed variable-length batch (FlashAttention's varlen layout):
    Q [total_q, Hq, D], K/V [total_k, Hkv, D/Dv], Out [total_q, Hq, Dv]; sequence b owns
    rows CuQ[b]:CuQ[b+1] of Q and Out and CuK[b]:CuK[b+1] of K and V (int32 [B+1]).

    Grid (cdiv(max_seqlen_q, TILE_M), Hq / HEADS, B): fmha_fwd_kernel's with the longest
    sequence's query tiles, HEADS query heads a block. Each block runs _fmha_fwd_block, the
    padded forward's code, in its ROWS form: tiles are read at the sequence's row offsets
    of the packed arrays (_row_view: through the launch's TMA descriptors, none made in
    the kernel), so each sequence's output equals spak.fmha's on it alone, bit for bit.
    Rows past a sequence belong to the next one: query rows there are never stored, keys
    there are masked, and the ragged last key tile's V and the ragged last query tile's
    Out go through views that end at the sequence (_sequence_view: a descriptor made in
    the block, only where such a tile is reached). Causal: bottom-right per sequence.

    WHOLE (gpu.plan_decode.plan_varlen sets it from the shapes alone: every run max_seqlen
    long, a multiple of the tiles): those two paths are not compiled, not even as an
    empty loop. Never taken on such a batch, they still cost 2-9% (results/varlen-h100-
    2026-11-27 run 14, results/issue18-h100-2026-11-28 run 21)."""
    bid_m = ct.bid(0)
    if CAUSAL:
        bid_m = ct.num_blocks(0) - 1 - bid_m      # longest first, as fmha_fwd_kernel
    b = ct.bid(2)
    # both runs' offsets before the branch: their loads are issued together
    q0, lq = _segment(CuQ, b, Q.shape[0])
    k0, lk = _segment(CuK, b, K.shape[0])
    if bid_m * TILE_M < lq:                       # tiles past the sequence: nothing
        for i in range(HEADS):
            h = ct.bid(1) * HEADS + i
            _fmha_fwd_block(Q, K, V, Out, Q, None, scale, scale_log2_pow2, 0, h,
                            h // GROUP, bid_m, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL,
                            False, RAW_MAX, LAT_K, LAT_V, False, True, q0, k0, lq, lk,
                            WHOLE)


def _segment(Cu, b, total):
    """(start, length) of sequence b: Cu[b]:Cu[b+1] clamped into [0, total] (the offsets are
    device data the host never reads: a bad one must not reach past the array)."""
    start = min(max(ct.load(Cu, index=(b,), shape=()), 0), total)
    stop = min(max(ct.load(Cu, index=(b + 1,), shape=()), start), total)
    return start, stop - start


def _row_view(X, ROWS, WIDTH):
    """Packed [total, H, D] X as tiles of ROWS rows of one head, placed at any row: a load
    at (r, h, 0) reads rows r .. r + ROWS of head h (zeros past the array)."""
    return X.tiled_view((ROWS, 1, WIDTH), traversal_steps=(1, 1, WIDTH),
                        padding_mode=ct.PaddingMode.ZERO)


def _store_rows(Out, out, h, bid_m, q0, seq_q, TILE_M, HEAD_DIM_V, WHOLE):
    """Query tile bid_m of head h into the packed Out at row q0 + bid_m * TILE_M: a whole
    tile through the launch's descriptor; the ragged last one through a view that ends at
    the sequence, so the rows past it (the next sequence's) are not written."""
    if WHOLE:
        _row_view(Out, TILE_M, HEAD_DIM_V).store(
            (q0 + bid_m * TILE_M, h, 0), out.reshape((TILE_M, 1, HEAD_DIM_V)))
    elif (bid_m + 1) * TILE_M <= seq_q:
        _row_view(Out, TILE_M, HEAD_DIM_V).store(
            (q0 + bid_m * TILE_M, h, 0), out.reshape((TILE_M, 1, HEAD_DIM_V)))
    else:
        ct.store(_sequence_view(Out, q0, seq_q), index=(0, h, bid_m, 0),
                 tile=out.reshape((1, 1, TILE_M, HEAD_DIM_V)))


def _sequence_view(X, start, length):
    """Rows [start, start + length) of a packed [total, H, D] array as a [1, H, length, D]
    array: the padded forward's layout over the same memory, no copy."""
    first = min(start, X.shape[0] - 1)            # an empty run still needs a valid slice
    rows = X.slice(0, first, first + length)
    return ct.Array.from_foreign(rows.foreign_pointer,
                                 (1, X.shape[1], length, X.shape[2]),
                                 (X.strides[0], X.strides[1], X.strides[0], X.strides[2]))
