"""The cuTile kernels compile to cubin for the target GPUs, on a CPU-only machine.

Type-checking by cuTile's front end plus code generation by tileiras, no launch.
A hand-picked cover of the flag space (each arch, kernel, dtype, head dim, causal and mask
value appears at least once) keeps the default run near a minute on a 2-core box; set
SPAK_COMPILE_ALL=1 for the full matrix (2 archs x 2 kernels x 2 dtypes x D 64/128 x
causal x mask = 64 variants, about 3 minutes on a 2-core box).
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("cuda.tile")

from spak.gpu.compile import TARGET_ARCHS, all_variants, compile_variant, variant_launches  # noqa: E402
from spak.gpu.plan import LAUNCH_NAMES, default_tiles  # noqa: E402

# (arch, kernel, dtype, head_dim, causal, has_mask, assume, int64) -- default tiles
COVER = [
    ("sm_90", "fused", "float16", 64, True, True, "launch", False),
    ("sm_90", "fused", "bfloat16", 128, False, False, "launch", False),
    ("sm_90", "fused", "float16", 128, True, False, "launch", False),
    ("sm_120", "fused", "float16", 128, True, False, "launch", False),
    ("sm_120", "fused", "bfloat16", 64, False, True, "launch", False),
    ("sm_90", "naive", "bfloat16", 128, True, True, "launch", False),
    ("sm_120", "naive", "float16", 64, False, False, "launch", False),
    # the fully general signature (no stride/alignment assumptions)
    ("sm_90", "fused", "float16", 64, False, True, "none", False),
    ("sm_120", "naive", "bfloat16", 64, True, True, "none", False),
    # the int64-indexed twins plan_fmha switches to past 2^31 elements
    ("sm_90", "fused", "bfloat16", 64, True, True, "launch", True),
    ("sm_120", "naive", "float16", 128, False, True, "launch", True),
]


def _id(v):
    arch, kernel, dtype, d, causal, mask = v[:6]
    tail = "".join(f"-{x}" for x in (v[6:7] if len(v) > 6 and v[6] != "launch" else ())) \
        + ("-int64" if len(v) > 7 and v[7] else "")
    return (f"{arch}-{kernel}-{dtype}-d{d}-{'causal' if causal else 'full'}-"
            f"{'mask' if mask else 'nomask'}{tail}")


def _check(result, kernel):
    assert result["ok"], result["error"]
    assert result["error"] is None
    names = [k["name"] for k in result["kernels"]]
    assert names == list(LAUNCH_NAMES[kernel])
    assert all(k["cubin_bytes"] > 0 for k in result["kernels"])
    assert result["cubin_bytes"] == sum(k["cubin_bytes"] for k in result["kernels"])


@pytest.mark.slow
@pytest.mark.parametrize("variant", COVER, ids=_id)
def test_compiles(variant):
    arch, kernel, dtype, d, causal, mask, assume, int64 = variant
    r = compile_variant(kernel, arch=arch, dtype=dtype, head_dim=d, causal=causal,
                        has_mask=mask, tiles=default_tiles(d, arch), assume=assume,
                        int64=int64)
    _check(r, kernel)


# Parametrized only when asked for, so the default run lists no 64 skips.
_FULL = list(all_variants(TARGET_ARCHS)) if os.environ.get("SPAK_COMPILE_ALL") == "1" else []


@pytest.mark.slow
@pytest.mark.parametrize("kw", _FULL,
                         ids=lambda kw: _id((kw["arch"], kw["kernel_name"], kw["dtype"],
                                             kw["head_dim"], kw["causal"], kw["has_mask"])))
def test_compiles_full_matrix(kw):
    _check(compile_variant(**kw), kw["kernel_name"])


def test_unknown_arch_is_reported_not_raised():
    r = compile_variant("naive", arch="sm_75", dtype="float16", head_dim=64, causal=False,
                        has_mask=False, tiles={"TILE_M": 64, "TILE_N": 64})
    assert not r["ok"]
    assert "sm_75" in r["error"]


def test_signatures_follow_the_plan():
    # compile.py derives its signatures from plan_fmha; the launch lists must match.
    for kernel in ("fused", "naive"):
        launches = variant_launches(kernel, dtype="float16", head_dim=64, causal=True,
                                    has_mask=True)
        assert tuple(l.name for l in launches) == LAUNCH_NAMES[kernel]


def test_int64_twins_are_annotated_and_cached():
    import cuda.tile as ct
    from spak.gpu.kernels import fmha_fwd_kernel
    from spak.gpu.plan import int64_variant

    twin = int64_variant(fmha_fwd_kernel)
    assert twin is int64_variant(fmha_fwd_kernel)
    anns = twin._annotated_function.parameter_annotations
    assert [a.array.index_dtype for a in anns[:5]] == [ct.int64] * 5   # Q K V Out Mask
    assert all(a.array is None for a in anns[5:])                        # scale, Constants
    # the decorator's options carry over (occupancy 2 on sm_90 for the fused kernel)
    assert twin._compiler_options == fmha_fwd_kernel._compiler_options
