"""The eager host path of every PyTorch entry point may not grow (issue 34), and its caches
launch what the planners plan. CPU only: CUDA faked, ct.launch a recorder
(spak.cpu.host_cost); the measure is a count of calls, not a timing.

BUDGET: calls made by the repository's code during one repeated call (Python and C
functions: torch ops, builtins, ct.launch). ALL: calls made anywhere (torch's Python
included), which catches a call taking the custom ops' dispatch again. A change that adds
host work fails here: make it cheaper, or raise the number with the reason in the commit
(tools/host_profile_cpu.py shows where a call's time goes).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spak import api  # noqa: E402
from spak.cpu import host_cost as hc  # noqa: E402

#: case -> (calls by SPAK's code, calls anywhere, launches); before issue 34:
#: fmha 39 calls, fwd+bwd 79 (the custom ops' layers not counted), kvcache 167, varlen 144
BUDGET = {
    # 28 -> 21 (issue 34g): the repeated call's memo test and launch inlined in api.fmha
    # (no _plain_eager, _memo_key, _store_version, _impl, _forward, _launch_ready frames)
    "fmha 1x2x16x64 causal": (21, 22, 1),
    "fmha 4x16x512x64 causal": (21, 22, 1),
    # 78: the backward's tuned-config lookup (issue 35: api._bwd_config, one memo read);
    # api._train_apply (9 calls of ours replace autograd.Function.apply's ~25 in torch);
    # 78 -> 71 (135 -> 124 anywhere): the prepared backward (spak.bwd_ready)
    # 71 -> 63 (124 -> 116): the training forward launched from _Train.forward (34g)
    "fmha fwd+bwd 1x2x16x64 causal": (63, 116, 4),
    # one launch: a 256-key cache is not split (gpu.plan_decode.SHORT_CACHE_TILES);
    # kvcache 31 -> 25, varlen 37 -> 27: the launch bound but for the tensors
    # (kvcache.Prepared: no plan key, binder pool or tensor dict per call)
    # 25 -> 21, 27 -> 25 (issue 34g): the repeated call tested inline (api._plain_and_fresh;
    # no _memo_key, _plain_eager or _store_version frames, no import statement per call)
    # 21 -> 22 (issue 34h): Prepared.launch's frame merged into _launch_ready (-1), the
    # caches' is_contiguous() tested on the memo paths (+2: a non-contiguous cache of a
    # memoised shape was launched without validate()'s error); varlen 25 -> 24: the frame
    # 22 -> 23, 24 -> 25: the launch loop back in one shared body (kvcache.launch_all: it
    # was written out three times; ~0.1 us a call)
    "fmha_kvcache 1x1x32:8 x256": (23, 24, 1),
    "fmha_varlen 2 seqs (16, 24) x2x64 causal": (25, 26, 1),
}

#: case -> (allocations, torch tensors passed to ct.launch) per repeated call: what the
#: fake makes free and a GPU does not (an H200: ~4.9 us an allocation, ~1.3 us a tensor
#: argument, 4.4 us a launch; results/issue34-host-h200-2026-11-28). Before issue 34's
#: follow-up: fwd+bwd 8 allocations and 28 tensor arguments, kvcache 4 and 13 (2 launches).
#: Third: torch.cuda.* queries, one per stream look-up in the fake only (a CPU tensor's
#: device index is None, so gpu.launch.current_raw_stream asks for the current device;
#: on a GPU the index is known and none is made). Before: the backward asked
#: torch.cuda.current_device() once more (api._on_device; now the raw getter).
DEVICE_BUDGET = {
    "fmha 1x2x16x64 causal": (1, 5, 1),
    "fmha 4x16x512x64 causal": (1, 5, 1),
    # out + lse, dq + dk + dv; the backward's delta and log2 LSE buffer is kept between
    # steps (spak.bwd_ready; was one allocation a step)
    "fmha fwd+bwd 1x2x16x64 causal": (5, 28, 2),
    # 9 -> 6 tensor arguments: the one-split kernel (decode_one_kernel) takes no
    # never-read workspaces (issue 34e)
    "fmha_kvcache 1x1x32:8 x256": (1, 6, 1),
    "fmha_varlen 2 seqs (16, 24) x2x64 causal": (1, 6, 1),
}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", str(tmp_path / "none.json"))   # no entries
    monkeypatch.setattr(api, "STORE_RECHECK_S", 1e9)     # no stat() inside a count
    with hc.fake_cuda() as launches:
        yield launches


@pytest.mark.parametrize("name", list(BUDGET))
def test_a_repeated_eager_call_stays_within_its_host_budget(fake, name):
    fn = hc.cases()[name]
    fn()
    fn()
    fn()            # the third: what the second attached (api._attach) is in place
    fake.clear()
    ours, anywhere = hc.count_calls(fn), hc.count_calls(fn, where="")
    mine, total, launches = BUDGET[name]
    assert len(fake) == 2 * launches
    assert ours <= mine, f"{name}: {ours} calls by SPAK's code, budget {mine}"
    assert anywhere <= total, f"{name}: {anywhere} calls in all, budget {total}"


@pytest.mark.parametrize("name", list(DEVICE_BUDGET))
def test_a_repeated_eager_call_stays_within_its_device_side_budget(fake, name):
    fn = hc.cases()[name]
    fn()
    fn()
    got = hc.device_calls(fn)
    allocs, tensor_args, queries = DEVICE_BUDGET[name]
    assert got["launch"] == BUDGET[name][2]
    assert got["alloc"] <= allocs, f"{name}: {got}"
    # every repeated call allocates by torch.empty_like (issue 34h: the training forward's
    # LSE was the last torch.empty(shape, dtype=, device=) on these paths)
    assert got["alloc_sized"] == 0, f"{name}: {got}"
    assert got["tensor_arg"] <= tensor_args, f"{name}: {got}"
    assert got["cuda_query"] <= queries, f"{name}: {got}"


#: calls made anywhere while api._Train.backward runs, i.e. on the autograd engine's device
#: thread on a GPU, where each Python step costs more than on the calling thread (H200:
#: the backward node 187 us a step on the main thread, 363 on the engine's; issue 34).
#: 40 before the prepared backward (spak.bwd_ready): _plain_eager, _bwd_impl's contiguous
#: copies and allocations, _bwd_config, _on_device, fmha_bwd_into's key and pool
#: 26 -> 23 (issue 34g): dq, dk, dv of a small problem allocated by the forward
BACKWARD_BUDGET = 23


def test_the_backward_runs_little_python_on_the_engines_thread(fake, monkeypatch):
    fn = hc.cases()["fmha fwd+bwd 1x2x16x64 causal"]
    fn()
    fn()
    got = hc.count_calls(fn, where="", inside=api._Train.backward.__code__)
    assert got <= BACKWARD_BUDGET, f"{got} calls in the backward, budget {BACKWARD_BUDGET}"
    from spak import bwd_ready
    monkeypatch.setattr(bwd_ready, "ENABLED", False)     # the general path: not blind
    fn()
    assert hc.count_calls(fn, where="", inside=api._Train.backward.__code__) > got + 10


def test_the_prepared_backward_steps_aside_for_saved_tensor_hooks(fake, monkeypatch):
    """Under saved-tensor hooks (save_on_cpu, offloading) what autograd unpacks need not
    be the contiguous tensors the prepared backward binds: the general path runs."""
    from spak import bwd_ready
    fn = hc.cases()["fmha fwd+bwd 1x2x16x64 causal"]
    fn()
    seen = []
    real = bwd_ready.BwdReady.run
    monkeypatch.setattr(bwd_ready.BwdReady, "run",
                        lambda self, *a: seen.append(1) or real(self, *a))
    fn()
    assert len(seen) == 1                             # not blind: the prepared path
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        fake.clear()
        fn()
    assert len(seen) == 1 and len(fake) == 4          # the general path's launches


@pytest.mark.parametrize("name", ["fmha 1x2x16x64 causal", "fmha_kvcache 1x1x32:8 x256",
                                  "fmha_varlen 2 seqs (16, 24) x2x64 causal",
                                  "fmha fwd+bwd 1x2x16x64 causal"])
def test_the_prepared_paths_explain_a_compile_error(fake, monkeypatch, name):
    """A launch on a prepared path can still compile (a new specialisation): its cuTile
    compile error comes with the set-up diagnosis, as on the general path; another
    error passes as it is."""
    import cuda.tile as ct

    from spak.device import env as gpu_env
    fn = hc.cases()[name]
    fn()
    fn()
    # undone here, before the fake fixture restores torch.cuda and ct.launch: patched after
    # fake_cuda, a fixture-level undo would put fake_cuda's stand-ins back for good (CI:
    # test_sim_host_gpu then found torch.cuda answering (9, 0) on a CPU torch)
    with monkeypatch.context() as m:
        m.setattr(gpu_env, "explain", lambda exc, arch: ValueError(f"explained {arch}"))
        m.setattr(api, "device_arch", lambda device: "sm_90")
        real = ct.launch
        for error, raised in ((RuntimeError("failed to compile Tile IR program"), ValueError),
                              (ZeroDivisionError(), ZeroDivisionError)):
            def fail(stream, grid, kernel, args, error=error):
                # the backward's launches only, in the training case (its forward is api's)
                if "bwd" in name and "bwd" not in kernel._annotated_function.pyfunc.__name__:
                    return real(stream, grid, kernel, args)
                raise error
            m.setattr(ct, "launch", fail)
            with pytest.raises(raised) as got:
                fn()
            assert raised is not ValueError or "explained sm_90" in str(got.value)


def test_the_device_count_sees_one_more_allocation(fake, monkeypatch):
    """device_calls is not blind: one more torch.empty on the path is one more alloc."""
    fn = hc.cases()["fmha_kvcache 1x1x32:8 x256"]
    fn()
    base = hc.device_calls(fn)
    from spak import kvcache as kvc
    real = kvc._empty_like
    monkeypatch.setattr(kvc, "_empty_like", lambda t: (torch.empty(4), real(t))[1])
    got = hc.device_calls(fn)
    assert got["alloc"] == base["alloc"] + 1 and got["launch"] == base["launch"]
    assert got["alloc_sized"] == base["alloc_sized"] + 1       # torch.empty parses a size
    assert base["gpu_us"] > 0 and got["gpu_us"] > base["gpu_us"]


@pytest.mark.parametrize("case,launches", [
    ("1x32:8x256x64/noncausal/fp16", 1),                 # short cache: one split
    ("2x8:2x64x64/causal/page16/lens=64:37/fp16", 1),     # paged: the block table bound
    ("2x8:2x600x64/noncausal/lens=600:77/fp16", 2)])     # split + combine, one workspace
def test_kvcache_gives_the_simulators_bits(cpu_launch, monkeypatch, case, launches):
    """spak.fmha_kvcache (first call and memoised calls, its workspaces views of one
    buffer, the one-split plan's dummies kept and its launch Prepared) gives the bits of gpu.plan_decode's plan
    run by the simulator on numpy arrays (`spak sim`'s path), and meets the float64 gate."""
    import numpy as np

    import cuda.tile as ct
    import spak
    from spak import sim
    from spak.core.metrics import gate_for, rel_l2
    from spak.families.fmha_decode import FAMILY
    from spak.gpu.plan_decode import plan_decode
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", "/nonexistent/none.json")     # defaults
    p = FAMILY.parse(case)
    x = FAMILY.make_inputs(p, seed=11)
    t = {k: None if v is None else torch.from_numpy(v) for k, v in x.items()}
    seen = []
    real = ct.launch
    monkeypatch.setattr(ct, "launch", lambda s, g, k, a: seen.append(k) or real(s, g, k, a))
    from spak import kvcache as kvc
    monkeypatch.setattr(kvc, "_READY", {})
    outs = [spak.fmha_kvcache(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],
                              block_table=t.get("block_table"), is_causal=p.causal)
            for _ in range(3)]
    assert len(seen) == 3 * launches
    assert len(kvc._READY) == (launches == 1)        # one split: the Prepared launch
    out_np = np.zeros(outs[0].shape, dtype=np.float16)
    for L in plan_decode(x["q"], x["k_cache"], x["v_cache"], x["cache_seqlens"], out_np,
                         block_table=x.get("block_table"), causal=p.causal, num_sms=132):
        sim.launch(L.kernel, L.grid, [sim.SimArray(a) if isinstance(a, np.ndarray) else a
                                      for a in L.args])
    ref = FAMILY.reference(p, x)["out"]
    for out in outs:
        assert torch.isfinite(out).all()
        assert np.array_equal(out.numpy(), out_np)
        assert rel_l2(out.numpy(), ref) <= gate_for(p.dtype)


def test_host_cost_bench_writes_its_markdown():
    """tools/host_cost_bench.py's report (a missing markdown() ended the H200 run)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "tools" / "host_cost_bench.py"
    spec = importlib.util.spec_from_file_location("host_cost_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    md = mod.markdown({"gpu": "G", "date": "D", "n": 5}, {"fmha x | spak": 1.5,
                                                          "fmha x | SDPA cudnn": 2.5}, {})
    assert "| fmha x | spak | 1.5 |" in md and "| fmha x | SDPA cudnn | 2.5 |" in md



def test_host_cost_bench_train_diag_rows_run(fake):
    """--train-diag's rows (issue 34d) run on CPU tensors: every row times (none failed:
    a failing row is a string), and the pinned rows give this thread its CPU mask back."""
    import importlib.util
    import os
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "tools" / "host_cost_bench.py"
    spec = importlib.util.spec_from_file_location("host_cost_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mask = os.sched_getaffinity(0)
    rows = mod.train_diag_rows(torch, torch.device("cpu"))
    assert len(rows) == 7 and sum(isinstance(f, tuple) for f in rows.values()) == 2
    res = mod.run_eager(torch, rows, 2, sync=lambda: None)
    assert all(isinstance(v, float) and v > 0 for v in res.values()), res
    assert os.sched_getaffinity(0) == mask


def test_host_cost_bench_ab_rows_run_and_restore_the_switches(fake):
    """--ab's rows (issue 34e) run on CPU tensors: every SPAK row times (SDPA's pinned
    backends, the sample and CAI objects need a GPU), the old path's switches and
    autograd's multithreading and switch interval are restored, and the old-path rows
    run the old path (no Prepared made while the switch is off)."""
    import importlib.util
    import sys
    from pathlib import Path

    from spak import bwd_ready, kvcache, varlen
    path = Path(__file__).resolve().parents[1] / "tools" / "host_cost_bench.py"
    spec = importlib.util.spec_from_file_location("host_cost_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    interval = sys.getswitchinterval()
    rows = mod.ab_rows(torch, torch.device("cpu"))
    old = {k: v for k, v in rows.items() if "old path" in k}
    assert len(old) == 4
    kvcache._READY.clear()
    varlen._READY.clear()
    mod.run_eager(torch, {k: v for k, v in old.items() if "varlen" in k}, 2,
                  sync=lambda: None)
    assert not varlen._READY
    res = mod.run_eager(torch, rows, 2, sync=lambda: None)
    spak_rows = [k for k in res if "| spak" in k or "floor: Prepared.launch alone" in k]
    assert len(spak_rows) >= 12
    assert all(isinstance(res[k], float) and res[k] > 0 for k in spak_rows), res
    assert kvcache.PREPARED and varlen.PREPARED and bwd_ready.ENABLED
    assert sys.getswitchinterval() == interval
    assert torch.autograd.is_multithreading_enabled()


def test_the_count_sees_one_more_op(fake, monkeypatch):
    """The count is not blind: one extra torch op on the path is one more call."""
    fn = hc.cases()["fmha 1x2x16x64 causal"]
    fn()
    fn()
    base = hc.count_calls(fn)
    real = api._empty_like
    monkeypatch.setattr(api, "_empty_like", lambda *a, **kw: (torch.is_grad_enabled(),
                                                               real(*a, **kw))[1])
    # lambdas and comprehensions are not counted themselves, what they call is: one more
    assert hc.count_calls(fn) == base + 1


def _same(launch, want, named):
    """A recorded launch equals a planned one: kernel, grid, constants; tensors the same
    objects for the call's own (named, by id) and the same shape/dtype for workspaces."""
    (grid, kernel, args), L = launch, want
    assert kernel is L.kernel and tuple(grid) == tuple(L.grid) and len(args) == len(L.args)
    for a, b in zip(args, L.args):
        if isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            if id(b) in named:
                assert a is named[id(b)]
        else:
            assert type(a) is type(b) and a == b


