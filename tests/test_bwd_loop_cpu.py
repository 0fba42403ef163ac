"""The FMHA backward's GPU loop on the CPU: the fmha_bwd family's GPU methods on torch CPU
tensors (input sets with the forward's out and LSE, float64 gradients, checks, SDPA's
backward through autograd as peers, forward+backward rows, the simulator's exact slices),
`spak run --family fmha_bwd` end to end with cuTile's launch replaced by the CPU simulator
running the same launches, the sweep's GPU runner, `spak sweep --list`, `spak store` and
`spak plan plans/fmha_bwd.toml` without a GPU.

The simulator plays the GPU here: every simulator-vs-"GPU" agreement in this file is the
simulator against itself (the slicing and bookkeeping of the agreement, not fidelity;
that is tests/test_gpu_bwd.py on a GPU and results/).
"""
from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spak import families  # noqa: E402
from spak.attention.reference import attention_f64, attention_grads_f64  # noqa: E402
from spak.device import agreement, bwd_gpu, case  # noqa: E402
from spak.device.calls import GpuCall  # noqa: E402
from spak.gpu.plan_bwd import PARTIAL_WRITERS  # noqa: E402
from tests.helpers_gpu_loop import patch_run_env, run_args, sim_env, stub_cuda_timing  # noqa: E402

BWD = families.get("fmha_bwd")
GRADS = ("dq", "dk", "dv")


@pytest.fixture
def sim_launch(monkeypatch):
    """torch.cuda's timing calls stubbed and cuTile's launch (through spak.gpu.launch) run
    by the CPU simulator: a GpuCall computes real outputs. fp16 and float32 tensors are
    simulated in place; bf16 ones as float32 copies holding bf16 values, copied back."""
    import cuda.tile as ct
    from spak import sim
    import spak.gpu.launch as gl
    stub_cuda_timing(monkeypatch, torch)
    launched = []

    def wrap(a):
        if not isinstance(a, torch.Tensor):
            return a
        if a.dtype == torch.bfloat16:
            return sim.SimArray(a.float().numpy(), ct.bfloat16)
        return sim.SimArray(a.numpy())

    def launch(stream, grid, kernel, args):
        launched.append(kernel)
        arrs = [wrap(a) for a in args]
        # the fused-dQ pass leaves parts of its workspaces unwritten by design
        sim.launch(kernel, grid, arrs, check_unwritten=kernel not in PARTIAL_WRITERS)
        for a, s in zip(args, arrs):
            if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16:
                a.copy_(torch.from_numpy(s.data))
    monkeypatch.setattr(gl, "ct", types.SimpleNamespace(launch=launch))
    monkeypatch.setattr(gl, "current_raw_stream", lambda *a: 0)
    return launched


def _names(kernels) -> list[str]:
    return [getattr(k, "__name__", None) or k._annotated_function.pyfunc.__name__
            for k in kernels]


# ------------------------------------------------------------------ inputs and references

