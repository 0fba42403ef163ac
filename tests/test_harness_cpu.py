"""The benchmark harness of `spak run` on the CPU (torch.cuda's timing faked): the timing
modes (kernel, flush, eager), the peer plug-ins (a missing peer is a row note, the same-size
copy of a bandwidth-bound family), the error ratios, both modes on one shape end to end
with the simulator as the GPU, and the plot."""
from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from spak.device import case, peers, timing  # noqa: E402
from spak.device.calls import PeerCall  # noqa: E402
from spak.families import get  # noqa: E402
from spak.families.fmha_fwd import FAMILY as FWD  # noqa: E402
from tests.helpers_gpu_loop import HostEvent, run_args, sim_env, stub_cuda_timing  # noqa: E402
from tests.test_gpu_loop_cpu import sim_launch, fake_cuda  # noqa: E402,F401


def test_flush_mode_flushes_before_every_call_and_times_each_alone(fake_cuda, monkeypatch):
    monkeypatch.setattr(timing, "FLUSH_BYTES", 1024)
    seen = []
    st = timing.time_flushed(seen.append, 3, warmup=2, target_s=0.001, max_calls=7,
                             device="cpu")
    timed = seen[3:]
    assert 5 <= st["runs"] == len(timed) <= 7
    assert timed == [i % 3 for i in range(len(timed))]
    # one event pair per timed call (plus the estimate's pair)
    assert fake_cuda.count("record") == 2 + 2 * len(timed)
    assert st["ms_median"] >= 0


def test_eager_mode_counts_host_time_per_call(fake_cuda):
    import time
    st = timing.time_eager(lambda i: time.sleep(0.002), 2, warmup=1, batches=3,
                           target_s=0.03)
    assert st["batches"] == 3 and st["runs"] == 3 * st["per_batch"]
    assert 2.0 <= st["ms_median"] < 20.0            # 2 ms of host work per call


def test_time_turns_rejects_an_unknown_mode(fake_cuda):
    with pytest.raises(ValueError, match="unknown timing mode 'bogus'"):
        timing.time_turns({"a": lambda i: None}, lambda i: None, 0, mode="bogus", spin_s=0)


def test_a_missing_peer_is_a_note_and_a_broken_one_too(monkeypatch):
    def missing(fam, p, sets):
        raise peers.PeerMissing("not here")

    def broken(fam, p, sets):
        raise KeyError("q")
    monkeypatch.setattr(peers, "PLUGINS", [
        peers.Plugin("gone", (), missing), peers.Plugin("bad", (), broken),
        peers.Plugin("ok", ("fmha_fwd",), lambda f, p, s: {"ok": PeerCall(run=len)}),
        peers.Plugin("other", ("fmha_decode",), lambda f, p, s: {"other": None})])
    calls, notes = peers.gather(FWD, FWD.parse("1x1x64x64/fp16"), [{}])
    assert list(calls) == ["ok"]
    assert notes == {"gone": "not here", "bad": "bad: KeyError: 'q'"}
    calls, notes = peers.gather(FWD, FWD.parse("1x1x64x64/fp16"), [{}], wanted=["gone"])
    assert calls == {} and list(notes) == ["gone"]
    # a plug-in off by default runs only when named
    monkeypatch.setattr(peers, "PLUGINS", [peers.Plugin(
        "slow", (), lambda f, p, s: {"slow": PeerCall(run=len)}, default=False)])
    assert peers.gather(FWD, FWD.parse("1x1x64x64/fp16"), [{}]) == ({}, {})
    assert list(peers.gather(FWD, FWD.parse("1x1x64x64/fp16"), [{}], ["slow"])[0]) == ["slow"]


def test_nvidia_sample_absent_and_tilegym_shape_limits_are_notes(monkeypatch, tmp_path):
    monkeypatch.setenv("SPAK_PEERS", str(tmp_path))
    spec = FWD.parse("1x1x64x64/fp16/noncausal")
    with pytest.raises(peers.PeerMissing, match="tools/peers_fetch.py"):
        peers._sample(FWD, spec, [{}])
    with pytest.raises(peers.PeerMissing, match="Sq != Sk"):
        peers._sample(FWD, FWD.parse("1x1x32:64x64/fp16/causal"), [{}])
    dec = get("fmha_decode")
    with pytest.raises(peers.PeerMissing, match="contiguous full-length"):
        peers._tilegym(dec, dec.parse("1x8:2x256x64/page16"), [{}])