def test_fmha_repeated_calls_launch_what_the_planner_plans(fake):
    from spak.gpu import launch as gl
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 40, 32, generator=g).half() for _ in range(3))
    import spak
    spak.fmha(q, k, v, is_causal=True, scale=0.3)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    fake.clear()
    out = spak.fmha(q2, k2, v2, is_causal=True, scale=0.3)      # the _READY path
    assert len(fake) == 1
    c = api.launch_settings("fused", q.dtype, 32, True, 40, q.device, 2 * 4 * 40)
    tiles = {"TILE_M": c["TILE_M"], "TILE_N": c["TILE_N"], "LAT_K": c["LAT_K"],
             "LAT_V": c["LAT_V"]}
    (L,) = gl.plan_torch("fused", q2, k2, v2, out, causal=True, scale=0.3, tiles=tiles)
    named = {id(q2): q2, id(k2): k2, id(v2): v2, id(out): out}
    _same(fake[0], L, named)


def test_kvcache_repeated_calls_launch_what_the_planner_plans(fake):
    import spak
    from spak import kvcache as kvc
    from spak.gpu.plan_decode import default_decode_tiles, plan_decode
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 1, 8, 64, generator=g).half()
    kc, vc = (torch.randn(2, 300, 2, 64, generator=g).half() for _ in range(2))
    lens = torch.tensor([300, 77], dtype=torch.int32)
    spak.fmha_kvcache(q, kc, vc, lens)
    fake.clear()
    out = spak.fmha_kvcache(q, kc, vc, lens)                      # the memo path
    got = list(fake)
    tiles = {**default_decode_tiles(64), **kvc.decode_tiles("", q.dtype, 64, 4, 1, False)}
    tiles.setdefault("KT_FORM", -1)
    want = plan_decode(q, kc, vc, lens, out, scale=64 ** -0.5, num_sms=132, tiles=tiles,
                       alloc=lambda shape, kind: torch.empty(shape, dtype=torch.float32))
    assert len(got) == len(want) == 2
    named = {id(q): q, id(kc): kc, id(vc): vc, id(lens): lens, id(out): out}
    for a, b in zip(got, want):
        _same(a, b, named)
    split_ws = got[0][2][[i for i, x in enumerate(want[0].args)
                          if isinstance(x, torch.Tensor) and id(x) not in named][0]]
    combine_ws = [x for x in got[1][2] if isinstance(x, torch.Tensor)
                  and not any(x is t for t in (q, kc, vc, lens, out))]
    # the combine reads the split kernel's workspaces of this call, not another's
    assert any(x.data_ptr() == split_ws.data_ptr() for x in combine_ws)