def test_input_sets_hold_the_forwards_output_and_lse(sim_launch):
    spec = BWD.parse("1x4:2x30:50x32/fp16/causal/mask")      # GQA, Sq < Sk, a dead row
    a = BWD.gpu_inputs(spec, 0, 0, "cpu")
    assert set(a) == {"q", "k", "v", "mask", "kmask", "dout", "out", "lse"}
    assert _names(sim_launch) == ["fmha_fwd_lse_kernel"]       # our fused forward, once
    b = BWD.gpu_inputs(spec, 0, 0, "cpu")
    for n in ("q", "k", "v", "dout", "out", "lse"):
        assert torch.equal(a[n], b[n]), n                        # reproducible
    assert a["dout"].shape == spec.q_shape and a["dout"].abs().sum() > 0
    assert not torch.equal(a["dout"], a["q"])                   # its own stream
    ref = attention_f64(a["q"].numpy(), a["k"].numpy(), a["v"].numpy(),
                        mask=a["mask"].numpy(), causal=True)
    assert np.linalg.norm(a["out"].double().numpy() - ref) / np.linalg.norm(ref) < 1e-3
    dead = torch.isinf(a["lse"])                                # row Sq // 2 of batch 0
    assert dead.sum() == spec.Hq and dead[0, :, spec.Sq // 2].all()
    assert torch.isfinite(a["lse"][~dead]).all() and (a["out"][dead] == 0).all()
    sets = BWD.gpu_input_sets(spec, 0, 3, "cpu")
    assert len(sets) == 3 and torch.equal(sets[0]["out"], a["out"])
    assert sets[2]["mask"] is sets[0]["mask"] and sets[2]["kmask"] is sets[0]["kmask"]
    assert not torch.equal(sets[1]["dout"], sets[0]["dout"])
    assert not torch.equal(sets[1]["out"], sets[0]["out"])    # its own forward
    alone = BWD.gpu_inputs(spec, 0, 2, "cpu")                  # the mask drawn again
    assert torch.equal(alone["out"], sets[2]["out"]) and torch.equal(alone["mask"],
                                                                      sets[0]["mask"])


@pytest.mark.parametrize("case_", ["1x4:2x40:70x32/fp16/causal/mask",
                                   "2x2x50:20x32/bf16/causal",           # rows with no key
                                   "1x2x30x32/fp16/noncausal/boolmask"])
def test_device_reference_matches_the_cpu_reference(sim_launch, monkeypatch, case_):
    spec = BWD.parse(case_)
    x = BWD.gpu_inputs(spec, 1, 0, "cpu")
    small = BWD.gpu_reference(spec, x)
    monkeypatch.setattr(bwd_gpu, "CPU_REF_MAX_FLOPS", 0)             # the torch path
    monkeypatch.setattr(bwd_gpu, "_BLOCK_ELEMS", 16 * spec.Sk)        # several row blocks
    big = BWD.gpu_reference(spec, x)
    f = (lambda t: t.float().numpy())
    want = attention_grads_f64(f(x["q"]), f(x["k"]), f(x["v"]), f(x["dout"]),
                               mask=x["mask"].numpy() if x["mask"] is not None else None,
                               causal=spec.causal)
    for n, w in zip(GRADS, want):
        assert small[n].dtype == big[n].dtype == torch.float64
        assert np.allclose(big[n].numpy(), w, rtol=1e-11, atol=1e-12), n
        assert torch.allclose(small[n], big[n], rtol=1e-11, atol=1e-12), n
        assert np.isfinite(w).all() and np.abs(w).sum() > 0


# ------------------------------------------------------------------ our call and its checks

def test_gpu_call_times_the_backward_alone_and_passes_its_checks(sim_launch):
    spec = BWD.parse("1x4:2x70:150x64/fp16/causal/mask")
    x = BWD.gpu_inputs(spec, 0, 0, "cpu")
    cfg = {"DKV_TILE_M": 32, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 64,
           "occupancy": 1, "num_ctas": None}
    call = BWD.gpu_call("fused", spec, x, cfg)
    assert isinstance(call, GpuCall) and set(call.outputs) == set(GRADS)
    assert all(torch.isnan(t).all() for t in call.outputs.values())        # poisoned
    assert [L.name for L in call.launches] == ["bwd.preprocess", "bwd.dkdv", "bwd.dq"]
    # the hints reach the dK/dV and dQ kernels; the preprocess keeps its own occupancy
    occ = [L.kernel._compiler_options.occupancy for L in call.launches]
    assert occ[1:] == [1, 1] and occ[0] != 1
    del sim_launch[:]
    call()
    assert _names(sim_launch) == ["fmha_bwd_preprocess_kernel", "fmha_bwd_dkdv_kernel",
                                  "fmha_bwd_dq_kernel"]                   # no forward
    row = BWD.gpu_check(spec, x, call.outputs, BWD.gpu_reference(spec, x),
                        BWD.peer_reference(spec, x))
    assert row["passed"], row
    assert set(row["outputs"]) == set(GRADS) and row["dead_rows"] == 4
    worst = max(row["outputs"].values(), key=lambda e: e["rel_l2"])
    assert row["rel_l2"] == worst["rel_l2"] < 1e-3 and row["rel_l2_vs_sdpa"] < 2e-3
    with pytest.raises(ValueError, match="DKV_TILE_N"):
        BWD.gpu_call("fused", spec, x, {"DKV_TILE_N": 48})
    with pytest.raises(ValueError, match="unknown keys"):
        BWD.gpu_call("fused", spec, x, {"TILE_M": 64})
    with pytest.raises(ValueError, match="kernel must be"):
        BWD.gpu_call("naive", spec, x, {})


def test_fused_dq_kernel_through_the_gpu_loop(sim_launch):
    """The fused_dq kernel (DQ_FUSED, issue 35): two launches, gradients within the gates
    vs float64, dead rows' dQ zero, dQ on the dK/dV pass's row tiles in the exact cuts."""
    spec = BWD.parse("1x4:2x130:100x64/fp16/causal")       # the first 30 rows see no key
    x = BWD.gpu_inputs(spec, 0, 0, "cpu")
    cfg = {**BWD.gpu_config("fused_dq", spec, "cpu"), "DKV_TILE_M": 32, "DKV_TILE_N": 32}
    assert cfg["DQ_FUSED"] == 1 and BWD.gpu_config("fused", spec, "cpu").get("DQ_FUSED") is None
    assert BWD.workspace_bytes("fused_dq", spec) > BWD.workspace_bytes("fused", spec)
    call = BWD.gpu_call("fused_dq", spec, x, cfg)
    assert [L.name for L in call.launches] == ["bwd.preprocess", "bwd.dkdv"]
    del sim_launch[:]
    call()
    assert _names(sim_launch) == ["fmha_bwd_preprocess_dq_kernel", "fmha_bwd_dkdvdq_kernel"]
    row = BWD.gpu_check(spec, x, call.outputs, BWD.gpu_reference(spec, x))
    assert row["passed"] and row["dead_rows"] == 4 * 30, row
    work = 64 * 100 * 64 * 4
    cuts = BWD.sim_slice("fused_dq", spec, x, call.outputs, cfg, work=work)
    assert [sorted(c.gpu) for c in cuts] == [["dk", "dv"], ["dq"]]
    assert (130 - cuts[1].problem.Sq) % 32 == 0               # r0: DKV_TILE_M's multiple
    res = agreement.agreement(BWD, "fused_dq", spec, x, call.outputs, cfg, model="sm_90",
                              work=work)
    assert res["fraction_bit_identical"] == 1.0                # sim vs sim: bookkeeping


def test_gpu_check_fails_wrong_nan_and_nonzero_dead_gradients(sim_launch):
    spec = BWD.parse("1x2x90:40x32/fp16/causal")           # the first 50 rows see no key
    x = BWD.gpu_inputs(spec, 0, 0, "cpu")
    ref = BWD.gpu_reference(spec, x)
    good = {n: ref[n].half() for n in GRADS}
    row = BWD.gpu_check(spec, x, good, ref, BWD.peer_reference(spec, x))
    assert row["passed"] and row["dead_rows"] == 2 * 50 and row["masked_rows_zero"]
    for name, (idx, val) in {"dq": ((0, 0, 3, 0), 1e-3),             # a dead row's dQ
                             "dk": ((0, 1, 5, 2), float("nan")),
                             "dv": (slice(None), 0.0)}.items():        # all wrong
        bad = {n: t.clone() for n, t in good.items()}
        bad[name][idx] = val
        r = BWD.gpu_check(spec, x, bad, ref)
        assert not r["passed"] and not r["outputs"][name]["passed"] or name == "dq", name
        assert not r["passed"], name
    assert BWD.gpu_check(spec, x, {**good, "dk": good["dk"].clone().fill_(float("nan"))},
                         ref)["nonfinite"] == good["dk"].numel()


def test_an_exactly_zero_gradient_is_measured_against_its_size(sim_launch):
    # one key: softmax is constant, so dQ and dK are exactly 0; ours is rounding noise
    spec = BWD.parse("1x2x20:1x32/fp16/noncausal")
    x = BWD.gpu_inputs(spec, 0, 0, "cpu")
    call = BWD.gpu_call("fused", spec, x, BWD.gpu_config("fused", spec, "cpu"))
    call()
    ref = BWD.gpu_reference(spec, x)
    assert float(ref["dq"].abs().max()) == 0.0
    row = BWD.gpu_check(spec, x, call.outputs, ref)
    assert row["passed"], row
    assert all(math.isfinite(e["rel_l2"]) for e in row["outputs"].values())
    big = {**call.outputs, "dq": call.outputs["dq"] + 0.5}               # not noise
    assert not BWD.gpu_check(spec, x, big, ref)["passed"]


def test_gpu_config_tiles_store_and_workspace(monkeypatch, tmp_path):
    spec = BWD.parse("2x4x300x64/fp16/causal")
    assert BWD.gpu_config("fused", spec, "cpu", tiles=(32, 64)) == {
        "DKV_TILE_M": 32, "DKV_TILE_N": 64, "DQ_TILE_M": 32, "DQ_TILE_N": 64}
    default = BWD.default_config(spec, "sm_90")
    assert BWD.gpu_config("fused", spec, "cpu") == default
    assert BWD.workspace_bytes("fused", spec) == 8 * 2 * 4 * 300
    # on a GPU: the store's entry for this GPU, filled up from the defaults
    store = {"version": 2, "configs": [{
        "family": "fmha_bwd", "gpu": "Sim GPU", "kernel": "fused", "dtype": "fp16",
        "head_dim": 64, "causal": True, "seq_bucket": 512,
        "tiles": {"DKV_TILE_M": 32, "DKV_TILE_N": 128, "DQ_TILE_M": 64, "DQ_TILE_N": 64,
                  "occupancy": 1}}]}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(store))
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Sim GPU")
    monkeypatch.setattr(bwd_gpu, "_arch", lambda device: "sm_90")
    assert BWD.gpu_config("fused", spec, "cuda") == {**default, **store["configs"][0]["tiles"]}
    other = BWD.parse("2x4x300x128/fp16/causal")                       # no entry: defaults
    assert BWD.gpu_config("fused", other, "cuda") == BWD.default_config(other, "sm_90")


