"""ci/fwd_variants.py (issue 17's A/B variants of gpu/kernels/fused.py): every variant still
generates from the current fused.py (its edits are exact-match text replacements), and the
round-5 ones (the block order, the sample's launch grid, one key loop, all of them together)
give spak's output bits on finite inputs in the simulator, launched as the GPU harness
(ci/fwd_peers_bench.variant_launch) launches them: spak's planned launch, arguments matched
by parameter name, the grid through the variant's own variant_grid when it has one."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from spak import sim
from spak.gpu.plan import plan_fmha

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ci"))
import fwd_variants  # noqa: E402


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    out = tmp_path_factory.mktemp("var")
    assert fwd_variants.main([str(out)]) == 0
    return out


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"variant_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _params(kernel):
    code = kernel._annotated_function.pyfunc.__code__
    return list(code.co_varnames[:code.co_argcount])


def _run(mod, q, k, v, causal, tiles):
    """out of fmha_fwd_kernel from ``mod`` (None: spak's) as the GPU harness launches it."""
    out = np.zeros(q.shape, q.dtype)
    L = plan_fmha("fused", q, k, v, out, causal=causal, tiles=tiles)[0]
    kernel, grid, args = L.kernel, L.grid, L.args
    if mod is not None:
        given = dict(zip(_params(kernel), args))
        kernel = mod.fmha_fwd_kernel
        args = tuple(given[n] for n in _params(kernel))
        grid = getattr(mod, "variant_grid", lambda g: g)(grid)
    sim.launch(kernel, grid, args)
    return out


def test_every_variant_generates(variants):
    names = {p.stem for p in variants.glob("*.py")}
    assert names == set(fwd_variants.VARIANTS)
    for name in fwd_variants.APPENDIX:
        assert hasattr(_load(variants / f"{name}.py"), "variant_grid")



# (B, Hq, Hkv, Sq, Sk, D, causal, tiles): a ragged causal problem with a dead-row-free
# bottom-right diagonal, a GQA non-causal one, Sq < Sk causal (bid ordering matters).
CASES = [(2, 3, 3, 40, 40, 16, True, {"TILE_M": 16, "TILE_N": 16}),
         (1, 4, 2, 33, 50, 32, False, {"TILE_M": 16, "TILE_N": 32}),
         (2, 2, 1, 24, 56, 16, True, {"TILE_M": 16, "TILE_N": 16})]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[3]}x{c[4]}x{c[5]}"
                         f"{'c' if c[6] else ''}")
def test_round5_variants_give_spaks_bits(variants, case):
    B, Hq, Hkv, Sq, Sk, D, causal, tiles = case
    rng = np.random.default_rng(17)
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float16)
    k, v = (rng.standard_normal((B, Hkv, Sk, D)).astype(np.float16) for _ in range(2))
    ref = _run(None, q, k, v, causal, tiles)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    for name in ("natural", "flatgrid"):     # oneloop, samplelike: retired (ci/fwd_variants.py)
        out = _run(_load(variants / f"{name}.py"), q, k, v, causal, tiles)
        np.testing.assert_array_equal(out.view(np.uint16), ref.view(np.uint16), err_msg=name)
