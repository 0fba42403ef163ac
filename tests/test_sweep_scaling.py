"""How `spak sweep --gpus` scales, on the CPU with fake workers (sleeping jobs, so the
2-core machine is not the limit), and spak.tune.scaling, the analysis of the GPU runs of
issue 36 (ranking agreement, per-GPU speed, fault checks)."""
from __future__ import annotations

import json
import statistics

from spak.attention.problems import select_cases
from spak.results.jsonl import ResultsWriter
from spak.tune import jobs as tj, runner as tr, scaling as sc, space as ts

SHAPES = ["2x4x256x64/causal", "1x4x300x64/noncausal", "1x2x200x128/causal",
          "4x8x1024x64/causal"]
SPACE = ["TILE_M=64,128", "TILE_N=64,128", "occupancy=1,2,3", "num_ctas=1"]


def _run(tmp_path, gpus, name):
    specs = select_cases(SHAPES, dtype="fp16")
    jobs = tj.plan_jobs("fused", specs, ts.expand_space(ts.parse_space_args(SPACE)),
                        arch="sm_90")
    opts = tr.SweepOptions(timeout=30, compile_jobs=0, quiet=True, retry_faults=True,
                           runner="fake:" + json.dumps({"delay_s": 0.08}))
    out = tmp_path / f"{name}.jsonl"
    s = tr.Sweep(out, opts, gpus=gpus, echo=lambda m: None)
    s.start_workers()
    w = ResultsWriter(out)
    res = s.run(jobs, w, {"gpu": "Fake GPU", "arch": "sm_90", "commit": "x", "host": "h"})
    w.write({"schema": tr.SCHEMA, "kind": "end", "status": "complete", "gpu": "Fake GPU",
             "wall_s": s.breakdown()["wall_s"], "breakdown": s.breakdown(),
             **s.frame_fields()})
    w.close()
    return s, jobs, res


def test_four_gpus_take_a_quarter_of_the_job_time_plus_little(tmp_path):
    """The jobs phase (start-up excluded: the GPU runs report it apart) on 4 GPUs within
    1.2/4 of one GPU's, the work balanced (the 4 shapes are unequal: the big one is
    shared at the end), every GPU busy at least 80% of the phase."""
    s1, jobs, _ = _run(tmp_path, ["0"], "n1")
    s4, _, res = _run(tmp_path, ["0", "1", "2", "3"], "n4")
    b1, b4 = s1.breakdown(), s4.breakdown()
    assert res["left"] == 0
    assert b4["run_s"] <= 1.2 / 4 * b1["run_s"] + 0.5, (b1["run_s"], b4["run_s"])
    for g in b4["gpus"]:
        assert g["busy_s"] >= 0.8 * statistics.median(x["busy_s"] for x in b4["gpus"])
    res = sc.analyze(tmp_path)
    assert res["scaling"]["n4"]["gpus"] == 4 and res["scaling"]["n4"]["vs_n1"] < 1
    assert res["ranking"]["n4"]["same"] == len(SHAPES)        # the fake's figures: same
    assert set(res["per_gpu"]["n4"]) == {"0", "1", "2", "3"}
    lines = sc.summary_lines(res)
    assert any(x.startswith("n4 ") for x in lines)


def _r(case, cid, tf, gpu=0, provider="spak-fused", **kw):
    return {"kind": "result", "case": case, "provider": provider, "config_id": cid,
            "status": "ok", "tflops": tf, "gpu": "G", "host": "h", "gpu_index": gpu,
            "kernel": "fused", "family": "fmha_fwd", **kw}


def test_ranking_tells_ties_from_real_differences():
    a = [_r("s1", "A", 300.0), _r("s1", "B", 295.0),          # A by 1.7%: a tie
         _r("s2", "A", 300.0), _r("s2", "B", 200.0),          # same winner
         _r("s3", "A", 300.0), _r("s3", "B", 250.0)]
    b = [_r("s1", "A", 296.0), _r("s1", "B", 299.0),
         _r("s2", "A", 310.0), _r("s2", "B", 200.0),
         _r("s3", "A", 240.0), _r("s3", "B", 290.0)]          # B wins by 21%, A had 20%
    r = sc.ranking(a, b)
    assert r["shapes"] == 3 and r["same"] == 1
    assert [x["case"] for x in r["ties"]] == ["s1"]
    assert [x["case"] for x in r["differ"]] == ["s3"]


