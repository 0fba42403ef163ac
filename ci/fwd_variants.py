"""Write the forward kernel's experiment variants (issue 17) next to each other, for A/B runs.

    python ci/fwd_variants.py OUT_DIR            # writes OUT_DIR/<name>.py, one per variant
    python ci/ab_fused.py --peer lat24=OUT_DIR/lat24.py ... --store-gpu "NVIDIA H100 80GB HBM3"

Each variant is gpu/kernels/fused.py with ONE of the differences between it and NVIDIA's cuTile
sample (samples/AttentionFMHA.py, cutile-python 9c3ee3c) applied as a text edit, so a run
measures that difference alone; `sample4` applies them all. The edits are exact-match
replacements that must each match once: when fused.py changes under them the script fails
loudly instead of writing a variant that silently is not what its name says.
Variants keep fmha_fwd_kernel's signature (ci/ab_fused.py matches arguments by name).
A variant that launches another grid (round 5: flatgrid, samplelike) defines
variant_grid(grid) -> grid; ci/fwd_peers_bench.py applies it (ci/ab_fused.py does not: run
those through fwd_peers_bench, whose bit comparison with spak.fmha would catch the miss).
tests/test_fwd_variants.py checks that every variant generates and that the round-5 ones
give spak's bits in the simulator.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUSED = ROOT / "gpu" / "kernels" / "fused.py"

# --- the sample's differences, one edit list each ------------------------------------------
# The sample's fixed load-latency hints: K 2, V 4 (ours: unset unless the store says).
LAT24 = [("latency=LAT_K if LAT_K > 0 else None).reshape((HEAD_DIM, TILE_N))",
          "latency=2).reshape((HEAD_DIM, TILE_N))"),          # the padded path's K load
         ("\n                    latency=LAT_V if LAT_V > 0 else None)",
          "\n                    latency=4)")]                  # and its V load

# Natural block order: no longest-first reversal of causal query tiles (entry point only).
NATURAL = [("""    bid_m = ct.bid(0)
    if CAUSAL:
        # Longest first""", """    bid_m = ct.bid(0)
    if False:
        # Longest first""")]

# The sample's scale-after-max without our huge-logit guard (per-row select and clamp):
# m_new raw, offset m_new * c. NOT safe for |max score * c| >= 2^24 nor for rows that see no
# key in their first tile; measures only what the guard costs.
NOSAFE = [("""    c_row = ct.where(ct.abs(m_new) >= huge_max, c_pow2, c)""",
           """    c_row = c"""),
          ("""    mb = ct.maximum(m_new * c_row, -FLOAT32_MAX)""",
           """    mb = m_new * c_row""")]

# `oneloop` (one key loop, mask applied from mask_from on: the sample's form) was measured
# at 3be02fe (noise; tileiras unswitches it into two loops) and dropped from this list.

# Loads without an explicit padding mode (the sample's; TMA fills out-of-bounds with zeros,
# the stub calls the default undetermined).
NOPAD = [("""                      order=(0, 1, 3, 2),                # K^T via the load's axis order
                      padding_mode=ct.PaddingMode.ZERO,""",
          """                      order=(0, 1, 3, 2),                # K^T via the load's axis order"""),
         ("""        v = ct.load(V, index=(b, kv_h, j, 0), shape=(1, 1, TILE_N, HEAD_DIM_V),
                    padding_mode=ct.PaddingMode.ZERO,""",
          """        v = ct.load(V, index=(b, kv_h, j, 0), shape=(1, 1, TILE_N, HEAD_DIM_V),""")]

# Measured and since adopted in gpu/kernels/fused.py (their edits no longer apply; run
# this script at commit 3be02fe to regenerate them): `consthead` (head counts as
# compile-time constants), `epilogue` (acc / l without the dead-row guard), `maskadd`
# (causal mask without the bounds test, added as 0 / -inf) and `sample7` (all the sample's
# differences). fused.py took consthead's and maskadd's substance, not their text.

