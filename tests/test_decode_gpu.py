"""spak.fmha_kvcache on a CUDA GPU against float64 and the simulator (skipped without one).
The full matrix and the bandwidth runs are ci/decode_bench.py@f3e1eb2's."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

CASES = ["2x32:8x1000x128/lens=1000:517", "2x8:1x4:77x64/causal/page16/lens=77:5/splits=3",
         "3x4x50x128/page64/lens=1:50:0/splits=2", "1x32:4x600x128/page64/splits=5",
         # one kv head, Sq 1, 16-key pages: the plan's KT_AUTO takes the keys_vt form
         "2x32:1x300x128/page16/lens=300:77/splits=3"]


def _run(case, dtype):
    import torch
    import spak
    from spak.families.fmha_decode import FAMILY
    p = FAMILY.parse(case + "/" + dtype)
    inp = FAMILY.make_inputs(p, seed=2)
    dt = torch.float16 if dtype == "fp16" else torch.bfloat16

    def t(x):
        if x is None:
            return None
        y = torch.from_numpy(np.ascontiguousarray(x)).cuda()
        return y.to(dt) if x.ndim == 4 else y
    out = spak.fmha_kvcache(t(inp["q"]), t(inp["k_cache"]), t(inp["v_cache"]),
                            t(inp["cache_seqlens"]), block_table=t(inp["block_table"]),
                            is_causal=p.causal, num_splits=p.splits)
    return p, inp, out


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES)
def test_gpu_matches_float64_and_simulator(case, dtype):
    import torch
    from spak.core.metrics import fraction_bit_identical, rel_l2
    from spak.cpu.simrun_decode import simulate_decode
    from spak.families.fmha_decode import FAMILY
    p, inp, out = _run(case, dtype)
    got = out.float().cpu().numpy() if dtype == "bf16" else out.cpu().numpy()
    assert np.isfinite(got).all()
    assert rel_l2(got, FAMILY.reference(p, inp)["out"]) <= FAMILY.gate(p)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sim, _ = simulate_decode(inp, dtype=dtype, causal=p.causal, num_splits=p.splits,
                             num_sms=sms)
    assert fraction_bit_identical(got, sim, dtype) >= 0.999


def test_cuda_graph_replay_with_new_lengths():
    import torch
    import spak
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 256, 2, 64, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    lens = torch.tensor([256, 3], device="cuda", dtype=torch.int32)
    spak.fmha_kvcache(q, k, v, lens)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = spak.fmha_kvcache(q, k, v, lens)
    lens.copy_(torch.tensor([17, 200], device="cuda", dtype=torch.int32))
    g.replay()
    assert torch.equal(out, spak.fmha_kvcache(q, k, v, lens))
