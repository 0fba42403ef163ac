"""Faults: results are kept line by line (flushed; fsync'd per row or per second), survive a killed process, are read back
past a torn or corrupt line, and an out-of-memory error on one shape is a row, not the end.

`spak run`'s GPU path cannot run here; its writer (append_jsonl), its per-shape and per-kernel
failure handling (guarded_case, run_case with the GPU parts replaced by CPU stand-ins) and
the readers can, and are tested. The sweeper's own kill/resume test is in test_sweep.py;
here `spak sweep --resume` meets a corrupt results file.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from spak.device import case as run_case_mod, table as run_table
from spak.device.failures import failure_text
from spak.families.fmha_fwd import FAMILY as FWD
from spak.results.jsonl import ResultsWriter, append_jsonl, read_results

from spak.attention.problems import parse_spec

ROOT = Path(__file__).resolve().parents[1]


def _lines(path: Path) -> list:
    """Every line of a file parsed, a line that does not parse as None."""
    out = []
    for ln in path.read_bytes().split(b"\n"):
        if ln.strip():
            try:
                out.append(json.loads(ln))
            except ValueError:
                out.append(None)
    return out


# ------------------------------------------------------------------ the writers flush, fsync

def _spy_fsync(monkeypatch, p):
    seen = []
    real_fsync = os.fsync

    def fsync(fd):
        real_fsync(fd)
        seen.append(_lines(p))            # what a host crash right now would leave on disk

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


_ROWS = [{"i": i, "x": float("nan") if i == 1 else i / 3} for i in range(5)]


def test_spak_run_rows_are_fsynced_one_by_one(tmp_path, monkeypatch):
    p = tmp_path / "r.jsonl"
    seen = _spy_fsync(monkeypatch, p)
    for r in _ROWS:
        append_jsonl(p, r)
    assert len(seen) == len(_ROWS)                           # one fsync per row
    for n, on_disk in enumerate(seen, 1):
        assert [r["i"] for r in on_disk] == list(range(n))  # row n complete at its fsync
    assert _lines(p)[1]["x"] is None                        # strict JSON: NaN -> null


@pytest.mark.parametrize("sync_every_s", [0.0, 3600.0])
def test_sweep_rows_are_visible_at_once_and_fsynced_by_interval_and_at_close(
        tmp_path, monkeypatch, sync_every_s):
    """What a killed process leaves is what reached the OS (flush): every row written so
    far, whatever the fsync interval; fsync (host crashes) runs per interval and at close."""
    p = tmp_path / "r.jsonl"
    seen = _spy_fsync(monkeypatch, p)
    w = ResultsWriter(p, sync_every_s=sync_every_s)
    for n, r in enumerate(_ROWS, 1):
        w.write(r)
        assert [x["i"] for x in _lines(p)] == list(range(n))  # read through another handle
    assert len(seen) == (len(_ROWS) if sync_every_s == 0 else 0)
    w.close()
    assert len(seen) == (len(_ROWS) if sync_every_s == 0 else 0) + 1
    assert [r["i"] for r in seen[-1]] == list(range(len(_ROWS)))
    assert _lines(p)[1]["x"] is None


_WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from spak.results.jsonl import append_jsonl
i = 0
while True:
    append_jsonl({path!r}, {{"provider": "spak-fused", "case": "c%d" % i, "i": i,
                             "pad": "x" * 20000}})
    i += 1
"""


def test_a_killed_run_keeps_every_finished_row_and_the_file_stays_appendable(tmp_path):
    """SIGKILL a process appending rows as fast as it can: every complete line parses; at
    most the last is torn; appending afterwards (a rerun with the same --out) loses nothing."""
    p = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER.format(root=str(ROOT), path=str(p))])
    try:
        deadline = time.time() + 60
        while time.time() < deadline and (not p.exists() or p.stat().st_size < 400_000):
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rows = _lines(p)
    assert len(rows) >= 10
    assert all(r is not None for r in rows[:-1])               # only the last may be torn
    assert [r["i"] for r in rows if r] == list(range(sum(r is not None for r in rows)))
    # a torn tail, as a kill mid-write (or a full disk) leaves it
    with open(p, "ab") as f:
        f.write(b'{"provider": "spak-fused", "case": "torn", "i": ')
    append_jsonl(p, {"provider": "spak-naive", "case": "after", "i": -1})
    after = _lines(p)
    assert after[-1] == {"provider": "spak-naive", "case": "after", "i": -1}
    assert after[-2] is None                                   # the torn line, on its own
    got = read_results(p, warn=lambda m: None)              # what report/resume read
    assert got[-1]["case"] == "after" and all(r["case"] != "torn" for r in got)


