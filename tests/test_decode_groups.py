"""GQA groups that no power of two divides (issue 33): the group is covered by
cdiv(group, GT) tiles of GT (a power of two) heads, the last one padded with masked rows
(tiles["GROUP_PAD"] 1, the default), so each kv head's K/V is read once per tile, not once
per power-of-two piece. On the simulator against float64: groups 5, 7, 12 and 71 (Falcon-7B's
MQA: two tiles of 64 heads), contiguous and paged caches, Sq 1 and 3, ragged lengths with 0
and 1, the three KT forms; the padded rows never reach the output (bit-identical to the
former tiling where both split the keys alike)."""
import numpy as np
import pytest

from spak.core.metrics import rel_l2
from spak.cpu.simrun_decode import simulate_decode
from spak.families.fmha_decode import FAMILY
from spak.gpu.plan_decode import head_tiles, plan_decode, row_tiles

# the family's "groups" set: B x Hq:Hkv x [Sq:]Sk x D, small enough for CI
CASES = FAMILY.shape_sets["groups"]


def _run(case, tiles=None, seed=5):
    p = FAMILY.parse(case)
    inp = FAMILY.make_inputs(p, seed=seed)
    out, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits,
                             tiles=tiles)
    return p, inp, out


@pytest.mark.parametrize("form", [0, 1, 2])
@pytest.mark.parametrize("case", CASES)
def test_groups_match_float64(case, form):
    p, inp, out = _run(case, {"KT_FORM": form})
    ref = FAMILY.reference(p, inp)["out"]
    assert not np.isnan(out).any()              # every row of every head written
    assert rel_l2(out, ref) <= FAMILY.gate(p)
    assert rel_l2(out, ref * 1.01) > FAMILY.gate(p)       # the check can fail


@pytest.mark.parametrize("case", ["2x14:2x70x64/fp16/lens=70:1/splits=2",
                                  "1x24:2x3:60x32/page16/bf16/splits=3"])
def test_padded_rows_leave_every_real_row_bitwise_unchanged(case):
    """Non-causal with the split count pinned, each row's arithmetic is the same in a padded
    tile of 8/16 heads as in the former tiles of 1/4: the outputs agree bit for bit."""
    _, _, padded = _run(case)
    _, _, pow2 = _run(case, {"GROUP_PAD": 0})
    assert np.array_equal(padded.view(np.uint16) if padded.dtype == np.float16 else
                          padded.view(np.uint32),
                          pow2.view(np.uint16) if pow2.dtype == np.float16 else
                          pow2.view(np.uint32))


