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
    from tests.test_varlen import _packed
    b = int(rng.integers(2, 6))
    lq = rng.integers(0, 150, b)
    lk = rng.integers(0, 300, b)
    lq[rng.integers(b)] = 1
    lk[rng.integers(b)] = 0
    lk[np.argmax(lk)] = max(int(lk.max()), 1)     # some key somewhere
    hkv = int(rng.choice([1, 2]))
    hq, d = hkv * int(rng.choice([2, 4])), int(rng.choice([64, 128]))
    return _packed(lq, lk, hq, hkv, d, dtype, seed=int(rng.integers(2 ** 31)))


def _on_gpu(x, dtype, causal):
    """spak.fmha_varlen as a user calls it (its tiles looked up at run time), and the
    config it launched (spak.varlen.launch_config: the same lookup, for the simulator)."""
    import torch
    import spak
    from spak.varlen import launch_config
    tdt = torch.float16 if dtype == "fp16" else torch.bfloat16

    def t(a):
        y = torch.from_numpy(np.ascontiguousarray(a)).cuda()
        return y.to(tdt) if a.ndim == 3 else y
    q, k, v, cq, ck = (t(x[n]) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"))
    mq, mk = (int(np.diff(x[n]).max()) for n in ("cu_seqlens_q", "cu_seqlens_k"))
    out = spak.fmha_varlen(q, k, v, cq, ck, mq, mk, is_causal=causal)
    torch.cuda.synchronize()
    config = launch_config(q, cq, mq, mk, causal)
    return (out.cpu().numpy() if dtype == "fp16" else out.float().cpu().numpy()), config


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_fmha_varlen_matches_float64_and_the_simulator(dtype, causal):
    import torch
    from spak.attention.kvcache_ref import varlen_attention_f64
    from spak.core.metrics import fraction_bit_identical, gate_for, rel_l2
    from spak.cpu.simrun_decode import simulate_varlen
    seed = SEED + 7 * causal + (dtype == "bf16")
    x = _ragged(np.random.default_rng(seed), dtype)
    why = f"seed {seed}, runs q {np.diff(x['cu_seqlens_q'])} k {np.diff(x['cu_seqlens_k'])}"
    ref = varlen_attention_f64(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"],
                               causal=causal)
    got, config = _on_gpu(x, dtype, causal)
    assert got.shape == ref.shape and np.isfinite(got).all(), why
    assert rel_l2(got, ref) <= gate_for(dtype), (rel_l2(got, ref), why)
    # rows that see no key are exactly 0 (never NaN)
    assert (got[ref == 0] == 0).all(), why
    # the same launches in the simulator, at the config the GPU call launched, bit for bit
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    sim, _ = simulate_varlen(x, dtype=dtype, causal=causal, tiles=config,
                             model=arch if arch in ("sm_90", "sm_120", "sm_89") else "sm_90")
    why += f", config {config}"
    frac = fraction_bit_identical(got, sim, dtype)
    print(f"varlen {dtype} causal={causal} {why}: {100 * frac:.4f}% bit-identical to the "
          f"simulator, rel L2 vs float64 {rel_l2(got, ref):.2e}")
    assert frac >= 0.999, (frac, why)
