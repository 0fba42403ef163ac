"""`spak calibrate --record DIR` then `spak calibrate --check --data DIR` on a CUDA GPU
(skipped without one): the flow an owner of a GPU we lack (RTX 5070, L4) runs, proven on
one we have. On an H100/H200 the record is checked with the sm_90 model, which was measured
on those GPUs: every op it claims bit for bit must come out 100%, the FMHA cases too, and a
record with one changed bit must fail.

It records with `--quick` (meant for under 2 minutes: every exact op is still recorded,
the FMHA cases on two small shapes, no per-op kernels; the full record was cut by a 150 s
limit on an H200 in its MUFU.RSQ + tanh survey step, before the per-op kernels started);
SPAK_CALIBRATE_FULL=1 records the full one. SPAK_CALIBRATE_OUT=DIR keeps the record (the
GPU job copies it home).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

FULL = os.environ.get("SPAK_CALIBRATE_FULL") == "1"
#: rows of --check's table the measured sm_90 model must match bit for bit on an H100/H200
EXACT_ON_SM90 = ("mma", "rowsum", "cast_f16", "cast_bf16", "mufu_exp2", "mufu_rcp",
                 "mufu_rsq", "mufu_tanh", "fmha")


def _rows(out):
    """{op: [percent, ...]} from --check's table."""
    rows: dict = {}
    for line in out.splitlines():
        parts = line.split()
        pct = [p for p in parts if p.endswith("%")]
        if parts and pct:
            rows.setdefault(parts[0], []).append(float(pct[0].rstrip("%")))
    return rows


@pytest.fixture
def recorded(tmp_path_factory):
    from spak.cli import main
    keep = os.environ.get("SPAK_CALIBRATE_OUT")
    data = Path(keep) if keep else tmp_path_factory.mktemp("calib")
    assert main(["calibrate", "--record", str(data), *([] if FULL else ["--quick"])]) == 0
    return data


def test_record_then_check_on_this_gpu(recorded, capsys, tmp_path):
    import torch
    from spak.cli import main
    from spak.device.archs import from_torch
    arch = from_torch()[0]
    meta = json.loads((recorded / "calibration.json").read_text())
    assert meta["arch"] == arch and meta["gpu"] == torch.cuda.get_device_name()
    assert meta["steps"]["agreement_cases"] >= 4           # both kernels, both shapes
    tools = ("probes", "tables", "mufu_rsq", "mufu_tanh") + (("ops",) if FULL else ())
    assert all(meta["steps"][s] == 0 for s in tools), meta["steps"]   # exit codes
    assert meta["quick"] is not FULL
    for f in ("probe_mma_fp16_k16.npz", "probe_elementwise.npz", "sm90_mufu.npz",
              "mufu_probe.npz", "tanh_table.npz", "agreement.npz"):
        assert (recorded / f).exists(), f
    capsys.readouterr()
    rc = main(["calibrate", "--check", "--data", str(recorded)])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0 and f"model {arch}" in out, out
    if arch == "sm_90":
        rows = _rows(out)
        for op in EXACT_ON_SM90:
            assert rows.get(op) and all(p == 100.0 for p in rows[op]), (op, rows.get(op))
    # the check can fail on this record: one recorded mma output bit changed
    bad = tmp_path / "bad"
    shutil.copytree(recorded, bad)
    f = bad / "probe_mma_fp16_k64.npz"
    z = dict(np.load(f))
    d = z["mma_fp16_k64_d"].copy()
    d.reshape(-1).view(np.uint32)[7] ^= 1
    z["mma_fp16_k64_d"] = d
    np.savez(f, **z)
    assert main(["calibrate", "--check", "--data", str(bad)]) == 1
    assert "FAIL" in capsys.readouterr().out