def test_copy_peer_moves_the_familys_bytes_and_is_not_compared(fake_cuda):
    dec = get("fmha_decode")
    p = dec.parse("2x8:2x256x64")
    sets = dec.gpu_input_sets(p, 0, 2, "cpu")
    calls = peers._copy(dec, p, sets)
    cp = calls["copy"]
    assert cp.checked is False
    dst = cp.run(sets[1])
    assert 2 * dst.numel() == dec.bytes_moved(p) - dec.bytes_moved(p) % 2
    assert dst.float().std() > 0                       # random bytes, never zeros
    row = case._peer(dec, "copy", cp, sets, None)
    assert row["note"].startswith("not compared") and "rel_l2" not in row


def test_error_ratios_are_ours_over_each_peers():
    rows = [{"provider": "spak-fused", "kernel": "fused", "rel_l2": 1e-4},
            {"provider": "sdpa-flash", "kernel": None, "rel_l2": 2e-4},
            {"provider": "fwd+bwd:spak-fused", "kernel": None, "rel_l2": 1e-4},
            {"provider": "copy", "kernel": None}]
    case.error_ratios(rows)
    assert rows[0]["err_ratio"] == {"sdpa-flash": pytest.approx(0.5)}


def test_copy_fraction_is_the_copys_time_over_ours():
    rows = [{"provider": "spak-splitkv", "kernel": "splitkv", "ms_median": 2.0},
            {"provider": "copy", "kernel": None, "ms_median": 1.5}]
    case.copy_fraction(rows)
    assert rows[0]["of_copy"] == pytest.approx(0.75) and "of_copy" not in rows[1]


def test_run_case_times_both_modes_and_eager_calls_the_public_entry(sim_launch,
                                                                    monkeypatch):
    api_calls = []

    def eager_call(kernel, problem, inputs):
        return lambda: api_calls.append(kernel)
    monkeypatch.setattr(FWD, "eager_call", eager_call)
    spec = FWD.parse("1x1x64x64/fp16/noncausal")
    rows = case.run_case(spec, ("fused",), run_args(tiles=(64, 64), no_time=False,
                                                    no_sim=True, peers=["sdpa"],
                                                    timing=["kernel", "eager"], repeats=2),
                         sim_env(), 500.0, lambda r: None, FWD)
    ours = rows[0]
    assert set(ours["modes"]) == {"kernel", "eager"}
    assert ours["timing_mode"] == "kernel"
    assert ours["ms_median"] == ours["modes"]["kernel"]["ms_median"] > 0
    assert ours["modes"]["eager"]["call"] == "public entry" and api_calls
    assert ours["modes"]["kernel"]["call"] == "planned launches"