def _decode_inputs():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 1, 8, 64, generator=g).half()
    kc, vc = (torch.randn(2, 64, 2, 64, generator=g).half() for _ in range(2))
    return q, kc, vc, torch.tensor([64, 9], dtype=torch.int32)


KV_BAD = {
    "causal-int": dict(is_causal=1), "scale-nan": dict(scale=float("nan")),
    "scale-bool": dict(scale=True), "splits-0": dict(num_splits=0),
    "splits-float": dict(num_splits=2.0), "lens-negative": dict(cache_seqlens=-1),
    "lens-float": dict(cache_seqlens=torch.ones(2)), "tiles-bad": dict(tiles={"TILE_N": 3}),
    "k-bf16": dict(k_cache="bf16"),
}


@pytest.mark.parametrize("case", list(KV_BAD))
def test_kvcache_memo_still_raises_what_validation_raises(fake, case):
    import spak
    from spak import kvcache as kvc
    q, kc, vc, lens = _decode_inputs()
    spak.fmha_kvcache(q, kc, vc, lens)
    spak.fmha_kvcache(q, kc, vc, 64)
    assert len(kvc._VALIDATED) == 2
    kw = {"cache_seqlens": lens, **KV_BAD[case]}
    if kw.get("k_cache") == "bf16":
        kw["k_cache"] = kc.bfloat16()
    args = dict(q=q, k_cache=kc, v_cache=vc)
    args.update({k: kw.pop(k) for k in ("k_cache",) if k in kw})
    with pytest.raises((TypeError, ValueError)) as want:
        kvc.validate(args["q"], args["k_cache"], vc, kw["cache_seqlens"], require_cuda=False,
                     **{k: v for k, v in kw.items() if k != "cache_seqlens"})
    with pytest.raises(want.type, match=None) as got:
        spak.fmha_kvcache(args["q"], args["k_cache"], vc, **kw)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("which", ["k_cache", "v_cache"])
