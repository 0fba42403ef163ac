"""ci/fwd_store_resweep.py on the CPU: the pick among passes and the store it writes
(a fake runner stands in for the GPU)."""
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ci"))
import fwd_store_resweep as rs  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


def test_top_configs_needs_every_case():
    tf = {"a": {"s1": 100.0, "s2": 100.0}, "b": {"s1": 300.0}, "c": {"s1": 90.0, "s2": 120.0}}
    assert rs.top_configs(tf, ["s1", "s2"], 2) == ["c", "a"]     # b lacks s2: out
    assert rs.top_configs(tf, ["s1"], 1) == ["b"]


def test_median_rows_only_retimed_configs_compete():
    def row(cid, tf):
        return {"case": "x", "config_id": cid, "status": "ok", "tflops": tf, "ms_median": 1 / tf}
    rows = [row("lucky", 500.0), row("timed", 100.0), row("timed", 120.0), row("timed", 110.0),
            {**row("timed", 1.0), "status": "wrong_result", "tflops": None}]
    med = rs.median_rows(rows)
    assert [r["config_id"] for r in med] == ["timed"]
    assert med[0]["tflops"] == 110.0 and med[0]["passes"] == 3


def test_groups_and_candidates_cover_the_cells():
    gs = rs.groups()
    cells = {g["cell"] for g in gs}
    assert cells == set(rs.CELLS)
    for g in gs:
        dt, D, causal, bucket = g["cell"]
        assert all(c["TILE_N"] in (64, 128) and c["TILE_M"] in (64, 128) for c in g["configs"])
        assert not any(c["TILE_M"] == 64 and c.get("num_ctas") == 2 for c in g["configs"])
        assert all(("/" + dt + "/") in case for case in g["cases"])
        assert all(case.endswith("/causal" if causal else "/noncausal") for case in g["cases"])
    assert any(not g["store"] for g in gs)                 # the S=512 seeds ride along


def test_run_group_and_store_update_with_a_fake_runner(tmp_path):
    from spak.tune.choose import update_store
    from spak.tune import store as tuned
    from spak.tune.worker import FakeRunner

    class Fake(FakeRunner):
        def __init__(self):
            # the sample's config wins clearly; everything else at a made-up figure
            super().__init__({"delay_s": 0, "tflops": {"64x64/o4/c1/LAT_K=2/LAT_V=0": 900.0}})
            self.info = {"gpu": H100, "arch": "sm_90", "torch": None, "cuda_tile": None}
    g = next(g for g in rs.groups() if g["cell"] == ("fp16", 64, True, 512) and g["store"])
    rs.add_incumbent(g, H100)
    assert g["incumbent"] in g["configs"]
    rows = rs.run_group(Fake(), g, {"sweep_id": "t", "commit": "t"}, lambda m: None)
    passes = {r["config_id"]: 0 for r in rows}
    for r in rows:
        passes[r["config_id"]] += 1
    assert passes["64x64/o4/c1/LAT_K=2/LAT_V=0"] == 3        # top: re-timed twice
    assert sum(n == 3 for n in passes.values()) <= rs.RETIME + 1
    for r in rows:
        r["group"] = "store"
    p = tmp_path / "choose.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rs.median_rows(rows)))
    store = tmp_path / "store.json"
    shutil.copy(ROOT / "spak" / "data" / "tuned_configs.json", store)
    update_store([p], path=store, gpu=H100, kernel="fused")
    t = tuned.lookup(H100, "fused", "fp16", 64, True, 512, path=store, strict=True)
    assert t == {"TILE_M": 64, "TILE_N": 64, "occupancy": 4, "num_ctas": 1,
                 "LAT_K": 2, "LAT_V": 0}
    # other cells untouched
    assert tuned.lookup(H100, "fused", "bf16", 128, False, 8192, path=store) == \
        tuned.lookup(H100, "fused", "bf16", 128, False, 8192)


@pytest.mark.parametrize("D,bucket", [(64, 2048), (128, 16384)])
def test_filters(D, bucket):
    gs = [g for g in rs.groups() if g["cell"][1] == D and g["cell"][3] <= bucket and g["store"]]
    assert gs and all(g["store"] for g in gs)
