"""`spak sweep --ray` on a local Ray instance with fake GPU resources and the fake timing
backend (spak.tune.worker.FakeRunner). Skipped where Ray is not installed (it is the
optional `cluster` extra, not part of `test`), except in CI, which installs it (ci/cpu.sh):
there a missing Ray fails (tests/tools.py)."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest

from spak.attention.problems import select_cases
from spak.results.jsonl import ResultsWriter, read_results
from spak.tune import jobs as tj, runner as tr, space as ts

from tests import tools  # noqa: E402
ray = tools.import_or_skip("ray", 'pip install -e ".[cluster]"')
from spak.tune import cluster  # noqa: E402  (after the skip: it is for --ray only)

pytestmark = pytest.mark.slow
SHAPES = ["2x4x256x64/causal", "1x4x300x64/noncausal", "4x4x256x64/causal",
          "1x2x200x128/causal"]
SPACE = ["TILE_M=64,128", "TILE_N=64", "occupancy=1,2", "num_ctas=1"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _jobs():
    specs = select_cases(SHAPES, dtype="fp16")
    return tj.plan_jobs("fused", specs, ts.expand_space(ts.parse_space_args(SPACE)),
                        arch="sm_90")


def _run(tmp_path, fake, done=frozenset(), out=None):
    out = out or tmp_path / "ray.jsonl"
    opts = tr.SweepOptions(timeout=5.0, compile_jobs=0, runner="fake:" + json.dumps(fake),
                           quiet=True)
    s = cluster.RaySweep(out, opts, address="auto", echo=lambda m: None)
    hello = s.start_worker()
    writer = ResultsWriter(out)
    res = s.run(_jobs(), writer, {"gpu": hello["gpu"], "arch": "sm_90", "commit": "abc"},
                done=done)
    writer.close()
    return s, res, out


def _results(path):
    return [r for r in read_results(path) if r.get("kind") == "result"]


def test_groups_share_compile_units_and_keep_their_peers():
    jobs = _jobs()
    groups = cluster.job_groups(jobs)
    # 2x4x256x64 and 4x4x256x64 (causal, D=64, B a multiple of 16 neither: same cubins)
    cases = [sorted({j.case for j in g}) for g in groups]
    assert ["2x4x256x64/fp16/causal", "4x4x256x64/fp16/causal"] in cases
    assert sorted(j.key for g in groups for j in g) == sorted(j.key for j in jobs)
    # resumed: a group with configs left keeps its peers and default; a finished one goes
    done = {j.key for j in jobs if j.case == "1x4x300x64/fp16/noncausal"} | \
        {j.key for j in jobs if j.case == "1x2x200x128/fp16/causal" and j.config_id != "64x64/o1/c1"}
    again = {j.case: [j.config_id if j.config else j.provider for j in g]
             for g in cluster.job_groups(jobs, done) for j in g}
    assert "1x4x300x64/fp16/noncausal" not in again
    assert sorted(again["1x2x200x128/fp16/causal"]) == \
        sorted(["sdpa-cudnn", "sdpa-flash", "default", "64x64/o1/c1"])


def test_ray_tasks_time_every_job_once_peers_on_their_configs_gpu(tmp_path, local_ray):
    s, res, out = _run(tmp_path, {"delay_s": 0.01, "crash": ["128x64/o2/c1@1x4x300x64/fp16/noncausal"]})
    rows = _results(out)
    assert res["stopped"] is None and res["left"] == 0
    assert Counter((r["case"], r["provider"], r["config_id"]) for r in rows) == \
        Counter(j.key for j in _jobs())
    where = defaultdict(set)
    for r in rows:
        where[r["case"]].add((r["host"], r["gpu_index"]))
    assert all(len(w) == 1 for w in where.values()) and \
        {i for w in where.values() for _, i in w} <= {0, 1}
    crash = next(r for r in rows if r["config_id"] == "128x64/o2/c1"
                 and r["case"] == "1x4x300x64/fp16/noncausal")
    assert crash["status"] == "crash" and crash["attempts"] == 2     # retried in the task
    assert s.gpu_names() == ["Fake GPU"] and s.frame_fields()["ray"]["gpus"] == 2


def test_ray_resume_runs_what_is_left_beside_fresh_peers(tmp_path, local_ray):
    _, _, out = _run(tmp_path, {"delay_s": 0.0})
    first = _results(out)
    keep = [r for r in first if r["config_id"] != "128x64/o1/c1"]
    out.write_text("".join(json.dumps(r) + "\n" for r in keep))
    from spak.tune.sweep import done_keys
    done = done_keys(read_results(out), None, "fused", False)
    _, res, _ = _run(tmp_path, {"delay_s": 0.0}, done=done, out=out)
    rows = _results(out)
    assert {(r["case"], r["provider"], r["config_id"]) for r in rows} == {j.key for j in _jobs()}
    assert res["finished"] == len(SHAPES) * (1 + 2 + 1)       # the config, peers, default
