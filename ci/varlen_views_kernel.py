"""The varlen forward as shipped before 2026-11-27c, kept as a benchmark opponent only: every
block views its sequence's rows of Q, K, V and Out as [1, H, L, D] arrays
(gpu/kernels/fused.py `_sequence_view`: four TMA descriptors built in the block) and runs
the padded forward's block on them. The shipped kernel (fused.fmha_varlen_kernel) reads
at row offsets of the packed arrays instead; ci/decode_bench.py times both in one run
(`varlen_views`)."""
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
                             HEADS: ConstInt = 1):
    """fmha_varlen_kernel's signature and grid; per-sequence views for every array."""
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
