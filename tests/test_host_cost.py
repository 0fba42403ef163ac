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
    "fmha 1x2x16x64 causal": (28, 32, 1),
    "fmha 4x16x512x64 causal": (28, 32, 1),
    # 69: the backward's tuned-config lookup (issue 35: api._bwd_config, one memo read)
    "fmha fwd+bwd 1x2x16x64 causal": (69, 150, 4),
    "fmha_kvcache 1x1x32:8 x256": (37, 42, 2),
    "fmha_varlen 2 seqs (16, 24) x2x64 causal": (38, 43, 1),
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
    fake.clear()
    ours, anywhere = hc.count_calls(fn), hc.count_calls(fn, where="")
    mine, total, launches = BUDGET[name]
    assert len(fake) == 2 * launches
    assert ours <= mine, f"{name}: {ours} calls by SPAK's code, budget {mine}"
    assert anywhere <= total, f"{name}: {anywhere} calls in all, budget {total}"


def test_the_count_sees_one_more_op(fake, monkeypatch):
    """The count is not blind: one extra torch op on the path is one more call."""
    fn = hc.cases()["fmha 1x2x16x64 causal"]
    fn()
    base = hc.count_calls(fn)
    real = api._launch_ready
    monkeypatch.setattr(api, "_launch_ready",
                        lambda ready, q, k, v, lse: real(ready, q.contiguous(), k, v, lse))
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