# ------------------------------------------------------------------ peers

def test_peers_compute_spak_gradients_and_forward_backward_rows(sim_launch):
    spec = BWD.parse("1x2x50:20x32/fp16/causal/mask")      # rows with no key, a masked row
    x = BWD.gpu_inputs(spec, 0, 0, "cpu")
    ref = BWD.gpu_reference(spec, x)
    assert list(BWD.peer_calls(spec, x)) == ["sdpa-cudnn", "sdpa-flash",
                                             "fwd+bwd:spak-fused", "fwd+bwd:sdpa-cudnn",
                                             "fwd+bwd:sdpa-flash"]
    with pytest.raises(ValueError, match="unknown fmha_bwd peer"):
        BWD.peer_calls(spec, x, names=["sdpa-bogus"])
    peers = BWD.peer_calls(spec, x, names=["sdpa-math", "fwd+bwd:sdpa-math",
                                           "fwd+bwd:spak-fused"])
    assert peers["sdpa-math"].flops is None
    assert peers["fwd+bwd:sdpa-math"].flops == peers["fwd+bwd:spak-fused"].flops == \
        3.5 * spec.flops
    for name, peer in peers.items():
        with peer.context():
            first = peer.outputs(peer.run(x))
            again = peer.outputs(peer.run(x))                    # the graph was kept
        for n in GRADS:
            assert torch.isfinite(first[n]).all(), (name, n)
            assert case.rel_l2(first[n], ref[n]) < 1e-3, (name, n)
            assert torch.equal(first[n], again[n]), (name, n)
        assert (first["dq"][:, :, :30] == 0).all(), name          # rows that see no key
    cudnn = BWD.peer_calls(spec, x, names=["sdpa-cudnn"])["sdpa-cudnn"]
    # cuDNN only, no fallback to the math backend: torch finds no kernel for CPU tensors
    with cudnn.context(), pytest.raises(RuntimeError, match="No viable backend"):
        cudnn.run(x)
    peer_ref = BWD.peer_reference(spec, x)
    assert all(case.rel_l2(peer_ref[n], ref[n]) < 1e-3 for n in GRADS)