def test_plot_run_draws_one_panel_per_mode(tmp_path):
    pytest.importorskip("matplotlib")
    from spak.report.runplot import plot_run, run_series
    rows = [{"case": "c1", "provider": p, "flops": 1e12, "ms_median": ms,
             "modes": {"kernel": {"ms_median": ms}, "eager": {"ms_median": 2 * ms}}}
            for p, ms in (("spak-fused", 1.0), ("sdpa-flash", 2.0))]
    metric, series = run_series(rows)
    assert metric == "TFLOPS" and series["eager"]["c1"]["spak-fused"] == pytest.approx(500)
    out = plot_run(rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000 and out.endswith("p.png")
    assert plot_run([], tmp_path / "q.png").startswith("nothing timed")


def test_spak_run_rejects_an_unknown_mode_or_peer(capsys):
    from spak.cli import main
    assert main(["run", "--timing", "kernel,slow", "--shapes", "1x2x64x64"]) == 2
    assert "unknown mode(s) ['slow']" in capsys.readouterr().err
    assert main(["run", "--peers", "sdpa,nope", "--shapes", "1x2x64x64"]) == 2
    assert "unknown peer(s) ['nope']" in capsys.readouterr().err


_ = (HostEvent, stub_cuda_timing, types)


def test_spak_run_with_two_modes_and_a_plot_on_the_simulator(sim_launch, monkeypatch,
                                                             tmp_path, capsys):
    """The command end to end: both modes timed, the peers' lines, one plot."""
    pytest.importorskip("matplotlib")
    from spak.cli import main
    from tests.helpers_gpu_loop import patch_run_env
    patch_run_env(monkeypatch, torch)
    monkeypatch.setenv("SPAK_PEERS", str(tmp_path / "none"))      # the sample is missing
    from spak.device import gpurun
    monkeypatch.setattr(gpurun, "matmul_ceiling", lambda *a, **k: {"tflops": 900.0,
                                                                   "ms_median": 1.0})
    monkeypatch.setattr(FWD, "eager_call", lambda kernel, p, x: None)
    code = main(["run", "--shapes", "1x1x64x64/fp16/noncausal", "--tiles", "64x64",
                 "--no-sim", "--timing", "kernel,eager", "--peers", "sdpa,nvidia-sample",
                 "--repeats", "1", "--out", "-", "--plot", str(tmp_path / "run.png")])
    err = capsys.readouterr().out
    assert code == 0, err
    assert "spak-fused" in err and "kernel " in err and "eager " in err
    assert "nvidia-sample" in err and "skipped" in err
    assert (tmp_path / "run.png").is_file()


@pytest.mark.skipif(not (peers.peers_dir() / "samples" / "AttentionFMHA.py").is_file(),
                    reason="no .peers/samples (python tools/peers_fetch.py): not vendored")
@pytest.mark.parametrize("shape", ["1x2x64x64/fp16/noncausal", "1x4:2x128x128/fp16/causal"])
def test_nvidia_sample_peer_computes_attention_in_interpreter_mode(shape):
    """Our launcher of NVIDIA's sample kernel (grid, argument order, GQA, causal) on the
    simulator: its output matches float64 like ours does."""
    from spak.sim import interpret
    spec = FWD.parse(shape)
    sets = FWD.gpu_input_sets(spec, 0, 1, "cpu")
    interpret.enable()
    try:
        peer = peers._sample(FWD, spec, sets)["nvidia-sample"]
        out = peer.run(sets[0])
    finally:
        interpret.disable()
    ref = FWD.gpu_reference(spec, sets[0])["out"]
    err = float(((out.double() - ref.double()).norm() / ref.double().norm()))
    assert torch.isfinite(out).all() and err < 1e-3


def test_tilegym_decode_peer_in_interpreter_mode():
    """TileGym's fmha_decode through the plug-in (layout [B, H, S, D] copies made per set,
    output back in ours) on the simulator, where TileGym is importable (.peers/, PYTHONPATH)."""
    from spak.sim import interpret
    dec = get("fmha_decode")
    p = dec.parse("1x4:1x64x64")
    sets = dec.gpu_input_sets(p, 0, 1, "cpu")
    interpret.enable(tensor_is_cuda=True)
    try:
        try:
            call = peers._tilegym(dec, p, sets)["tilegym"]
        except peers.PeerMissing as exc:
            pytest.skip(str(exc))
        out = call.run(sets[0])
    finally:
        interpret.disable()
    ref = dec.gpu_reference(p, sets[0])["out"]
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert float((out.double() - ref.double()).norm() / ref.double().norm()) < 1e-3


def test_decode_rows_carry_gb_per_s_and_the_copys_fraction(sim_launch, monkeypatch):
    """The decode family through the harness on the simulator: our kernel checked and timed
    in both modes beside the same-size copy; GB/s and of_copy on our row, the copy's row
    timed and not compared; SDPA and TileGym notes on a paged cache."""
    monkeypatch.setenv("SPAK_PEERS", "/nonexistent")
    dec = get("fmha_decode")
    spec = dec.parse("1x4:1x64x64/page16")
    rows = case.run_case(spec, dec.kernels[:1],
                         run_args(no_time=False, no_sim=True, peers=None, repeats=1,
                                  timing=["kernel", "eager"]),
                         sim_env(), 500.0, lambda r: None, dec)
    by = {r["provider"]: r for r in rows}
    ours = by[f"spak-{dec.kernels[0]}"]
    assert ours["passed"] and ours["gb_per_s"] > 0 and set(ours["modes"]) == {"kernel", "eager"}
    assert ours["of_copy"] == pytest.approx(by["copy"]["ms_median"] / ours["ms_median"])
    assert by["copy"]["note"].startswith("not compared") and by["copy"]["ms_median"] > 0
    assert "paged" in by["sdpa"]["note"] and by["tilegym"]["skipped"]


# ------------------------------------------------------- issue 35: what bwd_bench measured

def test_rows_say_whether_a_second_call_gives_the_same_bits(sim_launch, monkeypatch):
    """`deterministic`: a second call of our kernel into fresh NaN outputs, bits compared;
    a call one ulp off (as a racing atomic add would be) reads False, and the summary
    counts it."""
    from spak.device import table
    from spak.device.calls import GpuCall
    spec = FWD.parse("1x1x64x64/fp16/noncausal")
    args = run_args(tiles=(64, 64), no_sim=True)
    (row,) = case.run_case(spec, ("fused",), args, sim_env(), None, lambda r: None, FWD)
    assert row["passed"] and row["deterministic"] is True

    class OneUlpOff(GpuCall):
        def __call__(self, stream=None):
            super().__call__(stream)
            self.outputs["out"].view(torch.int16)[0, 0, 5, 7] += 1
    real, made = FWD.gpu_call, []

    def flaky(kernel, problem, inputs, config, *, alloc=None):
        c = real(kernel, problem, inputs, config, alloc=alloc)
        made.append(c)
        return OneUlpOff(c.outputs, c.launches, c.tiles, c.hints) if len(made) == 2 else c
    monkeypatch.setattr(FWD, "gpu_call", flaky)
    (row,) = case.run_case(spec, ("fused",), args, sim_env(), None, lambda r: None, FWD)
    assert row["passed"] and row["deterministic"] is False and len(made) == 2
    assert "deterministic (a second call's bits) 0/1" in table.summary([row], FWD)
    made.clear()

    def second_fails(kernel, problem, inputs, config, *, alloc=None):
        made.append(1)
        if len(made) == 2:
            raise RuntimeError("CUDA out of memory")
        return real(kernel, problem, inputs, config, alloc=alloc)
    monkeypatch.setattr(FWD, "gpu_call", second_fails)
    (row,) = case.run_case(spec, ("fused",), args, sim_env(), None, lambda r: None, FWD)
    assert row["passed"] and row["error"] is None and row["deterministic"] is None
    a = torch.tensor([float("nan"), 1.0])
    assert case.same_bits(a, a.clone()) and not case.same_bits(a, a.half())


def _fake_fmha(log):
    """spak.fmha's stand-in on the CPU (it takes CUDA tensors): SDPA's math, calls logged."""
    F = torch.nn.functional.scaled_dot_product_attention

    def fmha(q, k, v, *, is_causal, attn_mask, enable_gqa, kernel):
        log.append((q.requires_grad, is_causal, enable_gqa, kernel))
        return F(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa)
    return fmha


def test_backward_eager_mode_times_spak_fmha_through_autograd(monkeypatch):
    """eager_call (the backward row) runs spak.fmha's forward once per set and then only
    autograd's backward; fwd+bwd:spak-fused's eager form runs both every call; both give
    autograd's gradients of the public entry."""
    import spak.api
    from spak.device.bwd_peers import _spak_eager_fwd_bwd
    log: list = []
    monkeypatch.setattr(spak.api, "fmha", _fake_fmha(log))
    bwd = get("fmha_bwd")
    spec = bwd.parse("1x4:2x48x16/fp16/causal")
    g = torch.Generator().manual_seed(1)
    x = {n: torch.randn(s, generator=g, dtype=torch.float64) for n, s in
         (("q", spec.q_shape), ("k", spec.kv_shape), ("v", spec.kv_shape),
          ("dout", spec.q_shape))}
    x["mask"] = None
    leaves = tuple(x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
        *leaves, is_causal=True, enable_gqa=True), leaves, x["dout"])
    call = bwd.eager_call("fused", spec, x)
    assert log == []                                    # nothing runs before it is timed
    for _ in range(3):
        got = call()
    assert log == [(True, True, True, "fused")]         # one forward, its graph kept
    assert all(torch.equal(a, b) and a.abs().sum() > 0 for a, b in zip(got, want))
    step = _spak_eager_fwd_bwd(spec)
    for _ in range(2):
        got = step(x)
    assert len(log) == 3 and all(torch.equal(a, b) for a, b in zip(got, want))
    peers_ = bwd.peer_calls(spec, x, names=["fwd+bwd:spak-fused", "fwd+bwd:sdpa-flash"])
    assert peers_["fwd+bwd:spak-fused"].eager is not None
    assert peers_["fwd+bwd:sdpa-flash"].eager is None


