"""ci/fwd_peers_bench.py on the CPU: its pure parts (config and variant parsing, rotation,
ratios, geomeans, the correctness rule, Kendall tau, the rank summary, the tables) and the
vendored NVIDIA sample kernel (ci/peers/cutile_sample_fmha.py) run through our launcher
in the simulator's interpreter mode against float64, causal and not."""
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spak import sim
from spak.attention.reference import attention_f64

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fwd_peers_bench", ROOT / "ci" / "fwd_peers_bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_config_parsing_round_trips_and_refuses_bad_text():
    assert bench.parse_config("64x128/o2") == {"TILE_M": 64, "TILE_N": 128, "occupancy": 2,
                                               "num_ctas": None}
    assert bench.parse_config("128x128/o2/c2")["num_ctas"] == 2
    for d, cfgs in bench.SAMPLE_CONFIGS.items():
        for c in cfgs:
            assert bench.config_label(bench.parse_config(c)) == c
    for bad in ("64", "64x/o2", "64x64/q2", "64x64/o0", "axb"):
        with pytest.raises(ValueError, match="config"):
            bench.parse_config(bad)


def test_variant_parsing():
    assert bench.parse_variant("pipe=.peer/pipe.py") == ("pipe", ".peer/pipe.py")
    for bad in ("pipe", "=x.py", "pipe=", "a b=x.py", "spak=x.py", "sample:1=x.py"):
        with pytest.raises(ValueError, match="--variant"):
            bench.parse_variant(bad)


def test_rotation_starts_each_shape_at_the_next_provider():
    names = ["spak", "sample:64x64/o4", "cudnn", "flash"]
    assert bench.rotate(names, 0) == names
    assert bench.rotate(names, 1) == ["sample:64x64/o4", "cudnn", "flash", "spak"]
    assert bench.rotate(names, 5) == bench.rotate(names, 1)
    assert bench.rotate([], 3) == []
    firsts = {bench.rotate(names, i)[0] for i in range(len(names))}
    assert firsts == set(names)


def test_timing_orders_change_every_providers_neighbours():
    names = ["spak", "sample:64x64/o4", "cudnn", "flash", "v_same"]
    assert bench.timing_orders(names, 2, 1) == [bench.rotate(names, 2)]
    orders = bench.timing_orders(names, 2, 4)
    assert orders[0] == bench.rotate(names, 2)
    assert len(orders) == 4 and all(sorted(o) == sorted(names) for o in orders)
    assert orders == bench.timing_orders(names, 2, 4)        # reproducible

    def after(order, name):           # the provider timed right before `name`, if any
        i = order.index(name)
        return order[i - 1] if i else None
    # spak's predecessor differs between the rounds (round 5: always SDPA flash)
    assert len({after(o, "spak") for o in orders}) >= 3
    assert bench.timing_orders(names, 0, 0) == [names]     # at least one round


def test_ratios_and_sample_best():
    ms = {"spak": 1.0, "sample:64x64/o4": 0.9, "sample:128x64/o2": 1.2, "sample@spak": 0.5,
          "cudnn": 1.1, "flash": 2.0}
    assert bench.sample_best(ms) == "sample:64x64/o4"       # sample@spak never counts
    r = bench.ratios(ms)
    assert r["spak/sample_best"] == pytest.approx(0.9)
    assert r["spak/cudnn"] == pytest.approx(1.1)
    assert r["sample_best/cudnn"] == pytest.approx(1.1 / 0.9)
    assert r["max(spak,sample)/cudnn"] == pytest.approx(1.1 / 0.9)
    assert r["spak/flash"] == pytest.approx(2.0)
    assert bench.ratios({"spak": 1.0})["spak/cudnn"] is None


def _row(shape, dtype, spak, sample, cudnn):
    ms = {"spak": spak, "sample:64x64/o4": sample, "cudnn": cudnn}
    return {"shape": shape, "dtype": dtype, "ms": ms, "ratios": bench.ratios(ms),
            "tflops": {k: 1.0 / v for k, v in ms.items()}}


def test_summary_geomeans_only_the_standard_shapes():
    rows = [_row("a", "fp16", 1.0, 1.0, 2.0), _row("b", "fp16", 1.0, 0.5, 0.5),
            _row("seed", "fp16", 1.0, 0.01, 100.0), _row("a", "bf16", 2.0, 1.0, 1.0)]
    s = bench.summarize(rows, {"a", "b"})
    f = s["fp16"]
    assert f["n"] == 2
    assert f["spak/cudnn"]["geomean"] == pytest.approx(1.0)          # sqrt(2 * 0.5)
    assert f["spak/cudnn"]["min"] == pytest.approx(0.5) and f["spak/cudnn"]["min_at"] == "b"
    assert f["spak/sample_best"]["below_1"] == 1
    assert s["bf16"]["spak/cudnn"]["geomean"] == pytest.approx(0.5)
    md = bench.markdown(rows, s)
    assert "| shape | dtype | spak |" in md and "spak/cudnn: 1.000 (min 0.500 at b" in md


