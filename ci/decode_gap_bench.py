"""Issue 18 (2026-11-24e): why TileGym's split-KV decode is ahead of spak.fmha_kvcache at
the same split count (8x32:1x1:8192, 1x32:8x1:8192 and neighbours), on a GPU, in one go.

    python ci/decode_gap_bench.py --out DIR [--rounds 4] [--jobs 15]

Per shape (fp16, D 128, Sq 1, contiguous cache, every sequence full), providers timed in
`rounds` rounds, each round in a freshly shuffled order (seeded) after one discarded
timing (the first-timing penalty of results/decode-h100-2026-11-24d run 3):
  spak        spak.fmha_kvcache at its defaults (rows form, one-wave split count)
  kt1, kt2    the keys-in-M forms (TileGym's S^T = K Q^T; kt2 also O^T = V^T P^T)
  occ2        the split kernel with the occupancy hint 2 (128 threads, 2 blocks an SM)
  layout      the default kernels reading TileGym's cache layout [B, Hkv, L, D] (a strided
              [B, L, Hkv, D] view of it; for MQA the same memory: a control)
  split, combine   the default plan's two launches timed alone (its workspaces reused)
  cmb-sum     the default split kernel, the combine summing splits with ct.sum instead of
              its halving tree (other bits: a timing probe)
  full        the default plan with a split kernel that takes every sequence's length to be
              the cache's capacity (no Lens load: the key range of a split is known from
              the shapes alone, as in TileGym's kernel, which has no per-sequence lengths);
              the bench's sequences are full, so its bits equal the default's
  tilegym     TileGym's decode on [B, Hkv, L, D]; tg-reduce its reduce kernel alone
  sdpa-cudnn, sdpa-flash, copy-same (a device copy moving the case's bytes)
GB/s = (K + V + Q + O bytes) / time. Checks: every tiles variant against float64 and the
simulator on small cases (both kinds of shape), and on each timed shape every variant's
output against the default's (bit-identical expected: same arithmetic) and SDPA's.
Writes DIR/rows.jsonl and DIR/summary.md.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "ci"))
sys.path.insert(0, os.path.join(ROOT, "ci", "peers"))

SHAPES = [(8, 1, 8192), (1, 8, 8192), (8, 1, 32768), (1, 8, 32768), (8, 8, 8192),
          (64, 1, 8192)]                                     # (B, Hkv, Sk); Hq 32
VARIANTS = {"kt1": {"KT_FORM": 1}, "kt2": {"KT_FORM": 2}, "occ2": {"OCCUPANCY": 2}}
CHECK_CASES = ["1x32:1x2048x128/noncausal/splits=16/fp16",
               "1x32:8x2048x128/noncausal/splits=16/fp16",
               "2x32:8x1000x128/noncausal/lens=1000:517/splits=5/fp16"]


def providers(c, dev):
    """name -> (list of zero-argument calls over the rotated copies, free())."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import spak
    import tilegym_flash_decode as tg
    from decode_bench import _make_copies
    from spak.kvcache import _plan, launch_templates
    B, Hkv, Sk = c
    cc = dict(B=B, Hq=32, Hkv=Hkv, Sq=1, Sk=Sk, D=128, page=0, dtype="fp16")
    n = COPIES or max(1, min(8, -(-256 * 2**20 // (B * Sk * Hkv * 512))))
    copies, lens = _make_copies(cc, n, dev)
    P = {"spak": [lambda x=x: spak.fmha_kvcache(x["q"], x["k"], x["v"], lens)
                  for x in copies]}
    for n in SPLITS:          # --splits: the same call at a given split count
        P[f"n{n}"] = [lambda x=x, n=n: spak.fmha_kvcache(x["q"], x["k"], x["v"], lens,
                                                         num_splits=n) for x in copies]
    for name, t in VARIANTS.items():
        P[name] = [lambda x=x, t=t: spak.fmha_kvcache(x["q"], x["k"], x["v"], lens, tiles=t)
                   for x in copies]
    # TileGym's layout seen as ours: [B, Hkv, L, D] memory as a [B, L, Hkv, D] view
    lay = [dict(x, kl=x["ks"].transpose(1, 2), vl=x["vs"].transpose(1, 2)) for x in copies]
    x0 = copies[0]
    out = torch.empty_like(x0["q"])
    tiles = (128, 64, 1, 0, 0, 0, 0, 0)              # TILE_N, MAX_ROWS, PAGE_MODE, OCC, ...
    templates, shapes = _plan(x0["q"], x0["k"], x0["v"], lens, None, out, False,
                              128 ** -0.5, 0, *tiles)
    work = [torch.empty(s, dtype=torch.float32, device=dev) for s in shapes]

    def launch(x, which, k=None, v=None):
        tens = {"q": x["q"], "k": x["k"] if k is None else k, "v": x["v"] if v is None else v,
                "lens": lens, "out": out, "bt": None}
        launch_templates(dev, [templates[i] for i in which], work, tens)
    P["layout"] = [lambda x=x: launch(x, range(len(templates)), x["kl"], x["vl"]) for x in lay]
    P["split"] = [lambda x=x: launch(x, [0]) for x in copies]
    full = [(decode_variant("full").decode_split_kernel,) + tuple(templates[0][1:])] \
        + list(templates[1:])
    P["full"] = [lambda x=x: launch_templates(
        dev, full, work, {"q": x["q"], "k": x["k"], "v": x["v"], "lens": lens, "out": out,
                          "bt": None}) for x in copies]
    if len(templates) > 1:
        P["combine"] = [lambda x=x: launch(x, [1]) for x in copies]
        # the combine with TileGym's reduce's occupancy hint (a scheduling hint: the same
        # arithmetic, so the same bits): the whole op, the default split kernel
        from spak.gpu.variants import with_hints
        kern, grid, args = templates[1]
        hinted = templates[:1] + [(with_hints(kern, occupancy=4), grid, args)]

        def launch_o4(x):
            tens = {"q": x["q"], "k": x["k"], "v": x["v"], "lens": lens, "out": out,
                    "bt": None}
            launch_templates(dev, hinted, work, tens)
        P["cmb-o4"] = [lambda x=x: launch_o4(x) for x in copies]
        # narrower column chunks: 128 / DV_T times the combine blocks (a row's columns
        # are merged independently: the same bits); B = 1 has only Hq rows = 32 blocks
        from spak.kvcache import _Const
        summed = templates[:1] + [(decode_variant("sum").decode_combine_kernel,)
                                  + tuple(templates[1][1:])]
        P["cmb-sum"] = [lambda x=x: launch_templates(
            dev, summed, work, {"q": x["q"], "k": x["k"], "v": x["v"], "lens": lens,
                                "out": out, "bt": None}) for x in copies]
        for dv in (32, 64):
            t2 = templates[:1] + [(kern, (grid[0] * (128 // dv), grid[1], grid[2]),
                                   args[:-1] + (_Const(dv),))]
            P[f"cmb-dv{dv}"] = [lambda x=x, t2=t2: launch_templates(
                dev, t2, work, {"q": x["q"], "k": x["k"], "v": x["v"], "lens": lens,
                                "out": out, "bt": None}) for x in copies]
    P["tilegym"] = [lambda x=x: tg.fmha_decode(x["qs"], x["ks"], x["vs"], None) for x in copies]
    splits = max(1, 132 // (B * Hkv))
    ts = max(128, tg.next_power_of_2(-(-Sk // splits)))
    splits = -(-Sk // ts)
    mid = torch.randn(B, 32, splits, 128, device=dev, dtype=torch.float16)
    lse = torch.randn(B, 32, splits, device=dev, dtype=torch.float32)
    o = torch.empty(B, 32, 128, device=dev, dtype=torch.float16)
    P["tg-reduce"] = [lambda: tg.splitk_reduce(mid, lse, o, Sk)]
    for name, be in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(x, be=be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(x["qs"], x["ks"], x["vs"],
                                                      enable_gqa=Hkv != 32)
        P[name] = [lambda x=x, f=sdpa: f(x) for x in copies]
    half = (B * Sk * Hkv * 512 + 4 * B * 32 * 128) // 2
    bufs = [(torch.empty(half, dtype=torch.uint8, device=dev),
             torch.empty(half, dtype=torch.uint8, device=dev)) for _ in range(n)]
    P["copy-same"] = [lambda a=a, b=b: b.copy_(a) for a, b in bufs]
    return P, copies, lay, lens, (templates, work, out, launch), len(templates)


#: text edits of gpu/kernels/decode.py for the bench's kernel variants (decode_variant)
DECODE_EDITS = {
    # every sequence's length taken to be the cache's capacity: no dependent Lens load
    "full": [("    L = ct.load(Lens, index=(b,), shape=())\n    return min(max(L, 0), cap)",
              "    return cap")],
    # the combine's sum over splits by ct.sum (the compiler's reduction) instead of the
    # halving tree of extracts: other bits (summation order), a timing probe only
    "sum": [("    l_i, acc = _merge_tree(l_s, a_s, w, SPLITS_T, DV_T)",
             "    l_i = ct.sum(l_s * w, axis=0, keepdims=True)\n"
             "    acc = ct.sum(a_s * w, axis=0, keepdims=True)")],
}


@functools.lru_cache(maxsize=None)
def decode_variant(name):
    """gpu/kernels/decode.py with DECODE_EDITS[name] applied, loaded as a module from a
    temporary file (its relative import made absolute); once per name, so every shape
    launches the same kernel objects."""
    from pathlib import Path
    from fwd_variants import load_edited
    text = (Path(ROOT) / "gpu" / "kernels" / "decode.py").read_text()
    absolute = ("from .common import", "from spak.gpu.kernels.common import")
    return load_edited(text, [absolute] + DECODE_EDITS[name], "decode_gap_bench",
                       f"decode_{name}")


def agree(c, P, copies, lay, lens, lau, emit, log):
    """Every variant's output on the timed shape against the default's (bits) and SDPA's."""
    import torch
    import torch.nn.functional as F
    import spak
    import tilegym_flash_decode as tg
    x, xl = copies[0], lay[0]
    ref = spak.fmha_kvcache(x["q"], x["k"], x["v"], lens)
    sd = F.scaled_dot_product_attention(x["qs"], x["ks"], x["vs"],
                                        enable_gqa=c[1] != 32).transpose(1, 2).float()
    _, _, out, launch = lau

    def layout():
        launch(xl, range(len(lau[0])), xl["kl"], xl["vl"])
        return out.clone()
    makers = {n: (lambda t=t: spak.fmha_kvcache(x["q"], x["k"], x["v"], lens, tiles=t))
              for n, t in VARIANTS.items()}
    makers["layout"] = layout
    makers.update({f"n{n}": (lambda n=n: spak.fmha_kvcache(x["q"], x["k"], x["v"], lens,
                                                           num_splits=n)) for n in SPLITS})

    def full():
        P["full"][0]()
        return out.clone()
    makers["full"] = full
    if "cmb-o4" in P:
        def cmb_o4():
            P["cmb-o4"][0]()
            return out.clone()
        makers["cmb-o4"] = cmb_o4
    for name in ("cmb-dv32", "cmb-dv64", "cmb-sum"):
        if name in P:
            def cmb(name=name):
                P[name][0]()
                return out.clone()
            makers[name] = cmb
    makers["tilegym"] = lambda: tg.fmha_decode(x["qs"], x["ks"], x["vs"], None).view(
        c[0], 32, 1, 128).transpose(1, 2)
    outs = {}
    for n, make in makers.items():
        try:
            outs[n] = make()
        except Exception as e:  # noqa: BLE001 -- recorded, the timing goes on
            log(f"agree {c} {n}: {type(e).__name__}: {str(e)[:200]}")
            emit(dict(kind="agree", shape=list(c), name=n, error=str(e)[:300]))
    for n, o in [("spak", ref)] + list(outs.items()):
        same = float((o == ref).float().mean().item())
        err = float(((o.float() - sd).norm() / sd.norm()).item())
        emit(dict(kind="agree", shape=list(c), name=n, identical_to_spak=same,
                  rel_l2_vs_sdpa=err, nonfinite=int((~torch.isfinite(o)).sum().item())))
        log(f"agree {c} {n:8s} identical to spak {same:.4%}  rel_l2 vs sdpa {err:.1e}")


def time_shape(c, dev, rounds, seed, emit, log):
    import torch
    from decode_bench import shuffled_rounds
    P, copies, lay, lens, lau, nl = providers(c, dev)
    agree(c, P, copies, lay, lens, lau, emit, log)
    names = [n for n in P if not ONLY or n in ONLY]
    ms = shuffled_rounds(P, names, rounds, seed, "spak", log, c)
    B, Hkv, Sk = c
    nbytes = B * Sk * Hkv * 512 + 4 * B * 32 * 128
    row = dict(kind="time", shape=f"{B}x32:{Hkv}x1:{Sk}", B=B, Hkv=Hkv, Sk=Sk, bytes=nbytes,
               launches=nl, ms=ms, gbs={n: [nbytes / t / 1e6 for t in v] for n, v in ms.items()},
               median_gbs={n: nbytes / float(np.median(v)) / 1e6 for n, v in ms.items()},
               median_us={n: float(np.median(v)) * 1e3 for n, v in ms.items()})
    emit(row)
    log(f"time {row['shape']:18s} " + "  ".join(
        f"{n} {row['median_gbs'][n]:.0f}" for n in names)
        + "  (us: " + " ".join(f"{n} {row['median_us'][n]:.1f}" for n in names) + ")")
    del P, copies, lay
    torch.cuda.empty_cache()


def checks(emit, log):
    import torch
    from decode_bench import _check_one
    from spak.families.fmha_decode import FAMILY
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for case in CHECK_CASES:
        for t in [None] + list(VARIANTS.values()):
            try:
                _check_one(FAMILY.parse(case), dev, sms, emit, log, tiles=t)
            except Exception as e:  # noqa: BLE001
                log(f"check {case} {t}: {type(e).__name__}: {str(e)[:200]}")
                emit(dict(kind="check", case=case, tiles=t, error=str(e)[:300], passed=False))


def warm(jobs, log):
    """Compile every kernel variant in worker processes (lengths 0: nothing read)."""
    from decode_bench import warm_up
    grid = [dict(B=B, Hq=32, Hkv=h, Sq=1, Sk=s, D=128, page=0, dtype="fp16",
                 extra={n: {"tiles": t} for n, t in VARIANTS.items()}) for B, h, s in SHAPES]
    warm_up([], grid, jobs, log)


def summary(rows) -> str:
    names = NAMES + [f"n{n}" for n in SPLITS]
    lines = ["| shape | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for r in rows:
        if r["kind"] != "time":
            continue
        cells = []
        for n in names:
            v = r["gbs"].get(n)
            cells.append("-" if not v else f"{np.median(v):.0f} ({min(v):.0f}-{max(v):.0f})")
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + " |")
    lines += ["", "us (median): ", "| shape | " + " | ".join(names) + " |",
              "|---" * (len(names) + 1) + "|"]
    for r in rows:
        if r["kind"] == "time":
            lines.append(f"| {r['shape']} | " + " | ".join(
                f"{r['median_us'][n]:.1f}" if n in r["median_us"] else "-" for n in names) + " |")
    return "\n".join(lines)


NAMES = ["spak", "full", "kt1", "kt2", "occ2", "layout", "split", "combine", "cmb-o4", "cmb-dv32",
         "cmb-dv64", "cmb-sum", "tilegym",
         "tg-reduce", "sdpa-cudnn", "sdpa-flash", "copy-same"]
#: --splits: split counts timed as providers "n<count>" beside the default's
SPLITS: list = []
#: --copies: rotated input copies per shape (0: enough to pass 256 MB, at most 8)
COPIES = 0
ONLY: list = []


def main() -> int:
    global COPIES, ONLY, SHAPES, SPLITS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=15)
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--copies", type=int, default=0,
                    help="rotated input copies a shape (0: enough to pass 256 MB, <= 8); "
                         "more copies spread each graph replay's fixed cost thinner")
    ap.add_argument("--shapes", default="", metavar="B:HKV:SK[,...]",
                    help="shapes to time (Hq 32, Sq 1; default: "
                         + ",".join(f"{b}:{h}:{k}" for b, h, k in SHAPES) + ")")
    ap.add_argument("--splits", default="", metavar="N[,N...]",
                    help="also time the call at these split counts (providers nN), e.g. "
                         "128 where the rule's 132 leaves 4 splits empty")
    ap.add_argument("--only", default="",
                    help="comma-separated providers to time (default: all)")
    a = ap.parse_args()
    COPIES = a.copies
    SPLITS = [int(n) for n in a.splits.split(",") if n]
    if a.shapes:
        SHAPES = [tuple(int(x) for x in s.split(":")) for s in a.shapes.split(",")]
    ONLY = [n for n in a.only.split(",") if n]
    import torch
    from decode_bench import open_rows, time_shapes, write_summary
    rows, emit, log = open_rows(a.out)
    if not a.no_warm:
        warm(a.jobs, log)
    time_shapes(SHAPES, time_shape, torch.device("cuda"), a.rounds, 1000, emit, log)
    checks(emit, log)
    write_summary(a.out, summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
