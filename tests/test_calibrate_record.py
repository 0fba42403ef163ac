"""`spak calibrate --record DIR` / `--check --data DIR` for GPUs we do not own (issue 22).

No GPU here: the record is assembled the way --record writes it, with the GPU's part played
by data the simulator did not produce: MMA-Sim's RTX Blackwell model (mma), the H200's probe
fixture (the elementwise ops the sm_120 model assumes are sm_90's), row sums worked out by
hand and by a lane-by-lane oracle of the order read from sm_120's SASS (tests/oracles.py;
tests/test_models_sm120_sm89.py ties it to the cubin), and FMHA cases whose output is known
exactly by construction (q = 0: every probability is 1, the output is the mean of V's
integer rows over a power-of-two key count). The check must pass on that record and fail,
naming the op, when one recorded bit is changed. The real-GPU flow (--record then --check
on an H100) is tests/test_gpu_calibrate.py.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from spak.cli import main
from spak.device import calibrate
from spak.sim.numerics import MUFU_TABLES
from tests.oracles import hand_rows_sm120, warp_row_sums

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


def _hand_sums():
    """The fixture's H200 rows of 128 with the first 4 replaced by the hand-worked rows;
    their sm_120 sums: by hand for those, by the lane-by-lane SASS-order oracle for the rest."""
    x = DATA["sum_x"].copy()
    rows, sums = hand_rows_sm120()
    x[0, :4] = rows
    y = warp_row_sums(x)
    assert (y[0, :4] == sums).all()            # the oracle agrees with the hand
    return x, y


def _hand_fmha_cases(path):
    """agreement.npz (ci/agree_replay.py's format) with outputs known without running
    anything: q = 0 makes every score 0 and every probability exactly 1, so each output row
    is the mean of V's rows; V holds small integers and Sk = 128, so the mean is exact in
    fp16 and bf16 (a sum of integers, divided by a power of two)."""
    from spak.core.metrics import round_to_bf16
    from spak.gpu.plan import default_tiles
    rng = np.random.default_rng(39)
    dump = {}
    n = 0
    for dtype in ("fp16", "bf16"):
        for kernel in ("fused", "naive"):
            q = np.zeros((1, 2, 37, 64), np.float32)
            k = rng.standard_normal((1, 2, 128, 64)).astype(np.float32)
            v = rng.integers(-8, 9, (1, 2, 128, 64)).astype(np.float32)
            if dtype == "fp16":
                q, k, v = (a.astype(np.float16) for a in (q, k, v))
            else:
                k = round_to_bf16(k)         # bf16 values in float32 storage
            out = np.broadcast_to(v.astype(np.float64).mean(axis=2, keepdims=True), q.shape)
            gpu = out.astype(np.float16 if dtype == "fp16" else np.float32)
            assert (gpu.astype(np.float64) == out).all()      # exact in either dtype
            meta = {"case": f"{kernel}|hand-{dtype}", "scale": None, "causal": False,
                    "dtype": dtype, "tiles": dict(default_tiles(64, "sm_120", False))}
            dump.update({f"{n:03d}/q": q, f"{n:03d}/k": k, f"{n:03d}/v": v,
                         f"{n:03d}/gpu": gpu, f"{n:03d}/meta": np.frombuffer(
                             json.dumps(meta).encode(), np.uint8)})
            n += 1
    np.savez_compressed(path / calibrate.AGREEMENT, **dump)


@pytest.fixture
def record(tmp_path):
    """A calibration directory as `spak calibrate --record` on an RTX 5070 would write it,
    from data the model did not produce (module docstring)."""
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
    sum_x, sum_y = _hand_sums()
    np.savez(tmp_path / "probe_elementwise.npz", x=DATA["exp2__x"], y=DATA["exp2__y"],
             div_x=DATA["div__div_x"], div_y=DATA["div__div_y"], div_q=DATA["div__div_q"],
             cast_x=DATA["cast__cast_x"], cast_f16=DATA["cast__cast_f16"],
             cast_bf16=DATA["cast__cast_bf16"], sum_x=sum_x, sum_y=sum_y)
    shutil.copy(MUFU_TABLES, tmp_path / "sm90_mufu.npz")
    _hand_fmha_cases(tmp_path)
    (tmp_path / calibrate.CALIBRATION).write_text(json.dumps({"arch": "sm_120"}))
    return tmp_path


def test_record_agreement_round_trips_through_the_check(tmp_path, monkeypatch, capsys):
    """The writer's format only: the simulator stands in for the GPU here, so the 100% it
    prints is the simulator agreeing with itself, not evidence about any GPU."""
    from spak.attention import problems
    monkeypatch.setitem(problems.SHAPE_SETS, "tiny-calibration", TINY)
    monkeypatch.setattr(calibrate, "AGREEMENT_SET", "tiny-calibration")
    assert calibrate.record_agreement(tmp_path, "sm_120", run=_sim_as_gpu("sm_120")) == 4
    (tmp_path / calibrate.CALIBRATION).write_text(json.dumps({"arch": "sm_120"}))
    assert main(["calibrate", "--check", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("fmha") == 4 and "REFUTED" not in out


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


def test_quick_record_runs_the_reduced_plan(tmp_path, monkeypatch, capsys):
    """--record --quick without a GPU's work: the tools it starts (no per-op kernels, the
    rsqrt table alone, tanh on two binades, probes without their summary), the quick FMHA
    set, and calibration.json naming both; a failing tool makes the exit status 1."""
    from spak.device import archs
    import subprocess
    calls, status, real = [], {}, subprocess.Popen

    def popen(cmd, **kw):             # a tools/ script ends at once with status[script] or 0
        if "/tools/" not in str(cmd[1:2]):
            return real(cmd, **kw)            # git and the like: the real thing
        calls.append([Path(cmd[1]).name, *cmd[2:]])
        kw["stdout"].write(f"ran {cmd[1]}\n")
        rc = status.get(Path(cmd[1]).name, 0)
        return type("Tool", (), {"returncode": rc, "poll": lambda self: rc})()

    monkeypatch.setattr(archs, "from_torch", lambda: ("sm_90", 90, "NVIDIA H100 80GB HBM3"))
    monkeypatch.setattr(subprocess, "Popen", popen)
    got = {}
    monkeypatch.setattr(calibrate, "record_agreement",
                        lambda out, arch, shapes=None: got.setdefault("shapes", shapes) and 4)
    rec = tmp_path / "rec"
    assert main(["calibrate", "--record", str(rec), "--quick"]) == 0
    assert [c[0] for c in calls] == ["numerics_probe.py", "numerics_tables.py",
                                     "mufu_probe.py", "mufu_probe.py"]
    assert "--no-summary" in calls[0] and "--rsqrt-only" in calls[2]
    assert "--binades=-1,0" in calls[3] and "--tanh-table" in calls[3]
    assert got["shapes"] == calibrate.QUICK_SET
    meta = json.loads((rec / calibrate.CALIBRATION).read_text())
    assert meta["quick"] is True and meta["agreement_set"] == "quick"
    assert meta["steps"]["agreement_cases"] == 4 and set(meta["seconds"]) >= {"probes", "agreement"}
    assert (rec / "probes.log").read_text().startswith("ran ")      # each tool's output kept
    status["numerics_tables.py"] = 3
    assert main(["calibrate", "--record", str(rec), "--quick"]) == 1
    assert json.loads((rec / calibrate.CALIBRATION).read_text())["steps"]["tables"] == 3
    assert main(["calibrate", "--check", "--quick"]) == 2
    assert "--quick goes with --record" in capsys.readouterr().err
