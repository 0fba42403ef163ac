"""`spak sweep --gpus` on the CPU: one worker per GPU fed from one queue, with the fake
timing backend (spak.tune.worker.FakeRunner) in real worker subprocesses.

Covered: nothing lost, nothing doubled (every job has a row; every swept config exactly
one; no job twice on one GPU) and every GPU that timed configs of a shape timed its peers
and default too (`_check_rows`); few shapes on more GPUs are shared at the end (work
stealing) instead of splitting 2:1; a worker fault is retried once on another GPU, then
recorded; a worker killed from outside mid-job; a GPU whose worker cannot restart leaves
the sweep and its shapes are timed elsewhere; a driver killed and resumed; the time
breakdown; several GPUs' rows merged by `spak store update` (median per config, spread
recorded).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from spak.attention.problems import select_cases
from spak.results.jsonl import ResultsWriter, read_results
from spak.tune import choose, jobs as tj, merge, runner as tr, space as ts, sweep as tsw

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ["2x4x256x64/causal", "1x4x300x64/noncausal", "1x2x200x128/causal",
          "4x8x1024x64/causal"]
SPACE = ["TILE_M=64,128", "TILE_N=64", "occupancy=1,2", "num_ctas=1"]
PER_CASE = 2 + 1 + 4                      # peers, default, configs


def _results(path) -> list[dict]:
    return [r for r in read_results(path) if r.get("kind") == "result"]


def _sweep(tmp_path, fake: dict, gpus, *, timeout=5.0, shapes=SHAPES, out=None,
           done=frozenset(), claims=None, patch=None, have=frozenset(), space=SPACE):
    out = out or tmp_path / "g.jsonl"
    specs = select_cases(shapes, dtype="fp16")
    jobs = tj.plan_jobs("fused", specs, ts.expand_space(ts.parse_space_args(space)),
                        arch="sm_90")
    opts = tr.SweepOptions(timeout=timeout, compile_jobs=0, runner="fake:" + json.dumps(fake),
                           quiet=True, retry_faults=True)
    s = tr.Sweep(out, opts, gpus=gpus, echo=lambda m: None)
    if patch:
        patch(s)
    hellos = s.start_workers()
    writer = ResultsWriter(out)
    res = s.run(jobs, writer, {"gpu": hellos[0]["gpu"], "arch": "sm_90", "commit": "abc",
                               "host": "h"}, done=done, claims=claims,
                have_anchors=have)
    writer.close()
    return s, jobs, res, out


def _check_rows(rows, jobs) -> None:
    """Nothing lost, nothing doubled, comparisons on one GPU (see the module doc)."""
    keys = {j.key for j in jobs}
    assert {(r["case"], r["provider"], r["config_id"]) for r in rows} == keys     # none lost
    per_gpu = Counter((r["case"], r["provider"], r["config_id"], r["gpu_index"]) for r in rows)
    assert set(per_gpu.values()) == {1}, [k for k, n in per_gpu.items() if n > 1]
    configs = Counter((r["case"], r["config_id"]) for r in rows
                      if r["provider"] == "spak-fused" and r["config_id"] != "default")
    assert set(configs.values()) == {1}, [k for k, n in configs.items() if n > 1]
    anchors = {(j.case, j.provider, j.config_id) for j in jobs if j.anchor}
    for r in rows:
        for a in (k for k in anchors if k[0] == r["case"]):
            assert (*a, r["gpu_index"]) in per_gpu, (r["case"], r["gpu_index"], a)


def _gpu_of_case(rows) -> dict:
    by_case = defaultdict(set)
    for r in rows:
        by_case[r["case"]].add(r["gpu_index"])
    return by_case


def test_one_queue_many_gpus_each_shape_on_one_gpu(tmp_path):
    s, jobs, res, out = _sweep(tmp_path, {"delay_s": 0.02}, ["0", "1", "2"])
    rows = _results(out)
    assert res["left"] == 0 and res["stopped"] is None and s.worker_starts == 3
    _check_rows(rows, jobs)
    assert all(r["gpu"] == "Fake GPU" and r["gpu_index"] in (0, 1, 2) for r in rows)
    assert len(set().union(*_gpu_of_case(rows).values())) == 3  # all GPUs worked
    # the largest shape (most modelled work) is claimed first
    first = {r["gpu_index"]: r["case"] for r in reversed(rows)}
    assert "4x8x1024x64/fp16/causal" in first.values()
    b = s.breakdown()
    assert [g["gpu_index"] for g in b["gpus"]] == [0, 1, 2]
    assert sum(g["jobs"] for g in b["gpus"]) == len(rows)
    for g in b["gpus"]:
        assert g["startup_s"] > 0 and g["busy_s"] >= g["jobs"] * 0.02
        assert g["busy_s"] + g["wait_compile_s"] + g["tail_s"] <= b["run_s"] + 0.5


def test_shapes_that_share_variants_stay_on_one_gpu(tmp_path):
    """8 shapes in 4 groups that share their compile units (head dim x causal), 4 GPUs:
    each variant's first launch (~0.13 s per worker on an H200) is paid on one GPU only.
    Before, the 4 largest shapes (one per group) went one to a GPU and the small ones to
    whichever GPU was free: a variant on 2 GPUs (the H200 run: 304 first launches on 4
    GPUs, 152 on one)."""
    shapes = [f"{s}x{d}/{c}" for d in (64, 128) for c in ("causal", "noncausal")
              for s in ("4x8x512", "2x8x1024")]
    s, jobs, res, out = _sweep(tmp_path, {"delay_s": 0.02}, ["0", "1", "2", "3"],
                               shapes=shapes)
    rows = _results(out)
    assert res["left"] == 0
    _check_rows(rows, jobs)
    unit = {j.key: j.unit["unit_id"] for j in jobs if j.unit}
    gpus_of_unit = defaultdict(set)
    for r in rows:
        if (r["case"], r["provider"], r["config_id"]) in unit:
            gpus_of_unit[unit[r["case"], r["provider"], r["config_id"]]].add(r["gpu_index"])
    assert len(gpus_of_unit) == 4 * (1 + 4)            # 4 groups x (default + 4 configs)
    assert all(len(g) == 1 for g in gpus_of_unit.values()), dict(gpus_of_unit)
    assert len(set().union(*gpus_of_unit.values())) == 4          # every GPU worked
    assert Counter(r["gpu_index"] for r in rows) == {g: 2 * PER_CASE for g in range(4)}


def test_workers_spawn_before_the_helpers_and_start_up_phases_are_reported(tmp_path):
    """The CLI warms the compile helpers before starting the workers; the helpers spawn
    after the workers all the same (first in line for whatever the start-ups contend for).
    The breakdown has each GPU's start-up phases and the helpers' time to ready."""
    from spak.tune.timeline import breakdown_lines
    specs = select_cases(SHAPES[:2], dtype="fp16")
    jobs = tj.plan_jobs("fused", specs, ts.expand_space(ts.parse_space_args(SPACE)),
                        arch="sm_90")
    fake = {"delay_s": 0.01, "startup_s": 0.3, "compile_delay_s": 0.01}
    opts = tr.SweepOptions(timeout=10, compile_jobs=2, runner="fake:" + json.dumps(fake),
                           quiet=True, retry_faults=True)
    out = tmp_path / "w.jsonl"
    s = tr.Sweep(out, opts, gpus=["0", "1"], echo=lambda m: None)
    s.compiler.warm()                            # as spak sweep does, before the workers
    assert s.compiler.helpers == []
    s.start_workers()
    spawned = [sl.worker.started for sl in s.slots]
    assert len(s.compiler.helpers) == 2
    assert max(spawned) <= min(h.started for h in s.compiler.helpers)
    w = ResultsWriter(out)
    res = s.run(jobs, w, {"gpu": "Fake GPU", "arch": "sm_90", "commit": "x", "host": "h"})
    w.close()
    assert res["left"] == 0
    b = s.breakdown()
    for g in b["gpus"]:
        ph = g["startup_phases"]
        assert set(ph) == {"interpreter", "fake_startup", "other"}
        assert ph["fake_startup"] == 0.3 and 0 < ph["interpreter"] < g["startup_s"]
        assert abs(sum(ph.values()) - g["startup_s"]) < 0.05
    r = b["compile"]["ready_s"]
    assert 0.3 <= r["min"] <= r["median"] <= r["max"] < 30
    assert b["compile"]["phases"]["fake_startup"] == 0.3
    text = "\n".join(breakdown_lines(b))
    assert "compile helpers ready" in text and "(python " in text and "fake start-up 0.3" in text


def test_few_shapes_are_shared_at_the_end_not_split_2_to_1(tmp_path):
    """3 shapes on 2 GPUs: the first real 2-GPU run split its 39 jobs 26/13; with work
    stealing the GPU left without a shape helps with one (its anchors timed again)."""
    space = ["TILE_M=64,128", "TILE_N=64,128", "occupancy=1,2,3", "num_ctas=1"]
    s, jobs, res, out = _sweep(tmp_path, {"delay_s": 0.05}, ["0", "1"], shapes=SHAPES[:3],
                               space=space)
    rows = _results(out)
    assert res["left"] == 0
    _check_rows(rows, jobs)
    n = Counter(r["gpu_index"] for r in rows)
    assert n[0] + n[1] == 3 * (3 + 12) + 3              # one shape shared: its 3 anchors twice
    assert abs(n[0] - n[1]) <= 4, n                     # not 30 vs 15
    shared = [c for c, g in _gpu_of_case(rows).items() if g == {0, 1}]
    assert len(shared) == 1


def test_a_worker_fault_is_retried_once_then_recorded(tmp_path):
    c = "1x4x300x64/fp16/noncausal"
    fake = {"delay_s": 0.0, "crash": [f"128x64/o2/c1@{c}"], "hang": [f"64x64/o1/c1@{c}"]}
    s, jobs, res, out = _sweep(tmp_path, fake, ["0", "1"], timeout=1.5)
    rows = {(r["case"], r["config_id"]): r for r in _results(out)
            if r["provider"] == "spak-fused"}
    assert res["left"] == 0
    _check_rows(_results(out), jobs)
    crash, hang = rows[(c, "128x64/o2/c1")], rows[(c, "64x64/o1/c1")]
    assert crash["status"] == "crash" and crash["attempts"] == 2
    assert crash["retried_after"].startswith("crash: the worker died (status 13)")
    assert hang["status"] == "timeout" and hang["attempts"] == 2
    assert hang["retried_after"].startswith("timeout: no result within --timeout")
    # each retry ran on the other GPU than its first attempt
    for r in (crash, hang):
        assert r["retried_from"] in (0, 1) and r["gpu_index"] == 1 - r["retried_from"]
    assert all("attempts" not in r for k, r in rows.items() if k not in
               {(c, "128x64/o2/c1"), (c, "64x64/o1/c1")})
    # a fresh worker after each of the 4 faults, unless its GPU had nothing left to run
    assert 2 + 1 <= s.worker_starts <= 2 + 4
    assert s.breakdown()["gpus"][0]["fault_s"] + s.breakdown()["gpus"][1]["fault_s"] >= 1.5 * 2


def test_a_config_that_hangs_one_gpu_times_out_there_and_runs_on_another(tmp_path,
                                                                         monkeypatch):
    """$SPAK_SWEEP_FAULTS (the GPU script's fault runs use it on real GPUs): a config that
    hangs on gpu1 only is killed at --timeout, retried on gpu0 (ok there, "retried_from"
    1), gpu1's fresh worker goes on with the rest; nothing lost, nothing doubled."""
    c = "4x8x1024x64/fp16/causal"
    monkeypatch.setenv("SPAK_SWEEP_FAULTS", json.dumps({"1": {"hang": ["64x64/o2/c1"]}}))
    s, jobs, res, out = _sweep(tmp_path, {"delay_s": 0.01}, ["0", "1"], timeout=1.5)
    rows = _results(out)
    assert res["left"] == 0 and res["stopped"] is None
    _check_rows(rows, jobs)
    retried = [r for r in rows if r.get("attempts") == 2]
    assert retried and all(r["status"] == "ok" and r["gpu_index"] == 0
                           and r["retried_from"] == 1 and r["config_id"] == "64x64/o2/c1"
                           and r["retried_after"].startswith("timeout") for r in retried)
    assert all(r["status"] == "ok" for r in rows)
    assert any(r["gpu_index"] == 1 and r["case"] != c for r in rows)   # gpu1 went on
    assert s.breakdown()["gpus"][1]["fault_s"] >= 1.5


def test_fault_injection_reads_only_this_gpus_entry():
    from spak.tune import worker as tw
    base = tw.FakeRunner({})
    assert tw.with_faults(base, {}) is base
    env = {"SPAK_SWEEP_FAULTS": '{"1": {"crash": ["a"]}}', "CUDA_VISIBLE_DEVICES": "0"}
    assert tw.with_faults(base, env) is base
    inj = tw.with_faults(base, {**env, "CUDA_VISIBLE_DEVICES": "1"})
    assert isinstance(inj, tw.FaultInjector) and inj._hit("crash", {"config_id": "a",
                                                                   "case": "x"})
    assert inj.hello()["gpu"] == "Fake GPU"
    with pytest.raises(ValueError, match="SPAK_SWEEP_FAULTS"):
        tw.with_faults(base, {"SPAK_SWEEP_FAULTS": "[1]"})


def test_a_once_fault_hangs_one_gpu_once(tmp_path, monkeypatch):
    """"once": the first job of the config on gpu1 hangs; the others (on any GPU) run."""
    marker = tmp_path / "fired"
    monkeypatch.setenv("SPAK_SWEEP_FAULTS", json.dumps(
        {"1": {"hang": ["64x64/o1/c1", "128x64/o1/c1"], "once": str(marker)}}))
    s, jobs, res, out = _sweep(tmp_path, {"delay_s": 0.01}, ["0", "1"], timeout=1.5)
    rows = _results(out)
    _check_rows(rows, jobs)
    assert marker.exists() and all(r["status"] == "ok" for r in rows)
    assert len([r for r in rows if r.get("attempts") == 2]) == 1


def test_a_gpu_whose_worker_cannot_restart_leaves_and_its_shapes_move(tmp_path):
    fake = {"delay_s": 0.01, "crash": ["128x64/o2/c1"]}

    def patch(s):
        real = s.start_worker

        def start_worker(slot=None):
            if slot is not None and slot.gpu == "1" and s.worker_starts >= 2:
                raise RuntimeError("CUDA error: unspecified launch failure (device lost)")
            return real(slot)
        s.start_worker = start_worker
    s, jobs, res, out = _sweep(tmp_path, fake, ["0", "1"], patch=patch)
    rows = _results(out)
    assert res["left"] == 0 and res["stopped"] is None
    assert s.slots[1].retired and "device lost" in s.slots[1].retired
    _check_rows([r for r in rows if r["status"] == "ok" or "attempts" in r], jobs)
    # a shape gpu1 had started is timed whole on gpu0 too: its peers and default again
    moved = [c for c, g in _gpu_of_case(rows).items() if g == {0, 1}]
    assert moved
    for c in moved:
        on0 = {r["config_id"] if r["provider"].startswith("spak") else r["provider"]
               for r in rows if r["case"] == c and r["gpu_index"] == 0}
        assert {"sdpa-cudnn", "sdpa-flash", "default"} <= on0


def test_resume_keeps_each_shape_on_its_gpu(tmp_path):
    out = tmp_path / "r.jsonl"
    rows = _results(_sweep(tmp_path, {"delay_s": 0.0}, ["0", "1"], out=out)[3])
    half = [r for r in rows if r["config_id"] not in ("128x64/o1/c1", "128x64/o2/c1")]
    out.write_text("".join(json.dumps({**r, "host": "h"}) + "\n" for r in half))
    done, claims = tsw.done_by_gpu(read_results(out), {"0": "Fake GPU", "1": "Fake GPU"},
                                   "fused", False, host="h")
    assert done == {(r["case"], r["provider"], r["config_id"]) for r in half}
    assert claims == {r["case"]: str(r["gpu_index"]) for r in reversed(half)}
    have = tsw.anchors_by_gpu(read_results(out), {"0": "Fake GPU", "1": "Fake GPU"},
                              "fused", False, host="h")
    assert have == {(r["case"], r["provider"], r["config_id"], str(r["gpu_index"]))
                    for r in half if r["provider"] != "spak-fused" or r["config_id"] == "default"}
    # GPU 1 is not in this run: its shapes run again whole, on GPU 0
    d0, c0 = tsw.done_by_gpu(read_results(out), {"0": "Fake GPU"}, "fused", False, host="h")
    assert set(c0.values()) == {"0"} and len(d0) < len(done)
    assert not tsw.done_by_gpu(read_results(out), {"0": "Fake GPU"}, "fused", False,
                               host="other")[0]
    _, jobs, res, _ = _sweep(tmp_path, {"delay_s": 0.0}, ["0", "1"], out=out, done=done,
                             claims=claims, have=have)
    after = _results(out)
    assert after[:len(half)] == half
    _check_rows(after, jobs)


# ------------------------------------------------------------------ the real command

def _cli(args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "spak", "sweep", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, **kw)


def _wait_rows(out, n, proc, limit=60, until=lambda rows: True):
    """Until `out` holds n result rows and until(rows) holds, the process ends, or `limit` s."""
    t = time.time()
    while time.time() - t < limit and proc.poll() is None:
        rows = _results(out)
        if len(rows) >= n and until(rows):
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_cli_worker_killed_mid_job_and_driver_killed_then_resumed(tmp_path):
    out = tmp_path / "k.jsonl"
    args = ["--runner", "fake:" + json.dumps({"delay_s": 0.4}), "--shapes", *SHAPES,
            "--space", *SPACE, "--out", str(out), "--compile-jobs", "0", "--gpus", "0,1"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "spak", "sweep", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_rows(out, 3, proc)
    start = next(r for r in read_results(out) if r.get("kind") == "start")
    victim = start["gpus"][1]["pid"]
    os.kill(victim, signal.SIGKILL)                   # a worker, mid-job
    # the killed job's retry runs on a fresh worker (process start-up: seconds on a loaded
    # 2-core machine, while the other GPU goes on writing rows): wait for it too
    _wait_rows(out, 12, proc, until=lambda rows: any(r.get("attempts") == 2 for r in rows))
    proc.send_signal(signal.SIGKILL)                  # then the driver
    proc.wait()
    before = _results(out)
    assert 12 <= len(before) < len(SHAPES) * PER_CASE
    retried = [r for r in before if r.get("attempts") == 2]
    assert len(retried) == 1 and retried[0]["status"] == "ok" and \
        retried[0]["retried_after"].startswith("crash: the worker died (signal 9)")
    again = _cli(args + ["--resume"], timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    rows = _results(out)
    assert rows[:len(before)] == before                       # nothing finished was lost
    specs = select_cases(SHAPES, dtype="fp16")
    _check_rows(rows, tj.plan_jobs("fused", specs,
                                   ts.expand_space(ts.parse_space_args(SPACE)), arch="sm_90"))
    assert "2 GPUs (gpu0 Fake GPU, gpu1 Fake GPU)" in again.stdout


def test_cli_gpus_argument_errors(tmp_path):
    for bad, msg in (("0,,1", "comma-separated"), ("0,0", "twice"), ("x", "comma-separated")):
        r = _cli(["--runner", "fake:{}", "--gpus", bad, "--shapes", SHAPES[0],
                  "--out", str(tmp_path / "e.jsonl")], timeout=60)
        assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert tsw.gpu_list("0, 3") == ["0", "3"]
    os.environ["CUDA_VISIBLE_DEVICES"], old = "2,GPU-abc", os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        assert tsw.gpu_list("all") == ["2", "GPU-abc"]
    finally:
        if old is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


# ------------------------------------------------------------------ merging GPUs

def _row(gpu_index, tflops, cid="64x64", *, host="h", gpu="NVIDIA H100 80GB HBM3",
         date="2026-11-24T00:00:00Z", S=2048):
    B = 16384 // S
    return {"schema": "spak.sweep/2", "kind": "result", "family": "fmha_fwd",
            "gpu": gpu, "host": host, "gpu_index": gpu_index, "kernel": "fused",
            "case": f"{B}x32x{S}x64/fp16/noncausal", "B": B, "Hq": 32, "Hkv": 32, "Sq": S,
            "Sk": S, "D": 64, "dtype": "fp16", "causal": False, "provider": "spak-fused",
            "config_id": cid, "status": "ok", "tflops": tflops, "ms_median": 1000.0 / tflops,
            "config": {"TILE_M": int(cid.split("x")[0]), "TILE_N": 64, "occupancy": None,
                       "num_ctas": None}, "date": date}


def test_merge_takes_the_median_across_gpus_and_reports_the_spread():
    rows = [_row(0, 300.0), _row(1, 330.0), _row(2, 310.0),
            _row(1, 320.0, date="2026-11-25T00:00:00Z"),        # gpu1 again: replaces 330
            _row(0, 500.0, gpu="NVIDIA H200"),                  # another model: its own row
            {**_row(3, 1.0), "status": "crash", "tflops": None}]  # a failure does not count
    merged = merge.merge_gpu_rows(rows)
    h100 = next(r for r in merged if r["gpu"] == "NVIDIA H100 80GB HBM3")
    assert len(merged) == 2 and h100["gpus"] == 3 and h100["tflops"] == 310.0
    assert h100["tflops_spread"] == pytest.approx((320.0 - 300.0) / 310.0)
    assert sorted(h100["gpu_indices"]) == [0, 1, 2]
    # one failing GPU alone keeps its failure
    assert merge.merge_gpu_rows([rows[-1]])[0]["status"] == "crash"


def test_store_update_merges_gpus_of_one_model(tmp_path):
    rows = [_row(0, 300.0), _row(1, 340.0), _row(2, 320.0),         # 64x64: median 320
            _row(0, 330.0, "128x64"), _row(1, 250.0, "128x64"), _row(2, 260.0, "128x64")]
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (e,) = choose.choose(read_results(p))
    assert e["tiles"] == {"TILE_M": 64, "TILE_N": 64}                # 320 > median 260
    assert e["tflops"] == 320.0 and e["gpus"] == 3
    assert e["tflops_spread"] == pytest.approx(40.0 / 320.0, abs=1e-4)
    lines = choose.update_store([p], tmp_path / "s.json")
    assert "wrote 1 entries" in lines[-1]


def test_gpus_that_disagree_beyond_the_spread_are_named_everywhere(tmp_path):
    """A GPU 25% slow on one config: the merged row says which GPU gave what, `spak sweep`'s
    lines, `spak report` and `spak store update` name it; GPUs within the noise do not."""
    same = merge.merge_gpu_rows([{**_row(0, 300.0), "spread": 0.01},
                                 {**_row(1, 306.0), "spread": 0.01}])[0]
    assert same["gpus_disagree"] is False and same["gpu_tflops"] == {"gpu0": 300.0,
                                                                     "gpu1": 306.0}
    noisy = merge.merge_gpu_rows([{**_row(0, 300.0), "spread": 0.06},
                                  {**_row(1, 340.0), "spread": 0.06}])[0]
    assert noisy["gpus_disagree"] is False                # 13% < 3 x the rows' 6% spread
    rows = [{**_row(0, 320.0), "spread": 0.01}, {**_row(1, 240.0), "spread": 0.01},
            {**_row(2, 322.0), "spread": 0.01},
            _row(0, 250.0, "128x64"), _row(1, 252.0, "128x64"), _row(2, 251.0, "128x64")]
    merged = merge.merge_gpu_rows(rows)
    bad = next(r for r in merged if r["config_id"] == "64x64")
    assert bad["gpus_disagree"] is True and bad["gpu_tflops"]["gpu1"] == 240.0
    (line,) = merge.disagreement_lines(merged)
    assert "64x64" in line and "gpu1 240.0" in line and "gpu0 320.0" in line
    two_hosts = merge.merge_gpu_rows([_row(0, 300.0), _row(0, 200.0, host="k")])[0]
    assert set(two_hosts["gpu_tflops"]) == {"h/gpu0", "k/gpu0"}
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (e,) = choose.choose(read_results(p))
    assert e["tiles"]["TILE_M"] == 64 and set(e["gpus_disagree"]) == {bad["case"]}
    lines = choose.update_store([p], tmp_path / "s.json")
    assert "WARNING: its GPUs disagree" in lines[0] and "gpu1 240.0" in lines[0]
    from spak.report.load import load_rows
    from spak.report.tables import markdown
    md = markdown(load_rows([p]), sources=[str(p)], plots={}, leaderboard=None)
    assert "## GPUs of one model that disagree" in md and "gpu1 240.0" in md
    assert md.count("| NVIDIA H100 80GB HBM3 | ") == 1      # only the 64x64 row


# ------------------------------------------------------------------ --ray without Ray

def test_ray_mode_without_ray_says_how_to_install(tmp_path, monkeypatch, capsys):
    from spak.cli import main
    monkeypatch.setitem(sys.modules, "ray", None)           # as where Ray is not installed
    out = str(tmp_path / "r.jsonl")
    base = ["sweep", "--runner", "fake:{}", "--shapes", SHAPES[0], "--out", out]
    assert main(base + ["--ray"]) == 1
    assert 'spak sweep --ray needs Ray: pip install -e ".[cluster]"' in capsys.readouterr().err
    assert main(base + ["--ray", "local", "--gpus", "0,1"]) == 2
    assert "--gpus and --ray exclude each other" in capsys.readouterr().err
