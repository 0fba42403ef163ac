"""Issue 18 (2026-11-27): is the combine's tiling the cliff at 65+ splits?

    python ci/decode_combine_probe.py --out DIR [--rounds 3]

ci/decode_bench.py --grid r27c (results/decode-splits-h100-2026-11-27) read batch-1 MQA
Sq 4 at 1757-1796 GB/s with 64 splits of a 131072-key cache and 901-921 with 65; the split
kernel is the same code either way (the count is a grid size), the combine is not: 65+
splits round up to SPLITS_T 128 with 64-column chunks (gpu.plan_decode.combine_tiles),
which tileiras compiles with 200 B/thread of spill under the occupancy hint 4 (SPLITS_T 64
x 128 columns: 16 B; 256 x 32: none). Here the whole call (spak.fmha_kvcache, CUDA-graph
replays of >= 4 calls) is timed with the plan's combine tiling ("cur") beside
  dv32    at most 4096 floats a block once SPLITS_T >= 128 (128 x 32: no spill on sm_90)
  f4096   at most 4096 floats a block everywhere
in shuffled rounds; outputs compared bit for bit with "cur" (the same per-column tree).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "ci"))

#: (B, Hkv, Sq, Sk, num_splits or None for the rule's)
CASES = [(1, 1, 4, 131072, None), (1, 1, 4, 131072, 64), (1, 1, 4, 131072, 132),
         (1, 1, 4, 32768, None), (1, 1, 4, 32768, 66), (1, 1, 4, 65536, None),
         (1, 1, 1, 131072, None), (1, 1, 1, 131072, 66), (1, 1, 1, 32768, None),
         (1, 2, 4, 131072, None), (1, 2, 4, 131072, 32), (1, 8, 1, 131072, None),
         (8, 1, 1, 131072, None), (64, 1, 1, 8192, None)]


def _tilings():
    import spak.gpu.plan_decode as pd
    cur = pd.combine_tiles

    def capped(floats, from_t):
        def tiles(splits, head_dim_v):
            st, dv = cur(splits, head_dim_v)
            if st < from_t:
                return st, dv
            return st, min(dv, max(32, floats // st))
        return tiles
    return {"cur": cur, "dv32": capped(4096, 128), "f4096": capped(4096, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import torch
    import spak
    import spak.gpu.plan_decode as pd
    import spak.kvcache as kv
    from decode_bench import _graph_time, _make_copies, call_cycle, open_rows
    rows, emit, log = open_rows(a.out)
    tilings = _tilings()
    dev = torch.device("cuda")
    for i, (B, Hkv, Sq, Sk, ns) in enumerate(CASES):
        c = dict(B=B, Hq=32, Hkv=Hkv, Sq=Sq, Sk=Sk, D=128, page=0, dtype="fp16")
        n = max(1, min(8, -(-256 * 2**20 // (B * Sk * Hkv * 512))))
        copies, lens = _make_copies(c, n, dev)
        calls = call_cycle(copies)
        outs, ms = {}, {t: [] for t in tilings}

        def fns(t):
            pd.combine_tiles = tilings[t]
            kv._PLANS.clear()
            return [lambda x=x: spak.fmha_kvcache(x["q"], x["k"], x["v"], lens,
                                                  is_causal=Sq > 1, num_splits=ns)
                    for x in calls]
        for t in tilings:
            f = fns(t)
            outs[t] = f[0]()
        order = list(tilings)
        rng = random.Random(3000 + i)
        _graph_time(fns("cur"), reps=5)                        # discarded
        for _ in range(a.rounds):
            rng.shuffle(order)
            for t in order:
                ms[t].append(_graph_time(fns(t))[0])
        pd.combine_tiles = tilings["cur"]
        kv._PLANS.clear()
        nbytes = B * Sk * Hkv * 512 + 4 * B * Sq * 32 * 128
        splits = ns or pd.auto_splits(B, 32, Hkv, Sq, Sk, 128, 64, 132)
        row = dict(kind="combine_probe", B=B, Hkv=Hkv, Sq=Sq, Sk=Sk, splits=splits,
                   tiles={t: list(tilings[t](splits, 128)) for t in tilings},
                   ms=ms, gbs={t: nbytes / float(np.median(v)) / 1e6 for t, v in ms.items()},
                   identical={t: float((outs[t] == outs["cur"]).float().mean().item())
                              for t in tilings},
                   nonfinite=int(sum((~torch.isfinite(o)).sum().item() for o in outs.values())))
        emit(row)
        log(f"{B}x32:{Hkv}x{Sq}:{Sk} splits {splits:3d} " + "  ".join(
            f"{t} {row['tiles'][t]} {row['gbs'][t]:.0f}" for t in tilings)
            + f"  identical {min(row['identical'].values()):.4%} nonfinite {row['nonfinite']}")
        del copies, calls, outs
        torch.cuda.empty_cache()
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump([r for r in rows if r["kind"] == "combine_probe"], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
