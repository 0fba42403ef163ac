"""Decode attention over a KV cache on a GPU, in one go: correctness vs float64, agreement
with the CPU simulator, CUDA-graph capture and torch.compile, then bandwidth against SDPA's
backends and a device-to-device copy measured in the same run (issue 18).

    python ci/decode_bench.py --out DIR [--quick] [--jobs 8] [--grid full|focus] [--varlen]

Writes DIR/rows.jsonl (one JSON object per check or timing), DIR/summary.md (tables) and
prints the summary last. Bandwidth = bytes of K and V read for every sequence's length,
plus Q and O, over the median time of one call; calls are timed as CUDA-graph replays over
enough rotated input copies that the working set passes the 50 MB L2. SDPA peers get the
cache already gathered to a contiguous [B, Hkv, L, D] (enable_gqa=True); for Sq > 1 they
run non-causal (SDPA's is_causal is top-left when Sq != Sk), ours bottom-right causal.

--grid focus times the shapes the 2026-11-24 run left short (batch 1 with MQA/GQA, 16-key
pages) and a few that were fine, with knobs (page modes, key tiles, split counts) beside
the defaults. --varlen adds spak.fmha_varlen: checks against float64 and the simulator on
ragged batches, and timings against spak.fmha and SDPA on the same batch padded.

Before anything is timed, every kernel variant is compiled in parallel worker processes
(cuTile's disk cache is shared): each worker launches the real shapes with every length 0,
so no cache byte is read and the caches need no memory (as_strided views of one element).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import zlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KV_CAP = 4 * 2**30           # K+V bytes per timed case (SDPA's gathered copy doubles it)
L2_BYTES = 256 * 2**20       # rotate inputs until the working set passes this
#: at least this many calls a graph replay (input sets cycled): a replay's fixed cost
#: (~15 us, results/decode-h100-2026-11-24e) spread over a single call read caches of
#: >= 256 MB 5-9% low; the same set again is still a DRAM read (it alone passes L2_BYTES)
MIN_CALLS = 4


# ------------------------------------------------------------------------------ shapes

def timing_grid(quick: bool) -> list[dict]:
    """Issue 18's grid, fp16: B 1/8/64, Hq 32, Hkv 32/8/1, D 128, Sq 1/4, caches 1k-128k,
    contiguous and paged (16, 256), K+V <= KV_CAP; bf16 on a slice of it."""
    cases = []
    for B in (1, 8, 64):
        for hkv in (32, 8, 1):
            for sq in (1, 4):
                for sk in (1024, 8192, 32768, 131072):
                    if B * sk * hkv * 128 * 4 > KV_CAP:
                        continue
                    if quick and (sk not in (8192, 32768) or B == 64):
                        continue
                    for page in (0, 16, 256):
                        cases.append(dict(B=B, Hq=32, Hkv=hkv, Sq=sq, Sk=sk, D=128,
                                          page=page, dtype="fp16"))
    for hkv in (8, 1):
        for sq in (1, 4):
            for page in (0, 16):
                cases.append(dict(B=8, Hq=32, Hkv=hkv, Sq=sq, Sk=32768, D=128, page=page,
                                  dtype="bf16"))
    # a few knobs beside the defaults (keys per step, split counts)
    extra = {"tn64": {"tiles": {"TILE_N": 64}}, "splits8": {"num_splits": 8},
             "splits32": {"num_splits": 32}, "splits64": {"num_splits": 64}}
    for B in (1, 8):
        for page in (0, 16):
            cases.append(dict(B=B, Hq=32, Hkv=8, Sq=1, Sk=32768, D=128, page=page,
                              dtype="fp16", extra=extra))
    return cases


def _case(B, hkv, sq, sk, page=0, dtype="fp16", extra=None):
    c = dict(B=B, Hq=32, Hkv=hkv, Sq=sq, Sk=sk, D=128, page=page, dtype=dtype)
    if extra:
        c["extra"] = extra
    return c


def focus_grid() -> list[dict]:
    """The shapes the first run left short (B = 1 MQA/GQA, MQA at B = 8, 16-key pages,
    with contiguous beside them for the paged ratio), a few that were fine (regression),
    and knobs: the page modes on 16-key pages, split counts at B = 1."""
    pages = {"boxes": {"tiles": {"PAGE_MODE": 0}}, "gather": {"tiles": {"PAGE_MODE": 1}}}
    splits = {f"splits{n}": {"num_splits": n} for n in (32, 128)}
    cases = [_case(1, 1, 1, 8192), _case(1, 1, 1, 32768, extra=splits),
             _case(1, 1, 1, 131072), _case(1, 1, 1, 32768, 16), _case(1, 1, 1, 32768, 256),
             _case(1, 1, 4, 32768), _case(1, 1, 4, 131072),
             _case(1, 8, 1, 8192), _case(1, 8, 1, 32768), _case(1, 8, 4, 32768),
             _case(8, 1, 1, 8192), _case(8, 1, 1, 32768), _case(8, 1, 4, 32768)]
    # 16-key pages in every mode, their contiguous twins
    cases += [_case(8, 32, 1, 32768), _case(8, 32, 1, 32768, 16, extra=pages),
              _case(8, 8, 1, 32768), _case(8, 8, 1, 32768, 16, extra=pages),
              _case(1, 8, 1, 32768, 16, extra=pages), _case(8, 1, 4, 32768, 16, extra=pages),
              _case(64, 8, 4, 8192), _case(64, 8, 4, 8192, 16, extra=pages)]
    # fine in the first run
    cases += [_case(64, 32, 4, 1024), _case(1, 32, 1, 32768), _case(64, 8, 1, 8192)]
    return cases


def goal_grid(forms: bool = False) -> list[dict]:
    """The issue's grid where the goal applies (cache >= 8k), fp16: B 1/8/64, Hkv
    32/8/1, Sq 1/4, contiguous and 16/256-key pages, K+V <= KV_CAP. forms: the MQA
    shapes (and GQA with 16-key pages) also timed with the keys-in-M forms (FORM_KNOBS)."""
    cases = [c for c in timing_grid(False) if c["Sk"] >= 8192 and "extra" not in c
             and c["dtype"] == "fp16"]
    if forms:
        for c in cases:
            if c["Hkv"] == 1 or (c["Hkv"] == 8 and c["page"] == 16):
                c["extra"] = {k: v for k, v in FORM_KNOBS.items()
                              if (c["Sq"] > 1 or "rows128" not in k)
                              and (c["page"] == 16 or "boxes" not in k)}
    return cases


def models_grid(dtypes=("fp16",)) -> list[dict]:
    """The fmha_decode family's "models-small" set (issue 33: served models' head
    configurations), every sequence at full length (this bench times equal lengths only;
    `spak run --shapes models-small` times the ragged ones): spak.fmha_kvcache beside
    SDPA and, where Sq = 1 on a contiguous cache, TileGym's decode."""
    from spak.families.fmha_decode import FAMILY
    cases, seen = [], set()
    for p in FAMILY.select(["models-small"], dtype="fp16"):
        key = (p.B, p.Hq, p.Hkv, p.Sq, p.Sk, p.D, p.page)
        if key in seen:
            continue
        seen.add(key)
        for dt in dtypes:
            cases.append(dict(B=p.B, Hq=p.Hq, Hkv=p.Hkv, Sq=p.Sq, Sk=p.Sk, D=p.D,
                              page=p.page, dtype=dt, model=p.model))
    return cases


#: the split kernel's KT_FORM (rows or keys in the tensor cores' M) as timing knobs
FORM_KNOBS = {"kt0": {"tiles": {"KT_FORM": 0}}, "kt1": {"tiles": {"KT_FORM": 1}},
              "kt2": {"tiles": {"KT_FORM": 2}},
              "kt1tn64": {"tiles": {"KT_FORM": 1, "TILE_N": 64}},
              "kt2tn64": {"tiles": {"KT_FORM": 2, "TILE_N": 64}},
              "kt1rows128tn64": {"tiles": {"KT_FORM": 1, "MAX_ROWS": 128, "TILE_N": 64}},
              "kt2rows128tn64": {"tiles": {"KT_FORM": 2, "MAX_ROWS": 128, "TILE_N": 64}},
              "kt1boxes": {"tiles": {"KT_FORM": 1, "PAGE_MODE": 0}},
              "kt2boxes": {"tiles": {"KT_FORM": 2, "PAGE_MODE": 0}}}


