"""Write copies of NVIDIA's cuTile FMHA sample that each take ONE of our kernel's choices
(issue 17, round 6: the reverse bisection), for ci/fwd_peers_bench.py --sample-variant.

    python ci/fwd_sample_variants.py OUT_DIR     # writes OUT_DIR/<name>.py, one per variant

Round 5 (results/fwd-round5-h100-2026-11-24e) put every named difference of the sample into
our source ("samplelike") and got no faster, while the sample at our tiles and hints stayed
5-7% ahead at D=64 S <= 2048 causal. So this round goes the other way: the sample's source
(ci/peers/cutile_sample_fmha.py, vendored from NVIDIA/cutile-python 9c3ee3c, Apache-2.0; a
benchmark opponent, outside the package) with one of our choices each; the variant that
loses the sample's lead names the part of our source that costs it.

  s_reversed  causal query tiles longest first (our block order)
  s_ourgrid   grid (query tiles, H, B): batch and head from their own grid axes (ours);
              the launch grid comes from the module's sample_grid(tiles, B, H)
  s_twoloop   two key loops, the masked tiles in the second (ours); the sample's one loop
              with `if j >= mask_start` is what tileiras unswitches
  s_rawmax    our softmax step: the row max on raw scores, offset mb = m * scale, the
              rescale exp2(m_old * scale - mb) (the sample: scaled max, exp2(m_old - m_new));
              other output bits than the sample's (alpha's rounding), same tolerance
  s_ours      all four
Round 6b (s_ours + one more of ours each; s_ours2 all of them):
  s_guards    the huge-logit guard (per-row multiplier select against a threshold, offset
              clamp; the power-of-two multiplier a stand-in, never selected by these inputs)
              and the dead-row epilogue (l == 0 -> output 0)
  s_selmask   the mask as a select (where(keep, qk, -inf)) instead of adding where(keep, 0, -inf)
  s_pad       padding_mode ZERO on the Q, K and V loads
  s_params    our extra parameters: a Mask array (a dummy (1, 1, 1, 1), as spak passes when
              there is no mask) and a second float scale; sample_args(args) inserts them

Edits are exact-match replacements that must each match once, so a change of the vendored
file fails loudly instead of writing a variant that is not what its name says.
tests/test_fwd_sample_variants.py checks that every variant generates and runs in the
simulator with the sample's output (bit for bit where the arithmetic is the same).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "ci" / "peers" / "cutile_sample_fmha.py"
sys.path.insert(0, str(ROOT / "ci"))
from fwd_variants import apply, write_variants  # noqa: E402

REVERSED = [("""    bid_x = ct.bid(0)
""", """    bid_x = ct.bid(0)
    if CAUSAL:
        bid_x = ct.num_blocks(0) - 1 - bid_x     # longest first (SPAK's order)
""")]

OURGRID = [("""    bid_y = ct.bid(1)
    batch_idx = bid_y // H
    head_idx = bid_y % H
""", """    batch_idx = ct.bid(2)                        # SPAK's grid: (tiles, H, B)
    head_idx = ct.bid(1)
""")]
OURGRID_LAUNCH = '''

def sample_grid(tiles, batch, heads):
    """SPAK's grid shape for this variant (the sample's is (tiles, batch * heads, 1))."""
    return (tiles, heads, batch)
'''

RAWMAX = [("""        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale)
        qk = qk * qk_scale - m_ij  # [TILE_M, TILE_N]

        # attention weights
        p = ct.exp2(qk, flush_to_zero=True)  # [TILE_M, TILE_N]
        l_ij = ct.sum(p, axis=-1, keepdims=True)  # [TILE_M, 1]
        alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)  # [TILE_M, 1]
""", """        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True))   # raw units (SPAK)
        mb = m_ij * qk_scale
        p = ct.exp2(qk * qk_scale - mb, flush_to_zero=True)  # [TILE_M, TILE_N]
        l_ij = ct.sum(p, axis=-1, keepdims=True)  # [TILE_M, 1]
        alpha = ct.exp2(m_i * qk_scale - mb, flush_to_zero=True)  # [TILE_M, 1]
""")]

GUARDS = [("""        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True))   # raw units (SPAK)
        mb = m_ij * qk_scale
        p = ct.exp2(qk * qk_scale - mb, flush_to_zero=True)  # [TILE_M, TILE_N]
        l_ij = ct.sum(p, axis=-1, keepdims=True)  # [TILE_M, 1]
        alpha = ct.exp2(m_i * qk_scale - mb, flush_to_zero=True)  # [TILE_M, 1]
""", """        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True))   # raw units (SPAK)
        c_row = ct.where(ct.abs(m_ij) >= huge_max, qk_pow2, qk_scale)
        mb = ct.maximum(m_ij * c_row, -3.4028234663852886e38)
        p = ct.exp2(qk * c_row - mb, flush_to_zero=True)  # [TILE_M, TILE_N]
        l_ij = ct.sum(p, axis=-1, keepdims=True)  # [TILE_M, 1]
        alpha = ct.exp2(m_i * c_row - mb, flush_to_zero=True)  # [TILE_M, 1]
