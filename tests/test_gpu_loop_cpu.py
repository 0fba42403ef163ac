"""The GPU loop (`spak run`, the sweep worker's GPU side) on the CPU: the shared timer with
torch.cuda's events stubbed, the FMHA forward family's GPU methods on CPU tensors (inputs,
float64 references, SDPA peers, checks), and `spak run` end to end with cuTile's launch
replaced by the CPU simulator running the same launches.

Every "simulator agrees with the GPU" figure in this file is the simulator compared with
itself (it plays the GPU): it tests the slicing and bookkeeping of the agreement, never the
simulator's fidelity. Fidelity evidence: tests/test_gpu*.py (marked gpu) and results/.
"""
from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spak.attention.reference import attention_f64  # noqa: E402
from spak.device import agreement, case, gpu_reference, timing  # noqa: E402
from spak.device.calls import GpuCall  # noqa: E402
from spak.families.base import KernelFamily  # noqa: E402
from spak.families.fmha_fwd import FAMILY as FWD  # noqa: E402
from tests.helpers_gpu_loop import (HostEvent, patch_run_env, run_args, sim_env,  # noqa: E402
                                    stub_cuda_timing)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's timing and device queries stubbed; returns the call log."""
    HostEvent.log = []
    stub_cuda_timing(monkeypatch, torch, sleep=lambda n: HostEvent.log.append(("sleep", n)))
    return HostEvent.log


@pytest.fixture
def sim_launch(monkeypatch, fake_cuda):
    """cuTile's launch (through spak.gpu.launch) runs the kernel in the CPU simulator on
    the tensors' memory, so a GpuCall computes real outputs on the CPU."""
    from spak import sim
    import spak.gpu.launch as gl
    launched = []

    def launch(stream, grid, kernel, args):
        launched.append(kernel)
        arrs = [sim.SimArray(a.numpy()) if isinstance(a, torch.Tensor) else a for a in args]
        sim.launch(kernel, grid, arrs)
    monkeypatch.setattr(gl, "ct", types.SimpleNamespace(launch=launch))
    monkeypatch.setattr(gl, "current_raw_stream", lambda *a: 0)
    return launched


# ------------------------------------------------------------------ the timer

def test_time_events_batches_behind_a_sleep_and_rotates_the_sets(fake_cuda):
    seen = []
    st = timing.time_events(seen.append, 3, warmup=2, batches=4, target_s=0.004,
                            max_per_batch=5)
    assert seen[:2] == [0, 1]                          # warm-up, then the estimate call
    assert seen[2] == 0
    timed = seen[3:]
    assert st["batches"] == 4 and st["runs"] == len(timed) == 4 * st["per_batch"]
    assert 1 <= st["per_batch"] <= 5
    assert timed == [i % 3 for i in range(len(timed))]   # every set in turn
    sleeps = [x for x in fake_cuda if isinstance(x, tuple)]
    assert len(sleeps) == 4 and all(0 < n <= timing.SLEEP_MAX_S * 1.4e9 for _, n in sleeps)
    for key in ("ms_median", "ms_p25", "ms_p75", "ms_min", "ms_max", "spread"):
        assert key in st


def test_input_set_count_covers_three_l2_sizes():
    assert timing.input_set_count(1 << 20, 50 << 20, 8) == 8            # small: the cap
    assert timing.input_set_count(40 << 20, 50 << 20, 8) == 4           # ceil(150/40)
    assert timing.input_set_count(400 << 20, 50 << 20, 8) == 1          # big: one set
    assert timing.input_set_count(0, 50 << 20, 2) == 2


# ------------------------------------------------------------------ family GPU methods

