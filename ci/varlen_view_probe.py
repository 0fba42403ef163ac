"""Does a tiled view with element-sized traversal steps load through TMA? (sm_90 SASS, no
GPU.) The varlen forward (gpu/kernels/fused.py, fmha_varlen_kernel) makes per-sequence
views inside each block (Array.slice + Array.from_foreign): four TMA descriptors built in
shared memory before the first load, the cost left between it and spak.fmha on short
blocks (results/varlen-h100-2026-11-27). A view the host makes once ([1, H, total, D],
strides permuted) read at any row offset would need none:

    tv = K.tiled_view((1, 1, TN, D), traversal_steps=(1, 1, 1, D))
    k = tv.load((0, h, k0 + j * TN, 0))        # rows k0 + j*TN .. , any k0

    python ci/varlen_view_probe.py

prints, for a loop of K tile loads feeding mma (ct.load on tile indices vs the tiled view
at row offsets), the TMA loads and stores, global loads, descriptor set-up (STS of a
descriptor, UTMACCTL) in each kernel's SASS. 2026-11-27 (tileiras 13.4.92): both 4
UTMALDG, 2 UTMASTG, no LDG, no STS: the tiled view at row offsets loads through a
host-made descriptor. Run 6 of results/varlen-h100-2026-11-27 (heads-major host views,
reverted) lost where sequences end mid-tile (the ragged tile's V zeroed through
registers); since 2026-11-27c the shipped kernel reads the packed [total, H, D] arrays
this way (gpu/kernels/fused.py `_row_view`) and takes V of a ragged last key tile through
a view that ends at the sequence instead (runs 7-10).
"""
from __future__ import annotations

import collections
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cuda.tile as ct  # noqa: E402
from cuda.tile.compilation import (ArrayConstraint, CallingConvention,  # noqa: E402
                                   KernelSignature, ScalarConstraint, export_kernel)

C = ct.Constant[int]
B = ct.Constant[bool]


@ct.kernel(occupancy=2)
def k_loop(Q, K, Out, K0, N, TM: C, TN: C, D: C, ROW_OFFSETS: B):
    """Q K^T over keys K0 .. K0 + N of head bid(1); Q, K, Out [1, H, T, D]."""
    h = ct.bid(1)
    q = ct.load(Q, index=(0, h, ct.bid(0), 0), shape=(1, 1, TM, D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TM, D))
    acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
    if ROW_OFFSETS:
        tv = K.tiled_view((1, 1, TN, D), traversal_steps=(1, 1, 1, D),
                          padding_mode=ct.PaddingMode.ZERO)
    for j in range(0, ct.cdiv(N, TN)):
        if ROW_OFFSETS:
            k = tv.load((0, h, K0 + j * TN, 0)).reshape((TN, D))
        else:
            k = ct.load(K, index=(0, h, j, 0), shape=(1, 1, TN, D),
                        padding_mode=ct.PaddingMode.ZERO).reshape((TN, D))
        acc = ct.mma(q, ct.transpose(k), acc)
    ct.store(Out, index=(0, h, ct.bid(0), 0),
             tile=acc.astype(ct.float16).reshape((1, 1, TM, TN)))


def _array(nd):
    return ArrayConstraint(ct.float16, nd, index_dtype=ct.int32, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False,
                           stride_constant=(None,) * (nd - 1) + (1,), base_addr_divisible_by=16,
                           stride_divisible_by=(8,) * (nd - 1) + (1,),
                           shape_divisible_by=(1,) * (nd - 1) + (16,))


def main() -> int:
    from sass_trace import nvdisasm
    i32 = ScalarConstraint(ct.int32)
    for offsets in (False, True):
        buf = io.BytesIO()
        sig = KernelSignature([_array(4), _array(4), _array(4), i32, i32, 64, 128, 128, offsets],
                              CallingConvention.cutile_python_v1())
        export_kernel(k_loop, [sig], buf, gpu_code="sm_90", output_format="cubin")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(buf.getvalue())
            f.flush()
            sass = subprocess.run([nvdisasm(), "-c", f.name], check=True, capture_output=True,
                                  text=True).stdout
        ops = collections.Counter(m.group(1) for m in
                                  re.finditer(r"\s([A-Z][A-Z0-9_]+)(\.[A-Z0-9_.]+)?\s", sass))
        print("tiled view at row offsets" if offsets else "ct.load on tile indices     ",
              {k: ops[k] for k in ("UTMALDG", "UTMASTG", "LDG", "STS", "UTMACCTL")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
