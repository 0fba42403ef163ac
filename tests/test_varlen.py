"""Packed variable-length attention (issue 18's varlen prefill): the varlen kernel on the
simulator against float64 on ragged batches (lengths 0 and 1, more queries than keys,
GQA/MQA, causal bottom-right per sequence), the planner's and spak.fmha_varlen's input
checks, and the PyTorch entry points (spak.fmha_varlen, spak.fmha_kvcache) run end to end
with cuTile's launch replaced by the simulator. All CPU."""
from __future__ import annotations

import numpy as np
import pytest

from spak.attention.kvcache_ref import decode_attention_f64, varlen_attention_f64
from spak.core.metrics import gate_for, rel_l2, round_to_bf16
from spak.cpu.simrun_decode import simulate_varlen

T16 = {"TILE_M": 16, "TILE_N": 16}      # many tiles on tiny shapes


def _packed(lq, lk, Hq, Hkv, D, dtype="fp16", seed=0, Dv=None):
    """Packed q/k/v with the offsets of runs lq (queries) and lk (keys)."""
    rng = np.random.default_rng([seed, len(lq), sum(lq), sum(lk), Hq, Hkv, D])
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)

    def draw(shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        return x.astype(np.float16) if dtype == "fp16" else round_to_bf16(x)
    return dict(q=draw((cq[-1], Hq, D)), k=draw((ck[-1], Hkv, D)),
                v=draw((ck[-1], Hkv, Dv or D)), cu_seqlens_q=cq, cu_seqlens_k=ck)


# (query runs, key runs, Hq, Hkv, D, causal): ragged, a run of length 0 (queries and/or
# keys) and of length 1, more queries than keys (causal: the first rows see nothing)
CASES = [
    ([5, 0, 1, 33], [7, 3, 0, 40], 4, 2, 64, False),
    ([5, 0, 1, 33], [7, 3, 0, 40], 4, 2, 64, True),
    ([17, 40, 1], [17, 100, 1], 8, 1, 64, True),             # MQA, prefill after a cache
    ([20, 3], [9, 3], 2, 2, 80, True),                       # Sq > Sk; D = 80
]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("lq, lk, Hq, Hkv, D, causal", CASES)
def test_varlen_simulator_matches_float64(lq, lk, Hq, Hkv, D, causal, dtype):
    x = _packed(lq, lk, Hq, Hkv, D, dtype)
    out, reports = simulate_varlen(x, dtype=dtype, causal=causal, tiles=T16)
    ref = varlen_attention_f64(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"],
                               causal=causal)
    assert np.isfinite(out).all()                      # every row written (output poisoned)
    assert rel_l2(out, ref) <= gate_for(dtype)
    assert all(r.clean for r in reports), [r.summary() for r in reports]


def test_varlen_equals_per_sequence_decode_reference_and_can_fail():
    """The varlen reference against the KV-cache one (another indexing path), and the
    comparison notices a wrong answer: causal output against the non-causal reference; a
    run with no key is exactly zero."""
    x = _packed([6, 4, 3], [6, 9, 0], 4, 2, 32, seed=3)
    out, _ = simulate_varlen(x, causal=True, tiles=T16)
    cq, ck = x["cu_seqlens_q"], x["cu_seqlens_k"]
    for b in range(2):
        q = x["q"][cq[b]:cq[b + 1]][None]
        k, v = x["k"][ck[b]:ck[b + 1]][None], x["v"][ck[b]:ck[b + 1]][None]
        want = decode_attention_f64(q, k, v, np.array([k.shape[1]], np.int32), causal=True)
        assert rel_l2(out[cq[b]:cq[b + 1]][None], want) <= 1e-3
    wrong = varlen_attention_f64(x["q"], x["k"], x["v"], cq, ck, causal=False)
    assert rel_l2(out, wrong) > 1e-2
    assert not out[cq[2]:].any()


def test_varlen_tiles_agree():
    x = _packed([40, 7], [50, 70], 4, 4, 32, seed=5)
    a, _ = simulate_varlen(x, causal=True, tiles={"TILE_M": 16, "TILE_N": 32})
    b, _ = simulate_varlen(x, causal=True, tiles={"TILE_M": 32, "TILE_N": 16})
    ref = varlen_attention_f64(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"],
                               causal=True)
    assert rel_l2(a, ref) <= 1e-3 and rel_l2(b, ref) <= 1e-3


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_varlen_is_the_padded_forward_per_sequence_bit_for_bit(causal, dtype):
    """The varlen kernel runs spak.fmha's block (fused.py) over each sequence's rows: per
    sequence its output equals the padded forward's on that sequence alone, bit for bit
    (ragged runs, more keys than queries, a run shorter than a tile, GQA)."""
    from spak.cpu.simrun import simulate_fmha
    lq, lk = [37, 16, 5], [37, 50, 70]
    x = _packed(lq, lk, 4, 2, 64, dtype, seed=11)
    tiles = {"TILE_M": 16, "TILE_N": 32}
    out, _ = simulate_varlen(x, dtype=dtype, causal=causal, tiles=tiles)
    cq, ck = x["cu_seqlens_q"], x["cu_seqlens_k"]
    for b in range(len(lq)):
        q, k, v = (x[n][c[b]:c[b + 1]].transpose(1, 0, 2)[None]
                   for n, c in (("q", cq), ("k", ck), ("v", ck)))
        want, _ = simulate_fmha("fused", q, k, v, causal=causal, tiles=tiles, dtype=dtype)
        got = out[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None]
        assert np.isfinite(got).all()
        assert np.array_equal(got, want), f"sequence {b}"


def test_whole_tiles_rule():
    """The varlen kernel's WHOLE form only where the shapes alone prove every run a whole
    number of tiles: total = B x max_seqlen (q and k), max_seqlen a multiple of the tile."""
    from spak.gpu.plan_decode import whole_tiles
    assert whole_tiles(96, 144, 3, 32, 48, 16, 16)
    assert not whole_tiles(95, 144, 3, 32, 48, 16, 16)       # a shorter query run
    assert not whole_tiles(96, 144, 3, 32, 48, 16, 32)       # 48 keys: a ragged key tile
    assert not whole_tiles(99, 144, 3, 33, 48, 16, 16)       # 33 rows: a ragged query tile
    assert not whole_tiles(0, 0, 0, 0, 0, 16, 16)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_whole_tiles_form_is_the_padded_forward_bit_for_bit(causal, monkeypatch):
    """Equal runs of whole tiles (Sq != Sk, GQA): the plan launches the WHOLE form (no
    ragged-tile paths) and each sequence's output still equals the padded forward's."""
    import spak.gpu.plan_decode as pd
    from spak.cpu.simrun import simulate_fmha
    seen, real = [], pd.plan_varlen

    def spy(*a, **kw):
        launches = real(*a, **kw)
        seen.append(launches[0].args[-1])
        return launches
    monkeypatch.setattr(pd, "plan_varlen", spy)
    lq, lk, tiles = [32, 32, 32], [48, 48, 48], {"TILE_M": 16, "TILE_N": 16}
    x = _packed(lq, lk, 4, 2, 64, seed=5)
    out, reports = simulate_varlen(x, causal=causal, tiles=tiles)
    assert seen == [True] and all(r.clean for r in reports)
    cq, ck = x["cu_seqlens_q"], x["cu_seqlens_k"]
    for b in range(len(lq)):
        q, k, v = (x[n][c[b]:c[b + 1]].transpose(1, 0, 2)[None]
                   for n, c in (("q", cq), ("k", ck), ("v", ck)))
        want, _ = simulate_fmha("fused", q, k, v, causal=causal, tiles=tiles)
        got = out[cq[b]:cq[b + 1]].transpose(1, 0, 2)[None]
        assert np.isfinite(got).all()
        assert np.array_equal(got, want), f"sequence {b}"
    seen.clear()
    simulate_varlen(x, causal=causal, tiles={"TILE_M": 16, "TILE_N": 32})
    assert seen == [False]                    # 48 keys are not whole 32-key tiles


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_heads_per_block_change_no_bit(causal):
    """tiles["HEADS"]: a block computes several query heads one after another on the same
    views; every head's rows are computed as with one head a block, to the bit (HEADS 3
    rounds down to a divisor of Hq: 1)."""
    x = _packed([37, 16, 5], [37, 50, 70], 8, 2, 64, seed=11)
    outs = [simulate_varlen(x, causal=causal, tiles={**T16, "HEADS": h})[0] for h in (1, 4, 8, 3)]
    for out in outs[1:]:
        assert np.array_equal(out.view(np.uint16), outs[0].view(np.uint16))
    assert np.isfinite(outs[0]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_rows_of_other_sequences_stay_out(causal):
    """Tiles are read at row offsets of the packed arrays, so a ragged tile holds the next
    sequence's rows: with inf in one sequence's K and V and NaN in its Q, every other
    sequence's output is bit-identical to the clean batch's. No block writes another
    sequence's rows (the ragged last query tile stores through a view that ends at its
    sequence): the simulator's checker fails a launch on an element written twice."""
    lq, lk = [37, 16, 5, 70], [37, 50, 70, 3]
    clean = _packed(lq, lk, 8, 2, 64, seed=11)
    bad = {n: a.copy() for n, a in clean.items()}
    cq, ck = clean["cu_seqlens_q"], clean["cu_seqlens_k"]
    bad["k"][ck[1]:ck[2]] = np.inf
    bad["v"][ck[1]:ck[2]] = -np.inf
    bad["q"][cq[1]:cq[2]] = np.nan
    tiles = {**T16, "TILE_N": 32}
    want, _ = simulate_varlen(clean, causal=causal, tiles=tiles)
    got, _ = simulate_varlen(bad, causal=causal, tiles=tiles)
    others = np.r_[cq[0]:cq[1], cq[2]:cq[-1]]
    assert np.isfinite(want).all()
    assert np.array_equal(got[others].view(np.uint16), want[others].view(np.uint16))


def test_varlen_no_keys_at_all_gives_zeros():
    x = _packed([3, 2], [0, 0], 2, 1, 16)
    out, reports = simulate_varlen(x, tiles=T16)
    assert reports == [] and not out.any()


# ----------------------------------------------------------------------- the planner

def _plan_args(**over):
    a = dict(q=np.zeros((10, 4, 64), np.float16), k=np.zeros((12, 2, 64), np.float16),
             v=np.zeros((12, 2, 64), np.float16), cq=np.array([0, 4, 10], np.int32),
             ck=np.array([0, 5, 12], np.int32), out=np.zeros((10, 4, 64), np.float16),
             kw={})
    a.update(over)
    return a


@pytest.mark.parametrize("over, err, words", [
    (dict(q=np.zeros((10, 4, 1, 64), np.float16)), ValueError, "q must be 3D"),
    (dict(k=np.zeros((12, 3, 64), np.float16), v=np.zeros((12, 3, 64), np.float16)),
     ValueError, "multiple of k's heads"),
    (dict(v=np.zeros((11, 2, 64), np.float16)), ValueError, "k and v must agree"),
    (dict(out=np.zeros((10, 4, 32), np.float16)), ValueError, "out must have shape"),
    (dict(cq=np.array([0, 4, 10], np.int64)), TypeError, "cu_seqlens_q dtype must be int32"),
    (dict(ck=np.array([0, 12], np.int32)), ValueError, "cu_seqlens_k must have shape"),
    (dict(cq=np.zeros((1, 3), np.int32)), ValueError, "cu_seqlens_q must be 1D"),
    (dict(k=np.zeros((12, 2, 64), np.float32), v=np.zeros((12, 2, 64), np.float32)),
     TypeError, "k dtype"),
    (dict(kw=dict(max_seqlen_q=-1)), ValueError, "max_seqlen_q"),
    (dict(kw=dict(tiles={"TILE_M": 48})), ValueError, "power of two"),
    (dict(kw=dict(tiles={"MAX_ROWS": 64})), ValueError, "unknown keys"),
    (dict(kw=dict(tiles={"HEADS": 0})), ValueError, "HEADS"),
    (dict(kw=dict(tiles={"LAT_K": 11})), ValueError, "LAT_K"),
    (dict(kw=dict(tiles={"OCCUPANCY": 1.5})), TypeError, "OCCUPANCY"),
    (dict(kw=dict(causal="yes")), TypeError, "causal must be a bool"),
])
def test_plan_varlen_rejects_bad_input(over, err, words):
    from spak.gpu.plan_decode import plan_varlen
    a = _plan_args(**over)
    kw = {"max_seqlen_q": 6, "max_seqlen_k": 7, **a["kw"]}
    with pytest.raises(err, match=words):
        plan_varlen(a["q"], a["k"], a["v"], a["cq"], a["ck"], a["out"], **kw)


# ----------------------------------------------------------------------- the API

torch = pytest.importorskip("torch")


def _t(*shape, dtype=None):
    return torch.randn(*shape, dtype=dtype or torch.float16)


def _i32(*vals):
    return torch.tensor(vals, dtype=torch.int32)


@pytest.mark.parametrize("mutate, err, words", [
    (lambda a: a.update(q=np.zeros((10, 4, 64))), TypeError, "q must be a torch.Tensor"),
    (lambda a: a.update(q=_t(10, 64)), ValueError, "q must be 3D"),
    (lambda a: a.update(q=_t(10, 4, 64, dtype=torch.float32)), TypeError, "q dtype"),
    (lambda a: a.update(v=_t(12, 2, 64, dtype=torch.bfloat16)), TypeError, "v dtype"),
    (lambda a: a.update(k=_t(12, 3, 64), v=_t(12, 3, 64)), ValueError, "multiple"),
    (lambda a: a.update(k=_t(12, 2, 32)), ValueError, "same head_dim"),
    (lambda a: a.update(cq=torch.tensor([0.0, 4.0, 10.0])), TypeError, "cu_seqlens_q dtype"),
    (lambda a: a.update(ck=_i32(0, 12)), ValueError, "same length"),
    (lambda a: a.update(cq=torch.zeros(0, dtype=torch.int32)), ValueError, "1D"),
    (lambda a: a.update(mq=-1), ValueError, "max_seqlen_q must be >= 0"),
    (lambda a: a.update(mk=2.5), TypeError, "max_seqlen_k must be an int"),
    (lambda a: a.update(kw=dict(is_causal=1)), TypeError, "is_causal"),
    (lambda a: a.update(kw=dict(scale=float("inf"))), ValueError, "scale"),
    (lambda a: a.update(kw=dict(tiles={"TILE_M": 100})), ValueError, "tiles"),
    (lambda a: None, ValueError, "must be CUDA tensors"),
])
def test_fmha_varlen_rejects_bad_input(mutate, err, words):
    import spak
    a = dict(q=_t(10, 4, 64), k=_t(12, 2, 64), v=_t(12, 2, 64), cq=_i32(0, 4, 10),
             ck=_i32(0, 5, 12), mq=6, mk=7, kw={})
    mutate(a)
    with pytest.raises(err, match=words):
        spak.fmha_varlen(a["q"], a["k"], a["v"], a["cq"], a["ck"], a["mq"], a["mk"], **a["kw"])


def test_varlen_custom_op_fake_shape():
    import spak.varlen  # noqa: F401 -- registers torch.ops.spak.fmha_varlen
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        out = torch.ops.spak.fmha_varlen(_t(10, 4, 64), _t(12, 2, 64), _t(12, 2, 32),
                                         _i32(0, 4, 10), _i32(0, 5, 12), 6, 7, True, 0.125,
                                         64, 64, 0)
    assert tuple(out.shape) == (10, 4, 32) and out.dtype == torch.float16


def test_fmha_varlen_end_to_end_on_the_simulator(cpu_launch):
    import spak
    x = _packed([9, 0, 1, 20], [12, 4, 0, 20], 4, 2, 32, seed=7)
    t = {k: torch.from_numpy(v) for k, v in x.items()}
    out = spak.fmha_varlen(t["q"], t["k"], t["v"], t["cu_seqlens_q"], t["cu_seqlens_k"],
                           20, 20, is_causal=True, tiles=T16)
    ref = varlen_attention_f64(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"],
                               causal=True)
    assert out.shape == (30, 4, 32) and torch.isfinite(out).all()
    assert rel_l2(out.numpy(), ref) <= 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_fmha_varlen_whole_tiles_end_to_end_on_the_simulator(cpu_launch, causal):
    """spak.fmha_varlen on equal runs of whole tiles (its WHOLE form), twice: float64 gate,
    and the second call (the op's cached launch templates) gives the same bits."""
    import spak
    x = _packed([32, 32, 32], [48, 48, 48], 4, 2, 32, seed=9)
    t = {k: torch.from_numpy(v) for k, v in x.items()}
    args = (t["q"], t["k"], t["v"], t["cu_seqlens_q"], t["cu_seqlens_k"], 32, 48)
    out = spak.fmha_varlen(*args, is_causal=causal, tiles=T16)
    again = spak.fmha_varlen(*args, is_causal=causal, tiles=T16)
    ref = varlen_attention_f64(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"],
                               causal=causal)
    assert torch.isfinite(out).all() and rel_l2(out.numpy(), ref) <= 1e-3
    assert torch.equal(out, again)


def test_fmha_varlen_prepared_launch_on_the_simulator(cpu_launch, monkeypatch):
    """Issue 34: a memoised call (no tiles dict) keeps its launch bound but for the tensors
    (kvcache.Prepared); calls through it give the general path's bits on fresh inputs and
    meet the float64 gate; int64 offsets are converted on it too."""
    import spak
    import spak.kvcache as kvc
    import spak.varlen as vl
    monkeypatch.setenv("SPAK_TUNED_CONFIGS", "/nonexistent/none.json")     # defaults
    monkeypatch.setattr(vl, "_READY", {})
    import spak.api as api
    monkeypatch.setattr(api, "_device_info", lambda device: ("sm_90", "NVIDIA H100 80GB HBM3"))
    seen = []
    real = vl._launch_ready            # the Prepared call's body (issue 34h)

    def spy(ready, *tensors):
        assert isinstance(ready, kvc.Prepared)
        seen.append(1)
        return real(ready, *tensors)
    monkeypatch.setattr(vl, "_launch_ready", spy)
    for seed, idx in ((7, torch.int32), (8, torch.int32), (9, torch.int64)):
        x = _packed([9, 0, 1, 20], [12, 4, 0, 20], 4, 2, 32, seed=seed)
        t = {k: torch.from_numpy(v) for k, v in x.items()}
        args = (t["q"], t["k"], t["v"], t["cu_seqlens_q"].to(idx), t["cu_seqlens_k"].to(idx),
                20, 20)
        monkeypatch.setattr(vl, "PREPARED", False)
        general = spak.fmha_varlen(*args, is_causal=True)
        monkeypatch.setattr(vl, "PREPARED", True)
        n = len(seen)
        outs = [spak.fmha_varlen(*args, is_causal=True) for _ in range(2)]
        # a new key: the second call takes the Prepared the first made; a known one: both
        assert len(seen) == n + (2 if seed == 8 else 1)
        ref = varlen_attention_f64(x["q"], x["k"], x["v"], x["cu_seqlens_q"],
                                   x["cu_seqlens_k"], causal=True)
        for out in outs:
            assert torch.isfinite(out).all() and rel_l2(out.numpy(), ref) <= 1e-3
            assert torch.equal(out, general)


def test_fmha_kvcache_end_to_end_on_the_simulator(cpu_launch):
    """The API's launch templates, workspaces and the combine's view of them (several
    splits), paged: the path a GPU call takes, run on the CPU."""
    import spak
    from spak.families.fmha_decode import FAMILY
    p = FAMILY.parse("2x8:2x3:100x64/causal/page16/lens=100:37/fp16")
    x = FAMILY.make_inputs(p, seed=4)
    t = {k: None if v is None else torch.from_numpy(v) for k, v in x.items()}
    for splits in (3, 3):                     # the second call reuses the cached plan
        out = spak.fmha_kvcache(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"],
                                block_table=t["block_table"], is_causal=True,
                                num_splits=splits)
        assert torch.isfinite(out).all()
        assert rel_l2(out.numpy(), FAMILY.reference(p, x)["out"]) <= 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_launch_config_is_spak_fmha_config_for_the_padded_batch(monkeypatch, causal):
    """spak.varlen.launch_config (what spak.fmha_varlen launches) is spak.fmha's launch
    config for the padded batch (the tuned store's H100 entry here), and given tiles pass
    through with no hints."""
    import spak.api as api
    from spak.varlen import launch_config
    monkeypatch.setattr(api, "_device_info", lambda device: ("sm_90", "NVIDIA H100 80GB HBM3"))
    B, L, Hq, Hkv, D = 8, 2048, 32, 8, 128
    q = torch.empty(B * L, Hq, D, dtype=torch.float16)
    cu = torch.arange(0, B * L + 1, L, dtype=torch.int32)
    got = launch_config(q, cu, L, L, causal)
    tiles, hints = api._launch_config(torch.empty(B, Hq, L, D, dtype=torch.float16),
                                      torch.empty(B, Hkv, L, D, dtype=torch.float16),
                                      "fused", causal, 0, 0, 0, 0, 0, 0)
    assert got == {"TILE_M": tiles["TILE_M"], "TILE_N": tiles["TILE_N"],
                   "LAT_K": tiles["LAT_K"], "LAT_V": tiles["LAT_V"],
                   "OCCUPANCY": hints["occupancy"] or 0, "NUM_CTAS": hints["num_ctas"] or 0}
    assert launch_config(q, cu, L, L, causal, 32, 64) == {
        "TILE_M": 32, "TILE_N": 64, "LAT_K": 0, "LAT_V": 0, "OCCUPANCY": 0, "NUM_CTAS": 0}
