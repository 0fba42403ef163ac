"""spak.fmha_varlen on a CUDA GPU (skipped without one): against float64 and against the
simulator running the same launches, on fresh random ragged batches (lengths and values
drawn anew each run; the seed is in every assertion message, so a failure reproduces).

The CPU tests (tests/test_varlen.py) stub the device check and run the simulator in the
GPU's place; this is the one that runs the kernel on hardware.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

SEED = int(os.environ.get("SPAK_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))


def _ragged(rng, dtype):
    """A packed batch of 2-5 sequences: some empty (queries and/or keys), some of length 1,
    lengths not multiples of any tile; GQA 4:1 or 2:1; head dim 64 or 128."""
    from spak.core.metrics import round_to_bf16
    b = int(rng.integers(2, 6))
    lq = rng.integers(0, 150, b)
    lk = rng.integers(0, 300, b)
    lq[rng.integers(b)] = 1
    lk[rng.integers(b)] = 0
    hkv = int(rng.choice([1, 2]))
    hq, d = hkv * int(rng.choice([2, 4])), int(rng.choice([64, 128]))
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)

    def draw(shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        return x.astype(np.float16) if dtype == "fp16" else round_to_bf16(x)
    return dict(q=draw((cq[-1], hq, d)), k=draw((ck[-1], hkv, d)), v=draw((ck[-1], hkv, d)),
                cu_seqlens_q=cq, cu_seqlens_k=ck)


def _on_gpu(x, dtype, causal, tiles=None):
    import torch
    import spak
    tdt = torch.float16 if dtype == "fp16" else torch.bfloat16

    def t(a):
        y = torch.from_numpy(np.ascontiguousarray(a)).cuda()
        return y.to(tdt) if a.ndim == 3 else y
    cq, ck = x["cu_seqlens_q"], x["cu_seqlens_k"]
    out = spak.fmha_varlen(t(x["q"]), t(x["k"]), t(x["v"]), t(cq), t(ck),
                           int(np.diff(cq).max()), int(np.diff(ck).max()), is_causal=causal,
                           tiles=tiles)
    torch.cuda.synchronize()
    return out.cpu().numpy() if dtype == "fp16" else out.float().cpu().numpy()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_fmha_varlen_matches_float64_and_the_simulator(dtype, causal):
    import torch
    from spak.attention.kvcache_ref import varlen_attention_f64
    from spak.core.metrics import fraction_bit_identical, gate_for, rel_l2
    from spak.cpu.simrun_decode import simulate_varlen
    from spak.gpu.plan_decode import default_varlen_tiles
    seed = SEED + 7 * causal + (dtype == "bf16")
    x = _ragged(np.random.default_rng(seed), dtype)
    why = f"seed {seed}, runs q {np.diff(x['cu_seqlens_q'])} k {np.diff(x['cu_seqlens_k'])}"
    ref = varlen_attention_f64(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"],
                               causal=causal)
    # the user's call (tiles from the store or the defaults) against float64
    got = _on_gpu(x, dtype, causal)
    assert got.shape == ref.shape and np.isfinite(got).all(), why
    assert rel_l2(got, ref) <= gate_for(dtype), (rel_l2(got, ref), why)
    # rows that see no key are exactly 0 (never NaN)
    assert (got[ref == 0] == 0).all(), why
    # the same launches in the simulator, at the same tiles, bit for bit
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    tiles = default_varlen_tiles(x["q"].shape[2], arch, causal)
    got = _on_gpu(x, dtype, causal, tiles=tiles)
    sim, _ = simulate_varlen(x, dtype=dtype, causal=causal, tiles=tiles,
                             model=arch if arch in ("sm_90", "sm_120", "sm_89") else "sm_90")
    frac = fraction_bit_identical(got, sim, dtype)
    print(f"varlen {dtype} causal={causal} {why}: {100 * frac:.4f}% bit-identical to the "
          f"simulator, rel L2 vs float64 {rel_l2(got, ref):.2e}")
    assert frac >= 0.999, (frac, why)