@pytest.mark.parametrize("lens_int", [False, True])
def test_kvcache_memo_still_rejects_a_non_contiguous_cache(fake, which, lens_int):
    """The memo keys shapes, not strides: a cache of a memoised shape that is not
    contiguous still gets validate()'s error (issue 34h; it was launched before), on the
    inline path (tensor cache_seqlens) and the memo's (an int)."""
    import spak
    from spak import kvcache as kvc
    q, kc, vc, lens = _decode_inputs()
    lens = 64 if lens_int else lens
    for _ in range(3):
        out = spak.fmha_kvcache(q, kc, vc, lens)
    assert kvc._READY and out.shape == (2, 1, 8, 64)
    bad = {"k_cache": kc, "v_cache": vc}
    # the same shape [2, 64, 2, 64], strides of a [2, 2, 64, 64] cache seen transposed
    bad[which] = bad[which].transpose(1, 2).contiguous().transpose(1, 2)
    assert bad[which].shape == kc.shape and not bad[which].is_contiguous()
    with pytest.raises(ValueError, match=f"{which} must be contiguous"):
        spak.fmha_kvcache(q, bad["k_cache"], bad["v_cache"], lens)
    fake.clear()
    spak.fmha_kvcache(q, kc, vc, lens)           # the contiguous call still launches
    assert len(fake) == 1