def test_gpu_inputs_are_reproducible_random_and_timing_sets_share_the_mask():
    spec = FWD.parse("2x4:2x33:70x64/fp16/causal/mask")
    a = FWD.gpu_inputs(spec, 0, 0, "cpu")
    b = FWD.gpu_inputs(spec, 0, 0, "cpu")
    assert set(a) == {"q", "k", "v", "mask", "kmask"}
    for n in ("q", "k", "v"):
        assert torch.equal(a[n], b[n]) and a[n].abs().sum() > 0 and a[n].dtype == torch.float16
    assert a["q"].shape == spec.q_shape and a["k"].shape == spec.kv_shape
    assert torch.isneginf(a["mask"][0, 0, spec.Sq // 2]).all()        # the dead row
    assert a["kmask"].dtype == torch.float32
    sets = FWD.gpu_input_sets(spec, 0, 3, "cpu")
    assert len(sets) == 3 and not torch.equal(sets[1]["q"], sets[0]["q"])
    assert sets[2]["mask"] is sets[0]["mask"] and sets[2]["kmask"] is sets[0]["kmask"]


@pytest.mark.parametrize("case_", ["1x2x40:70x32/causal/bf16", "2x4:2x50:20x32/causal/mask",
                                   "1x2x30x32/noncausal/boolmask"])
def test_gpu_reference_on_device_matches_the_cpu_reference(monkeypatch, case_):
    spec = FWD.parse(case_)
    x = FWD.gpu_inputs(spec, 1, 0, "cpu")
    small = FWD.gpu_reference(spec, x)["out"]
    monkeypatch.setattr(gpu_reference, "CPU_REF_MAX_FLOPS", 0)           # the torch path
    monkeypatch.setattr(gpu_reference, "_BLOCK_ELEMS", 16 * spec.Sk)      # several blocks
    big = FWD.gpu_reference(spec, x)["out"]
    assert small.dtype == big.dtype == torch.float64
    assert torch.allclose(small, big, rtol=1e-12, atol=1e-12)
    np_ref = attention_f64(x["q"].float().numpy(), x["k"].float().numpy(),
                           x["v"].float().numpy(), mask=None if x["mask"] is None
                           else x["mask"].numpy(), causal=spec.causal)
    assert np.allclose(big.numpy(), np_ref, rtol=1e-12, atol=1e-12)


def test_sdpa_peer_reference_follows_spak_conventions():
    # causal with Sq > Sk: the first Sq - Sk rows see no key and must be zero
    spec = FWD.parse("1x2x90:40x32/causal/fp16")
    x = FWD.gpu_inputs(spec, 0, 0, "cpu")
    ref = FWD.gpu_reference(spec, x)["out"]
    peer = FWD.peer_reference(spec, x)["out"]
    assert (peer[:, :, :50] == 0).all()
    assert case.rel_l2(peer, ref) < FWD.gate(spec, "out")
    calls = FWD.peer_calls(spec, x)
    assert list(calls) == ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient"]
    with pytest.raises(ValueError, match="unknown SDPA peer"):
        FWD.peer_calls(spec, x, names=["sdpa-bogus"])
    math_peer = FWD.peer_calls(spec, x, names=["sdpa-math"])["sdpa-math"]
    with math_peer.context():
        out = math_peer.conform(math_peer.outputs(math_peer.run(x)))["out"]
    assert case.rel_l2(out, ref) < FWD.gate(spec, "out")


def test_gpu_check_fails_a_wrong_output_and_a_nonzero_dead_row():
    spec = FWD.parse("1x2x90:40x32/causal/fp16")
    x = FWD.gpu_inputs(spec, 0, 0, "cpu")
    ref = FWD.gpu_reference(spec, x)
    peer = FWD.peer_reference(spec, x)
    good = {"out": ref["out"].half()}
    row = FWD.gpu_check(spec, x, good, ref, peer)
    assert row["passed"] and row["dead_rows"] == 2 * 50 and row["masked_rows_zero"]
    assert row["rel_l2"] < 1e-3 and row["rel_l2_vs_sdpa"] < 2e-3 and row["nonfinite"] == 0
    dead = {"out": good["out"].clone()}
    dead["out"][0, 0, 3, 0] = 1.0                   # a row that sees no key, not zero
    assert not FWD.gpu_check(spec, x, dead, ref, peer)["passed"]
    nan = {"out": good["out"].clone()}
    nan["out"][0, 1, 60, 5] = float("nan")
    r = FWD.gpu_check(spec, x, nan, ref, peer)
    assert r["nonfinite"] == 1 and not r["passed"]


def test_gpu_config_and_workspace():
    spec = FWD.parse("2x4x128x64/fp16/causal")
    assert FWD.gpu_config("fused", spec, "cpu", tiles=(64, 32)) == {"TILE_M": 64, "TILE_N": 32}
    assert FWD.workspace_bytes("naive", spec) == 2 * 4 * 128 * 128 * 6
    assert FWD.workspace_bytes("fused", spec) == 0
    with pytest.raises(ValueError, match="TILE_M"):
        FWD.gpu_call("fused", spec, FWD.gpu_inputs(spec, 0, 0, "cpu"),
                     {"TILE_M": 48, "TILE_N": 32})


def test_a_family_without_gpu_methods_says_so():
    class Bare(KernelFamily):
        name = "bare"
    assert FWD.has_gpu_loop() and not Bare().has_gpu_loop()
    with pytest.raises(ValueError, match="--tiles"):
        Bare().gpu_config("k", None, "cpu", tiles=(64, 64))


# ------------------------------------------------------------------ calls on the simulator

def test_gpu_call_and_agreement_slicing_sim_vs_sim(sim_launch):
    """The GPU call and the agreement's slicing and replay dump. The simulator stands in
    for the GPU (sim_launch), so the 100% below is the simulator against itself: a test of
    the slicing and bookkeeping, NOT evidence of the simulator's fidelity (that is
    tests/test_gpu.py on a GPU and the H100/H200 recordings in results/agreement-*)."""
    spec = FWD.parse("1x2x200:130x64/fp16/causal/mask")
    x = FWD.gpu_inputs(spec, 0, 0, "cpu")
    call = FWD.gpu_call("fused", spec, x, {"TILE_M": 64, "TILE_N": 64, "occupancy": 2})
    assert isinstance(call, GpuCall) and torch.isnan(call.outputs["out"]).all()   # poisoned
    assert call.hints == {"occupancy": 2, "num_ctas": None}
    call()
    assert sim_launch and not torch.isnan(call.outputs["out"]).any()
    row = FWD.gpu_check(spec, x, call.outputs, FWD.gpu_reference(spec, x),
                        FWD.peer_reference(spec, x))
    assert row["passed"], row
    dump: dict = {}
    res = agreement.agreement(FWD, "fused", spec, x, call.outputs, {"TILE_M": 64, "TILE_N": 64},
                              model="sm_90", work=64 * spec.Sk * spec.D, dump=dump)
    assert res["fraction_bit_identical"] == 1.0 and res["max_ulp"] == 0
    assert res["elements"] == 72 * 64 and "rows 128..199 of 200" in res["slice"]
    assert dump == {}                                  # nothing disagreed
    call.outputs["out"][0, 0, 199, 0] += 1.0           # one element off: kept for replay
    res = agreement.agreement(FWD, "fused", spec, x, call.outputs, {"TILE_M": 64, "TILE_N": 64},
                              model="sm_90", work=64 * spec.Sk * spec.D, dump=dump)
    assert res["fraction_bit_identical"] < 1.0
    assert {"000/q", "000/k", "000/v", "000/mask", "000/gpu", "000/meta"} <= set(dump)
    meta = json.loads(dump["000/meta"].tobytes())
    assert meta == {"case": f"fused|{spec.case_id}", "scale": 1 / math.sqrt(64),
                    "causal": True, "dtype": "fp16", "tiles": {"TILE_M": 64, "TILE_N": 64}}


def _args(**kw):
    return run_args(**{"tiles": (64, 64), **kw})


def test_run_case_checks_simulates_and_times_every_provider(sim_launch, monkeypatch,
                                                            tmp_path):
    monkeypatch.setenv("SPAK_PEERS", str(tmp_path))      # no fetched peers: notes
    spec = FWD.parse("1x1x64x64/fp16/noncausal")
    rows = []
    out = case.run_case(spec, ("fused", "naive"), _args(no_time=False), sim_env(), 500.0,
                        rows.append, FWD)
    assert rows == out
    names = [r["provider"] for r in rows]
    assert names[:5] == ["spak-fused", "spak-naive", "sdpa-flash", "sdpa-cudnn",
                         "sdpa-efficient"]
    # every other peer plug-in of the forward is a row: timed, skipped with the reason, or
    # (a peer importable here whose CPU call fails) its error: never the end of the run
    assert set(names[5:]) <= {"nvidia-sample", "tilegym", "flashinfer"}
    assert all(r.get("ms_median") or (r.get("skipped") and r.get("note")) or r.get("error")
               for r in rows[5:])
    for r in rows[:2]:
        assert r["passed"] and r["family"] == "fmha_fwd" and r["case"] == spec.case_id
        # sim vs sim (the simulator is the GPU here): the row's bookkeeping, not fidelity
        assert r["sim"]["fraction_bit_identical"] == 1.0 and r["sim"]["slice"] == "full problem"
        assert r["ms_median"] > 0 and r["runs"] >= r["batches"] and r["input_sets"] == 2
        assert r["timing"] == "in turns" and r["tflops"] > 0 and r["pct_ceiling"] > 0
        assert r["tiles"] == {"TILE_M": 64, "TILE_N": 64}
        for key in ("B", "Hq", "Hkv", "Sq", "Sk", "D", "dtype", "causal", "mask", "flops",
                    "rel_l2", "rel_l2_vs_sdpa", "max_abs", "nonfinite", "gate",
                    "first_call_s", "ceiling_tflops", "schema", "gpu"):
            assert key in r, key
    # the SDPA backends have no CPU kernels: each is a skipped row, not a failure
    assert all(r.get("skipped") or r.get("ms_median") for r in rows[2:5])


def test_run_case_skips_naive_over_its_workspace_limit(sim_launch):
    spec = FWD.parse("1x2x64x64/fp16/noncausal")
    rows = case.run_case(spec, ("naive",), _args(naive_max_gb=1e-9, no_sim=True), sim_env(),
                         None, lambda r: None, FWD)
    assert rows[0]["skipped"].startswith("naive workspace") and "--naive-max-gb" in \
        rows[0]["skipped"]


def test_spak_run_command_on_the_simulator(sim_launch, monkeypatch, tmp_path, capsys):
    from spak.cli import main
    patch_run_env(monkeypatch, torch)
    out = tmp_path / "run.jsonl"
    code = main(["run", "--kernel", "all", "--shapes", "1x2x64x64", "--causal", "yes",
                 "--no-time", "--tiles", "64x64", "--json", "--out", str(out)])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 0, captured.err
    assert [r["provider"] for r in doc["rows"]] == ["spak-fused", "spak-naive"]
    assert doc["summary"].startswith("2/2 SPAK kernel cases passed; simulator bit-identical "
                                     "100.00%")
    assert [json.loads(ln) for ln in out.read_text().splitlines()] == doc["rows"]
    assert "fused  1x2x64x64" in captured.err                 # the table, on stderr
    code = main(["run", "--kernel", "naive", "--family", "fmha_fwd", "--list",
                 "--shapes", "1x2x64x64/fp16"])
    assert code == 0 and capsys.readouterr().out.split() == ["1x2x64x64/fp16/noncausal",
                                                             "1x2x64x64/fp16/causal"]
