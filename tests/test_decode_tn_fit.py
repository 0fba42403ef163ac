"""The rows form's fitted key tile (issue 33h, gpu.plan_decode.fit_tile_n): where sm_90
compiles a gathered paged tile of 128 keys with spills (32 rows over 4+ pages) on a cache
of FIT_MIN_KEYS keys or more, the plan takes 64 keys a step; TN_FIT 0 keeps TILE_N as given. On the simulator:
the fitted plans against float64, and the split count the family's simulator slice counts
(spak.device.decode_gpu.split_count -> planned_splits) equals the plan's grid."""
import numpy as np
import pytest

import spak.gpu.plan_decode as pd
from spak.core.metrics import rel_l2
from spak.cpu.simrun_decode import simulate_decode
from spak.families.fmha_decode import FAMILY


@pytest.mark.parametrize("tn,page,rows,cap,want", [
    (128, 16, 32, 4096, 64),     # Mixtral-8x22B Sq 4: 8 gathered pages, 32 rows (H200: 2.1x)
    (128, 32, 32, 2048, 64),     # 4 pages, 32 rows, the least fitted cache
    (128, 16, 32, 1024, 128),    # Llama-3.1-70B Sq 4 at 1k keys: 64 keys ran slower (H200)
    (128, 16, 32, 2047, 128),
    (128, 64, 32, 4096, 128),    # 2 pages, 32 rows (Qwen2.5-7B Sq 4): 64 keys spill more
    (128, 64, 64, 16384, 128),   # Falcon-7B Sq 4, 64 rows at D 64: 64 keys ran slower (H200)
    (128, 16, 64, 4096, 128),    # 64 rows
    (128, 16, 16, 4096, 128),    # 16 rows: no spill
    (128, 16, 128, 4096, 128),   # 128 rows spill either way
    (128, 0, 32, 4096, 128),     # contiguous
    (128, 128, 32, 4096, 128),   # a page a tile: one box
    (64, 16, 32, 4096, 64),      # already 64
    (256, 16, 32, 4096, 64),
])
def test_fit_rule(tn, page, rows, cap, want):
    assert pd.fit_tile_n(tn, page, rows, cap) == want


def _stand_ins(p):
    """q, k/v cache, lengths, table, out of problem p as spak.device.decode_gpu.decode_gpu_inputs
    shapes them (shape-only stand-ins: the gate's rows are GBs)."""
    from spak.gpu.compile_decode import _Spec
    q = _Spec((p.B, p.Sq, p.Hq, p.D), "float16")
    if p.page:
        per = -(-p.Sk // p.page)
        k, bt = _Spec((p.B * per + 1, p.page, p.Hkv, p.D), "float16"), _Spec((p.B, per), "int32")
    else:
        k, bt = _Spec((p.B, p.Sk, p.Hkv, p.D), "float16"), None
    return q, k, _Spec((p.B,), "int32"), bt


def _launch_tn(case, tiles=None):
    """(the split kernel's TILE_N, its split count, the problem) as planned."""
    p = FAMILY.parse(case)
    q, k, lens, bt = _stand_ins(p)
    ls = pd.plan_decode(q, k, k, lens, q, block_table=bt, causal=p.causal, tiles=tiles,
                        num_splits=p.splits, alloc=lambda s, kind: type(q)(tuple(s), kind))
    return ls[0].args[11 if ls[0].name == "decode" else 14], ls[0].grid[1], p


@pytest.mark.parametrize("case,tn", [
    ("32x48:8x4:4096x128/causal/page16", 64),       # Mixtral-8x22B's gate row
    ("128x71:1x4:16384x64/causal/page64", 128),     # Falcon-7B's: left (64 ran slower)
    ("8x64:8x4:1024x128/causal/page16", 128),       # Llama-3.1-70B Sq 4: 1k keys, left
    ("128x28:4x4:1024x128/causal/page64", 128),     # Qwen2.5-7B's: left at 128
    ("8x32:8x4:4096x128/causal/page16", 128),       # group 4, 16 rows
    ("4x64:8x4:65536x128/causal", 128),             # contiguous
    ("128x56:8x16384x128", 128),                    # Yi-34B: 2^31 elements, batch ranges
    ("40x8:1x4:524288x128/causal", 128),            # 2 ranges of 20: 6 splits, not 3
])
def test_gate_rows_plan_the_fitted_tile(case, tn):
    got, splits, p = _launch_tn(case)
    assert got == tn
    assert _launch_tn(case, {"TN_FIT": 0})[0] == 128
    assert _launch_tn(case, {"KT_FORM": 2})[0] == 128          # keys forms: as given
    torch = pytest.importorskip("torch")
    from spak.device.decode_gpu import split_count
    q, k, lens, bt = _stand_ins(p)
    meta = {n: None if a is None else torch.empty(a.shape, device="meta")
            for n, a in (("q", q), ("k_cache", k), ("v_cache", k), ("block_table", bt))}
    assert split_count(p, meta, {}) == splits                  # the slice's count: the plan's
    assert split_count(p, meta, {"TN_FIT": 0}) == _launch_tn(case, {"TN_FIT": 0})[1]


@pytest.mark.parametrize("case,tn", [("2x12:2x4:2100x128/causal/page16/lens=2100:37/splits=2", 64),
                                     ("1x71:1x4:150x64/causal/page64/lens=150", 128)])
def test_fitted_plans_match_float64(case, tn):
    p = FAMILY.parse(case)
    inp = FAMILY.make_inputs(p, seed=4)
    ref = FAMILY.reference(p, inp)["out"]
    out, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits)
    assert _launch_tn(case)[0] == tn                            # the fitted form (or not)
    assert not np.isnan(out).any()
    assert rel_l2(out, ref) <= FAMILY.gate(p)
    assert rel_l2(out, ref * 1.01) > FAMILY.gate(p)             # the check can fail


def test_tn_fit_knob_is_checked():
    q = np.zeros((1, 1, 4, 32), np.float16)
    k = np.zeros((1, 64, 1, 32), np.float16)
    with pytest.raises(ValueError, match="TN_FIT"):
        pd.plan_decode(q, k, k, np.full(1, 64, np.int32), q.copy(), tiles={"TN_FIT": -1})


def test_tiles_probe_tool_on_the_simulator(cpu_launch, monkeypatch, tmp_path):
    """tools/decode_tiles_probe.py (the GPU job's config probe) on the CPU: the planned
    call per config against float64, TILE_N as the plan resolved it, a failing config
    reported without stopping the next; the timing stubbed (no CUDA events here)."""
    import importlib.util
    import json
    import spak.device.timing as timing
    spec = importlib.util.spec_from_file_location("probe", "tools/decode_tiles_probe.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(timing, "time_events", lambda fn, n: [fn(0), {"ms_median": 2.0}][1])
    case = "2x12:2x4:2100x128/causal/page16/lens=2100:37"
    out = tmp_path / "c.jsonl"
    rows = tool.probe(case, [{}, {"TN_FIT": 0}, {"MAX_ROWS": 48}], device="cpu",
                      out=str(out))
    assert [json.loads(ln) for ln in out.read_text().splitlines()] == rows
    assert [r.get("tile_n") for r in rows[:2]] == [64, 128]
    assert all(r["passed"] and r["rel_l2"] < 1e-3 and r["ms"] == 2.0 for r in rows[:2])
    assert "error" in rows[2] and "MAX_ROWS" in rows[2]["error"]
    json.dumps(rows)
    assert tool.jobs(["A", '{"TN_FIT": 0}', "{}", "B"]) == [("A", [{"TN_FIT": 0}, {}]),
                                                           ("B", [{}])]
