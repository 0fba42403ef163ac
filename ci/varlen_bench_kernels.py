"""Varlen forward kernels kept as benchmark opponents only (ci/decode_bench.py times them
beside the shipped gpu/kernels/fused.py `fmha_varlen_kernel`, same signature and grid):

- fmha_varlen_views_kernel (`varlen_views`): as shipped before 2026-11-27c: every block
  views its sequence's rows of Q, K, V and Out as [1, H, L, D] arrays (`_sequence_view`:
  four TMA descriptors built in the block) and runs the padded forward's block on them.
- fmha_varlen_nocu_kernel (`varlen_nocu`, equal-length batches only): the shipped kernel
  with the offsets computed (b * L, L = total / B) instead of loaded from CuQ/CuK: prices
  the offsets' load, which every block waits for before its first tile load."""
import cuda.tile as ct

from spak.gpu.kernels.fused import _fmha_fwd_block, _segment, _sequence_view

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel(occupancy=ct.ByTarget(sm_90=2))
def fmha_varlen_views_kernel(Q, K, V, Out, CuQ, CuK,
                             scale: float, scale_log2_pow2: float,
                             HEAD_DIM: ConstInt, HEAD_DIM_V: ConstInt,
                             TILE_M: ConstInt, TILE_N: ConstInt,
                             CAUSAL: ConstBool, RAW_MAX: ConstBool, GROUP: ConstInt,
                             LAT_K: ConstInt = 0, LAT_V: ConstInt = 0,
                             HEADS: ConstInt = 1, WHOLE: ConstBool = False):
    """fmha_varlen_kernel's signature and grid; per-sequence views for every array
    (WHOLE unused: this kernel had no such form)."""
    bid_m = ct.bid(0)
    if CAUSAL:
        bid_m = ct.num_blocks(0) - 1 - bid_m
    b = ct.bid(2)
    q0, lq = _segment(CuQ, b, Q.shape[0])
    if bid_m * TILE_M < lq:
        k0, lk = _segment(CuK, b, K.shape[0])
        Qs, Ks = _sequence_view(Q, q0, lq), _sequence_view(K, k0, lk)
        Vs, Os = _sequence_view(V, k0, lk), _sequence_view(Out, q0, lq)
        for i in range(HEADS):
            h = ct.bid(1) * HEADS + i
            _fmha_fwd_block(Qs, Ks, Vs, Os, Q, None, scale, scale_log2_pow2, 0, h,
                            h // GROUP, bid_m, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL,
                            False, RAW_MAX, LAT_K, LAT_V, False)


@ct.kernel(occupancy=ct.ByTarget(sm_90=2))
def fmha_varlen_nocu_kernel(Q, K, V, Out, CuQ, CuK,
                            scale: float, scale_log2_pow2: float,
                            HEAD_DIM: ConstInt, HEAD_DIM_V: ConstInt,
                            TILE_M: ConstInt, TILE_N: ConstInt,
                            CAUSAL: ConstBool, RAW_MAX: ConstBool, GROUP: ConstInt,
                            LAT_K: ConstInt = 0, LAT_V: ConstInt = 0,
                            HEADS: ConstInt = 1, WHOLE: ConstBool = False):
    """fmha_varlen_kernel on an equal-length batch with no offset loads (CuQ/CuK unread)."""
    bid_m = ct.bid(0)
    if CAUSAL:
        bid_m = ct.num_blocks(0) - 1 - bid_m
    b = ct.bid(2)
    lq = Q.shape[0] // ct.num_blocks(2)
    lk = K.shape[0] // ct.num_blocks(2)
    q0 = b * lq
    k0 = b * lk
    if bid_m * TILE_M < lq:
        for i in range(HEADS):
            h = ct.bid(1) * HEADS + i
            _fmha_fwd_block(Q, K, V, Out, Q, None, scale, scale_log2_pow2, 0, h,
                            h // GROUP, bid_m, HEAD_DIM, HEAD_DIM_V, TILE_M, TILE_N, CAUSAL,
                            False, RAW_MAX, LAT_K, LAT_V, False, True, q0, k0, lq, lk,
                            WHOLE)


