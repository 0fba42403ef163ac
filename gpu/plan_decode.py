"""Host-side launch plans for split-KV decode attention over a KV cache: framework-agnostic.

``plan_decode`` validates the arrays and returns the launches (gpu.plan.Launch) computing

    out[b, i, h] = softmax(q[b, i, h] . K_b^T * scale) V_b   over the first cache_seqlens[b]
                                                             keys of sequence b

with the kernels of gpu/kernels/decode.py: one split-KV launch and, when the keys are split
more than once, one combine launch. Like gpu.plan it never launches anything and never
imports torch: numpy arrays / sim.SimArray for the simulator, torch tensors on a GPU.

Layouts (FlashAttention's flash_attn_with_kvcache, vLLM):
  q             [B, Sq, Hq, D]               fp16 or bf16
  k_cache       [B, Sk_max, Hkv, D]          contiguous cache, or, with block_table,
                [num_pages, page_size, Hkv, D]
  v_cache       like k_cache with Dv
  cache_seqlens int32 [B]                    keys per sequence (device values; clamped to
                                             [0, capacity] by the kernel, not checked here)
  block_table   int32 [B, max_pages]         page ids per sequence (paged cache only)
  out           [B, Sq, Hq, Dv]

The split count comes from the shape and the SM count (``choose_num_splits``: blocks
enough for a few waves, the combine's traffic bounded), or the caller's ``num_splits``; the
row tiling (GQA packing) from ``row_tiles``.

``plan_varlen`` plans attention over a packed variable-length batch (prefill,
FlashAttention's varlen layout: q [total_q, Hq, D], k/v [total_k, Hkv, D/Dv],
cu_seqlens_q/k int32 [B+1], out [total_q, Hq, Dv]) with the padded forward's block
(gpu/kernels/fused.py, fmha_varlen_kernel) at each sequence's row offsets.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from .kernels import decode as _decode
from .kernels import fused as _fused
from .variants import HINT_RANGES, with_hints
from .plan import (MAX_HEAD_DIM, Launch, _check_bool, _check_contiguous, _check_head_dims,
                   _check_inputs, _check_int, _check_scale, _dtype_name, _launch, _shape,
                   _shapes, _tile_width, _type_name, check_pow2_tiles, merge_tiles,
                   raw_max_args)

__all__ = ["plan_decode", "plan_varlen", "whole_tiles", "default_decode_tiles",
           "default_varlen_tiles",
           "row_tiles", "head_tiles", "choose_num_splits", "choose_kt_form", "choose_page_ahead",
           "auto_splits", "combine_tiles", "batch_chunks", "batch_slice", "INDEX_LIMIT",
           "fit_tile_n", "planned_splits", "TILE_KEYS", "VARLEN_TILE_KEYS", "PAGE_MODES",
           "KT_FORMS", "KT_AUTO", "AHEAD_AUTO", "MAX_SPLITS", "NUM_CTAS_VALUES",
           "LAUNCH_NAMES"]

#: Config keys of a decode `tiles` dict: keys per step, the most query rows (query
#: positions x packed heads) one block holds, how a paged tile of several pages is
#: read (PAGE_MODES; pages >= TILE_N: one box anyway), and the split kernel's occupancy
#: hint (0: the compiler's choice, which on sm_90 is 256 threads x 255 registers, one
#: block per SM; 2: 128 threads, two blocks per SM), the form (KT_FORMS) and the split
#: kernel's CTAs a block (NUM_CTAS: 0 the compiler's choice; 2 a cluster of two CTAs,
#: as the forward's c2 store entries at D = 128).
#: LAT: the DRAM latency hint of the split kernel's K/V loads (1..10; 0 the compiler's).
#: PAGE_AHEAD (paged caches): 1 looks up each key tile's page ids one step ahead (the
#: K/V loads of a step then wait on no block-table load), 0 in the step itself, -1
#: (AHEAD_AUTO, the default) choose_page_ahead.
#: GROUP_PAD (issue 33): 1 (the default) covers a GQA group that no power of two divides
#: (5, 7, 12, 71 heads) with cdiv(group, GT) tiles of GT (a power of two) heads, the last
#: one padded with masked rows, so each kv head's K/V is read cdiv(group, GT) times a
#: split; 0 the former tiling, blocks of the largest power of two dividing the group (a
#: group of 7: seven blocks, each reading the K/V), kept for same-run comparisons.
#: INDEX32 (issue 33h): 1 (the default) plans a contiguous cache of more than INDEX_LIMIT
#: elements as one plan per batch range whose arrays stay within it (batch_chunks), so every
#: launch takes the kernels' 32-bit-index form; 0 one plan over the whole batch, which past
#: 2^31 elements is the int64-indexed twin (gpu.plan.int64_variant). sm_90, tileiras 13.4,
#: Yi-34B's 128x56:8x16384x128 one-split kernel: the twin has no TMA load (64 LDGSTS, 0
#: UTMALDG) and spills 696 bytes a thread; the 32-bit form over 64 sequences: 18 UTMALDG, no
#: stack. H200 (results/issue33-h200x2-2026-11-28d): the twin's call 0.77 of a copy where
#: 32-bit one-split plans of the same family (Mixtral-8x7B 128x32:8x1024x128) reach 0.96.
#: TN_FIT (issue 33h): 1 (the default) lets the plan lower TILE_N in the rows form where
#: sm_90 compiles a gathered paged tile with spills (fit_tile_n); 0 TILE_N as given.
TILE_KEYS = ("TILE_N", "MAX_ROWS", "PAGE_MODE", "OCCUPANCY", "KT_FORM", "NUM_CTAS", "LAT",
             "PAGE_AHEAD", "GROUP_PAD", "INDEX32", "TN_FIT")
#: Config keys of a varlen `tiles` dict: spak.fmha's launch config (query rows per block,
#: keys per step, the K/V load latency hints, the occupancy and num_ctas hints; 0 = the
#: kernel's own) and HEADS, the query heads a block computes (VARLEN_HEADS).
VARLEN_TILE_KEYS = ("TILE_M", "TILE_N", "LAT_K", "LAT_V", "OCCUPANCY", "NUM_CTAS", "HEADS")
#: Query heads a varlen block computes one after another, (non-causal, causal): HEADS > 1
#: shares a block's offset loads (and the views of ragged tiles) among heads, but a
#: causal block's work grows with it and the last blocks leave a tail. H100, Hq 32, Hkv 8,
#: D 128, fp16, one run (results/varlen-h100-2026-11-27 run 7, tiles at row offsets),
#: TFLOPS HEADS 1 / 2 / 4: non-causal 8 x 2048 566 / 530 / 549, 2 x 8192 537 / 542 / 553,
#: 32 x 512 450 / 453 / 458, 16 x 1000 473 / 479 / 484, ragged 8 505 / 569 / 554;
#: causal 8 x 2048 462 / 450 / 434, 2 x 8192 577 / 557 / 510, 32 x 512 284 / 277 / 286,
#: 16 x 1000 373 / 364 / 356, ragged 8 486 / 490 / 482.
VARLEN_HEADS = (4, 1)
#: OCCUPANCY values a decode tiles dict accepts (0: no hint)
OCCUPANCIES = (0, 1, 2, 3, 4)
#: NUM_CTAS values a decode tiles dict accepts (0: no hint; else cuTile's num_ctas). H100
#: (results/decode-h100-2026-11-24d run 1): 2 loses everywhere (MQA Sq 4 with 128 rows
#: 0.8-1.0x of the 64-row default; 64 rows, or 16-key pages, 0.003-0.1x): a knob, never
#: a default.
NUM_CTAS_VALUES = (0, 1, 2, 4)
#: PAGE_MODE values: one box per page concatenated into the tile; one gathered load per
#: tile (ct.load_advanced_indexing over the page ids). H100, 16-key pages, 128-key tiles
#: (results/decode-h100-2026-11-24, run 5): gather 0.93-1.13 of contiguous, boxes
#: 0.29-0.76; both 100% bit-identical to the simulator (run 4). A third mode measured
#: there (each page's box fed to the tensor cores as loaded) spilled registers (0.1-0.5x
#: boxes) and agreed with the simulator on 94-99% of outputs only: removed.
PAGE_MODES = {0: "boxes", 1: "gather"}
#: KT_FORM values: how the split kernel puts a key tile on the tensor cores. 0 "rows":
#: S = Q K^T, the packed query rows in M (K read transposed: K^T [D, TN]); 1 "keys":
#: S^T = K Q^T, the keys in M and the rows in N (K as stored; O = P V with P^T
#: transposed); 2 "keys_vt": the same scores, O^T = V^T P^T (V read transposed).
KT_FORMS = {0: "rows", 1: "keys", 2: "keys_vt"}
#: tiles["KT_FORM"] = KT_AUTO (the default): choose_kt_form picks from the shape
KT_AUTO = -1
#: tiles["PAGE_AHEAD"] = AHEAD_AUTO (the default): choose_page_ahead picks
AHEAD_AUTO = -1
#: Fewer rows than this pad with zero query rows: the tensor cores' smallest M is 16.
MIN_ROWS = 16
MAX_SPLITS = 256
#: Split heuristic (choose_num_splits): ONE WAVE of blocks, rounded down (num_sms //
#: blocks splits; one split once the blocks fill the SMs), at least MIN_SPLIT_TILES key
#: tiles a split. The split kernel holds one block per SM (255 registers x 256 threads)
#: and streams its key tiles through a pipeline: a second (partial) wave, or more and
#: shorter splits, add per-split start-up, partial-state traffic and combine work, and
#: fewer blocks than SMs still stream at most of the bandwidth. H100, D 128, fp16,
#: results/decode-h100-2026-11-24d run 1 (GB/s; the former rule, 1-4 waves of splits of
#: a sixteenth of the cache, in brackets):
#: - 64x32:1x1:8192 (64 blocks): 2 splits 2336 [8: 2109], 4: 2240, 3 (1.45 waves): 2037;
#: - 1x32:32x1:8192 (32 blocks): 4 splits 2563 [16: 2311], 8: 2435;
#: - 8x32:8x1:8192 (64 blocks): 2 splits 2717 [8: 2554]; 8x32:32x1:8192 (256): 1 split
#:   3030 [2: 2974]; MQA Sq 4 8x32:1x4:8192, 128-row blocks: 8 splits 1114 [15: 939];
#: - where the former rule already gave one wave (8x32:1x1 and 1x32:8x1, 8 blocks: 16
#:   splits) it stays best (12, 24, 32 and 8 splits 1-35% slower); 32k caches: one wave
#:   equal or up to 3% faster.
#: MIN_SPLIT_TILES 1: B = 1 MQA 8k (one block) 32 splits of 2 tiles 383 GB/s, 64 of one
#: 367 in run 1, but 387 vs 383 in run 2, and at 32k 128 splits of 2 tiles lost 8-9% to
#: 132 (run 2, all three layouts: the combine's narrower column chunks, more blocks).
#: The combine reads back every split's partial state (acc, m, l per row): that traffic
#: may reach at most COMBINE_SHARE of the K/V bytes.
MIN_SPLIT_TILES = 1
COMBINE_SHARE = 0.5
#: A cache of at most this many key tiles is never split (issue 34, the host path): a
#: split plan is two launches and three workspaces, and on an H200 each ct.launch costs
#: 4.4 us plus ~1.3 us a tensor argument and each torch.empty ~4.9 us of host time
#: (results/issue34-host-h200-2026-11-28), while a block walks two key tiles in about
#: what the combine's own launch takes on the GPU. spak.fmha_kvcache at 1x32:8 heads over
#: 256 keys was 62 us an eager call on the H200 against SDPA's 19-30. Not yet timed on
#: the GPU against two splits (.gpujobs/i34.sh times both, CUDA-graph replays).
SHORT_CACHE_TILES = 2
#: The combine holds every split of a row chunk in registers: at most this many floats,
#: half of it once the split tile reaches COMBINE_WIDE_SPLITS. sm_90 (tileiras 13.4,
#: occupancy hint 4): 64 x 128 and 256 x 32 compile without spill, 128 x 64 spills 200
#: B/thread, 128 x 32 does not; H100, the whole call at 66 splits, 128 x 64 -> 128 x 32
#: (results/decode-splits-h100-2026-11-27, combine-probe; outputs bit-identical): MQA Sq 4
#: batch 1 890 -> 1531 GB/s (131072 keys), 345 -> 813 (32768), 581 -> 1193 (65536); MQA
#: Sq 1 1370 -> 1693; Hkv 2 Sq 4 1403 -> 2142.
COMBINE_FLOATS = 8192
COMBINE_WIDE_SPLITS = 128
#: Split counts of (COMBINE_POW2_CAP, 2 * COMBINE_POW2_CAP) round down to the cap: past it
#: the combine's split tile doubles (a power of two) for a few more splits. H100, batch-1
#: MQA Sq 4 (two query tiles a split, results/decode-splits-h100-2026-11-27): 64 splits
#: 1757-1796 GB/s vs the rule's 66 at 1531 (131072 keys, with the tiling above) and
#: 1404-1426 vs 1193 (65536 keys).
COMBINE_POW2_CAP = 64
LAUNCH_NAMES = ("decode", "decode.split", "decode.combine", "varlen")
#: The most elements an array of a 32-bit-index launch may have (gpu.plan.INT32_MAX: past
#: it gpu.plan._launch takes the int64 twin); batch_chunks keeps every chunk's within it.
INDEX_LIMIT = 2**31 - 1
DEFAULT_SMS = 132            # H100 SXM; the API passes the device's own count


def default_decode_tiles(head_dim: int, arch: str = "sm_90") -> dict[str, int]:
    """{"TILE_N", "MAX_ROWS", "PAGE_MODE"} for a head dim: 128 keys per step up to
    D = 128 (a K and a V tile of 32 KB in flight per step: decode is bound by the memory
    system), 64 beyond; pages smaller than a tile in one gathered load (PAGE_MODE 1).
    Untuned first guesses (the same for every arch) until the sweeper measures them."""
    d = _tile_width(_check_int("head_dim", head_dim, 1, MAX_HEAD_DIM))
    return {"TILE_N": 128 if d <= 128 else 64, "MAX_ROWS": 64, "PAGE_MODE": 1,
            "OCCUPANCY": 0, "KT_FORM": KT_AUTO, "NUM_CTAS": 0, "LAT": 0,
            "PAGE_AHEAD": AHEAD_AUTO, "GROUP_PAD": 1, "INDEX32": 1, "TN_FIT": 1}


def default_varlen_tiles(head_dim: int, arch: str = "sm_90", causal: bool = False) -> dict:
    """The varlen kernel's config where the tuned store has none: spak.fmha's default tiles
    for the head dim (gpu.plan.default_tiles), no hints, and VARLEN_HEADS query heads a
    block. spak.fmha_varlen looks up the store as spak.fmha does (spak.api.resolve_tiles),
    so a packed batch and the padded one launch the same tiles."""
    from .plan import default_tiles
    t = default_tiles(head_dim, arch, causal)
    return {"TILE_M": t["TILE_M"], "TILE_N": t["TILE_N"], "LAT_K": 0, "LAT_V": 0,
            "OCCUPANCY": 0, "NUM_CTAS": 0, "HEADS": VARLEN_HEADS[bool(causal)]}


def row_tiles(num_q_heads: int, num_kv_heads: int, seq_q: int, max_rows: int,
              pad: bool = True) -> tuple[int, int]:
    """(GT, SQ_T): query heads and query positions per block (powers of two).

    pad (tiles["GROUP_PAD"], the default): the tiling with the fewest blocks per kv head,
    cdiv(group, GT) x cdiv(Sq, SQ_T) (each reads the kv head's K/V once a split), the
    group's last tile padded with masked rows where GT does not divide it; ties go to the
    larger GT. A group of 7 -> GT 8 (one block); 12 -> 16; 71 at Sq 1 -> two tiles of 64
    (one of 128 at max_rows 128); 71 at Sq 4 -> 16 heads x 4 queries (5 blocks, not
    2 x 4 of 64 x 1). A power-of-two group gets the former tiling. pad False: GT is the
    largest power of two dividing the group (the former rule: a group of 6 heads takes 3
    blocks of 2, of 7 seven of 1), capped at max_rows. SQ_T covers Sq, between
    MIN_ROWS / GT (tensor-core M) and max_rows / GT (registers)."""
    group = num_q_heads // num_kv_heads

    def sq_tile(gt):
        return min(max(1 << max(seq_q - 1, 0).bit_length(), MIN_ROWS // gt),
                   max(max_rows // gt, 1))
    if not pad:
        gt = min(group & -group, max_rows)
        return gt, sq_tile(gt)
    best = None
    gt = 1
    while gt <= max(max_rows, 1):
        sq_t = sq_tile(gt)
        key = (-(-group // gt) * -(-seq_q // sq_t), -gt)
        if best is None or key < best[0]:
            best = (key, gt, sq_t)
        if gt >= group:                       # larger tiles only add padding
            break
        gt *= 2
    return best[1], best[2]


def head_tiles(num_q_heads: int, num_kv_heads: int, gt: int) -> int:
    """Head tiles of a launch: cdiv(group, GT) for each kv head (the last one padded where
    GT does not divide the group)."""
    group = num_q_heads // num_kv_heads
    return num_kv_heads * -(-group // gt)


def choose_kt_form(num_q_heads: int, num_kv_heads: int, seq_q: int, page: int,
                   tile_n: int) -> int:
    """The split kernel's KT_FORM where tiles leave it to the plan (KT_AUTO): keys_vt (2)
    for one query per sequence with a large KV group (16+ query heads a kv head: 32 rows
    a block) over a paged cache whose pages are smaller than a key tile (gathered: the
    rows form would transpose the gathered K in registers), else rows (0). H100, Hq 32,
    D 128, fp16, caches 8k-128k (results/decode-h100-2026-11-24c): MQA 16-key pages
    701-736 -> 1308-2722 GB/s (the gathered K's transpose gone); MQA contiguous within
    noise either way, GQA 4:1 16-key pages -2..+6% (left at 0); Sq = 4: keys forms
    0.5-0.9x of rows at every batch (64 and 128 rows). Pages of a tile or more: rows,
    since the page ids are looked up a tile ahead (choose_page_ahead): H200, MQA Sq 1,
    256-key pages, rows / keys_vt 1.08-1.17 on 5 shapes, 0.99-1.00 of contiguous
    (results/decode-paged-h200-2026-11-27 run 2); H100 1.02-1.09, 0.98-1.00 of contiguous
    (results/decode-paged-h100-2026-11-27 run 3). With the in-step look-up, H100 run c
    had read keys_vt -3..+6%."""
    group = num_q_heads // max(num_kv_heads, 1)
    if seq_q == 1 and group >= 16 and 0 < page < tile_n:
        return 2
    return 0


def choose_page_ahead(page: int, tile_n: int, form: int, page_mode: int = 1) -> bool:
    """Whether the split kernel looks a paged cache's page ids up one key tile ahead
    (tiles["PAGE_AHEAD"] = AHEAD_AUTO): where a tile lies in one page (page >= TILE_N: one
    table load a step, on which both of the step's K/V boxes wait), for gathered tiles of
    several pages in the keys_vt form, and for boxes a page (PAGE_MODE 0); not for
    gathered tiles in the rows form. Ahead / in-step, D 128, fp16, Hq 32, 5 shuffled
    rounds, results/decode-paged-h100-2026-11-27 (H100, runs 3-5; H200 runs 1-2 in
    brackets): 256-key pages GQA/MHA 1.04-1.15 [1.17-1.39], MQA 1.04-1.16 [1.06-1.13];
    16-key gathered tiles in keys_vt (MQA Sq 1) 1.02-1.11 [1.00-1.13], in rows 0.97-1.00
    [0.97-1.00]; 16-key boxes 1.06-1.54 (still 0.34-0.92 of the gather)."""
    if page <= 0:
        return False
    return page >= tile_n or (form == 2 and page_mode == 1) or page_mode == 0


def choose_num_splits(blocks: int, key_tiles: int, num_sms: int, *, kv_bytes: int,
                      partial_bytes: int) -> int:
    """Key splits for `blocks` (batch x head tiles x query tiles) blocks over `key_tiles`
    tiles of cache capacity: one wave of blocks rounded down (num_sms // blocks, at least
    1), at least MIN_SPLIT_TILES tiles a split, at most MAX_SPLITS, and the combine's
    traffic (2 x splits x partial_bytes: written, then read) at most COMBINE_SHARE of
    the K/V bytes; a count just past COMBINE_POW2_CAP rounds down to it. From the
    capacity, not the lengths: those live on the device (reading them would cost a sync
    and break CUDA graph capture). At most SHORT_CACHE_TILES tiles: one split."""
    if blocks <= 0 or key_tiles <= SHORT_CACHE_TILES:
        return 1
    want = min(max(num_sms // blocks, 1), max(key_tiles // MIN_SPLIT_TILES, 1))
    combine_cap = int(COMBINE_SHARE * kv_bytes // max(2 * partial_bytes, 1))
    n = max(1, min(want, MAX_SPLITS, combine_cap))
    if COMBINE_POW2_CAP < n < 2 * COMBINE_POW2_CAP:
        n = COMBINE_POW2_CAP
    return n


def auto_splits(B: int, Hq: int, Hkv: int, Sq: int, capacity: int, tile_n: int,
                max_rows: int, num_sms: int, head_dim: int = 128,
                head_dim_v: Optional[int] = None, esize: int = 2, pad: bool = True) -> int:
    """The split count plan_decode chooses when none is given (capacity: the cache's keys
    per sequence, Sk_max or max_pages x page_size; pad: tiles["GROUP_PAD"])."""
    dv = head_dim if head_dim_v is None else head_dim_v
    gt, sq_t = row_tiles(Hq, Hkv, Sq, max_rows, pad)
    q_tiles = -(-Sq // sq_t)
    blocks = B * head_tiles(Hq, Hkv, gt) * q_tiles
    return choose_num_splits(
        blocks, -(-capacity // tile_n), num_sms,
        kv_bytes=B * Hkv * capacity * (head_dim + dv) * esize,
        partial_bytes=B * Sq * Hq * (_tile_width(dv) + 2) * 4)


def combine_tiles(splits: int, head_dim_v: int) -> tuple[int, int]:
    """(SPLITS_T, DV_T) of the combine: the split count rounded up to a power of two, and
    the output columns per block such that a row chunk of every split fits
    COMBINE_FLOATS registers' worth (half of it from COMBINE_WIDE_SPLITS splits; at least
    32 columns: 64-byte output boxes)."""
    splits_t = 1 << max(splits - 1, 0).bit_length()
    dv = _tile_width(head_dim_v)
    floats = COMBINE_FLOATS if splits_t < COMBINE_WIDE_SPLITS else COMBINE_FLOATS // 2
    return splits_t, min(dv, max(32, floats // splits_t))


def plan_decode(q, k_cache, v_cache, cache_seqlens, out, *,
                block_table=None,
                causal: bool = False,
                scale: Optional[float] = None,
                num_splits: Optional[int] = None,
                tiles: Optional[dict] = None,
                num_sms: int = DEFAULT_SMS,
                alloc: Optional[Callable[[tuple, str], Any]] = None) -> list[Launch]:
    """Launches computing decode attention into ``out`` (layouts in the module docstring).

    causal: bottom-right (query i of a sequence of length L sees keys j <= i + L - Sq);
    only matters for Sq > 1. scale: default 1/sqrt(D), any finite number.
    num_splits: None (choose_num_splits) or an int in [1, MAX_SPLITS].
    tiles: {"TILE_N": 16..256, "MAX_ROWS": 16..256 (powers of two), "PAGE_MODE": 0 or 1
    (PAGE_MODES), "OCCUPANCY": 0..4 (the split kernel's occupancy hint, 0: none),
    "KT_FORM": -1..2 (KT_FORMS: rows or keys in the tensor cores' M; -1 KT_AUTO:
    choose_kt_form), "NUM_CTAS": 0, 1, 2 or 4 (the split kernel's num_ctas hint, 0:
    none), "LAT": 0..10 (the K/V loads' latency hint, 0: none), "PAGE_AHEAD": -1..1
    (paged: page ids looked up one key tile ahead, 1, or in the step, 0; -1 AHEAD_AUTO:
    choose_page_ahead), "GROUP_PAD": 0 or 1 (row_tiles: 1 pads a group no power of two
    divides to whole tiles, 0 the former power-of-two split), "INDEX32": 0 or 1 (1: a
    contiguous cache past INDEX_LIMIT elements is planned per batch range, batch_chunks,
    every launch 32-bit indexed; 0: one int64-indexed plan), "TN_FIT": 0 or 1 (1: the rows
    form's TILE_N lowered where fit_tile_n says sm_90 spills; 0: as given)};
    default default_decode_tiles(D). With a paged cache of pages
    concatenated (PAGE_MODE 0) a tile spans at most 8 pages.
    alloc(shape, "float32") makes the split workspaces; may be omitted for numpy q.
    Returns [] when there is nothing to compute (B, Sq or Hq is 0).
    """
    B, Sq, Hq, D, Hkv, Dv, page, cap = _check_arrays(q, k_cache, v_cache, cache_seqlens, out,
                                                     block_table)
    causal = _check_bool("causal", causal)
    scale = _check_scale(scale, D)
    t = _check_tiles(tiles, D, page)
    num_sms = _check_int("num_sms", num_sms, 1, 1 << 16)
    if num_splits is not None:
        num_splits = _check_int("num_splits", num_splits, 1, MAX_SPLITS)
    if B * Sq * Hq == 0:
        return []
    chunks = _chunks(B, Sq, Hq, D, Hkv, Dv, cap, page, t)
    if chunks:              # each batch range's arrays within INDEX_LIMIT: 32-bit launches
        sub = dict(tiles or {}, INDEX32=0)
        return [L for b0, b1 in chunks for L in plan_decode(
            *(batch_slice(x, b0, b1) for x in (q, k_cache, v_cache, cache_seqlens, out)),
            causal=causal, scale=scale, num_splits=num_splits, tiles=sub, num_sms=num_sms,
            alloc=alloc)]
    gt, sq_t, tn, form, ahead, mode = _resolve(Hq, Hkv, Sq, D, page, cap, t)
    masked = (Hq // Hkv) % gt != 0           # the kernel's PAD form: masked padding rows
    occ, ctas, lat = t["OCCUPANCY"], t["NUM_CTAS"], t["LAT"]
    tiles_qh = head_tiles(Hq, Hkv, gt) * -(-Sq // sq_t)
    splits = num_splits or auto_splits(B, Hq, Hkv, Sq, cap, tn, t["MAX_ROWS"], num_sms, D,
                                       Dv, pad=t["GROUP_PAD"])
    alloc = _resolve_alloc(alloc, q)
    bt = cache_seqlens if block_table is None else block_table   # never read when contiguous
    d_t, dv_t = _tile_width(D), _tile_width(Dv)
    split_kernel = with_hints(_decode.decode_split_kernel, occupancy=occ or None,
                              num_ctas=ctas or None)
    if splits == 1:     # the split kernel's one-split block, without its workspaces
        one_kernel = with_hints(_decode.decode_one_kernel, occupancy=occ or None,
                                num_ctas=ctas or None)
        return [_launch(one_kernel, (tiles_qh, 1, B),
                        (q, k_cache, v_cache, cache_seqlens, bt, out,
                         scale, d_t, dv_t, sq_t, gt, tn, page, mode, causal, masked,
                         form, lat, ahead),
                        "decode")]
    # the splits of a row side by side: the combine reads them in one load (its view of
    # the same memory: [B * Sq, Hq, splits, Dv tile])
    acc = alloc((B, Sq, Hq, splits * dv_t), "float32")
    mx = alloc((B, Sq, Hq, splits), "float32")
    lx = alloc((B, Sq, Hq, splits), "float32")
    splits_t, cdv = combine_tiles(splits, Dv)
    return [_launch(split_kernel, (tiles_qh, splits, B),
                    (q, k_cache, v_cache, cache_seqlens, bt, out, acc, mx, lx,
                     scale, d_t, dv_t, sq_t, gt, tn, page, mode, True, causal, masked,
                     form, lat, ahead),
                    "decode.split"),
            _launch(_decode.decode_combine_kernel, (Hq * -(-Dv // cdv), Sq, B),
                    (acc.reshape((B * Sq, Hq, splits, dv_t)), mx, lx, out, splits_t, cdv),
                    "decode.combine")]


def _resolve(Hq, Hkv, Sq, D, page, cap, t) -> tuple:
    """(GT, SQ_T, TILE_N, KT_FORM, AHEAD, PAGE_MODE) a plan launches for checked tiles t:
    the row tiling, the form (choose_kt_form where KT_AUTO), TILE_N fitted to the rows form
    (fit_tile_n, where TN_FIT), the page look-up (choose_page_ahead where AHEAD_AUTO; only
    a paged cache has page ids, so contiguous plans keep one variant)."""
    gt, sq_t = row_tiles(Hq, Hkv, Sq, t["MAX_ROWS"], t["GROUP_PAD"])
    tn, form, ahead = t["TILE_N"], t["KT_FORM"], t["PAGE_AHEAD"]
    if form == KT_AUTO:
        form = choose_kt_form(Hq, Hkv, Sq, page, tn)
    if t["TN_FIT"] and form == 0:
        tn = fit_tile_n(tn, page, gt * sq_t, cap)
    if ahead == AHEAD_AUTO:
        ahead = choose_page_ahead(page, tn, form, t["PAGE_MODE"])
    else:
        ahead = bool(ahead) and page > 0
    return gt, sq_t, tn, form, ahead, t["PAGE_MODE"] if 0 < page < tn else 0


def _chunks(B, Sq, Hq, D, Hkv, Dv, cap, page, t):
    """batch_chunks of a contiguous plan with INDEX32 (None: one plan)."""
    if not t["INDEX32"] or page:
        return None
    return batch_chunks(B, _per_sequence(Sq, Hq, D, Hkv, Dv, cap))


def planned_splits(B: int, Sq: int, Hq: int, Hkv: int, D: int, Dv: int, capacity: int,
                   page: int, tiles: Optional[dict], num_sms: int = DEFAULT_SMS) -> int:
    """The split count plan_decode chooses (num_splits None) for sequence 0's launch: its
    batch range's (batch_chunks) and its fitted TILE_N (fit_tile_n). capacity: keys per
    sequence (Sk_max, or max_pages x page); page 0: contiguous."""
    t = _check_tiles(tiles, D, page)
    chunks = _chunks(B, Sq, Hq, D, Hkv, Dv, capacity, page, t)
    if chunks:
        B = chunks[0][1]
    gt, sq_t, tn, *_ = _resolve(Hq, Hkv, Sq, D, page, capacity, t)
    return auto_splits(B, Hq, Hkv, Sq, capacity, tn, t["MAX_ROWS"], num_sms, D, Dv,
                       pad=t["GROUP_PAD"])


def fit_tile_n(tile_n: int, page: int, rows: int, capacity: int) -> int:
    """TILE_N for the rows form (KT_FORM 0) where tiles["TN_FIT"] (the default): halved to
    64 for a gathered paged tile (page < TILE_N) that sm_90 compiles with spills at 128 keys,
    32 rows over 4+ pages, on caches of FIT_MIN_KEYS keys or more. tileiras 13.4, fp16, Sq 4
    causal, the split and one-split kernels (B/thread of stack at 128 -> 64 keys; 384
    threads x 168 registers unless noted): 32 rows, 16-key pages, D 128: 368-896 -> 0-64
    (Mixtral-8x22B's one-split kernel 896 -> 0, 256 threads x 255 registers); D 64: 464-496
    -> 0; 32-key pages, D 64: 760 -> 0. Left at 128: 32 rows over 2 pages (64-key pages, D
    128: 8 -> 240 at 64), 64 rows (Falcon-7B's 64 rows at D 64 over 64-key pages spill 272
    B at 128 and none at 64, yet 64 keys ran 1.20x slower on an H200), 128 rows.
    Measured (H200, 2026-11-28e, results/issue33-h200-2026-11-28e): Mixtral-8x22B
    32x48:8x4:4096x128 on 16-key pages 0.607 -> 0.287 ms at 64 keys; Llama-3.1-70B
    8x64:8x4:1024x128 (the same 32 rows over 8 pages, a 1k cache, 64 blocks) 0.0291 ->
    0.0331 ms, slower: hence FIT_MIN_KEYS (fitted on these two rows; between 1k and 4k
    unmeasured)."""
    if not 0 < page < tile_n or tile_n <= 64:
        return tile_n
    if rows == 32 and tile_n // page >= 4 and capacity >= FIT_MIN_KEYS:
        return 64
    return tile_n


#: fit_tile_n's least cache length (keys a sequence): below it a fitted 64-key tile's longer
#: loop lost more than the 128-key tile's spills (Llama-3.1-70B Sq 4 at 1k keys, H200)
FIT_MIN_KEYS = 2048


def _per_sequence(Sq, Hq, D, Hkv, Dv, cap) -> int:
    """The most elements one sequence adds to any array of a contiguous plan: its cache
    slice, its queries / outputs, or its split workspace at the most splits it can take."""
    dv_t = _tile_width(Dv)
    splits = min(MAX_SPLITS, max(-(-cap // 16), 1))
    return max(cap * Hkv * max(D, Dv), Sq * Hq * max(D, Dv), Sq * Hq * splits * dv_t)


def batch_chunks(B: int, per_sequence: int,
                 limit: Optional[int] = None) -> Optional[list[tuple[int, int]]]:
    """Batch ranges [(b0, b1), ...] whose arrays (per_sequence elements a sequence) stay
    within `limit` (default INDEX_LIMIT), or None where the whole batch does, or where one
    sequence alone passes it (then the plan is the int64-indexed twin). The ranges are
    near equal and, from 4 sequences on, multiples of 4, so a range's first int32 length
    (and every other array's first element) stays 16-byte aligned, as ct.launch's
    specialisation of a whole tensor assumes."""
    limit = INDEX_LIMIT if limit is None else limit
    if B * per_sequence <= limit:
        return None
    most = limit // per_sequence
    if most < 1:
        return None
    if most >= 4:
        most -= most % 4
    n = -(-B // most)
    size = -(-B // n)
    if most >= 4:
        size += -size % 4                  # still <= most: a multiple of 4 at least cdiv
    return [(b0, min(b0 + size, B)) for b0 in range(0, B, size)]


def batch_slice(x, b0: int, b1: int):
    """Sequences [b0, b1) of an array (a view, no copy): torch tensors, numpy arrays,
    sim.SimArray, and the compile stand-ins (dataclasses with a shape)."""
    if hasattr(x, "narrow"):                               # torch
        return x.narrow(0, b0, b1 - b0)
    if hasattr(x, "_root") and hasattr(x, "slice"):        # sim.SimArray: a view
        return x.slice(0, b0, b1)
    if dataclasses.is_dataclass(x):                        # a shape-only stand-in
        return dataclasses.replace(x, shape=(b1 - b0, *tuple(x.shape)[1:]))
    return x[b0:b1]                                        # numpy


def plan_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, *, max_seqlen_q: int,
                max_seqlen_k: int, causal: bool = False, scale: Optional[float] = None,
                tiles: Optional[dict] = None, arch: str = "sm_90") -> list[Launch]:
    """The launch computing attention over a packed variable-length batch into ``out``:

        out[cq[b] + i, h] = softmax(q[cq[b] + i, h] . K_b^T * scale) V_b,
        K_b = k[ck[b]:ck[b+1], h // (Hq/Hkv)], i < cq[b+1] - cq[b]

    q [total_q, Hq, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv], out [total_q, Hq, Dv]
    (fp16/bf16), cu_seqlens_q/k int32 [B+1] (ascending offsets from 0: device data,
    clamped by the kernel, not read here). max_seqlen_q: the longest query run (sizes the
    grid: a longer one is cut short); max_seqlen_k: the longest key run. With the totals
    they tell whether every run is a whole number of tiles (whole_tiles: the kernel's
    WHOLE form; a run longer than its max_seqlen then leaves other runs' rows undefined,
    where otherwise only its own rows past max_seqlen_q go unwritten). causal:
    bottom-right per sequence, query i sees keys j <= i + Lk - Lq.
    tiles: VARLEN_TILE_KEYS, missing keys from default_varlen_tiles (HEADS is rounded
    down to a divisor of Hq: the gcd). Returns [] when nothing is
    computed (no sequence, query or head, or max_seqlen_q == 0); with no key at all
    (total_k == 0) out is left to the caller (every row is 0)."""
    named = (("q", q), ("k", k), ("v", v), ("out", out))
    shapes = _shapes(named, 3, " [total, heads, head_dim]")
    Tq, Hq, D = shapes["q"]
    Tk, Hkv, Dk = shapes["k"]
    if shapes["v"][:2] != (Tk, Hkv):
        raise ValueError(f"k and v must agree in all but the last dim, got {shapes['k']} "
                         f"and {shapes['v']}")
    Dv = shapes["v"][2]
    if Dk != D:
        raise ValueError(f"q and k must have the same head dim, got {D} and {Dk}")
    _check_head_dims(D, Dv)
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k's heads ({Hkv})")
    if shapes["out"] != (Tq, Hq, Dv):
        raise ValueError(f"out must have shape {(Tq, Hq, Dv)} [total_q, Hq, Dv], got "
                         f"{shapes['out']}")
    cq = _shape("cu_seqlens_q", cu_seqlens_q)
    if len(cq) != 1 or cq[0] < 1:
        raise ValueError(f"cu_seqlens_q must be 1D [B+1], got shape {cq}")
    _check_int32_vector("cu_seqlens_q", cu_seqlens_q, cq)
    _check_int32_vector("cu_seqlens_k", cu_seqlens_k, cq)
    _check_inputs(named)
    max_q = _check_int("max_seqlen_q", max_seqlen_q, 0, 1 << 31)
    max_k = _check_int("max_seqlen_k", max_seqlen_k, 0, 1 << 31)
    causal = _check_bool("causal", causal)
    scale = _check_scale(scale, D)
    t = _check_varlen_tiles(tiles, D, arch, causal)
    tm, tn = t["TILE_M"], t["TILE_N"]
    B = cq[0] - 1
    if B == 0 or Tq == 0 or Hq == 0 or max_q == 0 or Tk == 0:
        return []
    raw_max, c_pow2 = raw_max_args(scale, False)
    kernel = with_hints(_fused.fmha_varlen_kernel, occupancy=t["OCCUPANCY"] or None,
                        num_ctas=t["NUM_CTAS"] or None)
    heads = math.gcd(t["HEADS"], Hq)              # a divisor of Hq
    return [_launch(kernel, (-(-max_q // tm), Hq // heads, B),
                    (q, k, v, out, cu_seqlens_q, cu_seqlens_k, scale, c_pow2, _tile_width(D),
                     _tile_width(Dv), tm, tn, causal, raw_max, Hq // Hkv, t["LAT_K"],
                     t["LAT_V"], heads, whole_tiles(Tq, Tk, B, max_q, max_k, tm, tn)),
                    "varlen")]


def whole_tiles(total_q: int, total_k: int, B: int, max_q: int, max_k: int, tile_m: int,
                tile_n: int) -> bool:
    """Every run a whole number of tiles, known from the shapes alone (the offsets are
    device data): total = B x max_seqlen makes every run max_seqlen long (none is longer,
    FlashAttention's promise), and max_seqlen a multiple of the tile. Then the varlen
    kernel leaves out its ragged-tile paths (fused.fmha_varlen_kernel, WHOLE)."""
    return (B > 0 and total_q == B * max_q and total_k == B * max_k
            and max_q % tile_m == 0 and max_k % tile_n == 0)


def _check_varlen_tiles(tiles, head_dim, arch, causal) -> dict:
    t = merge_tiles(tiles, default_varlen_tiles(head_dim, arch, causal), VARLEN_TILE_KEYS,
                    f"keys {VARLEN_TILE_KEYS} or None", _type_name)
    check_pow2_tiles(t, ("TILE_M", "TILE_N"))
    for key in ("LAT_K", "LAT_V"):
        _check_int(f"tiles['{key}']", t[key], 0, 10)
    # 0: no hint; with_hints checks the rest of each hint's range
    _check_int("tiles['OCCUPANCY']", t["OCCUPANCY"], 0, HINT_RANGES["occupancy"][1])
    _check_int("tiles['NUM_CTAS']", t["NUM_CTAS"], 0, HINT_RANGES["num_ctas"][1])
    _check_int("tiles['HEADS']", t["HEADS"], 1, 64)
    return t


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------
def _check_arrays(q, k_cache, v_cache, cache_seqlens, out, block_table):
    """Sizes (B, Sq, Hq, D, Hkv, Dv, page size or 0, capacity in keys); raises
    ValueError/TypeError naming the argument."""
    named = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out))
    shapes = _shapes(named, 4)
    B, Sq, Hq, D = shapes["q"]
    NB, S, Hkv, Dk = shapes["k_cache"]
    NBv, Sv, Hv, Dv = shapes["v_cache"]
    if (NBv, Sv, Hv) != (NB, S, Hkv):
        raise ValueError(f"k_cache and v_cache must agree in all but the last dim, got "
                         f"{shapes['k_cache']} and {shapes['v_cache']}")
    if Dk != D:
        raise ValueError(f"q and k_cache must have the same head dim, got {D} and {Dk}")
    _check_head_dims(D, Dv)
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of the cache's kv heads ({Hkv})")
    if shapes["out"] != (B, Sq, Hq, Dv):
        raise ValueError(f"out must have shape {(B, Sq, Hq, Dv)} [B, Sq, Hq, Dv], "
                         f"got {shapes['out']}")
    _check_int32_vector("cache_seqlens", cache_seqlens, (B,))
    if block_table is None:
        if NB != B:
            raise ValueError(f"k_cache batch ({NB}) must match q batch ({B}) for a "
                             f"contiguous cache [B, Sk_max, Hkv, D]")
        page, cap = 0, S
    else:
        bt = _shape("block_table", block_table)
        if len(bt) != 2 or bt[0] != B:
            raise ValueError(f"block_table must be 2D [B={B}, max_pages], got shape {bt}")
        _check_int32_vector("block_table", block_table, bt)
        page, cap = S, S * bt[1]
        if page < 16 or page & (page - 1):
            raise ValueError(f"page size (k_cache.shape[1]) must be a power of two >= 16 "
                             f"with block_table, got {page}")
    _check_inputs(named)
    return B, Sq, Hq, D, Hkv, Dv, page, cap


def _check_int32_vector(name, x, shape):
    got = _shape(name, x)
    if got != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {got}")
    if _dtype_name(x) != "int32":
        raise TypeError(f"{name} dtype must be int32, got {_dtype_name(x)}")
    _check_contiguous(name, x)


def _check_tiles(tiles, head_dim, page) -> dict:
    """The tiles dict merged over default_decode_tiles, each value checked (ValueError /
    TypeError naming the key) and normalised (ints; GROUP_PAD, INDEX32, TN_FIT bools)."""
    t = merge_tiles(tiles, default_decode_tiles(head_dim), TILE_KEYS,
                    f"keys {TILE_KEYS} or None", _type_name)
    check_pow2_tiles(t, ("TILE_N", "MAX_ROWS"))
    out = {"TILE_N": int(t["TILE_N"]), "MAX_ROWS": int(t["MAX_ROWS"])}
    out["OCCUPANCY"] = _check_int("tiles['OCCUPANCY']", t["OCCUPANCY"], 0, max(OCCUPANCIES))
    mode = out["PAGE_MODE"] = _check_int("tiles['PAGE_MODE']", t["PAGE_MODE"], 0,
                                         max(PAGE_MODES))
    tn = out["TILE_N"]
    if page and mode == 0 and tn > 8 * page:
        raise ValueError(f"tiles['TILE_N'] ({tn}) may span at most 8 pages of {page} "
                         f"with tiles['PAGE_MODE'] = 0")
    out["KT_FORM"] = _check_int("tiles['KT_FORM']", t["KT_FORM"], KT_AUTO, max(KT_FORMS))
    ctas = out["NUM_CTAS"] = _check_int("tiles['NUM_CTAS']", t["NUM_CTAS"], 0,
                                        max(NUM_CTAS_VALUES))
    if ctas not in NUM_CTAS_VALUES:
        raise ValueError(f"tiles['NUM_CTAS'] must be one of {NUM_CTAS_VALUES}, got {ctas}")
    out["LAT"] = _check_int("tiles['LAT']", t["LAT"], 0, 10)
    out["PAGE_AHEAD"] = _check_int("tiles['PAGE_AHEAD']", t["PAGE_AHEAD"], AHEAD_AUTO, 1)
    for key in ("GROUP_PAD", "INDEX32", "TN_FIT"):
        out[key] = bool(_check_int(f"tiles['{key}']", t[key], 0, 1))
    return out


def _resolve_alloc(alloc, q):
    if alloc is not None:
        if not callable(alloc):
            raise TypeError(f"alloc must be callable(shape, kind), got {alloc!r}")
        return alloc
    import numpy as np
    if type(q) is not np.ndarray and type(q).__name__ != "SimArray":
        raise ValueError("alloc(shape, kind) is required unless q is a numpy array "
                         f"(q is {type(q).__name__})")
    return lambda shape, kind: np.zeros(shape, dtype=np.float32)
