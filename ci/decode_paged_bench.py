"""Issue 18 (2026-11-27): paged decode against contiguous, with the page ids looked up one
key tile ahead (tiles["PAGE_AHEAD"] 1) or in the step itself (0), on a GPU, in one go.

    python ci/decode_paged_bench.py --out DIR [--rounds 5] [--jobs 15] [--shapes all|short]

Why: paged reads 0.83-0.97 of contiguous on the goal grid (results/decode-h100-2026-11-24e
run 4, median 0.944), 256-key pages (one page lookup per 128-key tile, then two boxes at
the page) no better than 16-key ones. In the step-local form a tile's K/V addresses wait
on its block-table load; one step ahead, they do not.

Per shape (fp16, D 128, Hq 32, every sequence full; shuffled page tables), providers timed
in `rounds` rounds, each in a freshly shuffled order (seeded) after one discarded timing:
  contig          spak.fmha_kvcache on a contiguous cache (the defaults)
  p16, p16a       16-key pages, PAGE_AHEAD 0 / 1 (same cache, same table)
  p256, p256a     256-key pages, PAGE_AHEAD 0 / 1
  p256a-alt       (--forms) p256a in the other form: rows (KT_FORM 0) where the plan picks
                  keys_vt (MQA Sq 1), else keys_vt (2)
  p16a-alt        (--forms) p16a in the other form
  p16b, p16ba     (--page16) 16-key pages as one box a page (PAGE_MODE 0), PAGE_AHEAD 0 / 1
  p16ba-alt       p16ba in the other form
  p16-tn64        16-key pages gathered, 64-key tiles (the plan's look-up choice)
GB/s = (K + V + Q + O bytes) / time (CUDA-graph replays of >= 4 calls over rotated input
copies, ci/decode_bench.py's timer). On every timed shape the ahead outputs are compared
bit for bit with the step-local ones (same cache), and everything with SDPA's on the
contiguous copy; checks: PAGE_AHEAD 1 against float64 and the simulator on small paged
cases (both forms, both page modes, ragged lengths with 0 and 1, many splits).
Writes DIR/rows.jsonl and DIR/summary.md.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "ci"))

#: (B, Hkv, Sq, Sk), Hq 32: the goal grid's paged shapes furthest below contiguous, and a
#: few at or near it (the regression side)
SHAPES = [(1, 8, 1, 8192), (1, 8, 1, 32768), (1, 1, 1, 32768), (1, 32, 1, 8192),
          (8, 1, 1, 8192), (8, 1, 1, 32768), (64, 1, 1, 8192), (1, 8, 4, 8192),
          (8, 1, 4, 32768), (64, 1, 4, 8192), (8, 32, 1, 32768), (8, 8, 1, 131072),
          (1, 1, 1, 131072), (64, 8, 4, 8192), (8, 8, 1, 8192), (64, 8, 1, 8192),
          (8, 32, 1, 8192)]
SHORT = SHAPES[:6]
FORMS = False                  # --forms
P16 = False                    # --page16
#: name -> (page size, tiles); "alt" in tiles: the other KT_FORM than the plan's
PROVIDERS = {"contig": (0, None), "p16": (16, {"PAGE_AHEAD": 0}),
             "p16a": (16, {"PAGE_AHEAD": 1}), "p256": (256, {"PAGE_AHEAD": 0}),
             "p256a": (256, {"PAGE_AHEAD": 1})}
ALT = {"p256a-alt": (256, {"PAGE_AHEAD": 1, "alt": 1}),
       "p16a-alt": (16, {"PAGE_AHEAD": 1, "alt": 1})}
PAGE16 = {"p16b": (16, {"PAGE_MODE": 0, "PAGE_AHEAD": 0}),
          "p16ba": (16, {"PAGE_MODE": 0, "PAGE_AHEAD": 1}),
          "p16ba-alt": (16, {"PAGE_MODE": 0, "PAGE_AHEAD": 1, "alt": 1}),
          "p16-tn64": (16, {"TILE_N": 64})}


def _providers():
    return {**PROVIDERS, **(ALT if FORMS else {}), **(PAGE16 if P16 else {})}


def _tiles(t, Hkv, Sq, page):
    """t with "alt" replaced by the KT_FORM the plan would not pick."""
    from spak.gpu.plan_decode import choose_kt_form
    if not t or "alt" not in t:
        return t
    t = {k: v for k, v in t.items() if k != "alt"}
    t["KT_FORM"] = 0 if choose_kt_form(32, Hkv, Sq, page, t.get("TILE_N", 128)) == 2 else 2
    return t
CHECK_CASES = ["2x8:1x4:77x64/causal/page16/lens=77:5/splits=3/bf16",
               "4x8:1x300x64/noncausal/page16/lens=0:1:17:300/fp16",
               "1x32:1x4:2048x128/causal/page16/fp16",
               "2x32:1x3000x128/noncausal/page16/lens=3000:1111/fp16",
               "3x32:8x1000x128/noncausal/page256/lens=1000:517:1/splits=5/fp16",
               "1x32:4x600x128/noncausal/page64/splits=5/fp16",
               "2x32:1x1000x128/noncausal/page256/lens=1000:129/splits=7/fp16"]


def _case(shape, page):
    B, Hkv, Sq, Sk = shape
    return dict(B=B, Hq=32, Hkv=Hkv, Sq=Sq, Sk=Sk, D=128, page=page, dtype="fp16")


def providers(shape, dev):
    """name -> list of zero-argument calls (one graph replay), and the copies (kept alive)."""
    import spak
    from decode_bench import _make_copies, call_cycle
    B, Hkv, Sq, Sk = shape
    n = max(1, min(8, -(-256 * 2**20 // (B * Sk * Hkv * 512))))
    sets, P = {}, {}
    for page in (0, 16, 256):
        copies, lens = _make_copies(_case(shape, page), n, dev)
        sets[page] = (copies, lens)
    for name, (page, t) in _providers().items():
        copies, lens = sets[page]
        tiles = _tiles(t, Hkv, Sq, page)
        P[name] = [lambda x=x, t=tiles, lens=lens: spak.fmha_kvcache(
            x["q"], x["k"], x["v"], lens, block_table=x["bt"], is_causal=Sq > 1, tiles=t)
            for x in call_cycle(copies)]
    return P, sets


def agree(shape, P, sets, emit, log):
    """Ahead vs step-local on the same paged cache (bits); every provider vs SDPA on its
    own cache's contiguous gather (rel L2)."""
    import torch
    import torch.nn.functional as F
    Sq = shape[2]
    outs = {n: P[n][0]() for n in P}
    pairs = [(16, "p16a", "p16"), (256, "p256a", "p256")]
    pairs += [(16, "p16ba", "p16"), (16, "p16b", "p16")] if P16 else []
    for page, a, b in pairs:
        same = float((outs[a] == outs[b]).float().mean().item())
        x = sets[page][0][0]
        sd = F.scaled_dot_product_attention(x["qs"].float(), x["ks"].float(), x["vs"].float(),
                                            enable_gqa=True).transpose(1, 2)
        err = float(((outs[a].float() - sd).norm() / sd.norm()).item())
        fin = int((~torch.isfinite(outs[a])).sum().item())
        emit(dict(kind="agree", shape=list(shape), name=a, identical_to=b, identical=same,
                  rel_l2_vs_sdpa_fp32=err, nonfinite=fin, noncausal_reference=Sq > 1))
        log(f"agree {shape} {a} vs {b}: identical {same:.4%}; rel L2 vs SDPA (fp32) "
            f"{err:.1e}{' (Sq>1: ours causal, SDPA not: not comparable)' if Sq > 1 else ''}"
            f", non-finite {fin}")