def test_correctness_rule_fails_nan_and_ten_times_cudnn():
    errs = {"spak": 4e-3, "cudnn": 1e-3, "flash": 9e-3, "sample:64x64/o4": 2e-2}
    assert bench.correctness_failures(errs, {}) == [
        "sample:64x64/o4: max abs err 0.02 > 10 x cudnn's 0.001"]
    bad = bench.correctness_failures({"spak": 1e-3, "cudnn": 1e-3}, {"spak": 3})
    assert bad == ["spak: 3 NaN/Inf"]
    assert bench.correctness_failures({"spak": float("nan"), "cudnn": 1e-3}, {})
    # no cuDNN (it refused the shape): flash's error is the yardstick
    assert bench.correctness_failures({"spak": 5e-2, "flash": 1e-3}, {})


def test_kendall_tau_and_rank_summary():
    a = {"x": 1.0, "y": 2.0, "z": 3.0, "w": 4.0}
    assert bench.kendall_tau(a, a) == pytest.approx(1.0)
    assert bench.kendall_tau(a, {k: -v for k, v in a.items()}) == pytest.approx(-1.0)
    one_swap = {"x": 1.0, "y": 2.0, "z": 4.0, "w": 3.0}          # 5 of 6 pairs agree
    assert bench.kendall_tau(a, one_swap) == pytest.approx(4 / 6)
    assert bench.kendall_tau({"x": 1.0}, {"x": 1.0}) is None
    s = bench.rank_summary({"p": 1.0, "q": 1.1, "r": 1.3}, {"p": 1.05, "q": 1.0, "r": 1.2})
    assert s["sweep_rank"] == ["p", "q", "r"] and s["bench_rank"] == ["q", "p", "r"]
    assert not s["best_agrees"] and s["lost"] == pytest.approx(0.05)
    assert s["tau"] == pytest.approx(1 / 3)
    passes = [{"sweep_ms": {"p": 1.0, "q": 1.1}, "bench_ms": {"p": 1.0, "q": 1.0}},
              {"sweep_ms": {"p": 1.1, "q": 1.1}, "bench_ms": {"p": 1.2, "q": 1.0}}]
    assert bench.pass_spread(passes, "sweep_ms") == {"median": pytest.approx(0.05),
                                                     "max": pytest.approx(0.1)}
    md = bench.rank_markdown([{**s, "case": "c", "tau_sweep_self": 1.0, "tau_bench_self": 0.5,
                               "flops": 1e9, "sweep_ms": {"p": 1.0, "q": 1.1, "r": 1.3},
                               "bench_ms": {"p": 1.05, "q": 1.0, "r": 1.2}, "passes": passes}])
    assert "| c | 0.333 | 1.000 | 0.500 | p | q | False | 5.0% | 5.0% / 10.0% | 10.0% / 20.0% |" \
        in md


def test_help_runs_without_a_gpu():
    r = subprocess.run([sys.executable, str(ROOT / "ci" / "fwd_peers_bench.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--rank-check" in r.stdout and "--variant" in r.stdout


# ------------------------------------------------------------ the vendored sample, simulated

@pytest.mark.parametrize("causal,cfg", [(False, "32x32/o4"), (True, "32x16/o2")])
def test_vendored_sample_runs_in_the_simulator(causal, cfg):
    """Our launcher of the sample kernel (occupancy re-applied through with_hints) on the
    simulator, interpreter mode, vs float64; the tile sizes make several key tiles, the
    causal case one query tile spanning two key tiles (the masked-tile branch)."""
    sample = bench.load_module(bench.SAMPLE_PATH, "cutile_sample_fmha_test")
    rng = np.random.default_rng(17)
    B, H, S, D = 1, 2, 64, 32
    q, k, v = (torch.from_numpy(rng.standard_normal((B, H, S, D)).astype(np.float16))
               for _ in range(3))
    out = torch.full((B, H, S, D), float("nan"), dtype=torch.float16)
    scale = 1.0 / math.sqrt(D)
    sim.enable()
    try:
        bench.sample_launch(sample, q, k, v, out, bench.parse_config(cfg), causal, scale)()
    finally:
        sim.disable()
    ref = attention_f64(q.numpy(), k.numpy(), v.numpy(), mask=None, causal=causal, scale=scale)
    got = out.numpy().astype(np.float64)
    assert np.isfinite(got).all()
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < 1e-3, rel
    # the causal mask matters here: the non-causal answer is far from the causal reference
    other = attention_f64(q.numpy(), k.numpy(), v.numpy(), mask=None, causal=not causal,
                          scale=scale)
    assert np.linalg.norm(got - other) / np.linalg.norm(other) > 1e-2
