"""Numeric constants and scalar index arithmetic shared by the FMHA kernels.

No tile code lives here, on purpose: the CPU simulator runs a kernel by binding its own
``ct`` into the kernel module's globals, so tile code (anything that calls ``ct.*``) is kept
inside the kernel's own module (fused.py, naive.py), where that binding reaches it. Plain
integer arithmetic on block indices and extents (min, max, //) needs no ``ct``.
"""
import math

# exp(x) == exp2(x * LOG2E). The kernels work in the base-2 domain because exp2 is the
# GPU's native transcendental (one MUFU.EX2), and the scale folds into the same multiply.
LOG2E = 1.4426950408889634  # 1 / ln(2)
NEG_INF = -math.inf
FLOAT32_MAX = 3.4028234663852886e38


def causal_key_range(bid_m, seq_q, seq_k, TILE_M, TILE_N, CAUSAL):
    """Which key tiles the query tile bid_m visits, as (kv_end, mask_from).

    Bottom-right causal alignment: query i sees key j iff j <= i + (seq_k - seq_q).
    kv_end: one past the last key any row of the tile may see (0 when it sees none).
    mask_from: the first key tile that needs the element-wise test (the causal diagonal
    band, or the ragged last tile when seq_k % TILE_N != 0); tiles before it are whole
    interior tiles, visited with no index arithmetic and no selects. Shared by the forward
    (fused.py) and the backward's dQ kernel (fmha_bwd.py), which walk the same keys."""
    if CAUSAL:
        diag = seq_k - seq_q
        last_row = min((bid_m + 1) * TILE_M, seq_q) - 1
        kv_end = max(min(seq_k, last_row + diag + 1), 0)
        first_row_sees = max(bid_m * TILE_M + diag + 1, 0)  # keys [0, this) seen by all rows
        mask_from = min(first_row_sees // TILE_N, seq_k // TILE_N)
    else:
        kv_end = seq_k
        mask_from = seq_k // TILE_N
    return kv_end, mask_from