# The sample's epilogue: acc / l with no guard for rows that saw no key (l == 0 -> NaN).
EPILOGUE = [("""    has_keys = l_i != 0.0
    l_safe = ct.where(has_keys, l_i, 1.0)
    out = ct.truediv(acc, l_safe, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    out = ct.where(has_keys, out, 0.0)""", """    has_keys = l_i != 0.0
    out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)""")]

# The sample's way to apply the causal mask: added as 0 / -inf instead of selected.
MASKADD = [("""            keep = key_pos <= q_pos                         # [TM, TN]
        else:
            keep = key_pos < seq_k                          # [1, TN]
        qk = ct.where(keep, qk, NEG_INF)""", """            qk = qk + ct.where(key_pos <= q_pos, 0.0, NEG_INF)
        else:
            qk = ct.where(key_pos < seq_k, qk, NEG_INF)""")]

# The causal mask as min(qk, +-inf bias) (a07b92d's form; keeps the select's NaN semantics):
# in the sm_90 SASS at 64x64/o4/K2 D=64 causal the boundary loop drops from 415 to 379
# instructions and the 8-byte spill goes (ci/fwd_sass_diff.py); round 2 timed it neutral.
MINBIAS = [("""            keep = key_pos <= q_pos                         # [TM, TN]
        else:
            keep = key_pos < seq_k                          # [1, TN]
        qk = ct.where(keep, qk, NEG_INF)""",
            """            qk = ct.minimum(qk, ct.where(key_pos <= q_pos, POS_INF, NEG_INF))
        else:
            qk = ct.where(key_pos < seq_k, qk, NEG_INF)""")]

# --- round 5: what is left outside the loop bodies (docs/perf-notes.md "Round 5") ----------
# The sample's launch grid, (query tiles, B * Hq, 1) with b, h = bid(1) // Hq, bid(1) % Hq,
# instead of ours, (query tiles, Hq, B). The same linear block order (x fastest, then the
# flattened (b, h) in the same sequence), plus one division by the run-time head count (the
# sample's H is a compile-time constant: its division is a shift). The launch changes with
# it: FLATGRID_LAUNCH's variant_grid, which ci/fwd_peers_bench.py applies to spak's grid.
FLATGRID = [("""        bid_m = ct.num_blocks(0) - 1 - bid_m
    b, h, kv_h = _head_coords(GROUP)
    _fmha_fwd_block(Q, K, V, Out, Mask, None,""",
             """        bid_m = ct.num_blocks(0) - 1 - bid_m
    heads = Q.shape[1]                      # the sample's grid: (query tiles, B * Hq, 1)
    b, h = ct.bid(1) // heads, ct.bid(1) % heads
    kv_h = h // GROUP
    _fmha_fwd_block(Q, K, V, Out, Mask, None,""")]
FLATGRID_LAUNCH = '''

def variant_grid(grid):
    """The sample's launch grid for spak's planned one: (m, Hq, B) -> (m, B * Hq, 1)."""
    m, hq, b = grid
    return (m, hq * b, 1)
'''

# The sample's one key loop, masking from mask_from on under a branch (tileiras unswitches
# it; round 2 timed it at 3be02fe on the old kernel: noise). Same tiles, same order, same
# arithmetic per tile as our two loops: only the loop structure (the sample's `mid` part).
ONELOOP = [("""    for j in range(0, min(mask_from, num_tiles)):
        qk = _scores(q, K, Mask, b, kv_h, mask_b, mask_h, bid_m, j, qk_scale_log2,
                     HEAD_DIM, TILE_M, TILE_N, HAS_MASK, RAW_MAX, LAT_K)
        m_i, l_i, acc = _online_softmax_step(
            qk, m_i, l_i, acc, V, b, kv_h, j, multipliers,
            TILE_N, HEAD_DIM_V, Q.dtype, RAW_MAX, LAT_V)
    for j in range(mask_from, num_tiles):""", """    for j in range(0, num_tiles):"""),
           ("""        key_pos = j * TILE_N + key_offs                     # [1, TN]
        if CAUSAL:""", """        if j >= mask_from:
          key_pos = j * TILE_N + key_offs                     # [1, TN]
          if CAUSAL:"""),
           ("""            keep = key_pos <= q_pos                         # [TM, TN]
        else:
            keep = key_pos < seq_k                          # [1, TN]
        qk = ct.where(keep, qk, NEG_INF)""", """            keep = key_pos <= q_pos                         # [TM, TN]
          else:
            keep = key_pos < seq_k                          # [1, TN]
          qk = ct.where(keep, qk, NEG_INF)""")]