def time_shape(shape, dev, rounds, seed, emit, log):
    import torch
    from decode_bench import shuffled_rounds
    P, sets = providers(shape, dev)
    agree(shape, P, sets, emit, log)
    names = list(P)
    ms = shuffled_rounds(P, names, rounds, seed, "contig", log, shape)
    B, Hkv, Sq, Sk = shape
    nbytes = B * Sk * Hkv * 512 + 4 * B * Sq * 32 * 128
    med = {n: nbytes / float(np.median(v)) / 1e6 for n, v in ms.items()}
    row = dict(kind="time", shape=f"{B}x32:{Hkv}x{Sq}:{Sk}", B=B, Hkv=Hkv, Sq=Sq, Sk=Sk,
               bytes=nbytes, ms=ms, gbs={n: [nbytes / t / 1e6 for t in v] for n, v in ms.items()},
               median_gbs=med)
    emit(row)
    log(f"time {row['shape']:16s} " + "  ".join(f"{n} {med[n]:.0f}" for n in names)
        + f"  | p16a/p16 {med['p16a'] / med['p16']:.3f} p256a/p256 {med['p256a'] / med['p256']:.3f}"
        f"  p16a/contig {med['p16a'] / med['contig']:.3f} p256a/contig "
        f"{med['p256a'] / med['contig']:.3f}")
    del P, sets
    torch.cuda.empty_cache()


