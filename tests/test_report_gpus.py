"""`spak report` over rows of several GPUs of one model (spak sweep --gpus, several hosts):
one row per measurement, the median TFLOPS over the GPUs, with "gpus" and "tflops_spread"
(the rule spak store update uses, spak.tune.merge). Rows of one GPU: the later replaces."""
from __future__ import annotations

from spak.report.load import load_rows
from tests.test_report import _row, _write


def _on(row, index, tflops, host="h1"):
    return {**row, "schema": "spak.sweep/2", "family": "fmha_fwd", "host": host,
            "gpu_index": index, "tflops": tflops}


def test_rows_of_three_gpus_become_their_median(tmp_path):
    base = _row(2048, 64, True, "spak-fused", "64x64/o2", 0.0,
                cfg={"TILE_M": 64, "TILE_N": 64, "occupancy": 2, "num_ctas": None})
    peer = _row(2048, 64, True, "sdpa-cudnn", "-", 300.0)
    rows = [_on(base, 0, 300.0), _on(base, 1, 330.0), _on(base, 2, 360.0), _on(peer, 0, 300.0)]
    got = {(r.provider, r.config_id): r for r in load_rows([_write(tmp_path / "r.jsonl", rows)])}
    assert len(got) == 2
    ours = got[("spak-fused", "64x64/o2")]
    assert ours["tflops"] == 330.0 and ours["gpus"] == 3
    assert abs(ours["tflops_spread"] - 60.0 / 330.0) < 1e-12
    assert got[("sdpa-cudnn", "-")]["tflops"] == 300.0        # one GPU: kept as it is


def test_a_later_row_of_the_same_gpu_replaces_the_earlier(tmp_path):
    base = _row(2048, 64, True, "spak-fused", "64x64/o2", 0.0)
    rows = [_on(base, 0, 100.0), _on(base, 1, 200.0), _on(base, 0, 300.0)]
    (r,) = load_rows([_write(tmp_path / "r.jsonl", rows)])
    assert r["tflops"] == 250.0 and r["gpus"] == 2            # median of 300 and 200