def test_eager_mode_uses_a_peers_public_entry(sim_launch, monkeypatch):
    """run_case's eager mode: our backward row and fwd+bwd:spak-fused through the public
    entry (spak.fmha + autograd), SDPA's rows as they are."""
    import spak.api
    log: list = []
    monkeypatch.setattr(spak.api, "fmha", _fake_fmha(log))
    bwd = get("fmha_bwd")
    spec = bwd.parse("1x2x32x16/fp16/causal")
    rows = case.run_case(spec, ("fused",), run_args(no_time=False, no_sim=True, peers=None,
                                                    timing=["eager"], repeats=1),
                         sim_env(), None, lambda r: None, bwd)
    by = {r["provider"]: r for r in rows}
    assert by["spak-fused"]["deterministic"] is True and by["spak-fused"]["passed"]
    assert by["spak-fused"]["modes"]["eager"]["call"] == "public entry"
    assert by["fwd+bwd:spak-fused"]["modes"]["eager"]["call"] == "public entry"
    assert by["fwd+bwd:sdpa-flash"]["modes"]["eager"]["call"] == "peer call"
    assert log and all(e == (True, True, False, "fused") for e in log)


def test_report_puts_off_grid_lengths_beside_their_aligned_neighbours():
    """The report's off-16 lines: each ragged key length over the nearest aligned one with
    the same heads, D and causal flag (backward and forward + backward); below 0.95 marked."""
    from spak.report.load import load_rows
    from spak.report.tables import markdown
    import json
    import tempfile
    rows = []
    for shape, tf in (("16x12x1000x64", 380.0), ("16x12x1024x64", 400.0),
                      ("2x32:8x8191x128", 300.0), ("2x32:8x8192x128", 400.0),
                      ("4x32:8x4096x128", 100.0), ("4x32x4000x96", 50.0)):
        for prov, f in (("spak-fused", 1.0), ("fwd+bwd:spak-fused", 1.1),
                        ("sdpa-cudnn", 1.2)):
            p = get("fmha_bwd").parse(shape + "/fp16/causal")
            rows.append({"schema": "spak.run/2", "family": "fmha_bwd", "gpu": "Sim GPU",
                         "date": "2026-11-28T00:00:00Z", "commit": "abc", "provider": prov,
                         "kernel": "fused" if prov == "spak-fused" else None,
                         "case": p.case_id, "shape": p.display, "B": p.B, "Hq": p.Hq,
                         "Hkv": p.Hkv, "Sq": p.Sq, "Sk": p.Sk, "D": p.D, "dtype": "fp16",
                         "causal": True, "tflops": tf * f * (0.9 if "8191" in shape and
                                                             prov != "spak-fused" else 1),
                         "passed": True, "error": None,
                         "tiles": {"DKV_TILE_M": 64} if prov == "spak-fused" else None})
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/run.jsonl"
        with open(path, "w") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in rows))
        md = markdown(load_rows([path]), sources=["run.jsonl"], plots={}, leaderboard=None)
    assert "### Lengths off the 16-grid" in md
    lines = [x for x in md.splitlines() if x.startswith("- ")]
    assert lines == ["- 16x12x1000x64 / 16x12x1024x64: 0.950, forward + backward 0.950",
                     "- 2x32:8x8191x128 / 2x32:8x8192x128: 0.750 (below 0.95), forward + "
                     "backward 0.675 (below 0.95)"]


