"""The fused-dQ backward (tiles DQ_FUSED 1/2/4: dQ summed in the dK/dV pass in a fixed
order behind per-query-tile counters; gpu/kernels/fmha_bwd.py section 4) on the CPU
simulator: gradients vs float64 on fresh random inputs under the family's gates (fp16 and
bf16, causal and not, lengths off the 16-grid, GQA, Sq != Sk both ways, masks), dK/dV bit
for bit the three-launch backward's (the same code), the same dQ bits in any block start
order and with as few resident blocks as 1 or 2 (the ticket makes the waits deadlock-free),
and the planner's refusals.
"""
from __future__ import annotations

import cuda.tile as ct
import numpy as np
import pytest

from spak import sim
from spak.attention.problems import make_inputs, parse_spec
from spak.attention.reference import attention_grads_f64
from spak.core.metrics import rel_l2, round_to_bf16
from spak.cpu.simrun import kernel_mask
from spak.cpu.simrun_bwd import simulate_fmha_bwd
from spak.families.fmha_bwd import BWD_GATES
from spak.gpu.plan_bwd import plan_fmha_bwd

T32 = {"DKV_TILE_M": 32, "DKV_TILE_N": 32, "DQ_TILE_M": 32, "DQ_TILE_N": 32}


def _dout(spec, seed):
    x = np.random.default_rng([seed, 7]).standard_normal(
        (spec.B, spec.Hq, spec.Sq, spec.D), dtype=np.float32)
    return x.astype(np.float16) if spec.dtype == "fp16" else round_to_bf16(x)


def _grads(text, tiles, seed):
    spec = parse_spec(text)
    inp = make_inputs(spec, seed)
    dout = _dout(spec, seed)
    g, reports = simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, mask=inp.mask,
                                   causal=spec.causal, tiles=tiles, dtype=spec.dtype)
    return spec, inp, dout, g, reports


CASES = [
    # (case, DQ_FUSED, tiles): causal GQA off the 16-grid; bf16 non-causal; Sq > Sk causal
    # (leading query tiles see no key: dQ = 0 there); Sq < Sk; a mask; D 128 in parts
    ("1x4:2x100x64/causal/fp16", 1, T32),
    ("1x2x70x48/noncausal/bf16", 1, T32),
    ("2x2:1x90:41x64/causal/fp16", 2, T32),
    ("1x4:1x33:77x128/causal/bf16", 2, T32),
    ("1x4:2x50:70x80/noncausal/fp16/mask", 1, T32),
    ("1x2x77x128/causal/fp16", 4, {"DKV_TILE_M": 16, "DKV_TILE_N": 32}),
    # DQ_EARLY: the product before the wait, then the workspace added to it
    ("1x4:2x100x64/causal/bf16", 1, {**T32, "DQ_EARLY": 1}),
    ("1x2x70x48/noncausal/fp16", 2, {**T32, "DQ_EARLY": 1}),
]


@pytest.mark.parametrize("case,fused,tiles", CASES, ids=[c[0] for c in CASES])
def test_fused_dq_gradients_match_float64(case, fused, tiles):
    seed = int(np.random.SeedSequence().entropy % 2**31)     # fresh inputs every run
    spec, inp, dout, g, reports = _grads(case, {**tiles, "DQ_FUSED": fused}, seed)
    assert [r.kernel for r in reports][-2:] == ["fmha_bwd_preprocess_dq_kernel",
                                                "fmha_bwd_dkdvdq_kernel"]
    ref = attention_grads_f64(inp.q, inp.k, inp.v, dout, mask=inp.mask, causal=spec.causal)
    three = {k: v for k, v in tiles.items() if k != "DQ_EARLY"}
    _, _, _, g3, _ = _grads(case, three, seed)                # the three-launch backward
    for name, r in zip(("dq", "dk", "dv"), ref):
        assert np.isfinite(g[name]).all(), (name, seed)
        err = rel_l2(g[name], r)
        assert err <= BWD_GATES[spec.dtype], (name, err, seed)
        # no worse than the three-launch backward's dQ beyond rounding noise
        assert err <= 1.25 * rel_l2(g3[name], r) + 1e-6, (name, err, seed)
    np.testing.assert_array_equal(g["dk"], g3["dk"])
    np.testing.assert_array_equal(g["dv"], g3["dv"])
    if spec.causal and spec.Sq > spec.Sk:                     # rows that see no key
        dead = spec.Sq - spec.Sk
        assert (g["dq"][:, :, :dead] == 0).all()


def test_dq_parts_change_no_bit():
    seed = 11
    out = [_grads("1x2:1x45x64/causal/fp16", {**T32, "DQ_FUSED": p}, seed)[3]["dq"]
           for p in (1, 2, 4)]
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[0], out[2])


