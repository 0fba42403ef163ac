"""The decode kernels compile with tileiras for every target arch, on the CPU (issue 18's
compile gate: sm_90, sm_120, sm_89); nothing is launched."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

# (page, seq_q, heads, causal): a contiguous GQA decode with splits, and a paged MQA
# speculative step with causal masking and multi-page tiles
VARIANTS = [(0, 1, (32, 8), False), (16, 4, (8, 1), True)]


@pytest.mark.parametrize("arch", ["sm_90", "sm_120", "sm_89"])
@pytest.mark.parametrize("page, seq_q, heads, causal", VARIANTS)
def test_decode_kernels_compile(arch, page, seq_q, heads, causal):
    from spak.gpu.compile_decode import compile_decode_variant
    r = compile_decode_variant(arch=arch, dtype="fp16" if page else "bf16", head_dim=128,
                               causal=causal, page=page, seq_q=seq_q, heads=heads)
    assert r["ok"], r["error"]
    assert [k["name"] for k in r["kernels"]] == ["decode.split", "decode.combine"]
    assert all(k["cubin_bytes"] > 0 for k in r["kernels"])
