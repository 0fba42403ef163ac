"""Decode attention over a KV cache (issue 18): the split-KV kernels on the simulator against
float64, the planner's and the PyTorch API's input checks, the family's grammar, and the
float64 reference against the FMHA one. All CPU; the GPU tests are in test_decode_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from spak.attention.kvcache_ref import decode_attention_f64
from spak.core.errors import ShapeError
from spak.core.metrics import rel_l2
from spak.cpu.simrun_decode import simulate_decode
from spak.families.fmha_decode import FAMILY, DecodeProblem, make_inputs, parse_problem

# Odd cases, each well under a second on the simulator. Cache slots past a sequence's
# length are NaN and table entries past its pages are -1 (make_inputs): reading one fails.
SIM_CASES = [
    "2x16:2x100x64/lens=100:37/splits=2",                  # GQA 8:1, ragged
    "2x8:2x4:70x128/causal/lens=70:4/splits=3",            # GQA 4:1, Sq=4, D=128
    "3x8:1x90x64/page16/lens=1:90:0",                      # MQA, lengths 1 and 0
    "2x4x4:100x64/causal/page16/lens=100:3/splits=2",      # MHA, Sq=4 > a length
    "2x8:2x120x128/page64/lens=120:65/splits=2",           # 64-key pages, mid-page end
    "1x12:2x2:40x64/causal/page16/splits=2",               # group of 6: a padded tile
    "3x8:2x20:30x64/causal/qlens=20:0:1/lens=30:5:0",      # varlen prefill, packed
]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", SIM_CASES)
def test_simulator_matches_float64(case, dtype):
    p = parse_problem(case).__class__(**{**parse_problem(case).__dict__, "dtype": dtype})
    row = FAMILY.sim_case("splitkv", p)
    assert row["nonfinite"] == 0, row
    assert row["rel_l2"] <= row["gate"], row
    assert row["passed"]


def test_split_counts_agree_and_runs_are_bitwise_identical():
    p = parse_problem("2x8:2x3:300x64/causal/page16/lens=300:129")
    inp = make_inputs(p, seed=3)
    ref = FAMILY.reference(p, inp)["out"]
    outs = {}
    for splits in (1, 2, 5):
        outs[splits], _ = simulate_decode(inp, causal=True, num_splits=splits,
                                          tiles={"TILE_N": 32})
        assert rel_l2(outs[splits], ref) <= 1e-3
    again, _ = simulate_decode(inp, causal=True, num_splits=5, tiles={"TILE_N": 32})
    assert np.array_equal(again.view(np.uint16), outs[5].view(np.uint16))


def test_gate_can_fail():
    """The comparison notices a wrong answer: the causal output against the non-causal
    reference, and a length-0 sequence must be exactly zero."""
    p = parse_problem("2x8:2x4:64x64/causal/lens=64:0/splits=2")
    inp = make_inputs(p)
    out, _ = simulate_decode(inp, causal=True, num_splits=2)
    wrong = decode_attention_f64(inp["q"], inp["k_cache"], inp["v_cache"],
                                 inp["cache_seqlens"], causal=False)
    assert rel_l2(out, wrong) > 1e-2
    assert not out[1].any()


def test_reference_matches_fmha_reference():
    """The KV-cache reference against spak.attention.reference (another implementation):
    full-length contiguous cache, GQA, causal bottom-right; and the paged layout of the
    same keys gives the same answer."""
    from spak.attention.reference import attention_f64
    rng = np.random.default_rng(7)
    B, Sq, Hq, Hkv, Sk, D = 2, 3, 8, 2, 40, 16
    q = rng.standard_normal((B, Sq, Hq, D))
    k = rng.standard_normal((B, Sk, Hkv, D))
    v = rng.standard_normal((B, Sk, Hkv, D))
    lens = np.array([Sk, Sk], np.int32)
    got = decode_attention_f64(q, k, v, lens, causal=True)
    want = attention_f64(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
                         v.transpose(0, 2, 1, 3), causal=True).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    page = 8
    table = rng.permutation(B * Sk // page).reshape(B, -1)
    kp, vp = np.empty((B * Sk // page, page, Hkv, D)), np.empty((B * Sk // page, page, Hkv, D))
    kp[table] = k.reshape(B, -1, page, Hkv, D)
    vp[table] = v.reshape(B, -1, page, Hkv, D)
    paged = decode_attention_f64(q, kp, vp, lens, table, causal=True)
    np.testing.assert_allclose(paged, got, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------- the planner

def _arrays(**over):
    a = dict(q=np.zeros((2, 1, 8, 64), np.float16), k=np.zeros((2, 32, 2, 64), np.float16),
             v=np.zeros((2, 32, 2, 64), np.float16), lens=np.zeros(2, np.int32),
             out=np.zeros((2, 1, 8, 64), np.float16), block_table=None)
    a.update(over)
    return a


@pytest.mark.parametrize("over, kw, err, words", [
    (dict(q=np.zeros((2, 8, 64), np.float16)), {}, ValueError, "q must be 4D"),
    (dict(q=np.zeros((2, 1, 6, 64), np.float16), out=np.zeros((2, 1, 6, 64), np.float16),
          k=np.zeros((2, 32, 4, 64), np.float16), v=np.zeros((2, 32, 4, 64), np.float16)),
     {}, ValueError, "multiple of the cache's kv heads"),
    (dict(v=np.zeros((2, 16, 2, 64), np.float16)), {}, ValueError, "k_cache and v_cache"),
    (dict(lens=np.zeros(2, np.int64)), {}, TypeError, "cache_seqlens dtype must be int32"),
    (dict(lens=np.zeros(3, np.int32)), {}, ValueError, "cache_seqlens must have shape"),
    (dict(out=np.zeros((2, 1, 8, 32), np.float16)), {}, ValueError, "out must have shape"),
    (dict(k=np.zeros((2, 32, 2, 64), np.float32), v=np.zeros((2, 32, 2, 64), np.float32)),
     {}, TypeError, "k_cache dtype"),
    (dict(block_table=np.zeros((2, 4), np.int32), k=np.zeros((8, 24, 2, 64), np.float16),
          v=np.zeros((8, 24, 2, 64), np.float16)), {}, ValueError, "power of two >= 16"),
    (dict(block_table=np.zeros((3, 4), np.int32)), {}, ValueError, "block_table must be 2D"),
    ({}, dict(num_splits=0), ValueError, "num_splits"),
    ({}, dict(tiles={"TILE_M": 64}), ValueError, "unknown keys"),
    ({}, dict(tiles={"TILE_N": 48}), ValueError, "power of two"),
    ({}, dict(tiles={"PAGE_MODE": 2}), ValueError, "PAGE_MODE"),
    ({}, dict(tiles={"OCCUPANCY": 5}), ValueError, "OCCUPANCY"),
    ({}, dict(causal=1), TypeError, "causal must be a bool"),
    ({}, dict(scale=float("nan")), ValueError, "scale"),
])
def test_planner_rejects_bad_input(over, kw, err, words):
    from spak.gpu.plan_decode import plan_decode
    a = _arrays(**over)
    with pytest.raises(err, match=words):
        plan_decode(a["q"], a["k"], a["v"], a["lens"], a["out"], block_table=a["block_table"],
                    **kw)


def test_row_tiles_and_split_choice():
    from spak.gpu.plan_decode import MAX_SPLITS, choose_num_splits, row_tiles
    assert row_tiles(32, 8, 1, 64) == (4, 4)        # GQA 4:1: 4 heads x 4 padded rows
    assert row_tiles(32, 32, 1, 64) == (1, 16)      # MHA: rows padded to 16
    assert row_tiles(32, 1, 4, 64) == (32, 2)       # MQA, Sq=4: two query tiles
    assert row_tiles(12, 2, 1, 64) == (8, 2)        # group of 6: one padded tile of 8
    assert row_tiles(12, 2, 1, 64, pad=False) == (2, 8)   # former: 3 tiles of 2 heads
    kw = dict(partial_bytes=32 * 130 * 4)
    # one wave of blocks, rounded down (H100 run 1 of results/decode-h100-2026-11-24d):
    # enough blocks already (64 x 32 heads, 8k keys; or 256 blocks: 3030 vs 2974 GB/s
    # with 2 splits): one split
    assert choose_num_splits(2048, 64, 132, kv_bytes=64 * 32 * 8192 * 512, **kw) == 1
    assert choose_num_splits(256, 64, 132, kv_bytes=8 * 32 * 8192 * 512, **kw) == 1
    # 64 blocks (MQA B = 64, GQA 4:1 B = 8), 8k keys: 2 splits, one wave (2336 vs 2109
    # GB/s with the former 8, four waves)
    assert choose_num_splits(64, 64, 132, kv_bytes=64 * 8192 * 512, **kw) == 2
    # MQA, B = 8 (8 blocks), 32k keys: one full wave of 16 splits (not 66 of 4)
    assert choose_num_splits(8, 256, 132, kv_bytes=8 * 32768 * 512, **kw) == 16
    # MHA, B = 1 (32 blocks), 8k keys: 4 splits (2563 vs 2311 GB/s with 16)
    assert choose_num_splits(32, 64, 132, kv_bytes=32 * 8192 * 512, **kw) == 4
    # 100 blocks: one wave rounded down is one split (no second wave of 68 blocks)
    assert choose_num_splits(100, 64, 132, kv_bytes=100 * 8192 * 512, **kw) == 1
    # MQA, batch 1, 128k keys: one block unsplit; one wave of splits
    assert choose_num_splits(1, 1024, 132, kv_bytes=131072 * 512, **kw) == 132
    # ... at 8k keys the combine's traffic (half the K/V bytes at most) caps it at 63
    assert choose_num_splits(1, 64, 132, kv_bytes=8192 * 512, **kw) == 63
    assert choose_num_splits(1, 256, 132, kv_bytes=32768 * 512, **kw) == 132
    # the combine's traffic (half the K/V bytes at most) caps the count
    assert choose_num_splits(1, 1024, 132, kv_bytes=64 * 130 * 4 * 2 * 32 * 2, **kw) == 64
    assert choose_num_splits(1, 1, 132, kv_bytes=128 * 512, **kw) == 1     # one key tile
    # another GPU's SM count: its own wave
    assert choose_num_splits(8, 256, 48, kv_bytes=8 * 32768 * 512, **kw) == 6
    assert MAX_SPLITS == 256
    # MQA Sq 4, batch 1 (two query tiles: 2 blocks), 128k keys: one wave is 66 splits,
    # just past 64, where the combine's split tile would double: 64 (H100, results/
    # decode-splits-h100-2026-11-27: 1757-1796 GB/s vs 1531 with 66)
    kw4 = dict(partial_bytes=4 * 32 * 130 * 4)
    assert choose_num_splits(2, 1024, 132, kv_bytes=131072 * 512, **kw4) == 64
    assert choose_num_splits(1, 100, 132, kv_bytes=12800 * 512 * 64, **kw) == 64
    assert choose_num_splits(1, 128, 132, kv_bytes=16384 * 512 * 64, **kw) == 128


def test_combine_tiles_halve_the_chunk_from_128_splits():
    """A [128, 64] float32 chunk spills under the combine's occupancy hint on sm_90; the
    tiling keeps 4096 floats a block from 128 splits (results/decode-splits-h100-2026-11-27,
    combine-probe: 1.2-2.4x on the whole call, the same bits)."""
    from spak.gpu.plan_decode import combine_tiles
    assert combine_tiles(2, 128) == (2, 128)
    assert combine_tiles(64, 128) == (64, 128)
    assert combine_tiles(65, 128) == (128, 32)
    assert combine_tiles(132, 128) == (256, 32)
    assert combine_tiles(200, 64) == (256, 32)


def test_occupancy_hint_builds_the_hinted_split_kernel_only():
    """OCCUPANCY swaps the split kernel for its hinted variant (the same source: the
    simulator runs the raw function) and leaves the combine alone; 0 is no hint."""
    from spak.gpu.kernels import decode as dk
    from spak.gpu.plan_decode import plan_decode
    a = _arrays()
    args = (a["q"], a["k"], a["v"], a["lens"], a["out"])
    plain = plan_decode(*args, num_splits=2, tiles={"OCCUPANCY": 0})
    hinted = plan_decode(*args, num_splits=2, tiles={"OCCUPANCY": 2})
    assert plain[0].kernel is dk.decode_split_kernel
    assert hinted[0].kernel is not dk.decode_split_kernel
    assert hinted[0].kernel._compiler_options.occupancy == 2
    assert hinted[1].kernel is plain[1].kernel is dk.decode_combine_kernel


def test_page_modes_are_bitwise_identical_on_the_simulator():
    """Boxes concatenated and one gathered load read the same keys into the same tile:
    the outputs agree to the last bit (both agreed 100% with the H100)."""
    p = parse_problem("2x8:2x4:300x64/causal/page16/lens=300:129")
    inp = make_inputs(p, seed=9)
    outs = [simulate_decode(inp, causal=True, num_splits=3, tiles={"PAGE_MODE": m})[0]
            for m in (0, 1)]
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


# ----------------------------------------------------------------------- the grammar

def test_grammar_round_trip_and_expansion():
    p = parse_problem("2x8:1x4:77x64/causal/page16/lens=77:5/splits=3/bf16")
    assert (p.B, p.Hq, p.Hkv, p.Sq, p.Sk, p.D, p.page, p.lens, p.splits) == \
        (2, 8, 1, 4, 77, 64, 16, (77, 5), 3)
    assert parse_problem(p.case_id) == p
    one = FAMILY.select(["1x32:8x4096x128"])           # Sq = 1: causal changes nothing
    assert [(q.dtype, q.causal) for q in one] == [("fp16", False), ("bf16", False)]
    assert len(FAMILY.select(["1x8x4:64x64"], dtype="fp16")) == 2
    assert FAMILY.select(["default"], dtype="fp16")
    assert isinstance(DecodeProblem(1, 1, 1, 1, 1, 16), DecodeProblem)


def test_varlen_grammar():
    p = parse_problem("3x8:2x40:60x64/causal/qlens=5:0:40/lens=7:3:60")
    assert p.varlen and p.qlens == (5, 0, 40) and parse_problem(p.case_id) == p
    x = FAMILY.make_inputs(p)
    assert x["q"].shape == (45, 8, 64) and list(x["cu_seqlens_k"]) == [0, 7, 10, 70]
    assert FAMILY.bytes_moved(p) == 70 * 2 * 2 * 64 * 2 + 2 * 45 * 8 * 64 * 2
    g = FAMILY.gpu_inputs(p, 0, 0, "cpu")         # the packed layout on the device too
    assert g["q"].shape == (45, 8, 64) and g["cu_seqlens_k"].tolist() == [0, 7, 10, 70]


@pytest.mark.parametrize("text, words", [
    ("1x8x64", "not a decode shape"),
    ("2x8x4:10x64/qlens=5:1", r"qlens must hold B=2 values in \[0, Sq=4\]"),
    ("2x8x4:10x64/qlens=1:1/page16", "no page or splits"),
    ("2x8:3x100x64", "multiple of Hkv"),
    ("2x8x100x64/lens=5", "lens must hold B=2"),
    ("1x8x100x64/lens=101", r"\[0, Sk=100\]"),
    ("1x8x100x64/page24", "power of two >= 16"),
    ("1x8x100x64/sliding", "unknown qualifier"),
    ("1x8x100x64/fp16/bf16", "conflicting"),
])
def test_grammar_errors(text, words):
    with pytest.raises(ShapeError, match=words):
        parse_problem(text)


def test_spak_sim_family_cli(capsys):
    from spak.cli import main
    rc = main(["sim", "--family", "fmha_decode", "--shapes", "2x8:2x40x64/lens=40:9",
               "--dtype", "fp16"])
    assert rc == 0, capsys.readouterr()
    # every kernel of the family: the split kernel as planned, its two keys-in-M forms,
    # the former GQA row tiling (splitkv_pow2) and the plan without issue 33h's rules
    out = capsys.readouterr().out
    assert "5/5 cases passed" in out and "splitkv_keys_vt 1/1" in out
    assert "splitkv_pow2 1/1" in out and "splitkv_prev 1/1" in out


def test_bytes_moved_counts_each_sequence():
    p = parse_problem("2x8:2x100x64/lens=100:0")
    assert FAMILY.bytes_moved(p) == 100 * 2 * 2 * 64 * 2 + 2 * 2 * 1 * 8 * 64 * 2


# ----------------------------------------------------------------------- the API

torch = pytest.importorskip("torch")


def _t(*shape, dtype=None):
    return torch.randn(*shape, dtype=dtype or torch.float16)


@pytest.mark.parametrize("mutate, err, words", [
    (lambda a: a.update(q=np.zeros((2, 1, 8, 64))), TypeError, "q must be a torch.Tensor"),
    (lambda a: a.update(q=_t(2, 8, 64)), ValueError, "q must be 4D"),
    (lambda a: a.update(q=_t(2, 1, 8, 64, dtype=torch.float32)), TypeError, "q dtype"),
    (lambda a: a.update(k=_t(2, 32, 2, 64, dtype=torch.bfloat16)), TypeError, "k_cache dtype"),
    (lambda a: a.update(k=_t(2, 32, 3, 64), v=_t(2, 32, 3, 64)), ValueError, "multiple"),
    (lambda a: a.update(k=_t(2, 64, 2, 32).transpose(1, 3)), ValueError, "contiguous"),
    (lambda a: a.update(lens=torch.zeros(2)), TypeError, "cache_seqlens dtype"),
    (lambda a: a.update(lens=torch.zeros(3, dtype=torch.int32)), ValueError, "cache_seqlens"),
    (lambda a: a.update(lens=-1), ValueError, "cache_seqlens must be >= 0"),
    (lambda a: a.update(bt=torch.zeros(2, 4, dtype=torch.int32), k=_t(8, 24, 2, 64),
                        v=_t(8, 24, 2, 64)), ValueError, "page_size"),
    (lambda a: a.update(bt=torch.zeros(2, 4)), TypeError, "block_table dtype"),
    (lambda a: a.update(kw=dict(is_causal=None)), TypeError, "is_causal"),
    (lambda a: a.update(kw=dict(scale="1")), TypeError, "scale"),
    (lambda a: a.update(kw=dict(num_splits=1000)), ValueError, "num_splits"),
    (lambda a: a.update(kw=dict(tiles={"TILE_N": 100})), ValueError, "tiles"),
    (lambda a: a.update(kw=dict(tiles={"PAGE_MODE": 2})), ValueError, "PAGE_MODE"),
    (lambda a: None, ValueError, "must be CUDA tensors"),
])
def test_api_rejects_bad_input(mutate, err, words):
    import spak
    a = dict(q=_t(2, 1, 8, 64), k=_t(2, 32, 2, 64), v=_t(2, 32, 2, 64),
             lens=torch.tensor([5, 32], dtype=torch.int32), bt=None, kw={})
    mutate(a)
    with pytest.raises(err, match=words):
        spak.fmha_kvcache(a["q"], a["k"], a["v"], a["lens"], block_table=a["bt"], **a["kw"])


def test_custom_op_fake_shape():
    """torch.compile traces the op through its fake implementation: [B, Sq, Hq, Dv]."""
    import spak.kvcache  # noqa: F401 -- registers torch.ops.spak.fmha_kvcache
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v = _t(3, 2, 8, 64), _t(3, 16, 2, 64), _t(3, 16, 2, 32)
        out = torch.ops.spak.fmha_kvcache(q, k, v, torch.zeros(3, dtype=torch.int32), None,
                                          True, 0.125, 0, 128, 64, 1, 0, -1, -1, 0)
    assert tuple(out.shape) == (3, 2, 8, 32) and out.dtype == torch.float16


# ------------------------------------------------------- the GPU loop's methods, on the CPU

@pytest.fixture
def sim_launch(monkeypatch):
    """cuTile's launch (through spak.gpu.launch) runs the kernel in the CPU simulator on
    the tensors' memory, so the family's GpuCall computes real outputs on the CPU."""
    import types
    from spak import sim
    import spak.gpu.launch as gl

    def launch(stream, grid, kernel, args):
        sim.launch(kernel, grid, [sim.SimArray(a.numpy()) if isinstance(a, torch.Tensor)
                                  else a for a in args])
    monkeypatch.setattr(gl, "ct", types.SimpleNamespace(launch=launch))
    monkeypatch.setattr(gl, "current_raw_stream", lambda *a: 0)


@pytest.mark.parametrize("case, kernel, work", [
    ("2x8:2x3:100x64/causal/page16/lens=100:40/fp16", "splitkv", 1 << 29),
    ("2x16:2x90x64/lens=90:7/fp16", "splitkv", 1 << 29),
    # padded GQA tiles (issue 33): a group of 7 (kv head 0's whole group simulated), and
    # 71 heads at Sq 3 cut to one tile of 16 heads by a small work budget
    ("2x14:2x90x64/page16/lens=90:7/fp16", "splitkv", 1 << 29),
    ("2x71:1x3:40x32/causal/lens=40:17/fp16", "splitkv", 1 << 12),
    ("2x14:2x90x64/page16/lens=90:7/fp16", "splitkv_pow2", 1 << 29)])
def test_gpu_loop_methods_on_the_simulator(sim_launch, case, kernel, work):
    from spak.device import agreement
    p = FAMILY.parse(case)
    x = FAMILY.gpu_inputs(p, 0, 0, "cpu")
    assert torch.isnan(x["k_cache"]).any() and not torch.isnan(x["q"]).any()   # dead slots
    config = {**FAMILY.gpu_config(kernel, p, "cpu"), "num_splits": 3}
    call = FAMILY.gpu_call(kernel, p, x, config)
    assert torch.isnan(call.outputs["out"]).all()                              # poisoned
    call()
    row = FAMILY.gpu_check(p, x, call.outputs, FAMILY.gpu_reference(p, x))
    assert row["passed"] and row["nonfinite"] == 0, row
    res = agreement.agreement(FAMILY, kernel, p, x, call.outputs, config, model="sm_90",
                              work=work)
    assert res["fraction_bit_identical"] == 1.0, res
    assert ("kv head 0" in res["slice"]) and res["elements"] > 0
    if p.Hq == 71:                          # cut to one padded tile's heads (GT 16)
        assert "heads 0-15" in res["slice"], res["slice"]


def test_gpu_reference_matches_the_numpy_one():
    p = FAMILY.parse("2x8:2x4:50x64/causal/page16/lens=50:9/fp16")
    x = FAMILY.gpu_inputs(p, 1, 0, "cpu")
    npx = {k: (None if v is None else v.numpy()) for k, v in x.items()}
    want = decode_attention_f64(npx["q"], npx["k_cache"], npx["v_cache"],
                                npx["cache_seqlens"], npx["block_table"], causal=True)
    got = FAMILY.gpu_reference(p, x)["out"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_peers_only_where_sdpa_computes_the_same_function():
    assert set(FAMILY.peer_calls(FAMILY.parse("2x8:2x64x64"), None)) == {
        "sdpa-cudnn", "sdpa-flash", "sdpa-efficient"}
    assert FAMILY.peer_calls(FAMILY.parse("2x8:2x64x64/page16"), None) == {}
    assert FAMILY.peer_calls(FAMILY.parse("2x8:2x4:64x64/causal"), None) == {}
    assert FAMILY.has_gpu_loop()


@pytest.mark.slow
def test_decode_plan_cpu_gates(tmp_path):
    """plans/fmha_decode.toml's CPU gates (simulator vs float64, the checker) pass without a
    GPU; its compiles are `spak compile --plan plans/fmha_decode.toml`'s (CI's plan.sh)."""
    import json
    from spak.cli import main
    assert main(["plan", "plans/fmha_decode.toml", "--no-gpu", "--no-compile", "--out",
                 str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "report.json").read_text())
    passed = {(g["step"], g["metric"]) for g in doc["gates"] if g["status"] == "PASS"}
    assert ("splitkv", "Numerical error (simulator vs float64)") in passed


def test_combine_of_100_splits_matches_float64():
    """65-127 splits: the combine's [128, 32] chunks (two of a 64-wide row), on the
    simulator, against float64; splits past the count read as weight 0."""
    from spak.core.metrics import gate_for, rel_l2
    from spak.cpu.simrun_decode import simulate_decode
    from spak.families.fmha_decode import FAMILY
    p = FAMILY.parse("1x8:1x12800x64/noncausal/lens=12799/splits=100/fp16")
    inp = FAMILY.make_inputs(p, seed=5)
    got, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits)
    assert np.isfinite(got).all()
    assert rel_l2(got, FAMILY.reference(p, inp)["out"]) <= gate_for(p.dtype)


@pytest.mark.parametrize("case", ["3x8:1x90x64/page16/lens=1:90:0/fp16",
                                  "1x32:8x256x64/fp16", "1x28:4x2:64x64/causal/fp16",
                                  "2x8:1x4:60x64/causal/page16/lens=60:9/fp16"])
def test_one_split_kernel_is_the_split_kernels_one_split_block_bit_for_bit(case):
    """Issue 34: a short cache's plan launches decode_one_kernel (no workspace arguments:
    fewer tensors for the host to convert per launch); on the simulator it gives the bits
    of decode_split_kernel with SPLIT False and never-read workspaces, the form it
    replaces, and meets the float64 gate."""
    from spak import sim
    from spak.core.metrics import gate_for
    from spak.gpu.kernels import decode as dk
    from spak.gpu.plan_decode import plan_decode
    p = FAMILY.parse(case)
    x = FAMILY.make_inputs(p, seed=3)
    outs = []
    for old in (False, True):
        out = np.zeros(x["q"].shape[:3] + (x["v_cache"].shape[3],), x["q"].dtype)
        (L,) = plan_decode(x["q"], x["k_cache"], x["v_cache"], x["cache_seqlens"], out,
                           block_table=x.get("block_table"), causal=p.causal, num_sms=132)
        assert L.kernel._annotated_function.pyfunc is dk.decode_one_kernel._annotated_function.pyfunc
        args, kernel = list(L.args), L.kernel
        if old:                 # the former launch: three dummies, SPLIT False
            d = np.zeros((1, 1, 1, 1), np.float32)
            args, kernel = args[:6] + [d, d, d] + args[6:14] + [False] + args[14:], \
                dk.decode_split_kernel
        sim.launch(kernel, L.grid, [sim.SimArray(a) if isinstance(a, np.ndarray) else a
                                    for a in args])
        outs.append(out)
    assert np.isfinite(outs[0].astype(np.float32)).all()
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
    assert rel_l2(outs[0], FAMILY.reference(p, x)["out"]) <= gate_for("fp16")
