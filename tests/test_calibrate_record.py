"""`spak calibrate --record DIR` / `--check --data DIR` for GPUs we do not own (issue 22).

No GPU here: the record is assembled the way --record writes it, with the GPU's part played
by MMA-Sim's RTX Blackwell model (mma), the H200's probe fixture (the elementwise ops the
sm_120 model assumes are sm_90's), the sm_120 row-sum order read from its SASS, and the
simulator (the FMHA cases, through calibrate.record_agreement's `run` hook). The check must pass on that record and fail,
naming the op, when one recorded bit is changed.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from spak.cli import main
from spak.device import calibrate
from spak.sim.numerics import MUFU_TABLES, tree_sum_f32

pytest.importorskip("torch")
pytest.importorskip("mmasim")

DATA = np.load(Path(__file__).parent / "data" / "numerics_sm90.npz")
TINY = ["1x2x17x64/causal/fp16", "2x4:2x77:130x64/noncausal/bf16/mask"]


def _oracle():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "mmasim_oracle", Path(__file__).resolve().parents[1] / "tools" / "mmasim_oracle.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sim_as_gpu(model):
    from spak.cpu.simrun import simulate_fmha

    def run(kernel, q, k, v, mask, causal, dtype, tiles):
        return simulate_fmha(kernel, q, k, v, mask=mask, causal=causal, tiles=tiles,
                             model=model, dtype=dtype)[0]
    return run


@pytest.fixture
def record(tmp_path, monkeypatch):
    """A calibration directory as `spak calibrate --record` on an RTX 5070 would write it."""
    O = _oracle()
    rng = np.random.default_rng(22)
    for dt in ("fp16", "bf16"):
        for k in (16, 64):
            a, b, c = O.inputs("wide", dt, k, 4, rng)
            d = O.oracle("sm_120", dt, a, b, c)
            base = f"mma_{dt}_k{k}"
            np.savez(tmp_path / f"probe_{base}.npz", **{
                base + "_a": a.astype(np.float32), base + "_b": b.astype(np.float32),
                base + "_c": c, base + "_d": d})
    np.savez(tmp_path / "probe_elementwise.npz", x=DATA["exp2__x"], y=DATA["exp2__y"],
             div_x=DATA["div__div_x"], div_y=DATA["div__div_y"], div_q=DATA["div__div_q"],
             cast_x=DATA["cast__cast_x"], cast_f16=DATA["cast__cast_f16"],
             cast_bf16=DATA["cast__cast_bf16"], sum_x=DATA["sum_x"],
             # rows of a loaded tile: sm_120's order (its SASS), not the H200's
             sum_y=tree_sum_f32(DATA["sum_x"], 2, "halving"))
    shutil.copy(MUFU_TABLES, tmp_path / "sm90_mufu.npz")
    from spak.attention import problems
    monkeypatch.setitem(problems.SHAPE_SETS, "tiny-calibration", TINY)
    monkeypatch.setattr(calibrate, "AGREEMENT_SET", "tiny-calibration")
    assert calibrate.record_agreement(tmp_path, "sm_120", run=_sim_as_gpu("sm_120")) == 4
    (tmp_path / calibrate.CALIBRATION).write_text(json.dumps({"arch": "sm_120"}))
    return tmp_path


def test_check_reads_the_record_with_the_recorded_arch_model(record, capsys):
    assert main(["calibrate", "--check", "--data", str(record)]) == 0
    out = capsys.readouterr().out
    assert "model sm_120" in out and "REFUTED" not in out and "FAIL" not in out
    for op in ("mma", "rowsum", "exp2", "div", "mufu_exp2", "mufu_rcp", "fmha"):
        assert op in out
    assert out.count("assumed") >= 6 and out.count("exact") >= 10
    # the L4's model does not reproduce RTX Blackwell's tensor core: the check can fail
    assert main(["calibrate", "--check", "--data", str(record), "--model", "sm_89"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_a_refuted_assumption_fails_the_check(record, capsys):
    z = dict(np.load(record / calibrate.AGREEMENT))
    key = next(k for k in z if k.endswith("/gpu"))
    g = z[key].copy()
    g.reshape(-1).view(np.uint16 if g.dtype == np.float16 else np.uint32)[5] ^= 1
    z[key] = g
    np.savez(record / calibrate.AGREEMENT, **z)
    t = dict(np.load(record / "sm90_mufu.npz"))
    t["exp2_off"] = t["exp2_off"].copy()
    t["exp2_off"][123] += 1
    np.savez(record / "sm90_mufu.npz", **t)
    assert main(["calibrate", "--check", "--data", str(record)]) == 1
    out = capsys.readouterr().out
    refuted = [ln.split()[0] for ln in out.splitlines() if "REFUTED" in ln]
    assert refuted == ["mufu_exp2", "fmha"]


def test_record_needs_a_gpu(tmp_path, capsys):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["calibrate", "--record", str(tmp_path / "rec")]) == 1
    assert "no CUDA GPU" in capsys.readouterr().err
