"""The FMHA backward's kernels (and the forward's LSE entry point) compile to cubin for
sm_90, sm_120 and sm_89 on a CPU-only machine (cuTile's front end + tileiras, no launch),
as tests/test_compile.py does for the forward. About 8 s per variant on a 2-core box."""
from __future__ import annotations

import pytest

pytest.importorskip("cuda.tile")

from spak.gpu.compile import bwd_variant_launches, compile_bwd_variant  # noqa: E402
from spak.gpu.plan_bwd import BWD_LAUNCH_NAMES, default_bwd_tiles  # noqa: E402

NAMES = ["fused.lse", *BWD_LAUNCH_NAMES["fused"]]

# (arch, dtype, head_dim, causal, has_mask, int64): each arch, dtype, D 64/128/80/256,
# causal and mask value at least once, and the int64 twins
COVER = [
    ("sm_90", "float16", 64, True, True, False),
    ("sm_90", "bfloat16", 128, False, False, False),
    ("sm_120", "float16", 128, True, False, False),
    ("sm_89", "bfloat16", 64, False, True, False),
    ("sm_90", "float16", 80, True, False, False),
    ("sm_90", "bfloat16", 256, False, True, False),
    ("sm_90", "float16", 64, True, True, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("v", COVER, ids=lambda v: "-".join(map(str, v)))
def test_backward_compiles(v):
    arch, dtype, d, causal, mask, int64 = v
    r = compile_bwd_variant(arch=arch, dtype=dtype, head_dim=d, causal=causal,
                            has_mask=mask, tiles=default_bwd_tiles(d, arch), int64=int64)
    assert r["ok"], r["error"]
    assert [k["name"] for k in r["kernels"]] == NAMES
    assert all(k["cubin_bytes"] > 0 for k in r["kernels"])
    assert r["cubin_bytes"] == sum(k["cubin_bytes"] for k in r["kernels"])


def test_backward_signatures_follow_the_plans():
    L = bwd_variant_launches(dtype="float16", head_dim=64, causal=True, has_mask=True)
    assert [l.name for l in L] == NAMES
    assert L[0].kernel._annotated_function.pyfunc.__name__ == "fmha_fwd_lse_kernel"
    L = bwd_variant_launches(dtype="float16", head_dim=64, causal=True, has_mask=True,
                             int64=True)
    assert all(l.kernel._annotated_function.pyfunc.__name__.endswith("_i64") for l in L)


def test_unknown_arch_is_reported_not_raised():
    r = compile_bwd_variant(arch="sm_75", dtype="float16", head_dim=64, causal=False,
                            has_mask=False)
    assert not r["ok"] and "sm_75" in r["error"]


def test_family_compile_variant():
    from spak import families
    r = families.get("fmha_bwd").compile_variant(
        {"kernel": "fused", "arch": "sm_75", "dtype": "fp16", "head_dim": 128,
         "causal": True, "mask": False})
    assert not r["ok"] and r["tiles"] == default_bwd_tiles(128, "sm_75", True)


# the fused-dQ backward (DQ_FUSED, issue 35): its two launches after the forward's LSE
FUSED_COVER = [
    ("sm_90", "float16", 64, True, True, 1),
    ("sm_90", "bfloat16", 128, False, False, 1),
    ("sm_90", "float16", 128, True, False, 2),     # 2 parts, non-causal: tileiras exit 5
    ("sm_120", "float16", 128, True, False, 1),
    ("sm_89", "bfloat16", 64, False, True, 1),
]


@pytest.mark.slow
@pytest.mark.parametrize("v", FUSED_COVER, ids=lambda v: "-".join(map(str, v)))
def test_fused_dq_backward_compiles(v):
    arch, dtype, d, causal, mask, parts = v
    tiles = {**default_bwd_tiles(d, arch), "DQ_FUSED": parts}
    r = compile_bwd_variant(arch=arch, dtype=dtype, head_dim=d, causal=causal,
                            has_mask=mask, tiles=tiles)
    assert r["ok"], r["error"]
    assert [k["name"] for k in r["kernels"]] == ["fused.lse", "bwd.preprocess", "bwd.dkdv"]
    assert all(k["cubin_bytes"] > 0 for k in r["kernels"])
    L = bwd_variant_launches(dtype=dtype, head_dim=d, causal=causal, has_mask=mask,
                             tiles=tiles)
    assert L[-1].kernel._annotated_function.pyfunc.__name__ == "fmha_bwd_dkdvdq_kernel"


@pytest.mark.slow
def test_fused_dq_spin_reads_its_counter_with_a_gpu_scope_atomic():
    """The fused-dQ pass hung on an H200 (2026-11-28): tileiras 13.4 compiled the spin's
    ``ct.load(Count, memory_order=ACQUIRE)`` in this warp-specialised kernel to LDGSTS.E, a
    weak async copy through L1, so a waiting block could read a stale counter forever. The
    spin now reads with an atomic add of 0: in the SASS an ``ATOMG ... .STRONG.GPU`` adding
    RZ, each followed by the L1 invalidation of an acquire (CCTL.IVALL)."""
    import re
    import subprocess
    import tempfile
    from tests import tools
    from spak.gpu.compile import export_cubin
    nvdisasm = tools.require("nvdisasm")
    tiles = {**default_bwd_tiles(64, "sm_90"), "DQ_FUSED": 1}
    launch = bwd_variant_launches(dtype="float16", head_dim=64, causal=True, has_mask=False,
                                  tiles=tiles)[-1]
    assert launch.kernel._annotated_function.pyfunc.__name__ == "fmha_bwd_dkdvdq_kernel"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(export_cubin(launch, "sm_90"))
        f.flush()
        lines = [ln for ln in subprocess.run([nvdisasm, "-c", f.name], check=True,
                                             capture_output=True, text=True).stdout.splitlines()
                 if "/*" in ln]
    spins = [i for i, ln in enumerate(lines)
             if re.search(r"ATOMG\.E\.ADD\.F32\S*\.STRONG\.GPU\s.*,\s*RZ\s*;", ln)]
    assert spins, "no GPU-scope atomic read of the counters: the spin is a plain load again"
    assert all("CCTL.IVALL" in lines[i + 1] for i in spins)
