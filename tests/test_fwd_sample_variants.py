"""ci/fwd_sample_variants.py (issue 17 round 6: copies of NVIDIA's sample with one of SPAK's
choices each): every variant generates from the vendored sample, and in the simulator,
launched as ci/fwd_peers_bench.sample_launch launches the sample (its grid or the
variant's sample_grid, its arguments or the variant's sample_args), gives the sample's
output bits where the arithmetic is the same (block order, grid, loop split), s_ours's bits
for round 6b's additions to s_ours, and float64's answer within fp16 tolerance where the
arithmetic differs (SPAK's softmax step)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from spak import sim

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ci"))
import fwd_sample_variants  # noqa: E402
from fwd_peers_bench import load_module  # noqa: E402

SAME_BITS = ("s_same", "s_reversed", "s_ourgrid", "s_twoloop")
# round 6b: s_ours plus guards / select mask / padding / parameters: s_ours's arithmetic on
# finite inputs whose rows all see a key (the guards then select nothing)
SAME_AS_OURS = ("s_guards", "s_selmask", "s_pad", "s_params", "s_ours2")


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    out = tmp_path_factory.mktemp("svar")
    assert fwd_sample_variants.main([str(out)]) == 0
    return out


def _run(mod, q, k, v, causal, tm, tn):
    """The sample's launch (fwd_peers_bench.sample_launch's grid and arguments) in sim."""
    B, Hq, Sq, D = q.shape
    Sk = k.shape[2]
    out = np.zeros(q.shape, q.dtype)
    grid = (math.ceil(Sq / tm), B * Hq, 1)
    if hasattr(mod, "sample_grid"):
        grid = mod.sample_grid(grid[0], B, Hq)
    args = (q, k, v, out, 1.0 / math.sqrt(D), 0, D, Hq, tm, tn, Hq // k.shape[1], causal,
            Sk % tn == 0)
    if hasattr(mod, "sample_args"):
        args = mod.sample_args(args)
    sim.launch(mod.fmha_kernel, grid, args)
    return out


def _reference(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    k, v = (np.repeat(x.astype(np.float64), group, axis=1) for x in (k, v))
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[3])
    if causal:                       # Sq == Sk here: both corners' conventions agree
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_every_variant_generates(variants):
    assert {p.stem for p in variants.glob("*.py")} == set(fwd_sample_variants.VARIANTS)
    assert hasattr(load_module(variants / "s_ourgrid.py", "s_ourgrid"), "sample_grid")
    two = (variants / "s_twoloop.py").read_text()
    assert two.count("for j in range(") == 2 and "j >= mask_start" not in two


# (B, Hq, Hkv, S, D, causal, TILE_M, TILE_N): S a multiple of both tiles (the sample reads
# out-of-range rows with an undetermined padding), GQA, TILE_M != TILE_N under causal.
CASES = [(2, 3, 3, 64, 16, True, 16, 16), (1, 4, 2, 48, 32, False, 16, 16),
         (1, 2, 2, 64, 16, True, 32, 16)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[3]}x{c[4]}"
                         f"{'c' if c[5] else ''}-{c[6]}x{c[7]}")
def test_sample_variants_match_the_sample(variants, case):
    B, Hq, Hkv, S, D, causal, tm, tn = case
    rng = np.random.default_rng(6)
    q = rng.standard_normal((B, Hq, S, D)).astype(np.float16)
    k, v = (rng.standard_normal((B, Hkv, S, D)).astype(np.float16) for _ in range(2))
    base = _run(load_module(fwd_sample_variants.SAMPLE, "sample"), q, k, v, causal, tm, tn)
    ours = _run(load_module(variants / "s_ours.py", "s_ours"), q, k, v, causal, tm, tn)
    ref = _reference(q, k, v, causal)
    assert np.isfinite(base).all()
    assert np.abs(base - ref).max() < 2e-3
    for name in fwd_sample_variants.VARIANTS:
        out = _run(load_module(variants / f"{name}.py", name), q, k, v, causal, tm, tn)
        assert np.isfinite(out).all(), name
        if name in SAME_BITS or name in SAME_AS_OURS:
            want = base if name in SAME_BITS else ours
            np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16),
                                          err_msg=name)
        if name not in SAME_BITS:
            assert np.abs(out - ref).max() < 2e-3, name