def _fused_launches(text, seed, early=0):
    """The fused plan on simulator arrays (the forward's out and lse from a simulated
    run), for sim.find_races."""
    spec = parse_spec(text)
    inp = make_inputs(spec, seed)
    dout = _dout(spec, seed)
    g, _ = simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, causal=spec.causal,
                             tiles=T32, dtype=spec.dtype)
    ctd = ct.float16

    def wrap(x, name):
        return sim.SimArray(np.array(x, copy=True), ctd, name=name)

    def alloc(shape, kind):
        if kind == "input":
            return sim.SimArray(np.full(shape, np.nan, np.float16), ctd)
        return np.full(shape, np.nan, np.float32)

    q, k, v, o, do = (wrap(x, n) for x, n in ((inp.q, "Q"), (inp.k, "K"), (inp.v, "V"),
                                              (g["out"], "Out"), (dout, "dOut")))
    grads = [wrap(np.full(x.shape, np.nan, np.float16), n)
             for x, n in ((inp.q, "dQ"), (inp.k, "dK"), (inp.v, "dV"))]
    L = plan_fmha_bwd("fused", q, k, v, o, do, np.array(g["lse"]), *grads,
                      mask=kernel_mask(None, spec.B, spec.Hq, spec.Sq, spec.Sk),
                      causal=spec.causal, tiles={**T32, "DQ_FUSED": 1, "DQ_EARLY": early},
                      alloc=alloc)
    return L, g


@pytest.mark.parametrize("case,early", [("1x2:1x100x64/causal/fp16", 0),
                                        ("1x2x70x64/noncausal/fp16", 0),
                                        ("1x2:1x100x64/causal/fp16", 1)])
def test_same_bits_in_any_block_order_and_residency(case, early):
    """Shuffled start orders with random hand-overs, 2 resident blocks (find_races), and
    1 resident block: no race, no deadlock, the outputs bit-identical across orders."""
    L, g = _fused_launches(case, seed=5, early=early)
    assert [x.name for x in L] == ["bwd.preprocess", "bwd.dkdv"]
    sim.launch(L[0].kernel, L[0].grid, L[0].args)
    rep = sim.find_races(L[1].kernel, L[1].grid, L[1].args, orders=3, seed=3, resident=2)
    # the workspaces' partly unwritten by design (simrun_bwd's PARTIAL_WRITERS); any
    # other finding is a race
    races = [r for r in rep.races if not r.startswith("unwritten:")]
    assert not races and not rep.differences, (races, rep.differences)
    assert len(rep.reports) == 3
    sim.launch(L[1].kernel, L[1].grid, L[1].args, resident=1, check_unwritten=False)
    dq = L[1].args[9].data
    assert np.isfinite(dq).all()
    g1, _ = simulate_fmha_bwd("fused", *(x.data for x in L[1].args[:3]), L[1].args[3].data,
                              causal=L[1].args[18],
                              tiles={**T32, "DQ_FUSED": 1, "DQ_EARLY": early},
                              dtype="fp16", out=g["out"], lse=g["lse"])
    np.testing.assert_array_equal(dq, g1["dq"])


def test_planner_refusals_and_fallbacks():
    spec = parse_spec("1x2x40x64/causal/fp16")
    inp = make_inputs(spec, 0)
    dout = _dout(spec, 0)
    with pytest.raises(ValueError, match="DQ_FUSED"):
        simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, tiles={"DQ_FUSED": 3})
    with pytest.raises(ValueError, match="DQ_FUSED"):
        simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, tiles={"DQ_FUSED": True})
    with pytest.raises(ValueError, match="DKV_SPLIT 1"):
        simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout,
                          tiles={"DQ_FUSED": 1, "DKV_SPLIT": 2})
    with pytest.raises(ValueError, match="DQ_EARLY.*needs DQ_FUSED"):
        simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout, tiles={"DQ_EARLY": 1})
    with pytest.raises(ValueError, match="DQ_EARLY'. must be 0 or 1"):
        simulate_fmha_bwd("fused", inp.q, inp.k, inp.v, dout,
                          tiles={"DQ_FUSED": 1, "DQ_EARLY": 2})
    # D 256 splits dK/dV by default: the fused pass needs DKV_SPLIT 1 said explicitly
    s256 = parse_spec("1x1x20x256/causal/fp16")
    i256 = make_inputs(s256, 0)
    with pytest.raises(ValueError, match="DKV_SPLIT 1"):
        simulate_fmha_bwd("fused", i256.q, i256.k, i256.v, _dout(s256, 0),
                          tiles={"DQ_FUSED": 1})
    # Sk = 0: no dK/dV pass to fuse into; the three-launch plan writes dQ = 0
    q = inp.q
    k0 = np.zeros((1, 2, 0, 64), np.float16)
    g, reps = simulate_fmha_bwd("fused", q, k0, k0, dout, tiles={"DQ_FUSED": 1})
    assert (g["dq"] == 0).all() and "fmha_bwd_dq_kernel" in [r.kernel for r in reps]


def test_fused_dq_refuses_a_real_gpu_by_default(monkeypatch):
    """On an H200 the fused-dQ pass never finished (2026-11-28): a CUDA tensor is refused
    with the reason, unless SPAK_BWD_FUSED_DQ_GPU=1 asks for it anyway."""
    from types import SimpleNamespace
    from spak.gpu.plan_bwd import launches_fused_dq
    monkeypatch.delenv("SPAK_BWD_FUSED_DQ_GPU", raising=False)
    q = SimpleNamespace(is_cuda=True)
    with pytest.raises(RuntimeError, match="slower than the three-launch"):
        launches_fused_dq(q, *([None] * 12), 1.0, 64, 64, {}, True, False, None)
