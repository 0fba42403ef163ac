"""The sweep's CPU compile helpers (issue 36): the launch signature derived from shapes
(spak.gpu.launch_sig), the compile-cpu helper role (spak.tune.cpu_compile), the hand-back
of units it cannot model to GPU helpers (spak.tune.compile_ahead), the first-launch hit
count in the time breakdown, and the helpers' default count.

The reference for "what ct.launch derives" is tests/data/cutile_launch_keys_h200.json:
the mangled kernel symbols cuTile's disk cache recorded for three real JIT launches of the
fused forward on an H200 (made by /work/device_out/c2/keyprobe.py, 2026-11-28), beside
what gpu.compile's export (assume="launch") produced for the same problems.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from spak import families
from spak.attention.problems import select_cases
from spak.gpu.launch_sig import (LaunchArray, Unmappable, launch_array_constraint,
                                 launch_signature)
from spak.results.jsonl import ResultsWriter, read_results
from spak.tune import jobs as tj, runner as tr, space as ts, sweep as tsw, timeline

ROOT = Path(__file__).resolve().parents[1]
KEYS = json.loads((ROOT / "tests/data/cutile_launch_keys_h200.json").read_text())
FWD, BWD = families.get("fmha_fwd"), families.get("fmha_bwd")


def _demangle(symbol):
    from cuda.tile.compilation._name_mangling import demangle_kernel_name
    name, sig = demangle_kernel_name(symbol)
    return name, sig.calling_convention.name, tuple(sig.parameters)


def _recorded(name):
    shape, dtype, causal = name.split("/")
    B, H, S, D = map(int, shape.split("x"))
    return (B, H, S, D), dtype, causal == "causal"


@pytest.mark.parametrize("name", sorted(KEYS))
def test_signature_reproduces_the_recorded_jit_symbols(name):
    """plan_fmha on LaunchArray stand-ins of the problem's tensors gives exactly the JIT
    launch's symbol (and so its signature: demangled, parameter by parameter), which the
    old export (v1, only the last extent divisible, no shape constants) did not."""
    from spak.gpu.plan import plan_fmha
    shape, dtype, causal = _recorded(name)
    arrays = [LaunchArray(shape, dtype) for _ in range(4)]
    launches = plan_fmha("fused", *arrays, causal=causal, scale=1 / math.sqrt(shape[3]),
                         alloc=lambda s, kind: LaunchArray(s, "float32" if kind == "float32"
                                                           else dtype))
    got = [launch_signature(L.kernel, L.args).symbol for L in launches]
    [jit] = KEYS[name]["jit"].values()
    [export] = KEYS[name]["export"].values()
    assert got == jit
    assert [_demangle(s) for s in got] == [_demangle(s) for s in jit]
    assert got != export                                 # the gap this module closes


@pytest.mark.parametrize("name", sorted(KEYS))
def test_forward_family_stand_ins_give_the_recorded_symbols(name):
    """The compile helpers' path (the family's compile unit -> stand_in_launches on the
    unit's real problem, at the family's default config) gives the same symbols."""
    shape, dtype, causal = _recorded(name)
    B, H, S, D = shape
    dt = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    p = FWD.parse(f"{B}x{H}x{S}x{D}/{dt}/{'causal' if causal else 'noncausal'}")
    unit = {**FWD.compile_unit("fused", p, FWD.default_config(p, "sm_90"), "default"),
            "family": "fmha_fwd"}
    launches = FWD.stand_in_launches(json.loads(json.dumps(unit)), "sm_90")   # as sent
    [jit] = KEYS[name]["jit"].values()
    assert [launch_signature(L.kernel, L.args).symbol for L in launches] == jit


def test_launch_rules_per_dimension():
    """Extents of 1 are constants (and force calling convention v2), every extent
    divisible by 16 is declared so, unit strides are constants, 16-byte strides divisible;
    an unaligned base declares nothing; int32 indexing past 2^31 is refused."""
    import cuda.tile as ct
    c = launch_array_constraint(LaunchArray((1, 3, 48, 64), "float16"))
    assert c.shape_constant == (1, None, None, None)
    assert c.shape_divisible_by == (1, 1, 16, 16)
    assert c.stride_constant == (None, None, None, 1)
    assert c.stride_divisible_by == (8, 8, 8, 1)                   # 9216, 3072, 64 elements
    odd = launch_array_constraint(LaunchArray((2, 5, 3), "float32"))
    assert odd.stride_divisible_by == (1, 1, 1) and odd.shape_divisible_by == (1, 1, 1)
    assert launch_array_constraint(LaunchArray((4, 8), "float16", aligned16=False)) \
        .base_addr_divisible_by == 1
    ones = launch_array_constraint(LaunchArray((1, 1), "float32"))
    assert ones.stride_constant == (1, 1) and ones.shape_constant == (1, 1)
    with pytest.raises(Unmappable):
        launch_array_constraint(LaunchArray((3, 2 ** 30, 2), "float16"), ct.int32)
    assert launch_array_constraint(LaunchArray((3, 2 ** 30, 2), "float16"), ct.int64)


def test_calling_convention_v1_without_unit_extents_and_unmappable_args():
    """The backward's preprocess on B, H, S, D all > 1 compiles under v1 (the launch's
    minimum); an argument kind the module does not model is Unmappable (the unit goes to
    a GPU helper), never a guessed constraint."""
    p = BWD.parse("2x4x256x64/fp16")
    unit = {**BWD.compile_unit("fused", p, BWD.default_config(p, "sm_90"), "x"),
            "family": "fmha_bwd"}
    launches = {L.name: L for L in BWD.stand_in_launches(unit, "sm_90")}
    assert set(launches) == {"fused", "bwd.preprocess", "bwd.dkdv", "bwd.dq"}
    pre = launch_signature(launches["bwd.preprocess"].kernel, launches["bwd.preprocess"].args)
    assert pre.calling_convention.name == "cutile_python_v1"
    L = launches["bwd.preprocess"]
    with pytest.raises(Unmappable):
        launch_signature(L.kernel, (object(),) + tuple(L.args[1:]))
    with pytest.raises(Unmappable):
        launch_signature(L.kernel, tuple(L.args[:-1]))


def test_masked_backward_and_unmodelled_families():
    """A masked backward unit plans with the kernel mask [B, 1, Sq, Sk]; a masked forward
    unit (its compile unit carries no mask) and a varlen decode problem (no compile unit:
    the worker builds it) are not modelled: None, so a GPU helper or the worker builds them."""
    p = BWD.parse("2x4x200x64/fp16/causal").replace(mask="bool")
    unit = {**BWD.compile_unit("fused", p, BWD.default_config(p, "sm_90"), "x"),
            "family": "fmha_bwd"}
    launches = BWD.stand_in_launches(unit, "sm_90")
    for L in launches:
        launch_signature(L.kernel, L.args)
    assert any(getattr(a, "shape", None) == (2, 1, 200, 200) for a in launches[0].args)
    pf = FWD.parse("2x4x200x64/fp16").replace(mask="bool")
    assert FWD.stand_in_launches({**FWD.compile_unit("fused", pf, FWD.default_config(
        pf, "sm_90"), "x"), "family": "fmha_fwd"}, "sm_90") is None
    dec = families.get("fmha_decode")
    assert dec.stand_in_launches({"case": "3x8:2x40:60x64/causal/qlens=5:0:40/lens=7:3:60",
                                  "kernel": "splitkv", "config": {}}, "sm_90") is None


def test_cpu_helper_compiles_the_launch_entry_without_torch(tmp_path):
    """A compile-cpu helper process (no torch: blocked; no GPU) builds a unit into cuTile's
    disk cache under the symbol the JIT launch records (the 1x2x1024x64 fp16 causal one:
    1x2x128x64 has the same specialisation), and a second request only finds it."""
    p = FWD.parse("1x2x128x64/fp16/causal")
    unit = {**FWD.compile_unit("fused", p, FWD.default_config(p, "sm_90"), "default"),
            "family": "fmha_fwd", "arch": "sm_90"}
    script = (
        "import json, sys\n"
        "from cuda.tile._cext import default_tile_context as ctx\n"
        f"ctx.config.cache_dir = {str(tmp_path)!r}\n"
        "from spak.tune.cpu_compile import CpuCompiler\n"
        "c = CpuCompiler(block_torch=True)\n"
        f"u = json.loads({json.dumps(json.dumps(unit))})\n"
        "print(json.dumps([c.compile(u), c.compile(u), sys.modules.get('torch') is None]))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    first, second, no_torch = json.loads(out.stdout.strip().splitlines()[-1])
    assert first["status"] == "ok" and second["status"] == "ok" and no_torch
    [jit] = KEYS["1x2x1024x64/float16/causal"]["jit"].values()
    assert first["kernels"] == jit
    con = sqlite3.connect(tmp_path / "cache.db")
    names = [json.loads(m)["kernel_names"] for (m,) in con.execute("select metadata from cache")]
    assert names == [jit]                                  # one entry: the second was a hit
    assert second["seconds"] < first["seconds"]


def _fake_sweep(tmp_path, fake, *, compile_jobs=2, compile_on="cpu", gpus=("0", "1")):
    out = tmp_path / "s.jsonl"
    specs = select_cases(["2x4x256x64/causal", "1x2x200x128/causal"], dtype="fp16")
    space = ts.expand_space(ts.parse_space_args(["TILE_M=64,128", "TILE_N=64",
                                                 "occupancy=1", "num_ctas=1"]))
    jobs = tj.plan_jobs("fused", specs, space, arch="sm_90")
    opts = tr.SweepOptions(timeout=20.0, compile_jobs=compile_jobs, compile_on=compile_on,
                           runner="fake:" + json.dumps(fake), quiet=True, retry_faults=True)
    s = tr.Sweep(out, opts, gpus=list(gpus), echo=lambda m: None)
    hellos = s.start_workers()
    writer = ResultsWriter(out)
    res = s.run(jobs, writer, {"gpu": hellos[0]["gpu"], "arch": "sm_90", "commit": "abc",
                               "host": "h"})
    writer.close()
    rows = [r for r in read_results(out) if r.get("kind") == "result"]
    return s, jobs, rows


def test_sweep_hands_unmapped_units_to_a_gpu_helper_and_counts_hits(tmp_path):
    """CPU helpers build what they can; a unit they hand back ("unmapped") is built by a GPU
    helper; every job still has an ok row; the breakdown says how many of each, and the
    workers' first launches' disk-cache hits and misses (fake: cpu_miss)."""
    fake = {"delay_s": 0.01, "compile_delay_s": 0.05, "cpu_unmapped": ["128x64/o1/c1"],
            "cpu_miss": ["64x64/o1/c1"]}
    s, jobs, rows = _fake_sweep(tmp_path, fake)
    assert {(r["case"], r["provider"], r["config_id"]) for r in rows} == {j.key for j in jobs}
    assert all(r["status"] == "ok" for r in rows)
    c = s.compiler
    assert c.started_by_kind["cpu"] >= 1 and c.started_by_kind["gpu"] >= 1
    assert c.unmapped == 2                                 # one config x two shapes
    assert all(c.unit_state[j.unit["unit_id"]]["status"] == "ok" for j in jobs if j.unit)
    b = s.breakdown()
    hits = sum(g["cubin_hits"] for g in b["gpus"])
    misses = sum(g["cubin_compiles"] for g in b["gpus"])
    units = {j.unit["unit_id"] for j in jobs if j.unit}
    assert misses == 2 and hits + misses >= len(units)     # 64x64's two shapes missed
    text = "\n".join(timeline.breakdown_lines(b))
    assert "first launches: " in text and f"{misses} compiled by the workers" in text
    assert "on the CPU" in text and "units the CPU ones handed back" in text


def test_sweep_falls_back_to_gpu_helpers_when_cpu_helpers_cannot_start(tmp_path):
    """CPU helpers that fail at start-up: GPU helpers build every unit, nothing is lost."""
    s, jobs, rows = _fake_sweep(tmp_path, {"delay_s": 0.01, "cpu_setup_error": True})
    assert {(r["case"], r["provider"], r["config_id"]) for r in rows} == {j.key for j in jobs}
    assert all(r["status"] == "ok" for r in rows)
    c = s.compiler
    assert c.mode == "gpu" and c.started_by_kind["gpu"] >= 1
    assert all(c.unit_state[j.unit["unit_id"]]["status"] == "ok" for j in jobs if j.unit)


def test_sweep_gpu_helpers_only(tmp_path):
    """--compile-on gpu: today's helpers, no CPU ones."""
    s, jobs, rows = _fake_sweep(tmp_path, {"delay_s": 0.01}, compile_on="gpu", gpus=("0",))
    assert all(r["status"] == "ok" for r in rows)
    assert s.compiler.started_by_kind == {"cpu": 0, "gpu": s.compiler.helpers_started}