def tune_grid() -> list[dict]:
    """The shapes short of the goal with cache >= 8k (B = 1 MQA/GQA, MQA at B = 8 and 64,
    Sq = 4 with MQA, 16-key pages) and two that reach it, each with the knobs of the
    split kernel beside the default: the occupancy hint (2: 128 threads, two blocks per
    SM, instead of 256 threads x 255 registers, one block), 64-key tiles, 16-row blocks
    (MQA: two head tiles of one kv head, no register spills), 128-row blocks (MQA Sq = 4:
    K/V read once instead of twice), and split counts with the occupancy hint."""
    o2 = {"OCCUPANCY": 2}
    base = {"occ2": {"tiles": o2}, "tn64": {"tiles": {"TILE_N": 64}},
            "occ2tn64": {"tiles": {**o2, "TILE_N": 64}},
            "rows16": {"tiles": {"MAX_ROWS": 16}}, "occ2rows16": {"tiles": {**o2, "MAX_ROWS": 16}}}

    def splits(ns, tiles=o2):
        return {f"occ2s{n}": {"tiles": tiles, "num_splits": n} for n in ns}
    b1 = splits((16, 32, 66, 132, 264))
    b8 = splits((8, 16, 33, 66))
    pages = {"occ2": {"tiles": o2}, "boxes": {"tiles": {"PAGE_MODE": 0}},
             "occ2boxes": {"tiles": {**o2, "PAGE_MODE": 0}}, "tn64": {"tiles": {"TILE_N": 64}},
             "occ2tn16": {"tiles": {**o2, "TILE_N": 16}}}
    rows128 = {"rows128": {"tiles": {"MAX_ROWS": 128}},
               "occ2rows128": {"tiles": {**o2, "MAX_ROWS": 128}}}
    cases = [_case(1, 1, 1, 8192, extra={**base, **b1}), _case(1, 1, 1, 32768, extra={**base, **b1}),
             _case(1, 1, 1, 131072, extra={**base, **b1}),
             _case(1, 8, 1, 8192, extra={**base, **b1}), _case(1, 8, 1, 32768, extra={**base, **b1}),
             _case(8, 1, 1, 8192, extra={**base, **b8}), _case(8, 1, 1, 32768, extra={**base, **b8}),
             _case(64, 1, 1, 8192, extra=base),
             _case(1, 1, 4, 32768, extra={**base, **rows128, **b1}),
             _case(8, 1, 4, 32768, extra={**base, **rows128, **b8}),
             _case(1, 8, 4, 32768, extra={**base, **b1}),
             _case(8, 8, 1, 32768, extra={**base, **b8}), _case(8, 32, 1, 32768, extra=base)]
    # 16-key pages (contiguous twins above or here)
    cases += [_case(8, 32, 1, 32768, 16, extra=pages), _case(8, 8, 1, 32768, 16, extra=pages),
              _case(1, 8, 1, 32768, 16, extra=pages), _case(8, 1, 4, 32768, 16, extra=pages),
              _case(64, 8, 4, 8192), _case(64, 8, 4, 8192, 16, extra=pages),
              _case(1, 1, 1, 32768, 256, extra={"occ2": {"tiles": o2}})]
    return cases


#: a cluster of two CTAs a block (tiles["NUM_CTAS"] 2): 128 rows (MQA Sq 4: K/V read once,
#: each CTA 64 rows, no spill on sm_90) or the default 64; the 128-row block without the
#: cluster (776 B/thread of spill) as the reference
CTA_KNOBS = {"r128c2": {"tiles": {"MAX_ROWS": 128, "NUM_CTAS": 2}},
             "r128c2tn64": {"tiles": {"MAX_ROWS": 128, "NUM_CTAS": 2, "TILE_N": 64}},
             "c2": {"tiles": {"NUM_CTAS": 2}},
             "r128": {"tiles": {"MAX_ROWS": 128}},
             "r128c2l2": {"tiles": {"MAX_ROWS": 128, "NUM_CTAS": 2, "LAT": 2}},
             "r128c2l5": {"tiles": {"MAX_ROWS": 128, "NUM_CTAS": 2, "LAT": 5}}}
