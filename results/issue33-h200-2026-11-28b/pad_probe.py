"""Issue 33c probe (GPU): does the padded rows-form decode (splitkv, KT_FORM 0, PAD) give
kv head 0's heads bits that depend on the padding rows' data (the next group's queries,
which a padded tile loads and never stores)? The CPU simulator's slice has zeros there.
For each shape: the planned splitkv call twice on the same inputs (run-to-run), then with
the queries of every head past kv head 0's group replaced; kv head 0's heads compared bit
for bit. Also the same call with those queries zeroed (what the slice sees). Prints one
line per shape; writes $OUT_DIR/pad_probe.json."""
import json
import os
import sys

import torch

from spak.families.fmha_decode import FAMILY

out_dir = sys.argv[1]
dev = os.environ.get("PROBE_DEVICE", "cuda")      # "cpu": a dry run on the simulator
res = []
for case in sys.argv[2:]:
    p = FAMILY.parse(case)
    g = p.Hq // p.Hkv
    x = FAMILY.gpu_inputs(p, 0, 0, dev)
    cfg = FAMILY.gpu_config("splitkv", p, dev)

    def run(inp):
        call = FAMILY.gpu_call("splitkv", p, inp, cfg)
        call()
        if dev == "cuda":
            torch.cuda.synchronize()
        return call.outputs["out"][:, :, :g].clone()
    a, b = run(x), run(x)
    y = dict(x, q=x["q"].clone())
    y["q"][:, :, g:] = torch.randn(y["q"][:, :, g:].shape, device=dev).to(y["q"].dtype)
    c = run(y)
    z = dict(x, q=x["q"].clone())
    z["q"][:, :, g:] = 0
    d = run(z)
    view = (lambda t: t.view(torch.int16))
    r = {"case": case, "group": g, "tiles": cfg,
         "run_to_run_equal": bool((view(a) == view(b)).all()),
         "other_q_changed_equal": float((view(a) == view(c)).float().mean()),
         "other_q_zero_equal": float((view(a) == view(d)).float().mean()),
         "elements": a.numel()}
    res.append(r)
    print(f"pad_probe {case}: run-to-run equal {r['run_to_run_equal']}; kv head 0's heads "
          f"bit-equal after the other heads' q changed {100 * r['other_q_changed_equal']:.3f}%,"
          f" zeroed {100 * r['other_q_zero_equal']:.3f}% of {r['elements']}", flush=True)
with open(os.path.join(out_dir, "pad_probe.json"), "w") as f:
    json.dump(res, f, indent=1)