VL_BAD = {"causal-int": dict(is_causal=1), "scale-inf": dict(scale=float("inf")),
          "max-negative": dict(max_seqlen_q=-1), "max-float": dict(max_seqlen_k=24.0),
          "cu-int64-shape": dict(cu_seqlens_k=torch.tensor([0, 40], dtype=torch.int64)),
          "tiles-bad": dict(tiles={"TILE_M": 7})}


@pytest.mark.parametrize("case", list(VL_BAD))
def test_varlen_memo_still_raises_what_validation_raises(fake, case):
    import spak
    from spak import varlen as vl
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(40, 2, 64, generator=g).half() for _ in range(3))
    cu = torch.tensor([0, 16, 40], dtype=torch.int32)
    base = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=24, max_seqlen_k=24)
    spak.fmha_varlen(q, k, v, **base, is_causal=True)
    spak.fmha_varlen(q, k, v, **base, is_causal=True)
    assert len(vl._VALIDATED) == 1
    kw = {**base, "is_causal": True, **VL_BAD[case]}
    with pytest.raises((TypeError, ValueError)) as want:
        vl.validate_varlen(q, k, v, require_cuda=False, **kw)
    with pytest.raises(want.type) as got:
        spak.fmha_varlen(q, k, v, **kw)
    assert str(got.value) == str(want.value)