def checks(emit, log):
    import torch
    from decode_bench import _check_one
    from spak.families.fmha_decode import FAMILY
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for case in CHECK_CASES:
        for t in ({"PAGE_AHEAD": 1}, {"PAGE_AHEAD": 1, "KT_FORM": 2},
                  {"PAGE_AHEAD": 1, "PAGE_MODE": 0}, {"PAGE_AHEAD": 1, "PAGE_MODE": 0,
                                                      "KT_FORM": 2})[:4 if P16 else 2]:
            try:
                _check_one(FAMILY.parse(case), dev, sms, emit, log, tiles=t)
            except Exception as e:  # noqa: BLE001
                log(f"check {case} {t}: {type(e).__name__}: {str(e)[:200]}")
                emit(dict(kind="check", case=case, tiles=t, error=str(e)[:300], passed=False))


def warm(shapes, jobs, log):
    """Compile every variant in worker processes (lengths 0: nothing read)."""
    from decode_bench import warm_up
    grid = []
    for s in shapes:
        grid.append(_case(s, 0))
        for page in (16, 256):
            grid.append(dict(_case(s, page), extra={
                n: {"tiles": _tiles(t, s[1], s[2], page)}
                for n, (pg, t) in _providers().items() if pg == page}))
    warm_up([], grid, jobs, log)


def summary(rows) -> str:
    names = list(_providers())
    pairs = [("p16a", "p16"), ("p256a", "p256"), ("p16", "contig"), ("p16a", "contig"),
             ("p256", "contig"), ("p256a", "contig")] + (
        [("p256a-alt", "p256a"), ("p16a-alt", "p16a"), ("p16a-alt", "contig")]
        if FORMS else []) + (
        [("p16ba", "p16b"), ("p16ba", "p16a"), ("p16ba-alt", "p16ba"), ("p16ba", "contig"),
         ("p16-tn64", "p16a")] if P16 else [])
    head = ["shape"] + names + [f"{a}/{b}" for a, b in pairs]
    lines = ["GB/s, median of the rounds (min-max):", "",
             "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        if r["kind"] != "time":
            continue
        m = r["median_gbs"]
        cells = [f"{m[n]:.0f} ({min(r['gbs'][n]):.0f}-{max(r['gbs'][n]):.0f})" for n in names]
        cells += [f"{m[a] / m[b]:.3f}" for a, b in pairs]
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + " |")
    chk = [r for r in rows if r["kind"] == "check"]
    if chk:
        lines += ["", f"checks: {sum(bool(r.get('passed')) for r in chk)}/{len(chk)} within "
                  f"the float64 gates; simulator bit-identical (min over checks) "
                  f"{min((r.get('sim_identical', 0) for r in chk), default=0):.4%}"]
    ag = [r for r in rows if r["kind"] == "agree"]
    if ag:
        lines += [f"ahead vs step-local on the timed shapes: identical (min) "
                  f"{min(r['identical'] for r in ag):.4%}, non-finite "
                  f"{sum(r['nonfinite'] for r in ag)}"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=15)
    ap.add_argument("--shapes", choices=("all", "short"), default="all")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--no-checks", action="store_true")
    ap.add_argument("--forms", action="store_true", help="time p256a-alt too")
    ap.add_argument("--page16", action="store_true", help="time the PAGE16 providers too")
    ap.add_argument("--only-shapes", default="",
                    help="indices into SHAPES, comma-separated (default: --shapes)")
    a = ap.parse_args()
    global FORMS, P16
    FORMS, P16 = a.forms, a.page16
    import torch
    from decode_bench import open_rows, time_shapes, write_summary
    shapes = SHAPES if a.shapes == "all" else SHORT
    if a.only_shapes:
        shapes = [SHAPES[int(i)] for i in a.only_shapes.split(",")]
    rows, emit, log = open_rows(a.out)
    if not a.no_warm:
        warm(shapes, a.jobs, log)
    time_shapes(shapes, time_shape, torch.device("cuda"), a.rounds, 2000, emit, log)
    if not a.no_checks:
        checks(emit, log)
    write_summary(a.out, summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
