"""The decode and varlen kernels compile with tileiras for every target arch, on the CPU
(issue 18's compile gate: sm_90, sm_120, sm_89); nothing is launched."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

# (page, seq_q, heads, causal, tiles): a contiguous GQA decode with splits, a paged MQA
# speculative step with causal masking and multi-page tiles, page by page (the default)
# and gathered, and tiles inside one page
VARIANTS = [(0, 1, (32, 8), False, None), (16, 4, (8, 1), True, None),
            (16, 1, (8, 2), False, {"PAGE_MODE": 1}),
            # page ids one key tile ahead (PAGE_AHEAD auto): tiles inside 256-key pages in
            # the rows form (GQA, and MQA since keys_vt is kept for gathered tiles)
            (256, 1, (32, 8), False, None), (256, 1, (32, 1), False, None),
            # padded GQA tiles (issue 33): a group of 7 in one tile of 8 (rows form), and
            # Falcon-7B's 71 (D 64) in two tiles of 64 (keys_vt, 16-key pages: the plan's
            # form there). Not here: keys_vt with 64-row tiles on 16-key pages at D 128
            # (64:1 at Sq 1, 16:1 at Sq 3): tileiras 13.4 crashes on them for sm_120
            # (return code -11) before issue 33 as after
            (0, 1, (28, 4), False, None), (16, 1, (71, 1), False, {"KT_FORM": 2})]


@pytest.mark.parametrize("arch", ["sm_90", "sm_120", "sm_89"])
@pytest.mark.parametrize("page, seq_q, heads, causal, tiles", VARIANTS)
def test_decode_kernels_compile(arch, page, seq_q, heads, causal, tiles):
    from spak.gpu.compile_decode import compile_decode_variant
    head_dim = 64 if heads == (71, 1) else 128          # Falcon-7B's head dim
    r = compile_decode_variant(arch=arch, dtype="fp16" if page else "bf16", head_dim=head_dim,
                               causal=causal, page=page, seq_q=seq_q, heads=heads, tiles=tiles)
    assert r["ok"], r["error"]
    assert [k["name"] for k in r["kernels"]] == ["decode.split", "decode.combine"]
    assert all(k["cubin_bytes"] > 0 for k in r["kernels"])


# the one-split kernel (issue 34: decode_one_kernel, no workspace arguments): contiguous
# GQA rows form, paged causal speculative keys form, a padded group
ONE_SPLIT = [(0, 1, (32, 8), False, None), (16, 4, (8, 1), True, {"KT_FORM": 2}),
             (16, 1, (28, 4), False, None),
             # issue 33h's fitted key tiles (gpu.plan_decode.fit_tile_n): Mixtral-8x22B's
             # group 6 at Sq 4 over 16-key pages (32 rows, 64 keys = 4 gathered pages),
             # Falcon-7B's 71 at Sq 4 over 64-key pages (64 rows, 128-key tiles)
             (16, 4, (48, 8), True, None), (64, 4, (71, 1), True, None)]


@pytest.mark.parametrize("arch", ["sm_90", "sm_120", "sm_89"])
@pytest.mark.parametrize("page, seq_q, heads, causal, tiles", ONE_SPLIT)
def test_decode_one_split_kernel_compiles(arch, page, seq_q, heads, causal, tiles):
    from spak.gpu.compile_decode import compile_decode_variant
    r = compile_decode_variant(arch=arch, dtype="fp16", head_dim=64, causal=causal, page=page,
                               seq_q=seq_q, heads=heads, tiles=tiles, splits=1)
    assert r["ok"], r["error"]
    assert [k["name"] for k in r["kernels"]] == ["decode"] and r["cubin_bytes"] > 0


@pytest.mark.parametrize("whole", [False, True])
@pytest.mark.parametrize("arch", ["sm_90", "sm_120", "sm_89"])
def test_varlen_kernel_compiles(arch, whole):
    from spak.gpu.compile_decode import compile_decode_variant
    r = compile_decode_variant(arch=arch, dtype="bf16", head_dim=128, causal=True,
                               heads=(32, 8), kernel="varlen", whole=whole)
    assert r["ok"], r["error"]
    assert [k["name"] for k in r["kernels"]] == ["varlen"] and r["cubin_bytes"] > 0


@pytest.mark.parametrize("page, heads, head_dim, stack_before", [
    (16, (48, 8), 128, 896)])     # Mixtral-8x22B Sq 4 (one split): 32 rows, 16-key pages
def test_fitted_key_tile_compiles_without_stack_on_sm_90(page, heads, head_dim, stack_before):
    """fit_tile_n's reason, on the compiler: the gate rows' one-split kernels spill at 128
    keys (tileiras 13.4: 896 B/thread of stack) and not at the fitted 64. (Falcon-7B's 64
    rows at D 64 also spill at 128 keys, 272 B, but the fitted 64 ran slower on an H200:
    not fitted.)"""
    from spak.gpu.compile_decode import compile_decode_variant
    kw = dict(arch="sm_90", dtype="fp16", head_dim=head_dim, causal=True, page=page,
              seq_q=4, heads=heads, splits=1)
    (fit,) = compile_decode_variant(**kw)["kernels"]
    (given,) = compile_decode_variant(**kw, tiles={"TN_FIT": 0})["kernels"]
    assert fit["stack_bytes"] == 0
    assert given["stack_bytes"] >= stack_before // 2
