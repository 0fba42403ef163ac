"""The sm_120 (RTX 5070) and sm_89 (L4) models: what differs from sm_90, and the compiler
facts read from their cubins (issue 22; docs/numerics-sm120.md, docs/numerics-sm89.md).

The tensor-core arithmetic is checked against MMA-Sim in tests/test_mmasim_oracle.py. Here:
the models are registered and swappable, the row-sum order of loaded tiles (the one
compiler fact where sm_120 differs from sm_90), the FMHA gates under each model, and, where
nvdisasm is installed, that the cubins still show what the models assume.
"""
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import cuda.tile as ct

from spak.cli import main
from spak.sim.numerics import MODELS, Sm89, Sm90, Sm120, get_model
from tests import tools
from tests.oracles import hand_rows_sm120, warp_row_sums

ROOT = Path(__file__).resolve().parents[1]


def bits(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def test_models_are_registered_with_their_provenance():
    assert MODELS["sm_120"] is Sm120 and MODELS["sm_89"] is Sm89
    assert "sm_120-v0" not in MODELS            # the old declared model is gone
    for name, cls in (("sm_120", Sm120), ("sm_89", Sm89)):
        m = get_model(name)
        assert m.name == name and isinstance(m, Sm90) and m.contract_fma
        assert "MMA-Sim" in m.describe()["description"]
    assert (get_model("sm_120").mma_kstep, get_model("sm_120").mma_fbits) == (16, 25)
    assert (get_model("sm_89").mma_kstep, get_model("sm_89").mma_fbits,
            get_model("sm_89").mma_ezero) == (8, 24, -132)
    # sm_90's measured MUFU tables are the (declared) assumption for both
    for name in ("sm_120", "sm_89"):
        assert (get_model(name).exp2_table == get_model("sm_90").exp2_table).all()


def test_sm120_adds_a_lanes_four_neighbours_as_halves():
    """(x0 + x2) + (x1 + x3) on sm_120, (x0 + x1) + (x2 + x3) on sm_90 and sm_89."""
    x = np.array([[1.0, 2.0 ** -24, -1.0, 2.0 ** -24]], np.float32)
    assert get_model("sm_90").sum(x, (1,), ct.float32)[0] == np.float32(2.0 ** -24)
    assert get_model("sm_89").sum(x, (1,), ct.float32)[0] == np.float32(2.0 ** -24)
    assert get_model("sm_120").sum(x, (1,), ct.float32)[0] == np.float32(2.0 ** -23)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 128)) * 2.0 ** rng.integers(-8, 8, (64, 1))).astype(np.float32)
    s120 = get_model("sm_120").sum(x, (1,), ct.float32)
    # against the warp written out lane by lane (tests/oracles.py), not the model's
    # own tree_sum_f32, and against rows summed by hand
    rows, sums = hand_rows_sm120()
    assert (bits(get_model("sm_120").sum(rows, (1,), ct.float32)) == bits(sums)).all()
    assert (bits(s120) == bits(warp_row_sums(x, (0, 2, 1, 3)))).all()
    assert (bits(s120) != bits(get_model("sm_90").sum(x, (1,), ct.float32))).any()
    # the mma-fragment order is the same on all three
    f = get_model("sm_120").sum(x, (1,), ct.float32, layout="mma")
    assert (bits(f) == bits(get_model("sm_90").sum(x, (1,), ct.float32, layout="mma"))).all()


@pytest.mark.parametrize("model", ["sm_120", "sm_89"])
def test_spak_sim_gates_pass_under_the_model(model, capsys):
    rc = main(["sim", "--model", model, "--kernel", "all", "--dtype", "all",
               "--shapes", "1x2x128x64/causal", "2x4:2x77:130x64/mask/noncausal"])
    out = capsys.readouterr().out
    assert rc == 0 and f"model {model}" in out and "FAIL" not in out


def _tool():
    spec = importlib.util.spec_from_file_location("sass_trace_mma",
                                                  ROOT / "tools" / "sass_trace_mma.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _nvdisasm_or_skip():
    tools.require("nvdisasm")      # a skip here, a failure in CI (tests/tools.py)


@pytest.mark.slow
@pytest.mark.parametrize("arch,instr", [("sm_120", "HMMA.16816.F32"),
                                        ("sm_89", "HMMA.16816.F32")])
def test_the_cubin_still_shows_what_the_model_assumes(arch, instr):
    """tileiras output for the fused kernel: mma.sync m16n8k16 chained in ascending K, the
    row sum of an mma tile in the model's fragment order (the traced SASS expression,
    evaluated in float32, equals fragment_row_sum_f32 bit for bit), scores in FFMAs."""
    _nvdisasm_or_skip()
    r = _tool().analyse(arch, "float16", 64, False, False)
    assert set(r["hmma"]) == {instr}
    assert r["k_steps_ascending"] and r["n_blocks_seen"] == list(range(8))
    assert r["row_sum_matches_model"] is True
    assert r["ffma_on_scores"] > 0 and all("fma(s," in f for f in r["ffma_on_scores_forms"])


@pytest.mark.slow
def test_the_cubin_row_sum_of_a_loaded_tile_is_each_models_order():
    _nvdisasm_or_skip()
    tool = _tool()
    for arch, chunk in (("sm_90", "(x0 + x1) + (x2 + x3)"), ("sm_120", "(x0 + x2) + (x1 + x3)"),
                        ("sm_89", "(x0 + x1) + (x2 + x3)")):
        r = tool.analyse_rowsum(arch, 64, 64)
        assert r["chunk_order"] == chunk and r["butterfly_masks_first_to_last"] == [8, 4, 2, 1]
        assert r["row_sum_matches_model"] is True
    # the oracle of tests/oracles.py (which feeds calibrate's sm_120 record) is what
    # the cubin computes: its traced expression evaluated on the hand-worked rows
    r = tool.analyse_rowsum("sm_120", 64, 128)
    code = re.sub(r"L\d+\[(\d)\]", lambda m: f"_X[4 * t + {m.group(1)}]",
                  r["row_expression"])
    rows, sums = hand_rows_sm120()
    rng = np.random.default_rng(39)
    rand = (rng.standard_normal((64, 128)) * 2.0 ** rng.integers(-20, 20, (64, 128)))
    got = np.array([tool._evaluator(code, {"_X": x})(0) for x in rows], np.float32)
    assert (bits(got) == bits(sums)).all()
    got = np.array([tool._evaluator(code, {"_X": x})(0) for x in rand.astype(np.float32)],
                   np.float32)
    assert (bits(got) == bits(warp_row_sums(rand))).all()
    # the evaluation can fail: sm_120's traced order is not sm_90's model
    r = tool.analyse_rowsum("sm_120", 64, 64)
    assert tool.loaded_sum_matches(r["row_expression"], 64, "sm_90") is False