def test_a_double_backward_through_the_eager_training_path_raises(fake):
    """With create_graph=True api._Train's backward takes the op: a gradient penalty
    through spak.fmha raises the op's error (as before issue 34) instead of silently
    dropping spak.fmha's second derivative."""
    import spak
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=g).half().requires_grad_()
               for _ in range(3))
    out = spak.fmha(q, k, v, is_causal=True)
    (dq,) = torch.autograd.grad(out.float().sum(), (q,), create_graph=True)
    penalty = dq.float().pow(2).sum() + q.float().sum()     # q's own term: differentiable
    with pytest.raises(RuntimeError, match="no autograd formula"):
        penalty.backward()


def _allocs_in_backward(fn, monkeypatch):
    """(gradient allocations made while api._Train.backward runs, made elsewhere) in one
    call of fn: bwd_ready's empty_like recorded with where it was called from."""
    import sys

    from spak import bwd_ready
    seen = []
    real = bwd_ready._empty_like

    def empty_like(t):
        f, inside = sys._getframe(1), False
        while f is not None:
            inside = inside or f.f_code is api._Train.backward.__code__
            f = f.f_back
        seen.append(inside)
        return real(t)
    monkeypatch.setattr(bwd_ready, "_empty_like", empty_like)
    fn()
    monkeypatch.setattr(bwd_ready, "_empty_like", real)
    return sum(seen), len(seen) - sum(seen)


def test_the_forward_allocates_a_small_problems_gradients(fake, monkeypatch):
    """Issue 34g: dq, dk, dv of a small problem are allocated by the forward (on the
    calling thread), none by the backward (autograd's device thread on a GPU); over
    bwd_ready.PREALLOC_BYTES, or with it 0, by the backward as before."""
    from spak import bwd_ready
    fn = hc.cases()["fmha fwd+bwd 1x2x16x64 causal"]
    fn()
    fn()
    assert _allocs_in_backward(fn, monkeypatch) == (0, 3)
    monkeypatch.setattr(bwd_ready, "PREALLOC_BYTES", 0)
    assert _allocs_in_backward(fn, monkeypatch) == (3, 0)


