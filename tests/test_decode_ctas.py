"""The split kernel's CTAs a block (tiles["NUM_CTAS"], cuTile's num_ctas hint; issue 18):
validation naming the key, the hint on the split launch only, and the 128-row MQA Sq 4
block the 2-CTA cluster serves, against float64 on the simulator (the hint is a decorator
option: the simulator runs the same function)."""
from __future__ import annotations

import numpy as np
import pytest

from spak.gpu.plan_decode import default_decode_tiles, plan_decode


def _arrays(B=1, Sq=4, Hq=32, Hkv=1, Sk=96, D=64):
    q = np.zeros((B, Sq, Hq, D), np.float16)
    k = np.zeros((B, Sk, Hkv, D), np.float16)
    return q, k, k, np.full((B,), Sk, np.int32), np.zeros((B, Sq, Hq, D), np.float16)


def _ctas(kernel):
    return kernel._compiler_options.num_ctas


def test_num_ctas_goes_to_the_split_kernel_only():
    launches = plan_decode(*_arrays(), num_splits=2, tiles={"NUM_CTAS": 2, "MAX_ROWS": 128})
    assert [L.name for L in launches] == ["decode.split", "decode.combine"]
    assert _ctas(launches[0].kernel) == 2 and _ctas(launches[1].kernel) is None
    # 128 rows: one head tile of 32 heads x 4 queries, so one query tile per kv head
    assert launches[0].grid == (1, 2, 1)
    plain = plan_decode(*_arrays(), num_splits=2, tiles={"NUM_CTAS": 0})
    assert _ctas(plain[0].kernel) is None and plain[0].grid == (2, 2, 1)


def test_default_is_no_hint():
    """H100 run 1 (results/decode-h100-2026-11-24d): num_ctas 2 lost everywhere."""
    assert default_decode_tiles(128)["NUM_CTAS"] == 0 and default_decode_tiles(128)["LAT"] == 0
    assert _ctas(plan_decode(*_arrays(), num_splits=2)[0].kernel) is None


@pytest.mark.parametrize("bad", [3, 8, -1, 16])
def test_bad_num_ctas_names_the_key(bad):
    with pytest.raises(ValueError, match=r"tiles\['NUM_CTAS'\]"):
        plan_decode(*_arrays(), tiles={"NUM_CTAS": bad})


def test_api_refuses_bad_num_ctas():
    torch = pytest.importorskip("torch")
    from spak.kvcache import validate
    q = torch.zeros(1, 1, 8, 64, dtype=torch.float16)
    k = torch.zeros(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="NUM_CTAS"):
        validate(q, k, k, torch.zeros(1, dtype=torch.int32), tiles={"NUM_CTAS": 3},
                 require_cuda=False)
    validate(q, k, k, torch.zeros(1, dtype=torch.int32), tiles={"NUM_CTAS": 2},
             require_cuda=False)


@pytest.mark.parametrize("case", ["2x32:1x4:150x64/causal/page16/lens=150:1/splits=2/fp16",
                                  "1x32:1x4:200x64/causal/lens=200/bf16"])
def test_128_row_cluster_block_matches_float64(case):
    """MQA Sq 4 in one 128-row block (K/V read once), NUM_CTAS 2: float64 gate, no NaN,
    and bit-identical to the 64-row default (each row's arithmetic is the same)."""
    from spak.core.metrics import gate_for, rel_l2
    from spak.cpu.simrun_decode import simulate_decode
    from spak.families.fmha_decode import FAMILY
    p = FAMILY.parse(case)
    inp = FAMILY.make_inputs(p, seed=3)
    ref = FAMILY.reference(p, inp)["out"]
    got, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits,
                             tiles={"MAX_ROWS": 128, "NUM_CTAS": 2})
    # TN_FIT 0: the 64-row block at D 64 over pages would take 64-key tiles (fit_tile_n),
    # another key partition than the 128-row block's
    base, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits,
                              tiles={"TN_FIT": 0})
    assert np.isfinite(got).all()
    assert rel_l2(got, ref) <= gate_for(p.dtype)
    assert np.array_equal(got.view(np.uint16) if got.dtype == np.float16 else got,
                          base.view(np.uint16) if base.dtype == np.float16 else base)
