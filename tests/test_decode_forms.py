"""The split kernel's keys-in-M forms (tiles["KT_FORM"] 1 and 2: S^T = K Q^T, issue 18) on
the simulator against float64: MQA Sq 1 and 4 (tiled and per-step row sums), 16-key pages
(gathered and boxes), ragged lengths with 0 and 1; and the plan's knob validation."""
import numpy as np
import pytest

from spak.core.metrics import rel_l2
from spak.cpu.simrun_decode import simulate_decode
from spak.families.fmha_decode import FAMILY
from spak.gpu.plan_decode import KT_AUTO, choose_kt_form, default_decode_tiles, plan_decode

CASES = [
    ("2x32:1x300x64/page16/lens=300:1/splits=3/fp16", {}),
    ("3x32:1x4:200x64/causal/page16/lens=0:200:77/splits=2/bf16", {}),
    ("1x32:1x8:150x64/causal/splits=2/fp16", {}),                  # 64 rows: per-step sums
    ("2x8:1x4:77x64/causal/page16/lens=77:5/splits=3/fp16", {"PAGE_MODE": 0}),
    ("2x16:2x4:140x128/causal/lens=140:9/fp16", {"TILE_N": 64}),
]


@pytest.mark.parametrize("form", [1, 2])
@pytest.mark.parametrize("case,tiles", CASES)
def test_keys_forms_match_float64(case, tiles, form):
    p = FAMILY.parse(case)
    inp = FAMILY.make_inputs(p, seed=3)
    ref = FAMILY.reference(p, inp)["out"]
    out, reports = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits,
                                   tiles={**tiles, "KT_FORM": form})
    assert not np.isnan(out).any()
    assert rel_l2(out, ref) <= FAMILY.gate(p)
    # the test can fail: a wrong scale would be far outside the gate
    assert rel_l2(out, ref * 1.01) > FAMILY.gate(p)


def test_forms_plan_the_same_grid_and_pass_the_form():
    p = FAMILY.parse("2x32:1x4:200x64/causal/page16/fp16")
    inp = FAMILY.make_inputs(p)
    out = np.zeros((2, 4, 32, 64), np.float16)
    args = (inp["q"], inp["k_cache"], inp["v_cache"], inp["cache_seqlens"], out)
    plans = {f: plan_decode(*args, block_table=inp["block_table"], causal=True, num_splits=2,
                            tiles={"KT_FORM": f}) for f in (0, 1, 2)}
    assert {tuple(L.grid for L in v) for v in plans.values()} == {
        tuple(L.grid for L in plans[0])}
    # the split kernel's arguments end (..., KT_FORM, LAT, AHEAD)
    assert [v[0].args[-3] for v in plans.values()] == [0, 1, 2]
    auto = plan_decode(*args, block_table=inp["block_table"], causal=True, num_splits=2)
    assert auto[0].args[-3] == choose_kt_form(32, 1, 4, 16, 128)
    assert default_decode_tiles(64)["KT_FORM"] == KT_AUTO


@pytest.mark.parametrize("bad", [3, -2])
def test_bad_kt_form_names_the_key(bad):
    p = FAMILY.parse("1x8:1x40x64/fp16")
    inp = FAMILY.make_inputs(p)
    with pytest.raises(ValueError, match="KT_FORM"):
        plan_decode(inp["q"], inp["k_cache"], inp["v_cache"], inp["cache_seqlens"],
                    np.zeros((1, 1, 8, 64), np.float16), tiles={"KT_FORM": bad})


def test_auto_form_rule():
    """keys_vt for MQA-like groups (16+ heads a kv head) at Sq 1 over a paged cache of
    pages smaller than a key tile (H100, results/decode-h100-2026-11-24c; H200,
    results/decode-paged-h200-2026-11-27 run 2); rows elsewhere."""
    assert choose_kt_form(32, 1, 1, 16, 128) == 2
    assert choose_kt_form(32, 1, 1, 256, 128) == 0          # a tile inside one page
    assert choose_kt_form(32, 1, 1, 128, 128) == 0
    assert choose_kt_form(32, 1, 1, 64, 128) == 2           # gathered
    assert choose_kt_form(32, 2, 1, 16, 128) == 2
    assert choose_kt_form(32, 1, 1, 0, 128) == 0           # contiguous
    assert choose_kt_form(32, 1, 4, 16, 128) == 0           # Sq 4
    assert choose_kt_form(32, 8, 1, 16, 128) == 0           # GQA 4:1


