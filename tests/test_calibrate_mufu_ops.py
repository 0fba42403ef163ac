"""`spak calibrate --check` on issue 19's records: MUFU.RSQ offsets and MUFU.TANH's table
(tools/mufu_probe.py) against the tables the sm_90 model reads, and the per-op kernels
(tools/sim_ops_gpu.py) re-run on the simulator. The records here are built from the model's
own tables (what an H100 recorded, by construction), then one value is changed: the
check must name the op and fail."""
import shutil
from pathlib import Path

import numpy as np
import pytest

from spak.device import calibrate
from spak.sim import mufu

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(mufu.rsq_table() is None or mufu.tanh_table() is None,
                                reason="sim/data MUFU tables missing")


def _tanh_record(path, binades=(2, -3)):
    """tanh_table.npz as the probe writes it, for a few binades, from the model's table."""
    emin, runs, starts, bits = mufu.tanh_table()
    arrays = {}
    for e in binades:
        k = e - emin
        n = 1 << (23 - int(runs[k]))
        b = bits[starts[k]:starts[k] + n].astype(np.int64)
        arrays[f"t{e}_first"] = b[:1].astype(np.uint32)
        arrays[f"t{e}_diff"] = np.diff(b).astype(np.int16)
    np.savez(path, **arrays)
    return arrays


def _lines(data):
    lines, bad = calibrate.check("sm_90", data)
    return "\n".join(lines), bad


def test_rsq_and_tanh_tables_pass_then_fail_on_one_changed_value(tmp_path):
    np.savez(tmp_path / "mufu_probe.npz", rsqrt_off=mufu.rsq_table())
    arrays = _tanh_record(tmp_path / "tanh_table.npz")
    text, bad = _lines(tmp_path)
    assert bad == 0, text
    assert "mufu_rsq" in text and "mufu_tanh" in text and "100.0000%" in text
    assert "runs of +-[2^-3, 2^3)" in text          # the binades the record holds (2, -3)
    # one MUFU.TANH step off by one ulp: every later run of that binade moves
    arrays["t2_diff"][1000] += 1
    np.savez(tmp_path / "tanh_table.npz", **arrays)
    off = mufu.rsq_table().copy()
    off[12345] += 1
    np.savez(tmp_path / "mufu_probe.npz", rsqrt_off=off)
    text, bad = _lines(tmp_path)
    assert bad == 2, text
    rows = {l.split()[0]: l for l in text.splitlines()[2:]}
    assert "FAIL" in rows["mufu_rsq"] and "FAIL" in rows["mufu_tanh"]
    toks = rows["mufu_tanh"].split()
    assert toks[[t.endswith("%") for t in toks].index(True) + 1] == "1"      # worst ulp


def test_ops_rows_are_reported_per_family(tmp_path):
    rec = ROOT / "results" / "sim-ops-h100-2026-11-24"
    for f in ("sim_ops_gpu.npz", "sim_ops_gpu.json"):
        shutil.copy(rec / f, tmp_path / f)
    text, bad = _lines(tmp_path)
    fams = [l for l in text.splitlines() if l.startswith("ops:")]
    assert len(fams) >= 5 and all("reported" in l for l in fams), text
    assert any(l.startswith("ops:matmul") and "100.0000%" in l for l in fams)
    assert bad == 0
