"""Page ids one key tile ahead (tiles["PAGE_AHEAD"] 1; issue 18): each step of the split
kernel looks up the NEXT tile's page ids, so its own K/V loads wait on no block-table load.
The look-up moves, the arithmetic does not: on the simulator the output must be
bit-identical to the in-step look-up and within the float64 gate, on paged caches of every
kind the kernel reads (a page holding several tiles, a tile of several gathered or boxed
pages), both forms (rows and keys in the tensor cores' M), ragged lengths with 0 and 1,
sequences ending mid-page, shuffled page tables and many splits (a split's look-ahead
past its last tile, and past the sequence's last page, must stay in bounds)."""
from __future__ import annotations

import numpy as np
import pytest

from spak.gpu.plan_decode import default_decode_tiles, plan_decode

CASES = [
    # (problem, tiles beside PAGE_AHEAD)
    ("3x8:2x300x64/noncausal/page64/lens=300:1:0/splits=3/fp16", {"TILE_N": 32}),
    ("2x8:1x4:200x64/causal/page16/lens=200:33/splits=2/bf16", {}),           # gathered
    ("2x8:1x4:200x64/causal/page16/lens=200:33/splits=2/fp16", {"PAGE_MODE": 0}),
    ("2x32:1x520x64/noncausal/page16/lens=520:17/splits=5/fp16", {"KT_FORM": 2}),
    ("2x32:1x520x64/noncausal/page256/lens=520:300/splits=3/fp16", {"KT_FORM": 2}),
    ("2x16:4x2:700x64/causal/page256/lens=700:129/splits=4/fp16", {"TILE_N": 128}),
    ("1x8:8x1000x64/noncausal/page16/lens=999/splits=7/fp16", {"KT_FORM": 1}),
]


def _bits(x):
    return x.view(np.uint16) if x.dtype == np.float16 else x.view(np.uint32)


@pytest.mark.parametrize("case,tiles", CASES)
def test_page_ahead_is_bit_identical_and_within_the_float64_gate(case, tiles):
    from spak.core.metrics import gate_for, rel_l2
    from spak.cpu.simrun_decode import simulate_decode
    from spak.families.fmha_decode import FAMILY
    p = FAMILY.parse(case)
    inp = FAMILY.make_inputs(p, seed=11)
    assert inp["block_table"] is not None
    ref = FAMILY.reference(p, inp)["out"]
    got, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits,
                             tiles={**tiles, "PAGE_AHEAD": 1})
    base, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits,
                              tiles={**tiles, "PAGE_AHEAD": 0})
    assert np.isfinite(got).all()
    assert rel_l2(got, ref) <= gate_for(p.dtype)
    assert np.array_equal(_bits(got), _bits(base))


def _arrays(page):
    B, Sq, Hq, Hkv, D = 1, 1, 8, 2, 64
    q = np.ones((B, Sq, Hq, D), np.float16)
    if page:
        k = np.ones((4, page, Hkv, D), np.float16)
        bt = np.arange(4, dtype=np.int32).reshape(1, 4)
    else:
        k, bt = np.ones((B, 64, Hkv, D), np.float16), None
    out = np.zeros((B, Sq, Hq, D), np.float16)
    return (q, k, k, np.full((B,), 40, np.int32), out), bt


def test_page_ahead_reaches_the_kernel_only_for_paged_caches():
    """The kernel's AHEAD argument (the last) follows tiles["PAGE_AHEAD"] on a paged cache;
    a contiguous cache has no page ids, so its plan keeps the one variant either way."""
    args, bt = _arrays(16)
    on = plan_decode(*args, block_table=bt, num_splits=2, tiles={"PAGE_AHEAD": 1})
    off = plan_decode(*args, block_table=bt, num_splits=2, tiles={"PAGE_AHEAD": 0})
    assert on[0].args[-1] is True and off[0].args[-1] is False
    args, _ = _arrays(0)
    assert plan_decode(*args, num_splits=2, tiles={"PAGE_AHEAD": 1})[0].args[-1] is False