"""), ("""    qk_scale = qk_scale * INV_LOG_2
""", """    qk_scale = qk_scale * INV_LOG_2
    huge_max = ct.truediv(16777216.0, qk_scale, flush_to_zero=True,
                          rounding_mode=RMd.APPROX)
    qk_pow2 = qk_scale * 0.5          # stand-in for spak's power-of-two multiplier
"""), ("""    acc = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=RMd.APPROX)
""", """    has_keys = l_i != 0.0
    acc = ct.truediv(acc, ct.where(has_keys, l_i, 1.0), flush_to_zero=True,
                     rounding_mode=RMd.APPROX)
    acc = ct.where(has_keys, acc, 0.0)
""")]

SELMASK = [("""            mask = ct.where(mask, 0.0, -np.inf)  # [TILE_M, TILE_N]
            qk += mask
""", """            qk = ct.where(mask, qk, -np.inf)  # [TILE_M, TILE_N] (SPAK's select)
""")]

PAD = [("""        Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D)
    )""", """        Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
        padding_mode=ct.PaddingMode.ZERO,
    )"""), ("""            order=(0, 1, 3, 2),
            latency=2,
""", """            order=(0, 1, 3, 2),
            latency=2, padding_mode=ct.PaddingMode.ZERO,
"""), ("""            latency=4,
""", """            latency=4, padding_mode=ct.PaddingMode.ZERO,
""")]

PARAMS = [("""def fmha_kernel(Q, K, V, Out,
                qk_scale: float,
""", """def fmha_kernel(Q, K, V, Out, Mask,
                qk_scale: float, qk_scale_pow2: float,
""")]
PARAMS_LAUNCH = '''

def sample_args(args):
    """The sample's arguments with spak's extra ones inserted: a dummy Mask after Out (what
    spak passes when there is no mask) and a second float after the scale."""
    q = args[0]
    if type(q).__module__.startswith("torch"):     # numpy arrays have .device too
        import torch
        mask = torch.zeros((1, 1, 1, 1), dtype=torch.float32, device=q.device)
    else:
        import numpy
        mask = numpy.zeros((1, 1, 1, 1), numpy.float32)
    return (*args[:4], mask, args[4], args[4] * 0.5, *args[5:])
'''

_LOOP_HEAD = "    for j in range(0, Tc):\n"
_LOOP_END = "        m_i = m_ij  # [TILE_M, 1]\n"
_MASK_IF = "        if (CAUSAL or not EVEN_K) and j >= mask_start:\n"


def two_loops(text: str) -> str:
    """The sample's key loop as SPAK's two: tiles [0, mask_start) without the mask code,
    then [mask_start, Tc) with it (mask_start <= Tc: the sample clamps it to the keys)."""
    start, end = text.index(_LOOP_HEAD), text.index(_LOOP_END) + len(_LOOP_END)
    body = text[start + len(_LOOP_HEAD):end]
    i = body.index(_MASK_IF)
    j = body.index("        # --- Online Softmax Update ---")
    plain = body[:i] + body[j:]
    masked = body.replace(_MASK_IF, "        if CAUSAL or not EVEN_K:\n")
    loops = ("    for j in range(0, min(mask_start, Tc)):\n" + plain
             + "    for j in range(min(mask_start, Tc), Tc):\n" + masked)
    return text[:start] + loops + text[end:]


_OURS = REVERSED + OURGRID + RAWMAX
# name -> (edits, two key loops?, appended launch hooks)
VARIANTS = {
    "s_same": ([], False, ""),                   # an identical copy: the run's noise
    "s_reversed": (REVERSED, False, ""),
    "s_ourgrid": (OURGRID, False, OURGRID_LAUNCH),
    "s_twoloop": ([], True, ""),
    "s_rawmax": (RAWMAX, False, ""),
    "s_ours": (_OURS, True, OURGRID_LAUNCH),
    # round 6b: s_ours plus one more of ours each, then all
    "s_guards": (_OURS + GUARDS, True, OURGRID_LAUNCH),
    "s_selmask": (_OURS + SELMASK, True, OURGRID_LAUNCH),
    "s_pad": (_OURS + PAD, True, OURGRID_LAUNCH),
    "s_params": (_OURS + PARAMS, True, OURGRID_LAUNCH + PARAMS_LAUNCH),
    "s_ours2": (_OURS + GUARDS + SELMASK + PAD + PARAMS, True, OURGRID_LAUNCH + PARAMS_LAUNCH),
}


def variant_text(name: str) -> str:
    edits, split, hooks = VARIANTS[name]
    text = apply(SAMPLE.read_text(), edits, "fwd_sample_variants")  # one loop: each matches once
    if split:
        text = two_loops(text)
    header = f"# fwd_sample_variants.py: {name} (generated; see that script)\n"
    return header + text + hooks


def main(argv=None) -> int:
    return write_variants(argv, __doc__, VARIANTS, variant_text)


if __name__ == "__main__":
    sys.exit(main())