@pytest.mark.parametrize("hq,hkv,sq,gt,tiles_per_kv,old_per_kv", [
    (28, 4, 1, 8, 1, 7),        # Qwen2.5-7B: group 7, one tile instead of seven
    (40, 8, 1, 8, 1, 5),        # Qwen2.5-14B: group 5
    (96, 8, 1, 16, 1, 3),       # Mistral-Large style: group 12 (former tiles of 4)
    (71, 1, 1, 64, 2, 71),      # Falcon-7B MQA: two tiles of 64 instead of 71 of 1
    (32, 8, 1, 4, 1, 1),        # a power of two: unchanged
])
def test_k_v_read_once_per_tile(hq, hkv, sq, gt, tiles_per_kv, old_per_kv):
    """The split kernel's grid: one block per (head tile, query tile, split, batch), each
    reading its kv head's K/V; tiles of a kv head = cdiv(group, GT)."""
    assert row_tiles(hq, hkv, sq, 64)[0] == gt
    assert head_tiles(hq, hkv, gt) == hkv * tiles_per_kv
    old_gt = row_tiles(hq, hkv, sq, 64, pad=False)[0]
    assert head_tiles(hq, hkv, old_gt) == hkv * old_per_kv
    q = np.zeros((1, sq, hq, 64), np.float16)
    k = np.zeros((1, 256, hkv, 64), np.float16)
    lens = np.full(1, 256, np.int32)
    out = np.zeros((1, sq, hq, 64), np.float16)
    (split, *_) = plan_decode(q, k, k, lens, out, num_splits=1)
    assert split.grid == (hkv * tiles_per_kv, 1, 1)
    padded = (hq // hkv) % gt != 0
    assert split.args[-4] is padded     # PAD: the args end (..., PAD, KT_FORM, LAT, AHEAD)


def test_group_pad_knob_is_checked():
    q = np.zeros((1, 1, 7, 64), np.float16)
    k = np.zeros((1, 64, 1, 64), np.float16)
    with pytest.raises(ValueError, match="GROUP_PAD"):
        plan_decode(q, k, k, np.full(1, 64, np.int32), np.zeros_like(q),
                    tiles={"GROUP_PAD": 2})


def test_kvcache_backward_says_inference_only():
    """An input that requires grad: the forward runs, a backward gets SPAK's own error
    (spak.kvcache.INFERENCE_ONLY), not torch's "no autograd formula was registered"."""
    import torch
    import spak.kvcache as kv
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(2, 1, 8, 64, dtype=torch.float16, requires_grad=True)
        k = torch.empty(2, 16, 2, 64, dtype=torch.float16)
        out = torch.ops.spak.fmha_kvcache(q, k, k, torch.zeros(2, dtype=torch.int32), None,
                                          False, 0.125, 0, 128, 64, 1, 0, -1, 0, 0)
        assert out.requires_grad
        with pytest.raises(RuntimeError, match="inference only"):
            out.float().sum().backward()
    assert "inference only" in kv.INFERENCE_ONLY


@pytest.mark.parametrize("whole", [False, True])
def test_varlen_bad_offsets_stay_inside_the_tensors(whole):
    """cu_seqlens past the packed length, decreasing, or with runs longer than max_seqlen:
    the varlen kernel clamps them on the device, so the simulator (which raises for a
    box outside an array beyond its padding, and for an element two blocks write) runs it
    through; a good run beside them is still right."""
    from spak import sim
    import cuda.tile as ct
    from spak.gpu.plan_decode import plan_varlen
    from spak.attention.kvcache_ref import varlen_attention_f64
    rng = np.random.default_rng(7)
    B, max_q = 2, 64
    total = B * max_q if whole else 100           # whole: the WHOLE form (no ragged paths)
    q, k, v = (rng.standard_normal((total, 4, 64)).astype(np.float16) for _ in range(3))
    cu_q = np.array([0, 64, 300], np.int32)       # ends past the packed length
    cu_k = np.array([0, 64, 20], np.int32)        # decreases
    out = np.full((total, 4, 64), np.nan, np.float16)
    arrs = [sim.SimArray(x.copy(), ct.float16) for x in (q, k, v)]
    o = sim.SimArray(out, ct.float16)
    (L,) = plan_varlen(*arrs, cu_q, cu_k, o, max_seqlen_q=max_q, max_seqlen_k=max_q,
                       tiles={"TILE_M": 64, "TILE_N": 64})
    assert L.args[-1] is whole
    sim.launch(L.kernel, L.grid, L.args)
    ref = varlen_attention_f64(q[:64], k[:64], v[:64], np.array([0, 64], np.int32),
                               np.array([0, 64], np.int32), causal=False)
    assert rel_l2(o.data[:64], ref) <= 1e-3       # sequence 0 is well formed


def test_check_cu_seqlens_names_the_problem():
    from spak.varlen import check_cu_seqlens
    check_cu_seqlens([0, 30, 40], [0, 50, 60], 40, 60, 30, 50)          # good: no error
    for args, words in [(([3, 40], [0, 60], 40, 60, 64, 64), "cu_seqlens_q must start at 0"),
                        (([0, 40], [0, 50, 20], 40, 20, 64, 64), "must not decrease"),
                        (([0, 70], [0, 60], 40, 60, 80, 64), "end at the packed length 40"),
                        (([0, 40], [0, 60], 40, 60, 64, 50), "more than max_seqlen \\(50\\)")]:
        with pytest.raises(ValueError, match=words):
            check_cu_seqlens(*args)


def test_model_sets_and_qualifiers():
    """`--shapes models`: every model of decode_models.MODELS, every layout and both
    length patterns and query counts, K+V within MAX_KV_BYTES, each row naming its model;
    models-small covers every group size; `ragged` and `model=` round-trip."""
    from spak.families.decode_models import MAX_KV_BYTES, MODELS, ragged_lens
    ps = FAMILY.select(["models"], dtype="fp16")
    assert {p.model for p in ps} == set(MODELS)
    assert {p.page for p in ps} == {0, 16, 64, 256} and {p.Sq for p in ps} == {1, 4}
    assert {p.ragged for p in ps} == {False, True}
    assert all(p.B * p.Sk * p.Hkv * 4 * p.D <= MAX_KV_BYTES for p in ps)
    assert all((p.Hq, p.Hkv, p.D) == MODELS[p.model] for p in ps)
    assert all(p.causal == (p.Sq > 1) for p in ps)
    small = FAMILY.select(["models-small"], dtype="fp16")
    assert {p.Hq // p.Hkv for p in small} >= {1, 2, 4, 5, 6, 7, 8, 12, 16, 71}
    assert {p.D for p in small} == {64, 96, 128, 256}
    p = FAMILY.parse("3x28:4x1000x128/page16/ragged/model=qwen2.5-7b")
    assert p.seq_lens == ragged_lens(3, 1000) and p.seq_lens[0] == 1000
    assert all(250 <= n <= 1000 for n in ragged_lens(64, 1000))
    assert FAMILY.parse(p.case_id) == p and "model=qwen2.5-7b" in p.display


def test_gate_slice_and_pages_sets():
    """models-gate: one shape of `models` per model, half in the form SDPA and TileGym
    compute (contiguous, full, Sq 1), the other half covering all seven other variants;
    models-pages: each shape contiguous and in 16/64/256-key pages, nothing else differing."""
    from spak.families.decode_models import MODELS
    full = {p.case_id for p in FAMILY.select(["models"], dtype="fp16")}
    gate = FAMILY.select(["models-gate"], dtype="fp16")
    assert [p.model for p in gate] == list(MODELS)
    assert all(p.case_id in full for p in gate)
    plain = [p for p in gate if not p.page and not p.ragged and p.Sq == 1]
    assert len(plain) == len(MODELS) // 2
    assert {(p.page, p.ragged, p.Sq) for p in gate if p not in plain} == {
        (16, True, 1), (64, False, 4), (256, True, 1), (0, True, 4), (256, False, 1),
        (16, False, 4), (64, True, 1)}
    pages = FAMILY.select(["models-pages"], dtype="fp16")
    by = {}
    for p in pages:
        by.setdefault((p.model, p.B, p.Hq, p.Hkv, p.Sk, p.D, p.Sq, p.ragged), set()).add(p.page)
    assert len(by) >= 2 and all(v == {0, 16, 64, 256} for v in by.values())


def test_gate_plan_tool_plans_every_case_and_notes_missing_peers():
    """tools/decode_gate_plan.py on the gate slice: every case planned on stand-ins, the
    same-size copy on every case, SDPA on exactly the contiguous full Sq-1 cases and a
    note saying why everywhere else."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "tools" / "decode_gate_plan.py"
    spec = importlib.util.spec_from_file_location("decode_gate_plan", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    rows = tool.survey(["models-gate"], "fp16", sim=False)
    assert len(rows) == 20 and not any("plan_error" in r for r in rows)
    assert all(r["launches"] and "copy" in r["peers"] for r in rows)
    for r in rows:
        plain = r["layout"] == "contiguous" and not r["ragged"] and r["Sq"] == 1
        assert ("sdpa-cudnn" in r["peers"]) == plain
        assert plain or "no form" in r["peer_notes"]["sdpa"]
    assert all(r["est_s"] >= r["est_warm_s"] > 0 for r in rows)
    # a ragged contiguous cache (lens None, shorter sequences): no SDPA, no TileGym (they
    # read the NaN past each length: H200 2026-11-28, phi3-mini, 21504 NaN outputs)
    [r] = tool.survey(["8x32x4096x96/ragged/model=phi3-mini"], "fp16", sim=False)
    assert r["peers"] == ["copy"] and {"sdpa", "tilegym"} <= set(r["peer_notes"])


def test_spak_run_without_shapes_takes_the_family_sets(capsys):
    from spak.cli import main
    assert main(["run", "--family", "fmha_decode", "--list"]) == 0
    out = capsys.readouterr().out.split()
    assert len(out) == len(FAMILY.shape_sets["models-small"])
    assert any("model=falcon-7b" in line for line in out)


def _split_plan(launch):
    """(grid, the split kernel's constants: scale, tile widths, SQ_T, GT, TILE_N, page,
    mode, SPLIT, causal, PAD, KT_FORM, LAT, AHEAD) of a plan's first launch; the one-split
    kernel (no workspaces, no SPLIT parameter: issue 34) read as the split kernel's."""
    if len(launch.args) == 19:              # decode_one_kernel: 6 arrays, SPLIT False
        return launch.grid[1], launch.args[6:14] + (False,) + launch.args[14:]
    return launch.grid[1], launch.args[9:]


@pytest.mark.parametrize("case", [
    "4x28:4x4096x64/fp16/model=qwen2.5-7b",           # group 7: pow2 GT 1, padded GT 8
    "2x48:4x2048x64/page64/bf16",                     # group 12 paged
    "2x71:1x3:1024x32/causal/fp16"])                  # Falcon-7B's 71 at Sq 3
@pytest.mark.parametrize("kernel", FAMILY.kernels)
def test_sim_slice_plans_what_the_gpu_call_planned(case, kernel):
    """`spak run`'s agreement check re-plans a slice (batch 0, kv head 0's heads) on the
    simulator: its split count and every constant of the split kernel (GT, SQ_T, PAD,
    KT_FORM...) must be the GPU call's, or the combine sums in another order. The H200 run
    of 2026-11-28 had splitkv_pow2 at 50-68% bit-identical on every non-power-of-two group:
    the slice counted splits with GROUP_PAD 1 (8 for Qwen2.5-7B) while the GPU call pinned
    GROUP_PAD 0 (1 split). No launch runs here: plans only."""
    torch = pytest.importorskip("torch")
    from spak.gpu.plan_decode import plan_decode
    p = FAMILY.parse(case)
    x = FAMILY.gpu_inputs(p, 0, 0, "cpu")
    config = FAMILY.gpu_config(kernel, p, "cpu")
    call = FAMILY.gpu_call(kernel, p, x, config)
    sl = FAMILY.sim_slice(kernel, p, x, call.outputs, config, work=1 << 22)
    si = sl.inputs
    tiles = {k: v for k, v in (sl.tiles or {}).items()}
    # as FAMILY.simulate plans it (the kernel's pinned knobs over the slice's tiles)
    from spak.families.fmha_decode import _form_tiles
    out = np.zeros(si["q"].shape, np.float16)
    sim_plan = plan_decode(si["q"].astype(np.float16), si["k_cache"].astype(np.float16),
                           si["v_cache"].astype(np.float16), si["cache_seqlens"], out,
                           block_table=si["block_table"], causal=p.causal,
                           num_splits=sl.problem.splits, tiles=_form_tiles(kernel, tiles))
    gpu_splits, gpu_consts = _split_plan(call.launches[0])
    sim_splits, sim_consts = _split_plan(sim_plan[0])
    assert sim_splits == gpu_splits, (kernel, sl.text)
    pad = 10                                            # PAD's place in the constants
    assert sim_consts[:pad] + sim_consts[pad + 1:] == gpu_consts[:pad] + gpu_consts[pad + 1:]
    assert len(sim_plan) == len(call.launches)          # a combine in both or in neither
    gt = gpu_consts[4]
    if sl.problem.Hq == p.Hq // p.Hkv:                  # kv head 0's whole group
        assert sim_consts[pad] == gpu_consts[pad]
    else:                       # cut to whole tiles of GT heads: the same rows, no padding
        assert sl.problem.Hq % gt == 0 and sim_consts[pad] is False
    assert call.tiles["GROUP_PAD"] == (0 if kernel == "splitkv_pow2" else 1)
    assert config["GROUP_PAD"] == call.tiles["GROUP_PAD"]      # the row names the form run


@pytest.mark.parametrize("form", [0, 1])
def test_padding_rows_data_never_reaches_kv_head_0s_outputs(form):
    """A padded tile's extra rows read the next group's queries on the GPU, zeros in the
    agreement slice (kv head 0 alone): the simulator's outputs for kv head 0's heads must
    not depend on which (the rows form, KT_FORM 0, and the keys form)."""
    rng = np.random.default_rng(3)
    g, sk, d = 7, 512, 64
    q = rng.standard_normal((1, 1, 2 * g, d)).astype(np.float16)
    k, v = (rng.standard_normal((1, sk, 2, d)).astype(np.float16) for _ in range(2))
    lens = np.array([sk], np.int32)
    tiles = {"KT_FORM": form}
    both, _ = simulate_decode({"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": lens,
                               "block_table": None}, num_splits=2, tiles=tiles)
    alone, _ = simulate_decode({"q": q[:, :, :g].copy(), "k_cache": k[:, :, :1].copy(),
                                "v_cache": v[:, :, :1].copy(), "cache_seqlens": lens,
                                "block_table": None}, num_splits=2, tiles=tiles)
    assert not np.isnan(alone).any()
    assert np.array_equal(both[:, :, :g].view(np.uint16), alone.view(np.uint16))