# ONELOOP with MINBIAS's mask form (both edit the mask's lines): for samplelike.
ONELOOP_MIN = ONELOOP[:2] + [(MINBIAS[0][0], """            qk = ct.minimum(qk, ct.where(key_pos <= q_pos, POS_INF, NEG_INF))
          else:
            qk = ct.where(key_pos < seq_k, qk, NEG_INF)""")]

VARIANTS = {
    "same": [],                       # an identical copy: the run's noise
    "lat24": LAT24,
    "natural": NATURAL,
    "nosafe": NOSAFE,
    "nopad": NOPAD,
    "sample4": LAT24 + NATURAL + NOSAFE + NOPAD,
    "epilogue": EPILOGUE,
    # round 4: every SPAK guard off (NOT safe for +-inf inputs or |max score * c| >= 2^24:
    # prices what the promise costs), with and without the min-form mask
    "noguard": NOSAFE + EPILOGUE,
    # round 5 (prepared 2026-11-24d): the differences outside the loop bodies one at a time
    # (natural, above: the block order) and all of them on top of noguard_min + lat24
    # ("samplelike": every source difference from the sample we know of, in our source)
    "flatgrid": FLATGRID,
}
# Text appended to a variant (module-level helpers it needs; variant_grid(grid) -> grid:
# the launch grid the harness uses instead of spak's planned one).
APPENDIX: dict = {"flatgrid": FLATGRID_LAUNCH}
# Retired 2026-11-27c: maskadd, sample6, epi_add, minbias, noguard_min, oneloop, samplelike.
# Their edits (MASKADD, MINBIAS, ONELOOP, ONELOOP_MIN above) target the boundary loop as it
# was before the varlen kernel's row-offset form moved it into _boundary_step; to rebuild
# them, run this script as of commit 01d0f95 (`git show 01d0f95:ci/fwd_variants.py`).

# A peer is loaded as a plain module, outside the package: its relative import made absolute.
IMPORT = ("from .common import FLOAT32_MAX, LOG2E, NEG_INF",
          "from spak.gpu.kernels.common import FLOAT32_MAX, LOG2E, NEG_INF")


def apply(text: str, edits, who: str = "fwd_variants") -> str:
    for old, new in edits:
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"{who}: edit target found {n} times (want 1):\n{old}")
        text = text.replace(old, new)
    return text


def load_edited(text: str, edits, who: str, name: str):
    """A kernel module's source `text` with `edits` applied (apply), written to a temporary
    file and imported as module `name` (outside the package: edit its relative imports to
    absolute ones, e.g. IMPORT): the benches' way to launch a kernel variant."""
    import importlib.util
    import tempfile
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(apply(text, edits, who))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_variants(argv, doc: str, names, text_of) -> int:
    """The scripts' command line: OUT_DIR -> OUT_DIR/<name>.py with text_of(name) each."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(doc)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        (out / f"{name}.py").write_text(text_of(name))
        print(out / f"{name}.py")
    return 0


def variant_text(name: str) -> str:
    return apply(apply(FUSED.read_text(), [IMPORT]), VARIANTS[name]) + APPENDIX.get(name, "")


def main(argv=None) -> int:
    return write_variants(argv, __doc__, VARIANTS, variant_text)


if __name__ == "__main__":
    sys.exit(main())