# Text variants of the shipped kernel (gpu/kernels/fused.py with one edit, loaded as a
# module outside the package), for A/B timings: name -> [(old, new)].
EDITS = {
    # every query tile stored through the sequence's own view (one descriptor a block):
    # no second TMA-store staging buffer (80 instead of 96 KB of shared memory)
    "seqout": [("    elif (bid_m + 1) * TILE_M <= seq_q:\n", "    elif False:\n")],
    # the ragged last query tile stored by a masked scatter (registers to memory, no view,
    # no staging buffer); whole tiles through the row view as shipped
    "scatterout": [("""        ct.store(_sequence_view(Out, q0, seq_q), index=(0, h, bid_m, 0),
                 tile=out.reshape((1, 1, TILE_M, HEAD_DIM_V)))""",
                    """        rows = (q0 + bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)
                ).reshape((TILE_M, 1))
        cols = ct.arange(HEAD_DIM_V, dtype=ct.int32).reshape((1, HEAD_DIM_V))
        ct.scatter(Out, (rows, h, cols), out, mask=rows < q0 + seq_q)""")],
    # the WHOLE form with the ragged V loop compiled in again (empty there), as before
    # 2026-11-28: the same-run control of that change
    "wholeloop": [("        if not WHOLE:\n            for j in range(n_whole, num_tiles):",
                   "        if True:\n            for j in range(n_whole, num_tiles):")],
    # the ragged last key tile (at most one) as an `if` instead of a loop of 0 or 1 steps
    "vif": [("""        if not WHOLE:
            for j in range(n_whole, num_tiles):
                m_i, l_i, acc = _boundary_step(""",
             """        if not WHOLE:
            if n_whole < num_tiles:
                j = num_tiles - 1
                m_i, l_i, acc = _boundary_step(""")],
    # the ragged last key tile's V read at row offsets like every other tile, its rows
    # past the sequence (the next one's, maybe inf/NaN) zeroed in registers: no view, no
    # descriptor made in the block
    "vwhere": [
        ("TILE_N, HEAD_DIM_V, in_dtype, RAW_MAX, LAT_V, ROWS=False, k0=0):",
         "TILE_N, HEAD_DIM_V, in_dtype, RAW_MAX, LAT_V, ROWS=False, k0=0, vlen=-1):"),
        ("""            latency=LAT_V if LAT_V > 0 else None).reshape((TILE_N, HEAD_DIM_V))
    else:""",
         """            latency=LAT_V if LAT_V > 0 else None).reshape((TILE_N, HEAD_DIM_V))
        if vlen >= 0:
            rows = (j * TILE_N + ct.arange(TILE_N, dtype=ct.int32)).reshape((TILE_N, 1))
            v = ct.where(rows < vlen, v, 0.0)
    else:"""),
        ("""                   TILE_N, CAUSAL, HAS_MASK, RAW_MAX, LAT_K, LAT_V, in_dtype, K_ROWS, k0,
                   V_ROWS):""",
         """                   TILE_N, CAUSAL, HAS_MASK, RAW_MAX, LAT_K, LAT_V, in_dtype, K_ROWS, k0,
                   V_ROWS, vlen=-1):"""),
        ("TILE_N, HEAD_DIM_V, in_dtype, RAW_MAX, LAT_V, V_ROWS, k0)",
         "TILE_N, HEAD_DIM_V, in_dtype, RAW_MAX, LAT_V, V_ROWS, k0, vlen)"),
        ("q, K, _sequence_view(V, k0, seq_k), Mask,", "q, K, V, Mask,"),
        ("LAT_V, Q.dtype, True, k0, False)", "LAT_V, Q.dtype, True, k0, True, seq_k)"),
    ],
}


def variant_kernel(name):
    """fmha_varlen_kernel of fused.py with EDITS[name] applied (ci/fwd_variants.py's text
    edits and absolute import), loaded from a temporary file."""
    from fwd_variants import FUSED, IMPORT, load_edited
    return load_edited(FUSED.read_text(), [IMPORT] + EDITS[name], "varlen_bench_kernels",
                       f"varlen_{name}").fmha_varlen_kernel
