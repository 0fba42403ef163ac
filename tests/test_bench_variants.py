"""The GPU benches' kernel variants and options on the CPU (nothing launched): every text
edit of ci/varlen_bench_kernels.py (EDITS) and ci/decode_gap_bench.py (DECODE_EDITS) still
applies to the shipped kernel source and builds a kernel, so a change to gpu/kernels/
breaks here rather than in a GPU call; the varlen bench's option parsers."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ci"))

import decode_bench  # noqa: E402
import decode_gap_bench  # noqa: E402
import varlen_bench_kernels  # noqa: E402


@pytest.mark.parametrize("name", sorted(varlen_bench_kernels.EDITS))
def test_varlen_edits_build(name):
    """The built kernel is a cuTile kernel whose source is the edited text: every edit's
    new code in it, none of the replaced code (helper 38 may move these ci/ loaders)."""
    from pathlib import Path
    import cuda.tile as ct
    kernel = varlen_bench_kernels.variant_kernel(name)
    assert isinstance(kernel, ct.kernel) and kernel._pyfunc.__name__ == "fmha_varlen_kernel"
    source = Path(kernel._pyfunc.__code__.co_filename).read_text()
    for old, new in varlen_bench_kernels.EDITS[name]:
        assert new in source and old not in source, (name, old)


@pytest.mark.parametrize("name", sorted(decode_gap_bench.DECODE_EDITS))
def test_decode_edits_build(name):
    mod = decode_gap_bench.decode_variant(name)
    assert hasattr(mod, "decode_split_kernel") and hasattr(mod, "decode_combine_kernel")


def test_varlen_configs_option():
    got = decode_bench.parse_configs("TILE_M=128,NUM_CTAS=2;HEADS=2;")
    assert got == [{"TILE_M": 128, "NUM_CTAS": 2}, {"HEADS": 2}]
    assert decode_bench.config_name(got[0]) == "cfg_TILE_M128_NUM_CTAS2"
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        decode_bench.parse_configs("TILE_M")


def test_varlen_edit_whole_loop_is_the_former_kernel_text():
    """`wholeloop` (the same-run control of 887829e) puts back exactly one constant: the
    edited source differs from the shipped one in that line only."""
    from fwd_variants import FUSED, IMPORT, apply
    shipped = apply(FUSED.read_text(), [IMPORT])
    edited = apply(shipped, varlen_bench_kernels.EDITS["wholeloop"])
    diff = [(a, b) for a, b in zip(shipped.splitlines(), edited.splitlines()) if a != b]
    assert diff == [("        if not WHOLE:", "        if True:")]


def test_goal_plot_regions():
    """ci/decode_goal_plot.py sorts shapes by the goal and by their same-size copy."""
    import decode_goal_plot as gp
    rows = [{"gbs": {"spak": 2600, "copy-same": 2000}},      # at the goal
            {"gbs": {"spak": 2000, "copy-same": 2900}},      # below, the copy reaches it
            {"gbs": {"spak": 400, "copy-same": 1600}}]       # below, so is the copy
    assert gp.regions(rows) == {"at goal": 1, "below, copy reaches goal": 1,
                                "below, copy below goal": 1}
