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