@pytest.mark.parametrize("bad", [2, -2])
def test_bad_page_ahead_names_the_key(bad):
    args, bt = _arrays(16)
    with pytest.raises(ValueError, match=r"tiles\['PAGE_AHEAD'\]"):
        plan_decode(*args, block_table=bt, tiles={"PAGE_AHEAD": bad})


def test_api_refuses_bad_page_ahead():
    torch = pytest.importorskip("torch")
    from spak.kvcache import validate
    q = torch.zeros(1, 1, 8, 64, dtype=torch.float16)
    k = torch.zeros(1, 16, 2, 64, dtype=torch.float16)
    lens = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="PAGE_AHEAD"):
        validate(q, k, k, lens, tiles={"PAGE_AHEAD": 2}, require_cuda=False)
    for ok in (-1, 0, 1):
        validate(q, k, k, lens, tiles={"PAGE_AHEAD": ok}, require_cuda=False)


def test_default_chooses_by_page_and_form():
    """AHEAD_AUTO (the default): ahead where a tile lies in one page, and for gathered
    tiles in the keys_vt form (results/decode-paged-h200-2026-11-27 run 1)."""
    from spak.gpu.plan_decode import AHEAD_AUTO, choose_page_ahead
    assert default_decode_tiles(128)["PAGE_AHEAD"] == AHEAD_AUTO
    assert choose_page_ahead(256, 128, 0) and choose_page_ahead(128, 128, 2)
    assert choose_page_ahead(16, 128, 2) and not choose_page_ahead(16, 128, 0)
    assert choose_page_ahead(16, 128, 0, page_mode=0) and not choose_page_ahead(0, 128, 2)
    args, bt = _arrays(16)                     # 8 query heads of 2 kv heads: rows form
    assert plan_decode(*args, block_table=bt, num_splits=2)[0].args[-1] is False
    assert plan_decode(*args, block_table=bt, num_splits=2,
                       tiles={"KT_FORM": 2})[0].args[-1] is True
    args, bt = _arrays(64)
    assert plan_decode(*args, block_table=bt, num_splits=2,
                       tiles={"TILE_N": 64})[0].args[-1] is True


@pytest.mark.parametrize("case", [
    "2x32:1x600x64/noncausal/page256/lens=600:129/fp16",    # one page a tile: rows form
    "2x32:1x300x64/noncausal/page16/lens=300:17/fp16",      # gathered tiles: keys_vt
    "2x8:2x3:400x64/causal/page128/lens=400:1/fp16"])       # GQA, Sq 3, a tile a page
def test_fmha_kvcache_page_ahead_end_to_end(cpu_launch, case):
    """spak.fmha_kvcache, the function users call, with its launch run on the simulator:
    the default (look-ahead where choose_page_ahead says so), PAGE_AHEAD 1 and 0 agree to
    the bit and meet the float64 gate, several splits, ragged lengths."""
    torch = pytest.importorskip("torch")
    import spak
    from spak.core.metrics import gate_for, rel_l2
    from spak.families.fmha_decode import FAMILY
    p = FAMILY.parse(case)
    x = FAMILY.make_inputs(p, seed=9)
    t = {k: None if v is None else torch.from_numpy(v) for k, v in x.items()}
    ref = FAMILY.reference(p, x)["out"]
    outs = [spak.fmha_kvcache(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],
                              block_table=t["block_table"], is_causal=p.causal, num_splits=3,
                              tiles=tiles)
            for tiles in (None, {"PAGE_AHEAD": 1}, {"PAGE_AHEAD": 0})]
    for out in outs:
        assert torch.isfinite(out).all()
        assert rel_l2(out.numpy(), ref) <= gate_for(p.dtype)
        assert torch.equal(out, outs[0])

