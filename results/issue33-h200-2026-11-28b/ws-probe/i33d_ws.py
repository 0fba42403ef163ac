"""Issue 33d probe: which float32 partial value of the padded rows-form split kernel differs
from the simulator's? For each shape: the planned `splitkv` call on the GPU with its
split workspaces (Acc, Mx, Lx) kept; the simulator's slice (batch 0, kv head 0's heads,
the GPU call's tiles and splits) run on this host's CPU with its workspaces kept; the
two compared value by value. Prints one line per shape and writes OUT_DIR/ws_probe.json:
the differing (head, split, [column]) entries of m, l and acc with both values and their
float32 ulp distance, and the differing output elements.

    python i33d_ws.py OUT_DIR CASE...          (PROBE_SIM=1: a dry run on a CPU, both sides simulated)
"""
import json
import os
import sys

import numpy as np
import torch

from spak.families.fmha_decode import FAMILY
import spak.gpu.launch as gl
from spak import sim
from spak.gpu.plan_decode import plan_decode
import cuda.tile as ct

dev = "cuda"
if os.environ.get("PROBE_SIM"):     # a dry run on a CPU: the "GPU" side simulated too
    from spak.sim import interpret
    interpret.enable(model="sm_90", cuda_as_cpu=True)
    dev = "cpu"                     # inputs from the CPU generator (no CUDA one here)


def gpu_side(p, x, cfg):
    kept = []
    base = gl.torch_alloc(x["q"])

    def rec(shape, kind):
        t = base(shape, kind)
        kept.append(t)
        return t
    call = FAMILY.gpu_call("splitkv", p, x, cfg, alloc=rec)
    call()
    torch.cuda.synchronize()
    # distinct() asks for a second workspace of one shape as shape + (1,): view it back
    ws = [t.reshape(t.shape[:4]) for t in kept if t.dim() >= 4 and t.shape[0] == p.B]
    return call, ws


def sim_side(s):
    arr = {n: sim.SimArray(np.array(s.inputs[n]), ct.float16, name=n)
           for n in ("q", "k_cache", "v_cache")}
    out = sim.SimArray(np.full(s.gpu["out"].shape, np.nan, np.float16), ct.float16, name="Out")
    kept = []

    def alloc(shape, kind):
        kept.append(np.full(shape, np.nan, np.float32))
        return kept[-1]
    for L in plan_decode(arr["q"], arr["k_cache"], arr["v_cache"], s.inputs["cache_seqlens"],
                         out, block_table=s.inputs["block_table"], causal=s.problem.causal,
                         num_splits=s.problem.splits, tiles=s.tiles, alloc=alloc):
        sim.launch(L.kernel, L.grid, L.args, model="sm_90")
    return out.data, kept


def diff(name, g, c):
    """entries of g (GPU) and c (sim) whose float32 bits differ: index, values, ulps."""
    gi, ci = g.view(np.int32).astype(np.int64), c.view(np.int32).astype(np.int64)
    idx = np.argwhere(gi != ci)
    return [{"array": name, "index": [int(i) for i in k], "gpu": float(g[tuple(k)]),
             "sim": float(c[tuple(k)]), "ulps": int(abs(gi[tuple(k)] - ci[tuple(k)]))}
            for k in idx[:50]], len(idx)


res = []
for case in sys.argv[2:]:
    p = FAMILY.parse(case)
    g = p.Hq // p.Hkv
    x = FAMILY.gpu_inputs(p, 0, 0, dev)
    cfg = FAMILY.gpu_config("splitkv", p, dev)
    call, ws = gpu_side(p, x, cfg)
    s = FAMILY.sim_slice("splitkv", p, x, call.outputs, cfg)
    h = s.gpu["out"].shape[2]
    sim_out, kept = sim_side(s)
    r = {"case": case, "slice": s.text, "tiles": s.tiles, "splits": s.problem.splits}
    if len(ws) == 3 and len(kept) == 3:      # acc, mx, lx in plan_decode's order
        rows = []
        n = 0
        for name, gt, ct_ in zip(("acc", "m", "l"), ws, kept):
            d, k = diff(name, gt[0:1, :, :h].float().cpu().numpy(), ct_)
            rows += d
            n += k
        r["partials_differing"], r["partials"] = n, rows
    else:
        r["note"] = f"workspaces: gpu {len(ws)}, sim {len(kept)} (one split: none)"
    go = s.gpu["out"].astype(np.float16)
    bad = np.argwhere(go.view(np.uint16) != sim_out.view(np.uint16))
    r["out_differing"] = [[int(i) for i in k] for k in bad[:20]]
    res.append(r)
    print(f"ws_probe {case}: {s.text}; output elements differing {len(bad)}; partial values "
          f"differing {r.get('partials_differing', '-')}", flush=True)
    for d in r.get("partials", [])[:8]:
        print("   ", d, flush=True)
with open(os.path.join(sys.argv[1], "ws_probe.json"), "w") as f:
    json.dump(res, f, indent=1)
