"""`spak run --family fmha_decode` on a varlen problem (qlens=), the simulator playing the
GPU: packed inputs, the float64 reference, spak.fmha_varlen's kernel and the bit
agreement of the whole problem. Before this the H100's `spak run --family fmha_decode
--shapes default` failed its varlen case with "run on the simulator only here"."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spak.device import case  # noqa: E402
from spak.families.fmha_decode import FAMILY  # noqa: E402
from tests.helpers_gpu_loop import run_args, sim_env  # noqa: E402
from tests.test_bwd_loop_cpu import _names, sim_launch  # noqa: E402,F401


@pytest.mark.parametrize("text", ["4x8:2x40:60x64/qlens=5:0:1:40/lens=7:3:0:60/causal/fp16",
                                  "2x4:1x30:50x64/qlens=30:9/lens=0:50/bf16"])
def test_run_case_on_a_varlen_problem_sim_as_gpu(sim_launch, text):
    """The row's check against float64 is real; its bit agreement is the simulator against
    itself (it plays the GPU): bookkeeping, not fidelity (tests/test_gpu_varlen.py is)."""
    spec = FAMILY.parse(text)
    assert spec.varlen
    rows = case.run_case(spec, ("splitkv",), run_args(no_time=False), sim_env(), None,
                         lambda r: None, FAMILY)
    r = rows[0]
    assert r["passed"], {k: r.get(k) for k in ("error", "rel_l2", "nonfinite", "sim")}
    assert r["sim"]["fraction_bit_identical"] == 1.0 and r["sim"]["slice"] == "full problem"
    assert r["nonfinite"] == 0 and r["rel_l2"] <= FAMILY.gate(spec)
    assert r["ms_median"] > 0
    assert _names(sim_launch)[-1] == "fmha_varlen_kernel"


def test_varlen_check_can_fail(sim_launch):
    spec = FAMILY.parse("4x8:2x40:60x64/qlens=5:0:1:40/lens=7:3:0:60/fp16")
    x = FAMILY.gpu_inputs(spec, 0, 0, "cpu")
    call = FAMILY.gpu_call("splitkv", spec, x, FAMILY.default_config(spec))
    call()
    ref = FAMILY.gpu_reference(spec, x)
    good = FAMILY.gpu_check(spec, x, call.outputs, ref)
    bad = FAMILY.gpu_check(spec, x, {"out": call.outputs["out"] * 1.05}, ref)
    assert good["passed"] and not bad["passed"]