def former_splits(c) -> int:
    """The split count of the rule before 2026-11-24d (1-4 waves of splits of a
    sixteenth of the cache, 4-16 tiles each, at least one wave) for a grid case at the
    default tiles: the baseline the new one-wave rule is timed against in one run."""
    from spak.gpu.plan_decode import (COMBINE_SHARE, MAX_SPLITS, default_decode_tiles,
                                      head_tiles, row_tiles)
    t = default_decode_tiles(c["D"])
    gt, sq_t = row_tiles(c["Hq"], c["Hkv"], c["Sq"], t["MAX_ROWS"])
    blocks = c["B"] * head_tiles(c["Hq"], c["Hkv"], gt) * -(-c["Sq"] // sq_t)
    key_tiles, sms = -(-c["Sk"] // t["TILE_N"]), 132
    kv_bytes = c["B"] * c["Hkv"] * c["Sk"] * 2 * c["D"] * 2
    partial = c["B"] * c["Sq"] * c["Hq"] * (c["D"] + 2) * 4
    waves = (4 * sms + blocks // 2) // blocks
    tiles = min(max(key_tiles // 16, 4), 16)
    want = min(waves, max(sms // blocks, -(-key_tiles // tiles)))
    cap = int(COMBINE_SHARE * kv_bytes // max(2 * partial, 1))
    return max(1, min(want, key_tiles, MAX_SPLITS, cap))


def goal_prev_grid() -> list[dict]:
    """The goal grid at the defaults, with the former split rule's count as the knob
    "prev" wherever the two rules differ (the same kernels otherwise)."""
    from spak.gpu.plan_decode import auto_splits
    cases = goal_grid(False)
    for c in cases:
        new = auto_splits(c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], 128, 64, 132, c["D"])
        old = former_splits(c)
        if old != new:
            c["extra"] = {"prev": {"num_splits": old}}
    return cases


def recheck_grid() -> list[dict]:
    """2026-11-24d run 3: the shapes where run 2 read the one-wave rule >= 3% slower than
    the former one on a contiguous cache (while their paged twins gained, and run 1 read
    the opposite on two of them), each timed twice in the grid, and within a case three
    times per rule (explicit counts), interleaved: new, prev, new2, prev2, new3, prev3."""
    from spak.gpu.plan_decode import auto_splits
    shapes = [(8, 32, 4, 8192, 0), (8, 8, 1, 8192, 0), (8, 8, 4, 8192, 0),
              (1, 32, 1, 8192, 0), (1, 32, 4, 8192, 0), (64, 1, 1, 8192, 0),
              (8, 8, 1, 8192, 16), (64, 1, 4, 8192, 0)]
    cases = []
    for _ in range(2):
        for B, hkv, sq, sk, page in shapes:
            c = _case(B, hkv, sq, sk, page)
            new = {"num_splits": auto_splits(B, 32, hkv, sq, sk, 128, 64, 132, 128)}
            old = {"num_splits": former_splits(c)}
            c["extra"] = {"prev": old, "new2": new, "prev2": old, "new3": new, "prev3": old}
            cases.append(c)
    return cases


def goal_rep_grid() -> list[dict]:
    """2026-11-24e (issue 18): the goal grid at the defaults, with the default timed a
    second time ("rep", after the first: both after time_case's discarded timing), so the
    first-timing penalty can be read per shape (spak vs rep) and the count at the goal
    given both ways."""
    cases = goal_grid(False)
    for c in cases:
        c["extra"] = {"rep": {}}
    return cases


def goal_ahead_grid() -> list[dict]:
    """2026-11-27 (issue 18): the goal grid at the defaults (page ids one tile ahead where
    gpu.plan_decode.choose_page_ahead says so), the paged shapes also with the former
    in-step look-up ("step": PAGE_AHEAD 0), the contiguous ones timed twice ("rep")."""
    cases = goal_grid(False)
    for c in cases:
        c["extra"] = {"step": {"tiles": {"PAGE_AHEAD": 0}}} if c["page"] else {"rep": {}}
    return cases


def goal_bf16_grid() -> list[dict]:
    """2026-11-27b (issue 18): the goal grid in bf16 (the issue's grid names both dtypes;
    every earlier timing run was fp16), at the defaults, peers as in goal."""
    return [dict(c, dtype="bf16") for c in goal_grid(False)]


def r27_grid() -> list[dict]:
    """2026-11-27 (issue 18): batch-1 MQA (Sq 4 and 1) and B 8 MQA Sq 4, where the goal
    grid stays furthest from the copy: split counts beside the rule's (which the combine
    cap holds at 15 for 1x32:1x4:8192), and 128-row blocks (one query tile, K/V read once
    a split) with their own counts."""
    r128 = {"MAX_ROWS": 128}
    grid = [((1, 1, 4, 8192), (32, 64), (64, 132)), ((1, 1, 4, 32768), (32, 132), (66, 132)),
            ((1, 1, 4, 131072), (33, 132), (66, 132)), ((8, 1, 4, 8192), (4, 16), (8, 16)),
            ((8, 1, 4, 32768), (4, 16), (8, 16)), ((1, 1, 1, 8192), (32, 128), ()),
            ((1, 1, 1, 32768), (66,), ()), ((1, 1, 1, 131072), (66,), ())]
    cases = []
    for (B, hkv, sq, sk), ns, ns128 in grid:
        extra = _splits(*ns)
        if sq > 1:
            extra["r128"] = {"tiles": r128}
            extra.update(_splits(*ns128, tiles=r128))
        cases.append(_case(B, hkv, sq, sk, extra=extra))
    return cases


def r27b_grid() -> list[dict]:
    """2026-11-27 (issue 18), after r27: MQA Sq 4 at B 1 read 906 GB/s with the rule's 66
    splits of a 131072-key cache, 1300 with 33 and 1390 with 132 (one timing each): the
    split count over a finer range there and at 65536 keys, the combine cap at 8192."""
    grid = [((1, 1, 4, 131072), (22, 33, 44, 55, 77, 88, 99, 110, 132)),
            ((1, 1, 4, 65536), (33, 44, 88, 132)), ((1, 1, 4, 8192), (32, 64)),
            ((1, 1, 4, 16384), (16, 32, 64)), ((8, 1, 4, 131072), (4, 16)),
            ((1, 8, 4, 131072), (4, 8, 33)), ((1, 1, 1, 131072), (33, 66))]
    return [_case(B, hkv, sq, sk, extra=_splits(*ns)) for (B, hkv, sq, sk), ns in grid]


def r27c_grid() -> list[dict]:
    """2026-11-27 (issue 18), after r27b: batch-1 MQA Sq 4 (two query tiles a split) read
    ~900 GB/s with 132 blocks (66 splits) at 131072 keys and ~1700 with 110 (55), 580 vs
    1310 at 65536 (132 vs 88 blocks), yet 126 blocks were best at 32768 and 128 at B 8:
    where between 110 and 132 blocks does it fall?"""
    grid = [((1, 1, 4, 131072), (58, 60, 62, 63, 64, 65)),
            ((1, 1, 4, 65536), (55, 60, 63, 64, 65)),
            ((1, 1, 4, 32768), (55, 64, 65, 66)), ((8, 1, 4, 131072), (7,)),
            ((2, 1, 4, 131072), (30, 32, 33)), ((1, 2, 4, 131072), (30, 32, 33))]
    return [_case(B, hkv, sq, sk, extra=_splits(*ns)) for (B, hkv, sq, sk), ns in grid]


#: the K/V loads' DRAM latency hint (tiles["LAT"]) at the default tiles
LAT_KNOBS = {"l2": {"tiles": {"LAT": 2}}, "l5": {"tiles": {"LAT": 5}}}


def _splits(*ns, tiles=None):
    return {f"s{n}" + ("c" if tiles else ""): {"num_splits": n, **({"tiles": tiles} if tiles
                                                                     else {})} for n in ns}


def r18d_grid() -> list[dict]:
    """2026-11-24d (issue 18): MQA Sq 4 with a 2-CTA cluster a block (CTA_KNOBS), and the
    split count on the small grids where TileGym was ahead (one wave of long splits) and
    their neighbours: the default (the planner's rule) beside fixed counts."""
    c2 = {"MAX_ROWS": 128, "NUM_CTAS": 2}
    mqa4 = [_case(B, 1, 4, sk, page) for B, sk, page in
            ((1, 8192, 0), (1, 32768, 0), (1, 131072, 0), (8, 8192, 0), (8, 32768, 0),
             (8, 131072, 0), (64, 8192, 0), (64, 32768, 0), (8, 32768, 16), (64, 8192, 16),
             (8, 32768, 256), (1, 131072, 16))]
    for c in mqa4:
        c["extra"] = dict(CTA_KNOBS)
        if c["page"] == 16:              # 16-key pages: the 64-key cluster tile left out
            c["extra"].pop("r128c2tn64")
    mqa4[3]["extra"].update(_splits(8, 30, tiles=c2))
    mqa4[6]["extra"].update(_splits(4, 16, tiles=c2))
    splits = [(64, 1, 8192, (1, 2, 3, 4, 6)), (64, 1, 32768, (2, 4)),
              (8, 1, 8192, (8, 12, 24, 32)), (8, 1, 32768, (8, 32)),
              (1, 8, 8192, (4, 8, 12, 32)), (1, 8, 32768, (8, 32)),
              (1, 32, 8192, (2, 4, 8)), (1, 32, 32768, (4, 8)),
              (8, 8, 8192, (2, 4, 6)), (8, 32, 8192, (1, 2, 4)), (64, 8, 8192, (1, 2)),
              (1, 1, 8192, (32, 128))]
    cases = mqa4 + [_case(B, hkv, 1, sk, extra=_splits(*ns)) for B, hkv, sk, ns in splits]
    for c in cases[len(mqa4):]:
        if c["Hkv"] == 1 and c["Sk"] == 8192 and c["B"] >= 8:
            c["extra"]["c2"] = CTA_KNOBS["c2"]     # MQA Sq 1 (32 rows): 16 a CTA
        if c["Sk"] == 8192:
            c["extra"].update(LAT_KNOBS)
    return cases


#: varlen batches: (name, key lengths per sequence; queries = keys, prefill)
VARLEN_TIMED = [("equal8x2048", [2048] * 8),
                ("equal2x8192", [8192] * 2),
                ("equal32x512", [512] * 32),
                ("equal16x1000", [1000] * 16),
                ("ragged8", [4096, 3000, 2048, 1500, 1024, 700, 300, 100]),
                # 32 runs of 100..1000 keys (seeded): many ragged ends, short blocks
                ("ragged32", [int(x) for x in np.random.default_rng(32).integers(100, 1001, 32)])]
#: varlen checks: (query runs, key runs, Hq, Hkv, D, causal)
VARLEN_CHECKS = [([5, 0, 1, 33, 200], [7, 3, 0, 40, 260], 32, 8, 128, True),
                 ([5, 0, 1, 33, 200], [7, 3, 0, 40, 260], 32, 8, 128, False),
                 ([300, 77], [300, 77], 8, 1, 64, True),
                 ([129, 1, 64], [129, 1, 64], 16, 16, 80, True)]


#: --checks few: small cases over every code path the defaults take (MQA/GQA/MHA, Sq 1
#: and 4, causal, ragged lengths with 0 and 1, 16/64-key pages, splits 1 and many)
FEW_CHECKS = ["2x8:2x100x64/noncausal/lens=37:100/splits=2/fp16",
              "2x8:1x4:77x64/causal/page16/lens=77:5/splits=3/bf16",
              "4x8:1x300x64/noncausal/page16/lens=0:1:17:300/fp16",
              "1x32:1x2048x128/noncausal/fp16", "1x32:1x4:2048x128/causal/page16/fp16",
              "2x32:8x1000x128/noncausal/lens=1000:517/fp16",
              "1x32:4x600x128/noncausal/page64/splits=5/fp16",
              "2x32x2048x128/noncausal/lens=2048:1500/bf16",
              "1x8:1x12800x64/noncausal/splits=200/fp16"]


#: the occupancy hint 2 (128-thread blocks: other register layouts, other reduction
#: orders possible) against the simulator on the same cases
#: the 2-CTA cluster a block (tiles["NUM_CTAS"] 2) against float64 and the simulator:
#: MQA Sq 4 with 128 rows (TILE_N 128 and 64, contiguous, 16- and 256-key pages, ragged
#: lengths with 0 and 1, many splits, bf16), the default 64 rows, MQA Sq 1, GQA
CTA_CHECKS = [(c, {"NUM_CTAS": 2, **t}) for c, t in (
    ("1x32:1x4:2048x128/causal/fp16", {"MAX_ROWS": 128}),
    ("1x32:1x4:2048x128/causal/fp16", {"MAX_ROWS": 128, "TILE_N": 64}),
    ("2x32:1x4:1000x128/causal/page16/lens=999:64/fp16", {"MAX_ROWS": 128}),
    ("3x32:1x4:700x128/causal/page256/lens=700:1:0/bf16", {"MAX_ROWS": 128}),
    ("2x32:1x4:3000x128/causal/lens=3000:17/splits=37/fp16", {"MAX_ROWS": 128}),
    ("1x32:1x4:2048x128/causal/fp16", {}),
    ("1x32:1x2048x128/noncausal/fp16", {}),
    ("2x32:8x1000x128/noncausal/lens=1000:517/fp16", {}))] + [
    # the latency hint (a scheduling hint: the same arithmetic)
    ("1x32:1x4:2048x128/causal/fp16", {"MAX_ROWS": 128, "NUM_CTAS": 2, "LAT": 5}),
    ("2x32:1x3000x128/noncausal/page16/lens=3000:1111/fp16", {"KT_FORM": 2, "LAT": 2}),
    ("2x32:8x1000x128/noncausal/lens=1000:517/fp16", {"LAT": 2})]
OCC_CHECKS = [(c, {"OCCUPANCY": 2}) for c in FEW_CHECKS[:7]] + [
    (FEW_CHECKS[3], {"OCCUPANCY": 2, "MAX_ROWS": 16}),
    ("1x32:1x4:2048x128/causal/fp16", {"OCCUPANCY": 2, "MAX_ROWS": 128})]


def check_problems(quick: bool, few: bool = False):
    if few:
        from spak.families.fmha_decode import FAMILY
        return [FAMILY.parse(c) for c in FEW_CHECKS]
    from spak.families.fmha_decode import FAMILY
    extras = [] if quick else [
        "1x32:8x8192x128/page16/lens=8000", "4x32:8x4:4096x128/causal/page256/lens=4096:3000:17:1",
        "2x32x2048x128/lens=2048:1500", "3x32:1x4:2000x128/causal/lens=2000:1:999",
        "8x32:8x1024x128/page16",
        # the case that faulted (misaligned address) in the first GPU run, and neighbours
        "1x32:4x600x128/page64/splits=5", "1x32:4x600x128/page64/splits=4",
        "1x32:4x600x128/page64/splits=1", "1x32:4x600x128/splits=5",
        "2x32:4x600x128/page64/splits=5", "1x32:1x2048x128", "1x32:1x4:2048x128/causal/page16",
        "1x32x4096x128/page256", "2x32:8x4:3000x128/causal/page256/lens=3000:2999",
        # the parallel combine: many splits (a 64-way tree), a count that is no power of
        # two, and 200 splits of 64 keys (256-wide tree, 32-column chunks)
        "1x32:1x8192x128", "2x16:2x4:3000x128/causal/page16/lens=3000:1111/splits=37",
        "1x8:1x12800x64/splits=200", "1x32:1x4:2048x128/causal/page16/bf16"]
    # the named sets in both dtypes, the rest in fp16 unless they say otherwise
    items = ["default", "gates"] + [e if "bf16" in e else e + "/fp16" for e in extras]
    return FAMILY.select(items, dtype="all", causal="both")


#: the paged checks repeated with the other page modes: (case, tiles)
MODE_CHECKS = [(c, {"PAGE_MODE": m}) for m in (0, 1) for c in
               ("2x32:8x4:1000x128/fp16/causal/page16/lens=999:64",
                "4x8:1x300x64/bf16/noncausal/page16/lens=0:1:17:300")]
#: the keys-in-M forms (KT_FORM 1, 2) against float64 and the simulator: MQA Sq 1 and 4,
#: 16-key pages (gathered and boxes), ragged lengths with 0 and 1, many splits, the
#: per-step column sums (rows x TILE_N past the l tile), GQA/MHA, bf16
FORM_CHECKS = [(c, {"KT_FORM": f, **t}) for f in (1, 2) for c, t in (
    ("1x32:1x2048x128/noncausal/fp16", {}),
    ("2x32:1x3000x128/noncausal/page16/lens=3000:1111/fp16", {}),
    ("4x32:1x300x128/noncausal/page16/lens=0:1:17:300/bf16", {}),
    ("1x32:1x4:2048x128/causal/fp16", {}),
    ("2x32:1x4:1000x128/causal/page16/lens=999:64/fp16", {}),
    ("1x32:1x4:2048x128/causal/fp16", {"MAX_ROWS": 128, "TILE_N": 64}),
    ("1x32:1x4:2048x128/causal/fp16", {"MAX_ROWS": 128}),
    ("2x32:1x4:1000x128/causal/page16/lens=999:64/fp16", {"PAGE_MODE": 0}),
    ("2x32:8x1000x128/noncausal/lens=1000:517/fp16", {}),
    ("2x32:32x2:600x128/causal/page16/lens=600:2/bf16", {}),
    ("1x8:1x12800x64/noncausal/splits=200/fp16", {}),
    ("1x32:1x8192x128/noncausal/page16/fp16", {"TILE_N": 64}))]


# ------------------------------------------------------------------------------ helpers

def _torch(x, dev):
    import torch
    if x is None:
        return None
    if x.dtype == np.float32 and x.ndim == 4:          # bf16 values held in float32
        return torch.from_numpy(x).to(dev).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x)).to(dev)


def _numpy(t):
    import torch
    if t.dtype == torch.bfloat16:
        return t.float().cpu().numpy()
    return t.cpu().numpy()


def _call_args(p, tiles=None):
    return dict(is_causal=p.causal, num_splits=p.splits, tiles=tiles)


# -------------------------------------------------------------------- warm-up (compile)

def _warm_case(spec):
    """Compile one variant: launch the real shapes with every length 0 (no cache byte is
    read; the caches are allocated but never written)."""
    t0 = time.perf_counter()
    try:
        _warm_launch(*spec)
        return spec[0], None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 -- reported, the run goes on
        return spec[0], f"{type(e).__name__}: {e}", time.perf_counter() - t0


def _warm_launch(kind, p):
    if kind == "varlen":
        return _warm_varlen(p)
    import torch
    import spak
    dev = torch.device("cuda")
    dt = torch.float16 if p["dtype"] == "fp16" else torch.bfloat16
    q = torch.randn(p["B"], p["Sq"], p["Hq"], p["D"], device=dev, dtype=dt)
    if p["page"]:
        per = -(-p["Sk"] // p["page"])
        k = torch.empty(p["B"] * per, p["page"], p["Hkv"], p["D"], device=dev, dtype=dt)
        bt = torch.zeros(p["B"], per, dtype=torch.int32, device=dev)
    else:
        k, bt = torch.empty(p["B"], p["Sk"], p["Hkv"], p["D"], device=dev, dtype=dt), None
    lens = torch.zeros(p["B"], dtype=torch.int32, device=dev)
    spak.fmha_kvcache(q, k, k, lens, block_table=bt, is_causal=p["causal"],
                      num_splits=p.get("splits") or p.get("num_splits"), tiles=p.get("tiles"))
    torch.cuda.synchronize()
    del q, k
    torch.cuda.empty_cache()


def _warm_varlen(p):
    """Compile the varlen kernel (and spak.fmha's for the comparison) on tiny inputs of
    the same head counts and dims: the compiled variant does not depend on lengths."""
    import torch
    import spak
    dev = torch.device("cuda")
    q = torch.randn(64, p["Hq"], p["D"], device=dev, dtype=torch.float16)
    k = torch.randn(64, p["Hkv"], p["D"], device=dev, dtype=torch.float16)
    cu = torch.tensor([0, 30, 64], dtype=torch.int32, device=dev)
    spak.fmha_varlen(q, k, k, cu, cu, 34, 34, is_causal=p["causal"])
    qb = torch.randn(1, p["Hq"], 64, p["D"], device=dev, dtype=torch.float16)
    kb = torch.randn(1, p["Hkv"], 64, p["D"], device=dev, dtype=torch.float16)
    spak.fmha(qb, kb, kb, is_causal=p["causal"], enable_gqa=p["Hq"] != p["Hkv"])
    torch.cuda.synchronize()


def warm_up(problems, grid, jobs, log, varlen=False, extra_checks=()):
    from spak.families.fmha_decode import FAMILY
    specs = [("check", dict(B=p.B, Hq=p.Hq, Hkv=p.Hkv, Sq=p.Sq, Sk=p.Sk, D=p.D, page=p.page,
                            dtype=p.dtype, causal=p.causal, splits=p.splits))
             for p in problems]
    for case, tiles in (extra_checks if problems else []):
        p = FAMILY.parse(case)
        specs.append(("check", dict(B=p.B, Hq=p.Hq, Hkv=p.Hkv, Sq=p.Sq, Sk=p.Sk, D=p.D,
                                    page=p.page, dtype=p.dtype, causal=p.causal,
                                    splits=p.splits, tiles=tiles)))
    if varlen:
        specs += [("varlen", dict(Hq=hq, Hkv=hkv, D=d, causal=c))
                  for hq, hkv, d, c in sorted({(32, 8, 128, True), (32, 8, 128, False),
                                               *((x[2], x[3], x[4], x[5])
                                                 for x in VARLEN_CHECKS)})]
    specs += [("time", dict(c, causal=c["Sq"] > 1)) for c in grid]
    specs += [("time", dict(c, causal=c["Sq"] > 1, **cfg)) for c in grid
              for cfg in (c.get("extra") or {}).values()]
    t0 = time.perf_counter()
    errors = 0
    import multiprocessing as mp
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
        for kind, err, sec in ex.map(_warm_case, specs, chunksize=2):
            errors += err is not None
            if err:
                log(f"warm-up error ({kind}): {err[:300]}")
    log(f"warm-up: {len(specs)} launches in {jobs} processes, {time.perf_counter() - t0:.0f} s,"
        f" {errors} errors")


# ------------------------------------------------------------------------- correctness

def correctness(problems, emit, log):
    import torch
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for p in problems:
        _guarded(lambda p=p: _check_one(p, dev, sms, emit, log), emit, log)


def _check_one(p, dev, sms, emit, log, tiles=None):
    import torch
    import spak
    from spak.core.metrics import fraction_bit_identical, max_abs, nonfinite_count, rel_l2
    from spak.cpu.simrun_decode import simulate_decode
    from spak.families.fmha_decode import FAMILY
    inp = FAMILY.make_inputs(p, seed=1)
    t = {k: _torch(v, dev) for k, v in inp.items()}
    args = (t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"])
    out = spak.fmha_kvcache(*args, block_table=t["block_table"], **_call_args(p, tiles))
    again = spak.fmha_kvcache(*args, block_table=t["block_table"], **_call_args(p, tiles))
    got = _numpy(out)
    ref = FAMILY.reference(p, inp)["out"]
    sim, _ = simulate_decode(inp, dtype=p.dtype, causal=p.causal, num_splits=p.splits,
                             num_sms=sms, tiles=tiles)
    case = p.case_id + ("".join(f"/{k}={v}" for k, v in tiles.items()) if tiles else "")
    row = dict(kind="check", case=case, rel_l2=rel_l2(got, ref),
               max_abs=max_abs(got, ref), nonfinite=nonfinite_count(got),
               gate=FAMILY.gate(p), sim_identical=fraction_bit_identical(got, sim, p.dtype),
               deterministic=bool(torch.equal(out, again)), elements=int(got.size))
    row["passed"] = (row["nonfinite"] == 0 and row["rel_l2"] <= row["gate"])
    emit(row)
    log(f"check {case:60s} rel {row['rel_l2']:.2e} sim {row['sim_identical']:.4%} "
        f"{'PASS' if row['passed'] else 'FAIL'}")


def replay_matches_eager(f, change):
    """(f's CUDA-graph replay equals an eager call, that eager output): f is called once,
    captured, `change()` rewrites its inputs in place, the graph is replayed and f called
    again eagerly on the new inputs."""
    import torch
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = f()
    change()
    g.replay()
    eager = f()
    return bool(torch.equal(out, eager)), eager


def graph_and_compile(emit, log):
    """The op under CUDA-graph capture (replayed with new inputs) and torch.compile."""
    import torch
    import spak
    dev = torch.device("cuda")
    B, Hq, Hkv, D, page, Sk = 4, 32, 8, 128, 16, 4096
    q = torch.randn(B, 1, Hq, D, device=dev, dtype=torch.float16)
    k = torch.randn(B * Sk // page, page, Hkv, D, device=dev, dtype=torch.float16)
    v = torch.randn_like(k)
    bt = torch.randperm(B * Sk // page, device=dev, dtype=torch.int32).view(B, -1)
    lens = torch.tensor([4096, 100, 1, 2049], device=dev, dtype=torch.int32)
    f = lambda: spak.fmha_kvcache(q, k, v, lens, block_table=bt)  # noqa: E731

    def change():
        q.copy_(torch.randn_like(q))
        lens.copy_(torch.tensor([7, 4000, 33, 0], device=dev, dtype=torch.int32))
    ok_graph, eager = replay_matches_eager(f, change)
    comp = torch.compile(lambda *a: spak.fmha_kvcache(*a[:4], block_table=a[4]),
                         backend="aot_eager")
    ok_compile = bool(torch.equal(comp(q, k, v, lens, bt), eager))
    emit(dict(kind="graph_compile", graph_replay_equal=ok_graph, compile_equal=ok_compile))
    log(f"CUDA graph replay == eager: {ok_graph}; torch.compile == eager: {ok_compile}")


# ------------------------------------------------------------------------------ timing

#: Replays of the discarded timing before a case's first config (see time_case)
FIRST_DISCARD_REPS = 10


def _graph_time(fn_list, reps=20):
    """Median ms per call: the calls captured in one CUDA graph (_graph), replayed `reps`
    times; eager with events if capture fails."""
    import torch
    try:
        run, how = _graph(fn_list), "graph"
    except Exception:  # noqa: BLE001 -- eager fallback, recorded
        torch.cuda.synchronize()

        def run():
            for fn in fn_list:
                fn()
        how = "eager"
        run()
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / len(fn_list))
    return float(np.median(times)), how


def _graph(fn_list):
    """The calls captured in one CUDA graph (after one eager call), replayed once: its
    replay."""
    import torch
    for fn in fn_list:
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fn_list:
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g.replay


def paired_ratios(runs: dict, base: str, pairs: int = 40, reps: int = 3) -> dict:
    """name -> median over `pairs` of (ms of name / ms of base), each pair timed back to
    back (reps replays each, the order alternating): the GPU's clock drifts by 10-15%
    between rounds of the same call (results/varlen-h100-2026-11-27 run 9), and both
    sides of a pair see the same drift. runs: name -> graph replay (_graph)."""
    import torch

    def ms(run):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            run()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)
    out = {}
    for name, run in runs.items():
        if name == base:
            continue
        r = []
        for i in range(pairs):
            if i % 2:
                x, y = ms(run), ms(runs[base])
            else:
                y, x = ms(runs[base]), ms(run)
            r.append(x / y)
        out[name] = float(np.median(r))
    return out


def shuffled_rounds(P: dict, names: list, rounds: int, seed: int, first: str, log,
                    label) -> dict:
    """name -> ms per call of each round: `rounds` rounds, each in a fresh seeded shuffle
    of `names`, after one discarded timing of `first` (the first-timing penalty of
    results/decode-h100-2026-11-24d run 3). P[name]: the calls of one graph replay; a
    failed timing is logged and recorded as NaN."""
    rng = random.Random(seed)
    ms = {n: [] for n in names}
    _graph_time(P[first], reps=10)                   # discarded: a GPU already busy
    for _ in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for n in order:
            try:
                ms[n].append(_graph_time(P[n])[0])
            except Exception as e:  # noqa: BLE001 -- recorded
                log(f"{label} {n}: {type(e).__name__}: {str(e)[:200]}")
                ms[n].append(float("nan"))
    return ms


def time_shapes(shapes, time_shape, dev, rounds, seed0, emit, log):
    """time_shape(shape, dev, rounds, seed, emit, log) for each shape (seeds seed0 + i);
    a shape that fails is logged and the run goes on."""
    for i, s in enumerate(shapes):
        try:
            time_shape(s, dev, rounds, seed0 + i, emit, log)
        except Exception as e:  # noqa: BLE001 -- recorded
            log(f"shape {s}: {type(e).__name__}: {str(e)[:300]}")


def write_summary(out: str, text: str):
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text + "\n")
    print(text)


def copy_ceiling(emit, log):
    import torch
    n = 2 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.random_(0, 255)
    ms, _ = _graph_time([lambda: dst.copy_(src)], reps=10)
    gbs = 2 * n / ms / 1e6
    emit(dict(kind="copy", bytes=2 * n, ms=ms, gbs=gbs))
    log(f"device-to-device copy of 2 GiB: {ms:.3f} ms, {gbs:.0f} GB/s (read + write)")
    del src, dst
    return gbs


def call_cycle(sets: list) -> list:
    """The input sets of one graph replay: `sets` cycled to at least MIN_CALLS calls."""
    return (list(sets) * MIN_CALLS)[:max(len(sets), MIN_CALLS)]


def _make_copies(c, n, dev):
    import torch
    dt = torch.float16 if c["dtype"] == "fp16" else torch.bfloat16
    B, Sq, Hq, Hkv, D, Sk, page = (c[k] for k in ("B", "Sq", "Hq", "Hkv", "D", "Sk", "page"))
    copies = []
    for _ in range(n):
        q = torch.randn(B, Sq, Hq, D, device=dev, dtype=dt)
        if page:
            per = -(-Sk // page)
            k = torch.randn(B * per, page, Hkv, D, device=dev, dtype=dt)
            v = torch.randn_like(k)
            bt = torch.randperm(B * per, device=dev, dtype=torch.int32).view(B, per)
            # the SDPA peer's contiguous gather of the same cache (outside the timing)
            kg = k[bt.long()].reshape(B, per * page, Hkv, D)[:, :Sk]
            vg = v[bt.long()].reshape(B, per * page, Hkv, D)[:, :Sk]
        else:
            k = torch.randn(B, Sk, Hkv, D, device=dev, dtype=dt)
            v = torch.randn_like(k)
            bt, kg, vg = None, k, v
        copies.append(dict(q=q, k=k, v=v, bt=bt, qs=q.transpose(1, 2).contiguous(),
                           ks=kg.transpose(1, 2).contiguous(), vs=vg.transpose(1, 2).contiguous()))
    lens = torch.full((B,), Sk, dtype=torch.int32, device=dev)
    return copies, lens


def time_case(c, emit, log, peers=True, extra=None):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import spak
    dev = torch.device("cuda")
    kv_bytes = c["B"] * c["Sk"] * c["Hkv"] * c["D"] * 4
    qo_bytes = 2 * c["B"] * c["Sq"] * c["Hq"] * c["D"] * 2
    n = max(1, min(8, math.ceil(L2_BYTES / kv_bytes)))
    copies, lens = _make_copies(c, n, dev)
    copies = call_cycle(copies)
    causal = c["Sq"] > 1
    label = (f"{c['B']}x{c['Hq']}:{c['Hkv']}x{c['Sq']}:{c['Sk']}x{c['D']}"
             f"{'/page%d' % c['page'] if c['page'] else ''}/{c['dtype']}")
    res = {}
    for i, (name, cfg) in enumerate([("spak", {})] + list((extra or {}).items())):
        fns = [lambda x=x, cfg=cfg: spak.fmha_kvcache(x["q"], x["k"], x["v"], lens,
                                                      block_table=x["bt"], is_causal=causal,
                                                      **cfg) for x in copies]
        try:
            if i == 0:
                # The first config timed in a case read up to 10% low (results/decode-h100-
                # 2026-11-24d run 3: 2440 GB/s first, 2687-2691 on repeats): a discarded
                # timing first, so every config is timed on a GPU already busy.
                _graph_time(fns, reps=FIRST_DISCARD_REPS)
            res[name] = _graph_time(fns)
        except Exception as e:  # noqa: BLE001
            res[name] = (float("nan"), f"error {type(e).__name__}: {str(e)[:200]}")
    backends = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION,
                "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}
    # the peers read the same gathered [B, Hkv, L, D] cache whatever our layout: once
    for name, be in (backends.items() if peers and c["page"] == 0 else ()):
        def sdpa(x, be=be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(x["qs"], x["ks"], x["vs"],
                                                      enable_gqa=c["Hq"] != c["Hkv"])
        try:
            res[name] = _graph_time([lambda x=x: sdpa(x) for x in copies])
        except Exception as e:  # noqa: BLE001
            res[name] = (float("nan"), f"error {type(e).__name__}: {str(e)[:120]}")
    if peers and c["page"] == 0 and c["Sq"] == 1:
        res.update(_tilegym(c, copies, log))
    res["copy-same"] = _copy_same(kv_bytes + qo_bytes, n, dev)
    row = dict(kind="time", label=label, **c, kv_bytes=kv_bytes, copies=n, calls=len(copies),
               ms={k: v[0] for k, v in res.items()}, how={k: v[1] for k, v in res.items()},
               gbs={k: (kv_bytes + qo_bytes) / v[0] / 1e6 for k, v in res.items()})
    emit(row)
    best = min((v[0] for k, v in res.items() if k.startswith("sdpa") and v[0] == v[0]),
               default=float("nan"))
    log(f"time {label:36s} spak {row['gbs']['spak']:7.0f} GB/s ({res['spak'][0] * 1e3:8.1f} us)"
        + (f"  best sdpa {(kv_bytes + qo_bytes) / best / 1e6:7.0f} GB/s" if best == best else "")
        + "".join(f"  {k} {row['gbs'][k]:7.0f}" for k in (extra or {}))
        + "".join(f"  {k} {row['gbs'][k]:7.0f}" for k in ("tilegym", "copy-same")
                  if k in row["gbs"]))
    del copies
    torch.cuda.empty_cache()
    return row


def _tilegym(c, copies, log):
    """NVIDIA TileGym's cuTile split-KV decode (ci/peers/tilegym_flash_decode.py, a
    benchmark opponent) on the same gathered [B, Hkv, L, D] cache as SDPA (it has no
    paged or per-sequence-length path, and Sq = 1 only); its output is checked against
    SDPA's once (rel L2 logged and stored in the timing's 'how')."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
    try:
        import tilegym_flash_decode as tg
        x = copies[0]
        got = tg.fmha_decode(x["qs"], x["ks"], x["vs"], None).float()
        ref = F.scaled_dot_product_attention(x["qs"], x["ks"], x["vs"],
                                             enable_gqa=c["Hq"] != c["Hkv"]).float()
        err = float(((got - ref).norm() / ref.norm()).item())
        ms, how = _graph_time([lambda x=x: tg.fmha_decode(x["qs"], x["ks"], x["vs"], None)
                               for x in copies])
        return {"tilegym": (ms, f"{how} rel_l2_vs_sdpa={err:.1e}")}
    except Exception as e:  # noqa: BLE001 -- recorded
        log(f"tilegym: {type(e).__name__}: {str(e)[:200]}")
        return {"tilegym": (float("nan"), f"error {type(e).__name__}: {str(e)[:200]}")}


def _copy_same(nbytes, n, dev):
    """A device-to-device copy moving the case's bytes (half read, half written), over
    the same number of rotated buffers, timed the same way: the ceiling of a stream this
    short (launch and ramp included), beside the 2 GiB copy's."""
    import torch
    half = max(int(nbytes) // 2, 1)
    bufs = [(torch.empty(half, dtype=torch.uint8, device=dev),
             torch.empty(half, dtype=torch.uint8, device=dev)) for _ in range(n)]
    ms, how = _graph_time([lambda a=a, b=b: b.copy_(a) for a, b in call_cycle(bufs)])
    del bufs
    return ms, how


# ------------------------------------------------------------------------------ varlen

def _packed(lq, lk, Hq, Hkv, D, dtype, seed=0):
    rng = np.random.default_rng([seed, sum(lq), sum(lk), Hq, Hkv, D])
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)

    def draw(shape):
        from spak.core.metrics import round_to_bf16
        x = rng.standard_normal(shape, dtype=np.float32)
        return x.astype(np.float16) if dtype == "fp16" else round_to_bf16(x)
    return dict(q=draw((cq[-1], Hq, D)), k=draw((ck[-1], Hkv, D)), v=draw((ck[-1], Hkv, D)),
                cu_seqlens_q=cq, cu_seqlens_k=ck)


def varlen_check(spec, emit, log):
    """spak.fmha_varlen on the GPU vs float64 and vs the simulator, both dtypes."""
    import torch
    import spak
    from spak.attention.kvcache_ref import varlen_attention_f64
    from spak.core.metrics import fraction_bit_identical, gate_for, nonfinite_count, rel_l2
    from spak.cpu.simrun_decode import simulate_varlen
    from spak.varlen import launch_config
    lq, lk, Hq, Hkv, D, causal = spec
    for dtype in ("fp16", "bf16"):
        x = _packed(lq, lk, Hq, Hkv, D, dtype)
        t = {k: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k, v in x.items()}
        if dtype == "bf16":                       # bf16 values held in float32 on the CPU
            t.update({n: t[n].to(torch.bfloat16) for n in ("q", "k", "v")})
        args = (t["q"], t["k"], t["v"], t["cu_seqlens_q"], t["cu_seqlens_k"], max(lq), max(lk))
        out = spak.fmha_varlen(*args, is_causal=causal)
        again = spak.fmha_varlen(*args, is_causal=causal)
        got = _numpy(out)
        ref = varlen_attention_f64(x["q"], x["k"], x["v"], x["cu_seqlens_q"],
                                   x["cu_seqlens_k"], causal=causal)
        # the config the GPU call launched (the tuned store's, as spak.fmha's)
        cfg = launch_config(t["q"], t["cu_seqlens_q"], max(lq), max(lk), causal)
        sim, _ = simulate_varlen(x, dtype=dtype, causal=causal, tiles=cfg)
        log(f"varlen check config {cfg}")
        case = (f"varlen {Hq}:{Hkv}x{D} q={':'.join(map(str, lq))} k={':'.join(map(str, lk))}"
                f"/{dtype}/{'causal' if causal else 'noncausal'}")
        row = dict(kind="check", case=case, rel_l2=rel_l2(got, ref), gate=gate_for(dtype),
                   nonfinite=nonfinite_count(got), elements=int(got.size),
                   sim_identical=fraction_bit_identical(got, sim, dtype),
                   deterministic=bool(torch.equal(out, again)))
        row["passed"] = row["nonfinite"] == 0 and row["rel_l2"] <= row["gate"]
        emit(row)
        log(f"check {case:60s} rel {row['rel_l2']:.2e} sim {row['sim_identical']:.4%} "
            f"{'PASS' if row['passed'] else 'FAIL'}")


def _varlen_launch(q, k, v, cu, Lmax, causal, tiles, opponent=None):
    """One varlen call through plan_varlen with `tiles` (knobs spak.fmha_varlen does not
    take), launched on the current stream; opponent: "views" or "nocu", a kernel of
    ci/varlen_bench_kernels.py in its place, same config (run 11's heads-major views,
    "hm", are in git history at 5f99061); "ragged": the shipped kernel without its WHOLE
    form (on a batch of whole tiles)."""
    import cuda.tile as ct
    import torch
    from spak.gpu.plan_decode import plan_varlen
    out = torch.empty_like(q[..., :v.shape[2]])
    (L,) = plan_varlen(q, k, v, cu, cu, out, max_seqlen_q=Lmax, max_seqlen_k=Lmax,
                       causal=causal, tiles=tiles)
    kernel, args = L.kernel, L.args
    if opponent == "ragged":   # the WHOLE form off: the ragged-tile paths compiled in
        args = tuple(L.args[:-1]) + (False,)
    elif opponent:
        import varlen_bench_kernels
        from spak.gpu.variants import with_hints
        kernel = with_hints(varlen_bench_kernels.variant_kernel(opponent)
                            if opponent in varlen_bench_kernels.EDITS else
                            getattr(varlen_bench_kernels, f"fmha_varlen_{opponent}_kernel"),
                            occupancy=tiles.get("OCCUPANCY") or None,
                            num_ctas=tiles.get("NUM_CTAS") or None)
    def call():
        ct.launch(torch.cuda.current_stream(), L.grid, kernel, args)
    call.out = out            # where the call writes (for a bit check)
    return call


def _torch_varlen(q, k, v, cu, Lmax, causal):
    """PyTorch's packed varlen attention (torch.nn.attention.varlen.varlen_attn, a
    FlashAttention kernel), the peer on the same packed tensors; its causal argument is
    is_causal in some releases, window_size=(-1, 0) in others."""
    import inspect
    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    kw = {"enable_gqa": True} if "enable_gqa" in params else {}
    if "is_causal" in params:
        kw["is_causal"] = causal
    elif causal:
        kw["window_size"] = (-1, 0)
    return lambda: varlen_attn(q, k, v, cu, cu, Lmax, Lmax, **kw)


def _fmha_strided(q, k, v, B, L, causal):
    """spak.fmha's forward kernel and config (the tuned store's, as spak.fmha resolves it)
    launched on the packed rows seen as [B, H, L, D] strided views: the varlen memory
    layout with descriptors made on the host, to price what the varlen kernel adds."""
    import cuda.tile as ct
    import torch
    from spak.api import resolve_tiles
    from spak.gpu.plan import plan_fmha
    from spak.gpu.variants import with_hints
    Hq, D = q.shape[1], q.shape[2]
    t = resolve_tiles("fused", q.dtype, D, causal, L, q.device, rows=B * Hq * L)
    tiles = {key: int(t[key]) for key in ("TILE_M", "TILE_N", "LAT_K", "LAT_V") if t.get(key)}
    view = (lambda x: x.view(B, L, x.shape[1], x.shape[2]).transpose(1, 2))
    out = torch.empty_like(q)
    dense = [view(x).contiguous() for x in (q, k, v, out)]
    (Lc,) = plan_fmha("fused", *dense, causal=causal, tiles=tiles,
                      alloc=lambda shape, kind: torch.zeros(shape, device=q.device))
    kernel = with_hints(Lc.kernel, occupancy=t.get("occupancy") or None,
                        num_ctas=t.get("num_ctas") or None)
    args = (view(q), view(k), view(v), view(out)) + tuple(Lc.args[4:])
    return lambda: ct.launch(torch.cuda.current_stream(), Lc.grid, kernel, args)


def varlen_time(name, lens, emit, log, Hq=32, Hkv=8, D=128, rounds=5, dtype="fp16",
                knobs=True, pairs=0, configs=(), edits=()):
    """spak.fmha_varlen on a packed prefill batch (queries = keys per sequence) against
    spak.fmha on the batch padded to the longest sequence, spak.fmha once per sequence,
    and SDPA (cuDNN, flash) padded. TFLOPS count the useful work: 4 Hq L^2 D per
    sequence, halved when causal. Padded and unmasked, a ragged batch computes more (and
    a different function past each sequence's end): the peers there bound what padding
    costs; with equal lengths the padded batch is the same problem. knobs: also the HEADS
    variants and the opponents of ci/varlen_bench_kernels.py. pairs: also paired_ratios
    (time / spak.fmha padded's time, median over pairs timed back to back). configs:
    dicts of plan_varlen tiles over spak.fmha_varlen's config, each timed as `cfg_...`
    (in the pairs too) and its bits compared with varlen's (equal where TILE_N is: a
    row's result does not depend on how rows are tiled). edits: names of
    ci/varlen_bench_kernels.py's EDITS, each timed as `varlen_<name>` at varlen's config
    (in the pairs too), its bits compared with varlen's."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import spak
    from spak.varlen import launch_config
    dev = torch.device("cuda")
    B, Lmax = len(lens), max(lens)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=dev)
    T = int(sum(lens))
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    for causal in (False, True):
        q = torch.randn(T, Hq, D, device=dev, dtype=tdt)
        k = torch.randn(T, Hkv, D, device=dev, dtype=tdt)
        v = torch.randn_like(k)
        qp = torch.zeros(B, Hq, Lmax, D, device=dev, dtype=tdt)
        kp = torch.zeros(B, Hkv, Lmax, D, device=dev, dtype=tdt)
        vp = torch.zeros_like(kp)
        seqs = []
        for b, n in enumerate(lens):
            s0 = int(cu[b])
            qp[b, :, :n] = q[s0:s0 + n].transpose(0, 1)
            kp[b, :, :n] = k[s0:s0 + n].transpose(0, 1)
            vp[b, :, :n] = v[s0:s0 + n].transpose(0, 1)
            seqs.append((qp[b:b + 1, :, :n].contiguous(), kp[b:b + 1, :, :n].contiguous(),
                         vp[b:b + 1, :, :n].contiguous()))
        flop = sum(4.0 * Hq * n * n * D for n in lens) / (2 if causal else 1)
        cfg = launch_config(q, cu, Lmax, Lmax, causal)      # spak.fmha_varlen's config
        fns = {
            "varlen": lambda: spak.fmha_varlen(q, k, v, cu, cu, Lmax, Lmax, is_causal=causal),
            "torch_varlen": _torch_varlen(q, k, v, cu, Lmax, causal),
            "fmha_padded": lambda: spak.fmha(qp, kp, vp, is_causal=causal, enable_gqa=True),
            "fmha_per_seq": lambda: [spak.fmha(a, b_, c, is_causal=causal, enable_gqa=True)
                                     for a, b_, c in seqs],
        }
        if knobs:
            fns.update({f"varlen_h{h}": _varlen_launch(q, k, v, cu, Lmax, causal,
                                                        {**cfg, "HEADS": h}) for h in (1, 2, 4)})
            fns["varlen_views"] = _varlen_launch(q, k, v, cu, Lmax, causal,
                                                 {**cfg, "HEADS": 2 if causal else 4}, "views")
        for over in configs:
            fns[config_name(over)] = _varlen_launch(q, k, v, cu, Lmax, causal, {**cfg, **over})
        for e in edits:
            fns[f"varlen_{e}"] = _varlen_launch(q, k, v, cu, Lmax, causal, cfg, e)
        for nm, be in (("sdpa-cudnn_padded", SDPBackend.CUDNN_ATTENTION),
                       ("sdpa-flash_padded", SDPBackend.FLASH_ATTENTION)):
            def sd(be=be):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal,
                                                          enable_gqa=True)
            fns[nm] = sd
        if len(set(lens)) == 1:          # the packed rows as a [B, H, L, D] strided batch
            fns["fmha_bshd"] = _fmha_strided(q, k, v, B, Lmax, causal)
            if knobs:
                fns["varlen_nocu"] = _varlen_launch(q, k, v, cu, Lmax, causal, cfg, "nocu")
                if Lmax % 128 == 0:   # whole tiles: the varlen call takes the WHOLE form
                    fns["varlen_ragged"] = _varlen_launch(
                        q, k, v, cu, Lmax, causal, {**cfg, "HEADS": 1 if causal else 4},
                        "ragged")
        names = list(fns)
        ms = shuffled_rounds({n: [f] for n, f in fns.items()}, names, rounds,
                             zlib.crc32(f"{name}{causal}".encode()), "fmha_padded", log,
                             f"varlen {name}")
        res = {n: float(np.nanmedian(v)) if not np.isnan(v).all() else float("nan")
               for n, v in ms.items()}
        # time ratios to spak.fmha on the padded batch, pairs timed back to back
        paired = {}
        if pairs:
            runs = {n: _graph([fns[n]]) for n in ("fmha_padded", "varlen", "varlen_views",
                                                   "varlen_ragged", "fmha_bshd",
                                                   "fmha_per_seq")
                    + tuple(map(config_name, configs)) + tuple(f"varlen_{e}" for e in edits)
                    if n in fns}
            paired = paired_ratios(runs, "fmha_padded", pairs)
            del runs
        # the equal-length batch: varlen and spak.fmha compute the same thing
        check = None
        if len(set(lens)) == 1:
            a = spak.fmha_varlen(q, k, v, cu, cu, Lmax, Lmax, is_causal=causal).float()
            b = spak.fmha(qp, kp, vp, is_causal=causal, enable_gqa=True).transpose(1, 2)
            check = float(((a - b.reshape(a.shape).float()).norm() / b.float().norm()).item())
            # the same block code on the same rows: the bits should agree
            same = float((a == b.reshape(a.shape).float()).float().mean().item())
            log(f"varlen {name} {'causal' if causal else 'noncausal'}: identical to "
                f"spak.fmha on {100 * same:.4f}% of elements")
        a = spak.fmha_varlen(q, k, v, cu, cu, Lmax, Lmax, is_causal=causal)
        for n in (("varlen_ragged", "varlen_views") + tuple(map(config_name, configs))
                  + tuple(f"varlen_{e}" for e in edits)):
            if n in fns:
                fns[n]()
                same = float((fns[n].out == a).float().mean().item())
                log(f"varlen {name} {dtype} {'causal' if causal else 'noncausal'}: {n} "
                    f"identical to varlen on {100 * same:.4f}% of elements")
        row = dict(kind="varlen_time", name=name, lens=lens, causal=causal, Hq=Hq, Hkv=Hkv,
                   D=D, dtype=dtype, rounds=rounds, ms=res,
                   ms_rounds={n: [float(x) for x in v] for n, v in ms.items()},
                   time_over_padded=paired, tflops={k: flop / v / 1e9 for k, v in res.items()},
                   rel_l2_vs_fmha=check)
        emit(row)
        mode = "causal" if causal else "noncausal"
        log(f"varlen {name:12s} {dtype} {Hq}:{Hkv}x{D} {mode:9s} " + "  ".join(
            f"{k} {row['tflops'][k]:6.1f}" for k in res) + " TFLOPS"
            + (f"  rel vs fmha {check:.1e}" if check is not None else "")
            + ("  paired time / fmha_padded: " + "  ".join(f"{k} {v:.3f}" for k, v in
                                                          paired.items()) if paired else ""))
        del q, k, v, qp, kp, vp, seqs
        torch.cuda.empty_cache()


def config_name(over: dict) -> str:
    """The row name of a --varlen-configs entry: cfg_TILE_M128_NUM_CTAS2."""
    return "cfg_" + "_".join(f"{k}{v}" for k, v in over.items())


def parse_configs(text: str) -> list:
    """--varlen-configs: 'TILE_M=128,NUM_CTAS=2;OCCUPANCY=1' -> [{...}, {...}]."""
    out = []
    for part in filter(None, text.split(";")):
        over = {}
        for kv in part.split(","):
            k, _, v = kv.partition("=")
            if not v:
                raise SystemExit(f"--varlen-configs: expected KEY=VALUE, got {kv!r}")
            over[k.strip()] = int(v)
        out.append(over)
    return out


def varlen_graph_and_compile(emit, log):
    """spak.fmha_varlen under CUDA-graph capture (replayed with new values and new run
    lengths of the same totals) and torch.compile, against eager calls."""
    import torch
    import spak
    dev = torch.device("cuda")
    Hq, Hkv, D, T = 32, 8, 128, 3000
    q = torch.randn(T, Hq, D, device=dev, dtype=torch.float16)
    k = torch.randn(T, Hkv, D, device=dev, dtype=torch.float16)
    v = torch.randn_like(k)
    cu = torch.tensor([0, 1000, 1001, 2500, 3000], device=dev, dtype=torch.int32)
    f = lambda: spak.fmha_varlen(q, k, v, cu, cu, 1500, 1500, is_causal=True)  # noqa: E731

    def change():
        q.copy_(torch.randn_like(q))
        cu.copy_(torch.tensor([0, 1500, 1500, 2999, 3000], device=dev, dtype=torch.int32))
    ok_graph, eager = replay_matches_eager(f, change)
    comp = torch.compile(lambda *a: spak.fmha_varlen(*a, 1500, 1500, is_causal=True),
                         backend="aot_eager")
    ok_compile = bool(torch.equal(comp(q, k, v, cu, cu), eager))
    emit(dict(kind="varlen_graph_compile", graph_replay_equal=ok_graph,
              compile_equal=ok_compile, nonfinite=int((~torch.isfinite(eager)).sum())))
    log(f"varlen: CUDA graph replay == eager: {ok_graph}; torch.compile == eager: "
        f"{ok_compile}")


# ------------------------------------------------------------------------------ summary

def summary(rows, copy_gbs) -> str:
    lines = ["# decode bench summary", ""]
    checks = [r for r in rows if r["kind"] == "check"]
    if checks:
        n_ok = sum(r["passed"] for r in checks)
        el = sum(r["elements"] for r in checks)
        ident = sum(r["sim_identical"] * r["elements"] for r in checks) / max(el, 1)
        det = all(r["deterministic"] for r in checks)
        lines += [f"correctness: {n_ok}/{len(checks)} cases within the float64 gates, no NaN; "
                  f"simulator bit-identical {ident:.4%} of {el} output elements; "
                  f"run-to-run identical: {det}", ""]
        lines += ["| case | rel L2 | gate | sim identical | pass |", "|---|---|---|---|---|"]
        lines += [f"| {r['case']} | {r['rel_l2']:.2e} | {r['gate']:g} | {r['sim_identical']:.4%} "
                  f"| {'yes' if r['passed'] else 'NO'} |" for r in checks]
        lines.append("")
    times = [r for r in rows if r["kind"] == "time"]
    if times:
        lines += [f"copy ceiling (2 GiB device-to-device, read + write): {copy_gbs:.0f} GB/s; "
                  f"'/ 3.02': the fraction of the issue's 3.02 TB/s copy figure; 'paged / "
                  f"contig': spak paged over spak contiguous, same shape, same run", "",
                  "| shape | spak GB/s | / copy | / 3.02 | best SDPA GB/s | SDPA / copy | "
                  "spak / best SDPA | paged / contig | TileGym GB/s | same-size copy GB/s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        sdpa, contig = {}, {}
        for r in times:
            if r["page"] == 0:
                sdpa[_shape_key(r)] = max((v for k, v in r["gbs"].items()
                                           if k.startswith("sdpa") and v == v),
                                          default=float("nan"))
                contig[_shape_key(r)] = r["gbs"]["spak"]
        for r in times:
            g, sd = r["gbs"], sdpa.get(_shape_key(r), float("nan"))
            ratio = g["spak"] / contig[_shape_key(r)] if r["page"] and _shape_key(r) in contig \
                else float("nan")
            lines.append(f"| {r['label']} | {g['spak']:.0f} | {g['spak'] / copy_gbs:.2f} | "
                         f"{g['spak'] / 3020:.2f} | {sd:.0f} | {sd / copy_gbs:.2f} | "
                         f"{g['spak'] / sd:.2f} | {ratio:.2f} | {g.get('tilegym', float('nan')):.0f}"
                         f" | {g.get('copy-same', float('nan')):.0f} |")
    vt = [r for r in rows if r["kind"] == "varlen_time"]
    if vt:
        names = list(dict.fromkeys(n for r in vt for n in r["tflops"]))
        lines += ["", "varlen prefill, TFLOPS of useful work (median of the rounds): "
                  + ", ".join(names), "",
                  "| batch | heads | dtype | causal | " + " | ".join(names)
                  + " | varlen / fmha_padded | varlen / fmha_per_seq |",
                  "|---|---|---|---|" + "---|" * (len(names) + 2)]
        lines += [f"| {r['name']} | {r['Hq']}:{r['Hkv']}x{r['D']} | {r.get('dtype', 'fp16')} | "
                  f"{r['causal']} | " + " | ".join(
            f"{r['tflops'].get(n, float('nan')):.1f}" for n in names) +
            f" | {r['tflops']['varlen'] / r['tflops']['fmha_padded']:.2f}"
            f" | {r['tflops']['varlen'] / r['tflops']['fmha_per_seq']:.2f} |" for r in vt]
    knobs = [r for r in times if r.get("extra")]
    groups: dict = {}
    for r in knobs:                          # one table per set of knobs
        groups.setdefault(tuple(k for k in r["gbs"] if not k.startswith("sdpa")), []).append(r)
    for names, rows_g in groups.items():
        lines += ["", "knobs (GB/s): " + ", ".join(names), "",
                  "| shape | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        lines += [f"| {r['label']} | " + " | ".join(f"{r['gbs'].get(n, float('nan')):.0f}"
                                                  for n in names) + " |" for r in rows_g]
    return "\n".join(lines)


def _task(task):
    """One task in the worker process: (rows, log lines)."""
    import torch
    rows, logs = [], []
    kind = task[0]
    if kind == "check":
        from spak.families.fmha_decode import FAMILY
        dev = torch.device("cuda")
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        _check_one(FAMILY.parse(task[1]), dev, sms, rows.append, logs.append,
                   task[2] if len(task) > 2 else None)
    elif kind == "varlen_check":
        varlen_check(task[1], rows.append, logs.append)
    elif kind == "varlen_graph":
        varlen_graph_and_compile(rows.append, logs.append)
    elif kind == "varlen_time":
        varlen_time(task[1], task[2], rows.append, logs.append, **task[3])
    elif kind == "graph":
        graph_and_compile(rows.append, logs.append)
    elif kind == "copy":
        copy_ceiling(rows.append, logs.append)
    else:
        time_case(task[1], rows.append, logs.append, extra=task[1].get("extra"))
    torch.cuda.synchronize()
    return rows, logs


def run_tasks(tasks, emit, log):
    """Every task in one worker process; a CUDA fault poisons a process's context, so the
    worker is replaced after one and the run goes on with the next task."""
    import multiprocessing as mp
    from concurrent.futures.process import BrokenProcessPool
    ex = None
    for task in tasks:
        if ex is None:
            ex = ProcessPoolExecutor(1, mp_context=mp.get_context("spawn"))
        try:
            rows, logs = ex.submit(_task, task).result(timeout=300)
            for r in rows:
                emit(r)
            for line in logs:
                log(line)
        except Exception as e:  # noqa: BLE001 -- recorded, the run goes on
            msg = f"{type(e).__name__}: {str(e)[:400]}"
            emit(dict(kind="error", task=str(task)[:300], error=msg))
            log(f"ERROR in {str(task)[:120]}: {msg}")
            if isinstance(e, BrokenProcessPool) or "CUDA" in msg or "Accelerator" in msg:
                ex.shutdown(wait=False, cancel_futures=True)
                ex = None
    if ex is not None:
        ex.shutdown()


def _guarded(phase, emit, log):
    """Run one phase; an exception is recorded and the run goes on."""
    if phase is None:
        return
    try:
        phase()
    except Exception as e:  # noqa: BLE001
        import traceback
        emit(dict(kind="error", error=f"{type(e).__name__}: {e}"))
        log("ERROR " + traceback.format_exc()[-1500:])


def _shape_key(r):
    return tuple(r[k] for k in ("B", "Hq", "Hkv", "Sq", "Sk", "D", "dtype"))


def open_rows(out: str):
    """(rows, emit, log) of a GPU run writing OUT/rows.jsonl: emit(row) appends a row to the
    list and the file (flushed: a time limit keeps what was written), log(msg) prints it
    at once; the first row (kind "env") says the GPU, torch, commit, date and arguments."""
    import torch
    from spak.results.provenance import commit_label
    os.makedirs(out, exist_ok=True)
    rows = []
    rows_f = open(os.path.join(out, "rows.jsonl"), "a")

    def emit(row):
        rows.append(row)
        rows_f.write(json.dumps(row, default=str) + "\n")
        rows_f.flush()

    def log(msg):
        print(msg, flush=True)
    props = torch.cuda.get_device_properties(0)
    emit(dict(kind="env", gpu=torch.cuda.get_device_name(0), sms=props.multi_processor_count,
              torch=torch.__version__, commit=commit_label(), date=time.strftime("%Y-%m-%d %H:%M"),
              argv=sys.argv[1:]))
    log(f"{rows[-1]}")
    return rows, emit, log


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--few-checks", action="store_true", help="FEW_CHECKS only")
    ap.add_argument("--checks-last", action="store_true",
                    help="the plain checks after the timings (a time limit cuts checks)")
    ap.add_argument("--new-checks", action="store_true",
                    help="with --few-checks: FEW_CHECKS and CTA_CHECKS only")
    ap.add_argument("--few-only", action="store_true",
                    help="with --few-checks: FEW_CHECKS alone")
    ap.add_argument("--grid", choices=("full", "focus", "tune", "goal", "r18d", "goal_prev",
                                       "models",
                                       "recheck", "goal_rep", "goal_ahead", "r27", "r27b", "r27c",
                                       "none", "goal_bf16"),
                    default="full", help="decode shapes to time (none: only --varlen's)")
    ap.add_argument("--varlen", action="store_true")
    ap.add_argument("--varlen-rounds", type=int, default=5, metavar="N",
                    help="shuffled rounds per varlen timing (default 5)")
    ap.add_argument("--varlen-dtypes", default="fp16", metavar="D[,D]",
                    help="varlen timing dtypes, fp16 and/or bf16 (default fp16)")
    ap.add_argument("--varlen-pairs", type=int, default=0, metavar="N",
                    help="also time varlen, its opponents and peers against spak.fmha "
                         "padded in N back-to-back pairs (the ratio's median)")
    ap.add_argument("--varlen-heads", default="32:8:128", metavar="HQ:HKV:D[,...]",
                    help="varlen timing head counts and head dim (default 32:8:128)")
    ap.add_argument("--varlen-core", action="store_true",
                    help="varlen timings without the HEADS variants and bench opponents")
    ap.add_argument("--varlen-batches", default="", metavar="NAME[,...]",
                    help="varlen batches to time (default all: "
                         + ",".join(n for n, _ in VARLEN_TIMED) + ")")
    ap.add_argument("--varlen-configs", default="", metavar="K=V[,K=V][;...]",
                    help="varlen configs over spak.fmha_varlen's, each timed beside it "
                         "(e.g. 'TILE_M=128,NUM_CTAS=2;OCCUPANCY=1')")
    ap.add_argument("--varlen-edits", default="", metavar="NAME[,...]",
                    help="ci/varlen_bench_kernels.py EDITS to time beside varlen")
    ap.add_argument("--forms", action="store_true",
                    help="--grid goal: time the MQA shapes (and GQA with 16-key pages) "
                         "with every KT_FORM too (FORM_KNOBS)")
    args = ap.parse_args(argv)
    import torch
    rows, emit, log = open_rows(args.out)
    problems = [] if args.skip_checks else check_problems(args.quick, args.few_checks)
    grid = {"focus": focus_grid, "tune": tune_grid, "r18d": r18d_grid,
            "goal_prev": goal_prev_grid, "recheck": recheck_grid, "goal_rep": goal_rep_grid,
            "goal_ahead": goal_ahead_grid, "r27": r27_grid, "r27b": r27b_grid,
            "r27c": r27c_grid, "none": lambda: [], "goal_bf16": goal_bf16_grid,
            "goal": lambda: goal_grid(args.forms), "models": models_grid}.get(
        args.grid, lambda: timing_grid(args.quick))()
    extra_checks = [] if args.few_only else CTA_CHECKS if args.new_checks else (
        CTA_CHECKS + MODE_CHECKS + FORM_CHECKS + (OCC_CHECKS if args.few_checks else []))
    if not args.no_warm:
        warm_up(problems, grid, args.jobs, log, varlen=args.varlen, extra_checks=extra_checks)
    checks = [("check", p.case_id) for p in problems]
    checks += [("check", c, t) for c, t in extra_checks] if problems else []
    checks += [("varlen_check", v) for v in VARLEN_CHECKS] if args.varlen and problems else []
    checks += [("graph",)] if problems else []
    checks += [("varlen_graph",)] if args.varlen and problems else []
    timings = [("copy",)] + [("time", c) for c in grid]
    heads = [tuple(int(x) for x in h.split(":")) for h in args.varlen_heads.split(",")]
    timings += [("varlen_time", n, lens, dict(rounds=args.varlen_rounds, dtype=dt,
                                               knobs=not args.varlen_core,
                                               pairs=args.varlen_pairs, Hq=hq, Hkv=hkv, D=d,
                                               configs=parse_configs(args.varlen_configs),
                                               edits=[e for e in args.varlen_edits.split(",")
                                                      if e]))
                for hq, hkv, d in heads for dt in args.varlen_dtypes.split(",")
                for n, lens in VARLEN_TIMED
                if not args.varlen_batches or n in args.varlen_batches.split(",")] \
        if args.varlen else []
    tasks = timings + checks if args.checks_last else checks + timings
    run_tasks(tasks, emit, log)
    copies = [r["gbs"] for r in rows if r["kind"] == "copy"]
    copy_gbs = copies[-1] if copies else float("nan")
    text = summary(rows, copy_gbs)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