def test_append_heals_a_torn_last_line(tmp_path):
    """The bug this fixes: append_jsonl used to glue the next row onto a torn last line,
    losing that row too (ResultsWriter already healed)."""
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": 2, "b"')
    append_jsonl(p, {"a": 3})
    assert [r for r in _lines(p)] == [{"a": 1}, None, {"a": 3}]
    append_jsonl(None, {"a": 4})                        # --out -: nothing written


# ------------------------------------------------------------------ sweep --resume

def _sweep_cli(args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "spak", "sweep", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_sweep_resume_over_a_corrupt_results_file(tmp_path):
    """A results file with a torn last line and a corrupt middle line: --resume warns about
    both, re-runs only the configs whose row was lost, and each job ends up exactly once."""
    out = tmp_path / "s.jsonl"
    args = ["--runner", "fake:{}", "--shapes", "1x4x300x64/noncausal", "--space",
            "TILE_M=64,128", "TILE_N=64", "occupancy=1", "num_ctas=1", "--out", str(out),
            "--compile-jobs", "0", "--no-sdpa"]
    first = _sweep_cli(args)
    assert first.returncode == 0, first.stdout + first.stderr
    results = [r for r in read_results(out) if r.get("kind") == "result"]
    assert len(results) == 3                                   # 2 configs + the default
    text = out.read_text().splitlines(keepends=True)
    victim = next(i for i, ln in enumerate(text) if '"kind": "result"' in ln)
    lost = json.loads(text[victim])["config_id"]
    text[victim] = text[victim][: len(text[victim]) // 2] + "\n"      # corrupt middle line
    out.write_text("".join(text) + '{"schema": "spak.sweep/1", "kind": "resu')   # torn tail
    again = _sweep_cli(args + ["--resume"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stderr.count("skipping a corrupt line") == 2, again.stderr
    assert "Traceback" not in again.stderr
    results = [r for r in read_results(out) if r.get("kind") == "result"]
    ids = sorted(r["config_id"] for r in results)
    assert ids == sorted({r["config_id"] for r in results}) and len(ids) == 3
    start = [r for r in read_results(out) if r.get("kind") == "start"][-1]
    assert start["todo"] == 1 and results[-1]["config_id"] == lost


# ------------------------------------------------------------------ OOM: a row, not the end

def _oom(msg="CUDA out of memory. Tried to allocate 80.00 GiB (GPU 0; 79.1 GiB total)"):
    torch = pytest.importorskip("torch")
    return torch.cuda.OutOfMemoryError(msg + "\nIf reserved but unallocated memory is large...")


def test_failure_text_keeps_the_first_line_of_an_oom():
    assert failure_text(_oom()) == ("OutOfMemoryError: CUDA out of memory. Tried to "
                                           "allocate 80.00 GiB (GPU 0; 79.1 GiB total)")
    assert failure_text(ValueError("bad\nshape")) == "ValueError: bad\nshape"


def test_oom_while_preparing_one_shape_is_rows_and_the_batch_goes_on(tmp_path):
    """guarded_case (what cmd_run wraps each shape in): an OOM making a huge shape's inputs
    or references used to escape run_case and end the whole batch."""
    p = tmp_path / "run.jsonl"
    specs = [parse_spec(s) for s in ("1x80x262144x128/causal", "1x2x128x64", "2x4x64x64")]
    base = {"schema": "spak.run/1", "gpu": "Fake GPU"}
    seen = []

    def emit(row):
        append_jsonl(p, row)
        seen.append(row)

    def run_case(spec, em):
        if spec.Sq == 262144:
            raise _oom()                                   # before any row: inputs/refs
        if spec.B == 2:
            em({**base, "case": spec.case_id, "provider": "spak-fused", "passed": True})
            raise RuntimeError("late failure after the fused row")
        row = {**base, "case": spec.case_id, "provider": "spak-fused", "passed": True}
        em(row)
        return [row]

    all_rows = []
    for spec in specs:
        all_rows += run_case_mod.guarded_case(spec, ("fused", "naive"),
                                        lambda em: run_case(spec, em), emit, base)
    on_disk = _lines(p)
    assert on_disk == seen == all_rows                     # every row emitted, in order
    huge = [r for r in on_disk if r["case"] == specs[0].case_id]
    assert [r["provider"] for r in huge] == ["spak-fused", "spak-naive"]
    assert all(r["error"].startswith("OutOfMemoryError: CUDA out of memory") and
               r["passed"] is False and r["Sq"] == 262144 for r in huge)
    assert [r["provider"] for r in on_disk if r["case"] == specs[1].case_id] == ["spak-fused"]
    last = [r for r in on_disk if r["case"] == specs[2].case_id]
    assert [r["provider"] for r in last] == ["spak-fused", "spak-naive"]   # no duplicate
    assert last[1]["error"] == "RuntimeError: late failure after the fused row"
    # the table and the summary take error rows as they come
    assert any("OutOfMemoryError" in ln for ln in run_table.format_case(huge))
    assert run_table.summary(on_disk).startswith("2/5 SPAK kernel cases passed")


def test_keyboard_interrupt_still_stops_the_batch():
    spec = parse_spec("1x2x128x64")

    def run(em):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_case_mod.guarded_case(spec, ("fused",), run, lambda r: None, {})


def test_oom_in_one_kernel_is_its_row_and_the_other_kernel_runs(monkeypatch, tmp_path):
    """run_case's per-kernel guard, on the CPU: the GPU-only parts (inputs on CUDA, the GPU
    reference, planning and launching) are replaced; the fused kernel's launch raises a CUDA
    OOM, the naive kernel's plan raises another error: two error rows, both written."""
    torch = pytest.importorskip("torch")
    import spak.gpu.launch as _gpu_launch_mod
    spec = parse_spec("1x2x64x64/fp16/causal")
    g = torch.Generator().manual_seed(0)

    def inputs(spec, seed=0, set_index=0, device="cuda"):
        q, k, v = (torch.randn(spec.q_shape, generator=g).half() for _ in range(3))
        return {"q": q, "k": k, "v": v, "mask": None, "kmask": None}

    def plan(kernel, *a, **kw):
        if kernel == "fused":
            raise _oom()
        raise ValueError("tiles['TILE_M'] must be in [16, 256], got 8")

    monkeypatch.setattr(FWD, "gpu_inputs", inputs)
    monkeypatch.setattr(FWD, "gpu_reference",
                        lambda spec, x: {"out": torch.zeros(x["q"].shape, dtype=torch.float64)})
    monkeypatch.setattr(_gpu_launch_mod, "plan_torch", plan)
    args = SimpleNamespace(no_time=True, no_sim=True, no_sdpa=True, max_sets=1, seed=0,
                           naive_max_gb=16.0, tiles=(64, 64), model=None, sim_heads=1,
                           sim_work=1)
    env = SimpleNamespace(base={"schema": "spak.run/1", "gpu": "Fake GPU"}, arch="sm_90",
                          l2_bytes=50 << 20)
    p = tmp_path / "run.jsonl"
    rows = run_case_mod.guarded_case(
        spec, ("fused", "naive"),
        lambda em: run_case_mod.run_case(spec, ("fused", "naive"), args, env, None, em),
        lambda r: append_jsonl(p, r), env.base)
    assert [r["provider"] for r in rows] == ["spak-fused", "spak-naive"]
    assert rows[0]["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert rows[1]["error"].startswith("ValueError: tiles['TILE_M']")
    assert [r["provider"] for r in _lines(p)] == ["spak-fused", "spak-naive"]
    assert not any(r["passed"] for r in rows)
