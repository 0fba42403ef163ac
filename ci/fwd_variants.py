"""Write the forward kernel's experiment variants (issue 17) next to each other, for A/B runs.

    python ci/fwd_variants.py OUT_DIR            # writes OUT_DIR/<name>.py, one per variant
    python ci/ab_fused.py --peer lat24=OUT_DIR/lat24.py ... --store-gpu "NVIDIA H100 80GB HBM3"

Each variant is gpu/kernels/fused.py with ONE of the differences between it and NVIDIA's cuTile
sample (samples/AttentionFMHA.py, cutile-python 9c3ee3c) applied as a text edit, so a run
measures that difference alone; `sample4` applies them all. The edits are exact-match
replacements that must each match once: when fused.py changes under them the script fails
loudly instead of writing a variant that silently is not what its name says.
Variants keep fmha_fwd_kernel's signature (ci/ab_fused.py matches arguments by name).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUSED = ROOT / "gpu" / "kernels" / "fused.py"

# --- the sample's differences, one edit list each ------------------------------------------
# The sample's fixed load-latency hints: K 2, V 4 (ours: unset unless the store says).
LAT24 = [("latency=LAT_K if LAT_K > 0 else None", "latency=2"),
         ("latency=LAT_V if LAT_V > 0 else None", "latency=4")]

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

# One key loop with the mask applied only from mask_from on (the sample's form), instead of
# our interior loop + boundary loop.
ONELOOP = [("""    for j in range(0, min(mask_from, num_tiles)):
        qk = _scores(q, K, Mask, b, kv_h, mask_b, mask_h, bid_m, j, qk_scale_log2,
                     HEAD_DIM, TILE_M, TILE_N, HAS_MASK, RAW_MAX, LAT_K)
        m_i, l_i, acc = _online_softmax_step(
            qk, m_i, l_i, acc, V, b, kv_h, j, multipliers,
            TILE_N, HEAD_DIM_V, Q.dtype, RAW_MAX, LAT_V)
    for j in range(mask_from, num_tiles):""", """    for j in range(0, num_tiles):"""),
           ("""        key_pos = j * TILE_N + key_offs                     # [1, TN]
        keep = key_pos < seq_k
        if CAUSAL:
            keep = keep & (key_pos <= q_pos)                # [TM, TN]
        qk = ct.where(keep, qk, NEG_INF)""", """        if j >= mask_from:
            key_pos = j * TILE_N + key_offs
            keep = key_pos < seq_k
            if CAUSAL:
                keep = keep & (key_pos <= q_pos)
            qk = ct.where(keep, qk, NEG_INF)""")]

# Loads without an explicit padding mode (the sample's; TMA fills out-of-bounds with zeros,
# the stub calls the default undetermined).
NOPAD = [("""                  order=(0, 1, 3, 2),                # K^T via the load's axis order
                  padding_mode=ct.PaddingMode.ZERO,""",
          """                  order=(0, 1, 3, 2),                # K^T via the load's axis order"""),
         ("""    v = ct.load(V, index=(b, kv_h, j, 0), shape=(1, 1, TILE_N, HEAD_DIM_V),
                padding_mode=ct.PaddingMode.ZERO,""",
          """    v = ct.load(V, index=(b, kv_h, j, 0), shape=(1, 1, TILE_N, HEAD_DIM_V),""")]

# Head counts as compile-time constants (the sample's H and QUERY_GROUP_SIZE): the block's
# (batch, head, kv head) by constant division instead of run-time integer division. Needs
# the values per launch: the variant gets a peer_args (ci/ab_fused.py) that fills them in.
CONSTHEAD = [("""                    LAT_V: ConstInt = 0):    # same for V loads (tuning knobs for the sweeper)
    bid_m = ct.bid(0)""", """                    LAT_V: ConstInt = 0,
                    NUM_HEADS: ConstInt = 1, GROUP: ConstInt = 1):
    bid_m = ct.bid(0)"""),
             ("""    b, h, kv_h = _head_coords(ct.bid(1), Q, K)
    _fmha_fwd_block(Q, K, V, Out, Mask, None,""", """    b = ct.bid(1) // NUM_HEADS
    h = ct.bid(1) % NUM_HEADS
    kv_h = h // GROUP
    _fmha_fwd_block(Q, K, V, Out, Mask, None,""")]
CONSTHEAD_ARGS = '''

def peer_args(ours):
    """ci/ab_fused.py: our arguments plus the head counts as constants."""
    import inspect
    names = list(inspect.signature(fmha_fwd_kernel._annotated_function.pyfunc).parameters)
    extra = {"NUM_HEADS": ours["Q"].shape[1],
             "GROUP": ours["Q"].shape[1] // ours["K"].shape[1]}
    return tuple({**ours, **extra}[n] for n in names)
'''

# The sample's epilogue: acc / l with no guard for rows that saw no key (l == 0 -> NaN).
EPILOGUE = [("""    has_keys = l_i != 0.0
    l_safe = ct.where(has_keys, l_i, 1.0)
    out = ct.truediv(acc, l_safe, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    out = ct.where(has_keys, out, 0.0)""", """    has_keys = l_i != 0.0
    out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)""")]

# The sample's causal mask: no bounds test when Sk is a multiple of TILE_N (its EVEN_K),
# and the mask added as 0 / -inf instead of selected.
MASKADD = [("""        key_pos = j * TILE_N + key_offs                     # [1, TN]
        keep = key_pos < seq_k
        if CAUSAL:
            keep = keep & (key_pos <= q_pos)                # [TM, TN]
        qk = ct.where(keep, qk, NEG_INF)""", """        key_pos = j * TILE_N + key_offs                     # [1, TN]
        keep = key_pos <= q_pos
        qk = qk + ct.where(keep, 0.0, NEG_INF)""")]

VARIANTS = {
    "same": [],                       # an identical copy: the run's noise
    "lat24": LAT24,
    "natural": NATURAL,
    "nosafe": NOSAFE,
    "oneloop": ONELOOP,
    "nopad": NOPAD,
    "sample4": LAT24 + NATURAL + NOSAFE + ONELOOP + NOPAD,
    "consthead": CONSTHEAD,
    "epilogue": EPILOGUE,
    "maskadd": MASKADD,       # causal, Sk % TILE_N == 0 only
    "sample7": LAT24 + NATURAL + NOSAFE + NOPAD + CONSTHEAD + EPILOGUE + MASKADD,
}
# Text appended to a variant (module-level helpers it needs).
APPENDIX = {"consthead": CONSTHEAD_ARGS, "sample7": CONSTHEAD_ARGS}

# A peer is loaded as a plain module, outside the package: its relative import made absolute.
IMPORT = ("from .common import FLOAT32_MAX, LOG2E, NEG_INF",
          "from spak.gpu.kernels.common import FLOAT32_MAX, LOG2E, NEG_INF")


def apply(text: str, edits) -> str:
    for old, new in edits:
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"fwd_variants: edit target found {n} times (want 1):\n{old}")
        text = text.replace(old, new)
    return text


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    base = FUSED.read_text()
    for name, edits in VARIANTS.items():
        text = apply(apply(base, [IMPORT]), edits) + APPENDIX.get(name, "")
        (out / f"{name}.py").write_text(text)
        print(out / f"{name}.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