@pytest.mark.slow
def test_the_issue_35_gpu_jobs_backward_run_and_report_on_the_simulator(sim_launch,
                                                                        monkeypatch,
                                                                        tmp_path, capsys):
    """.gpujobs/i35.sh's backward command (peers sdpa, flush timing, --repeats 2) end to end
    on the simulator, then `spak report` of its rows: the rows carry deterministic and
    err_ratio, the forward + backward table and the off-16 line are there."""
    import functools
    import json
    from spak.cli import main
    from spak.device import gpurun
    from tests.helpers_gpu_loop import patch_run_env
    patch_run_env(monkeypatch, torch)
    monkeypatch.setattr(gpurun, "matmul_ceiling", lambda *a, **k: {"tflops": 900.0,
                                                                   "ms_median": 1.0})
    monkeypatch.setattr(timing, "FLUSH_BYTES", 1024)
    monkeypatch.setattr(timing, "time_flushed",
                        functools.partial(timing.time_flushed, device="cpu", max_calls=5))
    out = tmp_path / "run.jsonl"
    code = main(["run", "--family", "fmha_bwd", "--peers", "sdpa", "--no-sim", "--timing",
                 "flush", "--repeats", "2", "--dtype", "fp16", "--shapes",
                 "1x2x40x16/causal", "1x2x48x16/causal", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    ours = [r for r in rows if r["provider"] == "spak-fused"]
    assert len(ours) == 2 and all(r["deterministic"] and r["passed"] for r in ours)
    assert all(set(r["err_ratio"]) == {"sdpa-flash", "fwd+bwd:sdpa-flash"} for r in ours)
    assert all(r["timing_mode"] == "flush" and r["tflops"] > 0 for r in ours)
    assert "deterministic (a second call's bits) 2/2" in printed
    assert main(["report", str(out), "--family", "fmha_bwd", "--no-plots", "--out-dir",
                 str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "### Forward + backward" in md and "### Lengths off the 16-grid" in md
    assert "- 1x2x40x16 / 1x2x48x16: " in md


def test_precompile_units_follow_the_runs_configs():
    """tools/precompile.py's units: one per (problem, config), duplicates merged, --tiles
    and --config giving the configs `spak run --tiles` and tools/bwd_split_ab.py launch."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "precompile", Path(__file__).resolve().parents[1] / "tools" / "precompile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    units = mod.units
    fwd = units("fmha_fwd", ["1x2x1000x64/noncausal", "1x2x1000x64/noncausal"],
                tiles=("default", (128, 128), (64, 64)), device="cpu")
    assert [u["config_id"] for u in fwd] == ["128x128", "64x64"]     # default is 128x128 here
    assert fwd[1]["config"] == {"TILE_M": 64, "TILE_N": 64} and fwd[0]["family"] == "fmha_fwd"
    old = {"DKV_TILE_M": 32, "DKV_TILE_N": 32, "DKV_SPLIT": 1}
    (u,) = units("fmha_bwd", ["2x4:2x1000x256/causal"], config=old, device="cpu")
    assert u["config"]["DKV_TILE_M"] == 32 and u["config"]["DKV_SPLIT"] == 1
    assert u["config"]["DQ_TILE_M"] == get("fmha_bwd").default_config(
        get("fmha_bwd").parse("2x4:2x1000x256/causal/fp16"))["DQ_TILE_M"]
    assert len(units("fmha_bwd", ["2x4:2x1000x256/causal"], dtype="all", device="cpu")) == 2
    # --kernel fused_dq: the config tools/bwd_fused_dq_ab.py launches (DQ_FUSED 1), its own unit
    (f,) = units("fmha_bwd", ["2x4:2x1000x128/causal"], device="cpu", kernel="fused_dq")
    (p,) = units("fmha_bwd", ["2x4:2x1000x128/causal"], device="cpu")
    assert f["config"]["DQ_FUSED"] == 1 and "DQ_FUSED" not in p["config"]
    assert f["unit_id"] != p["unit_id"] and f["kernel"] == "fused_dq"


@pytest.mark.parametrize("family", ["fmha_fwd", "fmha_bwd"])
def test_spak_run_lists_the_train_set_for_both_families(family, capsys):
    """`spak run --shapes train` parses for the forward and the backward alike (44 problems
    with dtype open), and the GPU job's slice is part of it."""
    from spak.attention.problems import SHAPE_SETS
    from spak.cli import main
    assert main(["run", "--family", family, "--list", "--dtype", "all", "--shapes",
                 "train"]) == 0
    cases = capsys.readouterr().out.split()
    assert len(cases) == 2 * len(SHAPE_SETS["train"]) == 44
    for shape in ("16x32:8x1000x128/causal", "16x32:8x1024x128/causal",
                  "16x12x1000x64/causal", "16x12x1024x64/causal", "2x16:8x4096x256/causal",
                  "4x32:8x4096x128/causal", "1x32:8x16384x128/causal"):
        assert f"{shape.split('/')[0]}/bf16/causal" in cases and shape in SHAPE_SETS["train"]