@pytest.fixture
def sim_launch(monkeypatch):
    """cuTile's launch (through spak.gpu.launch) runs in the CPU simulator on the tensors'
    memory (as in tests/test_decode.py)."""
    import types
    import torch
    from spak import sim
    import spak.gpu.launch as gl

    def launch(stream, grid, kernel, args):
        sim.launch(kernel, grid, [sim.SimArray(a.numpy()) if isinstance(a, torch.Tensor)
                                  else a for a in args])
    monkeypatch.setattr(gl, "ct", types.SimpleNamespace(launch=launch))
    monkeypatch.setattr(gl, "current_raw_stream", lambda *a: 0)


@pytest.mark.parametrize("kernel,config", [
    ("splitkv", {"TILE_N": 64, "MAX_ROWS": 32, "num_splits": 0, "KT_FORM": 2}),
    ("splitkv_keys", {"TILE_N": 64, "MAX_ROWS": 32, "num_splits": 3})])
def test_sweep_pieces_check_a_keys_form_config(sim_launch, kernel, config):
    """What the sweep worker does with a config of the [sweep.sm_90] space (KT_FORM a
    knob, or pinned by the kernel name): the family's call, checked against its peer
    reference (float64; None made the H100 sweep fail every job)."""
    import torch
    from spak.device.checks import rel_l2 as t_rel_l2
    from spak.tune.worker import check_threshold
    p = FAMILY.parse("2x32:1x150x64/page16/lens=150:33/fp16")
    x = FAMILY.gpu_inputs(p, 0, 0, "cpu")
    ref = FAMILY.peer_reference(p, x)
    assert ref is not None and ref["out"].dtype == torch.float64
    call = FAMILY.gpu_call(kernel, p, x, config)
    assert call.launches[0].args[-3] in (1, 2)                # a keys form was planned
    call()
    err = t_rel_l2(call.outputs["out"].float(), ref["out"])
    assert err <= check_threshold(FAMILY, p)
    assert t_rel_l2(call.outputs["out"].float() * 1.01, ref["out"]) > FAMILY.gate(p)


def test_sweep_worker_runs_a_decode_job_on_shared_workspaces(sim_launch, monkeypatch):
    """The sweep worker itself (spak.tune.worker.GpuRunner) on a decode job: its input sets
    share one allocator (spak.device.calls.shared_alloc), which hands the same tensor to
    two requests of one shape unless the plan's requests go through `distinct`: the split
    kernel's running max and sum aliased, and every config of the H100's first decode sweep
    was a wrong result (results/decode-h100-2026-11-24c). A peer that does not compute the
    problem (SDPA on a paged cache) is 'unsupported', not a KeyError."""
    import types
    import torch
    import spak.gpu.launch as gl
    from tests.helpers_gpu_loop import cpu_sweep_runner
    r = cpu_sweep_runner(monkeypatch, torch, l2_bytes=1 << 10)
    r.ct = types.SimpleNamespace(launch=lambda stream, grid, kernel, args:
                                 gl.ct.launch(stream, grid, kernel, args))
    case = "2x4:1x150x64/page16/lens=150:33/splits=3/fp16"
    job = {"family": "fmha_decode", "kernel": "splitkv", "case": case,
           "provider": "spak-splitkv", "config_id": "x", "flops": 1.0,
           "config": {"TILE_N": 64, "MAX_ROWS": 32, "num_splits": 3}}
    res = r.run(job)
    assert res["status"] == "ok", res.get("error")
    assert res["rel_l2_vs_sdpa"] < 2e-3 and res["ms_median"] > 0
    peer = r.run({**job, "provider": "sdpa-cudnn", "config": None})
    assert peer["status"] == "unsupported" and "sdpa-cudnn" in peer["error"]