# ------------------------------------------------------------------ the simulator's slices

def test_agreement_slicing_sim_vs_sim_whole_head_group_and_two_exact_cuts(sim_launch):
    """Which rows/keys the agreement compares, and that a changed element is seen (or not,
    outside the cut). Sim vs sim: the 100% is the simulator against itself."""
    spec = BWD.parse("1x2x200:300x64/fp16/causal")
    x = BWD.gpu_inputs(spec, 0, 0, "cpu")
    cfg = {"DKV_TILE_M": 32, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 64}
    call = BWD.gpu_call("fused", spec, x, cfg)
    call()
    whole = agreement.agreement(BWD, "fused", spec, x, call.outputs, cfg, model="sm_90")
    assert whole["fraction_bit_identical"] == 1.0 and whole["max_ulp"] == 0
    assert whole["slice"] == "b=0, q heads 0..0 (kv 0..0), all 200 rows and 300 keys"
    assert whole["elements"] == 200 * 64 + 2 * 300 * 64
    # a smaller budget: dK/dV on the last keys (all rows), dQ on the last rows (all keys)
    work = 64 * 300 * 64 * 2
    cuts = BWD.sim_slice("fused", spec, x, call.outputs, cfg, work=work)
    assert [sorted(c.gpu) for c in cuts] == [["dk", "dv"], ["dq"]]
    assert (cuts[0].problem.Sq, cuts[0].problem.Sk) == (200, 300 - 192)      # k0 % 64 == 0
    assert (cuts[1].problem.Sq, cuts[1].problem.Sk) == (200 - 128, 300)      # r0 % 64 == 0
    assert cuts[0].inputs.out is not None and cuts[0].inputs.lse.dtype == np.float32
    res = agreement.agreement(BWD, "fused", spec, x, call.outputs, cfg, model="sm_90",
                              work=work)
    assert res["fraction_bit_identical"] == 1.0 and res["elements"] == 2 * 108 * 64 + 72 * 64
    assert res["slice"] == ("dk/dv: b=0, q heads 0..0 (kv 0..0), keys 192..299 of 300, all "
                            "rows; dq: b=0, q heads 0..0 (kv 0..0), rows 128..199 of 200, "
                            "all keys")
    dump: dict = {}
    call.outputs["dv"][0, 0, 299, 0] += 1.0                    # in the dK/dV cut: seen
    call.outputs["dq"][0, 0, 0, 0] += 1.0                      # outside the dQ cut: not
    res = agreement.agreement(BWD, "fused", spec, x, call.outputs, cfg, model="sm_90",
                              work=work, dump=dump)
    assert res["fraction_bit_identical"] == 1.0 - 1.0 / res["elements"]
    assert {"000/q", "000/dout", "000/out", "000/lse", "000/gpu_dk", "000/gpu_dv",
            "000/meta"} <= set(dump) and "001/meta" not in dump
    meta = json.loads(dump["000/meta"].tobytes())
    assert meta["keys_from"] == 192 and meta["compared"] == ["dk", "dv"]


