"""`spak sweep` on the CPU: the scheduler, isolation and resume, with a fake runner.

The worker and the compile helpers are real subprocesses (spak/tune/worker.py); only
what they do per config is faked (spak.tune.worker.FakeRunner): planted compile errors,
launch exceptions, wrong results, NaNs, hangs and crashes. The SIGKILL test kills a real
`python -m spak sweep` in the middle and resumes it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from spak.results.jsonl import ResultsWriter, read_results
from spak.tune import jobs as tj, runner as tr, space as ts, sweep as tsw
from spak.attention.problems import select_cases
from spak.families.fmha_fwd import FAMILY as FWD
from spak.tune.worker import FakeRunner, tiny_dim

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ["2x4x256x64/causal", "1x4x300x64/noncausal", "1x2x200x128/causal"]
SPACE = ["TILE_M=64,128", "TILE_N=64", "occupancy=1,2", "num_ctas=1"]


def _results(path) -> list[dict]:
    return [r for r in read_results(path) if r.get("kind") == "result"]


def _sweep(tmp_path, fake: dict, *, shapes=SHAPES, space=None, timeout=5.0,
           compile_jobs=0, budget_s=None, done=frozenset(), out=None):
    """Run the engine in-process (the worker and helpers are subprocesses)."""
    out = out or tmp_path / "sweep.jsonl"
    specs = select_cases(shapes, dtype="fp16")
    sp = ts.parse_space_args(space or SPACE)
    configs = ts.expand_space(sp)
    jobs = tj.plan_jobs("fused", specs, configs, arch="sm_90")
    opts = tr.SweepOptions(timeout=timeout, budget_s=budget_s, compile_jobs=compile_jobs,
                           runner="fake:" + json.dumps(fake), quiet=True)
    s = tr.Sweep(out, opts)
    hello = s.start_worker()
    writer = ResultsWriter(out)
    res = s.run(jobs, writer, {"gpu": hello["gpu"], "arch": hello["arch"], "commit": "abc"},
                done=done)
    writer.close()
    return s, jobs, res, out


# ------------------------------------------------------------------ spaces and jobs

def test_space_parsing_and_ids():
    sp = ts.parse_space_args(["TILE_M=64,128 tile_n=64", "occupancy=1,auto", "NUM_CTAS=2"])
    assert sp == {"TILE_M": [64, 128], "TILE_N": [64], "occupancy": [1, None], "num_ctas": [2]}
    ids = [ts.config_id(c) for c in ts.expand_space(sp)]
    assert ids == ["64x64/o1/c2", "64x64/c2", "128x64/o1/c2", "128x64/c2"]
    knobs = ts.parse_space_args(["LAT_K=0,4", "lat_v=2"])
    assert knobs == {"LAT_K": [0, 4], "LAT_V": [2]}
    assert ts.config_id({"TILE_M": 64, "TILE_N": 64, "occupancy": None, "num_ctas": None,
                         "LAT_K": 4}) == "64x64/LAT_K=4"
    for bad, msg in [("TILE_M=96", "power of two"), ("LAT_K=11", r"\[0, 10\]"), ("occupancy=40", r"\[1, 32\]"),
                     ("num_ctas=3", "power of two"), ("TILE_Q=64", "unknown space key"),
                     ("TILE_M", "KEY=V1,V2"), ("TILE_N=auto", "cannot be auto")]:
        with pytest.raises(ValueError, match=msg):
            ts.parse_space_args([bad])


def test_space_from_plan_and_fallbacks(tmp_path):
    space, src = ts.load_space(ts.DEFAULT_PLAN, "sm_90")
    assert set(space) >= {"TILE_M", "TILE_N", "occupancy", "num_ctas"} and "[sweep.sm_90]" in src
    space, src = ts.load_space(ts.DEFAULT_PLAN, "sm_100")          # the plan has no sm_100
    assert space == FWD.sweep_fallback["sm_100"] and "built-in" in src
    plan = tmp_path / "p.toml"
    plan.write_text("[sweep.sm_90]\nTILE_M = [32]\n")                # not a valid plan
    with pytest.raises(ValueError, match="does not load"):
        ts.load_space(plan, "sm_90")
    space, src = ts.load_space(tmp_path / "missing.toml", "sm_90")
    assert space == FWD.sweep_fallback["sm_90"] and "built-in" in src
    with pytest.raises(ValueError, match="no built-in sweep space for sm_75"):
        ts.load_space(tmp_path / "missing.toml", "sm_75")


def test_jobs_order_and_compile_units():
    specs = select_cases(["standard"], dtype="fp16")
    configs = ts.expand_space(ts.parse_space_args(["TILE_M=64,128", "TILE_N=64,128",
                                                   "occupancy=1,2", "num_ctas=1"]))
    jobs = tj.plan_jobs("fused", specs, configs, arch="sm_90")
    assert len(jobs) == 24 * (2 + 1 + 8)
    assert [j.provider for j in jobs[:48]] == ["sdpa-cudnn", "sdpa-flash"] * 24
    assert {j.provider for j in jobs[48:72]} == {"spak-fused-default"}
    assert len({j.key for j in jobs}) == len(jobs)
    # one cubin per (variant, D, causal, batch class): B = 32, 16 | B = 8, 4, 2 | B = 1 -- as
    # the compiles (first_call_s) of results/run-nvidia-h200-2026-11-22.jsonl.gz showed
    units = {j.unit["unit_id"] for j in jobs if j.unit}
    assert len(units) == 9 * 2 * 2 * 3
    by_case = {j.case: j.unit["unit_id"] for j in jobs if j.config_id == "64x64/o1/c1"}
    assert by_case["32x32x512x64/fp16/causal"] == by_case["16x32x1024x64/fp16/causal"]
    assert by_case["8x32x2048x64/fp16/causal"] == by_case["2x32x8192x64/fp16/causal"]
    assert by_case["8x32x2048x64/fp16/causal"] != by_case["1x32x16384x64/fp16/causal"]
    assert by_case["8x32x2048x64/fp16/causal"] != by_case["32x32x512x64/fp16/causal"]
    assert by_case["8x32x2048x64/fp16/causal"] != by_case["8x16x2048x128/fp16/causal"]
    for j in jobs:
        if j.unit:   # small stand-ins, but the head dim (a compile-time Constant) is kept
            assert j.unit["q"][3] == j.unit["k"][3] == j.spec.D
            assert max(j.unit["q"][:3] + j.unit["k"][:3]) <= 31
            assert tj._spec_bits(j.unit["q"], 2) == tj._spec_bits(j.spec.q_shape, 2)
    est = tj.estimate_seconds(jobs, compile_jobs=8)
    assert est["compile_units"] == 108 and 60 < est["total_s"] < 540


@given(st.integers(1, 5000), st.integers(1, 5000), st.integers(1, 300))
def test_tiny_dims_keep_the_launch_specialisation(a, b, d):
    shape = (a, 3, b, d)
    tiny = tuple(tiny_dim(x) for x in shape)
    assert max(tiny) <= 31
    assert tj._spec_bits(shape, 2) == tj._spec_bits(tiny, 2)


# ------------------------------------------------------------------ isolation

def test_planted_faults_are_recorded_and_the_sweep_goes_on(tmp_path):
    c = "2x4x256x64/fp16/causal"
    fake = {"delay_s": 0.0, "compile_error": ["128x64/o2/c1"],
            "launch_error": [f"64x64/o2/c1@{c}"], "wrong": ["64x64/o1/c1@1x4x300x64/fp16/noncausal"],
            "nan": [f"128x64/o1/c1@{c}"], "hang": ["64x64/o2/c1@1x2x200x128/fp16/causal"],
            "crash": ["128x64/o1/c1@1x2x200x128/fp16/causal"]}
    s, jobs, res, out = _sweep(tmp_path, fake, timeout=2.0)
    rows = _results(out)
    assert res["left"] == 0 and res["stopped"] is None
    assert len(rows) == len(jobs) == 3 * (2 + 1 + 4)
    st_ = {(r["case"], r["config_id"]): r for r in rows}
    assert all(st_[(x, "128x64/o2/c1")]["status"] == "compile_error" for x in
               ["2x4x256x64/fp16/causal", "1x4x300x64/fp16/noncausal", "1x2x200x128/fp16/causal"])
    assert st_[(c, "64x64/o2/c1")]["status"] == "launch_error"
    assert "launch failed" in st_[(c, "64x64/o2/c1")]["error"]
    assert st_[("1x4x300x64/fp16/noncausal", "64x64/o1/c1")]["status"] == "wrong_result"
    assert st_[(c, "128x64/o1/c1")]["status"] == "wrong_result"
    assert st_[(c, "128x64/o1/c1")]["nonfinite"] == 12
    hang = st_[("1x2x200x128/fp16/causal", "64x64/o2/c1")]
    assert hang["status"] == "timeout" and 2.0 <= hang["wall_s"] < 10
    crash = st_[("1x2x200x128/fp16/causal", "128x64/o1/c1")]
    assert crash["status"] == "crash" and "status 13" in crash["error"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == len(rows) - 3 - 1 - 2 - 1 - 1
    assert all(r["tflops"] > 0 and r["commit"] == "abc" and r["gpu"] == "Fake GPU" for r in ok)
    assert s.worker_starts == 3          # the first, and one fresh worker after each kill
    assert res["counts"]["ok"] == len(ok)


def test_compile_helpers_errors_hangs_and_crashes(tmp_path):
    fake = {"delay_s": 0.0, "compile_delay_s": 0.05, "compile_error": ["128x64/o1/c1"],
            "compile_hang": ["64x64/o2/c1"], "compile_crash": ["128x64/o2/c1"]}
    s, jobs, res, out = _sweep(tmp_path, fake, shapes=SHAPES[:2], timeout=2.0, compile_jobs=2)
    assert len(_results(out)) == len(jobs) and res["left"] == 0
    rows = {(r["case"], r["config_id"]): r for r in _results(out)}
    for case in ("2x4x256x64/fp16/causal", "1x4x300x64/fp16/noncausal"):
        ce = rows[(case, "128x64/o1/c1")]
        assert ce["status"] == "compile_error" and ce["error"].startswith("(compile helper)")
        assert rows[(case, "64x64/o2/c1")]["status"] == "timeout"
        # a helper that crashed hands its variant back to the worker, which compiles it
        assert rows[(case, "128x64/o2/c1")]["status"] == "ok"
        assert rows[(case, "64x64/o1/c1")]["status"] == "ok"
        assert rows[(case, "default")]["status"] == "ok"


def test_resume_skips_measured_configs(tmp_path):
    out = tmp_path / "r.jsonl"
    _, jobs, res1, _ = _sweep(tmp_path, {"delay_s": 0.2}, budget_s=3.0, out=out)
    assert res1["stopped"] == "budget" and 0 < res1["left"] < len(jobs)
    first = _results(out)
    done = tsw.done_keys(read_results(out), "Fake GPU", "fused", retry_failed=False)
    assert len(done) == len(first)
    _, _, res2, _ = _sweep(tmp_path, {"delay_s": 0.0, "launch_error": ["128x64/o2/c1"]},
                           done=done, out=out)
    rows = _results(out)
    assert rows[:len(first)] == first
    assert res2["finished"] == len(jobs) - len(first)
    assert sorted(r["case"] + r["provider"] + r["config_id"] for r in rows) == \
        sorted(j.case + j.provider + j.config_id for j in jobs)
    # --retry-failed: failures are not "done"
    done2 = tsw.done_keys(read_results(out), "Fake GPU", "fused", retry_failed=True)
    assert len(done2) == len(rows) - sum(r["status"] != "ok" for r in rows)
    # another GPU's rows never count as done
    assert not tsw.done_keys(read_results(out), "Other GPU", "fused", retry_failed=False)


def test_results_writer_heals_a_torn_last_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"kind": "result", "a": 1}\n{"kind": "res')
    w = ResultsWriter(p)
    w.write({"kind": "result", "a": 2})
    w.close()
    warnings = []
    rows = read_results(p, warn=warnings.append)
    assert [r["a"] for r in rows] == [1, 2] and len(warnings) == 1


# ------------------------------------------------------------------ the real command

def _cli(args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "spak", "sweep", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:          # a zombie waiting for its (dead) parent's reaper counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_sigkill_mid_sweep_then_resume_loses_at_most_the_config_in_flight(tmp_path):
    out = tmp_path / "k.jsonl"
    args = ["--runner", "fake:" + json.dumps({"delay_s": 0.15}), "--shapes", *SHAPES,
            "--space", *SPACE, "--out", str(out), "--compile-jobs", "0"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "spak", "sweep", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and len(_results(out)) < 8:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)          # the parent: no chance to clean up
    proc.wait()
    before = _results(out)
    assert 8 <= len(before) < 21
    worker = next(r["worker_pid"] for r in read_results(out) if r.get("kind") == "start")
    t = time.time()
    while _alive(worker) and time.time() - t < 10:
        time.sleep(0.05)
    assert not _alive(worker), "the worker outlived its killed parent"
    again = _cli(args[:-2] + ["--compile-jobs", "0", "--resume"], timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    rows = _results(out)
    assert rows[:len(before)] == before                      # nothing measured was lost
    keys = [(r["case"], r["provider"], r["config_id"]) for r in rows]
    assert len(keys) == len(set(keys)) == 3 * 7               # each job exactly once
    resumed = [r for r in read_results(out) if r.get("kind") == "start"][-1]
    assert resumed["todo"] == 21 - len(before)                # only the in-flight one re-run
    assert "already in" in again.stdout


def test_cli_budget_exit_status_and_list(tmp_path):
    out = tmp_path / "b.jsonl"
    r = _cli(["--runner", "fake:" + json.dumps({"delay_s": 0.3}), "--shapes", *SHAPES,
              "--space", *SPACE, "--out", str(out), "--budget-s", "2.5"], timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "--resume" in r.stdout
    end = [x for x in read_results(out) if x.get("kind") == "end"][-1]
    assert end["status"] == "budget" and end["left"] > 0
    r2 = _cli(["--runner", "fake:{}", "--shapes", *SHAPES, "--space", *SPACE, "--out",
               str(out)], timeout=60)
    assert r2.returncode == 2 and "--resume" in r2.stderr     # never silently appends
    r3 = _cli(["--runner", "fake:{}", "--shapes", *SHAPES, "--space", *SPACE, "--out",
               str(out), "--resume", "--update-store", "--store", str(tmp_path / "s.json")],
              timeout=60)
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "* " in r3.stdout and "best config" in r3.stdout  # the best per shape marked
    assert "store: wrote" in r3.stdout
    assert json.loads((tmp_path / "s.json").read_text())["configs"]
    lst = _cli(["--list", "--shapes", "standard", "--arch", "sm_90"], timeout=60)
    assert lst.returncode == 0 and "estimate" in lst.stdout and "504 jobs" in lst.stdout


def test_no_gpu_is_a_clear_error(tmp_path):
    pytest.importorskip("torch")
    from tests.conftest import _has_cuda_gpu
    if _has_cuda_gpu():
        pytest.skip("a GPU is present")
    r = _cli(["--shapes", SHAPES[0], "--out", str(tmp_path / "x.jsonl")], timeout=120)
    assert r.returncode == 1 and "no CUDA GPU" in r.stderr


def test_fake_runner_is_deterministic():
    f = FakeRunner({"delay_s": 0})
    job = {"config_id": "64x64/o1/c1", "case": "1x1x128x64/fp16/causal", "provider": "spak-fused",
           "flops": 1e9}
    a, b = f.run(job), f.run(job)
    assert a == b and a["status"] == "ok" and a["ms_median"] > 0


# ------------------------------------------------------------------ kernel variants

def test_kernel_variants_are_cached_and_validated():
    from spak.gpu.kernels.fused import fmha_fwd_kernel as k
    from spak.gpu.plan import int64_variant
    from spak.gpu.variants import apply_hints, check_hints, split_config, with_hints
    assert with_hints(k) is k
    v = with_hints(k, occupancy=2)
    assert v is with_hints(k, occupancy=2) and v is not k
    assert v._compiler_options.occupancy == 2 and v._annotated_function.pyfunc is \
        k._annotated_function.pyfunc
    t = with_hints(int64_variant(k), num_ctas=2)
    assert t._compiler_options.num_ctas == 2
    assert split_config({"TILE_M": 64, "TILE_N": 128, "occupancy": None, "num_ctas": 2}) == \
        ({"TILE_M": 64, "TILE_N": 128}, {"occupancy": None, "num_ctas": 2})
    for bad in ({"occupancy": 0}, {"occupancy": 33}, {"num_ctas": 3}, {"warps": 4},
                {"occupancy": True}):
        with pytest.raises(ValueError):
            check_hints(bad)
    from spak.gpu.plan import Launch
    L = [Launch(k, (1, 1, 1), (), "fused")]
    assert apply_hints(L, {"occupancy": 1})[0].kernel is with_hints(k, occupancy=1)
    assert apply_hints(L, None)[0].kernel is k


@pytest.mark.slow
def test_hinted_variant_compiles_for_sm90():
    """occupancy/num_ctas variants go through tileiras (on the CPU, no GPU needed) and the
    hint reaches the compiler: occupancy 2 is met (2 blocks of 256 threads an SM, no
    spills); num_ctas 2 gives other machine code than the same kernel without it."""
    import io
    from cuda.tile.compilation import export_kernel
    from spak.gpu import compile as gc
    from spak.gpu.resources import blocks_per_sm, read_cubin
    from spak.gpu.variants import apply_hints
    built = {}
    for hints in ({"occupancy": 2}, {"num_ctas": 2}):
        L = apply_hints(gc.variant_launches("fused", dtype="float16", head_dim=64, causal=True,
                                            has_mask=False,
                                            tiles={"TILE_M": 64, "TILE_N": 64}), hints)[0]
        buf = io.BytesIO()
        export_kernel(L.kernel, [gc._signature(L.kernel, L.args, "launch")], buf,
                      gpu_code="sm_90", output_format="cubin")
        (k,) = read_cubin(buf.getvalue())
        assert k.name.startswith("fmha_fwd_kernel") and k.threads == 256 and k.stack_bytes == 0
        built[next(iter(hints))] = k
    assert blocks_per_sm(built["occupancy"], "sm_90")[0] >= 2
    assert built["num_ctas"].code_sha1 != built["occupancy"].code_sha1


# ------------------------------------------------------------------ the GPU runner, on the CPU

@pytest.fixture
def cpu_gpu_runner(monkeypatch):
    """spak.tune.worker.GpuRunner on torch CPU tensors: torch.cuda's device queries and timing
    calls stubbed, and cuTile's launch replaced by the CPU simulator running the same
    kernel (so the runner's planning, hints, check, timing and error paths all execute)."""
    torch = pytest.importorskip("torch")
    from spak import sim
    from tests.helpers_gpu_loop import cpu_sweep_runner
    r = cpu_sweep_runner(monkeypatch, torch)
    launched = []

    class CT:
        corrupt = False
        fail = None

        @staticmethod
        def launch(stream, grid, kernel, args):
            assert stream == "stream"
            if CT.fail is not None:
                raise CT.fail
            launched.append(kernel)
            arrs = [sim.SimArray(a.numpy()) if isinstance(a, torch.Tensor) else a for a in args]
            sim.launch(kernel, grid, arrs)
            if CT.corrupt:
                args[3].view(-1)[0] = 7.0
    r.ct = CT
    r.launched = launched
    return r


def test_gpu_runner_paths_on_the_simulator(cpu_gpu_runner):
    from cuda.tile._exception import TileError
    r = cpu_gpu_runner
    case = "1x2:1x80x64/fp16/causal"       # GQA, ragged S
    spec = select_cases([case])[0]
    job = {"kernel": "fused", "case": case, "provider": "spak-fused", "config_id": "64x32/o2",
           "config": {"TILE_M": 64, "TILE_N": 32, "occupancy": 2, "num_ctas": None},
           "flops": spec.flops}
    res = r.run(job)
    assert res["status"] == "ok", res
    assert res["rel_l2_vs_sdpa"] < 2e-3 and res["nonfinite"] == 0
    assert res["ms_median"] > 0 and res["runs"] >= 2 and res["input_sets"] == 2
    assert res["hints_used"] == {"occupancy": 2, "num_ctas": None}
    assert all(k._compiler_options.occupancy == 2 for k in r.launched)
    # the default tiles (config None -> gpu.plan.default_tiles)
    assert r.run({**job, "provider": "spak-fused-default", "config_id": "default",
                  "config": None})["status"] == "ok"
    # a wrong output, a compile error, a launch error, a bad config
    r.ct.corrupt = True
    bad = r.run(job)
    assert bad["status"] == "wrong_result" and "rel L2 vs SDPA" in bad["error"]
    r.ct.corrupt = False
    r.ct.fail = TileError("cannot compile")
    assert r.run(job)["status"] == "compile_error"
    r.ct.fail = RuntimeError("CUDA error: an illegal memory access was encountered")
    le = r.run(job)
    assert le["status"] == "launch_error" and not le.get("fatal")
    r.ct.fail = None
    assert r.run({**job, "config": {"TILE_M": 48, "TILE_N": 32}})["status"] == "invalid_config"
    assert r.run({**job, "config": {"TILE_M": 64, "TILE_N": 32, "unroll": 2}})["status"] == \
        "invalid_config"
    # kernel knobs travel in the tiles dict (gpu.plan validates them)
    knob = r.run({**job, "config_id": "64x32/LAT_K=3", "config": {"TILE_M": 64, "TILE_N": 32,
                                                                   "occupancy": None, "LAT_K": 3}})
    assert knob["status"] == "ok" and knob["tiles_used"]["LAT_K"] == 3, knob
    # SDPA providers: timed when the backend exists here, "unsupported" when it refuses
    for prov in ("sdpa-cudnn", "sdpa-flash", "sdpa-math"):
        s = r.run({**job, "provider": prov, "config_id": "-", "config": None})
        assert s["status"] in ("ok", "unsupported"), s
        if s["status"] == "ok":
            assert s["rel_l2_vs_sdpa"] < 1e-3 and s["ms_median"] > 0
    # the compile helper's path: small stand-ins of one compile unit
    unit = tj.attention_compile_unit("fused", spec, job["config"], job["config_id"])
    assert r.compile(unit)["status"] == "ok"


# ------------------------------------------------------------------ kernel families

def test_rows_carry_the_family_and_resume_keeps_families_apart(tmp_path):
    _, jobs, res, out = _sweep(tmp_path, {"delay_s": 0.0}, shapes=SHAPES[:1])
    rows = _results(out)
    assert res["left"] == 0 and len(rows) == len(jobs) == 2 + 1 + 4
    assert {(r["schema"], r["family"]) for r in rows} == {("spak.sweep/2", "fmha_fwd")}
    assert all(j.payload()["family"] == "fmha_fwd" for j in jobs)
    assert rows[0]["flops"] == jobs[0].flops == jobs[0].spec.flops
    done = tsw.done_keys(read_results(out), "Fake GPU", "fused", retry_failed=False)
    assert len(done) == len(rows)
    assert not tsw.done_keys(read_results(out), "Fake GPU", "fused", False, family="fmha_bwd")
    # a schema-1 row (no family) is the forward's
    old = [{**r, "schema": "spak.sweep/1"} for r in rows]
    for r in old:
        del r["family"]
    assert tsw.done_keys(old, "Fake GPU", "fused", retry_failed=False) == done


def test_a_family_brings_its_space_keys_default_config_and_flops(monkeypatch):
    from tests.test_store import _toy_family
    toy = _toy_family(monkeypatch)
    sp = ts.parse_space_args(["dkv_tile_m=64 DKV_TILE_N=64,128", "DQ_TILE_M=64",
                              "DQ_TILE_N=32", "occupancy=2"], toy)
    with pytest.raises(ValueError, match="unknown space key 'TILE_M'"):
        ts.parse_space_args(["TILE_M=64"], toy)
    with pytest.raises(ValueError, match="DQ_TILE_N: 48 is not a power of two"):
        ts.parse_space_args(["DQ_TILE_N=48"], toy)
    ids = [ts.config_id(c, toy.space_keys) for c in ts.expand_space(sp, toy)]
    assert ids == ["DKV64x64/DQ64x32/o2", "DKV64x128/DQ64x32/o2"]
    with pytest.raises(ValueError, match="toy_bwd names no plan file.*pass --space"):
        ts.load_space(None, "sm_90", toy)
    problems, skipped = tsw.select_problems(toy, ["1x2x128x64/fp16/causal",
                                                  "1x2x128x64/fp16/mask"], dtype="fp16",
                                            causal="both")
    assert [p.case_id for p in problems] == ["1x2x128x64/fp16/causal"]
    assert skipped[0][1].startswith("masked")
    plan = tsw.plan_sweep(toy, "fused", problems, "sm_90",
                          override=ts.parse_space_args(["DKV_TILE_M=64", "DKV_TILE_N=64",
                                                        "DQ_TILE_M=64", "DQ_TILE_N=64"], toy))
    assert plan.source.startswith("the command line with --space DKV_TILE_M=64")
    default, swept = plan.jobs
    assert default.config == {"DKV_TILE_M": 64, "DKV_TILE_N": 64, "DQ_TILE_M": 64,
                              "DQ_TILE_N": 64, "occupancy": None}
    assert swept.config_id == "DKV64x64/DQ64x64" and swept.unit is None
    assert default.payload()["family"] == "toy_bwd" and default.flops == toy.flops(problems[0])


def test_cli_family_flag_lists_the_same_jobs(capsys, monkeypatch):
    from spak.cli import main
    from tests.test_store import _toy_family
    monkeypatch.setattr(_toy_family(monkeypatch), "kernels", ("fused",))
    argv = ["sweep", "--list", "--arch", "sm_90", "--shapes", SHAPES[0], "--space", *SPACE]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main(argv + ["--family", "fmha_fwd"]) == 0
    assert capsys.readouterr().out == plain and "7 jobs" in plain
    assert main(["sweep", "--list", "--family", "toy_bwd", "--kernel", "naive"]) == 2
    assert "toy_bwd has kernels fused, not 'naive'" in capsys.readouterr().err
