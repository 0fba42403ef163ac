"""Every SPAK tensor-core model is bit-identical to MMA-Sim's model of its GPU (issue 22).

MMA-Sim (arXiv 2511.10909, `mmasim==2.1.1` in the `test` extra) is a bit-accurate model of
tensor-core instructions validated by its authors on the hardware; here it is the oracle
for the GPUs we do not own (sm_120: RTX Blackwell, sm_89: Ada Lovelace) and a second
witness for the one we measured (sm_90: Hopper). tools/mmasim_oracle.py generates the inputs,
runs `ct.mma` through the simulator (gpu/probes' mma_probe) and MMA-Sim's k16 instructions
chained in ascending K as the compiler issues them (tools/sass_trace.py, tools/sass_trace_mma.py),
and prints the agreement table.

Per model: 2 dtypes x 6 input classes x K in (16, 32, 64) x 4096 outputs = 147,456 outputs,
every bit compared.
"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import cuda.tile as ct

pytest.importorskip("torch")
pytest.importorskip("mmasim")

_spec = importlib.util.spec_from_file_location(
    "mmasim_oracle", Path(__file__).resolve().parents[1] / "tools" / "mmasim_oracle.py")
O = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(O)

from spak.sim.numerics import MODELS, get_model   # noqa: E402


def test_the_check_covers_at_least_1e5_outputs_per_model_and_every_input_class():
    per_model = len(O.DTYPES) * len(O.CLASSES) * len(O.KS) * O.M * O.N
    assert per_model >= 100_000
    assert set(O.ARCHS) == {"sm_90", "sm_120", "sm_89"} <= set(MODELS)
    rng = np.random.default_rng(0)
    a, b, c = O.inputs("special", "bf16", 16, 1, rng)
    assert np.isnan(a).any() and np.isinf(b).any() and (c == 0).any()
    a, b, c = O.inputs("subnormal", "fp16", 16, 1, rng)
    assert ((np.abs(a) < 2.0 ** -14) & (a != 0)).any()          # fp16 subnormals
    a, b, c = O.inputs("wide", "bf16", 16, 1, rng)
    assert np.abs(a).max() > 2.0 ** 100 and np.abs(a[a != 0]).min() < 2.0 ** -100


@pytest.mark.slow
@pytest.mark.parametrize("dt", O.DTYPES)
@pytest.mark.parametrize("model", sorted(O.ARCHS))
def test_model_is_bit_identical_to_mmasim(model, dt):
    bad = []
    for cls in O.CLASSES:
        for k in O.KS:
            r = O.compare(model, dt, cls, k, cases=1)
            assert r["outputs"] == O.M * O.N
            if r["identical"] != r["outputs"]:
                bad.append((cls, k, r["outputs"] - r["identical"], r["first_diffs"]))
    assert not bad, f"{model} {dt} differs from MMA-Sim {O.ARCHS[model][0]}: {bad}"


@pytest.mark.parametrize("model,other", [("sm_90", "sm_89"), ("sm_89", "sm_120")])
def test_the_oracle_tells_the_architectures_apart(model, other):
    """Hopper's arithmetic (F=25, 16-term steps) is not Ada's (F=24, 8-term steps): the
    check can fail."""
    r = O.compare(model, "fp16", "normal", 64, cases=1, oracle_model=other)
    assert r["identical"] / r["outputs"] < 0.8


def test_the_old_sm_120_model_disagrees_with_rtx_blackwell():
    """`--model sm_120` used to be the v0 arithmetic (exact sum, one rounding): ~55%."""
    r = O.compare("sm_90-v0", "fp16", "normal", 16, cases=1, oracle_model="sm_120")
    assert 0.3 < r["identical"] / r["outputs"] < 0.8


@pytest.mark.parametrize("dt", O.DTYPES)
@pytest.mark.parametrize("model", ["sm_120", "sm_89"])
def test_batched_oracle_is_mmasims_own_instruction(model, dt):
    rng = np.random.default_rng(3)
    assert O.same_as_instruction_tiles(model, dt, *O.inputs("wide", dt, 16, 1, rng))


def _one(model, a, b, c, dt):
    """get_model(model).mma on one [1, K] x [K, 1] product (the public model call)."""
    a = np.asarray(a, np.float64).reshape(1, 1, -1)
    b = np.asarray(b, np.float16 if dt == "fp16" else np.float32).reshape(1, -1, 1)
    return get_model(model).mma(a, b, np.full((1, 1, 1), c, np.float32), ct.float32)[0, 0, 0]


@pytest.mark.parametrize("model", sorted(O.ARCHS))
def test_an_overflowing_step_leaves_inf_in_the_fp32_accumulator(model):
    """bf16: step 1 sums past 2^128 (fp32 inf); step 2 adds a larger negative finite sum.
    The accumulator register holds inf between the k16 instructions, so the result stays
    +inf (a float64 carry would have given -inf)."""
    a = np.zeros(32)
    b = np.zeros(32)
    a[0], b[0] = 2.0 ** 100, 2.0 ** 30                # 2^130: inf in fp32
    a[16], b[16] = -(2.0 ** 100), 2.0 ** 40           # -2^140
    r = _one(model, a, b, 0.0, "bf16")
    want = O.oracle(model, "bf16", O._round(np.tile(a, (1, 64, 1)), "bf16"),
                    O._round(np.tile(b[None, :, None], (1, 1, 64)), "bf16"),
                    np.zeros((1, 64, 64), np.float32))[0, 0, 0]
    assert np.isposinf(r) and np.isposinf(want)


@pytest.mark.parametrize("model", sorted(O.ARCHS))
def test_a_zero_result_is_plus_zero(model):
    """-0 accumulator and a sum that truncates to zero: the tensor core's fused sum has no
    sign of zero, MMA-Sim gives +0 (IEEE addition would keep -0)."""
    a = np.zeros(16)
    b = np.zeros(16)
    a[0], b[0] = -(2.0 ** -100), 2.0 ** -60           # -2^-160: below fp32's subnormals
    r = _one(model, a, b, -0.0, "bf16")
    assert r == 0 and not np.signbit(r)
    r = _one(model, np.zeros(16), np.zeros(16, np.float16), -0.0, "fp16")
    assert r == 0 and not np.signbit(r)