def test_ranking_margins_within_the_rows_spread_are_not_real_differences():
    """The H200 run's 16x16x1024x128 noncausal: winners 3.7% and 7.1% apart, but the rows'
    batches spread 6.5-11% (IQR / median): not a difference the runs can tell."""
    a = [_r("s1", "A", 529.6, spread=0.111), _r("s1", "B", 494.6, spread=0.069),
         _r("s2", "A", 300.0, spread=0.01), _r("s2", "B", 250.0, spread=0.01)]
    b = [_r("s1", "A", 504.5, spread=0.019), _r("s1", "B", 522.9, spread=0.065),
         _r("s2", "A", 240.0, spread=0.01), _r("s2", "B", 290.0, spread=0.02)]
    r = sc.ranking(a, b)
    assert [x["case"] for x in r["within_spread"]] == ["s1"]
    assert [x["case"] for x in r["differ"]] == ["s2"] and not r["ties"]
    x = r["within_spread"][0]
    assert abs(x["margin_a"] - (529.6 / 494.6 - 1)) < 1e-9 and x["spread_a"] == 0.111
    lines = sc.summary_lines({"scaling": {}, "ranking": {"n4": r}, "per_gpu": {},
                              "disagree": [], "faults": {}})
    assert "1 beyond 3% but within the rows' spread, 1 beyond both" in lines[1]


def test_per_gpu_speed_and_fault_check_find_a_slow_gpu_lost_and_doubled_rows():
    base = [_r("s1", "A", 300.0), _r("s1", "B", 200.0)]
    rows = [_r("s1", "A", 240.0, gpu=1), _r("s1", "B", 161.0, gpu=1),
            _r("s1", "A", 301.0, gpu=0)]
    g = sc.per_gpu_speed(rows, base)
    assert g["1"]["n"] == 2 and abs(g["1"]["median"] - 0.8025) < 1e-3
    run = {"rows": [_r("s1", "-", 100.0, provider="sdpa-flash"), _r("s1", "A", 300.0),
                    _r("s1", "A", 310.0), _r("s1", "B", 200.0, gpu=1)], "starts": [{}]}
    c = sc.fault_check(run, {("s1", "sdpa-flash", "-"), ("s1", "spak-fused", "A"),
                             ("s1", "spak-fused", "C")})
    assert c["lost"] == [("s1", "spak-fused", "C")]
    assert c["doubled_on_one_gpu"] == [["s1", "spak-fused", "A", 0]]
    assert c["configs_twice"] == [["s1", "A"]]
    assert c["anchors_missing"] == [["s1", 1]]                # gpu1 timed B without flash


def test_first_launches_count_each_workers_first_launch_of_a_variant():
    """Two shapes with the same compile units (same D, causal, divisibility): on one GPU
    the second shape's launches are repeats; split over two GPUs, both are first launches
    (the 4x H200 run's 304 first launches against 152 on one GPU)."""
    def row(case, cid, gpu, fc):
        cfg = {"TILE_M": 64, "TILE_N": 64, "occupancy": 2, "num_ctas": 1}
        return _r(case, cid, 300.0, gpu=gpu, first_call_s=fc,
                  config=None if cid == "default" else cfg)
    a, b = "4x8x512x64/fp16/causal", "2x8x1024x64/fp16/causal"
    one = [row(a, "64x64/o2/c1", 0, 0.13), row(a, "default", 0, 0.12),
           row(b, "64x64/o2/c1", 0, 0.001), row(b, "default", 0, 0.002),
           _r(a, "-", 400.0, provider="sdpa-flash", first_call_s=0.5)]
    f = sc.first_launches(one)
    assert f["0"]["variants"] == 2 and abs(f["0"]["first_s"] - 0.25) < 1e-9
    assert f["0"]["repeats"] == 2 and abs(f["0"]["repeat_s"] - 0.003) < 1e-9
    two = one[:2] + [row(b, "64x64/o2/c1", 1, 0.14), row(b, "default", 1, 0.11)]
    f = sc.first_launches(two)
    assert f["0"]["variants"] == 2 and f["1"]["variants"] == 2 and f["1"]["repeats"] == 0
