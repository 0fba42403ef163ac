"""A contiguous cache past 2^31 elements (issue 33h, Yi-34B 128x56:8x16384x128): the plan
cuts the batch into ranges whose arrays stay within gpu.plan_decode.INDEX_LIMIT, one plan
each, so every launch is the kernels' 32-bit-index form (TMA loads) instead of the
int64-indexed twin. The limit is lowered here so CI-sized caches take the same path: the
chunked plan against float64, bit for bit against the one-launch plan, through the public
spak.fmha_kvcache (its launch templates take batch ranges of the call's tensors)."""
import numpy as np
import pytest

import spak.gpu.plan_decode as pd
from spak.core.metrics import gate_for, rel_l2
from spak.cpu.simrun_decode import simulate_decode
from spak.families.fmha_decode import FAMILY

CASES = ["9x14:2x70x64/fp16/lens=70:1:0:33:70:64:2:69:5",          # group 7, 9 sequences
         "6x12:4x3:40x32/causal/bf16/lens=40:3:17:40:1:22"]          # group 3, Sq 3, causal


def _per_seq(p):
    return pd._per_sequence(p.Sq, p.Hq, p.D, p.Hkv, p.D, p.Sk)


def test_batch_chunks():
    yi = 16384 * 8 * 128                         # Yi-34B: one sequence's K elements
    assert pd.batch_chunks(128, yi) == [(0, 64), (64, 128)]
    assert pd.batch_chunks(130, yi) == [(0, 68), (68, 130)]      # near equal, 4 | start
    assert pd.batch_chunks(64, yi) is None                        # within the limit
    assert pd.batch_chunks(1, 2**32) is None                      # one sequence past it
    assert pd.batch_chunks(3, 2**30) == [(0, 1), (1, 2), (2, 3)]
    assert pd.batch_chunks(9, 100, limit=350) == [(0, 3), (3, 6), (6, 9)]
    for B, per, lim in [(128, yi, None), (1000, 7, 64), (77, 10, 400)]:
        ch = pd.batch_chunks(B, per, lim)
        assert ch[0][0] == 0 and ch[-1][1] == B
        assert all(a[1] == b[0] for a, b in zip(ch, ch[1:]))
        assert all((b1 - b0) * per <= (lim or pd.INDEX_LIMIT) for b0, b1 in ch)


def test_yi34b_plans_32_bit_launches():
    """The real shape, on shape-only stand-ins: two plans of 64 sequences, no int64 twin;
    INDEX32 0 keeps the former one int64-indexed launch."""
    from spak.gpu.compile_decode import _Spec
    q, out = _Spec((128, 1, 56, 128), "float16"), _Spec((128, 1, 56, 128), "float16")
    k = _Spec((128, 16384, 8, 128), "float16")
    lens = _Spec((128,), "int32")
    alloc = lambda shape, kind: _Spec(tuple(shape), "float32")          # noqa: E731
    new = pd.plan_decode(q, k, k, lens, out, alloc=alloc)
    old = pd.plan_decode(q, k, k, lens, out, alloc=alloc, tiles={"INDEX32": 0})
    names = [L.kernel._annotated_function.pyfunc.__name__ for L in new]
    assert names == ["decode_one_kernel"] * 2
    assert [L.grid for L in new] == [(8, 1, 64)] * 2
    assert [L.args[2].shape[0] for L in new] == [64, 64]
    assert [L.kernel._annotated_function.pyfunc.__name__ for L in old] == \
        ["decode_one_kernel_i64"]


def _sim(p, inp, tiles=None, splits=None):
    out, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=splits,
                             tiles=tiles)
    return out


@pytest.mark.parametrize("case", CASES)
def test_chunked_plan_matches_float64_and_the_whole_plan(case, monkeypatch):
    p = FAMILY.parse(case)
    inp = FAMILY.make_inputs(p, seed=3)
    whole = _sim(p, inp, splits=2)
    monkeypatch.setattr(pd, "INDEX_LIMIT", 3 * _per_seq(p))   # ranges of 3 sequences
    q = np.zeros(inp["q"].shape, np.float16)            # the plan alone: fp16 stand-ins
    k = np.zeros(inp["k_cache"].shape, np.float16)
    n = len(pd.plan_decode(q, k, k, inp["cache_seqlens"], np.zeros_like(q), num_splits=2))
    assert n == 2 * -(-p.B // 3)                  # split + combine per range
    chunked = _sim(p, inp, splits=2)
    bits = np.uint16 if chunked.dtype == np.float16 else np.uint32
    assert np.array_equal(chunked.view(bits), whole.view(bits))
    auto = _sim(p, inp)                           # each range its own split count
    ref = FAMILY.reference(p, inp)["out"]
    for out in (chunked, auto):
        assert not np.isnan(out).any()
        assert rel_l2(out, ref) <= FAMILY.gate(p)
        assert rel_l2(out, ref * 1.01) > FAMILY.gate(p)      # the check can fail


def test_fmha_kvcache_launches_batch_ranges(cpu_launch, monkeypatch):
    """The public call: its cached launch templates take the call's tensors' batch ranges
    (a second call with new tensors must not reuse the first call's)."""
    torch = pytest.importorskip("torch")
    import spak
    p = FAMILY.parse(CASES[0])
    monkeypatch.setattr(pd, "INDEX_LIMIT", 4 * _per_seq(p))
    for seed in (1, 2):
        x = FAMILY.make_inputs(p, seed=seed)
        t = {k: None if v is None else torch.from_numpy(v) for k, v in x.items()}
        got = spak.fmha_kvcache(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],
                                num_splits=2)
        ref = FAMILY.reference(p, x)["out"]
        assert torch.isfinite(got).all()
        assert rel_l2(got.numpy(), ref) <= gate_for(p.dtype)
        want = _sim(p, x, splits=2)
        assert np.array_equal(got.numpy().view(np.uint16), want.view(np.uint16))


def test_index32_knob_is_checked():
    q = np.zeros((1, 1, 4, 32), np.float16)
    k = np.zeros((1, 64, 1, 32), np.float16)
    with pytest.raises(ValueError, match="INDEX32"):
        pd.plan_decode(q, k, k, np.full(1, 64, np.int32), q.copy(), tiles={"INDEX32": 2})
