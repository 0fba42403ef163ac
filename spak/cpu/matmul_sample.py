"""A matmul kernel in the style of NVIDIA's cutile-python sample (written here): each block
owns one (TM, TN) tile of C, its tile ids come from a grouped 2-D swizzle of the block id
(neighbouring blocks share A rows for cache reuse on the GPU), and the K loop feeds
ct.mma with (TM, TK) and (TK, TN) tiles into a float32 accumulator.

Used by `python -m spak.cpu.bench_sim --problem matmul` (the simulator's speed on a
sample-size problem) and tools/sim_ops_gpu.py (its bits against an H100). Imports only
cuda.tile, so it runs unchanged on the GPU.
"""
from __future__ import annotations

import cuda.tile as ct

ConstInt = ct.Constant[int]
GROUP_M = 8     # tile rows per swizzle group


def swizzle_2d(bid, m, n, tm, tn, group):
    """(row, column) tile ids of block `bid`: blocks walk a group of `group` tile rows
    column by column, so consecutive blocks reuse the same B columns and A rows."""
    rows, cols = ct.cdiv(m, tm), ct.cdiv(n, tn)
    per_group = group * cols
    first = (bid // per_group) * group
    height = min(rows - first, group)
    return first + (bid % per_group) % height, (bid % per_group) // height


@ct.kernel
def matmul_kernel(A, B, C, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    bm, bn = swizzle_2d(ct.bid(0), A.shape[0], B.shape[1], TM, TN, GROUP_M)
    acc = ct.full((TM, TN), 0, dtype=ct.float32)
    for k in range(ct.num_tiles(A, axis=1, shape=(TM, TK))):
        a = ct.load(A, index=(bm, k), shape=(TM, TK), padding_mode=ct.PaddingMode.ZERO)
        b = ct.load(B, index=(k, bn), shape=(TK, TN), padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(a, b, acc)
    ct.store(C, index=(bm, bn), tile=acc.astype(C.dtype))


def grid(m: int, n: int, tm: int, tn: int) -> tuple[int]:
    """One block per C tile."""
    return (-(-m // tm) * -(-n // tn),)
