"""The FMHA kernels, run by the simulator, against the float64 reference (issue 2's gates)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from spak.core.metrics import gate_for, nonfinite_count, rel_l2
from spak.attention.problems import ProblemSpec, make_inputs, parse_spec
from spak.attention.reference import attention_f64
from spak.cpu.simrun import run_case, simulate_fmha

KERNELS = ("fused", "naive")

# The gate matrix: causal/non-causal, D 64/128, GQA 4:1, Sq != Sk,
# S not a tile multiple (1, 17, 100, 1000), fp16 and bf16, additive and bool masks.
GATE_CASES = [
    "1x2x1x64/fp16/noncausal", "1x2x1x128/bf16/causal",
    "2x2x17x64/fp16/causal", "1x2x17x128/bf16/noncausal",
    "1x4:1x100x64/fp16/causal", "1x4:1x100x128/bf16/noncausal",
    "1x2x1000x64/fp16/noncausal", "1x2x1000x128/fp16/causal", "1x1x1000x64/bf16/causal",
    "1x4:1x100:300x64/fp16/causal", "1x4x300:100x128/bf16/causal",
    "1x8:2x1:1000x64/fp16/causal", "2x4:2x77:130x64/fp16/noncausal/mask",
    "1x2x200x128/bf16/causal/boolmask",
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", GATE_CASES)
def test_gate_matrix(kernel, case):
    r = run_case(kernel, parse_spec(case), seed=7)
    assert r["nonfinite"] == 0
    assert r["rel_l2"] <= r["gate"], f"{kernel} {case}: rel L2 {r['rel_l2']:.2e} > {r['gate']}"
    assert r["passed"]


@pytest.mark.parametrize("tiles", [(16, 16), (32, 64), (64, 32), (128, 64)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_tile_sizes_do_not_change_the_answer(kernel, tiles):
    spec = parse_spec("1x4:2x70:150x64/fp16/causal")
    r = run_case(kernel, spec, tiles=tiles, seed=3)
    assert r["passed"] and r["rel_l2"] <= 1e-3


@pytest.mark.parametrize("kernel", KERNELS)
def test_fully_masked_rows_are_zero_not_nan(kernel):
    # Sq > Sk with causal: the first Sq - Sk query rows see no key at all
    spec = parse_spec("1x2x40:24x64/fp16/causal/mask")
    inp = make_inputs(spec, seed=5)
    out, _ = simulate_fmha(kernel, inp.q, inp.k, inp.v, mask=inp.mask, causal=True)
    assert nonfinite_count(out) == 0
    assert (out[:, :, :16] == 0).all()
    masked_row = spec.Sq // 2                  # make_inputs masks this row of batch 0 entirely
    assert (out[0, :, masked_row] == 0).all()
    ref = attention_f64(inp.q, inp.k, inp.v, mask=inp.mask, causal=True)
    assert rel_l2(out, ref) <= 1e-3


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", ["1x2x65x64/fp16/noncausal", "1x2x65:90x64/fp16/causal/mask"])
def test_scale_argument_zero_and_negative_included(kernel, case):
    spec = parse_spec(case)
    inp = make_inputs(spec, seed=11)
    for scale in (0.05, 0.3, 0.0, -0.2):
        out, _ = simulate_fmha(kernel, inp.q, inp.k, inp.v, mask=inp.mask, causal=spec.causal,
                               scale=scale)
        ref = attention_f64(inp.q, inp.k, inp.v, mask=inp.mask, causal=spec.causal, scale=scale)
        assert nonfinite_count(out) == 0
        assert rel_l2(out, ref) <= 1e-3, scale


@st.composite
def problems(draw):
    hkv = draw(st.integers(1, 2))
    return ProblemSpec(B=draw(st.integers(1, 2)), Hq=hkv * draw(st.sampled_from([1, 2, 4])),
                       Hkv=hkv, Sq=draw(st.integers(1, 140)), Sk=draw(st.integers(1, 140)),
                       D=draw(st.sampled_from([16, 32, 64, 128])),
                       dtype=draw(st.sampled_from(["fp16", "bf16"])),
                       causal=draw(st.booleans()),
                       mask=draw(st.sampled_from([None, None, "additive", "bool"])))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=problems(), kernel=st.sampled_from(KERNELS),
       tiles=st.sampled_from([None, (16, 32), (32, 16), (64, 64)]), seed=st.integers(0, 2**16))
def test_property_sim_matches_float64(spec, kernel, tiles, seed):
    inp = make_inputs(spec, seed)
    out, _ = simulate_fmha(kernel, inp.q, inp.k, inp.v, mask=inp.mask, causal=spec.causal,
                           tiles=tiles, dtype=spec.dtype)
    ref = attention_f64(inp.q, inp.k, inp.v, mask=inp.mask, causal=spec.causal)
    assert nonfinite_count(out) == 0
    assert (out[np.abs(ref) == 0] == 0).all()     # rows with no allowed key are exact zeros
    assert rel_l2(out, ref) <= gate_for(spec.dtype)