# ------------------------------------------------------------------ spak run

@pytest.mark.slow
def test_run_case_times_the_backward_beside_its_peers(sim_launch):
    spec = BWD.parse("1x2:1x40:70x32/fp16/causal")
    rows = case.run_case(spec, ("fused",), run_args(no_time=False), sim_env(), 500.0,
                         lambda r: None, BWD)
    by = {r["provider"]: r for r in rows}
    assert list(by) == ["spak-fused", "sdpa-cudnn", "sdpa-flash", "fwd+bwd:spak-fused",
                        "fwd+bwd:sdpa-cudnn", "fwd+bwd:sdpa-flash"]
    ours = by["spak-fused"]
    assert ours["passed"] and ours["family"] == "fmha_bwd" and ours["sim"][
        "fraction_bit_identical"] == 1.0                    # sim vs sim: bookkeeping only
    assert ours["flops"] == 2.5 * spec.flops and ours["timing"] == "in turns"
    assert ours["tflops"] == pytest.approx(ours["flops"] / ours["ms_median"] / 1e9)
    both = by["fwd+bwd:spak-fused"]
    assert both["flops"] == 3.5 * spec.flops and both["rel_l2"] < 1e-3
    assert both["tflops"] == pytest.approx(both["flops"] / both["ms_median"] / 1e9)
    assert by["sdpa-cudnn"]["skipped"] and by["fwd+bwd:sdpa-cudnn"]["skipped"]   # no CPU kernel