def test_preallocated_gradients_are_given_once(fake, monkeypatch):
    """retain_graph: a second backward through the same forward gets fresh gradients,
    never the buffers the first one handed to autograd (now someone's .grad); and the
    first backward's gradient is the buffer the forward allocated (accumulated as is)."""
    import spak
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=g).half().requires_grad_()
               for _ in range(3))
    dout = torch.randn(1, 2, 16, 64, generator=g).half()
    for _ in range(2):                   # the first backward makes the launcher
        spak.fmha(q, k, v, is_causal=True).backward(dout)
    q.grad = k.grad = v.grad = None
    out = spak.fmha(q, k, v, is_causal=True)
    assert len(out.grad_fn.grads) == 3
    pre = [t.data_ptr() for t in out.grad_fn.grads]      # no reference kept: stolen, not
    import cuda.tile as ct                               # copied, by AccumulateGrad (the
    with monkeypatch.context() as m:                     # fake's recorder would keep one)
        m.setattr(ct, "launch", lambda *a: None)
        out.backward(dout, retain_graph=True)
    first = (q.grad, k.grad, v.grad)
    assert [a.data_ptr() for a in first] == pre
    assert out.grad_fn.grads is None     # the context gave them away
    q.grad = k.grad = v.grad = None
    out.backward(dout)
    assert all(t.grad.data_ptr() != a.data_ptr() for t, a in zip((q, k, v), first))


def test_the_inline_path_and_the_general_one_launch_the_same(fake, monkeypatch):
    """api.INLINE off (SPAK_FMHA_INLINE=0, the GPU A/B's old path) runs the general path:
    more calls, the same launch (kernel, grid, arguments)."""
    fn = hc.cases()["fmha 1x2x16x64 causal"]
    for _ in range(3):
        fn()
    fake.clear()
    inline = hc.count_calls(fn)
    monkeypatch.setattr(api, "INLINE", False)
    general = hc.count_calls(fn)
    assert general > inline + 4
    (g1, k1, a1), (g2, k2, a2) = fake
    assert g1 == g2 and k1 is k2 and len(a1) == len(a2)
    assert all(x is y for x, y in zip(a1[:3], a2[:3]))           # q, k, v
    assert a1[4] is a2[4] and a1[5:] == a2[5:]                   # dummy mask, constants