def test_auto_compile_jobs_cpu_helpers_take_every_core_but_the_gpus(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert tsw.auto_compile_jobs("gpu", gpus=4, compile_on="cpu") == 60
    assert tsw.auto_compile_jobs("gpu", gpus=4, compile_on="gpu") == 32
    assert tsw.auto_compile_jobs("fake", gpus=4) == 0
    assert tsw.visible_gpu_count("0,1,3") == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert tsw.visible_gpu_count("all") == 2


def test_decode_launches_map_to_launch_signatures():
    """The decode family's kernels (split + combine over a paged cache, varlen) take only
    arrays (int32 lengths, block table included) and scalars: all mappable, so compile
    units for decode (which the family does not define yet) could use the CPU helpers.
    Paged q [B, 1, H, D]: the extent 1 makes it v2; varlen's packed arrays: v1."""
    from spak.gpu.plan_decode import plan_decode, plan_varlen
    A = LaunchArray
    q, out = A((2, 1, 32, 128), "float16"), A((2, 1, 32, 128), "float16")
    k, bt, lens = A((64, 64, 8, 128), "float16"), A((2, 16), "int32"), A((2,), "int32")
    launches = plan_decode(q, k, k, lens, out, block_table=bt, causal=False, num_splits=4,
                           alloc=lambda s, kind: A(tuple(s), "float32"))
    sigs = {L.name: launch_signature(L.kernel, L.args) for L in launches}
    assert set(sigs) == {"decode.split", "decode.combine"}
    assert sigs["decode.split"].calling_convention.name == "cutile_python_v2"
    qv, kv, cu = A((300, 32, 128), "float16"), A((500, 8, 128), "float16"), A((3,), "int32")
    [varlen] = plan_varlen(qv, kv, kv, cu, cu, qv, max_seqlen_q=200, max_seqlen_k=300,
                           causal=True)
    assert launch_signature(varlen.kernel, varlen.args).calling_convention.name == \
        "cutile_python_v1"