def test_spak_run_command_on_the_simulator(sim_launch, monkeypatch, tmp_path, capsys):
    from spak.cli import main
    patch_run_env(monkeypatch, torch)
    out = tmp_path / "run.jsonl"
    code = main(["run", "--family", "fmha_bwd", "--shapes", "1x2x64x32",
                 "1x4:2x33:70x32/mask", "--causal", "yes", "--dtype", "fp16", "--no-time",
                 "--json", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(captured.out)
    assert [(r["provider"], r["case"]) for r in doc["rows"]] == [
        ("spak-fused", "1x2x64x32/fp16/causal"), ("spak-fused", "1x4:2x33:70x32/fp16/causal/mask")]
    for r in doc["rows"]:
        assert r["family"] == "fmha_bwd" and r["passed"] and set(r["outputs"]) == set(GRADS)
        assert r["tiles"] == BWD.default_config(BWD.parse(r["case"]), "sm_90")
    assert doc["summary"].startswith("2/2 SPAK kernel cases passed; simulator bit-identical "
                                     "100.00%")
    assert [json.loads(ln) for ln in out.read_text().splitlines()] == doc["rows"]
    assert "family fmha_bwd" in captured.err and "fused  1x2x64x32" in captured.err
    assert main(["run", "--family", "fmha_bwd", "--list", "--shapes", "1x2x64x32/fp16"]) == 0
    assert capsys.readouterr().out.split() == ["1x2x64x32/fp16/noncausal",
                                               "1x2x64x32/fp16/causal"]


# ------------------------------------------------------------------ the sweep

def test_sweep_list_space_and_compile_units(capsys):
    from spak.cli import main
    assert main(["sweep", "--family", "fmha_bwd", "--list", "--arch", "sm_90", "--shapes",
                 "2x4x300x64/causal", "1x8:2x100:300x64/mask/causal", "--dtype", "fp16",
                 "--space", "DKV_TILE_M=64", "DQ_TILE_M=64", "occupancy=2"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert "skipping 1 shape(s), masked" in out.err
    jobs = [ln.split() for ln in lines[:-2]]
    assert [j[1] for j in jobs[:3]] == ["sdpa-cudnn", "sdpa-flash", "spak-fused-default"]
    # the plan's space less its exclusions (DKV 64x128 spills: plans/fmha_bwd.toml); the
    # fused-dQ knob (DQ_FUSED) is out of the space: slower on a GPU
    assert {j[2] for j in jobs[3:]} == {"DKV64x64/DQ64x32/o2/c1", "DKV64x64/DQ64x64/o2/c1",
                                        "DKV64x64/DQ64x128/o2/c1"}
    assert "plans/fmha_bwd.toml [sweep.sm_90] with --space" in lines[-2]
    assert main(["sweep", "--family", "fmha_bwd", "--list", "--arch", "sm_90", "--shapes",
                 "2x4x300x64", "--space", "TILE_M=64"]) == 2
    assert "unknown space key 'TILE_M'" in capsys.readouterr().err
    # a masked problem's compile unit carries the kernel mask's specialisation
    spec = BWD.parse("1x8:2x100:300x64/fp16/mask")
    cfg = BWD.default_config(spec)
    unit = BWD.compile_unit("fused", spec, cfg, "default")
    assert unit["mask"] == [1, 1, 20, 28]                       # tiny, same divisibility
    assert unit["unit_id"].endswith("|mask u.u.-s.--1")
    plain = BWD.compile_unit("fused", spec.replace(mask=None), cfg, "default")
    assert "mask" not in plain and plain["unit_id"] != unit["unit_id"]


def test_compile_call_builds_the_forward_and_the_backward(sim_launch):
    spec = BWD.parse("2x4:2x77:130x80/fp16/causal/mask")
    cfg = {**BWD.default_config(spec), "occupancy": 2}
    unit = {**BWD.compile_unit("fused", spec, cfg, "x"), "family": "fmha_bwd"}
    call = BWD.compile_call(unit, "cpu")
    assert [L.name for L in call.launches][1:] == ["bwd.preprocess", "bwd.dkdv", "bwd.dq"]
    call()
    assert _names(sim_launch) == ["fmha_fwd_lse_kernel", "fmha_bwd_preprocess_kernel",
                                  "fmha_bwd_dkdv_kernel", "fmha_bwd_dq_kernel"]
    assert call.launches[3].args[0].shape == tuple(unit["q"])


def test_sweep_gpu_runner_checks_and_times_a_backward_config(sim_launch, monkeypatch):
    from tests.helpers_gpu_loop import cpu_sweep_runner
    r = cpu_sweep_runner(monkeypatch, torch)
    import spak.gpu.launch as gl
    r.ct = types.SimpleNamespace(launch=lambda stream, grid, kernel, args:
                                 gl.ct.launch(stream, grid, kernel, args))
    case_ = "1x2:1x40:70x32/fp16/causal"
    spec = BWD.parse(case_)
    job = {"family": "fmha_bwd", "kernel": "fused", "case": case_, "provider": "spak-fused",
           "config_id": "x", "flops": BWD.flops(spec),
           "config": {"DKV_TILE_M": 32, "DKV_TILE_N": 64, "DQ_TILE_M": 64, "DQ_TILE_N": 64,
                      "occupancy": 2, "num_ctas": None}}
    res = r.run(job)
    assert res["status"] == "ok", json.dumps(res, default=str)
    assert res["rel_l2_vs_sdpa"] < 2e-3 and res["ms_median"] > 0 and res["input_sets"] == 2
    assert r.run({**job, "config": {"DKV_TILE_M": 48}})["status"] == "invalid_config"
    assert r.run({**job, "provider": "sdpa-cudnn", "config": None})["status"] == "unsupported"
    unit = {**BWD.compile_unit("fused", spec, job["config"], "x"), "family": "fmha_bwd"}
    assert r.compile(unit)["status"] == "ok"


# ------------------------------------------------------------------ the store and the plan

def test_store_update_show_and_lookup_of_backward_rows(tmp_path, capsys):
    from spak.cli import main
    spec = BWD.parse("4x16x2048x64/fp16/causal")
    base = {"schema": "spak.sweep/2", "kind": "result", "family": "fmha_bwd",
            "gpu": "NVIDIA H100 80GB HBM3", "kernel": "fused", "case": spec.case_id,
            "shape": spec.display, "dtype": "fp16", "causal": True, "flops": BWD.flops(spec),
            "B": 4, "Hq": 16, "Hkv": 16, "Sq": 2048, "Sk": 2048, "D": 64, "status": "ok",
            "date": "2026-11-24T05:00:00Z", "commit": "abc"}
    dflt = {**BWD.default_config(spec), "occupancy": None, "num_ctas": None}
    tuned = {"DKV_TILE_M": 64, "DKV_TILE_N": 128, "DQ_TILE_M": 64, "DQ_TILE_N": 128,
             "occupancy": 2, "num_ctas": 1}
    rows = [{**base, "provider": "spak-fused-default", "config_id": "default",
             "config": dflt, "tflops": 200.0},
            {**base, "provider": "spak-fused", "config_id": "DKV64x128/DQ64x128/o2/c1",
             "config": tuned, "tflops": 250.0},
            {**base, "family": "fmha_fwd", "provider": "spak-fused", "config_id": "64x64",
             "config": {"TILE_M": 64, "TILE_N": 64}, "tflops": 999.0}]     # another family
    res = tmp_path / "sweep.jsonl"
    res.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = tmp_path / "store.json"
    assert main(["store", "--store", str(store), "--family", "fmha_bwd", "update",
                 str(res)]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3 fmha_bwd fused fp16 D=64 causal S<=2048: " in out
    assert "DKV64x128/DQ64x128/o2/c1 250.0 TFLOPS (1.250x default) [new]" in out
    (entry,) = json.loads(store.read_text())["configs"]
    assert entry["family"] == "fmha_bwd" and entry["tiles"] == tuned
    assert main(["store", "--store", str(store), "--family", "fmha_bwd", "show"]) == 0
    assert "DKV64x128/DQ64x128/o2/c1" in capsys.readouterr().out
    assert main(["store", "--store", str(store), "--family", "fmha_bwd", "lookup",
                 "NVIDIA H100 80GB HBM3", "fused", "fp16", "64", "yes", "1500"]) == 0
    assert "DKV64x128/DQ64x128/o2/c1" in capsys.readouterr().out
    assert main(["store", "--store", str(store), "lookup", "NVIDIA H100 80GB HBM3", "fused",
                 "fp16", "64", "yes", "1500"]) == 0               # the forward: none stored
    assert capsys.readouterr().out.startswith("none")


def test_report_hooks():
    spec = BWD.parse("2x8x4096x128/fp16/causal")
    place = BWD.report_place(spec)
    assert place.title == "Backward, with causal mask, head dim 128"
    assert place.group == (("D", 128), ("causal", True)) and place.size == 4096
    assert BWD.peer_label("sdpa-cudnn") == "SDPA cuDNN" and BWD.peer_label("x") == "x"
    assert BWD.compared_peers == ("sdpa-cudnn", "sdpa-flash") and "2.5" in \
        BWD.metric_definition
    assert BWD.has_gpu_loop() and BWD.store_key(spec) == {
        "dtype": "fp16", "head_dim": 128, "causal": True, "seq_bucket": 4096}


@pytest.mark.slow
def test_plan_cpu_gates_without_a_gpu(tmp_path, capsys):
    from spak.cli import main
    out = tmp_path / "plan"
    assert main(["plan", "plans/fmha_bwd.toml", "--no-gpu", "--no-compile", "--out",
                 str(out)]) == 0
    doc = json.loads((out / "report.json").read_text())
    passed = [(g["step"], g["metric"]) for g in doc["gates"] if g["status"] == "PASS"]
    assert ("backward", "Numerical error (simulator vs float64)") in passed
    assert ("tuned", "Sweep tiles: Numerical error (simulator vs float64)") in passed
    gpu = {g["metric"] for g in doc["gates"] if g["status"] == "not run here"}
    assert {"Numerical error (GPU vs float64)", "Correctness (simulator agrees with GPU)",
            "Tuned >= default tiles"} <= gpu
    assert doc["sweep"]["sm_90"]["DKV_TILE_N"] == [64, 128]


def test_fused_dq_ab_tool_on_the_simulator(sim_launch, tmp_path, capsys):
    """tools/bwd_fused_dq_ab.py (issue 35's GPU A/B) end to end on the CPU, the simulator
    playing the GPU: rows with times for our three providers, the fused ones deterministic
    and equal to each other, errors vs float64 within the gates; the SDPA peers have no
    CPU kernel here (their failure is a row note, not a crash)."""
    import importlib.util
    from spak import sim
    spec = importlib.util.spec_from_file_location("bwd_fused_dq_ab",
                                                  "tools/bwd_fused_dq_ab.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "ab.jsonl"
    assert tool.main(["--device", "cpu", "--shapes", "1x2:1x70x32/causal", "--dtypes",
                      "fp16", "--reps", "1", "--target-s", "0.001", "--parts2",
                      "--out", str(out)]) == 0
    [row] = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert set(row["ms"]) >= {"cur", "fused1", "fused2"}, row
    assert row["fused1_deterministic"] and row["fused2_deterministic"]
    assert row["fused1_eq_fused2"] and row["fused1e_deterministic"]
    assert row["rel_l2"]["fused1e"] < 1e-3
    assert all(row["rel_l2"][n] < 1e-3 for n in ("cur", "fused1", "fused2"))
    assert "problem" not in row.get("errors", {})
    assert "fp16 1x2:1x70x32/causal: TFLOPS cur" in capsys.readouterr().out
    del sim