def test_host_cost_i34g_rows_run_and_restore_the_switches(fake):
    """tools/host_cost_i34g.py (the GPU job of issue 34g) on CPU tensors: every SPAK row
    times (SDPA's pinned backends and the sample need a GPU), the A/B switches come back,
    and the launch counts are the budgets'."""
    import importlib.util
    from pathlib import Path

    from spak import bwd_ready
    path = Path(__file__).resolve().parents[1] / "tools" / "host_cost_i34g.py"
    spec = importlib.util.spec_from_file_location("host_cost_i34g", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pre = bwd_ready.PREALLOC_BYTES
    rows = {k: v for k, v in mod.rows(torch, torch.device("cpu")).items()
            if "SDPA" not in k}                  # torch's CPU attention: seconds at 4x16x512
    res = mod.hb.run_eager(torch, rows, 2, sync=lambda: None)
    spak_rows = [k for k in res if "| spak" in k]
    assert len(spak_rows) == 13
    assert all(isinstance(res[k], float) and res[k] > 0 for k in spak_rows), res
    assert api.INLINE and bwd_ready.PREALLOC_BYTES == pre
    assert torch.autograd.is_multithreading_enabled()
    counts = mod.launch_counts(torch, mod._cases(torch, torch.device("cpu")))
    assert [c["launch"] for c in counts.values()] == [1, 4, 1, 1]


def test_host_cost_i34h_times_in_interleaved_blocks(fake):
    """tools/host_cost_i34h.py (the GPU job of issue 34h) on CPU tensors: the decode and
    training groups' SPAK rows and floors time in every block, multithreading comes back
    on, the paired ratio is the median of per-block ratios, and a non-contiguous cache of
    a memoised shape is refused."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "tools" / "host_cost_i34h.py"
    spec = importlib.util.spec_from_file_location("host_cost_i34h", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cpu = torch.device("cpu")
    for make in (mod.kvcache_group, mod.train_group):
        group = {k: v for k, v in make(torch, cpu).items() if "SDPA" not in k}
        got = mod.interleaved(torch, group, 3, 2, lambda: None)
        assert list(got) == list(group)
        assert all(isinstance(v, list) and len(v) == 3 and min(v) > 0 for v in got.values()), got
    assert torch.autograd.is_multithreading_enabled()
    s = mod.summarize({"p | spak": [2.0, 4.0, 9.0], "p | SDPA cudnn": [4.0, 2.0, 3.0],
                       "p | floor: x": [1.0, 1.0, 1.0]})
    assert s["p | spak"]["median"] == 4.0 and s["p | spak"]["best"] == 2.0
    assert s["p | spak"]["vs SDPA cudnn"] == 2.0          # median of 0.5, 2, 3
    assert "vs floor: x" not in s["p | spak"]
    (res,) = mod.noncontiguous_check(torch, cpu).values()
    assert res["pass"] is True


@pytest.mark.parametrize("Dv", [64, 32])
def test_the_inline_paths_output_is_contiguous_and_shaped(fake, Dv):
    """The inline path's out (torch.empty_like of the contiguous q when Dv == D, else
    torch.empty): [B, Hq, Sq, Dv], q's dtype, contiguous, also for a non-contiguous q of
    the same shape (its copy is what the launch reads)."""
    import spak
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 2, 16, 64, generator=g).half()
    k = torch.randn(1, 2, 16, 64, generator=g).half()
    v = torch.randn(1, 2, 16, Dv, generator=g).half()
    qt = torch.randn(1, 2, 64, 16, generator=g).half().transpose(2, 3)    # not contiguous
    for x in (q, q, q, qt):
        fake.clear()
        out = spak.fmha(x, k, v, is_causal=True)
        assert out.shape == (1, 2, 16, Dv) and out.dtype == q.dtype and out.is_contiguous()
        (_, _, args), = fake
        assert args[3] is out and args[0].is_contiguous() and torch.equal(args[0], x)


@pytest.mark.parametrize("name,op", [("fmha 1x2x16x64 causal", "spak.fmha_fwd"),
                                     ("fmha_kvcache 1x1x32:8 x256", "spak.fmha_kvcache"),
                                     ("fmha_varlen 2 seqs (16, 24) x2x64 causal",
                                      "spak.fmha_varlen")])
def test_a_mode_still_sees_the_op_after_the_inline_path_is_ready(fake, name, op):
    """The inline paths (issue 34g) are for plain eager calls only: once a signature's
    launch is ready, a call under a dispatch mode still goes through the custom op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    fn = hc.cases()[name]
    for _ in range(3):
        fn()
    fake.clear()
    fn()
    assert len(fake) == 1                     # the inline path launched
    with Seen() as mode:
        fn()
    assert any(o.startswith(op) for o in mode.ops), mode.ops


def test_the_training_forwards_lse_is_its_own_contiguous_float32(fake):
    """Issue 34h: the repeated training forward allocates the LSE as torch.empty_like of
    a stride-0 template (the kept dummy mask seen as [B, Hq, Sq]): each step gets its own
    contiguous float32 [B, Hq, Sq] buffer, never the dummy's memory, and the backward
    launches read that buffer."""
    import spak
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, 24, 64, generator=g).half().requires_grad_()
               for _ in range(3))
    dout = torch.randn(2, 3, 24, 64, generator=g).half()
    for _ in range(2):
        spak.fmha(q, k, v, is_causal=True).backward(dout)
    fake.clear()
    lses = []
    for _ in range(2):
        out = spak.fmha(q, k, v, is_causal=True)
        (grid, kernel, args), = fake[-1:]
        lse, dummy = args[5], args[4]
        assert lse.dtype == torch.float32 and lse.shape == (2, 3, 24)
        assert lse.is_contiguous() and lse.stride() == (72, 24, 1)
        assert lse.untyped_storage().data_ptr() != dummy.untyped_storage().data_ptr()
        lses.append(lse)
        out.backward(dout)
        assert any(a is lse for _, _, bargs in fake[-3:] for a in bargs)
    assert lses[0].data_ptr() != lses[1].data_ptr()       # the recorder keeps both alive
